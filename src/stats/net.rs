//! Network counters of a network namespace, read from `/proc/<pid>/net/dev` of a process inside
//! it (a pod's container init; the agent itself for the node): no `setns`, no thread of ours
//! ever changes namespace. Interfaces cAdvisor ignores (loopback, veth and docker ends) are
//! left out, and `eth0` is the default interface kubelet puts on top.

use procfs::net::DeviceStatus;

use super::summary::{InterfaceStats, NetworkStats, Time};

/// kubelet's default interface name (network.DefaultInterfaceName).
pub const DEFAULT_INTERFACE: &str = "eth0";

/// One interface's counters, as cAdvisor keeps them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_dropped: u64,
}

/// cAdvisor's isIgnoredDevice.
fn ignored(name: &str) -> bool {
    ["lo", "veth", "docker", "nerdctl"].iter().any(|p| name.starts_with(p))
}

/// The interfaces of the namespace `pid` is in (`None` for the agent's own), sorted by name.
pub fn read(pid: Option<i32>) -> Option<Vec<Iface>> {
    let devs = match pid {
        Some(p) => procfs::process::Process::new(p).ok()?.dev_status().ok()?,
        None => procfs::net::dev_status().ok()?,
    };
    let mut v: Vec<Iface> = devs.into_values().filter(|d| !ignored(&d.name)).map(iface).collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    Some(v)
}

fn iface(d: DeviceStatus) -> Iface {
    Iface {
        name: d.name,
        rx_bytes: d.recv_bytes,
        rx_packets: d.recv_packets,
        rx_errors: d.recv_errs,
        rx_dropped: d.recv_drop,
        tx_bytes: d.sent_bytes,
        tx_packets: d.sent_packets,
        tx_errors: d.sent_errs,
        tx_dropped: d.sent_drop,
    }
}

/// The Summary's NetworkStats: every interface, and eth0 inline when there is one.
pub fn network_stats(ifaces: &[Iface], time: Time) -> NetworkStats {
    let to = |i: &Iface| InterfaceStats {
        name: i.name.clone(),
        rx_bytes: Some(i.rx_bytes),
        rx_errors: Some(i.rx_errors),
        tx_bytes: Some(i.tx_bytes),
        tx_errors: Some(i.tx_errors),
    };
    NetworkStats {
        time,
        default: ifaces
            .iter()
            .find(|i| i.name == DEFAULT_INTERFACE)
            .map(to)
            .unwrap_or_default(),
        interfaces: ifaces.iter().map(to).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eth0_goes_on_top_and_loopback_is_ignored() {
        let ifs = vec![
            Iface {
                name: "eth0".into(),
                rx_bytes: 10,
                tx_errors: 1,
                ..Default::default()
            },
            Iface {
                name: "net1".into(),
                tx_bytes: 3,
                ..Default::default()
            },
        ];
        let n = network_stats(&ifs, Time::default());
        assert_eq!(n.default.name, "eth0");
        assert_eq!((n.default.rx_bytes, n.default.tx_errors), (Some(10), Some(1)));
        assert_eq!(n.interfaces.len(), 2);
        assert!(ignored("lo") && ignored("veth1234") && !ignored("eth0"));
    }

    #[test]
    fn reads_the_agents_own_namespace() {
        let v = read(None).unwrap();
        assert!(v.iter().all(|i| i.name != "lo"));
        assert!(read(Some(std::process::id() as i32)).is_some());
    }
}
