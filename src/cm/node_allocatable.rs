//! kubelet's node allocatable enforcement (`pkg/kubelet/cm/node_container_manager_linux.go`):
//! `kubepods` always gets the node's cpu shares, memory and pids (capacity, or with
//! `enforceNodeAllocatable: [pods]` capacity - systemReserved - kubeReserved - huge pages;
//! eviction thresholds are not subtracted here, only from the scheduler's allocatable); with
//! `system-reserved` / `kube-reserved` the existing `systemReservedCgroup` /
//! `kubeReservedCgroup` get the reservations as limits.

use std::time::Duration;

use anyhow::{bail, Result};
use ferrolet_runtime::cgroups::{hugepage_size_name, CgroupLimits};
use tracing::info;

use super::pod_container_manager::PodCgroups;
use crate::config::{Config, Reserved};
use crate::events::{Kind, Recorder};
use crate::node::allocatable::{hugepage_resource, Resources};
use crate::pod::qos;

/// kubelet's getCgroupConfig of the node allocatable for `kubepods`: `capacity` (with `max_pid`,
/// kubelet's internal pid capacity), less the reservations when `enforce_pods`.
pub fn kubepods_limits(
    capacity: &Resources,
    max_pid: Option<i64>,
    system: Reserved,
    kube: Reserved,
    enforce_pods: bool,
    hugepage_sizes_kb: &[u64],
) -> CgroupLimits {
    let less = |cap: i64, a: i64, b: i64| {
        if enforce_pods {
            cap.saturating_sub(a).saturating_sub(b).max(0)
        } else {
            cap
        }
    };
    let cpu = less(capacity.cpu_milli, system.cpu_milli, kube.cpu_milli);
    let mut memory = less(capacity.memory, system.memory, kube.memory);
    if enforce_pods {
        let huge: i64 = capacity.hugepages.values().fold(0i64, |a, b| a.saturating_add(*b));
        memory = memory.saturating_sub(huge).max(0);
    }
    let pids = max_pid.map(|m| less(m, system.pid, kube.pid));
    let hugetlb = hugepage_sizes_kb
        .iter()
        .filter_map(|kb| {
            let bytes = capacity.hugepages.get(&hugepage_resource(*kb))?;
            Some((hugepage_size_name(*kb), *bytes))
        })
        .collect();
    CgroupLimits {
        cpu_shares: Some(qos::milli_cpu_to_shares(cpu)),
        // 0 would read as "no limit" in the cgroup files; keep one page.
        memory_limit: Some(memory.max(4096)),
        pids_limit: pids.map(|p| p.max(1)),
        hugetlb,
        ..Default::default()
    }
}

/// kubelet's getCgroupConfig of a reservation: only what was reserved.
pub fn reserved_limits(r: Reserved) -> CgroupLimits {
    CgroupLimits {
        cpu_shares: (r.cpu_milli > 0).then(|| qos::milli_cpu_to_shares(r.cpu_milli)),
        memory_limit: (r.memory > 0).then_some(r.memory),
        pids_limit: (r.pid > 0).then_some(r.pid),
        ..Default::default()
    }
}

/// The `kubepods` limits for this configuration and machine.
pub fn kubepods_limits_for(cfg: &Config, capacity: &Resources, cgroups: &PodCgroups) -> CgroupLimits {
    kubepods_limits(
        capacity,
        crate::node::machine::pids().ok().map(|(max, _)| max),
        cfg.system_reserved,
        cfg.kube_reserved,
        cfg.cgroups_per_qos && cfg.cm.enforces("pods"),
        &cgroups.options().hugepage_sizes_kb,
    )
}

/// kubelet's enforceNodeAllocatableCgroups: update `kubepods` (retried every minute in the
/// background while memory in use is above the new limit, with kubelet's events), then the
/// reserved cgroups, which must exist: an error there stops the agent, as it stops kubelet.
pub fn enforce(cfg: &Config, cgroups: &PodCgroups, kubepods: CgroupLimits, events: &Recorder) -> Result<()> {
    if cfg.cgroups_per_qos {
        let (cg, path, events) = (cgroups.clone(), cgroups.kubepods(), events.clone());
        let first = cg.update_level(&path, &kubepods);
        match first {
            Ok(()) => {
                info!(cgroup = %path, memory = kubepods.memory_limit, cpu_shares = kubepods.cpu_shares, pids = kubepods.pids_limit, "node allocatable enforced");
                events.node(
                    Kind::Normal,
                    "SuccessfulNodeAllocatableEnforcement",
                    "Updated Node Allocatable limit across pods",
                );
            }
            Err(e) => {
                events.node(
                    Kind::Warning,
                    "FailedNodeAllocatableEnforcement",
                    &format!("Failed to update Node Allocatable Limits {path:?}: {e:#}"),
                );
                std::thread::Builder::new()
                    .name("node-allocatable".into())
                    .spawn(move || loop {
                        std::thread::sleep(Duration::from_secs(60));
                        match cg.update_level(&path, &kubepods) {
                            Ok(()) => {
                                events.node(
                                    Kind::Normal,
                                    "SuccessfulNodeAllocatableEnforcement",
                                    "Updated Node Allocatable limit across pods",
                                );
                                return;
                            }
                            Err(e) => events.node(
                                Kind::Warning,
                                "FailedNodeAllocatableEnforcement",
                                &format!("Failed to update Node Allocatable Limits {path:?}: {e:#}"),
                            ),
                        }
                    })?;
            }
        }
    }
    for (key, name, path, reserved) in [
        (
            "system-reserved",
            "System",
            &cfg.cm.system_reserved_cgroup,
            cfg.system_reserved,
        ),
        ("kube-reserved", "Kube", &cfg.cm.kube_reserved_cgroup, cfg.kube_reserved),
    ] {
        if !cfg.cm.enforces(key) {
            continue;
        }
        let result = if cgroups.runtime().exists(path) {
            cgroups.update_level(path, &reserved_limits(reserved))
        } else {
            Err(anyhow::anyhow!("{path:?} cgroup does not exist"))
        };
        if let Err(e) = result {
            let message = format!("Failed to enforce {name} Reserved Cgroup Limits on {path:?}: {e:#}");
            events.node(Kind::Warning, "FailedNodeAllocatableEnforcement", &message);
            bail!(message);
        }
        events.node(
            Kind::Normal,
            "SuccessfulNodeAllocatableEnforcement",
            &format!("Updated limits on {} reserved cgroup {path}", name.to_lowercase()),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity() -> Resources {
        crate::node::allocatable::test_capacity()
    }

    #[test]
    fn kubepods_is_capacity_unless_pods_are_enforced() {
        let system = Reserved {
            cpu_milli: 500,
            memory: 1 << 30,
            pid: 1000,
            ..Default::default()
        };
        let kube = Reserved {
            cpu_milli: 500,
            memory: 512 << 20,
            ..Default::default()
        };
        let l = kubepods_limits(&capacity(), Some(100_000), system, kube, false, &[2048]);
        assert_eq!(l.cpu_shares, Some(4096));
        assert_eq!(l.memory_limit, Some(8 << 30));
        assert_eq!(l.pids_limit, Some(100_000));
        assert_eq!(l.hugetlb.get("2MB"), Some(&(512 << 20)));
        let l = kubepods_limits(&capacity(), Some(100_000), system, kube, true, &[]);
        assert_eq!(l.cpu_shares, Some(3072));
        // No eviction threshold here: kubelet subtracts it only from the scheduler's view.
        assert_eq!(l.memory_limit, Some((8 << 30) - (1 << 30) - (512 << 20) - (512 << 20)));
        assert_eq!(l.pids_limit, Some(99_000));
        assert!(l.hugetlb.is_empty());
    }

    #[test]
    fn reservations_become_limits() {
        let l = reserved_limits(Reserved {
            cpu_milli: 250,
            memory: 64 << 20,
            ..Default::default()
        });
        assert_eq!(
            (l.cpu_shares, l.memory_limit, l.pids_limit),
            (Some(256), Some(64 << 20), None)
        );
        assert_eq!(reserved_limits(Reserved::default()), CgroupLimits::default());
    }
}
