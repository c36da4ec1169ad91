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
    ]
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
