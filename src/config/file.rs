//! Reading a KubeletConfiguration file (kubelet.config.k8s.io/v1beta1, YAML or JSON). Fields
//! ferrolet implements (the settings of [`super::settings`]) are applied; fields kubelet has but
//! ferrolet does not implement are accepted with a warning naming them; anything else is an
//! error naming the field, as kubelet's strict decoding does.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{Map, Value};

use super::codec::FileCx;
use super::settings;
use super::{Config, EvictionHard};

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
    let mut cx = FileCx {
        base,
        warnings: &mut warnings,
    };
    for (key, v) in map {
        let f = key.as_str();
        match f {
            "kind" | "apiVersion" => {}
            _ if settings::by_json(f).is_some() || settings::is_object(f) => read(cfg, f, v, &mut cx)?,
            _ => match settings::ALIASES.iter().find(|(alias, _)| *alias == f) {
                Some((_, path)) => read_as(cfg, path, f, v, &mut cx)?,
                None if KNOWN_UNSUPPORTED.contains(&f) => cx
                    .warnings
                    .push(format!("{f} is a kubelet setting ferrolet does not implement; ignored")),
                None => bail!("unknown field {f:?} (not a KubeletConfiguration field)"),
            },
        }
    }
    // kubelet's rule: an evictionHard map replaces the defaults, unless
    // mergeDefaultEvictionSettings asks for the defaults of the signals it does not name.
    if map.contains_key("evictionHard") && cfg.merge_default_eviction_settings {
        let mut merged = EvictionHard::default();
        for (signal, t) in cfg.eviction_hard.iter() {
            merged.set(signal, Some(t));
        }
        cfg.eviction_hard = merged;
    }
    Ok(warnings)
}

/// Read the field at `path` (dotted inside objects): a setting, or an object of settings
/// whose fields are read in turn; anything else is an error naming it.
fn read(cfg: &mut Config, path: &str, v: &Value, cx: &mut FileCx) -> Result<()> {
    if settings::by_json(path).is_some() {
        return read_as(cfg, path, path, v, cx);
    }
    let obj = v
        .as_object()
        .ok_or_else(|| anyhow!("{path}: expected an object, got {v}"))?;
    for (k, x) in obj {
        let field = format!("{path}.{k}");
        if settings::by_json(&field).is_none() && !settings::is_object(&field) {
            bail!("unknown field {field}");
        }
        read(cfg, &field, x, cx)?;
    }
    Ok(())
}

/// Read the setting whose field is `path`, written `f` in the file.
fn read_as(cfg: &mut Config, path: &str, f: &str, v: &Value, cx: &mut FileCx) -> Result<()> {
    let s = settings::by_json(path).ok_or_else(|| anyhow!("unknown field {f}"))?;
    (s.read)(cfg, f, v, cx)
}

#[cfg(test)]
mod tests {
    use super::super::{NetworkMode, Reserved, Threshold};
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
