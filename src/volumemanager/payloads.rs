//! What each object-backed volume holds, file by file (kubelet's MakePayload of the configMap
//! and secret plugins, the downward API's CollectData, the projected plugin's collectData): the
//! objects' keys, or the `items` chosen from them, with their modes. Pure: the objects come
//! fetched already ([`VolumeObjects`]); [`super::atomic_writer`] puts the result on disk.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, DownwardAPIVolumeFile, KeyToPath, Pod, ProjectedVolumeSource, Secret,
    SecretVolumeSource,
};

use super::atomic_writer::{FileProjection, Payload};
use crate::objects::{Lookup, VolumeObjects};
use crate::pod;
use crate::pod::fieldpath::{field_ref, resource_field, PodFacts};

/// The API's default mode of configMap, secret, downwardAPI and projected files.
pub const DEFAULT_MODE: i32 = 0o644;

/// The object a volume names: `Ok(None)` when it is missing but optional (an empty volume).
fn object<'a, K>(
    objects: &'a BTreeMap<String, Lookup<K>>,
    kind: &str,
    name: &str,
    optional: bool,
) -> Result<Option<&'a K>, String> {
    match objects.get(name) {
        Some(Ok(Some(o))) => Ok(Some(o)),
        Some(Ok(None)) if optional => Ok(None),
        Some(Ok(None)) => Err(format!("{kind} {name:?} not found")),
        Some(Err(e)) => Err(e.clone()),
        None => Err(format!("couldn't get {kind} {name}: not fetched")),
    }
}

/// kubelet's MakePayload over a key -> bytes map: every key, or just `items` (a missing key is
/// an error unless the volume is optional).
fn make_payload(
    data: BTreeMap<&str, &[u8]>,
    items: Option<&[KeyToPath]>,
    default_mode: i32,
    optional: bool,
    missing: &dyn Fn(&str) -> String,
) -> Result<Payload, String> {
    let mut out = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, d) in data {
                out.insert(
                    k.to_string(),
                    FileProjection {
                        data: d.to_vec(),
                        mode: default_mode as u32,
                    },
                );
            }
        }
        Some(items) => {
            for it in items {
                let Some(d) = data.get(it.key.as_str()) else {
                    if optional {
                        continue;
                    }
                    return Err(missing(&it.key));
                };
                out.insert(
                    it.path.clone(),
                    FileProjection {
                        data: d.to_vec(),
                        mode: it.mode.unwrap_or(default_mode) as u32,
                    },
                );
            }
        }
    }
    Ok(out)
}

fn config_map_data(cm: Option<&ConfigMap>) -> BTreeMap<&str, &[u8]> {
    let mut m = BTreeMap::new();
    if let Some(cm) = cm {
        for (k, v) in cm.data.iter().flatten() {
            m.insert(k.as_str(), v.as_bytes());
        }
        for (k, v) in cm.binary_data.iter().flatten() {
            m.entry(k.as_str()).or_insert(v.0.as_slice());
        }
    }
    m
}

fn secret_data(s: Option<&Secret>) -> BTreeMap<&str, &[u8]> {
    s.into_iter()
        .flat_map(|s| s.data.iter().flatten())
        .map(|(k, v)| (k.as_str(), v.0.as_slice()))
        .collect()
}

fn config_map_payload(
    cm: Option<&ConfigMap>,
    items: Option<&[KeyToPath]>,
    mode: i32,
    optional: bool,
) -> Result<Payload, String> {
    make_payload(config_map_data(cm), items, mode, optional, &|k| {
        format!("configmap references non-existent config key: {k}")
    })
}

fn secret_payload(
    s: Option<&Secret>,
    items: Option<&[KeyToPath]>,
    mode: i32,
    optional: bool,
) -> Result<Payload, String> {
    make_payload(secret_data(s), items, mode, optional, &|k| {
        format!("references non-existent secret key: {k}")
    })
}

/// A configMap volume.
pub fn config_map(v: &ConfigMapVolumeSource, objects: &VolumeObjects) -> Result<Payload, String> {
    let optional = v.optional == Some(true);
    let cm = object(&objects.config_maps, "configmap", &v.name, optional)?;
    config_map_payload(cm, v.items.as_deref(), v.default_mode.unwrap_or(DEFAULT_MODE), optional)
}

/// A secret volume.
pub fn secret(v: &SecretVolumeSource, objects: &VolumeObjects) -> Result<Payload, String> {
    let optional = v.optional == Some(true);
    let name = v.secret_name.as_deref().unwrap_or("");
    let s = object(&objects.secrets, "secret", name, optional)?;
    secret_payload(s, v.items.as_deref(), v.default_mode.unwrap_or(DEFAULT_MODE), optional)
}

/// A downwardAPI volume's files (kubelet's CollectData); every failing item is reported.
pub fn downward_api(
    p: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: i32,
    facts: &PodFacts,
) -> Result<Payload, String> {
    let mut out = Payload::new();
    let mut errs = Vec::new();
    for item in items {
        let content = if let Some(f) = &item.field_ref {
            match f.field_path.as_str() {
                "metadata.labels" => Ok(kv_lines(p.metadata.labels.as_ref())),
                "metadata.annotations" => Ok(kv_lines(p.metadata.annotations.as_ref())),
                path => field_ref(p, path, facts),
            }
        } else if let Some(r) = &item.resource_field_ref {
            let cname = r.container_name.as_deref().unwrap_or("");
            match pod::containers(p).iter().find(|c| c.name == cname) {
                Some(c) => {
                    let div = r.divisor.as_ref().map(|q| q.0.clone()).unwrap_or_else(|| "1".into());
                    resource_field(c, &r.resource, &div, facts)
                }
                None => Err(format!("resourceFieldRef.containerName {cname:?} not found")),
            }
        } else {
            Err("needs fieldRef or resourceFieldRef".into())
        };
        match content {
            Ok(c) => {
                out.insert(
                    item.path.clone(),
                    FileProjection {
                        data: c.into_bytes(),
                        mode: item.mode.unwrap_or(default_mode) as u32,
                    },
                );
            }
            Err(e) => errs.push(format!("{}: {e}", item.path)),
        }
    }
    aggregate(errs)?;
    Ok(out)
}

/// A projected volume: its sources in order, later paths winning. A serviceAccountToken file
/// is 0600 when the pod has an fsGroup (which then adds group read), as kubelet's.
pub fn projected(
    p: &Pod,
    volume: &str,
    v: &ProjectedVolumeSource,
    objects: &VolumeObjects,
    facts: &PodFacts,
    fs_group: bool,
) -> Result<Payload, String> {
    let mode = v.default_mode.unwrap_or(DEFAULT_MODE);
    let mut out = Payload::new();
    let mut errs = Vec::new();
    for (i, src) in v.sources.iter().flatten().enumerate() {
        let part = if let Some(c) = &src.config_map {
            let optional = c.optional == Some(true);
            object(&objects.config_maps, "configmap", &c.name, optional)
                .and_then(|cm| config_map_payload(cm, c.items.as_deref(), mode, optional))
        } else if let Some(s) = &src.secret {
            let optional = s.optional == Some(true);
            object(&objects.secrets, "secret", &s.name, optional)
                .and_then(|sec| secret_payload(sec, s.items.as_deref(), mode, optional))
        } else if let Some(d) = &src.downward_api {
            downward_api(p, d.items.as_deref().unwrap_or(&[]), mode, facts)
        } else if let Some(t) = &src.service_account_token {
            match objects.tokens.get(&(volume.to_string(), i)) {
                Some(Ok(token)) => Ok(Payload::from([(
                    t.path.clone(),
                    FileProjection {
                        data: token.clone().into_bytes(),
                        mode: if fs_group { 0o600 } else { mode as u32 },
                    },
                )])),
                Some(Err(e)) => Err(e.clone()),
                None => Err("service account token not fetched".into()),
            }
        } else if src.cluster_trust_bundle.is_some() {
            Err(format!(
                "sources[{i}]: clusterTrustBundle projections are not supported: ferrolet has no ClusterTrustBundle source (a certificates.k8s.io beta API read from an API server)"
            ))
        } else {
            let kind = serde_json::to_value(src)
                .ok()
                .and_then(|v| v.as_object().and_then(|m| m.keys().next().cloned()))
                .unwrap_or_else(|| "an empty source".into());
            Err(format!("sources[{i}]: {kind} projections are not supported"))
        };
        match part {
            Ok(files) => out.extend(files),
            Err(e) => errs.push(e),
        }
    }
    aggregate(errs)?;
    Ok(out)
}

/// apimachinery's aggregate error: one error as itself, several as `[a, b]`.
fn aggregate(errs: Vec<String>) -> Result<(), String> {
    match errs.len() {
        0 => Ok(()),
        1 => Err(errs.into_iter().next().unwrap_or_default()),
        _ => Err(format!("[{}]", errs.join(", "))),
    }
}

/// `key="value"` lines sorted by key, as the downward API writes labels and annotations.
fn kv_lines(m: Option<&BTreeMap<String, String>>) -> String {
    m.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", serde_json::Value::String(v.clone())))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn objects() -> VolumeObjects {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cfg"}, "data": {"a": "1", "b": "2"}, "binaryData": {"bin": "AAE="}
        }))
        .unwrap();
        let sec: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "sec"}, "data": {"pw": "aHVudGVyMg=="}
        }))
        .unwrap();
        let mut o = VolumeObjects::default();
        o.config_maps.insert("cfg".into(), Ok(Some(Arc::new(cm))));
        o.config_maps.insert("gone".into(), Ok(None));
        o.secrets.insert("sec".into(), Ok(Some(Arc::new(sec))));
        o.tokens.insert(("api".into(), 1), Ok("tok".into()));
        o
    }

    fn files(p: &Payload) -> Vec<(String, String, u32)> {
        p.iter()
            .map(|(k, f)| (k.clone(), String::from_utf8_lossy(&f.data).into_owned(), f.mode))
            .collect()
    }

    #[test]
    fn config_map_keys_items_and_modes() {
        let o = objects();
        let v: ConfigMapVolumeSource =
            serde_json::from_value(serde_json::json!({"name": "cfg", "defaultMode": 0o600})).unwrap();
        let got = config_map(&v, &o).unwrap();
        assert_eq!(got["bin"].data, vec![0u8, 1]);
        assert_eq!(got["a"].mode, 0o600);
        let v: ConfigMapVolumeSource = serde_json::from_value(serde_json::json!({
            "name": "cfg", "items": [{"key": "b", "path": "dir/b.txt", "mode": 0o400}]
        }))
        .unwrap();
        assert_eq!(
            files(&config_map(&v, &o).unwrap()),
            [("dir/b.txt".into(), "2".into(), 0o400)]
        );
        let v: ConfigMapVolumeSource =
            serde_json::from_value(serde_json::json!({"name": "cfg", "items": [{"key": "zz", "path": "z"}]})).unwrap();
        assert_eq!(
            config_map(&v, &o).unwrap_err(),
            "configmap references non-existent config key: zz"
        );
        let v: ConfigMapVolumeSource = serde_json::from_value(serde_json::json!({"name": "gone"})).unwrap();
        assert_eq!(config_map(&v, &o).unwrap_err(), "configmap \"gone\" not found");
        let v: ConfigMapVolumeSource =
            serde_json::from_value(serde_json::json!({"name": "gone", "optional": true})).unwrap();
        assert!(config_map(&v, &o).unwrap().is_empty());
    }

    #[test]
    fn secret_volume() {
        let o = objects();
        let v: SecretVolumeSource = serde_json::from_value(serde_json::json!({"secretName": "sec"})).unwrap();
        assert_eq!(
            files(&secret(&v, &o).unwrap()),
            [("pw".into(), "hunter2".into(), 0o644)]
        );
        let v: SecretVolumeSource =
            serde_json::from_value(serde_json::json!({"secretName": "sec", "items": [{"key": "x", "path": "x"}]}))
                .unwrap();
        assert_eq!(secret(&v, &o).unwrap_err(), "references non-existent secret key: x");
    }

    #[test]
    fn projected_kube_api_access() {
        let o = objects();
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {"containers": []}
        }))
        .unwrap();
        let v: ProjectedVolumeSource = serde_json::from_value(serde_json::json!({"defaultMode": 0o644, "sources": [
            {"configMap": {"name": "cfg", "items": [{"key": "a", "path": "ca.crt"}]}},
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
        ]}))
        .unwrap();
        let got = projected(&p, "api", &v, &o, &PodFacts::default(), false).unwrap();
        assert_eq!(
            files(&got),
            [
                ("ca.crt".into(), "1".into(), 0o644),
                ("namespace".into(), "ns".into(), 0o644),
                ("token".into(), "tok".into(), 0o644)
            ]
        );
        let got = projected(&p, "api", &v, &o, &PodFacts::default(), true).unwrap();
        assert_eq!(
            got["token"].mode, 0o600,
            "fsGroup: the group gets read through ownership"
        );
        // Errors of several sources are reported together.
        let v: ProjectedVolumeSource = serde_json::from_value(serde_json::json!({"sources": [
            {"configMap": {"name": "gone"}}, {"secret": {"name": "sec", "items": [{"key": "x", "path": "x"}]}}
        ]}))
        .unwrap();
        assert_eq!(
            projected(&p, "api", &v, &o, &PodFacts::default(), false).unwrap_err(),
            "[configmap \"gone\" not found, references non-existent secret key: x]"
        );
    }
}
