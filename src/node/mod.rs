//! Facts about this node the agent reports and admits pods against: name, addresses,
//! capacity and allocatable cpu/memory/ephemeral-storage/pods.

use std::net::IpAddr;

use crate::config::Config;

#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub ips: Vec<IpAddr>,
    pub ephemeral_storage: i64,
    pub allocatable_cpu_milli: i64,
    pub allocatable_memory: i64,
    pub max_pods: u32,
}

impl NodeInfo {
    pub fn detect(cfg: &Config) -> NodeInfo {
        let cpu_milli = std::thread::available_parallelism()
            .map(|n| n.get() as i64)
            .unwrap_or(1)
            * 1000;
        let memory = meminfo_total().unwrap_or(0);
        let ephemeral_storage = nix::sys::statvfs::statvfs(cfg.root_dir.parent().unwrap_or(&cfg.root_dir))
            .map(|s| (s.blocks() as i64) * (s.fragment_size() as i64))
            .unwrap_or(0);
        let ips = match cfg.node_ip {
            Some(ip) => vec![ip],
            None => default_route_ips(),
        };
        NodeInfo {
            name: cfg.node_name.clone(),
            ips,
            ephemeral_storage,
            allocatable_cpu_milli: (cpu_milli - cfg.system_reserved_cpu_milli).max(0),
            allocatable_memory: (memory - cfg.system_reserved_memory).max(0),
            max_pods: cfg.max_pods,
        }
    }

    pub fn ip_strings(&self) -> Vec<String> {
        self.ips.iter().map(|i| i.to_string()).collect()
    }
}

fn meminfo_total() -> Option<i64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The IPv4 addresses of the interface holding the default route (what kubelet reports as the
/// node's InternalIP when none is configured); loopback when there is no default route.
fn default_route_ips() -> Vec<IpAddr> {
    let iface = std::fs::read_to_string("/proc/net/route").ok().and_then(|s| {
        s.lines()
            .skip(1)
            .find(|l| l.split_whitespace().nth(1) == Some("00000000"))
            .and_then(|l| l.split_whitespace().next().map(str::to_string))
    });
    let mut ips = Vec::new();
    if let (Some(iface), Ok(addrs)) = (iface, nix::ifaddrs::getifaddrs()) {
        for a in addrs {
            if a.interface_name != iface {
                continue;
            }
            if let Some(sin) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) {
                ips.push(IpAddr::V4(sin.ip()));
            }
        }
    }
    if ips.is_empty() {
        ips.push(IpAddr::from([127, 0, 0, 1]));
    }
    ips
}
