//! Reading a KubeletConfiguration file (kubelet.config.k8s.io/v1beta1, YAML or JSON). Fields
//! ferrolet implements are applied; fields kubelet has but ferrolet does not implement are
//! accepted with a warning naming them; anything else is an error naming the field, as
//! kubelet's strict decoding does.

use std::net::IpAddr;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{Map, Value};

use super::serving::{self, TlsVersion};
use super::{resolve_relative, Config, EvictionHard, NetworkMode, Reserved, Threshold};
use crate::pod::units::{bytes, parse_duration};

/// KubeletConfiguration fields accepted but not acted on (yet).
pub const KNOWN_UNSUPPORTED: &[&str] = &[
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
            "authentication" => serving::apply_authentication(&mut cfg.serving, v, base)?,
            "authorization" => serving::apply_authorization(&mut cfg.serving, v)?,
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
            "mergeDefaultEvictionSettings" => merge_eviction_defaults = boolean(f, v)?,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(yaml: &str) -> Result<(Config, Vec<String>)> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.yaml");
        std::fs::write(&p, yaml).unwrap();
        let mut c = Config::default();
        let w = apply_file(&mut c, &p)?;
        Ok((c, w))
    }

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    #[test]
    fn applies_known_fields() {
        let (c, w) = apply(&format!(
            "{HEAD}staticPodPath: /srv/m\nfileCheckFrequency: 5s\nsyncFrequency: 1m\nmaxPods: 7\ncontainerLogMaxSize: 1Mi\ncrashLoopBackOff:\n  maxContainerRestartPeriod: 60s\nfeatureGates:\n  Foo: true\nferrolet:\n  network: none\n"
        ))
        .unwrap();
        assert_eq!(c.static_pod_path.as_deref(), Some(Path::new("/srv/m")));
        assert_eq!(c.file_check_frequency.as_secs(), 5);
        assert_eq!(c.sync_frequency.as_secs(), 60);
        assert_eq!(c.max_pods, 7);
        assert_eq!(c.container_log_max_size, 1 << 20);
        assert_eq!(c.max_container_restart_period.as_secs(), 60);
        assert_eq!(c.network.mode, NetworkMode::None);
        assert!(w.iter().any(|x| x.contains("featureGates")));
    }

    #[test]
    fn run_once_and_the_log_link_dir() {
        let (c, w) = apply(&format!(
            "{HEAD}runOnce: true\nferrolet:\n  containerLogLinkDir: /srv/log/containers\n"
        ))
        .unwrap();
        assert!(c.run_once);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.container_log_link_dir, Path::new("/srv/log/containers"));
        assert_eq!(
            Config::default().container_log_link_dir,
            Path::new("/var/log/containers")
        );
        let e = apply(&format!("{HEAD}runOnce: sometimes\n")).unwrap_err().to_string();
        assert!(e.contains("runOnce"), "{e}");
    }

    #[test]
    fn enable_debugging_handlers_is_read_and_defaults_on() {
        assert!(Config::default().serving.enable_debugging_handlers);
        let (c, w) = apply(&format!("{HEAD}enableDebuggingHandlers: false\n")).unwrap();
        assert!(!c.serving.enable_debugging_handlers);
        assert!(w.is_empty(), "acted on, not ignored: {w:?}");
        let e = apply(&format!("{HEAD}enableDebuggingHandlers: no-thanks\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("enableDebuggingHandlers"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        let e = apply(&format!("{HEAD}fileCheckFrequency: 20x\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("fileCheckFrequency"), "{e}");
        let e = apply(&format!("{HEAD}bogusField: 1\n")).unwrap_err().to_string();
        assert!(e.contains("bogusField"), "{e}");
        let e = apply(&format!("{HEAD}maxPods: many\n")).unwrap_err().to_string();
        assert!(e.contains("maxPods"), "{e}");
        let e = apply("kind: Pod\napiVersion: v1\n").unwrap_err().to_string();
        assert!(e.contains("kind"), "{e}");
    }

    #[test]
    fn container_manager_fields() {
        let (c, w) = apply(&format!(
            "{HEAD}qosReserved: {{memory: 50%}}\ncpuCFSQuota: false\ncpuCFSQuotaPeriod: 50ms\nenforceNodeAllocatable: [pods, kube-reserved]\nkubeReservedCgroup: /kube.slice\noomScoreAdj: -500\nsingleProcessOOMKill: true\nferrolet: {{qosUpdatePeriod: 5s}}\n"
        ))
        .unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.cm.qos_reserved_memory, Some(50));
        assert!(!c.cm.cpu_cfs_quota);
        assert_eq!(c.cm.cpu_cfs_quota_period, std::time::Duration::from_millis(50));
        assert_eq!(c.cm.enforce_node_allocatable, ["pods", "kube-reserved"]);
        assert_eq!(c.cm.kube_reserved_cgroup, "/kube.slice");
        assert_eq!(c.cm.oom_score_adj, -500);
        assert!(c.cm.single_process_oom_kill);
        assert_eq!(c.cm.qos_update_period, std::time::Duration::from_secs(5));
        c.cm.validate(true).unwrap();
        let (c, _) = apply(&format!("{HEAD}enforceNodeAllocatable: [none]\n")).unwrap();
        assert!(c.cm.enforce_node_allocatable.is_empty());
        for (bad, want) in [
            (
                "enforceNodeAllocatable: [none, pods]",
                "may not contain additional enforcements",
            ),
            ("qosReserved: {memory: 150%}", "between 0% and 100%"),
            ("qosReserved: {cpu: 50%}", "only memory"),
        ] {
            let e = apply(&format!("{HEAD}{bad}\n")).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
        for (bad, want) in [
            (
                "enforceNodeAllocatable: [kube-reserved]",
                "kubeReservedCgroup (--kube-reserved-cgroup) must be specified",
            ),
            (
                "enforceNodeAllocatable: [system-reserved]",
                "systemReservedCgroup (--system-reserved-cgroup) must be specified",
            ),
            (
                "enforceNodeAllocatable: [bogus]",
                "option \"bogus\" specified for enforceNodeAllocatable",
            ),
            ("cpuCFSQuotaPeriod: 2s", "must be between 1ms and 1sec"),
            ("oomScoreAdj: -1001", "must be between -1000 and 1000"),
        ] {
            let (c, _) = apply(&format!("{HEAD}{bad}\n")).unwrap();
            let e = c.cm.validate(true).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
        let (c, _) = apply(&format!("{HEAD}cgroupsPerQOS: false\n")).unwrap();
        assert!(c
            .cm
            .validate(false)
            .unwrap_err()
            .to_string()
            .contains("is not supported unless cgroupsPerQOS"));
    }

    #[test]
    fn eviction_manager_gc_and_log_rotation_settings() {
        let (c, w) = apply(&format!(
            "{HEAD}evictionSoft:\n  memory.available: 1Gi\n  nodefs.inodesFree: 10%\nevictionSoftGracePeriod:\n  memory.available: 1m30s\n  nodefs.inodesFree: 2m\nevictionMinimumReclaim:\n  nodefs.available: 500Mi\nevictionPressureTransitionPeriod: 30s\nevictionMaxPodGracePeriod: 60\ncontainerLogMaxWorkers: 3\ncontainerLogMonitorInterval: 5s\nferrolet:\n  evictionMonitoringPeriod: 1s\n  containerGCPeriod: 2s\n  maximumDeadContainersPerContainer: 2\n  maximumDeadContainers: 10\n  minimumContainerTTLDuration: 1m\n"
        ))
        .unwrap();
        assert!(w.is_empty(), "{w:?}");
        let e = &c.eviction;
        assert_eq!(e.soft.memory_available, Some(Threshold::Quantity(1 << 30)));
        assert_eq!(e.soft.nodefs_inodes_free, Some(Threshold::Percent(10.0)));
        assert_eq!(
            e.soft_grace_period["memory.available"],
            std::time::Duration::from_secs(90)
        );
        assert_eq!(e.minimum_reclaim["nodefs.available"], Threshold::Quantity(500 << 20));
        assert_eq!(e.pressure_transition_period, std::time::Duration::from_secs(30));
        assert_eq!(e.max_pod_grace_period, 60);
        assert_eq!(e.container_log_max_workers, 3);
        assert_eq!(e.container_log_monitor_interval, std::time::Duration::from_secs(5));
        assert_eq!(e.monitoring_period, std::time::Duration::from_secs(1));
        assert_eq!(e.container_gc.period, std::time::Duration::from_secs(2));
        assert_eq!(e.container_gc.max_per_pod_container, 2);
        assert_eq!(e.container_gc.max_containers, 10);
        assert_eq!(e.container_gc.min_age, std::time::Duration::from_secs(60));
        let v = super::super::effective::kubelet_configuration(&c);
        assert_eq!(v["evictionSoft"]["memory.available"], "1073741824");
        assert_eq!(v["evictionSoftGracePeriod"]["memory.available"], "1m30s");
        assert_eq!(v["ferrolet"]["evictionMonitoringPeriod"], "1s");

        // kubelet's checks, naming the field.
        let mut bad = Config::default();
        apply_text(
            &mut bad,
            &format!("{HEAD}evictionSoft:\n  memory.available: 1Gi\n"),
            Path::new("/"),
        )
        .unwrap();
        let e = bad.validate().unwrap_err().to_string();
        assert!(
            e.contains("grace period must be specified for the soft eviction threshold memory.available"),
            "{e}"
        );
        let e = apply(&format!("{HEAD}evictionSoftGracePeriod:\n  memory.free: 1m\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unsupported eviction signal"), "{e}");
        let mut bad = Config::default();
        apply_text(
            &mut bad,
            &format!("{HEAD}containerLogMonitorInterval: 1s\n"),
            Path::new("/"),
        )
        .unwrap();
        let e = bad.validate().unwrap_err().to_string();
        assert!(
            e.contains("containerLogMonitorInterval must be a positive time duration greater than or equal to 3s"),
            "{e}"
        );
    }

    #[test]
    fn reservations_and_eviction_thresholds() {
        let (c, w) = apply(&format!(
            "{HEAD}systemReserved:\n  cpu: 500m\n  memory: 1Gi\n  pid: '100'\nkubeReserved:\n  cpu: '1'\n  ephemeral-storage: 2Gi\nevictionHard:\n  memory.available: 200Mi\n  imagefs.available: 10%\n"
        ))
        .unwrap();
        assert_eq!(
            c.system_reserved,
            Reserved {
                cpu_milli: 500,
                memory: 1 << 30,
                ephemeral_storage: 0,
                pid: 100,
            }
        );
        assert_eq!(c.kube_reserved.cpu_milli, 1000);
        assert_eq!(c.kube_reserved.ephemeral_storage, 2 << 30);
        // A given map replaces kubelet's defaults.
        assert_eq!(c.eviction_hard.memory_available, Some(Threshold::Quantity(200 << 20)));
        assert_eq!(c.eviction_hard.nodefs_available, None);
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.eviction_hard.imagefs_available, Some(Threshold::Percent(10.0)));

        let (c, _) = apply(&format!(
            "{HEAD}mergeDefaultEvictionSettings: true\nevictionHard:\n  pid.available: 5%\n"
        ))
        .unwrap();
        assert_eq!(c.eviction_hard.pid_available, Some(Threshold::Percent(5.0)));
        assert_eq!(
            c.eviction_hard.memory_available,
            EvictionHard::default().memory_available
        );
        assert_eq!(c.eviction_hard.nodefs_available, Some(Threshold::Percent(10.0)));

        let e = apply(&format!("{HEAD}evictionHard:\n  memory.available: 120%\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("evictionHard.memory.available"), "{e}");
        let e = apply(&format!("{HEAD}kubeReserved:\n  memory: lots\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("kubeReserved.memory"), "{e}");
    }

    #[test]
    fn event_rate_as_kubelet_reads_it() {
        let (c, w) = apply(&format!("{HEAD}eventRecordQPS: 0\neventBurst: 7\n")).unwrap();
        assert_eq!((c.cluster.event_record_qps, c.cluster.event_burst), (0, 7));
        assert!(w.is_empty(), "{w:?}");
        let (c, _) = apply(&format!("{HEAD}eventBurst: 0\n")).unwrap();
        assert_eq!((c.cluster.event_record_qps, c.cluster.event_burst), (50, 100));
        let e = apply(&format!("{HEAD}eventRecordQPS: -1\n")).unwrap_err().to_string();
        assert!(e.contains("eventRecordQPS"), "{e}");
    }

    #[test]
    fn the_example_configs_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        for f in ["kubelet-config.yaml", "kubelet-config-cluster.yaml"] {
            let mut c = Config::default();
            apply_file(&mut c, &dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e:#}"));
        }
        let mut c = Config::default();
        apply_file(&mut c, &dir.join("kubelet-config-cluster.yaml")).unwrap();
        assert_eq!(c.cluster.register_with_taints[0].effect, "NoSchedule");
        assert_eq!(c.cluster.node_lease_duration_seconds, 40);
    }

    #[test]
    fn image_settings_and_their_validation() {
        let (c, w) = apply(&format!(
            "{HEAD}serializeImagePulls: false\nmaxParallelImagePulls: 3\nregistryPullQPS: 0\nregistryBurst: 4\nimageGCHighThresholdPercent: 90\nimageGCLowThresholdPercent: 70\nimageMinimumGCAge: 1m\nnodeStatusMaxImages: -1\nregistryConfigFile: reg.yaml\nferrolet:\n  imagePullProgressTimeout: 30s\n  imageGCPeriod: 2s\n"
        ))
        .unwrap();
        assert!(w.is_empty(), "{w:?}");
        let i = &c.images;
        assert!(!i.serialize_image_pulls);
        assert_eq!(i.max_parallel_image_pulls, Some(3));
        assert_eq!((i.registry_pull_qps, i.registry_burst), (0, 4));
        assert_eq!(
            (i.image_gc_high_threshold_percent, i.image_gc_low_threshold_percent),
            (90, 70)
        );
        assert_eq!(i.image_minimum_gc_age.as_secs(), 60);
        assert_eq!(i.node_status_max_images, -1);
        assert!(i.registry_config_file.as_ref().unwrap().ends_with("reg.yaml"));
        assert_eq!(i.image_pull_progress_timeout.as_secs(), 30);
        assert_eq!(i.image_gc_period.as_secs(), 2);
        c.validate().unwrap();
        for (yaml, want) in [
            ("imageGCHighThresholdPercent: 70\nimageGCLowThresholdPercent: 80\n", "imageGCLowThresholdPercent (--image-gc-low-threshold) 80 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 70"),
            ("imageGCHighThresholdPercent: 101\n", "imageGCHighThresholdPercent (--image-gc-high-threshold) 101 must be between 0 and 100"),
            ("maxParallelImagePulls: 2\n", "maxParallelImagePulls (2) must be unset (or 1) when serializeImagePulls is true"),
            ("nodeStatusMaxImages: -2\n", "nodeStatusMaxImages"),
        ] {
            let (c, _) = apply(&format!("{HEAD}{yaml}")).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let e = apply(&format!("{HEAD}registryPullQPS: -1\n")).unwrap_err().to_string();
        assert!(
            e.contains("registryPullQPS (--registry-qps) -1 must not be a negative number"),
            "{e}"
        );
        let e = apply(&format!("{HEAD}imageMinimumGCAge: soon\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("imageMinimumGCAge"), "{e}");
    }

    #[test]
    fn relative_paths_resolve_against_the_file() {
        let (c, _) = apply(&format!("{HEAD}staticPodPath: manifests\n")).unwrap();
        let p = c.static_pod_path.unwrap();
        assert!(p.is_absolute() && p.ends_with("manifests"), "{}", p.display());
    }
}
