//! Reading a CNI result (0.3.x / 0.4.0 / 1.0.0 share the shape we need): the pod's IPs are
//! `ips[].address`, preferring those on the interface inside the sandbox; the interface is the
//! one whose `sandbox` is set.

use std::net::IpAddr;

use serde_json::Value;

use crate::types::NetworkStatus;

/// The status a final result describes; `ifname` is the requested name, used when the result
/// lists no sandbox interface.
pub(crate) fn status_from_result(result: &Value, ifname: &str) -> NetworkStatus {
    let interfaces = result["interfaces"].as_array().cloned().unwrap_or_default();
    let sandbox_if = interfaces
        .iter()
        .enumerate()
        .filter(|(_, i)| i["sandbox"].as_str().is_some_and(|s| !s.is_empty()))
        .find(|(_, i)| i["name"].as_str() == Some(ifname))
        .or_else(|| {
            interfaces
                .iter()
                .enumerate()
                .find(|(_, i)| i["sandbox"].as_str().is_some_and(|s| !s.is_empty()))
        });
    let ips_raw = result["ips"].as_array().cloned().unwrap_or_default();
    let on_sandbox: Vec<&Value> = match sandbox_if {
        Some((idx, _)) => ips_raw
            .iter()
            .filter(|ip| ip["interface"].as_u64() == Some(idx as u64))
            .collect(),
        None => Vec::new(),
    };
    let chosen: Vec<&Value> = if on_sandbox.is_empty() {
        ips_raw.iter().collect()
    } else {
        on_sandbox
    };
    let parse_addr = |v: &Value| -> Option<IpAddr> {
        let s = v["address"].as_str()?;
        s.split('/').next()?.parse().ok()
    };
    let ips: Vec<IpAddr> = chosen.iter().filter_map(|v| parse_addr(v)).collect();
    let gateway = chosen
        .iter()
        .find_map(|v| v["gateway"].as_str().and_then(|g| g.parse().ok()));
    NetworkStatus {
        ips,
        interface: sandbox_if
            .and_then(|(_, i)| i["name"].as_str())
            .unwrap_or(ifname)
            .to_string(),
        gateway,
        mac: sandbox_if
            .and_then(|(_, i)| i["mac"].as_str())
            .filter(|m| !m.is_empty())
            .map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bridge_plugin_result() {
        let r = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "aa:aa:aa:aa:aa:aa"},
                {"name": "veth1234", "mac": "bb:bb:bb:bb:bb:bb"},
                {"name": "eth0", "mac": "cc:cc:cc:cc:cc:cc", "sandbox": "/run/netns/p"}
            ],
            "ips": [{"address": "10.22.0.5/16", "gateway": "10.22.0.1", "interface": 2}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        });
        let s = status_from_result(&r, "eth0");
        assert_eq!(s.ips, vec!["10.22.0.5".parse::<IpAddr>().unwrap()]);
        assert_eq!(s.interface, "eth0");
        assert_eq!(s.gateway, Some("10.22.0.1".parse().unwrap()));
        assert_eq!(s.mac.as_deref(), Some("cc:cc:cc:cc:cc:cc"));
    }

    #[test]
    fn v031_result_without_interfaces() {
        let r = json!({
            "cniVersion": "0.3.1",
            "ips": [{"version": "4", "address": "10.1.2.3/24"}, {"version": "6", "address": "fd00::3/64", "gateway": "fd00::1"}]
        });
        let s = status_from_result(&r, "net1");
        assert_eq!(s.ips.len(), 2);
        assert_eq!(s.interface, "net1");
        assert_eq!(s.gateway, Some("fd00::1".parse().unwrap()));
        assert_eq!(s.mac, None);
    }
}
