//! kubelet's pod container manager: pod cgroups the way kubelet's cgroupfs driver lays them
//! out (docs/cgroups.md#layout):
//! `<cgroupRoot>/kubepods/{burstable,besteffort}/pod<uid>` (Guaranteed pods directly under
//! `kubepods`), each pod's cgroup limited by the sum of its containers' requests and limits.
//! The container cgroups below them are created by the runtime.

use anyhow::{Context, Result};
use ferrolet_runtime::cgroups::{CgroupLimits, Cgroups};
use k8s_openapi::api::core::v1::Pod;

use crate::config::Config;
use crate::pod::{self, qos};

/// What a pod cgroup's limits depend on besides the pod (kubelet's ResourceConfigForPod
/// arguments).
#[derive(Debug, Clone)]
pub struct PodLimitOptions {
    /// podPidsLimit; -1 or 0: none.
    pub pids_limit: i64,
    /// cpuCFSQuota: cpu limits become a CFS quota.
    pub cfs_quota: bool,
    /// cpuCFSQuotaPeriod in µs.
    pub cfs_period_us: u64,
    /// The huge page sizes (kB) the kernel has when the hugetlb controller can limit them.
    pub hugepage_sizes_kb: Vec<u64>,
}

impl Default for PodLimitOptions {
    fn default() -> Self {
        PodLimitOptions {
            pids_limit: -1,
            cfs_quota: true,
            cfs_period_us: qos::CPU_PERIOD_US,
            hugepage_sizes_kb: Vec::new(),
        }
    }
}

impl PodLimitOptions {
    pub fn from_config(cfg: &Config, cgroups: &Cgroups) -> PodLimitOptions {
        let sizes = if cgroups.has_hugetlb() {
            crate::node::machine::hugepage_pools(std::path::Path::new("/sys/kernel/mm/hugepages"))
                .into_iter()
                .map(|(kb, _)| kb)
                .collect()
        } else {
            Vec::new()
        };
        PodLimitOptions {
            pids_limit: cfg.pod_pids_limit,
            cfs_quota: cfg.cm.cpu_cfs_quota,
            cfs_period_us: cfg.cm.cpu_cfs_quota_period.as_micros() as u64,
            hugepage_sizes_kb: sizes,
        }
    }
}

#[derive(Clone)]
pub struct PodCgroups {
    cgroups: Cgroups,
    root: String,
    per_qos: bool,
    opts: PodLimitOptions,
    /// The limits this agent wrote to each pod cgroup: a resync writes only what changed.
    applied: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, CgroupLimits>>>,
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
            opts: PodLimitOptions::from_config(cfg, cgroups),
            applied: Default::default(),
        })
    }

    pub fn runtime(&self) -> &Cgroups {
        &self.cgroups
    }

    pub fn per_qos(&self) -> bool {
        self.per_qos
    }

    pub fn options(&self) -> &PodLimitOptions {
        &self.opts
    }

    /// The cgroup of a QoS tier: `kubepods` itself for Guaranteed.
    pub fn qos_path(&self, class: qos::QosClass) -> String {
        match class {
            qos::QosClass::Guaranteed => self.kubepods(),
            qos::QosClass::Burstable => format!("{}/burstable", self.kubepods()),
            qos::QosClass::BestEffort => format!("{}/besteffort", self.kubepods()),
        }
    }

    pub fn root(&self) -> &str {
        &self.root
    }

    /// The root of the pod cgroup tree (kubelet's kubepods).
    pub fn kubepods(&self) -> String {
        format!("{}/kubepods", self.root)
    }

    /// Create `kubepods` with `kubepods_limits` (kubelet's node allocatable cgroup) and the QoS
    /// tiers below it (kubelet's QOSContainerManager.Start): besteffort at the minimum cpu
    /// shares, huge pages unbounded at both tiers. The tiers' shares and memory follow the pods
    /// afterwards (crate::cm::qos).
    pub fn init(&self, kubepods_limits: &CgroupLimits) -> Result<()> {
        if !self.per_qos {
            return Ok(());
        }
        let k = self.kubepods();
        let r = if self.cgroups.exists(&k) {
            self.cgroups.update(&k, kubepods_limits)
        } else {
            self.cgroups.create(&k, kubepods_limits)
        };
        r.with_context(|| format!("creating {k}"))?;
        let unbounded: std::collections::BTreeMap<String, i64> = self
            .opts
            .hugepage_sizes_kb
            .iter()
            .map(|kb| (ferrolet_runtime::cgroups::hugepage_size_name(*kb), -1))
            .collect();
        for (class, shares) in [(qos::QosClass::Burstable, None), (qos::QosClass::BestEffort, Some(2))] {
            let path = self.qos_path(class);
            let limits = CgroupLimits {
                cpu_shares: shares,
                hugetlb: unbounded.clone(),
                ..Default::default()
            };
            self.cgroups
                .create(&path, &limits)
                .with_context(|| format!("creating {path}"))?;
        }
        Ok(())
    }

    /// Set limits on an existing cgroup of the tree (a QoS tier).
    pub fn update_level(&self, path: &str, limits: &CgroupLimits) -> Result<()> {
        self.cgroups
            .update(path, limits)
            .with_context(|| format!("updating {path}"))
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
    pub fn limits_for(p: &Pod, opts: &PodLimitOptions) -> CgroupLimits {
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
            // With cpuCFSQuota off the quota is unlimited, as kubelet leaves it.
            l.cpu_quota = Some(if opts.cfs_quota {
                qos::milli_cpu_to_quota_with_period(sum_limits("cpu"), opts.cfs_period_us)
            } else {
                -1
            });
            l.cpu_period = Some(opts.cfs_period_us);
        }
        if all_mem_limited {
            l.memory_limit = Some(sum_limits("memory"));
        }
        if opts.pids_limit > 0 {
            l.pids_limit = Some(opts.pids_limit);
        }
        // Every page size gets a limit: the pod's hugepages-<size> request, else 0.
        for kb in &opts.hugepage_sizes_kb {
            let resource = crate::node::allocatable::hugepage_resource(*kb);
            l.hugetlb.insert(
                ferrolet_runtime::cgroups::hugepage_size_name(*kb),
                qos::pod_requests(p, &resource).max(0),
            );
        }
        l
    }

    /// Create (or update) the pod's cgroup; returns its path.
    pub fn ensure_pod(&self, p: &Pod) -> Result<String> {
        let path = self.pod_path(p);
        if !self.per_qos {
            return Ok(path);
        }
        let limits = Self::limits_for(p, &self.opts);
        let t = std::time::Instant::now();
        if self.cgroups.exists(&path) {
            // Every resync comes here (kubelet's EnsureExists leaves an existing one alone):
            // limits are written once per agent run, and again only when they change.
            if self.applied().get(&path) == Some(&limits) {
                return Ok(path);
            }
            let r = self.cgroups.update(&path, &limits);
            crate::metrics::global().cgroup_operation("update", t.elapsed());
            r.with_context(|| format!("updating pod cgroup {path}"))?;
        } else {
            let r = self.cgroups.create(&path, &limits);
            crate::metrics::global().cgroup_operation("create", t.elapsed());
            r.with_context(|| format!("creating pod cgroup {path}"))?;
        }
        self.applied().insert(path.clone(), limits);
        Ok(path)
    }

    /// Whether [`ensure_pod`](Self::ensure_pod) has nothing to do: the pod's cgroup is there
    /// with the limits this agent wrote for it (a stat, no write).
    pub fn pod_settled(&self, p: &Pod) -> bool {
        if !self.per_qos {
            return true;
        }
        let path = self.pod_path(p);
        self.applied().get(&path) == Some(&Self::limits_for(p, &self.opts)) && self.cgroups.exists(&path)
    }

    fn applied(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, CgroupLimits>> {
        self.applied.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the pod's cgroup exists already.
    pub fn pod_exists(&self, p: &Pod) -> bool {
        !self.per_qos || self.cgroups.exists(&self.pod_path(p))
    }

    pub fn remove_pod(&self, p: &Pod) -> Result<()> {
        if !self.per_qos {
            return Ok(());
        }
        let path = self.pod_path(p);
        self.applied().remove(&path);
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
