//! The agent's configuration: built-in defaults that work on a fresh machine, then a
//! KubeletConfiguration file (`--config`), then flags with kubelet's names. Later wins.

mod file;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

pub use file::apply_file;

/// Where pod networking comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkMode {
    /// The built-in bridge, veth pairs and IPAM.
    Bridge,
    /// CNI plugins from the CNI config and bin directories.
    Cni,
    /// No pod network: pods get loopback only (hostNetwork pods still work).
    None,
}

#[derive(Debug, Clone)]
pub struct NetworkConfig {
    pub mode: NetworkMode,
    pub bridge: String,
    /// The pod subnet; kubelet's podCIDR when set.
    pub subnet: String,
    pub cni_conf_dir: PathBuf,
    pub cni_bin_dirs: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub node_name: String,
    pub root_dir: PathBuf,
    pub static_pod_path: Option<PathBuf>,
    pub static_pod_url: Option<String>,
    pub static_pod_url_headers: Vec<(String, String)>,
    pub file_check_frequency: Duration,
    pub http_check_frequency: Duration,
    pub sync_frequency: Duration,
    /// Absolute cgroup path under which `kubepods` lives; empty means the cgroup the agent was
    /// started in (safe on shared machines and under systemd with Delegate=yes).
    pub cgroup_root: String,
    pub cgroups_per_qos: bool,
    pub max_pods: u32,
    /// -1: no per-pod limit.
    pub pod_pids_limit: i64,
    pub pod_logs_dir: PathBuf,
    pub container_log_max_size: u64,
    pub container_log_max_files: u32,
    pub enable_server: bool,
    pub address: IpAddr,
    /// The read-only HTTP API (`/pods`, `/healthz`, `/containerLogs`); 0 disables it.
    pub read_only_port: u16,
    pub cluster_dns: Vec<IpAddr>,
    pub cluster_domain: String,
    pub resolv_conf: PathBuf,
    pub pod_cidr: Option<String>,
    pub node_ip: Option<IpAddr>,
    pub runtime_request_timeout: Duration,
    pub max_container_restart_period: Duration,
    /// First crash-loop back-off (kubelet's is fixed at 10s; ferrolet lets tests shorten it).
    pub initial_container_restart_period: Duration,
    /// Pods without a seccompProfile get RuntimeDefault (kubelet's seccompDefault; on by
    /// default here, DESIGN.md §1).
    pub seccomp_default: bool,
    pub system_reserved_cpu_milli: i64,
    pub system_reserved_memory: i64,
    pub network: NetworkConfig,
    /// Image archives dropped here are imported at start and on every file check.
    pub image_import_dir: PathBuf,
    /// Import the demo image built into this binary when the store lacks it.
    pub load_demo_image: bool,
    pub verbosity: u8,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_name: default_node_name(),
            root_dir: PathBuf::from("/var/lib/ferrolet"),
            static_pod_path: Some(PathBuf::from("/etc/ferrolet/manifests")),
            static_pod_url: None,
            static_pod_url_headers: Vec::new(),
            file_check_frequency: Duration::from_secs(20),
            http_check_frequency: Duration::from_secs(20),
            sync_frequency: Duration::from_secs(60),
            cgroup_root: String::new(),
            cgroups_per_qos: true,
            max_pods: 110,
            pod_pids_limit: -1,
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            container_log_max_size: 10 << 20,
            container_log_max_files: 5,
            enable_server: true,
            address: IpAddr::from([127, 0, 0, 1]),
            read_only_port: 10255,
            cluster_dns: Vec::new(),
            cluster_domain: "cluster.local".into(),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            pod_cidr: None,
            node_ip: None,
            runtime_request_timeout: Duration::from_secs(120),
            max_container_restart_period: Duration::from_secs(300),
            initial_container_restart_period: Duration::from_secs(10),
            seccomp_default: true,
            system_reserved_cpu_milli: 0,
            system_reserved_memory: 0,
            network: NetworkConfig {
                mode: NetworkMode::Bridge,
                bridge: "ferrolet0".into(),
                subnet: "10.88.0.0/16".into(),
                cni_conf_dir: PathBuf::from("/etc/cni/net.d"),
                cni_bin_dirs: vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")],
            },
            image_import_dir: PathBuf::from("/var/lib/ferrolet/images/import"),
            load_demo_image: true,
            verbosity: 2,
        }
    }
}

impl Config {
    /// Paths under the root dir.
    pub fn pods_dir(&self) -> PathBuf {
        self.root_dir.join("pods")
    }
    pub fn socket_path(&self) -> PathBuf {
        self.root_dir.join("ferrolet.sock")
    }
    pub fn exec_socket_path(&self) -> PathBuf {
        self.root_dir.join("exec.sock")
    }

    /// Checks across fields, after file and flags are applied.
    pub fn validate(&self) -> Result<()> {
        if self.node_name.is_empty() || !is_dns_subdomain(&self.node_name) {
            bail!(
                "hostname-override: node name {:?} is not a valid DNS subdomain",
                self.node_name
            );
        }
        if !self.root_dir.is_absolute() {
            bail!("root-dir: {} is not an absolute path", self.root_dir.display());
        }
        if !self.cgroup_root.is_empty() && !self.cgroup_root.starts_with('/') {
            bail!("cgroupRoot: {:?} must be an absolute cgroup path", self.cgroup_root);
        }
        if self.max_pods == 0 {
            bail!("maxPods: must be at least 1");
        }
        if self.container_log_max_files < 2 {
            bail!(
                "containerLogMaxFiles: must be at least 2 (kubelet's rule), got {}",
                self.container_log_max_files
            );
        }
        if self.file_check_frequency.is_zero() || self.sync_frequency.is_zero() {
            bail!("fileCheckFrequency and syncFrequency must be positive");
        }
        if let Some(u) = &self.static_pod_url {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                bail!("staticPodURL: {u:?} is not an http(s) URL");
            }
        }
        Ok(())
    }
}

/// Apply `ferrolet run` flags (kubelet's names) over the file and defaults.
pub fn apply_flags(cfg: &mut Config, f: &crate::cli::RunFlags) -> Result<()> {
    use crate::units::{bytes, parse_duration};
    let dur = |name: &str, v: &Option<String>| -> Result<Option<Duration>> {
        v.as_deref()
            .map(|s| parse_duration(s).map_err(|e| anyhow::anyhow!("--{name}: {e}")))
            .transpose()
    };
    if let Some(p) = &f.pod_manifest_path {
        cfg.static_pod_path = Some(absolute(p)?);
    }
    if let Some(u) = &f.manifest_url {
        cfg.static_pod_url = Some(u.clone());
    }
    if !f.manifest_url_header.is_empty() {
        cfg.static_pod_url_headers = f
            .manifest_url_header
            .iter()
            .map(|h| parse_header(h))
            .collect::<Result<_>>()?;
    }
    if let Some(r) = &f.root_dir {
        cfg.root_dir = absolute(r)?;
        cfg.image_import_dir = cfg.root_dir.join("images/import");
    }
    if let Some(h) = &f.hostname_override {
        cfg.node_name = h.trim().to_ascii_lowercase();
    }
    if let Some(v) = f.v {
        cfg.verbosity = v;
    }
    if let Some(d) = dur("file-check-frequency", &f.file_check_frequency)? {
        cfg.file_check_frequency = d;
    }
    if let Some(d) = dur("http-check-frequency", &f.http_check_frequency)? {
        cfg.http_check_frequency = d;
    }
    if let Some(d) = dur("sync-frequency", &f.sync_frequency)? {
        cfg.sync_frequency = d;
    }
    if let Some(d) = dur("runtime-request-timeout", &f.runtime_request_timeout)? {
        cfg.runtime_request_timeout = d;
    }
    if let Some(d) = dur("initial-container-restart-period", &f.initial_container_restart_period)? {
        cfg.initial_container_restart_period = d;
    }
    if let Some(c) = &f.cgroup_root {
        cfg.cgroup_root = c.clone();
    }
    if let Some(b) = f.cgroups_per_qos {
        cfg.cgroups_per_qos = b;
    }
    if let Some(m) = f.max_pods {
        cfg.max_pods = m;
    }
    if let Some(m) = f.pod_max_pids {
        cfg.pod_pids_limit = m;
    }
    if let Some(p) = f.read_only_port {
        cfg.read_only_port = p;
    }
    if let Some(a) = f.address {
        cfg.address = a;
    }
    if !f.cluster_dns.is_empty() {
        cfg.cluster_dns = f.cluster_dns.clone();
    }
    if let Some(d) = &f.cluster_domain {
        cfg.cluster_domain = d.clone();
    }
    if let Some(r) = &f.resolv_conf {
        cfg.resolv_conf = r.clone();
    }
    if let Some(c) = &f.pod_cidr {
        cfg.pod_cidr = Some(c.clone());
    }
    if let Some(ip) = f.node_ip {
        cfg.node_ip = Some(ip);
    }
    if let Some(s) = &f.container_log_max_size {
        cfg.container_log_max_size = bytes(s).map_err(|e| anyhow::anyhow!("--container-log-max-size: {e}"))? as u64;
    }
    if let Some(n) = f.container_log_max_files {
        cfg.container_log_max_files = n;
    }
    if let Some(n) = &f.network {
        cfg.network.mode = match n.as_str() {
            "bridge" => NetworkMode::Bridge,
            "cni" => NetworkMode::Cni,
            "none" => NetworkMode::None,
            o => bail!("--network: expected bridge, cni or none, got {o:?}"),
        };
    }
    if let Some(d) = &f.cni_conf_dir {
        cfg.network.cni_conf_dir = d.clone();
    }
    if !f.cni_bin_dir.is_empty() {
        cfg.network.cni_bin_dirs = f.cni_bin_dir.clone();
    }
    if let Some(d) = &f.image_import_dir {
        cfg.image_import_dir = absolute(d)?;
    }
    Ok(())
}

fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir().context("current directory")?.join(p))
    }
}

/// Resolve a path given in a config file relative to the file's directory, as kubelet does.
pub(crate) fn resolve_relative(base: &Path, p: &str) -> PathBuf {
    let path = PathBuf::from(p);
    if path.is_absolute() {
        path
    } else {
        base.join(path)
    }
}

fn default_node_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && !s.is_empty() && s.split('.').all(is_dns_label)
}

pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Parse `key:value` (kubelet's --manifest-url-header form).
pub fn parse_header(s: &str) -> Result<(String, String)> {
    let (k, v) = s
        .split_once(':')
        .with_context(|| format!("manifest-url-header: {s:?} is not key:value"))?;
    Ok((k.trim().to_string(), v.trim().to_string()))
}
