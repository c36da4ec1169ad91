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
    enable_debugging_handlers: Option<bool>,
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
    shutdown_grace_period: Option<String>,
    shutdown_grace_period_critical_pods: Option<String>,
    shutdown_grace_period_by_pod_priority: Option<Vec<V1beta1ShutdownGracePeriodByPodPriority>>,
}

#[allow(dead_code)]
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct V1beta1ShutdownGracePeriodByPodPriority {
    priority: i32,
    shutdown_grace_period_seconds: i64,
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

/// An agent on free kubelet and healthz ports (`port`, `healthz`) trusting the client CA in
/// `pki` (a system:masters client certificate made there), with `config` more lines, running
/// pod `web` that prints `hello`.
fn agent_with_client_ca(name: &str, config: &str, hello: &str) -> (tempfile::TempDir, u16, u16, Agent) {
    let pki = tempfile::tempdir().unwrap();
    client_pki(pki.path(), "kube-apiserver-kubelet-client", "system:masters");
    let (port, healthz) = (free_port(), free_port());
    let config = format!(
        "port: {port}\nhealthzPort: {healthz}\n{config}authentication:\n  x509:\n    clientCAFile: {}\n",
        pki.path().join("ca.crt").display()
    );
    let a = Agent::start_with_config(name, &[], &config);
    a.write(
        "web.yaml",
        &pod_yaml("web", "Always", &format!("echo {hello}; sleep 3600")),
    );
    a.wait_phase("web", "Running", Duration::from_secs(30));
    (pki, port, healthz, a)
}

#[test]
fn tls_port_with_client_certificates_and_the_healthz_port() {
    let (pki, port, healthz, mut a) = agent_with_client_ca("server", "", "hello-10250");

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
    assert_eq!(configz["kubeletconfig"]["enableDebuggingHandlers"], true);
    let typed: KubeletConfigurationV1beta1 = serde_json::from_value(configz["kubeletconfig"].clone())
        .unwrap_or_else(|e| panic!("/configz does not decode with kubelet's types: {e}\n{configz}"));
    assert_eq!(typed.kube_api_qps, Some(50));
    assert_eq!(typed.enable_debugging_handlers, Some(true));
    assert_eq!(typed.port, Some(port as i32));
    assert_eq!(typed.shutdown_grace_period.as_deref(), Some("0s"));
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

/// `enableDebuggingHandlers: false` (kubelet's InstallDebuggingDisabledHandlers): on the
/// kubelet port exec, attach, port-forward, run, container and node logs, /runningpods/ and
/// /debug/pprof/ answer 405 "Debug endpoints are disabled." whatever the method, /configz is
/// not served, and health, pods, spec, stats and metrics are; the CLI's owner-only socket keeps
/// every route, and its /configz shows the setting.
#[test]
fn debugging_handlers_off_refuse_exec_logs_and_port_forward() {
    let (pki, port, healthz, mut a) =
        agent_with_client_ca("server-nodebug", "enableDebuggingHandlers: false\n", "hello-nodebug");
    let pod = format!("web-{}", a.node);

    let base = format!("https://localhost:{port}");
    let ca = a.root.join("pki/kubelet.crt");
    let (cert, key) = (pki.path().join("client.crt"), pki.path().join("client.key"));
    let with_cert = [
        "--cacert",
        ca.to_str().unwrap(),
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ];
    wait_until("the kubelet port", Duration::from_secs(20), || {
        curl(&with_cert, &format!("{base}/healthz")) == (200, "ok".into())
    });

    let disabled = (405, "Debug endpoints are disabled.\n".to_string());
    let upgrade_spdy = ["-H", "Connection: Upgrade", "-H", "Upgrade: SPDY/3.1"];
    let refused: [(&str, String, &[&str]); 12] = [
        ("GET", format!("/containerLogs/default/{pod}/main"), &[]),
        ("GET", format!("/containerLogs/default/{pod}/main?follow=true"), &[]),
        (
            "POST",
            format!("/exec/default/{pod}/main?command=echo&output=1"),
            &upgrade_spdy,
        ),
        ("GET", format!("/exec/default/{pod}/main?command=echo&output=1"), &[]),
        ("POST", format!("/attach/default/{pod}/main?output=1"), &upgrade_spdy),
        ("POST", format!("/portForward/default/{pod}"), &upgrade_spdy),
        ("GET", format!("/portForward/default/{pod}?port=80"), &[]),
        ("POST", format!("/run/default/{pod}/main?cmd=echo%20hi"), &[]),
        ("GET", "/logs/".into(), &[]),
        ("GET", "/logs/syslog".into(), &[]),
        ("GET", "/runningpods/".into(), &[]),
        ("GET", "/debug/pprof/".into(), &[]),
    ];
    for (method, path, extra) in refused {
        let mut args = with_cert.to_vec();
        args.extend(["-X", method]);
        args.extend(extra);
        assert_eq!(curl(&args, &format!("{base}{path}")), disabled, "{method} {path}");
    }
    // kubelet registers /configz with the debugging handlers only
    assert_eq!(curl(&with_cert, &format!("{base}/configz")).0, 404);
    // still behind authentication: no credential is 401, not 405
    let (code, body) = curl(
        &["--cacert", ca.to_str().unwrap()],
        &format!("{base}/containerLogs/default/{pod}/main"),
    );
    assert_eq!((code, body.as_str()), (401, "Unauthorized"));

    // the default handlers are served
    let (code, body) = curl(&with_cert, &format!("{base}/pods"));
    assert_eq!(code, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(list["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["metadata"]["name"] == pod));
    let (code, body) = curl(&with_cert, &format!("{base}/stats/summary"));
    assert_eq!(code, 200, "{body}");
    let summary: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(summary["node"]["nodeName"], a.node.as_str(), "{summary}");
    let (code, body) = curl(&with_cert, &format!("{base}/spec/"));
    assert_eq!(code, 200, "{body}");
    let (code, body) = curl(&with_cert, &format!("{base}/metrics"));
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        curl(&[], &format!("http://127.0.0.1:{healthz}/healthz")),
        (200, "ok".into())
    );

    // the owner-only CLI socket keeps the logs and shows the setting in /configz
    let (code, body) = a.get(&format!("/containerLogs/default/{pod}/main")).unwrap();
    let body = String::from_utf8_lossy(&body);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("hello-nodebug"), "{body}");
    let (code, body) = a.get("/configz").unwrap();
    assert_eq!(code, 200);
    let configz: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(configz["kubeletconfig"]["enableDebuggingHandlers"], false, "{configz}");
    a.stop();
}

/// Processes on the machine whose arguments, joined by spaces, are `cmdline`.
fn processes(cmdline: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let args: Vec<String> = c
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if args.join(" ") == cmdline {
                out.push(pid);
            }
        }
    }
    out
}

/// Open an exec of `yes MARKER` over SPDY (v4, stdout only) on the agent's socket, read some
/// of its output, and leave without a word: the connection just closes.
fn spdy_exec_and_leave(socket: &Path, path: &str) {
    use ferrolet::server::streaming::spdy::{self, Frame, HeaderDecoder, HeaderEncoder, Headers};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
             X-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        while !answer.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            assert_eq!(s.read(&mut b).await.unwrap(), 1, "the answer's head");
            answer.push(b[0]);
        }
        let answer = String::from_utf8_lossy(&answer).into_owned();
        assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
        let mut enc = HeaderEncoder::new();
        for (id, kind) in [(1u32, "error"), (3, "stdout")] {
            let f = Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: Headers(vec![("streamType".into(), kind.into())]),
            };
            s.write_all(&spdy::encode(&f, &mut enc).unwrap()).await.unwrap();
        }
        let mut dec = HeaderDecoder::new();
        let mut out = 0;
        while out < 64 * 1024 {
            match spdy::read_frame(&mut s, &mut dec).await.unwrap() {
                Some(Frame::Data { stream_id: 3, data, .. }) => out += data.len(),
                Some(_) => {}
                None => panic!("the exec ended by itself"),
            }
        }
    });
}

/// A command run for a client ends with its session (kubelet's exec kills the process when
/// the stream ends): `POST /run` whose client gives up, and an exec over SPDY whose client
/// goes away, leave no `yes` spinning.
#[test]
fn a_command_ends_when_its_client_goes_away() {
    let mut a = Agent::start("server-exec-gone", &[]);
    a.write("web.yaml", &pod_yaml("web", "Always", "sleep 3600"));
    a.wait_phase("web", "Running", Duration::from_secs(30));
    let pod = format!("web-{}", a.node);
    let socket = a.socket();
    let gone = |cmdline: &str| {
        wait_until(&format!("{cmdline} to be killed"), Duration::from_secs(3), || {
            processes(cmdline).is_empty()
        })
    };

    // /run: the client waits a second for an answer that never comes, then hangs up.
    let marker = "yes ferrolet-run-gone";
    let url = format!("http://localhost/run/default/{pod}/main?cmd=yes%20ferrolet-run-gone");
    let mut curl = Command::new("curl")
        .args([
            "-s",
            "--unix-socket",
            socket.to_str().unwrap(),
            "-X",
            "POST",
            "--max-time",
            "1",
        ])
        .arg(&url)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the run to start", Duration::from_secs(10), || {
        !processes(marker).is_empty()
    });
    curl.wait().unwrap();
    gone(marker);

    // exec over SPDY: the connection closes under a command still writing.
    let marker = "yes ferrolet-exec-gone";
    let path = format!("/exec/default/{pod}/main?command=yes&command=ferrolet-exec-gone&output=1");
    spdy_exec_and_leave(&socket, &path);
    gone(marker);
    a.stop();
}

/// Hold `count` idle connections to each of the ports on 127.0.0.1 given as `PORT@SOURCE`
/// (the source address the squatter's connections come from), opening a new one whenever the
/// agent closes one. Prints `ready` once they are all open the first time.
const SQUATTER: &str = r#"
import resource, select, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
ports = [(int(p), src) for p, src in (t.split("@") for t in sys.argv[1].split(","))]
count = int(sys.argv[2])
def connect(port):
    s = socket.socket()
    s.bind((port[1], 0))
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port[0]))
    except BlockingIOError:
        pass
    return s
held = []
for p in ports:
    for i in range(count):
        held.append((p, connect(p)))
        if i % 50 == 49:
            time.sleep(0.02)  # within the listen backlog, so that each is accepted
print("ready", flush=True)
while True:
    time.sleep(0.2)
    poll = select.poll()
    for _, s in held:
        poll.register(s.fileno(), select.POLLIN | select.POLLHUP | select.POLLERR)
    readable = {fd for fd, _ in poll.poll(0)}
    for i, (p, s) in enumerate(held):
        if s.fileno() in readable:
            try:
                closed = s.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                closed = True
            if closed:
                s.close()
                held[i] = (p, connect(p))
"#;

/// More idle connections than the kubelet port's budget, held by an unprivileged user from
/// another address, and as many on the healthz port from the probes' own address, do not lock
/// the node's clients out: every /healthz probe and every authenticated API request is
/// answered meanwhile, a probe at worst at its second try (the issue's reproduction answered
/// 0 of 30 and 3 of 30).
#[test]
fn idle_connections_do_not_lock_out_healthz_or_the_kubelet_port() {
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        skip_loudly(
            "idle_connections_do_not_lock_out",
            "no /usr/bin/python3 for the squatter",
        );
        return;
    }
    let pki = tempfile::tempdir().unwrap();
    client_pki(pki.path(), "kube-apiserver-kubelet-client", "system:masters");
    let (port, healthz) = (free_port(), free_port());
    let config = format!(
        "port: {port}\nhealthzPort: {healthz}\nauthentication:\n  x509:\n    clientCAFile: {}\n",
        pki.path().join("ca.crt").display()
    );
    let mut a = Agent::start_with_config("server-squat", &[], &config);
    let health = format!("http://127.0.0.1:{healthz}/healthz");
    wait_until("healthz", Duration::from_secs(20), || {
        curl(&[], &health) == (200, "ok".into())
    });
    let ca = a.root.join("pki/kubelet.crt");
    let (cert, key) = (pki.path().join("client.crt"), pki.path().join("client.key"));
    let with_cert = [
        "--cacert",
        ca.to_str().unwrap(),
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "--max-time",
        "5",
    ];
    let api = format!("https://localhost:{port}/pods");
    assert_eq!(curl(&with_cert, &api).0, 200);

    let mut squatter = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(python)
        .args(["-c", SQUATTER, &format!("{port}@127.0.0.2,{healthz}@127.0.0.1"), "1100"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the squatter");
    let ready = {
        let mut line = String::new();
        let out = squatter.stdout.as_mut().unwrap();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).unwrap();
        line
    };
    let result = std::panic::catch_unwind(|| {
        assert_eq!(ready.trim(), "ready", "the squatter did not start");
        // Let the squatter's connections settle into the agent's slots (and be cut and
        // reopened) before probing.
        std::thread::sleep(Duration::from_secs(2));
        // A probe may lose its connection to the squatter's once: the squatter is on the
        // probes' own address, and a connection not yet read when 64 newer ones arrive gives
        // way (seen on a loaded machine); kubelet's probers retry, so do these, once.
        let mut answered = (0, 0);
        let mut first_try = 0;
        for _ in 0..30 {
            let probe = || curl(&["--max-time", "2"], &health) == (200, "ok".into());
            if probe() {
                first_try += 1;
                answered.0 += 1;
            } else if probe() {
                answered.0 += 1;
            }
        }
        eprintln!("healthz: {first_try} of 30 probes answered at the first try");
        for _ in 0..10 {
            if curl(&with_cert, &api).0 == 200 {
                answered.1 += 1;
            }
        }
        assert_eq!(
            answered,
            (30, 10),
            "(healthz probes, API requests) answered of (30, 10)"
        );
    });
    let _ = squatter.kill();
    let _ = squatter.wait();
    a.stop();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
