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

/// The processes whose command line starts with `prefix`, by pid.
fn processes(prefix: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| c.starts_with(prefix.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// shareProcessNamespace: one pid namespace for the pod, held by an init of its own as PID 1.
/// A container sees the other's processes, an orphan it leaves is reaped, and what it tries
/// against PID 1 (kill it, read through /proc/1) is refused; an exit code is the container's
/// own; an agent restart keeps the pod as it is; deleting the pod ends its init. A pod without
/// it keeps a pid namespace per container; a hostPID pod has the node's, and its own cgroup at
/// /sys/fs/cgroup.
#[test]
fn share_process_namespace_gives_the_pod_one_pid_namespace_with_an_init() {
    let mut a = Agent::start("sharepid", &[]);
    let probe = "echo pid1=$(cat /proc/1/comm); ps -o comm | sort | tr '\\n' ' '; echo; \
        (sleep 0.3 &); sleep 1; ps -o pid,ppid,stat,comm; echo zombies=$(ps -o stat | grep -c Z); \
        kill -9 1; sleep 0.2; echo pid1-after-kill=$(cat /proc/1/comm); \
        ls /proc/1/root/ >/dev/null 2>&1 || echo root-refused; \
        cat /proc/1/environ >/dev/null 2>&1 || echo environ-refused; \
        readlink /proc/1/exe >/dev/null 2>&1 || echo exe-refused; \
        echo limit=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max 2>/dev/null); \
        echo done; exec sleep 600";
    a.write(
        "shared.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: shared}}\nspec:\n  shareProcessNamespace: true\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: sleeper\n    image: {IMAGE}\n    command: [sleep, \"600\"]\n  - name: probe\n    image: {IMAGE}\n    command: [sh, -c, {probe:?}]\n    resources: {{limits: {{memory: 64Mi}}}}\n  - name: quitter\n    image: {IMAGE}\n    command: [sh, -c, \"sleep 1; exit 3\"]\n"
        ),
    );
    a.write(
        "private.yaml",
        &pod_yaml(
            "private",
            "",
            "echo pid1=$(cat /proc/1/comm); ps -o comm | sort | tr '\\n' ' '; echo; echo done; exec sleep 600",
        ),
    );
    a.write(
        "hostpid.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: hostpid}}\nspec:\n  hostPID: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sh, -c, \"echo mine=$$$$ limit=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max 2>/dev/null); echo done; exec sleep 600\"]\n    resources: {{limits: {{memory: 32Mi}}}}\n"
        ),
    );
    a.wait_phase("shared", "Running", T);
    // a container in the node's pid namespace: its own cgroup at /sys/fs/cgroup too
    a.wait_phase("hostpid", "Running", T);
    let host = log_with(&a, "hostpid", "done");
    assert!(host.contains("limit=33554432\n"), "{host}");
    let mine: i32 = host
        .split("mine=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    assert!(
        mine > 1 && std::path::Path::new(&format!("/proc/{mine}")).exists(),
        "a host pid: {host}"
    );
    let out = log_with_container(&a, "shared", "probe", "done");
    assert!(out.contains("pid1=ferrolet-init\n"), "the pod's init is PID 1: {out}");
    assert!(
        out.contains("ferrolet-init ") && out.contains("sleep ") && out.contains("ps "),
        "the probe sees the sleeper and the init: {out}"
    );
    assert!(out.contains("zombies=0\n"), "the orphan was reaped: {out}");
    assert!(out.contains("pid1-after-kill=ferrolet-init\n"), "{out}");
    assert!(
        out.contains("limit=67108864\n"),
        "the container's own cgroup at /sys/fs/cgroup: {out}"
    );
    for refused in ["root-refused", "environ-refused", "exe-refused"] {
        assert!(out.contains(refused), "{refused}: {out}");
    }
    let own = log_with(&a, "private", "done");
    assert!(own.contains("pid1=sh\n") && own.contains("ps sh "), "{own}");
    assert!(!own.contains("ferrolet-init"), "{own}");

    // the quitter's exit code is its own
    let p = a.wait_for("shared", "the quitter exited", T, |p| {
        try_container_status(p, "quitter").is_some_and(|s| s.state.as_ref().is_some_and(|s| s.terminated.is_some()))
    });
    let t = container_status(&p, "quitter")
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!((t.exit_code, t.reason.as_deref()), (3, Some("Error")));

    // one init per sharing pod, in the pod's cgroup, surviving an agent restart
    let init_title = format!("ferrolet-pod-init default/shared-{}\0", a.node);
    let inits = processes(&init_title);
    assert_eq!(inits.len(), 1, "{inits:?}");
    let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", inits[0])).unwrap();
    assert!(cgroup.contains("/pod-init"), "{cgroup}");
    let sleeper = container_id(&a.pod("shared").unwrap(), "sleeper");
    a.restart();
    a.wait_log("ADD", T);
    std::thread::sleep(Duration::from_secs(2));
    let p = a.wait_phase("shared", "Running", T);
    assert_eq!(container_id(&p, "sleeper"), sleeper, "the restart kept the container");
    assert_eq!(processes(&init_title), inits);

    a.remove("shared.yaml");
    a.wait_gone("shared", T);
    assert!(processes(&init_title).is_empty(), "the pod's init outlived it");
}

fn log_with_container(a: &Agent, pod: &str, container: &str, marker: &str) -> String {
    let deadline = Instant::now() + T;
    loop {
        let out = a.logs(pod, &format!("container={container}"));
        if out.contains(marker) || Instant::now() > deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The `uid_map` a pod's container printed: (host id, size).
fn uid_map(out: &str) -> Option<(u64, u64)> {
    out.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["map", "0", host, size] => Some((host.parse().ok()?, size.parse().ok()?)),
            _ => None,
        }
    })
}

/// hostUsers: false (kubelet 1.26's user namespaces): each pod its own 65536 host ids, kept
/// across an agent restart and freed with the pod; root inside (the image's files, the
/// agent's volumes and /etc/hosts its own through idmapped mounts) and an unprivileged id on
/// the host, which cannot write a root-owned host file a hostPath shows it. A pod that also
/// shares its pid namespace gets both. hostNetwork with it fails validation.
#[test]
fn host_users_false_gives_each_pod_its_own_ids() {
    use std::os::unix::fs::MetadataExt;
    let mut a = Agent::start("userns", &[]);
    let host_dir = a.dir.join("hostpath");
    std::fs::create_dir_all(&host_dir).unwrap();
    std::fs::write(host_dir.join("file"), "host root's\n").unwrap();
    let script = "echo id=$(id -u):$(id -g); echo map $(cat /proc/self/uid_map); \
        echo image=$(stat -c %u:%g /bin/busybox); \
        touch /scratch/x && echo emptydir=$(stat -c %u:%g /scratch/x); \
        if (echo x >> /host/file); then echo WROTE-HOST-FILE; fi; \
        echo hosts=$(stat -c %u:%g /etc/hosts) info=$(stat -c %u /info/name); \
        echo pid1=$(cat /proc/1/comm); echo done; exec sleep 600";
    let pod = |name: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  hostUsers: false\n{extra}  terminationGracePeriodSeconds: 1\n  volumes:\n  - {{name: scratch, emptyDir: {{}}}}\n  - {{name: host, hostPath: {{path: {}}}}}\n  - name: info\n    downwardAPI: {{items: [{{path: name, fieldRef: {{fieldPath: metadata.name}}}}]}}\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sh, -c, {script:?}]\n    volumeMounts:\n    - {{name: scratch, mountPath: /scratch}}\n    - {{name: host, mountPath: /host}}\n    - {{name: info, mountPath: /info}}\n",
            host_dir.display()
        )
    };
    a.write("one.yaml", &pod("one", ""));
    a.write("two.yaml", &pod("two", "  shareProcessNamespace: true\n"));
    a.write(
        "hostnet.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: hostnet}}\nspec:\n  hostUsers: false\n  hostNetwork: true\n  containers:\n  - {{name: c, image: {IMAGE}, command: [sleep, \"600\"]}}\n"
        ),
    );
    a.wait_phase("one", "Running", T);
    a.wait_phase("two", "Running", T);
    let one = log_with(&a, "one", "done");
    let two = log_with(&a, "two", "done");
    for (name, out) in [("one", &one), ("two", &two)] {
        assert!(out.contains("id=0:0\n"), "{name}: root inside: {out}");
        assert!(out.contains("image=0:0\n"), "{name}: the image is root's: {out}");
        assert!(out.contains("emptydir=0:0\n"), "{name}: {out}");
        assert!(
            out.contains("hosts=0:0 info=0\n"),
            "{name}: the agent's files are root's: {out}"
        );
        assert!(
            !out.contains("WROTE-HOST-FILE") && out.contains("Permission denied"),
            "{name}: {out}"
        );
        let (host, size) = uid_map(out).unwrap_or_else(|| panic!("{name}: no uid_map: {out}"));
        assert_eq!(size, 65536, "{name}");
        assert!(host >= 131072 && host % 65536 == 0, "{name}: {host}");
    }
    assert!(two.contains("pid1=ferrolet-init\n"), "{two}");
    assert!(!one.contains("pid1=ferrolet-init"), "{one}");
    let (h1, _) = uid_map(&one).unwrap();
    let (h2, _) = uid_map(&two).unwrap();
    assert_ne!(h1, h2, "two pods share host ids");
    // the container's processes run as the pod's first host id
    let sleeping: Vec<i32> = processes("sleep\x00600\x00");
    let uids: Vec<u32> = sleeping
        .iter()
        .filter_map(|pid| std::fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid()))
        .collect();
    assert!(uids.contains(&(h1 as u32)) && uids.contains(&(h2 as u32)), "{uids:?}");
    // the file a hostPath shows is untouched, the emptyDir's file is host root's
    assert_eq!(std::fs::read_to_string(host_dir.join("file")).unwrap(), "host root's\n");

    // an agent restart keeps every pod's ids
    a.restart();
    for (name, before) in [("one", h1), ("two", h2)] {
        a.wait_phase(name, "Running", T);
        let out = a.cli(&["exec", &format!("{name}-{}", a.node), "--", "cat", "/proc/self/uid_map"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        let host: u64 = text.split_whitespace().nth(1).and_then(|h| h.parse().ok()).unwrap_or(0);
        assert_eq!(host, before, "{name} after the restart: {text}");
    }
    a.wait_log("spec.hostNetwork: Forbidden: when `pod.Spec.HostUsers` is false", T);

    // deleting a pod frees its ids
    let pods_dir = a.root.join("pods");
    let userns_files = || {
        std::fs::read_dir(&pods_dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().join("userns").exists())
            .count()
    };
    assert_eq!(userns_files(), 2);
    a.remove("one.yaml");
    a.wait_gone("one", T);
    assert_eq!(userns_files(), 1);
}

/// Where the kernel enforces AppArmor: containers run under ferrolet's default profile whether
/// they ask for RuntimeDefault or nothing, which refuses a mount even with CAP_SYS_ADMIN and
/// seccomp Unconfined; Unconfined mounts; a privileged container is unconfined.
#[test]
fn apparmor_runtime_default_confines_containers() {
    if !(std::fs::read("/sys/module/apparmor/parameters/enabled").is_ok_and(|b| b.first() == Some(&b'Y'))
        && std::path::Path::new("/sys/kernel/security/apparmor").exists())
    {
        skip_loudly(
            "apparmor_runtime_default_confines_containers",
            "this kernel does not enforce AppArmor (the cgroup v2 lane's does)",
        );
        return;
    }
    let a = Agent::start("apparmor", &[]);
    let script = "echo attr=$(cat /proc/self/attr/current); mkdir -p /m; \
        if mount -t tmpfs t /m 2>/dev/null; then echo MOUNTED; else echo mount-refused; fi; echo done; exec sleep 600";
    let pod = |name: &str, sc: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sh, -c, {script:?}]\n    securityContext:\n      seccompProfile: {{type: Unconfined}}\n{sc}"
        )
    };
    let caps = "      capabilities: {add: [SYS_ADMIN]}\n";
    a.write(
        "asked.yaml",
        &pod(
            "asked",
            &format!("{caps}      appArmorProfile: {{type: RuntimeDefault}}\n"),
        ),
    );
    a.write("unset.yaml", &pod("unset", caps));
    a.write(
        "open.yaml",
        &pod("open", &format!("{caps}      appArmorProfile: {{type: Unconfined}}\n")),
    );
    a.write("privileged.yaml", &pod("privileged", "      privileged: true\n"));
    for name in ["asked", "unset"] {
        a.wait_phase(name, "Running", T);
        let out = log_with(&a, name, "done");
        assert!(out.contains("attr=ferrolet-default (enforce)\n"), "{name}: {out}");
        assert!(
            out.contains("mount-refused") && !out.contains("MOUNTED"),
            "{name}: {out}"
        );
    }
    for name in ["open", "privileged"] {
        a.wait_phase(name, "Running", T);
        let out = log_with(&a, name, "done");
        assert!(out.contains("attr=unconfined\n"), "{name}: {out}");
        assert!(
            out.contains("MOUNTED"),
            "{name}: the same mount without the profile: {out}"
        );
    }
}

/// Where SELinux is enabled (the cgroup v2 lane's second boot, with a small policy of its own:
/// tests/vm/selinux), pods are labeled as containerd labels them: a pod that names a level runs
/// its containers at it (a container's own type over its sandbox's label), a pod that names
/// none gets a level no other pod holds; the rootfs, the container's tmpfs mounts and /dev/shm
/// are mounted with the mount label, the emptyDir and the files the agent binds are relabeled
/// to it, a file a container writes carries the level, and an exec'd process runs in the
/// container's label. A hostPath keeps its label.
#[test]
fn selinux_labels_pods_containers_and_their_files() {
    if !ferrolet_runtime::selinux::enabled() {
        assert!(
            std::env::var_os("FERROLET_REQUIRE_SELINUX").is_none(),
            "FERROLET_REQUIRE_SELINUX is set but SELinux is not enabled here"
        );
        skip_loudly(
            "selinux_labels_pods_containers_and_their_files",
            "SELinux is not enabled on this kernel (the cgroup v2 lane's SELinux boot enables it)",
        );
        return;
    }
    let label = |p: &std::path::Path| ferrolet_runtime::selinux::file_label(p).unwrap().unwrap_or_default();
    let a = Agent::start("selinux", &[]);
    let host = a.host_dir();
    std::fs::write(host.join("file"), "x").unwrap();
    let host_label = label(&host);
    let script = "echo attr=$(cat /proc/self/attr/current); \
        grep -E ' (/|/dev|/dev/shm) ' /proc/mounts | sed 's/^/mount=/'; \
        touch /data/from-$C; echo done; exec sleep 600";
    let pod = |name: &str, pod_sc: &str, b_sc: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{pod_sc}  volumes:\n  - {{name: data, emptyDir: {{}}}}\n  - {{name: host, hostPath: {{path: {}}}}}\n  containers:\n  - name: a\n    image: {IMAGE}\n    env: [{{name: C, value: a}}]\n    command: [sh, -c, {script:?}]\n    volumeMounts: [{{name: data, mountPath: /data}}, {{name: host, mountPath: /host}}]\n  - name: b\n    image: {IMAGE}\n    env: [{{name: C, value: b}}]\n    command: [sh, -c, {script:?}]\n    volumeMounts: [{{name: data, mountPath: /data}}]\n{b_sc}",
            host.display()
        )
    };
    a.write(
        "named.yaml",
        &pod(
            "named",
            "  securityContext:\n    seLinuxOptions: {level: \"s0:c123,c456\"}\n",
            "    securityContext:\n      seLinuxOptions: {type: spc_t}\n",
        ),
    );
    a.write("plain1.yaml", &pod("plain1", "", ""));
    a.write("plain2.yaml", &pod("plain2", "", ""));
    let line = |out: &str, key: &str| -> Vec<String> {
        out.lines()
            .filter_map(|l| l.strip_prefix(key))
            .map(str::to_string)
            .collect()
    };
    let level_of = |ctx: &str| ctx.splitn(4, ':').nth(3).unwrap_or_default().to_string();
    let mut plain_levels = Vec::new();
    for name in ["named", "plain1", "plain2"] {
        a.wait_phase(name, "Running", T);
        let p = a.pod(name).unwrap();
        let uid = p.metadata.uid.clone().unwrap();
        let pod_dir = a.root.join("pods").join(&uid);
        let out_a = log_with_container(&a, name, "a", "done");
        let out_b = log_with_container(&a, name, "b", "done");
        let attr_a = line(&out_a, "attr=").pop().unwrap_or_default();
        let attr_b = line(&out_b, "attr=").pop().unwrap_or_default();
        let level = level_of(&attr_a);
        if name == "named" {
            assert_eq!(attr_a, "system_u:system_r:container_t:s0:c123,c456", "{out_a}");
            assert_eq!(attr_b, "system_u:system_r:spc_t:s0:c123,c456", "{out_b}");
        } else {
            assert!(attr_a.starts_with("system_u:system_r:container_t:s0:c"), "{out_a}");
            assert_eq!(attr_a, attr_b, "the containers of a pod share its label");
            plain_levels.push(level.clone());
        }
        let mount_label = format!("system_u:object_r:container_file_t:{level}");
        for out in [&out_a, &out_b] {
            let mounts = line(out, "mount=");
            assert!(mounts.len() >= 3, "{out}");
            for m in &mounts {
                assert!(m.contains(&format!("context=\"{mount_label}\"")), "{name}: {m}");
            }
        }
        let data = pod_dir.join("volumes/kubernetes.io~empty-dir/data");
        assert_eq!(label(&data), mount_label, "{name}: the emptyDir");
        for c in ["a", "b"] {
            let f = data.join(format!("from-{c}"));
            assert_eq!(
                level_of(&label(&f)),
                level,
                "{name}/{c}: a file the container wrote: {f:?}"
            );
        }
        assert_eq!(label(&pod_dir.join("etc-hosts")), mount_label, "{name}: /etc/hosts");
        // an exec'd process runs in the container's label
        let out = a.cli(&[
            "exec",
            &format!("{name}-{}", a.node),
            "-c",
            "b",
            "--",
            "cat",
            "/proc/self/attr/current",
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.trim_end_matches(['\n', '\0']), attr_b, "{name}: exec");
    }
    assert_ne!(plain_levels[0], plain_levels[1], "each pod has a level of its own");
    assert_eq!(label(&host), host_label, "a hostPath is never relabeled");
}
