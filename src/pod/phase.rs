//! The pod phase, as the API names it (`status.phase`). Which phase a pod is in is the status
//! manager's to decide (kubelet's getPhase, in status/phase.rs).

use k8s_openapi::api::core::v1::PodStatus;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }

    /// Succeeded or Failed: nothing of the pod runs again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }

    /// The phase a status reports, if any.
    pub fn of(status: &PodStatus) -> Option<Phase> {
        match status.phase.as_deref()? {
            "Pending" => Some(Phase::Pending),
            "Running" => Some(Phase::Running),
            "Succeeded" => Some(Phase::Succeeded),
            "Failed" => Some(Phase::Failed),
            _ => None,
        }
    }
}
