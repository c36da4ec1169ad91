//! The ConfigMaps and Secrets of static pods on a node without an API server: `kind: ConfigMap`
//! and `kind: Secret` documents in the static pod path (beside the pods or in files of their
//! own), read anew each time a pod's volumes are synced or a container starts, so a changed
//! file reaches volumes within syncFrequency and env at the next container start, as objects
//! from an API server do. An object without a namespace is in `default`, like a static pod;
//! a pod sees only the objects of its own namespace. The same objects serve static pods'
//! imagePullSecrets (the image manager reads them through
//! [`static_secrets`](crate::podconfig::file::static_secrets)).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use k8s_openapi::ByteString;

use super::{container_references, references, EnvObjects, Lookup, VolumeObjects};
use crate::pod;
use crate::podconfig::file::{static_objects, StaticObjects};

/// Why a projected serviceAccountToken cannot be served from local objects.
pub const NO_TOKEN: &str = "serviceAccountToken projections need an API server to issue the token; a static pod on a node without one has no service account";

/// The local object source: the static pod path.
#[derive(Debug, Clone)]
pub struct LocalObjects {
    path: PathBuf,
}

/// One reading of the static pod path, by (namespace, name).
#[derive(Debug, Default, Clone)]
pub struct LocalSnapshot {
    config_maps: BTreeMap<(String, String), Arc<ConfigMap>>,
    secrets: BTreeMap<(String, String), Arc<Secret>>,
}

impl LocalObjects {
    pub fn new(path: PathBuf) -> LocalObjects {
        LocalObjects { path }
    }

    /// Read the static pod path now (blocking: call it off the async threads).
    pub fn read(&self) -> LocalSnapshot {
        LocalSnapshot::from_objects(static_objects(&self.path))
    }

    /// [`LocalSnapshot::volume_objects`] of the path as it is now; a pod whose volumes name no
    /// ConfigMap or Secret needs no reading at all (blocking otherwise).
    pub fn volume_objects(&self, p: &Pod) -> VolumeObjects {
        let (cms, secrets) = references(p);
        if cms.is_empty() && secrets.is_empty() {
            return LocalSnapshot::default().volume_objects(p);
        }
        self.read().volume_objects(p)
    }

    /// [`LocalSnapshot::env_objects`] of the path as it is now; nothing is read for a container
    /// whose env names no ConfigMap or Secret (blocking otherwise).
    pub fn env_objects(&self, p: &Pod, c: &Container) -> EnvObjects {
        let (cms, secrets) = container_references(c);
        if cms.is_empty() && secrets.is_empty() {
            return LocalSnapshot::default().env_objects(p, c);
        }
        self.read().env_objects(p, c)
    }
}

fn key(ns: Option<&str>, name: Option<&str>) -> (String, String) {
    (
        ns.filter(|n| !n.is_empty()).unwrap_or("default").to_string(),
        name.unwrap_or_default().to_string(),
    )
}

/// The API server merges `stringData` into `data` when a Secret is written; a Secret read from a
/// file gets the same treatment (stringData wins, as on the API server).
fn normalize_secret(mut s: Secret) -> Secret {
    if let Some(sd) = s.string_data.take() {
        let data = s.data.get_or_insert_with(BTreeMap::new);
        for (k, v) in sd {
            data.insert(k, ByteString(v.into_bytes()));
        }
    }
    s
}

impl LocalSnapshot {
    pub fn from_objects(o: StaticObjects) -> LocalSnapshot {
        let mut out = LocalSnapshot::default();
        // The first of two objects with one name wins, as the first of two pods does.
        for c in o.config_maps {
            let k = key(c.metadata.namespace.as_deref(), c.metadata.name.as_deref());
            out.config_maps.entry(k).or_insert_with(|| Arc::new(c));
        }
        for s in o.secrets {
            let k = key(s.metadata.namespace.as_deref(), s.metadata.name.as_deref());
            out.secrets.entry(k).or_insert_with(|| Arc::new(normalize_secret(s)));
        }
        out
    }

    fn config_map(&self, ns: &str, name: &str) -> Lookup<ConfigMap> {
        Ok(self.config_maps.get(&(ns.to_string(), name.to_string())).cloned())
    }

    fn secret(&self, ns: &str, name: &str) -> Lookup<Secret> {
        Ok(self.secrets.get(&(ns.to_string(), name.to_string())).cloned())
    }

    /// What the pod's configMap, secret and projected volumes need, from local objects.
    pub fn volume_objects(&self, p: &Pod) -> VolumeObjects {
        let ns = pod::namespace(p);
        let (cms, secrets) = references(p);
        let mut out = VolumeObjects::default();
        (out.config_maps, out.secrets) = self.lookups(ns, cms, secrets);
        for v in pod::spec(p).volumes.iter().flatten() {
            for (i, src) in v.projected.iter().flat_map(|p| p.sources.iter().flatten()).enumerate() {
                if src.service_account_token.is_some() {
                    out.tokens.insert((v.name.clone(), i), Err(NO_TOKEN.to_string()));
                }
            }
        }
        out
    }

    /// What `c`'s env and envFrom reference, from local objects (no Services without an API
    /// server: no service variables).
    pub fn env_objects(&self, p: &Pod, c: &Container) -> EnvObjects {
        let ns = pod::namespace(p);
        let (cms, secrets) = container_references(c);
        let mut out = EnvObjects::default();
        (out.config_maps, out.secrets) = self.lookups(ns, cms, secrets);
        out
    }

    /// The named ConfigMaps and Secrets of namespace `ns`, each found or not.
    #[allow(clippy::type_complexity)]
    fn lookups(
        &self,
        ns: &str,
        cms: impl IntoIterator<Item = String>,
        secrets: impl IntoIterator<Item = String>,
    ) -> (BTreeMap<String, Lookup<ConfigMap>>, BTreeMap<String, Lookup<Secret>>) {
        let cms = cms.into_iter().map(|n| (n.clone(), self.config_map(ns, &n))).collect();
        let secrets = secrets.into_iter().map(|n| (n.clone(), self.secret(ns, &n))).collect();
        (cms, secrets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_string_data_and_missing_objects() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("objects.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata: {a: one}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg, namespace: other}\ndata: {a: other}\n---\n\
             apiVersion: v1\nkind: Secret\nmetadata: {name: sec}\ndata: {pw: aHVudGVyMg==}\nstringData: {user: admin}\n",
        )
        .unwrap();
        let snap = LocalObjects::new(dir.path().to_path_buf()).read();
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {
                "volumes": [
                    {"name": "c", "configMap": {"name": "cfg"}},
                    {"name": "s", "secret": {"secretName": "sec"}},
                    {"name": "gone", "configMap": {"name": "nope"}},
                    {"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
                ],
                "containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "cfg"}}]}]
            }
        }))
        .unwrap();
        let o = snap.volume_objects(&p);
        let cm = o.config_maps["cfg"].as_ref().unwrap().as_ref().unwrap();
        assert_eq!(cm.data.as_ref().unwrap()["a"], "one", "the pod's namespace only");
        let s = o.secrets["sec"].as_ref().unwrap().as_ref().unwrap();
        let data = s.data.as_ref().unwrap();
        assert_eq!(data["pw"].0, b"hunter2");
        assert_eq!(data["user"].0, b"admin", "stringData is merged into data");
        assert!(matches!(o.config_maps["nope"], Ok(None)));
        assert_eq!(o.tokens[&("t".to_string(), 0)].as_ref().unwrap_err(), NO_TOKEN);
        let e = snap.env_objects(&p, &pod::containers(&p)[0]);
        assert!(matches!(&e.config_maps["cfg"], Ok(Some(_))));
    }
}
