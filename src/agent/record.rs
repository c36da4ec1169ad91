//! `agent.json`: what the agent created outside its root dir (the kubepods cgroup tree, the pod
//! network's settings, the pod log directory, the log links' directory), so `ferrolet reset` can remove exactly that even
//! when the configuration has changed since.

use std::path::{Path, PathBuf};

use anyhow::Result;
use ferrolet_fsutil::{read_json_opt, write_json_atomic};
use serde::{Deserialize, Serialize};

/// What the agent created outside its root dir, so `reset` can remove it.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentRecord {
    pub cgroup_root: String,
    /// cgroup directories (in every hierarchy) created for the kubepods tree, outermost first.
    pub created_cgroup_dirs: Vec<PathBuf>,
    pub pod_logs_dir: PathBuf,
    #[serde(default)]
    pub network: Option<serde_json::Value>,
    /// Where the containers' log links are made (`ferrolet.containerLogLinkDir`).
    #[serde(default)]
    pub container_log_link_dir: PathBuf,
}

pub fn record_path(root: &Path) -> PathBuf {
    root.join("agent.json")
}

pub fn load_record(root: &Path) -> AgentRecord {
    read_json_opt(&record_path(root)).ok().flatten().unwrap_or_default()
}

/// The record at the agent's start. One that cannot be read is never replaced silently: it is
/// moved aside to `agent.json.unreadable` (for a person to look at) and the reason returned, so
/// the caller can say so and rebuild what it can.
pub fn load_record_at_start(root: &Path) -> (AgentRecord, Option<String>) {
    match read_json_opt::<AgentRecord>(&record_path(root)) {
        Ok(r) => (r.unwrap_or_default(), None),
        Err(e) => {
            let aside = root.join("agent.json.unreadable");
            let moved = match std::fs::rename(record_path(root), &aside) {
                Ok(()) => format!("moved aside to {}", aside.display()),
                Err(m) => format!("could not be moved aside: {m}"),
            };
            (AgentRecord::default(), Some(format!("{e:#}; {moved}")))
        }
    }
}

pub fn save_record(root: &Path, rec: &AgentRecord) -> Result<()> {
    Ok(write_json_atomic(&record_path(root), rec)?)
}
