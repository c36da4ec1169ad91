//! The agent's async discipline. Work that blocks a thread (fsync'd writes, mounts, cgroupfs
//! writes, directory walks) runs on tokio's blocking pool through [`ferrolet_fsutil::blocking`],
//! never on the async workers. Duties that must last the agent's whole life survive a panic in
//! one of their rounds ([`spawn_loop`], [`supervise`]).

use std::future::Future;
use std::time::Duration;

use futures::FutureExt;
use tracing::error;

/// A hundred years: what a duration too long for the clock's arithmetic stands for.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `now + d`, never overflowing: a duration from a manifest or a plugin's answer (a grace
/// period of i64::MAX seconds) panics `Instant + Duration`; past a hundred years it is that.
pub fn after(now: tokio::time::Instant, d: Duration) -> tokio::time::Instant {
    now.checked_add(d.min(FAR_FUTURE))
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}

/// [`after`] for `std::time::Instant`.
pub fn std_after(now: std::time::Instant, d: Duration) -> std::time::Instant {
    now.checked_add(d.min(FAR_FUTURE))
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}

/// `t + secs` seconds in wall-clock time, `None` when out of chrono's range.
pub fn wall_after(t: chrono::DateTime<chrono::Utc>, secs: i64) -> Option<chrono::DateTime<chrono::Utc>> {
    t.checked_add_signed(chrono::Duration::try_seconds(secs)?)
}

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

/// Runs an action once, a while after things stopped changing: each [`AfterQuiet::changed`]
/// (re)starts a wait of `quiet`, and the action runs when a wait ends with no change in it.
/// Cheap to clone.
#[derive(Clone)]
pub struct AfterQuiet(std::sync::Arc<tokio::sync::Notify>);

impl AfterQuiet {
    /// Start the waiting task (within the async runtime).
    pub fn spawn(quiet: Duration, action: impl Fn() + Send + 'static) -> AfterQuiet {
        let changes = std::sync::Arc::new(tokio::sync::Notify::new());
        let c = changes.clone();
        tokio::spawn(async move {
            loop {
                c.notified().await;
                while tokio::time::timeout(quiet, c.notified()).await.is_ok() {}
                action();
            }
        });
        AfterQuiet(changes)
    }

    /// Something changed: the action runs `quiet` after the last change.
    pub fn changed(&self) {
        self.0.notify_one();
    }
}

/// The main loop's duty name in [`Liveness`] (kubelet's healthz check of the same name).
pub const SYNC_LOOP: &str = "syncloop";
/// Each pod worker's duty name starts with this, then the pod's full name.
pub const POD_WORKER: &str = "podworker ";

/// When the agent's long-lived duties last showed they are alive, for /healthz (kubelet's
/// syncloop health check, extended to the pod workers). A duty either beats (an idle loop says
/// "still here" regularly) or marks a round busy with a limit (a pod sync that must end within
/// it); a beat older than its limit, or a round past its limit, is a failure.
#[derive(Default)]
pub struct Liveness {
    duties: std::sync::Mutex<std::collections::BTreeMap<String, Duty>>,
}

struct Duty {
    /// When the duty last beat or began its current round.
    since: std::time::Instant,
    limit: Duration,
    /// In a round (as opposed to idle between beats).
    busy: bool,
}

impl Liveness {
    /// `name` is alive now and will beat again within `limit`.
    pub fn beat(&self, name: &str, limit: Duration) {
        self.set(name, limit, false);
    }

    /// `name` begins a round that should end within `limit`.
    pub fn busy(&self, name: &str, limit: Duration) {
        self.set(name, limit, true);
    }

    /// `name` ended its round and waits for work (no limit while idle), or is gone for good.
    pub fn done(&self, name: &str) {
        self.duties().remove(name);
    }

    /// What is wrong now: one line per duty past its limit.
    pub fn failures(&self) -> Vec<String> {
        let now = std::time::Instant::now();
        self.duties()
            .iter()
            .filter(|(_, d)| now.duration_since(d.since) > d.limit)
            .map(|(name, d)| {
                let secs = now.duration_since(d.since).as_secs();
                if d.busy {
                    format!("{name}: one round has taken {secs}s (limit {}s)", d.limit.as_secs())
                } else {
                    format!("{name}: last seen {secs}s ago (limit {}s)", d.limit.as_secs())
                }
            })
            .collect()
    }

    /// Failures of the duties whose names start with `prefix`.
    pub fn failures_of(&self, prefix: &str) -> Vec<String> {
        self.failures().into_iter().filter(|f| f.starts_with(prefix)).collect()
    }

    fn set(&self, name: &str, limit: Duration, busy: bool) {
        self.duties().insert(
            name.to_string(),
            Duty {
                since: std::time::Instant::now(),
                limit,
                busy,
            },
        );
    }

    fn duties(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, Duty>> {
        self.duties.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn after_quiet_runs_once_when_changes_stop() {
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let r = runs.clone();
        let q = AfterQuiet::spawn(Duration::from_secs(1), move || {
            r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let count = || runs.load(std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(count(), 0, "nothing changed yet");
        // A change every 0.6 s for 3 s keeps it waiting.
        for _ in 0..5 {
            q.changed();
            tokio::time::sleep(Duration::from_millis(600)).await;
            assert_eq!(count(), 0, "changes less than a second apart");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(count(), 1, "a second after the last change");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(count(), 1, "once per quiet spell");
        // Changes at once count as one.
        q.changed();
        q.changed();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(count(), 2);
    }

    #[test]
    fn liveness_fails_late_beats_and_long_rounds_only() {
        let l = Liveness::default();
        l.beat("syncloop", Duration::from_secs(60));
        l.busy("pod/a", Duration::from_millis(1));
        l.busy("pod/b", Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(l.failures().len(), 1);
        assert!(
            l.failures()[0].starts_with("pod/a: one round has taken"),
            "{:?}",
            l.failures()
        );
        assert!(l.failures_of("syncloop").is_empty());
        l.done("pod/a");
        assert!(l.failures().is_empty(), "an idle worker has no limit");
        l.beat("syncloop", Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(l.failures_of("syncloop").len(), 1);
    }
}
