//! The sandbox pool (docs/sandbox.md, "The sandbox pool"): pod sandboxes built before any pod
//! asks for one (network, IPC and UTS namespaces pinned, /dev/shm mounted, the built-in
//! bridge's veth and IP attached), so that a new pod whose settings fit only names its
//! sandbox and moves it into its own directory.
//!
//! An entry lives in `<root>/sandbox-pool/<id>/` laid out as a pod's directory
//! (`sandbox.json`, `sandbox/{net,ipc,uts,shm}`), so the sandbox code builds and tears it down
//! as it does a pod's. What is here: which entries are ready, when to build more, handing one
//! to a pod, and what a crash left. The blocking parts (renames, unmounts, fsync'd records) run
//! on the blocking pool.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::sandbox::{self, Sandbox};
use super::{dns, network, selinux, PodSetup};
use crate::pod;
use crate::tasks::blocking;

/// Entries are built only after this long without a pod's sandbox being made or taken: a burst
/// of pods takes what is ready and builds the rest itself, and the pool fills again after. Long
/// enough that a refill (a zygote fork, namespaces, a veth) does not land between the starts
/// of pods written one after another.
pub const QUIET: Duration = Duration::from_millis(500);

/// What an entry pins: the namespaces of a pod that fits ([`PodSetup::fits_pool`]).
const POOLED: sandbox::OwnNamespaces = sandbox::OwnNamespaces {
    net: true,
    ipc: true,
    uts: true,
    pid: false,
    user: false,
};

/// A ready entry: its directory and its record.
#[derive(Debug, Clone)]
pub struct Entry {
    pub dir: PathBuf,
    pub sandbox: Sandbox,
}

pub struct SandboxPool {
    dir: PathBuf,
    size: usize,
    ready: Mutex<Vec<Entry>>,
    last_use: Mutex<Instant>,
    /// Wakes the refill loop when an entry is taken.
    wake: tokio::sync::Notify,
}

impl SandboxPool {
    pub fn new(dir: PathBuf, size: usize) -> SandboxPool {
        SandboxPool {
            dir,
            size,
            ready: Mutex::new(Vec::new()),
            last_use: Mutex::new(Instant::now()),
            wake: tokio::sync::Notify::new(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn ready(&self) -> usize {
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// A pod's sandbox was just made or taken: refills wait for [`QUIET`] after it.
    pub fn used(&self) {
        *self.last_use.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// How long the refill should still wait before building.
    pub fn wait_before_building(&self) -> Duration {
        QUIET.saturating_sub(self.last_use.lock().unwrap_or_else(|e| e.into_inner()).elapsed())
    }

    /// The oldest ready entry, if any; the refill loop is woken to replace it.
    pub fn take(&self) -> Option<Entry> {
        let mut ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        let e = (!ready.is_empty()).then(|| ready.remove(0));
        drop(ready);
        self.used();
        self.wake.notify_one();
        e
    }

    pub fn put(&self, e: Entry) {
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).push(e);
    }

    /// A new entry's directory and sandbox id (`pool-<16 hex digits>`).
    pub fn new_entry_dir(&self) -> (String, PathBuf) {
        let id = format!("pool-{}", ferrolet_fsutil::random_hex(8));
        let dir = self.dir.join(&id);
        (id, dir)
    }
}

/// The entries in the pool's directory `dir`, ready, being built or left by an earlier run.
pub fn entries_on_disk(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("pool-")))
        .collect()
}

/// [`forget`] every entry in the pool's directory `dir`, each tried whatever the others do;
/// returns how many went and what failed, by entry. The entries' networks are the caller's
/// (at start the network's collection, at reset the removal of every network).
pub fn forget_all(dir: &Path) -> (usize, Vec<String>) {
    let (mut gone, mut failed) = (0, Vec::new());
    for entry in entries_on_disk(dir) {
        match forget(&entry) {
            Ok(()) => gone += 1,
            Err(e) => failed.push(format!("pooled sandbox {}: {e:#}", entry.display())),
        }
    }
    (gone, failed)
}

/// The pool as pod setup uses it: taking an entry for a pod, building, refilling, draining.
impl PodSetup {
    /// Whether `p` may take a sandbox from the pool: network, IPC and UTS namespaces of its
    /// own and nothing else, no hostPorts or bandwidth limits (set up per pod), no SELinux
    /// labels (its /dev/shm carries the pod's), and the built-in bridge or no pod network
    /// (CNI plugins are told the pod at ADD).
    fn fits_pool(&self, p: &Pod) -> bool {
        let own = sandbox::own_namespaces(p);
        own.net
            && own.ipc
            && own.uts
            && !own.pid
            && !own.user
            && matches!(self.network.settings().mode.as_str(), "bridge" | "none")
            && network::port_mappings(p).is_ok_and(|m| m.is_empty())
            && network::bandwidth(p).is_ok_and(|b| b.is_none())
            && !selinux::enabled()
    }

    /// A ready pool entry made the pod's: named with the pod's hostname, then moved into the
    /// pod's directory ([`move_into`]). `None` (and the pod builds its own) when the pod
    /// does not fit, the pool is empty, or the entry cannot be used (it is released).
    pub(super) async fn take_pooled(&self, p: &Arc<Pod>, pod_dir: &Path) -> Option<Sandbox> {
        let pool = self.pool.as_ref()?;
        if !self.fits_pool(p) {
            return None;
        }
        let entry = pool.take()?;
        let taken = async {
            if !self.sandbox_usable(&entry.sandbox) {
                anyhow::bail!("it is not live any more");
            }
            let uts = entry.sandbox.uts.clone().context("it has no UTS namespace")?;
            self.rt
                .set_hostname(&uts, &dns::uts_hostname_or_short(p, &self.cfg.cluster_domain))
                .await?;
            failpoint("pool-after-hostname").await;
            let (entry, pod_dir) = (entry.clone(), pod_dir.to_path_buf());
            blocking(move || {
                sandbox::prepare_dir(&pod_dir)?;
                move_into(&entry, &pod_dir)
            })
            .await
        }
        .await;
        match taken {
            Ok(sb) => {
                info!(pod = %pod::full_name(p), sandbox = %sb.id, ips = ?sb.pod_ips, "pod sandbox taken from the pool");
                crate::metrics::global().pod_sandbox_started(true);
                crate::metrics::start_phase(pod::name(p), "sandbox");
                if sb.network.is_some() {
                    crate::metrics::start_phase(pod::name(p), "network");
                }
                Some(sb)
            }
            Err(e) => {
                warn!(pod = %pod::full_name(p), sandbox = %entry.sandbox.id, error = %format!("{e:#}"), "a pooled sandbox could not be used; releasing it");
                self.release_pool_entry(&entry.dir, Some(&entry.sandbox)).await;
                None
            }
        }
    }

    /// Build one pool entry: namespaces pinned without a hostname, /dev/shm, the record, then
    /// the network (the built-in bridge's veth and IP). A failure leaves nothing behind.
    async fn build_pool_entry(&self, pool: &SandboxPool) -> Result<Entry> {
        let (id, dir) = pool.new_entry_dir();
        let built = async {
            let sdir = {
                let dir = dir.clone();
                blocking(move || sandbox::prepare_dir(&dir)).await?
            };
            let pins = ferrolet_runtime::namespaces::Pins {
                hostname: None,
                net: true,
                ipc: true,
                uts: true,
                pid: None,
                user: None,
            };
            self.rt
                .pin_namespaces(&sdir, &pins)
                .await
                .context("creating namespaces")?;
            let mut sb = {
                let (dir, id) = (dir.clone(), id.clone());
                blocking(move || {
                    let shm = sandbox::mount_shm(&dir, true, None)?;
                    let sb = sandbox::record(id, &dir, &POOLED, shm, None, None);
                    sandbox::save_unsynced(&dir, &sb)?;
                    Ok(sb)
                })
                .await?
            };
            if let (Some(netns), true) = (sb.net.clone(), self.network.enabled()) {
                sb.pod_ips = self.network.attach_pooled(&sb.id, &netns).await?;
                sb.network = Some(self.network.settings().mode.clone());
                let (dir, rec) = (dir.clone(), sb.clone());
                blocking(move || sandbox::save_unsynced(&dir, &rec)).await?;
            }
            Ok(sb)
        }
        .await;
        match built {
            Ok(sandbox) => Ok(Entry { dir, sandbox }),
            Err(e) => {
                let sb = sandbox::load(&dir).ok().flatten();
                self.release_pool_entry(&dir, sb.as_ref()).await;
                Err(e)
            }
        }
    }

    /// Release a pool entry that no pod has claimed: its network, its namespaces and /dev/shm,
    /// its directory. What fails is logged; the entry's record stays for the next start.
    async fn release_pool_entry(&self, dir: &Path, sb: Option<&Sandbox>) {
        if let Some(sb) = sb {
            if let Err(e) = self.release_network(sb).await {
                warn!(sandbox = %sb.id, error = %format!("{e:#}"), "releasing the network of a pooled sandbox");
                return;
            }
        }
        let dir2 = dir.to_path_buf();
        if let Err(e) = blocking(move || forget(&dir2)).await {
            warn!(dir = %dir.display(), error = %format!("{e:#}"), "removing a pooled sandbox");
        }
    }

    /// At start, before the network is built and before any pod worker: what an earlier run
    /// left in the pool goes. Only the namespaces, /dev/shm and records go here; the network's
    /// collection that follows releases the networks no record names any more. An entry a
    /// pod's record names (the agent stopped while handing it over) keeps its network for
    /// the pod, which replaces a sandbox that is not live. Entries are never kept across a
    /// restart: one may carry a hostname a pod gave it. This runs with the pool off too: a
    /// run with it on may have left entries.
    pub async fn drain_pool(&self) {
        let dir = super::pool_dir(&self.cfg.root_dir);
        let (gone, failed) = match blocking(move || Ok(forget_all(&dir))).await {
            Ok(r) => r,
            Err(e) => (0, vec![format!("{e:#}")]),
        };
        if gone > 0 {
            info!(entries = gone, "removed the sandbox pool an earlier run left");
        }
        for e in failed {
            warn!(error = %e, "removing the sandbox pool an earlier run left");
        }
    }

    /// The pool's refill, for as long as the agent runs: after [`QUIET`] without a pod's
    /// sandbox made or taken, entries are built one at a time until the pool is full. A
    /// failure (a network not ready) is logged once and tried again after a pause.
    pub async fn refill_pool(&self) {
        let Some(pool) = &self.pool else {
            return;
        };
        let mut failing = false;
        loop {
            if pool.ready() >= pool.size() {
                pool.wake.notified().await;
                continue;
            }
            let wait = pool.wait_before_building();
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
                continue;
            }
            match self.build_pool_entry(pool).await {
                Ok(e) => {
                    if failing {
                        info!("building pooled sandboxes again");
                    }
                    failing = false;
                    pool.put(e);
                }
                Err(e) => {
                    if !failing {
                        warn!(error = %format!("{e:#}"), "building a pooled sandbox; trying again later");
                    }
                    failing = true;
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                }
            }
        }
    }
}

/// Move a ready entry's sandbox into `pod_dir`, as the pod's: its record is written first
/// (claiming the network and namespaces: a crash after this leaves a pod sandbox that is not
/// live and is replaced, its network released by id), then the pinned directory is renamed in
/// (its mounts move with it), then the entry is forgotten. `pod_dir/sandbox` must be an empty
/// directory ([`sandbox::prepare_dir`]). Returns the pod's record.
pub fn move_into(entry: &Entry, pod_dir: &Path) -> Result<Sandbox> {
    let shm = sandbox::sandbox_dir(pod_dir).join("shm");
    let mut sb = sandbox::record(entry.sandbox.id.clone(), pod_dir, &POOLED, shm, None, None);
    sb.pod_ips = entry.sandbox.pod_ips.clone();
    sb.network = entry.sandbox.network.clone();
    sandbox::save_unsynced(pod_dir, &sb)?;
    failpoint_blocking("pool-after-claim");
    let (from, to) = (sandbox::sandbox_dir(&entry.dir), sandbox::sandbox_dir(pod_dir));
    if let Err(e) = std::fs::rename(&from, &to) {
        // Not the pod's after all: the entry is released by the caller.
        let _ = std::fs::remove_file(sandbox::record_path(pod_dir));
        return Err(e).with_context(|| format!("moving {} to {}", from.display(), to.display()));
    }
    // The sandbox is the pod's now: what is left of the entry goes at the next start if not now.
    if let Err(e) = forget(&entry.dir) {
        warn!(dir = %entry.dir.display(), error = %format!("{e:#}"), "removing a taken pool entry");
    }
    Ok(sb)
}

/// Crash-test hook, as the network's (`FERROLET_NETPLUG_FAILPOINT`): when
/// `FERROLET_POOL_FAILPOINT` names the point, the hand-over stops there for good, so that a
/// test can SIGKILL the agent at a known step. Points: `pool-after-hostname` (the entry is
/// named for the pod, no record claims it), `pool-after-claim` (the pod's record names it, the
/// pins are still in the pool). Unset (always, in production) it costs one env lookup.
pub async fn failpoint(name: &str) {
    if reached(name) {
        loop {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }
}

fn failpoint_blocking(name: &str) {
    if reached(name) {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

fn reached(name: &str) -> bool {
    let hit = std::env::var_os("FERROLET_POOL_FAILPOINT").is_some_and(|v| v == name);
    if hit {
        warn!(failpoint = name, "failpoint reached; waiting to be killed");
    }
    hit
}

/// Remove an entry's directory once nothing is pinned in it any more.
pub fn forget(entry_dir: &Path) -> Result<()> {
    sandbox::teardown_local(entry_dir)?;
    match std::fs::remove_dir_all(entry_dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", entry_dir.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry as the pool builds one, with plain files where the pins would be mounted.
    fn entry(pool: &SandboxPool) -> Entry {
        let (id, dir) = pool.new_entry_dir();
        let sdir = sandbox::sandbox_dir(&dir);
        std::fs::create_dir_all(sdir.join("shm")).unwrap();
        for f in ["net", "ipc", "uts"] {
            std::fs::write(sdir.join(f), f).unwrap();
        }
        let mut sb = sandbox::record(id, &dir, &POOLED, sdir.join("shm"), None, None);
        sb.pod_ips = vec!["10.66.0.7".into()];
        sb.network = Some("bridge".into());
        sandbox::save(&dir, &sb).unwrap();
        Entry { dir, sandbox: sb }
    }

    #[test]
    fn a_taken_entry_becomes_the_pods_sandbox_and_leaves_the_pool() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = SandboxPool::new(tmp.path().join("pool"), 2);
        let e = entry(&pool);
        assert_eq!(entries_on_disk(pool.dir()), vec![e.dir.clone()]);
        let pod_dir = tmp.path().join("pods/uid-1");
        std::fs::create_dir_all(sandbox::sandbox_dir(&pod_dir)).unwrap();

        let sb = move_into(&e, &pod_dir).unwrap();
        let sdir = sandbox::sandbox_dir(&pod_dir);
        assert_eq!(sb.id, e.sandbox.id, "the network is known by the same id");
        assert_eq!(sb.net.as_deref(), Some(sdir.join("net").as_path()));
        assert_eq!(sb.uts.as_deref(), Some(sdir.join("uts").as_path()));
        assert_eq!(sb.shm, sdir.join("shm"));
        assert_eq!(
            (sb.pod_ips.clone(), sb.network.clone()),
            (e.sandbox.pod_ips.clone(), e.sandbox.network.clone())
        );
        assert_eq!(
            std::fs::read_to_string(sdir.join("net")).unwrap(),
            "net",
            "the pins moved"
        );
        assert_eq!(sandbox::load(&pod_dir).unwrap(), Some(sb));
        assert!(
            entries_on_disk(pool.dir()).is_empty(),
            "the entry is gone from the pool"
        );
    }

    #[test]
    fn an_entry_that_cannot_move_is_not_claimed() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = SandboxPool::new(tmp.path().join("pool"), 1);
        let e = entry(&pool);
        let pod_dir = tmp.path().join("pods/uid-2");
        // something in the way: rename(2) replaces only an empty directory
        std::fs::create_dir_all(sandbox::sandbox_dir(&pod_dir).join("left")).unwrap();
        assert!(move_into(&e, &pod_dir).is_err());
        assert_eq!(
            sandbox::load(&pod_dir).unwrap(),
            None,
            "no record claims the entry's network"
        );
        assert_eq!(
            sandbox::load(&e.dir).unwrap(),
            Some(e.sandbox.clone()),
            "the entry is intact, to be released"
        );
    }

    #[test]
    fn entries_are_taken_oldest_first_and_a_take_delays_the_refill() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = SandboxPool::new(tmp.path().join("pool"), 2);
        let (a, b) = (entry(&pool), entry(&pool));
        pool.put(a.clone());
        pool.put(b.clone());
        assert_eq!(pool.ready(), 2);
        assert_eq!(pool.take().unwrap().sandbox.id, a.sandbox.id);
        assert!(pool.wait_before_building() > QUIET / 2, "a take holds the refill back");
        assert_eq!(pool.take().unwrap().sandbox.id, b.sandbox.id);
        assert!(pool.take().is_none());
        assert!(a.sandbox.id.starts_with("pool-") && a.sandbox.id != b.sandbox.id);
    }
}
