//! Mirror pods as objects (kubelet's pod/mirror_client.go and the pod manager's mirror
//! checks): how a static pod's mirror is made, and how a mirror is told to belong to one.
//! Pure; the API calls are in the parent module.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::pod;

use crate::pod::{annotation, CONFIG_MIRROR};

/// kubelet's pod full name, `name_namespace`: how a mirror pod and its static pod are paired.
pub fn full_name(p: &Pod) -> String {
    format!("{}_{}", pod::name(p), pod::namespace(p))
}

/// Whether `mirror` is the mirror of `static_pod` as it is now (kubelet's IsMirrorPodOf):
/// same name and namespace, and the mirror annotation holds the static pod's config hash.
pub fn is_mirror_of(mirror: &Pod, static_pod: &Pod) -> bool {
    pod::name(mirror) == pod::name(static_pod)
        && pod::namespace(mirror) == pod::namespace(static_pod)
        && annotation(mirror, CONFIG_MIRROR).is_some()
        && annotation(mirror, CONFIG_MIRROR) == annotation(static_pod, pod::CONFIG_HASH)
}

/// The mirror pod kubelet creates for `static_pod` on `node` (whose Node object has
/// `node_uid`): the static pod with the mirror annotation set to its config hash, owned by the
/// Node (controller, as NodeRestriction requires), bound to the node, without status or any
/// server-set metadata.
pub fn build(static_pod: &Pod, node: &str, node_uid: &str) -> Pod {
    let mut m = static_pod.clone();
    let hash = annotation(static_pod, pod::CONFIG_HASH).unwrap_or("").to_string();
    let meta = &mut m.metadata;
    meta.uid = None;
    meta.resource_version = None;
    meta.creation_timestamp = None;
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.generation = None;
    meta.managed_fields = None;
    meta.self_link = None;
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(CONFIG_MIRROR.into(), hash);
    meta.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.to_string(),
        uid: node_uid.to_string(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    m.spec.get_or_insert_with(Default::default).node_name = Some(node.to_string());
    m.status = None;
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::manifest::{apply_static_identity, Source};

    fn static_pod() -> Pod {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        apply_static_identity(&mut p, &Source::File("/etc/m/web.yaml".into()), "node-a");
        p
    }

    #[test]
    fn a_mirror_is_the_static_pod_owned_by_the_node_with_its_hash() {
        let s = static_pod();
        let m = build(&s, "node-a", "node-uid-1");
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["metadata"]["name"], "web-node-a");
        assert_eq!(v["metadata"]["namespace"], "default");
        assert_eq!(v["metadata"]["labels"]["app"], "web");
        assert!(
            v["metadata"].get("uid").is_none(),
            "the API server gives the mirror its own UID"
        );
        let ann = &v["metadata"]["annotations"];
        assert_eq!(ann[CONFIG_MIRROR], ann[pod::CONFIG_HASH]);
        assert_eq!(ann[CONFIG_MIRROR], pod::uid(&s));
        assert_eq!(ann[pod::CONFIG_SOURCE], "file");
        assert_eq!(
            v["metadata"]["ownerReferences"],
            serde_json::json!([{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-uid-1", "controller": true}])
        );
        assert_eq!(v["spec"]["nodeName"], "node-a");
        assert!(v.get("status").is_none());
        assert!(pod::is_mirror(&m) && !pod::is_mirror(&s));
        assert_eq!(full_name(&m), "web-node-a_default");
    }

    #[test]
    fn a_mirror_belongs_to_the_static_pod_only_while_the_hash_matches() {
        let s = static_pod();
        let mut m = build(&s, "node-a", "u");
        m.metadata.uid = Some("server-uid".into());
        assert!(is_mirror_of(&m, &s));
        // The manifest changed: a new hash.
        let mut changed = s.clone();
        changed
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(pod::CONFIG_HASH.into(), "other".into());
        assert!(!is_mirror_of(&m, &changed));
        // A pod of the same name that is not a mirror.
        let mut plain = s.clone();
        plain.metadata.annotations = None;
        assert!(!is_mirror_of(&plain, &s));
        let mut elsewhere = m.clone();
        elsewhere.metadata.namespace = Some("other".into());
        assert!(!is_mirror_of(&elsewhere, &s));
    }
}
