//! The objects pods use, read with the node's own identity: env and envFrom from a ConfigMap
//! and a Secret, a configMap volume updated live (its `..data` swapped), the projected
//! ServiceAccount token every pod gets, accepted by TokenReview; a Secret and a ServiceAccount
//! the API server says are gone are not served from the node's checkpoint.

use std::path::Path;
use std::time::Duration;

use libtest_mimic::Trial;

use crate::common::IMAGE;
use crate::{cluster, test};

pub fn tests() -> Vec<Trial> {
    vec![
        test("env_from_config_map_and_secret", env_from_config_map_and_secret),
        test("config_map_volume_updates_live", config_map_volume_updates_live),
        test(
            "projected_service_account_token_accepted_by_token_review",
            projected_service_account_token_accepted_by_token_review,
        ),
        test(
            "objects_the_server_says_are_gone_are_not_served_from_the_checkpoint",
            objects_the_server_says_are_gone_are_not_served_from_the_checkpoint,
        ),
    ]
}

/// Deletes the API objects a test made when it ends, passed or not.
struct Cleanup(Vec<[&'static str; 2]>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for [kind, name] in &self.0 {
            cluster().kubectl(&["delete", kind, name, "--ignore-not-found", "--wait=false"]);
        }
    }
}

/// The messages of the pod's events with `reason`, as the API server has them.
fn event_messages(pod: &str, reason: &str) -> Vec<String> {
    let c = cluster();
    let selector = format!("involvedObject.name={pod},reason={reason}");
    c.get_json(&["events", "--field-selector", &selector])
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e["message"].as_str().map(String::from))
        .collect()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The admission plugin needs the namespace's default ServiceAccount before any pod.
fn wait_default_service_account() {
    let c = cluster();
    c.wait("the default ServiceAccount", Duration::from_secs(60), || {
        c.kubectl(&["get", "serviceaccount", "default"]).status.success()
    });
}

fn env_from_config_map_and_secret() {
    let c = cluster();
    wait_default_service_account();
    let node = c.node("objenv");
    let host = node.host_dir();
    c.apply(&format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: env-cfg, namespace: default}}
data: {{MODE: fast, 1BAD: skipped}}
---
apiVersion: v1
kind: Secret
metadata: {{name: env-sec, namespace: default}}
stringData: {{PASSWORD: hunter2}}
---
apiVersion: v1
kind: Service
metadata: {{name: env-db, namespace: default}}
spec: {{ports: [{{port: 5432}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: env-objects, namespace: default}}
spec:
  nodeName: {node}
  volumes: [{{name: host, hostPath: {{path: {host}}}}}]
  containers:
  - name: app
    image: {IMAGE}
    command: [sh, -c, "env > /host/env.tmp && mv /host/env.tmp /host/env; sleep 3600"]
    envFrom: [{{configMapRef: {{name: env-cfg}}}}, {{secretRef: {{name: env-sec}}, prefix: S_}}]
    env:
    - {{name: PW, valueFrom: {{secretKeyRef: {{name: env-sec, key: PASSWORD}}}}}}
    - {{name: URL, value: "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"}}
    volumeMounts: [{{name: host, mountPath: /host}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: env-missing, namespace: default}}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  containers:
  - name: app
    image: {IMAGE}
    command: [sleep, "3600"]
    env: [{{name: X, valueFrom: {{configMapKeyRef: {{name: nope, key: k}}}}}}]
"#,
        node = node.node,
        host = host.display()
    ));
    c.wait("the container's environment", Duration::from_secs(90), || {
        read(&host.join("env")).contains("PW=")
    });
    let env = read(&host.join("env"));
    let lines: Vec<&str> = env.lines().collect();
    assert!(lines.contains(&"MODE=fast"), "{env}");
    assert!(lines.contains(&"S_PASSWORD=hunter2"), "{env}");
    assert!(lines.contains(&"PW=hunter2"), "{env}");
    assert!(!env.contains("1BAD"), "{env}");
    assert!(lines.contains(&"KUBERNETES_SERVICE_PORT=443"), "{env}");
    let svc = c.get_json(&["service", "kubernetes"]).unwrap();
    let ip = svc["spec"]["clusterIP"].as_str().unwrap();
    assert!(
        lines.contains(&format!("KUBERNETES_SERVICE_HOST={ip}").as_str()),
        "{env}"
    );
    assert!(lines.contains(&format!("URL=https://{ip}:443").as_str()), "{env}");
    assert!(
        lines.contains(&format!("KUBERNETES_PORT_443_TCP=tcp://{ip}:443").as_str()),
        "{env}"
    );
    // A Service of the pod's namespace (from the node's watch of the Services).
    let db = c.get_json(&["service", "env-db"]).unwrap();
    let db_ip = db["spec"]["clusterIP"].as_str().unwrap();
    assert!(
        lines.contains(&format!("ENV_DB_SERVICE_HOST={db_ip}").as_str()),
        "{env}"
    );
    assert!(lines.contains(&"ENV_DB_SERVICE_PORT=5432"), "{env}");

    // A missing ConfigMap keeps the container from starting, in kubelet's words.
    c.wait(
        "CreateContainerConfigError for the missing ConfigMap",
        Duration::from_secs(60),
        || {
            c.get_json(&["pod", "env-missing"]).is_some_and(|p| {
                let w = &p["status"]["containerStatuses"][0]["state"]["waiting"];
                w["reason"] == "CreateContainerConfigError" && w["message"] == "configmap \"nope\" not found"
            })
        },
    );
    // The skipped key is reported (kubelet's event; the agent's log has every event).
    let log = node.agent_log();
    assert!(
        log.contains("InvalidEnvironmentVariableNames")
            && log.contains("Keys [1BAD] from the EnvFrom configMap default/env-cfg"),
        "no InvalidEnvironmentVariableNames event"
    );
    c.kubectl_ok(&["delete", "pod", "env-objects", "env-missing", "--grace-period=1"]);
    c.kubectl_ok(&["delete", "configmap", "env-cfg"]);
    c.kubectl_ok(&["delete", "secret", "env-sec"]);
}

/// A node whose volumes follow their objects: a resync every 3 s, and the objects cached for
/// the Node's TTL, which the TTL controller sets (0 here) once the node has registered.
fn node_following_objects(name: &str) -> crate::common::Agent {
    let c = cluster();
    let kc = c.node_kubeconfig(&format!("node-{name}"));
    let node = c.node_with(name, &["--kubeconfig", kc.to_str().unwrap()], "syncFrequency: 3s\n");
    c.wait(
        "the TTL controller's annotation on the Node",
        Duration::from_secs(60),
        || {
            c.get_json(&["node", &node.node])
                .is_some_and(|n| n["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] == "0")
        },
    );
    node
}

fn config_map_volume_updates_live() {
    let c = cluster();
    wait_default_service_account();
    let node = node_following_objects("objlive");
    let host = node.host_dir();
    let cm = |v: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: live, namespace: default}}\ndata: {{key: {v}}}\n")
    };
    c.apply(&cm("one"));
    c.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: live-cfg, namespace: default}}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  volumes:
  - {{name: host, hostPath: {{path: {host}}}}}
  - {{name: cfg, configMap: {{name: live}}}}
  containers:
  - name: app
    image: {IMAGE}
    command: [sh, -c, "while true; do {{ cat /cfg/key; echo; readlink /cfg/..data; }} > /host/state.tmp; mv /host/state.tmp /host/state; sleep 0.5; done"]
    volumeMounts: [{{name: host, mountPath: /host}}, {{name: cfg, mountPath: /cfg}}]
"#,
        node = node.node,
        host = host.display()
    ));
    // The content and the `..data` link it was read through, in one file written at once (the
    // link is read after the content, so it is that version's or a newer one).
    let state = || {
        let s = read(&host.join("state"));
        let (seen, data) = s.split_once('\n').unwrap_or_default();
        (seen.to_string(), data.trim().to_string())
    };
    c.wait("the first version in the pod", Duration::from_secs(90), || {
        state().0 == "one"
    });
    let first = state().1;
    assert!(first.starts_with("..20"), "{first:?}");
    c.apply(&cm("two"));
    // Within the objects' TTL (the Node's node.alpha.kubernetes.io/ttl, 0 in a cluster this
    // small, read from the watched Node) plus one resync.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while state().0 != "two" {
        if std::time::Instant::now() > deadline {
            let node_obj = c.get_json(&["node", &node.node]).unwrap_or_default();
            panic!(
                "the update did not reach the pod in 60 s (seen {:?}; node annotations {}):\n{}",
                state().0,
                node_obj["metadata"]["annotations"],
                crate::common::tail(&node.agent_log(), 12)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let second = state().1;
    assert!(second.starts_with("..20") && second != first, "{first:?} -> {second:?}");
    c.kubectl_ok(&["delete", "pod", "live-cfg", "--grace-period=1"]);
    c.kubectl_ok(&["delete", "configmap", "live"]);
}

fn projected_service_account_token_accepted_by_token_review() {
    let c = cluster();
    wait_default_service_account();
    let node = c.node("objtoken");
    let host = node.host_dir();
    // No automountServiceAccountToken: false, so the admission plugin adds kube-api-access.
    c.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: sa-token, namespace: default}}
spec:
  nodeName: {node}
  volumes: [{{name: host, hostPath: {{path: {host}}}}}]
  containers:
  - name: app
    image: {IMAGE}
    command: [sh, -c, "d=/var/run/secrets/kubernetes.io/serviceaccount; cat $d/namespace > /host/ns; cp $d/ca.crt /host/ca; cat $d/token > /host/token.tmp && mv /host/token.tmp /host/token; sleep 3600"]
    volumeMounts: [{{name: host, mountPath: /host}}]
"#,
        node = node.node,
        host = host.display()
    ));
    c.wait("the token in the pod", Duration::from_secs(90), || {
        !read(&host.join("token")).is_empty()
    });
    assert_eq!(read(&host.join("ns")), "default");
    assert!(read(&host.join("ca")).contains("BEGIN CERTIFICATE"));
    // The token volume is tmpfs on the node, never disk.
    let p = c.get_json(&["pod", "sa-token"]).unwrap();
    let uid = p["metadata"]["uid"].as_str().unwrap();
    let vol = p["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| v["name"].as_str().filter(|n| n.starts_with("kube-api-access-")))
        .expect("the admission plugin's kube-api-access volume")
        .to_string();
    let mounts = read(Path::new("/proc/self/mountinfo"));
    let suffix = format!("{uid}/volumes/kubernetes.io~projected/{vol}");
    assert!(
        mounts.lines().any(|l| l.contains(&suffix) && l.contains(" - tmpfs ")),
        "no tmpfs at {suffix}"
    );

    let token = read(&host.join("token"));
    let review = c.kubectl_stdin(
        &["create", "-f", "-", "-o", "json"],
        &format!("apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec: {{token: {token}}}\n"),
    );
    let review: serde_json::Value = serde_json::from_str(&review).unwrap();
    let st = &review["status"];
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(st["user"]["username"], "system:serviceaccount:default:default", "{st}");
    assert_eq!(
        st["user"]["extra"]["authentication.kubernetes.io/pod-name"][0], "sa-token",
        "the token is bound to the pod: {st}"
    );
    c.kubectl_ok(&["delete", "pod", "sa-token", "--grace-period=1"]);
}

/// Issue 34: an answer of the API server is the truth, not an outage. A Secret it says is gone
/// is forgotten by the checkpoint and its volume is not refreshed (a FailedMount event; the
/// files already there stay, as kubelet leaves them). A token it refuses (the ServiceAccount is
/// gone) after an agent restart, with nothing cached in memory, is a FailedMount too: the
/// checkpoint's token is served only while the server gives no answer.
fn objects_the_server_says_are_gone_are_not_served_from_the_checkpoint() {
    let c = cluster();
    wait_default_service_account();
    let _cleanup = Cleanup(vec![
        ["pod", "gone-objects"],
        ["secret", "gone-secret"],
        ["serviceaccount", "gone-sa"],
    ]);
    let mut node = node_following_objects("objgone");
    let host = node.host_dir();
    let secret = |v: &str| {
        format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: gone-secret, namespace: default}}\nstringData: {{pw: {v}}}\n")
    };
    c.apply("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: gone-sa, namespace: default}\n");
    c.apply(&secret("kept-until-deleted"));
    c.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: gone-objects, namespace: default}}
spec:
  nodeName: {node}
  serviceAccountName: gone-sa
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  volumes:
  - {{name: host, hostPath: {{path: {host}}}}}
  - {{name: sec, secret: {{secretName: gone-secret}}}}
  - name: tok
    projected:
      sources: [{{serviceAccountToken: {{path: token, expirationSeconds: 3600}}}}]
  containers:
  - name: app
    image: {IMAGE}
    command: [sh, -c, "while true; do cat /sec/pw > /host/pw.tmp; mv /host/pw.tmp /host/pw; cat /tok/token > /host/token.tmp; mv /host/token.tmp /host/token; sleep 0.5; done"]
    volumeMounts: [{{name: host, mountPath: /host}}, {{name: sec, mountPath: /sec}}, {{name: tok, mountPath: /tok}}]
"#,
        node = node.node,
        host = host.display()
    ));
    c.wait("the secret and the token in the pod", Duration::from_secs(90), || {
        read(&host.join("pw")) == "kept-until-deleted" && !read(&host.join("token")).is_empty()
    });
    let token = read(&host.join("token"));
    let uid = c.get_json(&["pod", "gone-objects"]).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let checkpoint = node.root.join(format!("checkpoint/pods/{uid}.json"));
    use base64::Engine;
    let kept = base64::engine::general_purpose::STANDARD.encode("kept-until-deleted");
    c.wait(
        "the secret and the token in the checkpoint",
        Duration::from_secs(30),
        || {
            let s = read(&checkpoint);
            s.contains(&kept) && s.contains(&token)
        },
    );

    // The Secret is deleted (the server is up): forgotten, not served; the files stay.
    c.kubectl_ok(&["delete", "secret", "gone-secret"]);
    c.wait(
        "a FailedMount event saying the secret is not found",
        Duration::from_secs(60),
        || {
            event_messages("gone-objects", "FailedMount")
                .iter()
                .any(|m| m.contains(r#"secret "gone-secret" not found"#))
        },
    );
    c.wait(
        "the secret forgotten by the checkpoint",
        Duration::from_secs(30),
        || !read(&checkpoint).contains(&kept),
    );
    assert_eq!(read(&host.join("pw")), "kept-until-deleted", "the volume's files stay");

    // The Secret back, the ServiceAccount gone, and the agent restarted: its in-memory tokens
    // are gone, and the TokenRequest is refused.
    c.apply(&secret("back-again"));
    c.wait("the new secret in the pod", Duration::from_secs(60), || {
        read(&host.join("pw")) == "back-again"
    });
    c.kubectl_ok(&["delete", "serviceaccount", "gone-sa"]);
    node.restart();
    c.wait(
        "a FailedMount event saying the ServiceAccount is not found",
        Duration::from_secs(60),
        || {
            event_messages("gone-objects", "FailedMount")
                .iter()
                .any(|m| m.contains("failed to fetch token") && m.contains("gone-sa"))
        },
    );
    assert_eq!(read(&host.join("token")), token, "the token's file stays as it was");
    assert_eq!(read(&host.join("pw")), "back-again");
}
