//! The pod cgroup tree made at start: the agent's own cgroup as the default root (the agent
//! and its zygote moved into a leaf on cgroup v2), what is about to be created recorded in
//! agent.json first (so `ferrolet reset` removes exactly that), then the QoS level cgroups.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ferrolet_runtime::Runtime;
use tracing::{info, warn};

use super::record::{load_record_at_start, save_record};
use crate::cm::pod_container_manager::PodCgroups;
use crate::config::Config;

/// `dir` and its ancestors up to (not including) the first for which `stop` holds, outermost
/// first.
fn up_to(dir: &Path, stop: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut chain: Vec<PathBuf> = dir
        .ancestors()
        .take_while(|p| !stop(p))
        .map(Path::to_path_buf)
        .collect();
    chain.reverse();
    chain
}

/// The cgroup directories the kubepods tree will need that do not exist yet (recorded so
/// `ferrolet reset` can remove exactly those).
fn missing_cgroup_dirs(rt: &Runtime, kubepods: &str) -> Vec<PathBuf> {
    rt.cgroups()
        .dirs(kubepods)
        .iter()
        .flat_map(|dir| up_to(dir, Path::exists))
        .collect()
}

/// The directories of `cgroup` (in every hierarchy) strictly below `root` that exist,
/// outermost first.
fn existing_dirs_below(rt: &Runtime, root: &str, cgroup: &str) -> Vec<PathBuf> {
    let cg = rt.cgroups();
    cg.dirs(root)
        .into_iter()
        .zip(cg.dirs(cgroup))
        .flat_map(|(top, dir)| up_to(&dir, |p| p == top || !p.starts_with(&top)))
        .filter(|d| d.exists())
        .collect()
}

/// The leaf cgroup the agent moves into on cgroup v2 when its own cgroup holds kubepods.
const AGENT_LEAF: &str = "ferrolet.agent";

/// The pod cgroup tree: the agent's own cgroup as the default root (moving the agent and its
/// zygote into a leaf on v2), what it is about to create recorded in agent.json first, then the
/// QoS level cgroups.
pub(super) fn setup_cgroups(
    cfg: &Config,
    rt: &Runtime,
) -> Result<(
    PodCgroups,
    ferrolet_runtime::cgroups::CgroupLimits,
    crate::node::allocatable::Resources,
)> {
    let cgroups = PodCgroups::new(cfg, rt.cgroups())?;
    // cgroup v2 forbids processes beside child cgroups: with the agent's own cgroup as the
    // parent of kubepods, the agent (and its zygote, and so the monitors) move into a leaf.
    let own = cgroups.root();
    let leaf = (cfg.cgroup_root.is_empty() && rt.cgroups().is_v2() && !own.is_empty() && own != "/")
        .then(|| format!("{own}/{AGENT_LEAF}"));
    let (mut record, unreadable) = load_record_at_start(&cfg.root_dir);
    if record.cgroup_root != own {
        record.created_cgroup_dirs.clear();
    }
    if let Some(e) = &unreadable {
        // What an earlier run created below the pod cgroup root is the agent's whoever made
        // it; whether the root's own missing ancestors were is lost with the record.
        let ours = existing_dirs_below(rt, own, &cgroups.kubepods())
            .into_iter()
            .chain(leaf.iter().flat_map(|l| existing_dirs_below(rt, own, l)))
            .collect::<Vec<_>>();
        warn!(
            error = %e,
            taken_as_the_agents = %ours.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
            "agent.json unreadable: a new one is written; the existing cgroups below the pod cgroup root are recorded as the agent's (reset removes them), any parent of {own} an earlier run created is not known and stays"
        );
        record.created_cgroup_dirs.extend(ours);
    }
    record.cgroup_root = own.to_string();
    record.pod_logs_dir = cfg.pod_logs_dir.clone();
    record.container_log_link_dir = cfg.container_log_link_dir.clone();
    let mut to_create = missing_cgroup_dirs(rt, &cgroups.kubepods());
    to_create.extend(leaf.iter().flat_map(|l| missing_cgroup_dirs(rt, l)));
    for d in to_create {
        if !record.created_cgroup_dirs.contains(&d) {
            record.created_cgroup_dirs.push(d);
        }
    }
    // Recorded before anything is created, so a crash in between leaves nothing unknown.
    save_record(&cfg.root_dir, &record)?;
    if leaf.is_some() {
        let me = std::process::id() as i32;
        ferrolet_runtime::cgroups::vacate_own_cgroup(rt.cgroups(), own, AGENT_LEAF, &[me, rt.zygote_pid()])?;
    }
    // kubepods gets the node allocatable (kubelet's createNodeAllocatableCgroups).
    let capacity = crate::node::machine::capacity(&cfg.root_dir, cfg.max_pods);
    let kubepods_limits = crate::cm::node_allocatable::kubepods_limits_for(cfg, &capacity, &cgroups);
    if cfg.cgroups_per_qos {
        cgroups
            .init(&kubepods_limits)
            .context("creating the kubepods cgroups")?;
    }
    info!(cgroup_root = %cgroups.root(), v2 = rt.cgroups().is_v2(), "pod cgroups");
    Ok((cgroups, kubepods_limits, capacity))
}
