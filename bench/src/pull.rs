//! Image pulls from a local registry: Debian's docker-registry (distribution 2.8) on the
//! benchmark namespace's loopback with the two-layer image of images/build-registry.sh pushed by
//! skopeo. `ferrolet images pull` into an empty root dir beside `skopeo copy docker://... dir:`
//! into an empty directory, alternating, in the same run; then the cold start of a static pod
//! whose image is not on the node (the agent pulls it) beside the same pod with the image present.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::agent::{ms_between, pod_manifest, wait_mark, Agent};

pub struct PullResults {
    pub ferrolet_ms: f64,
    pub skopeo_ms: f64,
    pub cold_start_ms: f64,
    pub warm_start_ms: f64,
    pub image_bytes: u64,
    pub runs: usize,
}

/// A docker-registry on 127.0.0.1 with filesystem storage under `dir`; killed on drop.
struct Registry {
    port: u16,
    child: Child,
}

impl Registry {
    fn start(dir: &Path) -> Result<Registry> {
        std::fs::create_dir_all(dir.join("data"))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        std::fs::write(
            dir.join("config.yml"),
            format!(
                "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.join("data").display()
            ),
        )?;
        let log = std::fs::File::create(dir.join("registry.log"))?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting docker-registry (apt-get install docker-registry)")?;
        let r = Registry { port, child };
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "docker-registry did not listen; see {}",
                    dir.join("registry.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(r)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    crate::procstat::percentile(&v, 50.0)
}

fn dir_bytes(d: &Path) -> u64 {
    std::fs::read_dir(d)
        .map(|rd| rd.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

pub fn run_all(bin: &Path, images: &Path, dir: &Path, cgroup_root: &str, runs: usize) -> Result<PullResults> {
    let archive = images.join("two.oci.tar");
    if !archive.exists() {
        bail!("{} missing (images/build-registry.sh builds it)", archive.display());
    }
    let reg = Registry::start(&dir.join("registry"))?;
    let host = format!("127.0.0.1:{}", reg.port);
    let reference = format!("{host}/demo/two:1");
    run(Command::new("skopeo")
        .args(["copy", "--dest-tls-verify=false"])
        .arg(format!("oci-archive:{}:1", archive.display()))
        .arg(format!("docker://{reference}")))?;

    // 1. Whole-image pulls into empty stores, alternating ferrolet and skopeo.
    let scratch = dir.join("pulls");
    let (mut f, mut s) = (Vec::new(), Vec::new());
    let mut image_bytes = 0;
    for i in 0..runs + 1 {
        let root: PathBuf = scratch.join(format!("ferrolet-{i}"));
        let t = Instant::now();
        run(Command::new(bin)
            .args(["images", "pull", &reference, "--root-dir"])
            .arg(&root))?;
        let fe = t.elapsed().as_secs_f64() * 1000.0;
        let out = scratch.join(format!("skopeo-{i}"));
        let t = Instant::now();
        run(Command::new("skopeo")
            .args(["copy", "--src-tls-verify=false", &format!("docker://{reference}")])
            .arg(format!("dir:{}", out.display())))?;
        let sk = t.elapsed().as_secs_f64() * 1000.0;
        image_bytes = dir_bytes(&out);
        // the first pair warms the page cache and the registry
        if i > 0 {
            f.push(fe);
            s.push(sk);
        }
        let _ = Command::new(bin).args(["reset", "--root-dir"]).arg(&root).output();
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_dir_all(&out);
    }

    // 2. A static pod whose image must be pulled (an empty store, so both layers come from the
    // registry), beside the same pod with the image on the node.
    let a = Agent::start(
        bin,
        &dir.join("ferrolet-pull"),
        cgroup_root,
        "none",
        &dir.join("agent-pull.log"),
    )?;
    // `images prune` removes every image no container uses: the demo image first (so both
    // layers come from the registry), then the pulled image after each round.
    let store = ferrolet_runtime::image::ImageStore::open(a.root.join("images")).map_err(anyhow::Error::from)?;
    let prune = || -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            run(Command::new(bin).args(["images", "prune", "--root-dir"]).arg(&a.root))?;
            if store.list().map_err(anyhow::Error::from)?.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("images still in the store after prune");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    prune()?;
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for i in 0..runs {
        for (kind, v) in [("cold", &mut cold), ("warm", &mut warm)] {
            let name = format!("{kind}{i}");
            let t0 = a.add(&name, &pod_manifest(&name, &a.marks, &reference))?;
            v.push(ms_between(t0, wait_mark(&a.marks, &name, Duration::from_secs(60))?));
            a.remove(&name)?;
            let deadline = Instant::now() + Duration::from_secs(60);
            while a.pod_count() != 0 {
                if Instant::now() > deadline {
                    bail!("pod {name} was not removed");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // the next cold start finds no image (no container uses it any more)
        prune()?;
    }
    a.finish();
    Ok(PullResults {
        ferrolet_ms: p50(f),
        skopeo_ms: p50(s),
        cold_start_ms: p50(cold),
        warm_start_ms: p50(warm),
        image_bytes,
        runs,
    })
}
