//! The agent's main job, with real pods: static pods from a manifest directory, as kubelet runs
//! them. Each test runs its own `ferrolet run` (see common/mod.rs).

mod common;

use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(30);

#[test]
fn add_update_remove_manifests() {
    let a = Agent::start("addupd", &[]);
    a.write("hello.yaml", &pod_yaml("hello", "Always", "echo v1; sleep 3600"));
    let p1 = a.wait_phase("hello", "Running", T);
    let uid1 = p1.metadata.uid.clone().unwrap();
    assert_eq!(p1.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(p1.spec.as_ref().unwrap().node_name.as_deref(), Some(a.node.as_str()));
    assert_eq!(
        p1.metadata.annotations.as_ref().unwrap()["kubernetes.io/config.source"],
        "file"
    );
    a.wait_logs("hello", "", "v1");
    // The pod's worker let go of its cgroup migration hold once its container was created:
    // the warm thread ends with the last hold, where a hold kept would keep it running for
    // 5 s after the newest one (docs/start-path.md, "The cgroup migration wait").
    let warm_threads = || {
        std::fs::read_dir(format!("/proc/{}/task", a.pid()))
            .unwrap()
            .flatten()
            .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "ferrolet-cgwarm"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    while warm_threads() > 0 {
        assert!(
            Instant::now() < deadline,
            "the cgroup migration warm thread outlived the pod's start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Once the pod's start settled, the agent gave back what it used (docs/agent.md, "Code
    // pages"), without waiting for the minute's round.
    a.wait_log("released unused memory: pods settled", Duration::from_secs(5));
    // A changed manifest is a new pod (new UID); the old one is terminated.
    a.write("hello.yaml", &pod_yaml("hello", "Always", "echo v2; sleep 3600"));
    let p2 = a.wait_pod("hello", "the new version running", T, |p| {
        p.is_some_and(|p| p.metadata.uid.as_deref() != Some(uid1.as_str()) && phase_of(Some(p)) == Some("Running"))
    });
    a.wait_logs("hello", "", "v2");
    assert_eq!(a.pods().len(), 1, "the old version is gone");
    let _ = p2;
    // Removing the file deletes the pod and everything it had.
    a.remove("hello.yaml");
    a.wait_gone("hello", T);
    let pods_dir = a.root.join("pods");
    let deadline = Instant::now() + T;
    while std::fs::read_dir(&pods_dir).map(|d| d.count()).unwrap_or(0) > 0 {
        assert!(Instant::now() < deadline, "pod state left behind");
        std::thread::sleep(Duration::from_millis(100));
    }
    let containers = std::fs::read_dir(a.root.join("containers")).unwrap().count();
    assert_eq!(containers, 0, "containers left behind");
}

#[test]
fn init_containers_run_in_order_then_app() {
    let a = Agent::start("initorder", &[]);
    a.write(
        "init.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: init}}
spec:
  initContainers:
  - {{name: one, image: {IMAGE}, command: [sh, -c, "echo -n 1 >> /work/order"], volumeMounts: [{{name: w, mountPath: /work}}]}}
  - {{name: two, image: {IMAGE}, command: [sh, -c, "sleep 0.3; echo -n 2 >> /work/order"], volumeMounts: [{{name: w, mountPath: /work}}]}}
  containers:
  - {{name: app, image: {IMAGE}, command: [sh, -c, "echo order=$(cat /work/order); sleep 3600"], volumeMounts: [{{name: w, mountPath: /work}}]}}
  volumes: [{{name: w, emptyDir: {{}}}}]
"#
        ),
    );
    let p = a.wait_phase("init", "Running", T);
    a.wait_logs("init", "container=app", "order=12");
    let st = p.status.as_ref().unwrap();
    let inits = st.init_container_statuses.as_ref().unwrap();
    for i in inits {
        let t = i.state.as_ref().unwrap().terminated.as_ref().expect("init terminated");
        assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")));
    }
    let cond = |t: &str| {
        st.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == t)
            .unwrap()
            .status
            .clone()
    };
    assert_eq!(cond("Initialized"), "True");
    assert_eq!(cond("Ready"), "True");
}

#[test]
fn failing_init_container_restart_policies() {
    let a = Agent::start("initfail", &[]);
    let pod = |name: &str, policy: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: {policy}
  initContainers:
  - {{name: bad, image: {IMAGE}, command: [sh, -c, "exit 2"]}}
  containers:
  - {{name: app, image: {IMAGE}, command: [sleep, "3600"]}}
"#
        )
    };
    a.write("never.yaml", &pod("never", "Never"));
    a.write("always.yaml", &pod("always", "Always"));
    // Never: the pod fails and the app container never starts.
    let p = a.wait_phase("never", "Failed", T);
    let bad = container_status(&p, "bad");
    assert_eq!(bad.state.as_ref().unwrap().terminated.as_ref().unwrap().exit_code, 2);
    assert!(container_status(&p, "app").container_id.is_none(), "app must not start");
    // Always: the init container is retried under back-off; the pod stays Pending.
    let p = a.wait_for("always", "init restarted twice", T, |p| restarts(p, "bad") >= 2);
    assert_eq!(phase_of(Some(&p)), Some("Pending"));
    assert!(container_status(&p, "app").container_id.is_none());
    let out = a.cli(&["pods"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("Init:") && table.contains("always-"), "{table}");
}

#[test]
fn sidecar_keeps_running_beside_the_app() {
    let a = Agent::start("sidecar", &[]);
    a.write(
        "side.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: side}}
spec:
  initContainers:
  - name: logger
    image: {IMAGE}
    restartPolicy: Always
    command: [sh, -c, "while true; do date >> /shared/log; sleep 0.2; done"]
    volumeMounts: [{{name: s, mountPath: /shared}}]
  - {{name: after, image: {IMAGE}, command: [sh, -c, "test -s /shared/log"], volumeMounts: [{{name: s, mountPath: /shared}}]}}
  containers:
  - {{name: app, image: {IMAGE}, command: [sh, -c, "sleep 1; wc -l < /shared/log; sleep 3600"], volumeMounts: [{{name: s, mountPath: /shared}}]}}
  volumes: [{{name: s, emptyDir: {{}}}}]
"#
        ),
    );
    let p = a.wait_phase("side", "Running", T);
    assert!(running(&p, "logger"), "the sidecar runs");
    assert!(running(&p, "app"));
    let after = container_status(&p, "after");
    assert_eq!(
        after.state.as_ref().unwrap().terminated.as_ref().unwrap().exit_code,
        0,
        "the next init container saw the sidecar's output"
    );
    std::thread::sleep(Duration::from_millis(1500));
    let n: u32 = a.logs("side", "container=app").trim().parse().expect("a line count");
    assert!(n > 2, "sidecar kept writing: {n}");
    let table = String::from_utf8_lossy(&a.cli(&["pods"]).stdout).to_string();
    assert!(table.contains("2/2"), "sidecar counts in READY: {table}");
}

#[test]
fn restart_policies_exit_0_and_1() {
    let a = Agent::start("restarts", &[]);
    let cases = [
        ("always-ok", "Always", 0),
        ("always-fail", "Always", 1),
        ("onfailure-ok", "OnFailure", 0),
        ("onfailure-fail", "OnFailure", 1),
        ("never-ok", "Never", 0),
        ("never-fail", "Never", 1),
    ];
    for (name, policy, code) in cases {
        a.write(
            &format!("{name}.yaml"),
            &pod_yaml(name, policy, &format!("echo run; exit {code}")),
        );
    }
    // Restarting ones: restart count grows, last state is the exit, reason CrashLoopBackOff.
    // Six pods start at once and each restarts twice: in the v2 guest under CI's load the
    // first starts alone took 20 s, so the wait is for a count that never grows, not a speed.
    for name in ["always-ok", "always-fail", "onfailure-fail"] {
        let p = a.wait_for(name, "restarted twice", Duration::from_secs(120), |p| {
            restarts(p, "main") >= 2
        });
        let c = container_status(&p, "main");
        let last = c
            .last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .expect("lastState.terminated");
        assert!(last.container_id.is_some());
        assert_eq!(phase_of(Some(&p)), Some("Running"), "{name}");
    }
    let p = a.wait_for("always-fail", "CrashLoopBackOff", T, |p| {
        waiting_reason(p, "main").as_deref() == Some("CrashLoopBackOff")
    });
    let msg = waiting_message(&p, "main").unwrap();
    assert!(
        msg.contains("back-off") && msg.contains("restarting failed container=main"),
        "{msg}"
    );
    // Finished ones stay finished.
    for (name, phase, code, reason) in [
        ("onfailure-ok", "Succeeded", 0, "Completed"),
        ("never-ok", "Succeeded", 0, "Completed"),
        ("never-fail", "Failed", 1, "Error"),
    ] {
        let p = a.wait_phase(name, phase, T);
        let t = container_status(&p, "main")
            .state
            .as_ref()
            .unwrap()
            .terminated
            .clone()
            .expect("terminated");
        assert_eq!((t.exit_code, t.reason.as_deref()), (code, Some(reason)), "{name}");
        assert_eq!(restarts(&p, "main"), 0, "{name} never restarts");
    }
}

#[test]
fn crash_loop_back_off_grows() {
    let a = Agent::start("backoff", &[]);
    a.write("crash.yaml", &pod_yaml("crash", "Always", "date +%s%N; exit 1"));
    // initial back-off 1s (test setting): restarts wait 0, 1, 2, 4 s.
    a.wait_for("crash", "4 restarts", Duration::from_secs(40), |p| {
        restarts(p, "main") >= 4
    });
    // Start times of attempts 1..4 from the terminated states we saw: use the agent's log.
    let log = a.agent_log();
    let starts: Vec<f64> = log
        .lines()
        .filter(|l| l.contains("Started container main"))
        .filter_map(|l| chrono::DateTime::parse_from_rfc3339(l.split_whitespace().next()?).ok())
        .map(|t| t.timestamp_millis() as f64 / 1000.0)
        .collect();
    assert!(starts.len() >= 5, "{starts:?}");
    let gaps: Vec<f64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    // Each wait at least the back-off, and growing.
    assert!(gaps[1] >= 0.9 && gaps[2] >= 1.9 && gaps[3] >= 3.9, "gaps {gaps:?}");
    assert!(gaps[3] > gaps[2] && gaps[2] > gaps[1], "back-off grows: {gaps:?}");
}

#[test]
fn graceful_termination_honours_grace_period() {
    let a = Agent::start("grace", &[]);
    let marks = scratch(&a.dir, "marks");
    let pod = |name: &str, grace: u32, script: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: {grace}
  containers:
  - name: main
    image: {IMAGE}
    command: [sh, -c, {script:?}]
    volumeMounts: [{{name: m, mountPath: /marks}}]
  volumes: [{{name: m, hostPath: {{path: {}, type: Directory}}}}]
"#,
            marks.display()
        )
    };
    // Exits on TERM: deletion finishes quickly, well inside the 20s grace period.
    a.write(
        "trap.yaml",
        &pod(
            "trap",
            20,
            "trap 'echo term > /marks/trap; exit 0' TERM; while true; do sleep 0.1; done",
        ),
    );
    // Keep running after TERM, writing the time since TERM until SIGKILL comes: at the end of
    // the 2 s grace period, and for grace 0 after 1 s (kubelet's pod workers give a pod's
    // termination at least 1 s; the 2 s minimum is for containers killed in a running pod).
    // Appended, a line each time: a KILL between a truncating open and its write left the file
    // empty once, on a busy machine.
    let counting = |file: &str| {
        format!(
            "trap 'a=$EPOCHREALTIME; while true; do echo \"$a $EPOCHREALTIME\" >> /marks/{file}; sleep 0.1; done' TERM; \
             while true; do sleep 0.1; done"
        )
    };
    a.write("stubborn.yaml", &pod("stubborn", 2, &counting("stubborn")));
    a.write("brief.yaml", &pod("brief", 0, &counting("brief")));
    a.wait_phase("trap", "Running", T);
    a.wait_phase("stubborn", "Running", T);
    a.wait_phase("brief", "Running", T);
    let t0 = Instant::now();
    a.remove("trap.yaml");
    a.wait_gone("trap", T);
    let quick = t0.elapsed();
    assert_eq!(
        std::fs::read_to_string(marks.join("trap")).unwrap_or_default().trim(),
        "term",
        "the container got SIGTERM"
    );
    assert!(
        quick < Duration::from_secs(8),
        "exited on TERM, not after the grace period: {quick:?}"
    );
    let t1 = Instant::now();
    a.remove("stubborn.yaml");
    a.wait_gone("stubborn", T);
    let slow = t1.elapsed();
    assert!(
        slow >= Duration::from_millis(1900) && slow < Duration::from_secs(10),
        "killed after the grace period: {slow:?}"
    );
    a.remove("brief.yaml");
    a.wait_gone("brief", T);
    // Seconds from the trap's start to its last write before KILL: a tenth or two short of the
    // time between TERM and KILL, more when the machine is busy (and KILL may come late).
    let lived = |file: &str| -> f64 {
        let text = std::fs::read_to_string(marks.join(file)).unwrap_or_default();
        // The last whole line (a KILL may cut the one being written).
        let last = text.lines().rev().find_map(|l| {
            let t: Vec<f64> = l.split_whitespace().filter_map(|v| v.parse().ok()).collect();
            match t[..] {
                [a, b] => Some(b - a),
                _ => None,
            }
        });
        last.unwrap_or_else(|| panic!("{file}: no times after TERM: {text:?}"))
    };
    let (stubborn, brief) = (lived("stubborn"), lived("brief"));
    assert!(
        (1.4..2.8).contains(&stubborn),
        "2 s between TERM and KILL: {stubborn:.2} s"
    );
    assert!(
        (0.5..1.6).contains(&brief),
        "1 s between TERM and KILL for grace 0: {brief:.2} s"
    );
}

#[test]
fn broken_manifest_beside_good_ones() {
    let a = Agent::start("broken", &[]);
    a.write("good.yaml", &pod_yaml("good", "Always", "sleep 3600"));
    a.write(
        "bad.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bad\nspec:\n  containers: [ {name: x, image: busybox\n",
    );
    a.write("invalid.yaml", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: invalid\nspec:\n  restartPolicy: Sometimes\n  containers:\n  - name: x\n    image: busybox\n");
    a.write(".hidden.yaml", "not even yaml: [");
    a.wait_phase("good", "Running", T);
    let v = a.ferrolet_pods();
    let errs = v["manifestErrors"].as_object().unwrap();
    let find = |f: &str| {
        errs.iter()
            .find(|(k, _)| k.ends_with(f))
            .map(|(_, v)| v.as_str().unwrap().to_string())
    };
    assert!(find("bad.yaml").unwrap().contains("YAML"), "{errs:?}");
    assert!(find("invalid.yaml").unwrap().contains("spec.restartPolicy"), "{errs:?}");
    assert!(find(".hidden.yaml").is_none(), "dot files are ignored");
    let table = String::from_utf8_lossy(&a.cli(&["pods"]).stdout).to_string();
    assert!(
        table.contains("bad.yaml") && table.contains("MANIFESTS NOT RUNNING"),
        "{table}"
    );
    // Fixing the file runs it; the good pod was never disturbed.
    let good_id = container_status(&a.pod("good").unwrap(), "main").container_id.clone();
    a.write("bad.yaml", &pod_yaml("bad", "Always", "sleep 3600"));
    a.wait_phase("bad", "Running", T);
    assert_eq!(container_status(&a.pod("good").unwrap(), "main").container_id, good_id);
    // A good file turned bad keeps its last good version running.
    a.write("good.yaml", "kind: Pod\nthis is: [broken");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(container_status(&a.pod("good").unwrap(), "main").container_id, good_id);
    assert!(a.ferrolet_pods()["manifestErrors"]
        .as_object()
        .unwrap()
        .keys()
        .any(|k| k.ends_with("good.yaml")));
}

/// Numbers a manifest may carry past Kubernetes' ranges are manifest errors, never a panic:
/// an activeDeadlineSeconds of i64::MAX panicked the pod's worker every 5 s and the pod was
/// neither listed nor reported. A pod with the longest grace period Kubernetes allows runs and
/// goes away as any other.
#[test]
fn numbers_out_of_range_are_manifest_errors_not_panics() {
    let a = Agent::start("ranges", &[]);
    let with = |name: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n{extra}  containers:\n  - name: main\n    image: {IMAGE}\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1; done\"]\n"
        )
    };
    a.write(
        "deadline.yaml",
        &with("deadline", "  activeDeadlineSeconds: 9223372036854775807\n"),
    );
    a.write(
        "grace.yaml",
        &with("grace", "  terminationGracePeriodSeconds: 9223372036854775807\n"),
    );
    a.write("probe.yaml", &format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: probe}}\nspec:\n  containers:\n  - name: main\n    image: {IMAGE}\n    livenessProbe: {{exec: {{command: [\"true\"]}}, periodSeconds: -3}}\n"
    ));
    a.wait_phase("grace", "Running", T);
    let errs = a.ferrolet_pods()["manifestErrors"].clone();
    let text = errs.to_string();
    assert!(
        text.contains("spec.activeDeadlineSeconds: Invalid value: 9223372036854775807"),
        "{text}"
    );
    assert!(
        text.contains("livenessProbe.periodSeconds: Invalid value: -3"),
        "{text}"
    );
    assert!(a.pod("deadline").is_none() && a.pod("probe").is_none());
    a.remove("grace.yaml");
    a.wait_gone("grace", T);
    assert!(!a.agent_log().contains("panicked"), "{}", tail(&a.agent_log(), 40));
}

#[test]
fn missing_image_is_reported() {
    let a = Agent::start("noimage", &[]);
    a.write("pull.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: pull}\nspec:\n  containers:\n  - {name: c, image: 127.0.0.1:1/nothing:1}\n");
    a.write("never.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: never}\nspec:\n  containers:\n  - {name: c, image: 127.0.0.1:1/nothing:1, imagePullPolicy: Never}\n");
    let p = a.wait_for("pull", "image pull failure", T, |p| {
        matches!(
            waiting_reason(p, "c").as_deref(),
            Some("ErrImagePull") | Some("ImagePullBackOff")
        )
    });
    assert_eq!(phase_of(Some(&p)), Some("Pending"));
    a.wait_for("pull", "ImagePullBackOff", T, |p| {
        waiting_reason(p, "c").as_deref() == Some("ImagePullBackOff")
    });
    let p = a.wait_for("never", "ErrImageNeverPull", T, |p| {
        waiting_reason(p, "c").as_deref() == Some("ErrImageNeverPull")
    });
    let msg = waiting_message(&p, "c").unwrap();
    assert!(msg.contains("127.0.0.1:1/nothing:1") && msg.contains("Never"), "{msg}");
}

/// Each container's `buildMounts` from its monitor.json: how many mounts the namespace it was
/// built in had, absent when it was built in the host's.
fn build_mounts(root: &std::path::Path) -> Vec<(String, Option<u64>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root.join("containers")).unwrap().flatten() {
        let Ok(text) = std::fs::read_to_string(e.path().join("monitor.json")) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        out.push((
            e.file_name().to_string_lossy().into_owned(),
            v.get("buildMounts").and_then(|n| n.as_u64()),
        ));
    }
    out
}

/// The agent builds containers in mount namespaces of their own (ferrolet_runtime::mount_ns),
/// except when pods' mounts are below a root dir that is not a mount point yet (an upgrade
/// with pods running): then it says so and builds them in its own namespace, as before. Either
/// way the pods run, and reset leaves no mount behind.
#[test]
fn containers_are_built_in_their_own_mount_namespace_unless_the_root_has_mounts() {
    let mut a = Agent::start("mntns", &[]);
    a.write("iso.yaml", &pod_yaml("iso", "Always", "sleep 3600"));
    a.wait_phase("iso", "Running", T);
    let built = build_mounts(&a.root);
    assert_eq!(built.len(), 1, "{built:?}");
    assert!(built[0].1.is_some(), "a namespace of its own: {built:?}");
    assert!(a
        .agent_log()
        .contains("containers are built in mount namespaces without the pods' mounts"));
    a.stop();
    let out = a.reset().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // What an older agent left: a mount below a root that is not a mount point.
    let leftover = a.root.join("pods").join("leftover");
    std::fs::create_dir_all(&leftover).unwrap();
    mount_tmpfs(&leftover);
    a.restart();
    a.write("legacy.yaml", &pod_yaml("legacy", "Always", "sleep 3600"));
    a.wait_phase("legacy", "Running", T);
    // iso.yaml is still in the manifest dir: its pod comes back too (both are counted).
    a.wait_phase("iso", "Running", T);
    a.wait_log("containers are built in the host's mount namespace", T);
    let built = build_mounts(&a.root);
    assert_eq!(built.len(), 2, "{built:?}");
    assert!(
        built.iter().all(|(_, n)| n.is_none()),
        "the agent's namespace: {built:?}"
    );
    a.stop();
    let out = a.reset().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let root = format!("{}", std::fs::canonicalize(&a.root).unwrap().display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let left: Vec<&str> = mounts
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&root)))
        .collect();
    assert!(left.is_empty(), "mounts left behind: {left:#?}");
}

#[test]
fn agent_kill9_and_restart_keeps_containers() {
    let mut a = Agent::start("kill9", &[]);
    a.write(
        "keep.yaml",
        &pod_yaml("keep", "Always", "while true; do echo tick; sleep 0.2; done"),
    );
    a.write("crashy.yaml", &pod_yaml("crashy", "Always", "exit 1"));
    let before = a.wait_phase("keep", "Running", T);
    let crashy = a.wait_for("crashy", "one restart", T, |p| restarts(p, "main") >= 1);
    let id = container_status(&before, "main").container_id.clone().unwrap();
    let started = running_since(&before, "main");
    a.restart();
    let after = a.wait_phase("keep", "Running", T);
    let c = container_status(&after, "main");
    assert_eq!(
        c.container_id.as_deref(),
        Some(id.as_str()),
        "same container after the agent restart"
    );
    assert_eq!(c.restart_count, 0);
    assert_eq!(c.state.as_ref().unwrap().running.as_ref().unwrap().started_at, started);
    assert_eq!(
        after.status.as_ref().unwrap().start_time,
        before.status.as_ref().unwrap().start_time,
        "start time carried over"
    );
    // Restart counts carry over too.
    let p = a.pod("crashy").unwrap();
    assert!(restarts(&p, "main") >= restarts(&crashy, "main"));
    a.wait_logs("keep", "tailLines=1", "tick");
}

#[test]
fn admission_max_pods_and_unsupported_features() {
    let a = Agent::start("admit", &["--max-pods", "1"]);
    a.write("a.yaml", &pod_yaml("a", "Always", "sleep 3600"));
    a.wait_phase("a", "Running", T);
    a.write("b.yaml", &pod_yaml("b", "Always", "sleep 3600"));
    let b = a.wait_phase("b", "Failed", T);
    assert_eq!(b.status.as_ref().unwrap().reason.as_deref(), Some("OutOfpods"));
    // (configMap volumes of static pods are served from the static pod path: tests/volumes.rs.)
    a.write("runtimeclass.yaml", &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: rc}}\nspec:\n  runtimeClassName: kata\n  containers:\n  - {{name: c, image: {IMAGE}}}\n"));
    let u = a.wait_phase("rc", "Failed", T);
    let st = u.status.as_ref().unwrap();
    assert_eq!(st.reason.as_deref(), Some("UnsupportedPodSpec"));
    assert!(st.message.as_deref().unwrap().contains("runtimeClassName"), "{st:?}");
}

#[test]
fn logs_and_exec_through_the_cli() {
    let a = Agent::start("cli", &[]);
    a.write(
        "talk.yaml",
        &pod_yaml(
            "talk",
            "Always",
            "for i in 1 2 3 4 5; do echo line $i; done; echo oops >&2; sleep 3600",
        ),
    );
    let p = a.wait_phase("talk", "Running", T);
    let name = p.metadata.name.clone().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = a.cli(&["logs", &name, "--tail", "2"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "line 5\noops\n");
    // The manifest name works too.
    let out = a.cli(&["logs", "talk", "-c", "main", "--timestamps", "--tail", "1"]);
    let s = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(s.ends_with(" oops\n") && s.contains('T'), "{s}");
    let out = a.cli(&["exec", &name, "--", "sh", "-c", "echo hi from $(hostname); exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("hi from {name}\n"));
    let out = a.cli(&["exec", "nosuchpod", "--", "true"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    let out = a.cli(&["pods", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["items"][0]["metadata"]["name"], name.as_str());
    let out = a.cli(&["pods", "-o", "yaml"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("kind: List"));
}

#[test]
fn previous_logs_after_a_restart() {
    let a = Agent::start("prev", &[]);
    a.write(
        "once.yaml",
        &pod_yaml(
            "once",
            "Always",
            "echo attempt-$(cat /proc/sys/kernel/random/uuid | cut -c1-8); sleep 1; exit 1",
        ),
    );
    a.wait_for("once", "restarted", T, |p| {
        restarts(p, "main") >= 1 && running(p, "main")
    });
    let prev = a.logs("once", "previous=true");
    // Running says the container started, not that its first line is logged yet (the
    // container runs `cat | cut` first; on a loaded machine that took longer than the status).
    let deadline = std::time::Instant::now() + T;
    let mut cur = a.logs("once", "");
    while cur.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        cur = a.logs("once", "");
    }
    assert!(
        prev.starts_with("attempt-") && cur.starts_with("attempt-") && prev != cur,
        "{prev:?} vs {cur:?}"
    );
    // Issue 11.9: bad options are refused as kubelet refuses them; sinceTime is honoured.
    let path = format!("/containerLogs/default/once-{}/main", a.node);
    for bad in ["sinceSeconds=-5", "sinceTime=garbage", "tailLines=-1", "limitBytes=0"] {
        let (code, body) = a.get(&format!("{path}?{bad}")).unwrap();
        assert_eq!(code, 400, "{bad}: {}", String::from_utf8_lossy(&body));
    }
    assert_eq!(a.logs("once", "sinceTime=2100-01-01T00:00:00Z"), "");
}

#[test]
fn follow_streams_until_the_container_exits() {
    let a = Agent::start("follow", &[]);
    a.write(
        "f.yaml",
        &pod_yaml("f", "Never", "for i in 1 2 3; do echo n$i; sleep 0.5; done"),
    );
    a.wait_for("f", "started", T, |p| running(p, "main"));
    let t0 = Instant::now();
    let s = a.logs("f", "follow=true");
    assert_eq!(s, "n1\nn2\nn3\n");
    assert!(t0.elapsed() < Duration::from_secs(10));
}

/// This test process's open files limit up to its hard limit (floods open many sockets).
fn raise_nofile() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
}

#[test]
fn http_pods_endpoint_and_config_errors() {
    let port = free_port();
    let a = Agent::start_with_config("http", &[], &format!("readOnlyPort: {port}\n"));
    a.write("web.yaml", &pod_yaml("web", "Always", "sleep 3600"));
    a.wait_phase("web", "Running", T);
    let get = |path: &str| -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(get("/healthz").ends_with("ok"));
    let body = get("/pods");
    let json = &body[body.find("\r\n\r\n").unwrap() + 4..];
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(
        (v["kind"].as_str(), v["apiVersion"].as_str()),
        (Some("PodList"), Some("v1"))
    );
    let item = &v["items"][0];
    assert_eq!(item["status"]["phase"], "Running");
    assert_eq!(
        item["spec"]["containers"][0]["terminationMessagePath"],
        "/dev/termination-log"
    );
    assert!(item["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .starts_with("ferrolet://"));
    // Issue 11.8: the unauthenticated port serves no logs and no manifest errors (they quote
    // files); the owner-only CLI socket does.
    for path in [
        "/containerLogs/default/web-node-http/main",
        "/ferrolet/pods",
        "/ferrolet/logs/default/web",
    ] {
        assert!(get(path).starts_with("HTTP/1.0 404"), "{path} on the read-only port");
    }
    assert_eq!(a.get("/ferrolet/pods").unwrap().0, 200);
    // Issue 11.1: a flood of connections is capped; the agent keeps working meanwhile.
    raise_nofile();
    let flood: Vec<std::net::TcpStream> = (0..1100)
        .filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let closed = flood
        .iter()
        .filter(|s| {
            use std::io::Read;
            s.set_nonblocking(true).unwrap();
            matches!((&**s).read(&mut [0u8; 1]), Ok(0))
        })
        .count();
    assert!(closed >= 1100 - 1024, "connections beyond the cap are closed: {closed}");
    a.write("more.yaml", &pod_yaml("more", "Always", "sleep 3600"));
    a.wait_phase("more", "Running", T);
    drop(flood);

    // Bad configuration: a clear error naming the field, non-zero exit.
    let cfg = a.dir.join("bad.yaml");
    std::fs::write(
        &cfg,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsyncFrequency: soon\n",
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("syncFrequency"), "{err}");
    std::fs::write(
        &cfg,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnoSuchField: 1\n",
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("noSuchField"));
    let out = std::process::Command::new(BIN)
        .args(["run", "--max-pods", "lots"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max-pods"));
}

#[test]
fn manifest_url_source() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = std::sync::Arc::new(std::sync::Mutex::new(pod_yaml(
        "remote",
        "Always",
        "echo from-url; sleep 3600",
    )));
    let served = body.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 2048];
            let n = s.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).to_string();
            let ok = req.contains("x-token: secret");
            let b = served.lock().unwrap().clone();
            let resp = if ok {
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                    b.len()
                )
            } else {
                "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string()
            };
            let _ = s.write_all(resp.as_bytes());
        }
    });
    let url = format!("http://127.0.0.1:{port}/pods.yaml");
    let a = Agent::start(
        "url",
        &[
            "--manifest-url",
            &url,
            "--manifest-url-header",
            "x-token:secret",
            "--http-check-frequency",
            "1s",
        ],
    );
    let p = a.wait_phase("remote", "Running", T);
    assert_eq!(
        p.metadata.annotations.as_ref().unwrap()["kubernetes.io/config.source"],
        "http"
    );
    a.wait_logs("remote", "", "from-url");
    *body.lock().unwrap() = pod_yaml("remote2", "Always", "sleep 3600");
    a.wait_phase("remote2", "Running", T);
    a.wait_gone("remote", T);
}

#[test]
fn pod_cgroup_tree_limits_and_oom_killed() {
    let a = Agent::start("cgtree", &[]);
    a.write(
        "tree.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: tree}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sleep, \"3600\"]\n    resources:\n      requests: {{cpu: 100m, memory: 32Mi}}\n      limits: {{memory: 64Mi}}\n"
        ),
    );
    a.write(
        "oom.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: oom}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [dd, if=/dev/zero, of=/dev/null, bs=67108864, count=1]\n    resources:\n      limits: {{memory: 16Mi, cpu: 500m}}\n"
        ),
    );
    let p = a.wait_phase("tree", "Running", T);
    assert_eq!(p.status.as_ref().unwrap().qos_class.as_deref(), Some("Burstable"));
    let cg = ferrolet_runtime::cgroups::Cgroups::detect().unwrap();
    let uid = p.metadata.uid.clone().unwrap();
    let id = container_id(&p, "c");
    let kubepods = format!("{}/kubepods", a.cgroup.path());
    let pod_cg = format!("{kubepods}/burstable/pod{uid}");
    let ctr_cg = format!("{pod_cg}/{id}");
    let mem = |cgroup: &str, v1: &str, v2: &str| {
        let d = cg.dir_for("memory", cgroup).unwrap();
        std::fs::read_to_string(d.join(if cg.is_v2() { v2 } else { v1 }))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    assert_eq!(
        mem(&ctr_cg, "memory.limit_in_bytes", "memory.max"),
        (64u64 << 20).to_string(),
        "container limit"
    );
    assert_eq!(
        mem(&pod_cg, "memory.limit_in_bytes", "memory.max"),
        (64u64 << 20).to_string(),
        "pod limit"
    );
    let cpu = cg.dir_for("cpu", &pod_cg).unwrap();
    if cg.is_v2() {
        assert_eq!(
            std::fs::read_to_string(cpu.join("cpu.weight")).unwrap().trim(),
            "4",
            "100m -> 102 shares -> weight 4"
        );
        for level in [kubepods.clone(), format!("{kubepods}/burstable"), pod_cg.clone()] {
            let sc =
                std::fs::read_to_string(cg.dir_for("memory", &level).unwrap().join("cgroup.subtree_control")).unwrap();
            assert!(
                sc.contains("memory") && sc.contains("cpu") && sc.contains("pids"),
                "{level}: {sc}"
            );
        }
    } else {
        assert_eq!(std::fs::read_to_string(cpu.join("cpu.shares")).unwrap().trim(), "102");
    }
    let o = a.wait_phase("oom", "Failed", T);
    assert_oom_killed(&o, "c");
    assert_eq!(o.status.as_ref().unwrap().qos_class.as_deref(), Some("Guaranteed"));
    let guaranteed = format!("{kubepods}/pod{}", o.metadata.uid.clone().unwrap());
    let mem_dir = cg.dir_for("memory", &guaranteed).unwrap();
    assert!(mem_dir.exists(), "guaranteed pods sit directly under kubepods");
    // Deleting the pods removes their cgroups.
    a.remove("tree.yaml");
    a.remove("oom.yaml");
    a.wait_gone("tree", T);
    a.wait_gone("oom", T);
    assert!(!cg.dir_for("memory", &pod_cg).unwrap().exists(), "pod cgroup removed");
}

#[test]
fn default_cgroup_root_is_the_agents_own_cgroup() {
    let a = Agent::start_in_own_cgroup("owncg");
    a.write("p.yaml", &pod_yaml("p", "Always", "sleep 3600"));
    let p = a.wait_phase("p", "Running", T);
    let cg = ferrolet_runtime::cgroups::Cgroups::detect().unwrap();
    let uid = p.metadata.uid.clone().unwrap();
    let pod_cg = format!("{}/kubepods/besteffort/pod{uid}", a.cgroup.path());
    assert!(
        cg.dir_for("memory", &pod_cg).unwrap().is_dir(),
        "kubepods lives in the agent's own cgroup"
    );
    if cg.is_v2() {
        // The agent (and its zygote) moved into a leaf so its cgroup could delegate controllers.
        let own = cg.dir_for("memory", a.cgroup.path()).unwrap();
        let leaf: Vec<u32> = std::fs::read_to_string(own.join("ferrolet.agent/cgroup.procs"))
            .unwrap()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect();
        assert!(leaf.contains(&a.pid()), "agent {} in the leaf: {leaf:?}", a.pid());
        assert_eq!(
            std::fs::read_to_string(own.join("cgroup.procs")).unwrap().trim(),
            "",
            "no process left in the parent"
        );
    }
}

#[test]
fn reset_removes_what_the_agent_made() {
    let mut a = Agent::start_in_own_cgroup("reset");
    let with_resources =
        |name: &str, resources: &str| format!("{}    resources: {resources}\n", pod_yaml(name, "Always", "sleep 3600"));
    a.write("g.yaml", &with_resources("g", "{limits: {cpu: 100m, memory: 32Mi}}"));
    a.write("b.yaml", &with_resources("b", "{requests: {cpu: 50m}}"));
    a.write("e.yaml", &pod_yaml("e", "Always", "sleep 3600"));
    for p in ["g", "b", "e"] {
        a.wait_phase(p, "Running", T);
    }
    let cg = ferrolet_runtime::cgroups::Cgroups::detect().unwrap();
    let kubepods = format!("{}/kubepods", a.cgroup.path());
    assert!(cg.dir_for("memory", &kubepods).unwrap().is_dir());
    // Stopped, the agent leaves its pods running; reset takes everything away.
    a.stop();
    let out = a.reset().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rel = kubepods.trim_start_matches('/');
    for m in cg.mounts() {
        assert!(!m.join(rel).exists(), "{} left behind", m.join(rel).display());
        assert!(
            !m.join(a.cgroup.path().trim_start_matches('/'))
                .join("ferrolet.agent")
                .exists(),
            "the agent's leaf cgroup left behind under {}",
            m.display()
        );
    }
    let root = a.root.display().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&root)).collect();
    assert!(left.is_empty(), "mounts left behind: {left:#?}");
    for sub in ["containers", "pods"] {
        let n = std::fs::read_dir(a.root.join(sub)).map(|d| d.count()).unwrap_or(0);
        assert_eq!(n, 0, "{sub} left behind");
    }
    let n = std::fs::read_dir(&a.logs).map(|d| d.count()).unwrap_or(0);
    assert_eq!(n, 0, "pod logs left behind");
}

#[test]
fn agent_keeps_working_when_its_log_cannot_be_written() {
    // Issue 11.3: one failed write to stderr used to end the task that logged it (the source,
    // the sync loop...): no new pods, no restarts, while /healthz said ok.
    let mut a = Agent::start("nolog", &[]);
    a.write("old.yaml", &pod_yaml("old", "Always", "sleep 1; exit 1"));
    a.wait_phase("old", "Running", T);
    a.restart_with_closed_stderr();
    a.write("new.yaml", &pod_yaml("new", "Always", "sleep 3600"));
    a.wait_phase("new", "Running", T);
    // The crash-looping pod keeps being restarted by the new agent.
    let before = restarts(&a.pod("old").unwrap(), "main");
    a.wait_for("old", "another restart", T, |p| restarts(p, "main") > before);
    a.remove("new.yaml");
    a.wait_gone("new", T);
    assert_eq!(a.get("/healthz").unwrap(), (200, b"ok".to_vec()));
}

#[test]
fn healthz_checks_as_kubelet() {
    let a = Agent::start("healthz", &[]);
    a.write("p.yaml", &pod_yaml("p", "Always", "sleep 3600"));
    a.wait_phase("p", "Running", T);
    assert_eq!(a.get("/healthz").unwrap(), (200, b"ok".to_vec()));
    let (code, body) = a.get("/healthz?verbose").unwrap();
    assert_eq!(
        (code, String::from_utf8_lossy(&body).as_ref()),
        (
            200,
            "[+]ping ok\n[+]syncloop ok\n[+]podworkers ok\nhealthz check passed\n"
        )
    );
    assert_eq!(a.get("/healthz/syncloop").unwrap(), (200, b"ok".to_vec()));
    assert_eq!(a.get("/healthz/nope").unwrap().0, 404);
}

#[test]
fn a_pod_whose_removal_fails_stays_until_it_is_gone() {
    // Issue 11.1: a teardown that failed half-way used to drop the pod from the node's books, so
    // a new pod of the same name started beside what was left.
    let a = Agent::start("stuck", &[]);
    a.write(
        "p.yaml",
        &format!(
            "{}    volumeMounts: [{{name: scratch, mountPath: /scratch}}]\n  volumes: [{{name: scratch, emptyDir: {{}}}}]\n",
            pod_yaml("p", "Always", "sleep 3600")
        ),
    );
    let p = a.wait_phase("p", "Running", T);
    let uid = p.metadata.uid.clone().unwrap();
    let busy = a
        .root
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/scratch/busy");
    std::fs::create_dir_all(&busy).unwrap();
    mount_tmpfs(&busy);
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let guard = Unmount(busy.clone());
    a.remove("p.yaml");
    // Same name, new content: a new pod that must wait for the old one.
    a.write("p2.yaml", &pod_yaml("p", "Always", "sleep 3599"));
    std::thread::sleep(Duration::from_secs(4));
    let still = a.pod("p").expect("the pod whose volumes could not be removed stays");
    assert_eq!(
        still.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "the new pod waits for the old one"
    );
    drop(guard);
    a.wait_for("p", "the new pod, once the old one is gone", T, |p| {
        p.metadata.uid.as_deref() != Some(uid.as_str()) && phase_of(Some(p)) == Some("Running")
    });
    assert!(!a.root.join("pods").join(&uid).exists());
}

#[test]
fn a_pod_of_many_containers_shows_its_progress() {
    // Issue 11.9: the status came only after the whole round had started every container (a
    // 1000-container pod showed none for ~42 s).
    let a = Agent::start("many", &[]);
    let n = 60;
    let mut yaml = String::from("apiVersion: v1\nkind: Pod\nmetadata:\n  name: many\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n");
    for i in 0..n {
        yaml.push_str(&format!(
            "  - {{name: c{i}, image: {IMAGE}, command: [sleep, \"3600\"]}}\n"
        ));
    }
    a.write("many.yaml", &yaml);
    let partial = std::cell::Cell::new(false);
    a.wait_for("many", "all containers running", T * 3, |p| {
        let Some(cs) = p.status.as_ref().and_then(|s| s.container_statuses.as_ref()) else {
            return false;
        };
        let running = cs
            .iter()
            .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            .count();
        if running < n {
            partial.set(true);
        }
        running == n
    });
    assert!(partial.get(), "a status was published before every container ran");
}

/// A garbled agent.json at start was replaced silently by a new record that no longer named
/// the cgroups the earlier run had made, so `reset` left them. Now the agent says so, keeps
/// the garbled file aside, and records the cgroups below its pod cgroup root as its own.
#[test]
fn a_garbled_agent_record_is_said_at_start_and_reset_removes_everything() {
    let mut a = Agent::start_in_own_cgroup("garbled");
    a.write("p.yaml", &pod_yaml("p", "Always", "sleep 3600"));
    let before = a.wait_phase("p", "Running", T);
    a.stop();
    std::fs::write(a.root.join("agent.json"), "{\"cgroupRoot\": 12, garbage").unwrap();
    a.restart();
    a.wait_log("agent.json unreadable: a new one is written", T);
    assert!(a.root.join("agent.json.unreadable").exists());
    // The pod kept running and is adopted as it was.
    let after = a.wait_phase("p", "Running", T);
    assert_eq!(after.metadata.uid, before.metadata.uid);
    assert_eq!(restarts(&after, "main"), 0);
    a.stop();
    let out = a.reset().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cg = ferrolet_runtime::cgroups::Cgroups::detect().unwrap();
    let own = a.cgroup.path().trim_start_matches('/').to_string();
    for m in cg.mounts() {
        for d in ["kubepods", "ferrolet.agent"] {
            let p = m.join(&own).join(d);
            assert!(!p.exists(), "{} left behind", p.display());
        }
    }
}

#[test]
fn reset_finds_containers_without_their_records() {
    let mut a = Agent::start_in_own_cgroup("rsg");
    for p in ["g", "b", "e"] {
        a.write(&format!("{p}.yaml"), &pod_yaml(p, "Always", "sleep 3600"));
    }
    for p in ["g", "b", "e"] {
        a.wait_phase(p, "Running", T);
    }
    a.stop();
    let cg = ferrolet_runtime::cgroups::Cgroups::detect().unwrap();
    let kubepods = format!("{}/kubepods", a.cgroup.path());
    let procs = cg.procs_below(&kubepods);
    assert!(procs.len() >= 3, "{procs:?}");
    let cdir = a.root.join("containers");
    let mut ids: Vec<String> = std::fs::read_dir(&cdir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    ids.sort();
    assert_eq!(ids.len(), 3, "{ids:?}");
    std::fs::write(cdir.join(&ids[0]).join("container.json"), "garbage").unwrap();
    std::fs::write(cdir.join(&ids[1]).join("monitor.json"), "").unwrap();
    std::fs::write(cdir.join(&ids[1]).join("exit.json"), "x").unwrap();
    // the third loses its state dir altogether: only its cgroup (and processes) are left
    nix::mount::umount2(&cdir.join(&ids[2]).join("rootfs"), nix::mount::MntFlags::MNT_DETACH).unwrap();
    std::fs::remove_dir_all(cdir.join(&ids[2])).unwrap();
    std::fs::remove_dir_all(a.root.join("libcontainer").join(&ids[2])).unwrap();
    std::fs::write(a.root.join("agent.json"), "{garbage").unwrap();

    // Issue 11.2: reset found "0 containers" and left orphans, mounts and cgroups behind.
    let out = a.reset().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "agent.json unreadable is reported: {stderr}"
    );
    std::thread::sleep(Duration::from_millis(300));
    for p in &procs {
        let st = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        assert!(st.is_empty() || st.contains(") Z"), "process {p} survived: {st}");
    }
    let rel = kubepods.trim_start_matches('/');
    for m in cg.mounts() {
        assert!(!m.join(rel).exists(), "{} left behind", m.join(rel).display());
    }
    let root = a.root.display().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&root)).collect();
    assert!(left.is_empty(), "mounts left behind: {left:#?}");
    for sub in ["containers", "pods", "libcontainer"] {
        let n = std::fs::read_dir(a.root.join(sub)).map(|d| d.count()).unwrap_or(0);
        assert_eq!(n, 0, "{sub} left behind");
    }
    let logs = std::fs::read_dir(&a.logs).map(|d| d.count()).unwrap_or(0);
    assert!(logs <= 1, "pod logs left: {logs}");
    // The unreadable record was moved aside: the next reset has nothing left to complain of.
    assert!(a.root.join("agent.json.unreadable").exists());
    let again = a.reset().unwrap();
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
}

#[test]
fn stdin_and_tty_pods_run_and_log() {
    let mut a = Agent::start("tty", &[]);
    a.write(
        "term.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: term}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: tty\n    image: {IMAGE}\n    stdin: true\n    stdinOnce: true\n    tty: true\n    command: [\"sh\", \"-c\", \"tty; echo on-a-terminal; exec sleep 3600\"]\n  - name: in\n    image: {IMAGE}\n    stdin: true\n    command: [\"sh\", \"-c\", \"echo waiting for stdin; cat; echo never\"]\n"
        ),
    );
    let before = a.wait_phase("term", "Running", T);
    let deadline = Instant::now() + T;
    loop {
        let (tty, input) = (a.logs("term", "container=tty"), a.logs("term", "container=in"));
        // A terminal's output goes to the log as stdout, with the terminal's line endings.
        if tty.contains("/dev/pts/0") && tty.contains("on-a-terminal") && input.contains("waiting for stdin") {
            assert!(
                !input.contains("never"),
                "stdin without an attacher must stay open: {input}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "logs: {tty:?} {input:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The monitors hold the containers' stdin and terminal: an agent restart changes nothing.
    a.restart();
    let after = a.wait_phase("term", "Running", T);
    for c in ["tty", "in"] {
        assert_eq!(
            container_status(&after, c).container_id,
            container_status(&before, c).container_id,
            "{c}: same container after the agent restart"
        );
        assert_eq!(restarts(&after, c), 0, "{c}");
    }
}

/// Started by systemd (`Type=notify`, examples/ferrolet.service): the agent says READY=1 once
/// its manifests' pods went to the pod workers, feeds the watchdog while it is live, and says
/// STOPPING=1 on SIGTERM. The test is the service manager's end of the notify socket.
#[test]
fn systemd_hears_ready_after_the_first_pods_then_the_watchdog_then_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(T)).unwrap();
    let recv = || {
        let mut buf = [0u8; 4096];
        let n = sock.recv(&mut buf).expect("a message on the notify socket");
        String::from_utf8_lossy(&buf[..n]).to_string()
    };
    let mut a = Agent::unstarted_with_env(
        "sdnotify",
        vec![
            ("NOTIFY_SOCKET".into(), path.display().to_string()),
            ("WATCHDOG_USEC".into(), "400000".into()),
        ],
    );
    a.write("ready.yaml", &pod_yaml("ready", "Always", "sleep 3600"));
    a.boot();
    let first = recv();
    assert!(first.lines().any(|l| l == "READY=1"), "{first:?}");
    assert!(
        a.pod("ready").is_some(),
        "READY=1 came before the manifest's pod was taken"
    );
    for _ in 0..3 {
        let m = recv();
        assert_eq!(m.trim(), "WATCHDOG=1");
    }
    a.stop();
    let mut last = String::new();
    while let Ok(m) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(recv)) {
        last = m;
        if last.contains("STOPPING=1") {
            break;
        }
    }
    assert!(last.contains("STOPPING=1"), "{last:?}");
}
