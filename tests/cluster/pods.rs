//! Pods from the API server: bound to the node, run, their status written back, deleted with
//! their grace period.

use std::time::{Duration, Instant};

use libtest_mimic::Trial;

use crate::common::IMAGE;
use crate::{cluster, test};

pub fn tests() -> Vec<Trial> {
    vec![test(
        "api_pod_runs_reports_status_and_deletes_gracefully",
        api_pod_runs_reports_status_and_deletes_gracefully,
    )]
}

fn api_pod_runs_reports_status_and_deletes_gracefully() {
    let c = cluster();
    let node = c.node("apipod");
    let host = node.dir.join("host");
    std::fs::create_dir_all(&host).unwrap();
    c.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: graceful, namespace: default}}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 4
  volumes: [{{name: host, hostPath: {{path: {host}}}}}]
  containers:
  - name: app
    image: {IMAGE}
    command: [sh, -c, "trap '' TERM; while true; do sleep 1; done"]
    volumeMounts: [{{name: host, mountPath: /host}}]
    lifecycle:
      preStop: {{exec: {{command: [sh, -c, "echo stopping > /host/prestop"]}}}}
"#,
        node = node.node,
        host = host.display()
    ));
    c.wait("the pod to run as the API shows it", Duration::from_secs(60), || {
        c.get_json(&["pod", "graceful"])
            .is_some_and(|p| p["status"]["phase"] == "Running" && p["status"]["containerStatuses"][0]["ready"] == true)
    });
    let p = c.get_json(&["pod", "graceful"]).unwrap();
    let st = &p["status"];
    assert!(st["podIP"].as_str().is_some_and(|ip| !ip.is_empty()), "{st}");
    assert!(
        st["hostIP"].as_str().is_some_and(|ip| ip.starts_with("198.51.100.")),
        "{st}"
    );
    assert_eq!(st["qosClass"], "BestEffort", "{st}");
    // The scheduler's condition is kept next to kubelet's.
    let conditions: Vec<&str> = st["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["type"].as_str())
        .collect();
    for t in ["Initialized", "Ready", "ContainersReady"] {
        assert!(conditions.contains(&t), "{conditions:?}");
    }
    assert!(
        st["containerStatuses"][0]["state"]["running"]["startedAt"].is_string(),
        "{st}"
    );

    // Deleted with a 4 s grace period: preStop runs, TERM is ignored, the kill comes at the end
    // of the grace period, then the node deletes the object.
    let asked = Instant::now();
    c.kubectl_ok(&["delete", "pod", "graceful", "--wait=false"]);
    c.wait("the pod object to disappear", Duration::from_secs(60), || {
        c.get_json(&["pod", "graceful"]).is_none()
    });
    let took = asked.elapsed();
    assert!(
        took >= Duration::from_secs(3),
        "deleted after {took:?}, before its grace period"
    );
    assert_eq!(
        std::fs::read_to_string(host.join("prestop")).unwrap_or_default().trim(),
        "stopping"
    );
    c.wait("the node to forget the pod", Duration::from_secs(10), || {
        !node
            .pods()
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some("graceful"))
    });
}
