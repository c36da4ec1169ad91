//! What a monitor reads and does in its container's cgroup when the container ends: its OOM
//! kill count ([`oom_kills`]) and, for a container in a pid namespace it does not own, the
//! processes it left behind ([`signal_all`]). The monitor is handed the paths when it starts
//! (the runtime's `Cgroups` knows the hierarchies; these helpers only read and signal), and the
//! runtime uses the same helpers.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// The pids in `dir`'s `cgroup.procs` and in those of the cgroups below it.
pub fn collect_pids(dir: &Path, out: &mut BTreeSet<i32>, depth: usize) {
    if depth > 32 {
        return;
    }
    if let Ok(s) = fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(s.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_pids(&e.path(), out, depth + 1);
        }
    }
}

/// True when `pid` is, as this process sees `/proc/PID/cgroup`, in `cgroup` or below it.
fn process_in_cgroup(pid: i32, cgroup: &str) -> bool {
    let want = format!("/{}", cgroup.trim_matches('/'));
    fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|s| {
        s.lines().any(|l| {
            let path = l.splitn(3, ':').nth(2).unwrap_or("");
            path == want || path.strip_prefix(want.as_str()).is_some_and(|r| r.starts_with('/'))
        })
    })
}

/// Send `signal` to every process in `cgroup` and below, listed from `dirs` (the cgroup's
/// directory in each hierarchy). Each pid is signalled through a pidfd opened before its
/// membership is checked, so a pid reused by a process outside the cgroup is never signalled.
/// Never a whole hierarchy (an empty `cgroup`). Returns how many were signalled.
pub fn signal_all(dirs: &[impl AsRef<Path>], cgroup: &str, signal: i32) -> usize {
    if cgroup.trim_matches('/').is_empty() {
        return 0;
    }
    let mut pids = BTreeSet::new();
    for d in dirs {
        collect_pids(d.as_ref(), &mut pids, 0);
    }
    let mut n = 0;
    for pid in pids {
        let Ok(pfd) = crate::sys::pidfd_open(pid) else {
            continue;
        };
        if process_in_cgroup(pid, cgroup) && crate::sys::pidfd_send_signal(&pfd, signal).is_ok() {
            n += 1;
        }
    }
    n
}

/// The `oom_kill` count of a v2 `memory.events` or a v1 `memory.oom_control`.
pub fn oom_kills(events_file: &Path) -> Option<u64> {
    read_kv(events_file).get("oom_kill").copied()
}

/// A file of "key value" lines (memory.stat, cpu.stat, memory.events, memory.oom_control,
/// cpuacct.stat); missing file: empty.
pub fn read_kv(p: &Path) -> BTreeMap<String, u64> {
    fs::read_to_string(p).map(|s| parse_kv(&s)).unwrap_or_default()
}

/// "key value" lines; lines whose value is not a number are left out.
pub fn parse_kv(s: &str) -> BTreeMap<String, u64> {
    s.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_parsing() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("m"), "anon 10\ninactive_file 5\nbad\n").unwrap();
        let m = read_kv(&d.path().join("m"));
        assert_eq!(m.get("anon"), Some(&10));
        assert_eq!(m.len(), 2);
        assert!(read_kv(&d.path().join("missing")).is_empty());
        assert_eq!(parse_kv("a 1\nb x\n").len(), 1);
    }

    #[test]
    fn oom_kills_reads_the_oom_kill_line_of_either_version() {
        let d = tempfile::tempdir().unwrap();
        let v2 = d.path().join("memory.events");
        fs::write(&v2, "low 0\nhigh 0\nmax 3\noom 2\noom_kill 1\noom_group_kill 0\n").unwrap();
        assert_eq!(oom_kills(&v2), Some(1));
        let v1 = d.path().join("memory.oom_control");
        fs::write(&v1, "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n").unwrap();
        assert_eq!(oom_kills(&v1), Some(4));
        assert_eq!(oom_kills(&d.path().join("missing")), None);
    }

    #[test]
    fn signal_all_never_signals_a_whole_hierarchy() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("cgroup.procs"), format!("{}\n", std::process::id())).unwrap();
        assert_eq!(signal_all(&[d.path()], "/", 0), 0);
        assert_eq!(signal_all(&[d.path()], "", 0), 0);
    }
}
