//! The API server away: pods keep running, the agent restarts without restarting a container,
//! and the statuses catch up when the API server is back.

use std::time::{Duration, Instant};

use libtest_mimic::Trial;

use crate::common::IMAGE;
use crate::{cluster, test};

pub fn tests() -> Vec<Trial> {
    vec![test(
        "api_server_outage_restarts_nothing_and_statuses_catch_up",
        api_server_outage_restarts_nothing_and_statuses_catch_up,
    )]
}

fn api_server_outage_restarts_nothing_and_statuses_catch_up() {
    let c = cluster();
    let mut node = c.node("outage");
    for (name, command, policy) in [
        ("steady", "sleep 3600", "Always"),
        // Finishes while the API server is away.
        ("finisher", "sleep 25", "Never"),
    ] {
        c.apply(&format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  restartPolicy: {policy}
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: app, image: {IMAGE}, command: [sh, -c, "{command}"]}}
"#,
            node = node.node
        ));
    }
    let running = |name: &str| {
        c.get_json(&["pod", name])
            .is_some_and(|p| p["status"]["phase"] == "Running")
    };
    c.wait("both pods running", Duration::from_secs(60), || {
        running("steady") && running("finisher")
    });
    let before = c.get_json(&["pod", "steady"]).unwrap();
    let started = before["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].clone();
    assert!(started.is_string(), "{before}");

    let stopped = c.stop_apiserver();
    let outage = Instant::now();
    // The agent restarts while the API server is away: it adopts what runs.
    node.restart();
    std::thread::sleep(Duration::from_secs(3));
    let local = |name: &str| {
        node.pods()
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
    };
    let remaining = Duration::from_secs(60).saturating_sub(outage.elapsed());
    std::thread::sleep(remaining);
    c.restart_apiserver(stopped);
    let back = Instant::now();

    c.wait("the statuses to catch up", Duration::from_secs(30), || {
        c.get_json(&["pod", "finisher"])
            .is_some_and(|p| p["status"]["phase"] == "Succeeded")
            && c.get_json(&["pod", "steady"]).is_some_and(|p| {
                p["status"]["phase"] == "Running" && p["status"]["containerStatuses"][0]["ready"] == true
            })
    });
    eprintln!("statuses caught up {:?} after the API server's return", back.elapsed());
    let after = c.get_json(&["pod", "steady"]).unwrap();
    assert_eq!(
        after["status"]["containerStatuses"][0]["state"]["running"]["startedAt"], started,
        "the container was restarted"
    );
    assert_eq!(after["status"]["containerStatuses"][0]["restartCount"], 0);
    let steady = local("steady").expect("the node still runs the pod");
    assert_eq!(steady.status.unwrap().container_statuses.unwrap()[0].restart_count, 0);
    assert!(
        node.agent_log().contains("watching this node's pods"),
        "the outage was not noticed:\n{}",
        node.agent_log()
    );
    for p in ["steady", "finisher"] {
        c.kubectl_ok(&["delete", "pod", p, "--wait=false"]);
    }
    c.wait("the pods to go", Duration::from_secs(60), || {
        c.get_json(&["pod", "steady"]).is_none() && c.get_json(&["pod", "finisher"]).is_none()
    });
}
