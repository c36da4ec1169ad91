//! The pod sandbox without a pause container (docs/sandbox.md): network, IPC and UTS
//! namespaces created once per pod and pinned by bind mounts under the pod's directory, a pid
//! namespace with an init of its own for a pod that shares one, and a /dev/shm tmpfs shared by
//! its containers. Containers join the namespaces by path. The record
//! (`sandbox.json`) also holds the pod's network attachment, which [`super::PodSetup`] adds.
//! After a reboot the pins are gone: the sandbox is recreated and the pod's containers with it,
//! as kubelet does when a sandbox changes. Everything here blocks (mounts, fsync'd writes):
//! call it off the async threads.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ferrolet_fsutil::{read_json_opt, write_json_atomic};
use ferrolet_runtime::namespaces::{IdRange, ProcessRef};
use ferrolet_runtime::Runtime;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::pod;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// Stable id for the network layer (CNI_CONTAINERID).
    pub id: String,
    pub created_at: String,
    pub net: Option<PathBuf>,
    pub ipc: Option<PathBuf>,
    pub uts: Option<PathBuf>,
    pub shm: PathBuf,
    /// The pod's pid namespace (shareProcessNamespace), and the init process holding it.
    #[serde(default)]
    pub pid: Option<PathBuf>,
    #[serde(default)]
    pub init: Option<ProcessRef>,
    /// The pod's user namespace (`hostUsers: false`) and the host ids it maps.
    #[serde(default)]
    pub user: Option<PathBuf>,
    #[serde(default)]
    pub userns: Option<IdRange>,
    pub pod_ips: Vec<String>,
    pub boot_id: String,
    /// The pod network mode the sandbox is attached to ("bridge", "cni"); none when it has no
    /// network of its own or networking is off.
    #[serde(default)]
    pub network: Option<String>,
    /// The pod's SELinux labels, where SELinux is enabled (super::selinux): its containers'
    /// unless they ask otherwise, and its /dev/shm's.
    #[serde(default)]
    pub selinux: Option<super::selinux::SandboxLabels>,
}

pub fn sandbox_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("sandbox")
}

pub fn record_path(pod_dir: &Path) -> PathBuf {
    pod_dir.join("sandbox.json")
}

/// The pod's sandbox record: `Ok(None)` when it has none, an error when it has one that cannot
/// be read (a bad disk, a hostile edit); the caller must not take that for "no sandbox".
pub fn load(pod_dir: &Path) -> ferrolet_fsutil::Result<Option<Sandbox>> {
    read_json_opt(&record_path(pod_dir))
}

fn pinned(p: &Option<PathBuf>) -> bool {
    match p {
        None => true,
        Some(p) => nix::sys::statfs::statfs(p)
            .map(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
            .unwrap_or(false),
    }
}

impl Sandbox {
    /// Still usable: same boot, namespaces still pinned, the pid namespace's init still
    /// running (without it no process can join), attached to the network it needs (`network`:
    /// the current mode when pods get a network).
    pub fn is_live(&self, network: Option<&str>) -> bool {
        let net_ok = self.net.is_none() || self.network.as_deref() == network;
        let init_ok = self.pid.is_none() || self.init.is_some_and(|i| i.alive());
        net_ok
            && init_ok
            && self.boot_id == ferrolet_fsutil::boot_id()
            && pinned(&self.net)
            && pinned(&self.ipc)
            && pinned(&self.uts)
            && pinned(&self.pid)
            && pinned(&self.user)
            && (!self.shm.starts_with("/dev") || self.shm == Path::new("/dev/shm"))
    }
}

/// The namespaces the sandbox of `p` gets of its own (the rest are the node's, and every
/// container has a pid namespace of its own unless `pid`).
pub struct OwnNamespaces {
    pub net: bool,
    pub ipc: bool,
    pub uts: bool,
    /// shareProcessNamespace: one pid namespace for the pod.
    pub pid: bool,
    /// hostUsers: false: a user namespace owning the others.
    pub user: bool,
}

pub fn own_namespaces(p: &Pod) -> OwnNamespaces {
    let host_net = pod::host_network(p);
    let spec = pod::spec(p);
    OwnNamespaces {
        net: !host_net,
        ipc: !spec.host_ipc.unwrap_or(false),
        uts: !host_net,
        pid: spec.share_process_namespace == Some(true) && !spec.host_pid.unwrap_or(false),
        user: spec.host_users == Some(false),
    }
}

/// Where the pod's init is confined (an empty directory) and its cgroup, a leaf of the pod's
/// (on cgroup v2 a cgroup with children may hold no process).
pub fn init_root(pod_dir: &Path) -> PathBuf {
    sandbox_dir(pod_dir).join("init-root")
}

pub const INIT_CGROUP: &str = "pod-init";

/// Clear what an earlier sandbox of this pod left (e.g. before a reboot) and make the directory
/// the namespaces are pinned in.
pub fn prepare_dir(pod_dir: &Path) -> Result<PathBuf> {
    teardown_local(pod_dir)?;
    let dir = sandbox_dir(pod_dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Mount the pod's /dev/shm (the node's with hostIPC) and record the sandbox, without a
/// network yet. Call after the namespaces are pinned in `dir` (and the pod's init, `init`,
/// started).
pub fn finish(
    p: &Pod,
    pod_dir: &Path,
    own: &OwnNamespaces,
    init: Option<ProcessRef>,
    userns: Option<IdRange>,
) -> Result<Sandbox> {
    let selinux = super::selinux::sandbox_labels(p, || selinux_levels(pod_dir.parent().unwrap_or(pod_dir)))
        .map_err(|e| anyhow::anyhow!(e))?;
    let id = format!("{}-{}", pod::uid(p), &ferrolet_fsutil::random_hex(4));
    let shm = mount_shm(pod_dir, own.ipc, selinux.as_ref())?;
    let mut sb = record(id, pod_dir, own, shm, init, userns);
    sb.selinux = selinux;
    // Saved before any network exists, so a crash after this leaves an id to tear down.
    save(pod_dir, &sb)?;
    Ok(sb)
}

/// The sandbox's /dev/shm: a tmpfs of its own under `<dir>/sandbox` with an IPC namespace of
/// its own (`ipc`), else the node's.
pub fn mount_shm(dir: &Path, ipc: bool, selinux: Option<&super::selinux::SandboxLabels>) -> Result<PathBuf> {
    if !ipc {
        return Ok(PathBuf::from("/dev/shm"));
    }
    let shm = sandbox_dir(dir).join("shm");
    std::fs::create_dir_all(&shm)?;
    let context = selinux.map(|l| format!(",context=\"{}\"", l.mount)).unwrap_or_default();
    nix::mount::mount(
        Some("shm"),
        &shm,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV | nix::mount::MsFlags::MS_NOEXEC,
        Some(format!("mode=1777,size=65536k{context}").as_str()),
    )
    .context("mounting the pod's /dev/shm")?;
    Ok(shm)
}

/// The record of a sandbox pinned under `<dir>/sandbox`, without a network yet.
pub fn record(
    id: String,
    dir: &Path,
    own: &OwnNamespaces,
    shm: PathBuf,
    init: Option<ProcessRef>,
    userns: Option<IdRange>,
) -> Sandbox {
    let dir = sandbox_dir(dir);
    Sandbox {
        id,
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        net: own.net.then(|| dir.join("net")),
        ipc: own.ipc.then(|| dir.join("ipc")),
        uts: own.uts.then(|| dir.join("uts")),
        shm,
        pid: own.pid.then(|| dir.join("pid")),
        init,
        user: userns.map(|_| super::userns::pin_path(&dir)),
        userns,
        pod_ips: Vec::new(),
        boot_id: ferrolet_fsutil::boot_id(),
        network: None,
        selinux: None,
    }
}

/// Ids of the sandboxes recorded under `pods_dir` (every pod directory's `sandbox.json`).
pub fn recorded_ids(pods_dir: &Path) -> Vec<String> {
    std::fs::read_dir(pods_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| load(&e.path()).ok().flatten())
        .map(|s| s.id)
        .collect()
}

/// The SELinux levels the sandboxes recorded under `pods_dir` hold (a new pod's must differ).
pub fn selinux_levels(pods_dir: &Path) -> std::collections::HashSet<String> {
    std::fs::read_dir(pods_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| load(&e.path()).ok().flatten())
        .filter_map(|s| s.selinux.and_then(|l| l.level()))
        .collect()
}

pub fn save(pod_dir: &Path, sb: &Sandbox) -> Result<()> {
    Ok(write_json_atomic(&record_path(pod_dir), sb)?)
}

/// [`save`] without waiting for the disk, for a record holding nothing that outlives the boot
/// (no user namespace ids): after a power cut its pins are gone whatever it says, and a lost
/// record only leaves a network no record names, which the network's collection releases.
pub fn save_unsynced(pod_dir: &Path, sb: &Sandbox) -> Result<()> {
    debug_assert!(sb.userns.is_none());
    Ok(ferrolet_fsutil::write_json_atomic_unsynced(&record_path(pod_dir), sb)?)
}

/// Stop the pod's init (which ends whatever is left in its pid namespace), unpin namespaces,
/// unmount /dev/shm, forget the record. Network teardown is the caller's.
pub fn teardown_local(pod_dir: &Path) -> Result<()> {
    let dir = sandbox_dir(pod_dir);
    // An unreadable record has no init to tell of: the pod cgroup's removal kills it then.
    if let Some(init) = load(pod_dir).ok().flatten().and_then(|s| s.init) {
        init.kill(std::time::Duration::from_secs(5))
            .with_context(|| format!("stopping the pod's init (pid {})", init.pid))?;
    }
    if dir.exists() {
        Runtime::unpin_namespaces(&dir)?;
        let shm = dir.join("shm");
        if shm.exists() {
            ferrolet_runtime::rootfs::unmount(&shm).context("unmounting pod /dev/shm")?;
        }
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(record_path(pod_dir));
    Ok(())
}
