//! The boundary between Kubernetes and the runtime (kubelet's kuberuntime): a pod's container
//! turned into a [`ferrolet_runtime::ContainerConfig`] ([`container`], [`env`]), the labels that
//! tie runtime containers back to pods ([`labels`]), the runtime's containers seen as
//! Kubernetes sees them ([`views`]), starting and stopping containers in kubelet's steps
//! ([`start`], [`kill`]), their termination messages ([`termination`]), their logs
//! ([`logs`]) and the log links shippers read ([`log_links`]). The `ferrolet-runtime` crate below knows nothing of Kubernetes; this is where
//! the two meet.

pub mod container;
pub mod env;
pub mod gc;
pub mod kill;
pub mod labels;
pub mod log_links;
pub mod log_rotation;
pub mod logs;
pub mod start;
pub mod termination;
pub mod views;

/// How container ids appear in pod status (`containerID`), as `containerd://...` does for
/// containerd.
pub const CONTAINER_ID_PREFIX: &str = "ferrolet://";

/// A runtime container id as pod status shows it.
pub fn status_container_id(id: &str) -> String {
    format!("{CONTAINER_ID_PREFIX}{id}")
}

/// The runtime container id behind a status `containerID`.
pub fn runtime_container_id(status_id: &str) -> &str {
    status_id.strip_prefix(CONTAINER_ID_PREFIX).unwrap_or(status_id)
}
