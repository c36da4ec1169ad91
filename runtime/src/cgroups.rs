//! cgroups as the node has them: pure v2 (unified), or v1 controllers (legacy, or hybrid with an
//! empty cgroup2 beside them, as libcgroups treats it). The runtime creates container cgroups
//! through libcontainer; this module creates the parents (pod and QoS levels) with their
//! limits, removes them, tells the cgroup a process started in (so everything can nest under
//! it), and reads stats tolerantly: a missing file is a missing number, never an error.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::kept_files::KeptFiles;
use ferrolet_monitor::cgroup::collect_pids;

/// Controllers ferrolet sets limits with or reads stats from.
const V1_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "pids",
    "devices",
    "freezer",
    "blkio",
    "hugetlb",
    "perf_event",
    "net_cls",
    "net_prio",
    "rdma",
    "misc",
];
const V2_CONTROLLERS: &[&str] = &["cpu", "cpuset", "io", "memory", "pids", "hugetlb"];

#[derive(Debug, Clone)]
pub enum CgroupMode {
    /// cgroup2 mounted at this path holds every controller.
    V2 { mount: PathBuf },
    /// v1 controllers, each at its mount point (`cpu,cpuacct` may share one). `named` holds
    /// the hierarchies without a controller ferrolet drives (`name=systemd`, and the hybrid
    /// layout's cgroup2 under the key ""): other runtimes create cgroups there, so nested
    /// roots and removal cover them too.
    V1 {
        mounts: BTreeMap<String, PathBuf>,
        named: BTreeMap<String, PathBuf>,
    },
}

/// Limits for a pod or QoS level cgroup.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CgroupLimits {
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub memory_limit: Option<i64>,
    pub pids_limit: Option<i64>,
    /// Huge page limits by the kernel's page size name (`2MB`, `1GB`), in bytes; `-1` is no
    /// limit. Written only where the hugetlb controller is available.
    #[serde(default)]
    pub hugetlb: BTreeMap<String, i64>,
}

/// Usage read from a cgroup; `None` where the node does not account it. Counters are
/// cumulative since the cgroup was created; see docs/cgroups.md#stats for the file each comes
/// from on v1 and v2.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CgroupStats {
    pub cpu_usage_nanos: Option<u64>,
    pub cpu_user_nanos: Option<u64>,
    pub cpu_system_nanos: Option<u64>,
    /// CFS enforcement periods elapsed, those throttled, and the time throttled.
    pub cpu_periods: Option<u64>,
    pub cpu_throttled_periods: Option<u64>,
    pub cpu_throttled_nanos: Option<u64>,
    pub memory_usage_bytes: Option<u64>,
    /// The highest usage recorded (v1 `max_usage_in_bytes`, v2 `memory.peak` where the kernel
    /// has it).
    pub memory_max_usage_bytes: Option<u64>,
    pub memory_working_set_bytes: Option<u64>,
    pub memory_rss_bytes: Option<u64>,
    pub memory_cache_bytes: Option<u64>,
    pub memory_mapped_file_bytes: Option<u64>,
    pub memory_swap_bytes: Option<u64>,
    pub memory_page_faults: Option<u64>,
    pub memory_major_page_faults: Option<u64>,
    /// Tasks (threads included) in the cgroup and below.
    pub pids: Option<u64>,
    pub oom_kills: Option<u64>,
    /// The limits in force: `None` for no limit.
    pub memory_limit_bytes: Option<u64>,
    pub cpu_shares: Option<u64>,
    pub cpu_quota_us: Option<u64>,
    pub cpu_period_us: Option<u64>,
}

/// A cgroup's cpu counter and memory usage ([`Cgroups::pulse`]): while both stay as they were,
/// nothing in the cgroup ran, forked, faulted or was charged memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pulse {
    pub cpu_nanos: Option<u64>,
    pub memory_bytes: Option<u64>,
}

impl Pulse {
    /// Whether it says anything: a cgroup without either controller has no pulse to compare.
    pub fn known(&self) -> bool {
        self.cpu_nanos.is_some() && self.memory_bytes.is_some()
    }
}

#[derive(Debug, Clone)]
pub struct Cgroups {
    mode: CgroupMode,
    /// The stats' files, kept open between reads (shared by the clones).
    stat_files: Arc<KeptFiles>,
}

impl Cgroups {
    /// Detect the node's layout from /proc/self/mountinfo.
    pub fn detect() -> Result<Cgroups> {
        let info = fs::read_to_string("/proc/self/mountinfo").map_err(|e| Error::Cgroup {
            path: "/proc/self/mountinfo".into(),
            reason: e.to_string(),
        })?;
        let mut v1 = BTreeMap::new();
        let mut named = BTreeMap::new();
        let mut v2: Option<PathBuf> = None;
        for line in info.lines() {
            // "... mountpoint opts ... - fstype source superopts"
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let mp = pre.split(' ').nth(4).unwrap_or("");
            let mut post = post.split(' ');
            let fstype = post.next().unwrap_or("");
            let superopts = post.nth(1).unwrap_or("");
            match fstype {
                "cgroup2" if v2.is_none() || mp == "/sys/fs/cgroup" => {
                    v2 = Some(PathBuf::from(unescape(mp)));
                }
                "cgroup" => {
                    for opt in superopts.split(',') {
                        if V1_CONTROLLERS.contains(&opt) {
                            v1.entry(opt.to_string()).or_insert_with(|| PathBuf::from(unescape(mp)));
                        } else if opt.starts_with("name=") {
                            named
                                .entry(opt.to_string())
                                .or_insert_with(|| PathBuf::from(unescape(mp)));
                        }
                    }
                }
                _ => {}
            }
        }
        let unified_root = is_cgroup2(Path::new("/sys/fs/cgroup"));
        let v1_mode = |mounts, mut named: BTreeMap<String, PathBuf>, v2: Option<PathBuf>| {
            if let Some(unified) = v2 {
                named.insert(String::new(), unified);
            }
            CgroupMode::V1 { mounts, named }
        };
        let mode = if v1.contains_key("memory") && !unified_root {
            v1_mode(v1, named, v2)
        } else if let Some(m) = v2 {
            CgroupMode::V2 { mount: m }
        } else if !v1.is_empty() {
            v1_mode(v1, named, None)
        } else {
            return Err(Error::Cgroup {
                path: "/sys/fs/cgroup".into(),
                reason: "no cgroup v1 controllers and no cgroup2 mount found".into(),
            });
        };
        Ok(Cgroups {
            mode,
            stat_files: Arc::default(),
        })
    }

    pub fn mode(&self) -> &CgroupMode {
        &self.mode
    }

    pub fn is_v2(&self) -> bool {
        matches!(self.mode, CgroupMode::V2 { .. })
    }

    /// The cgroup this process runs in: on v2 the unified path, on v1 the memory controller's
    /// (the one these machines confine processes with). Nest everything under it.
    pub fn own_path(&self) -> Result<String> {
        let data = fs::read_to_string("/proc/self/cgroup").map_err(|e| Error::Cgroup {
            path: "/proc/self/cgroup".into(),
            reason: e.to_string(),
        })?;
        for line in data.lines() {
            let mut f = line.splitn(3, ':');
            let (_, ctrls, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
            let hit = if self.is_v2() {
                ctrls.is_empty()
            } else {
                ctrls.split(',').any(|c| c == "memory")
            };
            if hit {
                return Ok(path.to_string());
            }
        }
        Err(Error::Cgroup {
            path: "/proc/self/cgroup".into(),
            reason: "no entry for this process's cgroup".into(),
        })
    }

    /// Directories backing a cgroup path, one per hierarchy.
    pub fn dirs(&self, cgroup: &str) -> Vec<PathBuf> {
        let rel = cgroup.trim_start_matches('/');
        match &self.mode {
            CgroupMode::V2 { mount } => vec![mount.join(rel)],
            CgroupMode::V1 { mounts, .. } => {
                let mut v: Vec<PathBuf> = mounts.values().map(|m| m.join(rel)).collect();
                v.sort();
                v.dedup();
                v
            }
        }
    }

    /// [`dirs`](Cgroups::dirs) plus the hierarchies without controllers (v1 `name=` ones and
    /// a hybrid node's cgroup2): where a process must be moved to be fully inside a cgroup.
    pub fn all_dirs(&self, cgroup: &str) -> Vec<PathBuf> {
        let rel = cgroup.trim_start_matches('/');
        self.mounts().into_iter().map(|m| m.join(rel)).collect()
    }

    /// The directory of `cgroup` in the hierarchy holding `controller`.
    pub fn dir_for(&self, controller: &str, cgroup: &str) -> Option<PathBuf> {
        let rel = cgroup.trim_start_matches('/');
        match &self.mode {
            CgroupMode::V2 { mount } => Some(mount.join(rel)),
            CgroupMode::V1 { mounts, .. } => mounts.get(controller).map(|m| m.join(rel)),
        }
    }

    /// Create `cgroup` (and missing parents) in every hierarchy and apply `limits`.
    pub fn create(&self, cgroup: &str, limits: &CgroupLimits) -> Result<()> {
        let err = |p: &Path, e: std::io::Error| Error::Cgroup {
            path: p.display().to_string(),
            reason: e.to_string(),
        };
        match &self.mode {
            CgroupMode::V2 { mount } => {
                let target = mount.join(cgroup.trim_start_matches('/'));
                // Every ancestor below the mount must delegate the controllers to its children.
                let mut cur = mount.clone();
                for comp in Path::new(cgroup.trim_start_matches('/')).components() {
                    enable_subtree_controllers(&cur)?;
                    cur = cur.join(comp);
                    if !cur.exists() {
                        fs::create_dir(&cur).map_err(|e| err(&cur, e))?;
                    }
                }
                self.apply(&target, limits)
            }
            CgroupMode::V1 { .. } => {
                for d in self.dirs(cgroup) {
                    fs::create_dir_all(&d).map_err(|e| err(&d, e))?;
                }
                if let Some(cpuset) = self.dir_for("cpuset", cgroup) {
                    fill_cpuset(&cpuset)?;
                }
                self.apply_v1(cgroup, limits)
            }
        }
    }

    fn apply(&self, dir: &Path, l: &CgroupLimits) -> Result<()> {
        if let Some(s) = l.cpu_shares {
            write_cg(dir, "cpu.weight", &shares_to_weight(s).to_string())?;
        }
        if l.cpu_quota.is_some() || l.cpu_period.is_some() {
            let quota = match l.cpu_quota {
                Some(q) if q > 0 => q.to_string(),
                _ => "max".to_string(),
            };
            write_cg(dir, "cpu.max", &format!("{quota} {}", l.cpu_period.unwrap_or(100_000)))?;
        }
        if let Some(m) = l.memory_limit {
            write_cg(dir, "memory.max", &if m > 0 { m.to_string() } else { "max".into() })?;
        }
        if let Some(p) = l.pids_limit {
            write_cg(dir, "pids.max", &if p > 0 { p.to_string() } else { "max".into() })?;
        }
        for (size, limit) in &l.hugetlb {
            let file = format!("hugetlb.{size}.max");
            if dir.join(&file).exists() {
                write_cg(dir, &file, &if *limit >= 0 { limit.to_string() } else { "max".into() })?;
            }
        }
        Ok(())
    }

    fn apply_v1(&self, cgroup: &str, l: &CgroupLimits) -> Result<()> {
        let need = |c: &str| {
            self.dir_for(c, cgroup).ok_or_else(|| Error::Cgroup {
                path: cgroup.to_string(),
                reason: format!("the {c} controller is not mounted"),
            })
        };
        if let Some(s) = l.cpu_shares {
            write_cg(&need("cpu")?, "cpu.shares", &s.to_string())?;
        }
        if let Some(p) = l.cpu_period {
            write_cg(&need("cpu")?, "cpu.cfs_period_us", &p.to_string())?;
        }
        if let Some(q) = l.cpu_quota {
            write_cg(
                &need("cpu")?,
                "cpu.cfs_quota_us",
                &if q > 0 { q.to_string() } else { "-1".into() },
            )?;
        }
        if let Some(m) = l.memory_limit {
            write_cg(
                &need("memory")?,
                "memory.limit_in_bytes",
                &if m > 0 { m.to_string() } else { "-1".into() },
            )?;
        }
        if let Some(p) = l.pids_limit {
            write_cg(
                &need("pids")?,
                "pids.max",
                &if p > 0 { p.to_string() } else { "max".into() },
            )?;
        }
        if let Some(dir) = self.dir_for("hugetlb", cgroup).filter(|_| !l.hugetlb.is_empty()) {
            for (size, limit) in &l.hugetlb {
                let file = format!("hugetlb.{size}.limit_in_bytes");
                if dir.join(&file).exists() {
                    write_cg(&dir, &file, &if *limit >= 0 { limit.to_string() } else { "-1".into() })?;
                }
            }
        }
        Ok(())
    }

    /// Whether huge page limits can be set: the hugetlb controller is mounted (v1) or offered
    /// (v2).
    pub fn has_hugetlb(&self) -> bool {
        match &self.mode {
            CgroupMode::V2 { mount } => read_trim(&mount.join("cgroup.controllers"))
                .split_whitespace()
                .any(|c| c == "hugetlb"),
            CgroupMode::V1 { mounts, .. } => mounts.contains_key("hugetlb"),
        }
    }

    /// The memory in use in `cgroup` (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    pub fn memory_usage(&self, cgroup: &str) -> Option<u64> {
        let d = self.dir_for("memory", cgroup)?;
        read_u64(&d.join(if self.is_v2() {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        }))
    }

    /// Read one file of `cgroup` in the hierarchy of `controller` (trimmed); None when absent.
    pub fn read_file(&self, controller: &str, cgroup: &str, file: &str) -> Option<String> {
        let d = self.dir_for(controller, cgroup)?;
        fs::read_to_string(d.join(file)).ok().map(|s| s.trim().to_string())
    }

    /// Update limits of an existing cgroup.
    pub fn update(&self, cgroup: &str, limits: &CgroupLimits) -> Result<()> {
        match &self.mode {
            CgroupMode::V2 { mount } => self.apply(&mount.join(cgroup.trim_start_matches('/')), limits),
            CgroupMode::V1 { .. } => self.apply_v1(cgroup, limits),
        }
    }

    /// Remove `cgroup` and every cgroup below it, deepest first, in every hierarchy. Processes
    /// still inside make this fail with the path named.
    pub fn remove(&self, cgroup: &str) -> Result<()> {
        // Every hierarchy is attempted; the first failure is reported.
        let mut first = None;
        for d in self.all_dirs(cgroup) {
            if let Err(e) = remove_cgroup_dir(&d) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    pub fn exists(&self, cgroup: &str) -> bool {
        self.dir_for("memory", cgroup).is_some_and(|d| d.is_dir())
    }

    /// Pids of processes in the cgroup (not below it).
    pub fn procs(&self, cgroup: &str) -> Vec<i32> {
        let Some(d) = self.dir_for("pids", cgroup).or_else(|| self.dir_for("memory", cgroup)) else {
            return Vec::new();
        };
        fs::read_to_string(d.join("cgroup.procs"))
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Pids of every process in `cgroup` or below it, in any hierarchy (an absent cgroup has
    /// none).
    pub fn procs_below(&self, cgroup: &str) -> Vec<i32> {
        let mut pids = std::collections::BTreeSet::new();
        for d in self.all_dirs(cgroup) {
            collect_pids(&d, &mut pids, 0);
        }
        pids.into_iter().collect()
    }

    /// How many processes are in `cgroup` and below, counted in one hierarchy (pids, else
    /// memory): cheaper than [`procs_below`](Cgroups::procs_below) for stats.
    pub fn process_count(&self, cgroup: &str) -> usize {
        match self.dir_for("pids", cgroup).or_else(|| self.dir_for("memory", cgroup)) {
            Some(d) => self.count_below(&d, cgroup.trim_end_matches('/'), None, 0),
            None => 0,
        }
    }

    /// [`process_count`](Cgroups::process_count) of `cgroup` and of every cgroup below it, in
    /// one walk: keyed by cgroup path (`cgroup` as given, then `/`-joined names below it).
    pub fn process_counts(&self, cgroup: &str) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        if let Some(d) = self.dir_for("pids", cgroup).or_else(|| self.dir_for("memory", cgroup)) {
            self.count_below(&d, cgroup.trim_end_matches('/'), Some(&mut out), 0);
        }
        out
    }

    /// Processes in the cgroup directory `dir` (path `cgroup`) and below. The directory is
    /// listed only when it has subdirectories (a cgroupfs directory's link count is 2 plus its
    /// subdirectories), and on v2 `cgroup.procs` is read through a kept descriptor (v2 lists
    /// the processes afresh at every read from the start): a container's cgroup costs a read
    /// and a stat, not two opens, a listing and two closes.
    fn count_below(
        &self,
        dir: &Path,
        cgroup: &str,
        mut out: Option<&mut HashMap<String, usize>>,
        depth: usize,
    ) -> usize {
        if depth > 32 {
            return 0;
        }
        let procs = dir.join("cgroup.procs");
        let listed = match self.mode {
            CgroupMode::V2 { .. } => self.stat_files.read(&procs),
            // v1 keeps the list an open file made for as long as it is read again within a
            // second: a kept descriptor could read a stale one.
            CgroupMode::V1 { .. } => fs::read_to_string(&procs).ok(),
        };
        let mut n = listed.map_or(0, |s| s.lines().filter(|l| l.trim().parse::<i32>().is_ok()).count());
        if fs::metadata(dir).is_ok_and(|m| m.nlink() > 2) {
            for e in fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let child = format!("{cgroup}/{}", e.file_name().to_string_lossy());
                    n += self.count_below(&e.path(), &child, out.as_deref_mut(), depth + 1);
                }
            }
        }
        if let Some(out) = out {
            out.insert(cgroup.to_string(), n);
        }
        n
    }

    /// Send `signal` to every process in `cgroup` and below, in every hierarchy
    /// ([`ferrolet_monitor::cgroup::signal_all`]: through pidfds, so a reused pid outside the
    /// cgroup is never signalled). Returns how many were signalled.
    pub(crate) fn signal_all(&self, cgroup: &str, signal: i32) -> usize {
        ferrolet_monitor::cgroup::signal_all(&self.all_dirs(cgroup), cgroup, signal)
    }

    /// SIGKILL every process in `cgroup` and below until none is left or `timeout` passes
    /// (processes forked meanwhile are killed in the next round). Returns the pids still there
    /// at the end: empty when done. For containers whose records cannot say what runs.
    pub fn kill_all(&self, cgroup: &str, timeout: std::time::Duration) -> Vec<i32> {
        if cgroup.trim_matches('/').is_empty() {
            return self.procs_below(cgroup); // never a whole hierarchy
        }
        let deadline = std::time::Instant::now() + timeout;
        // cgroup v2 (Linux 5.14+) kills a whole subtree at once.
        if let CgroupMode::V2 { mount } = &self.mode {
            let _ = fs::write(mount.join(cgroup.trim_start_matches('/')).join("cgroup.kill"), "1");
        }
        loop {
            let left = self.procs_below(cgroup);
            if left.is_empty() || std::time::Instant::now() >= deadline {
                return left;
            }
            self.signal_all(cgroup, libc::SIGKILL);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Number of OOM kills in the cgroup so far.
    pub fn oom_kills(&self, cgroup: &str) -> Option<u64> {
        ferrolet_monitor::cgroup::oom_kills(&self.oom_events_file(cgroup)?)
    }

    /// The file whose `oom_kill` line counts the cgroup's OOM kills: v2 `memory.events`, v1
    /// `memory.oom_control`. A monitor is handed it when it starts, to read when its container
    /// exits.
    pub(crate) fn oom_events_file(&self, cgroup: &str) -> Option<PathBuf> {
        let d = self.dir_for("memory", cgroup)?;
        Some(match &self.mode {
            CgroupMode::V2 { .. } => d.join("memory.events"),
            CgroupMode::V1 { .. } => d.join("memory.oom_control"),
        })
    }

    /// The two numbers that move whenever anything in `cgroup` or below it runs or its memory
    /// changes: its cpu counter and its memory usage (v1 `cpuacct.usage` and
    /// `memory.usage_in_bytes`, v2 `cpu.stat`'s `usage_usec` and `memory.current`), two small
    /// reads where [`stats`](Cgroups::stats) makes a dozen.
    pub fn pulse(&self, cgroup: &str) -> Pulse {
        let files = &*self.stat_files;
        match &self.mode {
            CgroupMode::V2 { mount } => {
                let d = mount.join(cgroup.trim_start_matches('/'));
                Pulse {
                    cpu_nanos: kept_kv(files, &d.join("cpu.stat"))
                        .get("usage_usec")
                        .map(|u| u.saturating_mul(1000)),
                    memory_bytes: kept_u64(files, &d.join("memory.current")),
                }
            }
            CgroupMode::V1 { .. } => Pulse {
                cpu_nanos: self
                    .dir_for("cpuacct", cgroup)
                    .and_then(|d| kept_u64(files, &d.join("cpuacct.usage"))),
                memory_bytes: self
                    .dir_for("memory", cgroup)
                    .and_then(|d| kept_u64(files, &d.join("memory.usage_in_bytes"))),
            },
        }
    }

    /// Usage numbers for a cgroup; whatever the node does not have is left out. Its files are
    /// kept open for the next time ([`KeptFiles`]).
    pub fn stats(&self, cgroup: &str) -> CgroupStats {
        let files = &*self.stat_files;
        match &self.mode {
            CgroupMode::V2 { mount } => stats_v2(files, &mount.join(cgroup.trim_start_matches('/'))),
            CgroupMode::V1 { .. } => stats_v1(
                files,
                self.dir_for("cpu", cgroup).as_deref(),
                self.dir_for("cpuacct", cgroup).as_deref(),
                self.dir_for("memory", cgroup).as_deref(),
                self.dir_for("pids", cgroup).as_deref(),
            ),
        }
    }
}

/// v1 reports "no limit" as a huge page-aligned number; anything at or above this is none.
const V1_NO_LIMIT: u64 = 1 << 62;

/// A kept file's number (as [`read_u64`]).
fn kept_u64(files: &KeptFiles, p: &Path) -> Option<u64> {
    files.read(p)?.trim().parse().ok()
}

/// A kept file's "key value" lines (as [`ferrolet_monitor::cgroup::read_kv`]), looked up where they are: a sampling
/// round reads a few keys of each file, and a map of all of them (v1's memory.stat has 35) was
/// an allocation per key per cgroup per round.
fn kept_kv(files: &KeptFiles, p: &Path) -> Kv {
    Kv(files.read(p).unwrap_or_default())
}

/// A "key value" file's content.
struct Kv(String);

impl Kv {
    fn get(&self, key: &str) -> Option<u64> {
        self.find(|k| k == key)
    }

    /// v1 memory.stat's hierarchical `total_<key>` where the kernel has it, else `<key>`.
    fn total_or_own(&self, key: &str) -> Option<u64> {
        self.find(|k| k.strip_prefix("total_") == Some(key))
            .or_else(|| self.get(key))
    }

    fn find(&self, want: impl Fn(&str) -> bool) -> Option<u64> {
        self.0.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            want(k).then(|| v.trim().parse().ok()).flatten()
        })
    }
}

fn stats_v2(files: &KeptFiles, d: &Path) -> CgroupStats {
    let cpu = kept_kv(files, &d.join("cpu.stat"));
    let ms = kept_kv(files, &d.join("memory.stat"));
    let usec = |k: &str| cpu.get(k).map(|u| u.saturating_mul(1000));
    let usage = kept_u64(files, &d.join("memory.current"));
    let cpu_max = files.read(&d.join("cpu.max")).unwrap_or_default();
    let (quota, period) = match cpu_max.trim().split_once(' ') {
        Some((q, p)) => (q.parse().ok(), p.parse().ok()),
        None => (None, None),
    };
    CgroupStats {
        cpu_usage_nanos: usec("usage_usec"),
        cpu_user_nanos: usec("user_usec"),
        cpu_system_nanos: usec("system_usec"),
        cpu_periods: cpu.get("nr_periods"),
        cpu_throttled_periods: cpu.get("nr_throttled"),
        cpu_throttled_nanos: usec("throttled_usec"),
        memory_usage_bytes: usage,
        memory_max_usage_bytes: kept_u64(files, &d.join("memory.peak")),
        memory_working_set_bytes: usage.map(|u| working_set(u, ms.get("inactive_file"))),
        memory_rss_bytes: ms.get("anon"),
        memory_cache_bytes: ms.get("file"),
        memory_mapped_file_bytes: ms.get("file_mapped"),
        memory_swap_bytes: kept_u64(files, &d.join("memory.swap.current")),
        memory_page_faults: ms.get("pgfault"),
        memory_major_page_faults: ms.get("pgmajfault"),
        pids: kept_u64(files, &d.join("pids.current")),
        oom_kills: kept_kv(files, &d.join("memory.events")).get("oom_kill"),
        // "max" does not parse: no limit.
        memory_limit_bytes: kept_u64(files, &d.join("memory.max")),
        cpu_shares: kept_u64(files, &d.join("cpu.weight")).map(weight_to_shares),
        cpu_quota_us: quota,
        cpu_period_us: period,
    }
}

fn stats_v1(
    files: &KeptFiles,
    cpu: Option<&Path>,
    cpuacct: Option<&Path>,
    memory: Option<&Path>,
    pids: Option<&Path>,
) -> CgroupStats {
    let mut s = CgroupStats::default();
    if let Some(d) = cpuacct {
        s.cpu_usage_nanos = kept_u64(files, &d.join("cpuacct.usage"));
        // cpuacct.stat counts in USER_HZ ticks.
        let ticks = kept_kv(files, &d.join("cpuacct.stat"));
        let ns_per_tick = 1_000_000_000 / clock_ticks_per_second();
        s.cpu_user_nanos = ticks.get("user").map(|t| t.saturating_mul(ns_per_tick));
        s.cpu_system_nanos = ticks.get("system").map(|t| t.saturating_mul(ns_per_tick));
    }
    if let Some(d) = cpu {
        let st = kept_kv(files, &d.join("cpu.stat"));
        s.cpu_periods = st.get("nr_periods");
        s.cpu_throttled_periods = st.get("nr_throttled");
        s.cpu_throttled_nanos = st.get("throttled_time");
        s.cpu_shares = kept_u64(files, &d.join("cpu.shares"));
        // -1 (no quota) does not parse as u64.
        s.cpu_quota_us = kept_u64(files, &d.join("cpu.cfs_quota_us"));
        s.cpu_period_us = kept_u64(files, &d.join("cpu.cfs_period_us"));
    }
    if let Some(d) = memory {
        let ms = kept_kv(files, &d.join("memory.stat"));
        // Hierarchical totals (total_*) where the kernel has them.
        let get = |k: &str| ms.total_or_own(k);
        let usage = kept_u64(files, &d.join("memory.usage_in_bytes"));
        s.memory_usage_bytes = usage;
        s.memory_max_usage_bytes = kept_u64(files, &d.join("memory.max_usage_in_bytes"));
        s.memory_working_set_bytes = usage.map(|u| working_set(u, get("inactive_file")));
        s.memory_rss_bytes = get("rss");
        s.memory_cache_bytes = get("cache");
        s.memory_mapped_file_bytes = get("mapped_file");
        s.memory_swap_bytes = get("swap");
        s.memory_page_faults = get("pgfault");
        s.memory_major_page_faults = get("pgmajfault");
        s.oom_kills = kept_kv(files, &d.join("memory.oom_control")).get("oom_kill");
        s.memory_limit_bytes = kept_u64(files, &d.join("memory.limit_in_bytes")).filter(|l| *l < V1_NO_LIMIT);
    }
    if let Some(d) = pids {
        s.pids = kept_u64(files, &d.join("pids.current"));
    }
    s
}

/// cAdvisor's working set: usage less inactive file pages (never below zero).
pub fn working_set(usage: u64, inactive_file: Option<u64>) -> u64 {
    usage.saturating_sub(inactive_file.unwrap_or(0))
}

/// USER_HZ, the unit of cpuacct.stat and /proc/stat.
pub(crate) fn clock_ticks_per_second() -> u64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as u64,
        _ => 100,
    }
}

/// A cgroup created below this process's own cgroup (the rule on shared machines: never at a
/// hierarchy root). On v1 the same path is created in every hierarchy, which can mean creating
/// ancestors in hierarchies where this process sits at the root; [`cleanup`](NestedRoot::cleanup)
/// removes the tree and then those ancestors when they are empty, so the machine is left as it
/// was found. Safe when several processes (parallel tests) share the ancestors.
pub struct NestedRoot {
    cgroups: Cgroups,
    path: String,
}

impl NestedRoot {
    /// Create `<own cgroup>/<name>` in every hierarchy.
    pub fn create(cgroups: &Cgroups, name: &str) -> Result<NestedRoot> {
        let own = cgroups.own_path()?;
        let path = format!("{}/{}", own.trim_end_matches('/'), name);
        for m in cgroups.mounts() {
            let mut cur = m.clone();
            for c in Path::new(path.trim_start_matches('/')).components() {
                cur = cur.join(c);
                match fs::create_dir(&cur) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        return Err(Error::Cgroup {
                            path: cur.display().to_string(),
                            reason: e.to_string(),
                        })
                    }
                }
            }
        }
        let root = NestedRoot {
            cgroups: cgroups.clone(),
            path,
        };
        if let CgroupMode::V1 { .. } = cgroups.mode {
            if let Some(cpuset) = cgroups.dir_for("cpuset", &root.path) {
                fill_cpuset(&cpuset)?;
            }
        }
        Ok(root)
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Remove everything below the root, the root, and its empty ancestors that are not this
    /// process's own cgroup (or above it) in their hierarchy.
    pub fn cleanup(&self) -> Result<()> {
        self.cgroups.remove(&self.path)?;
        self.cgroups.remove_empty_ancestors(&self.path);
        Ok(())
    }
}

impl Cgroups {
    /// Mount points of every hierarchy (one on v2), including v1's controller-less ones.
    pub fn mounts(&self) -> Vec<PathBuf> {
        match &self.mode {
            CgroupMode::V2 { mount } => vec![mount.clone()],
            CgroupMode::V1 { mounts, named } => {
                let mut v: Vec<PathBuf> = mounts.values().chain(named.values()).cloned().collect();
                v.sort();
                v.dedup();
                v
            }
        }
    }

    /// This process's own `cgroup.procs` in one hierarchy (memory on v1, the unified one on
    /// v2): writing its pid there is a cgroup migration that moves nothing
    /// ([`MigrationWarmer`](crate::migration_warmer::MigrationWarmer)).
    pub(crate) fn own_procs_file(&self) -> std::io::Result<PathBuf> {
        let mount = match &self.mode {
            CgroupMode::V2 { mount } => mount.clone(),
            CgroupMode::V1 { mounts, .. } => mounts
                .get("memory")
                .or_else(|| mounts.values().next())
                .cloned()
                .ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::NotFound, "no cgroup v1 controller is mounted")
                })?,
        };
        let own = self.own_path_in(&mount).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "this process's cgroup is not in /proc/self/cgroup",
            )
        })?;
        Ok(mount.join(own.trim_start_matches('/')).join("cgroup.procs"))
    }

    /// This process's cgroup in the hierarchy mounted at `mount`.
    fn own_path_in(&self, mount: &Path) -> Option<String> {
        let data = fs::read_to_string("/proc/self/cgroup").ok()?;
        let ctrls: Vec<String> = match &self.mode {
            CgroupMode::V2 { .. } => return data.lines().find(|l| l.starts_with("0::")).map(|l| l[3..].to_string()),
            CgroupMode::V1 { mounts, named } => {
                if named.get("").is_some_and(|m| m.as_path() == mount) {
                    return data.lines().find(|l| l.starts_with("0::")).map(|l| l[3..].to_string());
                }
                mounts
                    .iter()
                    .chain(named.iter())
                    .filter(|(_, m)| m.as_path() == mount)
                    .map(|(c, _)| c.clone())
                    .collect()
            }
        };
        data.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, c, p) = (f.next()?, f.next()?, f.next()?);
            c.split(',')
                .any(|x| ctrls.iter().any(|w| w == x))
                .then(|| p.to_string())
        })
    }

    /// rmdir the ancestors of `cgroup` (deepest first) that are empty, stopping below the
    /// hierarchy root and never touching this process's own cgroup or its ancestors.
    pub(crate) fn remove_empty_ancestors(&self, cgroup: &str) {
        for m in self.mounts() {
            let own = self.own_path_in(&m).unwrap_or_else(|| "/".into());
            let own = Path::new(&own);
            let mut cur = Path::new(cgroup).parent();
            while let Some(c) = cur {
                if c == Path::new("/") || c.as_os_str().is_empty() || own.starts_with(c) {
                    break;
                }
                if fs::remove_dir(m.join(c.strip_prefix("/").unwrap_or(c))).is_err() {
                    break;
                }
                cur = c.parent();
            }
        }
    }
}

/// A page size in kB as the hugetlb controller's files name it: `2048` -> `2MB`,
/// `1048576` -> `1GB`, `64` -> `64KB`.
pub fn hugepage_size_name(kb: u64) -> String {
    if kb >= 1 << 20 && kb % (1 << 20) == 0 {
        format!("{}GB", kb >> 20)
    } else if kb >= 1 << 10 && kb % (1 << 10) == 0 {
        format!("{}MB", kb >> 10)
    } else {
        format!("{kb}KB")
    }
}

/// True when `/sys/fs/cgroup` is cgroup2 (runc's IsCgroup2UnifiedMode).
pub(crate) fn unified_mode() -> bool {
    is_cgroup2(Path::new("/sys/fs/cgroup"))
}

/// cgroup v2 cpu.weight back to v1 cpu.shares (the inverse of [`shares_to_weight`], as cAdvisor
/// reports spec.cpu.shares on v2).
pub(crate) fn weight_to_shares(weight: u64) -> u64 {
    if weight == 0 {
        return 0;
    }
    2 + ((weight.clamp(1, 10_000) - 1) * 262_142) / 9999
}

/// cgroup v1 cpu.shares to v2 cpu.weight, the linear conversion kubelet uses for the pod, QoS
/// and node cgroups (and runc used before 1.3.2). Containers get
/// [`container_shares_to_weight`] instead.
pub fn shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 100;
    }
    let s = shares.clamp(2, 262_144);
    1 + ((s - 2) * 9999) / 262_142
}

/// The cpu.weight a container's cgroup gets on v2 for the OCI spec's `cpu.shares`: libcontainer
/// converts as runc >= 1.3.2 and crun >= 1.23 do, on a curve that maps 1024 shares (one cpu) to
/// the default weight 100, where the linear [`shares_to_weight`] gives 39. So, as with
/// containerd and a current runc, a container's weight differs from its pod's.
pub fn container_shares_to_weight(shares: u64) -> u64 {
    match shares {
        0 => 0,
        1..=2 => 1,
        262_144.. => 10_000,
        s => {
            let l = (s as f64).log2();
            let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
            (10f64.powf(exponent).ceil() as u64).clamp(1, 10_000)
        }
    }
}

/// Make `dir` delegate to its children every controller it has and ferrolet uses. Only the
/// missing ones are written, so levels above a delegated subtree (owned by systemd) are left
/// alone when they already delegate.
fn enable_subtree_controllers(dir: &Path) -> Result<()> {
    let sc = dir.join("cgroup.subtree_control");
    let enabled = read_trim(&sc);
    let missing: Vec<String> = available_controllers(dir)
        .into_iter()
        .filter(|c| !enabled.split_whitespace().any(|e| e == c))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let line = missing.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(" ");
    fs::write(&sc, &line).map_err(|e| Error::Cgroup {
        path: sc.display().to_string(),
        reason: format!(
            "enabling {line}: {e} (a cgroup with processes in it cannot delegate controllers; nest the cgroup root in an empty cgroup)"
        ),
    })
}

/// On cgroup v2, move `pids` (the agent and its zygote) out of their cgroup `own` into the
/// leaf `<own>/<leaf>`, so that `own` may delegate controllers to the pod cgroups created
/// below it (the "no internal processes" rule). Refuses when `own` holds anyone else's
/// processes. Nothing to do on v1 or in the root cgroup.
pub fn vacate_own_cgroup(cgroups: &Cgroups, own: &str, leaf: &str, pids: &[i32]) -> Result<()> {
    let CgroupMode::V2 { mount } = &cgroups.mode else {
        return Ok(());
    };
    if own == "/" || own.is_empty() {
        return Ok(());
    }
    let dir = mount.join(own.trim_start_matches('/'));
    let procs: Vec<i32> = fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default();
    let foreign: Vec<i32> = procs.iter().copied().filter(|p| !pids.contains(p)).collect();
    if !foreign.is_empty() {
        return Err(Error::Cgroup {
            path: dir.display().to_string(),
            reason: format!(
                "the cgroup ferrolet runs in holds other processes too ({foreign:?}), so it cannot hold the pod cgroups (cgroup v2 forbids controllers below a cgroup with processes); start ferrolet in a cgroup of its own (systemd: Delegate=yes) or set cgroupRoot"
            ),
        });
    }
    let leaf_dir = dir.join(leaf);
    match fs::create_dir(&leaf_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(Error::Cgroup {
                path: leaf_dir.display().to_string(),
                reason: e.to_string(),
            })
        }
    }
    for p in procs {
        write_cg(&leaf_dir, "cgroup.procs", &p.to_string())?;
    }
    Ok(())
}

fn available_controllers(dir: &Path) -> Vec<String> {
    fs::read_to_string(dir.join("cgroup.controllers"))
        .map(|s| {
            s.split_whitespace()
                .filter(|c| V2_CONTROLLERS.contains(c))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// A new v1 cpuset cgroup starts with no cpus and mems; copy them down from the nearest
/// ancestor that has them.
fn fill_cpuset(dir: &Path) -> Result<()> {
    // Both files count: another creator of a shared ancestor may have written its cpus and not
    // yet its mems, and a cgroup with no mems refuses every task (ENOSPC).
    let unfilled = |d: &Path| {
        ["cpuset.cpus", "cpuset.mems"]
            .iter()
            .any(|f| read_trim(&d.join(f)).is_empty())
    };
    let mut chain = Vec::new();
    let mut cur = dir.to_path_buf();
    while unfilled(&cur) {
        chain.push(cur.clone());
        match cur.parent() {
            Some(p) if p.join("cpuset.cpus").exists() => cur = p.to_path_buf(),
            _ => return Ok(()),
        }
    }
    for d in chain.into_iter().rev() {
        // (each was pushed after its parent was found)
        let Some(parent) = d.parent() else { continue };
        for f in ["cpuset.cpus", "cpuset.mems"] {
            if read_trim(&d.join(f)).is_empty() {
                write_cg(&d, f, &read_trim(&parent.join(f)))?;
            }
        }
    }
    Ok(())
}

fn remove_cgroup_dir(dir: &Path) -> Result<()> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Ok(());
    };
    for e in rd.flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_cgroup_dir(&e.path())?;
        }
    }
    // rmdir can race with the kernel finishing the last exit: retry briefly.
    let mut last = None;
    for _ in 0..20 {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(Error::Cgroup {
        path: dir.display().to_string(),
        reason: format!("cannot remove: {}", last.map(|e| e.to_string()).unwrap_or_default()),
    })
}

fn write_cg(dir: &Path, file: &str, value: &str) -> Result<()> {
    let p = dir.join(file);
    fs::write(&p, value).map_err(|e| Error::Cgroup {
        path: p.display().to_string(),
        reason: format!("writing {value:?}: {e}"),
    })
}

fn read_trim(p: &Path) -> String {
    fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// A file holding one number (`memory.current`, `pids.current`...); `None` when it is missing
/// or holds something else (`max`).
pub(crate) fn read_u64(p: &Path) -> Option<u64> {
    fs::read_to_string(p).ok()?.trim().parse().ok()
}

fn is_cgroup2(p: &Path) -> bool {
    nix::sys::statfs::statfs(p)
        .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
        .unwrap_or(false)
}

/// mountinfo escapes spaces and such as \040.
pub(crate) fn unescape(s: &str) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| c.is_ascii_digit()) {
            if let Ok(n) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(n as char);
                i += 4;
                continue;
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// kubelet 1.26's swap rule (NodeSwap off): a container's memory limit bounds memory and swap
/// together, so a container with a limit does not swap (cgroup v2: `memory.swap.max` 0; v1:
/// `memory.memsw.limit_in_bytes` = the limit). libcgroups cannot say it: on v2 it skips a swap
/// value of 0, and on v1 it fails where the kernel has no swap accounting. The monitor writes
/// it after the build, before the container is reported created; a kernel without the file
/// (no swap accounting) has nothing to bound.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct SwapBound {
    /// The file to write.
    pub file: PathBuf,
    /// What to write there.
    pub value: String,
}

impl SwapBound {
    /// The bound for a container in `cgroup` with a memory limit of `limit` bytes; None when
    /// the kernel accounts no swap.
    pub(crate) fn for_limit(cgroups: &Cgroups, cgroup: &str, limit: i64) -> Option<SwapBound> {
        let (file, value, probe) = if cgroups.is_v2() {
            let dir = cgroups.dirs(cgroup).into_iter().next()?;
            let parent = dir.parent()?.to_path_buf();
            (
                dir.join("memory.swap.max"),
                "0".to_string(),
                parent.join("memory.swap.max"),
            )
        } else {
            let dir = cgroups.dir_for("memory", cgroup)?;
            let root = cgroups.dir_for("memory", "/")?;
            (
                dir.join("memory.memsw.limit_in_bytes"),
                limit.to_string(),
                root.join("memory.memsw.limit_in_bytes"),
            )
        };
        // The parent (v2) or the hierarchy's root (v1) has the file where swap is accounted.
        probe.exists().then_some(SwapBound { file, value })
    }

    /// Write the bound.
    pub(crate) fn apply(&self) -> std::io::Result<()> {
        std::fs::write(&self.file, &self.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two creators share an ancestor: one has written its cpus and not yet its mems when the
    /// other fills its own child. The child must still get mems, or no task can join it.
    #[test]
    fn a_cpuset_child_is_filled_when_its_parent_has_cpus_and_no_mems_yet() {
        let cgroups = Cgroups::detect().expect("the cgroup hierarchies");
        let root = NestedRoot::create(&cgroups, &format!("cpuset-{}", std::process::id())).unwrap();
        let top = match (&cgroups.mode, cgroups.dir_for("cpuset", root.path())) {
            (CgroupMode::V1 { .. }, Some(top)) => top,
            _ => {
                eprintln!("no v1 cpuset hierarchy here: nothing to fill");
                return root.cleanup().unwrap();
            }
        };
        let (half, child) = (top.join("half"), top.join("half/child"));
        let mut kid = None;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fs::create_dir(&half).unwrap();
            write_cg(&half, "cpuset.cpus", &read_trim(&top.join("cpuset.cpus"))).unwrap();
            fs::create_dir(&child).unwrap();
            fill_cpuset(&child).unwrap();
            for d in [&half, &child] {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    assert_eq!(
                        read_trim(&d.join(f)),
                        read_trim(&top.join(f)),
                        "{}",
                        d.join(f).display()
                    );
                }
            }
            let k = kid.insert(std::process::Command::new("sleep").arg("30").spawn().unwrap());
            fs::write(child.join("cgroup.procs"), k.id().to_string()).expect("a task joins the filled child");
        }));
        if let Some(mut k) = kid {
            let _ = k.kill();
            let _ = k.wait();
        }
        root.cleanup().unwrap();
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
    }

    #[test]
    fn process_counts_of_a_cgroup_and_below_in_one_walk() {
        let cgroups = Cgroups::detect().expect("the cgroup hierarchies");
        let root = NestedRoot::create(&cgroups, &format!("counts-{}", std::process::id())).unwrap();
        let pod = format!("{}/pod", root.path());
        let (c1, c2) = (format!("{pod}/c1"), format!("{pod}/c1/nested"));
        let mut kids = Vec::new();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for cg in [&pod, &c1, &c2] {
                for m in cgroups.mounts() {
                    fs::create_dir_all(m.join(cg.trim_start_matches('/'))).unwrap();
                }
            }
            // One process in the pod's own cgroup, one in c1, two in c1/nested.
            for cg in [&pod, &c1, &c2, &c2] {
                let kid = std::process::Command::new("sleep").arg("30").spawn().unwrap();
                let dir = cgroups
                    .dir_for("pids", cg)
                    .or_else(|| cgroups.dir_for("memory", cg))
                    .unwrap();
                fs::write(dir.join("cgroup.procs"), kid.id().to_string()).unwrap();
                kids.push(kid);
            }
            let counts = cgroups.process_counts(&pod);
            assert_eq!(counts.get(&pod), Some(&4), "{counts:?}");
            assert_eq!(counts.get(&c1), Some(&3), "{counts:?}");
            assert_eq!(counts.get(&c2), Some(&2), "{counts:?}");
            assert_eq!(cgroups.process_count(&c1), 3);
            // Read again through the kept descriptors, after one left.
            let mut gone = kids.pop().unwrap();
            gone.kill().unwrap();
            gone.wait().unwrap();
            assert_eq!(cgroups.process_count(&format!("{pod}/")), 3);
            assert_eq!(cgroups.process_counts(&pod).get(&c2), Some(&1));
            assert_eq!(cgroups.process_count(&format!("{pod}/absent")), 0);
        }));
        for mut k in kids {
            let _ = k.kill();
            let _ = k.wait();
        }
        root.cleanup().unwrap();
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
    }

    #[test]
    fn weight_conversion_matches_runc() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(container_shares_to_weight(2), 1);
        assert_eq!(container_shares_to_weight(102), 17);
        assert_eq!(container_shares_to_weight(1024), 100);
        assert_eq!(container_shares_to_weight(262_144), 10_000);
    }

    #[test]
    fn hugepage_names_as_the_cgroup_files() {
        assert_eq!(hugepage_size_name(2048), "2MB");
        assert_eq!(hugepage_size_name(1_048_576), "1GB");
        assert_eq!(hugepage_size_name(64), "64KB");
    }

    #[test]
    fn kv_lookups_in_place() {
        let ms = Kv("cache 7\nrss 3\nrss_huge 0\ntotal_cache 70\ntotal_rss x\nbad\noom_kill 2\n".into());
        assert_eq!(ms.get("rss"), Some(3));
        assert_eq!(ms.get("rss_h"), None, "whole keys only");
        assert_eq!(ms.get("oom_kill"), Some(2));
        assert_eq!(ms.get("bad"), None);
        assert_eq!(ms.total_or_own("cache"), Some(70), "the hierarchical total first");
        assert_eq!(
            ms.total_or_own("rss"),
            Some(3),
            "an unreadable total gives way to the own value"
        );
        assert_eq!(ms.total_or_own("rss_huge"), Some(0));
        assert_eq!(Kv(String::new()).get("rss"), None);
    }

    #[test]
    fn weight_round_trips_to_shares() {
        for shares in [2, 1024, 262_144] {
            let back = weight_to_shares(shares_to_weight(shares));
            assert!(back.abs_diff(shares) <= 27, "{shares} -> {back}");
        }
    }

    #[test]
    fn v2_files_to_stats() {
        let d = tempfile::tempdir().unwrap();
        let w = |f: &str, c: &str| fs::write(d.path().join(f), c).unwrap();
        w(
            "cpu.stat",
            "usage_usec 2000\nuser_usec 1500\nsystem_usec 500\nnr_periods 10\nnr_throttled 3\nthrottled_usec 7\n",
        );
        w("memory.current", "1000\n");
        w(
            "memory.stat",
            "anon 300\nfile 600\ninactive_file 400\nfile_mapped 50\npgfault 9\npgmajfault 1\n",
        );
        w("memory.max", "max\n");
        w("cpu.max", "50000 100000\n");
        w("pids.current", "4\n");
        let s = stats_v2(&KeptFiles::default(), d.path());
        assert_eq!(s.cpu_usage_nanos, Some(2_000_000));
        assert_eq!(s.cpu_user_nanos, Some(1_500_000));
        assert_eq!(s.cpu_throttled_periods, Some(3));
        assert_eq!(s.cpu_throttled_nanos, Some(7000));
        assert_eq!(s.memory_working_set_bytes, Some(600));
        assert_eq!(s.memory_rss_bytes, Some(300));
        assert_eq!(s.memory_cache_bytes, Some(600));
        assert_eq!(s.memory_mapped_file_bytes, Some(50));
        assert_eq!(s.memory_limit_bytes, None);
        assert_eq!((s.cpu_quota_us, s.cpu_period_us), (Some(50_000), Some(100_000)));
        assert_eq!(s.pids, Some(4));
        assert_eq!(s.memory_swap_bytes, None);
    }

    #[test]
    fn v1_files_to_stats() {
        let d = tempfile::tempdir().unwrap();
        let w = |f: &str, c: &str| fs::write(d.path().join(f), c).unwrap();
        w("cpuacct.usage", "5000\n");
        w("cpuacct.stat", "user 2\nsystem 1\n");
        w("cpu.stat", "nr_periods 4\nnr_throttled 2\nthrottled_time 99\n");
        w("cpu.cfs_quota_us", "-1\n");
        w("cpu.shares", "1024\n");
        w("memory.usage_in_bytes", "1000\n");
        w("memory.limit_in_bytes", "9223372036854771712\n");
        w("memory.stat", "rss 1\ncache 2\ntotal_rss 300\ntotal_cache 600\ntotal_inactive_file 400\ntotal_mapped_file 5\ntotal_swap 0\ntotal_pgfault 8\n");
        let p = Some(d.path());
        let s = stats_v1(&KeptFiles::default(), p, p, p, p);
        assert_eq!(s.cpu_usage_nanos, Some(5000));
        let tick = 1_000_000_000 / clock_ticks_per_second();
        assert_eq!(s.cpu_user_nanos, Some(2 * tick));
        assert_eq!(s.cpu_throttled_nanos, Some(99));
        assert_eq!(s.cpu_quota_us, None);
        assert_eq!(s.cpu_shares, Some(1024));
        assert_eq!(s.memory_working_set_bytes, Some(600));
        assert_eq!(s.memory_rss_bytes, Some(300));
        assert_eq!(s.memory_cache_bytes, Some(600));
        assert_eq!(s.memory_swap_bytes, Some(0));
        assert_eq!(s.memory_limit_bytes, None);
        assert_eq!(s.memory_page_faults, Some(8));
    }

    #[test]
    fn detects_something_and_own_path() {
        let c = Cgroups::detect().unwrap();
        let own = c.own_path().unwrap();
        assert!(own.starts_with('/'));
    }

    #[test]
    fn unescapes_mountinfo() {
        assert_eq!(unescape("/a\\040b"), "/a b");
    }
}
