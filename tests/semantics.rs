//! kubelet's semantics that real workloads and conformance tests check exactly, with real pods:
//! init container readiness, the FallbackToLogsOnError message of a partial line, the groups
//! of a process with runAsGroup, AppArmor refused where the kernel cannot enforce it and
//! seLinuxOptions ignored where SELinux is off, the /var/log/containers links, and runOnce.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Pod;

const T: Duration = Duration::from_secs(40);

fn status(p: &Pod) -> &k8s_openapi::api::core::v1::PodStatus {
    p.status.as_ref().unwrap()
}

#[test]
fn init_containers_that_succeeded_are_ready() {
    let a = Agent::start("initready", &[]);
    a.write(
        "p.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  terminationGracePeriodSeconds: 1\n  initContainers:\n  - name: first\n    image: {IMAGE}\n    command: [sh, -c, \"exit 0\"]\n  - name: second\n    image: {IMAGE}\n    command: [sh, -c, \"echo init\"]\n  containers:\n  - name: app\n    image: {IMAGE}\n    command: [sleep, \"600\"]\n"
        ),
    );
    let p = a.wait_for("p", "ready", T, |p| {
        status(p)
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    });
    let init = status(&p).init_container_statuses.as_ref().unwrap();
    for s in init {
        let t = s.state.as_ref().unwrap().terminated.as_ref().expect("terminated");
        assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")), "{}", s.name);
        assert!(s.ready, "init container {} terminated with 0 is ready: {s:?}", s.name);
        assert_eq!(s.started, Some(false), "{}", s.name);
    }
    assert!(container_status(&p, "app").ready);
}

/// A pod for another OS is refused with kubelet's reason and message.
#[test]
fn a_pod_for_another_os_is_pod_os_not_supported() {
    let a = Agent::start("podos", &[]);
    a.write(
        "win.yaml",
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: win}}\nspec:\n  os: {{name: windows}}\n  containers:\n  - {{name: c, image: {IMAGE}}}\n"),
    );
    let p = a.wait_phase("win", "Failed", T);
    assert_eq!(status(&p).reason.as_deref(), Some("PodOSNotSupported"));
    assert_eq!(
        status(&p).message.as_deref(),
        Some("Pod was rejected: Failed to admit pod as the OS field doesn't match node OS")
    );
}

/// setHostnameAsFQDN with a subdomain: the container's hostname (and /etc/hostname) is the FQDN;
/// one longer than 64 characters leaves the pod Pending with kubelet's FailedCreatePodSandBox.
#[test]
fn set_hostname_as_fqdn_gives_the_fqdn_or_no_sandbox() {
    let a = Agent::start("fqdn", &[]);
    let pod = |name: &str, sub: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: Never\n  hostname: h\n  subdomain: {sub}\n  setHostnameAsFQDN: true\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sh, -c, 'echo \"uts=$(hostname) file=$(cat /etc/hostname)\"']\n"
        )
    };
    a.write("short.yaml", &pod("short", "s"));
    let long_sub = "a".repeat(40);
    a.write("long.yaml", &pod("long", &long_sub));
    a.wait_phase("short", "Succeeded", T);
    let fqdn = "h.s.default.svc.cluster.local";
    assert_eq!(a.logs("short", "").trim(), format!("uts={fqdn} file={fqdn}"));
    let want = format!("h.{long_sub}.default.svc.cluster.local");
    a.wait_log(
        &format!(
            "Failed to create pod sandbox: failed to construct FQDN from pod hostname and cluster domain, FQDN {want} is too long (64 characters is the max, {} characters requested)",
            want.len()
        ),
        T,
    );
    assert!(a.agent_log().contains("reason=\"FailedCreatePodSandBox\""));
    let p = a.pod("long").expect("the long pod");
    assert_eq!(status(&p).phase.as_deref(), Some("Pending"));
}

#[test]
fn fallback_to_logs_keeps_a_partial_last_line_as_written() {
    let a = Agent::start("fallbackpartial", &[]);
    let pod = |name: &str, script: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: {IMAGE}\n    terminationMessagePolicy: FallbackToLogsOnError\n    command: [sh, -c, {script:?}]\n"
        )
    };
    // The node e2e conformance test's container: `echo -n DONE; false`.
    a.write("partial.yaml", &pod("partial", "printf DONE; exit 1"));
    a.write("full.yaml", &pod("full", "echo first; echo DONE; exit 1"));
    let message = |p: &Pod| {
        container_status(p, "c")
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.message.clone())
    };
    let p = a.wait_phase("partial", "Failed", T);
    assert_eq!(message(&p).as_deref(), Some("DONE"));
    // Full lines keep their newlines, as kubelet's log tail gives them.
    let p = a.wait_phase("full", "Failed", T);
    assert_eq!(message(&p).as_deref(), Some("first\nDONE\n"));
}

#[test]
fn run_as_group_is_one_of_the_supplementary_groups() {
    let a = Agent::start("groups", &[]);
    // The Kubernetes documentation's security-context example.
    let pod = |name: &str, policy: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: Never\n  securityContext:\n    runAsUser: 1000\n    runAsGroup: 3000\n    fsGroup: 2000\n    supplementalGroups: [4000]\n{policy}  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sh, -c, \"id; cat /proc/self/status | grep ^Groups\"]\n"
        )
    };
    a.write("merge.yaml", &pod("merge", ""));
    a.write("strict.yaml", &pod("strict", "    supplementalGroupsPolicy: Strict\n"));
    for name in ["merge", "strict"] {
        let p = a.wait_phase(name, "Succeeded", T);
        let out = a.logs(name, "");
        assert_eq!(
            out.lines().next(),
            Some("uid=1000 gid=3000 groups=2000,3000,4000"),
            "{name}: {out}"
        );
        let user = container_status(&p, "c")
            .user
            .as_ref()
            .and_then(|u| u.linux.as_ref())
            .unwrap_or_else(|| panic!("{name}: containerStatuses[].user.linux is missing"));
        assert_eq!((user.uid, user.gid), (1000, 3000), "{name}");
        let mut groups = user.supplemental_groups.clone().unwrap_or_default();
        groups.sort();
        assert_eq!(groups, vec![2000, 3000, 4000], "{name}");
    }
}

#[test]
fn apparmor_refused_and_selinux_options_run_where_the_kernel_has_neither() {
    let apparmor_on = std::fs::read("/sys/module/apparmor/parameters/enabled").is_ok_and(|b| b.first() == Some(&b'Y'))
        && Path::new("/sys/kernel/security/apparmor").exists();
    let selinux_on = Path::new("/sys/fs/selinux/enforce").exists();
    let a = Agent::start("lsm", &[]);
    let pod = |name: &str, meta: &str, sc: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n{meta}spec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sleep, \"600\"]\n{sc}"
        )
    };
    a.write(
        "field.yaml",
        &pod(
            "field",
            "",
            "    securityContext:\n      appArmorProfile: {type: RuntimeDefault}\n",
        ),
    );
    a.write(
        "annotation.yaml",
        &pod(
            "annotation",
            "  annotations:\n    container.apparmor.security.beta.kubernetes.io/c: localhost/k8s-apparmor-example-deny-write\n",
            "",
        ),
    );
    a.write(
        "unconfined.yaml",
        &pod(
            "unconfined",
            "",
            "    securityContext:\n      appArmorProfile: {type: Unconfined}\n",
        ),
    );
    a.write(
        "selinux.yaml",
        &pod(
            "selinux",
            "",
            "    securityContext:\n      seLinuxOptions: {level: \"s0:c123,c456\"}\n",
        ),
    );
    // Unconfined asks for nothing the node must enforce: it runs anywhere.
    a.wait_phase("unconfined", "Running", T);
    if !apparmor_on {
        for name in ["field", "annotation"] {
            let p = a.wait_phase(name, "Failed", T);
            let st = status(&p);
            assert_eq!(st.reason.as_deref(), Some("AppArmor"), "{name}");
            assert_eq!(
                st.message.as_deref(),
                Some("Cannot enforce AppArmor: AppArmor is not enabled on the host"),
                "{name}"
            );
            assert!(st.container_statuses.is_none(), "{name}: nothing ran");
        }
    } else {
        eprintln!("AppArmor is enabled here: the refusal is not exercised");
    }
    if selinux_on {
        // Labeled (tests/pod_security.rs selinux_labels_pods_containers_and_their_files).
        a.wait_phase("selinux", "Running", T);
    } else {
        // As kubelet and containerd: without SELinux on the host the labels are ignored.
        a.wait_phase("selinux", "Running", T);
        a.wait_log("seLinuxOptions ignored: SELinux is not enabled on the host", T);
    }
}

fn links(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), target))
        })
        .collect();
    out.sort();
    out
}

#[test]
fn container_log_links_come_and_go_with_the_containers() {
    // tests/common gives every agent --container-log-link-dir <its dir>/log-links.
    let a = Agent::start("loglinks", &[]);
    let dir = a.dir.join("log-links");
    a.write(
        "web.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sh, -c, \"echo hello-shipper; sleep 600\"]\n"
        ),
    );
    a.write(
        "crash.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: crash}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sh, -c, \"echo attempt; exit 1\"]\n"
        ),
    );
    let p = a.wait_for("web", "running", T, |p| running(p, "c"));
    let id = container_id(&p, "c");
    let name = format!("web-{}_default_c-{id}.log", a.node);
    let link = dir.join(&name);
    let target =
        std::fs::read_link(&link).unwrap_or_else(|e| panic!("{}: {e}; links: {:?}", link.display(), links(&dir)));
    let uid = p.metadata.uid.clone().unwrap();
    assert_eq!(
        target,
        a.logs.join(format!("default_web-{}_{uid}/c/0.log", a.node)),
        "the link points at the CRI log"
    );
    let deadline = Instant::now() + T;
    while !std::fs::read_to_string(&link)
        .unwrap_or_default()
        .contains("stdout F hello-shipper")
    {
        assert!(
            Instant::now() < deadline,
            "the CRI log line never showed through the link"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // A crash-looping container: links for the attempts the node keeps (the current and the
    // previous one), none for those it removed.
    a.wait_for("crash", "restarted 3 times", Duration::from_secs(60), |p| {
        restarts(p, "c") >= 3
    });
    let prefix = format!("crash-{}_default_c-", a.node);
    let deadline = Instant::now() + T;
    loop {
        let crash: Vec<_> = links(&dir)
            .into_iter()
            .filter(|(n, _)| n.starts_with(&prefix))
            .collect();
        let all_live = crash.iter().all(|(_, t)| t.exists());
        if crash.len() == 2 && all_live {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "expected the links of the 2 kept attempts, found {crash:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Removing the pod removes its containers and their links.
    a.remove("web.yaml");
    a.wait_gone("web", T);
    assert!(link.symlink_metadata().is_err(), "the link went with the container");
    a.remove("crash.yaml");
    a.wait_gone("crash", T);
    assert_eq!(links(&dir), Vec::new(), "no link left");
}

/// `ferrolet run --runonce` on the agent's directories (the agent stopped): exit status,
/// stdout, stderr.
fn run_once(a: &Agent) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.arg("run")
        .arg("--runonce")
        .arg("--config")
        .arg(a.dir.join("kubelet.yaml"))
        .arg("--pod-manifest-path")
        .arg(&a.manifests)
        .arg("--root-dir")
        .arg(&a.root)
        .arg("--cgroup-root")
        .arg(a.cgroup.path())
        .arg("--hostname-override")
        .arg(&a.node)
        .arg("--network")
        .arg("none")
        .arg("--container-log-link-dir")
        .arg(a.dir.join("log-links"))
        .env("RUST_LOG", "ferrolet=info");
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("ferrolet --runonce");
    // Bounded: a runOnce that hangs is a failure, and its process is ended here.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if Instant::now() > deadline {
            stop_child(&mut child, Duration::from_secs(5));
            panic!("runOnce did not exit within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn run_once_runs_the_static_pods_reports_and_exits() {
    let mut a = Agent::start("runonce", &[]);
    a.stop();
    let node = a.node.clone();

    // An image the node does not have and may not pull: kubelet's syncPod fails, so does runOnce.
    a.write(
        "bad.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec:\n  containers:\n  - name: c\n    image: example.invalid/nothing:1\n    imagePullPolicy: Never\n",
    );
    let (code, out, err) = run_once(&a);
    assert_eq!(code, Some(1), "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains(&format!(
            "default/bad-{node}: error syncing pod: container \"c\": ErrImageNeverPull"
        )),
        "{out}"
    );
    assert!(
        err.contains(&format!("runonce failed: error running pods: [bad-{node}_default(")),
        "{err}"
    );
    a.remove("bad.yaml");

    a.write(
        "web.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sleep, \"600\"]\n"
        ),
    );
    // Finished before any of its containers ran (its init container failed): done, as
    // kubelet's runPod returns for a terminal pod.
    a.write(
        "job.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: job}}\nspec:\n  restartPolicy: Never\n  initContainers:\n  - name: init\n    image: {IMAGE}\n    command: [sh, -c, \"exit 3\"]\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sh, -c, \"echo done\"]\n"
        ),
    );
    let t0 = Instant::now();
    let (code, out, err) = run_once(&a);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        vec![
            format!("default/job-{node}: Failed"),
            format!("default/web-{node}: Running"),
        ],
        "stderr: {err}"
    );
    assert!(t0.elapsed() < Duration::from_secs(60));

    // The containers were left as they were: the next agent adopts the running one.
    a.restart();
    let p = a.wait_for("web", "running", T, |p| running(p, "c"));
    assert_eq!(restarts(&p, "c"), 0, "the container runOnce started still runs");
    a.wait_phase("job", "Failed", T);
}

/// allowPrivilegeEscalation, seccomp and the user decide how a container is confined, as
/// with containerd or CRI-O: noNewPrivileges only when escalation is refused, no ambient or
/// inheritable capabilities, no effective ones for a non-root user, the open-files limit the
/// agent's own; and a process exec'd into the container is confined exactly as its first.
#[test]
fn privilege_escalation_seccomp_and_limits_follow_the_security_context() {
    let a = Agent::start("confine", &[]);
    let script = "grep -E '^(NoNewPrivs|Seccomp|CapInh|CapEff|CapAmb):' /proc/self/status | tr -d ' \\t'; echo nofile=$(ulimit -H -n); sleep 600";
    let container =
        |name: &str, sc: &str| format!("  - name: {name}\n    image: {IMAGE}\n    command: [sh, -c, {script:?}]\n{sc}");
    a.write(
        "confine.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: confine}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n{}{}{}",
            container("plain", ""),
            container(
                "locked",
                "    securityContext:\n      allowPrivilegeEscalation: false\n      seccompProfile: {type: RuntimeDefault}\n"
            ),
            container(
                "user",
                "    securityContext:\n      runAsUser: 1000\n      seccompProfile: {type: Unconfined}\n"
            ),
        ),
    );
    a.wait_phase("confine", "Running", T);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", a.pid())).unwrap();
    let agent_nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .unwrap()
        .to_string();
    let default_caps = "CapEff:00000000a80425fb";
    let expect: [(&str, &[&str]); 3] = [
        // (seccompDefault is on unless the configuration turns it off)
        (
            "plain",
            &[
                "NoNewPrivs:0",
                "Seccomp:2",
                "CapInh:0000000000000000",
                default_caps,
                "CapAmb:0000000000000000",
            ],
        ),
        ("locked", &["NoNewPrivs:1", "Seccomp:2", default_caps]),
        (
            "user",
            &[
                "NoNewPrivs:0",
                "Seccomp:0",
                "CapEff:0000000000000000",
                "CapAmb:0000000000000000",
            ],
        ),
    ];
    for (name, want) in expect {
        let deadline = Instant::now() + T;
        let out = loop {
            let out = a.logs("confine", &format!("container={name}"));
            if out.contains("nofile=") || Instant::now() > deadline {
                break out;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        for w in want {
            assert!(out.lines().any(|l| l == *w), "{name}: want {w}: {out}");
        }
        assert!(
            out.contains(&format!("nofile={agent_nofile}\n")),
            "{name}: the agent's {agent_nofile}: {out}"
        );
        // an exec'd process: the same lines as the container's first process
        let pod = format!("confine-{}", a.node);
        let exec = a.cli(&[
            "exec",
            &pod,
            "-c",
            name,
            "--",
            "sh",
            "-c",
            "grep -E '^(NoNewPrivs|Seccomp|CapInh|CapEff|CapAmb):' /proc/self/status | tr -d ' \\t'; echo nofile=$(ulimit -H -n)",
        ]);
        let got = String::from_utf8_lossy(&exec.stdout);
        assert!(
            exec.status.success(),
            "{name}: exec: {got} {}",
            String::from_utf8_lossy(&exec.stderr)
        );
        for w in want {
            assert!(got.lines().any(|l| l == *w), "{name}: exec'd, want {w}: {got}");
        }
        assert!(
            got.contains(&format!("nofile={agent_nofile}\n")),
            "{name}: exec'd: {got}"
        );
    }
}
