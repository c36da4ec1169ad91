//! Every setting of `ferrolet run`, declared once: its KubeletConfiguration field
//! (kubelet.config.k8s.io/v1beta1 name; `a.b` inside an object, `ferrolet.x` for ferrolet's
//! own), its flag (kubelet's name), where it lives in [`Config`], and its [`Codec`] (how the
//! value is written in the file, on the command line and in `/configz`). The file reader
//! ([`super::file`]), the flags ([`super::flags`]) and `/configz` ([`super::effective`]) all
//! walk [`SETTINGS`]; defaults are the fields' defaults in `Config`, and checks across fields
//! are [`Config::validate`]. docs/config.md says how to add one.
//!
//! A line reads `(FIELD | FLAG) => PLACE: CODEC [OPTIONS],` where FIELD or FLAG may be `_` (no
//! such form), the doc comment above it is the flag's help, and OPTIONS are:
//! `quiet` (not shown in `/configz`, as before this table), `hidden` (a flag kept out of
//! `--help`).

use anyhow::Result;
use clap::Arg;
use serde_json::Value;

use super::codec::*;
use super::Config;

/// One setting, as [`settings!`] declares it.
pub struct Setting {
    /// The file's field, dotted inside objects (`authentication.webhook.cacheTTL`).
    pub json: Option<&'static str>,
    /// The flag's long name (a one-letter name is also the short flag: `-v`).
    pub flag: Option<&'static str>,
    /// The flag's help.
    pub doc: &'static str,
    pub opts: &'static [&'static str],
    /// Set the setting from the file's value, naming the field in errors.
    pub read: fn(&mut Config, &str, &Value, &mut FileCx) -> Result<()>,
    /// Set the setting from the flag's values.
    pub apply_flag: fn(&mut Config, &str, &[String]) -> Result<()>,
    /// The value as `/configz` shows it.
    pub show: fn(&Config) -> Value,
    /// The flag's clap shape.
    pub arg: fn(Arg) -> Arg,
}

impl Setting {
    pub fn has(&self, opt: &str) -> bool {
        self.opts.contains(&opt)
    }

    /// The flag's help on one line (without a final period, as clap's derive writes it).
    pub fn help(&self) -> String {
        let help = self.doc.split_whitespace().collect::<Vec<_>>().join(" ");
        help.strip_suffix('.').map(str::to_string).unwrap_or(help)
    }
}

macro_rules! name {
    (_) => {
        None
    };
    ($n:literal) => {
        Some($n)
    };
}

macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])*
        ($json:tt | $flag:tt) => $($place:ident).+ : $codec:ty $([$($opt:ident),*])?,
    )*) => {
        /// Every setting, in the order `--help` lists the flags.
        pub static SETTINGS: &[Setting] = &[$(
            Setting {
                json: name!($json),
                flag: name!($flag),
                doc: concat!($($doc, "\n",)*),
                opts: &[$($(stringify!($opt)),*)?],
                read: |cfg, f, v, cx| {
                    cfg.$($place).+ = <$codec as Codec>::read(f, v, cx)?;
                    Ok(())
                },
                apply_flag: |cfg, name, vals| {
                    cfg.$($place).+ = <$codec as Codec>::flag(name, vals)?;
                    Ok(())
                },
                show: |cfg| <$codec as Codec>::show(&cfg.$($place).+),
                arg: <$codec as Codec>::arg,
            },
        )*];
    };
}

settings! {
    // Static pods and the agent's own directories.
    /// Directory (or file) of static pod manifests.
    ("staticPodPath" | "pod-manifest-path") => static_pod_path: OptPath,
    /// URL of static pod manifests (kubelet's manifestURL).
    ("staticPodURL" | "manifest-url") => static_pod_url: OptStr,
    /// key:value header for --manifest-url (repeatable).
    ("staticPodURLHeader" | "manifest-url-header") => static_pod_url_headers: UrlHeaders [quiet],
    /// The agent's state directory (default /var/lib/ferrolet).
    (_ | "root-dir") => root_dir: FilePath,
    /// Run the static pods once, wait until they run (or have finished), report and exit
    /// (kubelet's --runonce).
    ("runOnce" | "runonce") => run_once: Bool,
    /// Where the containers' log links go (kubelet's /var/log/containers).
    ("ferrolet.containerLogLinkDir" | "container-log-link-dir") => container_log_link_dir: FilePath,
    /// The node's name (default: the host name).
    (_ | "hostname-override") => node_name: NodeName,
    /// Log verbosity (kubelet's -v / --v).
    (_ | "v") => verbosity: Int<u8>,
    /// How often the static pod path is read again.
    ("fileCheckFrequency" | "file-check-frequency") => file_check_frequency: Dur,
    /// How often the static pod URL is fetched again.
    ("httpCheckFrequency" | "http-check-frequency") => http_check_frequency: Dur,
    /// How often every pod is synced even with nothing new.
    ("syncFrequency" | "sync-frequency") => sync_frequency: Dur,
    /// Interval between stats samples (cAdvisor's housekeeping), e.g. 10s.
    (_ | "housekeeping-interval") => housekeeping_interval: Dur,
    /// Interval between disk usage walks of container layers, logs and volumes (kubelet's
    /// volumeStatsAggPeriod), e.g. 1m.
    ("volumeStatsAggPeriod" | "volume-stats-agg-period") => volume_stats_agg_period: Dur [quiet],
    ("enableServer" | _) => enable_server: Bool,
    ("podLogsDir" | _) => pod_logs_dir: FilePath,
    /// Image archives dropped here are imported.
    ("ferrolet.imageImportDir" | "image-import-dir") => image_import_dir: FilePath [quiet],
    ("ferrolet.loadDemoImage" | _) => load_demo_image: Bool [quiet],

    // Pods and containers.
    ("cgroupRoot" | "cgroup-root") => cgroup_root: Str,
    ("cgroupsPerQOS" | "cgroups-per-qos") => cgroups_per_qos: Bool,
    /// Refuse to start while the node has swap on (kubelet's --fail-swap-on).
    ("failSwapOn" | "fail-swap-on") => fail_swap_on: Bool,
    ("maxPods" | "max-pods") => max_pods: Int<u32>,
    ("podPidsLimit" | "pod-max-pids") => pod_pids_limit: Int<i64>,
    /// Comma-separated unsafe sysctls or patterns (ending in `*`) pods may set.
    ("allowedUnsafeSysctls" | "allowed-unsafe-sysctls") => allowed_unsafe_sysctls: Sysctls,
    ("runtimeRequestTimeout" | "runtime-request-timeout") => runtime_request_timeout: Dur,
    ("streamingConnectionIdleTimeout" | _) => streaming_connection_idle_timeout: Dur [quiet],
    ("containerLogMaxSize" | "container-log-max-size") => container_log_max_size: Quantity,
    ("containerLogMaxFiles" | "container-log-max-files") => container_log_max_files: Int<u32>,
    ("seccompDefault" | _) => seccomp_default: Bool,
    ("crashLoopBackOff.maxContainerRestartPeriod" | _) => max_container_restart_period: Dur,
    /// First crash-loop back-off (kubelet's is 10s).
    ("ferrolet.initialContainerRestartPeriod" | "initial-container-restart-period")
        => initial_container_restart_period: Dur [quiet, hidden],

    // The pod network and DNS.
    ("address" | "address") => address: Ip,
    ("readOnlyPort" | "read-only-port") => read_only_port: Port,
    ("clusterDNS" | "cluster-dns") => cluster_dns: IpList,
    ("clusterDomain" | "cluster-domain") => cluster_domain: Str,
    ("resolvConf" | "resolv-conf") => resolv_conf: FilePath,
    ("podCIDR" | "pod-cidr") => pod_cidr: OptStr,
    ("ferrolet.nodeIP" | "node-ip") => node_ip: OptIp [quiet],
    /// Pod network: bridge (built in), cni, or none.
    ("ferrolet.network" | "network") => network.mode: NetMode [quiet],
    ("ferrolet.bridgeName" | _) => network.bridge: Str [quiet],
    ("ferrolet.podSubnet" | _) => network.subnet: Str [quiet],
    ("ferrolet.cniConfDir" | "cni-conf-dir") => network.cni_conf_dir: FilePath [quiet],
    ("ferrolet.cniBinDirs" | "cni-bin-dir") => network.cni_bin_dirs: PathList [quiet],

    // Node allocatable, the container manager and eviction.
    ("systemReserved" | _) => system_reserved: ReservedMap,
    ("kubeReserved" | _) => kube_reserved: ReservedMap,
    /// QoS tiers' memory reserve, `memory=50%` (kubelet's --qos-reserved).
    ("qosReserved" | "qos-reserved") => cm.qos_reserved_memory: QosReserved,
    ("cpuCFSQuota" | "cpu-cfs-quota") => cm.cpu_cfs_quota: Bool,
    ("cpuCFSQuotaPeriod" | "cpu-cfs-quota-period") => cm.cpu_cfs_quota_period: Dur,
    /// Comma-separated: pods, system-reserved, kube-reserved, or none.
    ("enforceNodeAllocatable" | "enforce-node-allocatable") => cm.enforce_node_allocatable: Enforce,
    ("systemReservedCgroup" | "system-reserved-cgroup") => cm.system_reserved_cgroup: Str,
    ("kubeReservedCgroup" | "kube-reserved-cgroup") => cm.kube_reserved_cgroup: Str,
    ("oomScoreAdj" | "oom-score-adj") => cm.oom_score_adj: Int<i32>,
    ("singleProcessOOMKill" | _) => cm.single_process_oom_kill: Bool,
    ("ferrolet.qosUpdatePeriod" | _) => cm.qos_update_period: Dur,
    /// Hard eviction thresholds, `memory.available<100Mi,nodefs.available<10%` (replaces the
    /// configuration's evictionHard, as kubelet's flag does).
    ("evictionHard" | "eviction-hard") => eviction_hard: Thresholds,
    ("mergeDefaultEvictionSettings" | _) => merge_default_eviction_settings: Bool [quiet],
    /// Soft eviction thresholds, `memory.available<1Gi`.
    ("evictionSoft" | "eviction-soft") => eviction.soft: Thresholds,
    /// Grace periods of the soft thresholds, `memory.available=1m30s`.
    ("evictionSoftGracePeriod" | "eviction-soft-grace-period") => eviction.soft_grace_period: GraceMap,
    /// How far past its threshold a signal must recover, `nodefs.available=500Mi`.
    ("evictionMinimumReclaim" | "eviction-minimum-reclaim") => eviction.minimum_reclaim: ReclaimMap,
    /// How long a pressure condition stays after it was last seen (default 5m).
    ("evictionPressureTransitionPeriod" | "eviction-pressure-transition-period")
        => eviction.pressure_transition_period: Dur,
    /// Longest grace period (seconds) of a pod evicted for a soft threshold.
    ("evictionMaxPodGracePeriod" | "eviction-max-pod-grace-period") => eviction.max_pod_grace_period: Int<i64>,
    ("containerLogMaxWorkers" | _) => eviction.container_log_max_workers: LogWorkers,
    ("containerLogMonitorInterval" | _) => eviction.container_log_monitor_interval: Dur,
    ("ferrolet.evictionMonitoringPeriod" | _) => eviction.monitoring_period: Dur,
    ("ferrolet.containerGCPeriod" | _) => eviction.container_gc.period: Dur,
    /// Dead containers younger than this are not collected (default 0).
    ("ferrolet.minimumContainerTTLDuration" | "minimum-container-ttl-duration")
        => eviction.container_gc.min_age: Dur,
    /// Dead containers kept per container (default 1; negative: no limit).
    ("ferrolet.maximumDeadContainersPerContainer" | "maximum-dead-containers-per-container")
        => eviction.container_gc.max_per_pod_container: Int<i32>,
    /// Dead containers kept on the node (default -1: no limit).
    ("ferrolet.maximumDeadContainers" | "maximum-dead-containers") => eviction.container_gc.max_containers: Int<i32>,

    // Joining a cluster.
    /// The node's kubeconfig: joins the cluster it names (written by the TLS bootstrap when
    /// --bootstrap-kubeconfig is given).
    (_ | "kubeconfig") => cluster.kubeconfig: OptPath,
    /// A bootstrap credential for requesting the node's client certificate.
    (_ | "bootstrap-kubeconfig") => cluster.bootstrap_kubeconfig: OptPath,
    ("registerNode" | "register-node") => cluster.register_node: Bool,
    /// key=value:Effect, comma-separated.
    ("registerWithTaints" | "register-with-taints") => cluster.register_with_taints: Taints,
    /// key=value, comma-separated.
    (_ | "node-labels") => cluster.node_labels: Labels,
    ("nodeStatusUpdateFrequency" | "node-status-update-frequency") => cluster.node_status_update_frequency: Dur,
    ("nodeStatusReportFrequency" | _) => cluster.node_status_report_frequency: Dur,
    ("nodeLeaseDurationSeconds" | _) => cluster.node_lease_duration_seconds: Int<i32>,
    ("kubeAPIQPS" | "kube-api-qps") => cluster.kube_api_qps: Int<i32>,
    ("kubeAPIBurst" | "kube-api-burst") => cluster.kube_api_burst: Int<u32>,
    /// Event writes a second to the API server (0: no limit).
    ("eventRecordQPS" | "event-qps") => cluster.event_record_qps: EventQps,
    ("eventBurst" | "event-burst") => cluster.event_burst: EventBurst,
    ("rotateCertificates" | "rotate-certificates") => cluster.rotate_certificates: Bool,

    // Graceful node shutdown (src/nodeshutdown/).
    ("shutdownGracePeriod" | _) => shutdown.grace_period: Dur,
    ("shutdownGracePeriodCriticalPods" | _) => shutdown.grace_period_critical_pods: Dur,
    ("shutdownGracePeriodByPodPriority" | _) => shutdown.by_pod_priority: PriorityGraces,
    ("ferrolet.logindConfDir" | _) => shutdown.logind_conf_dir: FilePath [quiet],

    // The kubelet API.
    /// The authenticated HTTPS port of the kubelet API.
    ("port" | "port") => serving.port: Port,
    ("tlsCertFile" | "tls-cert-file") => serving.tls_cert_file: OptPathNonEmpty,
    ("tlsPrivateKeyFile" | "tls-private-key-file") => serving.tls_private_key_file: OptPathNonEmpty,
    /// VersionTLS12 or VersionTLS13.
    ("tlsMinVersion" | "tls-min-version") => serving.tls_min_version: TlsMin,
    /// Request the serving certificate from the cluster and rotate it (serverTLSBootstrap).
    ("serverTLSBootstrap" | "rotate-server-certificates") => serving.server_tls_bootstrap: Bool,
    /// The plain /healthz port (0: off).
    ("healthzPort" | "healthz-port") => serving.healthz_port: Port,
    ("healthzBindAddress" | "healthz-bind-address") => serving.healthz_bind_address: Ip,
    /// Serve exec, attach, port-forward, run and the logs (kubelet's default true).
    ("enableDebuggingHandlers" | "enable-debugging-handlers") => serving.enable_debugging_handlers: Bool,
    /// CA bundle client certificates are verified against.
    ("authentication.x509.clientCAFile" | "client-ca-file") => serving.client_ca_file: OptPathNonEmpty,
    /// Check bearer tokens with a TokenReview.
    ("authentication.webhook.enabled" | "authentication-token-webhook") => serving.authn_webhook: OptBool,
    ("authentication.webhook.cacheTTL" | "authentication-token-webhook-cache-ttl")
        => serving.authn_webhook_cache_ttl: Dur,
    /// Serve requests without credentials as system:anonymous.
    ("authentication.anonymous.enabled" | "anonymous-auth") => serving.anonymous_auth: Bool,
    /// AlwaysAllow or Webhook.
    ("authorization.mode" | "authorization-mode") => serving.authz_mode: Authz,
    ("authorization.webhook.cacheAuthorizedTTL" | "authorization-webhook-cache-authorized-ttl")
        => serving.authz_cache_authorized_ttl: Dur,
    ("authorization.webhook.cacheUnauthorizedTTL" | "authorization-webhook-cache-unauthorized-ttl")
        => serving.authz_cache_unauthorized_ttl: Dur,

    // Images.
    /// Registry mirrors, rewrites, TLS and auth (k3s registries.yaml); default
    /// <root-dir>/registries.yaml.
    ("ferrolet.registryConfigFile" | "registry-config") => images.registry_config_file: OptPath,
    /// Pull one image at a time (kubelet's serializeImagePulls, default true).
    ("serializeImagePulls" | "serialize-image-pulls") => images.serialize_image_pulls: Bool,
    /// Pulls at once when not serialized (kubelet's maxParallelImagePulls).
    ("maxParallelImagePulls" | "max-parallel-image-pulls") => images.max_parallel_image_pulls: MaxParallel,
    /// Image pulls a second, 0 for no limit (kubelet's registryPullQPS, default 5).
    ("registryPullQPS" | "registry-qps") => images.registry_pull_qps: RegistryQps,
    /// Burst of image pulls (kubelet's registryBurst, default 10).
    ("registryBurst" | "registry-burst") => images.registry_burst: RegistryBurst,
    /// Image GC starts at this percent of the image filesystem used (default 85).
    ("imageGCHighThresholdPercent" | "image-gc-high-threshold") => images.image_gc_high_threshold_percent: Percent,
    /// Image GC frees down to this percent (default 80).
    ("imageGCLowThresholdPercent" | "image-gc-low-threshold") => images.image_gc_low_threshold_percent: Percent,
    /// Images younger than this are not collected (default 2m).
    ("imageMinimumGCAge" | "minimum-image-gc-age") => images.image_minimum_gc_age: Dur,
    ("imageMaximumGCAge" | _) => images.image_maximum_gc_age: Dur,
    /// A download making no progress this long fails (default 1m, 0 none).
    ("ferrolet.imagePullProgressTimeout" | "image-pull-progress-timeout") => images.image_pull_progress_timeout: Dur,
    ("ferrolet.imageGCPeriod" | _) => images.image_gc_period: Dur,
    ("ferrolet.maxConcurrentDownloads" | _) => images.max_concurrent_downloads: Int<u32>,
    /// Images in the Node's status, -1 for all (default 50).
    ("nodeStatusMaxImages" | "node-status-max-images") => images.node_status_max_images: Int<i32>,
    /// CredentialProviderConfig of exec credential plugins.
    ("ferrolet.imageCredentialProviderConfig" | "image-credential-provider-config")
        => images.credential_provider_config: OptPath,
    /// Where the credential plugins' binaries are.
    ("ferrolet.imageCredentialProviderBinDir" | "image-credential-provider-bin-dir")
        => images.credential_provider_bin_dir: OptPath,
}

/// Top-level names the file also accepts for a `ferrolet.` setting (the contract of issue 14
/// names them so).
pub const ALIASES: &[(&str, &str)] = &[
    ("registryConfigFile", "ferrolet.registryConfigFile"),
    ("imagePullProgressTimeout", "ferrolet.imagePullProgressTimeout"),
];

/// The setting whose file field is `path`.
pub fn by_json(path: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.json == Some(path))
}

/// Whether `path` is an object holding settings (`authentication`, `ferrolet`...).
pub fn is_object(path: &str) -> bool {
    SETTINGS
        .iter()
        .filter_map(|s| s.json)
        .any(|j| j.strip_prefix(path).is_some_and(|rest| rest.starts_with('.')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let mut json: Vec<_> = SETTINGS.iter().filter_map(|s| s.json).collect();
        let mut flags: Vec<_> = SETTINGS.iter().filter_map(|s| s.flag).collect();
        let (nj, nf) = (json.len(), flags.len());
        json.sort();
        json.dedup();
        flags.sort();
        flags.dedup();
        assert_eq!((json.len(), flags.len()), (nj, nf), "a field or flag declared twice");
        assert!(SETTINGS.iter().all(|s| s.json.is_some() || s.flag.is_some()));
        // A field is a value or an object of fields, never both (/configz nests by the dots).
        for j in json {
            assert!(!is_object(j), "{j} is a setting and an object of settings");
        }
    }
}
