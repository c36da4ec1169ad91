//! ferrolet-netplug: pod networking for ferrolet, with no Kubernetes types in it. A pod sandbox
//! is a pinned network namespace file plus a few facts ([`SandboxNetwork`]); this crate gives it
//! an interface, an IP, a default route, hostPorts and bandwidth limits, and takes them away
//! again, even after an agent crash.
//!
//! Two modes behind one API ([`NetPlug`]):
//! - [`Mode::Bridge`] (default): built in. Linux bridge, veth pairs, file-based IPAM, nftables
//!   masquerade and hostPort DNAT, TBF bandwidth limits; all over netlink except nftables
//!   (the `nft` command). See [`bridge`](crate::bridge).
//! - [`Mode::Cni`]: exec CNI plugins from a network configuration list (CNI spec 1.0.0).
//!
//! Both persist a record per sandbox in their state dir before creating anything, so
//! [`NetPlug::teardown_by_id`] and [`NetPlug::gc`] work from the record alone after a crash.
//! Operations on one sandbox are serialised; different sandboxes proceed concurrently.
//!
//! Namespace discipline: the process never changes its own namespaces. Work inside a pod's
//! namespace is done on a netlink socket created by a short-lived thread that joined it.
//! Sysctls written by the bridge mode (ip_forward, route_localnet on the bridge) are those of
//! the process's network namespace, the node's.

mod bridge;
mod cni;
pub mod error;
mod ipam;
pub mod netns;
mod nft;
mod nl;
mod record;
mod tc;
mod types;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

pub use error::{Error, PluginFailure, Result};
pub(crate) use types::validate_sandbox_id;
pub use types::{Bandwidth, BridgeConfig, CniConfig, Mode, NetworkStatus, PortMapping, Protocol, SandboxNetwork};

use bridge::BridgeNet;
use cni::CniNet;

/// Crash-test hook. When the environment variable `FERROLET_NETPLUG_FAILPOINT` names this
/// point, the operation stops here for good, so that a test can SIGKILL the process at a known
/// step (the integration tests do, to prove a crash leaks nothing that `gc` can not collect).
/// Points: `bridge-after-ipam` (IP allocated and recorded), `bridge-after-veth` (veth created),
/// `cni-after-add` (a plugin's ADD done). Unset (always, in production) it costs one env lookup.
pub(crate) async fn failpoint(name: &str) {
    if std::env::var_os("FERROLET_NETPLUG_FAILPOINT").is_some_and(|v| v == name) {
        tracing::warn!(failpoint = name, "failpoint reached; waiting to be killed");
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        }
    }
}

/// [`ferrolet_fsutil::blocking`], with this crate's error.
pub(crate) async fn blocking<T, E, F>(f: F) -> Result<T>
where
    T: Send + 'static,
    E: Into<Error> + Send + 'static,
    F: FnOnce() -> std::result::Result<T, E> + Send + 'static,
{
    ferrolet_fsutil::blocking(move || f().map_err(Into::into)).await
}

/// The veth host-side name the bridge mode uses for a sandbox ("veth" + 8 hex digits).
pub fn bridge_veth_name(sandbox_id: &str) -> String {
    bridge::veth_name(sandbox_id)
}

enum Inner {
    Bridge(BridgeNet),
    Cni(CniNet),
}

/// A pod network. Cheap to share (`Arc`); all methods take `&self`.
pub struct NetPlug {
    inner: Inner,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for NetPlug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetPlug").field("mode", &self.mode_name()).finish()
    }
}

impl NetPlug {
    /// Validate the configuration and prepare the network: for the bridge mode, check that the
    /// subnet overlaps no node route, create the bridge and the nftables table; for CNI, parse
    /// the config list, find every plugin binary and check each supports the config's version.
    /// Must be called inside a tokio runtime.
    pub async fn new(mode: Mode) -> Result<NetPlug> {
        let inner = match mode {
            Mode::Bridge(cfg) => Inner::Bridge(BridgeNet::new(cfg).await?),
            Mode::Cni(cfg) => Inner::Cni(CniNet::new(cfg).await?),
        };
        Ok(NetPlug {
            inner,
            locks: Mutex::new(HashMap::new()),
        })
    }

    /// Load the network's configuration file again (CNI: the config directory; the bridge's
    /// settings are the caller's and never change). Ok(true): it changed, and new
    /// attachments use it. An error: it changed and cannot be used; new attachments are refused
    /// with that error until a reload succeeds. Existing attachments keep their configuration.
    pub async fn reload(&self) -> Result<bool> {
        match &self.inner {
            Inner::Bridge(_) => Ok(false),
            Inner::Cni(c) => c.reload().await,
        }
    }

    /// "bridge" or "cni".
    pub fn mode_name(&self) -> &'static str {
        match self.inner {
            Inner::Bridge(_) => "bridge",
            Inner::Cni(_) => "cni",
        }
    }

    fn lock_for(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(id.to_string()).or_default().clone()
    }

    fn forget_lock(&self, id: &str) {
        let mut m = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = m.get(id) {
            // only the map holds it: nobody is waiting
            if Arc::strong_count(l) == 1 {
                m.remove(id);
            }
        }
    }

    /// Attach the sandbox to the network. On error nothing of the attempt is left behind
    /// (what could not be undone is recorded for [`NetPlug::gc`]). Calling it again for a
    /// sandbox that is set up tears the old attachment down first.
    pub async fn setup(&self, req: &SandboxNetwork) -> Result<NetworkStatus> {
        req.validate()?;
        let lock = self.lock_for(&req.sandbox_id);
        let _g = lock.lock().await;
        match &self.inner {
            Inner::Bridge(b) => b.setup(req).await,
            Inner::Cni(c) => c.setup(req).await,
        }
    }

    /// Detach the sandbox: IPs, interfaces, hostPorts, CNI attachments. Idempotent, and works
    /// when the namespace is already gone.
    pub async fn teardown(&self, req: &SandboxNetwork) -> Result<()> {
        req.validate()?;
        let res = {
            let lock = self.lock_for(&req.sandbox_id);
            let _g = lock.lock().await;
            match &self.inner {
                Inner::Bridge(b) => b.teardown(req).await,
                Inner::Cni(c) => c.teardown(req).await,
            }
        };
        self.forget_lock(&req.sandbox_id);
        res
    }

    /// [`NetPlug::teardown`] knowing only the id, from the persisted record (and, for what no
    /// record describes, from the IP allocations and the interfaces' labels).
    pub async fn teardown_by_id(&self, sandbox_id: &str) -> Result<()> {
        validate_sandbox_id(sandbox_id)?;
        let res = {
            let lock = self.lock_for(sandbox_id);
            let _g = lock.lock().await;
            match &self.inner {
                Inner::Bridge(b) => b.teardown_by_id(sandbox_id).await,
                Inner::Cni(c) => c.teardown_by_id(sandbox_id).await,
            }
        };
        self.forget_lock(sandbox_id);
        res
    }

    /// Verify the sandbox's network is as setup left it (CNI: the plugins' CHECK).
    pub async fn check(&self, req: &SandboxNetwork) -> Result<()> {
        req.validate()?;
        let lock = self.lock_for(&req.sandbox_id);
        let _g = lock.lock().await;
        match &self.inner {
            Inner::Bridge(b) => b.check(req).await,
            Inner::Cni(c) => c.check(req).await,
        }
    }

    /// Remove what [`NetPlug::new`] put on the node (bridge mode: the bridge and the nftables
    /// table; CNI: nothing, the plugins own their node state). For decommissioning a node
    /// (`ferrolet reset`), after every sandbox was torn down.
    pub async fn uninstall(&self) -> Result<()> {
        match &self.inner {
            Inner::Bridge(b) => b.uninstall().await,
            Inner::Cni(_) => Ok(()),
        }
    }

    /// Tear down everything belonging to sandboxes not in `live_sandbox_ids`; returns the ids
    /// collected. Tries every sandbox; if some failed, returns the first error after. The list
    /// must include sandboxes whose setup may be running concurrently: anything of ours that
    /// belongs to no listed sandbox is collected (bridge mode: also unlabelled veths on the
    /// bridge and hostPort elements of unallocated IPs).
    pub async fn gc(&self, live_sandbox_ids: &[String]) -> Result<Vec<String>> {
        let live: HashSet<&str> = live_sandbox_ids.iter().map(String::as_str).collect();
        let candidates = match &self.inner {
            Inner::Bridge(b) => b.gc_candidates().await?,
            Inner::Cni(c) => c.gc_candidates()?,
        };
        let mut collected = Vec::new();
        let mut first_err = None;
        for id in candidates.into_iter().filter(|i| !live.contains(i.as_str())) {
            if validate_sandbox_id(&id).is_err() {
                continue;
            }
            let res = {
                let lock = self.lock_for(&id);
                let _g = lock.lock().await;
                match &self.inner {
                    Inner::Bridge(b) => b.teardown_by_id(&id).await,
                    Inner::Cni(c) => c.teardown_by_id(&id).await,
                }
            };
            self.forget_lock(&id);
            match res {
                Ok(()) => {
                    tracing::info!(sandbox = %id, mode = self.mode_name(), "gc collected sandbox network");
                    collected.push(id);
                }
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %ferrolet_fsutil::chain(&e), "gc could not tear down sandbox network");
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Inner::Bridge(b) = &self.inner {
            if let Err(e) = b.gc_sweep(&live).await {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(collected),
        }
    }
}

/// The futures of [`NetPlug`] can be spawned on a multi-threaded runtime.
#[allow(dead_code)]
fn assert_send_sync(n: &NetPlug, r: &SandboxNetwork) {
    fn send<T: Send>(_: T) {}
    fn sync<T: Send + Sync>() {}
    sync::<NetPlug>();
    send(n.setup(r));
    send(n.teardown(r));
    send(n.teardown_by_id("x"));
    send(n.check(r));
    send(n.gc(&[]));
    send(NetPlug::new(Mode::Bridge(BridgeConfig::default())));
}
