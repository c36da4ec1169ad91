//! The pod network as the agent uses it: builds a [`NetPlug`] from the configuration (the
//! built-in bridge, CNI, or none), attaches pod sandboxes to it and detaches them by sandbox
//! id. It knows sandboxes only by id: which ones are live, its owner tells it. Like
//! kubelet's network plugin, a network that is not ready (no CNI config yet, a bad one, a
//! subnet that overlaps a node route) does not stop the agent: pods needing it wait in
//! ContainerCreating with the reason, hostNetwork pods run, and the next sync retries.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use ferrolet_netplug::{Bandwidth, BridgeConfig, CniConfig, Mode, NetPlug, PortMapping, Protocol, SandboxNetwork};
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::config::{Config, NetworkMode};
use crate::pod;

/// The settings a network was built with; recorded in agent.json so `ferrolet reset` can tear
/// the same network down.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSettings {
    /// "bridge", "cni" or "none".
    pub mode: String,
    pub bridge: String,
    pub subnet: String,
    pub cni_conf_dir: PathBuf,
    pub cni_bin_dirs: Vec<PathBuf>,
    pub state_dir: PathBuf,
}

impl NetworkSettings {
    pub fn from_config(cfg: &Config) -> NetworkSettings {
        let n = &cfg.network;
        let (mode, state) = match n.mode {
            NetworkMode::Bridge => ("bridge", "network"),
            NetworkMode::Cni => ("cni", "cni"),
            NetworkMode::None => ("none", "network"),
        };
        NetworkSettings {
            mode: mode.into(),
            bridge: n.bridge.clone(),
            // kubelet's podCIDR, when given, is the pod subnet.
            subnet: cfg.pod_cidr.clone().unwrap_or_else(|| n.subnet.clone()),
            cni_conf_dir: n.cni_conf_dir.clone(),
            cni_bin_dirs: n.cni_bin_dirs.clone(),
            state_dir: cfg.root_dir.join(state),
        }
    }

    fn netplug_mode(&self) -> Result<Option<Mode>> {
        Ok(match self.mode.as_str() {
            "bridge" => {
                let subnet = self
                    .subnet
                    .parse()
                    .map_err(|e| anyhow!("podCIDR / ferrolet.podSubnet {:?}: {e}", self.subnet))?;
                Some(Mode::Bridge(BridgeConfig {
                    bridge: self.bridge.clone(),
                    subnet,
                    state_dir: self.state_dir.clone(),
                    ..BridgeConfig::default()
                }))
            }
            "cni" => Some(Mode::Cni(CniConfig {
                conf_dir: self.cni_conf_dir.clone(),
                bin_dirs: self.cni_bin_dirs.clone(),
                state_dir: self.state_dir.clone(),
                ..CniConfig::default()
            })),
            _ => None,
        })
    }
}

/// Lists the sandboxes that exist (their ids), for collecting what gone ones left behind.
pub type LiveSandboxes = Arc<dyn Fn() -> Vec<String> + Send + Sync>;

/// Why the pod network is not ready, in kubelet's words for the Node's Ready condition
/// (`container runtime network not ready: NetworkReady=false ...`); None while it is ready (or
/// not yet tried, or off). Shared with the node's status loop, which exists before the network.
#[derive(Clone, Default)]
pub struct NetworkStatus(Arc<std::sync::RwLock<Option<String>>>);

impl NetworkStatus {
    pub fn not_ready(&self) -> Option<String> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, why: Option<String>) {
        let mut cur = self.0.write().unwrap_or_else(|e| e.into_inner());
        if *cur != why {
            match &why {
                Some(w) => warn!(reason = %w, "the pod network is not ready"),
                None if cur.is_some() => info!("the pod network is ready again"),
                None => {}
            }
            *cur = why;
        }
    }
}

/// The Node's Ready message for a network that is not, in kubelet's words.
fn not_ready_message(e: &anyhow::Error) -> String {
    format!(
        "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: {e:#}"
    )
}

/// The agent's pod network.
pub struct PodNetwork {
    settings: NetworkSettings,
    live: LiveSandboxes,
    plug: tokio::sync::Mutex<Option<Arc<NetPlug>>>,
    status: NetworkStatus,
}

impl PodNetwork {
    pub fn new(cfg: &Config, live: LiveSandboxes, status: NetworkStatus) -> PodNetwork {
        PodNetwork {
            settings: NetworkSettings::from_config(cfg),
            live,
            plug: tokio::sync::Mutex::new(None),
            status,
        }
    }

    /// kubelet's syncNetworkStatus, every few seconds: a network not built yet is tried again,
    /// one built loads its configuration again (a CNI config changed in place is used by the
    /// next pods, one that cannot be used makes the node NotReady), and the Node's Ready
    /// condition follows.
    pub async fn recheck(&self) {
        if !self.enabled() {
            return;
        }
        let built = self.plug.lock().await.clone();
        let Some(plug) = built else {
            let _ = self.plug().await;
            return;
        };
        match plug.reload().await {
            Ok(_) => self.status.set(None),
            Err(e) => self.status.set(Some(not_ready_message(
                &anyhow::Error::new(e).context(format!("network {} not ready", self.settings.mode)),
            ))),
        }
    }

    pub fn settings(&self) -> &NetworkSettings {
        &self.settings
    }

    /// Pods get a network (mode bridge or cni).
    pub fn enabled(&self) -> bool {
        self.settings.mode != "none"
    }

    /// The network, built on first use. The first build also collects what sandboxes that no
    /// longer exist left behind (IPs, interfaces, hostPorts): every sandbox the owner lists is
    /// live, and no setup can run concurrently because setups wait for this build.
    pub async fn plug(&self) -> Result<Arc<NetPlug>> {
        let mut guard = self.plug.lock().await;
        if let Some(p) = guard.as_ref() {
            return Ok(p.clone());
        }
        let Some(mode) = self.settings.netplug_mode()? else {
            bail!("pod networking is off (ferrolet.network: none)");
        };
        let plug = match NetPlug::new(mode).await {
            Ok(p) => Arc::new(p),
            Err(e) => {
                let e = anyhow::Error::new(e).context(format!("network {} not ready", self.settings.mode));
                self.status.set(Some(not_ready_message(&e)));
                return Err(e);
            }
        };
        self.status.set(None);
        if let Err(e) = self.gc_dead(&plug).await {
            warn!(error = %format!("{e:#}"), "collecting stale pod networks");
        }
        info!(mode = plug.mode_name(), "pod network ready");
        *guard = Some(plug.clone());
        Ok(plug)
    }

    /// Release what sandboxes that are not live (no readable record) hold: their IPs, interfaces
    /// and hostPorts. For a pod whose sandbox record became unreadable.
    pub async fn collect_garbage(&self) -> Result<Vec<String>> {
        let plug = self.plug().await?;
        self.gc_dead(&plug).await
    }

    /// Tear down every sandbox network whose sandbox the owner does not list as live.
    async fn gc_dead(&self, plug: &NetPlug) -> Result<Vec<String>> {
        let list = self.live.clone();
        let live = ferrolet_fsutil::spawn_blocking(move || list())
            .await
            .context("listing live sandboxes")?;
        let ids = plug.gc(&live).await.context("collecting stale pod networks")?;
        if !ids.is_empty() {
            info!(count = ids.len(), sandboxes = ?ids, "collected the network of sandboxes that no longer exist");
        }
        Ok(ids)
    }

    /// Build the network at agent start, so leftovers are collected even with no pods; a
    /// network that is not ready is logged and retried with the first pod.
    pub async fn init(&self) {
        if self.enabled() {
            if let Err(e) = self.plug().await {
                warn!(error = %format!("{e:#}"), "pod network not ready; pods needing it will wait");
            }
        }
    }

    /// Attach a sandbox's network namespace; returns the pod's IPs (primary first).
    pub async fn attach(&self, sandbox_id: &str, netns: &Path, p: &Pod) -> Result<Vec<String>> {
        let req = SandboxNetwork {
            sandbox_id: sandbox_id.to_string(),
            netns: netns.to_path_buf(),
            ifname: "eth0".into(),
            pod_name: pod::name(p).to_string(),
            pod_namespace: pod::namespace(p).to_string(),
            pod_uid: pod::uid(p).to_string(),
            port_mappings: port_mappings(p)?,
            bandwidth: bandwidth(p)?,
            requested_ips: Vec::new(),
        };
        self.set_up(&req, &pod::full_name(p)).await
    }

    /// Attach a sandbox built before its pod is known ([`super::pool`]): no hostPorts, no
    /// bandwidth limits, no pod names. Only the built-in bridge takes such a sandbox: CNI
    /// plugins are told the pod at ADD and may act on it.
    pub async fn attach_pooled(&self, sandbox_id: &str, netns: &Path) -> Result<Vec<String>> {
        self.set_up(&SandboxNetwork::new(sandbox_id, netns), "(the sandbox pool)")
            .await
    }

    async fn set_up(&self, req: &SandboxNetwork, pod: &str) -> Result<Vec<String>> {
        let plug = self.plug().await?;
        let t = std::time::Instant::now();
        let sandbox_id = &req.sandbox_id;
        let st = plug
            .setup(req)
            .await
            .with_context(|| format!("failed to set up the network of sandbox {sandbox_id}"))?;
        let ips: Vec<String> = st.ips.iter().map(IpAddr::to_string).collect();
        info!(
            pod,
            sandbox = %sandbox_id,
            ips = ?ips,
            mode = plug.mode_name(),
            ms = t.elapsed().as_millis() as u64,
            "pod network attached"
        );
        Ok(ips)
    }

    /// Detach a sandbox (from its persisted record: works after a crash or a reboot).
    pub async fn detach(&self, sandbox_id: &str) -> Result<()> {
        let plug = self.plug().await?;
        plug.teardown_by_id(sandbox_id)
            .await
            .with_context(|| format!("tearing down the network of sandbox {sandbox_id}"))?;
        info!(sandbox = sandbox_id, "pod network detached");
        Ok(())
    }
}

/// `ferrolet reset`: tear down every sandbox's network and what the network put on the node.
pub async fn remove_all(settings: &NetworkSettings) -> Result<()> {
    let Some(mode) = settings.netplug_mode()? else {
        return Ok(());
    };
    let plug = NetPlug::new(mode)
        .await
        .with_context(|| format!("network {}", settings.mode))?;
    let ids = plug.gc(&[]).await.context("tearing down pod networks")?;
    plug.uninstall()
        .await
        .context("removing the pod network from the node")?;
    info!(sandboxes = ids.len(), mode = plug.mode_name(), "pod network removed");
    Ok(())
}

/// hostPort mappings of the pod's containers (kubelet takes them from spec.containers).
pub fn port_mappings(p: &Pod) -> Result<Vec<PortMapping>> {
    let mut out = Vec::new();
    for (ci, c) in pod::containers(p).iter().enumerate() {
        for (pi, port) in c.ports.iter().flatten().enumerate() {
            let Some(host_port) = port.host_port.filter(|h| *h > 0) else {
                continue;
            };
            let field = format!("spec.containers[{ci}].ports[{pi}]");
            let protocol = match port.protocol.as_deref().unwrap_or("TCP") {
                "TCP" => Protocol::Tcp,
                "UDP" => Protocol::Udp,
                "SCTP" => Protocol::Sctp,
                o => bail!("{field}.protocol: unsupported value {o:?}: supported values: \"SCTP\", \"TCP\", \"UDP\""),
            };
            let host_ip = match port.host_ip.as_deref().filter(|s| !s.is_empty()) {
                Some(s) => Some(
                    s.parse::<IpAddr>()
                        .map_err(|_| anyhow!("{field}.hostIP: {s:?} is not a valid IP address"))?,
                ),
                None => None,
            };
            let port_u16 = |v: i32, f: &str| {
                u16::try_from(v)
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| anyhow!("{field}.{f}: {v} must be between 1 and 65535"))
            };
            out.push(PortMapping {
                host_port: port_u16(host_port, "hostPort")?,
                container_port: port_u16(port.container_port, "containerPort")?,
                protocol,
                host_ip,
            });
        }
    }
    Ok(out)
}

/// kubelet's bandwidth annotations, in bits per second; bursts unlimited as kubelet passes them.
pub fn bandwidth(p: &Pod) -> Result<Option<Bandwidth>> {
    let ann = p.metadata.annotations.as_ref();
    let get = |key: &str| -> Result<u64> {
        let Some(v) = ann.and_then(|a| a.get(key)) else {
            return Ok(0);
        };
        let q = crate::pod::units::parse_quantity(v).map_err(|e| anyhow!("metadata.annotations[{key}]: {e}"))?;
        if q < 1e3 {
            bail!("metadata.annotations[{key}]: resource is unreasonably small (< 1kbit)");
        }
        if q > 1e15 {
            bail!("metadata.annotations[{key}]: resource is unreasonably large (> 1Pbit)");
        }
        Ok(q as u64)
    };
    let ingress = get("kubernetes.io/ingress-bandwidth")?;
    let egress = get("kubernetes.io/egress-bandwidth")?;
    if ingress == 0 && egress == 0 {
        return Ok(None);
    }
    let burst = |rate: u64| if rate > 0 { i32::MAX as u64 } else { 0 };
    Ok(Some(Bandwidth {
        ingress_rate: ingress,
        ingress_burst: burst(ingress),
        egress_rate: egress,
        egress_burst: burst(egress),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn host_ports_from_containers() {
        let p = pod(serde_json::json!({"metadata":{"name":"a"},"spec":{"containers":[
            {"name":"c","ports":[{"containerPort":80,"hostPort":8080},{"containerPort":81},
             {"containerPort":53,"hostPort":5353,"protocol":"UDP","hostIP":"127.0.0.1"}]}]}}));
        let m = port_mappings(&p).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].host_port, m[0].container_port, m[0].protocol),
            (8080, 80, Protocol::Tcp)
        );
        assert_eq!(m[1].protocol, Protocol::Udp);
        assert_eq!(m[1].host_ip, Some("127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn bad_host_port_names_the_field() {
        let p = pod(serde_json::json!({"metadata":{"name":"a"},"spec":{"containers":[
            {"name":"c","ports":[{"containerPort":80,"hostPort":8080,"hostIP":"nope"}]}]}}));
        let e = port_mappings(&p).unwrap_err().to_string();
        assert!(e.contains("spec.containers[0].ports[0].hostIP"), "{e}");
    }

    #[test]
    fn bandwidth_annotations() {
        let p = pod(serde_json::json!({"metadata":{"name":"a","annotations":{
            "kubernetes.io/ingress-bandwidth":"10M"}},"spec":{"containers":[]}}));
        let b = bandwidth(&p).unwrap().unwrap();
        assert_eq!(b.ingress_rate, 10_000_000);
        assert_eq!(b.egress_rate, 0);
        let small = pod(serde_json::json!({"metadata":{"name":"a","annotations":{
            "kubernetes.io/egress-bandwidth":"10"}},"spec":{"containers":[]}}));
        assert!(bandwidth(&small)
            .unwrap_err()
            .to_string()
            .contains("unreasonably small"));
        assert!(bandwidth(&pod(
            serde_json::json!({"metadata":{"name":"a"},"spec":{"containers":[]}})
        ))
        .unwrap()
        .is_none());
    }

    #[test]
    fn pod_cidr_overrides_the_subnet() {
        let cfg = Config {
            pod_cidr: Some("10.1.2.0/24".into()),
            ..Config::default()
        };
        let s = NetworkSettings::from_config(&cfg);
        assert_eq!(s.subnet, "10.1.2.0/24");
        assert_eq!(s.state_dir, cfg.root_dir.join("network"));
    }
}
