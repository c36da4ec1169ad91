//! Pods as the agent handles them, and the Kubernetes vocabulary every other part shares:
//! decoding manifests, kubelet's defaulting and static-pod identity, validation (including
//! what ferrolet refuses to run), the QoS class, resource quantities and durations, `$(VAR)`
//! expansion, the reason strings kubelet writes into statuses, and the agent's table of pods.
//! Nothing here does I/O beyond reading a manifest's bytes.

pub mod defaults;
pub mod expansion;
pub mod fieldpath;
pub mod manager;
pub mod manifest;
mod phase;
pub mod qos;
pub mod reasons;
pub mod sysctl;
pub mod units;
pub mod validation;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

pub use phase::Phase;

/// kubelet's annotations on static pods.
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
/// On a mirror pod: the hash of the static pod it mirrors.
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
/// The source name of pods from the API server.
pub const SOURCE_API: &str = "api";

/// A pod from a file or URL (not from the API server).
pub fn is_static(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE).is_some_and(|s| s != SOURCE_API)
}

/// The API server's mirror of a static pod.
pub fn is_mirror(pod: &Pod) -> bool {
    annotation(pod, CONFIG_MIRROR).is_some()
}

/// The deletion of the pod was requested (through the API server).
pub fn deletion_requested(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// When the agent first saw the pod (its `kubernetes.io/config.seen` annotation).
pub fn seen_at(pod: &Pod) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(annotation(pod, CONFIG_SEEN)?)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// A pod's `spec.restartPolicy` (validation admits only these three; defaulting sets Always).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// Whether a container that exited with `exit_code` runs again under this policy.
    pub fn restarts(self, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }
}

pub fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}

pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}

/// `name_namespace(uid)`, how kubelet names a pod in its messages.
pub fn full_name(pod: &Pod) -> String {
    format!("{}_{}({})", name(pod), namespace(pod), uid(pod))
}

pub fn spec(pod: &Pod) -> &PodSpec {
    static EMPTY: std::sync::OnceLock<PodSpec> = std::sync::OnceLock::new();
    pod.spec.as_ref().unwrap_or_else(|| EMPTY.get_or_init(Default::default))
}

pub fn init_containers(pod: &Pod) -> &[Container] {
    spec(pod).init_containers.as_deref().unwrap_or(&[])
}

pub fn containers(pod: &Pod) -> &[Container] {
    &spec(pod).containers
}

/// Every container of the pod: app containers first, then init containers.
pub fn all_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    containers(pod).iter().chain(init_containers(pod))
}

/// The container named `name`, app or init.
pub fn container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    all_containers(pod).find(|c| c.name == name)
}

/// The pod's ephemeral containers (`kubectl debug`) as containers: kubelet runs them from the
/// fields they share with containers (EphemeralContainerCommon). Which container's process
/// namespace one joins is [`ephemeral_target`]. Not among [`all_containers`]: they have no
/// resources, probes, ports or hooks, and count for neither QoS nor readiness.
pub fn ephemeral_containers(pod: &Pod) -> Vec<Container> {
    spec(pod)
        .ephemeral_containers
        .iter()
        .flatten()
        .filter_map(|e| {
            let mut v = serde_json::to_value(e).ok()?;
            v.as_object_mut()?.remove("targetContainerName");
            manifest::from_value(v).ok()
        })
        .collect()
}

/// Whether `name` is one of the pod's ephemeral containers.
pub fn is_ephemeral_name(pod: &Pod, name: &str) -> bool {
    spec(pod).ephemeral_containers.iter().flatten().any(|e| e.name == name)
}

/// The container whose process namespace the ephemeral container `name` shares
/// (`targetContainerName`, `kubectl debug --target`).
pub fn ephemeral_target<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    spec(pod)
        .ephemeral_containers
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.target_container_name.as_deref())
        .filter(|t| !t.is_empty())
}

/// The container named `name` of any list, ephemeral containers included (owned: those are
/// converted, [`ephemeral_containers`]).
pub fn container_spec(pod: &Pod, name: &str) -> Option<Container> {
    container(pod, name)
        .cloned()
        .or_else(|| ephemeral_containers(pod).into_iter().find(|c| c.name == name))
}

/// Every container status of a pod status: app, init, then ephemeral containers'.
pub fn all_statuses(
    st: &k8s_openapi::api::core::v1::PodStatus,
) -> impl Iterator<Item = &k8s_openapi::api::core::v1::ContainerStatus> {
    st.container_statuses
        .iter()
        .flatten()
        .chain(st.init_container_statuses.iter().flatten())
        .chain(st.ephemeral_container_statuses.iter().flatten())
}

/// A sidecar: an init container with `restartPolicy: Always`.
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Whether `name` is one of the pod's sidecars.
pub fn is_sidecar_name(pod: &Pod, name: &str) -> bool {
    init_containers(pod).iter().any(|c| c.name == name && is_sidecar(c))
}

pub fn restart_policy(pod: &Pod) -> RestartPolicy {
    match spec(pod).restart_policy.as_deref() {
        Some("OnFailure") => RestartPolicy::OnFailure,
        Some("Never") => RestartPolicy::Never,
        _ => RestartPolicy::Always,
    }
}

pub fn host_network(pod: &Pod) -> bool {
    spec(pod).host_network.unwrap_or(false)
}

/// The grace period a termination gets: the deletion's when the API server set one (kubelet's
/// rule), else the spec's.
pub fn grace_period(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or(spec(pod).termination_grace_period_seconds)
        .unwrap_or(30)
        .max(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_policy_parsing_and_rules() {
        let p = |policy: &str| -> Pod {
            serde_json::from_value(
                serde_json::json!({"metadata":{"name":"p"},"spec":{"restartPolicy":policy,"containers":[]}}),
            )
            .unwrap()
        };
        assert_eq!(restart_policy(&p("Never")), RestartPolicy::Never);
        assert_eq!(restart_policy(&p("OnFailure")), RestartPolicy::OnFailure);
        assert_eq!(restart_policy(&Pod::default()), RestartPolicy::Always);
        assert!(RestartPolicy::Always.restarts(0));
        assert!(!RestartPolicy::OnFailure.restarts(0) && RestartPolicy::OnFailure.restarts(2));
        assert!(!RestartPolicy::Never.restarts(1));
    }
}
