//! kubelet's QoS container manager (`pkg/kubelet/cm/qos_container_manager_linux.go`): the
//! `burstable` tier's cpu shares are the sum of its pods' cpu requests, `besteffort` stays at
//! the minimum (2); with `qosReserved: {memory: NN%}` the tiers' memory limits keep NN% of the
//! higher tiers' memory requests away from the lower ones. Recomputed before a pod cgroup is
//! created, after one is removed, and every `ferrolet.qosUpdatePeriod` (kubelet: 1m).

use std::borrow::Borrow;
use std::sync::{Arc, Mutex};

use ferrolet_runtime::cgroups::CgroupLimits;
use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::pod_container_manager::PodCgroups;
use crate::pod::{self, qos};

/// The pods that count: admitted and not finished (kubelet's activePods).
pub type ActivePods = Arc<dyn Fn() -> Vec<Arc<Pod>> + Send + Sync>;

/// The limits of the two QoS tiers (Guaranteed pods sit in `kubepods` itself).
#[derive(Debug, Clone, PartialEq)]
pub struct TierLimits {
    pub burstable: CgroupLimits,
    pub besteffort: CgroupLimits,
}

/// kubelet's setCPUCgroupConfig and setMemoryReserve: burstable shares from the sum of the
/// Burstable pods' cpu requests (MilliCPUToShares, 2 when none), besteffort 2 shares; with a
/// memory reserve of `reserve_pct`, burstable memory = allocatable - guaranteed requests x pct,
/// besteffort = that - burstable requests x pct. `allocatable_memory` is the node's allocatable
/// without eviction thresholds (kubelet's GetNodeAllocatableAbsolute).
pub fn tier_limits<P: Borrow<Pod>>(pods: &[P], allocatable_memory: i64, reserve_pct: Option<i64>) -> TierLimits {
    let mut burstable_cpu = 0i64;
    let (mut guaranteed_mem, mut burstable_mem) = (0i64, 0i64);
    for p in pods {
        let p: &Pod = p.borrow();
        match qos::qos_class(p) {
            qos::QosClass::Burstable => {
                burstable_cpu = burstable_cpu.saturating_add(qos::pod_requests(p, "cpu"));
                burstable_mem = burstable_mem.saturating_add(qos::pod_requests(p, "memory"));
            }
            qos::QosClass::Guaranteed => {
                guaranteed_mem = guaranteed_mem.saturating_add(qos::pod_requests(p, "memory"));
            }
            qos::QosClass::BestEffort => {}
        }
    }
    let mut t = TierLimits {
        burstable: CgroupLimits {
            cpu_shares: Some(qos::milli_cpu_to_shares(burstable_cpu)),
            ..Default::default()
        },
        besteffort: CgroupLimits {
            cpu_shares: Some(2),
            ..Default::default()
        },
    };
    if let Some(pct) = reserve_pct.filter(|_| allocatable_memory > 0) {
        let reserve = |requests: i64| (requests as i128 * pct as i128 / 100) as i64;
        let burstable = allocatable_memory.saturating_sub(reserve(guaranteed_mem));
        let besteffort = burstable.saturating_sub(reserve(burstable_mem));
        // A limit of 0 or less would mean "unlimited" in the cgroup files: keep one page.
        t.burstable.memory_limit = Some(burstable.max(4096));
        t.besteffort.memory_limit = Some(besteffort.max(4096));
    }
    t
}

pub struct QosManager {
    cgroups: PodCgroups,
    allocatable_memory: i64,
    reserve_pct: Option<i64>,
    active: ActivePods,
    /// The limits last written, so each change is logged once; updates are serialized.
    last: Mutex<Option<TierLimits>>,
    /// Pods whose cgroup went while they may still be in the pod table (removed from it after
    /// their teardown): left out until they leave the table.
    gone: Mutex<std::collections::BTreeSet<String>>,
}

impl QosManager {
    pub fn new(
        cgroups: PodCgroups,
        allocatable_memory: i64,
        reserve_pct: Option<i64>,
        active: ActivePods,
    ) -> QosManager {
        QosManager {
            cgroups,
            allocatable_memory,
            reserve_pct,
            active,
            last: Mutex::new(None),
            gone: Mutex::new(Default::default()),
        }
    }

    /// Recompute and write the tiers from the active pods, counting `adding` (about to get its
    /// cgroup) and leaving out `removing` (its cgroup just went). Blocking (cgroupfs).
    pub fn update(&self, adding: Option<&Pod>, removing: Option<&str>) {
        if !self.cgroups.per_qos() {
            return;
        }
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let mut pods: Vec<Arc<Pod>> = (self.active)();
        {
            let mut gone = self.gone.lock().unwrap_or_else(|e| e.into_inner());
            gone.retain(|uid| pods.iter().any(|p| pod::uid(p) == uid));
            if let Some(uid) = removing {
                gone.insert(uid.to_string());
            }
            if let Some(a) = adding {
                gone.remove(pod::uid(a));
            }
            pods.retain(|p| !gone.contains(pod::uid(p)));
        }
        if let Some(a) = adding {
            if !pods.iter().any(|p| pod::uid(p) == pod::uid(a)) {
                pods.push(Arc::new(a.clone()));
            }
        }
        let want = tier_limits(&pods, self.allocatable_memory, self.reserve_pct);
        let mut written = want.clone();
        for (class, limits, out) in [
            (qos::QosClass::Burstable, &want.burstable, &mut written.burstable),
            (qos::QosClass::BestEffort, &want.besteffort, &mut written.besteffort),
        ] {
            let path = self.cgroups.qos_path(class);
            if let Err(e) = self.cgroups.update_level(&path, limits) {
                // kubelet's retrySetMemoryReserve: memory in use above the new limit makes the
                // write fail; set the limit at the usage to stop further growth.
                let usage = self.cgroups.runtime().memory_usage(&path).map(|u| u as i64);
                match (limits.memory_limit, usage) {
                    (Some(m), Some(u)) if u > m => {
                        let retry = CgroupLimits {
                            memory_limit: Some(u),
                            ..limits.clone()
                        };
                        match self.cgroups.update_level(&path, &retry) {
                            Ok(()) => *out = retry,
                            Err(e) => warn!(cgroup = %path, error = %format!("{e:#}"), "updating QoS tier"),
                        }
                    }
                    _ => warn!(cgroup = %path, error = %format!("{e:#}"), "updating QoS tier"),
                }
            }
        }
        if last.as_ref() != Some(&written) {
            info!(
                pods = pods.len(),
                burstable_cpu_shares = written.burstable.cpu_shares,
                burstable_memory = written.burstable.memory_limit,
                besteffort_memory = written.besteffort.memory_limit,
                "QoS tiers updated"
            );
            *last = Some(written);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, resources: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "uid": uid},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": resources}]}
        }))
        .unwrap()
    }

    #[test]
    fn burstable_shares_follow_requests() {
        let none: Vec<Pod> = Vec::new();
        let t = tier_limits(&none, 1 << 30, None);
        assert_eq!((t.burstable.cpu_shares, t.besteffort.cpu_shares), (Some(2), Some(2)));
        assert_eq!(t.burstable.memory_limit, None);
        let pods = vec![
            pod("b1", serde_json::json!({"requests": {"cpu": "100m"}})),
            pod("b2", serde_json::json!({"requests": {"cpu": "250m", "memory": "64Mi"}})),
            pod(
                "g",
                serde_json::json!({"limits": {"cpu": "1", "memory": "128Mi"}, "requests": {"cpu": "1", "memory": "128Mi"}}),
            ),
            pod("e", serde_json::json!({})),
        ];
        let t = tier_limits(&pods, 1 << 30, None);
        // 350m -> 358 shares; Guaranteed and BestEffort pods do not count.
        assert_eq!(t.burstable.cpu_shares, Some(358));
        assert_eq!(t.besteffort.cpu_shares, Some(2));
        assert_eq!(
            ferrolet_runtime::cgroups::shares_to_weight(358),
            14,
            "cgroup v2 writes cpu.weight 14"
        );
    }

    #[test]
    fn memory_reserve_as_kubelet() {
        let pods = vec![
            pod("b", serde_json::json!({"requests": {"memory": "100Mi"}})),
            pod(
                "g",
                serde_json::json!({"limits": {"cpu": "1", "memory": "200Mi"}, "requests": {"cpu": "1", "memory": "200Mi"}}),
            ),
        ];
        let alloc = 1i64 << 30;
        let t = tier_limits(&pods, alloc, Some(50));
        let burstable = alloc - (200 << 20) / 2;
        assert_eq!(t.burstable.memory_limit, Some(burstable));
        assert_eq!(t.besteffort.memory_limit, Some(burstable - (100 << 20) / 2));
        let t = tier_limits(&pods, alloc, Some(0));
        assert_eq!(
            (t.burstable.memory_limit, t.besteffort.memory_limit),
            (Some(alloc), Some(alloc))
        );
        let t = tier_limits(&pods, 100 << 20, Some(100));
        assert_eq!(
            t.besteffort.memory_limit,
            Some(4096),
            "never 0, which would lift the limit"
        );
    }
}
