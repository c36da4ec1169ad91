//! Registering the Node (kubelet's registerWithAPIServer, initialNode and the reconciliation of
//! an existing Node): the Node the agent would create, created until it exists; a Node already
//! there is taken over with its default labels, attach-detach annotation and resources set
//! right.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use tracing::{info, warn};

use super::machine::go_arch;
use crate::config::Config;
use crate::kubeclient::Kube;

/// The annotation by which a node says the attach/detach controller manages its volumes
/// (kubelet's enableControllerAttachDetach, on by default).
pub const CONTROLLER_MANAGED_ATTACH_DETACH: &str = "volumes.kubernetes.io/controller-managed-attach-detach";

/// The labels kubelet keeps right on an existing Node (updateDefaultLabels); of these ferrolet
/// sets hostname, os and arch, and a Node carrying another of them keeps it.
const DEFAULT_LABELS: [&str; 10] = [
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "node.kubernetes.io/windows-build",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
];

/// The Node kubelet's initialNode makes (without status: the caller runs the setters on it):
/// the default labels, then `--node-labels`, `--register-with-taints`, the attach-detach
/// annotation. spec.podCIDR is the controller-manager's to set.
pub fn initial_node(cfg: &Config) -> Node {
    let mut labels = BTreeMap::new();
    labels.insert("kubernetes.io/hostname".to_string(), cfg.node_name.clone());
    labels.insert("kubernetes.io/os".to_string(), "linux".to_string());
    labels.insert("kubernetes.io/arch".to_string(), go_arch().to_string());
    labels.insert("beta.kubernetes.io/os".to_string(), "linux".to_string());
    labels.insert("beta.kubernetes.io/arch".to_string(), go_arch().to_string());
    labels.extend(cfg.cluster.node_labels.clone());
    let taints = cfg.cluster.register_with_taints.clone();
    Node {
        metadata: ObjectMeta {
            name: Some(cfg.node_name.clone()),
            labels: Some(labels),
            annotations: Some([(CONTROLLER_MANAGED_ATTACH_DETACH.to_string(), "true".to_string())].into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            ..Default::default()
        }),
        status: None,
    }
}

/// Take an existing Node over as kubelet does (reconcileCMADAnnotationWithExistingNode,
/// updateDefaultLabels, updateDefaultResources, reconcileHugePageResource): returns whether
/// `existing` was changed.
pub fn reconcile_existing(initial: &Node, existing: &mut Node) -> bool {
    let mut changed = false;
    // The attach-detach annotation follows the agent's setting.
    let want = initial
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONTROLLER_MANAGED_ATTACH_DETACH))
        .cloned();
    let annotations = existing.metadata.annotations.get_or_insert_with(BTreeMap::new);
    if annotations.get(CONTROLLER_MANAGED_ATTACH_DETACH) != want.as_ref() {
        match want {
            Some(v) => annotations.insert(CONTROLLER_MANAGED_ATTACH_DETACH.to_string(), v),
            None => annotations.remove(CONTROLLER_MANAGED_ATTACH_DETACH),
        };
        changed = true;
    }
    // Default labels the agent sets take the agent's values.
    let empty = BTreeMap::new();
    let initial_labels = initial.metadata.labels.as_ref().unwrap_or(&empty);
    let labels = existing.metadata.labels.get_or_insert_with(BTreeMap::new);
    for key in DEFAULT_LABELS {
        let Some(v) = initial_labels.get(key) else {
            continue;
        };
        if labels.get(key) != Some(v) {
            labels.insert(key.to_string(), v.clone());
            changed = true;
        }
        if labels.get(key).is_some_and(String::is_empty) {
            labels.remove(key);
        }
    }
    // Capacity and allocatable the agent reports, where the existing Node lacks them, and huge
    // page sizes as the machine has them now.
    if let Some(want) = &initial.status {
        let status = existing.status.get_or_insert_with(Default::default);
        for (mine, theirs) in [
            (&want.capacity, &mut status.capacity),
            (&want.allocatable, &mut status.allocatable),
        ] {
            let Some(mine) = mine else { continue };
            let theirs = theirs.get_or_insert_with(BTreeMap::new);
            let before = theirs.clone();
            theirs.retain(|k, _| !k.starts_with("hugepages-") || mine.contains_key(k));
            for (k, v) in mine {
                if k.starts_with("hugepages-") || !theirs.contains_key(k) {
                    theirs.insert(k.clone(), v.clone());
                }
            }
            changed |= *theirs != before;
        }
    }
    changed
}

/// Register `initial` (with its status set), retrying with kubelet's back-off (100ms doubling
/// to 7s) until the Node exists and is ours; returns the Node as the API server has it. Never
/// gives up: an API server that is down or refuses is waited out.
pub async fn register(kube: &Kube, initial: &Node) -> Node {
    let name = initial.metadata.name.clone().unwrap_or_default();
    let mut delay = Duration::from_millis(100);
    let mut last_error = String::new();
    loop {
        match try_register(kube, initial).await {
            Ok(node) => {
                info!(node = %name, "registered the node with the API server");
                return node;
            }
            Err(e) => {
                let e = format!("{e:#}");
                if e != last_error {
                    warn!(node = %name, error = %e, "unable to register the node; retrying");
                    last_error = e;
                }
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(7));
    }
}

async fn try_register(kube: &Kube, initial: &Node) -> Result<Node> {
    let name = initial.metadata.name.as_deref().unwrap_or_default();
    let nodes: Api<Node> = Api::all(kube.client());
    match nodes.create(&PostParams::default(), initial).await {
        Ok(n) => return Ok(n),
        Err(kube::Error::Api(s)) if s.is_already_exists() => {}
        Err(e) => return Err(e).context("creating the Node"),
    }
    let existing = nodes
        .get(name)
        .await
        .with_context(|| format!("getting the existing Node {name}"))?;
    let mut updated = existing.clone();
    if !reconcile_existing(initial, &mut updated) {
        info!(node = %name, "the Node already exists; taking it over");
        return Ok(existing);
    }
    let patch = metadata_and_status_patch(&existing, &updated);
    let node = nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .with_context(|| format!("reconciling the existing Node {name}"))?;
    info!(node = %name, "the Node already exists; took it over with its default labels and resources set right");
    Ok(node)
}

/// A strategic-merge patch of labels, annotations, capacity and allocatable from `old` to
/// `new`, with the UID precondition (status-subresource patches may change a Node's metadata).
fn metadata_and_status_patch(old: &Node, new: &Node) -> Value {
    fn map_diff<V: serde::Serialize + PartialEq>(
        old: Option<&BTreeMap<String, V>>,
        new: Option<&BTreeMap<String, V>>,
    ) -> Value {
        let mut m = serde_json::Map::new();
        for k in old.into_iter().flat_map(|o| o.keys()) {
            if !new.is_some_and(|n| n.contains_key(k)) {
                m.insert(k.clone(), Value::Null);
            }
        }
        for (k, v) in new.into_iter().flatten() {
            if old.and_then(|o| o.get(k)) != Some(v) {
                m.insert(k.clone(), serde_json::to_value(v).unwrap_or(Value::Null));
            }
        }
        Value::Object(m)
    }
    let (os, ns) = (old.status.as_ref(), new.status.as_ref());
    json!({
        "metadata": {
            "uid": new.metadata.uid,
            "labels": map_diff(old.metadata.labels.as_ref(), new.metadata.labels.as_ref()),
            "annotations": map_diff(old.metadata.annotations.as_ref(), new.metadata.annotations.as_ref()),
        },
        "status": {
            "capacity": map_diff(os.and_then(|s| s.capacity.as_ref()), ns.and_then(|s| s.capacity.as_ref())),
            "allocatable": map_diff(os.and_then(|s| s.allocatable.as_ref()), ns.and_then(|s| s.allocatable.as_ref())),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeStatus, Taint};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn cfg() -> Config {
        let mut c = Config {
            node_name: "edge-1".into(),
            ..Default::default()
        };
        c.cluster.node_labels = [("example.com/rack".to_string(), "r1".to_string())].into();
        c.cluster.register_with_taints = vec![Taint {
            key: "dedicated".into(),
            value: Some("edge".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }];
        c
    }

    #[test]
    fn the_initial_node_has_kubelets_labels_taints_and_annotation() {
        let n = initial_node(&cfg());
        let l = n.metadata.labels.as_ref().unwrap();
        assert_eq!(l["kubernetes.io/hostname"], "edge-1");
        assert_eq!(l["kubernetes.io/os"], "linux");
        assert_eq!(l["beta.kubernetes.io/os"], "linux");
        assert_eq!(l["kubernetes.io/arch"], go_arch());
        assert_eq!(l["beta.kubernetes.io/arch"], go_arch());
        assert_eq!(l["example.com/rack"], "r1");
        assert_eq!(
            n.metadata.annotations.as_ref().unwrap()[CONTROLLER_MANAGED_ATTACH_DETACH],
            "true"
        );
        let spec = n.spec.as_ref().unwrap();
        assert_eq!(spec.taints.as_ref().unwrap()[0].key, "dedicated");
        assert!(spec.pod_cidr.is_none());
    }

    #[test]
    fn an_existing_node_gets_its_default_labels_back() {
        let mut initial = initial_node(&cfg());
        initial.status = Some(NodeStatus {
            capacity: Some(
                [
                    ("cpu".to_string(), Quantity("2".into())),
                    ("hugepages-2Mi".to_string(), Quantity("0".into())),
                ]
                .into(),
            ),
            ..Default::default()
        });
        let mut existing = Node {
            metadata: ObjectMeta {
                name: Some("edge-1".into()),
                uid: Some("u1".into()),
                labels: Some(
                    [
                        ("kubernetes.io/hostname".to_string(), "old".to_string()),
                        ("topology.kubernetes.io/zone".to_string(), "z".to_string()),
                        ("team".to_string(), "a".to_string()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            status: Some(NodeStatus {
                capacity: Some(
                    [
                        ("cpu".to_string(), Quantity("8".into())),
                        ("hugepages-1Gi".to_string(), Quantity("1Gi".into())),
                    ]
                    .into(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let old = existing.clone();
        assert!(reconcile_existing(&initial, &mut existing));
        let l = existing.metadata.labels.as_ref().unwrap();
        assert_eq!(l["kubernetes.io/hostname"], "edge-1");
        assert_eq!(l["kubernetes.io/os"], "linux");
        assert_eq!(l["topology.kubernetes.io/zone"], "z");
        assert_eq!(l["team"], "a");
        // --node-labels are not forced onto an existing Node, as in kubelet.
        assert!(!l.contains_key("example.com/rack"));
        let cap = existing.status.as_ref().unwrap().capacity.as_ref().unwrap();
        assert_eq!(cap["cpu"].0, "8");
        assert_eq!(cap["hugepages-2Mi"].0, "0");
        assert!(!cap.contains_key("hugepages-1Gi"));

        let p = metadata_and_status_patch(&old, &existing);
        assert_eq!(p["metadata"]["uid"], "u1");
        assert_eq!(p["metadata"]["labels"]["kubernetes.io/hostname"], "edge-1");
        assert!(p["metadata"]["labels"].get("team").is_none());
        assert_eq!(p["status"]["capacity"]["hugepages-1Gi"], Value::Null);
        assert_eq!(p["metadata"]["annotations"][CONTROLLER_MANAGED_ATTACH_DETACH], "true");

        let mut again = existing.clone();
        assert!(!reconcile_existing(&initial, &mut again));
    }
}
