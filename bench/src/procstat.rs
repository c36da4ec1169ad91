//! What the kernel says about processes: PSS from smaps_rollup and CPU time from stat.

use std::path::Path;

/// Proportional set size of `pid` in KiB (0 if it is gone).
pub fn pss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The fields of `/proc/<pid>/stat` after the command name (from `state` on), if it is there.
fn stat_fields(pid: i32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    Some(rest.split_whitespace().map(|f| f.parse::<u64>().unwrap_or(0)).collect())
}

/// Sum of the stat fields `range` (indices from `state`), 0 if the process is gone.
fn stat_sum(pid: i32, range: std::ops::Range<usize>) -> u64 {
    stat_fields(pid).map_or(0, |f| f.get(range).map_or(0, |v| v.iter().sum()))
}

/// utime + stime of `pid` in clock ticks (0 if it is gone).
pub fn cpu_ticks(pid: i32) -> u64 {
    stat_sum(pid, 11..13)
}

/// utime + stime + cutime + cstime of `pid` in clock ticks: its own time and that of the
/// children it has waited for (0 if it is gone).
pub fn cpu_ticks_with_children(pid: i32) -> u64 {
    stat_sum(pid, 11..15)
}

pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf with a constant name.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Processes whose command name is `comm`.
pub fn pids_named(comm: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm))
        .collect()
}

/// The children of `pid`.
pub fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let p = t.path().join("children");
        if let Ok(s) = std::fs::read_to_string(&p) {
            out.extend(s.split_whitespace().filter_map(|x| x.parse::<i32>().ok()));
        }
    }
    out
}

/// Monitor pids recorded by a ferrolet runtime under `root`.
pub fn monitors(root: &Path) -> Vec<i32> {
    std::fs::read_dir(root.join("containers"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("monitor.json")).ok())
        .filter_map(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .filter_map(|v| v["monitorPid"].as_i64().map(|p| p as i32))
        .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
        .collect()
}

/// CPU clock ticks so far of an agent `pid` whose processes are `procs` (itself first), split
/// as [`Split`] splits memory: the agent, its zygote, the container monitors under `root`.
pub fn cpu_split(pid: i32, procs: &[i32], root: &Path) -> [u64; 3] {
    let (zygote, mons) = helpers(procs, root);
    let sum = |ps: &[i32]| ps.iter().map(|p| cpu_ticks(*p)).sum();
    [cpu_ticks(pid), sum(&zygote), sum(&mons)]
}

/// The agent's helper processes (`procs` without the agent, which comes first): its zygote's,
/// and the container monitors under `root`.
fn helpers(procs: &[i32], root: &Path) -> (Vec<i32>, Vec<i32>) {
    let mons = monitors(root);
    let zygote = procs[1..].iter().copied().filter(|p| !mons.contains(p)).collect();
    (zygote, mons)
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0) * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

/// The machine's busy and total CPU time so far, in clock ticks, from /proc/stat's `cpu` line
/// (busy: everything but idle and iowait).
pub fn cpu_busy_total() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// Wait until the machine is quiet before a latency section: two half-second windows in a row
/// with the CPUs at most 10% busy, or `limit`. What the previous section left (the kernel
/// tearing down a hundred containers' namespaces, mounts and cgroups, ext4 discards, status
/// writes) otherwise lands in the next section's numbers. Returns how long it waited.
pub fn settle(limit: std::time::Duration) -> std::time::Duration {
    let t0 = std::time::Instant::now();
    let mut quiet = 0;
    let mut last = cpu_busy_total();
    while t0.elapsed() < limit && quiet < 2 {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let now = cpu_busy_total();
        quiet = match (last, now) {
            (Some((b0, t0)), Some((b1, t1))) if t1 > t0 && (b1 - b0) * 10 <= t1 - t0 => quiet + 1,
            _ => 0,
        };
        last = now;
    }
    t0.elapsed()
}

/// The fields of `/proc/<pid>/smaps_rollup` in KiB (empty if it is gone).
pub fn rollup(pid: i32) -> std::collections::HashMap<String, u64> {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.to_string(), v.split_whitespace().next()?.parse().ok()?))
        })
        .collect()
}

/// An agent's PSS split by process, in KiB: the agent's file-backed (its code, mostly) and
/// anonymous pages, its zygote, its container monitors.
pub struct Split {
    pub agent_file: u64,
    pub agent_anon: u64,
    pub zygote: u64,
    pub monitors: u64,
    pub monitor_count: usize,
}

impl Split {
    /// The split of the agent `pid` whose processes are `procs` (itself first) and whose root
    /// dir is `root`.
    pub fn of(pid: i32, procs: &[i32], root: &Path) -> Split {
        let agent = rollup(pid);
        let get = |m: &std::collections::HashMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
        let (zygote, mons) = helpers(procs, root);
        let zygote: u64 = zygote.iter().map(|p| pss_kib(*p)).sum();
        Split {
            agent_file: get(&agent, "Pss_File"),
            agent_anon: get(&agent, "Pss_Anon") + get(&agent, "Pss_Shmem"),
            zygote,
            monitors: mons.iter().map(|p| pss_kib(*p)).sum(),
            monitor_count: mons.len(),
        }
    }

    pub fn total(&self) -> u64 {
        self.agent_file + self.agent_anon + self.zygote + self.monitors
    }

    /// Rows for `what`: the total, and with `per` (the idle split and the pod count) each
    /// part's growth per pod.
    pub fn rows(&self, what: &str, per: Option<(&Split, f64)>) -> Vec<crate::Row> {
        let mib = |k: u64| k as f64 / 1024.0;
        let mut out = Vec::new();
        let mut r = crate::Row::new(format!("memory (PSS): {what}"), "MiB", "podman");
        r.ferrolet = Some(mib(self.total()));
        out.push(r);
        let parts = [
            (
                "agent code and other file pages",
                self.agent_file,
                per.map(|(i, _)| i.agent_file),
            ),
            (
                "agent data (anonymous)",
                self.agent_anon,
                per.map(|(i, _)| i.agent_anon),
            ),
            ("zygote", self.zygote, per.map(|(i, _)| i.zygote)),
            ("monitors", self.monitors, per.map(|(i, _)| i.monitors)),
        ];
        for (name, now, before) in parts {
            let mut r = crate::Row::new(format!("  {what}: {name}"), "MiB", "podman");
            r.ferrolet = Some(mib(now));
            out.push(r);
            if let (Some(b), Some((_, n))) = (before, per) {
                let mut r = crate::Row::new(format!("  {what}: {name}, per pod"), "KiB", "podman");
                r.ferrolet = Some((now as f64 - b as f64) / n);
                out.push(r);
            }
        }
        if let Some((i, n)) = per {
            let mut r = crate::Row::new(format!("memory (PSS) per pod: {what}"), "KiB", "podman");
            r.ferrolet = Some((self.total() as f64 - i.total() as f64) / n);
            out.push(r);
        }
        if self.monitor_count > 0 {
            let mut r = crate::Row::new(format!("  {what}: one monitor, mean"), "KiB", "podman");
            r.ferrolet = Some(self.monitors as f64 / self.monitor_count as f64);
            out.push(r);
        }
        out
    }
}
