//! Container log rotation (kubelet's container_log_manager.go). Every
//! containerLogMonitorInterval the running containers' logs are looked at by
//! containerLogMaxWorkers workers; for each: leftovers of an interrupted compression go, the
//! oldest rotated files go until at most containerLogMaxFiles - 2 remain, every rotated file
//! but the newest is gzipped (`<log>.<stamp>.gz`), and a log of containerLogMaxSize or more
//! is renamed to `<log>.<YYYYMMDD-HHMMSS>` and the container's monitor asked to reopen its log
//! (CRI's ReopenContainerLog), so the next line goes to a new file and none is lost. A failed
//! reopen renames the file back for the next round.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use ferrolet_runtime::Runtime;
use tracing::{info, trace, warn};

const COMPRESS_SUFFIX: &str = ".gz";
const TMP_SUFFIX: &str = ".tmp";
/// kubelet's timestampFormat for rotated logs.
const TIMESTAMP_FORMAT: &str = "%Y%m%d-%H%M%S";

#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub max_size: u64,
    pub max_files: u32,
}

/// Every file of `log`'s rotations (`<log>.*`: rotated, compressed, temporary), sorted by
/// name, oldest first.
pub fn all_rotated(log: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let prefix = format!("{name}.");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// The name a rotation at `now` gives `log`.
pub fn rotated_name(log: &Path, now: DateTime<Utc>) -> PathBuf {
    let mut s = log.as_os_str().to_owned();
    s.push(format!(".{}", now.format(TIMESTAMP_FORMAT)));
    PathBuf::from(s)
}

fn has_suffix(p: &Path, suffix: &str) -> bool {
    p.to_str().is_some_and(|s| s.ends_with(suffix))
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// kubelet's cleanupUnusedLogs: temporary files of an interrupted compression, and
/// uncompressed files whose compressed copy is complete. Returns what is left.
fn cleanup_unused(logs: Vec<PathBuf>) -> Vec<PathBuf> {
    let (mut keep, mut gone) = (Vec::new(), Vec::new());
    for l in &logs {
        if has_suffix(l, TMP_SUFFIX)
            || (!has_suffix(l, COMPRESS_SUFFIX) && logs.contains(&with_suffix(l, COMPRESS_SUFFIX)))
        {
            gone.push(l.clone());
        } else {
            keep.push(l.clone());
        }
    }
    for g in gone {
        let _ = std::fs::remove_file(g);
    }
    keep
}

/// kubelet's removeExcessLogs: keep at most `max_files - 2` rotated files (the live one and
/// the one about to be rotated make up the rest), the oldest going first.
fn remove_excess(mut logs: Vec<PathBuf>, max_files: u32) -> Vec<PathBuf> {
    logs.sort();
    let keep = max_files.saturating_sub(2) as usize;
    let n = logs.len().saturating_sub(keep);
    for l in logs.drain(..n) {
        if let Err(e) = std::fs::remove_file(&l) {
            warn!(file = %l.display(), error = %e, "removing an old rotated log");
        }
    }
    logs
}

/// gzip `log` to `<log>.gz` through `<log>.gz.tmp`, then remove `log`.
pub fn compress(log: &Path) -> io::Result<()> {
    let gz = with_suffix(log, COMPRESS_SUFFIX);
    let tmp = with_suffix(&gz, TMP_SUFFIX);
    let mut r = std::fs::File::open(log)?;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    let mut w = flate2::write::GzEncoder::new(f, flate2::Compression::default());
    io::copy(&mut r, &mut w)?;
    w.finish()?.sync_all()?;
    std::fs::rename(&tmp, &gz)?;
    std::fs::remove_file(log)
}

/// One container's log: clean up, compress, rotate when over the size. `reopen` asks the
/// container's monitor to reopen the log path. `tidy`: the log's rotated files were left
/// cleaned up and compressed by an earlier call that rotated nothing, so the directory is not
/// listed again (only this manager makes rotated files).
pub fn rotate_log(
    log: &Path,
    policy: Policy,
    now: DateTime<Utc>,
    reopen: &dyn Fn() -> Result<(), String>,
    tidy: bool,
) -> Result<bool, String> {
    if !tidy {
        let logs = cleanup_unused(all_rotated(log));
        let logs = remove_excess(logs, policy.max_files);
        for l in logs.iter().filter(|l| !has_suffix(l, COMPRESS_SUFFIX)) {
            if let Err(e) = compress(l) {
                return Err(format!("compressing {}: {e}", l.display()));
            }
        }
    }
    let size = match std::fs::metadata(log) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("{}: {e}", log.display())),
    };
    if policy.max_size == 0 || size < policy.max_size {
        return Ok(false);
    }
    let rotated = rotated_name(log, now);
    if rotated.exists() || with_suffix(&rotated, COMPRESS_SUFFIX).exists() {
        // Rotated already this second (or the clock went back): the next round does it.
        return Ok(false);
    }
    std::fs::rename(log, &rotated).map_err(|e| format!("renaming {}: {e}", log.display()))?;
    if let Err(e) = reopen() {
        // As kubelet: put it back so the next round tries again.
        let _ = std::fs::rename(&rotated, log);
        return Err(format!("reopening the log after rotating it: {e}"));
    }
    Ok(true)
}

/// The agent's log manager.
pub struct LogManager {
    rt: Arc<Runtime>,
    policy: Policy,
    workers: usize,
    /// Logs whose last look rotated nothing and left their rotated files tidy: their next
    /// look is a `stat` of the log, not a listing of its directory (kubelet lists it every
    /// round; with 100 containers that was 400 system calls a round for nothing). Emptied at
    /// every start, so leftovers of a crash are cleaned up once.
    tidy: Arc<Mutex<HashSet<PathBuf>>>,
}

impl LogManager {
    pub fn new(rt: Arc<Runtime>, policy: Policy, workers: u32) -> LogManager {
        LogManager {
            rt,
            policy,
            workers: workers.max(1) as usize,
            tidy: Arc::default(),
        }
    }

    /// One round over the running containers: the list and the looks, on the blocking pool.
    /// As kubelet's workers take containers from one queue, `workers` threads take them from
    /// one list: a big log being compressed holds up one worker, not the round. One blocking
    /// task per worker, not per container: with 100 containers, waking a pool thread for each
    /// look was most of an idle round's cost.
    pub async fn round(&self) {
        let rt = self.rt.clone();
        let listed = crate::tasks::blocking(move || Ok(rt.list()?)).await;
        let list = match listed {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %format!("{e:#}"), "log rotation: listing containers");
                return;
            }
        };
        let jobs: Vec<(String, PathBuf)> = list
            .into_iter()
            .filter(|c| c.is_running())
            .map(|c| (c.id().to_string(), c.record.log_path.clone()))
            .collect();
        {
            let live: HashSet<&PathBuf> = jobs.iter().map(|(_, log)| log).collect();
            lock(&self.tidy).retain(|l| live.contains(l));
        }
        let workers = self.workers.min(jobs.len());
        let queue = Arc::new(Mutex::new(jobs));
        let running: Vec<_> = (0..workers)
            .map(|_| {
                let (rt, tidy, queue, policy) = (self.rt.clone(), self.tidy.clone(), queue.clone(), self.policy);
                ferrolet_fsutil::spawn_blocking(move || {
                    loop {
                        // Taken, and the list let go, before the look: workers look at once.
                        let next = lock(&queue).pop();
                        let Some((id, log)) = next else { break };
                        look(&rt, &tidy, policy, &id, &log);
                    }
                })
            })
            .collect();
        futures::future::join_all(running).await;
    }
}

/// One container's log looked at, and rotated when it is due.
fn look(rt: &Runtime, tidy: &Mutex<HashSet<PathBuf>>, policy: Policy, id: &str, log: &Path) {
    let reopen = || {
        rt.reopen_container_log(id, Duration::from_secs(10))
            .map_err(|e| ferrolet_fsutil::chain(&e).to_string())
    };
    let was_tidy = lock(tidy).contains(log);
    let result = rotate_log(log, policy, Utc::now(), &reopen, was_tidy);
    match &result {
        Ok(false) => lock(tidy).insert(log.to_path_buf()),
        _ => lock(tidy).remove(log),
    };
    match result {
        Ok(true) => info!(container = %id, log = %log.display(), "container log rotated"),
        Ok(false) => trace!(container = %id, "container log checked"),
        Err(e) => warn!(container = %id, error = %e, "rotating the container's log"),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use std::cell::Cell;
    use std::io::Read;

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn rotated_names_are_kubelets() {
        let t = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        assert_eq!(
            rotated_name(Path::new("/l/c/0.log"), t),
            PathBuf::from("/l/c/0.log.20231114-221320")
        );
    }

    #[test]
    fn rotation_compresses_all_but_the_newest_and_keeps_max_files() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("0.log");
        let policy = Policy {
            max_size: 10,
            max_files: 4,
        };
        let reopened = Cell::new(0);
        let reopen = || {
            reopened.set(reopened.get() + 1);
            // The monitor opens a new file at the path.
            std::fs::write(&log, "").map_err(|e| e.to_string())
        };
        let t0 = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        for i in 0..5 {
            std::fs::write(&log, format!("line {i} and more\n")).unwrap();
            // The file of 10 (10.log) is another container's and stays.
            std::fs::write(d.path().join("10.log.20231114-221320"), "x").unwrap();
            assert!(rotate_log(&log, policy, t0 + chrono::Duration::seconds(i), &reopen, false).unwrap());
        }
        assert_eq!(reopened.get(), 5);
        // max_files 4: the live file and 3 rotated ones, all but the newest compressed.
        assert_eq!(
            names(d.path()),
            [
                "0.log",
                "0.log.20231114-221322.gz",
                "0.log.20231114-221323.gz",
                "0.log.20231114-221324",
                "10.log.20231114-221320"
            ]
        );
        let mut s = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(d.path().join("0.log.20231114-221323.gz")).unwrap())
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "line 3 and more\n");
        // A round with nothing to rotate compresses the newest too and trims to max_files - 2.
        assert!(!rotate_log(&log, policy, t0 + chrono::Duration::seconds(9), &reopen, false).unwrap());
        assert_eq!(
            names(d.path()),
            [
                "0.log",
                "0.log.20231114-221323.gz",
                "0.log.20231114-221324.gz",
                "10.log.20231114-221320"
            ]
        );
    }

    #[test]
    fn a_failed_reopen_puts_the_log_back() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("0.log");
        std::fs::write(&log, "0123456789abcdef\n").unwrap();
        let policy = Policy {
            max_size: 4,
            max_files: 5,
        };
        let err = rotate_log(&log, policy, Utc::now(), &|| Err("gone".into()), false).unwrap_err();
        assert!(err.contains("gone"), "{err}");
        assert_eq!(names(d.path()), ["0.log"]);
    }

    #[test]
    fn leftovers_of_an_interrupted_compression_go() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("0.log");
        for n in [
            "0.log",
            "0.log.20231114-221320",
            "0.log.20231114-221320.gz",
            "0.log.20231114-221321.gz.tmp",
        ] {
            std::fs::write(d.path().join(n), "x").unwrap();
        }
        let policy = Policy {
            max_size: 100,
            max_files: 5,
        };
        assert!(!rotate_log(&log, policy, Utc::now(), &|| Ok(()), false).unwrap());
        assert_eq!(names(d.path()), ["0.log", "0.log.20231114-221320.gz"]);
    }

    #[test]
    fn a_tidy_log_is_only_measured_until_it_is_over_its_size() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("0.log");
        std::fs::write(&log, "x").unwrap();
        std::fs::write(d.path().join("0.log.20231114-221321.gz.tmp"), "x").unwrap();
        let policy = Policy {
            max_size: 10,
            max_files: 5,
        };
        let t0 = Utc.with_ymd_and_hms(2023, 11, 14, 22, 13, 30).unwrap();
        // Said tidy: the directory is not listed, so not even a leftover is seen.
        assert!(!rotate_log(&log, policy, t0, &|| Ok(()), true).unwrap());
        assert_eq!(names(d.path()), ["0.log", "0.log.20231114-221321.gz.tmp"]);
        assert!(!rotate_log(&log, policy, t0, &|| Ok(()), false).unwrap());
        assert_eq!(names(d.path()), ["0.log"]);
        // Over its size, a tidy log is rotated all the same.
        std::fs::write(&log, "x".repeat(20)).unwrap();
        assert!(rotate_log(&log, policy, t0, &|| Ok(()), true).unwrap());
        assert_eq!(names(d.path()), ["0.log.20231114-221330"]);
    }
}
