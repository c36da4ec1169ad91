//! The last hour of cpu and memory, of the node and of each pod, for the status page's charts.
//!
//! Each series is a fixed ring of [`CAP`] points allocated once (12 bytes a point: the time in
//! seconds, millicores, KiB of working set), so recording a tick never allocates. A point
//! starts as one sampler tick; when the ring is full and does not yet reach back an hour (the
//! sampler ticks faster than every 10 s), neighbouring points are merged pairwise and each
//! point from then on folds twice as many ticks, so an hour always fits in [`CAP`] points and
//! a fresh agent shows detail at once. A full ring that covers the hour drops its oldest point.
//! A pod's series goes when the pod is no longer in the sampler's snapshot.

use std::collections::HashMap;

use super::summary::{CpuStats, MemoryStats, Summary};

/// Points per series: one per 10 s over an hour.
pub const CAP: usize = 360;
/// How far back the charts look.
pub const WINDOW_SECS: u32 = 3600;
/// A missing value (no cpu rate yet: the first tick of a cgroup).
pub const NONE: u32 = u32::MAX;

/// One point: the time of its last tick (seconds since the epoch), the mean cpu in millicores
/// and memory working set in KiB of the ticks it folds ([`NONE`] when none had a value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Point {
    pub at: u32,
    pub cpu_milli: u32,
    pub mem_kib: u32,
}

/// One ring of points.
#[derive(Debug, Clone)]
pub struct Series {
    points: Box<[Point; CAP]>,
    start: u16,
    len: u16,
    /// Ticks folded into one point.
    per_point: u32,
    /// Ticks folded into the last point so far.
    fill: u32,
    /// The sums and counts of the values (cpu, memory) folded into the last point, for an
    /// exact mean.
    sums: [u64; 2],
    counts: [u32; 2],
}

impl Default for Series {
    fn default() -> Series {
        Series {
            points: Box::new([Point::default(); CAP]),
            start: 0,
            len: 0,
            per_point: 1,
            fill: 0,
            sums: [0; 2],
            counts: [0; 2],
        }
    }
}

/// The mean of `a` weighing `wa` and `b` weighing `wb`, with [`NONE`] as no value.
fn mean(a: u32, wa: u32, b: u32, wb: u32) -> u32 {
    match (a, b) {
        (NONE, v) | (v, NONE) => v,
        _ => ((a as u64 * wa as u64 + b as u64 * wb as u64) / (wa as u64 + wb as u64).max(1)) as u32,
    }
}

impl Series {
    fn idx(&self, i: usize) -> usize {
        (self.start as usize + i) % CAP
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Ticks each point folds now (1 until the ring first needed halving).
    pub fn ticks_per_point(&self) -> u32 {
        self.per_point
    }

    /// The points, oldest first.
    pub fn points(&self) -> impl Iterator<Item = Point> + '_ {
        (0..self.len()).map(|i| self.points[self.idx(i)])
    }

    /// The points of the last hour before `now` (seconds since the epoch), oldest first.
    pub fn last_hour(&self, now: u32) -> impl Iterator<Item = Point> + '_ {
        let from = now.saturating_sub(WINDOW_SECS);
        self.points().filter(move |p| p.at >= from)
    }

    /// Fold `p`'s values into the sums of the last point; the means so far.
    fn fold(&mut self, p: Point) -> [u32; 2] {
        let mut out = [NONE; 2];
        for (k, v) in [p.cpu_milli, p.mem_kib].into_iter().enumerate() {
            if v != NONE {
                self.sums[k] += v as u64;
                self.counts[k] += 1;
            }
            if self.counts[k] > 0 {
                out[k] = (self.sums[k] / self.counts[k] as u64) as u32;
            }
        }
        out
    }

    /// Record one tick.
    pub fn push(&mut self, p: Point) {
        if self.len > 0 && self.fill < self.per_point {
            let i = self.idx(self.len() - 1);
            let at = p.at.max(self.points[i].at);
            let [cpu_milli, mem_kib] = self.fold(p);
            self.points[i] = Point { at, cpu_milli, mem_kib };
            self.fill += 1;
            return;
        }
        if self.len() == CAP {
            let first = self.points[self.idx(0)].at;
            let last = self.points[self.idx(CAP - 1)].at;
            // The span the ring would cover at this pace: CAP steps of the mean step so far.
            let covers = last.saturating_sub(first) as u64 * CAP as u64 / (CAP as u64 - 1);
            if covers < WINDOW_SECS as u64 * 9 / 10 {
                self.halve();
            } else {
                self.start = self.idx(1) as u16;
                self.len -= 1;
            }
        }
        let i = self.idx(self.len());
        self.points[i] = p;
        self.len += 1;
        self.fill = 1;
        (self.sums, self.counts) = ([0; 2], [0; 2]);
        self.fold(p);
    }

    /// Merge neighbouring points pairwise (in place): half as many points, each folding twice
    /// the ticks.
    fn halve(&mut self) {
        let n = self.len() / 2;
        for j in 0..n {
            let (a, b) = (self.points[self.idx(2 * j)], self.points[self.idx(2 * j + 1)]);
            let w = self.per_point;
            let k = self.idx(j);
            self.points[k] = Point {
                at: a.at.max(b.at),
                cpu_milli: mean(a.cpu_milli, w, b.cpu_milli, w),
                mem_kib: mean(a.mem_kib, w, b.mem_kib, w),
            };
        }
        if self.len() % 2 == 1 {
            let (src, dst) = (self.idx(self.len() - 1), self.idx(n));
            self.points[dst] = self.points[src];
        }
        self.len = self.len.div_ceil(2);
        self.per_point *= 2;
        self.fill = self.per_point;
    }
}

/// A pod's series, with the name it is shown by.
#[derive(Debug, Clone)]
pub struct PodSeries {
    pub namespace: String,
    pub name: String,
    pub series: Series,
}

/// The node's series and each pod's, by pod UID.
#[derive(Debug, Default)]
pub struct History {
    pub node: Series,
    pub pods: HashMap<String, PodSeries>,
}

fn point(at: u32, cpu: Option<&CpuStats>, mem: Option<&MemoryStats>) -> Point {
    let cpu_milli = cpu
        .and_then(|c| c.usage_nano_cores)
        .map_or(NONE, |n| (n / 1_000_000).min(NONE as u64 - 1) as u32);
    let mem_kib = mem
        .and_then(|m| m.working_set_bytes)
        .map_or(NONE, |b| (b / 1024).min(NONE as u64 - 1) as u32);
    Point { at, cpu_milli, mem_kib }
}

impl History {
    /// Record one sampling round; pods not in it are forgotten.
    pub fn record(&mut self, s: &Summary, at: u32) {
        let n = &s.node;
        self.node.push(point(at, n.cpu.as_ref(), n.memory.as_ref()));
        for p in &s.pods {
            let pt = point(at, p.cpu.as_ref(), p.memory.as_ref());
            match self.pods.get_mut(&p.pod_ref.uid) {
                Some(ps) => ps.series.push(pt),
                None => {
                    let mut series = Series::default();
                    series.push(pt);
                    self.pods.insert(
                        p.pod_ref.uid.clone(),
                        PodSeries {
                            namespace: p.pod_ref.namespace.clone(),
                            name: p.pod_ref.name.clone(),
                            series,
                        },
                    );
                }
            }
        }
        // Every pod of the round has its series now: more series means some pods are gone.
        if self.pods.len() != s.pods.len() {
            self.pods.retain(|uid, _| s.pods.iter().any(|p| &p.pod_ref.uid == uid));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::summary::{NodeStats, PodReference, PodStats, Time};

    fn pt(at: u32, v: u32) -> Point {
        Point {
            at,
            cpu_milli: v,
            mem_kib: v * 2,
        }
    }

    #[test]
    fn one_point_per_tick_until_full() {
        let mut s = Series::default();
        for t in 0..10 {
            s.push(pt(1000 + t * 10, t));
        }
        assert_eq!(s.len(), 10);
        assert_eq!(s.ticks_per_point(), 1);
        assert_eq!(
            s.points().map(|p| p.cpu_milli).collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
    }

    #[test]
    fn ten_second_ticks_keep_the_hour_and_drop_the_oldest() {
        let mut s = Series::default();
        for t in 0..1000u32 {
            s.push(pt(t * 10, t));
        }
        assert_eq!(s.len(), CAP);
        assert_eq!(s.ticks_per_point(), 1, "an hour of 10 s ticks fits without merging");
        let pts: Vec<_> = s.points().collect();
        assert_eq!(pts[0].cpu_milli, 1000 - CAP as u32);
        assert_eq!(pts[CAP - 1].cpu_milli, 999);
        assert!(pts.windows(2).all(|w| w[0].at < w[1].at));
    }

    #[test]
    fn fast_ticks_are_merged_so_an_hour_fits() {
        let mut s = Series::default();
        // one tick a second for two hours, the value the tick's number
        let ticks = 7200u32;
        for t in 0..ticks {
            s.push(pt(t, t));
            assert!(s.len() <= CAP);
        }
        let now = ticks - 1;
        let hour: Vec<_> = s.last_hour(now).collect();
        assert!(hour.len() <= CAP);
        assert!(hour.len() >= CAP / 2, "the hour keeps enough detail: {}", hour.len());
        let oldest = s.points().next().unwrap();
        assert!(
            oldest.at <= now - WINDOW_SECS,
            "the ring reaches back an hour: {}",
            oldest.at
        );
        // 16 ticks a point: each point's value is the mean of its ticks
        assert_eq!(s.ticks_per_point(), 16);
        let last_full = hour[hour.len() - 2];
        assert_eq!(last_full.cpu_milli, last_full.at - 8, "the mean of at-15..=at, floored");
        assert!(hour.windows(2).all(|w| w[0].at < w[1].at));
    }

    #[test]
    fn missing_values_do_not_count() {
        assert_eq!(mean(NONE, 3, 10, 1), 10);
        assert_eq!(mean(10, 3, NONE, 1), 10);
        assert_eq!(mean(10, 3, 30, 1), 15);
        assert_eq!(mean(NONE, 1, NONE, 1), NONE);
    }

    fn pod(uid: &str, cpu: u64) -> PodStats {
        PodStats {
            pod_ref: PodReference {
                name: format!("pod-{uid}"),
                namespace: "default".into(),
                uid: uid.into(),
            },
            cpu: Some(CpuStats {
                time: Time::default(),
                usage_nano_cores: Some(cpu),
                usage_core_nano_seconds: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pods_that_are_gone_are_dropped() {
        let mut h = History::default();
        let summary = |pods: Vec<PodStats>| Summary {
            node: NodeStats::default(),
            pods,
        };
        h.record(&summary(vec![pod("a", 250_000_000), pod("b", 0)]), 10);
        h.record(&summary(vec![pod("a", 500_000_000), pod("b", 0)]), 20);
        assert_eq!(h.pods.len(), 2);
        assert_eq!(
            h.pods["a"].series.points().map(|p| p.cpu_milli).collect::<Vec<_>>(),
            [250, 500]
        );
        assert_eq!(h.pods["a"].name, "pod-a");
        h.record(&summary(vec![pod("a", 0), pod("c", 0)]), 30);
        let mut uids: Vec<_> = h.pods.keys().cloned().collect();
        uids.sort();
        assert_eq!(uids, ["a", "c"]);
        assert_eq!(h.node.len(), 3);
        assert_eq!(h.node.points().next().unwrap().cpu_milli, NONE);
    }
}
