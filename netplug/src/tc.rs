//! Bandwidth limits of the bridge mode, with a token bucket (TBF) root qdisc, over netlink:
//! - traffic into the pod: TBF on the host end of the veth (its egress is the pod's ingress);
//! - traffic out of the pod: TBF on the pod's interface, inside the pod's namespace. A pod
//!   without CAP_NET_ADMIN can not change it, and no ifb device or redirect is needed.
//!
//! The TBF options are encoded here (netlink-packet-route does not model them): TCA_TBF_PARMS
//! (struct tc_tbf_qopt), TCA_TBF_RATE64 when the rate does not fit 32 bits, TCA_TBF_BURST.

use futures_util::TryStreamExt;
use netlink_packet_core::{DefaultNla, NetlinkMessage, NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST};
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcHeader, TcMessage, TcOption};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::Handle;

use crate::error::{NlContext, Result};
use crate::nl;

const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;

/// Queue latency allowed on top of the burst, as the CNI bandwidth plugin does (25 ms).
const LATENCY_MS: u64 = 25;

/// The TBF settings for `rate` bits/s and `burst` bits on a link of `mtu`: (rate bytes/s,
/// burst bytes, queue limit bytes). The burst is raised to one full frame when smaller (a
/// packet larger than the bucket could never be sent), and defaults to 100 ms of traffic.
pub(crate) fn tbf_params(rate_bits: u64, burst_bits: u64, mtu: u32) -> (u64, u32, u32) {
    let rate = (rate_bits / 8).max(1);
    let min_burst = mtu as u64 + 14;
    let burst = if burst_bits == 0 { rate / 10 } else { burst_bits / 8 };
    let burst = burst.clamp(min_burst, u32::MAX as u64);
    let limit = (rate * LATENCY_MS / 1000 + burst).min(u32::MAX as u64);
    (rate, burst as u32, limit as u32)
}

/// The TCA_OPTIONS of a TBF qdisc.
pub(crate) fn tbf_options(rate: u64, burst: u32, limit: u32) -> Vec<TcOption> {
    // struct tc_ratespec { u8 cell_log; u8 linklayer; u16 overhead; i16 cell_align; u16 mpu; u32 rate; }
    let mut parms = Vec::with_capacity(36);
    let ratespec = |buf: &mut Vec<u8>, rate: u32| {
        buf.push(0); // cell_log
        buf.push(1); // linklayer: TC_LINKLAYER_ETHERNET
        buf.extend_from_slice(&0u16.to_ne_bytes()); // overhead
        buf.extend_from_slice(&(-1i16).to_ne_bytes()); // cell_align
        buf.extend_from_slice(&0u16.to_ne_bytes()); // mpu
        buf.extend_from_slice(&rate.to_ne_bytes());
    };
    ratespec(&mut parms, rate.min(u32::MAX as u64) as u32);
    ratespec(&mut parms, 0); // peakrate: none
    parms.extend_from_slice(&limit.to_ne_bytes());
    parms.extend_from_slice(&0u32.to_ne_bytes()); // buffer: given by TCA_TBF_BURST
    parms.extend_from_slice(&0u32.to_ne_bytes()); // mtu: only for peakrate
    let mut opts = vec![TcOption::Other(DefaultNla::new(TCA_TBF_PARMS, parms))];
    if rate > u32::MAX as u64 {
        opts.push(TcOption::Other(DefaultNla::new(
            TCA_TBF_RATE64,
            rate.to_ne_bytes().to_vec(),
        )));
    }
    opts.push(TcOption::Other(DefaultNla::new(
        TCA_TBF_BURST,
        burst.to_ne_bytes().to_vec(),
    )));
    opts
}

/// Put (or replace) a TBF root qdisc on link `index`.
pub(crate) async fn set_tbf(
    h: &Handle,
    index: u32,
    name: &str,
    rate_bits: u64,
    burst_bits: u64,
    mtu: u32,
) -> Result<()> {
    let (rate, burst, limit) = tbf_params(rate_bits, burst_bits, mtu);
    let header = TcHeader {
        family: AddressFamily::Unspec,
        index: index as i32,
        handle: TcHandle { major: 1, minor: 0 },
        parent: TcHandle::ROOT,
        info: 0,
    };
    let msg = TcMessage::from_parts(
        header,
        vec![
            TcAttribute::Kind("tbf".into()),
            TcAttribute::Options(tbf_options(rate, burst, limit)),
        ],
    );
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewQueueDiscipline(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
    nl::request_ack(
        h,
        req,
        &format!("setting bandwidth limit {rate_bits} bit/s (burst {burst} bytes) on {name}"),
    )
    .await?;
    tracing::info!(interface = name, rate_bits, burst_bytes = burst, "bandwidth limit set");
    Ok(())
}

/// The kind of the root qdisc of link `index` ("tbf", "noqueue", ...), if any.
pub(crate) async fn root_qdisc_kind(h: &Handle, index: u32) -> Result<Option<String>> {
    let msgs: Vec<TcMessage> = h
        .qdisc()
        .get()
        .index(index as i32)
        .execute()
        .try_collect()
        .await
        .context("listing qdiscs")?;
    Ok(msgs
        .iter()
        .filter(|m| m.header.index == index as i32 && m.header.parent == TcHandle::ROOT)
        .find_map(|m| {
            m.attributes.iter().find_map(|a| match a {
                TcAttribute::Kind(k) => Some(k.clone()),
                _ => None,
            })
        }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::Nla;

    #[test]
    fn params_from_bits() {
        // 8 Mbit/s, 1 Mbit burst
        assert_eq!(tbf_params(8_000_000, 1_000_000, 1500), (1_000_000, 125_000, 150_000));
        // burst below one frame is raised
        assert_eq!(tbf_params(8_000_000, 8, 1500).1, 1514);
        // no burst: 100 ms worth
        assert_eq!(tbf_params(80_000_000, 0, 1500).1, 1_000_000);
    }

    #[test]
    fn options_encoding() {
        let opts = tbf_options(1_000_000, 125_000, 150_000);
        assert_eq!(opts.len(), 2);
        assert_eq!(opts[0].kind(), TCA_TBF_PARMS);
        assert_eq!(opts[0].value_len(), 36);
        let mut buf = vec![0u8; 36];
        opts[0].emit_value(&mut buf);
        assert_eq!(u32::from_ne_bytes(buf[8..12].try_into().unwrap()), 1_000_000);
        assert_eq!(u32::from_ne_bytes(buf[24..28].try_into().unwrap()), 150_000);
        assert_eq!(opts[1].kind(), TCA_TBF_BURST);
        // above 4 GB/s the 64-bit rate is added
        let opts = tbf_options(5_000_000_000, 1514, 2000);
        assert_eq!(opts[1].kind(), TCA_TBF_RATE64);
    }
}
