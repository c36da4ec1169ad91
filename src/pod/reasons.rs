//! The reason strings kubelet writes into pod and container statuses and events, named once
//! so the pod workers that set them, the status that reports them and the CLI that reads them
//! agree to the letter (kubelet: pkg/kubelet/container/sync_result.go, pkg/kubelet/images,
//! kuberuntime and status).

// A container waiting to run.
pub const CONTAINER_CREATING: &str = "ContainerCreating";
pub const POD_INITIALIZING: &str = "PodInitializing";
pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";
pub const CREATE_CONTAINER_ERROR: &str = "CreateContainerError";
pub const RUN_CONTAINER_ERROR: &str = "RunContainerError";
pub const POST_START_HOOK_ERROR: &str = "PostStartHookError";
pub const ERR_IMAGE_PULL: &str = "ErrImagePull";
pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
pub const INVALID_IMAGE_NAME: &str = "InvalidImageName";

// A container that ended.
pub const COMPLETED: &str = "Completed";
pub const ERROR: &str = "Error";
pub const OOM_KILLED: &str = "OOMKilled";
/// The runtime lost track of how the container ended.
pub const UNKNOWN: &str = "Unknown";

// Pod conditions.
pub const CONTAINERS_NOT_READY: &str = "ContainersNotReady";
/// kubelet's Ready reason when the containers are ready but a readiness gate is not.
pub const READINESS_GATES_NOT_READY: &str = "ReadinessGatesNotReady";
pub const CONTAINERS_NOT_INITIALIZED: &str = "ContainersNotInitialized";
pub const POD_COMPLETED: &str = "PodCompleted";
/// The Ready condition of a pod that failed.
pub const POD_FAILED: &str = "PodFailed";
/// A pod stopped at `activeDeadlineSeconds` (kubelet's active deadline handler).
pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
pub const DEADLINE_EXCEEDED_MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

// Pods the node refuses (admission).
pub const UNSUPPORTED_POD_SPEC: &str = "UnsupportedPodSpec";
/// kubelet's predicate admit handler: `spec.os.name` is not the node's OS.
pub const POD_OS_NOT_SUPPORTED: &str = "PodOSNotSupported";
/// kubelet's predicate admit handler: a `kubernetes.io/os` node selector is not the node's OS.
pub const POD_OS_SELECTOR_MISMATCH: &str = "PodOSSelectorNodeLabelDoesNotMatch";
pub const OUT_OF_PODS: &str = "OutOfpods";
/// `OutOf<resource>` as kubelet's resource admission words it (OutOfcpu, OutOfmemory).
pub fn out_of(resource: &str) -> String {
    format!("OutOf{resource}")
}

// Events (logged as kubelet would record them).
pub const EVENT_KILLING: &str = "Killing";
pub const EVENT_CREATED: &str = "Created";
pub const EVENT_STARTED: &str = "Started";
pub const EVENT_BACK_OFF: &str = "BackOff";
pub const EVENT_SANDBOX_CHANGED: &str = "SandboxChanged";
pub const EVENT_FAILED_CREATE_POD_SANDBOX: &str = "FailedCreatePodSandBox";
pub const EVENT_UNHEALTHY: &str = "Unhealthy";
pub const EVENT_PROBE_WARNING: &str = "ProbeWarning";
pub const EVENT_FAILED_POST_START_HOOK: &str = "FailedPostStartHook";
pub const EVENT_FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";
pub const EVENT_INVALID_ENV_VAR_NAMES: &str = "InvalidEnvironmentVariableNames";
pub const EVENT_FAILED_MOUNT: &str = "FailedMount";
/// kubelet's FailedToCreateContainer (and other failures of a container's start): a Warning.
pub const EVENT_FAILED: &str = "Failed";
/// ferrolet's own: an evicted static pod runs again once the node's pressure is gone.
pub const EVENT_RERUN_AFTER_EVICTION: &str = "RerunAfterEviction";

/// Why a container is not running, as its waiting state shows it, and when the pod worker
/// should try again (kubelet's SyncResult errors: the reason names the error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// One of the reason constants above.
    pub reason: &'static str,
    pub message: String,
    /// When to try again; `None` for a problem only a change of the pod can fix.
    pub retry_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl Waiting {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Waiting {
        Waiting {
            reason,
            message: message.into(),
            retry_at: None,
        }
    }

    pub fn retry_at(mut self, t: chrono::DateTime<chrono::Utc>) -> Waiting {
        self.retry_at = Some(t);
        self
    }

    /// Retry after `d` from now.
    pub fn retry_in(self, d: std::time::Duration) -> Waiting {
        self.retry_at(chrono::Utc::now() + chrono::Duration::from_std(d).unwrap_or_default())
    }
}

impl std::fmt::Display for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}
