//! kubelet's container manager with real pods (docs/cgroups.md): the QoS tiers' cpu shares and
//! memory reserve following the pods, CFS quota and throttling, podPidsLimit, OOM kills,
//! kubepods capped by enforceNodeAllocatable, and hugetlb limits (where the kernel has a hugetlb
//! controller and a pool). Every limit is small, and every cgroup sits below the test's own
//! nested cgroup. Runs on cgroup v1 here and on v2 in the VM lane (tests/vm). Extended
//! resources are admitted against a real device plugin's devices (common/deviceplugin.rs).

mod common;
#[path = "common/deviceplugin.rs"]
mod deviceplugin;

use std::time::{Duration, Instant};

use common::*;
use ferrolet_runtime::cgroups::{container_shares_to_weight, shares_to_weight, CgroupLimits, Cgroups};

const T: Duration = Duration::from_secs(45);

/// A cgroup file's trimmed content ("" when absent).
fn read(cg: &Cgroups, controller: &str, cgroup: &str, file: &str) -> String {
    cg.read_file(controller, cgroup, file).unwrap_or_default()
}

/// The cpu weight a cgroup has, as shares on v1 (`cpu.shares`) or as the weight v2 gets from
/// them (`cpu.weight`): compared with `want_shares` converted the same way.
fn assert_shares(cg: &Cgroups, cgroup: &str, want_shares: u64, what: &str) {
    if cg.is_v2() {
        assert_eq!(
            read(cg, "cpu", cgroup, "cpu.weight"),
            shares_to_weight(want_shares).to_string(),
            "{what}: cpu.weight of {want_shares} shares"
        );
    } else {
        assert_eq!(read(cg, "cpu", cgroup, "cpu.shares"), want_shares.to_string(), "{what}");
    }
}

/// The CFS quota and period of `cgroups`: `cpu.max` on v2, `cpu.cfs_quota_us` and
/// `cpu.cfs_period_us` on v1 (where no quota is -1).
fn assert_cfs(cg: &Cgroups, cgroups: &[&str], quota: &str, period: &str) {
    for c in cgroups {
        if cg.is_v2() {
            assert_eq!(read(cg, "cpu", c, "cpu.max"), format!("{quota} {period}"), "{c}");
        } else {
            let v1_quota = if quota == "max" { "-1" } else { quota };
            assert_eq!(read(cg, "cpu", c, "cpu.cfs_quota_us"), v1_quota, "{c}");
            assert_eq!(read(cg, "cpu", c, "cpu.cfs_period_us"), period, "{c}");
        }
    }
}

fn wait_shares(cg: &Cgroups, cgroup: &str, want_shares: u64, what: &str) {
    let deadline = Instant::now() + T;
    let (file, want) = if cg.is_v2() {
        ("cpu.weight", shares_to_weight(want_shares).to_string())
    } else {
        ("cpu.shares", want_shares.to_string())
    };
    while read(cg, "cpu", cgroup, file) != want {
        assert!(
            Instant::now() < deadline,
            "{what}: {file} of {cgroup} is {:?}, want {want}",
            read(cg, "cpu", cgroup, file)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The memory limit of a cgroup in bytes (None: unlimited).
fn memory_limit(cg: &Cgroups, cgroup: &str) -> Option<u64> {
    let file = if cg.is_v2() {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    read(cg, "memory", cgroup, file)
        .parse()
        .ok()
        .filter(|v| *v < (1u64 << 62))
}

/// The kernel keeps limits in pages.
fn pages(bytes: i64) -> u64 {
    (bytes as u64) / 4096 * 4096
}

fn mem_total() -> i64 {
    let m = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: i64 = m
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// Memory held as huge pages (allocatable leaves it out).
fn hugepages_total() -> i64 {
    let mut total = 0;
    for e in std::fs::read_dir("/sys/kernel/mm/hugepages")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        let kb: i64 = name
            .strip_prefix("hugepages-")
            .and_then(|s| s.strip_suffix("kB"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let n: i64 = std::fs::read_to_string(e.path().join("nr_hugepages"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        total += kb * 1024 * n;
    }
    total
}

/// CAP_SYS_RESOURCE (bit 24) in this process's effective set.
fn has_cap_sys_resource() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

fn with_resources(name: &str, script: &str, resources: &str) -> String {
    format!("{}    resources: {resources}\n", pod_yaml(name, "Always", script))
}

fn uid(p: &k8s_openapi::api::core::v1::Pod) -> String {
    p.metadata.uid.clone().unwrap()
}

fn container_cgroup(p: &k8s_openapi::api::core::v1::Pod, pod_cgroup: &str) -> String {
    let id = container_id(p, "main");
    format!("{pod_cgroup}/{id}")
}

#[test]
fn qos_tiers_follow_the_pods() {
    let a = Agent::start_with_config("qostiers", &[], "qosReserved: {memory: 50%}\n");
    let cg = Cgroups::detect().unwrap();
    let kubepods = format!("{}/kubepods", a.cgroup.path());
    let (burstable, besteffort) = (format!("{kubepods}/burstable"), format!("{kubepods}/besteffort"));
    // kubepods: the node's cpus as shares, memory capacity less huge pages (nothing reserved),
    // and the agent itself at kubelet's oomScoreAdj.
    // SAFETY: sysconf reads a value.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } as u64;
    assert_shares(&cg, &kubepods, cpus * 1024, "kubepods: the node's cpus");
    let alloc = mem_total() - hugepages_total();
    assert_eq!(
        memory_limit(&cg, &kubepods),
        Some(pages(alloc)),
        "kubepods capped at allocatable"
    );
    // Lowering it needs CAP_SYS_RESOURCE, which some machines (these) do not give root: then
    // the agent says so and goes on, as kubelet does.
    let adj = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", a.pid())).unwrap();
    if has_cap_sys_resource() {
        assert_eq!(adj.trim(), "-999");
    } else {
        assert_eq!(adj.trim(), "0");
        assert!(a.agent_log().contains("Failed to ApplyOOMScoreAdj"));
    }
    assert_shares(&cg, &besteffort, 2, "besteffort");
    assert_shares(&cg, &burstable, 2, "burstable with no pods");
    // No Guaranteed or Burstable requests yet: nothing reserved from the lower tiers.
    assert_eq!(memory_limit(&cg, &burstable), Some(pages(alloc)));
    assert_eq!(memory_limit(&cg, &besteffort), Some(pages(alloc)));

    a.write(
        "b1.yaml",
        &with_resources("b1", "sleep 3600", "{requests: {cpu: 300m, memory: 32Mi}}"),
    );
    a.write(
        "g.yaml",
        &with_resources(
            "g",
            "sleep 3600",
            "{limits: {cpu: 100m, memory: 64Mi}, requests: {cpu: 100m, memory: 64Mi}}",
        ),
    );
    a.wait_phase("b1", "Running", T);
    let g = a.wait_phase("g", "Running", T);
    assert_eq!(g.status.as_ref().unwrap().qos_class.as_deref(), Some("Guaranteed"));
    // 300m -> 307 shares; the Guaranteed pod's cpu is not the burstable tier's.
    wait_shares(&cg, &burstable, 307, "one burstable pod of 300m");
    let b_limit = alloc - (64 << 20) / 2;
    assert_eq!(memory_limit(&cg, &burstable), Some(pages(b_limit)), "50% of 64Mi kept");
    assert_eq!(memory_limit(&cg, &besteffort), Some(pages(b_limit - (32 << 20) / 2)));

    a.write(
        "b2.yaml",
        &with_resources("b2", "sleep 3600", "{requests: {cpu: 200m}}"),
    );
    a.wait_phase("b2", "Running", T);
    wait_shares(&cg, &burstable, 512, "burstable pods of 300m + 200m");
    assert_shares(&cg, &besteffort, 2, "besteffort stays at 2");

    // Removing pods takes their requests out of the tiers.
    a.remove("b1.yaml");
    a.wait_gone("b1", T);
    wait_shares(&cg, &burstable, 204, "the 200m pod left");
    assert_eq!(
        memory_limit(&cg, &besteffort),
        Some(pages(b_limit)),
        "no burstable memory requests left"
    );
    a.remove("b2.yaml");
    a.remove("g.yaml");
    a.wait_gone("b2", T);
    a.wait_gone("g", T);
    wait_shares(&cg, &burstable, 2, "no burstable pods");
    assert_eq!(memory_limit(&cg, &burstable), Some(pages(alloc)));
}

#[test]
fn cfs_quota_throttles_and_pids_are_limited() {
    let a = Agent::start_with_config(
        "cfs",
        &[],
        "cpuCFSQuotaPeriod: 50ms\npodPidsLimit: 20\noomScoreAdj: 500\n",
    );
    let cg = Cgroups::detect().unwrap();
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{}/oom_score_adj", a.pid()))
            .unwrap()
            .trim(),
        "500",
        "oomScoreAdj applied to the agent"
    );
    a.write(
        "busy.yaml",
        &with_resources(
            "busy",
            "while :; do :; done",
            "{limits: {cpu: 100m, memory: 32Mi}, requests: {cpu: 100m, memory: 32Mi}}",
        ),
    );
    a.write(
        "forks.yaml",
        &with_resources(
            "forks",
            "i=0; while [ $i -lt 40 ]; do sleep 3600 & i=$((i+1)); done; sleep 3600",
            "{requests: {cpu: 10m}}",
        ),
    );
    let p = a.wait_phase("busy", "Running", T);
    let pod_cg = format!("{}/kubepods/pod{}", a.cgroup.path(), uid(&p));
    let ctr_cg = container_cgroup(&p, &pod_cg);
    // 100m of a 50ms period: 5ms, on the container and the pod.
    assert_cfs(&cg, &[&ctr_cg, &pod_cg], "5000", "50000");
    if cg.is_v2() {
        // kubelet's memory.oom.group: an OOM kill takes the whole container.
        assert_eq!(read(&cg, "memory", &ctr_cg, "memory.oom.group"), "1");
    }
    // The busy loop is throttled: cpu.stat counts throttled periods.
    let deadline = Instant::now() + T;
    loop {
        let stat = read(&cg, "cpu", &ctr_cg, "cpu.stat");
        let throttled = stat
            .lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        if throttled >= 5 {
            break;
        }
        assert!(Instant::now() < deadline, "not throttled: {stat}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // podPidsLimit: the pod cgroup's pids.max, and a pod that tries more is refused forks.
    let f = a.wait_phase("forks", "Running", T);
    let forks_cg = format!("{}/kubepods/burstable/pod{}", a.cgroup.path(), uid(&f));
    assert_eq!(read(&cg, "pids", &forks_cg, "pids.max"), "20");
    let deadline = Instant::now() + T;
    while !a.logs("forks", "").contains("can't fork") {
        assert!(Instant::now() < deadline, "no fork refused: {}", a.logs("forks", ""));
        std::thread::sleep(Duration::from_millis(200));
    }
    let current: u64 = read(&cg, "pids", &forks_cg, "pids.current").parse().unwrap_or(0);
    assert!(current <= 20, "pids.current {current}");
    a.remove("busy.yaml");
    a.remove("forks.yaml");
    a.wait_gone("busy", T);
    a.wait_gone("forks", T);
}

#[test]
fn cpu_cfs_quota_off_leaves_no_quota() {
    let a = Agent::start_with_config("nocfs", &[], "cpuCFSQuota: false\n");
    let cg = Cgroups::detect().unwrap();
    a.write(
        "p.yaml",
        &with_resources(
            "p",
            "sleep 3600",
            "{limits: {cpu: 100m, memory: 32Mi}, requests: {cpu: 100m, memory: 32Mi}}",
        ),
    );
    let p = a.wait_phase("p", "Running", T);
    let pod_cg = format!("{}/kubepods/pod{}", a.cgroup.path(), uid(&p));
    let ctr_cg = container_cgroup(&p, &pod_cg);
    assert_cfs(&cg, &[&ctr_cg, &pod_cg], "max", "100000");
    // The limit still gives the shares of its request; on v2 libcontainer converts a
    // container's shares on runc's newer curve, not the pod cgroups' linear one.
    if cg.is_v2() {
        assert_eq!(
            read(&cg, "cpu", &ctr_cg, "cpu.weight"),
            container_shares_to_weight(102).to_string(),
            "container: cpu.weight of 102 shares"
        );
    } else {
        assert_shares(&cg, &ctr_cg, 102, "container");
    }
    assert_shares(&cg, &pod_cg, 102, "pod");
    a.remove("p.yaml");
    a.wait_gone("p", T);
}

/// Huge pages (kubelet's hugepages-<size> resources): a pod's request becomes its cgroup's
/// hugetlb limit, a pod without one gets 0, and kubepods gets the node's pool. Needs the hugetlb
/// controller and a reserved pool of 2Mi pages: the cgroup v2 lane reserves 16 at boot; this
/// machine's hybrid layout mounts no hugetlb controller, and the pool is the machine's, so the
/// test never reserves pages itself.
#[test]
fn hugepages_limit_the_pod_cgroups() {
    let cg = Cgroups::detect().unwrap();
    let pool_pages: i64 = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if !cg.has_hugetlb() || pool_pages < 2 {
        skip_loudly(
            "hugepages_limit_the_pod_cgroups",
            &format!(
                "needs the hugetlb controller and at least 2 reserved 2Mi pages (hugetlb: {}, pages: {pool_pages}); it runs in the cgroup v2 lane (tests/vm/run.sh)",
                cg.has_hugetlb()
            ),
        );
        return;
    }
    let pool = pool_pages * (2 << 20);
    let file = if cg.is_v2() {
        "hugetlb.2MB.max"
    } else {
        "hugetlb.2MB.limit_in_bytes"
    };
    let a = Agent::start("hugepages", &[]);
    let kubepods = format!("{}/kubepods", a.cgroup.path());
    assert_eq!(
        read(&cg, "hugetlb", &kubepods, file),
        pool.to_string(),
        "kubepods: the node's pool"
    );
    a.write(
        "huge.yaml",
        &with_resources(
            "huge",
            "sleep 3600",
            "{limits: {hugepages-2Mi: 4Mi, memory: 32Mi}, requests: {hugepages-2Mi: 4Mi, memory: 32Mi}}",
        ),
    );
    a.write("plain.yaml", &pod_yaml("plain", "Always", "sleep 3600"));
    let huge = a.wait_phase("huge", "Running", T);
    let plain = a.wait_phase("plain", "Running", T);
    let huge_cg = format!("{kubepods}/burstable/pod{}", uid(&huge));
    let plain_cg = format!("{kubepods}/besteffort/pod{}", uid(&plain));
    assert_eq!(
        read(&cg, "hugetlb", &huge_cg, file),
        (4 << 20).to_string(),
        "the pod's request"
    );
    assert_eq!(read(&cg, "hugetlb", &plain_cg, file), "0", "no request: no huge pages");
    a.remove("huge.yaml");
    a.remove("plain.yaml");
    a.wait_gone("huge", T);
    a.wait_gone("plain", T);
}

/// A node-wide OOM kill (no cgroup limit hit) is a Warning SystemOOM event with the victim, as
/// kubelet's OOM watcher reports it from the kernel log. It needs a real global OOM, which would
/// disturb this machine, so it runs only in the cgroup v2 lane's throwaway guest
/// (FERROLET_VM_GUEST, set by tests/vm/init); the hog volunteers as the victim with
/// oom_score_adj 1000.
#[test]
fn system_oom_is_a_node_event() {
    if std::env::var_os("FERROLET_VM_GUEST").is_none() {
        skip_loudly(
            "system_oom_is_a_node_event",
            "a node-wide OOM would disturb this machine; it runs in the cgroup v2 lane's guest (tests/vm/run.sh)",
        );
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    let a = Agent::start("systemoom", &[]);
    a.wait_log("watching /dev/kmsg for node OOM kills", T);
    // A string doubled until the machine has no memory left.
    let mut hog = std::process::Command::new("sh")
        .args([
            "-c",
            "echo 1000 > /proc/self/oom_score_adj; exec awk 'BEGIN { s = \"x\"; while (1) s = s s }'",
        ])
        .spawn()
        .unwrap();
    let pid = hog.id();
    let status = hog.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "the hog was OOM-killed");
    a.wait_log(&format!("System OOM encountered, victim process: awk, pid: {pid}"), T);
    assert!(
        a.agent_log().contains("reason=\"SystemOOM\""),
        "the SystemOOM event is recorded"
    );
}

#[test]
fn memory_hog_is_oom_killed() {
    let a = Agent::start("oomhog", &[]);
    a.write(
        "hog.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: hog}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: main\n    image: {IMAGE}\n    command: [sh, -c, \"x=$(head -c 67108864 /dev/zero | tr '\\\\0' a); echo survived\"]\n    resources:\n      limits: {{memory: 16Mi}}\n"
        ),
    );
    let p = a.wait_phase("hog", "Failed", T);
    assert_oom_killed(&p, "main");
    assert!(!a.logs("hog", "").contains("survived"));
    a.remove("hog.yaml");
    a.wait_gone("hog", T);
}

#[test]
fn kubepods_capped_by_enforce_node_allocatable() {
    // Reserve all but 160Mi of the machine: kubepods gets 128Mi after kubeReserved's 32Mi,
    // and a BestEffort hog without a limit of its own is OOM-killed at kubepods' limit.
    let cg = Cgroups::detect().unwrap();
    let memory = mem_total() - hugepages_total();
    let system = memory - (160 << 20);
    // The agent's kubeReservedCgroup: made by the test below its own nested cgroup (an
    // operator makes it as a systemd slice; kubelet never creates it).
    // Removed when the test ends, failed or not (after the agent, declared later, is gone).
    struct Holder(ferrolet_runtime::cgroups::NestedRoot);
    impl Drop for Holder {
        fn drop(&mut self) {
            if let Err(e) = self.0.cleanup() {
                eprintln!("removing {}: {e}", self.0.path());
            }
        }
    }
    let holder = Holder(
        ferrolet_runtime::cgroups::NestedRoot::create(&cg, &format!("ferrolet-it-kubereserved-{}", std::process::id()))
            .expect("nested cgroup"),
    );
    let kube_cg = format!("{}/kube", holder.0.path());
    cg.create(&kube_cg, &CgroupLimits::default()).unwrap();
    let a = Agent::start_with_config(
        "enforce",
        &[],
        &format!(
            "systemReserved: {{memory: \"{system}\"}}\nkubeReserved: {{memory: 32Mi, cpu: 100m}}\nevictionHard: {{memory.available: 1Mi}}\nenforceNodeAllocatable: [pods, kube-reserved]\nkubeReservedCgroup: {kube_cg}\n"
        ),
    );
    let kubepods = format!("{}/kubepods", a.cgroup.path());
    assert_eq!(memory_limit(&cg, &kubepods), Some(pages(128 << 20)));
    assert_eq!(
        memory_limit(&cg, &kube_cg),
        Some(32 << 20),
        "kubeReserved on its cgroup"
    );
    assert_shares(&cg, &kube_cg, 102, "kubeReserved cpu 100m");
    a.write(
        "hog.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: hog}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: main\n    image: {IMAGE}\n    command: [dd, if=/dev/zero, of=/dev/null, bs=268435456, count=1]\n"
        ),
    );
    // dd, the container's init, reads 256Mi into one buffer: past kubepods' 128Mi within that
    // one read, so the kernel's OOM kill comes long before the eviction manager (whose
    // allocatable threshold is 1Mi) could see the pods near their limit. A shell building the
    // same in a variable through a pipe took long enough in the emulated guest for the
    // eviction manager to evict it first. Still a longer wait than the others'.
    let p = a.wait_phase("hog", "Failed", 3 * T);
    assert_eq!(p.status.as_ref().unwrap().qos_class.as_deref(), Some("BestEffort"));
    assert_oom_killed(&p, "main");
    a.remove("hog.yaml");
    a.wait_gone("hog", T);
}

#[test]
fn a_missing_kube_reserved_cgroup_stops_the_agent() {
    // kubelet refuses to start when a reserved cgroup to enforce does not exist.
    let dir = std::env::temp_dir().join(format!("ferrolet-it-noreserved-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cg = Cgroups::detect().unwrap();
    let nested =
        ferrolet_runtime::cgroups::NestedRoot::create(&cg, &format!("ferrolet-it-noreserved-{}", std::process::id()))
            .expect("nested cgroup");
    let config = dir.join("kubelet.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: {}\nreadOnlyPort: 0\naddress: 127.0.0.1\nport: {}\nhealthzPort: {}\nenforceNodeAllocatable: [pods, kube-reserved]\nkubeReservedCgroup: {}/absent\n",
            dir.join("logs").display(),
            free_port(),
            free_port(),
            nested.path()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["run", "--config"])
        .arg(&config)
        .arg("--root-dir")
        .arg(dir.join("root"))
        .arg("--pod-manifest-path")
        .arg(dir.join("manifests"))
        .arg("--cgroup-root")
        .arg(nested.path())
        .args(["--network", "none", "--hostname-override", "noreserved"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    let reset = std::process::Command::new(BIN)
        .args(["reset", "--root-dir"])
        .arg(dir.join("root"))
        .output();
    let _ = reset;
    let _ = nested.cleanup();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    assert!(
        err.contains("Failed to enforce Kube Reserved Cgroup Limits on") && err.contains("cgroup does not exist"),
        "{err}"
    );
}

/// A pod asking for `n` of `resource`, printing the device nodes and the variable its plugin
/// gives it.
fn device_pod(name: &str, resource: &str, n: u32) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {IMAGE}\n    command: [sh, -c, \"ls /dev/test-*; echo TEST_DEVICES=$TEST_DEVICES; sleep 3600\"]\n    resources:\n      limits: {{{resource}: {n}}}\n"
    )
}

fn refused(p: &k8s_openapi::api::core::v1::Pod) -> (String, String) {
    let st = p.status.as_ref().unwrap();
    (
        st.reason.clone().unwrap_or_default(),
        st.message.clone().unwrap_or_default(),
    )
}

/// Wait until the agent's log (kept across restarts) has said `needle` `n` times.
fn wait_said(a: &Agent, needle: &str, n: usize) {
    let deadline = Instant::now() + T;
    while a.agent_log().matches(needle).count() < n {
        assert!(
            Instant::now() < deadline,
            "the agent never said {needle:?} {n} times:\n{}",
            tail(&a.agent_log(), 40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait until pod `name`'s log shows its devices: `TEST_DEVICES=<ids>` and a node per ID.
fn wait_devices(a: &Agent, name: &str, ids: &[&str]) {
    a.wait_phase(name, "Running", T);
    let deadline = Instant::now() + T;
    let want = format!("TEST_DEVICES={}", ids.join(","));
    loop {
        let log = a.logs(name, "");
        if log.contains(&want) {
            for id in ids {
                assert!(
                    log.contains(&format!("/dev/test-{id}")),
                    "{name} lacks /dev/test-{id}:\n{log}"
                );
            }
            return;
        }
        assert!(Instant::now() < deadline, "{name} never printed {want}:\n{log}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the pod resources API says: each container's devices as (pod, resource, IDs), and
/// how many devices the node's plugins list.
fn pod_resources(a: &Agent) -> (Vec<(String, String, Vec<String>)>, usize) {
    use ferrolet::apis::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
    use ferrolet::apis::podresources::v1::{AllocatableResourcesRequest, ListPodResourcesRequest};
    let socket = a.socket().parent().unwrap().join("pod-resources/kubelet.sock");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = ferrolet::apis::dial(&socket, Duration::from_secs(5)).await.unwrap();
        let mut c = PodResourcesListerClient::new(channel);
        let list = c.list(ListPodResourcesRequest {}).await.unwrap().into_inner();
        let all = c
            .get_allocatable_resources(AllocatableResourcesRequest {})
            .await
            .unwrap()
            .into_inner();
        let mut held: Vec<_> = list
            .pod_resources
            .iter()
            .flat_map(|p| p.containers.iter().map(move |c| (p, c)))
            .flat_map(|(p, c)| {
                c.devices
                    .iter()
                    .map(move |d| (p.name.clone(), d.resource_name.clone(), d.device_ids.clone()))
            })
            .collect();
        held.sort();
        (held, all.devices.len())
    })
}

/// Resource `name`'s capacity and allocatable in the node's status (/ferrolet/node).
fn node_resource(a: &Agent, name: &str) -> (Option<String>, Option<String>) {
    let (code, body) = a.get("/ferrolet/node").expect("/ferrolet/node");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let n: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let quantity = |list: &str| n["status"][list][name].as_str().map(String::from);
    (quantity("capacity"), quantity("allocatable"))
}

#[test]
fn device_plugins_devices_admit_pods_and_reach_their_containers() {
    use deviceplugin::TestDevicePlugin;
    let mut a = Agent::start("devices", &[]);
    let dir = a.socket().parent().unwrap().join("device-plugins");
    let res = "example.com/dev";
    let plugin = TestDevicePlugin::serve(&dir, res, "dev.sock", &[("d1", true), ("d2", true), ("d3", false)]);
    plugin.register();
    // Bad registrations are refused, naming the field.
    let e = plugin.register_as("v1alpha1", res).unwrap_err();
    assert!(e.message().starts_with("version:"), "{}", e.message());
    let e = plugin.register_as("v1beta1", "gpu").unwrap_err();
    assert!(e.message().starts_with("resource_name:"), "{}", e.message());
    wait_said(&a, "devices=3 healthy=2", 1);
    // The node shows them as a cluster's Node would: every device, the healthy ones allocatable.
    assert_eq!(node_resource(&a, res), (Some("3".into()), Some("2".into())));

    // Two healthy devices: a pod asking for both gets both, one more is refused as kubelet does.
    a.write("two.yaml", &device_pod("two", res, 2));
    a.wait_phase("two", "Running", T);
    wait_devices(&a, "two", &["d1", "d2"]);
    a.write("one.yaml", &device_pod("one", res, 1));
    let (reason, message) = refused(&a.wait_phase("one", "Failed", T));
    assert_eq!(reason, "OutOfexample.com/dev");
    assert!(message.contains("requested: 1, used: 2, capacity: 2"), "{message}");

    // The third device turns healthy: a pod asking for one gets it.
    plugin.set("d3", true);
    wait_said(&a, "devices=3 healthy=3", 1);
    a.write("three.yaml", &device_pod("three", res, 1));
    wait_devices(&a, "three", &["d3"]);

    // What monitoring agents read: who holds which device, and every device.
    let (held, all) = pod_resources(&a);
    assert_eq!(
        held,
        [
            (
                "three-node-devices".to_string(),
                res.to_string(),
                vec!["d3".to_string()]
            ),
            ("two-node-devices".into(), res.into(), vec!["d1".into(), "d2".into()]),
        ]
    );
    assert_eq!(all, 3);

    // A resource no plugin serves has no capacity.
    a.write("none.yaml", &device_pod("none", "other.example.com/x", 1));
    let (reason, message) = refused(&a.wait_phase("none", "Failed", T));
    assert_eq!(reason, "OutOfother.example.com/x");
    assert!(message.contains("capacity: 0"), "{message}");

    // An agent restart keeps the allocations (the checkpoint). The agent admits its pods again
    // before the plugin has registered again: the pods holding devices stay, as with kubelet
    // (pre-allocated devices pass its Allocate, and sanitizeNodeAllocatable its count). Once the plugin is back and "three" is gone, a new pod
    // gets d3, never a device "two" still holds.
    let started = |a: &Agent, name: &str| running_since(&a.wait_phase(name, "Running", T), "main");
    let (two_started, three_started) = (started(&a, "two"), started(&a, "three"));
    a.restart();
    plugin.register();
    wait_said(&a, "devices=3 healthy=3", 2);
    assert!(
        !a.agent_log()
            .contains("pod rejected: Node didn't have enough resource: example.com/dev, requested: 2"),
        "the restarted agent refused a pod holding devices:\n{}",
        tail(&a.agent_log(), 40)
    );
    assert_eq!(started(&a, "two"), two_started, "\"two\" was not left running");
    assert_eq!(started(&a, "three"), three_started, "\"three\" was not left running");
    a.remove("three.yaml");
    a.wait_gone("three", T);
    a.write("five.yaml", &device_pod("five", res, 1));
    wait_devices(&a, "five", &["d3"]);
    // The plugin was asked for each container's devices once: the restart asked again for none.
    assert_eq!(
        *plugin.allocations.lock().unwrap(),
        [
            vec!["d1".to_string(), "d2".into()],
            vec!["d3".into()],
            vec!["d3".into()]
        ]
    );

    // The plugin goes: its devices count as unhealthy, and a new pod asking for one is refused.
    drop(plugin);
    a.wait_log("its stream ended", T);
    a.write("four.yaml", &device_pod("four", res, 1));
    let (reason, message) = refused(&a.wait_phase("four", "Failed", T));
    assert_eq!(reason, "OutOfexample.com/dev");
    assert!(message.contains("capacity: 0"), "{message}");
    assert_eq!(node_resource(&a, res), (Some("3".into()), Some("0".into())));

    for p in ["two", "one", "none", "five", "four"] {
        a.remove(&format!("{p}.yaml"));
        a.wait_gone(p, T);
    }
}

/// Wait until the agent recorded a Warning event of reason Failed (kubelet's, for a container
/// that cannot start) whose line says every one of `needles`; the line.
fn wait_failed_event(a: &Agent, needles: &[&str]) -> String {
    let deadline = Instant::now() + T;
    loop {
        let log = a.agent_log();
        let line = log
            .lines()
            .find(|l| l.contains(" WARN ") && l.contains("reason=\"Failed\"") && needles.iter().all(|n| l.contains(n)));
        if let Some(l) = line {
            return l.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no Failed Warning event saying {needles:?}:\n{}",
            tail(&log, 40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait until container `main` of pod `name` waits with CreateContainerConfigError and a
/// message saying `needle`; the message.
fn wait_config_error(a: &Agent, name: &str, needle: &str) -> String {
    let p = a.wait_for(name, needle, T, |p| {
        waiting_reason(p, "main").as_deref() == Some("CreateContainerConfigError")
            && waiting_message(p, "main").is_some_and(|m| m.contains(needle))
    });
    waiting_message(&p, "main").unwrap()
}

#[test]
fn device_plugins_preferred_allocation_pre_start_finished_pods_and_bad_plugins() {
    use deviceplugin::{AllocateMode, Switches, TestDevicePlugin};
    use ferrolet::apis::deviceplugin::v1beta1::DevicePluginOptions;
    let a = Agent::start("devices2", &[]);
    let dir = a.socket().parent().unwrap().join("device-plugins");
    let marks = scratch(&a.dir, "marks");
    // The agent's memory (KiB of Rss and Pss) before and with two plugins registered, for the
    // record (printed, never asserted).
    let memory = |pid: u32| -> (u64, u64) {
        let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        (field("Rss:"), field("Pss:"))
    };
    std::thread::sleep(Duration::from_secs(1));
    let before = memory(a.pid());
    // A plugin that prefers p4, then p3, and is told of each start of a container.
    let pref = TestDevicePlugin::serve_with(
        &dir,
        "example.com/pref",
        "pref.sock",
        &[("p1", true), ("p2", true), ("p3", true), ("p4", true)],
        Switches {
            options: DevicePluginOptions {
                pre_start_required: true,
                get_preferred_allocation_available: true,
            },
            preferred: vec!["p4".into(), "p3".into()],
            pre_start_marks: Some(marks.clone()),
            ..Default::default()
        },
    );
    pref.register();
    // One device, a plain plugin.
    let one = TestDevicePlugin::serve(&dir, "example.com/one", "one.sock", &[("o1", true)]);
    one.register();
    wait_said(&a, "devices=4 healthy=4", 1);
    wait_said(&a, "devices=1 healthy=1", 1);
    let with_two = memory(a.pid());
    println!(
        "agent memory: {} KiB Rss / {} KiB Pss with no plugin, {} / {} KiB with 2 device plugins registered and listing",
        before.0, before.1, with_two.0, with_two.1
    );
    // A plugin whose Allocate never answers.
    let bad = TestDevicePlugin::serve_with(
        &dir,
        "example.com/bad",
        "bad.sock",
        &[("b1", true)],
        Switches {
            allocate: AllocateMode::Hang,
            ..Default::default()
        },
    );
    bad.register();
    wait_said(&a, "devices=4 healthy=4", 1);
    wait_said(&a, "devices=1 healthy=1", 2);

    // The plugin's preferred devices; PreStartContainer with them before each start: the
    // container reads what PreStartContainer wrote (its count of calls and the IDs), then ends
    // and is restarted.
    a.write(
        "pref.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: pref}}\nspec:\n  containers:\n  - name: main\n    image: {IMAGE}\n    command: [sh, -c, \"cat /marks/p3,p4; echo TEST_DEVICES=$TEST_DEVICES; sleep 1\"]\n    resources:\n      limits: {{example.com/pref: 2}}\n    volumeMounts: [{{name: marks, mountPath: /marks}}]\n  volumes: [{{name: marks, hostPath: {{path: {}}}}}]\n",
            marks.display()
        ),
    );

    // A pod that ran to completion (restartPolicy Never) holds its device no more: a new pod
    // is admitted and gets it while the finished pod is still on the node.
    a.write(
        "job.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: job}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: main\n    image: {IMAGE}\n    command: [sh, -c, \"ls /dev/test-o1\"]\n    resources:\n      limits: {{example.com/one: 1}}\n"
        ),
    );
    a.wait_phase("job", "Succeeded", T);
    a.write("next.yaml", &device_pod("next", "example.com/one", 1));
    wait_devices(&a, "next", &["o1"]);
    assert_eq!(
        phase_of(a.pod("job").as_ref()),
        Some("Succeeded"),
        "the finished pod is still there"
    );
    let (held, _) = pod_resources(&a);
    let of_one: Vec<_> = held.iter().filter(|(_, r, _)| r == "example.com/one").collect();
    assert_eq!(of_one.len(), 1, "{held:?}");
    assert!(of_one[0].0.starts_with("next-"), "{held:?}");
    // The checkpoint says the same.
    let next_uid = a.pod("next").unwrap().metadata.uid.unwrap();
    let cp: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("kubelet_internal_checkpoint")).unwrap()).unwrap();
    let holders: Vec<&str> = cp["Data"]["PodDeviceEntries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ResourceName"] == "example.com/one")
        .map(|e| e["PodUID"].as_str().unwrap())
        .collect();
    assert_eq!(holders, [next_uid.as_str()]);
    assert_eq!(
        *one.allocations.lock().unwrap(),
        [vec!["o1".to_string()], vec!["o1".into()]]
    );

    // A plugin whose Allocate hangs stalls only its own pod: another pod starts meanwhile (with
    // two of the other plugin's devices: its preference, p4 and p3, is taken by now, so it
    // answers with too few, and the choice is filled up here).
    a.write("hang.yaml", &device_pod("hang", "example.com/bad", 1));
    let deadline = Instant::now() + T;
    while bad.allocations.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the bad plugin was never asked");
        std::thread::sleep(Duration::from_millis(50));
    }
    let hang_began = Instant::now();
    a.write("other.yaml", &device_pod("other", "example.com/pref", 2));
    wait_devices(&a, "other", &["p1", "p2"]);
    assert!(
        !a.agent_log().contains("did not answer within"),
        "the other pod started only after the hanging Allocate gave up ({:?})",
        hang_began.elapsed()
    );
    wait_said(&a, "cannot be taken as it is", 1);
    // The hanging pod's container waits, and a Warning event names the resource and plugin.
    let m = wait_config_error(&a, "hang", "Allocate did not answer within 10s");
    assert!(m.contains("example.com/bad") && m.contains("bad.sock"), "{m}");
    wait_failed_event(
        &a,
        &["hang-", "example.com/bad", "\"bad.sock\"", "Allocate did not answer"],
    );
    // Garbage: a relative device path, then two answers for one container.
    bad.set_allocate(AllocateMode::BadPath);
    wait_config_error(&a, "hang", "devices[0].host_path");
    wait_failed_event(&a, &["hang-", "example.com/bad", "devices[0].host_path"]);
    bad.set_allocate(AllocateMode::TwoAnswers);
    wait_config_error(&a, "hang", "answered for 2 containers, not 1");
    wait_failed_event(&a, &["hang-", "example.com/bad", "answered for 2 containers"]);
    // The plugin crashes.
    drop(bad);
    wait_config_error(&a, "hang", "is not running");
    wait_failed_event(&a, &["hang-", "example.com/bad", "\"bad.sock\" is not running"]);
    // It comes back, hanging again: the pod's removal does not wait for its answer.
    let bad = TestDevicePlugin::serve_with(
        &dir,
        "example.com/bad",
        "bad.sock",
        &[("b1", true)],
        Switches {
            allocate: AllocateMode::Hang,
            ..Default::default()
        },
    );
    bad.register();
    let deadline = Instant::now() + T;
    while bad.allocations.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the plugin back was never asked");
        std::thread::sleep(Duration::from_millis(50));
    }
    let gave_up = a.agent_log().matches("Allocate did not answer within").count();
    let removing = Instant::now();
    a.remove("hang.yaml");
    a.wait_gone("hang", T);
    assert_eq!(
        a.agent_log().matches("Allocate did not answer within").count(),
        gave_up,
        "the removal waited for the hanging Allocate to give up ({:?})",
        removing.elapsed()
    );

    // Meanwhile the first pod was restarted: the plugin was asked once for its preference
    // (all four free, nothing that must be in it, two of them) and for Allocate, and
    // PreStartContainer came before each start with the container's devices.
    a.wait_for("pref", "restarted", T, |p| restarts(p, "main") >= 1);
    let deadline = Instant::now() + T;
    let calls_seen = loop {
        // The current attempt's log: `<calls> p3,p4`, written by the PreStartContainer before it.
        let log = a.logs("pref", "");
        let calls = log
            .lines()
            .find_map(|l| l.strip_suffix(" p3,p4"))
            .and_then(|n| n.trim().parse::<usize>().ok());
        if let Some(n) = calls.filter(|n| *n >= 2) {
            assert!(log.contains("TEST_DEVICES=p3,p4"), "{log}");
            break n;
        }
        assert!(
            Instant::now() < deadline,
            "pref never printed a second PreStartContainer:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    {
        let sw = pref.switches.lock().unwrap();
        let all = || ["p1", "p2", "p3", "p4"].map(String::from).to_vec();
        assert_eq!(
            sw.preferred_asked[0],
            (all(), Vec::new(), 2),
            "{:?}",
            sw.preferred_asked
        );
        let pre_starts_of_pref: Vec<_> = sw.pre_starts.iter().filter(|ids| ids[0] != "p1").collect();
        assert!(pre_starts_of_pref.len() >= calls_seen, "{:?}", sw.pre_starts);
        assert!(
            pre_starts_of_pref.iter().all(|ids| *ids == &["p3", "p4"]),
            "{:?}",
            sw.pre_starts
        );
    }
    assert_eq!(
        pref.allocations.lock().unwrap()[0],
        ["p3", "p4"],
        "Allocate was asked for the preferred devices"
    );
    assert_eq!(
        pref.allocations.lock().unwrap().len(),
        2,
        "once per container (pref and other): a restart keeps the devices"
    );

    let pods = ["pref", "job", "next", "other"];
    for p in pods {
        a.remove(&format!("{p}.yaml"));
    }
    for p in pods {
        a.wait_gone(p, T);
    }
}
