//! kubelet's plugin manager (`pkg/kubelet/pluginmanager`): the plugin registry directory
//! (`<root-dir>/plugins_registry/`) watched for unix sockets, each a plugin serving
//! pluginregistration.v1's `Registration`. A socket that appears is dialled, asked `GetInfo`,
//! checked, and handed to the [`PluginHandler`] of its type (`CSIPlugin`, `DevicePlugin`); the
//! plugin is told the outcome with `NotifyRegistrationStatus` (a refusal names the field). A
//! socket that goes (or is made anew) is deregistered from its handler.
//!
//! As kubelet's desired and actual states of the world with their reconciler: inotify (and a
//! re-list every [`RESCAN_EVERY`], for what inotify cannot tell) gives the sockets there are,
//! [`PluginManager`]'s table the plugins registered, and each difference becomes an operation
//! of its own task, one at a time per socket; a failed registration is tried again after a
//! back-off (kubelet's exponential back-off, 500 ms doubling to about 2 min). Every call to a
//! plugin has a deadline, and no operation waits for another socket's: a plugin that hangs or
//! lies stalls nothing but itself.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::apis::pluginregistration::v1::registration_client::RegistrationClient;
use crate::apis::pluginregistration::v1::{InfoRequest, PluginInfo, RegistrationStatus};

/// kubelet's plugin registry directory under its root dir.
pub const REGISTRY_DIR: &str = "plugins_registry";

/// The deadline of the connection and of each call to a plugin's Registration service
/// (kubelet's operation executor gives GetInfo and NotifyRegistrationStatus 1 s each, and the
/// dial 10 s; one generous deadline for all keeps a slow node working).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The deadline of a handler's validation and registration, which call the plugin's own
/// service (a CSI driver's NodeGetInfo) with deadlines of their own.
pub const HANDLER_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the directory is listed again whatever inotify said.
pub const RESCAN_EVERY: Duration = Duration::from_secs(5);

const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(122);

/// The plugin registry directory of the agent whose root dir is `root`.
pub fn registry_dir(root: &Path) -> PathBuf {
    root.join(REGISTRY_DIR)
}

/// What a type of plugin does with its plugins (kubelet's PluginHandler). Errors go back to
/// the plugin in `NotifyRegistrationStatus` and into the log: they name the field at fault.
#[tonic::async_trait]
pub trait PluginHandler: Send + Sync {
    /// Whether the plugin may register, before anything is done with it.
    async fn validate(&self, name: &str, endpoint: &str, versions: &[String]) -> anyhow::Result<()>;
    /// Take the plugin on (it was validated).
    async fn register(&self, name: &str, endpoint: &str, versions: &[String]) -> anyhow::Result<()>;
    /// The plugin registered as `name` at `endpoint` is gone. A handler that has since taken a
    /// newer plugin of the same name at another endpoint keeps that one.
    async fn deregister(&self, name: &str, endpoint: &str);
}

/// The handlers by plugin type (`CSIPlugin`, `DevicePlugin`).
pub type Handlers = BTreeMap<String, Arc<dyn PluginHandler>>;

/// A socket file as it is now: made anew, it is another plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SocketId {
    ino: u64,
    ctime: (i64, i64),
}

#[derive(Debug, Clone)]
enum State {
    /// An operation on the socket is under way.
    Busy,
    Registered {
        kind: String,
        name: String,
        endpoint: String,
    },
    /// Refused or unreachable: tried again at `next`.
    Failed { next: Instant, delay: Duration },
}

#[derive(Debug, Clone)]
struct Entry {
    id: SocketId,
    state: State,
}

struct Inner {
    dir: PathBuf,
    handlers: Handlers,
    table: Mutex<BTreeMap<PathBuf, Entry>>,
    wake: Notify,
}

/// The plugin watcher of one registry directory; its loop runs on the runtime it was started
/// on, for as long as that runtime (the agent's) lives.
#[derive(Clone)]
pub struct PluginManager {
    inner: Arc<Inner>,
}

/// A registered plugin, as [`PluginManager::plugins`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub socket: PathBuf,
    pub kind: String,
    pub name: String,
    pub endpoint: String,
}

impl PluginManager {
    /// Watch `dir` (made if missing) and register the plugins found there and those that come.
    pub fn start(dir: &Path, handlers: Handlers) -> std::io::Result<PluginManager> {
        std::fs::create_dir_all(dir)?;
        let ino = inotify::Inotify::init()?;
        use inotify::WatchMask as M;
        ino.watches()
            .add(dir, M::CREATE | M::DELETE | M::MOVED_FROM | M::MOVED_TO | M::ATTRIB)?;
        let mut events = ino.into_event_stream(vec![0u8; 4096])?;
        let m = PluginManager {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                handlers,
                table: Mutex::new(BTreeMap::new()),
                wake: Notify::new(),
            }),
        };
        info!(dir = %dir.display(), "plugin watcher started");
        let me = m.clone();
        tokio::spawn(async move {
            loop {
                let next = me.reconcile();
                tokio::select! {
                    ev = events.next() => {
                        if ev.is_none() {
                            warn!(dir = %me.inner.dir.display(), "plugin watcher: inotify ended; listing every {RESCAN_EVERY:?}");
                            loop {
                                let next = me.reconcile();
                                tokio::select! {
                                    _ = tokio::time::sleep_until(next) => {}
                                    _ = me.inner.wake.notified() => {}
                                }
                            }
                        }
                    }
                    _ = tokio::time::sleep_until(next) => {}
                    _ = me.inner.wake.notified() => {}
                }
            }
        });
        Ok(m)
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The plugins registered now.
    pub fn plugins(&self) -> Vec<Registered> {
        let table = self.inner.table.lock().unwrap_or_else(|e| e.into_inner());
        table
            .iter()
            .filter_map(|(socket, e)| match &e.state {
                State::Registered { kind, name, endpoint } => Some(Registered {
                    socket: socket.clone(),
                    kind: kind.clone(),
                    name: name.clone(),
                    endpoint: endpoint.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    /// The sockets in the directory now (dot files aside, as kubelet's watcher skips them).
    fn sockets(&self) -> BTreeMap<PathBuf, SocketId> {
        let mut out = BTreeMap::new();
        let Ok(rd) = std::fs::read_dir(&self.inner.dir) else {
            return out;
        };
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let Ok(md) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if md.file_type().is_socket() {
                out.insert(
                    e.path(),
                    SocketId {
                        ino: md.ino(),
                        ctime: (md.ctime(), md.ctime_nsec()),
                    },
                );
            }
        }
        out
    }

    /// Start an operation for each difference between the sockets and the table; the time of
    /// the next look.
    fn reconcile(&self) -> Instant {
        let now = Instant::now();
        let mut next = now + RESCAN_EVERY;
        let present = self.sockets();
        let mut table = self.inner.table.lock().unwrap_or_else(|e| e.into_inner());
        let mut gone = Vec::new();
        for (socket, e) in table.iter_mut() {
            if present.get(socket) == Some(&e.id) {
                continue;
            }
            match &e.state {
                State::Busy => {}
                State::Failed { .. } => gone.push(socket.clone()),
                State::Registered { kind, name, endpoint } => {
                    let (kind, name, endpoint) = (kind.clone(), name.clone(), endpoint.clone());
                    e.state = State::Busy;
                    self.spawn_deregister(socket.clone(), kind, name, endpoint);
                }
            }
        }
        for socket in gone {
            table.remove(&socket);
        }
        for (socket, id) in present {
            match table.get_mut(&socket) {
                None => {
                    table.insert(socket.clone(), Entry { id, state: State::Busy });
                    self.spawn_register(socket, id, FIRST_RETRY);
                }
                Some(e) if e.id == id => {
                    if let State::Failed { next: at, delay } = e.state {
                        if at <= now {
                            e.state = State::Busy;
                            self.spawn_register(socket, id, delay);
                        } else {
                            next = next.min(at);
                        }
                    }
                }
                // A new socket where a registered one was: deregistered first (above).
                Some(_) => {}
            }
        }
        next
    }

    fn spawn_register(&self, socket: PathBuf, id: SocketId, delay: Duration) {
        let me = self.clone();
        tokio::spawn(async move {
            let outcome = register(&me.inner.handlers, &socket).await;
            let mut table = me.inner.table.lock().unwrap_or_else(|e| e.into_inner());
            let state = match outcome {
                Ok((kind, name, endpoint)) => State::Registered { kind, name, endpoint },
                Err(()) => State::Failed {
                    next: Instant::now() + delay,
                    delay: (delay * 2).min(MAX_RETRY),
                },
            };
            table.insert(socket, Entry { id, state });
            drop(table);
            me.inner.wake.notify_one();
        });
    }

    fn spawn_deregister(&self, socket: PathBuf, kind: String, name: String, endpoint: String) {
        let me = self.clone();
        tokio::spawn(async move {
            if let Some(h) = me.inner.handlers.get(&kind) {
                if tokio::time::timeout(HANDLER_TIMEOUT, h.deregister(&name, &endpoint))
                    .await
                    .is_err()
                {
                    warn!(plugin = %name, kind = %kind, "plugin watcher: the handler's deregistration did not end in time");
                }
            }
            info!(plugin = %name, kind = %kind, socket = %socket.display(), "plugin deregistered");
            me.inner.table.lock().unwrap_or_else(|e| e.into_inner()).remove(&socket);
            me.inner.wake.notify_one();
        });
    }
}

/// Why a plugin's own account of itself is refused, naming the field.
pub fn check_info(info: &PluginInfo, handlers: &Handlers) -> Result<(), String> {
    if !handlers.contains_key(&info.r#type) {
        let known: Vec<&str> = handlers.keys().map(String::as_str).collect();
        return Err(format!(
            "type: no handler registered for plugin type {:?} (this node takes {known:?})",
            info.r#type
        ));
    }
    if info.name.is_empty() {
        return Err("name: the plugin gave no name".into());
    }
    if info.supported_versions.is_empty() || info.supported_versions.iter().any(String::is_empty) {
        return Err(format!(
            "supported_versions: {:?} must name at least one version, none empty",
            info.supported_versions
        ));
    }
    if !info.endpoint.is_empty() && !Path::new(&info.endpoint).is_absolute() {
        return Err(format!(
            "endpoint: {:?} is not an absolute path to a unix socket",
            info.endpoint
        ));
    }
    Ok(())
}

/// Register the plugin on `socket` with its handler and tell it the outcome: its type, name
/// and endpoint, or `Err` once logged and told.
async fn register(handlers: &Handlers, socket: &Path) -> Result<(String, String, String), ()> {
    let channel = match crate::apis::dial(socket, CALL_TIMEOUT).await {
        Ok(c) => c,
        Err(e) => {
            warn!(socket = %socket.display(), error = %ferrolet_fsutil::chain(&e), "plugin watcher: cannot dial the plugin");
            return Err(());
        }
    };
    let mut client = RegistrationClient::new(channel);
    let info = match tokio::time::timeout(CALL_TIMEOUT, client.get_info(InfoRequest {})).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(status)) => {
            warn!(socket = %socket.display(), code = ?status.code(), error = %status.message(), "plugin watcher: GetInfo failed");
            return Err(());
        }
        Err(_) => {
            warn!(socket = %socket.display(), timeout = ?CALL_TIMEOUT, "plugin watcher: GetInfo did not answer");
            return Err(());
        }
    };
    let endpoint = match info.endpoint.is_empty() {
        true => socket.to_string_lossy().into_owned(),
        false => info.endpoint.clone(),
    };
    let outcome = async {
        check_info(&info, handlers)?;
        let h = &handlers[&info.r#type];
        let (name, versions) = (&info.name, &info.supported_versions);
        match tokio::time::timeout(HANDLER_TIMEOUT, h.validate(name, &endpoint, versions)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("plugin validation failed: {e:#}")),
            Err(_) => {
                return Err(format!(
                    "plugin validation failed: no answer within {HANDLER_TIMEOUT:?}"
                ))
            }
        }
        match tokio::time::timeout(HANDLER_TIMEOUT, h.register(name, &endpoint, versions)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("plugin registration failed: {e:#}")),
            Err(_) => Err(format!(
                "plugin registration failed: no answer within {HANDLER_TIMEOUT:?}"
            )),
        }
    }
    .await;
    let status = RegistrationStatus {
        plugin_registered: outcome.is_ok(),
        error: outcome.clone().err().unwrap_or_default(),
    };
    match tokio::time::timeout(CALL_TIMEOUT, client.notify_registration_status(status)).await {
        Ok(Ok(_)) => {}
        Ok(Err(status)) => {
            warn!(plugin = %info.name, code = ?status.code(), error = %status.message(), "plugin watcher: NotifyRegistrationStatus failed")
        }
        Err(_) => warn!(plugin = %info.name, "plugin watcher: NotifyRegistrationStatus did not answer"),
    }
    match outcome {
        Ok(()) => {
            info!(plugin = %info.name, kind = %info.r#type, endpoint = %endpoint, versions = ?info.supported_versions, "plugin registered");
            Ok((info.r#type, info.name, endpoint))
        }
        Err(why) => {
            warn!(plugin = %info.name, kind = %info.r#type, socket = %socket.display(), "plugin refused: {why}");
            // A plugin refused before its handler took it on has nothing to deregister.
            Err(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;
    #[tonic::async_trait]
    impl PluginHandler for Nothing {
        async fn validate(&self, _: &str, _: &str, _: &[String]) -> anyhow::Result<()> {
            Ok(())
        }
        async fn register(&self, _: &str, _: &str, _: &[String]) -> anyhow::Result<()> {
            Ok(())
        }
        async fn deregister(&self, _: &str, _: &str) {}
    }

    #[test]
    fn bad_plugin_info_names_the_field() {
        let mut h = Handlers::new();
        h.insert("CSIPlugin".into(), Arc::new(Nothing));
        let good = PluginInfo {
            r#type: "CSIPlugin".into(),
            name: "csi.example.com".into(),
            endpoint: "/run/csi.sock".into(),
            supported_versions: vec!["1.0.0".into()],
        };
        assert_eq!(check_info(&good, &h), Ok(()));
        let bad = |f: &dyn Fn(&mut PluginInfo)| {
            let mut i = good.clone();
            f(&mut i);
            check_info(&i, &h).unwrap_err()
        };
        assert!(bad(&|i| i.r#type = "Other".into()).starts_with("type: "));
        assert!(bad(&|i| i.name.clear()).starts_with("name: "));
        assert!(bad(&|i| i.supported_versions.clear()).starts_with("supported_versions: "));
        assert!(bad(&|i| i.endpoint = "csi.sock".into()).starts_with("endpoint: "));
    }
}
