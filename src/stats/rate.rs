//! usageNanoCores as cAdvisor computes it: the growth of a cumulative cpu counter between the
//! last two samples divided by the time between them. Only the last two samples of each cgroup
//! are kept; a counter that went backwards (the cgroup was recreated) starts over.

use std::collections::HashMap;

/// One reading of a cumulative cpu counter at a wall-clock time (nanoseconds since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuSample {
    pub at_nanos: i64,
    pub usage_nanos: u64,
}

/// The last two samples of each cgroup (or of the node), by key.
#[derive(Debug, Default)]
pub struct CpuHistory {
    last: HashMap<String, (Option<CpuSample>, CpuSample)>,
}

impl CpuHistory {
    /// Record `s` for `key` and return the rate in nanocores over the window ending at `s`, or
    /// `None` with only one sample (or a counter that restarted, or no time between samples).
    pub fn record(&mut self, key: &str, s: CpuSample) -> Option<u64> {
        let prev = self.last.get(key).map(|(_, cur)| *cur);
        let prev = prev.filter(|p| p.usage_nanos <= s.usage_nanos && p.at_nanos < s.at_nanos);
        self.last.insert(key.to_string(), (prev, s));
        prev.and_then(|p| rate(p, s))
    }

    /// Forget every key not in `live` (gone cgroups).
    pub fn retain(&mut self, live: &std::collections::HashSet<String>) {
        self.last.retain(|k, _| live.contains(k));
    }

    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

/// Nanocores between two samples: cpu nanoseconds used per second of wall time.
pub fn rate(prev: CpuSample, cur: CpuSample) -> Option<u64> {
    let dt = cur.at_nanos.checked_sub(prev.at_nanos).filter(|d| *d > 0)? as u128;
    let du = cur.usage_nanos.checked_sub(prev.usage_nanos)? as u128;
    u64::try_from(du * 1_000_000_000 / dt).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at_ms: i64, usage_ms: u64) -> CpuSample {
        CpuSample {
            at_nanos: at_ms * 1_000_000,
            usage_nanos: usage_ms * 1_000_000,
        }
    }

    #[test]
    fn one_core_busy_is_a_billion_nanocores() {
        assert_eq!(rate(s(0, 0), s(10_000, 10_000)), Some(1_000_000_000));
        assert_eq!(rate(s(0, 0), s(10_000, 2_500)), Some(250_000_000));
        assert_eq!(rate(s(0, 0), s(2_000, 4_000)), Some(2_000_000_000));
    }

    #[test]
    fn no_rate_without_two_samples_or_time() {
        let mut h = CpuHistory::default();
        assert_eq!(h.record("a", s(0, 0)), None);
        assert_eq!(h.record("a", s(1000, 500)), Some(500_000_000));
        // the same instant again: no window
        assert_eq!(h.record("a", s(1000, 600)), None);
        assert_eq!(rate(s(5, 0), s(5, 10)), None);
    }

    #[test]
    fn a_counter_going_backwards_starts_over() {
        let mut h = CpuHistory::default();
        h.record("a", s(0, 1000));
        assert_eq!(h.record("a", s(1000, 10)), None);
        assert_eq!(h.record("a", s(2000, 110)), Some(100_000_000));
    }

    #[test]
    fn keys_are_separate_and_forgotten() {
        let mut h = CpuHistory::default();
        h.record("a", s(0, 0));
        h.record("b", s(0, 0));
        assert_eq!(h.record("b", s(1000, 1000)), Some(1_000_000_000));
        h.retain(&["a".to_string()].into_iter().collect());
        assert_eq!(h.len(), 1);
        assert_eq!(h.record("b", s(2000, 2000)), None);
    }
}
