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
