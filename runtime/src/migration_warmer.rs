//! Keeping the kernel's cgroup migration lock warm while containers are about to be created
//! (docs/start-path.md, "The cgroup migration wait").
//!
//! Moving a process into a cgroup (a write to `cgroup.procs`, as libcontainer's intermediate
//! process does for every container) takes the kernel's global `cgroup_threadgroup_rwsem` for
//! writing. When no migration happened for about an RCU grace period, the first writer waits
//! a whole grace period (`rcu_sync_enter`: 8-25 ms on the 2-core development machine, the
//! largest part of a pod's start before this existed). Writers that come while the lock is
//! warm, up to about one grace period after the last writer left, do not wait at all.
//!
//! A [`MigrationWarmer`] keeps it warm while anyone holds a [`WarmHold`]: one thread writes
//! this process's own pid into the cgroup it already is in, in one hierarchy, every
//! [`INTERVAL`] (shorter than a grace period). Such a migration moves nothing and no controller
//! sees anything. Only the first write of a spell waits; the containers' own migrations then
//! find the lock warm whenever they come. A single write at the right moment is not enough:
//! the window it opens closes one grace period after it, and the work between a pod's cgroup
//! and its container's migration (sandbox, network, volumes, the image, the spec) often takes
//! longer than that.
//!
//! The cost: a few microseconds of `cgroup_mutex` and of the rwsem every [`INTERVAL`], and
//! forks and exits on the node take the rwsem's slow path meanwhile. The thread runs only
//! while holds exist, at most [`LIMIT`] after the newest one was taken (a hold kept across a
//! long image pull does not keep it running), and exits on its own.

use std::fs::OpenOptions;
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::cgroups::Cgroups;

/// How often the warm thread writes. Grace periods here last two jiffies or more (8 ms at
/// HZ=250, 2 ms at HZ=1000); a write every 2 ms keeps the lock from going cold between them.
pub(crate) const INTERVAL: Duration = Duration::from_millis(2);

/// How long after the newest hold the thread keeps writing, held or not.
pub(crate) const LIMIT: Duration = Duration::from_secs(5);

/// The warm thread's name, as `/proc/<pid>/task/<tid>/comm` shows it.
pub const THREAD_NAME: &str = "ferrolet-cgwarm";

/// Keeps cgroup migrations from waiting for a grace period while holds exist. Cheap to clone.
#[derive(Clone)]
pub struct MigrationWarmer {
    shared: Arc<Shared>,
}

struct Shared {
    cgroups: Cgroups,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    holds: usize,
    newest: Option<Instant>,
    running: bool,
    /// This process's `cgroup.procs` could not be written: warming is given up.
    disabled: bool,
}

/// Containers are about to be created; dropping it says they are.
pub struct WarmHold {
    shared: Arc<Shared>,
}

impl MigrationWarmer {
    pub fn new(cgroups: Cgroups) -> MigrationWarmer {
        MigrationWarmer {
            shared: Arc::new(Shared {
                cgroups,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Keep migrations warm until the hold is dropped (or [`LIMIT`] has passed since the
    /// newest hold). Starts the warm thread if it is not running; never blocks on the kernel.
    pub fn hold(&self) -> WarmHold {
        let mut st = self.shared.lock();
        st.holds += 1;
        st.newest = Some(Instant::now());
        if !st.running && !st.disabled {
            let shared = self.shared.clone();
            match std::thread::Builder::new()
                .name(THREAD_NAME.into())
                .spawn(move || warm(&shared))
            {
                Ok(_) => st.running = true,
                // Only the start gets slower: the containers' own migrations wait instead.
                Err(e) => tracing::debug!(error = %e, "starting the cgroup migration warmer"),
            }
        }
        WarmHold {
            shared: self.shared.clone(),
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for WarmHold {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.holds = st.holds.saturating_sub(1);
    }
}

/// The warm thread: write, sleep, until no hold is left (or the newest is older than
/// [`LIMIT`]). The file is opened once per spell; a failure to open or write it gives warming
/// up for good.
fn warm(shared: &Shared) {
    let pid = std::process::id().to_string();
    let failed = (|| -> std::io::Result<()> {
        let mut file = OpenOptions::new().write(true).open(shared.cgroups.own_procs_file()?)?;
        loop {
            {
                let mut st = shared.lock();
                if st.holds == 0 || st.newest.is_none_or(|t| t.elapsed() >= LIMIT) {
                    // Under the same lock as the check: a hold taken after it starts a thread.
                    st.running = false;
                    return Ok(());
                }
            }
            file.write_all(pid.as_bytes())?;
            std::thread::sleep(INTERVAL);
        }
    })()
    .err();
    if let Some(e) = failed {
        tracing::debug!(error = %e, "writing this process's pid to warm cgroup migrations; warming given up");
        let mut st = shared.lock();
        st.running = false;
        st.disabled = true;
    }
}
