//! The pod sandbox without a pause container (DESIGN.md §3): network, IPC and UTS namespaces
//! created once per pod and pinned by bind mounts under the pod's directory, a /dev/shm tmpfs
//! shared by its containers, and (with pod networking) the pod's IPs. Containers join the
//! namespaces by path. After a reboot the pins are gone: the sandbox is recreated and the pod's
//! containers with it, as kubelet does when a sandbox changes.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ferrolet_fsutil::{read_json_opt, write_json_atomic};
use ferrolet_runtime::Runtime;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::network::PodNetwork;
use crate::pod;

const NSFS_MAGIC: i64 = 0x6e73_6673;

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
    pub pod_ips: Vec<String>,
    pub boot_id: String,
    /// The pod network mode the sandbox is attached to ("bridge", "cni"); none when it has no
    /// network of its own or networking is off.
    #[serde(default)]
    pub network: Option<String>,
}

pub fn sandbox_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("sandbox")
}

fn record_path(pod_dir: &Path) -> PathBuf {
    pod_dir.join("sandbox.json")
}

pub fn load(pod_dir: &Path) -> Option<Sandbox> {
    read_json_opt(&record_path(pod_dir)).ok().flatten()
}

fn pinned(p: &Option<PathBuf>) -> bool {
    match p {
        None => true,
        Some(p) => nix::sys::statfs::statfs(p)
            .map(|s| s.filesystem_type().0 == NSFS_MAGIC)
            .unwrap_or(false),
    }
}

impl Sandbox {
    /// Still usable: same boot, namespaces still pinned, attached to the network it needs
    /// (`network`: the current mode when pods get a network).
    pub fn is_live(&self, network: Option<&str>) -> bool {
        let net_ok = self.net.is_none() || self.network.as_deref() == network;
        net_ok
            && self.boot_id == ferrolet_fsutil::boot_id()
            && pinned(&self.net)
            && pinned(&self.ipc)
            && pinned(&self.uts)
            && (!self.shm.starts_with("/dev") || self.shm == Path::new("/dev/shm"))
    }
}

/// Create the sandbox for `p` under `pod_dir` and attach it to the pod network. The record is
/// saved before the network is set up, so a crash in between leaves an id to tear down.
pub async fn create(rt: &Runtime, net: &PodNetwork, p: &Pod, pod_dir: &Path) -> Result<Sandbox> {
    let dir = sandbox_dir(pod_dir);
    // Leftovers of an earlier sandbox (e.g. before a reboot).
    teardown_local(pod_dir)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let spec = pod::spec(p);
    let host_net = pod::host_network(p);
    let host_ipc = spec.host_ipc.unwrap_or(false);
    let own_net = !host_net;
    let own_ipc = !host_ipc;
    let own_uts = !host_net;
    if own_net || own_ipc || own_uts {
        let hostname = super::dns::hostname(p);
        rt.pin_namespaces(&dir, Some(&hostname), own_net, own_ipc, own_uts)
            .await
            .context("creating pod namespaces")?;
    }
    let shm = if host_ipc {
        PathBuf::from("/dev/shm")
    } else {
        let shm = dir.join("shm");
        std::fs::create_dir_all(&shm)?;
        nix::mount::mount(
            Some("shm"),
            &shm,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV | nix::mount::MsFlags::MS_NOEXEC,
            Some("mode=1777,size=65536k"),
        )
        .context("mounting the pod's /dev/shm")?;
        shm
    };
    let mut sb = Sandbox {
        id: format!("{}-{}", pod::uid(p), &ferrolet_fsutil::random_hex(4)),
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        net: own_net.then(|| dir.join("net")),
        ipc: own_ipc.then(|| dir.join("ipc")),
        uts: own_uts.then(|| dir.join("uts")),
        shm,
        pod_ips: Vec::new(),
        boot_id: ferrolet_fsutil::boot_id(),
        network: None,
    };
    save(pod_dir, &sb)?;
    if let (Some(netns), true) = (&sb.net, net.enabled()) {
        match net.attach(&sb.id, netns, p).await {
            Ok(ips) => {
                sb.pod_ips = ips;
                sb.network = Some(net.settings().mode.clone());
                save(pod_dir, &sb)?;
            }
            Err(e) => {
                // Setup leaves nothing behind on error; the namespaces go too, and the next
                // sync makes a new sandbox.
                teardown_local(pod_dir)?;
                return Err(e.context("Failed to create pod sandbox"));
            }
        }
    }
    Ok(sb)
}

pub fn save(pod_dir: &Path, sb: &Sandbox) -> Result<()> {
    write_json_atomic(&record_path(pod_dir), sb).map_err(|e| anyhow::anyhow!("{}", ferrolet_fsutil::chain(&e)))
}

/// Unpin namespaces, unmount /dev/shm, forget the record. Network teardown is the caller's.
pub fn teardown_local(pod_dir: &Path) -> Result<()> {
    let dir = sandbox_dir(pod_dir);
    if dir.exists() {
        Runtime::unpin_namespaces(&dir).map_err(|e| anyhow::anyhow!("{}", ferrolet_fsutil::chain(&e)))?;
        let shm = dir.join("shm");
        if shm.exists() {
            ferrolet_runtime::rootfs::unmount(&shm).context("unmounting pod /dev/shm")?;
        }
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(record_path(pod_dir));
    Ok(())
}
