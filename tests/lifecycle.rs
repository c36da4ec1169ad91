//! Lifecycle hooks, termination messages and the environment, with real pods, after
//! Kubernetes' test/e2e/common/node/lifecycle_hook.go, runtime.go and expansion.go.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Pod;

const T: Duration = Duration::from_secs(40);

fn terminated_message(p: &Pod, c: &str) -> Option<String> {
    container_status(p, c)
        .state
        .as_ref()?
        .terminated
        .as_ref()?
        .message
        .clone()
}

#[test]
fn post_start_exec_hook_runs_before_the_app_sees_it() {
    let a = Agent::start("poststart", &[]);
    a.write(
        "ps.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: ps}}
spec:
  containers:
  - name: c
    image: {IMAGE}
    command: [sh, -c, "for i in $(seq 50); do test -f /tmp/hook && break; sleep 0.1; done; echo seen:$(cat /tmp/hook); sleep 600"]
    lifecycle:
      postStart:
        exec: {{command: [sh, -c, "echo poststart > /tmp/hook"]}}
"#
        ),
    );
    a.wait_phase("ps", "Running", T);
    let deadline = Instant::now() + T;
    while !a.logs("ps", "").contains("seen:poststart") {
        assert!(
            Instant::now() < deadline,
            "the hook's file never appeared: {}",
            a.logs("ps", "")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn failing_post_start_kills_the_container() {
    let a = Agent::start("poststartfail", &[]);
    a.write(
        "bad.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: bad}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sleep, \"600\"]\n    lifecycle:\n      postStart:\n        exec: {{command: [sh, -c, \"echo nope; exit 7\"]}}\n"
        ),
    );
    a.wait_for("bad", "restarted after the hook failed", T, |p| restarts(p, "c") >= 1);
    let log = a.agent_log();
    assert!(
        log.contains("FailedPostStartHook") && log.contains("exited with 7"),
        "{}",
        tail(&log, 20)
    );
}

#[test]
fn pre_stop_hooks_exec_http_and_sleep() {
    let a = Agent::start("prestop", &[]);
    let marks = scratch(&a.dir, "marks");
    // exec preStop, then TERM: the marks say in which order.
    a.write(
        "exec.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: exec}}
spec:
  terminationGracePeriodSeconds: 15
  containers:
  - name: c
    image: {IMAGE}
    command: [sh, -c, "trap 'echo term >> /marks/order; exit 0' TERM; while true; do sleep 0.1; done"]
    volumeMounts: [{{name: m, mountPath: /marks}}]
    lifecycle:
      preStop:
        exec: {{command: [sh, -c, "echo prestop >> /marks/order"]}}
  volumes: [{{name: m, hostPath: {{path: {}}}}}]
"#,
            marks.display()
        ),
    );
    // httpGet preStop to a handler container of the same pod (its loopback), which logs the URL.
    a.write(
        "http.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: http}}
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: handler
    image: {IMAGE}
    command: [sh, -c, "mkdir -p /www; echo ok > /www/ok; exec httpd -f -vv -p 8081 -h /www"]
  - name: c
    image: {IMAGE}
    command: [sleep, "600"]
    lifecycle:
      postStart:
        httpGet: {{path: /ok, port: 8081}}
      preStop:
        httpGet: {{path: /echo-prestop, port: 8081}}
"#
        ),
    );
    // sleep preStop: termination takes the sleep, though the process exits on TERM at once.
    a.write(
        "sleepy.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: sleepy}}\nspec:\n  terminationGracePeriodSeconds: 20\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 0.1; done\"]\n    lifecycle:\n      preStop:\n        sleep: {{seconds: 3}}\n"
        ),
    );
    a.wait_phase("exec", "Running", T);
    a.wait_phase("http", "Running", T);
    a.wait_phase("sleepy", "Running", T);
    assert!(
        a.logs("http", "container=handler").contains("url:/ok"),
        "postStart httpGet reached the handler"
    );

    a.remove("exec.yaml");
    a.wait_gone("exec", T);
    assert_eq!(
        std::fs::read_to_string(marks.join("order")).unwrap(),
        "prestop\nterm\n",
        "preStop runs before TERM"
    );

    // Read the handler's log while the pod terminates (it is removed afterwards).
    a.remove("http.yaml");
    let deadline = Instant::now() + T;
    let mut seen = false;
    while Instant::now() < deadline && a.pod("http").is_some() {
        let (_, body) = a
            .get(&format!("/ferrolet/logs/default/http-{}?container=handler", a.node))
            .unwrap();
        if String::from_utf8_lossy(&body).contains("url:/echo-prestop") {
            seen = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(seen, "the preStop httpGet reached the handler");
    a.wait_gone("http", T);

    let t0 = Instant::now();
    a.remove("sleepy.yaml");
    a.wait_gone("sleepy", T);
    assert!(
        t0.elapsed() >= Duration::from_millis(2900),
        "preStop sleep ran: {:?}",
        t0.elapsed()
    );
}

#[test]
fn termination_messages() {
    let a = Agent::start("termmsg", &[]);
    let pod = |name: &str, policy: &str, extra: &str, script: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: {IMAGE}\n    terminationMessagePolicy: {policy}\n{extra}    command: [sh, -c, {script:?}]\n"
        )
    };
    // A non-root user at a non-default path.
    a.write(
        "file.yaml",
        &pod(
            "file",
            "File",
            "    terminationMessagePath: /dev/termination-custom-log\n    securityContext: {runAsUser: 1000}\n",
            "printf DONE > /dev/termination-custom-log",
        ),
    );
    a.write(
        "fallback.yaml",
        &pod("fallback", "FallbackToLogsOnError", "", "echo DONE; exit 1"),
    );
    a.write(
        "fallback-ok.yaml",
        &pod("fallback-ok", "FallbackToLogsOnError", "", "echo DONE; exit 0"),
    );
    a.write(
        "fallback-file.yaml",
        &pod(
            "fallback-file",
            "FallbackToLogsOnError",
            "",
            "printf OK > /dev/termination-log; exit 0",
        ),
    );
    let p = a.wait_phase("file", "Succeeded", T);
    assert_eq!(terminated_message(&p, "c").as_deref(), Some("DONE"));
    let p = a.wait_phase("fallback", "Failed", T);
    assert_eq!(terminated_message(&p, "c").as_deref().map(str::trim_end), Some("DONE"));
    let p = a.wait_phase("fallback-ok", "Succeeded", T);
    assert_eq!(terminated_message(&p, "c"), None, "empty when it succeeds");
    let p = a.wait_phase("fallback-file", "Succeeded", T);
    assert_eq!(terminated_message(&p, "c").as_deref(), Some("OK"));
}

#[test]
fn environment_expansion_and_downward_api() {
    let a = Agent::start("expansion", &[]);
    let data = scratch(&a.dir, "data");
    a.write(
        "env.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: env
  labels: {{app: demo}}
  annotations: {{note: hi}}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: {IMAGE}
    env:
    - {{name: FOO, value: foo-value}}
    - {{name: BAR, value: bar-value}}
    - {{name: FOOBAR, value: "$(FOO);;$(BAR)"}}
    - {{name: ESCAPED, value: "$$(FOO)"}}
    - {{name: UNDEFINED, value: "$(NOT_DEFINED)-x"}}
    - {{name: LATER_REF, value: "$(DEFINED_LATER)"}}
    - {{name: DEFINED_LATER, value: late}}
    - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
    - {{name: POD_NS, valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}}}
    - {{name: POD_UID, valueFrom: {{fieldRef: {{fieldPath: metadata.uid}}}}}}
    - {{name: NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}
    - {{name: LABEL, valueFrom: {{fieldRef: {{fieldPath: "metadata.labels['app']"}}}}}}
    - {{name: ANN, valueFrom: {{fieldRef: {{fieldPath: "metadata.annotations['note']"}}}}}}
    - {{name: HOST_IP, valueFrom: {{fieldRef: {{fieldPath: status.hostIP}}}}}}
    - {{name: MEM_LIMIT, valueFrom: {{resourceFieldRef: {{resource: limits.memory, divisor: 1Mi}}}}}}
    - {{name: CPU_REQ, valueFrom: {{resourceFieldRef: {{resource: requests.cpu, divisor: 1m}}}}}}
    - {{name: MEM0, valueFrom: {{resourceFieldRef: {{resource: limits.memory, divisor: "0"}}}}}}
    - {{name: CPU0, valueFrom: {{resourceFieldRef: {{resource: requests.cpu, divisor: "0"}}}}}}
    - {{name: CPU_LIMIT0, valueFrom: {{resourceFieldRef: {{resource: limits.cpu, divisor: "0"}}}}}}
    - {{name: SUB, value: sub-$(POD_NS)}}
    command: [sh, -c]
    args:
    - 'echo "FOOBAR=$FOOBAR"; echo "ESCAPED=$ESCAPED"; echo "UNDEFINED=$UNDEFINED"; echo "LATER_REF=$LATER_REF"; echo "ARG=$(FOO)"; echo "POD=$POD_NAME/$POD_NS/$POD_UID/$NODE"; echo "LABEL=$LABEL ANN=$ANN HOST_IP=$HOST_IP"; echo "MEM=$MEM_LIMIT CPU=$CPU_REQ"; echo "ZERO=$MEM0 $CPU0 $CPU_LIMIT0 $(cat /dapi/cpu)"; echo sub > /data/file'
    resources:
      requests: {{cpu: 250m, memory: 16Mi}}
      limits: {{memory: 64Mi}}
    volumeMounts:
    - {{name: d, mountPath: /data, subPathExpr: "$(SUB)"}}
    - {{name: dapi, mountPath: /dapi}}
  volumes:
  - {{name: d, hostPath: {{path: {}, type: Directory}}}}
  - {{name: dapi, downwardAPI: {{items: [{{path: cpu, resourceFieldRef: {{containerName: c, resource: limits.cpu, divisor: "0"}}}}]}}}}
"#,
            data.display()
        ),
    );
    let p = a.wait_phase("env", "Succeeded", T);
    let out = a.logs("env", "");
    let line = |k: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{k}=")))
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(line("FOOBAR"), "FOOBAR=foo-value;;bar-value");
    assert_eq!(line("ESCAPED"), "ESCAPED=$(FOO)");
    assert_eq!(line("UNDEFINED"), "UNDEFINED=$(NOT_DEFINED)-x");
    assert_eq!(line("LATER_REF"), "LATER_REF=$(DEFINED_LATER)");
    assert_eq!(
        line("ARG"),
        "ARG=foo-value",
        "args are expanded with the container's env"
    );
    let uid = p.metadata.uid.clone().unwrap();
    assert_eq!(
        line("POD"),
        format!("POD={}/default/{uid}/{}", p.metadata.name.clone().unwrap(), a.node)
    );
    let host_ip = p.status.as_ref().unwrap().host_ip.clone().unwrap();
    assert_eq!(line("LABEL"), format!("LABEL=demo ANN=hi HOST_IP={host_ip}"));
    assert_eq!(line("MEM"), "MEM=64 CPU=250");
    // A divisor of "0" (the API server's default for an unset one) is 1: bytes, and cpu
    // rounded up to whole cores; an unset cpu limit is the node's allocatable, in env and
    // volumes alike.
    let zero = line("ZERO");
    let parts: Vec<&str> = zero.trim_start_matches("ZERO=").split(' ').collect();
    assert_eq!(&parts[..2], &["67108864", "1"], "{zero}");
    assert!(parts[2].parse::<u32>().is_ok_and(|n| n >= 1), "{zero}");
    assert_eq!(parts[2], parts[3], "env and downward API volume agree: {zero}");
    assert_eq!(
        std::fs::read_to_string(data.join("sub-default/file")).unwrap(),
        "sub\n",
        "subPathExpr expanded"
    );
}

#[test]
fn sub_path_expr_must_stay_inside_the_volume() {
    let a = Agent::start("subpathbad", &[]);
    a.write(
        "bad.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: bad}}\nspec:\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sleep, \"600\"]\n    env: [{{name: POD_NAME, value: \"..\"}}]\n    volumeMounts: [{{name: w, mountPath: /w, subPathExpr: \"$(POD_NAME)\"}}]\n  volumes: [{{name: w, emptyDir: {{}}}}]\n"
        ),
    );
    let p = a.wait_for("bad", "CreateContainerConfigError", T, |p| {
        waiting_reason(p, "c").as_deref() == Some("CreateContainerConfigError")
    });
    let msg = waiting_message(&p, "c").unwrap();
    assert!(msg.contains("must not contain '..'"), "{msg}");
}

#[test]
fn a_sub_path_through_a_planted_symlink_creates_nothing_outside_the_volume() {
    // Issue 11.6: `subPath: esc2/newdir` with `esc2 -> /host/dir` planted by a container made
    // a 0777 directory on the host before the "resolves outside" refusal.
    let a = Agent::start("subpathesc", &[]);
    let victim = a.dir.join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    let v = victim.display();
    a.write(
        "esc.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: esc}}\nspec:\n  initContainers:\n  - name: plant\n    image: {IMAGE}\n    command: [sh, -c, \"ln -s {v} /w/esc2 && mkdir -p /w/real && ln -s real /w/inside\"]\n    volumeMounts: [{{name: w, mountPath: /w}}]\n  containers:\n  - name: out\n    image: {IMAGE}\n    command: [sleep, \"600\"]\n    volumeMounts: [{{name: w, mountPath: /x, subPath: esc2/newdir}}]\n  - name: in\n    image: {IMAGE}\n    command: [sh, -c, \"echo ok > /y/f && sleep 600\"]\n    volumeMounts: [{{name: w, mountPath: /y, subPath: inside/sub}}]\n  volumes: [{{name: w, emptyDir: {{}}}}]\n"
        ),
    );
    let p = a.wait_for("esc", "the escaping subPath refused, the other running", T, |p| {
        waiting_reason(p, "out").as_deref() == Some("CreateContainerConfigError") && running(p, "in")
    });
    let msg = waiting_message(&p, "out").unwrap();
    assert!(msg.contains("resolves outside the volume"), "{msg}");
    assert_eq!(
        std::fs::read_dir(&victim).unwrap().count(),
        0,
        "nothing made outside the volume"
    );
    // A symlink that stays inside the volume works, and the container writes where it was led.
    let uid = p.metadata.uid.clone().unwrap();
    let real = a
        .root
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/w/real/sub/f");
    for _ in 0..100 {
        if real.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(std::fs::read_to_string(&real).unwrap().trim(), "ok");
}

/// runtime.go's "should run with the expected status": a container that fails once, then
/// succeeds, then runs, under each restart policy.
#[test]
fn expected_status_under_each_restart_policy() {
    let a = Agent::start("expected", &[]);
    let script = "echo x >> /restart-count/restartCount; n=$(wc -l < /restart-count/restartCount); if [ $n -eq 1 ]; then exit 1; fi; if [ $n -eq 2 ]; then exit 0; fi; while true; do sleep 1; done";
    for (name, policy) in [("rpa", "Always"), ("rpof", "OnFailure"), ("rpn", "Never")] {
        a.write(
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: {policy}\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sh, -c, {script:?}]\n    volumeMounts: [{{name: rc, mountPath: /restart-count}}]\n  volumes: [{{name: rc, emptyDir: {{medium: Memory}}}}]\n"
            ),
        );
    }
    let p = a.wait_for("rpa", "running after two restarts", T, |p| {
        restarts(p, "c") == 2 && running(p, "c")
    });
    assert_eq!(phase_of(Some(&p)), Some("Running"));
    let p = a.wait_phase("rpof", "Succeeded", T);
    assert_eq!(restarts(&p, "c"), 1);
    assert!(container_status(&p, "c").state.as_ref().unwrap().terminated.is_some());
    let p = a.wait_phase("rpn", "Failed", T);
    assert_eq!(restarts(&p, "c"), 0);
    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .unwrap()
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    };
    assert!(ready(&a.pod("rpa").unwrap()));
    assert!(!ready(&a.pod("rpof").unwrap()) && !ready(&a.pod("rpn").unwrap()));
}
