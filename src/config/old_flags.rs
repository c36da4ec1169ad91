//! `ferrolet run`'s flags, named as kubelet names them, and how they apply over the
//! configuration file and the defaults. An unset flag leaves the value alone; a bad value is an
//! error naming the flag.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;

use super::serving::{AuthzMode, ServingConfig, TlsVersion};
use super::{absolute, parse_header, parse_label, parse_taint, Config, NetworkMode};

/// Flags named as kubelet names them. Unset flags leave the config file's (or the default)
/// value alone.
#[derive(Args, Debug, Default)]
pub struct RunFlags {
    /// KubeletConfiguration file (kubelet.config.k8s.io/v1beta1).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory (or file) of static pod manifests.
    #[arg(long = "pod-manifest-path")]
    pub pod_manifest_path: Option<PathBuf>,
    /// URL of static pod manifests (kubelet's manifestURL).
    #[arg(long = "manifest-url")]
    pub manifest_url: Option<String>,
    /// key:value header for --manifest-url (repeatable).
    #[arg(long = "manifest-url-header")]
    pub manifest_url_header: Vec<String>,
    #[arg(long = "root-dir")]
    pub root_dir: Option<PathBuf>,
    /// Run the static pods once, wait until they run (or have finished), report and exit
    /// (kubelet's --runonce).
    #[arg(long = "runonce", num_args = 0..=1, default_missing_value = "true")]
    pub runonce: Option<bool>,
    /// Where the containers' log links go (kubelet's /var/log/containers).
    #[arg(long = "container-log-link-dir")]
    pub container_log_link_dir: Option<PathBuf>,
    #[arg(long = "hostname-override")]
    pub hostname_override: Option<String>,
    /// Log verbosity (kubelet's -v / --v).
    #[arg(long = "v", short = 'v')]
    pub v: Option<u8>,
    #[arg(long = "file-check-frequency")]
    pub file_check_frequency: Option<String>,
    #[arg(long = "http-check-frequency")]
    pub http_check_frequency: Option<String>,
    #[arg(long = "sync-frequency")]
    pub sync_frequency: Option<String>,
    /// Interval between stats samples (cAdvisor's housekeeping), e.g. 10s.
    #[arg(long = "housekeeping-interval")]
    pub housekeeping_interval: Option<String>,
    /// Interval between disk usage walks of container layers, logs and volumes (kubelet's
    /// volumeStatsAggPeriod), e.g. 1m.
    #[arg(long = "volume-stats-agg-period")]
    pub volume_stats_agg_period: Option<String>,
    #[arg(long = "cgroup-root")]
    pub cgroup_root: Option<String>,
    #[arg(long = "cgroups-per-qos", num_args = 0..=1, default_missing_value = "true")]
    pub cgroups_per_qos: Option<bool>,
    /// Refuse to start while the node has swap on (kubelet's --fail-swap-on).
    #[arg(long = "fail-swap-on", num_args = 0..=1, default_missing_value = "true")]
    pub fail_swap_on: Option<bool>,
    #[arg(long = "max-pods")]
    pub max_pods: Option<u32>,
    /// QoS tiers' memory reserve, `memory=50%` (kubelet's --qos-reserved).
    #[arg(long = "qos-reserved")]
    pub qos_reserved: Option<String>,
    #[arg(long = "cpu-cfs-quota", num_args = 0..=1, default_missing_value = "true")]
    pub cpu_cfs_quota: Option<bool>,
    #[arg(long = "cpu-cfs-quota-period")]
    pub cpu_cfs_quota_period: Option<String>,
    /// Comma-separated: pods, system-reserved, kube-reserved, or none.
    #[arg(long = "enforce-node-allocatable")]
    pub enforce_node_allocatable: Option<String>,
    #[arg(long = "system-reserved-cgroup")]
    pub system_reserved_cgroup: Option<String>,
    #[arg(long = "kube-reserved-cgroup")]
    pub kube_reserved_cgroup: Option<String>,
    #[arg(long = "oom-score-adj", allow_hyphen_values = true)]
    pub oom_score_adj: Option<i32>,
    #[arg(long = "pod-max-pids")]
    pub pod_max_pids: Option<i64>,
    #[arg(long = "read-only-port")]
    pub read_only_port: Option<u16>,
    #[arg(long = "address")]
    pub address: Option<std::net::IpAddr>,
    #[arg(long = "cluster-dns", value_delimiter = ',')]
    pub cluster_dns: Vec<std::net::IpAddr>,
    /// Comma-separated unsafe sysctls or patterns (ending in `*`) pods may set.
    #[arg(long = "allowed-unsafe-sysctls", value_delimiter = ',')]
    pub allowed_unsafe_sysctls: Vec<String>,
    #[arg(long = "cluster-domain")]
    pub cluster_domain: Option<String>,
    #[arg(long = "resolv-conf")]
    pub resolv_conf: Option<PathBuf>,
    #[arg(long = "pod-cidr")]
    pub pod_cidr: Option<String>,
    #[arg(long = "node-ip")]
    pub node_ip: Option<std::net::IpAddr>,
    #[arg(long = "runtime-request-timeout")]
    pub runtime_request_timeout: Option<String>,
    #[arg(long = "container-log-max-size")]
    pub container_log_max_size: Option<String>,
    #[arg(long = "container-log-max-files")]
    pub container_log_max_files: Option<u32>,
    /// Pod network: bridge (built in), cni, or none.
    #[arg(long = "network")]
    pub network: Option<String>,
    #[arg(long = "cni-conf-dir")]
    pub cni_conf_dir: Option<PathBuf>,
    #[arg(long = "cni-bin-dir", value_delimiter = ',')]
    pub cni_bin_dir: Vec<PathBuf>,
    /// Image archives dropped here are imported.
    #[arg(long = "image-import-dir")]
    pub image_import_dir: Option<PathBuf>,
    /// The node's kubeconfig: joins the cluster it names (written by the TLS bootstrap when
    /// --bootstrap-kubeconfig is given).
    #[arg(long = "kubeconfig")]
    pub kubeconfig: Option<PathBuf>,
    /// A bootstrap credential for requesting the node's client certificate.
    #[arg(long = "bootstrap-kubeconfig")]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    #[arg(long = "register-node", num_args = 0..=1, default_missing_value = "true")]
    pub register_node: Option<bool>,
    /// key=value:Effect, comma-separated.
    #[arg(long = "register-with-taints", value_delimiter = ',')]
    pub register_with_taints: Vec<String>,
    /// key=value, comma-separated.
    #[arg(long = "node-labels", value_delimiter = ',')]
    pub node_labels: Vec<String>,
    #[arg(long = "node-status-update-frequency")]
    pub node_status_update_frequency: Option<String>,
    #[arg(long = "kube-api-qps")]
    pub kube_api_qps: Option<i32>,
    #[arg(long = "kube-api-burst")]
    pub kube_api_burst: Option<u32>,
    /// Event writes a second to the API server (0: no limit).
    #[arg(long = "event-qps")]
    pub event_qps: Option<u32>,
    #[arg(long = "event-burst")]
    pub event_burst: Option<u32>,
    #[arg(long = "rotate-certificates", num_args = 0..=1, default_missing_value = "true")]
    pub rotate_certificates: Option<bool>,
    /// The authenticated HTTPS port of the kubelet API.
    #[arg(long = "port")]
    pub port: Option<u16>,
    #[arg(long = "tls-cert-file")]
    pub tls_cert_file: Option<PathBuf>,
    #[arg(long = "tls-private-key-file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// VersionTLS12 or VersionTLS13.
    #[arg(long = "tls-min-version")]
    pub tls_min_version: Option<String>,
    /// Request the serving certificate from the cluster and rotate it (serverTLSBootstrap).
    #[arg(long = "rotate-server-certificates", num_args = 0..=1, default_missing_value = "true")]
    pub rotate_server_certificates: Option<bool>,
    /// The plain /healthz port (0: off).
    #[arg(long = "healthz-port")]
    pub healthz_port: Option<u16>,
    #[arg(long = "healthz-bind-address")]
    pub healthz_bind_address: Option<std::net::IpAddr>,
    /// Serve exec, attach, port-forward, run and the logs (kubelet's default true).
    #[arg(long = "enable-debugging-handlers", num_args = 0..=1, default_missing_value = "true")]
    pub enable_debugging_handlers: Option<bool>,
    /// CA bundle client certificates are verified against.
    #[arg(long = "client-ca-file")]
    pub client_ca_file: Option<PathBuf>,
    /// Check bearer tokens with a TokenReview.
    #[arg(long = "authentication-token-webhook", num_args = 0..=1, default_missing_value = "true")]
    pub authentication_token_webhook: Option<bool>,
    #[arg(long = "authentication-token-webhook-cache-ttl")]
    pub authentication_token_webhook_cache_ttl: Option<String>,
    /// Serve requests without credentials as system:anonymous.
    #[arg(long = "anonymous-auth", num_args = 0..=1, default_missing_value = "true")]
    pub anonymous_auth: Option<bool>,
    /// AlwaysAllow or Webhook.
    #[arg(long = "authorization-mode")]
    pub authorization_mode: Option<String>,
    #[arg(long = "authorization-webhook-cache-authorized-ttl")]
    pub authorization_webhook_cache_authorized_ttl: Option<String>,
    #[arg(long = "authorization-webhook-cache-unauthorized-ttl")]
    pub authorization_webhook_cache_unauthorized_ttl: Option<String>,
    /// First crash-loop back-off (kubelet's is 10s).
    #[arg(long = "initial-container-restart-period", hide = true)]
    pub initial_container_restart_period: Option<String>,
    /// Registry mirrors, rewrites, TLS and auth (k3s registries.yaml); default
    /// <root-dir>/registries.yaml.
    #[arg(long = "registry-config")]
    pub registry_config: Option<PathBuf>,
    /// Pull one image at a time (kubelet's serializeImagePulls, default true).
    #[arg(long = "serialize-image-pulls", num_args = 0..=1, default_missing_value = "true")]
    pub serialize_image_pulls: Option<bool>,
    /// Pulls at once when not serialized (kubelet's maxParallelImagePulls).
    #[arg(long = "max-parallel-image-pulls", allow_negative_numbers = true)]
    pub max_parallel_image_pulls: Option<i64>,
    /// Image pulls a second, 0 for no limit (kubelet's registryPullQPS, default 5).
    #[arg(long = "registry-qps", allow_negative_numbers = true)]
    pub registry_qps: Option<i64>,
    /// Burst of image pulls (kubelet's registryBurst, default 10).
    #[arg(long = "registry-burst", allow_negative_numbers = true)]
    pub registry_burst: Option<i64>,
    /// Hard eviction thresholds, `memory.available<100Mi,nodefs.available<10%` (replaces the
    /// configuration's evictionHard, as kubelet's flag does).
    #[arg(long = "eviction-hard")]
    pub eviction_hard: Option<String>,
    /// Soft eviction thresholds, `memory.available<1Gi`.
    #[arg(long = "eviction-soft")]
    pub eviction_soft: Option<String>,
    /// Grace periods of the soft thresholds, `memory.available=1m30s`.
    #[arg(long = "eviction-soft-grace-period")]
    pub eviction_soft_grace_period: Option<String>,
    /// How far past its threshold a signal must recover, `nodefs.available=500Mi`.
    #[arg(long = "eviction-minimum-reclaim")]
    pub eviction_minimum_reclaim: Option<String>,
    /// How long a pressure condition stays after it was last seen (default 5m).
    #[arg(long = "eviction-pressure-transition-period")]
    pub eviction_pressure_transition_period: Option<String>,
    /// Longest grace period (seconds) of a pod evicted for a soft threshold.
    #[arg(long = "eviction-max-pod-grace-period", allow_negative_numbers = true)]
    pub eviction_max_pod_grace_period: Option<i64>,
    /// Dead containers younger than this are not collected (default 0).
    #[arg(long = "minimum-container-ttl-duration")]
    pub minimum_container_ttl_duration: Option<String>,
    /// Dead containers kept per container (default 1; negative: no limit).
    #[arg(long = "maximum-dead-containers-per-container", allow_negative_numbers = true)]
    pub maximum_dead_containers_per_container: Option<i32>,
    /// Dead containers kept on the node (default -1: no limit).
    #[arg(long = "maximum-dead-containers", allow_negative_numbers = true)]
    pub maximum_dead_containers: Option<i32>,
    /// Image GC starts at this percent of the image filesystem used (default 85).
    #[arg(long = "image-gc-high-threshold", allow_negative_numbers = true)]
    pub image_gc_high_threshold: Option<i32>,
    /// Image GC frees down to this percent (default 80).
    #[arg(long = "image-gc-low-threshold", allow_negative_numbers = true)]
    pub image_gc_low_threshold: Option<i32>,
    /// Images younger than this are not collected (default 2m).
    #[arg(long = "minimum-image-gc-age")]
    pub minimum_image_gc_age: Option<String>,
    /// A download making no progress this long fails (default 1m, 0 none).
    #[arg(long = "image-pull-progress-timeout")]
    pub image_pull_progress_timeout: Option<String>,
    /// Images in the Node's status, -1 for all (default 50).
    #[arg(long = "node-status-max-images", allow_negative_numbers = true)]
    pub node_status_max_images: Option<i32>,
    /// CredentialProviderConfig of exec credential plugins.
    #[arg(long = "image-credential-provider-config")]
    pub image_credential_provider_config: Option<PathBuf>,
    /// Where the credential plugins' binaries are.
    #[arg(long = "image-credential-provider-bin-dir")]
    pub image_credential_provider_bin_dir: Option<PathBuf>,
}

/// kubelet's `--eviction-hard` / `--eviction-soft` form: `signal<threshold`, comma-separated.
fn eviction_thresholds(flag: &str, v: &str) -> Result<super::EvictionHard> {
    let mut out = super::EvictionHard::none();
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (signal, t) = part
            .split_once('<')
            .ok_or_else(|| anyhow::anyhow!("--{flag}: {part:?} is not signal<threshold"))?;
        let t = super::Threshold::parse(t).map_err(|e| anyhow::anyhow!("--{flag}: {signal}: {e:#}"))?;
        if !out.set(signal.trim(), Some(t)) {
            bail!("--{flag}: unsupported eviction signal {:?}", signal.trim());
        }
    }
    Ok(out)
}

/// kubelet's `signal=value` maps (`--eviction-soft-grace-period`, `--eviction-minimum-reclaim`).
fn signal_map<T>(
    flag: &str,
    v: &str,
    parse: impl Fn(&str) -> Result<T>,
) -> Result<std::collections::BTreeMap<String, T>> {
    let mut out = std::collections::BTreeMap::new();
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (signal, x) = part
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--{flag}: {part:?} is not signal=value"))?;
        let signal = signal.trim();
        if !super::EVICTION_SIGNALS.contains(&signal) {
            bail!("--{flag}: unsupported eviction signal {signal:?}");
        }
        let x = parse(x.trim()).map_err(|e| anyhow::anyhow!("--{flag}: {signal}: {e:#}"))?;
        out.insert(signal.to_string(), x);
    }
    Ok(out)
}

/// Apply `ferrolet run` flags (kubelet's names) over the file and defaults.
pub fn apply(cfg: &mut Config, f: &RunFlags) -> Result<()> {
    use crate::pod::units::{bytes, parse_duration};
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
    if let Some(r) = f.runonce {
        cfg.run_once = r;
    }
    if let Some(d) = &f.container_log_link_dir {
        cfg.container_log_link_dir = absolute(d)?;
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
    if let Some(d) = dur("housekeeping-interval", &f.housekeeping_interval)? {
        cfg.housekeeping_interval = d;
    }
    if let Some(d) = dur("volume-stats-agg-period", &f.volume_stats_agg_period)? {
        cfg.volume_stats_agg_period = d;
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
    if let Some(b) = f.fail_swap_on {
        cfg.fail_swap_on = b;
    }
    if let Some(b) = f.cgroups_per_qos {
        cfg.cgroups_per_qos = b;
    }
    if let Some(m) = f.max_pods {
        cfg.max_pods = m;
    }
    if let Some(q) = &f.qos_reserved {
        cfg.cm.qos_reserved_memory = None;
        for part in q.split(',').filter(|p| !p.is_empty()) {
            let (res, v) = part
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--qos-reserved: {part:?} is not resource=percentage"))?;
            cfg.cm.qos_reserved_memory = Some(super::qos_reserved_percent("--qos-reserved", res, v)?);
        }
    }
    if let Some(b) = f.cpu_cfs_quota {
        cfg.cm.cpu_cfs_quota = b;
    }
    if let Some(p) = dur("cpu-cfs-quota-period", &f.cpu_cfs_quota_period)? {
        cfg.cm.cpu_cfs_quota_period = p;
    }
    if let Some(e) = &f.enforce_node_allocatable {
        let keys = e.split(',').filter(|k| !k.is_empty()).map(str::to_string).collect();
        cfg.cm.enforce_node_allocatable = super::enforce_node_allocatable_list("--enforce-node-allocatable", keys)?;
    }
    if let Some(c) = &f.system_reserved_cgroup {
        cfg.cm.system_reserved_cgroup = c.clone();
    }
    if let Some(c) = &f.kube_reserved_cgroup {
        cfg.cm.kube_reserved_cgroup = c.clone();
    }
    if let Some(t) = &f.eviction_hard {
        cfg.eviction_hard = eviction_thresholds("eviction-hard", t)?;
    }
    if let Some(t) = &f.eviction_soft {
        cfg.eviction.soft = eviction_thresholds("eviction-soft", t)?;
    }
    if let Some(m) = &f.eviction_soft_grace_period {
        cfg.eviction.soft_grace_period = signal_map("eviction-soft-grace-period", m, |v| {
            parse_duration(v).map_err(|e| anyhow::anyhow!("{e}"))
        })?;
    }
    if let Some(m) = &f.eviction_minimum_reclaim {
        cfg.eviction.minimum_reclaim = signal_map("eviction-minimum-reclaim", m, super::Threshold::parse)?;
    }
    if let Some(d) = dur(
        "eviction-pressure-transition-period",
        &f.eviction_pressure_transition_period,
    )? {
        cfg.eviction.pressure_transition_period = d;
    }
    if let Some(g) = f.eviction_max_pod_grace_period {
        cfg.eviction.max_pod_grace_period = g;
    }
    if let Some(d) = dur("minimum-container-ttl-duration", &f.minimum_container_ttl_duration)? {
        cfg.eviction.container_gc.min_age = d;
    }
    if let Some(n) = f.maximum_dead_containers_per_container {
        cfg.eviction.container_gc.max_per_pod_container = n;
    }
    if let Some(n) = f.maximum_dead_containers {
        cfg.eviction.container_gc.max_containers = n;
    }
    if let Some(a) = f.oom_score_adj {
        cfg.cm.oom_score_adj = a;
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
    if !f.allowed_unsafe_sysctls.is_empty() {
        cfg.allowed_unsafe_sysctls = f.allowed_unsafe_sysctls.clone();
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
    apply_serving(&mut cfg.serving, f)?;
    apply_images(&mut cfg.images, f)?;
    let c = &mut cfg.cluster;
    if let Some(k) = &f.kubeconfig {
        c.kubeconfig = Some(absolute(k)?);
    }
    if let Some(k) = &f.bootstrap_kubeconfig {
        c.bootstrap_kubeconfig = Some(absolute(k)?);
    }
    if let Some(b) = f.register_node {
        c.register_node = b;
    }
    if !f.register_with_taints.is_empty() {
        c.register_with_taints = f
            .register_with_taints
            .iter()
            .map(|t| parse_taint(t))
            .collect::<Result<_>>()?;
    }
    for l in &f.node_labels {
        let (k, v) = parse_label(l)?;
        c.node_labels.insert(k, v);
    }
    if let Some(d) = dur("node-status-update-frequency", &f.node_status_update_frequency)? {
        c.node_status_update_frequency = d;
    }
    if let Some(q) = f.kube_api_qps {
        c.kube_api_qps = q;
    }
    if let Some(b) = f.kube_api_burst {
        c.kube_api_burst = b;
    }
    if let Some(q) = f.event_qps {
        c.event_record_qps = q;
    }
    if let Some(b) = f.event_burst {
        c.event_burst = if b == 0 { 100 } else { b };
    }
    if let Some(b) = f.rotate_certificates {
        c.rotate_certificates = b;
    }
    Ok(())
}

/// The image flags.
fn apply_images(i: &mut super::ImageConfig, f: &RunFlags) -> Result<()> {
    use crate::pod::units::parse_duration;
    let dur = |name: &str, v: &Option<String>| -> Result<Option<Duration>> {
        v.as_deref()
            .map(|x| parse_duration(x).map_err(|e| anyhow::anyhow!("--{name}: {e}")))
            .transpose()
    };
    if let Some(p) = &f.registry_config {
        i.registry_config_file = Some(absolute(p)?);
    }
    if let Some(b) = f.serialize_image_pulls {
        i.serialize_image_pulls = b;
    }
    if let Some(n) = f.max_parallel_image_pulls {
        i.max_parallel_image_pulls =
            Some(u32::try_from(n).map_err(|_| anyhow::anyhow!("maxParallelImagePulls {n} must be a positive number"))?);
    }
    if let Some(n) = f.registry_qps {
        i.registry_pull_qps = u32::try_from(n)
            .map_err(|_| anyhow::anyhow!("registryPullQPS (--registry-qps) {n} must not be a negative number"))?;
    }
    if let Some(n) = f.registry_burst {
        i.registry_burst = u32::try_from(n)
            .map_err(|_| anyhow::anyhow!("registryBurst (--registry-burst) {n} must not be a negative number"))?;
    }
    if let Some(n) = f.image_gc_high_threshold {
        i.image_gc_high_threshold_percent = n;
    }
    if let Some(n) = f.image_gc_low_threshold {
        i.image_gc_low_threshold_percent = n;
    }
    if let Some(d) = dur("minimum-image-gc-age", &f.minimum_image_gc_age)? {
        i.image_minimum_gc_age = d;
    }
    if let Some(d) = dur("image-pull-progress-timeout", &f.image_pull_progress_timeout)? {
        i.image_pull_progress_timeout = d;
    }
    if let Some(n) = f.node_status_max_images {
        i.node_status_max_images = n;
    }
    if let Some(p) = &f.image_credential_provider_config {
        i.credential_provider_config = Some(absolute(p)?);
    }
    if let Some(p) = &f.image_credential_provider_bin_dir {
        i.credential_provider_bin_dir = Some(absolute(p)?);
    }
    Ok(())
}

/// The kubelet API's flags.
fn apply_serving(s: &mut ServingConfig, f: &RunFlags) -> Result<()> {
    use crate::pod::units::parse_duration;
    let dur = |name: &str, v: &Option<String>| -> Result<Option<Duration>> {
        v.as_deref()
            .map(|x| parse_duration(x).map_err(|e| anyhow::anyhow!("--{name}: {e}")))
            .transpose()
    };
    if let Some(p) = f.port {
        s.port = p;
    }
    if let Some(p) = &f.tls_cert_file {
        s.tls_cert_file = Some(absolute(p)?);
    }
    if let Some(p) = &f.tls_private_key_file {
        s.tls_private_key_file = Some(absolute(p)?);
    }
    if let Some(v) = &f.tls_min_version {
        s.tls_min_version = TlsVersion::parse("--tls-min-version", v)?;
    }
    if let Some(b) = f.rotate_server_certificates {
        s.server_tls_bootstrap = b;
    }
    if let Some(p) = f.healthz_port {
        s.healthz_port = p;
    }
    if let Some(a) = f.healthz_bind_address {
        s.healthz_bind_address = a;
    }
    if let Some(b) = f.enable_debugging_handlers {
        s.enable_debugging_handlers = b;
    }
    if let Some(p) = &f.client_ca_file {
        s.client_ca_file = Some(absolute(p)?);
    }
    if let Some(b) = f.authentication_token_webhook {
        s.authn_webhook = Some(b);
    }
    if let Some(d) = dur(
        "authentication-token-webhook-cache-ttl",
        &f.authentication_token_webhook_cache_ttl,
    )? {
        s.authn_webhook_cache_ttl = d;
    }
    if let Some(b) = f.anonymous_auth {
        s.anonymous_auth = b;
    }
    if let Some(m) = &f.authorization_mode {
        s.authz_mode = Some(AuthzMode::parse("--authorization-mode", m)?);
    }
    if let Some(d) = dur(
        "authorization-webhook-cache-authorized-ttl",
        &f.authorization_webhook_cache_authorized_ttl,
    )? {
        s.authz_cache_authorized_ttl = d;
    }
    if let Some(d) = dur(
        "authorization-webhook-cache-unauthorized-ttl",
        &f.authorization_webhook_cache_unauthorized_ttl,
    )? {
        s.authz_cache_unauthorized_ttl = d;
    }
    Ok(())
}
