//! The eviction manager's settings beyond evictionHard (kubelet's evictionSoft,
//! evictionSoftGracePeriod, evictionMinimumReclaim, evictionPressureTransitionPeriod,
//! evictionMaxPodGracePeriod; ferrolet's evictionMonitoringPeriod), container garbage
//! collection (kubelet's --minimum-container-ttl-duration, --maximum-dead-containers-per-container,
//! --maximum-dead-containers; ferrolet's containerGCPeriod) and container log rotation
//! (containerLogMaxWorkers, containerLogMonitorInterval). Validated with kubelet's messages.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Result};

use super::codec::*;
use super::settings::declare;
use super::{EvictionHard, EvictionThresholds, Threshold, EVICTION_SIGNALS};

declare! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct EvictionConfig {
        /// Soft thresholds: met only after their grace period (kubelet's evictionSoft).
        #[help = "Soft eviction thresholds, `memory.available<1Gi`."]
        #[setting("evictionSoft" | "eviction-soft" => Thresholds)]
        pub soft: EvictionThresholds = EvictionHard::none(),
        /// How long a soft threshold must be met before pods are evicted, by signal.
        #[help = "Grace periods of the soft thresholds, `memory.available=1m30s`."]
        #[setting("evictionSoftGracePeriod" | "eviction-soft-grace-period" => GraceMap)]
        pub soft_grace_period: BTreeMap<String, Duration> = BTreeMap::new(),
        /// How much beyond its threshold a signal must recover before the threshold is resolved,
        /// by signal (kubelet's evictionMinimumReclaim).
        #[help = "How far past its threshold a signal must recover, `nodefs.available=500Mi`."]
        #[setting("evictionMinimumReclaim" | "eviction-minimum-reclaim" => ReclaimMap)]
        pub minimum_reclaim: BTreeMap<String, Threshold> = BTreeMap::new(),
        /// How long a pressure condition stays after it was last observed (kubelet's 5m).
        #[help = "How long a pressure condition stays after it was last seen (default 5m)."]
        #[setting("evictionPressureTransitionPeriod" | "eviction-pressure-transition-period" => Dur)]
        pub pressure_transition_period: Duration = Duration::from_secs(300),
        /// The longest grace period a pod evicted for a soft threshold gets (seconds; kubelet's
        /// evictionMaxPodGracePeriod, 0 by default).
        #[help = "Longest grace period (seconds) of a pod evicted for a soft threshold."]
        #[setting("evictionMaxPodGracePeriod" | "eviction-max-pod-grace-period" => Int<i64>)]
        pub max_pod_grace_period: i64 = 0,
        /// How often the eviction manager looks (kubelet's fixed 10s;
        /// ferrolet.evictionMonitoringPeriod).
        #[setting("ferrolet.evictionMonitoringPeriod" | _ => Dur)]
        pub monitoring_period: Duration = Duration::from_secs(10),
        /// Container garbage collection.
        #[nested(ContainerGcConfig)]
        pub container_gc: ContainerGcConfig = ContainerGcConfig::default(),
        /// Parallel log rotations (kubelet's containerLogMaxWorkers, default 1).
        #[setting("containerLogMaxWorkers" | _ => LogWorkers)]
        pub container_log_max_workers: u32 = 1,
        /// How often container logs are checked for rotation (containerLogMonitorInterval, 10s).
        #[setting("containerLogMonitorInterval" | _ => Dur)]
        pub container_log_monitor_interval: Duration = Duration::from_secs(10),
    }
}

declare! {
    /// kubelet's container GC policy.
    #[derive(Debug, Clone, PartialEq)]
    pub struct ContainerGcConfig {
        /// Dead containers younger than this stay (--minimum-container-ttl-duration, 0).
        #[help = "Dead containers younger than this are not collected (default 0)."]
        #[setting("ferrolet.minimumContainerTTLDuration" | "minimum-container-ttl-duration" => Dur)]
        pub min_age: Duration = Duration::ZERO,
        /// Dead containers kept per container of a pod (--maximum-dead-containers-per-container, 1;
        /// negative: no limit).
        #[help = "Dead containers kept per container (default 1; negative: no limit)."]
        #[setting("ferrolet.maximumDeadContainersPerContainer" | "maximum-dead-containers-per-container" => Int<i32>)]
        pub max_per_pod_container: i32 = 1,
        /// Dead containers kept on the node (--maximum-dead-containers; negative: no limit).
        #[help = "Dead containers kept on the node (default -1: no limit)."]
        #[setting("ferrolet.maximumDeadContainers" | "maximum-dead-containers" => Int<i32>)]
        pub max_containers: i32 = -1,
        /// How often container GC runs (kubelet's fixed 1m; ferrolet.containerGCPeriod).
        #[setting("ferrolet.containerGCPeriod" | _ => Dur)]
        pub period: Duration = Duration::from_secs(60),
    }
}

impl EvictionConfig {
    /// kubelet's checks (ParseThresholdConfig and the configuration validation).
    pub fn validate(&self, hard: &EvictionHard) -> Result<()> {
        for (signal, _) in self.soft.iter() {
            match self.soft_grace_period.get(signal) {
                None => bail!(
                    "evictionSoftGracePeriod: grace period must be specified for the soft eviction threshold {signal}"
                ),
                Some(d) if d.is_zero() => {
                    bail!("evictionSoftGracePeriod: grace period for the soft eviction threshold {signal} must be positive")
                }
                Some(_) => {}
            }
        }
        for signal in self.soft_grace_period.keys() {
            if !EVICTION_SIGNALS.contains(&signal.as_str()) {
                bail!("evictionSoftGracePeriod: unsupported eviction signal {signal}");
            }
        }
        for (signal, t) in &self.minimum_reclaim {
            if !EVICTION_SIGNALS.contains(&signal.as_str()) {
                bail!("evictionMinimumReclaim: unsupported eviction signal {signal}");
            }
            if hard.get(signal).is_none() && self.soft.get(signal).is_none() {
                // kubelet accepts it and it has no effect; say so rather than ignore it.
                tracing::debug!(signal = %signal, "evictionMinimumReclaim for a signal without a threshold");
            }
            if let Threshold::Quantity(q) = t {
                if *q < 0 {
                    bail!("evictionMinimumReclaim.{signal}: must not be negative");
                }
            }
        }
        if self.max_pod_grace_period < 0 {
            bail!("evictionMaxPodGracePeriod: must not be negative");
        }
        if self.monitoring_period.is_zero() {
            bail!("ferrolet.evictionMonitoringPeriod: must be positive");
        }
        if self.container_gc.period.is_zero() {
            bail!("ferrolet.containerGCPeriod: must be positive");
        }
        if self.container_log_max_workers < 1 {
            bail!("invalid configuration: containerLogMaxWorkers must be greater than or equal to 1");
        }
        if self.container_log_monitor_interval < Duration::from_secs(3) {
            bail!("invalid configuration: containerLogMonitorInterval must be a positive time duration greater than or equal to 3s");
        }
        Ok(())
    }
}
