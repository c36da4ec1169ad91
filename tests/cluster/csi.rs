//! CSI drivers registered through a cluster node's plugin watcher are in the API server: the
//! node's CSINode object (owned by its Node) lists each driver with its node ID, topology keys
//! and volume limit, the Node carries the `csi.volume.kubernetes.io/nodeid` annotation and the
//! topology labels, and a driver whose registration socket goes leaves both. The driver is the
//! test's own (tests/common/csiplugin.rs), registering in the agent's `plugins_registry`.

use std::path::Path;
use std::time::{Duration, Instant};

use libtest_mimic::Trial;
use serde_json::Value;

use crate::csiplugin::{is_mount_point, MountGuard, Options, TestCsiPlugin};
use crate::{cluster, test};

pub fn tests() -> Vec<Trial> {
    vec![
        test(
            "csinode_lists_a_registered_driver_and_drops_it_when_it_goes",
            csinode_lists_a_registered_driver_and_drops_it_when_it_goes,
        ),
        test(
            "stateful_set_on_a_csi_volume_is_attached_staged_published_and_keeps_its_data",
            stateful_set_on_a_csi_volume_is_attached_staged_published_and_keeps_its_data,
        ),
    ]
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

/// Deletes the API objects a test made when it ends, passed or not.
struct Cleanup(Vec<[String; 2]>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for [kind, name] in &self.0 {
            cluster().kubectl(&["delete", kind, name, "--ignore-not-found", "--wait=false"]);
        }
    }
}

/// The external attacher's part, played by the test: the VolumeAttachment, whenever it exists
/// (the attach-detach controller deletes it when the pod goes and makes it anew for the next),
/// is marked attached with attachment metadata. Stops when dropped.
struct Attacher {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Attacher {
    fn start(name: String) -> Attacher {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                let c = cluster();
                let got = c.kubectl(&["get", "volumeattachment", &name, "-o", "jsonpath={.status.attached}"]);
                if got.status.success() && got.stdout != b"true" {
                    c.kubectl(&[
                        "patch",
                        "volumeattachment",
                        &name,
                        "--subresource=status",
                        "--type=merge",
                        "-p",
                        r#"{"status":{"attached":true,"attachmentMetadata":{"device":"fake0"}}}"#,
                    ]);
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        Attacher {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Attacher {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn running(c: &crate::common::cluster::Cluster, pod: &str) -> bool {
    c.get_json(&["pod", pod])
        .is_some_and(|p| p["status"]["phase"] == "Running")
}

/// A StatefulSet whose claim is bound to a CSI PersistentVolume of the test driver (no
/// CSIDriver object: attach required, as kubelet has it). The VolumeAttachment an external
/// attacher would mark attached is marked by the test, with attachment metadata that must
/// reach NodeStageVolume as its publish context. The pod runs and writes through the driver's
/// bind mounts; deleted, it comes back on the same data; the set deleted, the volume is
/// unpublished and unstaged.
fn stateful_set_on_a_csi_volume_is_attached_staged_published_and_keeps_its_data() {
    let c = cluster();
    c.wait("the default ServiceAccount", Duration::from_secs(60), || {
        c.kubectl(&["get", "serviceaccount", "default"]).status.success()
    });
    let node = c.node("csipv");
    let n = node.node.clone();
    let plugin_dir = node.dir.join("csi-plugin");
    let _mounts = MountGuard(node.dir.clone());
    let driver = format!("{n}.csi.test");
    let plugin = TestCsiPlugin::start(
        &node.root.join("plugins_registry"),
        &plugin_dir,
        &driver,
        Options::default(),
    );
    assert_eq!(
        plugin.first_notification(Duration::from_secs(30)),
        (true, String::new())
    );
    let backing = plugin.volume("vol-1");
    let (class, set, pv) = (format!("csi-{n}"), format!("csidb-{n}"), format!("pv-csi-{n}"));
    let attachment = ferrolet::volumemanager::csi::attachment_name("vol-1", &driver, &n);
    let _cleanup = Cleanup(vec![
        ["statefulset".into(), set.clone()],
        ["pvc".into(), format!("data-{set}-0")],
        ["pv".into(), pv.clone()],
        ["volumeattachment".into(), attachment.clone()],
        ["storageclass".into(), class.clone()],
    ]);
    c.apply(&format!(
        r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {class}}}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {pv}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: {class}
  csi: {{driver: {driver}, volumeHandle: vol-1, fsType: ext4, volumeAttributes: {{tier: test}}}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{n}]}}]
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata: {{name: {attachment}}}
spec:
  attacher: {driver}
  nodeName: {n}
  source: {{persistentVolumeName: {pv}}}
"#
    ));
    let _attacher = Attacher::start(attachment.clone());
    let created = Instant::now();
    c.apply(&crate::volumes::stateful_set(&set, &class, ""));
    let first = format!("{set}-0");
    c.wait("the StatefulSet's pod Running", Duration::from_secs(120), || {
        running(c, &first)
    });
    let to_running = created.elapsed();
    c.wait("the pod's first write", Duration::from_secs(30), || {
        read(&backing.join("seen")).lines().count() == 1
    });
    println!("a StatefulSet pod on a CSI volume: created -> Running in {to_running:?} (scheduling, binding, attachment, stage and publish included)");
    let calls = plugin.calls();
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with("NodeStageVolume vol-1 ") && c.ends_with("[device=fake0]")),
        "{calls:?}"
    );
    assert!(
        calls.iter().any(|c| c.starts_with("NodePublishVolume vol-1 ")),
        "{calls:?}"
    );
    let uid = |p: &Value| p["metadata"]["uid"].as_str().unwrap_or("").to_string();
    let old = uid(&c.get_json(&["pod", &first]).unwrap());
    let target = ferrolet::volumemanager::csi::target_path(&node.root.join("pods").join(&old), "data");
    assert!(is_mount_point(&target));
    let data = ferrolet::volumemanager::csi::VolData::load(target.parent().unwrap()).unwrap();
    assert_eq!(
        (data.spec_vol_id.as_str(), data.node_name.as_str()),
        (pv.as_str(), n.as_str())
    );
    assert_eq!(data.attachment_id, attachment);
    let staging = ferrolet::volumemanager::csi::staging_path(&node.root, &driver, "vol-1");
    assert!(is_mount_point(&staging));
    // The Node reports the volume in use (the attach-detach controller does not detach it).
    let unique = format!("kubernetes.io/csi/{driver}^vol-1");
    let in_use = || {
        c.get_json(&["node", &n])
            .and_then(|node| node["status"]["volumesInUse"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .any(|v| v == unique.as_str())
    };
    c.wait("the volume in the Node's volumesInUse", Duration::from_secs(60), in_use);

    // Deleted, the pod comes back on the same data.
    c.kubectl_ok(&["delete", "pod", &first, "--wait=false"]);
    c.wait("the StatefulSet's new pod Running", Duration::from_secs(120), || {
        c.get_json(&["pod", &first])
            .is_some_and(|p| uid(&p) != old && p["status"]["phase"] == "Running")
    });
    c.wait("the new pod's write beside the old", Duration::from_secs(30), || {
        read(&backing.join("seen")).lines().count() == 2
    });
    assert!(!target.parent().unwrap().exists(), "the old pod's volume dir is gone");

    // The set deleted: unpublished and unstaged; the data stays with the driver.
    c.kubectl_ok(&["delete", "statefulset", &set, "--wait=false"]);
    c.wait("the StatefulSet's pod gone", Duration::from_secs(60), || {
        c.get_json(&["pod", &first]).is_none()
    });
    c.wait("the volume unstaged", Duration::from_secs(30), || {
        !is_mount_point(&staging)
    });
    c.wait("the volume gone from volumesInUse", Duration::from_secs(60), || {
        !in_use()
    });
    let calls = plugin.calls();
    let count = |m: &str| calls.iter().filter(|c| c.starts_with(m)).count();
    assert_eq!(
        (count("NodeUnpublishVolume"), count("NodeUnstageVolume")),
        (2, 2),
        "{calls:?}"
    );
    assert_eq!(read(&backing.join("log")).lines().count(), 2);
    drop(plugin);
    drop(node);
}
