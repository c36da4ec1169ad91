//! `Kube::connect` against a real control plane (../shared/k8s/control-plane, started in a
//! network namespace of this test's own): a node with only the bootstrap kubeconfig gets its
//! client certificate through an auto-approved CSR, writes its pem and kubeconfig as kubelet
//! does, rotates the certificate (the rotation wait shortened by the test knob) and keeps
//! talking to the API server as itself; a second start uses the written kubeconfig; waiting
//! for a certificate ends with a clear error on a denial or at the time limit.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::net::TestNet;
use ferrolet::kubeclient::csr;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};

const NODE: &str = "boot-node";

/// The control plane, stopped and removed when dropped.
struct ControlPlane {
    net: TestNet,
    script: PathBuf,
    dir: PathBuf,
    admin: PathBuf,
    bootstrap: PathBuf,
}

impl ControlPlane {
    fn start() -> Option<ControlPlane> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/k8s/control-plane");
        if !script.exists() {
            eprintln!("\n!!! SKIPPING kube_connect: ../shared/k8s/control-plane is missing in this checkout !!!\n");
            return None;
        }
        let net = TestNet::create("kubeconnect");
        let dir = net.dir.join("control-plane");
        let out = net
            .command("bash")
            .arg(&script)
            .arg("start")
            .arg(&dir)
            .output()
            .unwrap();
        let cp = ControlPlane {
            admin: dir.join("admin.kubeconfig"),
            bootstrap: dir.join("bootstrap.kubeconfig"),
            net,
            script,
            dir,
        };
        assert!(
            out.status.success(),
            "control-plane start failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let env = String::from_utf8_lossy(&out.stdout).into_owned();
        let get = |k: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .map(|v| PathBuf::from(v.trim_matches(|c| c == '"' || c == '\'')))
                .unwrap_or_else(|| panic!("control-plane start printed no {k}:\n{env}"))
        };
        let (admin, bootstrap) = (get("KUBECONFIG"), get("K8S_BOOTSTRAP_KUBECONFIG"));
        let mut cp = cp;
        cp.admin = admin;
        cp.bootstrap = bootstrap;
        Some(cp)
    }

    fn kubectl(&self, args: &[&str]) -> String {
        let out = self
            .net
            .command("kubectl")
            .arg("--kubeconfig")
            .arg(&self.admin)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The CSRs as (name, requestor, approved, has a certificate).
    fn csrs(&self) -> Vec<(String, String, bool, bool)> {
        let v: serde_json::Value = serde_json::from_str(&self.kubectl(&["get", "csr", "-o", "json"])).unwrap();
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let approved = c["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|x| x["type"] == "Approved"));
                (
                    c["metadata"]["name"].as_str().unwrap_or("").to_string(),
                    c["spec"]["username"].as_str().unwrap_or("").to_string(),
                    approved,
                    c["status"]["certificate"].as_str().is_some_and(|s| !s.is_empty()),
                )
            })
            .collect()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self
            .net
            .command("bash")
            .arg(&self.script)
            .arg("stop")
            .arg(&self.dir)
            .output();
    }
}

fn config(root: &Path, bootstrap: Option<&Path>) -> ferrolet::config::Config {
    let mut cfg = ferrolet::config::Config {
        node_name: NODE.into(),
        root_dir: root.join("root"),
        ..Default::default()
    };
    cfg.cluster.kubeconfig = Some(root.join("etc/kubelet.conf"));
    cfg.cluster.bootstrap_kubeconfig = bootstrap.map(Path::to_path_buf);
    cfg.cluster.rotate_certificates = true;
    cfg
}

/// Wait until `f` holds, or fail naming `what`.
async fn until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[test]
fn bootstrap_then_rotation_against_a_real_api_server() {
    let Some(cp) = ControlPlane::start() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let root = work.path().to_path_buf();
    let bootstrap = cp.bootstrap.clone();
    // each certificate is renewed 3 s after it comes into use
    std::env::set_var("FERROLET_TEST_ROTATE_CERT_AFTER", "3");
    let cp = std::sync::Arc::new(cp);
    let cp2 = cp.clone();
    cp.net.in_ns(move || {
        let cp = cp2;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let cfg = config(&root, Some(&bootstrap));
            let pki = cfg.root_dir.join("pki");
            let current = pki.join("kubelet-client-current.pem");
            let kube = ferrolet::kubeclient::Kube::connect(&cfg).await.expect("Kube::connect");

            // the bootstrap: an approved, issued CSR from the bootstrap token
            let csrs = cp.csrs();
            let boot: Vec<_> = csrs.iter().filter(|c| c.0.starts_with("node-csr-")).collect();
            assert_eq!(boot.len(), 1, "{csrs:?}");
            assert!(boot[0].1.starts_with("system:bootstrap:"), "{csrs:?}");
            assert!(boot[0].2 && boot[0].3, "approved and issued: {csrs:?}");
            // the pem (0600) behind the current link, and the kubeconfig pointing at the link
            use std::os::unix::fs::PermissionsExt;
            let first = std::fs::read_link(&current).expect("kubelet-client-current.pem link");
            let mode = std::fs::metadata(&current).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            let kc = std::fs::read_to_string(cfg.cluster.kubeconfig.as_ref().unwrap()).unwrap();
            assert!(
                kc.contains(&format!("client-certificate: {}", current.display())),
                "{kc}"
            );
            assert!(!pki.join("kubelet-client.key.tmp").exists(), "the pending key is gone");

            // the node acts as itself: NodeRestriction lets system:node:boot-node create its Node
            let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": NODE}})).unwrap();
            Api::<Node>::all(kube.client())
                .create(&PostParams::default(), &node)
                .await
                .expect("creating its own Node with the bootstrapped credential");
            let other: Node =
                serde_json::from_value(serde_json::json!({"metadata": {"name": "someone-else"}})).unwrap();
            let err = Api::<Node>::all(kube.client())
                .create(&PostParams::default(), &other)
                .await
                .expect_err("a node may not create another node");
            assert!(matches!(err, kube::Error::Api(ref s) if s.code == 403), "{err}");

            // the rotation: a CSR requested by the node itself, a new pem behind the link
            until("a rotated certificate", Duration::from_secs(60), || {
                std::fs::read_link(&current).is_ok_and(|l| l != first)
            })
            .await;
            let csrs = cp.csrs();
            let renewals: Vec<_> = csrs.iter().filter(|c| c.0.starts_with("csr-")).collect();
            assert!(!renewals.is_empty(), "{csrs:?}");
            assert!(
                renewals
                    .iter()
                    .all(|c| c.1 == format!("system:node:{NODE}") && c.2 && c.3),
                "renewals requested by the node itself, approved, issued: {csrs:?}"
            );
            // and the node still talks to the API server, on the swapped client
            tokio::time::sleep(Duration::from_secs(1)).await;
            let got = Api::<Node>::all(kube.client())
                .get(NODE)
                .await
                .expect("reading its Node after rotation");
            assert_eq!(got.metadata.name.as_deref(), Some(NODE));
            drop(kube);

            // a restart without the bootstrap kubeconfig uses the written one, asking nothing
            // (the dropped handle's rotation ends at its next wake-up)
            std::env::remove_var("FERROLET_TEST_ROTATE_CERT_AFTER");
            tokio::time::sleep(Duration::from_secs(4)).await;
            let before = cp.csrs().len();
            let kube = ferrolet::kubeclient::Kube::connect(&config(&root, None))
                .await
                .expect("Kube::connect with the written kubeconfig");
            Api::<Node>::all(kube.client())
                .get(NODE)
                .await
                .expect("reading its Node after a restart");
            assert_eq!(
                cp.csrs().len(),
                before,
                "no new request on a restart with a valid kubeconfig"
            );

            // waiting ends with a clear error: a request nobody approves times out, a denied
            // one fails with the denial (a node asking for a subject not its own is never
            // auto-approved; the admin kubeconfig's X.509 v1 certificate is one rustls refuses)
            let key = csr::new_key().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.distinguished_name.push(rcgen::DnType::CommonName, "not-a-node");
            let pem = params.serialize_request(&key).unwrap().pem().unwrap();
            let err = csr::request_certificate(kube.client(), Some("stays-pending"), &pem, Duration::from_secs(2))
                .await
                .unwrap_err();
            let msg = format!("{err:#}");
            assert!(
                msg.contains("stays-pending") && msg.contains("no certificate issued within 2s"),
                "{msg}"
            );
            let deny = {
                let cp = cp.clone();
                async move {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    tokio::task::spawn_blocking(move || cp.kubectl(&["certificate", "deny", "gets-denied"]))
                        .await
                        .unwrap();
                }
            };
            let wait = csr::request_certificate(kube.client(), Some("gets-denied"), &pem, Duration::from_secs(60));
            let (res, ()) = tokio::join!(wait, deny);
            let msg = format!("{:#}", res.unwrap_err());
            assert!(
                msg.contains("gets-denied") && msg.contains("certificate signing request is denied"),
                "{msg}"
            );
        });
    });
}

#[test]
fn neither_kubeconfig_usable_is_an_error_naming_both_flags() {
    let work = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt
        .block_on(ferrolet::kubeclient::Kube::connect(&config(
            work.path(),
            Some(&work.path().join("missing-bootstrap.kubeconfig")),
        )))
        .err()
        .expect("no usable kubeconfig");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("--kubeconfig") && msg.contains("--bootstrap-kubeconfig"),
        "{msg}"
    );
    assert!(msg.contains("missing-bootstrap.kubeconfig"), "{msg}");
}
