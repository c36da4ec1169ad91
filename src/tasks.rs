//! The agent's async discipline. Work that blocks a thread (fsync'd writes, mounts, cgroupfs
//! writes, directory walks) runs on tokio's blocking pool through [`ferrolet_fsutil::blocking`],
//! never on the async workers. Duties that must last the agent's whole life survive a panic in
//! one of their rounds ([`spawn_loop`], [`supervise`]).

use std::future::Future;
use std::time::Duration;

use futures::FutureExt;
use tracing::error;

/// [`ferrolet_fsutil::blocking`] for the agent's code, whose errors are anyhow's.
pub async fn blocking<T, F>(f: F) -> anyhow::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> anyhow::Result<T> + Send + 'static,
{
    ferrolet_fsutil::blocking(f).await
}

/// Spawn a loop that runs `round()` again and again for as long as it returns `true`: a round
/// that panics is logged and the loop goes on with the next round after `pause`, so one bad
/// round (a corrupt archive, a bug) never silently ends a background duty. State that must
/// outlive a round lives in what `round` captures.
pub fn spawn_loop<F, Fut>(name: &'static str, pause: Duration, mut round: F)
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            match std::panic::AssertUnwindSafe(round()).catch_unwind().await {
                Ok(true) => {}
                Ok(false) => return,
                Err(p) => {
                    error!(task = name, "panicked: {}; carrying on", panic_message(p));
                    tokio::time::sleep(pause).await;
                }
            }
        }
    });
}

/// The text of a panic payload.
pub fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".into()
    }
}

/// Run the future `make()` returns; when it panics, log it and run a fresh one after `pause`.
/// Returns when a run ends normally. For background duties whose state can be rebuilt (a pod
/// source re-reads its manifests, a server rebinds its socket).
pub fn supervise<F, Fut>(name: &'static str, pause: Duration, make: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            match tokio::spawn(make()).await {
                Ok(()) => return,
                Err(e) if e.is_panic() => {
                    error!(
                        task = name,
                        "panicked: {}; restarting it",
                        panic_message(e.into_panic())
                    );
                    tokio::time::sleep(pause).await;
                }
                Err(_) => return,
            }
        }
    });
}
