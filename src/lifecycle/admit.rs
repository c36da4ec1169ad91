//! kubelet's admit handlers' answer (pkg/kubelet/lifecycle's PodAdmitResult): why the node
//! refuses a pod. The handlers live with what they judge: podconfig's admission (resources,
//! predicates, sysctls, the OS), podconfig::lsm (AppArmor), eviction (node pressure).

/// kubelet's reason for a pod whose AppArmor profile cannot be enforced (soft admission).
pub const REASON_APPARMOR: &str = "AppArmor";

/// Why the node refuses a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

impl Rejection {
    /// The message the pod's status carries: kubelet's rejectPod prefixes what a (hard) admit
    /// handler said with "Pod was rejected: "; the AppArmor check is kubelet's soft admission
    /// (canRunPod), whose message stands alone.
    pub fn status_message(&self) -> String {
        if self.reason == REASON_APPARMOR {
            self.message.clone()
        } else {
            format!("Pod was rejected: {}", self.message)
        }
    }
}

/// kubelet's reason for pods refused or terminated while the node shuts down.
pub const REASON_NODE_SHUTDOWN: &str = "NodeShutdown";

/// Whether the node is shutting down, as the node shutdown manager (src/nodeshutdown/) found
/// it: its admit handler refuses every pod meanwhile, and the Node is not Ready.
#[derive(Debug, Clone, Default)]
pub struct NodeShutdown(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl NodeShutdown {
    pub fn set(&self, shutting_down: bool) {
        self.0.store(shutting_down, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// kubelet's node shutdown admit handler.
    pub fn admit(&self) -> Result<(), Rejection> {
        if !self.is_shutting_down() {
            return Ok(());
        }
        Err(Rejection {
            reason: REASON_NODE_SHUTDOWN.into(),
            message: "Pod was rejected as the node is shutting down.".into(),
        })
    }

    /// What the Node's Ready condition says meanwhile (kubelet's ShutdownStatus).
    pub fn not_ready(&self) -> Option<String> {
        self.is_shutting_down().then(|| "node is shutting down".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_shutting_down_refuses_pods_and_is_not_ready() {
        let s = NodeShutdown::default();
        assert!(s.admit().is_ok() && s.not_ready().is_none());
        s.clone().set(true);
        let r = s.admit().unwrap_err();
        assert_eq!(r.reason, "NodeShutdown");
        assert_eq!(
            r.status_message(),
            "Pod was rejected: Pod was rejected as the node is shutting down."
        );
        assert_eq!(s.not_ready().as_deref(), Some("node is shutting down"));
    }
}
