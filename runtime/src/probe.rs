//! What the kernel knows about a container, for when its records cannot say: the monitor
//! holding its state directory, the parent of its init, the cgroup named after it, whether its
//! init has exec'd, and which boot a file was written in. Used by [`crate::container::load`]
//! when a record cannot be read, so a torn or garbled file never makes a live container look
//! gone (docs/runtime.md#unreadable-records). The processes of a cgroup are
//! [`crate::cgroups::Cgroups::procs_below`].
//!
//! Everything here reads `/proc` and never blocks.

use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// The name (`comm`) every monitor gives itself ((`zygote::monitor`)).
pub(crate) const MONITOR_COMM: &str = ferrolet_monitor::handoff::COMM;

/// `comm` of a process.
pub(crate) fn comm(pid: i32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end_matches('\n').to_string())
}

/// Parent pid of a process (field 4 of /proc/PID/stat).
pub(crate) fn ppid(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// A live monitor that holds `state_dir` open (monitors keep an fd on their container's state
/// directory for this). Only processes named [`MONITOR_COMM`] are looked at.
pub(crate) fn monitor_holding(state_dir: &Path) -> Option<i32> {
    let want = fs::canonicalize(state_dir).ok()?;
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if comm(pid).as_deref() != Some(MONITOR_COMM) {
            continue;
        }
        let fds = fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten();
        if fds
            .into_iter()
            .any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t == want))
        {
            return Some(pid);
        }
    }
    None
}

/// The monitor of a container whose init is among `candidates` (the init pid libcontainer
/// recorded, the processes of its cgroup): the parent of one of them that is a monitor.
/// Returns (monitor pid, init pid).
pub(crate) fn monitor_of(candidates: &[i32]) -> Option<(i32, i32)> {
    candidates.iter().find_map(|&pid| {
        let parent = ppid(pid)?;
        // A process of the container can give itself the monitor's name: a parent that is
        // itself one of the container's processes is never its monitor.
        (parent > 1 && !candidates.contains(&parent) && comm(parent).as_deref() == Some(MONITOR_COMM))
            .then_some((parent, pid))
    })
}

/// What libcontainer names a container's init until it executes the container's program.
const LIBCONTAINER_INIT_COMM: &str = "youki:[2:INIT]";

/// Whether `init` has exec'd its program. A created container's init is still a copy of the
/// process its monitor was forked as, named by libcontainer: its executable is the monitor's
/// while the monitor could not execute the monitor program, and its name is libcontainer's
/// either way (a monitor that runs the program has another executable,
/// docs/runtime.md#the-monitor-image). `None` when either is gone.
pub(crate) fn has_execed(init: i32, monitor: i32) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let id = |pid: i32| {
        fs::metadata(format!("/proc/{pid}/exe"))
            .ok()
            .map(|m| (m.dev(), m.ino()))
    };
    let (init_exe, monitor_exe) = (id(init)?, id(monitor)?);
    Some(init_exe != monitor_exe && comm(init)? != LIBCONTAINER_INIT_COMM)
}

/// Children of `pid` (from /proc/PID/task/*/children).
pub(crate) fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for t in fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(s) = fs::read_to_string(t.path().join("children")) {
            out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    out
}

/// The cgroup (as this process sees it) of any live process whose cgroup's last component is
/// `id`: how a container's cgroup is found when no record names it. Only processes are seen,
/// so an empty cgroup is not found.
pub(crate) fn cgroup_named(id: &str) -> Option<String> {
    if id.is_empty() {
        return None;
    }
    let suffix = format!("/{id}");
    for e in fs::read_dir("/proc").ok()?.flatten() {
        if !e
            .file_name()
            .to_str()
            .is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let Ok(s) = fs::read_to_string(e.path().join("cgroup")) else {
            continue;
        };
        for l in s.lines() {
            let path = l.splitn(3, ':').nth(2).unwrap_or("");
            if path.ends_with(&suffix) {
                return Some(path.to_string());
            }
        }
    }
    None
}

/// When this boot started (wall clock), from `btime` in /proc/stat.
pub(crate) fn boot_time() -> Option<SystemTime> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let secs: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// True when `path` was last written during this boot (by its mtime; a minute of slack for
/// the coarse `btime`). For records whose boot id cannot be read.
pub(crate) fn written_this_boot(path: &Path) -> bool {
    let (Some(boot), Ok(m)) = (boot_time(), fs::metadata(path).and_then(|m| m.modified())) else {
        return true;
    };
    m + Duration::from_secs(60) >= boot
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_facts() {
        let me = std::process::id() as i32;
        assert!(ppid(me).is_some_and(|p| p > 0));
        assert!(comm(me).is_some_and(|c| !c.is_empty()));
        assert!(boot_time().is_some_and(|b| b < SystemTime::now()));
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), "x").unwrap();
        assert!(written_this_boot(&d.path().join("f")));
    }
}
