//! One round of sampling: every number of the Summary read at once from cgroupfs and /proc, the
//! cpu rates computed against the previous round, and the filesystem usage taken from the last
//! walks. Blocking: run on the blocking pool, never on an async worker.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use ferrolet_runtime::cgroups::{working_set, CgroupStats};
use ferrolet_runtime::stats_rounds::StatsRounds;
use ferrolet_runtime::{ContainerInfo, Runtime};
use k8s_openapi::api::core::v1::Pod;
use procfs::{Current, CurrentSI};

use super::fs::{fs_info, fs_stats, tree_stats, FsInfo, UsageCache};
use super::net::{self, Iface};
use super::rate::{CpuHistory, CpuSample};
use super::summary::*;
use super::{CgroupEntry, Snapshot};
use crate::cm::pod_container_manager::PodCgroups;
use crate::kuberuntime::labels::{LABEL_CONTAINER_NAME, LABEL_POD_UID};
use crate::pod::manager::PodManager;

/// What the sampler reads from.
pub struct Sources {
    pub rt: Arc<Runtime>,
    pub pods: Arc<PodManager>,
    pub cgroups: PodCgroups,
    /// The volumes set up, for the stats of claims' PersistentVolumes.
    pub volumes: Arc<crate::volumemanager::VolumeManager>,
    pub node_name: String,
    /// On the node's filesystem (nodefs).
    pub root_dir: PathBuf,
    pub pods_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    /// The agent's own cgroup (kubelet's "kubelet" system container).
    pub agent_cgroup: String,
    pub agent_start: Time,
}

/// The volume plugins whose directories live under the pod's directory (their usage is walked),
/// and whether kubelet counts them in the pod's ephemeral storage (IsLocalEphemeralVolume).
fn volume_dir(pods_dir: &Path, uid: &str, v: &k8s_openapi::api::core::v1::Volume) -> Option<(PathBuf, bool)> {
    let (plugin, ephemeral) = if let Some(e) = &v.empty_dir {
        ("kubernetes.io~empty-dir", e.medium.as_deref().unwrap_or("").is_empty())
    } else if v.config_map.is_some() {
        ("kubernetes.io~configmap", true)
    } else if v.secret.is_some() {
        ("kubernetes.io~secret", false)
    } else if v.downward_api.is_some() {
        ("kubernetes.io~downward-api", false)
    } else if v.projected.is_some() {
        ("kubernetes.io~projected", false)
    } else {
        return None;
    };
    Some((pods_dir.join(uid).join("volumes").join(plugin).join(&v.name), ephemeral))
}

fn parse_time(s: &str) -> Option<Time> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| Time(t.with_timezone(&Utc)))
}

fn nanos(t: Time) -> i64 {
    t.0.timestamp_nanos_opt().unwrap_or(0)
}

/// CpuStats from a cumulative counter, with the rate against the last round.
fn cpu_stats(
    hist: &mut CpuHistory,
    live: &mut HashSet<String>,
    key: &str,
    usage: Option<u64>,
    now: Time,
) -> Option<CpuStats> {
    let usage = usage?;
    live.insert(key.to_string());
    let rate = hist.record(
        key,
        CpuSample {
            at_nanos: nanos(now),
            usage_nanos: usage,
        },
    );
    Some(CpuStats {
        time: now,
        usage_nano_cores: rate,
        usage_core_nano_seconds: Some(usage),
    })
}

/// MemoryStats of a cgroup; availableBytes only under a limit (limit - workingSet).
fn memory_stats(s: &CgroupStats, now: Time) -> Option<MemoryStats> {
    s.memory_usage_bytes?;
    Some(MemoryStats {
        time: now,
        available_bytes: s
            .memory_limit_bytes
            .zip(s.memory_working_set_bytes)
            .map(|(l, w)| l.saturating_sub(w)),
        usage_bytes: s.memory_usage_bytes,
        working_set_bytes: s.memory_working_set_bytes,
        rss_bytes: s.memory_rss_bytes,
        page_faults: s.memory_page_faults,
        major_page_faults: s.memory_major_page_faults,
    })
}

/// `a - b`, field by field, for the agent's cgroup less the pods below it (v1, or a cgroupRoot
/// the agent sits in).
fn minus(a: &CgroupStats, b: &CgroupStats) -> CgroupStats {
    let sub = |x: Option<u64>, y: Option<u64>| x.map(|x| x.saturating_sub(y.unwrap_or(0)));
    CgroupStats {
        cpu_usage_nanos: sub(a.cpu_usage_nanos, b.cpu_usage_nanos),
        memory_usage_bytes: sub(a.memory_usage_bytes, b.memory_usage_bytes),
        memory_working_set_bytes: sub(a.memory_working_set_bytes, b.memory_working_set_bytes),
        memory_rss_bytes: sub(a.memory_rss_bytes, b.memory_rss_bytes),
        memory_page_faults: sub(a.memory_page_faults, b.memory_page_faults),
        memory_major_page_faults: sub(a.memory_major_page_faults, b.memory_major_page_faults),
        ..Default::default()
    }
}

/// The node as a whole from /proc: the agent is nested, so the root cgroup is not its to read.
struct NodeReading {
    cpu_nanos: Option<u64>,
    boot: Option<Time>,
    memory: Option<MemoryStats>,
    capacity_bytes: u64,
}

fn read_node(now: Time) -> NodeReading {
    let ks = procfs::KernelStats::current().ok();
    let tps = procfs::ticks_per_second().max(1);
    let cpu_nanos = ks.as_ref().map(|k| {
        let t = &k.total;
        // guest time is already inside user time
        let busy = t.user + t.nice + t.system + t.irq.unwrap_or(0) + t.softirq.unwrap_or(0) + t.steal.unwrap_or(0);
        (busy as u128 * 1_000_000_000 / tps as u128) as u64
    });
    let boot = ks
        .as_ref()
        .and_then(|k| DateTime::from_timestamp(k.btime as i64, 0))
        .map(Time);
    let mi = procfs::Meminfo::current().ok();
    let vm = procfs::vmstat().ok();
    let capacity_bytes = mi.as_ref().map_or(0, |m| m.mem_total);
    // Pages on the kernel's per-cpu lists are free too, though MemFree leaves them out.
    let per_cpu_free = crate::node::machine::per_cpu_free_bytes();
    let memory = mi.map(|m| {
        let usage = m.mem_total.saturating_sub(m.mem_free.saturating_add(per_cpu_free));
        let ws = working_set(usage, m.inactive_file);
        let vmv = |k: &str| vm.as_ref().and_then(|v| v.get(k)).map(|v| *v as u64);
        MemoryStats {
            time: now,
            available_bytes: Some(m.mem_total.saturating_sub(ws)),
            usage_bytes: Some(usage),
            working_set_bytes: Some(ws),
            rss_bytes: m.anon_pages,
            page_faults: vmv("pgfault"),
            major_page_faults: vmv("pgmajfault"),
        }
    });
    NodeReading {
        cpu_nanos,
        boot,
        memory,
        capacity_bytes,
    }
}

/// The node's part of a round: /proc, the filesystems' statfs, the node's interfaces and the
/// two system containers' cgroups, a dozen files whatever the number of pods.
struct NodePart {
    stats: NodeStats,
    capacity_bytes: u64,
    ifaces: Option<Vec<Iface>>,
    nodefs: Option<FsInfo>,
    imagefs: Option<FsInfo>,
    imagefs_dir: PathBuf,
}

fn node_part(
    src: &Sources,
    hist: &mut CpuHistory,
    live: &mut HashSet<String>,
    usage: &UsageCache,
    now: Time,
) -> NodePart {
    let cg = src.rt.cgroups();
    let node_reading = read_node(now);
    let nodefs = fs_info(&src.root_dir);
    let imagefs_dir = src.rt.images().dir().to_path_buf();
    let imagefs = fs_info(&imagefs_dir);
    let mut image_fs = fs_stats(imagefs, now);
    match usage.get(&imagefs_dir) {
        Some((u, _)) => {
            image_fs.used_bytes = Some(u.bytes);
            image_fs.inodes_used = Some(u.inodes);
        }
        None => image_fs.used_bytes = None,
    }
    let ifaces = net::read(None);
    let rlimit = crate::node::machine::pids().ok().map(|(max, tasks)| RlimitStats {
        time: now,
        max_pid: Some(max),
        num_of_running_processes: Some(tasks),
    });

    // System containers: the agent's own cgroup (less the pods when they sit below it) and
    // kubepods.
    let kubepods = src.cgroups.kubepods();
    let kubepods_stats = cg.stats(&kubepods);
    let mut agent_stats = cg.stats(&src.agent_cgroup);
    if Path::new(&kubepods).starts_with(&src.agent_cgroup) {
        agent_stats = minus(&agent_stats, &kubepods_stats);
    }
    let mut system_containers = Vec::new();
    for (name, key, s) in [
        (SYSTEM_CONTAINER_KUBELET, "system:kubelet", &agent_stats),
        (SYSTEM_CONTAINER_PODS, "system:pods", &kubepods_stats),
    ] {
        system_containers.push(ContainerStats {
            name: name.to_string(),
            start_time: src.agent_start,
            cpu: cpu_stats(hist, live, key, s.cpu_usage_nanos, now),
            memory: memory_stats(s, now),
            ..Default::default()
        });
    }
    let stats = NodeStats {
        node_name: src.node_name.clone(),
        system_containers,
        start_time: node_reading.boot.unwrap_or(src.agent_start),
        cpu: cpu_stats(hist, live, "node", node_reading.cpu_nanos, now),
        memory: node_reading.memory.clone(),
        network: ifaces.as_ref().map(|i| net::network_stats(i, now)),
        fs: Some(fs_stats(nodefs, now)),
        runtime: Some(RuntimeStats {
            image_fs: Some(image_fs),
        }),
        rlimit,
    };
    NodePart {
        stats,
        capacity_bytes: node_reading.capacity_bytes,
        ifaces,
        nodefs,
        imagefs,
        imagefs_dir,
    }
}

/// The rounds' memory of the pods' and containers' cgroups, and of each pod's network
/// interfaces (the reading kept beside the pod's cgroup).
pub type Rounds = StatsRounds<Option<Vec<Iface>>>;

/// The node's numbers alone, read now, for a reader that needs them fresher than the last round
/// (the eviction manager's signals). Its cpu counters carry no rate: the rates are the rounds'.
pub fn sample_node(src: &Sources, usage: &UsageCache) -> NodeStats {
    let mut scratch = CpuHistory::default();
    node_part(src, &mut scratch, &mut HashSet::new(), usage, Time(Utc::now())).stats
}

/// One round. `hist` carries the previous round's cpu counters; `rounds` the pods' and
/// containers' cgroups as last read in full; `usage` the last walks.
pub fn sample(src: &Sources, hist: &mut CpuHistory, rounds: &mut Rounds, usage: &UsageCache) -> Snapshot {
    let now = Time(Utc::now());
    rounds.begin_round();
    let cg = src.rt.cgroups();
    let mut live = HashSet::new();
    let mut entries: Vec<CgroupEntry> = Vec::new();

    let node = node_part(src, hist, &mut live, usage, now);
    let containers_fs = fs_info(&src.rt.root().join("containers")).or(node.imagefs);
    let logs_fs = fs_info(&src.pod_logs_dir).or(node.nodefs);
    let nodefs = node.nodefs;
    let mut fs_targets: Vec<PathBuf> = vec![node.imagefs_dir.clone()];

    // The runtime's running containers, by pod.
    let mut by_pod: HashMap<String, Vec<ContainerInfo>> = HashMap::new();
    let listed = src.rt.list();
    let list_failed = listed.is_err();
    if let Err(e) = &listed {
        // scrape_error says it on every endpoint; the runtime logged the cause.
        tracing::debug!(error = %e, "stats: listing containers");
    }
    for c in listed.unwrap_or_default() {
        if !c.is_running() {
            continue;
        }
        if let Some(uid) = c.record.labels.get(LABEL_POD_UID) {
            by_pod.entry(uid.clone()).or_default().push(c);
        }
    }

    let mut pods_out = Vec::new();
    for e in src.pods.entries() {
        let uid = crate::pod::uid(&e.pod).to_string();
        let running = by_pod.remove(&uid).unwrap_or_default();
        let pod_cgroup = src.cgroups.pod_path(&e.pod);
        let has_own_cgroup = pod_cgroup != src.cgroups.root() && pod_cgroup != "/";
        if running.is_empty() && !(has_own_cgroup && cg.exists(&pod_cgroup)) {
            continue;
        }
        let pod_ref = PodReference {
            name: e.pod.metadata.name.clone().unwrap_or_default(),
            namespace: e.pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            uid: uid.clone(),
        };
        let pod_start = e
            .status
            .start_time
            .as_ref()
            .and_then(|t| DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32))
            .map(Time)
            .unwrap_or(now);
        let ps = sample_pod(
            src,
            hist,
            rounds,
            &mut live,
            usage,
            &mut entries,
            &mut fs_targets,
            PodInput {
                pod: &e.pod,
                pod_ref,
                pod_start,
                running,
                pod_cgroup: has_own_cgroup.then_some(pod_cgroup),
                containers_fs,
                logs_fs,
                nodefs,
            },
            now,
        );
        pods_out.push(ps);
    }

    hist.retain(&live);
    let mut snap = Snapshot::new(
        Summary {
            node: node.stats,
            pods: pods_out,
        },
        entries,
        node.capacity_bytes,
        node.ifaces.unwrap_or_default(),
        fs_targets,
        now,
    );
    snap.scrape_error = list_failed;
    snap
}

struct PodInput<'a> {
    pod: &'a Pod,
    pod_ref: PodReference,
    pod_start: Time,
    running: Vec<ContainerInfo>,
    pod_cgroup: Option<String>,
    containers_fs: Option<FsInfo>,
    logs_fs: Option<FsInfo>,
    nodefs: Option<FsInfo>,
}

#[allow(clippy::too_many_arguments)]
fn sample_pod(
    src: &Sources,
    hist: &mut CpuHistory,
    rounds: &mut Rounds,
    live: &mut HashSet<String>,
    usage: &UsageCache,
    entries: &mut Vec<CgroupEntry>,
    fs_targets: &mut Vec<PathBuf>,
    p: PodInput<'_>,
    now: Time,
) -> PodStats {
    let cg = src.rt.cgroups();
    // Network: from a process inside the pod's namespace (none with hostNetwork).
    let host_net = crate::pod::host_network(p.pod);
    let read_net = || {
        p.running
            .iter()
            .filter_map(|c| c.monitor.as_ref().map(|m| m.init_pid))
            .find_map(|pid| net::read(Some(pid)))
    };
    let ifaces: Option<Vec<Iface>> = match (host_net, p.pod_cgroup.as_deref()) {
        (true, _) => None,
        // A namespace with nothing to report (only loopback: no pod network) is read again
        // only when a process of the pod ran (one could have made an interface), as the
        // cgroups are, and at least once a minute. Counters that move with traffic from
        // outside, on an interface that is reported, are read every round.
        (false, Some(pc)) => rounds.reading(
            cg,
            pc,
            |last: &Option<Vec<Iface>>| last.as_ref().is_some_and(Vec::is_empty),
            read_net,
        ),
        (false, None) => read_net(),
    };

    let mut containers = Vec::new();
    let (mut eph_used, mut eph_inodes, mut eph_time) = (0u64, 0u64, None::<Time>);
    let mut add_eph = |fs: &Option<FsStats>| {
        if let Some(f) = fs {
            eph_used += f.used_bytes.unwrap_or(0);
            eph_inodes += f.inodes_used.unwrap_or(0);
            eph_time = Some(eph_time.map_or(f.time, |t: Time| t.max(f.time)));
        }
    };
    // Latest attempt of each container name.
    let mut by_name: BTreeMap<String, &ContainerInfo> = BTreeMap::new();
    for c in &p.running {
        let name = c.record.labels.get(LABEL_CONTAINER_NAME).cloned().unwrap_or_default();
        match by_name.get(&name) {
            Some(o) if o.record.created_at >= c.record.created_at => {}
            _ => {
                by_name.insert(name, c);
            }
        }
    }
    // Processes of the pod and of each container below it, in one walk of the pod's cgroup.
    let counts = p
        .pod_cgroup
        .as_deref()
        .map(|pc| rounds.process_counts(cg, pc))
        .unwrap_or_default();
    let mut pod_sum = CgroupStats::default();
    for (name, c) in by_name {
        let s = match p.pod_cgroup.as_deref() {
            Some(pc) => rounds.stats_below(cg, pc, &c.record.cgroup_path),
            None => rounds.stats(cg, &c.record.cgroup_path),
        };
        for (acc, v) in [
            (&mut pod_sum.cpu_usage_nanos, s.cpu_usage_nanos),
            (&mut pod_sum.memory_usage_bytes, s.memory_usage_bytes),
            (&mut pod_sum.memory_working_set_bytes, s.memory_working_set_bytes),
            (&mut pod_sum.memory_rss_bytes, s.memory_rss_bytes),
            (&mut pod_sum.memory_page_faults, s.memory_page_faults),
            (&mut pod_sum.memory_major_page_faults, s.memory_major_page_faults),
        ] {
            if let Some(v) = v {
                *acc = Some(acc.unwrap_or(0) + v);
            }
        }
        let start = c
            .started_at
            .as_deref()
            .and_then(parse_time)
            .or_else(|| parse_time(&c.record.created_at))
            .unwrap_or(now);
        let upper = src.rt.upper_dir(c.id());
        let log_dir = c.record.log_path.parent().map(Path::to_path_buf);
        fs_targets.push(upper.clone());
        let rootfs = tree_stats(usage.get(&upper), p.containers_fs, now);
        let logs = log_dir.as_ref().and_then(|d| {
            fs_targets.push(d.clone());
            tree_stats(usage.get(d), p.logs_fs, now)
        });
        add_eph(&rootfs);
        add_eph(&logs);
        let processes = match counts.get(c.record.cgroup_path.trim_end_matches('/')) {
            Some(n) => *n as u64,
            None => cg.process_count(&c.record.cgroup_path) as u64,
        };
        containers.push(ContainerStats {
            name: name.clone(),
            start_time: start,
            cpu: cpu_stats(hist, live, &c.record.cgroup_path, s.cpu_usage_nanos, now),
            memory: memory_stats(&s, now),
            rootfs: rootfs.clone(),
            logs,
            ..Default::default()
        });
        entries.push(CgroupEntry {
            id: c.record.cgroup_path.clone(),
            container: name,
            name: c.id().to_string(),
            image: c.record.image.clone(),
            pod: p.pod_ref.clone(),
            stats: s,
            start_time: start,
            processes,
            ifaces: None,
            rootfs: rootfs.and_then(|r| r.used_bytes.map(|u| (u, r.inodes_used.unwrap_or(0)))),
        });
    }

    // The pod's cgroup (or, without one, the sum of its containers).
    let (pod_stats, processes) = match &p.pod_cgroup {
        Some(pc) => {
            let n = match counts.get(pc.trim_end_matches('/')) {
                Some(n) => *n,
                None => cg.process_count(pc),
            };
            (rounds.stats(cg, pc), n as u64)
        }
        None => (
            pod_sum,
            entries.iter().rev().take(containers.len()).map(|e| e.processes).sum(),
        ),
    };
    let pod_key = p.pod_cgroup.clone().unwrap_or_else(|| format!("pod:{}", p.pod_ref.uid));
    let cpu = cpu_stats(hist, live, &pod_key, pod_stats.cpu_usage_nanos, now);
    let memory = memory_stats(&pod_stats, now);
    let network = ifaces.as_ref().map(|i| net::network_stats(i, now));

    // Volumes under the pod's directory.
    let mut volumes = Vec::new();
    for v in crate::pod::spec(p.pod).volumes.iter().flatten() {
        let Some((dir, ephemeral)) = volume_dir(&src.pods_dir, &p.pod_ref.uid, v) else {
            continue;
        };
        fs_targets.push(dir.clone());
        let Some(fs) = tree_stats(usage.get(&dir), fs_info(&dir), now) else {
            continue;
        };
        if ephemeral {
            add_eph(&Some(fs.clone()));
        }
        volumes.push(VolumeStats {
            fs,
            name: v.name.clone(),
            pvc_ref: None,
        });
    }
    // The claims' PersistentVolumes (local and hostPath: directories of the node, used in
    // place): their filesystem's numbers (kubelet's statfs metrics of a local volume), with
    // the claim they belong to.
    for (name, path, (namespace, claim)) in src.volumes.claimed_volumes(&p.pod_ref.uid) {
        let Some(info) = fs_info(&path) else {
            continue;
        };
        volumes.push(VolumeStats {
            fs: fs_stats(Some(info), now),
            name,
            pvc_ref: Some(PvcReference { name: claim, namespace }),
        });
    }
    // kubelet counts the pod's /etc/hosts file too.
    let hosts = src.pods_dir.join(&p.pod_ref.uid).join("etc-hosts");
    fs_targets.push(hosts.clone());
    if let Some((u, at)) = usage.get(&hosts) {
        add_eph(&Some(FsStats {
            time: at,
            used_bytes: Some(u.bytes),
            inodes_used: Some(u.inodes),
            ..Default::default()
        }));
    }
    let ephemeral_storage = eph_time.map(|t| {
        let mut f = fs_stats(p.nodefs, t);
        f.used_bytes = Some(eph_used);
        f.inodes_used = Some(eph_inodes);
        f
    });

    entries.push(CgroupEntry {
        id: pod_key,
        container: String::new(),
        name: String::new(),
        image: String::new(),
        pod: p.pod_ref.clone(),
        stats: pod_stats,
        start_time: p.pod_start,
        processes,
        ifaces,
        rootfs: None,
    });
    PodStats {
        pod_ref: p.pod_ref,
        start_time: p.pod_start,
        containers,
        cpu,
        memory,
        network,
        volume_stats: volumes,
        ephemeral_storage,
        process_stats: Some(ProcessStats {
            process_count: Some(processes),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn available_only_under_a_limit() {
        let mut s = CgroupStats {
            memory_usage_bytes: Some(100),
            memory_working_set_bytes: Some(60),
            ..Default::default()
        };
        assert_eq!(memory_stats(&s, Time::default()).unwrap().available_bytes, None);
        s.memory_limit_bytes = Some(1000);
        assert_eq!(memory_stats(&s, Time::default()).unwrap().available_bytes, Some(940));
        assert!(memory_stats(&CgroupStats::default(), Time::default()).is_none());
    }

    #[test]
    fn the_agent_less_its_pods() {
        let a = CgroupStats {
            cpu_usage_nanos: Some(100),
            memory_usage_bytes: Some(50),
            ..Default::default()
        };
        let b = CgroupStats {
            cpu_usage_nanos: Some(30),
            memory_usage_bytes: Some(70),
            ..Default::default()
        };
        let d = minus(&a, &b);
        assert_eq!((d.cpu_usage_nanos, d.memory_usage_bytes), (Some(70), Some(0)));
    }

    #[test]
    fn volume_directories_and_ephemeral_ones() {
        let v: k8s_openapi::api::core::v1::Volume = serde_json::from_value(serde_json::json!(
            {"name": "scratch", "emptyDir": {}}
        ))
        .unwrap();
        let (dir, eph) = volume_dir(Path::new("/p"), "u1", &v).unwrap();
        assert_eq!(dir, Path::new("/p/u1/volumes/kubernetes.io~empty-dir/scratch"));
        assert!(eph);
        let v: k8s_openapi::api::core::v1::Volume = serde_json::from_value(serde_json::json!(
            {"name": "m", "emptyDir": {"medium": "Memory"}}
        ))
        .unwrap();
        assert!(
            !volume_dir(Path::new("/p"), "u1", &v).unwrap().1,
            "a tmpfs is not ephemeral storage"
        );
        let v: k8s_openapi::api::core::v1::Volume = serde_json::from_value(serde_json::json!(
            {"name": "h", "hostPath": {"path": "/tmp"}}
        ))
        .unwrap();
        assert!(
            volume_dir(Path::new("/p"), "u1", &v).is_none(),
            "hostPath is the node's, not the pod's"
        );
        assert_eq!(
            parse_time("2024-01-02T03:04:05.5Z").map(|t| t.unix_millis()),
            Some(1_704_164_645_500)
        );
    }

    #[test]
    fn node_numbers_from_proc() {
        let n = read_node(Time(Utc::now()));
        assert!(n.cpu_nanos.unwrap() > 0);
        let m = n.memory.unwrap();
        assert!(m.working_set_bytes.unwrap() <= m.usage_bytes.unwrap());
        assert_eq!(
            m.available_bytes.unwrap() + m.working_set_bytes.unwrap(),
            n.capacity_bytes
        );
        assert!(n.boot.is_some());
    }
}
