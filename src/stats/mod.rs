//! Node, pod and container stats (kubelet's pkg/kubelet/stats, and the part of cAdvisor kubelet
//! reads them from), straight from cgroupfs (v1 and v2) and /proc.
//!
//! One background task samples everything once per housekeeping interval
//! (`--housekeeping-interval`, 10s as cAdvisor's default) on the blocking pool, keeps the last
//! two cpu readings of each cgroup for the rates ([`rate`]), records the round in the last
//! hour of node and pod cpu and memory for the status page ([`history`]), and publishes an immutable
//! [`Snapshot`]. Every endpoint serves from the latest snapshot: a scrape clones an `Arc` and,
//! the first time a view is asked for, renders it once ([`Snapshot`] keeps the rendering), so
//! its cost does not grow with cgroup walks. Directory walks (container writable layers, logs,
//! volumes, the image store) run on their own slower period (`volumeStatsAggPeriod`, kubelet's
//! fsResourceAnalyzer) and the samples use their last results. docs/cgroups.md#stats says
//! where each number comes from.

pub mod fs;
pub mod history;
pub mod net;
mod prom;
pub mod rate;
pub mod sampler;
pub mod summary;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use bytes::Bytes;
use ferrolet_runtime::cgroups::CgroupStats;
use tracing::{trace, warn};

use sampler::Sources;
use summary::{PodReference, Summary, Time};

use crate::tasks::{blocking, spawn_loop};

/// One cgroup as the cAdvisor endpoint shows it: a container or a pod.
#[derive(Debug, Clone)]
pub struct CgroupEntry {
    /// The cgroup path (cAdvisor's `id` label).
    pub id: String,
    /// Empty for the pod's own cgroup.
    pub container: String,
    /// The runtime's container id (cAdvisor's `name`); empty for a pod.
    pub name: String,
    pub image: String,
    pub pod: PodReference,
    pub stats: CgroupStats,
    pub start_time: Time,
    pub processes: u64,
    /// The pod's interfaces (on the pod's entry, as cAdvisor puts them on the sandbox).
    pub ifaces: Option<Vec<net::Iface>>,
    /// Writable layer usage (bytes, inodes) from the last walk.
    pub rootfs: Option<(u64, u64)>,
}

/// Everything one sampling round saw, and its renderings, made the first time each is asked.
#[derive(Debug)]
pub struct Snapshot {
    pub summary: Summary,
    pub entries: Vec<CgroupEntry>,
    pub memory_capacity: u64,
    pub node_ifaces: Vec<net::Iface>,
    /// The directories whose usage the slow walks measure.
    pub fs_targets: Vec<PathBuf>,
    pub taken: Time,
    /// The containers could not be listed this round (the metrics' scrape_error).
    pub scrape_error: bool,
    rendered: [OnceLock<Bytes>; 4],
}

/// The views a scrape can ask for.
#[derive(Debug, Clone, Copy)]
pub enum View {
    Summary = 0,
    CpuAndMemory = 1,
    ResourceMetrics = 2,
    Cadvisor = 3,
}

impl Snapshot {
    pub fn new(
        summary: Summary,
        entries: Vec<CgroupEntry>,
        memory_capacity: u64,
        node_ifaces: Vec<net::Iface>,
        fs_targets: Vec<PathBuf>,
        taken: Time,
    ) -> Snapshot {
        Snapshot {
            summary,
            entries,
            memory_capacity,
            node_ifaces,
            fs_targets,
            taken,
            scrape_error: false,
            rendered: Default::default(),
        }
    }

    /// The body of a view, rendered once per snapshot.
    pub fn render(&self, view: View) -> Bytes {
        self.rendered[view as usize]
            .get_or_init(|| match view {
                View::Summary => Bytes::from(serde_json::to_vec(&self.summary).unwrap_or_default()),
                View::CpuAndMemory => {
                    Bytes::from(serde_json::to_vec(&self.summary.cpu_and_memory()).unwrap_or_default())
                }
                View::ResourceMetrics => Bytes::from(prom::resource_metrics(self)),
                View::Cadvisor => Bytes::from(prom::cadvisor_metrics(self)),
            })
            .clone()
    }
}

/// How old a pod's or container's cgroup stats may be when nothing ran in the cgroup since
/// they were read ([`sampler::Rounds`]): what moves without its processes running (the working
/// set as the kernel ages pages, a limit written from outside) shows within this.
const FULL_READ_EVERY: Duration = Duration::from_secs(60);

/// The stats cache and the sources it samples.
pub struct Stats {
    sources: Sources,
    current: RwLock<Option<Arc<Snapshot>>>,
    history: Mutex<rate::CpuHistory>,
    rounds: Mutex<sampler::Rounds>,
    usage: Mutex<fs::UsageCache>,
    /// The last hour of cpu and memory, for the status page.
    last_hour: Mutex<history::History>,
}

impl Stats {
    pub fn new(sources: Sources) -> Arc<Stats> {
        Arc::new(Stats {
            sources,
            current: RwLock::new(None),
            history: Mutex::default(),
            rounds: Mutex::new(sampler::Rounds::new(FULL_READ_EVERY)),
            usage: Mutex::default(),
            last_hour: Mutex::default(),
        })
    }

    /// The latest snapshot; `None` before the first round.
    pub fn latest(&self) -> Option<Arc<Snapshot>> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Read the last hour of cpu and memory (the lock is held while `f` runs: keep it short).
    pub fn with_history<R>(&self, f: impl FnOnce(&history::History) -> R) -> R {
        f(&self.last_hour.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Sample now (blocking).
    pub fn sample_now(&self) -> Arc<Snapshot> {
        let snap = {
            let usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
            let mut hist = self.history.lock().unwrap_or_else(|e| e.into_inner());
            let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
            Arc::new(sampler::sample(&self.sources, &mut hist, &mut rounds, &usage))
        };
        let at = u32::try_from(snap.taken.0.timestamp()).unwrap_or(0);
        self.last_hour
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(&snap.summary, at);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(snap.clone());
        snap
    }

    /// What the eviction manager reads each round (blocking): the node's numbers read now, the
    /// pods' from the latest round when it was taken within `pods_max_age`, as kubelet's
    /// eviction manager reads the node afresh and the pods from cAdvisor's cache. Without such
    /// a round (none yet, or the sampler is slower than the caller), a new round, kept as the
    /// latest. Reading every pod's cgroups once per round of each reader cost an idle node
    /// twice the sampler's work.
    pub fn node_now_pods_within(&self, pods_max_age: Duration) -> Summary {
        let now = chrono::Utc::now();
        let recent = self.latest().filter(|s| {
            now.signed_duration_since(s.taken.0)
                .to_std()
                .is_ok_and(|age| age <= pods_max_age)
        });
        match recent {
            Some(last) => {
                let usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
                Summary {
                    node: sampler::sample_node(&self.sources, &usage),
                    pods: last.summary.pods.clone(),
                }
            }
            None => self.sample_now().summary.clone(),
        }
    }

    /// Walk every directory the latest snapshot named (blocking).
    pub fn walk_now(&self) {
        let Some(snap) = self.latest() else { return };
        let mut out = HashMap::new();
        for d in &snap.fs_targets {
            if let Some(u) = fs::dir_usage(d) {
                out.insert(d.clone(), (u, Time(chrono::Utc::now())));
            }
        }
        trace!(dirs = out.len(), "filesystem usage walked");
        self.usage.lock().unwrap_or_else(|e| e.into_inner()).replace(out);
    }

    /// Start the sampler (every `interval`) and the walks (every `fs_period`, the first right
    /// after the first sample; the next sample carries their results).
    pub fn start(self: &Arc<Stats>, interval: Duration, fs_period: Duration) {
        let me = self.clone();
        spawn_loop("stats sampler", interval, move || {
            let me = me.clone();
            async move {
                let s = me.clone();
                if let Err(e) = blocking(move || Ok(s.sample_now())).await {
                    warn!(error = %format!("{e:#}"), "stats sample");
                }
                tokio::time::sleep(interval).await;
                true
            }
        });
        let me = self.clone();
        let mut first = true;
        spawn_loop("stats filesystem walks", fs_period, move || {
            let me = me.clone();
            let wait = if first { Duration::ZERO } else { fs_period };
            first = false;
            async move {
                tokio::time::sleep(wait).await;
                // Wait for the first snapshot to know what to walk.
                while me.latest().is_none() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let s = me.clone();
                if let Err(e) = blocking(move || {
                    s.walk_now();
                    Ok(())
                })
                .await
                {
                    warn!(error = %format!("{e:#}"), "stats filesystem walk");
                }
                true
            }
        });
    }
}
