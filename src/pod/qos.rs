//! The pod's QoS class, computed exactly as kubelet's GetPodQOS does, and the numbers kubelet
//! derives from requests and limits: cpu shares, CFS quota, OOM score adjustment.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::pod::units::{bytes, milli};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

fn amount(res: &str, q: &str) -> i64 {
    if res == "cpu" {
        milli(q).unwrap_or(0)
    } else {
        bytes(q).unwrap_or(0)
    }
}

pub fn qos_class(pod: &Pod) -> QosClass {
    let mut requests: BTreeMap<String, i64> = BTreeMap::new();
    let mut limits: BTreeMap<String, i64> = BTreeMap::new();
    let mut guaranteed = true;
    for c in super::containers(pod).iter().chain(super::init_containers(pod)) {
        let r = c.resources.as_ref();
        for (k, q) in r.and_then(|r| r.requests.as_ref()).into_iter().flatten() {
            if k == "cpu" || k == "memory" {
                let v = amount(k, &q.0);
                if v != 0 {
                    *requests.entry(k.clone()).or_default() += v;
                }
            }
        }
        let mut found = 0;
        for (k, q) in r.and_then(|r| r.limits.as_ref()).into_iter().flatten() {
            if k == "cpu" || k == "memory" {
                let v = amount(k, &q.0);
                if v != 0 {
                    found += 1;
                    *limits.entry(k.clone()).or_default() += v;
                }
            }
        }
        if found < 2 {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    if guaranteed && requests.len() == limits.len() && requests.iter().all(|(k, v)| limits.get(k) == Some(v)) {
        return QosClass::Guaranteed;
    }
    QosClass::Burstable
}

/// kubelet's MilliCPUToShares: 1024 shares per core, at least 2 and at most 262144 (the
/// kernel's range). Quantities from a manifest can be anything: the arithmetic saturates.
pub fn milli_cpu_to_shares(m: i64) -> u64 {
    if m <= 0 {
        return 2;
    }
    (m.saturating_mul(1024) / 1000).clamp(2, 262_144) as u64
}

pub const CPU_PERIOD_US: u64 = 100_000;

/// The largest CFS quota the kernel takes (µs; its max_cfs_runtime).
pub const MAX_CPU_QUOTA_US: i64 = (1 << 44) - 1;

/// kubelet's MilliCPUToQuota: quota for `m` millicores per 100ms period, at least 1ms, at most
/// what the kernel takes.
pub fn milli_cpu_to_quota(m: i64) -> i64 {
    milli_cpu_to_quota_with_period(m, CPU_PERIOD_US)
}

/// kubelet's MilliCPUToQuota with a cpuCFSQuotaPeriod of `period_us`.
pub fn milli_cpu_to_quota_with_period(m: i64, period_us: u64) -> i64 {
    if m <= 0 {
        return 0;
    }
    (m.saturating_mul(period_us.min(i64::MAX as u64) as i64) / 1000).clamp(1000, MAX_CPU_QUOTA_US)
}

pub fn request(c: &Container, res: &str) -> i64 {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|m| m.get(res))
        .map(|q| amount(res, &q.0))
        .unwrap_or(0)
}

pub fn limit(c: &Container, res: &str) -> i64 {
    c.resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|m| m.get(res))
        .map(|q| amount(res, &q.0))
        .unwrap_or(0)
}

/// kubelet's GetContainerOOMScoreAdjust.
pub fn oom_score_adj(qos: QosClass, memory_request: i64, node_memory: i64) -> i32 {
    match qos {
        QosClass::Guaranteed => -997,
        QosClass::BestEffort => 1000,
        QosClass::Burstable => {
            if node_memory <= 0 {
                return 999;
            }
            let adj = 1000 - memory_request.saturating_mul(1000) / node_memory;
            adj.clamp(3, 999) as i32
        }
    }
}

/// Requests a pod needs from the node: max(sum of app containers, largest init container),
/// as kubelet's admission computes it (sidecars count with the app containers).
pub fn pod_requests(pod: &Pod, res: &str) -> i64 {
    let mut sidecars: i64 = 0;
    let mut init_max: i64 = 0;
    for c in super::init_containers(pod) {
        let r = request(c, res);
        if super::is_sidecar(c) {
            sidecars = sidecars.saturating_add(r);
            init_max = init_max.max(sidecars);
        } else {
            init_max = init_max.max(sidecars.saturating_add(r));
        }
    }
    let apps = super::containers(pod)
        .iter()
        .fold(sidecars, |sum, c| sum.saturating_add(request(c, res)));
    apps.max(init_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata":{"name":"p"},"spec":{"containers":containers}})).unwrap()
    }

    #[test]
    fn classes() {
        assert_eq!(
            qos_class(&pod(serde_json::json!([{"name":"a","image":"x"}]))),
            QosClass::BestEffort
        );
        let g = pod(
            serde_json::json!([{"name":"a","image":"x","resources":{"limits":{"cpu":"1","memory":"1Gi"},"requests":{"cpu":"1","memory":"1Gi"}}}]),
        );
        assert_eq!(qos_class(&g), QosClass::Guaranteed);
        let b = pod(serde_json::json!([{"name":"a","image":"x","resources":{"requests":{"cpu":"100m"}}}]));
        assert_eq!(qos_class(&b), QosClass::Burstable);
        let b2 = pod(
            serde_json::json!([{"name":"a","image":"x","resources":{"limits":{"cpu":"1","memory":"1Gi"},"requests":{"cpu":"500m","memory":"1Gi"}}}]),
        );
        assert_eq!(qos_class(&b2), QosClass::Burstable);
    }

    #[test]
    fn shares_and_quota() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_quota(500), 50_000);
        assert_eq!(milli_cpu_to_quota(1), 1000);
        assert_eq!(milli_cpu_to_quota_with_period(500, 50_000), 25_000);
        assert_eq!(milli_cpu_to_quota_with_period(1500, 1_000_000), 1_500_000);
        assert_eq!(milli_cpu_to_quota_with_period(5, 10_000), 1000);
    }

    #[test]
    fn oom_adjustments() {
        assert_eq!(oom_score_adj(QosClass::Guaranteed, 0, 100), -997);
        assert_eq!(oom_score_adj(QosClass::BestEffort, 0, 100), 1000);
        assert_eq!(oom_score_adj(QosClass::Burstable, 50, 100), 500);
        assert_eq!(oom_score_adj(QosClass::Burstable, 100, 100), 3);
    }

    #[test]
    fn huge_quantities_saturate_instead_of_overflowing() {
        // Found by the pod_manifest fuzzer: `cpu: 50Ti` overflowed the quota arithmetic.
        let huge = milli("50Ti").unwrap();
        assert_eq!(milli_cpu_to_quota(huge), MAX_CPU_QUOTA_US);
        assert_eq!(milli_cpu_to_quota(i64::MAX), MAX_CPU_QUOTA_US);
        assert_eq!(milli_cpu_to_shares(i64::MAX), 262_144);
        assert_eq!(oom_score_adj(QosClass::Burstable, i64::MAX, 1 << 30), 3);
        let p: Pod = serde_json::from_value(serde_json::json!({"metadata":{"name":"p"},"spec":{"containers":[
            {"name":"a","image":"x","resources":{"requests":{"cpu":"9e18","memory":"8Ei"}}},
            {"name":"b","image":"x","resources":{"requests":{"cpu":"9e18","memory":"8Ei"}}}]}}))
        .unwrap();
        assert_eq!(pod_requests(&p, "cpu"), i64::MAX);
        assert_eq!(pod_requests(&p, "memory"), i64::MAX);
    }
}
