//! What the runtime's container test binaries share: the runtime under a temp root with its
//! zygote isolated as the agent's, a cgroup nested in the test process's own, the demo image,
//! and the helpers that create, run and read containers. Everything is removed at the end,
//! pass or fail ([`finish`]).
#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use ferrolet_runtime::cgroups::NestedRoot;
use ferrolet_runtime::config::LogConfig;
use ferrolet_runtime::crilog::{self, Stream};
use ferrolet_runtime::{ContainerConfig, Runtime, ZygoteHandle};
use libtest_mimic::{Arguments, Failed, Trial};

pub struct Env {
    pub rt: Runtime,
    pub root: PathBuf,
    pub cgroup: NestedRoot,
    pub images: PathBuf,
    /// A tmpfs mounted outside the root before the zygote isolated: its copy must not hold it.
    pub premount: PathBuf,
}

static ENV: OnceLock<Env> = OnceLock::new();

pub fn env() -> &'static Env {
    ENV.get().expect("env initialised in main")
}

pub const IMAGE: &str = "busybox:1.35";

/// Everything after the zygote fork (which `main` does first, single-threaded): the
/// arguments, a root named after `name`, isolation, the nested cgroup, the image.
pub fn setup(name: &str, zygote: ZygoteHandle) -> Arguments {
    // Arguments first: a bad one must not leave a root dir or cgroups behind.
    let args = Arguments::from_args();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("these tests run real containers and need root");
        std::process::exit(1);
    }
    let images = ensure_images();
    let pid = std::process::id();
    let root = std::env::temp_dir().join(format!("ferrolet-{name}-{pid}"));
    let rt = Runtime::new(&root, zygote).expect("runtime");
    let premount = std::env::temp_dir().join(format!("ferrolet-{name}-premount-{pid}"));
    std::fs::create_dir_all(&premount).expect("premount dir");
    mount_tmpfs(&premount).expect("premount tmpfs");
    // As the agent does: every container here is built in a mount namespace of its own.
    block(rt.isolate_mounts()).expect("isolating the zygote's mounts");
    let cgroup = NestedRoot::create(rt.cgroups(), &format!("ferrolet-{name}-{pid}")).expect("nested cgroup root");
    rt.images()
        .import(&images.join("busybox.oci.tar"))
        .expect("import busybox");
    let _ = ENV.set(Env {
        rt,
        root,
        cgroup,
        images,
        premount,
    });
    args
}

/// Run the tests, remove what they made, exit with their verdict.
pub fn finish(args: &Arguments, tests: Vec<Trial>) -> ! {
    let conclusion = libtest_mimic::run(args, tests);
    teardown();
    conclusion.exit();
}

pub fn trial(name: &'static str, f: fn() -> Result<()>) -> Trial {
    Trial::test(name, move || f().map_err(|e| Failed::from(format!("{e:#}"))))
}

pub fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio")
        .block_on(f)
}

pub fn teardown() {
    let e = env();
    block(async {
        for c in e.rt.list().unwrap_or_default() {
            if let Err(err) = e.rt.delete(c.id()).await {
                eprintln!("teardown: deleting {}: {}", c.id(), ferrolet_fsutil::chain(&err));
            }
        }
    });
    if let Err(err) = e.cgroup.cleanup() {
        eprintln!("teardown: cgroup: {err}");
    }
    if let Err(err) = ferrolet_runtime::mount_ns::release_root(&e.root) {
        eprintln!("teardown: the root's bind mount: {err}");
    }
    if let Err(err) = nix::mount::umount(&e.premount) {
        eprintln!("teardown: {}: {err}", e.premount.display());
    }
    let _ = std::fs::remove_dir(&e.premount);
    let _ = std::fs::remove_dir_all(&e.root);
}

/// The demo image archives, built by images/build-busybox.sh if missing.
pub fn ensure_images() -> PathBuf {
    let dir = std::env::var_os("FERROLET_IMAGES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/out"));
    if !dir.join("busybox.oci.tar").exists() || !dir.join("busybox.docker.tar").exists() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/build-busybox.sh");
        let st = Command::new(&script)
            .arg(&dir)
            .status()
            .expect("run images/build-busybox.sh");
        assert!(st.success(), "images/build-busybox.sh failed");
    }
    dir
}

pub fn config(name: &str, command: &[&str]) -> ContainerConfig {
    let e = env();
    ContainerConfig {
        name: name.to_string(),
        image: IMAGE.to_string(),
        command: command.iter().map(|s| s.to_string()).collect(),
        cgroup_parent: e.cgroup.path().to_string(),
        log: LogConfig {
            path: e
                .root
                .join("logs")
                .join(format!("{name}-{}.log", ferrolet_fsutil::random_hex(4))),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Output of a finished container: (stdout lines, stderr lines).
pub fn output(log: &Path) -> Result<(Vec<String>, Vec<String>)> {
    let data = std::fs::read(log).with_context(|| format!("reading {}", log.display()))?;
    let mut out = (Vec::new(), Vec::new());
    for r in crilog::read_records(&data) {
        let s = String::from_utf8_lossy(&r.message).into_owned();
        match r.stream {
            Stream::Stdout => out.0.push(s),
            Stream::Stderr => out.1.push(s),
        }
    }
    Ok(out)
}

/// Create, start, wait and delete; the container is deleted whatever happens.
pub async fn run(cfg: &ContainerConfig) -> Result<(ferrolet_runtime::ExitRecord, Vec<String>, Vec<String>)> {
    run_built(cfg, None).await
}

/// [`run`], checking first, when `private` says which, that the container was built in a
/// mount namespace of its own (monitor.json's buildMounts) or in the host's.
pub async fn run_built(
    cfg: &ContainerConfig,
    private: Option<bool>,
) -> Result<(ferrolet_runtime::ExitRecord, Vec<String>, Vec<String>)> {
    let rt = &env().rt;
    let info = rt.create(cfg).await?;
    let id = info.id().to_string();
    let res = async {
        if let Some(private) = private {
            let built = rt.inspect(&id)?.monitor.and_then(|m| m.build_mounts);
            ensure!(
                built.is_some() == private,
                "built from {built:?} mounts; wanted a namespace of its own: {private}"
            );
        }
        rt.start(&id).await?;
        let exit = tokio::time::timeout(Duration::from_secs(30), rt.wait(&id))
            .await
            .map_err(|_| anyhow!("container did not exit in 30s"))??;
        let (o, e) = output(&cfg.log.path)?;
        Ok::<_, anyhow::Error>((exit, o, e))
    }
    .await;
    rt.delete(&id).await?;
    res
}

pub fn mount_tmpfs(at: &Path) -> nix::Result<()> {
    nix::mount::mount(
        Some("tmpfs"),
        at,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
}

/// A read-only, private bind mount of a host path.
pub fn read_only_bind(destination: &str, source: &Path) -> ferrolet_runtime::config::Mount {
    ferrolet_runtime::config::Mount {
        destination: destination.into(),
        source: source.to_path_buf(),
        kind: ferrolet_runtime::config::MountKind::Bind,
        readonly: true,
        propagation: ferrolet_runtime::config::Propagation::Private,
        options: Vec::new(),
        idmap: false,
    }
}

/// One entry of a crafted image layer.
pub enum LayerEntry {
    File(String, Vec<u8>),
    Symlink(String, String),
    Dir(String),
}

/// Write an OCI image layout at `dir` named `name` with one uncompressed layer of `entries`
/// and `User` set to `user`, as a hostile image author would make it (nothing checked on the
/// way).
pub fn write_oci_image(dir: &Path, name: &str, entries: &[LayerEntry], user: &str) -> Result<()> {
    use ferrolet_runtime::digest::Digest;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("blobs/sha256"))?;
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1);
        match e {
            LayerEntry::File(path, data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o755);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, &data[..])?;
            }
            LayerEntry::Symlink(path, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, path, target)?;
            }
            LayerEntry::Dir(path) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, path, std::io::empty())?;
            }
        }
    }
    let layer = b.into_inner()?;
    let put = |data: &[u8]| -> Result<Digest> {
        let d = Digest::of(data);
        std::fs::write(dir.join("blobs/sha256").join(d.hex()), data)?;
        Ok(d)
    };
    let layer_d = put(&layer)?;
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{"Cmd":["sh"],"User":"{user}"}},"rootfs":{{"type":"layers","diff_ids":["{layer_d}"]}}}}"#
    );
    let config_d = put(config.as_bytes())?;
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_d}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{layer_d}","size":{}}}]}}"#,
        config.len(),
        layer.len()
    );
    let manifest_d = put(manifest.as_bytes())?;
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)?;
    std::fs::write(
        dir.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{manifest_d}","size":{},"annotations":{{"io.containerd.image.name":"{name}"}}}}]}}"#,
            manifest.len()
        ),
    )?;
    Ok(())
}
