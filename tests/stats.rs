//! Stats with real pods: a pod burning a cpu, one holding 50 MB, one with an emptyDir holding a
//! file of known size, on the bridge network inside a test network namespace. `/stats/summary`
//! is decoded into types that mirror kubelet's stats/v1alpha1 Go structs (unknown fields
//! refused), `/metrics/resource` and `/metrics/cadvisor` with a Prometheus text parser, and
//! `ferrolet top` is read as a user would.

mod common;

use std::time::{Duration, Instant};

use common::net::TestNet;
use common::*;
use serde::Deserialize;

/// The Summary API as kubelet's Go types (k8s.io/kubelet/pkg/apis/stats/v1alpha1) define it,
/// inline structs spelled out (serde cannot refuse unknown fields through `flatten`).
#[allow(dead_code)] // every field of the schema, read or not: decoding is the check
mod go {
    use super::Deserialize;

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    pub struct Summary {
        pub node: NodeStats,
        pub pods: Vec<PodStats>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct NodeStats {
        pub node_name: String,
        #[serde(default)]
        pub system_containers: Vec<ContainerStats>,
        pub start_time: String,
        pub cpu: Option<CpuStats>,
        pub memory: Option<MemoryStats>,
        pub network: Option<NetworkStats>,
        pub fs: Option<FsStats>,
        pub runtime: Option<RuntimeStats>,
        pub rlimit: Option<RlimitStats>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    pub struct RlimitStats {
        pub time: String,
        pub maxpid: Option<i64>,
        pub curproc: Option<i64>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct RuntimeStats {
        pub image_fs: Option<FsStats>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    pub struct ProcessStats {
        pub process_count: Option<u64>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct PodStats {
        pub pod_ref: PodReference,
        pub start_time: String,
        pub containers: Vec<ContainerStats>,
        pub cpu: Option<CpuStats>,
        pub memory: Option<MemoryStats>,
        pub network: Option<NetworkStats>,
        #[serde(default)]
        pub volume: Vec<VolumeStats>,
        #[serde(rename = "ephemeral-storage")]
        pub ephemeral_storage: Option<FsStats>,
        #[serde(rename = "process_stats")]
        pub process_stats: Option<ProcessStats>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct ContainerStats {
        pub name: String,
        pub start_time: String,
        pub cpu: Option<CpuStats>,
        pub memory: Option<MemoryStats>,
        #[serde(default)]
        pub accelerators: Vec<serde_json::Value>,
        pub rootfs: Option<FsStats>,
        pub logs: Option<FsStats>,
        #[serde(default)]
        pub user_defined_metrics: Vec<serde_json::Value>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    pub struct PodReference {
        pub name: String,
        pub namespace: String,
        pub uid: String,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct InterfaceStats {
        pub name: String,
        pub rx_bytes: Option<u64>,
        pub rx_errors: Option<u64>,
        pub tx_bytes: Option<u64>,
        pub tx_errors: Option<u64>,
    }

    /// NetworkStats with its inline InterfaceStats.
    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct NetworkStats {
        pub time: String,
        pub name: String,
        pub rx_bytes: Option<u64>,
        pub rx_errors: Option<u64>,
        pub tx_bytes: Option<u64>,
        pub tx_errors: Option<u64>,
        #[serde(default)]
        pub interfaces: Vec<InterfaceStats>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct CpuStats {
        pub time: String,
        pub usage_nano_cores: Option<u64>,
        pub usage_core_nano_seconds: Option<u64>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct MemoryStats {
        pub time: String,
        pub available_bytes: Option<u64>,
        pub usage_bytes: Option<u64>,
        pub working_set_bytes: Option<u64>,
        pub rss_bytes: Option<u64>,
        pub page_faults: Option<u64>,
        pub major_page_faults: Option<u64>,
    }

    /// VolumeStats with its inline FsStats.
    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct VolumeStats {
        pub time: String,
        pub available_bytes: Option<u64>,
        pub capacity_bytes: Option<u64>,
        pub used_bytes: Option<u64>,
        pub inodes_free: Option<u64>,
        pub inodes: Option<u64>,
        pub inodes_used: Option<u64>,
        pub name: Option<String>,
        pub pvc_ref: Option<serde_json::Value>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct FsStats {
        pub time: String,
        pub available_bytes: Option<u64>,
        pub capacity_bytes: Option<u64>,
        pub used_bytes: Option<u64>,
        pub inodes_free: Option<u64>,
        pub inodes: Option<u64>,
        pub inodes_used: Option<u64>,
    }
}

const T: Duration = Duration::from_secs(60);
const MB: u64 = 1_000_000;
const FILE_BYTES: u64 = 3 << 20;

fn summary(a: &Agent, query: &str) -> go::Summary {
    let (code, body) = a.get(&format!("/stats/summary{query}")).expect("GET /stats/summary");
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("decoding the summary: {e}\n{}", String::from_utf8_lossy(&body)))
}

fn is_rfc3339(t: &str) -> bool {
    chrono::DateTime::parse_from_rfc3339(t).is_ok() && t.ends_with('Z')
}

fn pod<'a>(s: &'a go::Summary, a: &Agent, name: &str) -> Option<&'a go::PodStats> {
    let full = format!("{name}-{}", a.node);
    s.pods.iter().find(|p| p.pod_ref.name == full)
}

fn scrape(a: &Agent, path: &str) -> prometheus_parse::Scrape {
    let (code, body) = a.get(path).unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(code, 200);
    let text = String::from_utf8(body).unwrap();
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text")
}

fn value(s: &prometheus_parse::Sample) -> f64 {
    match s.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        _ => panic!("not a counter or gauge: {s:?}"),
    }
}

fn find<'a>(
    sc: &'a prometheus_parse::Scrape,
    metric: &str,
    labels: &[(&str, &str)],
) -> Vec<&'a prometheus_parse::Sample> {
    sc.samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect()
}

/// Sample every second, walk every two.
const FAST: &[&str] = &["--housekeeping-interval", "1s", "--volume-stats-agg-period", "2s"];

#[test]
fn stats_of_real_pods_on_the_bridge_network() {
    let net = TestNet::create("stats");
    let a = Agent::start_in_netns(
        "stats",
        &net.path,
        "bridge",
        FAST,
        "ferrolet:\n  podSubnet: 10.67.0.0/24\n",
    );
    check_pods(&a, true);
}

/// Without a pod network (and so without a network namespace to set up): the cgroup v2 lane
/// runs this one.
#[test]
fn stats_of_real_pods_without_a_network() {
    let a = Agent::start("statsnonet", FAST);
    check_pods(&a, false);
}

/// Run a pod burning a cpu, one holding 50 MB and one writing a file to an emptyDir, and
/// check every endpoint against what they do.
fn check_pods(a: &Agent, network: bool) {
    a.write("burn.yaml", &pod_yaml("burn", "Always", "while :; do :; done"));
    // 50 MB of anonymous memory (no tmpfs involved): dd reads one 50 MB block into its buffer,
    // in one read, then blocks writing it into a pipe nobody reads. Building the same in a
    // shell variable took over a minute in the emulated guest beside CI's other stages.
    a.write(
        "mem.yaml",
        &pod_yaml("mem", "Always", "dd if=/dev/zero bs=50000000 count=1 | sleep 1000"),
    );
    a.write(
        "vol.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: vol}}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes: [{{name: scratch, emptyDir: {{}}}}]\n  containers:\n  - name: main\n    image: {IMAGE}\n    command: [sh, -c, \"head -c {FILE_BYTES} /dev/urandom > /data/f && sync && sleep 1000\"]\n    volumeMounts: [{{name: scratch, mountPath: /data}}]\n"
        ),
    );
    for p in ["burn", "mem", "vol"] {
        a.wait_for(p, "running", T, |p| running(p, "main"));
    }
    // Wait until the samples show what the pods do (a rate needs two samples; the walk of the
    // emptyDir comes on its own period).
    let deadline = Instant::now() + T;
    let s = loop {
        let s = summary(a, "");
        let burn = pod(&s, a, "burn")
            .and_then(|p| p.containers.first())
            .and_then(|c| c.cpu.as_ref()?.usage_nano_cores);
        // The container's working set and rss both, as checked below.
        let mem = pod(&s, a, "mem")
            .and_then(|p| p.containers.first()?.memory.as_ref())
            .and_then(|m| Some(m.working_set_bytes?.min(m.rss_bytes?)));
        let vol = pod(&s, a, "vol").and_then(|p| p.volume.first()?.used_bytes);
        if burn.is_some_and(|n| n > 300_000_000)
            && mem.is_some_and(|m| m > 40 * MB)
            && vol.is_some_and(|v| v >= FILE_BYTES)
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "stats never showed the pods' work: burn {burn:?} nanocores, mem {mem:?} bytes, vol {vol:?} bytes\nmem pod: {:?}\nmem logs: {}\n{}",
            pod(&s, a, "mem"),
            a.logs("mem", ""),
            a.agent_log()
        );
        std::thread::sleep(Duration::from_millis(500));
    };

    // The node.
    let n = &s.node;
    assert_eq!(n.node_name, a.node);
    assert!(is_rfc3339(&n.start_time));
    let cpu = n.cpu.as_ref().expect("node cpu");
    assert!(is_rfc3339(&cpu.time));
    assert!(
        cpu.usage_nano_cores.unwrap() > 300_000_000,
        "the burning pod is on the node: {cpu:?}"
    );
    assert!(cpu.usage_core_nano_seconds.unwrap() > 0);
    let mem = n.memory.as_ref().expect("node memory");
    let (ws, usage, avail) = (
        mem.working_set_bytes.unwrap(),
        mem.usage_bytes.unwrap(),
        mem.available_bytes.unwrap(),
    );
    assert!(ws <= usage && ws > 50 * MB, "{mem:?}");
    assert!(mem.rss_bytes.unwrap() > 0 && mem.page_faults.unwrap() > 0, "{mem:?}");
    let capacity = ws + avail;
    assert!(capacity > 100 * MB);
    let fs = n.fs.as_ref().expect("nodefs");
    assert!(fs.capacity_bytes.unwrap() >= fs.available_bytes.unwrap() && fs.inodes.unwrap() > 0);
    let image_fs = n.runtime.as_ref().and_then(|r| r.image_fs.as_ref()).expect("imageFs");
    assert!(
        image_fs.used_bytes.unwrap() > MB,
        "the busybox image is in the store: {image_fs:?}"
    );
    let rl = n.rlimit.as_ref().expect("rlimit");
    assert!(rl.maxpid.unwrap() > rl.curproc.unwrap() && rl.curproc.unwrap() > 0);
    let names: Vec<&str> = n.system_containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["kubelet", "pods"]);
    let pods_sys = &n.system_containers[1];
    assert!(pods_sys.memory.as_ref().unwrap().working_set_bytes.unwrap() > 40 * MB);
    assert!(pods_sys.cpu.as_ref().unwrap().usage_nano_cores.unwrap() > 300_000_000);

    // The pods.
    let burn = pod(&s, a, "burn").unwrap();
    assert_eq!(burn.pod_ref.namespace, "default");
    assert!(!burn.pod_ref.uid.is_empty() && is_rfc3339(&burn.start_time));
    let c = &burn.containers[0];
    assert_eq!(c.name, "main");
    assert!(
        c.cpu.as_ref().unwrap().usage_nano_cores.unwrap() < 1_500_000_000,
        "one shell loop is at most one core"
    );
    assert!(burn.cpu.as_ref().unwrap().usage_nano_cores.unwrap() > 300_000_000);
    assert!(burn.process_stats.as_ref().unwrap().process_count.unwrap() >= 1);
    if network {
        let netw = burn.network.as_ref().expect("the pod's network");
        assert_eq!(netw.name, "eth0");
        assert!(netw.rx_bytes.is_some() && netw.tx_bytes.is_some());
        assert!(netw.interfaces.iter().any(|i| i.name == "eth0"));
        assert!(netw.interfaces.iter().all(|i| i.name != "lo"));
    } else {
        // A namespace of its own with only loopback: no interface to report.
        assert!(
            burn.network.as_ref().is_none_or(|n| n.interfaces.is_empty()),
            "{:?}",
            burn.network
        );
    }
    let rootfs = c.rootfs.as_ref().expect("rootfs");
    assert!(
        rootfs.capacity_bytes.is_some() && rootfs.inodes_used.is_some(),
        "{rootfs:?}"
    );
    let logs = c.logs.as_ref().expect("logs");
    assert!(logs.used_bytes.is_some(), "{logs:?}");

    let memp = pod(&s, a, "mem").unwrap();
    let mc = memp.containers[0].memory.as_ref().unwrap();
    assert!(
        mc.working_set_bytes.unwrap() > 40 * MB && mc.rss_bytes.unwrap() > 40 * MB,
        "{mc:?}"
    );
    assert!(mc.usage_bytes.unwrap() >= mc.working_set_bytes.unwrap());

    let vol = pod(&s, a, "vol").unwrap();
    let v = &vol.volume[0];
    assert_eq!(v.name.as_deref(), Some("scratch"));
    let used = v.used_bytes.unwrap();
    assert!(
        (FILE_BYTES..FILE_BYTES + MB).contains(&used),
        "emptyDir usage {used} for a {FILE_BYTES}-byte file"
    );
    assert!(v.inodes_used.unwrap() >= 2 && v.capacity_bytes.unwrap() > used);
    let eph = vol.ephemeral_storage.as_ref().expect("ephemeral-storage");
    assert!(
        eph.used_bytes.unwrap() >= used,
        "ephemeral storage counts the emptyDir: {eph:?}"
    );

    // only_cpu_and_memory: nothing but cpu and memory.
    let s2 = summary(a, "?only_cpu_and_memory=true");
    assert!(s2.node.fs.is_none() && s2.node.network.is_none() && s2.node.rlimit.is_none());
    let b2 = pod(&s2, a, "burn").unwrap();
    assert!(b2.network.is_none() && b2.containers[0].rootfs.is_none() && b2.cpu.is_some());

    // /metrics/resource as metrics-server reads it.
    let r = scrape(a, "/metrics/resource");
    let now = chrono::Utc::now();
    let burn_name = format!("burn-{}", a.node);
    let mem_name = format!("mem-{}", a.node);
    let cpu = find(
        &r,
        "container_cpu_usage_seconds_total",
        &[("pod", &burn_name), ("namespace", "default"), ("container", "main")],
    );
    assert_eq!(cpu.len(), 1);
    assert!(value(cpu[0]) > 0.3, "{cpu:?}");
    let age = now - cpu[0].timestamp;
    assert!(
        age < chrono::Duration::seconds(30) && age > chrono::Duration::seconds(-5),
        "sample timestamp {:?}",
        cpu[0].timestamp
    );
    let ws = find(
        &r,
        "container_memory_working_set_bytes",
        &[("pod", &mem_name), ("container", "main")],
    );
    assert!(value(ws[0]) > 40e6);
    assert!(
        value(
            find(
                &r,
                "pod_memory_working_set_bytes",
                &[("pod", &mem_name), ("namespace", "default")]
            )[0]
        ) > 40e6
    );
    assert!(value(find(&r, "pod_cpu_usage_seconds_total", &[("pod", &burn_name)])[0]) > 0.3);
    assert!(value(find(&r, "node_cpu_usage_seconds_total", &[])[0]) > 0.0);
    assert!(value(find(&r, "node_memory_working_set_bytes", &[])[0]) > 50e6);
    let start = find(&r, "container_start_time_seconds", &[("pod", &burn_name)]);
    assert!(value(start[0]) > (now.timestamp() - 600) as f64 && value(start[0]) <= now.timestamp() as f64 + 1.0);
    assert_eq!(value(find(&r, "scrape_error", &[])[0]), 0.0);
    assert!(r
        .docs
        .get("container_cpu_usage_seconds_total")
        .is_some_and(|d| d.starts_with("[ALPHA]")));

    // /metrics/cadvisor with cAdvisor's labels.
    let c = scrape(a, "/metrics/cadvisor");
    let ws = find(
        &c,
        "container_memory_working_set_bytes",
        &[("pod", &mem_name), ("container", "main"), ("namespace", "default")],
    );
    assert_eq!(ws.len(), 1);
    assert!(value(ws[0]) > 40e6);
    for l in ["id", "image", "name"] {
        assert!(ws[0].labels.get(l).is_some_and(|v| !v.is_empty()), "label {l}: {ws:?}");
    }
    assert!(find(
        &c,
        "container_cpu_usage_seconds_total",
        &[("pod", &burn_name), ("container", "main"), ("cpu", "total")]
    )
    .first()
    .is_some_and(|s| value(s) > 0.3));
    let rx = find(
        &c,
        "container_network_receive_bytes_total",
        &[("pod", &burn_name), ("interface", "eth0")],
    );
    assert_eq!(
        rx.len(),
        usize::from(network),
        "the pod's eth0 once, on the pod's cgroup"
    );
    assert!(!find(&c, "container_processes", &[("pod", &burn_name), ("container", "main")]).is_empty());
    assert!(!find(&c, "machine_memory_bytes", &[]).is_empty());

    // ferrolet top, as kubectl top prints.
    let out = a.cli(&["top", "pods", "--containers", "-n", "default"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let line = text
        .lines()
        .find(|l| l.starts_with(&burn_name))
        .unwrap_or_else(|| panic!("{text}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols[1], "main");
    let milli: u64 = cols[2].strip_suffix('m').unwrap().parse().unwrap();
    assert!(milli > 300, "{line}");
    let memline = text.lines().find(|l| l.starts_with(&mem_name)).unwrap();
    let mi: u64 = memline
        .split_whitespace()
        .nth(3)
        .unwrap()
        .strip_suffix("Mi")
        .unwrap()
        .parse()
        .unwrap();
    assert!(mi >= 40, "{memline}");
    let out = a.cli(&["top", "node"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.lines().nth(1).is_some_and(|l| l.starts_with(&a.node)),
        "{text}"
    );
}
