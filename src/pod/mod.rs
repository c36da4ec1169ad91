//! Pods as the agent handles them: decoding manifests, kubelet's defaulting and static-pod
//! identity, validation (including what ferrolet refuses to run), and the QoS class.

pub mod defaults;
pub mod manifest;
pub mod qos;
pub mod validation;

use k8s_openapi::api::core::v1::{Container, Pod};

/// kubelet's annotations on static pods.
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";

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

pub fn spec(pod: &Pod) -> &k8s_openapi::api::core::v1::PodSpec {
    static EMPTY: std::sync::OnceLock<k8s_openapi::api::core::v1::PodSpec> = std::sync::OnceLock::new();
    pod.spec.as_ref().unwrap_or_else(|| EMPTY.get_or_init(Default::default))
}

pub fn init_containers(pod: &Pod) -> &[Container] {
    spec(pod).init_containers.as_deref().unwrap_or(&[])
}

pub fn containers(pod: &Pod) -> &[Container] {
    &spec(pod).containers
}

/// A sidecar: an init container with `restartPolicy: Always`.
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

pub fn restart_policy(pod: &Pod) -> &str {
    spec(pod).restart_policy.as_deref().unwrap_or("Always")
}

pub fn host_network(pod: &Pod) -> bool {
    spec(pod).host_network.unwrap_or(false)
}

pub fn grace_period(pod: &Pod) -> i64 {
    spec(pod).termination_grace_period_seconds.unwrap_or(30).max(0)
}
