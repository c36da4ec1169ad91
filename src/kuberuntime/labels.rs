//! What the agent writes on every runtime container so it can find and understand it again
//! after a restart (kubelet's labels.go): the pod and container it belongs to as labels; the
//! attempt (restart count), spec hash, termination message settings and kind as annotations.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use sha2::{Digest, Sha256};

use crate::pod;

pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
pub const ANN_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const ANN_HASH: &str = "io.kubernetes.container.hash";
pub const ANN_TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub const ANN_TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
pub const ANN_TERMINATION_MESSAGE_FILE: &str = "ferrolet.io/termination-message-file";
pub const ANN_CONTAINER_KIND: &str = "ferrolet.io/container-kind";

/// Which list of the pod spec a container comes from, and how it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    /// An init container: runs to completion, in order, before the app containers.
    Init,
    /// An init container with `restartPolicy: Always`: started in order and kept running.
    Sidecar,
    /// One of `spec.containers`.
    App,
    /// One of `spec.ephemeralContainers` (`kubectl debug`): started once, never restarted.
    Ephemeral,
}

impl ContainerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerKind::Init => "init",
            ContainerKind::Sidecar => "sidecar",
            ContainerKind::App => "app",
            ContainerKind::Ephemeral => "ephemeral",
        }
    }
}

/// kubelet's container hash: changes whenever the container's spec does.
pub fn hash(c: &Container) -> String {
    let data = serde_json::to_vec(c).unwrap_or_default();
    hex::encode(&Sha256::digest(&data)[..4])
}

/// The labels naming the pod and container.
pub fn container_labels(p: &Pod, c: &Container) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_POD_NAME.to_string(), pod::name(p).to_string()),
        (LABEL_POD_NAMESPACE.to_string(), pod::namespace(p).to_string()),
        (LABEL_POD_UID.to_string(), pod::uid(p).to_string()),
        (LABEL_CONTAINER_NAME.to_string(), c.name.clone()),
    ])
}

/// Where the container's termination message is written: the path inside the container and
/// the file on the node behind it.
pub struct TerminationMessage<'a> {
    pub path: &'a str,
    pub file: &'a std::path::Path,
}

/// The annotations the agent reads back in [`super::views::ContainerView`].
pub fn container_annotations(
    c: &Container,
    kind: ContainerKind,
    attempt: u32,
    tm: &TerminationMessage,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        (ANN_RESTART_COUNT.to_string(), attempt.to_string()),
        (ANN_HASH.to_string(), hash(c)),
        (ANN_TERMINATION_MESSAGE_PATH.to_string(), tm.path.to_string()),
        (
            ANN_TERMINATION_MESSAGE_POLICY.to_string(),
            c.termination_message_policy.clone().unwrap_or_else(|| "File".into()),
        ),
        (ANN_TERMINATION_MESSAGE_FILE.to_string(), tm.file.display().to_string()),
        (ANN_CONTAINER_KIND.to_string(), kind.as_str().to_string()),
    ])
}
