//! Reading a KubeletConfiguration file (kubelet.config.k8s.io/v1beta1, YAML or JSON). Fields
//! ferrolet implements are applied; fields kubelet has but ferrolet does not implement are
//! accepted with a warning naming them; anything else is an error naming the field, as
//! kubelet's strict decoding does.

use std::net::IpAddr;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{Map, Value};

use super::serving::{AuthzMode, ServingConfig, TlsVersion};
use super::{resolve_relative, Config, EvictionHard, NetworkMode, Reserved, Threshold};
use crate::pod::units::{bytes, parse_duration};
use std::time::Duration;

/// KubeletConfiguration fields accepted but not acted on (yet).
use super::file::KNOWN_UNSUPPORTED;
pub const _K: &[&str] = &[
    "tlsCipherSuites",
    "enableContentionProfiling",
    "kubeletCgroups",
    "systemCgroups",
    "cgroupDriver",
    "cpuManagerPolicy",
    "cpuManagerPolicyOptions",
    "cpuManagerReconcilePeriod",
    "memoryManagerPolicy",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "hairpinMode",
    "maxOpenFiles",
    "contentType",
    "podsPerCore",
    "enableControllerAttachDetach",
    "protectKernelDefaults",
    "makeIPTablesUtilChains",
    "iptablesMasqueradeBit",
    "iptablesDropBit",
    "featureGates",
    "memorySwap",
    "configMapAndSecretChangeDetectionStrategy",
    "reservedSystemCPUs",
    "showHiddenMetricsForVersion",
    "volumePluginDir",
    "providerID",
    "kernelMemcgNotification",
    "logging",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "reservedMemory",
    "enableProfilingHandler",
    "enableDebugFlagsHandler",
    "memoryThrottlingFactor",
    "tracing",
    "localStorageCapacityIsolation",
    "containerRuntimeEndpoint",
    "imageServiceEndpoint",
    "failCgroupV1",
    "userNamespaces",
    "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist",
];

/// Apply the file at `path` onto `cfg`. Returns warnings (fields accepted but ignored).
pub fn apply_file(cfg: &mut Config, path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let base = std::fs::canonicalize(&base).unwrap_or(base);
    apply_text(cfg, &text, &base).map_err(|e| anyhow!("{}: {e:#}", path.display()))
}

/// Apply a KubeletConfiguration's text onto `cfg`; relative paths in it are relative to
/// `base`. Returns warnings (fields accepted but ignored).
pub fn apply_text(cfg: &mut Config, text: &str, base: &Path) -> Result<Vec<String>> {
    let value: Value = serde_saphyr::from_str(text).context("not valid YAML or JSON")?;
    let Value::Object(map) = value else {
        bail!("expected a KubeletConfiguration object");
    };
    apply_map(cfg, &map, base)
}

fn apply_map(cfg: &mut Config, map: &Map<String, Value>, base: &Path) -> Result<Vec<String>> {
    match map.get("kind").and_then(Value::as_str) {
        Some("KubeletConfiguration") => {}
        other => bail!("kind: expected KubeletConfiguration, got {other:?}"),
    }
    match map.get("apiVersion").and_then(Value::as_str) {
        Some("kubelet.config.k8s.io/v1beta1") | Some("kubelet.config.k8s.io/v1") => {}
        other => bail!("apiVersion: expected kubelet.config.k8s.io/v1beta1, got {other:?}"),
    }
    let mut warnings = Vec::new();
    let (mut eviction_hard, mut merge_eviction_defaults) = (None, false);
    for (key, v) in map {
        let f = key.as_str();
        match f {
            "kind" | "apiVersion" => {}
            "enableServer" => cfg.enable_server = boolean(f, v)?,
            "runOnce" => cfg.run_once = boolean(f, v)?,
            "staticPodPath" => cfg.static_pod_path = Some(resolve_relative(base, &string(f, v)?)),
            "staticPodURL" => cfg.static_pod_url = Some(string(f, v)?).filter(|s| !s.is_empty()),
            "staticPodURLHeader" => {
                let obj = v
                    .as_object()
                    .ok_or_else(|| anyhow!("{f}: expected a map of header name to list of values"))?;
                cfg.static_pod_url_headers.clear();
                for (k, vals) in obj {
                    let list = vals
                        .as_array()
                        .ok_or_else(|| anyhow!("{f}.{k}: expected a list of strings"))?;
                    for x in list {
                        cfg.static_pod_url_headers
                            .push((k.clone(), string(&format!("{f}.{k}"), x)?));
                    }
                }
            }
            "podLogsDir" => cfg.pod_logs_dir = resolve_relative(base, &string(f, v)?),
            "syncFrequency" => cfg.sync_frequency = duration(f, v)?,
            "volumeStatsAggPeriod" => cfg.volume_stats_agg_period = duration(f, v)?,
            "fileCheckFrequency" => cfg.file_check_frequency = duration(f, v)?,
            "httpCheckFrequency" => cfg.http_check_frequency = duration(f, v)?,
            "address" => cfg.address = ip(f, v)?,
            "readOnlyPort" => cfg.read_only_port = port(f, v)?,
            "port" => cfg.serving.port = port(f, v)?,
            "tlsCertFile" => {
                cfg.serving.tls_cert_file = Some(string(f, v)?)
                    .filter(|s| !s.is_empty())
                    .map(|p| resolve_relative(base, &p))
            }
            "tlsPrivateKeyFile" => {
                cfg.serving.tls_private_key_file = Some(string(f, v)?)
                    .filter(|s| !s.is_empty())
                    .map(|p| resolve_relative(base, &p))
            }
            "tlsMinVersion" => cfg.serving.tls_min_version = TlsVersion::parse(f, &string(f, v)?)?,
            "serverTLSBootstrap" => cfg.serving.server_tls_bootstrap = boolean(f, v)?,
            "healthzPort" => cfg.serving.healthz_port = port(f, v)?,
            "enableDebuggingHandlers" => cfg.serving.enable_debugging_handlers = boolean(f, v)?,
            "healthzBindAddress" => cfg.serving.healthz_bind_address = ip(f, v)?,
            "authentication" => apply_authentication(&mut cfg.serving, v, base)?,
            "authorization" => apply_authorization(&mut cfg.serving, v)?,
            "clusterDomain" => cfg.cluster_domain = string(f, v)?,
            "clusterDNS" => {
                let list = v
                    .as_array()
                    .ok_or_else(|| anyhow!("{f}: expected a list of IP addresses"))?;
                cfg.cluster_dns = list.iter().map(|x| ip(f, x)).collect::<Result<_>>()?;
            }
            "allowedUnsafeSysctls" => {
                let list = v
                    .as_array()
                    .ok_or_else(|| anyhow!("{f}: expected a list of sysctl names or patterns"))?;
                cfg.allowed_unsafe_sysctls = list.iter().map(|x| string(f, x)).collect::<Result<_>>()?;
            }
            "cgroupRoot" => cfg.cgroup_root = string(f, v)?,
            "cgroupsPerQOS" => cfg.cgroups_per_qos = boolean(f, v)?,
            "runtimeRequestTimeout" => cfg.runtime_request_timeout = duration(f, v)?,
            "streamingConnectionIdleTimeout" => cfg.streaming_connection_idle_timeout = duration(f, v)?,
            "maxPods" => cfg.max_pods = integer(f, v)?.try_into().map_err(|_| anyhow!("{f}: out of range"))?,
            "podCIDR" => cfg.pod_cidr = Some(string(f, v)?).filter(|s| !s.is_empty()),
            "podPidsLimit" => cfg.pod_pids_limit = integer(f, v)?,
            "resolvConf" => cfg.resolv_conf = resolve_relative(base, &string(f, v)?),
            "containerLogMaxSize" => {
                cfg.container_log_max_size = bytes(&string(f, v)?).map_err(|e| anyhow!("{f}: {e}"))? as u64
            }
            "containerLogMaxFiles" => {
                cfg.container_log_max_files = integer(f, v)?.try_into().map_err(|_| anyhow!("{f}: out of range"))?
            }
            "seccompDefault" => cfg.seccomp_default = boolean(f, v)?,
            "failSwapOn" => cfg.fail_swap_on = boolean(f, v)?,
            "rotateCertificates" => cfg.cluster.rotate_certificates = boolean(f, v)?,
            "registerNode" => cfg.cluster.register_node = boolean(f, v)?,
            "registerWithTaints" => {
                let list = v.as_array().ok_or_else(|| anyhow!("{f}: expected a list of taints"))?;
                cfg.cluster.register_with_taints = list
                    .iter()
                    .enumerate()
                    .map(|(i, t)| {
                        serde_json::from_value::<k8s_openapi::api::core::v1::Taint>(t.clone())
                            .map_err(|e| anyhow!("{f}[{i}]: {e}"))
                    })
                    .collect::<Result<_>>()?;
            }
            "nodeStatusUpdateFrequency" => cfg.cluster.node_status_update_frequency = duration(f, v)?,
            "nodeStatusReportFrequency" => cfg.cluster.node_status_report_frequency = duration(f, v)?,
            "nodeLeaseDurationSeconds" => {
                cfg.cluster.node_lease_duration_seconds =
                    integer(f, v)?.try_into().map_err(|_| anyhow!("{f}: out of range"))?
            }
            "kubeAPIQPS" => {
                cfg.cluster.kube_api_qps = integer(f, v)?.try_into().map_err(|_| anyhow!("{f}: out of range"))?
            }
            "kubeAPIBurst" => {
                cfg.cluster.kube_api_burst = integer(f, v)?.try_into().map_err(|_| anyhow!("{f}: out of range"))?
            }
            "eventRecordQPS" => {
                cfg.cluster.event_record_qps = integer(f, v)?
                    .try_into()
                    .map_err(|_| anyhow!("{f}: must be 0 (no limit) or a positive number of events a second"))?
            }
            "eventBurst" => {
                // 0 is unset: kubelet's defaulting fills in 100.
                cfg.cluster.event_burst = match integer(f, v)? {
                    0 => 100,
                    n => n.try_into().map_err(|_| anyhow!("{f}: must not be negative"))?,
                }
            }
            "systemReserved" => cfg.system_reserved = reserved(f, v, &mut warnings)?,
            "kubeReserved" => cfg.kube_reserved = reserved(f, v, &mut warnings)?,
            // The container manager (QoS tiers, CFS, node allocatable enforcement, OOM).
            "qosReserved" => {
                let obj = v
                    .as_object()
                    .ok_or_else(|| anyhow!("{f}: expected a map of resource to percentage"))?;
                cfg.cm.qos_reserved_memory = None;
                for (res, x) in obj {
                    let pct = string(&format!("{f}.{res}"), x)?;
                    cfg.cm.qos_reserved_memory = Some(super::qos_reserved_percent(f, res, &pct)?);
                }
            }
            "cpuCFSQuota" => cfg.cm.cpu_cfs_quota = boolean(f, v)?,
            "cpuCFSQuotaPeriod" => cfg.cm.cpu_cfs_quota_period = duration(f, v)?,
            "enforceNodeAllocatable" => {
                let list = v.as_array().ok_or_else(|| anyhow!("{f}: expected a list of strings"))?;
                let keys = list.iter().map(|x| string(f, x)).collect::<Result<Vec<_>>>()?;
                cfg.cm.enforce_node_allocatable =
                    super::enforce_node_allocatable_list("enforceNodeAllocatable (--enforce-node-allocatable)", keys)?;
            }
            "systemReservedCgroup" => cfg.cm.system_reserved_cgroup = string(f, v)?,
            "kubeReservedCgroup" => cfg.cm.kube_reserved_cgroup = string(f, v)?,
            "oomScoreAdj" => {
                cfg.cm.oom_score_adj = integer(f, v)?.try_into().map_err(|_| anyhow!("{f}: out of range"))?
            }
            "singleProcessOOMKill" => cfg.cm.single_process_oom_kill = boolean(f, v)?,
            "evictionHard" => eviction_hard = Some(parse_eviction_hard(f, v, &mut warnings)?),
            "mergeDefaultEvictionSettings" => {
                merge_eviction_defaults = boolean(f, v)?;
                cfg.merge_default_eviction_settings = merge_eviction_defaults
            }
            // The eviction manager, container GC and log rotation (src/config/eviction.rs).
            "evictionSoft" => cfg.eviction.soft = parse_eviction_hard(f, v, &mut warnings)?,
            "evictionSoftGracePeriod" => cfg.eviction.soft_grace_period = signal_map(f, v, duration)?,
            "evictionMinimumReclaim" => {
                cfg.eviction.minimum_reclaim = signal_map(f, v, |field, x| {
                    Threshold::parse(&string(field, x)?).map_err(|e| anyhow!("{field}: {e:#}"))
                })?
            }
            "evictionPressureTransitionPeriod" => cfg.eviction.pressure_transition_period = duration(f, v)?,
            "evictionMaxPodGracePeriod" => cfg.eviction.max_pod_grace_period = integer(f, v)?,
            "containerLogMaxWorkers" => {
                cfg.eviction.container_log_max_workers = integer(f, v)?.try_into().map_err(|_| {
                    anyhow!("invalid configuration: containerLogMaxWorkers must be greater than or equal to 1")
                })?
            }
            "containerLogMonitorInterval" => cfg.eviction.container_log_monitor_interval = duration(f, v)?,
            "crashLoopBackOff" => {
                let obj = v.as_object().ok_or_else(|| anyhow!("{f}: expected an object"))?;
                for (k, x) in obj {
                    match k.as_str() {
                        "maxContainerRestartPeriod" => {
                            cfg.max_container_restart_period = duration(&format!("{f}.{k}"), x)?
                        }
                        other => bail!("unknown field {f}.{other}"),
                    }
                }
            }
            "serializeImagePulls" => cfg.images.serialize_image_pulls = boolean(f, v)?,
            "maxParallelImagePulls" => {
                cfg.images.max_parallel_image_pulls = match v {
                    Value::Null => None,
                    _ => Some(
                        integer(f, v)?
                            .try_into()
                            .map_err(|_| anyhow!("{f}: must be a positive number"))?,
                    ),
                }
            }
            "registryPullQPS" => {
                cfg.images.registry_pull_qps = integer(f, v)?
                    .try_into()
                    .map_err(|_| anyhow!("registryPullQPS (--registry-qps) {v} must not be a negative number"))?
            }
            "registryBurst" => {
                cfg.images.registry_burst = integer(f, v)?
                    .try_into()
                    .map_err(|_| anyhow!("registryBurst (--registry-burst) {v} must not be a negative number"))?
            }
            "imageGCHighThresholdPercent" => cfg.images.image_gc_high_threshold_percent = percent(f, v)?,
            "imageGCLowThresholdPercent" => cfg.images.image_gc_low_threshold_percent = percent(f, v)?,
            "imageMinimumGCAge" => cfg.images.image_minimum_gc_age = duration(f, v)?,
            "imageMaximumGCAge" => cfg.images.image_maximum_gc_age = duration(f, v)?,
            "nodeStatusMaxImages" => {
                cfg.images.node_status_max_images =
                    integer(f, v)?.try_into().map_err(|_| anyhow!("{f}: out of range"))?
            }
            // ferrolet's own, accepted at the top level as the contract of issue 14 names them
            // (and under `ferrolet:`).
            "registryConfigFile" | "imagePullProgressTimeout" => apply_image_extension(cfg, f, f, v, base)?,
            "ferrolet" => apply_extensions(cfg, v, base)?,
            other if KNOWN_UNSUPPORTED.contains(&other) => warnings.push(format!(
                "{other} is a kubelet setting ferrolet does not implement; ignored"
            )),
            other => bail!("unknown field {other:?} (not a KubeletConfiguration field)"),
        }
    }
    if let Some(given) = eviction_hard {
        cfg.eviction_hard = merge_eviction(given, merge_eviction_defaults);
    }
    Ok(warnings)
}

/// A systemReserved / kubeReserved map: cpu, memory and ephemeral-storage are taken out of
/// allocatable; other resources are accepted with a warning.
fn reserved(f: &str, v: &Value, warnings: &mut Vec<String>) -> Result<Reserved> {
    let obj = v
        .as_object()
        .ok_or_else(|| anyhow!("{f}: expected a map of resource to quantity"))?;
    let mut r = Reserved::default();
    for (res, q) in obj {
        let field = format!("{f}.{res}");
        let q = string(&field, q)?;
        let amount = match res.as_str() {
            "cpu" => crate::pod::units::milli(&q).map_err(|e| anyhow!("{field}: {e}"))?,
            "memory" | "ephemeral-storage" => bytes(&q).map_err(|e| anyhow!("{field}: {e}"))?,
            "pid" => q
                .parse::<i64>()
                .map_err(|_| anyhow!("{field}: {q:?} is not a number of process ids"))?,
            other => {
                warnings.push(format!("{f}.{other} is not enforced by ferrolet"));
                continue;
            }
        };
        if amount < 0 {
            bail!("{field}: {q:?} is negative");
        }
        match res.as_str() {
            "cpu" => r.cpu_milli = amount,
            "memory" => r.memory = amount,
            "pid" => r.pid = amount,
            _ => r.ephemeral_storage = amount,
        }
    }
    Ok(r)
}

/// An evictionHard / evictionSoft map as the file names it (before kubelet's defaulting rule).
fn parse_eviction_hard(f: &str, v: &Value, warnings: &mut Vec<String>) -> Result<EvictionHard> {
    let obj = v
        .as_object()
        .ok_or_else(|| anyhow!("{f}: expected a map of signal to threshold"))?;
    let mut g = EvictionHard::none();
    for (signal, x) in obj {
        let field = format!("{f}.{signal}");
        let t = Threshold::parse(&string(&field, x)?).map_err(|e| anyhow!("{field}: {e:#}"))?;
        if !g.set(signal, Some(t)) {
            match signal.as_str() {
                "allocatableMemory.available" => warnings.push(format!("{field} is not measured by ferrolet")),
                other => bail!("{f}: unsupported eviction signal {other:?}"),
            }
        }
    }
    Ok(g)
}

/// A map of eviction signal to a value (evictionSoftGracePeriod, evictionMinimumReclaim).
fn signal_map<T>(
    f: &str,
    v: &Value,
    parse: impl Fn(&str, &Value) -> Result<T>,
) -> Result<std::collections::BTreeMap<String, T>> {
    let obj = v
        .as_object()
        .ok_or_else(|| anyhow!("{f}: expected a map of eviction signal to value"))?;
    let mut out = std::collections::BTreeMap::new();
    for (signal, x) in obj {
        if !super::EVICTION_SIGNALS.contains(&signal.as_str()) {
            bail!("{f}: unsupported eviction signal {signal:?}");
        }
        out.insert(signal.clone(), parse(&format!("{f}.{signal}"), x)?);
    }
    Ok(out)
}

/// kubelet's rule: an evictionHard map replaces the defaults, unless
/// mergeDefaultEvictionSettings asks for the defaults of the signals it does not name.
fn merge_eviction(given: EvictionHard, merge_defaults: bool) -> EvictionHard {
    if !merge_defaults {
        return given;
    }
    let mut out = EvictionHard::default();
    for (signal, t) in given.iter() {
        out.set(signal, Some(t));
    }
    out
}

/// ferrolet's own settings, under a `ferrolet:` key of the same file.
fn apply_extensions(cfg: &mut Config, v: &Value, base: &Path) -> Result<()> {
    let obj = v.as_object().ok_or_else(|| anyhow!("ferrolet: expected an object"))?;
    for (k, x) in obj {
        let f = format!("ferrolet.{k}");
        match k.as_str() {
            "network" => {
                cfg.network.mode = match string(&f, x)?.as_str() {
                    "bridge" => NetworkMode::Bridge,
                    "cni" => NetworkMode::Cni,
                    "none" => NetworkMode::None,
                    other => bail!("{f}: expected bridge, cni or none, got {other:?}"),
                }
            }
            "bridgeName" => cfg.network.bridge = string(&f, x)?,
            "podSubnet" => cfg.network.subnet = string(&f, x)?,
            "cniConfDir" => cfg.network.cni_conf_dir = resolve_relative(base, &string(&f, x)?),
            "cniBinDirs" => {
                let list = x.as_array().ok_or_else(|| anyhow!("{f}: expected a list of paths"))?;
                cfg.network.cni_bin_dirs = list
                    .iter()
                    .map(|p| string(&f, p).map(|s| resolve_relative(base, &s)))
                    .collect::<Result<_>>()?;
            }
            "imageImportDir" => cfg.image_import_dir = resolve_relative(base, &string(&f, x)?),
            "loadDemoImage" => cfg.load_demo_image = boolean(&f, x)?,
            "initialContainerRestartPeriod" => cfg.initial_container_restart_period = duration(&f, x)?,
            "nodeIP" => cfg.node_ip = Some(ip(&f, x)?),
            "containerLogLinkDir" => cfg.container_log_link_dir = resolve_relative(base, &string(&f, x)?),
            "qosUpdatePeriod" => cfg.cm.qos_update_period = duration(&f, x)?,
            "registryConfigFile"
            | "imagePullProgressTimeout"
            | "imageGCPeriod"
            | "maxConcurrentDownloads"
            | "imageCredentialProviderConfig"
            | "imageCredentialProviderBinDir" => apply_image_extension(cfg, k, &f, x, base)?,
            "evictionMonitoringPeriod" => cfg.eviction.monitoring_period = duration(&f, x)?,
            "containerGCPeriod" => cfg.eviction.container_gc.period = duration(&f, x)?,
            "minimumContainerTTLDuration" => cfg.eviction.container_gc.min_age = duration(&f, x)?,
            "maximumDeadContainersPerContainer" => {
                cfg.eviction.container_gc.max_per_pod_container =
                    integer(&f, x)?.try_into().map_err(|_| anyhow!("{f}: out of range"))?
            }
            "maximumDeadContainers" => {
                cfg.eviction.container_gc.max_containers =
                    integer(&f, x)?.try_into().map_err(|_| anyhow!("{f}: out of range"))?
            }
            other => bail!("unknown field ferrolet.{other}"),
        }
    }
    Ok(())
}

/// ferrolet's image settings (`key`), named `f` in errors.
fn apply_image_extension(cfg: &mut Config, key: &str, f: &str, x: &Value, base: &Path) -> Result<()> {
    let i = &mut cfg.images;
    match key {
        "registryConfigFile" => i.registry_config_file = Some(resolve_relative(base, &string(f, x)?)),
        "imagePullProgressTimeout" => i.image_pull_progress_timeout = duration(f, x)?,
        "imageGCPeriod" => i.image_gc_period = duration(f, x)?,
        "maxConcurrentDownloads" => {
            i.max_concurrent_downloads = integer(f, x)?.try_into().map_err(|_| anyhow!("{f}: out of range"))?
        }
        "imageCredentialProviderConfig" => i.credential_provider_config = Some(resolve_relative(base, &string(f, x)?)),
        "imageCredentialProviderBinDir" => i.credential_provider_bin_dir = Some(resolve_relative(base, &string(f, x)?)),
        other => bail!("unknown field {other}"),
    }
    Ok(())
}

fn percent(f: &str, v: &Value) -> Result<i32> {
    let n = integer(f, v)?;
    i32::try_from(n).map_err(|_| anyhow!("{f}: {n} must be between 0 and 100, inclusive"))
}

fn string(f: &str, v: &Value) -> Result<String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("{f}: expected a string, got {v}"))
}

fn boolean(f: &str, v: &Value) -> Result<bool> {
    v.as_bool()
        .ok_or_else(|| anyhow!("{f}: expected true or false, got {v}"))
}

fn integer(f: &str, v: &Value) -> Result<i64> {
    v.as_i64().ok_or_else(|| anyhow!("{f}: expected an integer, got {v}"))
}

fn duration(f: &str, v: &Value) -> Result<std::time::Duration> {
    parse_duration(&string(f, v)?).map_err(|e| anyhow!("{f}: {e}"))
}

fn ip(f: &str, v: &Value) -> Result<IpAddr> {
    let s = string(f, v)?;
    s.parse().map_err(|_| anyhow!("{f}: {s:?} is not an IP address"))
}

fn port(f: &str, v: &Value) -> Result<u16> {
    let n = integer(f, v)?;
    u16::try_from(n).map_err(|_| anyhow!("{f}: {n} is not a port number"))
}

fn apply_authentication(s: &mut ServingConfig, v: &Value, base: &Path) -> Result<()> {
    for (k, x) in object("authentication", v)? {
        let f = format!("authentication.{k}");
        match k.as_str() {
            "x509" => {
                for (k2, y) in object(&f, x)? {
                    match k2.as_str() {
                        "clientCAFile" => {
                            let p = string(&format!("{f}.{k2}"), y)?;
                            s.client_ca_file = (!p.is_empty()).then(|| resolve_relative(base, &p));
                        }
                        other => bail!("unknown field {f}.{other}"),
                    }
                }
            }
            "webhook" => {
                for (k2, y) in object(&f, x)? {
                    let f2 = format!("{f}.{k2}");
                    match k2.as_str() {
                        "enabled" => s.authn_webhook = Some(boolean(&f2, y)?),
                        "cacheTTL" => s.authn_webhook_cache_ttl = duration(&f2, y)?,
                        other => bail!("unknown field {f}.{other}"),
                    }
                }
            }
            "anonymous" => {
                for (k2, y) in object(&f, x)? {
                    match k2.as_str() {
                        "enabled" => s.anonymous_auth = boolean(&format!("{f}.{k2}"), y)?,
                        other => bail!("unknown field {f}.{other}"),
                    }
                }
            }
            other => bail!("unknown field authentication.{other}"),
        }
    }
    Ok(())
}

/// The file's `authorization` object.
fn apply_authorization(s: &mut ServingConfig, v: &Value) -> Result<()> {
    for (k, x) in object("authorization", v)? {
        let f = format!("authorization.{k}");
        match k.as_str() {
            "mode" => s.authz_mode = Some(AuthzMode::parse(&f, &string(&f, x)?)?),
            "webhook" => {
                for (k2, y) in object(&f, x)? {
                    let f2 = format!("{f}.{k2}");
                    match k2.as_str() {
                        "cacheAuthorizedTTL" => s.authz_cache_authorized_ttl = duration(&f2, y)?,
                        "cacheUnauthorizedTTL" => s.authz_cache_unauthorized_ttl = duration(&f2, y)?,
                        other => bail!("unknown field {f}.{other}"),
                    }
                }
            }
            other => bail!("unknown field authorization.{other}"),
        }
    }
    Ok(())
}

fn object<'a>(f: &str, v: &'a Value) -> Result<&'a serde_json::Map<String, Value>> {
    v.as_object().ok_or_else(|| anyhow!("{f}: expected an object, got {v}"))
}
