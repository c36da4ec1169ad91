//! The pod-level boundary, seen from inside real pods: sysctls as kubelet's admit handler
//! allows them (values read back from /proc/sys in the pod, refusals as kubelet words them).

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Pod;

const T: Duration = Duration::from_secs(40);

fn pod_yaml(name: &str, spec_extra: &str, command: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{spec_extra}  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sh, -c, {command:?}]\n"
    )
}

fn sysctls(list: &[(&str, &str)]) -> String {
    let mut s = String::from("  securityContext:\n    sysctls:\n");
    for (n, v) in list {
        s.push_str(&format!("    - {{name: {n}, value: {v:?}}}\n"));
    }
    s
}

fn status_of(p: &Pod) -> (Option<&str>, Option<&str>) {
    let st = p.status.as_ref().unwrap();
    (st.reason.as_deref(), st.message.as_deref())
}

/// The log of `pod` once it holds `marker`.
fn log_with(a: &Agent, pod: &str, marker: &str) -> String {
    let deadline = Instant::now() + T;
    loop {
        let out = a.logs(pod, "");
        if out.contains(marker) || Instant::now() > deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// kubelet 1.26's sysctl admit handler: the safe set and allowedUnsafeSysctls (a name and a
/// prefix) are set in the pod's namespaces and read back inside it; anything else, and a
/// net or ipc sysctl of a pod sharing the node's network or IPC namespace, is Failed with
/// SysctlForbidden and kubelet's message; a malformed name never reaches admission.
#[test]
fn sysctls_follow_kubelets_admit_handler() {
    let a = Agent::start_with_config(
        "sysctl",
        &[],
        "allowedUnsafeSysctls: [\"kernel.msg*\", net.core.somaxconn]\n",
    );
    let read = "for f in net/ipv4/ip_unprivileged_port_start net/ipv4/ping_group_range kernel/shm_rmid_forced kernel/msgmax net/core/somaxconn; do echo $f=$(cat /proc/sys/$f | tr '\\t' ' '); done; echo done; sleep 600";
    a.write(
        "set.yaml",
        &pod_yaml(
            "set",
            &sysctls(&[
                ("net.ipv4.ip_unprivileged_port_start", "100"),
                ("net.ipv4.ping_group_range", "0 1000"),
                ("kernel.shm_rmid_forced", "1"),
                ("kernel.msgmax", "65000"),
                ("net/core/somaxconn", "1000"),
            ]),
            read,
        ),
    );
    a.write(
        "unsafe.yaml",
        &pod_yaml("unsafe", &sysctls(&[("net.core.rmem_max", "1000000")]), "sleep 600"),
    );
    a.write(
        "hostnet.yaml",
        &pod_yaml(
            "hostnet",
            &format!("  hostNetwork: true\n{}", sysctls(&[("net.ipv4.tcp_syncookies", "1")])),
            "sleep 600",
        ),
    );
    a.write(
        "hostipc.yaml",
        &pod_yaml(
            "hostipc",
            &format!("  hostIPC: true\n{}", sysctls(&[("kernel.shm_rmid_forced", "1")])),
            "sleep 600",
        ),
    );
    a.write(
        "global.yaml",
        &pod_yaml("global", &sysctls(&[("vm.swappiness", "10")]), "sleep 600"),
    );
    a.write(
        "malformed.yaml",
        &pod_yaml("malformed", &sysctls(&[("Net.Bad", "1")]), "sleep 600"),
    );

    a.wait_phase("set", "Running", T);
    let out = log_with(&a, "set", "done");
    for want in [
        "net/ipv4/ip_unprivileged_port_start=100",
        "net/ipv4/ping_group_range=0 1000",
        "kernel/shm_rmid_forced=1",
        "kernel/msgmax=65000",
        "net/core/somaxconn=1000",
    ] {
        assert!(out.lines().any(|l| l == want), "want {want}: {out}");
    }
    // the node's own values are untouched
    let node = std::fs::read_to_string("/proc/sys/kernel/msgmax").unwrap();
    assert_ne!(node.trim(), "65000", "the pod's kernel.msgmax reached the node");

    for (name, msg) in [
        ("unsafe", "forbidden sysctl: \"net.core.rmem_max\" not allowlisted"),
        (
            "hostnet",
            "forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host net enabled",
        ),
        (
            "hostipc",
            "forbidden sysctl: \"kernel.shm_rmid_forced\" not allowed with host ipc enabled",
        ),
        ("global", "forbidden sysctl: \"vm.swappiness\" not allowlisted"),
    ] {
        let p = a.wait_phase(name, "Failed", T);
        let (reason, message) = status_of(&p);
        assert_eq!(reason, Some("SysctlForbidden"), "{name}");
        assert_eq!(message, Some(format!("Pod was rejected: {msg}").as_str()), "{name}");
        assert!(
            p.status.as_ref().unwrap().container_statuses.is_none(),
            "{name}: nothing ran"
        );
    }
    a.wait_log("spec.securityContext.sysctls[0].name: Invalid value: \"Net.Bad\"", T);
    assert!(a.pod("malformed").is_none(), "a malformed pod is not admitted at all");
}

/// An allowedUnsafeSysctls entry outside the namespaced groups stops the agent with
/// kubelet's message, naming the setting.
#[test]
fn an_unsafe_sysctl_that_is_not_namespaced_stops_the_agent() {
    let dir = std::env::temp_dir().join(format!("ferrolet-it-badsysctl-{}", std::process::id()));
    for (flag, msg) in [
        (
            "vm.swappiness",
            "the sysctl \"vm.swappiness\" are not known to be namespaced",
        ),
        ("kernel.*", "the sysctls \"kernel.*\" are not known to be namespaced"),
        ("net.*.x", "sysctl \"net.*.x\" must have at most 253 characters"),
    ] {
        let out = std::process::Command::new(BIN)
            .args(["run", "--allowed-unsafe-sysctls", flag, "--root-dir"])
            .arg(dir.join("root"))
            .arg("--pod-manifest-path")
            .arg(dir.join("manifests"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag}: started");
        assert!(
            err.contains("allowedUnsafeSysctls") && err.contains(msg),
            "{flag}: {err}"
        );
        assert!(
            !dir.join("root").exists(),
            "{flag}: the agent made its root before refusing"
        );
    }
}
