//! The Node's status (kubelet's nodestatus setters, in kubelet's order: NodeAddress,
//! MachineInfo, VersionInfo, DaemonEndpoints, Images, the pressure conditions, Ready), whether
//! it changed (nodeStatusHasChanged: heartbeats aside), and the strategic-merge patch that
//! takes the API server's copy to it (PatchNodeStatus).

use std::collections::BTreeMap;

use ferrolet_runtime::image::{ImageRecord, Reference};
use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{json, Value};

use super::allocatable::{Extended, Resources};
use super::conditions::{self, Pressure};
use super::machine::{go_arch, Identity};

/// The Kubernetes version whose API ferrolet speaks, shown as kubeletVersion (and, as kubelet
/// does, kubeProxyVersion).
pub const KUBELET_VERSION: &str = "v1.26.0";
/// The port the API server reaches the node agent on (daemonEndpoints.kubeletEndpoint).
pub const KUBELET_PORT: i32 = 10250;
/// kubelet's nodeStatusMaxImages default and maxNamesPerImageInNodeStatus.
pub const MAX_IMAGES: usize = 50;
pub const MAX_NAMES_PER_IMAGE: usize = 5;

/// The runtime's name and version as nodeInfo shows it.
pub fn container_runtime_version() -> String {
    format!("ferrolet://{}", env!("CARGO_PKG_VERSION"))
}

/// What one round of the setters works from; gathered by the caller (off the async threads).
#[derive(Debug, Clone)]
pub struct Observed {
    pub addresses: Vec<NodeAddress>,
    pub capacity: Resources,
    pub allocatable: Resources,
    /// The device plugins' resources, and those they served in the last status but no more.
    pub extended: Extended,
    pub extended_gone: Vec<String>,
    pub identity: Identity,
    pub images: Vec<ContainerImage>,
    pub pressure: Pressure,
    /// Why the node is not ready (the runtime's and the pod network's errors); empty: ready.
    pub not_ready: Vec<String>,
    /// The kubelet API's port (daemonEndpoints.kubeletEndpoint; kubelet's `port`).
    pub kubelet_port: i32,
    /// The volume manager's volumes in use (kubelet's setVolumesInUse), sorted.
    pub volumes_in_use: Vec<String>,
}

/// The node's addresses with a configured or detected IP and no cloud provider: each IP as
/// InternalIP, then the hostname.
pub fn addresses(hostname: &str, ips: &[std::net::IpAddr]) -> Vec<NodeAddress> {
    let mut out: Vec<NodeAddress> = ips
        .iter()
        .map(|ip| NodeAddress {
            type_: "InternalIP".into(),
            address: ip.to_string(),
        })
        .collect();
    out.push(NodeAddress {
        type_: "Hostname".into(),
        address: hostname.into(),
    });
    out
}

/// The image list as kubelet's Images setter makes it: largest first, at most `max`
/// (nodeStatusMaxImages, [`MAX_IMAGES`] by default; -1: all), each named by its `repo@digest`
/// and `repo:tag` names (at most [`MAX_NAMES_PER_IMAGE`]).
pub fn node_images(mut records: Vec<ImageRecord>, max: i32) -> Vec<ContainerImage> {
    records.sort_by(|a, b| {
        b.size
            .cmp(&a.size)
            .then_with(|| a.id.to_string().cmp(&b.id.to_string()))
    });
    if let Ok(max) = usize::try_from(max) {
        records.truncate(max);
    }
    records
        .into_iter()
        .map(|r| {
            let mut names: Vec<String> = Vec::new();
            for reference in &r.refs {
                let repo = Reference::parse(reference)
                    .map(|x| x.repository)
                    .unwrap_or_else(|_| reference.clone());
                let digest = format!("{repo}@{}", r.manifest);
                if !names.contains(&digest) {
                    names.push(digest);
                }
            }
            names.extend(r.refs.iter().cloned());
            names.truncate(MAX_NAMES_PER_IMAGE);
            ContainerImage {
                names: Some(names),
                size_bytes: Some(r.size as i64),
            }
        })
        .collect()
}

/// Run the setters on `node`'s status at `now`. Returns the node events the conditions record
/// (their reasons), to be recorded once the status is posted.
pub fn set_node_status(node: &mut Node, o: &Observed, now: &Time) -> Vec<&'static str> {
    let status = node.status.get_or_insert_with(Default::default);
    status.addresses = Some(o.addresses.clone());
    // None when empty: the API server drops an empty list, and the patch then removes it.
    status.volumes_in_use = (!o.volumes_in_use.is_empty()).then(|| o.volumes_in_use.clone());

    // Capacity and allocatable: the resources the agent measures replace their entries; any
    // other (an extended resource an administrator advertised) stays, allocatable as capacity.
    // The device plugins' resources: their devices and healthy devices (kubelet's device
    // manager); one no plugin serves any more leaves.
    let mut capacity = status.capacity.take().unwrap_or_default();
    capacity.retain(|k, _| !k.starts_with("hugepages-") || o.capacity.hugepages.contains_key(k));
    capacity.retain(|k, _| !o.extended_gone.contains(k));
    capacity.extend(o.capacity.to_list());
    let (extended_capacity, extended_allocatable) = o.extended.to_lists();
    capacity.extend(extended_capacity);
    let mut ours = o.allocatable.to_list();
    ours.extend(extended_allocatable);
    let allocatable: BTreeMap<String, Quantity> = capacity
        .iter()
        .map(|(k, v)| (k.clone(), ours.get(k).cloned().unwrap_or_else(|| v.clone())))
        .collect();
    status.capacity = Some(capacity);
    status.allocatable = Some(allocatable);

    let id = &o.identity;
    status.node_info = Some(NodeSystemInfo {
        machine_id: id.machine_id.clone(),
        system_uuid: id.system_uuid.clone(),
        boot_id: id.boot_id.clone(),
        kernel_version: id.kernel_version.clone(),
        os_image: id.os_image.clone(),
        container_runtime_version: container_runtime_version(),
        kubelet_version: KUBELET_VERSION.into(),
        kube_proxy_version: KUBELET_VERSION.into(),
        operating_system: "linux".into(),
        architecture: go_arch().into(),
        ..status.node_info.take().unwrap_or_default()
    });
    status.daemon_endpoints = Some(NodeDaemonEndpoints {
        kubelet_endpoint: Some(DaemonEndpoint { port: o.kubelet_port }),
    });
    // An empty list is no list: the API server drops it, and it must not look like a change.
    status.images = (!o.images.is_empty()).then(|| o.images.clone());
    // kubelet's NodeFeatures setter: the runtime honours supplementalGroupsPolicy (Strict).
    status.features = Some(k8s_openapi::api::core::v1::NodeFeatures {
        supplemental_groups_policy: Some(true),
    });

    let conds = status.conditions.get_or_insert_with(Vec::new);
    let mut events = conditions::set_pressure(conds, o.pressure, now);
    events.extend(conditions::set_ready(conds, &o.not_ready, now));
    events
}

/// Whether `new` differs from `old` other than in the conditions' heartbeats (kubelet's
/// nodeStatusHasChanged); quantities compare by value, not by spelling.
pub fn changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    // An API server older than 1.31 drops `features`: its absence on the server is no change
    // (it goes out with the next change or report, and a newer server keeps it).
    let server_has_features = old.features.is_some();
    let strip = |s: &NodeStatus| {
        let mut s = s.clone();
        if !server_has_features {
            s.features = None;
        }
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        s.capacity = None;
        s.allocatable = None;
        // The API server drops empty lists.
        if s.images.as_ref().is_some_and(Vec::is_empty) {
            s.images = None;
        }
        if s.addresses.as_ref().is_some_and(Vec::is_empty) {
            s.addresses = None;
        }
        s
    };
    strip(old) != strip(new)
        || !same_quantities(&old.capacity, &new.capacity)
        || !same_quantities(&old.allocatable, &new.allocatable)
}

fn same_quantities(a: &Option<BTreeMap<String, Quantity>>, b: &Option<BTreeMap<String, Quantity>>) -> bool {
    let (empty_a, empty_b) = (BTreeMap::new(), BTreeMap::new());
    let (a, b) = (a.as_ref().unwrap_or(&empty_a), b.as_ref().unwrap_or(&empty_b));
    a.len() == b.len()
        && a.iter().all(|(k, v)| {
            b.get(k).is_some_and(|w| {
                v.0 == w.0
                    || matches!(
                        (crate::pod::units::parse_quantity(&v.0), crate::pod::units::parse_quantity(&w.0)),
                        (Ok(x), Ok(y)) if x == y
                    )
            })
        })
}

/// The strategic-merge patch from `old` to `new` for the status subresource, with the Node's
/// UID as a precondition (as kubelet's PatchNodeStatus): conditions merge by type; addresses
/// are replaced whole (merging them by type would lose a second InternalIP); resources that
/// disappeared are removed; the rest is sent only when it changed.
pub fn status_patch(uid: &str, old: &NodeStatus, new: &NodeStatus) -> Value {
    let mut status = serde_json::Map::new();
    if old.conditions != new.conditions {
        status.insert("conditions".into(), to(&new.conditions));
    }
    if old.addresses != new.addresses {
        let mut list = vec![json!({"$patch": "replace"})];
        list.extend(new.addresses.iter().flatten().map(to));
        status.insert("addresses".into(), Value::Array(list));
    }
    for (key, o, n) in [
        ("capacity", &old.capacity, &new.capacity),
        ("allocatable", &old.allocatable, &new.allocatable),
    ] {
        if !same_quantities(o, n) || o != n {
            let mut m = serde_json::Map::new();
            for k in o.iter().flatten().map(|(k, _)| k) {
                if !n.as_ref().is_some_and(|n| n.contains_key(k)) {
                    m.insert(k.clone(), Value::Null);
                }
            }
            for (k, v) in n.iter().flatten() {
                m.insert(k.clone(), Value::String(v.0.clone()));
            }
            status.insert(key.into(), Value::Object(m));
        }
    }
    if old.node_info != new.node_info {
        status.insert("nodeInfo".into(), to(&new.node_info));
    }
    if old.daemon_endpoints != new.daemon_endpoints {
        status.insert("daemonEndpoints".into(), to(&new.daemon_endpoints));
    }
    if old.images != new.images {
        status.insert("images".into(), to(&new.images));
    }
    if old.features != new.features {
        status.insert("features".into(), to(&new.features));
    }
    if old.volumes_in_use != new.volumes_in_use {
        // A plain list: replaced whole; null removes it.
        status.insert("volumesInUse".into(), to(&new.volumes_in_use));
    }
    json!({"metadata": {"uid": uid}, "status": status})
}

/// A typed field as it goes into the patch (API types always serialize).
fn to<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The condition of `kind` in a status, if any.
pub fn condition<'a>(status: &'a NodeStatus, kind: &str) -> Option<&'a NodeCondition> {
    status.conditions.iter().flatten().find(|c| c.type_ == kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrolet_runtime::digest::Digest;

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + secs).unwrap())
    }

    fn observed() -> Observed {
        let capacity = Resources {
            cpu_milli: 2000,
            memory: 4 << 30,
            ephemeral_storage: 50 << 30,
            pods: 110,
            hugepages: [("hugepages-2Mi".to_string(), 0)].into(),
        };
        let allocatable = super::super::allocatable::allocatable(
            &capacity,
            Default::default(),
            Default::default(),
            &Default::default(),
        );
        Observed {
            addresses: addresses("n1", &["10.0.0.5".parse().unwrap()]),
            capacity,
            allocatable,
            identity: Identity {
                kernel_version: "6.1.0".into(),
                os_image: "Debian GNU/Linux 12 (bookworm)".into(),
                machine_id: "m".into(),
                system_uuid: "u".into(),
                boot_id: "b".into(),
            },
            images: Vec::new(),
            pressure: Pressure::default(),
            not_ready: Vec::new(),
            kubelet_port: KUBELET_PORT,
            extended: Default::default(),
            extended_gone: Vec::new(),
            volumes_in_use: Vec::new(),
        }
    }

    #[test]
    fn setters_fill_the_status() {
        let mut node = Node::default();
        let ev = set_node_status(&mut node, &observed(), &t(0));
        assert_eq!(
            ev,
            [
                "NodeHasSufficientMemory",
                "NodeHasNoDiskPressure",
                "NodeHasSufficientPID"
            ]
        );
        let s = node.status.as_ref().unwrap();
        let cap = s.capacity.as_ref().unwrap();
        assert_eq!(cap["cpu"].0, "2");
        assert_eq!(cap["memory"].0, "4Gi");
        assert_eq!(cap["pods"].0, "110");
        assert_eq!(cap["hugepages-2Mi"].0, "0");
        let alloc = s.allocatable.as_ref().unwrap();
        assert_eq!(alloc["memory"].0, "3996Mi");
        assert_eq!(alloc["ephemeral-storage"].0, "45Gi");
        let info = s.node_info.as_ref().unwrap();
        assert_eq!(info.kubelet_version, KUBELET_VERSION);
        assert_eq!(
            info.container_runtime_version,
            format!("ferrolet://{}", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(info.operating_system, "linux");
        assert_eq!(info.architecture, go_arch());
        assert_eq!(info.os_image, "Debian GNU/Linux 12 (bookworm)");
        assert_eq!(
            s.daemon_endpoints
                .as_ref()
                .unwrap()
                .kubelet_endpoint
                .as_ref()
                .unwrap()
                .port,
            10250
        );
        let addrs: Vec<_> = s
            .addresses
            .iter()
            .flatten()
            .map(|a| (a.type_.as_str(), a.address.as_str()))
            .collect();
        assert_eq!(addrs, [("InternalIP", "10.0.0.5"), ("Hostname", "n1")]);
        assert_eq!(condition(s, "Ready").unwrap().status, "True");
    }

    #[test]
    fn extended_resources_stay_and_heartbeats_are_no_change() {
        let mut node = Node::default();
        set_node_status(&mut node, &observed(), &t(0));
        let s = node.status.as_mut().unwrap();
        s.capacity
            .as_mut()
            .unwrap()
            .insert("example.com/dongle".into(), Quantity("4".into()));
        let before = s.clone();
        set_node_status(&mut node, &observed(), &t(10));
        let after = node.status.as_ref().unwrap();
        assert_eq!(after.capacity.as_ref().unwrap()["example.com/dongle"].0, "4");
        assert_eq!(after.allocatable.as_ref().unwrap()["example.com/dongle"].0, "4");
        // Only the heartbeats moved (and the dongle's allocatable appeared).
        let mut b = before.clone();
        b.allocatable
            .as_mut()
            .unwrap()
            .insert("example.com/dongle".into(), Quantity("4".into()));
        assert!(!changed(&b, after));
        let mut o = observed();
        o.not_ready = vec!["container runtime is down".into()];
        set_node_status(&mut node, &o, &t(20));
        assert!(changed(&b, node.status.as_ref().unwrap()));
    }

    #[test]
    fn the_node_says_it_honours_supplemental_groups_policy() {
        let mut node = Node::default();
        set_node_status(&mut node, &observed(), &t(0));
        let s = node.status.as_ref().unwrap();
        assert_eq!(s.features.as_ref().unwrap().supplemental_groups_policy, Some(true));
        let p = status_patch("u", &NodeStatus::default(), s);
        assert_eq!(p["status"]["features"]["supplementalGroupsPolicy"], true);
        // A server that drops the field (before 1.31) does not make every status a change.
        let mut dropped = s.clone();
        dropped.features = None;
        assert!(!changed(&dropped, s));
        let mut other = s.clone();
        other.features = Some(Default::default());
        assert!(changed(&other, s));
    }

    #[test]
    fn no_images_is_no_list() {
        let mut node = Node::default();
        set_node_status(&mut node, &observed(), &t(0));
        let s = node.status.as_ref().unwrap();
        assert_eq!(s.images, None);
        let mut served = s.clone();
        served.images = Some(Vec::new());
        assert!(!changed(&served, s));
    }

    #[test]
    fn volumes_in_use_are_listed_patched_and_removed() {
        let mut node = Node::default();
        set_node_status(&mut node, &observed(), &t(0));
        let none = node.status.clone().unwrap();
        assert_eq!(none.volumes_in_use, None, "no volumes: no list");
        let mut o = observed();
        o.volumes_in_use = vec!["kubernetes.io/csi/d^h1".into()];
        set_node_status(&mut node, &o, &t(0));
        let some = node.status.clone().unwrap();
        assert!(changed(&none, &some));
        assert_eq!(
            status_patch("u", &none, &some)["status"]["volumesInUse"],
            serde_json::json!(["kubernetes.io/csi/d^h1"])
        );
        // Gone again: the patch removes the list.
        assert_eq!(
            status_patch("u", &some, &none)["status"]["volumesInUse"],
            serde_json::Value::Null
        );
        assert!(status_patch("u", &some, &none)["status"]
            .as_object()
            .unwrap()
            .contains_key("volumesInUse"));
        assert!(!changed(&some, &some.clone()));
    }

    #[test]
    fn quantities_compare_by_value() {
        let a = NodeStatus {
            capacity: Some([("memory".to_string(), Quantity("1Gi".into()))].into()),
            ..Default::default()
        };
        let mut b = a.clone();
        b.capacity = Some([("memory".to_string(), Quantity("1048576Ki".into()))].into());
        assert!(!changed(&a, &b));
        b.capacity = Some([("memory".to_string(), Quantity("2Gi".into()))].into());
        assert!(changed(&a, &b));
    }

    #[test]
    fn the_patch_replaces_addresses_and_removes_gone_resources() {
        let old = NodeStatus {
            capacity: Some(
                [
                    ("cpu".to_string(), Quantity("2".into())),
                    ("hugepages-1Gi".to_string(), Quantity("0".into())),
                ]
                .into(),
            ),
            addresses: Some(addresses("n1", &["10.0.0.5".parse().unwrap()])),
            ..Default::default()
        };
        let mut new = old.clone();
        new.capacity.as_mut().unwrap().remove("hugepages-1Gi");
        new.addresses = Some(addresses(
            "n1",
            &["10.0.0.5".parse().unwrap(), "10.0.0.6".parse().unwrap()],
        ));
        let p = status_patch("uid-1", &old, &new);
        assert_eq!(p["metadata"]["uid"], "uid-1");
        assert_eq!(p["status"]["capacity"]["hugepages-1Gi"], Value::Null);
        assert_eq!(p["status"]["capacity"]["cpu"], "2");
        assert_eq!(p["status"]["addresses"][0]["$patch"], "replace");
        assert_eq!(p["status"]["addresses"][2]["address"], "10.0.0.6");
        assert!(p["status"].get("images").is_none());
        assert!(p["status"].get("allocatable").is_none());
    }

    #[test]
    fn images_largest_first_with_digest_and_tag_names() {
        let rec = |hex: char, size: u64, refs: &[&str]| ImageRecord {
            id: Digest::parse(&format!("sha256:{}", hex.to_string().repeat(64))).unwrap(),
            manifest: Digest::parse(&format!("sha256:{}", "f".repeat(64))).unwrap(),
            refs: refs.iter().map(|s| s.to_string()).collect(),
            layers: Vec::new(),
            size,
            imported_at: String::new(),
            last_used: None,
        };
        let images = node_images(
            vec![
                rec(
                    'a',
                    10,
                    &["docker.io/library/busybox:1.35", "docker.io/library/busybox:latest"],
                ),
                rec('b', 99, &["registry.local/app:v1"]),
            ],
            MAX_IMAGES as i32,
        );
        assert_eq!(images[0].size_bytes, Some(99));
        assert_eq!(
            images[1].names.as_deref().unwrap(),
            [
                format!("docker.io/library/busybox@sha256:{}", "f".repeat(64)),
                "docker.io/library/busybox:1.35".into(),
                "docker.io/library/busybox:latest".into()
            ]
        );
        let many: Vec<_> = (0..60).map(|i| rec('c', i, &[])).collect();
        assert_eq!(node_images(many.clone(), MAX_IMAGES as i32).len(), MAX_IMAGES);
        assert_eq!(node_images(many.clone(), -1).len(), 60, "-1: all");
        assert_eq!(node_images(many.clone(), 3).len(), 3);
        assert_eq!(node_images(many, 0).len(), 0);
    }
}
