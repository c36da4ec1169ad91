//! The kubelet API on 10250 against the real control plane (docs/server.md): each node trusts
//! the cluster CA for client certificates and, being in a cluster, checks bearer tokens with a
//! TokenReview and every request with a SubjectAccessReview made with the node's own
//! credential (allowed by the Node authorizer). A ServiceAccount token without RBAC is
//! forbidden, with RBAC on nodes/proxy, nodes/stats, nodes/metrics and nodes/log it gets
//! through; the API server's own client certificate (X.509 v1, group system:masters) gets
//! through; `kubectl logs -f` and `kubectl get --raw .../proxy/...` go through the API server,
//! and so does a pod's log read over WebSocket (`binary.k8s.io`, `base64.binary.k8s.io`) as
//! client libraries and dashboards read it.
//! The serving certificate bootstrap asks the kubelet-serving signer and serves what an admin
//! approves.

use std::process::Stdio;
use std::time::{Duration, Instant};

use libtest_mimic::Trial;

use crate::common::{Agent, IMAGE};
use crate::{cluster, test};

pub fn tests() -> Vec<Trial> {
    vec![
        test(
            "kubelet_api_authenticates_and_authorizes_through_the_api_server",
            kubelet_api_authenticates_and_authorizes_through_the_api_server,
        ),
        test(
            "kubelet_api_is_reached_through_the_api_server_proxy",
            kubelet_api_is_reached_through_the_api_server_proxy,
        ),
        test(
            "container_logs_over_websocket_through_the_api_server",
            container_logs_over_websocket_through_the_api_server,
        ),
        test(
            "serving_certificate_is_requested_and_served_once_approved",
            serving_certificate_is_requested_and_served_once_approved,
        ),
        test(
            "serving_certificate_rotates_without_a_restart",
            serving_certificate_rotates_without_a_restart,
        ),
    ]
}

/// The node's address (its `--node-ip`).
fn node_ip(a: &Agent) -> String {
    let i = a.args.iter().position(|x| x == "--node-ip").expect("--node-ip");
    a.args[i + 1].clone()
}

/// `curl` inside the cluster's namespace; (status, body). Status 0: no HTTP answer.
fn curl(args: &[&str], url: &str) -> (u16, String) {
    crate::common::curl_with(cluster().net.command("curl"), args, url)
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The API server's client certificate for kubelets (curl arguments).
fn apiserver_client() -> Vec<String> {
    let pki = cluster().dir.join("pki");
    vec![
        "-k".into(),
        "--cert".into(),
        pki.join("apiserver-kubelet-client.crt").display().to_string(),
        "--key".into(),
        pki.join("apiserver-kubelet-client.key").display().to_string(),
    ]
}

fn run_pod(node: &Agent, name: &str, script: &str, restart: &str) {
    cluster().apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {node}
  restartPolicy: {restart}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {IMAGE}
    command: [sh, -c, {script:?}]
"#,
        node = node.node
    ));
}

fn wait_running(name: &str) {
    let c = cluster();
    c.wait(&format!("pod {name} running"), Duration::from_secs(60), || {
        c.get_json(&["pod", name])
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });
}

fn kubelet_api_authenticates_and_authorizes_through_the_api_server() {
    let c = cluster();
    let kc = c.node_kubeconfig("node-srvauth");
    // denied answers are cached for 2 s here instead of 30 s, so the grant shows quickly
    let node = c.node_with(
        "srvauth",
        &["--kubeconfig", kc.to_str().unwrap()],
        "authorization:\n  webhook:\n    cacheUnauthorizedTTL: 2s\n",
    );
    let base = format!("https://{}:10250", node_ip(&node));
    wait_for("the kubelet port", Duration::from_secs(60), || {
        curl(&["-k"], &format!("{base}/healthz")).0 == 401
    });
    run_pod(
        &node,
        "srvauth-app",
        "while true; do echo tick; sleep 1; done",
        "Always",
    );
    wait_running("srvauth-app");

    let sa = "srvauth-reader";
    c.kubectl_ok(&["create", "serviceaccount", sa]);
    let token = c.kubectl_ok(&["create", "token", sa]).trim().to_string();
    let bearer = format!("Authorization: Bearer {token}");
    let user = format!("system:serviceaccount:default:{sa}");
    let pod = "srvauth-app";
    // (path, subresource kubelet authorizes it as)
    let sensitive = [
        ("/pods", "proxy"),
        ("/stats/summary", "stats"),
        ("/metrics", "metrics"),
        ("/logs/", "log"),
        (&*format!("/containerLogs/default/{pod}/app"), "proxy"),
        (&*format!("/exec/default/{pod}/app?command=ls&output=1"), "proxy"),
        (&*format!("/run/default/{pod}/app"), "proxy"),
        (&*format!("/portForward/default/{pod}"), "proxy"),
    ]
    .map(|(p, s)| (p.to_string(), s));

    for (path, sub) in &sensitive {
        let url = format!("{base}{path}");
        let (code, body) = curl(&["-k"], &url);
        assert_eq!(
            (code, body.as_str()),
            (401, "Unauthorized"),
            "{path} without credentials"
        );
        let (code, body) = curl(&["-k", "-H", "Authorization: Bearer not-a-token"], &url);
        assert_eq!((code, body.as_str()), (401, "Unauthorized"), "{path} with a bad token");
        let (code, body) = curl(&["-k", "-H", &bearer], &url);
        assert_eq!(code, 403, "{path} with a token without RBAC: {body}");
        assert_eq!(
            body,
            format!("Forbidden (user={user}, verb=get, resource=nodes, subresource={sub})"),
            "{path}"
        );
    }
    // POST is verb create
    let (code, body) = curl(
        &["-k", "-X", "POST", "-H", &bearer],
        &format!("{base}/exec/default/{pod}/app?command=ls"),
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("verb=create"), "{body}");

    c.apply(&format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: srvauth-kubelet-api}}
rules:
- apiGroups: [""]
  resources: [nodes/proxy, nodes/stats, nodes/metrics, nodes/log]
  verbs: [get, create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: srvauth-kubelet-api}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: srvauth-kubelet-api}}
subjects:
- {{kind: ServiceAccount, name: {sa}, namespace: default}}
"#
    ));
    // every path, once the denied answers cached for each subresource have expired
    for (path, _) in &sensitive {
        wait_for(&format!("{path} to be allowed"), Duration::from_secs(30), || {
            !matches!(curl(&["-k", "-H", &bearer], &format!("{base}{path}")).0, 0 | 401 | 403)
        });
    }
    let (code, body) = curl(
        &["-k", "-H", &bearer],
        &format!("{base}/containerLogs/default/{pod}/app?tailLines=1"),
    );
    assert_eq!((code, body.trim()), (200, "tick"));

    // the API server's client certificate (X.509 v1, system:masters): through, no review
    let client = apiserver_client();
    let client: Vec<&str> = client.iter().map(String::as_str).collect();
    for (path, _) in &sensitive {
        let (code, body) = curl(&client, &format!("{base}{path}"));
        assert!(
            !matches!(code, 0 | 401 | 403),
            "{path} with the API server's certificate: {code} {body}"
        );
    }
    let (code, body) = curl(&client, &format!("{base}/pods"));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("srvauth-app"), "{body}");

    c.kubectl(&["delete", "clusterrolebinding,clusterrole", "srvauth-kubelet-api"]);
    c.kubectl(&["delete", "serviceaccount", sa]);
    c.kubectl(&["delete", "pod", pod, "--wait=false"]);
}

fn kubelet_api_is_reached_through_the_api_server_proxy() {
    let c = cluster();
    let node = c.node("srvproxy");
    let name = node.node.clone();
    run_pod(
        &node,
        "srvproxy-lines",
        "sleep 3; for i in 1 2 3 4 5; do echo line-$i; sleep 1; done",
        "Never",
    );
    wait_running("srvproxy-lines");

    // kubectl logs -f streams through the API server and ends when the container exits
    let started = Instant::now();
    let out = c
        .net
        .command("timeout")
        .args(["90", "kubectl", "logs", "-f", "srvproxy-lines"])
        .env("KUBECONFIG", &c.kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("kubectl logs -f");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kubectl logs -f: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines, ["line-1", "line-2", "line-3", "line-4", "line-5"], "{text}");
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "it followed the running container"
    );

    let raw = |path: &str| c.kubectl_ok(&["get", "--raw", &format!("/api/v1/nodes/{name}/proxy{path}")]);
    let pods: serde_json::Value = serde_json::from_str(&raw("/pods")).unwrap();
    assert_eq!(pods["kind"], "PodList");
    assert!(
        pods["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["metadata"]["name"] == "srvproxy-lines"),
        "{pods}"
    );
    let configz: serde_json::Value = serde_json::from_str(&raw("/configz")).unwrap();
    let k = &configz["kubeletconfig"];
    assert_eq!(k["authorization"]["mode"], "Webhook", "{configz}");
    assert_eq!(k["authentication"]["webhook"]["enabled"], true, "{configz}");
    assert_eq!(k["port"], 10250);
    let spec: serde_json::Value = serde_json::from_str(&raw("/spec/")).unwrap();
    assert!(spec["num_cores"].as_u64().unwrap() >= 1, "{spec}");
    assert!(spec["memory_capacity"].as_u64().unwrap() > 0, "{spec}");
    assert_eq!(raw("/healthz"), "ok");
    c.kubectl(&["delete", "pod", "srvproxy-lines", "--wait=false"]);
}

/// What a WebSocket read of a pod's log through the API server delivered: the bytes of every
/// data message in order (base64 ones decoded), how many non-empty ones there were, and how long
/// the stream lasted.
struct WsLog {
    bytes: Vec<u8>,
    messages: usize,
    took: Duration,
}

/// `GET /api/v1/namespaces/default/pods/POD/log?QUERY` on the API server over WebSocket with
/// `subprotocol` and a bearer `token`, as client-go's and the JavaScript clients' log readers
/// do, read until the server closes the stream.
fn websocket_log(pod: &str, query: &str, subprotocol: &'static str, token: &str) -> WsLog {
    use futures::StreamExt;
    use rustls::pki_types::pem::PemObject;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;

    let c = cluster();
    let api = c.apiserver.clone();
    let ca = c.ca.clone();
    let url = format!(
        "{}/api/v1/namespaces/default/pods/{pod}/log?{query}",
        api.replacen("https://", "wss://", 1)
    );
    let bearer = format!("Bearer {token}");
    // the API server listens inside the cluster's namespace: connect from a thread in it
    c.net.in_ns(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut roots = rustls::RootCertStore::empty();
            for der in rustls::pki_types::CertificateDer::pem_file_iter(&ca).expect("the cluster CA") {
                roots.add(der.unwrap()).unwrap();
            }
            let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
            let tls = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let authority = api.trim_start_matches("https://").to_string();
            let (host, _) = authority.rsplit_once(':').expect("host:port");
            let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
            let tcp = tokio::net::TcpStream::connect(&authority)
                .await
                .expect("the API server");
            let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls))
                .connect(name, tcp)
                .await
                .expect("TLS to the API server");
            let mut req = url.as_str().into_client_request().unwrap();
            req.headers_mut().insert("Authorization", bearer.parse().unwrap());
            req.headers_mut()
                .insert("Sec-WebSocket-Protocol", subprotocol.parse().unwrap());
            let started = Instant::now();
            let (mut ws, answer) = tokio_tungstenite::client_async(req, stream)
                .await
                .unwrap_or_else(|e| panic!("WebSocket handshake for {url}: {e}"));
            assert_eq!(
                answer
                    .headers()
                    .get("Sec-WebSocket-Protocol")
                    .map(|v| v.to_str().unwrap()),
                Some(subprotocol),
                "{answer:?}"
            );
            let mut out = WsLog {
                bytes: Vec::new(),
                messages: 0,
                took: Duration::ZERO,
            };
            let read = async {
                while let Some(m) = ws.next().await {
                    match m.unwrap_or_else(|e| panic!("reading {url}: {e}")) {
                        // the API server's first message is an empty one (its ping)
                        Message::Binary(b) if b.is_empty() => {}
                        Message::Text(t) if t.is_empty() => {}
                        Message::Binary(b) => {
                            out.messages += 1;
                            out.bytes.extend_from_slice(&b);
                        }
                        Message::Text(t) => {
                            use base64::Engine;
                            out.messages += 1;
                            let b = base64::engine::general_purpose::STANDARD
                                .decode(t.as_str())
                                .unwrap_or_else(|e| panic!("{subprotocol} message {t:?}: {e}"));
                            out.bytes.extend_from_slice(&b);
                        }
                        Message::Close(_) => break,
                        _ => {}
                    }
                }
            };
            tokio::time::timeout(Duration::from_secs(90), read)
                .await
                .unwrap_or_else(|_| panic!("{url}: the stream did not end in 90 s"));
            out.took = started.elapsed();
            out
        })
    })
}

/// A pod's log read through the API server over WebSocket, with each of the API server's
/// subprotocols for it, delivers the container's lines (kubelet's /containerLogs answer
/// wrapped by the API server into WebSocket messages); with follow=true it streams the lines
/// of a running container as they come and ends when the container exits.
fn container_logs_over_websocket_through_the_api_server() {
    let c = cluster();
    let node = c.node("srvws");
    run_pod(
        &node,
        "srvws-lines",
        "for i in 1 2 3; do echo ws-line-$i; done; sleep 3600",
        "Always",
    );
    run_pod(
        &node,
        "srvws-follow",
        "sleep 4; for i in 1 2 3 4 5; do echo follow-$i; sleep 1; done",
        "Never",
    );
    c.apply(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: srvws-reader, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: srvws-pod-logs}
rules:
- {apiGroups: [""], resources: [pods, pods/log], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: srvws-pod-logs}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: srvws-pod-logs}
subjects:
- {kind: ServiceAccount, name: srvws-reader, namespace: default}
"#,
    );
    let token = c.kubectl_ok(&["create", "token", "srvws-reader"]).trim().to_string();
    wait_running("srvws-follow");

    // follow first, while the container still sleeps before its lines
    let followed = websocket_log("srvws-follow", "container=app&follow=true", "binary.k8s.io", &token);
    assert_eq!(
        String::from_utf8_lossy(&followed.bytes),
        "follow-1\nfollow-2\nfollow-3\nfollow-4\nfollow-5\n"
    );
    assert!(
        followed.took >= Duration::from_secs(3),
        "it followed the running container: {:?}",
        followed.took
    );
    assert!(followed.messages >= 2, "the lines came as they were written");

    wait_running("srvws-lines");
    let want = "ws-line-1\nws-line-2\nws-line-3\n";
    wait_for("the lines in kubectl logs", Duration::from_secs(30), || {
        c.kubectl(&["logs", "srvws-lines"]).stdout == want.as_bytes()
    });
    for subprotocol in ["binary.k8s.io", "base64.binary.k8s.io"] {
        let got = websocket_log("srvws-lines", "container=app", subprotocol, &token);
        assert_eq!(String::from_utf8_lossy(&got.bytes), want, "{subprotocol}");
        let got = websocket_log("srvws-lines", "container=app&tailLines=1", subprotocol, &token);
        assert_eq!(String::from_utf8_lossy(&got.bytes), "ws-line-3\n", "{subprotocol}");
    }

    c.kubectl(&["delete", "clusterrolebinding,clusterrole", "srvws-pod-logs"]);
    c.kubectl(&["delete", "serviceaccount", "srvws-reader"]);
    c.kubectl(&["delete", "pod", "srvws-lines", "srvws-follow", "--wait=false"]);
}

fn serving_certificate_is_requested_and_served_once_approved() {
    let c = cluster();
    let kc = c.node_kubeconfig("node-srvboot");
    let node = c.node_with(
        "srvboot",
        &["--kubeconfig", kc.to_str().unwrap()],
        "serverTLSBootstrap: true\n",
    );
    let user = format!("system:node:{}", node.node);
    // the request, from the node's own credential, for the kubelet-serving signer
    let csr = pending_serving_csr(&user);
    let base = format!("https://{}:10250", node_ip(&node));
    let ca = c.ca.display().to_string();
    // no certificate yet: handshakes fail
    assert_eq!(curl(&["--cacert", &ca], &format!("{base}/healthz")).0, 0);
    c.kubectl_ok(&["certificate", "approve", &csr]);
    // the served certificate is the cluster's, for the node's address (curl checks both)
    wait_for("the issued certificate to be served", Duration::from_secs(60), || {
        curl(&["--cacert", &ca], &format!("{base}/healthz")).0 == 401
    });
    let current = node.root.join("pki/kubelet-server-current.pem");
    assert!(std::fs::symlink_metadata(&current).unwrap().file_type().is_symlink());
    let target = std::fs::read_link(&current).unwrap();
    assert!(
        target.to_string_lossy().starts_with("kubelet-server-"),
        "{}",
        target.display()
    );
    // and kept across a restart (no new request)
    let mut node = node;
    node.restart();
    wait_for(
        "the stored certificate after a restart",
        Duration::from_secs(60),
        || curl(&["--cacert", &ca], &format!("{base}/healthz")).0 == 401,
    );
    let list = c.get_json(&["csr"]).unwrap();
    let requests = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["spec"]["signerName"] == "kubernetes.io/kubelet-serving" && r["spec"]["username"] == user.as_str()
        })
        .count();
    assert_eq!(requests, 1, "the stored certificate is reused");
}

/// Wait for a pending kubelet-serving request from `user` and return its name (its usages
/// checked).
fn pending_serving_csr(user: &str) -> String {
    let c = cluster();
    let mut csr = String::new();
    c.wait("a serving certificate request", Duration::from_secs(60), || {
        let list = c.get_json(&["csr"]).unwrap();
        if let Some(r) = list["items"].as_array().unwrap().iter().find(|r| {
            r["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
                && r["spec"]["username"] == user
                && r["status"]["conditions"].is_null()
        }) {
            csr = r["metadata"]["name"].as_str().unwrap().to_string();
            assert_eq!(
                r["spec"]["usages"],
                serde_json::json!(["digital signature", "key encipherment", "server auth"])
            );
            return true;
        }
        false
    });
    csr
}

/// The serial number of the certificate served at `ip:10250` (empty when none is).
fn served_serial(ip: &str) -> String {
    let out = cluster()
        .net
        .command("sh")
        .arg("-c")
        .arg(format!(
            "openssl s_client -connect {ip}:10250 </dev/null 2>/dev/null | openssl x509 -noout -serial"
        ))
        .output()
        .expect("openssl s_client");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn serving_certificate_rotates_without_a_restart() {
    let c = cluster();
    let kc = c.node_kubeconfig("node-srvrot");
    // every certificate is renewed 5 s after it comes into use
    let node = c.node_with_env(
        "srvrot",
        &["--kubeconfig", kc.to_str().unwrap()],
        "serverTLSBootstrap: true\n",
        vec![("FERROLET_TEST_ROTATE_CERT_AFTER".into(), "5".into())],
    );
    let user = format!("system:node:{}", node.node);
    let ip = node_ip(&node);
    c.kubectl_ok(&["certificate", "approve", &pending_serving_csr(&user)]);
    let mut first = String::new();
    wait_for("the first certificate served", Duration::from_secs(60), || {
        first = served_serial(&ip);
        first.starts_with("serial=")
    });
    // the renewal asks again; once approved the new certificate is served by the same process
    let pid = node.pid();
    c.kubectl_ok(&["certificate", "approve", &pending_serving_csr(&user)]);
    wait_for("the renewed certificate served", Duration::from_secs(60), || {
        let now = served_serial(&ip);
        now.starts_with("serial=") && now != first
    });
    assert_eq!(node.pid(), pid);
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "no restart");
}
