//! Pods from the API server: bound to the node, run, their status written back, deleted with
//! their grace period.

use std::time::{Duration, Instant};

use libtest_mimic::Trial;

use crate::common::IMAGE;
use crate::{cluster, test};

pub fn tests() -> Vec<Trial> {
    vec![
        test(
            "api_pod_runs_reports_status_and_deletes_gracefully",
            api_pod_runs_reports_status_and_deletes_gracefully,
        ),
        test(
            "static_pod_has_a_mirror_that_comes_back",
            static_pod_has_a_mirror_that_comes_back,
        ),
        test(
            "a_mirror_pod_without_its_static_pod_is_deleted",
            a_mirror_pod_without_its_static_pod_is_deleted,
        ),
        test(
            "a_pod_that_does_not_fit_is_failed_in_the_api",
            a_pod_that_does_not_fit_is_failed_in_the_api,
        ),
        test(
            "deployment_replicas_are_scheduled_and_run",
            deployment_replicas_are_scheduled_and_run,
        ),
        test(
            "a_readiness_gate_patched_by_a_client_makes_the_pod_ready",
            a_readiness_gate_patched_by_a_client_makes_the_pod_ready,
        ),
        test(
            "kubectl_debug_runs_an_ephemeral_container_in_its_targets_processes",
            kubectl_debug_runs_an_ephemeral_container_in_its_targets_processes,
        ),
        test(
            "admission_sees_a_label_added_to_the_node_after_it_registered",
            admission_sees_a_label_added_to_the_node_after_it_registered,
        ),
    ]
}

/// Admission judges a pod against the Node as it is now (kubelet's node informer), not as the
/// agent registered it: a label added later admits a pod bound with a nodeSelector on it; a
/// label the node lacks is still refused with kubelet's reason.
fn admission_sees_a_label_added_to_the_node_after_it_registered() {
    let c = cluster();
    let node = c.node("labeled-later");
    c.wait("the Node registered", Duration::from_secs(60), || {
        c.get_json(&["node", &node.node]).is_some()
    });
    c.kubectl_ok(&["label", "node", &node.node, "ferrolet.test/late=yes"]);
    // What the scheduler would do next; the agent's watch of its Node delivers the label
    // within milliseconds, a second is margin.
    std::thread::sleep(Duration::from_secs(1));
    c.apply(&sleeper(
        "selects-late",
        &node.node,
        "3600",
        "  nodeSelector: {ferrolet.test/late: \"yes\"}\n",
    ));
    c.apply(&sleeper(
        "selects-missing",
        &node.node,
        "3600",
        "  nodeSelector: {ferrolet.test/missing: \"yes\"}\n",
    ));
    c.wait("the pod on the new label Running", Duration::from_secs(60), || {
        c.get_json(&["pod", "selects-late"])
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });
    c.wait("the pod on a missing label refused", Duration::from_secs(30), || {
        c.get_json(&["pod", "selects-missing"])
            .is_some_and(|p| p["status"]["phase"] == "Failed" && p["status"]["reason"] == "NodeAffinity")
    });
    c.kubectl_ok(&["delete", "pod", "selects-late", "selects-missing", "--wait=false"]);
    c.wait("the pods to go", Duration::from_secs(30), || {
        c.get_json(&["pod", "selects-late"]).is_none() && c.get_json(&["pod", "selects-missing"]).is_none()
    });
}

/// The reasons of the events about pod `name` (namespace default).
fn event_reasons(name: &str) -> Vec<String> {
    let list = crate::cluster()
        .get_json(&["events", "--field-selector", &format!("involvedObject.name={name}")])
        .unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["reason"].as_str().map(str::to_string))
        .collect()
}

fn api_pod_runs_reports_status_and_deletes_gracefully() {
    let c = cluster();
    let node = c.node("apipod");
    let host = node.host_dir();
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
    // kubelet's events, from this node.
    c.wait("Created and Started events", Duration::from_secs(20), || {
        let r = event_reasons("graceful");
        r.iter().any(|x| x == "Created") && r.iter().any(|x| x == "Started")
    });
    // The node's metrics count the API pod and its calls to the API server (client-go's names).
    let (code, body) = node.get("/metrics").unwrap();
    let m = String::from_utf8_lossy(&body);
    assert_eq!(code, 200);
    assert!(m.contains("kubelet_desired_pods{static=\"false\"} 1"), "{m}");
    assert!(
        m.lines().any(|l| l.starts_with("rest_client_requests_total{")
            && l.contains("code=\"201\"")
            && l.contains("method=\"POST\"")),
        "{m}"
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

fn static_pod_has_a_mirror_that_comes_back() {
    let c = cluster();
    let node = c.node("mirror");
    node.write(
        "web.yaml",
        &format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: app, image: {IMAGE}, command: [sleep, "3600"]}}
"#
        ),
    );
    let name = format!("web-{}", node.node);
    let mirror = |c: &crate::common::cluster::Cluster| c.get_json(&["pod", &name]);
    c.wait(
        "the mirror pod to run as the API shows it",
        Duration::from_secs(60),
        || mirror(c).is_some_and(|p| p["status"]["phase"] == "Running"),
    );
    let m = mirror(c).unwrap();
    let ann = &m["metadata"]["annotations"];
    assert!(ann["kubernetes.io/config.mirror"].is_string(), "{ann}");
    assert_eq!(ann["kubernetes.io/config.source"], "file", "{ann}");
    let owner = &m["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Node", "{owner}");
    assert_eq!(owner["name"], node.node.as_str(), "{owner}");
    let first_uid = m["metadata"]["uid"].as_str().unwrap().to_string();

    // Deleted by a user: it comes back (a new object), and the static pod never stopped.
    let started = m["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].clone();
    c.kubectl_ok(&["delete", "pod", &name, "--wait=false"]);
    c.wait("the mirror pod to come back", Duration::from_secs(30), || {
        mirror(c).is_some_and(|p| {
            p["metadata"]["uid"].as_str() != Some(first_uid.as_str()) && p["status"]["phase"] == "Running"
        })
    });
    let again = mirror(c).unwrap();
    assert_eq!(
        again["status"]["containerStatuses"][0]["state"]["running"]["startedAt"], started,
        "the static pod's container restarted"
    );
    assert_eq!(again["status"]["containerStatuses"][0]["restartCount"], 0);

    // The static pod removed: its mirror goes.
    node.remove("web.yaml");
    c.wait("the mirror pod to go", Duration::from_secs(60), || mirror(c).is_none());
}

/// kubelet's HandlePodCleanups: a mirror pod bound to the node whose static pod the node does
/// not have is deleted at a housekeeping, found among the mirror pods the watch of the node's
/// pods shows (one seen while the agent runs, one found by its first list after a restart);
/// the mirror of the node's own static pod is kept. (A static pod removed while the agent was
/// down is cleaned up with its pod directory, which deletes its mirror on the way.)
fn a_mirror_pod_without_its_static_pod_is_deleted() {
    let c = cluster();
    let kc = c.node_kubeconfig("node-orphan");
    let mut node = c.node_with("orphan", &["--kubeconfig", kc.to_str().unwrap()], "syncFrequency: 3s\n");
    node.write(
        "stays.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: stays, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: app, image: {IMAGE}, command: [sleep, \"3600\"]}}\n"
        ),
    );
    let stays = format!("stays-{}", node.node);
    c.wait("the static pod's mirror Running", Duration::from_secs(60), || {
        c.get_json(&["pod", &stays])
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });
    let kept_uid = c.get_json(&["pod", &stays]).unwrap()["metadata"]["uid"].clone();
    // A mirror pod of no static pod of this node, bound to it (as a mirror left by a manifest
    // of an earlier install would be).
    let node_name = node.node.clone();
    let stray = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  annotations: {{kubernetes.io/config.mirror: \"0123\", kubernetes.io/config.source: file}}\nspec:\n  nodeName: {}\n  containers:\n  - {{name: app, image: {IMAGE}, command: [sleep, \"3600\"]}}\n",
            node_name
        )
    };
    let orphaned = |node: &crate::common::Agent| {
        node.agent_log()
            .matches("deleting an orphaned mirror pod: its static pod is gone")
            .count()
    };

    c.apply(&stray("stray-seen"));
    c.wait(
        "the mirror pod seen by the watch to go",
        Duration::from_secs(60),
        || c.get_json(&["pod", "stray-seen"]).is_none(),
    );
    assert_eq!(orphaned(&node), 1, "{}", crate::common::tail(&node.agent_log(), 40));

    node.stop();
    c.apply(&stray("stray-listed"));
    node.restart();
    c.wait(
        "the mirror pod found by the list to go",
        Duration::from_secs(60),
        || c.get_json(&["pod", "stray-listed"]).is_none(),
    );
    // (The log goes on across the restart.)
    assert_eq!(orphaned(&node), 2, "{}", crate::common::tail(&node.agent_log(), 40));
    // Housekeeping goes on (every 3 s) and leaves the node's own mirror alone.
    std::thread::sleep(Duration::from_secs(7));
    let kept = c
        .get_json(&["pod", &stays])
        .expect("the mirror of the node's static pod");
    assert_eq!(kept["metadata"]["uid"], kept_uid, "it was not made again");
}

fn deployment_replicas_are_scheduled_and_run() {
    let c = cluster();
    let node = c.node("deploy");
    c.wait("the node to be Ready", Duration::from_secs(60), || {
        c.get_json(&["node", &node.node]).is_some_and(|n| {
            n["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|x| x["type"] == "Ready" && x["status"] == "True"))
        })
    });
    // The node's images in its status: the demo image by tag and by digest, with its size.
    let n = c.get_json(&["node", &node.node]).unwrap();
    let images = n["status"]["images"].as_array().cloned().unwrap_or_default();
    let demo = images.iter().find(|i| {
        i["names"]
            .as_array()
            .is_some_and(|ns| ns.iter().any(|x| x == "docker.io/library/busybox:1.35"))
    });
    let demo = demo.unwrap_or_else(|| panic!("the demo image among the node's images: {images:?}"));
    assert!(demo["sizeBytes"].as_u64().is_some_and(|s| s > 0), "{demo}");
    assert!(
        demo["names"].as_array().unwrap().iter().any(|x| x
            .as_str()
            .is_some_and(|x| x.starts_with("docker.io/library/busybox@sha256:"))),
        "{demo}"
    );
    // Pinned to this node: other tests' nodes share the cluster. The pods get the
    // ServiceAccount token volume the API server adds to every pod.
    c.apply(&format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: default}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      nodeSelector: {{kubernetes.io/hostname: {node}}}
      terminationGracePeriodSeconds: 1
      containers:
      - name: app
        image: {IMAGE}
        command: [sleep, "3600"]
        # Ready only with the token volume in place.
        readinessProbe:
          exec: {{command: [test, -s, /var/run/secrets/kubernetes.io/serviceaccount/token]}}
          periodSeconds: 1
"#,
        node = node.node
    ));
    let ready = || {
        c.get_json(&["pods", "-l", "app=web"]).map_or(0, |l| {
            l["items"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| {
                    p["spec"]["nodeName"] == node.node.as_str()
                        && p["status"]["phase"] == "Running"
                        && p["status"]["containerStatuses"][0]["ready"] == true
                })
                .count()
        })
    };
    c.wait(
        "3 replicas Running and ready on the node",
        Duration::from_secs(90),
        || ready() == 3,
    );
    let d = c.get_json(&["deployment", "web"]).unwrap();
    c.wait(
        "the Deployment to count 3 available replicas",
        Duration::from_secs(30),
        || {
            c.get_json(&["deployment", "web"])
                .is_some_and(|d| d["status"]["availableReplicas"] == 3)
        },
    );
    assert_eq!(d["spec"]["replicas"], 3);
    c.kubectl_ok(&["delete", "deployment", "web", "--wait=false"]);
    c.wait("the replicas to go", Duration::from_secs(60), || {
        c.get_json(&["pods", "-l", "app=web"])
            .is_some_and(|l| l["items"].as_array().unwrap().is_empty())
    });
    // Normal operation never meets a NodeRestriction / Node authorizer refusal.
    let log = node.agent_log();
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "the node was refused something:\n{log}"
    );
}

fn a_pod_that_does_not_fit_is_failed_in_the_api() {
    let c = cluster();
    let node = c.node("admit");
    c.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: too-big, namespace: default}}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  containers:
  - {{name: app, image: {IMAGE}, command: [sleep, "3600"], resources: {{requests: {{cpu: "1000"}}}}}}
"#,
        node = node.node
    ));
    c.wait("the refusal in the API", Duration::from_secs(30), || {
        c.get_json(&["pod", "too-big"])
            .is_some_and(|p| p["status"]["phase"] == "Failed" && p["status"]["reason"] == "OutOfcpu")
    });
    let p = c.get_json(&["pod", "too-big"]).unwrap();
    let msg = p["status"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("Node didn't have enough resource: cpu"), "{msg}");
    c.kubectl_ok(&["delete", "pod", "too-big", "--wait=false"]);
    c.wait("the refused pod to go", Duration::from_secs(30), || {
        c.get_json(&["pod", "too-big"]).is_none()
    });
}

/// Pod `name` (namespace default) bound to `node`: one container `app` sleeping `secs`, a
/// grace period of 1 s, and `spec` (indented YAML lines) added to its spec.
fn sleeper(name: &str, node: &str, secs: &str, spec: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
{spec}  containers:
  - {{name: app, image: {IMAGE}, command: [sleep, "{secs}"]}}
"#
    )
}

/// readinessGates: the pod is Ready only once a client sets each gate's condition True through
/// the status subresource (kubelet's NeedToReconcilePodReadiness: the new object is synced).
fn a_readiness_gate_patched_by_a_client_makes_the_pod_ready() {
    let c = cluster();
    let node = c.node("gates");
    c.apply(&sleeper(
        "gated",
        &node.node,
        "3600",
        "  readinessGates: [{conditionType: example.com/gate}]\n",
    ));
    let condition = |p: &serde_json::Value, t: &str| -> serde_json::Value {
        p["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == t).cloned())
            .unwrap_or_default()
    };
    c.wait(
        "containers ready, the pod held back by its gate",
        Duration::from_secs(30),
        || {
            c.get_json(&["pod", "gated"]).is_some_and(|p| {
                condition(&p, "ContainersReady")["status"] == "True"
                    && condition(&p, "Ready")["reason"] == "ReadinessGatesNotReady"
            })
        },
    );
    let p = c.get_json(&["pod", "gated"]).unwrap();
    assert_eq!(condition(&p, "Ready")["status"], "False");
    assert_eq!(
        condition(&p, "Ready")["message"],
        "corresponding condition of pod readiness gate \"example.com/gate\" does not exist."
    );
    c.kubectl_ok(&[
        "patch",
        "pod",
        "gated",
        "--subresource=status",
        "--type=strategic",
        "-p",
        r#"{"status":{"conditions":[{"type":"example.com/gate","status":"True"}]}}"#,
    ]);
    c.wait("the pod Ready once its gate is True", Duration::from_secs(30), || {
        c.get_json(&["pod", "gated"]).is_some_and(|p| {
            condition(&p, "Ready")["status"] == "True" && condition(&p, "example.com/gate")["status"] == "True"
        })
    });
    c.kubectl_ok(&["delete", "pod", "gated", "--wait=false"]);
    c.wait("the gated pod to go", Duration::from_secs(30), || {
        c.get_json(&["pod", "gated"]).is_none()
    });
}

/// `kubectl debug` adds an ephemeral container through the pod's ephemeralcontainers
/// subresource: the node starts it in the running pod, in its target's process namespace
/// with `--target`, in one of its own without; reports it in ephemeralContainerStatuses;
/// serves its logs; and never restarts it once it has exited.
fn kubectl_debug_runs_an_ephemeral_container_in_its_targets_processes() {
    let c = cluster();
    let node = c.node("debug");
    c.apply(&sleeper("debugged", &node.node, "3601", ""));
    let ready = |p: &serde_json::Value| -> serde_json::Value {
        p["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready").cloned())
            .unwrap_or_default()
    };
    c.wait("the pod running and Ready", Duration::from_secs(30), || {
        c.get_json(&["pod", "debugged"])
            .is_some_and(|p| p["status"]["phase"] == "Running" && ready(&p)["status"] == "True")
    });
    // The status is a merge patch: the reason and message of a Ready that was False go.
    let r = ready(&c.get_json(&["pod", "debugged"]).unwrap());
    assert!(r.get("reason").is_none() && r.get("message").is_none(), "{r}");
    for (name, target) in [("dbg", Some("app")), ("loner", None)] {
        let mut args = vec![
            "debug",
            "debugged",
            "--image",
            IMAGE,
            "--container",
            name,
            "--image-pull-policy",
            "IfNotPresent",
        ];
        if let Some(t) = target {
            args.extend(["--target", t]);
        }
        args.extend(["--", "sh", "-c", "ps -o pid,args; sleep 2"]);
        c.kubectl_ok(&args);
    }
    let status = |name: &str| -> serde_json::Value {
        c.get_json(&["pod", "debugged"])
            .and_then(|p| {
                p["status"]["ephemeralContainerStatuses"]
                    .as_array()
                    .and_then(|s| s.iter().find(|s| s["name"] == name).cloned())
            })
            .unwrap_or_default()
    };
    for name in ["dbg", "loner"] {
        c.wait(
            &format!("ephemeral container {name} ran and exited 0"),
            Duration::from_secs(30),
            || status(name)["state"]["terminated"]["exitCode"] == 0,
        );
    }
    let targeted = c.kubectl_ok(&["logs", "debugged", "-c", "dbg"]);
    assert!(
        targeted.lines().any(|l| l.trim() == "1 sleep 3601"),
        "--target shares the app's processes (its init is pid 1):\n{targeted}"
    );
    let alone = c.kubectl_ok(&["logs", "debugged", "-c", "loner"]);
    assert!(
        !alone.contains("sleep 3601") && alone.lines().any(|l| l.trim().starts_with("1 sh -c")),
        "without a target, a process namespace of its own:\n{alone}"
    );
    // Exited for good: never restarted, never ready, and the app untouched.
    std::thread::sleep(Duration::from_secs(3));
    for name in ["dbg", "loner"] {
        let st = status(name);
        assert_eq!(st["restartCount"], 0, "{st}");
        assert_eq!(st["ready"], false, "{st}");
        assert!(st["state"]["terminated"].is_object(), "{st}");
        assert!(st["containerID"].as_str().is_some_and(|id| !id.is_empty()), "{st}");
    }
    let p = c.get_json(&["pod", "debugged"]).unwrap();
    let app = &p["status"]["containerStatuses"][0];
    assert!(app["state"]["running"].is_object() && app["restartCount"] == 0, "{app}");
    c.kubectl_ok(&["delete", "pod", "debugged", "--wait=false"]);
    c.wait("the debugged pod to go", Duration::from_secs(30), || {
        c.get_json(&["pod", "debugged"]).is_none()
    });
}
