//! Graceful node shutdown (kubelet's shutdownGracePeriod, shutdownGracePeriodCriticalPods and
//! shutdownGracePeriodByPodPriority; ferrolet's logindConfDir): how long systemd-logind holds
//! a shutdown for the pods, split by pod priority. Validated with kubelet's messages
//! (pkg/kubelet/apis/config/validation). src/nodeshutdown/ acts on them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use super::codec::*;
use super::settings::declare;

/// One priority group of shutdownGracePeriodByPodPriority: pods with at least `priority`
/// (and below the next group's) get `shutdown_grace_period_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityGrace {
    pub priority: i32,
    pub shutdown_grace_period_seconds: i64,
}

declare! {
    #[derive(Debug, Clone, PartialEq)]
    pub struct ShutdownConfig {
        /// How long the node's shutdown is held for its pods (0: graceful shutdown is off).
        #[setting("shutdownGracePeriod" | _ => Dur)]
        pub grace_period: Duration = Duration::ZERO,
        /// The part of `grace_period` kept for critical pods (priority system-cluster-critical
        /// and above), which stop last.
        #[setting("shutdownGracePeriodCriticalPods" | _ => Dur)]
        pub grace_period_critical_pods: Duration = Duration::ZERO,
        /// The grace periods by pod priority (instead of the two above).
        #[setting("shutdownGracePeriodByPodPriority" | _ => PriorityGraces)]
        pub by_pod_priority: Vec<PriorityGrace> = Vec::new(),
        /// Where the logind drop-in raising InhibitDelayMaxSec is written (kubelet's fixed
        /// /etc/systemd/logind.conf.d).
        #[setting("ferrolet.logindConfDir" | _ => FilePath, quiet)]
        pub logind_conf_dir: PathBuf = PathBuf::from("/etc/systemd/logind.conf.d"),
    }
}

impl ShutdownConfig {
    /// kubelet's validation of the shutdown settings.
    pub fn validate(&self) -> Result<()> {
        if self.grace_period_critical_pods > self.grace_period {
            bail!(
                "invalid configuration: shutdownGracePeriodCriticalPods ({}) must be <= shutdownGracePeriod ({})",
                crate::pod::units::format_duration(self.grace_period_critical_pods),
                crate::pod::units::format_duration(self.grace_period)
            );
        }
        if !self.by_pod_priority.is_empty()
            && (!self.grace_period.is_zero() || !self.grace_period_critical_pods.is_zero())
        {
            bail!("invalid configuration: Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at the same time");
        }
        for (i, g) in self.by_pod_priority.iter().enumerate() {
            if g.shutdown_grace_period_seconds < 0 {
                bail!(
                    "shutdownGracePeriodByPodPriority[{i}].shutdownGracePeriodSeconds: {} must not be negative",
                    g.shutdown_grace_period_seconds
                );
            }
        }
        Ok(())
    }

    /// Whether graceful node shutdown is on.
    pub fn enabled(&self) -> bool {
        !self.grace_period.is_zero() || !self.by_pod_priority.is_empty()
    }
}

/// shutdownGracePeriodByPodPriority: a list of `{priority, shutdownGracePeriodSeconds}`
/// (file only, as kubelet's).
pub struct PriorityGraces;
impl Codec for PriorityGraces {
    const VALUE_NAME: &'static str = "PRIORITY=DURATION,...";
    type T = Vec<PriorityGrace>;
    fn read(f: &str, v: &Value, _: &mut FileCx) -> Result<Self::T> {
        let list = v
            .as_array()
            .ok_or_else(|| anyhow!("{f}: expected a list of {{priority, shutdownGracePeriodSeconds}}"))?;
        let mut out = Vec::new();
        for (i, x) in list.iter().enumerate() {
            let field = format!("{f}[{i}]");
            let o = object(&field, x, "an object with priority and shutdownGracePeriodSeconds")?;
            for k in o.keys() {
                if k != "priority" && k != "shutdownGracePeriodSeconds" {
                    bail!("{field}: unknown field {k:?}");
                }
            }
            let int = |k: &str| -> Result<i64> { o.get(k).map_or(Ok(0), |v| integer(&format!("{field}.{k}"), v)) };
            let priority = int("priority")?;
            let priority = i32::try_from(priority)
                .map_err(|_| anyhow!("{field}.priority: {priority} is out of range for int32"))?;
            out.push(PriorityGrace {
                priority,
                shutdown_grace_period_seconds: int("shutdownGracePeriodSeconds")?,
            });
        }
        Ok(out)
    }
    fn show(t: &Self::T) -> Value {
        if t.is_empty() {
            return Value::Null;
        }
        t.iter()
            .map(|g| serde_json::json!({"priority": g.priority, "shutdownGracePeriodSeconds": g.shutdown_grace_period_seconds}))
            .collect::<Vec<_>>()
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelets_rules() {
        let s = |g: u64, c: u64| ShutdownConfig {
            grace_period: Duration::from_secs(g),
            grace_period_critical_pods: Duration::from_secs(c),
            ..Default::default()
        };
        s(30, 10).validate().unwrap();
        assert!(!s(0, 0).enabled() && s(30, 10).enabled());
        let e = s(10, 30).validate().unwrap_err().to_string();
        assert!(
            e.contains("shutdownGracePeriodCriticalPods (30s) must be <= shutdownGracePeriod (10s)"),
            "{e}"
        );
        let mut both = s(30, 0);
        both.by_pod_priority.push(PriorityGrace {
            priority: 0,
            shutdown_grace_period_seconds: 10,
        });
        let e = both.validate().unwrap_err().to_string();
        assert!(e.contains("Cannot specify both"), "{e}");
        let mut negative = s(0, 0);
        negative.by_pod_priority.push(PriorityGrace {
            priority: 0,
            shutdown_grace_period_seconds: -1,
        });
        let e = negative.validate().unwrap_err().to_string();
        assert!(
            e.contains("shutdownGracePeriodByPodPriority[0].shutdownGracePeriodSeconds"),
            "{e}"
        );
        assert!(negative.enabled());
    }

    #[test]
    fn read_from_the_file_and_shown_in_configz() {
        let mut c = crate::config::Config::default();
        let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\nferrolet:\n  logindConfDir: /run/test/logind\n";
        crate::config::file::apply_text(&mut c, text, std::path::Path::new("/")).unwrap();
        assert_eq!(c.shutdown.grace_period, Duration::from_secs(30));
        assert_eq!(c.shutdown.grace_period_critical_pods, Duration::from_secs(10));
        assert_eq!(c.shutdown.logind_conf_dir, PathBuf::from("/run/test/logind"));
        let z = crate::config::effective::kubelet_configuration(&c);
        assert_eq!(z["shutdownGracePeriod"], "30s");
        assert_eq!(z["shutdownGracePeriodCriticalPods"], "10s");

        let mut c = crate::config::Config::default();
        let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriodByPodPriority:\n- {priority: 100, shutdownGracePeriodSeconds: 20}\n";
        crate::config::file::apply_text(&mut c, text, std::path::Path::new("/")).unwrap();
        assert_eq!(
            c.shutdown.by_pod_priority,
            vec![PriorityGrace {
                priority: 100,
                shutdown_grace_period_seconds: 20
            }]
        );
        let z = crate::config::effective::kubelet_configuration(&c);
        assert_eq!(
            z["shutdownGracePeriodByPodPriority"],
            serde_json::json!([{"priority": 100, "shutdownGracePeriodSeconds": 20}])
        );
        let mut c = crate::config::Config::default();
        let bad = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriodByPodPriority:\n- {priority: 1, grace: 2}\n";
        let e = crate::config::file::apply_text(&mut c, bad, std::path::Path::new("/"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("shutdownGracePeriodByPodPriority[0]: unknown field \"grace\""),
            "{e}"
        );
    }
}
