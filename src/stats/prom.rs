//! The Prometheus endpoints rendered from a [`Snapshot`]: `/metrics/resource` exactly as
//! kubelet 1.26's resource metrics collector writes it (what metrics-server reads), and
//! `/metrics/cadvisor` with cAdvisor's container_* and machine_* families and its label set.
//! Samples carry the time they were read as their timestamp, as kubelet and cAdvisor emit them.
//! The text format is the `prometheus` crate's encoder (0.0.4, with timestamps).

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, TextEncoder};

use super::summary::Time;
use super::{CgroupEntry, Snapshot};

/// One family being built.
struct Family {
    f: MetricFamily,
}

impl Family {
    fn new(name: &str, help: &str, ty: MetricType) -> Family {
        let mut f = MetricFamily::default();
        f.set_name(name.to_string());
        f.set_help(help.to_string());
        f.set_field_type(ty);
        Family { f }
    }

    /// Add a sample; labels are sorted by name, as client_golang writes them.
    fn add(&mut self, labels: &[(&str, &str)], value: f64, at: Option<Time>) {
        let mut m = Metric::default();
        let mut ls: Vec<LabelPair> = labels
            .iter()
            .map(|(k, v)| {
                let mut l = LabelPair::default();
                l.set_name(k.to_string());
                l.set_value(v.to_string());
                l
            })
            .collect();
        ls.sort_by(|a, b| a.name().cmp(b.name()));
        m.set_label(ls);
        match self.f.get_field_type() {
            MetricType::COUNTER => {
                let mut c = Counter::default();
                c.set_value(value);
                m.set_counter(c);
            }
            _ => {
                let mut g = Gauge::default();
                g.set_value(value);
                m.set_gauge(g);
            }
        }
        if let Some(t) = at {
            m.set_timestamp_ms(t.unix_millis());
        }
        self.f.mut_metric().push(m);
    }
}

fn encode(families: Vec<Family>) -> Vec<u8> {
    // Families without samples are not written (as client_golang skips them).
    let fams: Vec<MetricFamily> = families
        .into_iter()
        .map(|f| f.f)
        .filter(|f| !f.get_metric().is_empty())
        .collect();
    let mut out = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&fams, &mut out) {
        tracing::error!(error = %e, "encoding metrics");
    }
    out
}

const NS_PER_S: f64 = 1e9;

/// kubelet's /metrics/resource (pkg/kubelet/metrics/collectors/resource_metrics.go, v1.26):
/// every family ALPHA, cpu and memory stamped with the time they were read.
pub fn resource_metrics(s: &Snapshot) -> Vec<u8> {
    use MetricType::{COUNTER, GAUGE};
    let mut node_cpu = Family::new(
        "node_cpu_usage_seconds_total",
        "[ALPHA] Cumulative cpu time consumed by the node in core-seconds",
        COUNTER,
    );
    let mut node_mem = Family::new(
        "node_memory_working_set_bytes",
        "[ALPHA] Current working set of the node in bytes",
        GAUGE,
    );
    let mut c_start = Family::new(
        "container_start_time_seconds",
        "[ALPHA] Start time of the container since unix epoch in seconds",
        GAUGE,
    );
    let mut c_cpu = Family::new(
        "container_cpu_usage_seconds_total",
        "[ALPHA] Cumulative cpu time consumed by the container in core-seconds",
        COUNTER,
    );
    let mut c_mem = Family::new(
        "container_memory_working_set_bytes",
        "[ALPHA] Current working set of the container in bytes",
        GAUGE,
    );
    let mut p_cpu = Family::new(
        "pod_cpu_usage_seconds_total",
        "[ALPHA] Cumulative cpu time consumed by the pod in core-seconds",
        COUNTER,
    );
    let mut p_mem = Family::new(
        "pod_memory_working_set_bytes",
        "[ALPHA] Current working set of the pod in bytes",
        GAUGE,
    );
    let mut scrape = Family::new(
        "scrape_error",
        "[ALPHA] 1 if there was an error while getting container metrics, 0 otherwise",
        GAUGE,
    );
    let n = &s.summary.node;
    if let Some(c) = &n.cpu {
        if let Some(u) = c.usage_core_nano_seconds {
            node_cpu.add(&[], u as f64 / NS_PER_S, Some(c.time));
        }
    }
    if let Some(m) = &n.memory {
        if let Some(w) = m.working_set_bytes {
            node_mem.add(&[], w as f64, Some(m.time));
        }
    }
    for p in &s.summary.pods {
        let (pod, ns) = (p.pod_ref.name.as_str(), p.pod_ref.namespace.as_str());
        for c in &p.containers {
            let l = [("container", c.name.as_str()), ("pod", pod), ("namespace", ns)];
            if c.start_time.0.timestamp() > 0 {
                c_start.add(&l, c.start_time.unix_seconds_f64(), Some(c.start_time));
            }
            if let Some(cpu) = &c.cpu {
                if let Some(u) = cpu.usage_core_nano_seconds {
                    c_cpu.add(&l, u as f64 / NS_PER_S, Some(cpu.time));
                }
            }
            if let Some(m) = &c.memory {
                if let Some(w) = m.working_set_bytes {
                    c_mem.add(&l, w as f64, Some(m.time));
                }
            }
        }
        let l = [("pod", pod), ("namespace", ns)];
        if let Some(cpu) = &p.cpu {
            if let Some(u) = cpu.usage_core_nano_seconds {
                p_cpu.add(&l, u as f64 / NS_PER_S, Some(cpu.time));
            }
        }
        if let Some(m) = &p.memory {
            if let Some(w) = m.working_set_bytes {
                p_mem.add(&l, w as f64, Some(m.time));
            }
        }
    }
    scrape.add(&[], f64::from(u8::from(s.scrape_error)), None);
    encode(vec![node_cpu, node_mem, c_start, c_cpu, c_mem, p_cpu, p_mem, scrape])
}

/// cAdvisor's labels as kubelet's /metrics/cadvisor sets them (container, id, image, name,
/// namespace, pod).
fn labels(e: &CgroupEntry) -> [(&'static str, &str); 6] {
    [
        ("container", e.container.as_str()),
        ("id", e.id.as_str()),
        ("image", e.image.as_str()),
        ("name", e.name.as_str()),
        ("namespace", e.pod.namespace.as_str()),
        ("pod", e.pod.name.as_str()),
    ]
}

/// kubelet's /metrics/cadvisor: cAdvisor's container families for every pod and container
/// cgroup and the node's root ("/"), and the machine families.
pub fn cadvisor_metrics(s: &Snapshot) -> Vec<u8> {
    use MetricType::{COUNTER, GAUGE};
    let f = Family::new;
    let mut cpu = f(
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed in seconds.",
        COUNTER,
    );
    let mut cpu_user = f(
        "container_cpu_user_seconds_total",
        "Cumulative user cpu time consumed in seconds.",
        COUNTER,
    );
    let mut cpu_sys = f(
        "container_cpu_system_seconds_total",
        "Cumulative system cpu time consumed in seconds.",
        COUNTER,
    );
    let mut periods = f(
        "container_cpu_cfs_periods_total",
        "Number of elapsed enforcement period intervals.",
        COUNTER,
    );
    let mut thr_periods = f(
        "container_cpu_cfs_throttled_periods_total",
        "Number of throttled period intervals.",
        COUNTER,
    );
    let mut thr_secs = f(
        "container_cpu_cfs_throttled_seconds_total",
        "Total time duration the container has been throttled.",
        COUNTER,
    );
    let mut mem_usage = f(
        "container_memory_usage_bytes",
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
        GAUGE,
    );
    let mut mem_max = f(
        "container_memory_max_usage_bytes",
        "Maximum memory usage recorded in bytes",
        GAUGE,
    );
    let mut mem_ws = f(
        "container_memory_working_set_bytes",
        "Current working set in bytes.",
        GAUGE,
    );
    let mut mem_rss = f("container_memory_rss", "Size of RSS in bytes.", GAUGE);
    let mut mem_cache = f("container_memory_cache", "Number of bytes of page cache memory.", GAUGE);
    let mut mem_mapped = f(
        "container_memory_mapped_file",
        "Size of memory mapped files in bytes.",
        GAUGE,
    );
    let mut mem_swap = f("container_memory_swap", "Container swap usage in bytes.", GAUGE);
    let mut mem_fail = f(
        "container_memory_failures_total",
        "Cumulative count of memory allocation failures.",
        COUNTER,
    );
    let mut oom = f(
        "container_oom_events_total",
        "Count of out of memory events observed for the container",
        COUNTER,
    );
    let mut rx_bytes = f(
        "container_network_receive_bytes_total",
        "Cumulative count of bytes received",
        COUNTER,
    );
    let mut rx_packets = f(
        "container_network_receive_packets_total",
        "Cumulative count of packets received",
        COUNTER,
    );
    let mut rx_errors = f(
        "container_network_receive_errors_total",
        "Cumulative count of errors encountered while receiving",
        COUNTER,
    );
    let mut rx_dropped = f(
        "container_network_receive_packets_dropped_total",
        "Cumulative count of packets dropped while receiving",
        COUNTER,
    );
    let mut tx_bytes = f(
        "container_network_transmit_bytes_total",
        "Cumulative count of bytes transmitted",
        COUNTER,
    );
    let mut tx_packets = f(
        "container_network_transmit_packets_total",
        "Cumulative count of packets transmitted",
        COUNTER,
    );
    let mut tx_errors = f(
        "container_network_transmit_errors_total",
        "Cumulative count of errors encountered while transmitting",
        COUNTER,
    );
    let mut tx_dropped = f(
        "container_network_transmit_packets_dropped_total",
        "Cumulative count of packets dropped while transmitting",
        COUNTER,
    );
    let mut fs_usage = f(
        "container_fs_usage_bytes",
        "Number of bytes that are consumed by the container on this filesystem.",
        GAUGE,
    );
    let mut fs_inodes = f("container_fs_inodes_total", "Number of Inodes", GAUGE);
    let mut processes = f(
        "container_processes",
        "Number of processes running inside the container.",
        GAUGE,
    );
    let mut threads = f(
        "container_threads",
        "Number of threads running inside the container",
        GAUGE,
    );
    let mut start = f(
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds.",
        GAUGE,
    );
    let mut last_seen = f(
        "container_last_seen",
        "Last time a container was seen by the exporter",
        GAUGE,
    );
    let mut spec_period = f("container_spec_cpu_period", "CPU period of the container.", GAUGE);
    let mut spec_quota = f("container_spec_cpu_quota", "CPU quota of the container.", GAUGE);
    let mut spec_shares = f("container_spec_cpu_shares", "CPU share of the container.", GAUGE);
    let mut spec_mem = f(
        "container_spec_memory_limit_bytes",
        "Memory limit for the container.",
        GAUGE,
    );
    let mut machine_cores = f("machine_cpu_cores", "Number of logical CPU cores.", GAUGE);
    let mut machine_mem = f(
        "machine_memory_bytes",
        "Amount of memory installed on the machine.",
        GAUGE,
    );
    let mut scrape = f(
        "container_scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
        GAUGE,
    );

    let at = Some(s.taken);
    // The node's root cgroup, from /proc.
    let node = &s.summary.node;
    let root = CgroupEntry {
        id: "/".into(),
        container: String::new(),
        name: String::new(),
        image: String::new(),
        pod: Default::default(),
        stats: ferrolet_runtime::cgroups::CgroupStats {
            cpu_usage_nanos: node.cpu.as_ref().and_then(|c| c.usage_core_nano_seconds),
            memory_usage_bytes: node.memory.as_ref().and_then(|m| m.usage_bytes),
            memory_working_set_bytes: node.memory.as_ref().and_then(|m| m.working_set_bytes),
            memory_rss_bytes: node.memory.as_ref().and_then(|m| m.rss_bytes),
            memory_page_faults: node.memory.as_ref().and_then(|m| m.page_faults),
            memory_major_page_faults: node.memory.as_ref().and_then(|m| m.major_page_faults),
            ..Default::default()
        },
        start_time: node.start_time,
        processes: 0,
        ifaces: Some(s.node_ifaces.clone()),
        rootfs: None,
    };
    for e in std::iter::once(&root).chain(s.entries.iter()) {
        let l = labels(e);
        let st = &e.stats;
        let secs = |ns: u64| ns as f64 / NS_PER_S;
        let put = |fam: &mut Family, v: Option<f64>| {
            if let Some(v) = v {
                fam.add(&l, v, at);
            }
        };
        if let Some(u) = st.cpu_usage_nanos {
            let mut lc = l.to_vec();
            lc.push(("cpu", "total"));
            cpu.add(&lc, secs(u), at);
        }
        put(&mut cpu_user, st.cpu_user_nanos.map(secs));
        put(&mut cpu_sys, st.cpu_system_nanos.map(secs));
        put(&mut periods, st.cpu_periods.map(|v| v as f64));
        put(&mut thr_periods, st.cpu_throttled_periods.map(|v| v as f64));
        put(&mut thr_secs, st.cpu_throttled_nanos.map(secs));
        put(&mut mem_usage, st.memory_usage_bytes.map(|v| v as f64));
        put(&mut mem_max, st.memory_max_usage_bytes.map(|v| v as f64));
        put(&mut mem_ws, st.memory_working_set_bytes.map(|v| v as f64));
        put(&mut mem_rss, st.memory_rss_bytes.map(|v| v as f64));
        put(&mut mem_cache, st.memory_cache_bytes.map(|v| v as f64));
        put(&mut mem_mapped, st.memory_mapped_file_bytes.map(|v| v as f64));
        put(&mut mem_swap, st.memory_swap_bytes.map(|v| v as f64));
        put(&mut oom, st.oom_kills.map(|v| v as f64));
        put(&mut threads, st.pids.map(|v| v as f64));
        put(&mut spec_period, st.cpu_period_us.map(|v| v as f64));
        put(&mut spec_quota, st.cpu_quota_us.map(|v| v as f64));
        put(&mut spec_shares, st.cpu_shares.map(|v| v as f64));
        put(&mut spec_mem, Some(st.memory_limit_bytes.unwrap_or(0) as f64));
        put(&mut processes, (e.id != "/").then_some(e.processes as f64));
        put(&mut start, Some(e.start_time.unix_seconds_f64()));
        put(&mut last_seen, Some(s.taken.unix_seconds_f64()));
        for (kind, v) in [
            ("pgfault", st.memory_page_faults),
            ("pgmajfault", st.memory_major_page_faults),
        ] {
            if let Some(v) = v {
                let mut lf = l.to_vec();
                lf.extend([("failure_type", kind), ("scope", "container")]);
                mem_fail.add(&lf, v as f64, at);
            }
        }
        if let Some((bytes, inodes)) = e.rootfs {
            let mut lf = l.to_vec();
            lf.push(("device", "upper"));
            fs_usage.add(&lf, bytes as f64, at);
            fs_inodes.add(&lf, inodes as f64, at);
        }
        for i in e.ifaces.iter().flatten() {
            let mut li = l.to_vec();
            li.push(("interface", i.name.as_str()));
            rx_bytes.add(&li, i.rx_bytes as f64, at);
            rx_packets.add(&li, i.rx_packets as f64, at);
            rx_errors.add(&li, i.rx_errors as f64, at);
            rx_dropped.add(&li, i.rx_dropped as f64, at);
            tx_bytes.add(&li, i.tx_bytes as f64, at);
            tx_packets.add(&li, i.tx_packets as f64, at);
            tx_errors.add(&li, i.tx_errors as f64, at);
            tx_dropped.add(&li, i.tx_dropped as f64, at);
        }
    }
    let ident = crate::node::machine::identity();
    let ml = [
        ("boot_id", ident.boot_id.as_str()),
        ("machine_id", ident.machine_id.as_str()),
        ("system_uuid", ident.system_uuid.as_str()),
    ];
    let cores = crate::node::machine::logical_cpus();
    machine_cores.add(&ml, cores as f64, None);
    machine_mem.add(&ml, s.memory_capacity as f64, None);
    scrape.add(&[], f64::from(u8::from(s.scrape_error)), None);
    encode(vec![
        cpu,
        cpu_user,
        cpu_sys,
        periods,
        thr_periods,
        thr_secs,
        mem_usage,
        mem_max,
        mem_ws,
        mem_rss,
        mem_cache,
        mem_mapped,
        mem_swap,
        mem_fail,
        oom,
        rx_bytes,
        rx_packets,
        rx_errors,
        rx_dropped,
        tx_bytes,
        tx_packets,
        tx_errors,
        tx_dropped,
        fs_usage,
        fs_inodes,
        processes,
        threads,
        start,
        last_seen,
        spec_period,
        spec_quota,
        spec_shares,
        spec_mem,
        machine_cores,
        machine_mem,
        scrape,
    ])
}

#[cfg(test)]
mod tests {
    use super::super::summary::*;
    use super::*;

    fn snap() -> Snapshot {
        let t = Time(chrono::DateTime::from_timestamp(1_700_000_000, 500_000_000).unwrap());
        let cpu = Some(CpuStats {
            time: t,
            usage_nano_cores: Some(5),
            usage_core_nano_seconds: Some(2_500_000_000),
        });
        let memory = Some(MemoryStats {
            time: t,
            working_set_bytes: Some(4096),
            ..Default::default()
        });
        let summary = Summary {
            node: NodeStats {
                node_name: "n".into(),
                cpu: cpu.clone(),
                memory: memory.clone(),
                ..Default::default()
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "web".into(),
                    namespace: "default".into(),
                    uid: "u".into(),
                },
                start_time: t,
                containers: vec![ContainerStats {
                    name: "app".into(),
                    start_time: t,
                    cpu: cpu.clone(),
                    memory: memory.clone(),
                    ..Default::default()
                }],
                cpu,
                memory,
                ..Default::default()
            }],
        };
        Snapshot::new(summary, vec![], 1 << 30, vec![], vec![], t)
    }

    #[test]
    fn resource_metrics_as_kubelet_writes_them() {
        let text = String::from_utf8(resource_metrics(&snap())).unwrap();
        assert!(text.contains("# TYPE node_cpu_usage_seconds_total counter"), "{text}");
        assert!(
            text.contains("node_cpu_usage_seconds_total 2.5 1700000000500\n"),
            "{text}"
        );
        assert!(text.contains(
            "container_cpu_usage_seconds_total{container=\"app\",namespace=\"default\",pod=\"web\"} 2.5 1700000000500\n"
        ));
        assert!(text.contains("pod_memory_working_set_bytes{namespace=\"default\",pod=\"web\"} 4096 1700000000500\n"));
        assert!(text.contains(
            "container_start_time_seconds{container=\"app\",namespace=\"default\",pod=\"web\"} 1700000000.5"
        ));
        assert!(text.contains("scrape_error 0\n"));
        let mut failed = snap();
        failed.scrape_error = true;
        assert!(String::from_utf8(resource_metrics(&failed))
            .unwrap()
            .contains("scrape_error 1\n"));
        assert!(text.contains("# HELP node_memory_working_set_bytes [ALPHA] Current working set of the node in bytes"));
    }

    #[test]
    fn cadvisor_has_the_root_and_machine() {
        let text = String::from_utf8(cadvisor_metrics(&snap())).unwrap();
        assert!(
            text.contains("container_cpu_usage_seconds_total{container=\"\",cpu=\"total\",id=\"/\""),
            "{text}"
        );
        assert!(text.contains("machine_memory_bytes{"));
        assert!(text.contains("container_scrape_error 0"));
    }
}
