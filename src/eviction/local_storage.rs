//! Local ephemeral storage limits (kubelet's localStorageEviction): a pod whose emptyDir
//! outgrew its sizeLimit, whose total ephemeral storage outgrew the sum of its containers'
//! limits, or one of whose containers (writable layer and logs) outgrew its own limit, is
//! evicted at once, whatever the node's pressure, with kubelet's messages.

use k8s_openapi::api::core::v1::Pod;

use super::signals::format_quantity;
use crate::pod::{self, qos};
use crate::stats::summary::PodStats;

const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// Why `p` must be evicted for its local storage, if it must.
pub fn violation(p: &Pod, stats: &PodStats) -> Option<String> {
    empty_dir(p, stats)
        .or_else(|| pod_limit(p, stats))
        .or_else(|| container_limit(p, stats))
}

/// An emptyDir used beyond its sizeLimit.
fn empty_dir(p: &Pod, stats: &PodStats) -> Option<String> {
    for v in pod::spec(p).volumes.iter().flatten() {
        let Some(limit) = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()) else {
            continue;
        };
        let size = crate::pod::units::bytes(&limit.0).ok()?;
        if size <= 0 {
            continue;
        }
        let used = stats
            .volume_stats
            .iter()
            .find(|s| s.name == v.name)
            .and_then(|s| s.fs.used_bytes);
        if used.is_some_and(|u| u as i64 > size) {
            return Some(format!(
                "Usage of EmptyDir volume {:?} exceeds the limit {:?}. ",
                v.name, limit.0
            ));
        }
    }
    None
}

/// The sum of the containers' ephemeral-storage limits (kubelet's PodLimits), when any sets one.
pub fn pod_limits(p: &Pod) -> Option<i64> {
    let has = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .is_some_and(|l| l.contains_key(EPHEMERAL_STORAGE))
    };
    if !pod::all_containers(p).any(has) {
        return None;
    }
    let apps: i64 = pod::containers(p)
        .iter()
        .map(|c| qos::limit(c, EPHEMERAL_STORAGE))
        .sum();
    let sidecars: i64 = pod::init_containers(p)
        .iter()
        .filter(|c| pod::is_sidecar(c))
        .map(|c| qos::limit(c, EPHEMERAL_STORAGE))
        .sum();
    let init_max = pod::init_containers(p)
        .iter()
        .filter(|c| !pod::is_sidecar(c))
        .map(|c| qos::limit(c, EPHEMERAL_STORAGE))
        .max()
        .unwrap_or(0);
    Some((apps + sidecars).max(init_max + sidecars))
}

fn pod_limit(p: &Pod, stats: &PodStats) -> Option<String> {
    let limit = pod_limits(p)?;
    let used = stats.ephemeral_storage.as_ref().and_then(|e| e.used_bytes).unwrap_or(0) as i64;
    (used > limit).then(|| {
        format!(
            "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
            format_quantity(limit, true)
        )
    })
}

fn container_limit(p: &Pod, stats: &PodStats) -> Option<String> {
    for cs in &stats.containers {
        let Some(c) = pod::all_containers(p).find(|c| c.name == cs.name) else {
            continue;
        };
        let Some(limit) = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(EPHEMERAL_STORAGE))
        else {
            continue;
        };
        let used = cs.rootfs.as_ref().and_then(|r| r.used_bytes).unwrap_or(0)
            + cs.logs.as_ref().and_then(|l| l.used_bytes).unwrap_or(0);
        if used as i64 > qos::limit(c, EPHEMERAL_STORAGE) {
            return Some(format!(
                "Container {} exceeded its local ephemeral storage limit {:?}. ",
                c.name, limit.0
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::summary::{ContainerStats, FsStats, VolumeStats};

    fn pod(y: &str) -> Pod {
        serde_saphyr::from_str(y).unwrap()
    }

    fn fs(used: u64) -> Option<FsStats> {
        Some(FsStats {
            used_bytes: Some(used),
            ..Default::default()
        })
    }

    #[test]
    fn empty_dir_over_its_size_limit() {
        let p = pod("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c, image: x}]\n  volumes:\n  - {name: data, emptyDir: {sizeLimit: 1Mi}}\n  - {name: other, emptyDir: {}}\n");
        let mut s = PodStats {
            volume_stats: vec![
                VolumeStats {
                    name: "data".into(),
                    fs: fs(1 << 20).unwrap(),
                    ..Default::default()
                },
                VolumeStats {
                    name: "other".into(),
                    fs: fs(1 << 30).unwrap(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(violation(&p, &s), None, "at the limit is within it");
        s.volume_stats[0].fs.used_bytes = Some((1 << 20) + 4096);
        assert_eq!(
            violation(&p, &s).as_deref(),
            Some("Usage of EmptyDir volume \"data\" exceeds the limit \"1Mi\". ")
        );
    }

    #[test]
    fn pod_and_container_limits() {
        let p = pod("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - {name: a, image: x, resources: {limits: {ephemeral-storage: 2Mi}}}\n  - {name: b, image: x, resources: {limits: {ephemeral-storage: 3Mi}}}\n");
        assert_eq!(pod_limits(&p), Some(5 << 20));
        let mut s = PodStats {
            ephemeral_storage: fs(6 << 20),
            ..Default::default()
        };
        assert_eq!(
            violation(&p, &s).as_deref(),
            Some("Pod ephemeral local storage usage exceeds the total limit of containers 5Mi. ")
        );
        s.ephemeral_storage = fs(4 << 20);
        s.containers = vec![ContainerStats {
            name: "a".into(),
            rootfs: fs(2 << 20),
            logs: fs(1),
            ..Default::default()
        }];
        assert_eq!(
            violation(&p, &s).as_deref(),
            Some("Container a exceeded its local ephemeral storage limit \"2Mi\". ")
        );
        let none = pod("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c, image: x}]\n");
        assert_eq!(pod_limits(&none), None);
    }
}
