//! What [`load`](crate::container::load) read of each container, reused while nothing it read
//! can have changed. The stats sampler, log rotation and garbage collection each list every
//! container every few seconds; reading four records and `/proc` for each was a sixth of an
//! idle agent's CPU with 100 pods.
//!
//! A container's state comes from the files of its state directory and, while it may run,
//! from whether its monitor lives. Every record is written by a rename into the directory (or
//! made there), which changes the directory's mtime and ctime, so a state is reused only while
//! the directory's stat is the same as when it was read and, for a created or running
//! container, while a pidfd of its monitor (opened when the state was read and checked
//! against the recorded start time) does not report an exit. File times are coarse (a clock
//! tick), so a state is kept only when the directory had been still for [`SETTLED`] before it
//! was read: a change after that gets another time. States with anything unusual (a record
//! unreadable, a monitor found through the kernel, an unknown or incomplete state) are read
//! afresh every time, as before.

use std::collections::{HashMap, HashSet};
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::container::{ContainerInfo, ContainerState};
use crate::pidfd::{process_matches, PidFd};

/// How long a state directory must have been unchanged for its state to be kept.
pub(crate) const SETTLED: Duration = Duration::from_secs(1);

/// A state directory as stat shows it: which directory, and when it last changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// Unchanged for [`SETTLED`] before `read_at` (the time taken before the directory's stat):
    /// a later change gets a later time. A clock set back reads as not settled.
    fn settled(&self, read_at: SystemTime) -> bool {
        let Ok(now) = read_at.duration_since(UNIX_EPOCH) else {
            return false;
        };
        let latest = self.mtime.max(self.ctime);
        let Ok(secs) = u64::try_from(latest.0) else {
            return false;
        };
        let changed = Duration::new(secs, u32::try_from(latest.1).unwrap_or(0));
        now.checked_sub(changed).is_some_and(|d| d >= SETTLED)
    }
}

struct Entry {
    stamp: Stamp,
    info: ContainerInfo,
    /// The monitor of a created or running container.
    monitor: Option<PidFd>,
}

#[derive(Default)]
pub(crate) struct ContainerCache {
    entries: Mutex<HashMap<String, Entry>>,
}

impl ContainerCache {
    /// The state read before, if the directory (stat `meta`) is unchanged and the monitor of a
    /// live container still runs.
    pub(crate) fn get(&self, id: &str, meta: &Metadata) -> Option<ContainerInfo> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let e = entries.get(id)?;
        let monitor_exited = e.monitor.as_ref().is_some_and(|m| m.has_exited());
        if e.stamp != Stamp::of(meta) || monitor_exited {
            entries.remove(id);
            return None;
        }
        Some(e.info.clone())
    }

    /// Keep `info`, read after the directory's stat `meta`, which was taken at `read_at`, when
    /// it can be trusted until the directory changes or the monitor exits.
    pub(crate) fn put(&self, id: &str, meta: &Metadata, read_at: SystemTime, info: &ContainerInfo) {
        let stamp = Stamp::of(meta);
        let keep = stamp.settled(read_at) && info.record_errors.is_empty();
        let monitor = match (&info.state, &info.monitor) {
            _ if !keep => return self.forget(id),
            (ContainerState::Exited(_), _) => None,
            (ContainerState::Created | ContainerState::Running, Some(m)) => {
                // Opened before the check: if the pid is the recorded monitor now, the pidfd
                // is of that process, not of a later one that reused the pid.
                match PidFd::open(m.monitor_pid) {
                    Ok(fd) if process_matches(m.monitor_pid, m.monitor_start) => Some(fd),
                    _ => return self.forget(id),
                }
            }
            _ => return self.forget(id),
        };
        let entry = Entry {
            stamp,
            info: info.clone(),
            monitor,
        };
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), entry);
    }

    pub(crate) fn forget(&self, id: &str) {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }

    /// Forget every container but `ids` (the ones whose directories are still there).
    pub(crate) fn retain(&self, ids: &HashSet<String>) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|id, _| ids.contains(id));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::{ContainerRecord, ExitRecord, MonitorRecord};
    use crate::pidfd::process_start_time;

    fn info(state: ContainerState, monitor: Option<MonitorRecord>) -> ContainerInfo {
        let record: ContainerRecord = serde_json::from_value(serde_json::json!({
            "id": "c", "name": "c", "image": "i", "imageRef": format!("sha256:{}", "0".repeat(64)),
            "imageId": "i", "labels": {}, "annotations": {}, "createdAt": "", "logPath": "",
            "cgroupPath": "", "stopSignal": null, "bootId": "",
        }))
        .unwrap();
        ContainerInfo {
            record,
            state,
            monitor,
            started_at: None,
            record_errors: Vec::new(),
        }
    }

    /// `read_at` as if the directory's stat had been taken `SETTLED` after its last change.
    fn later() -> SystemTime {
        SystemTime::now() + SETTLED + Duration::from_millis(10)
    }

    #[test]
    fn a_directory_changed_within_the_last_second_is_not_settled() {
        let d = tempfile::tempdir().unwrap();
        let m = std::fs::metadata(d.path()).unwrap();
        let stamp = Stamp::of(&m);
        assert!(!stamp.settled(SystemTime::now()));
        assert!(stamp.settled(later()));
        // A clock set back behind the directory's time.
        assert!(!stamp.settled(SystemTime::now() - Duration::from_secs(3600)));
    }

    #[test]
    fn an_exited_state_is_kept_until_its_directory_changes() {
        let d = tempfile::tempdir().unwrap();
        let cache = ContainerCache::default();
        let exited = ContainerState::Exited(ExitRecord {
            exit_code: 3,
            signal: None,
            oom_killed: false,
            finished_at: String::new(),
            reason: None,
        });
        let meta = std::fs::metadata(d.path()).unwrap();
        // Read too soon after the last change: not kept.
        cache.put("c", &meta, SystemTime::now(), &info(exited.clone(), None));
        assert!(cache.get("c", &meta).is_none());
        cache.put("c", &meta, later(), &info(exited.clone(), None));
        assert_eq!(cache.get("c", &meta).map(|i| i.state), Some(exited.clone()));
        // A record renamed into the directory changes it.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(d.path().join("exit.json.tmp"), "{}").unwrap();
        std::fs::rename(d.path().join("exit.json.tmp"), d.path().join("exit.json")).unwrap();
        let now = std::fs::metadata(d.path()).unwrap();
        assert!(cache.get("c", &now).is_none());
        assert_eq!(cache.len(), 0, "forgotten");
        // With problems reading it, a state is never kept.
        let mut bad = info(exited, None);
        bad.record_errors.push("container.json is missing".into());
        cache.put("c", &now, later(), &bad);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_running_state_is_kept_while_its_monitor_lives() {
        let d = tempfile::tempdir().unwrap();
        let meta = std::fs::metadata(d.path()).unwrap();
        let cache = ContainerCache::default();
        let mut monitor = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = monitor.id() as i32;
        let rec = MonitorRecord {
            monitor_pid: pid,
            monitor_start: process_start_time(pid).unwrap(),
            init_pid: 0,
            init_start: 0,
            build_mounts: None,
        };
        // A record whose start time is not the process's: never kept.
        let wrong = MonitorRecord {
            monitor_start: rec.monitor_start + 1,
            ..rec.clone()
        };
        cache.put("c", &meta, later(), &info(ContainerState::Running, Some(wrong)));
        assert_eq!(cache.len(), 0);
        // Unknown and incomplete states are read afresh every time.
        cache.put(
            "c",
            &meta,
            later(),
            &info(ContainerState::Incomplete, Some(rec.clone())),
        );
        assert_eq!(cache.len(), 0);
        cache.put("c", &meta, later(), &info(ContainerState::Running, Some(rec.clone())));
        assert_eq!(cache.get("c", &meta).map(|i| i.state), Some(ContainerState::Running));
        // Killed, writing nothing: the pidfd tells.
        monitor.kill().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while cache.get("c", &meta).is_some() {
            assert!(std::time::Instant::now() < deadline, "still running per the cache");
            cache.put("c", &meta, later(), &info(ContainerState::Running, Some(rec.clone())));
            std::thread::sleep(Duration::from_millis(5));
        }
        monitor.wait().unwrap();
        // Gone from the listing: forgotten.
        cache.put("c", &meta, later(), &info(ContainerState::Created, None));
        cache.retain(&HashSet::new());
        assert_eq!(cache.len(), 0);
    }
}
