//! What the runtime holds for a pod, seen as Kubernetes sees it: containers grouped by name,
//! each with its attempt (restart count), spec hash and state, read back from the labels and
//! annotations the agent put on them (so an agent restart loses nothing).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use ferrolet_runtime::{ContainerInfo, ContainerState, ExitRecord, ProcessUser};

use super::labels::*;

#[derive(Debug, Clone)]
pub struct ContainerView {
    pub id: String,
    pub name: String,
    pub attempt: u32,
    pub hash: String,
    pub state: ViewState,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub image_id: String,
    pub log_path: std::path::PathBuf,
    pub stop_signal: Option<String>,
    pub termination_message_file: Option<String>,
    pub termination_message_policy: String,
    /// The process's uid, gid and groups as the runtime set them.
    pub user: Option<ProcessUser>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ViewState {
    Created,
    Running,
    Exited(ExitRecord),
}

impl ContainerView {
    /// The container as Kubernetes sees it. A container whose state the runtime cannot tell
    /// (unreadable records, processes still in its cgroup) is running: nothing replaces it while
    /// it may live. One whose labels could not be recovered has no name: if it may be alive it
    /// is a stray to stop; if it is gone it is nobody's history.
    pub fn from_info(info: &ContainerInfo) -> Option<ContainerView> {
        let l = &info.record.labels;
        let a = &info.record.annotations;
        let state = match &info.state {
            ContainerState::Created => ViewState::Created,
            ContainerState::Running | ContainerState::Unknown { .. } => ViewState::Running,
            ContainerState::Exited(e) | ContainerState::ExitUnknown(e) => ViewState::Exited(e.clone()),
            ContainerState::Incomplete => return None,
        };
        let name = match l.get(LABEL_CONTAINER_NAME) {
            Some(n) => n.clone(),
            None if info.state.may_be_alive() => String::new(),
            None => return None,
        };
        Some(ContainerView {
            id: info.record.id.clone(),
            name,
            attempt: a.get(ANN_RESTART_COUNT).and_then(|s| s.parse().ok()).unwrap_or(0),
            hash: a.get(ANN_HASH).cloned().unwrap_or_default(),
            state,
            created_at: parse_time(&info.record.created_at).unwrap_or_else(Utc::now),
            started_at: info.started_at.as_deref().and_then(parse_time),
            image_id: info.record.image_id.clone(),
            log_path: info.record.log_path.clone(),
            stop_signal: info.record.stop_signal.clone(),
            termination_message_file: a.get(ANN_TERMINATION_MESSAGE_FILE).cloned(),
            termination_message_policy: a
                .get(ANN_TERMINATION_MESSAGE_POLICY)
                .cloned()
                .unwrap_or_else(|| "File".into()),
            user: info.record.user.clone(),
        })
    }

    pub fn is_running(&self) -> bool {
        matches!(self.state, ViewState::Running)
    }

    /// Running, or created and not started yet: a container that still holds a process.
    pub fn is_active(&self) -> bool {
        matches!(self.state, ViewState::Running | ViewState::Created)
    }

    pub fn exit(&self) -> Option<&ExitRecord> {
        match &self.state {
            ViewState::Exited(e) => Some(e),
            _ => None,
        }
    }

    pub fn finished_at(&self) -> Option<DateTime<Utc>> {
        self.exit().and_then(|e| parse_time(&e.finished_at))
    }
}

pub fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s).ok().map(|t| t.with_timezone(&Utc))
}

/// A pod's containers by name, newest attempt first.
#[derive(Debug, Clone, Default)]
pub struct PodContainers {
    pub by_name: BTreeMap<String, Vec<ContainerView>>,
}

impl PodContainers {
    pub fn new(mut views: Vec<ContainerView>) -> PodContainers {
        views.sort_by(|a, b| b.attempt.cmp(&a.attempt).then(b.created_at.cmp(&a.created_at)));
        let mut by_name: BTreeMap<String, Vec<ContainerView>> = BTreeMap::new();
        for v in views {
            by_name.entry(v.name.clone()).or_default().push(v);
        }
        PodContainers { by_name }
    }

    pub fn latest(&self, name: &str) -> Option<&ContainerView> {
        self.by_name.get(name).and_then(|v| v.first())
    }

    /// The attempt before the latest one (for `lastState` and `logs --previous`).
    pub fn previous(&self, name: &str) -> Option<&ContainerView> {
        self.by_name.get(name).and_then(|v| v.get(1))
    }

    pub fn all(&self) -> impl Iterator<Item = &ContainerView> {
        self.by_name.values().flatten()
    }
}
