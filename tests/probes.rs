//! Probes with real pods, after Kubernetes' test/e2e/common/node/container_probe.go: exec,
//! httpGet, tcpSocket and grpc probes; liveness restarts, readiness flips Ready, startup
//! probes gate the others. Pods here have no pod network, so probes reach them on their own
//! loopback through their network namespace.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Pod;

const T: Duration = Duration::from_secs(40);

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

fn pod(name: &str, body: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {IMAGE}\n{body}")
}

#[test]
fn exec_liveness_restarts_when_the_file_goes() {
    let a = Agent::start("liveexec", &[]);
    a.write(
        "live.yaml",
        &pod(
            "live",
            r#"    command: [sh, -c, "echo ok > /tmp/health; sleep 3; rm -f /tmp/health; sleep 600"]
    livenessProbe:
      exec: {command: [cat, /tmp/health]}
      initialDelaySeconds: 1
      periodSeconds: 1
      failureThreshold: 1
"#,
        ),
    );
    a.write(
        "healthy.yaml",
        &pod(
            "healthy",
            r#"    command: [sh, -c, "echo ok > /tmp/health; sleep 600"]
    livenessProbe:
      exec: {command: [cat, /tmp/health]}
      periodSeconds: 1
      failureThreshold: 1
"#,
        ),
    );
    let p = a.wait_for("live", "restarted by the liveness probe", T, |p| restarts(p, "c") >= 1);
    let last = container_status(&p, "c")
        .last_state
        .as_ref()
        .unwrap()
        .terminated
        .clone()
        .unwrap();
    assert_eq!(last.exit_code, 137, "killed: {last:?}");
    let log = a.agent_log();
    assert!(
        log.contains("Liveness probe failed"),
        "kubelet's event message in the log"
    );
    assert!(log.contains("failed liveness probe, will be restarted"));
    // The healthy one is left alone.
    assert_eq!(restarts(&a.pod("healthy").unwrap(), "c"), 0);
    assert!(running(&a.pod("healthy").unwrap(), "c"));
}

#[test]
fn exec_probe_that_times_out_fails() {
    let a = Agent::start("exectimeout", &[]);
    a.write(
        "slow.yaml",
        &pod(
            "slow",
            r#"    command: [sleep, "600"]
    livenessProbe:
      exec: {command: [sh, -c, "sleep 10"]}
      timeoutSeconds: 1
      periodSeconds: 2
      failureThreshold: 1
"#,
        ),
    );
    a.wait_for("slow", "restarted after a probe timeout", T, |p| restarts(p, "c") >= 1);
    assert!(a.agent_log().contains("timed out"));
}

#[test]
fn http_probes_pass_then_fail() {
    let a = Agent::start("httpprobe", &[]);
    a.write(
        "web.yaml",
        &pod(
            "web",
            r#"    command: [sh, -c, "mkdir -p /www; echo ok > /www/healthz; httpd -p 8080 -h /www; sleep 4; rm /www/healthz; sleep 600"]
    ports: [{name: http, containerPort: 8080}]
    readinessProbe:
      httpGet: {path: /healthz, port: http, httpHeaders: [{name: X-Probe, value: "yes"}]}
      periodSeconds: 1
    livenessProbe:
      httpGet: {path: /healthz, port: 8080}
      initialDelaySeconds: 2
      periodSeconds: 1
      failureThreshold: 2
"#,
        ),
    );
    let p = a.wait_for("web", "ready over http", T, ready);
    assert!(container_status(&p, "c").ready);
    // The file goes: 404, readiness drops, liveness restarts the container.
    a.wait_for("web", "restarted after 404s", T, |p| restarts(p, "c") >= 1);
    assert!(a.agent_log().contains("HTTP probe failed with statuscode: 404"));
}

#[test]
fn tcp_readiness_flips_ready() {
    let a = Agent::start("tcpready", &[]);
    a.write(
        "tcp.yaml",
        &pod(
            "tcp",
            r#"    command: [sh, -c, "sleep 3; httpd -p 8080 -h /; sleep 4; killall httpd; sleep 600"]
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
"#,
        ),
    );
    let p = a.wait_for("tcp", "running", T, |p| running(p, "c"));
    assert!(!ready(&p), "not ready before anything listens");
    let t0 = Instant::now();
    a.wait_for("tcp", "ready once the port listens", T, ready);
    a.wait_for("tcp", "unready once it stops", T, |p| !ready(p));
    assert!(t0.elapsed() < Duration::from_secs(20));
    let p = a.pod("tcp").unwrap();
    assert_eq!(restarts(&p, "c"), 0, "readiness never restarts");
    let cond = p.status.as_ref().unwrap().conditions.as_ref().unwrap();
    let c = cond.iter().find(|c| c.type_ == "ContainersReady").unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref()),
        ("False", Some("ContainersNotReady"))
    );
}

#[test]
fn readiness_initial_delay_and_never_ready() {
    let a = Agent::start("readydelay", &[]);
    a.write(
        "delay.yaml",
        &pod(
            "delay",
            r#"    command: [sleep, "600"]
    readinessProbe:
      exec: {command: ["true"]}
      initialDelaySeconds: 4
      periodSeconds: 1
"#,
        ),
    );
    a.write(
        "never.yaml",
        &pod(
            "never",
            r#"    command: [sleep, "600"]
    readinessProbe:
      exec: {command: ["false"]}
      periodSeconds: 1
"#,
        ),
    );
    let p = a.wait_for("delay", "running", T, |p| running(p, "c"));
    let started = running_since(&p, "c").unwrap();
    let p = a.wait_for("delay", "ready", T, ready);
    let became_ready = chrono::Utc::now().timestamp();
    assert!(
        became_ready - started.0.as_second() >= 4,
        "not ready before the initial delay"
    );
    assert_eq!(restarts(&p, "c"), 0);
    std::thread::sleep(Duration::from_secs(3));
    let n = a.pod("never").unwrap();
    assert!(
        !ready(&n) && restarts(&n, "c") == 0,
        "a failing readiness probe never readies and never restarts"
    );
}

#[test]
fn startup_probe_gates_liveness() {
    let a = Agent::start("startup", &[]);
    // Liveness would fail at once, but the startup probe (never succeeding here) holds it off.
    a.write(
        "held.yaml",
        &pod(
            "held",
            r#"    command: [sleep, "600"]
    startupProbe:
      exec: {command: [cat, /tmp/never]}
      periodSeconds: 1
      failureThreshold: 60
    livenessProbe:
      exec: {command: ["false"]}
      periodSeconds: 1
      failureThreshold: 1
"#,
        ),
    );
    // Startup succeeds after ~3s; then liveness fails and restarts it.
    a.write(
        "enabled.yaml",
        &pod(
            "enabled",
            r#"    command: [sh, -c, "sleep 3; touch /tmp/started; sleep 600"]
    startupProbe:
      exec: {command: [cat, /tmp/started]}
      periodSeconds: 1
      failureThreshold: 60
    livenessProbe:
      exec: {command: ["false"]}
      periodSeconds: 1
      failureThreshold: 1
"#,
        ),
    );
    // A startup probe that fails restarts the container.
    a.write(
        "fails.yaml",
        &pod(
            "fails",
            r#"    command: [sleep, "600"]
    startupProbe:
      exec: {command: ["false"]}
      periodSeconds: 1
      failureThreshold: 2
"#,
        ),
    );
    // Ready right after the startup probe succeeds, though readiness only runs every 60s.
    a.write(
        "quick.yaml",
        &pod(
            "quick",
            r#"    command: [sh, -c, "sleep 2; touch /tmp/started; sleep 600"]
    startupProbe:
      exec: {command: [cat, /tmp/started]}
      periodSeconds: 1
      failureThreshold: 60
    readinessProbe:
      exec: {command: ["true"]}
      periodSeconds: 60
"#,
        ),
    );
    a.wait_for("enabled", "restarted by liveness after startup", T, |p| {
        restarts(p, "c") >= 1
    });
    a.wait_for("fails", "restarted by the startup probe", T, |p| restarts(p, "c") >= 1);
    let q = a.wait_for("quick", "ready", Duration::from_secs(15), ready);
    assert_eq!(container_status(&q, "c").started, Some(true));
    let held = a.pod("held").unwrap();
    assert_eq!(restarts(&held, "c"), 0, "startup probe delays liveness");
    assert_eq!(container_status(&held, "c").started, Some(false));
    assert!(!ready(&held));
}

/// A grpc.health.v1 server on 127.0.0.1 answering SERVING until told otherwise.
fn grpc_health_server(serving: std::sync::Arc<std::sync::atomic::AtomicBool>) -> u16 {
    use bytes::Bytes;
    use http_body_util::{Full, StreamBody};
    use hyper::body::Frame;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((s, _)) = l.accept().await else { continue };
                let serving = serving.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |_req: hyper::Request<hyper::body::Incoming>| {
                        let status: u8 = if serving.load(std::sync::atomic::Ordering::SeqCst) {
                            1
                        } else {
                            2
                        };
                        async move {
                            let msg = vec![0u8, 0, 0, 0, 2, 0x08, status];
                            let mut trailers = hyper::HeaderMap::new();
                            trailers.insert("grpc-status", "0".parse().unwrap());
                            let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> =
                                vec![Ok(Frame::data(Bytes::from(msg))), Ok(Frame::trailers(trailers))];
                            let body = StreamBody::new(futures::stream::iter(frames));
                            let _ = Full::<Bytes>::default;
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .header("content-type", "application/grpc")
                                    .body(body)
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                        .await;
                });
            }
        });
    });
    port
}

#[test]
fn grpc_liveness_probe() {
    let serving = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let port = grpc_health_server(serving.clone());
    // A hostNetwork pod's IP is the node's: 127.0.0.1 here, where the health server listens.
    let a = Agent::start("grpc", &["--node-ip", "127.0.0.1"]);
    a.write(
        "g.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: g}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sleep, \"600\"]\n    livenessProbe:\n      grpc: {{port: {port}}}\n      periodSeconds: 1\n      failureThreshold: 2\n    readinessProbe:\n      grpc: {{port: {port}, service: web}}\n      periodSeconds: 1\n"
        ),
    );
    let p = a.wait_for("g", "ready over grpc", T, ready);
    assert_eq!(
        p.status.as_ref().unwrap().pod_ip.as_deref(),
        Some("127.0.0.1"),
        "hostNetwork pod IP is the node's"
    );
    serving.store(false, std::sync::atomic::Ordering::SeqCst);
    a.wait_for("g", "restarted: NOT_SERVING", T, |p| restarts(p, "c") >= 1);
    assert!(
        a.agent_log()
            .contains("service unhealthy (responded with \\\"NOT_SERVING\\\")")
            || a.agent_log().contains("NOT_SERVING")
    );
}

#[test]
fn readiness_turns_false_while_terminating_and_liveness_stops() {
    let a = Agent::start("termready", &[]);
    a.write(
        "t.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: t}}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: c
    image: {IMAGE}
    command: [sh, -c, "trap 'rm -f /tmp/ready /tmp/live; sleep 4; exit 0' TERM; touch /tmp/ready /tmp/live; while true; do sleep 0.2; done"]
    readinessProbe:
      exec: {{command: [cat, /tmp/ready]}}
      periodSeconds: 1
      failureThreshold: 1
    livenessProbe:
      exec: {{command: [cat, /tmp/live]}}
      periodSeconds: 1
      failureThreshold: 1
"#
        ),
    );
    a.wait_for("t", "ready", T, ready);
    a.remove("t.yaml");
    // The pod goes not-ready before it is gone, and no liveness kill happens meanwhile.
    let p = a.wait_pod("t", "not ready while terminating", T, |p| {
        p.is_none() || p.is_some_and(|p| !ready(p))
    });
    assert!(p.is_some(), "readiness must turn false before the pod is removed");
    a.wait_gone("t", T);
    assert!(
        !a.agent_log().contains("failed liveness probe"),
        "liveness stops once termination starts"
    );
}

#[test]
fn probe_grace_period_overrides_the_pods() {
    let a = Agent::start("probegrace", &[]);
    a.write(
        "g.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: g}}\nspec:\n  terminationGracePeriodSeconds: 500\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sleep, \"1000\"]\n    livenessProbe:\n      httpGet: {{path: /healthz, port: 8080}}\n      periodSeconds: 1\n      failureThreshold: 1\n      terminationGracePeriodSeconds: 2\n"
        ),
    );
    // sleep as PID 1 ignores TERM: only the probe's 2s grace (not the pod's 500s) lets it restart.
    a.wait_for(
        "g",
        "restarted within the probe's grace period",
        Duration::from_secs(30),
        |p| restarts(p, "c") >= 1,
    );
}

#[test]
fn http_redirects_local_followed_foreign_not() {
    let a = Agent::start("redirects", &[]);
    // CGI scripts answering 302, from a host directory (busybox httpd runs them).
    let cgi = scratch(&a.dir, "cgi-bin");
    for (file, loc) in [("local", "/missing"), ("foreign", "http://0.0.0.0/")] {
        let script = format!(
            "#!/bin/sh\necho 'Status: 302 Found'\necho 'Location: {loc}'\necho\necho '<a href=\"{loc}\">Found</a>.'\n"
        );
        let path = cgi.join(file);
        std::fs::write(&path, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let pod = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [httpd, -f, -p, \"8080\", -h, /www]\n    volumeMounts: [{{name: cgi, mountPath: /www/cgi-bin}}]\n    livenessProbe:\n      httpGet: {{path: /cgi-bin/{name}, port: 8080}}\n      initialDelaySeconds: 1\n      periodSeconds: 1\n      failureThreshold: 1\n  volumes: [{{name: cgi, hostPath: {{path: {}}}}}]\n",
            cgi.display()
        )
    };
    // A redirect to this host is followed: /missing answers 404 and the container restarts.
    a.write("local.yaml", &pod("local"));
    // A redirect elsewhere is not followed: success with a warning, no restart.
    a.write("foreign.yaml", &pod("foreign"));
    a.wait_for("local", "restarted after the followed redirect", T, |p| {
        restarts(p, "c") >= 1
    });
    std::thread::sleep(Duration::from_secs(3));
    let f = a.pod("foreign").unwrap();
    assert!(
        running(&f, "c") && restarts(&f, "c") == 0,
        "a foreign redirect does not fail the probe"
    );
    let log = a.agent_log();
    assert!(
        log.contains(
            "Liveness probe warning: Probe terminated redirects, Response body: <a href=\"http://0.0.0.0/\">Found</a>."
        ),
        "{}",
        tail(&log, 20)
    );
}

/// The value of the sample `name{labels...}` (labels given as `k="v"` pairs, all required) in a
/// Prometheus/OpenMetrics text exposition.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        (n == name && labels.iter().all(|kv| rest.contains(kv))).then(|| value.parse().ok())?
    })
}

#[test]
fn kubelet_metrics_count_pods_runtime_operations_and_probes() {
    let a = Agent::start("kmetrics", &[]);
    a.write(
        "probed.yaml",
        &pod(
            "probed",
            r#"    command: [sh, -c, "echo ok > /tmp/ready; sleep 600"]
    readinessProbe:
      exec: {command: [cat, /tmp/ready]}
      periodSeconds: 1
"#,
        ),
    );
    a.wait_for("probed", "ready", T, ready);
    let get = |path: &str| {
        let (code, body) = a.get(path).unwrap();
        assert_eq!(code, 200, "{path}");
        String::from_utf8(body).unwrap()
    };
    let m = get("/metrics");
    assert_eq!(sample(&m, "kubelet_running_pods", &[]), Some(1.0), "{m}");
    assert_eq!(
        sample(&m, "kubelet_running_containers", &[r#"container_state="running""#]),
        Some(1.0)
    );
    assert_eq!(sample(&m, "kubelet_desired_pods", &[r#"static="true""#]), Some(1.0));
    assert_eq!(sample(&m, "kubelet_pod_start_duration_seconds_count", &[]), Some(1.0));
    assert!(
        sample(
            &m,
            "kubelet_pod_worker_duration_seconds_count",
            &[r#"operation_type="create""#]
        ) >= Some(1.0)
    );
    for op in ["run_podsandbox", "create_container", "start_container", "exec_sync"] {
        let label = format!("operation_type=\"{op}\"");
        assert!(
            sample(&m, "kubelet_runtime_operations_total", &[&label]) >= Some(1.0),
            "{op} not counted:\n{m}"
        );
    }
    assert_eq!(sample(&m, "kubelet_started_pods_total", &[]), Some(1.0));
    assert_eq!(
        sample(
            &m,
            "kubelet_started_containers_total",
            &[r#"container_type="container""#]
        ),
        Some(1.0)
    );
    assert!(sample(&m, "process_resident_memory_bytes", &[]) > Some(1e6));

    let p = get("/metrics/probes");
    let uid = a.pod("probed").unwrap().metadata.uid.unwrap();
    let labels = [
        r#"probe_type="Readiness""#,
        r#"result="successful""#,
        r#"container="c""#,
        r#"pod="probed-"#,
        r#"namespace="default""#,
    ];
    assert!(sample(&p, "prober_probe_total", &labels) >= Some(1.0), "{p}");
    assert!(p.contains(&format!("pod_uid=\"{uid}\"")));
    assert!(sample(&p, "prober_probe_duration_seconds_count", &labels[..1]) >= Some(1.0));
    // The pod goes: its probe series go with it.
    a.remove("probed.yaml");
    a.wait_gone("probed", T);
    let p = get("/metrics/probes");
    assert!(!p.contains(&uid), "{p}");
    // Every request above is counted, by its route (the metrics endpoints apart); a made-up
    // path is "other", never a label value of its own.
    let _ = a.get("/made-up-path-4f2a");
    let m = get("/metrics");
    let requests = |path: &str| {
        let label = format!("path=\"{path}\"");
        sample(&m, "kubelet_http_requests_total", &[&label, r#"server_type="local""#])
    };
    assert!(requests("metrics") >= Some(1.0), "{m}");
    assert!(requests("metrics/probes") >= Some(2.0), "{m}");
    assert_eq!(requests("other"), Some(1.0), "{m}");
    assert!(!m.contains("made-up-path"), "{m}");
}
