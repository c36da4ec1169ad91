//! kubelet's nodeinfomanager: what the node tells the API server of its CSI drivers, kept up
//! in the background. For each driver registered: its node ID in the Node's
//! `csi.volume.kubernetes.io/nodeid` annotation (a JSON map, driver -> node ID), its topology
//! segments as the Node's labels, and an entry in the node's CSINode object (`storage.k8s.io/v1`,
//! named after the node and owned by the Node: name, nodeID, topologyKeys, allocatable.count),
//! which the scheduler and the external attacher and provisioner read. A driver deregistered
//! leaves the annotation and the CSINode (its topology labels stay, as in kubelet).
//!
//! kubelet makes these writes inside the registration and refuses the plugin when the API
//! server cannot be reached; an edge node is often cut off, so here the driver is registered on
//! the node at once and one task brings the API server up to date, retrying (1 s doubling to
//! 30 s) until it has. Only drivers this agent registered or deregistered are touched: entries
//! other agents or people made stay.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use super::{Driver, NODE_ID_ANNOTATION};
use crate::kubeclient::Kube;

/// What is to be written: driver name -> its registration, or `None` to remove it.
type Pending = BTreeMap<String, Option<Driver>>;

struct Shared {
    kube: Kube,
    node: String,
    pending: Mutex<Pending>,
    wake: Notify,
}

/// The node's CSI drivers as the API server is to have them; cheap to clone.
#[derive(Clone)]
pub struct NodeInfo {
    shared: Arc<Shared>,
}

impl NodeInfo {
    /// Keep the CSI drivers of Node `node` in the API server, from a task of its own.
    pub fn start(kube: Kube, node: &str) -> NodeInfo {
        let n = NodeInfo {
            shared: Arc::new(Shared {
                kube,
                node: node.to_string(),
                pending: Mutex::new(Pending::new()),
                wake: Notify::new(),
            }),
        };
        let shared = n.shared.clone();
        tokio::spawn(async move { run(shared).await });
        n
    }

    pub fn install(&self, d: &Driver) {
        self.set(&d.name, Some(d.clone()));
    }

    pub fn uninstall(&self, name: &str) {
        self.set(name, None);
    }

    fn set(&self, name: &str, d: Option<Driver>) {
        self.shared
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), d);
        self.shared.wake.notify_one();
    }
}

async fn run(s: Arc<Shared>) {
    loop {
        s.wake.notified().await;
        let mut delay = Duration::from_secs(1);
        let mut failing = false;
        loop {
            let batch = s.pending.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if batch.is_empty() {
                break;
            }
            match apply(&s, &batch).await {
                Ok(()) => {
                    let names: Vec<_> = batch
                        .iter()
                        .map(|(n, d)| format!("{}{n}", if d.is_some() { "+" } else { "-" }))
                        .collect();
                    info!(node = %s.node, drivers = ?names, "CSI drivers recorded in the Node and its CSINode");
                    let mut p = s.pending.lock().unwrap_or_else(|e| e.into_inner());
                    for (name, d) in batch {
                        if p.get(&name) == Some(&d) {
                            p.remove(&name);
                        }
                    }
                    delay = Duration::from_secs(1);
                    failing = false;
                }
                Err(e) => {
                    if !failing {
                        warn!(node = %s.node, error = %format!("{e:#}"), "cannot record the CSI drivers in the API server; retrying");
                    } else {
                        debug!(node = %s.node, error = %format!("{e:#}"), "CSI drivers still not recorded");
                    }
                    failing = true;
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
        }
    }
}

/// The annotation's map with `batch` applied; `None` when it is empty.
pub fn node_ids(current: Option<&str>, batch: &Pending) -> Option<String> {
    let mut ids: BTreeMap<String, String> = current.and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
    for (name, d) in batch {
        match d {
            Some(d) => ids.insert(name.clone(), d.node_id.clone()),
            None => ids.remove(name),
        };
    }
    (!ids.is_empty()).then(|| serde_json::to_string(&ids).unwrap_or_default())
}

/// The CSINode's drivers with `batch` applied (a driver's entry replaced in place).
pub fn csinode_drivers(mut drivers: Vec<CSINodeDriver>, batch: &Pending) -> Vec<CSINodeDriver> {
    for (name, d) in batch {
        let entry = d.as_ref().map(|d| CSINodeDriver {
            name: d.name.clone(),
            node_id: d.node_id.clone(),
            topology_keys: (!d.topology.is_empty()).then(|| d.topology.keys().cloned().collect()),
            allocatable: d.max_volumes.map(|n| VolumeNodeResources {
                count: Some(i32::try_from(n).unwrap_or(i32::MAX)),
            }),
        });
        match (drivers.iter().position(|x| &x.name == name), entry) {
            (Some(i), Some(e)) => drivers[i] = e,
            (Some(i), None) => {
                drivers.remove(i);
            }
            (None, Some(e)) => drivers.push(e),
            (None, None) => {}
        }
    }
    drivers
}

async fn apply(s: &Shared, batch: &Pending) -> Result<()> {
    let client = s.kube.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .get(&s.node)
        .await
        .with_context(|| format!("reading Node {}", s.node))?;
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let current = annotations.get(NODE_ID_ANNOTATION).map(String::as_str);
    let ids = node_ids(current, batch);
    let mut new_labels = serde_json::Map::new();
    for d in batch.values().flatten() {
        for (k, v) in &d.topology {
            if labels.get(k) != Some(v) {
                new_labels.insert(k.clone(), v.clone().into());
            }
        }
    }
    if ids.as_deref() != current || !new_labels.is_empty() {
        let mut meta = serde_json::json!({"annotations": {NODE_ID_ANNOTATION: ids}});
        if !new_labels.is_empty() {
            meta["labels"] = new_labels.into();
        }
        nodes
            .patch(
                &s.node,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": meta})),
            )
            .await
            .with_context(|| format!("updating the {NODE_ID_ANNOTATION} annotation of Node {}", s.node))?;
    }
    let csinodes: Api<CSINode> = Api::all(client);
    match csinodes
        .get_opt(&s.node)
        .await
        .with_context(|| format!("reading CSINode {}", s.node))?
    {
        Some(mut c) => {
            let before = c.spec.drivers.clone();
            let after = csinode_drivers(before.clone(), batch);
            if after != before {
                c.spec.drivers = after;
                // The resourceVersion read is sent back: a concurrent change is a conflict,
                // and the whole batch is read and applied again.
                csinodes
                    .replace(&s.node, &PostParams::default(), &c)
                    .await
                    .with_context(|| format!("updating CSINode {}", s.node))?;
            }
        }
        None => {
            let c = CSINode {
                metadata: ObjectMeta {
                    name: Some(s.node.clone()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: s.node.clone(),
                        uid: node.metadata.uid.clone().unwrap_or_default(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                spec: CSINodeSpec {
                    drivers: csinode_drivers(Vec::new(), batch),
                },
                ..Default::default()
            };
            csinodes
                .create(&PostParams::default(), &c)
                .await
                .with_context(|| format!("creating CSINode {}", s.node))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver(name: &str, id: &str) -> Driver {
        Driver {
            name: name.into(),
            endpoint: "/x.sock".into(),
            version: (1, 0, 0),
            node_id: id.into(),
            max_volumes: Some(3),
            topology: [("topology.example.com/zone".to_string(), "z1".to_string())].into(),
        }
    }

    #[test]
    fn annotation_and_drivers_follow_the_batch() {
        let mut b = Pending::new();
        b.insert("a.example.com".into(), Some(driver("a.example.com", "n-a")));
        let ids = node_ids(Some(r#"{"other.example.com":"x"}"#), &b).unwrap();
        assert_eq!(ids, r#"{"a.example.com":"n-a","other.example.com":"x"}"#);
        let drivers = csinode_drivers(Vec::new(), &b);
        assert_eq!(drivers.len(), 1);
        assert_eq!(drivers[0].node_id, "n-a");
        assert_eq!(
            drivers[0].topology_keys.as_deref(),
            Some(&["topology.example.com/zone".to_string()][..])
        );
        assert_eq!(drivers[0].allocatable.as_ref().unwrap().count, Some(3));
        let mut gone = Pending::new();
        gone.insert("a.example.com".into(), None);
        assert_eq!(node_ids(Some(r#"{"a.example.com":"n-a"}"#), &gone), None);
        assert!(csinode_drivers(drivers, &gone).is_empty());
    }
}
