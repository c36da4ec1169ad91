//! The node's credential from the bootstrap token (kubelet's TLS bootstrapping and certificate
//! rotation): an agent started with only `--bootstrap-kubeconfig` and a `--kubeconfig` that
//! does not exist yet gets an auto-approved CSR, writes its pem and kubeconfig as kubelet does,
//! renews the certificate with its own credential (the wait shortened by the test knob) and
//! keeps working with the API server afterwards. In-process, `Kube::connect` acts as the node
//! (NodeRestriction holds it to its own Node), a restart uses the written kubeconfig without
//! asking again, and waiting for a certificate ends clearly on a denial or at the time limit.

use std::path::Path;
use std::time::Duration;

use ferrolet::kubeclient::{csr, Kube};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use libtest_mimic::Trial;

use crate::common::IMAGE;
use crate::{cluster, test};

pub fn tests() -> Vec<Trial> {
    vec![
        test(
            "bootstrap_token_to_rotated_node_certificate",
            bootstrap_token_to_rotated_node_certificate,
        ),
        test(
            "connect_bootstraps_restarts_and_reports_refused_requests",
            connect_bootstraps_restarts_and_reports_refused_requests,
        ),
        test(
            "install_joins_with_a_bootstrap_token_and_a_ca_hash",
            install_joins_with_a_bootstrap_token_and_a_ca_hash,
        ),
    ]
}

/// `ferrolet ARGS` run inside the cluster's network namespace.
fn ferrolet_in_cluster(args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ferrolet"));
    cmd.args(args);
    crate::common::enter_netns(&mut cmd, &cluster().net.path);
    cmd.output().expect("running ferrolet")
}

/// The README's three steps against the real control plane: what `kubeadm init` publishes
/// (kube-public/cluster-info, readable anonymously, signed by the bootstrap signer), the token
/// and the CA's hash a person copies from `kubeadm token create --print-join-command`, and
/// `ferrolet install --bootstrap-token --server --ca-cert-hash` (staged with --destdir) giving
/// a node that registers and goes Ready. A wrong hash or token is refused before anything is
/// written.
fn install_joins_with_a_bootstrap_token_and_a_ca_hash() {
    let c = cluster();
    let ca_pem = std::fs::read(&c.ca).unwrap();
    let ca_b64 = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(&ca_pem)
    };
    c.apply(&format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: cluster-info, namespace: kube-public}}
data:
  kubeconfig: |
    apiVersion: v1
    kind: Config
    clusters:
    - name: ""
      cluster:
        certificate-authority-data: {ca_b64}
        server: {server}
    contexts: []
    users: []
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: "kubeadm:bootstrap-signer-clusterinfo", namespace: kube-public}}
rules: [{{apiGroups: [""], resources: [configmaps], resourceNames: [cluster-info], verbs: [get]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: "kubeadm:bootstrap-signer-clusterinfo", namespace: kube-public}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: "kubeadm:bootstrap-signer-clusterinfo"}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:anonymous"}}]
"#,
        server = c.apiserver
    ));
    // The token is the bootstrap kubeconfig's; the hash is what kubeadm prints, made here
    // with openssl as its documentation does.
    let bootstrap = std::fs::read_to_string(&c.bootstrap_kubeconfig).unwrap();
    let token = bootstrap
        .split("token: ")
        .nth(1)
        .and_then(|rest| rest.trim_start_matches('"').split(['"', '}', '\n']).next())
        .expect("a token in the bootstrap kubeconfig")
        .trim()
        .to_string();
    let token_id = token.split('.').next().unwrap().to_string();
    c.wait(
        "the bootstrap signer's signature of cluster-info",
        Duration::from_secs(60),
        || {
            c.get_json(&["configmap", "-n", "kube-public", "cluster-info"])
                .is_some_and(|cm| cm["data"][format!("jws-kubeconfig-{token_id}")].is_string())
        },
    );
    let hash = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -pubkey -noout -in {} | openssl pkey -pubin -outform der | openssl dgst -sha256 -hex | sed 's/^.* //'",
            c.ca.display()
        ))
        .output()
        .unwrap();
    let hash = format!("sha256:{}", String::from_utf8_lossy(&hash.stdout).trim());
    assert_eq!(hash.len(), 7 + 64, "{hash}");

    let dest = tempfile::tempdir().unwrap();
    let d = dest.path().to_str().unwrap();
    let join = |token: &str, hash: &str| {
        ferrolet_in_cluster(&[
            "install",
            "--destdir",
            d,
            "--no-start",
            "--bootstrap-token",
            token,
            "--server",
            &c.apiserver,
            "--ca-cert-hash",
            hash,
        ])
    };
    // Refused: a CA of another cluster, a token the cluster does not sign with.
    let wrong_hash = format!("sha256:{}", "0".repeat(64));
    let out = join(&token, &wrong_hash);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("refusing to trust it"), "{err}");
    let wrong_secret = format!("{token_id}.0000000000000000");
    let out = join(&wrong_secret, &hash);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("does not verify"), "{err}");
    assert!(
        !dest.path().join("etc").exists(),
        "nothing is written before the cluster is trusted"
    );

    let out = join(&token, &hash);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let etc = dest.path().join("etc/ferrolet");
    assert_eq!(std::fs::read(etc.join("pki/ca.crt")).unwrap(), ca_pem);
    let unit = std::fs::read_to_string(dest.path().join("etc/systemd/system/ferrolet.service")).unwrap();
    assert!(
        unit.contains("--bootstrap-kubeconfig /etc/ferrolet/bootstrap-kubeconfig"),
        "{unit}"
    );
    use std::os::unix::fs::PermissionsExt;
    let kc = etc.join("bootstrap-kubeconfig");
    assert_eq!(std::fs::metadata(&kc).unwrap().permissions().mode() & 0o777, 0o600);

    // The node the installed files make: its TLS bootstrap from the written kubeconfig, then
    // Ready in the API server.
    let state = tempfile::tempdir().unwrap();
    let node_kc = state.path().join("kubeconfig");
    let node = c.node_with(
        "joined",
        &[
            "--bootstrap-kubeconfig",
            kc.to_str().unwrap(),
            "--kubeconfig",
            node_kc.to_str().unwrap(),
        ],
        "",
    );
    c.wait("the joined node Ready", Duration::from_secs(90), || {
        c.get_json(&["node", &node.node]).is_some_and(|n| {
            n["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|x| x["type"] == "Ready" && x["status"] == "True"))
        })
    });
}

/// The CSRs as (name, requesting user, approved and issued).
fn csrs() -> Vec<(String, String, bool)> {
    let v = cluster().get_json(&["csr"]).expect("listing CSRs");
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let approved = c["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|x| x["type"] == "Approved"));
            let issued = c["status"]["certificate"].as_str().is_some_and(|s| !s.is_empty());
            (
                c["metadata"]["name"].as_str().unwrap_or("").to_string(),
                c["spec"]["username"].as_str().unwrap_or("").to_string(),
                approved && issued,
            )
        })
        .collect()
}

fn bootstrap_token_to_rotated_node_certificate() {
    let c = cluster();
    let etc = tempfile::tempdir().unwrap();
    let kubeconfig = etc.path().join("kubelet.conf");
    let before: Vec<String> = csrs().into_iter().map(|c| c.0).collect();
    let node = c.node_with_env(
        "boot",
        &[
            "--bootstrap-kubeconfig",
            c.bootstrap_kubeconfig.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ],
        "",
        vec![("FERROLET_TEST_ROTATE_CERT_AFTER".into(), "6".into())],
    );
    let user = format!("system:node:{}", node.node);
    let current = node.root.join("pki/kubelet-client-current.pem");

    // the bootstrap: a request from the bootstrap token, approved and issued
    c.wait("the node's bootstrap CSR to be issued", Duration::from_secs(60), || {
        csrs().iter().any(|(n, u, ok)| {
            !before.contains(n) && n.starts_with("node-csr-") && u.starts_with("system:bootstrap:") && *ok
        })
    });
    c.wait("the node kubeconfig to be written", Duration::from_secs(30), || {
        kubeconfig.exists()
    });
    let first = std::fs::read_link(&current).expect("kubelet-client-current.pem is a link");
    assert!(first.to_string_lossy().starts_with("kubelet-client-20"), "{first:?}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&current).unwrap().permissions().mode() & 0o777, 0o600);
    let kc = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(
        kc.contains(&format!("client-certificate: {}", current.display())),
        "{kc}"
    );
    assert!(kc.contains(&format!("client-key: {}", current.display())), "{kc}");

    // the rotation: a request by the node itself, a new pem behind the link
    c.wait("a rotated certificate", Duration::from_secs(60), || {
        std::fs::read_link(&current).is_ok_and(|l| l != first)
    });
    let all = csrs();
    assert!(
        all.iter()
            .any(|(n, u, ok)| !before.contains(n) && n.starts_with("csr-") && *u == user && *ok),
        "a renewal requested as {user}, approved and issued: {all:?}"
    );

    // still talking to the API server: a pod bound to the node runs and its status comes back
    c.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: after-rotation, namespace: default}}
spec:
  nodeName: {node}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {IMAGE}
    command: [sh, -c, "while true; do sleep 1; done"]
"#,
        node = node.node
    ));
    c.wait("the pod to run as the API shows it", Duration::from_secs(60), || {
        c.get_json(&["pod", "after-rotation"])
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });
    c.kubectl_ok(&["delete", "pod", "after-rotation", "--wait=false"]);
    c.wait("the pod object to disappear", Duration::from_secs(60), || {
        c.get_json(&["pod", "after-rotation"]).is_none()
    });
    assert!(
        !node.agent_log().contains("rotating the client certificate failed"),
        "{}",
        node.agent_log()
    );
}

/// Cluster-mode settings for an in-process node `name` with its files under `dir`.
fn node_config(dir: &Path, name: &str, bootstrap: Option<&Path>) -> ferrolet::config::Config {
    let mut cfg = ferrolet::config::Config {
        node_name: name.into(),
        root_dir: dir.join("root"),
        ..Default::default()
    };
    cfg.cluster.kubeconfig = Some(dir.join("etc/kubelet.conf"));
    cfg.cluster.bootstrap_kubeconfig = bootstrap.map(Path::to_path_buf);
    cfg
}

fn connect_bootstraps_restarts_and_reports_refused_requests() {
    let c = cluster();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().to_path_buf();
    // the API server is reached from a thread inside the cluster's namespace
    c.net.in_ns(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(connect_in_namespace(&dir));
    });
}

async fn connect_in_namespace(dir: &Path) {
    let c = cluster();
    let name = "node-inproc";
    let cfg = node_config(dir, name, Some(&c.bootstrap_kubeconfig));
    let kube = Kube::connect(&cfg)
        .await
        .expect("Kube::connect with the bootstrap kubeconfig");
    assert!(cfg.root_dir.join("pki/kubelet-client-current.pem").exists());
    assert!(
        !cfg.root_dir.join("pki/kubelet-client.key.tmp").exists(),
        "the pending key is gone once the certificate is stored"
    );

    // the credential is the node's: NodeRestriction lets it create its own Node, no other
    let node_obj = |n: &str| -> Node { serde_json::from_value(serde_json::json!({"metadata": {"name": n}})).unwrap() };
    let nodes = Api::<Node>::all(kube.client());
    nodes
        .create(&PostParams::default(), &node_obj(name))
        .await
        .expect("creating its own Node");
    let err = nodes
        .create(&PostParams::default(), &node_obj("someone-else"))
        .await
        .expect_err("a node may not create another node");
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 403), "{err}");
    drop(kube);

    // a restart on the written kubeconfig, without the bootstrap one, asks for nothing
    // (other tests on the shared cluster request certificates meanwhile: count this node's only;
    // without a bootstrap kubeconfig, a request could only come as the node itself)
    let user = format!("system:node:{name}");
    let before: Vec<String> = csrs().into_iter().map(|c| c.0).collect();
    let kube = Kube::connect(&node_config(dir, name, None))
        .await
        .expect("Kube::connect with the written kubeconfig");
    Api::<Node>::all(kube.client())
        .get(name)
        .await
        .expect("reading its Node after a restart");
    let asked: Vec<_> = csrs()
        .into_iter()
        .filter(|(n, u, _)| !before.contains(n) && *u == user)
        .collect();
    assert!(asked.is_empty(), "no new request with a valid kubeconfig: {asked:?}");

    // waiting ends with a clear error: a request nobody approves times out, a denied one fails
    // with the denial (a node asking for a name not its own is never auto-approved)
    let key = csr::new_key().unwrap();
    let pem = csr::node_request("not-this-node", &key).unwrap();
    let err = csr::request_certificate(kube.client(), Some("inproc-pending"), &pem, Duration::from_secs(2))
        .await
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("inproc-pending") && msg.contains("no certificate issued within 2s"),
        "{msg}"
    );
    let deny = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        tokio::task::spawn_blocking(|| cluster().kubectl_ok(&["certificate", "deny", "inproc-denied"]))
            .await
            .unwrap();
    };
    let wait = csr::request_certificate(kube.client(), Some("inproc-denied"), &pem, Duration::from_secs(60));
    let (res, ()) = tokio::join!(wait, deny);
    let msg = format!("{:#}", res.unwrap_err());
    assert!(
        msg.contains("inproc-denied") && msg.contains("certificate signing request is denied"),
        "{msg}"
    );
}
