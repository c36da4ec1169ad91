//! Cgroup stats read round after round, in full only where something moved. A sampler reading
//! a dozen files of every pod's and container's cgroup at every housekeeping interval was most
//! of an idle node's CPU (with 100 idle pods, 2600 system calls a round on cgroup v1). A cgroup
//! whose pulse ([`Cgroups::pulse`]: its cpu counter and memory usage, two reads) is what it was
//! at its last full read had nothing run in it, fork, fault or be charged memory, so that read
//! still holds, and so does its process count.
//!
//! What can change while nothing runs in a cgroup is caught by a full read at least every
//! `max_age`: the kernel aging its pages from the active to the inactive list (the working
//! set), a limit written from outside, a process moved in that has not run since.
//!
//! A parent's pulse counts everything below it: while it stays, a child's last full read holds
//! without reading the child's pulse ([`StatsRounds::stats_below`]). The caller may keep one
//! reading of its own per cgroup under the same rule ([`StatsRounds::reading`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::cgroups::{CgroupStats, Cgroups, Pulse};

/// The rounds' memory of each cgroup they look at. `R` is a reading of the caller's own kept
/// beside the cgroup's stats ([`reading`](Self::reading)).
#[derive(Debug)]
pub struct StatsRounds<R = ()> {
    max_age: Duration,
    round: u64,
    cgroups: HashMap<String, Entry<R>>,
    /// Full reads made (tests count them).
    #[cfg(test)]
    full_reads: usize,
    /// Pulses read (tests count them).
    #[cfg(test)]
    pulse_reads: usize,
}

#[derive(Debug)]
struct Entry<R> {
    /// The last round that looked at the cgroup (the others forget it).
    round: u64,
    /// The round `pulse` was read in: a cgroup's pulse is read at most once a round, and not
    /// at all while its parent's says nothing below it moved ([`stats_below`](StatsRounds::stats_below)).
    pulse_round: u64,
    pulse: Pulse,
    stats: Option<Full<CgroupStats>>,
    counts: Option<Full<HashMap<String, usize>>>,
    reading: Option<Full<R>>,
}

impl<R> Default for Entry<R> {
    fn default() -> Self {
        Entry {
            round: 0,
            pulse_round: 0,
            pulse: Pulse::default(),
            stats: None,
            counts: None,
            reading: None,
        }
    }
}

/// A full read, and the pulse the cgroup had when it was made.
#[derive(Debug)]
struct Full<T> {
    pulse: Pulse,
    /// The parent's pulse when the read was last known to hold (read before it): while the
    /// parent's stays so, nothing below the parent moved.
    parent: Option<Pulse>,
    at: Instant,
    value: T,
}

impl<T: Clone> Full<T> {
    /// The value when it still holds: the same known pulse, read within `max_age`.
    fn still(&self, pulse: Pulse, now: Instant, max_age: Duration) -> Option<T> {
        (pulse.known() && pulse == self.pulse && now.duration_since(self.at) < max_age).then(|| self.value.clone())
    }
}

impl<R: Clone> StatsRounds<R> {
    pub fn new(max_age: Duration) -> StatsRounds<R> {
        StatsRounds {
            max_age,
            round: 0,
            cgroups: HashMap::new(),
            #[cfg(test)]
            full_reads: 0,
            #[cfg(test)]
            pulse_reads: 0,
        }
    }

    /// A new round: the cgroups the last round did not look at are forgotten (they are gone,
    /// or no longer sampled).
    pub fn begin_round(&mut self) {
        let last = self.round;
        self.cgroups.retain(|_, e| e.round == last);
        self.round += 1;
    }

    /// `cgroup`'s stats, read in full unless its pulse says the last full read still holds.
    pub fn stats(&mut self, cg: &Cgroups, cgroup: &str) -> CgroupStats {
        self.held(cg, cgroup, |e| &mut e.stats, |_| true, || cg.stats(cgroup))
    }

    /// [`stats`](Self::stats) of `cgroup`, a cgroup below `parent` (a container's below its
    /// pod's): while the parent's pulse (which counts everything below it) is what it was when
    /// the last full read of `cgroup` was known to hold, not even `cgroup`'s pulse is read. A
    /// `cgroup` that is not below `parent` gets [`stats`](Self::stats).
    pub fn stats_below(&mut self, cg: &Cgroups, parent: &str, cgroup: &str) -> CgroupStats {
        if !is_below(parent, cgroup) {
            return self.stats(cg, cgroup);
        }
        let now = Instant::now();
        let parent_pulse = self.looked_at(cg, parent).pulse;
        let (round, max_age) = (self.round, self.max_age);
        if let Some(e) = self.cgroups.get_mut(cgroup) {
            let still = e.stats.as_ref().filter(|f| {
                parent_pulse.known() && f.parent == Some(parent_pulse) && now.duration_since(f.at) < max_age
            });
            if let Some(value) = still.map(|f| f.value.clone()) {
                e.round = round;
                return value;
            }
        }
        let value = self.stats(cg, cgroup);
        if let Some(f) = self.cgroups.get_mut(cgroup).and_then(|e| e.stats.as_mut()) {
            f.parent = Some(parent_pulse);
        }
        value
    }

    /// [`Cgroups::process_counts`] of `cgroup` and below, walked again unless the pulse of
    /// `cgroup` (which counts everything below it) says the last walk still holds.
    pub fn process_counts(&mut self, cg: &Cgroups, cgroup: &str) -> HashMap<String, usize> {
        self.held(cg, cgroup, |e| &mut e.counts, |_| true, || cg.process_counts(cgroup))
    }

    /// A reading of the caller's own of something only the processes of `cgroup` can change
    /// (the counters of a network namespace where nothing but loopback lives, say): the last
    /// one while `holdable` says it may be held and the cgroup's pulse says it still holds
    /// (and at most `max_age` old, as the stats), else `read` afresh.
    pub fn reading(
        &mut self,
        cg: &Cgroups,
        cgroup: &str,
        holdable: impl FnOnce(&R) -> bool,
        read: impl FnOnce() -> R,
    ) -> R {
        self.held(cg, cgroup, |e| &mut e.reading, holdable, read)
    }

    /// What `slot` of the cgroup's entry holds while the pulse says it still holds (and
    /// `holdable` lets it be held), else `read` afresh and kept with the pulse.
    fn held<T: Clone>(
        &mut self,
        cg: &Cgroups,
        cgroup: &str,
        slot: impl FnOnce(&mut Entry<R>) -> &mut Option<Full<T>>,
        holdable: impl FnOnce(&T) -> bool,
        read: impl FnOnce() -> T,
    ) -> T {
        let (now, max_age) = (Instant::now(), self.max_age);
        let e = self.looked_at(cg, cgroup);
        let pulse = e.pulse;
        let kept = slot(e);
        if let Some(v) = kept
            .as_ref()
            .filter(|f| holdable(&f.value))
            .and_then(|f| f.still(pulse, now, max_age))
        {
            return v;
        }
        let value = read();
        *kept = Some(Full {
            pulse,
            parent: None,
            at: now,
            value: value.clone(),
        });
        self.counted();
        value
    }

    /// The cgroup's entry, its pulse read if this round has not read it yet.
    fn looked_at(&mut self, cg: &Cgroups, cgroup: &str) -> &mut Entry<R> {
        let round = self.round;
        let e = self.cgroups.entry(cgroup.to_string()).or_default();
        e.round = round;
        if e.pulse_round != round {
            e.pulse_round = round;
            e.pulse = cg.pulse(cgroup);
            #[cfg(test)]
            {
                self.pulse_reads += 1;
            }
        }
        e
    }

    fn counted(&mut self) {
        #[cfg(test)]
        {
            self.full_reads += 1;
        }
    }
}

/// Whether cgroup path `child` lies strictly below `parent`.
fn is_below(parent: &str, child: &str) -> bool {
    let parent = parent.trim_end_matches('/');
    child
        .strip_prefix(parent)
        .is_some_and(|rest| rest.len() > 1 && rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::{CgroupMode, NestedRoot};

    fn limit_file(cgroups: &Cgroups) -> (&'static str, &'static str) {
        match cgroups.mode() {
            CgroupMode::V2 { .. } => ("memory", "memory.max"),
            CgroupMode::V1 { .. } => ("memory", "memory.limit_in_bytes"),
        }
    }

    /// A `sleep` moved into `path` (its accounting hierarchies: a new v1 cpuset cgroup has no
    /// cpus to run on) and woken there, returned once it sleeps, so that its run is charged to
    /// the cgroup. Kept in `kid` from its start, for the test's cleanup to stop it.
    fn sleeper_in<'a>(
        cgroups: &Cgroups,
        path: &str,
        kid: &'a mut Option<std::process::Child>,
    ) -> &'a mut std::process::Child {
        let child = kid.insert(
            std::process::Command::new("sh")
                .args(["-c", "read _; exec sleep 30"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let mut dirs: Vec<_> = ["cpuacct", "memory", "pids"]
            .iter()
            .filter_map(|c| cgroups.dir_for(c, path))
            .collect();
        dirs.dedup();
        for d in dirs {
            std::fs::write(d.join("cgroup.procs"), child.id().to_string()).unwrap();
        }
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        // Until it sleeps in `sleep`: the comm changes early in the exec, and a task's cpu time
        // is charged to its cgroup when it is scheduled out (under qemu-user a test once read
        // the counter while the exec still ran, uncharged).
        let stat = format!("/proc/{}/stat", child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&stat)
            .unwrap_or_default()
            .contains("(sleep) S ")
        {
            assert!(Instant::now() < deadline, "the child did not exec and sleep");
            std::thread::sleep(Duration::from_millis(10));
        }
        child
    }

    #[test]
    fn an_idle_cgroup_is_read_in_full_only_when_it_moved_or_its_read_is_old() {
        let cgroups = Cgroups::detect().expect("the cgroup hierarchies");
        let root = NestedRoot::create(&cgroups, &format!("stats-rounds-{}", std::process::id())).unwrap();
        let path = format!("{}/c", root.path());
        let mut kid: Option<std::process::Child> = None;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for m in cgroups.mounts() {
                std::fs::create_dir_all(m.join(path.trim_start_matches('/'))).unwrap();
            }
            if !cgroups.pulse(&path).known() {
                eprintln!("SKIPPED: no cpu or memory accounting for {path} here");
                return;
            }
            let (controller, file) = limit_file(&cgroups);
            let limit = cgroups.dir_for(controller, &path).unwrap().join(file);
            std::fs::write(&limit, "104857600").unwrap();
            let mut rounds: StatsRounds = StatsRounds::new(Duration::from_secs(3600));
            let round = |rounds: &mut StatsRounds| {
                rounds.begin_round();
                let counts = rounds.process_counts(&cgroups, &path);
                (rounds.stats(&cgroups, &path), counts.get(&path).copied())
            };
            let (first, procs) = round(&mut rounds);
            assert_eq!(rounds.full_reads, 2);
            assert_eq!(first.memory_limit_bytes, Some(104857600));
            assert_eq!(procs, Some(0));
            // Nothing ran in it: its pulse (two reads) is all a round reads.
            let (again, _) = round(&mut rounds);
            assert_eq!(rounds.full_reads, 2, "an idle cgroup was read in full again");
            assert_eq!(again.memory_limit_bytes, first.memory_limit_bytes);
            // A limit written from outside moves no pulse: it shows at the next full read,
            // within max_age.
            std::fs::write(&limit, "209715200").unwrap();
            round(&mut rounds);
            assert_eq!(rounds.full_reads, 2);
            rounds.max_age = Duration::ZERO;
            let (aged, _) = round(&mut rounds);
            assert_eq!(rounds.full_reads, 4);
            assert_eq!(aged.memory_limit_bytes, Some(209715200));
            rounds.max_age = Duration::from_secs(3600);
            round(&mut rounds);
            assert_eq!(rounds.full_reads, 4);
            // A process moved in and woken there runs (and execs) in it: its pulse moves, and
            // the cgroup is read in full and counted again.
            let child = sleeper_in(&cgroups, &path, &mut kid);
            let (busy, procs) = round(&mut rounds);
            assert_eq!(rounds.full_reads, 6);
            assert_eq!(procs, Some(1));
            assert!(busy.cpu_usage_nanos > first.cpu_usage_nanos, "{busy:?}");
            round(&mut rounds);
            assert_eq!(rounds.full_reads, 6);
            // Killed: its exit moves the pulse too.
            let _ = child.kill();
            let _ = child.wait();
            let (_, procs) = round(&mut rounds);
            assert_eq!(rounds.full_reads, 8);
            assert_eq!(procs, Some(0));
            // Rounds that do not look at a cgroup forget it.
            rounds.begin_round();
            rounds.begin_round();
            assert!(rounds.cgroups.is_empty());
        }));
        if let Some(mut k) = kid {
            let _ = k.kill();
            let _ = k.wait();
        }
        for m in cgroups.mounts() {
            let _ = std::fs::remove_dir(m.join(path.trim_start_matches('/')));
        }
        root.cleanup().unwrap();
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
    }

    #[test]
    fn below_means_a_path_under_the_parent() {
        assert!(is_below("/k/pod1", "/k/pod1/c"));
        assert!(is_below("/k/pod1/", "/k/pod1/c"));
        assert!(!is_below("/k/pod1", "/k/pod10/c"), "a sibling with a longer name");
        assert!(!is_below("/k/pod1", "/k/pod1"));
        assert!(!is_below("/k/pod1", "/k/pod1/"));
        assert!(!is_below("/k/pod1", "/elsewhere/c"));
    }

    /// A cgroup below a parent (a container below its pod): while the parent's pulse stays, not
    /// even the child's pulse is read; the caller's own reading is held by the pulse too.
    #[test]
    fn a_still_parent_answers_for_its_children_and_holds_the_callers_reading() {
        let cgroups = Cgroups::detect().expect("the cgroup hierarchies");
        let root = NestedRoot::create(&cgroups, &format!("stats-below-{}", std::process::id())).unwrap();
        let parent = format!("{}/p", root.path());
        let child_cg = format!("{parent}/c");
        let mut kid: Option<std::process::Child> = None;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for m in cgroups.mounts() {
                std::fs::create_dir_all(m.join(child_cg.trim_start_matches('/'))).unwrap();
            }
            if !cgroups.pulse(&parent).known() {
                eprintln!("SKIPPED: no cpu or memory accounting for {parent} here");
                return;
            }
            let mut rounds: StatsRounds<u32> = StatsRounds::new(Duration::from_secs(3600));
            let mut net_reads = 0;
            let mut round = |rounds: &mut StatsRounds<u32>, holdable: bool| {
                rounds.begin_round();
                rounds.reading(
                    &cgroups,
                    &parent,
                    |v| holdable && *v == 0,
                    || {
                        net_reads += 1;
                        0
                    },
                );
                rounds.stats_below(&cgroups, &parent, &child_cg);
                (rounds.pulse_reads, rounds.full_reads, net_reads)
            };
            // First: both pulses, the child's full read and the reading.
            assert_eq!(round(&mut rounds, true), (2, 2, 1));
            // Idle: the parent's pulse is all that is read.
            assert_eq!(round(&mut rounds, true), (3, 2, 1));
            assert_eq!(round(&mut rounds, true), (4, 2, 1));
            // A reading that may not be held is read every round.
            assert_eq!(round(&mut rounds, false), (5, 3, 2));
            // A process moved into the child and run there: the parent's pulse moves, the
            // child's is read and has moved, so it is read in full; the reading is read again.
            sleeper_in(&cgroups, &child_cg, &mut kid);
            assert_eq!(round(&mut rounds, true), (7, 5, 3));
            // Still again: the parent alone.
            assert_eq!(round(&mut rounds, true), (8, 5, 3));
        }));
        if let Some(mut k) = kid {
            let _ = k.kill();
            let _ = k.wait();
        }
        for m in cgroups.mounts() {
            let _ = std::fs::remove_dir(m.join(child_cg.trim_start_matches('/')));
            let _ = std::fs::remove_dir(m.join(parent.trim_start_matches('/')));
        }
        root.cleanup().unwrap();
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
    }
}
