//! The bridge mode's nftables table (family `inet`, name from the config): outbound masquerade of
//! the pod subnet, and hostPort DNAT.
//!
//! Layout:
//! - map `hostports`    : `proto . port            -> podIP . containerPort` (any node address)
//! - map `hostports_ip` : `hostIP . proto . port   -> podIP . containerPort` (one node address)
//! - chains `prerouting` and `output` (nat, -100): traffic to a local address jumps to
//!   `hostports`, which DNATs through the maps (hostIP-specific map first);
//! - chain `postrouting` (nat, 100): masquerade DNATed connections from the pod subnet to the
//!   pod subnet (hairpin: pod -> nodeIP:hostPort -> same or other pod), DNATed connections from
//!   127.0.0.0/8 leaving through the bridge (node -> localhost:hostPort), and, when
//!   `masquerade` is on, pod subnet -> outside.
//!
//! A sandbox's hostPorts are map *elements*: added and removed with the sandbox, keyed by
//! what they match, and carrying the pod IP. Removal is exact and needs no rule handles: the
//! record of the sandbox (its IP and mappings) is all that is needed after a crash, and `gc`
//! can also sweep elements whose pod IP is no longer allocated. The static part is (re)written
//! in one transaction by [`Nft::ensure_base`]: chains are flushed and refilled, maps (and
//! their elements) are kept.
//!
//! nftables is driven through the `nft` command (`nft -f -`, one atomic transaction per
//! change, `nft -j` to read). The native netlink crate considered (`rustables` 0.9) has no
//! `fib` expression and needs libclang at build time, and hand-encoding nf_tables netlink for
//! concatenated NAT maps is a lot of surface for little gain: one `nft` exec per sandbox with
//! hostPorts (none for the others) costs a few milliseconds.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use ipnet::IpNet;
use tokio::io::AsyncWriteExt;
use tracing::{debug, info};

use crate::error::{Error, Result};
use crate::types::{PortMapping, Protocol};

/// The hostPort map element of one mapping, in nft syntax and as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostPortElem {
    pub host_ip: Option<IpAddr>,
    pub protocol: Protocol,
    pub host_port: u16,
    pub pod_ip: IpAddr,
    pub container_port: u16,
}

impl HostPortElem {
    pub(crate) fn new(pod_ip: IpAddr, pm: &PortMapping) -> Self {
        HostPortElem {
            host_ip: pm.effective_host_ip(),
            protocol: pm.protocol,
            host_port: pm.host_port,
            pod_ip,
            container_port: pm.container_port,
        }
    }

    fn map(&self) -> &'static str {
        if self.host_ip.is_some() {
            "hostports_ip"
        } else {
            "hostports"
        }
    }

    fn key(&self) -> String {
        match self.host_ip {
            Some(h) => format!("{h} . {} . {}", self.protocol, self.host_port),
            None => format!("{} . {}", self.protocol, self.host_port),
        }
    }

    fn value(&self) -> String {
        format!("{} . {}", self.pod_ip, self.container_port)
    }
}

/// The table of one bridge network.
#[derive(Debug, Clone)]
pub(crate) struct Nft {
    nft: PathBuf,
    table: String,
    subnet: IpNet,
    bridge: String,
    masquerade: bool,
}

/// Where `nft` is: the usual sbin dirs, then PATH.
pub(crate) fn locate_nft() -> Result<PathBuf> {
    let mut tried = Vec::new();
    let mut dirs: Vec<PathBuf> = ["/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/sbin"]
        .iter()
        .map(PathBuf::from)
        .collect();
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    for d in dirs {
        let c = d.join("nft");
        if c.is_file() {
            return Ok(c);
        }
        tried.push(c.display().to_string());
    }
    Err(Error::NftMissing(tried.join(", ")))
}

impl Nft {
    pub(crate) fn new(nft: PathBuf, table: &str, subnet: IpNet, bridge: &str, masquerade: bool) -> Self {
        Nft {
            nft,
            table: table.to_string(),
            subnet: subnet.trunc(),
            bridge: bridge.to_string(),
            masquerade,
        }
    }

    fn v4(&self) -> bool {
        matches!(self.subnet, IpNet::V4(_))
    }

    /// The static part of the table, as one idempotent transaction.
    pub(crate) fn render_base(&self) -> String {
        let t = format!("inet {}", self.table);
        let (addr, ipk, nfproto) = if self.v4() {
            ("ipv4_addr", "ip", "ipv4")
        } else {
            ("ipv6_addr", "ip6", "ipv6")
        };
        let net = self.subnet;
        let mut s = String::new();
        let mut line = |l: String| {
            s.push_str(&l);
            s.push('\n');
        };
        line(format!("add table {t}"));
        line(format!(
            "add map {t} hostports {{ type inet_proto . inet_service : {addr} . inet_service ; }}"
        ));
        line(format!(
            "add map {t} hostports_ip {{ type {addr} . inet_proto . inet_service : {addr} . inet_service ; }}"
        ));
        for (chain, hook, prio) in [
            ("prerouting", "prerouting", -100),
            ("output", "output", -100),
            ("postrouting", "postrouting", 100),
        ] {
            line(format!(
                "add chain {t} {chain} {{ type nat hook {hook} priority {prio} ; policy accept ; }}"
            ));
        }
        line(format!("add chain {t} hostports"));
        for chain in ["prerouting", "output", "postrouting", "hostports"] {
            line(format!("flush chain {t} {chain}"));
        }
        line(format!("add rule {t} prerouting fib daddr type local jump hostports"));
        line(format!("add rule {t} output fib daddr type local jump hostports"));
        line(format!(
            "add rule {t} hostports meta nfproto {nfproto} dnat {ipk} to {ipk} daddr . meta l4proto . th dport map @hostports_ip"
        ));
        line(format!(
            "add rule {t} hostports meta nfproto {nfproto} dnat {ipk} to meta l4proto . th dport map @hostports"
        ));
        line(format!(
            "add rule {t} postrouting {ipk} saddr {net} {ipk} daddr {net} ct status dnat masquerade comment \"hairpin\""
        ));
        if self.v4() {
            line(format!(
                "add rule {t} postrouting ip saddr 127.0.0.0/8 oifname \"{}\" ct status dnat masquerade comment \"localhost hostPort\"",
                self.bridge
            ));
        }
        if self.masquerade {
            line(format!(
                "add rule {t} postrouting {ipk} saddr {net} {ipk} daddr != {net} masquerade comment \"outbound\""
            ));
        }
        s
    }

    /// Add the elements of a sandbox. Adding an element that is already there with the same
    /// pod is a no-op; one there for another pod fails the whole transaction.
    pub(crate) fn render_add(&self, elems: &[HostPortElem]) -> String {
        let t = format!("inet {}", self.table);
        elems
            .iter()
            .map(|e| format!("add element {t} {} {{ {} : {} }}\n", e.map(), e.key(), e.value()))
            .collect()
    }

    /// Remove the elements of a sandbox, idempotently: each is added (a no-op if present with
    /// the same pod) and then deleted, so a missing element is no error, and an element that
    /// now belongs to another pod fails the transaction instead of being removed.
    pub(crate) fn render_del(&self, elems: &[HostPortElem]) -> String {
        let t = format!("inet {}", self.table);
        elems
            .iter()
            .map(|e| {
                format!(
                    "add element {t} {m} {{ {k} : {v} }}\ndelete element {t} {m} {{ {k} }}\n",
                    m = e.map(),
                    k = e.key(),
                    v = e.value()
                )
            })
            .collect()
    }

    /// Create or refresh the static part of the table.
    pub(crate) async fn ensure_base(&self) -> Result<()> {
        self.run(&["-f", "-"], Some(&self.render_base()), "setting up the table")
            .await?;
        info!(table = %self.table, subnet = %self.subnet, "nftables table ready");
        Ok(())
    }

    /// Add the hostPort elements of a sandbox.
    pub(crate) async fn add(&self, elems: &[HostPortElem]) -> Result<()> {
        if elems.is_empty() {
            return Ok(());
        }
        self.run(&["-f", "-"], Some(&self.render_add(elems)), "adding hostPorts")
            .await?;
        for e in elems {
            info!(table = %self.table, map = e.map(), elem = %format!("{} : {}", e.key(), e.value()), "hostPort added");
        }
        Ok(())
    }

    /// Remove the hostPort elements of a sandbox; missing ones are fine, ones that map to
    /// another pod are left alone.
    pub(crate) async fn remove(&self, elems: &[HostPortElem]) -> Result<()> {
        if elems.is_empty() {
            return Ok(());
        }
        if self
            .run(&["-f", "-"], Some(&self.render_del(elems)), "removing hostPorts")
            .await
            .is_ok()
        {
            for e in elems {
                info!(table = %self.table, map = e.map(), elem = %e.key(), "hostPort removed");
            }
            return Ok(());
        }
        // One of them maps to another pod now (or the table is gone): one by one.
        let mut first_err = None;
        for e in elems {
            match self
                .run(
                    &["-f", "-"],
                    Some(&self.render_del(std::slice::from_ref(e))),
                    "removing hostPort",
                )
                .await
            {
                Ok(_) => info!(table = %self.table, map = e.map(), elem = %e.key(), "hostPort removed"),
                Err(err) => {
                    let msg = err.to_string();
                    if msg.contains("File exists") || msg.contains("busy") {
                        debug!(elem = %e.key(), "hostPort element belongs to another pod; left alone");
                    } else if first_err.is_none() {
                        first_err = Some(err);
                    }
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Remove the whole table (nothing to do when it does not exist).
    pub(crate) async fn delete_table(&self) -> Result<()> {
        match self
            .run(&["delete", "table", "inet", &self.table], None, "deleting the table")
            .await
        {
            Ok(_) => {
                info!(table = %self.table, "nftables table deleted");
                Ok(())
            }
            Err(e) if e.to_string().contains("No such file") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every hostPort element in the table (none when the table does not exist).
    pub(crate) async fn list(&self) -> Result<Vec<HostPortElem>> {
        let mut out = Vec::new();
        for map in ["hostports", "hostports_ip"] {
            let json = match self
                .run(
                    &["-j", "list", "map", "inet", &self.table, map],
                    None,
                    "listing hostPorts",
                )
                .await
            {
                Ok(j) => j,
                Err(e) if e.to_string().contains("No such file") => continue,
                Err(e) => return Err(e),
            };
            out.extend(
                parse_elements(&json, map == "hostports_ip").map_err(|reason| Error::Nft {
                    action: format!("decoding the elements of map {map}"),
                    table: self.table.clone(),
                    stderr: reason,
                })?,
            );
        }
        Ok(out)
    }

    async fn run(&self, args: &[&str], stdin: Option<&str>, action: &str) -> Result<String> {
        run_nft(&self.nft, args, stdin).await.map_err(|stderr| Error::Nft {
            action: action.to_string(),
            table: self.table.clone(),
            stderr,
        })
    }
}

/// Run nft; Err is its stderr (or why it could not run).
async fn run_nft(nft: &Path, args: &[&str], stdin: Option<&str>) -> std::result::Result<String, String> {
    let mut child = tokio::process::Command::new(nft)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("running {}: {e}", nft.display()))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .await
            .map_err(|e| format!("writing to nft: {e}"))?;
        drop(pipe);
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("waiting for nft: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(if err.is_empty() {
            format!("nft {}: {}", args.join(" "), out.status)
        } else {
            err
        })
    }
}

/// Decode the elements of `nft -j list map` output.
pub(crate) fn parse_elements(json: &str, with_host_ip: bool) -> std::result::Result<Vec<HostPortElem>, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let items = v["nftables"].as_array().cloned().unwrap_or_default();
    for item in items {
        let Some(map) = item.get("map") else { continue };
        let Some(elems) = map.get("elem").and_then(|e| e.as_array()) else {
            continue;
        };
        for e in elems {
            let pair = e.as_array().ok_or("element is not a [key, value] pair")?;
            let key = pair
                .first()
                .and_then(|k| k["concat"].as_array())
                .ok_or("element key is not a concatenation")?;
            let val = pair
                .get(1)
                .and_then(|k| k["concat"].as_array())
                .ok_or("element value is not a concatenation")?;
            let mut key = key.iter();
            let host_ip = if with_host_ip {
                Some(parse_ip(key.next())?)
            } else {
                None
            };
            let protocol = match key.next().and_then(|p| p.as_str()) {
                Some("tcp") => Protocol::Tcp,
                Some("udp") => Protocol::Udp,
                Some("sctp") => Protocol::Sctp,
                other => return Err(format!("unexpected protocol {other:?}")),
            };
            let host_port = parse_port(key.next())?;
            let pod_ip = parse_ip(val.first())?;
            let container_port = parse_port(val.get(1))?;
            out.push(HostPortElem {
                host_ip,
                protocol,
                host_port,
                pod_ip,
                container_port,
            });
        }
    }
    Ok(out)
}

fn parse_ip(v: Option<&serde_json::Value>) -> std::result::Result<IpAddr, String> {
    v.and_then(|v| v.as_str())
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("expected an IP address, got {v:?}"))
}

fn parse_port(v: Option<&serde_json::Value>) -> std::result::Result<u16, String> {
    v.and_then(|v| v.as_u64())
        .and_then(|n| u16::try_from(n).ok())
        .ok_or_else(|| format!("expected a port, got {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nft(masq: bool) -> Nft {
        Nft::new(
            "/usr/sbin/nft".into(),
            "ferrolet",
            "10.88.0.0/16".parse().unwrap(),
            "ferrolet0",
            masq,
        )
    }

    fn pm(host_port: u16, container_port: u16, protocol: Protocol, host_ip: Option<&str>) -> PortMapping {
        PortMapping {
            host_port,
            container_port,
            protocol,
            host_ip: host_ip.map(|s| s.parse().unwrap()),
        }
    }

    #[test]
    fn base_ruleset_v4() {
        let s = nft(true).render_base();
        assert!(s.contains("add table inet ferrolet\n"));
        assert!(s.contains(
            "add map inet ferrolet hostports { type inet_proto . inet_service : ipv4_addr . inet_service ; }"
        ));
        assert!(s.contains(
            "add chain inet ferrolet prerouting { type nat hook prerouting priority -100 ; policy accept ; }"
        ));
        assert!(s.contains("flush chain inet ferrolet postrouting\n"));
        assert!(s.contains("add rule inet ferrolet prerouting fib daddr type local jump hostports"));
        assert!(s.contains("dnat ip to ip daddr . meta l4proto . th dport map @hostports_ip"));
        assert!(s.contains("ip saddr 10.88.0.0/16 ip daddr 10.88.0.0/16 ct status dnat masquerade"));
        assert!(s.contains("oifname \"ferrolet0\" ct status dnat masquerade"));
        assert!(s.contains("ip saddr 10.88.0.0/16 ip daddr != 10.88.0.0/16 masquerade"));
        // the specific-IP map is consulted before the any-address map
        assert!(s.find("@hostports_ip").unwrap() < s.find("map @hostports\n").unwrap());
        assert!(!nft(false).render_base().contains("outbound"));
    }

    #[test]
    fn base_ruleset_v6() {
        let n = Nft::new(
            "/usr/sbin/nft".into(),
            "t6",
            "fd00:88::/64".parse().unwrap(),
            "br6",
            true,
        );
        let s = n.render_base();
        assert!(s.contains("type ip6_addr") || s.contains("type ipv6_addr . inet_proto"));
        assert!(s.contains("dnat ip6 to ip6 daddr . meta l4proto . th dport map @hostports_ip"));
        assert!(s.contains("ip6 saddr fd00:88::/64 ip6 daddr != fd00:88::/64 masquerade"));
        assert!(!s.contains("127.0.0.0/8"));
    }

    #[test]
    fn element_rendering() {
        let pod: IpAddr = "10.88.0.5".parse().unwrap();
        let elems = vec![
            HostPortElem::new(pod, &pm(8080, 80, Protocol::Tcp, None)),
            HostPortElem::new(pod, &pm(5353, 53, Protocol::Udp, Some("192.0.2.1"))),
            HostPortElem::new(pod, &pm(9, 9, Protocol::Sctp, Some("0.0.0.0"))),
        ];
        let n = nft(true);
        assert_eq!(
            n.render_add(&elems),
            "add element inet ferrolet hostports { tcp . 8080 : 10.88.0.5 . 80 }\n\
             add element inet ferrolet hostports_ip { 192.0.2.1 . udp . 5353 : 10.88.0.5 . 53 }\n\
             add element inet ferrolet hostports { sctp . 9 : 10.88.0.5 . 9 }\n"
        );
        assert_eq!(
            n.render_del(&elems[..1]),
            "add element inet ferrolet hostports { tcp . 8080 : 10.88.0.5 . 80 }\n\
             delete element inet ferrolet hostports { tcp . 8080 }\n"
        );
    }

    #[test]
    fn parse_listed_elements() {
        let any = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"map": {"family": "inet", "name": "hostports", "table": "ft", "type": ["inet_proto", "inet_service"], "handle": 1, "map": "ipv4_addr . inet_service", "elem": [[{"concat": ["udp", 53]}, {"concat": ["10.88.0.5", 5353]}], [{"concat": ["tcp", 8080]}, {"concat": ["10.88.0.5", 80]}]]}}]}"#;
        let got = parse_elements(any, false).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].protocol, Protocol::Udp);
        assert_eq!(got[0].container_port, 5353);
        assert_eq!(got[1].host_port, 8080);
        let ip = r#"{"nftables": [{"map": {"name": "hostports_ip", "elem": [[{"concat": ["192.0.2.1", "sctp", 99]}, {"concat": ["10.88.0.6", 9]}]]}}]}"#;
        let got = parse_elements(ip, true).unwrap();
        assert_eq!(got[0].host_ip, Some("192.0.2.1".parse().unwrap()));
        assert_eq!(got[0].protocol, Protocol::Sctp);
        assert_eq!(got[0].pod_ip, "10.88.0.6".parse::<IpAddr>().unwrap());
        // an empty map has no "elem"
        assert!(
            parse_elements(r#"{"nftables": [{"map": {"name": "hostports"}}]}"#, false)
                .unwrap()
                .is_empty()
        );
        assert!(parse_elements("not json", false).is_err());
    }
}
