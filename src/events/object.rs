//! The core/v1 Event objects kubelet posts (client-go's recorder makeEvent with kubelet's
//! object references): what the event is about (`involvedObject`), who reports it
//! (`source`, `reportingComponent`, `reportingInstance`) and its name,
//! `<object name>.<hex nanoseconds>`.

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::Kind;
use crate::pod;

/// The component kubelet reports events as.
pub const COMPONENT: &str = "kubelet";

/// A pod, or one of its containers (kubelet's GenerateContainerRef): `fieldPath` names the
/// container as `spec.containers{name}`, `spec.initContainers{name}` or
/// `spec.ephemeralContainers{name}`.
pub fn pod_reference(p: &Pod, container: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod::namespace(p).to_string()),
        name: Some(pod::name(p).to_string()),
        uid: Some(pod::uid(p).to_string()),
        resource_version: p.metadata.resource_version.clone().filter(|v| !v.is_empty()),
        field_path: container.map(|c| container_field_path(p, c)),
    }
}

fn container_field_path(p: &Pod, name: &str) -> String {
    let spec = pod::spec(p);
    if spec.containers.iter().any(|c| c.name == name) {
        format!("spec.containers{{{name}}}")
    } else if pod::init_containers(p).iter().any(|c| c.name == name) {
        format!("spec.initContainers{{{name}}}")
    } else if spec.ephemeral_containers.iter().flatten().any(|c| c.name == name) {
        format!("spec.ephemeralContainers{{{name}}}")
    } else {
        // kubelet's words for a container the spec does not name.
        format!("implicitly required container {name}")
    }
}

/// The node, as kubelet refers to it: kind Node, its name, and its name again as the UID.
pub fn node_reference(node: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        uid: Some(node.to_string()),
        ..Default::default()
    }
}

/// An API timestamp.
pub fn time(t: DateTime<Utc>) -> Time {
    let nanos = t.timestamp_nanos_opt().unwrap_or(0) as i128;
    Time(k8s_openapi::jiff::Timestamp::from_nanosecond(nanos).unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
}

/// An event's name: the object's name and the time in hex nanoseconds, as client-go names them.
pub fn event_name(object: &str, now: DateTime<Utc>) -> String {
    format!("{object}.{:x}", now.timestamp_nanos_opt().unwrap_or(0))
}

/// A new event (count 1) about `object`, reported by kubelet on `node`. Cluster-scoped objects'
/// events go to the `default` namespace.
pub fn make(object: ObjectReference, node: &str, kind: Kind, reason: &str, message: &str, now: DateTime<Utc>) -> Event {
    let namespace = object
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into());
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(object.name.as_deref().unwrap_or(""), now)),
            namespace: Some(namespace),
            ..Default::default()
        },
        involved_object: object,
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        first_timestamp: Some(time(now)),
        last_timestamp: Some(time(now)),
        count: Some(1),
        type_: Some(kind.as_str().to_string()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: Some(node.to_string()),
        }),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(node.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "42"},
            "spec": {
                "initContainers": [{"name": "init"}],
                "containers": [{"name": "app"}],
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_container_event_names_the_container_by_its_field_path() {
        let now = Utc.timestamp_opt(1_700_000_000, 123).unwrap();
        let e = make(
            pod_reference(&pod(), Some("app")),
            "node-a",
            Kind::Normal,
            "Started",
            "Started container app",
            now,
        );
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(
            v["involvedObject"],
            serde_json::json!({
                "apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "web", "uid": "u1",
                "resourceVersion": "42", "fieldPath": "spec.containers{app}"
            })
        );
        assert_eq!(v["metadata"]["namespace"], "shop");
        assert_eq!(v["metadata"]["name"], format!("web.{:x}", 1_700_000_000_000_000_123i64));
        assert_eq!(
            v["source"],
            serde_json::json!({"component": "kubelet", "host": "node-a"})
        );
        assert_eq!(v["reportingComponent"], "kubelet");
        assert_eq!(v["reportingInstance"], "node-a");
        assert_eq!(v["type"], "Normal");
        assert_eq!(v["count"], 1);
        assert_eq!(v["firstTimestamp"], v["lastTimestamp"]);
        let init = pod_reference(&pod(), Some("init"));
        assert_eq!(init.field_path.as_deref(), Some("spec.initContainers{init}"));
        assert_eq!(pod_reference(&pod(), None).field_path, None);
        let other = pod_reference(&pod(), Some("ghost"));
        assert_eq!(other.field_path.as_deref(), Some("implicitly required container ghost"));
    }

    #[test]
    fn node_events_go_to_the_default_namespace_with_the_name_as_uid() {
        let e = make(
            node_reference("node-a"),
            "node-a",
            Kind::Warning,
            "NodeNotReady",
            "m",
            Utc::now(),
        );
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(
            v["involvedObject"],
            serde_json::json!({"kind": "Node", "name": "node-a", "uid": "node-a"})
        );
        assert_eq!(v["metadata"]["namespace"], "default");
        assert_eq!(v["type"], "Warning");
    }
}
