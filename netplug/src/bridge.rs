//! The built-in bridge network: a Linux bridge in the node namespace holding the gateway
//! address, one veth pair per sandbox (host end on the bridge, named from the sandbox id; pod
//! end created directly inside the pod's namespace, by fd, under the requested name), IPs from
//! [`Ipam`], masquerade and hostPorts in an nftables table ([`Nft`]), bandwidth limits with TBF.
//!
//! Everything is done over netlink. Work inside a pod namespace goes through a netlink socket
//! created by a thread that joined the namespace ([`crate::netns`]); the process never changes
//! namespace. The veth's pod end is created in the pod namespace in the same request that
//! creates the pair (IFLA_NET_NS_FD on the peer), which is "create, move by fd, rename" in one
//! step: there is no moment when it exists in the node namespace or under a temporary name.
//!
//! Order of setup, so that a crash at any point can be undone by `teardown_by_id`/`gc`: the
//! record (phase `setup`, with the hostPorts, after the conflict check), the IP allocation (an
//! exclusive file naming the sandbox), the veth (host end labelled with the sandbox id), pod
//! side, bandwidth, nft elements, the record again (phase `ready`). A failed setup undoes what
//! it did before returning the error. The pod's namespace thread is started while the host
//! side is being made; a setup without hostPorts execs nothing.

use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use ipnet::IpNet;
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth};
use rtnetlink::{Handle, LinkBridge, LinkBridgePort, LinkMessageBuilder, LinkUnspec, LinkVeth};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::error::{Error, NlContext, Result};
use crate::ipam::{self, Ipam};
use crate::netns::{self, netns_exists, open_netns};
use crate::nft::{self, HostPortElem, Nft};
use crate::nl;
use crate::record::Records;
use crate::tc;
use crate::types::{validate_ifname, Bandwidth, BridgeConfig, NetworkStatus, PortMapping, SandboxNetwork};
use ferrolet_fsutil::chain;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Phase {
    /// Setup started; some of the resources may exist.
    Setup,
    /// Setup finished.
    Ready,
}

/// What was made for a sandbox: enough to undo it with nothing else at hand.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    sandbox_id: String,
    phase: Phase,
    netns: PathBuf,
    ifname: String,
    /// Host end of the veth pair.
    veth: String,
    bridge: String,
    ips: Vec<IpAddr>,
    gateway: IpAddr,
    prefix_len: u8,
    #[serde(default)]
    port_mappings: Vec<PortMapping>,
    #[serde(default)]
    bandwidth: Option<Bandwidth>,
    #[serde(default)]
    mac: Option<String>,
}

/// Name of the host end of a sandbox's veth: "veth" + 8 hex digits of a hash of the id.
pub(crate) fn veth_name(sandbox_id: &str) -> String {
    // FNV-1a 64, folded to 32 bits: stable across versions and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in sandbox_id.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("veth{:08x}", (h ^ (h >> 32)) as u32)
}

fn is_our_veth_name(name: &str) -> bool {
    name.len() == 12 && name.starts_with("veth") && name[4..].chars().all(|c| c.is_ascii_hexdigit())
}

/// Whether two subnets share addresses.
pub(crate) fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

pub(crate) struct BridgeNet {
    cfg: BridgeConfig,
    subnet: IpNet,
    gateway: IpAddr,
    mtu: u32,
    ipam: Ipam,
    records: Records,
    nft: Nft,
    /// Serialises hostPort conflict checks with the recording of a sandbox's mappings.
    ports_lock: tokio::sync::Mutex<()>,
    /// Index of the bridge as last fully ensured (address, up, sysctls).
    bridge_ok: std::sync::Mutex<Option<u32>>,
}

impl BridgeNet {
    pub(crate) async fn new(cfg: BridgeConfig) -> Result<Self> {
        validate_ifname(&cfg.bridge).map_err(|r| Error::invalid_config("bridge", r))?;
        if cfg.nft_table.is_empty()
            || cfg.nft_table.len() > 64
            || !cfg
                .nft_table
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(Error::invalid_config(
                "nft_table",
                format!("{:?}: use 1-64 of [A-Za-z0-9_-]", cfg.nft_table),
            ));
        }
        if cfg.state_dir.as_os_str().is_empty() {
            return Err(Error::invalid_config("state_dir", "empty path"));
        }
        let subnet = cfg.subnet.trunc();
        let gateway = match cfg.gateway {
            Some(gw) => {
                let bad = if !subnet.contains(&gw) {
                    Some(format!("not in subnet {subnet}"))
                } else if gw == subnet.network() {
                    Some("it is the network address".into())
                } else if subnet.network().is_ipv4() && gw == subnet.broadcast() {
                    Some("it is the broadcast address".into())
                } else {
                    None
                };
                if let Some(reason) = bad {
                    return Err(Error::invalid_config("gateway", format!("{gw}: {reason}")));
                }
                gw
            }
            None => ipam::default_gateway(&subnet).ok_or_else(|| {
                Error::invalid_config("subnet", format!("{subnet} is too small for a gateway and a pod"))
            })?,
        };
        if let Some(mtu) = cfg.mtu {
            if !(576..=65535).contains(&mtu) {
                return Err(Error::invalid_config("mtu", format!("{mtu}: must be 576-65535")));
            }
        }
        let nft_bin = nft::locate_nft()?;
        let ipam = Ipam::new(&cfg.state_dir, subnet, gateway)?;
        let records = Records::new(&cfg.state_dir)?;

        let h = netns::node_handle()?;
        let links = nl::links(&h).await?;
        let bridge_index = links.iter().find(|l| l.name == cfg.bridge).map(|l| l.index);
        let name_of = |idx: Option<u32>| {
            idx.and_then(|i| links.iter().find(|l| l.index == i))
                .map(|l| l.name.clone())
                .unwrap_or_else(|| "?".into())
        };
        let routes = nl::routes(&h, subnet.network().is_ipv6()).await?;
        for r in &routes {
            if r.dst.prefix_len() == 0 || (bridge_index.is_some() && r.oif == bridge_index) {
                continue;
            }
            if overlaps(&r.dst, &subnet) {
                return Err(Error::SubnetOverlap {
                    subnet: subnet.to_string(),
                    route: r.dst.to_string(),
                    interface: name_of(r.oif),
                });
            }
        }
        let mtu = match cfg.mtu {
            Some(m) => m,
            None => routes
                .iter()
                .find(|r| r.dst.prefix_len() == 0)
                .and_then(|r| r.oif)
                .and_then(|i| links.iter().find(|l| l.index == i))
                .and_then(|l| l.mtu)
                .unwrap_or(1500),
        };
        let nft = Nft::new(nft_bin, &cfg.nft_table, subnet, &cfg.bridge, cfg.masquerade);
        let net = BridgeNet {
            subnet,
            gateway,
            mtu,
            ipam,
            records,
            nft,
            ports_lock: tokio::sync::Mutex::new(()),
            bridge_ok: std::sync::Mutex::new(None),
            cfg,
        };
        net.bridge_index(&h).await?;
        net.nft.ensure_base().await?;
        info!(bridge = %net.cfg.bridge, subnet = %subnet, gateway = %gateway, mtu, "bridge network ready");
        Ok(net)
    }

    /// Create the bridge if missing, give it the gateway address, bring it up; turn on
    /// forwarding (and route_localnet on the bridge, for localhost hostPorts) in the node
    /// namespace. Returns the bridge's index.
    async fn ensure_bridge(&self, h: &Handle) -> Result<u32> {
        let name = &self.cfg.bridge;
        let link = match nl::link_by_name(h, name).await? {
            Some(l) => l,
            None => {
                let msg = LinkBridge::new(name).mtu(self.mtu).build();
                match nl::create_link(h, msg, &format!("creating bridge {name}")).await {
                    Ok(()) => {
                        let l = nl::link_by_name(h, name).await?.ok_or_else(|| {
                            Error::invalid_config("bridge", format!("{name} vanished after creation"))
                        })?;
                        // Pin the random MAC: a bridge otherwise takes the lowest MAC of its
                        // ports, and changes it as pods come and go (stale ARP in pods).
                        if let Some(mac) = &l.mac {
                            let bytes: Vec<u8> =
                                mac.split(':').filter_map(|b| u8::from_str_radix(b, 16).ok()).collect();
                            nl::set_link(
                                h,
                                LinkUnspec::new_with_index(l.index).address(bytes).build(),
                                &format!("setting the MAC of bridge {name}"),
                            )
                            .await?;
                        }
                        info!(bridge = %name, "bridge created");
                        l
                    }
                    Err(e) if e.is_exists() => nl::link_by_name(h, name)
                        .await?
                        .ok_or_else(|| Error::invalid_config("bridge", format!("{name} vanished")))?,
                    Err(e) => return Err(e),
                }
            }
        };
        if link.kind.as_deref() != Some("bridge") {
            return Err(Error::invalid_config(
                "bridge",
                format!(
                    "interface {name} exists and is not a bridge (kind {})",
                    link.kind.as_deref().unwrap_or("unknown")
                ),
            ));
        }
        let have = nl::addrs(h, Some(link.index)).await?;
        if !have.iter().any(|(_, ip, _)| *ip == self.gateway) {
            nl::add_addr(h, link.index, name, self.gateway, self.subnet.prefix_len()).await?;
            info!(bridge = %name, address = %format!("{}/{}", self.gateway, self.subnet.prefix_len()), "bridge address added");
        }
        if !link.up {
            nl::set_up(h, link.index, name).await?;
        }
        if self.subnet.network().is_ipv4() {
            nl::write_sysctl("net/ipv4/ip_forward", "1")?;
            nl::write_sysctl(&format!("net/ipv4/conf/{name}/route_localnet"), "1")?;
        } else {
            nl::write_sysctl("net/ipv6/conf/all/forwarding", "1")?;
        }
        Ok(link.index)
    }

    fn elems(ips: &[IpAddr], mappings: &[PortMapping]) -> Vec<HostPortElem> {
        match ips.first() {
            Some(ip) => mappings.iter().map(|pm| HostPortElem::new(*ip, pm)).collect(),
            None => Vec::new(),
        }
    }

    /// A hostPort of `req` already mapped by another recorded sandbox.
    fn port_conflict(&self, req: &SandboxNetwork) -> Result<Option<Error>> {
        for id in self.records.ids()? {
            if id == req.sandbox_id {
                continue;
            }
            let Some(rec) = self.records.read::<Record>(&id)? else {
                continue;
            };
            for pm in &req.port_mappings {
                for other in &rec.port_mappings {
                    let ip_clash = match (pm.effective_host_ip(), other.effective_host_ip()) {
                        (Some(a), Some(b)) => a == b,
                        _ => true,
                    };
                    if pm.protocol == other.protocol && pm.host_port == other.host_port && ip_clash {
                        return Ok(Some(Error::HostPortConflict {
                            port: pm.host_port,
                            protocol: pm.protocol.to_string(),
                            host_ip: pm.effective_host_ip().map_or("*".into(), |i| i.to_string()),
                            owner: id,
                        }));
                    }
                }
            }
        }
        Ok(None)
    }

    pub(crate) async fn setup(&self, req: &SandboxNetwork) -> Result<NetworkStatus> {
        let id = &req.sandbox_id;
        for ip in &req.requested_ips {
            if ip.is_ipv4() != self.subnet.network().is_ipv4() {
                return Err(Error::IpUnavailable {
                    ip: *ip,
                    subnet: self.subnet.to_string(),
                    reason: "not of the pod subnet's family".into(),
                });
            }
        }
        for pm in &req.port_mappings {
            if let Some(hip) = pm.effective_host_ip() {
                if hip.is_ipv4() != self.subnet.network().is_ipv4() {
                    return Err(Error::invalid_config(
                        "port_mappings",
                        format!("hostIP {hip} is not of the pod subnet's family ({})", self.subnet),
                    ));
                }
            }
        }
        if let Some(old) = self.records.read::<Record>(id)? {
            warn!(sandbox = %id, phase = ?old.phase, "sandbox already has a network; tearing it down first");
            self.undo(&old).await?;
        }
        open_netns(&req.netns)?;

        let mut rec = Record {
            sandbox_id: id.clone(),
            phase: Phase::Setup,
            netns: req.netns.clone(),
            ifname: req.ifname.clone(),
            veth: veth_name(id),
            bridge: self.cfg.bridge.clone(),
            ips: Vec::new(),
            gateway: self.gateway,
            prefix_len: self.subnet.prefix_len(),
            port_mappings: req.port_mappings.clone(),
            bandwidth: req.bandwidth,
            mac: None,
        };
        if req.port_mappings.is_empty() {
            self.records.write(id, &rec).await?;
        } else {
            // check and record under one lock, so two sandboxes can not both claim a hostPort
            let _g = self.ports_lock.lock().await;
            if let Some(conflict) = self.port_conflict(req)? {
                return Err(conflict);
            }
            self.records.write(id, &rec).await?;
        }
        let result = async {
            // (not re-recorded: the IP's file names the sandbox, and undo looks there too)
            let (ipam, sid, wanted) = (self.ipam.clone(), id.clone(), req.requested_ips.clone());
            let ip = crate::blocking(move || ipam.allocate(&sid, &wanted)).await?;
            rec.ips = vec![ip];
            crate::failpoint("bridge-after-ipam").await;
            self.configure(req, &rec).await
        }
        .await;
        match result {
            Ok(status) => {
                rec.phase = Phase::Ready;
                rec.mac = status.mac.clone();
                self.records.write(id, &rec).await?;
                info!(sandbox = %id, ip = %rec.ips[0], veth = %rec.veth, "sandbox network set up");
                Ok(status)
            }
            Err(e) => {
                warn!(sandbox = %id, error = %chain(&e), "sandbox network setup failed; undoing");
                if let Err(e2) = self.undo(&rec).await {
                    warn!(sandbox = %id, error = %chain(&e2), "undoing a failed setup failed; gc will retry");
                }
                Err(e)
            }
        }
    }

    /// The bridge's index: fast when it is the one fully set up before (exists, up), else
    /// [`Self::ensure_bridge`] again (someone deleted or downed it).
    async fn bridge_index(&self, h: &Handle) -> Result<u32> {
        let cached = *self.bridge_ok.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = nl::link_by_name(h, &self.cfg.bridge).await? {
            if l.up && Some(l.index) == cached {
                return Ok(l.index);
            }
        }
        let index = self.ensure_bridge(h).await?;
        *self.bridge_ok.lock().unwrap_or_else(|e| e.into_inner()) = Some(index);
        Ok(index)
    }

    /// Host side: the veth pair, its pod end created inside the pod namespace (named `ifname`;
    /// it can not be created up: a veth refuses to open before its peer is linked), its host
    /// end up on the bridge, labelled with the sandbox id, hairpin on.
    async fn host_side(&self, req: &SandboxNetwork, veth: &str) -> Result<nl::Link> {
        let h = netns::node_handle()?;
        let bridge_index = self.bridge_index(&h).await?;
        if let Some(old) = nl::link_by_name(&h, veth).await? {
            match old.alias.as_deref() {
                Some(a) if a != req.sandbox_id => {
                    return Err(Error::sandbox(
                        &req.sandbox_id,
                        format!("interface {veth} exists and belongs to sandbox {a}"),
                    ))
                }
                _ => {
                    nl::del_link(&h, old.index, veth).await?;
                }
            }
        }
        let ns = open_netns(&req.netns)?;
        let peer = LinkUnspec::new_with_name(&req.ifname)
            .mtu(self.mtu)
            .setns_by_fd(ns.as_raw_fd())
            .build();
        let msg = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
            .name(veth.to_string())
            .mtu(self.mtu)
            .controller(bridge_index)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
            .up()
            .build();
        nl::create_link(
            &h,
            msg,
            &format!(
                "creating veth {veth} <-> {} in {} on bridge {}",
                req.ifname,
                req.netns.display(),
                self.cfg.bridge
            ),
        )
        .await?;
        drop(ns);
        let host = nl::link_by_name(&h, veth)
            .await?
            .ok_or_else(|| Error::sandbox(&req.sandbox_id, format!("veth {veth} vanished after creation")))?;
        // (IFLA_IFALIAS is ignored by RTM_NEWLINK: a separate request)
        nl::set_link(
            &h,
            LinkUnspec::new_with_index(host.index)
                .alias(req.sandbox_id.clone())
                .build(),
            &format!("labelling {veth} with its sandbox"),
        )
        .await?;
        if self.cfg.hairpin {
            let msg = LinkBridgePort::new(host.index).hairpin(true).build();
            h.link()
                .set_port(msg)
                .execute()
                .await
                .context(format!("setting hairpin mode on {veth}"))?;
        }
        info!(sandbox = %req.sandbox_id, veth = %veth, bridge = %self.cfg.bridge, "veth created");
        Ok(host)
    }

    async fn configure(&self, req: &SandboxNetwork, rec: &Record) -> Result<NetworkStatus> {
        let ip = rec.ips[0];
        let veth = rec.veth.clone();
        let h = netns::node_handle()?;
        // The namespace thread starts while the host side is being made.
        let (host, ph) = tokio::join!(self.host_side(req, &veth), netns::netns_handle(&req.netns));
        let host = host?;
        let ph = ph?;
        crate::failpoint("bridge-after-veth").await;

        let pod = nl::link_by_name(&ph, &req.ifname).await?.ok_or_else(|| {
            Error::netns(
                &req.netns,
                format!("interface {} missing after veth creation", req.ifname),
            )
        })?;
        let lo_up = async {
            match nl::link_by_name(&ph, "lo").await? {
                Some(lo) if !lo.up => nl::set_up(&ph, lo.index, "lo").await,
                _ => Ok(()),
            }
        };
        let (lo, addr) = tokio::join!(
            lo_up,
            nl::add_addr(&ph, pod.index, &req.ifname, ip, self.subnet.prefix_len())
        );
        lo?;
        addr?;
        nl::set_up(&ph, pod.index, &req.ifname).await?;
        nl::add_default_route(&ph, pod.index, &req.ifname, self.gateway).await?;
        info!(sandbox = %req.sandbox_id, interface = %req.ifname, address = %format!("{ip}/{}", self.subnet.prefix_len()), gateway = %self.gateway, "pod interface configured");

        if let Some(bw) = &req.bandwidth {
            if bw.ingress_rate > 0 {
                tc::set_tbf(&h, host.index, &veth, bw.ingress_rate, bw.ingress_burst, self.mtu).await?;
            }
            if bw.egress_rate > 0 {
                tc::set_tbf(&ph, pod.index, &req.ifname, bw.egress_rate, bw.egress_burst, self.mtu).await?;
            }
        }

        let elems = Self::elems(&rec.ips, &req.port_mappings);
        if let Err(e) = self.nft.add(&elems).await {
            if e.to_string().contains("File exists") || e.to_string().contains("busy") {
                let pm = req.port_mappings.first().copied();
                return Err(Error::HostPortConflict {
                    port: pm.map_or(0, |p| p.host_port),
                    protocol: pm.map_or("?".into(), |p| p.protocol.to_string()),
                    host_ip: pm
                        .and_then(|p| p.effective_host_ip())
                        .map_or("*".into(), |i| i.to_string()),
                    owner: format!(
                        "(unknown: an element of nft table {} not made by a recorded sandbox)",
                        self.cfg.nft_table
                    ),
                });
            }
            return Err(e);
        }

        Ok(NetworkStatus {
            ips: vec![ip],
            interface: req.ifname.clone(),
            gateway: Some(self.gateway),
            mac: pod.mac,
        })
    }

    /// Undo everything a record says was (or may have been) made. Idempotent.
    async fn undo(&self, rec: &Record) -> Result<()> {
        let id = &rec.sandbox_id;
        let mut first_err: Option<Error> = None;
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                warn!(sandbox = %id, error = %chain(&e), "teardown step failed");
                if first_err.is_none() {
                    first_err = Some(e);
                }
            }
        };
        // the record may predate the allocation: the IPAM knows the rest
        let mut ips = rec.ips.clone();
        let (ipam, sid) = (self.ipam.clone(), id.clone());
        match crate::blocking(move || ipam.owned_by(&sid)).await {
            Ok(owned) => ips.extend(owned.into_iter().filter(|ip| !rec.ips.contains(ip))),
            Err(e) => note(Err(e)),
        }
        note(self.nft.remove(&Self::elems(&ips, &rec.port_mappings)).await);
        let h = netns::node_handle()?;
        note(
            async {
                if let Some(l) = nl::link_by_name(&h, &rec.veth).await? {
                    if l.alias.as_deref().is_none_or(|a| a == id.as_str())
                        && nl::del_link(&h, l.index, &rec.veth).await?
                    {
                        info!(sandbox = %id, veth = %rec.veth, "veth deleted");
                    }
                }
                Ok(())
            }
            .await,
        );
        let (ipam, sid, recorded) = (self.ipam.clone(), id.clone(), rec.ips.clone());
        note(
            crate::blocking(move || {
                for ip in recorded {
                    ipam.release(ip, &sid)?;
                }
                ipam.release_all(&sid)?;
                Ok::<_, Error>(())
            })
            .await,
        );
        if let Some(e) = first_err {
            return Err(e);
        }
        self.records.remove(id).await?;
        info!(sandbox = %id, "sandbox network torn down");
        Ok(())
    }

    /// What to undo for a sandbox without a record: its derived veth name, IPs it owns.
    fn derived_record(&self, id: &str, netns: PathBuf, ifname: &str, mappings: Vec<PortMapping>) -> Result<Record> {
        Ok(Record {
            sandbox_id: id.to_string(),
            phase: Phase::Setup,
            netns,
            ifname: ifname.to_string(),
            veth: veth_name(id),
            bridge: self.cfg.bridge.clone(),
            ips: self.ipam.owned_by(id)?,
            gateway: self.gateway,
            prefix_len: self.subnet.prefix_len(),
            port_mappings: mappings,
            bandwidth: None,
            mac: None,
        })
    }

    /// The sandbox's record for a teardown: `None` when there is none or it cannot be read. A
    /// teardown without it loses nothing: the veth's name derives from the id, the IPs are in
    /// the IPAM, and hostPort elements are found by those IPs.
    fn teardown_record(&self, id: &str) -> Option<Record> {
        match self.records.read::<Record>(id) {
            Ok(r) => r,
            Err(e) => {
                warn!(sandbox = %id, error = %chain(&e), "unreadable network record; tearing down from the IP allocations and the veth name");
                None
            }
        }
    }

    pub(crate) async fn teardown(&self, req: &SandboxNetwork) -> Result<()> {
        match self.teardown_record(&req.sandbox_id) {
            Some(rec) => self.undo(&rec).await,
            None => {
                let rec = self.derived_record(
                    &req.sandbox_id,
                    req.netns.clone(),
                    &req.ifname,
                    req.port_mappings.clone(),
                )?;
                self.undo(&rec).await?;
                self.sweep_elements_of(&rec.ips).await
            }
        }
    }

    pub(crate) async fn teardown_by_id(&self, id: &str) -> Result<()> {
        match self.teardown_record(id) {
            Some(rec) => self.undo(&rec).await,
            None => {
                let rec = self.derived_record(id, PathBuf::new(), "eth0", Vec::new())?;
                self.undo(&rec).await?;
                self.sweep_elements_of(&rec.ips).await
            }
        }
    }

    /// Remove hostPort elements pointing at `ips` (used when no record says which there are).
    async fn sweep_elements_of(&self, ips: &[IpAddr]) -> Result<()> {
        if ips.is_empty() {
            return Ok(());
        }
        let stale: Vec<HostPortElem> = self
            .nft
            .list()
            .await?
            .into_iter()
            .filter(|e| ips.contains(&e.pod_ip))
            .collect();
        self.nft.remove(&stale).await
    }

    pub(crate) async fn check(&self, req: &SandboxNetwork) -> Result<()> {
        let id = &req.sandbox_id;
        let rec: Record = self
            .records
            .read(id)?
            .ok_or_else(|| Error::check(id, "no network record (setup was not run or was torn down)"))?;
        if rec.phase != Phase::Ready {
            return Err(Error::check(id, "setup did not finish"));
        }
        if rec.netns != req.netns || rec.ifname != req.ifname {
            return Err(Error::check(
                id,
                format!(
                    "set up for {} in {}, asked about {} in {}",
                    rec.ifname,
                    rec.netns.display(),
                    req.ifname,
                    req.netns.display()
                ),
            ));
        }
        let ip = *rec.ips.first().ok_or_else(|| Error::check(id, "record has no IP"))?;
        if self.ipam.owner(ip)?.as_deref() != Some(id.as_str()) {
            return Err(Error::check(id, format!("IP {ip} is not allocated to the sandbox")));
        }
        let h = netns::node_handle()?;
        let bridge = nl::link_by_name(&h, &self.cfg.bridge)
            .await?
            .ok_or_else(|| Error::check(id, format!("bridge {} is missing", self.cfg.bridge)))?;
        let veth = nl::link_by_name(&h, &rec.veth)
            .await?
            .ok_or_else(|| Error::check(id, format!("host interface {} is missing", rec.veth)))?;
        if veth.controller != Some(bridge.index) {
            return Err(Error::check(
                id,
                format!("{} is not a port of bridge {}", rec.veth, self.cfg.bridge),
            ));
        }
        if !veth.up {
            return Err(Error::check(id, format!("{} is down", rec.veth)));
        }
        if !netns_exists(&req.netns) {
            return Err(Error::check(
                id,
                format!("network namespace {} is gone", req.netns.display()),
            ));
        }
        let ph = netns::netns_handle(&req.netns).await?;
        let pod = nl::link_by_name(&ph, &req.ifname)
            .await?
            .ok_or_else(|| Error::check(id, format!("interface {} is missing in the pod", req.ifname)))?;
        if !pod.up {
            return Err(Error::check(id, format!("interface {} is down in the pod", req.ifname)));
        }
        let addrs = nl::addrs(&ph, Some(pod.index)).await?;
        if !addrs.iter().any(|(_, a, _)| *a == ip) {
            return Err(Error::check(id, format!("{} does not have address {ip}", req.ifname)));
        }
        let routes = nl::routes(&ph, ip.is_ipv6()).await?;
        if !routes
            .iter()
            .any(|r| r.dst.prefix_len() == 0 && r.gateway == Some(rec.gateway))
        {
            return Err(Error::check(
                id,
                format!("no default route via {} in the pod", rec.gateway),
            ));
        }
        if let Some(bw) = &rec.bandwidth {
            for (rate, handle, index, name) in [
                (bw.ingress_rate, &h, veth.index, rec.veth.as_str()),
                (bw.egress_rate, &ph, pod.index, req.ifname.as_str()),
            ] {
                if rate > 0 && tc::root_qdisc_kind(handle, index).await?.as_deref() != Some("tbf") {
                    return Err(Error::check(
                        id,
                        format!("bandwidth limit (tbf qdisc) missing on {name}"),
                    ));
                }
            }
        }
        let want = Self::elems(&rec.ips, &rec.port_mappings);
        if !want.is_empty() {
            let have = self.nft.list().await?;
            for e in want {
                if !have.contains(&e) {
                    return Err(Error::check(
                        id,
                        format!(
                            "hostPort {}/{} -> {}:{} missing from nft table {}",
                            e.host_port, e.protocol, e.pod_ip, e.container_port, self.cfg.nft_table
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every sandbox id that has something of ours: records, IP allocations, labelled veths.
    async fn known_ids(&self, h: &Handle) -> Result<(BTreeSet<String>, Vec<nl::Link>)> {
        let mut ids: BTreeSet<String> = self.records.ids()?.into_iter().collect();
        ids.extend(self.ipam.allocations()?.into_iter().map(|(_, o)| o));
        let bridge = nl::link_by_name(h, &self.cfg.bridge).await?;
        let ports: Vec<nl::Link> = match bridge {
            Some(b) => nl::links(h)
                .await?
                .into_iter()
                .filter(|l| l.controller == Some(b.index) && is_our_veth_name(&l.name))
                .collect(),
            None => Vec::new(),
        };
        ids.extend(ports.iter().filter_map(|l| l.alias.clone()));
        ids.retain(|i| !i.is_empty());
        Ok((ids, ports))
    }

    /// Remove the node-wide parts: the nftables table and the bridge, both attempted (the
    /// first failure is returned). Sandboxes are the caller's to tear down first (their records
    /// and IPs stay otherwise).
    pub(crate) async fn uninstall(&self) -> Result<()> {
        let mut first_err = None;
        if let Err(e) = self.nft.delete_table().await {
            warn!(table = %self.cfg.nft_table, error = %chain(&e), "removing the nftables table failed");
            first_err = Some(e);
        }
        let bridge = async {
            let h = netns::node_handle()?;
            if let Some(l) = nl::link_by_name(&h, &self.cfg.bridge).await? {
                nl::del_link(&h, l.index, &self.cfg.bridge).await?;
                info!(bridge = %self.cfg.bridge, "bridge deleted");
            }
            Ok::<_, Error>(())
        };
        if let Err(e) = bridge.await {
            warn!(bridge = %self.cfg.bridge, error = %chain(&e), "removing the bridge failed");
            first_err.get_or_insert(e);
        }
        *self.bridge_ok.lock().unwrap_or_else(|e| e.into_inner()) = None;
        first_err.map_or(Ok(()), Err)
    }

    pub(crate) async fn gc_candidates(&self) -> Result<BTreeSet<String>> {
        let h = netns::node_handle()?;
        Ok(self.known_ids(&h).await?.0)
    }

    /// After the non-live sandboxes were torn down: delete veths on our bridge that no live
    /// sandbox owns (a crash before they were labelled) and hostPort elements whose pod IP is
    /// not allocated to a live sandbox. IP files that name no sandbox (torn, garbage) are
    /// released when no sandbox is live (the IP can be no one's); while some are, they stay
    /// allocated, and the first is returned as an error after everything else was done.
    pub(crate) async fn gc_sweep(&self, live: &HashSet<&str>) -> Result<()> {
        let h = netns::node_handle()?;
        let (_, ports) = self.known_ids(&h).await?;
        let live_veths: HashSet<String> = live.iter().map(|i| veth_name(i)).collect();
        for l in ports {
            if !live_veths.contains(&l.name)
                && l.alias.as_deref().is_none_or(|a| !live.contains(a))
                && nl::del_link(&h, l.index, &l.name).await?
            {
                info!(veth = %l.name, "gc deleted unowned veth");
            }
        }
        let mut stale = Vec::new();
        for e in self.nft.list().await? {
            let keep = match self.ipam.holder(e.pod_ip) {
                Some(ipam::Holder::Sandbox(o)) => live.contains(o.as_str()),
                // maybe a live sandbox's
                Some(ipam::Holder::Unreadable(_)) => !live.is_empty(),
                None => false,
            };
            if !keep {
                stale.push(e);
            }
        }
        if !stale.is_empty() {
            self.nft.remove(&stale).await?;
            info!(count = stale.len(), "gc removed stale hostPort elements");
        }
        let mut first_err = None;
        for (ip, _) in self.ipam.scan()?.unreadable {
            if live.is_empty() {
                self.ipam.release_unreadable(ip)?;
            } else if let Err(e) = self.ipam.owner(ip) {
                warn!(%ip, error = %chain(&e), "gc keeps an IP whose allocation names no sandbox while sandboxes are live");
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn veth_names_are_short_stable_and_ours() {
        let a = veth_name("0123456789abcdef0123456789abcdef");
        assert_eq!(a.len(), 12);
        assert!(a.len() <= 15);
        assert_eq!(a, veth_name("0123456789abcdef0123456789abcdef"));
        assert_ne!(a, veth_name("0123456789abcdef0123456789abcdee"));
        assert!(is_our_veth_name(&a));
        assert!(!is_our_veth_name("eth0"));
        assert!(!is_our_veth_name("vethzzzzzzzz"));
    }

    #[test]
    fn subnet_overlap() {
        let n = |s: &str| s.parse::<IpNet>().unwrap();
        assert!(overlaps(&n("10.88.0.0/16"), &n("10.88.5.0/24")));
        assert!(overlaps(&n("10.0.0.0/8"), &n("10.88.0.0/16")));
        assert!(!overlaps(&n("10.88.0.0/16"), &n("10.89.0.0/16")));
        assert!(!overlaps(&n("192.0.2.0/24"), &n("10.88.0.0/16")));
    }
}
