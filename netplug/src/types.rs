//! The crate's public data: the two modes' settings, what a pod sandbox asks of the network and
//! what it gets back. No Kubernetes types: the agent maps its pod spec onto these.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Which network implementation a [`crate::NetPlug`] drives.
#[derive(Debug, Clone)]
pub enum Mode {
    /// The built-in Linux bridge + veth + IPAM + nftables network.
    Bridge(BridgeConfig),
    /// Exec CNI plugins from a network configuration list, as the CNI 1.0.0 spec says.
    Cni(CniConfig),
}

/// Settings of the built-in bridge network.
#[derive(Debug, Clone)]
pub struct BridgeConfig {
    /// Name of the Linux bridge in the node's network namespace (created if missing).
    pub bridge: String,
    /// Pod subnet; pod IPs are allocated from it. IPv4 or IPv6 (one family).
    pub subnet: IpNet,
    /// Address of the bridge and the pods' default gateway; `None` = first host of `subnet`.
    pub gateway: Option<IpAddr>,
    /// MTU of the bridge, veths and pod interfaces; `None` = MTU of the interface carrying
    /// the node's default route, else 1500.
    pub mtu: Option<u32>,
    /// Masquerade traffic from the pod subnet to destinations outside it.
    pub masquerade: bool,
    /// Set hairpin mode on each pod's bridge port (a pod can reach itself through the node).
    pub hairpin: bool,
    /// Where IP allocations and per-sandbox records live. Must survive agent restarts.
    pub state_dir: PathBuf,
    /// Name of the nftables table (family `inet`) that holds NAT and hostPort rules.
    pub nft_table: String,
}

impl BridgeConfig {
    /// The defaults with `state_dir` set.
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        BridgeConfig {
            state_dir: state_dir.into(),
            ..Default::default()
        }
    }
}

impl Default for BridgeConfig {
    fn default() -> Self {
        BridgeConfig {
            bridge: "ferrolet0".into(),
            subnet: "10.88.0.0/16".parse().expect("valid default subnet"),
            gateway: None,
            mtu: None,
            masquerade: true,
            hairpin: true,
            state_dir: PathBuf::from("/var/lib/ferrolet/network"),
            nft_table: "ferrolet".into(),
        }
    }
}

/// Settings of the CNI mode.
#[derive(Debug, Clone)]
pub struct CniConfig {
    /// Directory of network configuration files; the lexically first `*.conflist`, `*.conf`
    /// or `*.json` is used.
    pub conf_dir: PathBuf,
    /// Directories searched for plugin binaries, in order (also passed as `CNI_PATH`).
    pub bin_dirs: Vec<PathBuf>,
    /// Where ADD results, the configs they were made with, and per-sandbox records are cached.
    pub state_dir: PathBuf,
    /// Time limit of one plugin execution; the plugin (and its process group) is killed after.
    pub timeout: Duration,
}

impl CniConfig {
    /// The defaults with `state_dir` set.
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        CniConfig {
            state_dir: state_dir.into(),
            ..Default::default()
        }
    }
}

impl Default for CniConfig {
    fn default() -> Self {
        CniConfig {
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            bin_dirs: vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")],
            state_dir: PathBuf::from("/var/lib/ferrolet/cni"),
            timeout: Duration::from_secs(60),
        }
    }
}

/// Transport protocol of a port mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The lowercase name used by nftables and CNI.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A hostPort: traffic to `host_port` on the node (on `host_ip` only, when set) goes to
/// `container_port` of the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: Protocol,
    /// `None` (or an unspecified address) = every local address of the node.
    pub host_ip: Option<IpAddr>,
}

impl PortMapping {
    /// `host_ip` with the unspecified addresses (0.0.0.0, ::) folded into `None`.
    pub(crate) fn effective_host_ip(&self) -> Option<IpAddr> {
        self.host_ip.filter(|ip| !ip.is_unspecified())
    }
}

/// Traffic shaping of a pod, as the CNI `bandwidth` capability has it: rates in bits per
/// second, bursts in bits. A zero rate leaves that direction unshaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Bandwidth {
    /// Traffic into the pod.
    pub ingress_rate: u64,
    pub ingress_burst: u64,
    /// Traffic out of the pod.
    pub egress_rate: u64,
    pub egress_burst: u64,
}

/// What a pod sandbox asks of the network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxNetwork {
    /// Stable id of the pod sandbox (`CNI_CONTAINERID`): letters, digits, '-', '_', '.'.
    pub sandbox_id: String,
    /// A file that is (a bind mount of) the pod's network namespace.
    pub netns: PathBuf,
    /// Interface name inside the pod, usually "eth0".
    pub ifname: String,
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    pub port_mappings: Vec<PortMapping>,
    pub bandwidth: Option<Bandwidth>,
    /// Specific IPs to give the pod, when free.
    pub requested_ips: Vec<IpAddr>,
}

impl SandboxNetwork {
    /// A request with only the required fields; the rest empty.
    pub fn new(sandbox_id: impl Into<String>, netns: impl Into<PathBuf>) -> Self {
        SandboxNetwork {
            sandbox_id: sandbox_id.into(),
            netns: netns.into(),
            ifname: "eth0".into(),
            pod_name: String::new(),
            pod_namespace: String::new(),
            pod_uid: String::new(),
            port_mappings: Vec::new(),
            bandwidth: None,
            requested_ips: Vec::new(),
        }
    }

    /// Check what every mode relies on: id and interface name shapes, mappings.
    pub fn validate(&self) -> Result<()> {
        validate_sandbox_id(&self.sandbox_id)?;
        validate_ifname(&self.ifname).map_err(|r| Error::invalid_config("ifname", r))?;
        if self.netns.as_os_str().is_empty() {
            return Err(Error::invalid_config("netns", "empty path"));
        }
        for (i, pm) in self.port_mappings.iter().enumerate() {
            if pm.host_port == 0 || pm.container_port == 0 {
                return Err(Error::invalid_config(
                    format!("port_mappings[{i}]"),
                    format!(
                        "hostPort {} -> containerPort {}: ports must be 1-65535",
                        pm.host_port, pm.container_port
                    ),
                ));
            }
            for (j, other) in self.port_mappings.iter().enumerate().take(i) {
                if other.host_port == pm.host_port
                    && other.protocol == pm.protocol
                    && other.effective_host_ip() == pm.effective_host_ip()
                {
                    return Err(Error::invalid_config(
                        format!("port_mappings[{i}]"),
                        format!(
                            "hostPort {}/{} is also mapped by port_mappings[{j}]",
                            pm.host_port, pm.protocol
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The network a sandbox got.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NetworkStatus {
    /// The pod's IPs (first = primary).
    pub ips: Vec<IpAddr>,
    /// The interface inside the pod's namespace.
    pub interface: String,
    pub gateway: Option<IpAddr>,
    /// MAC address of `interface`, "aa:bb:cc:dd:ee:ff".
    pub mac: Option<String>,
}

/// Sandbox ids name files and go into `CNI_CONTAINERID`: the CNI spec allows letters, digits
/// and `-_.`, starting with a letter or digit.
pub(crate) fn validate_sandbox_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 200
        && id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_config(
            "sandbox_id",
            format!("{id:?}: must be 1-200 of [A-Za-z0-9_.-], starting with a letter or digit"),
        ))
    }
}

/// Linux interface names: 1-15 bytes, no '/', ':' or whitespace, not "." or "..".
pub(crate) fn validate_ifname(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > 15 {
        return Err(format!("{name:?}: interface names are 1-15 bytes"));
    }
    if name == "." || name == ".." || name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
        return Err(format!("{name:?}: not a valid interface name"));
    }
    Ok(())
}

/// Format a MAC address the usual way.
pub(crate) fn format_mac(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_id_rules() {
        assert!(validate_sandbox_id("abc123-x_y.z").is_ok());
        assert!(validate_sandbox_id("").is_err());
        assert!(validate_sandbox_id("-abc").is_err());
        assert!(validate_sandbox_id("a/b").is_err());
        assert!(validate_sandbox_id("../x").is_err());
    }

    #[test]
    fn ifname_rules() {
        assert!(validate_ifname("eth0").is_ok());
        assert!(validate_ifname("sixteen-chars-xx").is_err());
        assert!(validate_ifname("a/b").is_err());
        assert!(validate_ifname("").is_err());
    }

    #[test]
    fn duplicate_host_ports_are_rejected() {
        let mut req = SandboxNetwork::new("s1", "/tmp/ns");
        let pm = PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: Protocol::Tcp,
            host_ip: None,
        };
        req.port_mappings = vec![
            pm,
            PortMapping {
                container_port: 81,
                ..pm
            },
        ];
        let e = req.validate().unwrap_err().to_string();
        assert!(e.contains("port_mappings[1]") && e.contains("8080/tcp"), "{e}");
        // same port, other protocol is fine
        req.port_mappings[1].protocol = Protocol::Udp;
        req.validate().unwrap();
    }

    #[test]
    fn unspecified_host_ip_means_any() {
        let pm = PortMapping {
            host_port: 1,
            container_port: 1,
            protocol: Protocol::Udp,
            host_ip: Some("0.0.0.0".parse().unwrap()),
        };
        assert_eq!(pm.effective_host_ip(), None);
        assert_eq!(format_mac(&[0, 0x1a, 0xff]), "00:1a:ff");
    }
}
