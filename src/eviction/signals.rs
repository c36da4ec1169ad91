//! Signals, thresholds and the node conditions they raise, as kubelet's eviction helpers
//! compute them (pkg/kubelet/eviction/helpers.go): observations from the stats summary,
//! thresholds met (with minimum reclaim), grace periods, the pressure transition period, and
//! kubelet's quantities in messages. Pure functions over plain data: the manager
//! ([`super::manager`]) holds the state between rounds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::config::{self, EvictionHard, EvictionThresholds};
use crate::stats::summary::{Summary, SYSTEM_CONTAINER_PODS};

/// An eviction signal (kubelet's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    MemoryAvailable,
    /// What `kubepods` has left under its limit (the node allocatable): kubelet watches it
    /// beside `memory.available` when `enforceNodeAllocatable` has `pods`.
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    PidAvailable,
}

impl Signal {
    pub const ALL: [Signal; 7] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    pub fn parse(s: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|x| x.name() == s)
    }

    /// The resource a signal starves (kubelet's signalToResource).
    pub fn resource(self) -> Resource {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable => Resource::EphemeralStorage,
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => Resource::Inodes,
            Signal::PidAvailable => Resource::Pids,
        }
    }

    /// The node condition a met threshold of this signal raises (kubelet's
    /// signalToNodeCondition).
    pub fn condition(self) -> Condition {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Condition::MemoryPressure,
            Signal::PidAvailable => Condition::PidPressure,
            _ => Condition::DiskPressure,
        }
    }

    /// Quantities of this signal print in binary (bytes) or decimal (counts) units, as kubelet
    /// makes them.
    fn binary(self) -> bool {
        matches!(self.resource(), Resource::Memory | Resource::EphemeralStorage)
    }
}

/// What a signal starves, as kubelet names the resource in its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Memory,
    EphemeralStorage,
    Inodes,
    Pids,
}

impl Resource {
    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
            Resource::Pids => "pids",
        }
    }
}

/// The node's pressure conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Condition {
    MemoryPressure,
    DiskPressure,
    PidPressure,
}

impl Condition {
    pub fn name(self) -> &'static str {
        match self {
            Condition::MemoryPressure => "MemoryPressure",
            Condition::DiskPressure => "DiskPressure",
            Condition::PidPressure => "PIDPressure",
        }
    }
}

/// One signal as observed: what is available of what capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: i64,
    pub capacity: i64,
}

pub type Observations = BTreeMap<Signal, Observation>;

/// kubelet's makeSignalObservations: the node's memory (available and working set), what
/// `kubepods` has left under its limit, the node's filesystem, the image filesystem and the
/// pid limit, from the summary.
pub fn observe(s: &Summary) -> Observations {
    let mut o = Observations::new();
    let n = &s.node;
    let pods = n.system_containers.iter().find(|c| c.name == SYSTEM_CONTAINER_PODS);
    for (signal, m) in [
        (Signal::MemoryAvailable, n.memory.as_ref()),
        (Signal::AllocatableMemoryAvailable, pods.and_then(|c| c.memory.as_ref())),
    ] {
        if let Some((a, ws)) = m.and_then(|m| m.available_bytes.zip(m.working_set_bytes)) {
            o.insert(
                signal,
                Observation {
                    available: a as i64,
                    capacity: (a + ws) as i64,
                },
            );
        }
    }
    let mut fs = |avail: Signal, inodes: Signal, f: Option<&crate::stats::summary::FsStats>| {
        let Some(f) = f else { return };
        if let (Some(a), Some(c)) = (f.available_bytes, f.capacity_bytes) {
            o.insert(
                avail,
                Observation {
                    available: a as i64,
                    capacity: c as i64,
                },
            );
        }
        if let (Some(a), Some(c)) = (f.inodes_free, f.inodes) {
            o.insert(
                inodes,
                Observation {
                    available: a as i64,
                    capacity: c as i64,
                },
            );
        }
    };
    fs(Signal::NodeFsAvailable, Signal::NodeFsInodesFree, n.fs.as_ref());
    fs(
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        n.runtime.as_ref().and_then(|r| r.image_fs.as_ref()),
    );
    if let Some(r) = &n.rlimit {
        if let (Some(max), Some(running)) = (r.max_pid, r.num_of_running_processes) {
            o.insert(
                Signal::PidAvailable,
                Observation {
                    available: max - running,
                    capacity: max,
                },
            );
        }
    }
    o
}

/// A threshold of the configuration: hard (no grace period) or soft.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: config::Threshold,
    pub grace_period: Duration,
    pub min_reclaim: Option<config::Threshold>,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }

    /// The threshold as a quantity of a resource of `capacity`.
    pub fn quantity(&self, capacity: i64) -> i64 {
        self.value.amount(capacity)
    }

    fn key(&self) -> (Signal, bool) {
        (self.signal, self.is_hard())
    }
}

/// The configured thresholds: the hard ones, then the soft ones with their grace periods,
/// each with its minimum reclaim; with `enforce_pods` (kubelet's addAllocatableThresholds,
/// when `enforceNodeAllocatable` has `pods`), a hard `memory.available` also holds for
/// `allocatableMemory.available`.
pub fn thresholds(
    hard: &EvictionHard,
    soft: &EvictionThresholds,
    grace: &BTreeMap<String, Duration>,
    min_reclaim: &BTreeMap<String, config::Threshold>,
    enforce_pods: bool,
) -> Vec<Threshold> {
    let mut out = Vec::new();
    for (map, is_soft) in [(hard, false), (soft, true)] {
        for (name, value) in map.iter() {
            let Some(signal) = Signal::parse(name) else { continue };
            let grace_period = match is_soft {
                true => grace.get(name).copied().unwrap_or_default(),
                false => Duration::ZERO,
            };
            if is_soft && grace_period.is_zero() {
                continue; // refused by the configuration's validation
            }
            out.push(Threshold {
                signal,
                value,
                grace_period,
                min_reclaim: min_reclaim.get(name).copied(),
            });
        }
    }
    if enforce_pods {
        let allocatable: Vec<Threshold> = out
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .map(|t| Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                ..*t
            })
            .collect();
        out.extend(allocatable);
    }
    out
}

/// kubelet's thresholdsMet: the thresholds whose signal is below them; with
/// `enforce_min_reclaim`, below them plus their minimum reclaim (a threshold met stays met
/// until the signal has recovered that far).
pub fn thresholds_met(ts: &[Threshold], obs: &Observations, enforce_min_reclaim: bool) -> Vec<Threshold> {
    ts.iter()
        .filter(|t| {
            let Some(o) = obs.get(&t.signal) else { return false };
            let mut q = t.quantity(o.capacity);
            if enforce_min_reclaim {
                if let Some(m) = t.min_reclaim {
                    q = q.saturating_add(m.amount(o.capacity));
                }
            }
            o.available < q
        })
        .copied()
        .collect()
}

/// Both lists, each threshold once.
pub fn merge(a: Vec<Threshold>, b: Vec<Threshold>) -> Vec<Threshold> {
    let mut out = a;
    for t in b {
        if !out.iter().any(|x| x.key() == t.key()) {
            out.push(t);
        }
    }
    out
}

/// When each threshold met now was first seen met (kept from `before` when it was met then).
pub fn first_observed(
    met: &[Threshold],
    before: &BTreeMap<(Signal, bool), Instant>,
    now: Instant,
) -> BTreeMap<(Signal, bool), Instant> {
    met.iter()
        .map(|t| (t.key(), before.get(&t.key()).copied().unwrap_or(now)))
        .collect()
}

/// The thresholds met for at least their grace period (kubelet's thresholdsMetGracePeriod).
pub fn met_grace_period(met: &[Threshold], first: &BTreeMap<(Signal, bool), Instant>, now: Instant) -> Vec<Threshold> {
    met.iter()
        .filter(|t| {
            first
                .get(&t.key())
                .is_some_and(|at| now.saturating_duration_since(*at) >= t.grace_period)
        })
        .copied()
        .collect()
}

/// The conditions the thresholds raise, each once, in kubelet's order.
pub fn conditions(met: &[Threshold]) -> Vec<Condition> {
    let mut c: Vec<Condition> = met.iter().map(|t| t.signal.condition()).collect();
    c.sort();
    c.dedup();
    c
}

/// The conditions seen within the transition period (kubelet's nodeConditionsObservedSince),
/// after noting those seen `now`.
pub fn conditions_observed_since(
    last_seen: &mut BTreeMap<Condition, Instant>,
    now_seen: &[Condition],
    period: Duration,
    now: Instant,
) -> Vec<Condition> {
    for c in now_seen {
        last_seen.insert(*c, now);
    }
    last_seen.retain(|_, at| now.saturating_duration_since(*at) < period);
    last_seen.keys().copied().collect()
}

/// The threshold to act on first: memory before the others (kubelet's byEvictionPriority).
pub fn by_eviction_priority(mut ts: Vec<Threshold>) -> Vec<Threshold> {
    ts.sort_by_key(|t| t.signal.resource() != Resource::Memory);
    ts
}

/// A quantity as Go's resource.Quantity prints it: binary suffixes (Ki, Mi, ...) for bytes,
/// decimal ones (k, M, ...) for counts, only when they divide it exactly.
pub fn format_quantity(v: i64, binary: bool) -> String {
    if v == 0 {
        return "0".into();
    }
    let (base, suffixes): (i64, [&str; 7]) = match binary {
        true => (1024, ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]),
        false => (1000, ["", "k", "M", "G", "T", "P", "E"]),
    };
    let (mut n, mut i) = (v, 0);
    while n % base == 0 && i < 6 {
        n /= base;
        i += 1;
    }
    format!("{n}{}", suffixes[i])
}

/// kubelet's "The node was low on resource: ..." start of an eviction message, with the
/// threshold met and what was available.
pub fn node_low_message(resource: Resource, met: &[Threshold], obs: &Observations) -> String {
    let mut m = format!("The node was low on resource: {}. ", resource.name());
    // getThresholdMetInfo: the first threshold met of a signal starving this resource.
    if let Some((t, o)) = met
        .iter()
        .filter(|t| t.signal.resource() == resource)
        .find_map(|t| obs.get(&t.signal).map(|o| (t, o)))
    {
        let b = t.signal.binary();
        m.push_str(&format!(
            "Threshold quantity: {}, available: {}. ",
            format_quantity(t.quantity(o.capacity), b),
            format_quantity(o.available, b)
        ));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Threshold as T;

    fn obs(sig: Signal, available: i64, capacity: i64) -> Observations {
        [(sig, Observation { available, capacity })].into_iter().collect()
    }

    fn hard(signal: Signal, value: T) -> Threshold {
        Threshold {
            signal,
            value,
            grace_period: Duration::ZERO,
            min_reclaim: None,
        }
    }

    #[test]
    fn quantities_print_as_go_does() {
        assert_eq!(format_quantity(100 << 20, true), "100Mi");
        assert_eq!(format_quantity(1536 << 10, true), "1536Ki");
        assert_eq!(format_quantity(12345, true), "12345");
        assert_eq!(format_quantity(3 << 30, true), "3Gi");
        assert_eq!(format_quantity(0, true), "0");
        assert_eq!(format_quantity(5000, false), "5k");
        assert_eq!(format_quantity(4_194_304, false), "4194304");
    }

    #[test]
    fn thresholds_met_and_min_reclaim() {
        let mut t = hard(Signal::MemoryAvailable, T::Quantity(100 << 20));
        let o = obs(Signal::MemoryAvailable, 90 << 20, 1 << 30);
        assert_eq!(thresholds_met(&[t], &o, false).len(), 1);
        let o = obs(Signal::MemoryAvailable, 120 << 20, 1 << 30);
        assert!(thresholds_met(&[t], &o, false).is_empty());
        // With a minimum reclaim of 50Mi, a met threshold stays met up to 150Mi available.
        t.min_reclaim = Some(T::Quantity(50 << 20));
        assert_eq!(thresholds_met(&[t], &o, true).len(), 1);
        let o = obs(Signal::MemoryAvailable, 151 << 20, 1 << 30);
        assert!(thresholds_met(&[t], &o, true).is_empty());
        // Percentages are of the signal's capacity.
        let p = hard(Signal::NodeFsAvailable, T::Percent(10.0));
        assert_eq!(
            thresholds_met(&[p], &obs(Signal::NodeFsAvailable, 99, 1000), false).len(),
            1
        );
        assert!(thresholds_met(&[p], &obs(Signal::NodeFsAvailable, 100, 1000), false).is_empty());
        // No observation, not met.
        assert!(thresholds_met(&[p], &Observations::new(), false).is_empty());
    }

    #[test]
    fn soft_thresholds_wait_for_their_grace_period() {
        let soft = Threshold {
            grace_period: Duration::from_secs(30),
            ..hard(Signal::MemoryAvailable, T::Quantity(1 << 30))
        };
        let h = hard(Signal::PidAvailable, T::Quantity(100));
        let t0 = Instant::now();
        let met = vec![soft, h];
        let first = first_observed(&met, &BTreeMap::new(), t0);
        let now = met_grace_period(&met, &first, t0);
        assert_eq!(now, vec![h], "hard thresholds act at once");
        let first = first_observed(&met, &first, t0 + Duration::from_secs(31));
        assert_eq!(met_grace_period(&met, &first, t0 + Duration::from_secs(31)).len(), 2);
        // Not met any more: forgotten, the grace period starts again.
        let first = first_observed(&[h], &first, t0 + Duration::from_secs(40));
        let first = first_observed(&met, &first, t0 + Duration::from_secs(41));
        assert_eq!(met_grace_period(&met, &first, t0 + Duration::from_secs(50)), vec![h]);
    }

    #[test]
    fn conditions_linger_for_the_transition_period() {
        let mut seen = BTreeMap::new();
        let t0 = Instant::now();
        let period = Duration::from_secs(300);
        let met = [
            hard(Signal::NodeFsInodesFree, T::Percent(5.0)),
            hard(Signal::ImageFsAvailable, T::Percent(5.0)),
        ];
        let c = conditions(&met);
        assert_eq!(c, vec![Condition::DiskPressure]);
        assert_eq!(conditions_observed_since(&mut seen, &c, period, t0), c);
        let later = t0 + Duration::from_secs(299);
        assert_eq!(conditions_observed_since(&mut seen, &[], period, later), c);
        assert!(conditions_observed_since(&mut seen, &[], period, t0 + period).is_empty());
    }

    #[test]
    fn memory_is_reclaimed_first() {
        let d = hard(Signal::NodeFsAvailable, T::Percent(10.0));
        let m = hard(Signal::MemoryAvailable, T::Quantity(1));
        let sorted = by_eviction_priority(vec![d, m]);
        assert_eq!(sorted[0].signal, Signal::MemoryAvailable);
    }

    #[test]
    fn node_low_message_names_threshold_and_available() {
        let t = hard(Signal::MemoryAvailable, T::Quantity(100 << 20));
        let o = obs(Signal::MemoryAvailable, 50 << 20, 1 << 30);
        assert_eq!(
            node_low_message(Resource::Memory, &[t], &o),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
        );
        let p = hard(Signal::NodeFsAvailable, T::Percent(50.0));
        let o = obs(Signal::NodeFsAvailable, 1 << 20, 8 << 20);
        assert_eq!(
            node_low_message(Resource::EphemeralStorage, &[p], &o),
            "The node was low on resource: ephemeral-storage. Threshold quantity: 4Mi, available: 1Mi. "
        );
    }

    #[test]
    fn configured_thresholds() {
        let mut soft = EvictionHard::none();
        soft.set("memory.available", Some(T::Quantity(1 << 30)));
        let grace = [("memory.available".to_string(), Duration::from_secs(90))]
            .into_iter()
            .collect();
        let reclaim = [("nodefs.available".to_string(), T::Quantity(1 << 20))]
            .into_iter()
            .collect();
        let ts = thresholds(&EvictionHard::default(), &soft, &grace, &reclaim, false);
        let nodefs = ts.iter().find(|t| t.signal == Signal::NodeFsAvailable).unwrap();
        assert!(nodefs.is_hard());
        assert_eq!(nodefs.min_reclaim, Some(T::Quantity(1 << 20)));
        let s = ts.iter().find(|t| !t.is_hard()).unwrap();
        assert_eq!(
            (s.signal, s.grace_period),
            (Signal::MemoryAvailable, Duration::from_secs(90))
        );
    }

    #[test]
    fn enforced_allocatable_gets_the_hard_memory_threshold() {
        let mut hard_map = EvictionHard::none();
        hard_map.set("memory.available", Some(T::Quantity(100 << 20)));
        let mut soft = EvictionHard::none();
        soft.set("memory.available", Some(T::Quantity(1 << 30)));
        let grace = [("memory.available".to_string(), Duration::from_secs(90))]
            .into_iter()
            .collect();
        let reclaim = [("memory.available".to_string(), T::Quantity(1 << 20))]
            .into_iter()
            .collect();
        let ts = thresholds(&hard_map, &soft, &grace, &reclaim, true);
        let alloc: Vec<_> = ts
            .iter()
            .filter(|t| t.signal == Signal::AllocatableMemoryAvailable)
            .collect();
        assert_eq!(alloc.len(), 1, "only the hard one is copied: {ts:?}");
        assert!(alloc[0].is_hard());
        assert_eq!(alloc[0].value, T::Quantity(100 << 20));
        assert_eq!(alloc[0].min_reclaim, Some(T::Quantity(1 << 20)));
        let without = thresholds(&hard_map, &soft, &grace, &reclaim, false);
        assert!(without.iter().all(|t| t.signal != Signal::AllocatableMemoryAvailable));
    }

    #[test]
    fn allocatable_is_observed_from_the_pods_container() {
        use crate::stats::summary::{ContainerStats, MemoryStats};
        let mem = |available: u64, ws: u64| MemoryStats {
            available_bytes: Some(available),
            working_set_bytes: Some(ws),
            ..Default::default()
        };
        let mut s = Summary::default();
        s.node.memory = Some(mem(8 << 30, 8 << 30));
        s.node.system_containers.push(ContainerStats {
            name: SYSTEM_CONTAINER_PODS.into(),
            memory: Some(mem(200 << 20, 824 << 20)),
            ..Default::default()
        });
        let o = observe(&s);
        assert_eq!(
            o[&Signal::AllocatableMemoryAvailable],
            Observation {
                available: 200 << 20,
                capacity: 1 << 30
            }
        );
        assert_eq!(o[&Signal::MemoryAvailable].available, 8 << 30);
        let t = hard(Signal::AllocatableMemoryAvailable, T::Quantity(256 << 20));
        assert_eq!(thresholds_met(&[t], &o, false), vec![t]);
        assert_eq!(t.signal.condition(), Condition::MemoryPressure);
    }
}
