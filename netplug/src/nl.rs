//! rtnetlink helpers: links, addresses, routes and sysctls, each error naming the interface or
//! address it was about. Every function takes the [`Handle`] of the namespace to act in.

use std::net::IpAddr;
use std::path::PathBuf;

use futures_util::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_core::{NetlinkMessage, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST};
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};

use crate::error::{Context, Error, NlContext, Result};
use crate::types::format_mac;

/// What we need to know of a link.
#[derive(Debug, Clone, Default)]
pub(crate) struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: Option<u32>,
    pub mac: Option<String>,
    pub controller: Option<u32>,
    pub alias: Option<String>,
    pub kind: Option<String>,
    pub up: bool,
}

impl Link {
    fn from_msg(msg: &LinkMessage) -> Link {
        let mut l = Link {
            index: msg.header.index,
            up: msg.header.flags.contains(LinkFlags::Up),
            ..Default::default()
        };
        for a in &msg.attributes {
            match a {
                LinkAttribute::IfName(n) => l.name = n.clone(),
                LinkAttribute::Mtu(m) => l.mtu = Some(*m),
                LinkAttribute::Address(b) if b.len() == 6 => l.mac = Some(format_mac(b)),
                LinkAttribute::Controller(c) => l.controller = Some(*c),
                LinkAttribute::IfAlias(s) => l.alias = Some(s.clone()),
                LinkAttribute::LinkInfo(infos) => {
                    for i in infos {
                        if let LinkInfo::Kind(k) = i {
                            l.kind = Some(k.to_string());
                        }
                    }
                }
                _ => {}
            }
        }
        l
    }
}

/// The link named `name`, if it exists.
pub(crate) async fn link_by_name(h: &Handle, name: &str) -> Result<Option<Link>> {
    let mut s = h.link().get().match_name(name.to_string()).execute();
    match s.try_next().await {
        Ok(Some(msg)) => Ok(Some(Link::from_msg(&msg))),
        Ok(None) => Ok(None),
        Err(e) => {
            let e = Err::<(), _>(e)
                .context(format!("looking up interface {name}"))
                .unwrap_err();
            if e.is_not_found() {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

/// Every link of the namespace.
pub(crate) async fn links(h: &Handle) -> Result<Vec<Link>> {
    let msgs: Vec<LinkMessage> = h
        .link()
        .get()
        .execute()
        .try_collect()
        .await
        .context("listing interfaces")?;
    Ok(msgs.iter().map(Link::from_msg).collect())
}

/// Send a RTM_NEWLINK with NLM_F_CREATE|NLM_F_EXCL.
pub(crate) async fn create_link(h: &Handle, msg: LinkMessage, what: &str) -> Result<()> {
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewLink(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    request_ack(h, req, what).await
}

/// Send a request and wait for its ack; the error names `what`.
pub(crate) async fn request_ack(h: &Handle, req: NetlinkMessage<RouteNetlinkMessage>, what: &str) -> Result<()> {
    let mut h = h.clone();
    let mut resp = h.request(req).context(what.to_string())?;
    use futures_util::StreamExt;
    while let Some(msg) = resp.next().await {
        if let netlink_packet_core::NetlinkPayload::Error(err) = msg.payload {
            if err.code.is_some() {
                return Err(rtnetlink::Error::NetlinkError(err)).context(what.to_string());
            }
        }
    }
    Ok(())
}

/// Apply a RTM_SETLINK built from `msg`.
pub(crate) async fn set_link(h: &Handle, msg: LinkMessage, what: &str) -> Result<()> {
    h.link().set(msg).execute().await.context(what.to_string())
}

pub(crate) async fn set_up(h: &Handle, index: u32, name: &str) -> Result<()> {
    set_link(
        h,
        LinkUnspec::new_with_index(index).up().build(),
        &format!("setting interface {name} up"),
    )
    .await
}

/// Delete a link; a link that is already gone is fine. Returns whether it existed.
pub(crate) async fn del_link(h: &Handle, index: u32, name: &str) -> Result<bool> {
    match h
        .link()
        .del(index)
        .execute()
        .await
        .context(format!("deleting interface {name}"))
    {
        Ok(()) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Add `ip/prefix` to a link; an address already there is fine. IPv6 addresses skip duplicate
/// address detection (the IPAM guarantees uniqueness; DAD would leave the address unusable for
/// about a second).
pub(crate) async fn add_addr(h: &Handle, index: u32, name: &str, ip: IpAddr, prefix: u8) -> Result<()> {
    let mut req = h.address().add(index, ip, prefix);
    if ip.is_ipv6() {
        req.message_mut().attributes.push(AddressAttribute::Flags(
            netlink_packet_route::address::AddressFlags::Nodad,
        ));
    }
    match req
        .execute()
        .await
        .context(format!("adding address {ip}/{prefix} to {name}"))
    {
        Err(e) if e.is_exists() => Ok(()),
        other => other,
    }
}

/// Addresses of a link (or of all links when `index` is None): (ifindex, ip, prefix).
pub(crate) async fn addrs(h: &Handle, index: Option<u32>) -> Result<Vec<(u32, IpAddr, u8)>> {
    let mut req = h.address().get();
    if let Some(i) = index {
        req = req.set_link_index_filter(i);
    }
    let msgs: Vec<_> = req.execute().try_collect().await.context("listing addresses")?;
    let mut out = Vec::new();
    for m in msgs {
        for a in &m.attributes {
            if let AddressAttribute::Address(ip) = a {
                out.push((m.header.index, *ip, m.header.prefix_len));
            }
        }
    }
    Ok(out)
}

/// Add the default route via `gw` (on-link through `index`); an existing one is fine.
pub(crate) async fn add_default_route(h: &Handle, index: u32, name: &str, gw: IpAddr) -> Result<()> {
    let msg = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(
            if gw.is_ipv4() {
                IpAddr::V4(0.into())
            } else {
                IpAddr::V6(0.into())
            },
            0,
        )
        .and_then(|b| b.gateway(gw))
        .map_err(|e| Error::invalid_config("gateway", format!("{gw}: {e}")))?
        .output_interface(index)
        .build();
    match h
        .route()
        .add(msg)
        .execute()
        .await
        .context(format!("adding default route via {gw} dev {name}"))
    {
        Err(e) if e.is_exists() => Ok(()),
        other => other,
    }
}

/// A route of the main table.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
}

/// Unicast routes of the main table of one family.
pub(crate) async fn routes(h: &Handle, v6: bool) -> Result<Vec<Route>> {
    let mut msg = RouteMessage::default();
    msg.header.address_family = if v6 { AddressFamily::Inet6 } else { AddressFamily::Inet };
    let msgs: Vec<RouteMessage> = h
        .route()
        .get(msg)
        .execute()
        .try_collect()
        .await
        .context("listing routes")?;
    let mut out = Vec::new();
    for m in msgs {
        let table = m
            .attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Table(t) => Some(*t),
                _ => None,
            })
            .unwrap_or(m.header.table as u32);
        if table != RouteHeader::RT_TABLE_MAIN as u32 || m.header.kind != RouteType::Unicast {
            continue;
        }
        let mut dst: Option<IpAddr> = None;
        let mut gateway = None;
        let mut oif = None;
        for a in &m.attributes {
            match a {
                RouteAttribute::Destination(RouteAddress::Inet(a)) => dst = Some((*a).into()),
                RouteAttribute::Destination(RouteAddress::Inet6(a)) => dst = Some((*a).into()),
                RouteAttribute::Gateway(RouteAddress::Inet(a)) => gateway = Some((*a).into()),
                RouteAttribute::Gateway(RouteAddress::Inet6(a)) => gateway = Some((*a).into()),
                RouteAttribute::Oif(i) => oif = Some(*i),
                _ => {}
            }
        }
        let dst = dst.unwrap_or(if v6 { IpAddr::V6(0.into()) } else { IpAddr::V4(0.into()) });
        if let Ok(net) = IpNet::new(dst, m.header.destination_prefix_length) {
            out.push(Route { dst: net, gateway, oif });
        }
    }
    Ok(out)
}

/// Write a sysctl, `rel` being its path under /proc/sys ("net/ipv4/ip_forward"), in the calling
/// thread's network namespace (for the node namespace: any thread of the process, as none of
/// them ever leaves it). Nothing is written when the value is already set.
pub(crate) fn write_sysctl(rel: &str, value: &str) -> Result<()> {
    let path = PathBuf::from("/proc/sys").join(rel);
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current.trim() == value {
        return Ok(());
    }
    Ok(std::fs::write(&path, value).with_context(|| format!("setting sysctl {rel}={value}"))?)
}
