//! The kubelet API's listeners on a standalone node (docs/server.md): 10250-style TLS with a
//! self-signed certificate kept under the root dir, client certificates verified against
//! clientCAFile (an X.509 v1 one, as the control plane's openssl makes them), anonymous
//! requests refused, and the plain healthz port. Requests are made with curl.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// `curl` a URL; returns (status, body).
fn curl(args: &[&str], url: &str) -> (u16, String) {
    common::curl_with(Command::new("curl"), args, url)
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a v1 client certificate for `cn` in group `o`, as the control plane makes them.
fn client_pki(dir: &Path, cn: &str, o: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=test-ca",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "client.key",
            "-out",
            "client.csr",
            "-subj",
            &format!("/O={o}/CN={cn}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "client.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "client.crt",
            "-days",
            "1",
        ],
    );
    // a certificate from a CA the node does not trust
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "other.key",
            "-out",
            "other.crt",
            "-days",
            "1",
            "-subj",
            &format!("/O={o}/CN={cn}"),
        ],
    );
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// KubeletConfiguration (kubelet.config.k8s.io/v1beta1) as kubelet's Go types decode it, for
/// the fields ferrolet's /configz prints: a client that decodes /configz with kubelet's types
/// (the upstream e2e framework does) fails on `50.0` where the type is an int32. Unknown
/// fields are ignored, as Go's decoder does; every type is kubelet's.
#[allow(dead_code)]
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct KubeletConfigurationV1beta1 {
    enable_server: Option<bool>,
    static_pod_path: Option<String>,
    #[serde(rename = "staticPodURL")]
    static_pod_url: Option<String>,
    sync_frequency: Option<String>,
    file_check_frequency: Option<String>,
    http_check_frequency: Option<String>,
    address: Option<String>,
    port: Option<i32>,
    read_only_port: Option<i32>,
    tls_cert_file: Option<String>,
    tls_private_key_file: Option<String>,
    tls_min_version: Option<String>,
    rotate_certificates: Option<bool>,
    #[serde(rename = "serverTLSBootstrap")]
    server_tls_bootstrap: Option<bool>,
    authentication: Option<V1beta1Authentication>,
    authorization: Option<V1beta1Authorization>,
    healthz_port: Option<i32>,
    healthz_bind_address: Option<String>,
    cluster_domain: Option<String>,
    #[serde(rename = "clusterDNS")]
    cluster_dns: Option<Vec<String>>,
    allowed_unsafe_sysctls: Option<Vec<String>>,
    cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    cgroups_per_qos: Option<bool>,
    cgroup_driver: Option<String>,
    max_pods: Option<i32>,
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<String>,
    pod_pids_limit: Option<i64>,
    resolv_conf: Option<String>,
    runtime_request_timeout: Option<String>,
    pod_logs_dir: Option<String>,
    container_log_max_size: Option<String>,
    container_log_max_files: Option<i32>,
    seccomp_default: Option<bool>,
    system_reserved: Option<std::collections::BTreeMap<String, String>>,
    kube_reserved: Option<std::collections::BTreeMap<String, String>>,
    eviction_hard: Option<std::collections::BTreeMap<String, String>>,
    eviction_soft: Option<std::collections::BTreeMap<String, String>>,
    eviction_soft_grace_period: Option<std::collections::BTreeMap<String, String>>,
    eviction_minimum_reclaim: Option<std::collections::BTreeMap<String, String>>,
    eviction_pressure_transition_period: Option<String>,
    eviction_max_pod_grace_period: Option<i32>,
    register_node: Option<bool>,
    register_with_taints: Option<Vec<k8s_openapi::api::core::v1::Taint>>,
    node_status_update_frequency: Option<String>,
    node_status_report_frequency: Option<String>,
    node_lease_duration_seconds: Option<i32>,
    #[serde(rename = "kubeAPIQPS")]
    kube_api_qps: Option<i32>,
    #[serde(rename = "kubeAPIBurst")]
    kube_api_burst: Option<i32>,
    #[serde(rename = "eventRecordQPS")]
    event_record_qps: Option<i32>,
    event_burst: Option<i32>,
    crash_loop_back_off: Option<V1beta1CrashLoopBackOff>,
    qos_reserved: Option<std::collections::BTreeMap<String, String>>,
    #[serde(rename = "cpuCFSQuota")]
    cpu_cfs_quota: Option<bool>,
    #[serde(rename = "cpuCFSQuotaPeriod")]
    cpu_cfs_quota_period: Option<String>,
    enforce_node_allocatable: Option<Vec<String>>,
    system_reserved_cgroup: Option<String>,
    kube_reserved_cgroup: Option<String>,
    oom_score_adj: Option<i32>,
    #[serde(rename = "singleProcessOOMKill")]
    single_process_oom_kill: Option<bool>,
    container_log_max_workers: Option<i32>,
    container_log_monitor_interval: Option<String>,
    serialize_image_pulls: Option<bool>,
    max_parallel_image_pulls: Option<i32>,
    #[serde(rename = "registryPullQPS")]
    registry_pull_qps: Option<i32>,
    registry_burst: Option<i32>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    image_gc_high_threshold_percent: Option<i32>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    image_gc_low_threshold_percent: Option<i32>,
    #[serde(rename = "imageMinimumGCAge")]
    image_minimum_gc_age: Option<String>,
    #[serde(rename = "imageMaximumGCAge")]
    image_maximum_gc_age: Option<String>,
    node_status_max_images: Option<i32>,
}

#[allow(dead_code)]
#[derive(Debug, serde::Deserialize)]
struct V1beta1Authentication {
    x509: Option<V1beta1X509>,
    webhook: Option<V1beta1AuthnWebhook>,
    anonymous: Option<V1beta1Anonymous>,
}

#[allow(dead_code)]
#[derive(Debug, serde::Deserialize)]
struct V1beta1X509 {
    #[serde(rename = "clientCAFile")]
    client_ca_file: Option<String>,
}

#[allow(dead_code)]
#[derive(Debug, serde::Deserialize)]
struct V1beta1AuthnWebhook {
    enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    cache_ttl: Option<String>,
}

#[allow(dead_code)]
#[derive(Debug, serde::Deserialize)]
struct V1beta1Anonymous {
    enabled: Option<bool>,
}

#[allow(dead_code)]
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct V1beta1Authorization {
    mode: Option<String>,
    webhook: Option<V1beta1AuthzWebhook>,
}

#[allow(dead_code)]
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct V1beta1AuthzWebhook {
    cache_authorized_ttl: Option<String>,
    cache_unauthorized_ttl: Option<String>,
}

#[allow(dead_code)]
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct V1beta1CrashLoopBackOff {
    max_container_restart_period: Option<String>,
}

#[test]
fn tls_port_with_client_certificates_and_the_healthz_port() {
    let pki = tempfile::tempdir().unwrap();
    client_pki(pki.path(), "kube-apiserver-kubelet-client", "system:masters");
    let (port, healthz) = (free_port(), free_port());
    let config = format!(
        "port: {port}\nhealthzPort: {healthz}\nauthentication:\n  x509:\n    clientCAFile: {}\n",
        pki.path().join("ca.crt").display()
    );
    let mut a = Agent::start_with_config("server", &[], &config);
    a.write("web.yaml", &pod_yaml("web", "Always", "echo hello-10250; sleep 3600"));
    a.wait_phase("web", "Running", Duration::from_secs(30));

    let health = format!("http://127.0.0.1:{healthz}/healthz");
    wait_until("healthz", Duration::from_secs(20), || {
        curl(&[], &health) == (200, "ok".into())
    });
    // the healthz port serves /healthz only
    assert_eq!(curl(&[], &format!("http://127.0.0.1:{healthz}/pods")).0, 404);

    let base = format!("https://localhost:{port}");
    let served = a.root.join("pki/kubelet.crt");
    assert!(
        served.exists(),
        "the self-signed certificate is kept in the root dir's pki/"
    );
    let key_mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(a.root.join("pki/kubelet.key")).unwrap().permissions(),
    );
    assert_eq!(key_mode & 0o777, 0o600);
    let ca = served.to_str().unwrap().to_string();
    let cert = pki.path().join("client.crt");
    let key = pki.path().join("client.key");
    let with_cert = [
        "--cacert",
        ca.as_str(),
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ];
    // the served certificate verifies against the stored one, for the name localhost
    let (code, body) = curl(&with_cert, &format!("{base}/pods"));
    assert_eq!(code, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["kind"], "PodList");
    assert!(list["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["metadata"]["name"] == format!("web-{}", a.node)));
    let (code, body) = curl(&with_cert, &format!("{base}/containerLogs/default/web-{}/main", a.node));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("hello-10250"), "{body}");

    // TLS 1.2 too: the client's handshake signature is checked with its certificate's key
    let mut tls12 = with_cert.to_vec();
    tls12.extend(["--tls-max", "1.2"]);
    let (code, body) = curl(&tls12, &format!("{base}/healthz"));
    assert_eq!((code, body.as_str()), (200, "ok"));

    // pods as the runtime sees them: name, namespace, uid; containers with name and image
    let (code, body) = curl(&with_cert, &format!("{base}/runningpods/"));
    assert_eq!(code, 200, "{body}");
    let running: serde_json::Value = serde_json::from_str(&body).unwrap();
    let web = running["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["metadata"]["name"] == format!("web-{}", a.node))
        .unwrap_or_else(|| panic!("{running}"));
    assert_eq!(web["metadata"]["namespace"], "default");
    assert!(web["metadata"]["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert_eq!(web["spec"]["containers"][0]["name"], "main");
    assert_eq!(web["spec"]["containers"][0]["image"], IMAGE);
    let (code, body) = curl(&with_cert, &format!("{base}/configz"));
    assert_eq!(code, 200, "{body}");
    let configz: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(configz["kubeletconfig"]["port"], port);
    assert_eq!(configz["kubeletconfig"]["authorization"]["mode"], "AlwaysAllow");
    let typed: KubeletConfigurationV1beta1 = serde_json::from_value(configz["kubeletconfig"].clone())
        .unwrap_or_else(|e| panic!("/configz does not decode with kubelet's types: {e}\n{configz}"));
    assert_eq!(typed.kube_api_qps, Some(50));
    assert_eq!(typed.port, Some(port as i32));
    let (code, body) = curl(&with_cert, &format!("{base}/spec/"));
    assert_eq!(code, 200, "{body}");
    let spec: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(spec["num_cores"].as_u64().unwrap() >= 1, "{spec}");
    let (code, body) = curl(&with_cert, &format!("{base}/logs/"));
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("<!doctype html>"), "{body}");
    let mut as_is = with_cert.to_vec();
    as_is.push("--path-as-is");
    assert_eq!(curl(&as_is, &format!("{base}/logs/../etc/passwd")).0, 400);

    // no credentials: 401, as kubelet with anonymous auth off
    let (code, body) = curl(&["--cacert", &ca], &format!("{base}/pods"));
    assert_eq!((code, body.as_str()), (401, "Unauthorized"));
    // a certificate from another CA is refused at the handshake
    let (other_cert, other_key) = (pki.path().join("other.crt"), pki.path().join("other.key"));
    let other = [
        "--cacert",
        ca.as_str(),
        "--cert",
        other_cert.to_str().unwrap(),
        "--key",
        other_key.to_str().unwrap(),
    ];
    assert_eq!(curl(&other, &format!("{base}/pods")).0, 0, "handshake refused");

    // the same certificate after a restart
    let before = std::fs::read(&served).unwrap();
    a.restart();
    wait_until("healthz after the restart", Duration::from_secs(30), || {
        curl(&[], &health).0 == 200
    });
    assert_eq!(std::fs::read(&served).unwrap(), before, "reused across restarts");
    wait_until("the kubelet port after the restart", Duration::from_secs(20), || {
        curl(&with_cert, &format!("{base}/healthz")).0 == 200
    });
}
