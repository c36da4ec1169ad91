//! The zygote's isolation (crate::mount_ns): the mount namespaces it and its forks go
//! between, once the agent asked for them. Shared by the zygote's request loop, which sets it,
//! and the forks that read it: the workers and the monitors.

use crate::proto::Reply;

/// The zygote's own mount namespace, once the agent asked for it (crate::mount_ns): its forks
/// go between it and the host's. Set once. The zygote is one thread: the lock is never
/// contended, nor held at a fork.
static ISOLATED: std::sync::Mutex<Option<std::sync::Arc<crate::mount_ns::Isolated>>> = std::sync::Mutex::new(None);

fn isolated_slot() -> std::sync::MutexGuard<'static, Option<std::sync::Arc<crate::mount_ns::Isolated>>> {
    ISOLATED.lock().unwrap_or_else(|e| e.into_inner())
}

/// The isolation of this zygote's forks, if the agent asked for it and it succeeded.
pub(crate) fn isolated() -> Option<std::sync::Arc<crate::mount_ns::Isolated>> {
    isolated_slot().clone()
}

/// In a fork that is done with namespaces (a monitor, once its container is built): close the
/// namespace fds it inherited, which would otherwise keep an old namespace of the zygote alive
/// for as long as the container runs.
pub(crate) fn forget_isolation() {
    isolated_slot().take();
}

/// Isolate the zygote, once: a second request for the root it isolated from is answered as
/// done, for another root refused.
pub(crate) fn isolate(root: &std::path::Path) -> Reply {
    let mut slot = isolated_slot();
    if let Some(iso) = slot.as_ref() {
        return match std::fs::canonicalize(root) {
            Ok(r) if r == iso.root => Reply::Ok,
            _ => Reply::Failed {
                error: format!("the zygote is isolated already, for {}", iso.root.display()),
            },
        };
    }
    match crate::mount_ns::isolate(root) {
        Ok(iso) => {
            *slot = Some(std::sync::Arc::new(iso));
            Reply::Ok
        }
        // Back in the host's namespace, as crate::mount_ns::isolate leaves it on failure:
        // forks build in the host's namespace, as without isolation.
        Err(e) => Reply::Failed { error: e.to_string() },
    }
}
