//! A container on disk. Everything the runtime knows about a container lives in its state
//! directory `<root>/containers/<id>/`, so a new agent process can pick up where a killed one
//! left off:
//!
//! ```text
//! container.json  what was asked for (written once, before the monitor is forked)
//! config.json     the OCI spec (the bundle)
//! monitor.json    monitor and init pids with start times (written by the monitor)
//! started.json    when start succeeded
//! exit.json       exit code, signal, OOM kill (written by the monitor when the container exits)
//! rootfs/ upper/ work/   the overlay
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::Result;
use crate::pidfd::process_matches;
use ferrolet_fsutil::{read_json, read_json_opt};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecord {
    pub id: String,
    pub name: String,
    /// The reference the caller asked for.
    pub image: String,
    /// The image's config digest.
    pub image_ref: Digest,
    /// The `imageID` Kubernetes shows (`repo@manifest-digest`).
    pub image_id: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub created_at: String,
    pub log_path: PathBuf,
    pub cgroup_path: String,
    /// The image's StopSignal, if any (e.g. `SIGQUIT`).
    pub stop_signal: Option<String>,
    pub boot_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MonitorRecord {
    pub monitor_pid: i32,
    pub monitor_start: u64,
    pub init_pid: i32,
    pub init_start: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StartedRecord {
    pub started_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExitRecord {
    /// The exit code, or 128 + signal number when killed by a signal.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub oom_killed: bool,
    pub finished_at: String,
    /// Set when the runtime, not the process, decided the outcome (e.g. the node rebooted).
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ContainerState {
    /// Created, not started; the init process waits.
    Created,
    Running,
    Exited(ExitRecord),
    /// Creation did not finish (the agent died between writing the record and the monitor
    /// reporting back): delete it.
    Incomplete,
}

#[derive(Debug, Clone)]
pub struct ContainerInfo {
    pub record: ContainerRecord,
    pub state: ContainerState,
    pub monitor: Option<MonitorRecord>,
    pub started_at: Option<String>,
}

impl ContainerInfo {
    pub fn id(&self) -> &str {
        &self.record.id
    }
    pub fn is_running(&self) -> bool {
        matches!(self.state, ContainerState::Running)
    }
}

pub(crate) fn state_dir(root: &Path, id: &str) -> PathBuf {
    root.join("containers").join(id)
}

/// Read a container's files and work out its state.
pub(crate) fn load(dir: &Path) -> Result<ContainerInfo> {
    let record: ContainerRecord = read_json(&dir.join("container.json"))?;
    let monitor: Option<MonitorRecord> = read_json_opt(&dir.join("monitor.json"))?;
    let started: Option<StartedRecord> = read_json_opt(&dir.join("started.json"))?;
    let exit: Option<ExitRecord> = read_json_opt(&dir.join("exit.json"))?;
    let state = match (&exit, &monitor) {
        (Some(e), _) => ContainerState::Exited(e.clone()),
        (None, None) => ContainerState::Incomplete,
        (None, Some(m)) => {
            let same_boot = record.boot_id == ferrolet_fsutil::boot_id();
            if same_boot && process_matches(m.monitor_pid, m.monitor_start) {
                if started.is_some() {
                    ContainerState::Running
                } else {
                    ContainerState::Created
                }
            } else if let Some(e) = read_json_opt::<ExitRecord>(&dir.join("exit.json"))? {
                // The monitor wrote the exit and left between our two looks (it writes
                // exit.json before it exits, so a dead monitor's exit is on disk by now).
                ContainerState::Exited(e)
            } else {
                // The monitor is gone without recording an exit: the node rebooted or the
                // monitor was killed. The outcome is unknown, as containerd reports it.
                ContainerState::Exited(ExitRecord {
                    exit_code: 255,
                    signal: None,
                    oom_killed: false,
                    finished_at: started
                        .as_ref()
                        .map(|s| s.started_at.clone())
                        .unwrap_or_else(|| record.created_at.clone()),
                    reason: Some(if same_boot {
                        "the container's monitor died; exit status unknown".into()
                    } else {
                        "the node rebooted; exit status unknown".into()
                    }),
                })
            }
        }
    };
    Ok(ContainerInfo {
        record,
        state,
        monitor,
        started_at: started.map(|s| s.started_at),
    })
}

/// The records of every container under `root`, without needing a running runtime (for tools
/// that only read, like `ferrolet images rm` checking which images are in use).
pub fn list_records(root: &Path) -> Vec<ContainerRecord> {
    let base = root.join("containers");
    std::fs::read_dir(&base)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| read_json::<ContainerRecord>(&e.path().join("container.json")).ok())
        .collect()
}
