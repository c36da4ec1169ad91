//! A ferrolet agent under benchmark: started from the release binary with its own root dir,
//! manifest dir and nested cgroup root; pods are written as manifests whose container touches
//! a file first thing, so "running" is measured from inside the container.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use nix::sched::CloneFlags;

use crate::procstat;

/// How to start an agent: [`Agent::launch`].
#[derive(Clone, Copy)]
pub struct Launch<'a> {
    pub bin: &'a Path,
    /// Its root, manifests, marks and config go here.
    pub dir: &'a Path,
    pub cgroup_root: &'a str,
    /// `--network`: none or bridge.
    pub network: &'a str,
    pub log: &'a Path,
    /// More `ferrolet run` flags.
    pub extra: &'a [String],
    /// Its node name (`--hostname-override`).
    pub node: &'a str,
    /// A network namespace to run in instead of the benchmark's.
    pub netns: Option<BorrowedFd<'a>>,
}

pub struct Agent {
    pub bin: PathBuf,
    pub root: PathBuf,
    pub manifests: PathBuf,
    pub marks: PathBuf,
    child: Option<Child>,
}

impl Agent {
    /// Wait until the agent's sandbox pool (`--sandbox-pool`) holds `n` entries, each with
    /// its record written, and the last one's network a moment to finish.
    pub fn wait_pool_full(&self, n: usize, timeout: Duration) -> Result<()> {
        let dir = self.root.join("sandbox-pool");
        let full = || {
            std::fs::read_dir(&dir)
                .map(|d| d.flatten().filter(|e| e.path().join("sandbox.json").exists()).count())
                .unwrap_or(0)
                >= n
        };
        let deadline = Instant::now() + timeout;
        while !full() {
            if Instant::now() > deadline {
                bail!("the sandbox pool in {} did not fill to {n}", dir.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(200));
        Ok(())
    }

    pub fn start(bin: &Path, dir: &Path, cgroup_root: &str, network: &str, log: &Path) -> Result<Agent> {
        Agent::start_with(bin, dir, cgroup_root, network, log, &[])
    }

    /// [`Agent::start`] with more `ferrolet run` flags.
    pub fn start_with(
        bin: &Path,
        dir: &Path,
        cgroup_root: &str,
        network: &str,
        log: &Path,
        extra: &[String],
    ) -> Result<Agent> {
        Agent::launch(&Launch {
            bin,
            dir,
            cgroup_root,
            network,
            log,
            extra,
            node: "bench",
            netns: None,
        })
    }

    /// Start an agent as `how` says; returns once it answers /healthz.
    pub fn launch(how: &Launch) -> Result<Agent> {
        let (bin, dir, log) = (how.bin, how.dir, how.log);
        let root = dir.join("root");
        let manifests = dir.join("manifests");
        let marks = dir.join("marks");
        for d in [&root, &manifests, &marks] {
            std::fs::create_dir_all(d)?;
        }
        let config = dir.join("kubelet.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nreadOnlyPort: 0\nmaxPods: 500\npodLogsDir: {}\nfileCheckFrequency: 20s\n\
                 address: 127.0.0.1\nport: {}\nhealthzPort: 0\n",
                dir.join("logs").display(),
                // The bench runs in the host's namespace: the kubelet port stays on loopback,
                // on a port nothing else holds.
                std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()
            ),
        )?;
        let logf = std::fs::File::create(log)?;
        let mut cmd = Command::new(bin);
        if let Some(fd) = how.netns {
            let fd = fd.as_raw_fd();
            // SAFETY: setns only, between fork and exec; the namespace's fd outlives the spawn.
            unsafe {
                cmd.pre_exec(move || {
                    nix::sched::setns(BorrowedFd::borrow_raw(fd), CloneFlags::CLONE_NEWNET)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let child = cmd
            .args(["run", "--config"])
            .arg(&config)
            .arg("--pod-manifest-path")
            .arg(&manifests)
            .arg("--root-dir")
            .arg(&root)
            .arg("--cgroup-root")
            .arg(how.cgroup_root)
            .arg("--network")
            .arg(how.network)
            .arg("--hostname-override")
            .arg(how.node)
            .args(how.extra)
            // The start phases (docs/start-path.md) go to the log for the per-phase table.
            .env(
                "RUST_LOG",
                "ferrolet=warn,ferrolet_runtime=warn,ferrolet::start_phase=debug",
            )
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()
            .context("starting ferrolet")?;
        let a = Agent {
            bin: bin.to_path_buf(),
            root,
            manifests,
            marks,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while a.get("/healthz").is_err() {
            if Instant::now() > deadline {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                bail!(
                    "the agent did not come up; its log ({}) ends:\n{}",
                    log.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(a)
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// GET `path` over the CLI socket; the body.
    pub fn get(&self, path: &str) -> Result<Vec<u8>> {
        let mut s = UnixStream::connect(self.root.join("ferrolet.sock"))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: f\r\n\r\n")?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)?;
        let split = buf.windows(4).position(|w| w == b"\r\n\r\n").context("bad response")?;
        Ok(buf[split + 4..].to_vec())
    }

    pub fn pod_count(&self) -> usize {
        self.get("/pods")
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["items"].as_array().map(|a| a.len()))
            .unwrap_or(usize::MAX)
    }

    /// The pod IPs the agent reports.
    pub fn pod_ips(&self) -> Vec<String> {
        self.get("/pods")
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["items"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p["status"]["podIP"].as_str().map(str::to_string))
            .collect()
    }

    /// Write the manifest of pod `name` (renamed into place); returns when it landed.
    pub fn add(&self, name: &str, manifest: &str) -> Result<SystemTime> {
        let tmp = self.manifests.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, manifest)?;
        let t0 = SystemTime::now();
        std::fs::rename(&tmp, self.manifests.join(format!("{name}.yaml")))?;
        Ok(t0)
    }

    pub fn remove(&self, name: &str) -> Result<()> {
        std::fs::remove_file(self.manifests.join(format!("{name}.yaml")))?;
        Ok(())
    }

    /// The agent, its zygote and every container monitor.
    pub fn processes(&self) -> Vec<i32> {
        let mut v = vec![self.pid()];
        v.extend(procstat::children(self.pid()).into_iter().filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "ferrolet-zygote")
        }));
        v.extend(procstat::monitors(&self.root));
        v
    }

    /// Stop the agent and remove everything it ran.
    pub fn finish(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::SIGTERM);
            let _ = c.wait();
        }
        let _ = Command::new(&self.bin)
            .args(["reset", "--root-dir"])
            .arg(&self.root)
            .output();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            let _ = Command::new(&self.bin)
                .args(["reset", "--root-dir"])
                .arg(&self.root)
                .output();
        }
    }
}

/// A pod whose container marks its start by creating `<marks>/<name>`, then sleeps.
pub fn pod_manifest(name: &str, marks: &Path, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {image}\n    command: [sh, -c, \"touch /marks/{name}; exec sleep 100000\"]\n    volumeMounts: [{{name: marks, mountPath: /marks}}]\n  volumes: [{{name: marks, hostPath: {{path: {}}}}}]\n",
        marks.display()
    )
}

/// When the mark of `name` appeared (its mtime), waiting up to `timeout`.
pub fn wait_mark(marks: &Path, name: &str, timeout: Duration) -> Result<SystemTime> {
    let p = marks.join(name);
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(m) = std::fs::metadata(&p) {
            return Ok(m.modified()?);
        }
        if Instant::now() > deadline {
            bail!("pod {name} did not start within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub fn ms_between(a: SystemTime, b: SystemTime) -> f64 {
    match b.duration_since(a) {
        Ok(d) => d.as_secs_f64() * 1000.0,
        Err(e) => -(e.duration().as_secs_f64() * 1000.0),
    }
}
