//! The eviction manager (kubelet's pkg/kubelet/eviction): every evictionMonitoringPeriod it
//! measures the node's signals from the stats summary ([`signals`]), decides which thresholds
//! are met (hard at once, soft after their grace period, each held until its minimum reclaim
//! is recovered), reports the pressure conditions (held for the transition period), evicts
//! pods over their local storage limits ([`local_storage`]), reclaims dead containers and
//! unused images before evicting for disk, and else evicts the first pod of kubelet's ranking
//! ([`rank`]), one per round, with reason Evicted and kubelet's message. Its conditions feed
//! the Node's status and the admission of new pods. docs/eviction.md.

mod admit;
pub mod local_storage;
mod manager;
pub mod rank;
pub mod signals;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

pub use manager::{Manager, Reclaim};
use signals::Condition;

/// kubelet's eviction reason.
pub const REASON: &str = "Evicted";
/// The DisruptionTarget condition's reason when the kubelet evicts.
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";

/// What the manager asks of the pod workers: stop the pod's containers and leave it Failed
/// with `reason`/`message`; `done` fires once its containers are stopped.
pub struct Kill {
    pub uid: String,
    pub reason: String,
    pub message: String,
    /// The grace period the pod's containers get.
    pub grace: Duration,
    /// Add kubelet's DisruptionTarget condition (threshold evictions; not local storage ones).
    pub disruption_target: bool,
    pub done: Option<tokio::sync::oneshot::Sender<()>>,
}

/// What the manager asks of the pod workers.
pub enum Request {
    /// Evict a pod.
    Kill(Kill),
    /// Run again, from the start, a static pod this node evicted once the node's pressure is
    /// gone (by UID): a standalone node has no controller to recreate it (docs/eviction.md).
    Rerun(String),
}

/// Whether `status` is that of a pod this node evicted for the node's pressure (phase Failed,
/// reason Evicted, the DisruptionTarget condition), not for its own local storage limits: the
/// static pods [`Request::Rerun`] brings back.
pub fn evicted_for_pressure(status: &k8s_openapi::api::core::v1::PodStatus) -> bool {
    status.phase.as_deref() == Some("Failed")
        && status.reason.as_deref() == Some(REASON)
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == crate::status::DISRUPTION_TARGET && c.status == "True")
}

/// How the manager's requests reach the pod workers (through the main loop).
pub type RequestFn = Arc<dyn Fn(Request) + Send + Sync>;

/// The manager's view others read: the node's pressure conditions now.
#[derive(Clone, Default)]
pub struct Eviction {
    conditions: Arc<RwLock<Vec<Condition>>>,
    /// Static and mirror pods are critical (kubelet's rule, in a cluster only).
    in_cluster: bool,
}

impl Eviction {
    pub fn new(in_cluster: bool) -> Eviction {
        Eviction {
            in_cluster,
            ..Default::default()
        }
    }

    pub fn conditions(&self) -> Vec<Condition> {
        self.conditions.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, c: Vec<Condition>) {
        *self.conditions.write().unwrap_or_else(|e| e.into_inner()) = c;
    }

    /// The pressures for the Node's conditions.
    pub fn pressure(&self) -> crate::node::conditions::Pressure {
        let c = self.conditions();
        crate::node::conditions::Pressure {
            memory: c.contains(&Condition::MemoryPressure),
            disk: c.contains(&Condition::DiskPressure),
            pid: c.contains(&Condition::PidPressure),
        }
    }

    /// kubelet's eviction admit handler: under memory pressure only, pods other than
    /// BestEffort are admitted (and BestEffort ones tolerating the memory-pressure taint); under
    /// any other pressure no pod is; critical pods always are.
    pub fn admit(&self, p: &Pod) -> Result<(), crate::lifecycle::admit::Rejection> {
        admit::eviction_admit(p, &self.conditions(), self.in_cluster)
    }
}
