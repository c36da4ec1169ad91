//! Which pod goes first (kubelet's rankMemoryPressure, rankDiskPressureFunc and
//! rankPIDPressure), and the message an evicted pod carries (kubelet's evictionMessage).

use std::cmp::Ordering;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::signals::{format_quantity, Resource};
use crate::pod::{self, qos};
use crate::stats::summary::PodStats;

/// kubelet's SystemCriticalPriority: pods at or above it are never evicted.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// A pod the manager may evict, with its stats from the summary (none: not measured).
#[derive(Debug, Clone)]
pub struct Candidate {
    pub pod: Arc<Pod>,
    pub stats: Option<PodStats>,
}

pub fn priority(p: &Pod) -> i32 {
    pod::spec(p).priority.unwrap_or(0)
}

/// kubelet's IsCriticalPod: priority at or above system-critical, or a static or mirror pod —
/// that last rule only in a cluster (`in_cluster`): on a standalone node every pod is static,
/// and it would leave the node nothing to evict (docs/eviction.md).
pub fn is_critical(p: &Pod, in_cluster: bool) -> bool {
    priority(p) >= SYSTEM_CRITICAL_PRIORITY || (in_cluster && (pod::is_static(p) || pod::is_mirror(p)))
}

/// The pod's usage of `resource`, as the ranking measures it.
pub fn usage(s: &PodStats, resource: Resource) -> Option<i64> {
    let v = match resource {
        Resource::Memory => s.memory.as_ref()?.working_set_bytes?,
        Resource::EphemeralStorage => s.ephemeral_storage.as_ref()?.used_bytes?,
        Resource::Inodes => s.ephemeral_storage.as_ref()?.inodes_used?,
        Resource::Pids => s.process_stats.as_ref()?.process_count?,
    };
    Some(v as i64)
}

/// What the pod requests of `resource` (inodes and pids are never requested).
pub fn request(p: &Pod, resource: Resource) -> i64 {
    match resource {
        Resource::Memory | Resource::EphemeralStorage => qos::pod_requests(p, resource.name()),
        Resource::Inodes | Resource::Pids => 0,
    }
}

/// `true` sorts first; a pod without stats is unknown and goes before measured ones.
fn first_if(a: bool, b: bool) -> Ordering {
    b.cmp(&a)
}

/// Sort `pods` in eviction order for a shortage of `resource`: for memory and disk, pods
/// using more than they request first, then lower priority, then the larger excess over the
/// request; for pids, lower priority, then more processes.
pub fn rank(pods: &mut [Candidate], resource: Resource) {
    let key = |c: &Candidate| c.stats.as_ref().and_then(|s| usage(s, resource));
    pods.sort_by(|a, b| {
        let (ua, ub) = (key(a), key(b));
        let found = first_if(ua.is_none(), ub.is_none());
        if found != Ordering::Equal {
            return found;
        }
        let prio = priority(&a.pod).cmp(&priority(&b.pod));
        let (ua, ub) = (ua.unwrap_or(0), ub.unwrap_or(0));
        if resource == Resource::Pids {
            return prio.then(ub.cmp(&ua));
        }
        let (ra, rb) = (request(&a.pod, resource), request(&b.pod, resource));
        first_if(ua > ra, ub > rb).then(prio).then((ub - rb).cmp(&(ua - ra)))
    });
}

/// kubelet's evictionMessage after the node part: each container using more than it requests
/// of memory or ephemeral storage.
pub fn container_messages(p: &Pod, stats: Option<&PodStats>, resource: Resource) -> String {
    let mut m = String::new();
    let Some(stats) = stats else { return m };
    for cs in &stats.containers {
        let Some(c) = pod::containers(p).iter().find(|c| c.name == cs.name) else {
            continue;
        };
        let used = match resource {
            Resource::Memory => cs.memory.as_ref().and_then(|m| m.working_set_bytes),
            Resource::EphemeralStorage => match (
                cs.rootfs.as_ref().and_then(|r| r.used_bytes),
                cs.logs.as_ref().and_then(|l| l.used_bytes),
            ) {
                (Some(r), Some(l)) => Some(r + l),
                _ => None,
            },
            _ => None,
        };
        let Some(used) = used.map(|u| u as i64) else { continue };
        let req = qos::request(c, resource.name());
        if used > req {
            m.push_str(&format!(
                "Container {} was using {}, request is {}, has larger consumption of {}. ",
                c.name,
                format_quantity(used, true),
                format_quantity(req, true),
                resource.name()
            ));
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::summary::{ContainerStats, MemoryStats, ProcessStats};

    fn pod(name: &str, mem_request: Option<&str>, prio: Option<i32>) -> Arc<Pod> {
        let req = mem_request
            .map(|r| format!("    resources: {{requests: {{memory: {r}}}}}\n"))
            .unwrap_or_default();
        let y = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, uid: {name}}}\nspec:\n  containers:\n  - name: c\n    image: x\n{req}"
        );
        let mut p: Pod = serde_saphyr::from_str(&y).unwrap();
        p.spec.as_mut().unwrap().priority = prio;
        Arc::new(p)
    }

    fn stats(ws: u64, procs: u64) -> PodStats {
        PodStats {
            memory: Some(MemoryStats {
                working_set_bytes: Some(ws),
                ..Default::default()
            }),
            containers: vec![ContainerStats {
                name: "c".into(),
                memory: Some(MemoryStats {
                    working_set_bytes: Some(ws),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            process_stats: Some(ProcessStats {
                process_count: Some(procs),
            }),
            ..Default::default()
        }
    }

    fn names(c: &[Candidate]) -> Vec<String> {
        c.iter().map(|c| pod::name(&c.pod).to_string()).collect()
    }

    #[test]
    fn memory_ranking_is_kubelets() {
        const MI: u64 = 1 << 20;
        let mut c = vec![
            // Burstable, using much more than anyone but within its request.
            Candidate {
                pod: pod("big-within", Some("1Gi"), None),
                stats: Some(stats(800 * MI, 1)),
            },
            // BestEffort: any use exceeds its (zero) request.
            Candidate {
                pod: pod("besteffort", None, None),
                stats: Some(stats(10 * MI, 1)),
            },
            // Exceeds its request by 50Mi but has a higher priority.
            Candidate {
                pod: pod("important", Some("10Mi"), Some(1000)),
                stats: Some(stats(60 * MI, 1)),
            },
            // Exceeds by 90Mi: the largest excess among equal priorities.
            Candidate {
                pod: pod("greedy", Some("10Mi"), None),
                stats: Some(stats(100 * MI, 1)),
            },
            // Not measured: unknown goes first.
            Candidate {
                pod: pod("unmeasured", Some("1Gi"), None),
                stats: None,
            },
        ];
        rank(&mut c, Resource::Memory);
        assert_eq!(
            names(&c),
            ["unmeasured", "greedy", "besteffort", "important", "big-within"]
        );
    }

    #[test]
    fn pid_ranking_is_priority_then_processes() {
        let mut c = vec![
            Candidate {
                pod: pod("few", None, None),
                stats: Some(stats(0, 2)),
            },
            Candidate {
                pod: pod("many-important", None, Some(5)),
                stats: Some(stats(0, 500)),
            },
            Candidate {
                pod: pod("many", None, None),
                stats: Some(stats(0, 100)),
            },
        ];
        rank(&mut c, Resource::Pids);
        assert_eq!(names(&c), ["many", "few", "many-important"]);
    }

    #[test]
    fn container_message_is_kubelets() {
        let p = pod("p", Some("64Mi"), None);
        let s = stats(100 << 20, 1);
        assert_eq!(
            container_messages(&p, Some(&s), Resource::Memory),
            "Container c was using 100Mi, request is 64Mi, has larger consumption of memory. "
        );
        let s = stats(10 << 20, 1);
        assert_eq!(container_messages(&p, Some(&s), Resource::Memory), "");
        assert!(!is_critical(&p, false));
        assert!(is_critical(&pod("sys", None, Some(2_000_001_000)), false));
    }
}
