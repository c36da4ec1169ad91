//! Persistent volumes through the real control plane: a StatefulSet on a local PersistentVolume
//! (a StorageClass with `WaitForFirstConsumer`, the scheduler binding its claim) runs, writes,
//! is deleted and comes back on the same data, also after an agent restart; a generic ephemeral
//! volume's claim (made by the controller, owned by the pod) is used; a claim that does not
//! exist or is not bound is named in the pod's FailedMount event; `/stats/summary` reports the
//! volume with its claim.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use libtest_mimic::Trial;
use serde_json::Value;

use crate::common::IMAGE;
use crate::{cluster, test};

pub fn tests() -> Vec<Trial> {
    vec![test(
        "stateful_set_on_a_local_volume_keeps_its_data",
        stateful_set_on_a_local_volume_keeps_its_data,
    )]
}

/// Deletes the API objects a test made when it ends, passed or not (namespaced ones first).
struct Cleanup(Vec<[String; 2]>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for [kind, name] in &self.0 {
            cluster().kubectl(&["delete", kind, name, "--ignore-not-found", "--wait=false"]);
        }
    }
}

fn pod(name: &str) -> Option<Value> {
    cluster().get_json(&["pod", name])
}

fn running(p: &Value) -> bool {
    p["status"]["phase"] == "Running"
}

/// The messages of the pod's events with `reason`.
fn event_messages(pod: &str, reason: &str) -> Vec<String> {
    let selector = format!("involvedObject.name={pod},reason={reason}");
    cluster()
        .get_json(&["events", "--field-selector", &selector])
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e["message"].as_str().map(String::from))
        .collect()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// A StatefulSet `set` of one pod (with `pod_extra`, lines of its pod spec) that appends a
/// line to `/data/log` on each start and copies the log to `/data/seen`, its `data` claim of 1Gi
/// from `class`.
pub fn stateful_set(set: &str, class: &str, pod_extra: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: {set}, namespace: default}}
spec:
  serviceName: ""
  replicas: 1
  selector: {{matchLabels: {{app: {set}}}}}
  template:
    metadata: {{labels: {{app: {set}}}}}
    spec:
{pod_extra}      terminationGracePeriodSeconds: 1
      containers:
      - name: db
        image: {IMAGE}
        command: [sh, -c, "echo $(cat /proc/sys/kernel/random/uuid) >> /data/log && cp /data/log /data/seen && sleep 3600"]
        volumeMounts: [{{name: data, mountPath: /data}}]
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: {class}
      resources: {{requests: {{storage: 1Gi}}}}
"#
    )
}

/// A local PersistentVolume of `class` at `path`, on `node` only.
fn local_pv(name: &str, class: &str, path: &Path, node: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: PersistentVolume
metadata: {{name: {name}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: {class}
  local: {{path: {path}}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]
"#,
        path = path.display()
    )
}

fn stateful_set_on_a_local_volume_keeps_its_data() {
    let c = cluster();
    c.wait("the default ServiceAccount", Duration::from_secs(60), || {
        c.kubectl(&["get", "serviceaccount", "default"]).status.success()
    });
    let mut node = c.node("pvlocal");
    let n = node.node.clone();
    // A class each, so that each claim gets the volume the test reads.
    let (class, eph_class, set) = (format!("local-{n}"), format!("local-eph-{n}"), format!("db-{n}"));
    let (disk, scratch) = (node.host_dir().join("disk"), node.host_dir().join("scratch"));
    for d in [&disk, &scratch] {
        std::fs::create_dir_all(d).unwrap();
    }
    let _cleanup = Cleanup(vec![
        ["statefulset".into(), set.clone()],
        ["pod".into(), format!("eph-{n}")],
        ["pod".into(), format!("noclaim-{n}")],
        ["pvc".into(), format!("data-{set}-0")],
        ["pv".into(), format!("pv-{n}")],
        ["pv".into(), format!("pv-eph-{n}")],
        ["storageclass".into(), class.clone()],
        ["storageclass".into(), eph_class.clone()],
    ]);
    c.apply(&format!(
        r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {class}}}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {eph_class}}}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
{pv}
---
{pv_eph}
"#,
        pv = local_pv(&format!("pv-{n}"), &class, &disk, &n),
        pv_eph = local_pv(&format!("pv-eph-{n}"), &eph_class, &scratch, &n),
    ));
    let created = Instant::now();
    c.apply(&stateful_set(&set, &class, "      securityContext: {fsGroup: 2345}\n"));
    let first = format!("{set}-0");
    c.wait("the StatefulSet's pod Running", Duration::from_secs(120), || {
        pod(&first).is_some_and(|p| running(&p))
    });
    let to_running = created.elapsed();
    c.wait("the pod's first write", Duration::from_secs(30), || {
        read(&disk.join("seen")).lines().count() == 1
    });
    println!(
        "a StatefulSet pod on a local volume: created -> Running in {to_running:?} (scheduling and binding included)"
    );
    // The pod's fsGroup owns the volume, as kubelet's local volume plugin does.
    assert_eq!(std::fs::metadata(&disk).unwrap().gid(), 2345);
    assert_eq!(std::fs::metadata(disk.join("log")).unwrap().gid(), 2345);

    // The volume's stats name its claim (once the sampler's round saw the pod).
    let volume_stats = || -> Option<Value> {
        let raw = c.kubectl(&["get", "--raw", &format!("/api/v1/nodes/{n}/proxy/stats/summary")]);
        let summary: Value = serde_json::from_slice(&raw.stdout).ok()?;
        let stats = summary["pods"]
            .as_array()?
            .iter()
            .find(|p| p["podRef"]["name"] == first.as_str())?
            .clone();
        stats["volume"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == "data")
            .cloned()
    };
    c.wait("the data volume in /stats/summary", Duration::from_secs(60), || {
        volume_stats().is_some()
    });
    let volume = volume_stats().unwrap();
    assert_eq!(volume["pvcRef"]["name"], format!("data-{set}-0"), "{volume}");
    assert_eq!(volume["pvcRef"]["namespace"], "default", "{volume}");
    assert!(volume["capacityBytes"].as_u64().unwrap_or(0) > 0, "{volume}");

    // Deleted, the pod comes back (a new UID) on the same data.
    let uid = |p: &Value| p["metadata"]["uid"].as_str().unwrap_or("").to_string();
    let old = uid(&pod(&first).unwrap());
    c.kubectl_ok(&["delete", "pod", &first, "--wait=false"]);
    c.wait("the StatefulSet's new pod Running", Duration::from_secs(120), || {
        pod(&first).is_some_and(|p| uid(&p) != old && running(&p))
    });
    c.wait("the new pod's write beside the old", Duration::from_secs(30), || {
        read(&disk.join("seen")).lines().count() == 2
    });

    // An agent restart keeps the pod and its volume: the container is not started again.
    node.restart();
    let restarts = || pod(&first).map(|p| p["status"]["containerStatuses"][0]["restartCount"].clone());
    std::thread::sleep(Duration::from_secs(5));
    c.wait(
        "the pod Running after the agent's restart",
        Duration::from_secs(60),
        || pod(&first).is_some_and(|p| running(&p)),
    );
    assert_eq!(restarts(), Some(Value::from(0)));
    assert_eq!(read(&disk.join("log")).lines().count(), 2);

    // A generic ephemeral volume: the claim the controller makes for the pod, owned by it.
    c.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: eph-{n}, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {IMAGE}
    command: [sh, -c, "echo scratch > /scratch/hello && sleep 3600"]
    volumeMounts: [{{name: scratch, mountPath: /scratch}}]
  volumes:
  - name: scratch
    ephemeral:
      volumeClaimTemplate:
        spec:
          accessModes: [ReadWriteOnce]
          storageClassName: {eph_class}
          resources: {{requests: {{storage: 1Gi}}}}
"#
    ));
    c.wait(
        "the pod with an ephemeral volume Running",
        Duration::from_secs(120),
        || pod(&format!("eph-{n}")).is_some_and(|p| running(&p)),
    );
    c.wait("the ephemeral volume's write", Duration::from_secs(30), || {
        read(&scratch.join("hello")) == "scratch\n"
    });

    // A claim that does not exist is named in the pod's FailedMount event.
    c.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: noclaim-{n}, namespace: default}}
spec:
  nodeName: {n}
  containers:
  - {{name: app, image: {IMAGE}, command: [sleep, "3600"], volumeMounts: [{{name: d, mountPath: /d}}]}}
  volumes: [{{name: d, persistentVolumeClaim: {{claimName: nope}}}}]
"#
    ));
    c.wait("the missing claim's FailedMount event", Duration::from_secs(60), || {
        event_messages(&format!("noclaim-{n}"), "FailedMount")
            .iter()
            .any(|m| m.contains("persistentvolumeclaim \"nope\" not found"))
    });
    assert!(!pod(&format!("noclaim-{n}")).is_some_and(|p| running(&p)));

    // The StatefulSet gone, its data stays on the node.
    c.kubectl_ok(&["delete", "statefulset", &set, "--wait=false"]);
    c.wait("the StatefulSet's pod gone", Duration::from_secs(60), || {
        pod(&first).is_none()
    });
    assert_eq!(read(&disk.join("log")).lines().count(), 2);
}
