//! Decoding pod manifests (YAML or JSON, one or many documents, Pod or PodList) and giving them
//! a static pod's identity as kubelet does: UID from a hash of the content and its source,
//! name suffixed with the node name, namespace `default`, the config annotations.

use k8s_openapi::api::core::v1::Pod;
use md5::{Digest, Md5};
use serde_json::Value;

/// Where a manifest came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    File(String),
    Url(String),
}

impl Source {
    pub fn kind(&self) -> &'static str {
        match self {
            Source::File(_) => "file",
            Source::Url(_) => "http",
        }
    }
}

/// Decode every pod in a manifest. Errors name the document and what is wrong with it.
pub fn decode(data: &str) -> Result<Vec<Pod>, String> {
    let docs: Vec<Value> = if data.trim_start().starts_with('{') || data.trim_start().starts_with('[') {
        serde_json::Deserializer::from_str(data)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .map_err(|e| format!("invalid JSON: {e}"))?
    } else {
        yaml_documents(data)?
    };
    let mut pods = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        let where_ = format!("document {}", i + 1);
        match doc {
            Value::Null => continue,
            Value::Object(ref m) if m.is_empty() => continue,
            Value::Object(ref m) => {
                let kind = m.get("kind").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "Pod" => pods.push(to_pod(doc, &where_)?),
                    "PodList" | "List" => {
                        let items = m.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
                        for (j, item) in items.into_iter().enumerate() {
                            let w = format!("{where_}, items[{j}]");
                            let k = item.get("kind").and_then(Value::as_str).unwrap_or("Pod");
                            if k != "Pod" {
                                return Err(format!("{w}: kind {k:?} is not a Pod"));
                            }
                            pods.push(to_pod(item, &w)?);
                        }
                    }
                    // The objects static pods use (image pull secrets, volumes, environment),
                    // read by podconfig::file::static_objects.
                    "Secret" | "ConfigMap" => continue,
                    "" => return Err(format!("{where_}: kind is missing (expected Pod)")),
                    other => return Err(format!("{where_}: kind {other:?} is not a Pod")),
                }
            }
            other => return Err(format!("{where_}: expected an object, got {}", kind_of(&other))),
        }
    }
    Ok(pods)
}

/// The documents of a YAML text as JSON values. The error says where and why, never what: the
/// parser's snippet of the source is left out, as the text may hold a secret (a kubeconfig's
/// key, a Secret).
pub fn yaml_documents(data: &str) -> Result<Vec<Value>, String> {
    serde_saphyr::from_multiple::<Value>(data).map_err(|e| {
        let e = e.to_string();
        let first = e.lines().next().unwrap_or_default().trim_start_matches("error: ");
        format!("invalid YAML: {first}")
    })
}

fn to_pod(v: Value, where_: &str) -> Result<Pod, String> {
    match v.get("apiVersion").and_then(Value::as_str) {
        Some("v1") | None => {}
        Some(other) => return Err(format!("{where_}: apiVersion {other:?} is not v1")),
    }
    from_value(v).map_err(|e| format!("{where_}: {e}"))
}

/// Decode a Kubernetes object (or part of one) from a JSON value; the error names the field
/// (`spec.containers[0].image: invalid type...`). Objects the agent decodes from values all
/// come through here, and through the text decoder kube-client uses, so each type's decoder is
/// compiled once (docs/static-build.md).
pub fn from_value<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, String> {
    ferrolet_fsutil::json::decode_value(&v).map_err(|e| e.to_string())
}

/// What a JSON value is, never what it says: errors about a manifest must not quote a file
/// that may not be one (a symlinked secret).
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Give a decoded pod its static identity (kubelet's applyDefaults for file and http sources).
pub fn apply_static_identity(pod: &mut Pod, source: &Source, node_name: &str) {
    if pod.metadata.uid.as_deref().unwrap_or("").is_empty() {
        let mut h = Md5::new();
        // The content (as decoded, before we touch it) then the source.
        h.update(serde_json::to_vec(pod).unwrap_or_default());
        match source {
            Source::File(p) => {
                h.update(format!("host:{node_name}"));
                h.update(format!("file:{p}"));
            }
            Source::Url(u) => h.update(format!("url:{u}")),
        }
        pod.metadata.uid = Some(hex::encode(h.finalize()));
    }
    let base = pod.metadata.name.clone().unwrap_or_default();
    pod.metadata.name = Some(format!("{base}-{}", node_name.to_ascii_lowercase()));
    if pod.metadata.namespace.as_deref().unwrap_or("").is_empty() {
        pod.metadata.namespace = Some("default".into());
    }
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node_name.to_string());
    if matches!(source, Source::File(_)) {
        let tol = k8s_openapi::api::core::v1::Toleration {
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Default::default()
        };
        spec.tolerations.get_or_insert_with(Vec::new).push(tol);
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let ann = pod.metadata.annotations.get_or_insert_with(Default::default);
    ann.insert(super::CONFIG_HASH.into(), uid);
    ann.insert(super::CONFIG_SOURCE.into(), source.kind().into());
    ann.insert(
        super::CONFIG_SEEN.into(),
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str =
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox\n";

    #[test]
    fn decodes_yaml_multi_doc_and_lists() {
        let two = format!("{POD}---\n{}", POD.replace("web", "web2"));
        assert_eq!(decode(&two).unwrap().len(), 2);
        let list = r#"{"kind":"PodList","apiVersion":"v1","items":[{"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"x"}]}}]}"#;
        assert_eq!(decode(list).unwrap().len(), 1);
        assert_eq!(decode("---\n---\n").unwrap().len(), 0);
    }

    #[test]
    fn errors_say_what_and_where() {
        let e = decode("kind: Service\napiVersion: v1\n").unwrap_err();
        assert!(e.contains("Service"), "{e}");
        let e = decode("kind: Pod\n  bad: [indent").unwrap_err();
        assert!(e.contains("YAML"), "{e}");
        let e = decode("{\"kind\":\"Pod\",\"spec\":{\"containers\":\"nope\"}}").unwrap_err();
        assert!(e.contains("document 1") && e.contains("spec.containers"), "{e}");
        let e = decode("kind: Pod\nspec:\n  containers:\n  - name: c\n    env: [{name: X, value: yes}]\n").unwrap_err();
        assert!(e.contains("spec.containers[0].env[0].value"), "{e}");
    }

    #[test]
    fn static_identity_is_stable_and_source_dependent() {
        let mut a = decode(POD).unwrap().remove(0);
        let mut b = decode(POD).unwrap().remove(0);
        let mut c = decode(POD).unwrap().remove(0);
        apply_static_identity(&mut a, &Source::File("/m/web.yaml".into()), "Node1");
        apply_static_identity(&mut b, &Source::File("/m/web.yaml".into()), "Node1");
        apply_static_identity(&mut c, &Source::File("/m/other.yaml".into()), "Node1");
        assert_eq!(a.metadata.uid, b.metadata.uid);
        assert_ne!(a.metadata.uid, c.metadata.uid);
        assert_eq!(a.metadata.name.as_deref(), Some("web-node1"));
        assert_eq!(a.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(a.metadata.uid.as_ref().unwrap().len(), 32);
        let ann = a.metadata.annotations.unwrap();
        assert_eq!(ann.get(crate::pod::CONFIG_SOURCE).map(String::as_str), Some("file"));
    }

    #[test]
    fn errors_never_quote_the_file() {
        // A file that is not a manifest (a secret symlinked into the manifest directory) must
        // not come back in an error. (Inside a Pod-shaped object, serde's type errors quote the
        // offending value, as kube-apiserver's do; those go only to the owner-only CLI socket.)
        for text in [
            "hunter2-secret",
            "root:hunter2-secret:19000:0:99999:7:::",
            "hunter2-secret\nline two\n",
            "- hunter2-secret\n- b",
            "[\"hunter2-secret\"]",
            "kind: Pod\nspec: [hunter2-secret\n",
            "password: hunter2-secret\n",
        ] {
            let e = decode(text).unwrap_err();
            assert!(!e.contains("hunter2"), "{text:?} -> {e}");
        }
    }
}
