//! CSI drivers registered through a cluster node's plugin watcher are in the API server: the
//! node's CSINode object (owned by its Node) lists each driver with its node ID, topology keys
//! and volume limit, the Node carries the `csi.volume.kubernetes.io/nodeid` annotation and the
//! topology labels, and a driver whose registration socket goes leaves both. The driver is the
//! test's own (tests/common/csiplugin.rs), registering in the agent's `plugins_registry`.

use std::time::Duration;

use libtest_mimic::Trial;
use serde_json::Value;

use crate::csiplugin::{Options, TestCsiPlugin};
use crate::{cluster, test};

pub fn tests() -> Vec<Trial> {
    vec![test(
        "csinode_lists_a_registered_driver_and_drops_it_when_it_goes",
        csinode_lists_a_registered_driver_and_drops_it_when_it_goes,
    )]
}

fn drivers(csinode: &Value) -> Vec<Value> {
    csinode["spec"]["drivers"].as_array().cloned().unwrap_or_default()
}

fn csinode_lists_a_registered_driver_and_drops_it_when_it_goes() {
    let c = cluster();
    let node = c.node("csi");
    let name = node.node.clone();
    c.wait("the Node", Duration::from_secs(60), || {
        c.get_json(&["node", &name]).is_some()
    });
    let plugin_dir = tempfile::tempdir().unwrap();
    let mut plugin = TestCsiPlugin::start(
        &node.root.join("plugins_registry"),
        plugin_dir.path(),
        "dirs.csi.test",
        Options {
            node_id: format!("{name}-id"),
            max_volumes: 5,
            topology: [("topology.csi.test/zone".to_string(), "z1".to_string())].into(),
            ..Options::default()
        },
    );
    assert_eq!(
        plugin.first_notification(Duration::from_secs(30)),
        (true, String::new())
    );
    let mut csinode = Value::Null;
    c.wait("the driver in the CSINode", Duration::from_secs(30), || {
        csinode = c.get_json(&["csinode", &name]).unwrap_or_default();
        !drivers(&csinode).is_empty()
    });
    let d = &drivers(&csinode)[0];
    assert_eq!(d["name"], "dirs.csi.test");
    assert_eq!(d["nodeID"], format!("{name}-id"));
    assert_eq!(d["topologyKeys"], serde_json::json!(["topology.csi.test/zone"]));
    assert_eq!(d["allocatable"]["count"], 5);
    let owner = &csinode["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["name"].as_str()),
        (Some("Node"), Some(name.as_str()))
    );
    let n = c.get_json(&["node", &name]).unwrap();
    assert_eq!(
        n["metadata"]["annotations"]["csi.volume.kubernetes.io/nodeid"],
        format!("{{\"dirs.csi.test\":\"{name}-id\"}}")
    );
    assert_eq!(n["metadata"]["labels"]["topology.csi.test/zone"], "z1");
    assert_eq!(owner["uid"], n["metadata"]["uid"]);

    // The plugin goes: so does its driver.
    plugin.unregister();
    c.wait("the driver gone from the CSINode", Duration::from_secs(30), || {
        c.get_json(&["csinode", &name]).is_some_and(|c| drivers(&c).is_empty())
    });
    let n = c.get_json(&["node", &name]).unwrap();
    assert!(
        n["metadata"]["annotations"]
            .get("csi.volume.kubernetes.io/nodeid")
            .is_none(),
        "{}",
        n["metadata"]["annotations"]
    );
    drop(node);
    let _ = c.kubectl(&["delete", "csinode", &name, "--wait=false"]);
}
