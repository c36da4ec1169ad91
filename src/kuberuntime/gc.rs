//! Container garbage collection (kubelet's kuberuntime_gc.go containerGC): dead containers
//! are grouped by pod and container name ("evict units"); those of pods the node no longer
//! has all go (once every source has reported), the rest keep the newest
//! `maxPerPodContainer` of each unit (1 by default, so `logs --previous` works) and at most
//! `maxContainers` on the node, oldest going first; none younger than `minAge` go. A removed
//! container takes its log files (rotated and compressed ones too) with it, through
//! [`remove_container`], the path the pod workers use as well.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ferrolet_runtime::container::ContainerState;
use ferrolet_runtime::Runtime;
use tracing::{info, warn};

use super::labels::{LABEL_CONTAINER_NAME, LABEL_POD_UID};
use crate::config::eviction::ContainerGcConfig;
use crate::pod::manager::PodManager;
use crate::pod::Phase;

/// A dead container, as GC weighs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dead {
    pub id: String,
    pub created: DateTime<Utc>,
}

/// (pod UID, container name).
pub type Unit = (String, String);

/// kubelet's evictContainers over dead containers grouped by unit: what to remove, given the
/// units whose pod is gone (`pod_gone`: all of theirs go).
pub fn to_remove(
    mut units: BTreeMap<Unit, Vec<Dead>>,
    policy: &ContainerGcConfig,
    pod_gone: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    units.retain(|(uid, _), list| {
        if pod_gone(uid) {
            out.extend(list.drain(..).map(|d| d.id));
            false
        } else {
            true
        }
    });
    // Newest first in each unit.
    for list in units.values_mut() {
        list.sort_by_key(|d| std::cmp::Reverse(d.created));
    }
    let keep_per_unit = |units: &mut BTreeMap<Unit, Vec<Dead>>, keep: usize, out: &mut Vec<String>| {
        for list in units.values_mut() {
            if list.len() > keep {
                out.extend(list.drain(keep..).map(|d| d.id));
            }
        }
    };
    if policy.max_per_pod_container >= 0 {
        keep_per_unit(&mut units, policy.max_per_pod_container as usize, &mut out);
    }
    let count = |u: &BTreeMap<Unit, Vec<Dead>>| u.values().map(Vec::len).sum::<usize>();
    if policy.max_containers >= 0 && count(&units) > policy.max_containers as usize {
        // An equal share per unit (at least one), then the oldest across units.
        let n_units = units.values().filter(|l| !l.is_empty()).count().max(1);
        let share = (policy.max_containers as usize / n_units).max(1);
        keep_per_unit(&mut units, share, &mut out);
        let total = count(&units);
        if total > policy.max_containers as usize {
            let mut flat: Vec<Dead> = units.into_values().flatten().collect();
            flat.sort_by_key(|d| d.created);
            out.extend(
                flat.into_iter()
                    .take(total - policy.max_containers as usize)
                    .map(|d| d.id),
            );
        }
    }
    out
}

/// Remove a container, its log link and its logs (the log file, its rotated and compressed
/// files).
pub async fn remove_container(
    rt: &Runtime,
    link_dir: &Path,
    id: &str,
    log_path: &Path,
) -> ferrolet_runtime::Result<()> {
    crate::kuberuntime::log_links::remove_container(rt, link_dir, id).await?;
    remove_logs(log_path);
    Ok(())
}

/// A container's log files: the live one and every rotated one, compressed or not.
pub fn remove_logs(log_path: &Path) {
    let _ = std::fs::remove_file(log_path);
    for r in crate::kuberuntime::log_rotation::all_rotated(log_path) {
        let _ = std::fs::remove_file(r);
    }
}

/// The node's container GC.
pub struct ContainerGc {
    rt: Arc<Runtime>,
    pods: Arc<PodManager>,
    policy: ContainerGcConfig,
    /// Where the containers' `/var/log/containers` links are.
    link_dir: std::path::PathBuf,
}

impl ContainerGc {
    pub fn new(
        rt: Arc<Runtime>,
        pods: Arc<PodManager>,
        policy: ContainerGcConfig,
        link_dir: std::path::PathBuf,
    ) -> ContainerGc {
        ContainerGc {
            rt,
            pods,
            policy,
            link_dir,
        }
    }

    /// One round (kubelet's GarbageCollect). `all_sources_ready`: pods unknown to the node
    /// are really gone; `evict_terminated`: containers of finished pods go too (the eviction
    /// manager's DeleteAllUnusedContainers). Returns how many containers went.
    pub async fn collect(&self, all_sources_ready: bool, evict_terminated: bool) -> usize {
        let (rt, pods, min_age) = (self.rt.clone(), self.pods.clone(), self.policy.min_age);
        let listed = crate::tasks::blocking(move || Ok(rt.list()?)).await;
        let list = match listed {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %format!("{e:#}"), "container GC: listing containers");
                return 0;
            }
        };
        let now = Utc::now();
        let mut units: BTreeMap<Unit, Vec<Dead>> = BTreeMap::new();
        let mut logs = BTreeMap::new();
        for c in list {
            if !matches!(c.state, ContainerState::Exited(_) | ContainerState::ExitUnknown(_)) {
                continue;
            }
            let (Some(uid), Some(name)) = (
                c.record.labels.get(LABEL_POD_UID),
                c.record.labels.get(LABEL_CONTAINER_NAME),
            ) else {
                continue;
            };
            let created = DateTime::parse_from_rfc3339(&c.record.created_at)
                .map(|t| t.with_timezone(&Utc))
                .unwrap_or(now);
            if (now - created).to_std().unwrap_or(Duration::ZERO) < min_age {
                continue;
            }
            logs.insert(c.id().to_string(), c.record.log_path.clone());
            units.entry((uid.clone(), name.clone())).or_default().push(Dead {
                id: c.id().to_string(),
                created,
            });
        }
        let known: HashSet<String> = pods
            .entries()
            .iter()
            .map(|e| crate::pod::uid(&e.pod).to_string())
            .collect();
        let finished: HashSet<String> = pods
            .entries()
            .iter()
            .filter(|e| Phase::of(&e.status).is_some_and(Phase::is_terminal))
            .map(|e| crate::pod::uid(&e.pod).to_string())
            .collect();
        let gone =
            |uid: &str| (all_sources_ready && !known.contains(uid)) || (evict_terminated && finished.contains(uid));
        let mut removed = 0;
        for id in to_remove(units, &self.policy, &gone) {
            let log = logs.get(&id).cloned().unwrap_or_default();
            match remove_container(&self.rt, &self.link_dir, &id, &log).await {
                Ok(()) => {
                    info!(container = %id, "container garbage collected");
                    removed += 1;
                }
                Err(e) => warn!(container = %id, error = %ferrolet_fsutil::chain(&e), "container GC: removing"),
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead(id: &str, secs: i64) -> Dead {
        Dead {
            id: id.into(),
            created: DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap(),
        }
    }

    fn policy(per: i32, max: i32) -> ContainerGcConfig {
        ContainerGcConfig {
            max_per_pod_container: per,
            max_containers: max,
            ..Default::default()
        }
    }

    fn unit(uid: &str, name: &str) -> Unit {
        (uid.into(), name.into())
    }

    #[test]
    fn keeps_the_newest_dead_container_of_each_container() {
        let units = [
            (unit("p", "app"), vec![dead("a1", 1), dead("a3", 3), dead("a2", 2)]),
            (unit("p", "side"), vec![dead("s1", 1)]),
        ]
        .into_iter()
        .collect();
        let mut r = to_remove(units, &policy(1, -1), &|_| false);
        r.sort();
        assert_eq!(r, ["a1", "a2"]);
    }

    #[test]
    fn gone_pods_lose_everything_and_the_node_total_is_capped() {
        let units: BTreeMap<Unit, Vec<Dead>> = [
            (unit("gone", "c"), vec![dead("g1", 1)]),
            (unit("p", "a"), vec![dead("a1", 1), dead("a2", 5)]),
            (unit("q", "b"), vec![dead("b1", 2), dead("b2", 3)]),
        ]
        .into_iter()
        .collect();
        let mut r = to_remove(units.clone(), &policy(-1, -1), &|u| u == "gone");
        r.sort();
        assert_eq!(r, ["g1"]);
        // At most 1 on the node: one per unit first, then the oldest of those.
        let mut r = to_remove(units, &policy(-1, 1), &|u| u == "gone");
        r.sort();
        assert_eq!(r, ["a1", "b1", "b2", "g1"]);
    }
}
