//! Which pods stop when, and for how long (kubelet's migrateConfig and groupByPriority in
//! pkg/kubelet/nodeshutdown): the priority groups of shutdownGracePeriodByPodPriority, or the
//! two groups shutdownGracePeriod and shutdownGracePeriodCriticalPods make; each pod in the
//! highest group whose priority it reaches.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::config::shutdown::{PriorityGrace, ShutdownConfig};

use crate::eviction::rank::{priority, SYSTEM_CRITICAL_PRIORITY};

/// The priority groups, lowest priority (stopped first) first; empty when graceful shutdown
/// is off. From the two periods: everything below system-critical gets the period less the
/// critical pods' part, the critical pods that part.
pub fn groups(cfg: &ShutdownConfig) -> Vec<PriorityGrace> {
    let mut out = if !cfg.by_pod_priority.is_empty() {
        cfg.by_pod_priority.clone()
    } else if cfg.grace_period.is_zero() {
        Vec::new()
    } else {
        let all = cfg.grace_period.as_secs() as i64;
        let critical = cfg.grace_period_critical_pods.as_secs() as i64;
        vec![
            PriorityGrace {
                priority: 0,
                shutdown_grace_period_seconds: (all - critical).max(0),
            },
            PriorityGrace {
                priority: SYSTEM_CRITICAL_PRIORITY,
                shutdown_grace_period_seconds: critical,
            },
        ]
    };
    out.sort_by_key(|g| g.priority);
    out
}

/// How long the whole shutdown may be held: every group's period (kubelet's
/// shutdownGracePeriodRequested, the InhibitDelayMaxSec it asks logind for).
pub fn requested(groups: &[PriorityGrace]) -> Duration {
    Duration::from_secs(
        groups
            .iter()
            .map(|g| g.shutdown_grace_period_seconds.max(0) as u64)
            .sum(),
    )
}

/// One group with its pods.
#[derive(Debug)]
pub struct Group {
    pub grace: PriorityGrace,
    pub pods: Vec<Arc<Pod>>,
}

/// kubelet's groupByPriority: each pod goes to the highest group whose priority is at most
/// its own; pods below the lowest group go to it, above the highest to it.
pub fn group_by_priority(groups: &[PriorityGrace], pods: Vec<Arc<Pod>>) -> Vec<Group> {
    let mut out: Vec<Group> = groups
        .iter()
        .map(|g| Group {
            grace: *g,
            pods: Vec::new(),
        })
        .collect();
    if out.is_empty() {
        return out;
    }
    for p in pods {
        let own = priority(&p);
        let i = out.iter().rposition(|g| g.grace.priority <= own).unwrap_or(0);
        out[i].pods.push(p);
    }
    out
}

/// The grace period a pod of `group` gets: its own terminationGracePeriodSeconds when that is
/// shorter than the group's period.
pub fn pod_grace(p: &Pod, group: &PriorityGrace) -> Duration {
    let mut secs = group.shutdown_grace_period_seconds.max(0);
    if let Some(own) = crate::pod::spec(p).termination_grace_period_seconds {
        if own <= secs {
            secs = own.max(0);
        }
    }
    Duration::from_secs(secs as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, priority: Option<i32>, grace: Option<i64>) -> Arc<Pod> {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "x"}]}
        }))
        .unwrap();
        let spec = p.spec.as_mut().unwrap();
        spec.priority = priority;
        spec.termination_grace_period_seconds = grace;
        Arc::new(p)
    }

    fn names(g: &Group) -> Vec<&str> {
        g.pods.iter().map(|p| p.metadata.name.as_deref().unwrap()).collect()
    }

    #[test]
    fn two_periods_make_two_groups() {
        let cfg = ShutdownConfig {
            grace_period: Duration::from_secs(30),
            grace_period_critical_pods: Duration::from_secs(10),
            ..Default::default()
        };
        let g = groups(&cfg);
        assert_eq!(
            g,
            vec![
                PriorityGrace {
                    priority: 0,
                    shutdown_grace_period_seconds: 20
                },
                PriorityGrace {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    shutdown_grace_period_seconds: 10
                },
            ]
        );
        assert_eq!(requested(&g), Duration::from_secs(30));
        assert!(groups(&ShutdownConfig::default()).is_empty());
        let grouped = group_by_priority(
            &g,
            vec![
                pod("plain", None, None),
                pod("negative", Some(-5), None),
                pod("node-critical", Some(2_000_001_000), None),
                pod("high", Some(1_000_000), None),
            ],
        );
        assert_eq!(names(&grouped[0]), ["plain", "negative", "high"]);
        assert_eq!(names(&grouped[1]), ["node-critical"]);
    }

    #[test]
    fn by_pod_priority_groups_sort_and_bound() {
        let cfg = ShutdownConfig {
            by_pod_priority: vec![
                PriorityGrace {
                    priority: 100_000,
                    shutdown_grace_period_seconds: 60,
                },
                PriorityGrace {
                    priority: 10,
                    shutdown_grace_period_seconds: 30,
                },
                PriorityGrace {
                    priority: 1000,
                    shutdown_grace_period_seconds: 20,
                },
            ],
            ..Default::default()
        };
        let g = groups(&cfg);
        assert_eq!(g.iter().map(|g| g.priority).collect::<Vec<_>>(), [10, 1000, 100_000]);
        assert_eq!(requested(&g), Duration::from_secs(110));
        let grouped = group_by_priority(
            &g,
            vec![
                pod("low", Some(0), None),
                pod("at-1000", Some(1000), None),
                pod("between", Some(50_000), None),
                pod("top", Some(i32::MAX), None),
            ],
        );
        assert_eq!(names(&grouped[0]), ["low"]);
        assert_eq!(names(&grouped[1]), ["at-1000", "between"]);
        assert_eq!(names(&grouped[2]), ["top"]);
    }

    #[test]
    fn a_pod_keeps_a_shorter_grace_period_of_its_own() {
        let g = PriorityGrace {
            priority: 0,
            shutdown_grace_period_seconds: 20,
        };
        assert_eq!(pod_grace(&pod("a", None, Some(5)), &g), Duration::from_secs(5));
        assert_eq!(pod_grace(&pod("b", None, Some(60)), &g), Duration::from_secs(20));
        assert_eq!(pod_grace(&pod("c", None, None), &g), Duration::from_secs(20));
    }
}
