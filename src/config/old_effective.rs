//! The effective configuration as a KubeletConfiguration (kubelet.config.k8s.io/v1beta1 JSON
//! field names), for `/configz`: every setting ferrolet acts on, with the value in force after
//! defaults, the file and the flags, and the mode-dependent defaults resolved. Durations are
//! written as Go writes them (`2m0s`), quantities as strings.

use serde_json::{json, Map, Value};

use super::{Config, Reserved, Threshold};
use crate::pod::units::format_duration;

fn reserved(r: &Reserved) -> Value {
    let mut m = Map::new();
    if r.cpu_milli != 0 {
        m.insert("cpu".into(), format!("{}m", r.cpu_milli).into());
    }
    if r.memory != 0 {
        m.insert("memory".into(), r.memory.to_string().into());
    }
    if r.ephemeral_storage != 0 {
        m.insert("ephemeral-storage".into(), r.ephemeral_storage.to_string().into());
    }
    if r.pid != 0 {
        m.insert("pid".into(), r.pid.to_string().into());
    }
    Value::Object(m)
}

fn threshold(t: Threshold) -> String {
    match t {
        Threshold::Quantity(q) => q.to_string(),
        Threshold::Percent(p) => format!("{p}%"),
    }
}

fn path(p: &std::path::Path) -> Value {
    p.display().to_string().into()
}

/// `cfg` as KubeletConfiguration JSON.
pub fn kubelet_configuration(cfg: &Config) -> Value {
    let s = &cfg.serving;
    let c = &cfg.cluster;
    let in_cluster = cfg.in_cluster();
    let i = &cfg.images;
    let thresholds = |m: &super::EvictionHard| -> Map<String, Value> {
        m.iter()
            .into_iter()
            .map(|(s, t)| (s.to_string(), threshold(t).into()))
            .collect()
    };
    let eviction = thresholds(&cfg.eviction_hard);
    let ev = &cfg.eviction;
    let mut v = json!({
        "enableServer": cfg.enable_server,
        "staticPodPath": cfg.static_pod_path.as_deref().map(path),
        "staticPodURL": cfg.static_pod_url,
        "syncFrequency": format_duration(cfg.sync_frequency),
        "fileCheckFrequency": format_duration(cfg.file_check_frequency),
        "httpCheckFrequency": format_duration(cfg.http_check_frequency),
        "address": cfg.address.to_string(),
        "port": s.port,
        "readOnlyPort": cfg.read_only_port,
        "tlsCertFile": s.tls_cert_file.as_deref().map(path),
        "tlsPrivateKeyFile": s.tls_private_key_file.as_deref().map(path),
        "tlsMinVersion": s.tls_min_version.name(),
        "rotateCertificates": c.rotate_certificates,
        "serverTLSBootstrap": s.server_tls_bootstrap,
        "authentication": {
            "x509": {"clientCAFile": s.client_ca_file.as_deref().map(path)},
            "webhook": {
                "enabled": s.token_webhook(in_cluster),
                "cacheTTL": format_duration(s.authn_webhook_cache_ttl),
            },
            "anonymous": {"enabled": s.anonymous_auth},
        },
        "authorization": {
            "mode": s.authz_mode(in_cluster).name(),
            "webhook": {
                "cacheAuthorizedTTL": format_duration(s.authz_cache_authorized_ttl),
                "cacheUnauthorizedTTL": format_duration(s.authz_cache_unauthorized_ttl),
            },
        },
        "healthzPort": s.healthz_port,
        "healthzBindAddress": s.healthz_bind_address.to_string(),
        "enableDebuggingHandlers": s.enable_debugging_handlers,
    });
    let node = json!({
        "clusterDomain": cfg.cluster_domain,
        "clusterDNS": cfg.cluster_dns.iter().map(|i| i.to_string()).collect::<Vec<_>>(),
        "allowedUnsafeSysctls": cfg.allowed_unsafe_sysctls,
        "cgroupRoot": cfg.cgroup_root,
        "cgroupsPerQOS": cfg.cgroups_per_qos,
        "cgroupDriver": "cgroupfs",
        "maxPods": cfg.max_pods,
        "podCIDR": cfg.pod_cidr,
        "podPidsLimit": cfg.pod_pids_limit,
        "resolvConf": path(&cfg.resolv_conf),
        "runtimeRequestTimeout": format_duration(cfg.runtime_request_timeout),
        "podLogsDir": path(&cfg.pod_logs_dir),
        "containerLogMaxSize": cfg.container_log_max_size.to_string(),
        "containerLogMaxFiles": cfg.container_log_max_files,
        "seccompDefault": cfg.seccomp_default,
        "failSwapOn": cfg.fail_swap_on,
        "systemReserved": reserved(&cfg.system_reserved),
        "kubeReserved": reserved(&cfg.kube_reserved),
        "evictionHard": eviction,
        "registerNode": c.register_node,
        "registerWithTaints": c.register_with_taints,
        "nodeStatusUpdateFrequency": format_duration(c.node_status_update_frequency),
        "nodeStatusReportFrequency": format_duration(c.node_status_report_frequency),
        "nodeLeaseDurationSeconds": c.node_lease_duration_seconds,
        "kubeAPIQPS": c.kube_api_qps,
        "kubeAPIBurst": c.kube_api_burst,
        "eventRecordQPS": c.event_record_qps,
        "eventBurst": c.event_burst,
        "crashLoopBackOff": {"maxContainerRestartPeriod": format_duration(cfg.max_container_restart_period)},
    });
    // The container manager's and the eviction manager's (a macro of its own: json! recurses
    // once per field).
    let resources = json!({
        "qosReserved": cfg.cm.qos_reserved_memory.map_or_else(|| json!({}), |p| json!({"memory": format!("{p}%")})),
        "cpuCFSQuota": cfg.cm.cpu_cfs_quota,
        "cpuCFSQuotaPeriod": format_duration(cfg.cm.cpu_cfs_quota_period),
        "enforceNodeAllocatable": if cfg.cm.enforce_node_allocatable.is_empty() { vec!["none".to_string()] } else { cfg.cm.enforce_node_allocatable.clone() },
        "systemReservedCgroup": cfg.cm.system_reserved_cgroup,
        "kubeReservedCgroup": cfg.cm.kube_reserved_cgroup,
        "oomScoreAdj": cfg.cm.oom_score_adj,
        "singleProcessOOMKill": cfg.cm.single_process_oom_kill,
        "evictionSoft": thresholds(&ev.soft),
        "evictionSoftGracePeriod": ev.soft_grace_period.iter().map(|(s, d)| (s.clone(), Value::from(format_duration(*d)))).collect::<Map<String, Value>>(),
        "evictionMinimumReclaim": ev.minimum_reclaim.iter().map(|(s, t)| (s.clone(), Value::from(threshold(*t)))).collect::<Map<String, Value>>(),
        "evictionPressureTransitionPeriod": format_duration(ev.pressure_transition_period),
        "evictionMaxPodGracePeriod": ev.max_pod_grace_period,
        "containerLogMaxWorkers": ev.container_log_max_workers,
        "containerLogMonitorInterval": format_duration(ev.container_log_monitor_interval),
    });
    let images = json!({
        "serializeImagePulls": i.serialize_image_pulls,
        "maxParallelImagePulls": i.max_parallel_image_pulls,
        "registryPullQPS": i.registry_pull_qps,
        "registryBurst": i.registry_burst,
        "imageGCHighThresholdPercent": i.image_gc_high_threshold_percent,
        "imageGCLowThresholdPercent": i.image_gc_low_threshold_percent,
        "imageMinimumGCAge": format_duration(i.image_minimum_gc_age),
        "imageMaximumGCAge": format_duration(i.image_maximum_gc_age),
        "nodeStatusMaxImages": i.node_status_max_images,
        "ferrolet": {
            "registryConfigFile": path(&cfg.registry_config_file()),
            "imagePullProgressTimeout": format_duration(i.image_pull_progress_timeout),
            "imageGCPeriod": format_duration(i.image_gc_period),
            "maxConcurrentDownloads": i.max_concurrent_downloads,
            "imageCredentialProviderConfig": i.credential_provider_config.as_deref().map(path),
            "imageCredentialProviderBinDir": i.credential_provider_bin_dir.as_deref().map(path),
        },
    });
    for part in [node, resources, images] {
        if let (Value::Object(m), Value::Object(n)) = (&mut v, part) {
            m.extend(n);
        }
    }
    if let Value::Object(m) = &mut v {
        m.insert("runOnce".into(), cfg.run_once.into());
        if let Some(Value::Object(f)) = m.get_mut("ferrolet") {
            f.insert("containerLogLinkDir".into(), path(&cfg.container_log_link_dir));
            f.insert(
                "qosUpdatePeriod".into(),
                format_duration(cfg.cm.qos_update_period).into(),
            );
        }
    }
    // The eviction manager's, container GC's and log rotation's own settings.
    if let Some(Value::Object(f)) = v.get_mut("ferrolet") {
        let gc = &ev.container_gc;
        f.insert(
            "evictionMonitoringPeriod".into(),
            format_duration(ev.monitoring_period).into(),
        );
        f.insert("containerGCPeriod".into(), format_duration(gc.period).into());
        f.insert("minimumContainerTTLDuration".into(), format_duration(gc.min_age).into());
        f.insert(
            "maximumDeadContainersPerContainer".into(),
            gc.max_per_pod_container.into(),
        );
        f.insert("maximumDeadContainers".into(), gc.max_containers.into());
    }
    // kubelet's JSON leaves unset optional fields out
    if let Value::Object(m) = &mut v {
        m.retain(|_, x| !x.is_null());
        if let Some(Value::Object(f)) = m.get_mut("ferrolet") {
            f.retain(|_, y| !y.is_null());
        }
        if let Some(Value::Object(a)) = m.get_mut("authentication") {
            if let Some(Value::Object(x)) = a.get_mut("x509") {
                x.retain(|_, y| !y.is_null());
            }
        }
    }
    v
}
