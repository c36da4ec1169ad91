//! The node: facts about it the agent admits pods against (name, addresses, capacity and
//! allocatable), and in a cluster its Node object (kubelet's kubelet_node_status.go,
//! nodestatus/ and nodelease/): registration, status, conditions, the Lease, the loops.

pub mod allocatable;
pub mod cluster;
pub mod conditions;
pub mod lease;
pub mod machine;
pub mod machine_info;
pub mod pod_cidr;
pub mod register;
pub mod status;

use std::net::IpAddr;

use crate::config::Config;
pub use allocatable::Resources;

#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub ips: Vec<IpAddr>,
    /// What the machine has.
    pub capacity: Resources,
    /// What pods may have: capacity less kubeReserved, systemReserved and evictionHard.
    pub allocatable: Resources,
}

impl NodeInfo {
    /// Reads /proc, /sys and statvfs: call it off the async threads.
    pub fn detect(cfg: &Config) -> NodeInfo {
        let capacity = machine::capacity(&cfg.root_dir, cfg.max_pods);
        let allocatable =
            allocatable::allocatable(&capacity, cfg.system_reserved, cfg.kube_reserved, &cfg.eviction_hard);
        let ips = match cfg.node_ip {
            Some(ip) => vec![ip],
            None => default_route_ips(),
        };
        NodeInfo {
            name: cfg.node_name.clone(),
            ips,
            capacity,
            allocatable,
        }
    }

    pub fn ip_strings(&self) -> Vec<String> {
        self.ips.iter().map(|i| i.to_string()).collect()
    }
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
