//! A pod the node stopped for good while its source still wants it (an eviction, the active
//! deadline: src/worker/killed.rs): the mark it leaves on the pod's status, and how the mark is
//! read back from a status recorded by an earlier run.

use k8s_openapi::api::core::v1::PodStatus;

use super::generate::{killed, DISRUPTION_TARGET};
use crate::pod::Phase;

/// Why the pod was stopped for good while still wanted: its status is Failed with this reason
/// and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Killed {
    pub reason: String,
    pub message: String,
    pub disruption: bool,
}

impl Killed {
    /// A status recorded by an earlier run: a Failed pod with a pod-level reason was killed by
    /// the node (a rejected pod never has a worker), and stays so after a restart.
    pub fn from_status(st: &PodStatus) -> Option<Killed> {
        if st.phase.as_deref() != Some(Phase::Failed.as_str()) {
            return None;
        }
        Some(Killed {
            reason: st.reason.clone()?,
            message: st.message.clone().unwrap_or_default(),
            disruption: st
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == DISRUPTION_TARGET && c.status == "True"),
        })
    }

    /// Its mark on the status computed from the containers.
    pub fn apply(&self, st: PodStatus, prev: Option<&PodStatus>) -> PodStatus {
        killed(st, &self.reason, &self.message, self.disruption, prev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodCondition;

    fn cond(t: &str, status: &str) -> PodCondition {
        PodCondition {
            type_: t.into(),
            status: status.into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_eviction_is_failed_with_its_reason_and_disruption_and_reads_back() {
        let k = Killed {
            reason: "Evicted".into(),
            message: "The node was low on resource: memory. ".into(),
            disruption: true,
        };
        let computed = PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![cond("Ready", "True"), cond("ContainersReady", "True")]),
            ..Default::default()
        };
        let st = k.apply(computed, None);
        assert_eq!(st.phase.as_deref(), Some("Failed"));
        assert_eq!(st.reason.as_deref(), Some("Evicted"));
        let conds = st.conditions.clone().unwrap();
        let dt = conds.iter().find(|c| c.type_ == DISRUPTION_TARGET).unwrap();
        assert_eq!(
            (dt.status.as_str(), dt.reason.as_deref()),
            ("True", Some("TerminationByKubelet"))
        );
        for t in ["Ready", "ContainersReady"] {
            let c = conds.iter().find(|c| c.type_ == t).unwrap();
            assert_eq!((c.status.as_str(), c.reason.as_deref()), ("False", Some("PodFailed")));
        }
        assert_eq!(Killed::from_status(&st), Some(k));
    }

    #[test]
    fn only_a_failed_status_with_a_pod_reason_was_a_kill() {
        let failed_by_containers = PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        };
        assert_eq!(Killed::from_status(&failed_by_containers), None);
        let running = PodStatus {
            phase: Some("Running".into()),
            reason: Some("DeadlineExceeded".into()),
            ..Default::default()
        };
        assert_eq!(Killed::from_status(&running), None);
        let deadline = PodStatus {
            phase: Some("Failed".into()),
            reason: Some("DeadlineExceeded".into()),
            message: Some("m".into()),
            ..Default::default()
        };
        let k = Killed::from_status(&deadline).unwrap();
        assert!(!k.disruption);
    }
}
