//! The machine as cAdvisor describes it (info/v1 MachineInfo, what kubelet serves at `/spec`):
//! cores, sockets, frequency, memory, huge pages, identity, block-device filesystems, disks,
//! network devices and the NUMA topology with its caches, read from /proc and /sys. What
//! cannot be read is left empty or zero, as cAdvisor leaves it. Blocks: call it off the async
//! threads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

#[derive(Debug, Serialize, Default)]
pub struct MachineInfo {
    pub timestamp: String,
    pub num_cores: usize,
    pub num_physical_cores: usize,
    pub num_sockets: usize,
    pub cpu_frequency_khz: u64,
    pub memory_capacity: u64,
    pub hugepages: Vec<HugePagesInfo>,
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
    pub filesystems: Vec<FsInfo>,
    pub disk_map: BTreeMap<String, DiskInfo>,
    pub network_devices: Vec<NetInfo>,
    pub topology: Vec<NumaNode>,
    pub cloud_provider: String,
    pub instance_type: String,
    pub instance_id: String,
}

#[derive(Debug, Serialize, Clone, PartialEq)]
pub struct HugePagesInfo {
    /// In kB.
    pub page_size: u64,
    pub num_pages: u64,
}

#[derive(Debug, Serialize)]
pub struct FsInfo {
    pub device: String,
    pub capacity: u64,
    #[serde(rename = "type")]
    pub fs_type: String,
    pub inodes: u64,
    pub has_inodes: bool,
}

#[derive(Debug, Serialize)]
pub struct DiskInfo {
    pub name: String,
    pub major: u64,
    pub minor: u64,
    pub size: u64,
    pub scheduler: String,
}

#[derive(Debug, Serialize)]
pub struct NetInfo {
    pub name: String,
    pub mac_address: String,
    pub speed: i64,
    pub mtu: i64,
}

#[derive(Debug, Serialize, Clone, PartialEq)]
pub struct Cache {
    pub id: usize,
    pub size: u64,
    #[serde(rename = "type")]
    pub cache_type: String,
    pub level: u32,
}

#[derive(Debug, Serialize)]
pub struct Core {
    pub core_id: usize,
    pub thread_ids: Vec<usize>,
    pub caches: Vec<Cache>,
    pub uncore_caches: Vec<Cache>,
    pub socket_id: usize,
}

#[derive(Debug, Serialize)]
pub struct NumaNode {
    pub node_id: usize,
    pub memory: u64,
    pub hugepages: Vec<HugePagesInfo>,
    pub cores: Vec<Core>,
    pub caches: Vec<Cache>,
}

fn read(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

fn read_num<T: std::str::FromStr>(p: impl AsRef<Path>) -> Option<T> {
    read(p)?.parse().ok()
}

/// A kernel cpu list (`0-3,8`).
pub fn parse_cpu_list(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<usize>().ok()),
        }
    }
    out
}

/// A cache size as sysfs writes it (`32K`, `8192K`, `1M`), in bytes.
fn cache_size(s: &str) -> u64 {
    let s = s.trim();
    let (n, mult) = match s.chars().last() {
        Some('K') => (&s[..s.len() - 1], 1024),
        Some('M') => (&s[..s.len() - 1], 1024 * 1024),
        Some('G') => (&s[..s.len() - 1], 1024 * 1024 * 1024),
        _ => (s, 1),
    };
    n.parse::<u64>().unwrap_or(0) * mult
}

/// The caches of cpu `cpu`: (shared cpu list, cache) per index.
fn cpu_caches(sys_cpu: &Path, cpu: usize) -> Vec<(Vec<usize>, Cache)> {
    let dir = sys_cpu.join(format!("cpu{cpu}/cache"));
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("index") {
            continue;
        }
        let p = e.path();
        let cache = Cache {
            id: read_num(p.join("id")).unwrap_or(0),
            size: read(p.join("size")).map(|s| cache_size(&s)).unwrap_or(0),
            cache_type: read(p.join("type")).unwrap_or_default(),
            level: read_num(p.join("level")).unwrap_or(0),
        };
        let shared = read(p.join("shared_cpu_list"))
            .map(|s| parse_cpu_list(&s))
            .unwrap_or_default();
        out.push((shared, cache));
    }
    out.sort_by_key(|(_, c)| (c.level, c.cache_type.clone()));
    out
}

fn hugepages_in(dir: &Path) -> Vec<HugePagesInfo> {
    super::machine::hugepage_pools(dir)
        .into_iter()
        .map(|(page_size, num_pages)| HugePagesInfo { page_size, num_pages })
        .collect()
}

/// The NUMA topology; one node 0 holding every cpu when the kernel shows no nodes.
fn topology(sys: &Path, online: &[usize], memory: u64) -> Vec<NumaNode> {
    let sys_cpu = sys.join("devices/system/cpu");
    let mut nodes: Vec<(usize, Vec<usize>, u64)> = Vec::new();
    if let Ok(rd) = std::fs::read_dir(sys.join("devices/system/node")) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_prefix("node").and_then(|n| n.parse::<usize>().ok()) else {
                continue;
            };
            let cpus = read(e.path().join("cpulist"))
                .map(|s| parse_cpu_list(&s))
                .unwrap_or_default();
            let mem = read(e.path().join("meminfo"))
                .and_then(|s| {
                    s.lines().find(|l| l.contains("MemTotal:")).and_then(|l| {
                        l.split_whitespace()
                            .rev()
                            .nth(1)
                            .and_then(|n| n.parse::<u64>().ok())
                            .map(|kb| kb * 1024)
                    })
                })
                .unwrap_or(0);
            nodes.push((id, cpus, mem));
        }
    }
    if nodes.is_empty() {
        nodes.push((0, online.to_vec(), memory));
    }
    nodes.sort_by_key(|n| n.0);
    nodes
        .into_iter()
        .map(|(node_id, cpus, mem)| {
            // cores by (socket, core id); caches shared by one core's threads are the core's,
            // caches shared wider are the node's
            let mut cores: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
            for &cpu in cpus.iter().filter(|c| online.contains(c)) {
                let t = sys_cpu.join(format!("cpu{cpu}/topology"));
                let socket = read_num(t.join("physical_package_id")).unwrap_or(0);
                let core = read_num(t.join("core_id")).unwrap_or(cpu);
                cores.entry((socket, core)).or_default().push(cpu);
            }
            let mut node_caches: Vec<Cache> = Vec::new();
            let cores = cores
                .into_iter()
                .map(|((socket_id, core_id), thread_ids)| {
                    let mut caches = Vec::new();
                    for (shared, cache) in cpu_caches(&sys_cpu, thread_ids[0]) {
                        if shared.iter().all(|c| thread_ids.contains(c)) {
                            caches.push(cache);
                        } else if !node_caches.contains(&cache) {
                            node_caches.push(cache);
                        }
                    }
                    Core {
                        core_id,
                        thread_ids,
                        caches,
                        uncore_caches: Vec::new(),
                        socket_id,
                    }
                })
                .collect();
            NumaNode {
                node_id,
                memory: mem,
                hugepages: hugepages_in(&sys.join(format!("devices/system/node/node{node_id}/hugepages"))),
                cores,
                caches: node_caches,
            }
        })
        .collect()
}

/// Block devices with a filesystem mounted, from mountinfo (cAdvisor's "vfs" filesystems).
fn filesystems(mountinfo: &str) -> Vec<FsInfo> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mount_point = left.split_whitespace().nth(4).unwrap_or("");
        let mut r = right.split_whitespace();
        let (_fstype, source) = (r.next().unwrap_or(""), r.next().unwrap_or(""));
        if !source.starts_with("/dev/") || !seen.insert(source.to_string()) {
            continue;
        }
        let Ok(st) = nix::sys::statvfs::statvfs(mount_point) else {
            continue;
        };
        out.push(FsInfo {
            device: source.to_string(),
            capacity: st.blocks() * st.fragment_size(),
            fs_type: "vfs".into(),
            inodes: st.files(),
            has_inodes: true,
        });
    }
    out
}

fn disks(sys: &Path) -> BTreeMap<String, DiskInfo> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(sys.join("block")) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("loop") || name.starts_with("ram") {
            continue;
        }
        let p = e.path();
        let Some((major, minor)) = read(p.join("dev")).and_then(|d| {
            let (a, b) = d.split_once(':')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        }) else {
            continue;
        };
        let scheduler = read(p.join("queue/scheduler"))
            .and_then(|s| {
                s.split_whitespace()
                    .find(|w| w.starts_with('['))
                    .map(|w| w.trim_matches(['[', ']']).to_string())
            })
            .unwrap_or_else(|| "none".into());
        out.insert(
            format!("{major}:{minor}"),
            DiskInfo {
                name,
                major,
                minor,
                size: read_num::<u64>(p.join("size")).unwrap_or(0) * 512,
                scheduler,
            },
        );
    }
    out
}

/// Network devices, without the ones cAdvisor ignores (loopback, veth, docker, nerdctl).
fn network_devices(sys: &Path) -> Vec<NetInfo> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(sys.join("class/net")) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if ["lo", "veth", "docker", "nerdctl"].iter().any(|p| name.starts_with(p)) {
            continue;
        }
        let p = e.path();
        out.push(NetInfo {
            mac_address: read(p.join("address")).unwrap_or_default(),
            speed: read_num(p.join("speed")).unwrap_or(0),
            mtu: read_num(p.join("mtu")).unwrap_or(0),
            name,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Read the machine's description.
pub fn machine_info() -> MachineInfo {
    let sys = Path::new("/sys");
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let online = read("/sys/devices/system/cpu/online")
        .map(|s| parse_cpu_list(&s))
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| (0..cpuinfo.lines().filter(|l| l.starts_with("processor")).count().max(1)).collect());
    let memory = super::machine::meminfo().map(|m| m.mem_total).unwrap_or(0);
    let topology = topology(sys, &online, memory);
    let physical: BTreeSet<(usize, usize)> = topology
        .iter()
        .flat_map(|n| n.cores.iter().map(|c| (c.socket_id, c.core_id)))
        .collect();
    let sockets: BTreeSet<usize> = topology
        .iter()
        .flat_map(|n| n.cores.iter().map(|c| c.socket_id))
        .collect();
    let frequency = read_num::<u64>("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").unwrap_or_else(|| {
        cpuinfo
            .lines()
            .find(|l| l.starts_with("cpu MHz"))
            .and_then(|l| l.split(':').nth(1))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|mhz| (mhz * 1000.0) as u64)
            .unwrap_or(0)
    });
    let id = super::machine::identity();
    MachineInfo {
        timestamp: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
        num_cores: online.len(),
        num_physical_cores: physical.len(),
        num_sockets: sockets.len(),
        cpu_frequency_khz: frequency,
        memory_capacity: memory,
        hugepages: hugepages_in(&sys.join("kernel/mm/hugepages")),
        machine_id: id.machine_id,
        system_uuid: id.system_uuid,
        boot_id: id.boot_id,
        filesystems: filesystems(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default()),
        disk_map: disks(sys),
        network_devices: network_devices(sys),
        topology,
        cloud_provider: "Unknown".into(),
        instance_type: "Unknown".into(),
        instance_id: "None".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_and_cache_sizes() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
        assert_eq!(cache_size("32K"), 32 * 1024);
        assert_eq!(cache_size("8M"), 8 << 20);
        assert_eq!(cache_size("512"), 512);
    }

    #[test]
    fn this_machine_reads_whole() {
        let m = machine_info();
        let cpus = std::thread::available_parallelism().unwrap().get();
        assert!(m.num_cores >= cpus, "{} cores, {cpus} usable", m.num_cores);
        assert!(m.num_physical_cores >= 1 && m.num_physical_cores <= m.num_cores);
        assert!(m.num_sockets >= 1);
        assert!(m.memory_capacity > 0);
        assert_eq!(
            m.topology
                .iter()
                .map(|n| n.cores.iter().map(|c| c.thread_ids.len()).sum::<usize>())
                .sum::<usize>(),
            m.num_cores
        );
        assert!(!m.boot_id.is_empty());
        let v = serde_json::to_value(&m).unwrap();
        for f in [
            "num_cores",
            "num_physical_cores",
            "num_sockets",
            "cpu_frequency_khz",
            "memory_capacity",
            "machine_id",
            "system_uuid",
            "boot_id",
            "filesystems",
            "disk_map",
            "network_devices",
            "topology",
            "cloud_provider",
            "instance_type",
        ] {
            assert!(v.get(f).is_some(), "{f}");
        }
    }
}
