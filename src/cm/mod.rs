//! kubelet's container manager (docs/cgroups.md): the pod cgroups ([`pod_container_manager`]),
//! the QoS tiers kept in step with the pods ([`qos`]), node allocatable enforced on `kubepods`
//! and on the reserved cgroups ([`node_allocatable`]), and OOM handling: node-level OOM kills read
//! from the kernel log ([`oom_watcher`]) and the agent's own oom_score_adj.

pub mod devicemanager;
pub mod node_allocatable;
pub mod oom_watcher;
pub mod pod_container_manager;
pub mod qos;
pub mod swap;

use anyhow::{Context, Result};

/// Set this process's oom_score_adj (kubelet's oomScoreAdj, -999 by default) so the kernel
/// picks the agent last. Only this process: children started later inherit it, as kubelet's do.
pub fn apply_own_oom_score_adj(adj: i32) -> Result<()> {
    let path = "/proc/self/oom_score_adj";
    std::fs::write(path, adj.to_string()).with_context(|| format!("writing {adj} to {path}"))
}
