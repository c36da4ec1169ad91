//! Pod cgroups the way kubelet's cgroupfs driver lays them out (docs/cgroups.md#layout):
//! `<cgroupRoot>/kubepods/{burstable,besteffort}/pod<uid>` (Guaranteed pods directly under
//! `kubepods`), each pod's cgroup limited by the sum of its containers' requests and limits.
//! The container cgroups below them are created by the runtime.

use anyhow::{Context, Result};
use ferrolet_runtime::cgroups::{CgroupLimits, Cgroups};
use k8s_openapi::api::core::v1::Pod;

use crate::config::Config;
use crate::pod::{self, qos};

#[derive(Clone)]
pub struct PodCgroups {
    cgroups: Cgroups,
    root: String,
    per_qos: bool,
}

impl PodCgroups {
    pub fn new(cfg: &Config, cgroups: &Cgroups) -> Result<PodCgroups> {
        let root = if cfg.cgroup_root.is_empty() {
            cgroups
                .own_path()
                .context("finding the agent's own cgroup (the default cgroupRoot)")?
        } else {
            cfg.cgroup_root.clone()
        };
        Ok(PodCgroups {
            cgroups: cgroups.clone(),
            root: root.trim_end_matches('/').to_string(),
            per_qos: cfg.cgroups_per_qos,
        })
    }

    pub fn root(&self) -> &str {
        &self.root
    }

    /// The root of the pod cgroup tree (kubelet's kubepods).
    pub fn kubepods(&self) -> String {
        format!("{}/kubepods", self.root)
    }

    /// Create the QoS level cgroups (kubelet's QOSContainerManager).
    pub fn init(&self) -> Result<()> {
        if !self.per_qos {
            return Ok(());
        }
        let k = self.kubepods();
        self.cgroups
            .create(&k, &CgroupLimits::default())
            .with_context(|| format!("creating {k}"))?;
        self.cgroups
            .create(&format!("{k}/burstable"), &CgroupLimits::default())?;
        self.cgroups.create(
            &format!("{k}/besteffort"),
            &CgroupLimits {
                cpu_shares: Some(2),
                ..Default::default()
            },
        )?;
        Ok(())
    }

    pub fn pod_path(&self, p: &Pod) -> String {
        if !self.per_qos {
            return if self.root.is_empty() {
                "/".into()
            } else {
                self.root.clone()
            };
        }
        let uid = pod::uid(p);
        match qos::qos_class(p) {
            qos::QosClass::Guaranteed => format!("{}/pod{uid}", self.kubepods()),
            qos::QosClass::Burstable => format!("{}/burstable/pod{uid}", self.kubepods()),
            qos::QosClass::BestEffort => format!("{}/besteffort/pod{uid}", self.kubepods()),
        }
    }

    /// kubelet's ResourceConfigForPod.
    pub fn limits_for(p: &Pod, pids_limit: i64) -> CgroupLimits {
        let all: Vec<_> = pod::containers(p).iter().chain(pod::init_containers(p)).collect();
        let cpu_req = qos::pod_requests(p, "cpu");
        let all_cpu_limited = all.iter().all(|c| qos::limit(c, "cpu") > 0);
        let all_mem_limited = all.iter().all(|c| qos::limit(c, "memory") > 0);
        let sum_limits = |res: &str| -> i64 {
            let apps = pod::containers(p)
                .iter()
                .fold(0i64, |sum, c| sum.saturating_add(qos::limit(c, res)));
            let init = pod::init_containers(p)
                .iter()
                .map(|c| qos::limit(c, res))
                .max()
                .unwrap_or(0);
            apps.max(init)
        };
        let mut l = CgroupLimits {
            cpu_shares: Some(qos::milli_cpu_to_shares(cpu_req)),
            ..Default::default()
        };
        if qos::qos_class(p) == qos::QosClass::BestEffort {
            l.cpu_shares = Some(2);
        }
        if all_cpu_limited {
            l.cpu_quota = Some(qos::milli_cpu_to_quota(sum_limits("cpu")));
            l.cpu_period = Some(qos::CPU_PERIOD_US);
        }
        if all_mem_limited {
            l.memory_limit = Some(sum_limits("memory"));
        }
        if pids_limit > 0 {
            l.pids_limit = Some(pids_limit);
        }
        l
    }

    /// Create (or update) the pod's cgroup; returns its path.
    pub fn ensure_pod(&self, p: &Pod, pids_limit: i64) -> Result<String> {
        let path = self.pod_path(p);
        if !self.per_qos {
            return Ok(path);
        }
        let limits = Self::limits_for(p, pids_limit);
        let t = std::time::Instant::now();
        if self.cgroups.exists(&path) {
            let r = self.cgroups.update(&path, &limits);
            crate::metrics::global().cgroup_operation("update", t.elapsed());
            r.with_context(|| format!("updating pod cgroup {path}"))?;
        } else {
            let r = self.cgroups.create(&path, &limits);
            crate::metrics::global().cgroup_operation("create", t.elapsed());
            r.with_context(|| format!("creating pod cgroup {path}"))?;
        }
        Ok(path)
    }

    pub fn remove_pod(&self, p: &Pod) -> Result<()> {
        if !self.per_qos {
            return Ok(());
        }
        let path = self.pod_path(p);
        let t = std::time::Instant::now();
        let r = self.cgroups.remove(&path);
        crate::metrics::global().cgroup_operation("destroy", t.elapsed());
        r.with_context(|| format!("removing pod cgroup {path}"))
    }

    /// Pod cgroups that exist on the node (`pod<uid>` under each QoS level), for cleaning up
    /// pods that are no longer wanted.
    pub fn existing_pod_uids(&self) -> Vec<String> {
        if !self.per_qos {
            return Vec::new();
        }
        let mut out = Vec::new();
        let k = self.kubepods();
        for level in [k.clone(), format!("{k}/burstable"), format!("{k}/besteffort")] {
            if let Some(dir) = self.cgroups.dir_for("memory", &level) {
                for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                    if let Some(uid) = e.file_name().to_string_lossy().strip_prefix("pod") {
                        out.push(uid.to_string());
                    }
                }
            }
        }
        out
    }
}
