//! The agent's configuration: built-in defaults that work on a fresh machine, then a
//! KubeletConfiguration file (`--config`, [`file`]), then flags with kubelet's names
//! ([`flags`]). Later wins. [`load`] does all three and the checks across fields.
//!
//! [`Config`] is the typed configuration the agent runs with. Each of its settings is declared
//! once, on its field (with [`settings::declare`]): doc, type, default, file field, flag and
//! codec; the file reader, the flags and `/configz` ([`effective`]) all derive from those
//! declarations (docs/config.md).

mod codec;
pub mod effective;
pub mod eviction;
pub mod file;
mod flags;
pub mod serving;
pub mod settings;
pub mod shutdown;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::pod::validation::is_dns_subdomain;
use codec::*;
use settings::declare;

pub use flags::{RunFlags, SettingFlags};
pub use serving::{AuthzMode, ServingConfig, TlsVersion};

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

declare! {
    #[derive(Debug, Clone)]
    pub struct NetworkConfig {
        #[help = "Pod network: bridge (built in), cni, or none."]
        #[setting("ferrolet.network" | "network" => NetMode, quiet)]
        pub mode: NetworkMode = NetworkMode::Bridge,
        #[setting("ferrolet.bridgeName" | _ => Str, quiet)]
        pub bridge: String = "ferrolet0".into(),
        /// The pod subnet; kubelet's podCIDR when set.
        #[setting("ferrolet.podSubnet" | _ => Str, quiet)]
        pub subnet: String = "10.88.0.0/16".into(),
        /// Where `--network cni` reads the CNI network configuration (the first file by name).
        #[setting("ferrolet.cniConfDir" | "cni-conf-dir" => FilePath, quiet)]
        pub cni_conf_dir: PathBuf = PathBuf::from("/etc/cni/net.d"),
        /// Directories searched for CNI plugin binaries, comma-separated.
        #[setting("ferrolet.cniBinDirs" | "cni-bin-dir" => PathList, quiet)]
        pub cni_bin_dirs: Vec<PathBuf> = vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")],
    }
}

declare! {
    /// Joining a cluster: how the agent reaches the API server and how it presents its Node
    /// (kubelet's --kubeconfig family of flags and the node status settings).
    #[derive(Debug, Clone)]
    pub struct ClusterConfig {
        /// The node's kubeconfig (kubelet's --kubeconfig): set, the agent joins the cluster; unset,
        /// it runs standalone. With a bootstrap kubeconfig it is written by the TLS bootstrap when
        /// missing or expired.
        #[help = "The node's kubeconfig: joins the cluster it names (written by the TLS bootstrap when --bootstrap-kubeconfig is given)."]
        #[setting(_ | "kubeconfig" => OptPath)]
        pub kubeconfig: Option<PathBuf> = None,
        /// A bootstrap credential (kubelet's --bootstrap-kubeconfig): used to request the node's
        /// client certificate with a CSR.
        #[help = "A bootstrap credential for requesting the node's client certificate."]
        #[setting(_ | "bootstrap-kubeconfig" => OptPath)]
        pub bootstrap_kubeconfig: Option<PathBuf> = None,
        /// Renew the node's client certificate before it expires (kubelet's rotateCertificates).
        #[setting("rotateCertificates" | "rotate-certificates" => Bool)]
        pub rotate_certificates: bool = true,
        /// Create the Node object (kubelet's --register-node).
        #[setting("registerNode" | "register-node" => Bool)]
        pub register_node: bool = true,
        /// Taints the Node is registered with (kubelet's --register-with-taints).
        #[help = "key=value:Effect, comma-separated."]
        #[setting("registerWithTaints" | "register-with-taints" => Taints)]
        pub register_with_taints: Vec<k8s_openapi::api::core::v1::Taint> = Vec::new(),
        /// Labels the Node is registered with (kubelet's --node-labels).
        #[help = "key=value, comma-separated."]
        #[setting(_ | "node-labels" => Labels)]
        pub node_labels: std::collections::BTreeMap<String, String> = Default::default(),
        /// How often the node status is computed (kubelet's nodeStatusUpdateFrequency).
        #[setting("nodeStatusUpdateFrequency" | "node-status-update-frequency" => Dur)]
        pub node_status_update_frequency: Duration = Duration::from_secs(10),
        /// How often an unchanged node status is still posted (nodeStatusReportFrequency).
        #[setting("nodeStatusReportFrequency" | _ => Dur)]
        pub node_status_report_frequency: Duration = Duration::from_secs(300),
        /// The node Lease's duration; it is renewed every quarter of it (10 s for kubelet's 40).
        #[setting("nodeLeaseDurationSeconds" | _ => Int<i32>)]
        pub node_lease_duration_seconds: i32 = 40,
        /// Client-side rate limit towards the API server (kubeAPIQPS / kubeAPIBurst).
        #[setting("kubeAPIQPS" | "kube-api-qps" => Int<i32>)]
        pub kube_api_qps: i32 = 50,
        /// Requests the API client may send at once above kubeAPIQPS (kubeAPIBurst).
        #[setting("kubeAPIBurst" | "kube-api-burst" => Int<u32>)]
        pub kube_api_burst: u32 = 100,
        /// Event writes a second to the API server, 0 for no limit, and their burst
        /// (eventRecordQPS / eventBurst; kubelet's defaults since v1.27, 5 and 10 before, raised
        /// with kubeAPIQPS).
        #[help = "Event writes a second to the API server (0: no limit)."]
        #[setting("eventRecordQPS" | "event-qps" => EventQps)]
        pub event_record_qps: u32 = 50,
        /// Event writes sent at once above eventRecordQPS (eventBurst; 0: 100).
        #[setting("eventBurst" | "event-burst" => EventBurst)]
        pub event_burst: u32 = 100,
    }
}

/// A reservation of node resources (kubelet's systemReserved / kubeReserved), in millicores
/// and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserved {
    pub cpu_milli: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
    /// Process ids (kubelet's `pid` reservation): taken off the kubepods `pids.max` when node
    /// allocatable is enforced, and set on the reserved cgroups.
    pub pid: i64,
}

declare! {
    /// The container manager's settings (kubelet's cm.NodeConfig): QoS tiers, CFS quota, node
    /// allocatable enforcement, OOM behaviour. docs/cgroups.md says what each does.
    #[derive(Debug, Clone, PartialEq)]
    pub struct CmConfig {
        /// `qosReserved: {memory: NN%}`: the share of higher tiers' memory requests kept from lower
        /// tiers (kubelet's QOSReserved); None when not set.
        #[help = "QoS tiers' memory reserve, `memory=50%` (kubelet's --qos-reserved)."]
        #[setting("qosReserved" | "qos-reserved" => QosReserved)]
        pub qos_reserved_memory: Option<i64> = None,
        /// Enforce cpu limits with CFS quota (cpuCFSQuota, default true).
        #[setting("cpuCFSQuota" | "cpu-cfs-quota" => Bool)]
        pub cpu_cfs_quota: bool = true,
        /// The CFS period (cpuCFSQuotaPeriod, default 100ms).
        #[setting("cpuCFSQuotaPeriod" | "cpu-cfs-quota-period" => Dur)]
        pub cpu_cfs_quota_period: Duration = Duration::from_millis(100),
        /// enforceNodeAllocatable: any of `pods`, `system-reserved`, `kube-reserved`, or `none`
        /// alone (an empty list, as kubelet normalizes it). Default `[pods]`.
        #[help = "Comma-separated: pods, system-reserved, kube-reserved, or none."]
        #[setting("enforceNodeAllocatable" | "enforce-node-allocatable" => Enforce)]
        pub enforce_node_allocatable: Vec<String> = vec!["pods".into()],
        /// Absolute cgroup paths of the system's daemons and of the agent, limited when
        /// `system-reserved` / `kube-reserved` are enforced.
        #[setting("systemReservedCgroup" | "system-reserved-cgroup" => Str)]
        pub system_reserved_cgroup: String = String::new(),
        /// Absolute cgroup path of the agent itself, limited when `kube-reserved` is enforced.
        #[setting("kubeReservedCgroup" | "kube-reserved-cgroup" => Str)]
        pub kube_reserved_cgroup: String = String::new(),
        /// The agent's own oom_score_adj (kubelet's oomScoreAdj, default -999).
        #[setting("oomScoreAdj" | "oom-score-adj" => Int<i32>)]
        pub oom_score_adj: i32 = -999,
        /// On cgroup v2, kill only the process the kernel picked instead of the whole container
        /// (kubelet's singleProcessOOMKill, default false: `memory.oom.group` is set).
        #[setting("singleProcessOOMKill" | _ => Bool)]
        pub single_process_oom_kill: bool = false,
        /// How often the QoS tiers are recomputed besides on every pod add and removal (kubelet's
        /// fixed 1m; `ferrolet.qosUpdatePeriod`).
        #[setting("ferrolet.qosUpdatePeriod" | _ => Dur)]
        pub qos_update_period: Duration = Duration::from_secs(60),
    }
}

impl CmConfig {
    pub fn enforces(&self, key: &str) -> bool {
        self.enforce_node_allocatable.iter().any(|k| k == key)
    }

    /// kubelet's validation of these fields (its messages).
    pub fn validate(&self, cgroups_per_qos: bool) -> Result<()> {
        let p = self.cpu_cfs_quota_period;
        if p < Duration::from_millis(1) || p > Duration::from_secs(1) {
            bail!(
                "invalid configuration: cpuCFSQuotaPeriod (--cpu-cfs-quota-period) {} must be between 1ms and 1sec, inclusive",
                crate::pod::units::format_duration(p)
            );
        }
        if !(-1000..=1000).contains(&self.oom_score_adj) {
            bail!(
                "invalid configuration: oomScoreAdj (--oom-score-adj) {} must be between -1000 and 1000, inclusive",
                self.oom_score_adj
            );
        }
        if let Some(pct) = self.qos_reserved_memory {
            if !(0..=100).contains(&pct) {
                bail!("qosReserved.memory: {pct}% must be between 0% and 100%, inclusive");
            }
        }
        if !cgroups_per_qos && !self.enforce_node_allocatable.is_empty() {
            bail!("invalid configuration: enforceNodeAllocatable (--enforce-node-allocatable) is not supported unless cgroupsPerQOS (--cgroups-per-qos) is set to true");
        }
        for key in &self.enforce_node_allocatable {
            match key.as_str() {
                "pods" => {}
                "system-reserved" => {
                    if self.system_reserved_cgroup.is_empty() {
                        bail!("invalid configuration: systemReservedCgroup (--system-reserved-cgroup) must be specified when \"system-reserved\" contained in enforceNodeAllocatable (--enforce-node-allocatable)");
                    }
                }
                "kube-reserved" => {
                    if self.kube_reserved_cgroup.is_empty() {
                        bail!("invalid configuration: kubeReservedCgroup (--kube-reserved-cgroup) must be specified when \"kube-reserved\" contained in enforceNodeAllocatable (--enforce-node-allocatable)");
                    }
                }
                other => bail!(
                    "invalid configuration: option {other:?} specified for enforceNodeAllocatable (--enforce-node-allocatable). Valid options are \"pods\", \"system-reserved\", \"kube-reserved\", or \"none\""
                ),
            }
        }
        for (f, v) in [
            ("systemReservedCgroup", &self.system_reserved_cgroup),
            ("kubeReservedCgroup", &self.kube_reserved_cgroup),
        ] {
            if !v.is_empty() && !v.starts_with('/') {
                bail!("{f}: {v:?} must be an absolute cgroup path");
            }
        }
        Ok(())
    }
}

/// enforceNodeAllocatable as given: `none` must stand alone and means an empty list.
pub fn enforce_node_allocatable_list(field: &str, keys: Vec<String>) -> Result<Vec<String>> {
    if keys.iter().any(|k| k == "none") {
        if keys.len() > 1 {
            bail!("invalid configuration: {field} may not contain additional enforcements when \"none\" is specified");
        }
        return Ok(Vec::new());
    }
    Ok(keys)
}

/// `memory=50%` (flag) or `{memory: 50%}` (file) value: the percentage.
pub fn qos_reserved_percent(field: &str, res: &str, v: &str) -> Result<i64> {
    if res != "memory" {
        bail!("{field}: cannot reserve {res:?} resource (only memory)");
    }
    let n = v
        .trim()
        .strip_suffix('%')
        .and_then(|n| n.parse::<i64>().ok())
        .with_context(|| format!("{field}.{res}: {v:?} is not a percentage like 50%"))?;
    if !(0..=100).contains(&n) {
        bail!("{field}.{res}: {v:?} must be between 0% and 100%, inclusive");
    }
    Ok(n)
}

/// An eviction threshold: an absolute quantity or a percentage of the resource's capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    Quantity(i64),
    Percent(f64),
}

impl Threshold {
    /// The threshold in the resource's units, for a resource of `capacity`.
    pub fn amount(self, capacity: i64) -> i64 {
        match self {
            Threshold::Quantity(q) => q,
            Threshold::Percent(p) => ((capacity as f64) * p / 100.0).round() as i64,
        }
    }

    /// kubelet's form: `100Mi`, `10%`.
    pub fn parse(s: &str) -> Result<Threshold> {
        let s = s.trim();
        if let Some(p) = s.strip_suffix('%') {
            let v: f64 = p.parse().map_err(|_| anyhow::anyhow!("{s:?} is not a percentage"))?;
            if !(0.0..=100.0).contains(&v) {
                bail!("{s:?}: a percentage must be between 0% and 100%");
            }
            return Ok(Threshold::Percent(v));
        }
        let q = crate::pod::units::bytes(s).map_err(|e| anyhow::anyhow!("{e}"))?;
        if q < 0 {
            bail!("{s:?} is negative");
        }
        Ok(Threshold::Quantity(q))
    }
}

/// The eviction signals ferrolet measures, by kubelet's names, in the order kubelet's
/// configuration lists them.
pub const EVICTION_SIGNALS: [&str; 6] = [
    "memory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "pid.available",
];

/// Eviction thresholds by signal (kubelet's evictionHard and evictionSoft maps); `None`: no
/// threshold for that signal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvictionHard {
    pub memory_available: Option<Threshold>,
    pub nodefs_available: Option<Threshold>,
    pub nodefs_inodes_free: Option<Threshold>,
    pub imagefs_available: Option<Threshold>,
    pub imagefs_inodes_free: Option<Threshold>,
    pub pid_available: Option<Threshold>,
}

/// The same map for evictionSoft.
pub type EvictionThresholds = EvictionHard;

impl EvictionHard {
    /// No thresholds at all.
    pub const fn none() -> EvictionHard {
        EvictionHard {
            memory_available: None,
            nodefs_available: None,
            nodefs_inodes_free: None,
            imagefs_available: None,
            imagefs_inodes_free: None,
            pid_available: None,
        }
    }

    fn slot(&mut self, signal: &str) -> Option<&mut Option<Threshold>> {
        Some(match signal {
            "memory.available" => &mut self.memory_available,
            "nodefs.available" => &mut self.nodefs_available,
            "nodefs.inodesFree" => &mut self.nodefs_inodes_free,
            "imagefs.available" => &mut self.imagefs_available,
            "imagefs.inodesFree" => &mut self.imagefs_inodes_free,
            "pid.available" => &mut self.pid_available,
            _ => return None,
        })
    }

    /// The threshold of `signal` (kubelet's name).
    pub fn get(&self, signal: &str) -> Option<Threshold> {
        let mut copy = *self;
        copy.slot(signal).and_then(|t| *t)
    }

    /// Set the threshold of `signal`; false for a signal ferrolet does not know.
    pub fn set(&mut self, signal: &str, t: Option<Threshold>) -> bool {
        match self.slot(signal) {
            Some(s) => {
                *s = t;
                true
            }
            None => false,
        }
    }

    /// The thresholds set, by signal name, in [`EVICTION_SIGNALS`] order.
    pub fn iter(&self) -> Vec<(&'static str, Threshold)> {
        EVICTION_SIGNALS
            .iter()
            .filter_map(|s| self.get(s).map(|t| (*s, t)))
            .collect()
    }
}

impl Default for EvictionHard {
    /// kubelet's defaults on Linux (memory.available 100Mi, nodefs.available 10%,
    /// nodefs.inodesFree 5%, imagefs.available 15%).
    fn default() -> EvictionHard {
        EvictionHard {
            memory_available: Some(Threshold::Quantity(100 << 20)),
            nodefs_available: Some(Threshold::Percent(10.0)),
            nodefs_inodes_free: Some(Threshold::Percent(5.0)),
            imagefs_available: Some(Threshold::Percent(15.0)),
            imagefs_inodes_free: None,
            pid_available: None,
        }
    }
}

declare! {
    /// Pulling and collecting images: kubelet's image settings and ferrolet's registry settings.
    #[derive(Debug, Clone, PartialEq)]
    pub struct ImageConfig {
        /// Mirrors, rewrites, TLS and auth per registry in k3s's registries.yaml format
        /// (ferrolet's registryConfigFile / --registry-config); `None`: `<rootDir>/registries.yaml`.
        /// Re-read when it changes.
        #[help = "Registry mirrors, rewrites, TLS and auth (k3s registries.yaml); default <root-dir>/registries.yaml."]
        #[setting("ferrolet.registryConfigFile" | "registry-config" => OptPath)]
        pub registry_config_file: Option<PathBuf> = None,
        /// One pull at a time (kubelet's serializeImagePulls).
        #[help = "Pull one image at a time (kubelet's serializeImagePulls, default true)."]
        #[setting("serializeImagePulls" | "serialize-image-pulls" => Bool)]
        pub serialize_image_pulls: bool = true,
        /// Pulls at once when not serialized (kubelet's maxParallelImagePulls; `None`: no limit).
        #[help = "Pulls at once when not serialized (kubelet's maxParallelImagePulls)."]
        #[setting("maxParallelImagePulls" | "max-parallel-image-pulls" => MaxParallel)]
        pub max_parallel_image_pulls: Option<u32> = None,
        /// Pulls a second (kubelet's registryPullQPS; 0: no limit) and their burst (registryBurst).
        #[help = "Image pulls a second, 0 for no limit (kubelet's registryPullQPS, default 5)."]
        #[setting("registryPullQPS" | "registry-qps" => RegistryQps)]
        pub registry_pull_qps: u32 = 5,
        #[help = "Burst of image pulls (kubelet's registryBurst, default 10)."]
        #[setting("registryBurst" | "registry-burst" => RegistryBurst)]
        pub registry_burst: u32 = 10,
        /// Image GC thresholds, percent of the image filesystem (imageGCHighThresholdPercent,
        /// imageGCLowThresholdPercent; 100 for the high threshold turns GC off).
        #[help = "Image GC starts at this percent of the image filesystem used (default 85)."]
        #[setting("imageGCHighThresholdPercent" | "image-gc-high-threshold" => Percent)]
        pub image_gc_high_threshold_percent: i32 = 85,
        #[help = "Image GC frees down to this percent (default 80)."]
        #[setting("imageGCLowThresholdPercent" | "image-gc-low-threshold" => Percent)]
        pub image_gc_low_threshold_percent: i32 = 80,
        /// Images younger than this (since first seen) are never collected (imageMinimumGCAge).
        #[help = "Images younger than this are not collected (default 2m)."]
        #[setting("imageMinimumGCAge" | "minimum-image-gc-age" => Dur)]
        pub image_minimum_gc_age: Duration = Duration::from_secs(120),
        /// Images unused this long are collected whatever the disk (imageMaximumGCAge; 0: off).
        #[setting("imageMaximumGCAge" | _ => Dur)]
        pub image_maximum_gc_age: Duration = Duration::ZERO,
        /// How often image GC runs (kubelet's fixed 5m; ferrolet.imageGCPeriod).
        #[setting("ferrolet.imageGCPeriod" | _ => Dur)]
        pub image_gc_period: Duration = Duration::from_secs(300),
        /// A download with no progress this long fails (ferrolet's imagePullProgressTimeout, as
        /// containerd's image_pull_progress_timeout; 0: none).
        #[help = "A download making no progress this long fails (default 1m, 0 none)."]
        #[setting("ferrolet.imagePullProgressTimeout" | "image-pull-progress-timeout" => Dur)]
        pub image_pull_progress_timeout: Duration = Duration::from_secs(60),
        /// Blobs downloaded at once across all pulls (containerd's max_concurrent_downloads).
        #[setting("ferrolet.maxConcurrentDownloads" | _ => Int<u32>)]
        pub max_concurrent_downloads: u32 = 3,
        /// Images listed in the Node's status (nodeStatusMaxImages; -1: all).
        #[help = "Images in the Node's status, -1 for all (default 50)."]
        #[setting("nodeStatusMaxImages" | "node-status-max-images" => Int<i32>)]
        pub node_status_max_images: i32 = 50,
        /// kubelet's --image-credential-provider-config and --image-credential-provider-bin-dir.
        #[help = "CredentialProviderConfig of exec credential plugins."]
        #[setting("ferrolet.imageCredentialProviderConfig" | "image-credential-provider-config" => OptPath)]
        pub credential_provider_config: Option<PathBuf> = None,
        #[help = "Where the credential plugins' binaries are."]
        #[setting("ferrolet.imageCredentialProviderBinDir" | "image-credential-provider-bin-dir" => OptPath)]
        pub credential_provider_bin_dir: Option<PathBuf> = None,
    }
}

impl ImageConfig {
    /// kubelet's validation of the image settings (its messages, with the flag names).
    pub fn validate(&self) -> Result<()> {
        let (hi, lo) = (
            self.image_gc_high_threshold_percent,
            self.image_gc_low_threshold_percent,
        );
        if !(0..=100).contains(&hi) {
            bail!("imageGCHighThresholdPercent (--image-gc-high-threshold) {hi} must be between 0 and 100, inclusive");
        }
        if !(0..=100).contains(&lo) {
            bail!("imageGCLowThresholdPercent (--image-gc-low-threshold) {lo} must be between 0 and 100, inclusive");
        }
        if lo >= hi {
            bail!("imageGCLowThresholdPercent (--image-gc-low-threshold) {lo} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {hi}");
        }
        if !self.image_maximum_gc_age.is_zero() && self.image_maximum_gc_age <= self.image_minimum_gc_age {
            bail!(
                "imageMaximumGCAge {} must be greater than imageMinimumGCAge {}",
                crate::pod::units::format_duration(self.image_maximum_gc_age),
                crate::pod::units::format_duration(self.image_minimum_gc_age)
            );
        }
        if let Some(n) = self.max_parallel_image_pulls {
            if n < 1 {
                bail!("maxParallelImagePulls {n} must be a positive number");
            }
            if self.serialize_image_pulls && n > 1 {
                bail!("maxParallelImagePulls ({n}) must be unset (or 1) when serializeImagePulls is true");
            }
        }
        if self.node_status_max_images < -1 {
            bail!("nodeStatusMaxImages (--node-status-max-images) must be -1 or greater");
        }
        if self.image_gc_period.is_zero() {
            bail!("ferrolet.imageGCPeriod: must be positive");
        }
        if self.max_concurrent_downloads == 0 {
            bail!("ferrolet.maxConcurrentDownloads: must be at least 1");
        }
        if self.credential_provider_config.is_some() && self.credential_provider_bin_dir.is_none() {
            bail!("image-credential-provider-bin-dir: must be set with --image-credential-provider-config");
        }
        Ok(())
    }
}

declare! {
    #[derive(Debug, Clone)]
    pub struct Config {
        #[help = "The node's name (default: the host name)."]
        #[setting(_ | "hostname-override" => NodeName)]
        pub node_name: String = default_node_name(),
        #[help = "The agent's state directory (default /var/lib/ferrolet)."]
        #[setting(_ | "root-dir" => FilePath)]
        pub root_dir: PathBuf = PathBuf::from("/var/lib/ferrolet"),
        #[help = "Directory (or file) of static pod manifests."]
        #[setting("staticPodPath" | "pod-manifest-path" => OptPath)]
        pub static_pod_path: Option<PathBuf> = Some(PathBuf::from("/etc/ferrolet/manifests")),
        #[help = "URL of static pod manifests (kubelet's manifestURL)."]
        #[setting("staticPodURL" | "manifest-url" => OptStr)]
        pub static_pod_url: Option<String> = None,
        #[help = "key:value header for --manifest-url (repeatable)."]
        #[setting("staticPodURLHeader" | "manifest-url-header" => UrlHeaders, quiet)]
        pub static_pod_url_headers: Vec<(String, String)> = Vec::new(),
        #[help = "How often the static pod path is read again."]
        #[setting("fileCheckFrequency" | "file-check-frequency" => Dur)]
        pub file_check_frequency: Duration = Duration::from_secs(20),
        #[help = "How often the static pod URL is fetched again."]
        #[setting("httpCheckFrequency" | "http-check-frequency" => Dur)]
        pub http_check_frequency: Duration = Duration::from_secs(20),
        #[help = "How often every pod is synced even with nothing new."]
        #[setting("syncFrequency" | "sync-frequency" => Dur)]
        pub sync_frequency: Duration = Duration::from_secs(60),
        /// How often the stats are sampled (cAdvisor's and kubelet's `--housekeeping-interval`).
        #[help = "Interval between stats samples (cAdvisor's housekeeping), e.g. 10s."]
        #[setting(_ | "housekeeping-interval" => Dur)]
        pub housekeeping_interval: Duration = Duration::from_secs(10),
        /// How often the disk usage of container layers, logs and volumes is walked (kubelet's
        /// volumeStatsAggPeriod).
        #[help = "Interval between disk usage walks of container layers, logs and volumes (kubelet's volumeStatsAggPeriod), e.g. 1m."]
        #[setting("volumeStatsAggPeriod" | "volume-stats-agg-period" => Dur, quiet)]
        pub volume_stats_agg_period: Duration = Duration::from_secs(60),
        /// Absolute cgroup path under which `kubepods` lives; empty means the cgroup the agent was
        /// started in (safe on shared machines and under systemd with Delegate=yes).
        #[setting("cgroupRoot" | "cgroup-root" => Str)]
        pub cgroup_root: String = String::new(),
        /// Put pods in QoS cgroups (kubepods/burstable, kubepods/besteffort), as kubelet does.
        #[setting("cgroupsPerQOS" | "cgroups-per-qos" => Bool)]
        pub cgroups_per_qos: bool = true,
        /// Most pods the node runs; more are refused at admission (kubelet's maxPods).
        #[setting("maxPods" | "max-pods" => Int<u32>)]
        pub max_pods: u32 = 110,
        /// Pod sandboxes built ahead of time and handed to new pods that fit (docs/sandbox.md,
        /// "The sandbox pool"); 0 turns the pool off.
        #[help = "Pod sandboxes built ahead of time for new pods (0: none, the default)."]
        #[setting("ferrolet.sandboxPool" | "sandbox-pool" => Int<u32>)]
        pub sandbox_pool: u32 = 0,
        /// Most processes in one pod (kubelet's podPidsLimit; -1: no per-pod limit).
        #[setting("podPidsLimit" | "pod-max-pids" => Int<i64>)]
        pub pod_pids_limit: i64 = -1,
        #[setting("podLogsDir" | _ => FilePath)]
        pub pod_logs_dir: PathBuf = PathBuf::from("/var/log/pods"),
        /// Size at which a container's log file is rotated, e.g. `10Mi`.
        #[setting("containerLogMaxSize" | "container-log-max-size" => Quantity)]
        pub container_log_max_size: u64 = 10 << 20,
        /// Log files kept per container, the current one included.
        #[setting("containerLogMaxFiles" | "container-log-max-files" => Int<u32>)]
        pub container_log_max_files: u32 = 5,
        #[setting("enableServer" | _ => Bool)]
        pub enable_server: bool = true,
        // kubelet's: the API server reaches the kubelet port at the node's address
        /// Where the kubelet port and the read-only port listen (kubelet's address, 0.0.0.0).
        #[setting("address" | "address" => Ip)]
        pub address: IpAddr = IpAddr::from([0, 0, 0, 0]),
        /// kubelet's read-only HTTP port (`/healthz`, `/pods`, unauthenticated); 0, the default as
        /// in kubelet, disables it.
        #[setting("readOnlyPort" | "read-only-port" => Port)]
        pub read_only_port: u16 = 0,
        /// DNS server addresses for pods with `dnsPolicy: ClusterFirst`, comma-separated.
        #[setting("clusterDNS" | "cluster-dns" => IpList)]
        pub cluster_dns: Vec<IpAddr> = Vec::new(),
        /// The cluster's DNS domain, searched by pods after their namespace's.
        #[setting("clusterDomain" | "cluster-domain" => Str)]
        pub cluster_domain: String = "cluster.local".into(),
        /// Sysctls (names, or prefixes ending in `*`) pods may set beyond kubelet's safe set
        /// (allowedUnsafeSysctls); each must be namespaced ([`crate::pod::sysctl`]).
        #[help = "Comma-separated unsafe sysctls or patterns (ending in `*`) pods may set."]
        #[setting("allowedUnsafeSysctls" | "allowed-unsafe-sysctls" => Sysctls)]
        pub allowed_unsafe_sysctls: Vec<String> = Vec::new(),
        /// The resolver configuration pods with `dnsPolicy: Default` get.
        #[setting("resolvConf" | "resolv-conf" => FilePath)]
        pub resolv_conf: PathBuf = PathBuf::from("/etc/resolv.conf"),
        /// The pod network's range on a standalone node (in a cluster the Node's spec.podCIDR).
        #[setting("podCIDR" | "pod-cidr" => OptStr)]
        pub pod_cidr: Option<String> = None,
        /// The node's address in its status and hostIP (default: the address of the default route).
        #[setting("ferrolet.nodeIP" | "node-ip" => OptIp, quiet)]
        pub node_ip: Option<IpAddr> = None,
        /// Longest a runtime request may take, such as an exec's start (kubelet's runtimeRequestTimeout).
        #[setting("runtimeRequestTimeout" | "runtime-request-timeout" => Dur)]
        pub runtime_request_timeout: Duration = Duration::from_secs(120),
        /// exec, attach and port-forward connections with no traffic this long are closed
        /// (streamingConnectionIdleTimeout; kubelet's default 4h, 0 never).
        #[setting("streamingConnectionIdleTimeout" | _ => Dur, quiet)]
        pub streaming_connection_idle_timeout: Duration = Duration::from_secs(4 * 3600),
        #[setting("crashLoopBackOff.maxContainerRestartPeriod" | _ => Dur)]
        pub max_container_restart_period: Duration = Duration::from_secs(300),
        /// First crash-loop back-off (kubelet's is fixed at 10s; ferrolet lets tests shorten it).
        #[help = "First crash-loop back-off (kubelet's is 10s)."]
        #[setting("ferrolet.initialContainerRestartPeriod" | "initial-container-restart-period" => Dur, quiet, hidden)]
        pub initial_container_restart_period: Duration = Duration::from_secs(10),
        /// Pods without a seccompProfile get RuntimeDefault (kubelet's seccompDefault; on by
        /// default here, docs/runtime.md#libcontainer-facts-that-matter).
        #[setting("seccompDefault" | _ => Bool)]
        pub seccomp_default: bool = true,
        /// Refuse to start while the node has swap on (kubelet's failSwapOn, default true).
        #[help = "Refuse to start while the node has swap on (kubelet's --fail-swap-on)."]
        #[setting("failSwapOn" | "fail-swap-on" => Bool)]
        pub fail_swap_on: bool = true,
        /// Resources set aside for the system's daemons (kubelet's systemReserved).
        #[setting("systemReserved" | _ => ReservedMap)]
        pub system_reserved: Reserved = Reserved::default(),
        /// Resources set aside for the agent itself (kubelet's kubeReserved).
        #[setting("kubeReserved" | _ => ReservedMap)]
        pub kube_reserved: Reserved = Reserved::default(),
        /// The container manager (QoS tiers, CFS, node allocatable enforcement, OOM).
        #[nested(CmConfig)]
        pub cm: CmConfig = CmConfig::default(),
        /// The hard eviction thresholds (kubelet's evictionHard): taken out of allocatable, and
        /// the eviction manager's (src/eviction/) hard thresholds.
        #[help = "Hard eviction thresholds, `memory.available<100Mi,nodefs.available<10%` (replaces the configuration's evictionHard, as kubelet's flag does)."]
        #[setting("evictionHard" | "eviction-hard" => Thresholds)]
        pub eviction_hard: EvictionHard = EvictionHard::default(),
        /// kubelet's mergeDefaultEvictionSettings: an evictionHard map in the file keeps the
        /// defaults of the signals it does not name.
        #[setting("mergeDefaultEvictionSettings" | _ => Bool, quiet)]
        pub merge_default_eviction_settings: bool = false,
        /// The rest of the eviction manager's, container GC's and log rotation's settings.
        #[nested(eviction::EvictionConfig)]
        pub eviction: eviction::EvictionConfig = eviction::EvictionConfig::default(),
        #[nested(NetworkConfig)]
        pub network: NetworkConfig = NetworkConfig::default(),
        /// Image archives dropped here are imported at start and on every file check.
        #[help = "Image archives dropped here are imported."]
        #[setting("ferrolet.imageImportDir" | "image-import-dir" => FilePath, quiet)]
        pub image_import_dir: PathBuf = PathBuf::from("/var/lib/ferrolet/images/import"),
        /// Import the demo image built into this binary when the store lacks it.
        #[setting("ferrolet.loadDemoImage" | _ => Bool, quiet)]
        pub load_demo_image: bool = true,
        #[help = "Log verbosity (kubelet's -v / --v)."]
        #[setting(_ | "v" => Int<u8>)]
        pub verbosity: u8 = 2,
        /// Joining a cluster (when `cluster.kubeconfig` is set).
        #[nested(ClusterConfig)]
        pub cluster: ClusterConfig = ClusterConfig::default(),
        /// The kubelet API: port, TLS, authentication and authorization.
        #[nested(ServingConfig)]
        pub serving: ServingConfig = ServingConfig::default(),
        /// Pulling and collecting images.
        #[nested(ImageConfig)]
        pub images: ImageConfig = ImageConfig::default(),
        /// Graceful node shutdown (src/nodeshutdown/).
        #[nested(shutdown::ShutdownConfig)]
        pub shutdown: shutdown::ShutdownConfig = shutdown::ShutdownConfig::default(),
        /// kubelet's runOnce (`--runonce`): run the static pods once, wait until each runs (or has
        /// finished), report and exit (src/agent/run_once.rs).
        #[help = "Run the static pods once, wait until they run (or have finished), report and exit (kubelet's --runonce)."]
        #[setting("runOnce" | "runonce" => Bool)]
        pub run_once: bool = false,
        /// Where the `<pod>_<ns>_<container>-<id>.log` symlinks to the containers' CRI logs go
        /// (kubelet's fixed /var/log/containers; `ferrolet.containerLogLinkDir`).
        #[help = "Where the containers' log links go (kubelet's /var/log/containers)."]
        #[setting("ferrolet.containerLogLinkDir" | "container-log-link-dir" => FilePath)]
        pub container_log_link_dir: PathBuf = PathBuf::from("/var/log/containers"),
    }
}

/// The configuration `ferrolet run` runs with: defaults, then the `--config` file, then the
/// flags, then the checks across fields. Also returns warnings about file fields that are
/// accepted but not acted on.
pub fn load(flags: &RunFlags) -> Result<(Config, Vec<String>)> {
    let mut cfg = Config::default();
    let mut warnings = Vec::new();
    if let Some(path) = &flags.config {
        warnings = file::apply_file(&mut cfg, path)?;
    }
    flags::apply(&mut cfg, flags)?;
    // Image archives are imported from under the root dir unless a location was given.
    if !flags.settings.given("root-dir")
        && !flags.settings.given("image-import-dir")
        && cfg.image_import_dir == Config::default().image_import_dir
    {
        cfg.image_import_dir = cfg.root_dir.join("images/import");
    }
    cfg.validate()?;
    Ok((cfg, warnings))
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
    /// The registries.yaml in force: as configured, else `<rootDir>/registries.yaml`.
    pub fn registry_config_file(&self) -> PathBuf {
        self.images
            .registry_config_file
            .clone()
            .unwrap_or_else(|| self.root_dir.join("registries.yaml"))
    }

    /// The configuration with the defaults that depend on the mode (standalone or in a
    /// cluster) or on other settings filled in, as `/configz` shows it.
    pub fn resolved(&self) -> Config {
        let mut c = self.clone();
        let in_cluster = self.in_cluster();
        c.serving.authn_webhook = Some(self.serving.token_webhook(in_cluster));
        c.serving.authz_mode = Some(self.serving.authz_mode(in_cluster));
        c.images.registry_config_file = Some(self.registry_config_file());
        c
    }

    /// Joined to a cluster (a kubeconfig is configured).
    pub fn in_cluster(&self) -> bool {
        self.cluster.kubeconfig.is_some()
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
        self.cm.validate(self.cgroups_per_qos)?;
        crate::pod::sysctl::Allowlist::new(&self.allowed_unsafe_sysctls)
            .map_err(|e| anyhow::anyhow!("allowedUnsafeSysctls: {e}"))?;
        if self.max_pods == 0 {
            bail!("maxPods: must be at least 1");
        }
        if self.container_log_max_files < 2 {
            bail!(
                "containerLogMaxFiles: must be at least 2 (kubelet's rule), got {}",
                self.container_log_max_files
            );
        }
        self.eviction.validate(&self.eviction_hard)?;
        if self.file_check_frequency.is_zero() || self.sync_frequency.is_zero() {
            bail!("fileCheckFrequency and syncFrequency must be positive");
        }
        if self.housekeeping_interval.is_zero() {
            bail!("housekeeping-interval: must be positive");
        }
        if self.volume_stats_agg_period.is_zero() {
            bail!("volumeStatsAggPeriod: must be positive");
        }
        let c = &self.cluster;
        if c.bootstrap_kubeconfig.is_some() && c.kubeconfig.is_none() {
            bail!("bootstrap-kubeconfig: needs --kubeconfig, where the node's credential is written");
        }
        if c.node_lease_duration_seconds <= 0 {
            bail!("nodeLeaseDurationSeconds: must be positive");
        }
        if c.node_status_update_frequency.is_zero() || c.node_status_report_frequency.is_zero() {
            bail!("nodeStatusUpdateFrequency and nodeStatusReportFrequency must be positive");
        }
        if c.kube_api_qps <= 0 || c.kube_api_burst == 0 {
            bail!("kubeAPIQPS and kubeAPIBurst must be positive");
        }
        self.serving.validate(self.in_cluster())?;
        self.images.validate()?;
        self.shutdown.validate()?;
        if let Some(u) = &self.static_pod_url {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                bail!("staticPodURL: {u:?} is not an http(s) URL");
            }
        }
        Ok(())
    }
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

/// Parse `key=value:Effect` (kubelet's --register-with-taints form; the value may be empty).
pub fn parse_taint(s: &str) -> Result<k8s_openapi::api::core::v1::Taint> {
    let (kv, effect) = s
        .rsplit_once(':')
        .with_context(|| format!("register-with-taints: {s:?} is not key=value:Effect"))?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        bail!("register-with-taints: {s:?}: effect must be NoSchedule, PreferNoSchedule or NoExecute");
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string()).filter(|v| !v.is_empty())),
        None => (kv, None),
    };
    if key.is_empty() {
        bail!("register-with-taints: {s:?} has no key");
    }
    Ok(k8s_openapi::api::core::v1::Taint {
        key: key.to_string(),
        value,
        effect: effect.to_string(),
        time_added: None,
    })
}

/// Parse `key=value` (kubelet's --node-labels form).
pub fn parse_label(s: &str) -> Result<(String, String)> {
    let (k, v) = s
        .split_once('=')
        .with_context(|| format!("node-labels: {s:?} is not key=value"))?;
    if k.is_empty() {
        bail!("node-labels: {s:?} has no key");
    }
    Ok((k.to_string(), v.to_string()))
}

/// Parse `key:value` (kubelet's --manifest-url-header form).
pub fn parse_header(s: &str) -> Result<(String, String)> {
    let (k, v) = s
        .split_once(':')
        .with_context(|| format!("manifest-url-header: {s:?} is not key:value"))?;
    Ok((k.trim().to_string(), v.trim().to_string()))
}
