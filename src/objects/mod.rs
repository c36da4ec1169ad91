//! The API objects pods use, read with the node's own identity (kubelet's configmap, secret and
//! token managers and its service lister): ConfigMaps and Secrets ([`store`]), ServiceAccount
//! tokens bound to pods ([`tokens`]), Services for environment variables ([`services`]), the
//! claims of persistent and ephemeral volumes with their PersistentVolumes ([`claims`]). The
//! Node authorizer lets the node read only what pods bound to it reference, so everything here
//! is asked for on behalf of one pod. Only nodes in a cluster have an [`ObjectManager`].
//!
//! What a container's environment or a pod's volumes need is fetched here, asynchronously, into
//! plain values ([`EnvObjects`], [`VolumeObjects`]) that the pure builders below read.
//!
//! Everything fetched is also kept in the node's checkpoint with the pods that use it, and
//! served from there while the API server cannot be reached (a Secret the server says is gone
//! is forgotten, never served): a node started without its server fills its pods' volumes and
//! env as they last were (docs/offline.md). Tokens are served as kept, expired or not; the
//! pod's own client retries, and the next fetch once the server is back renews them.

pub mod claims;
pub mod local;
pub mod services;
pub mod store;
pub mod tokens;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccountTokenProjection,
};

use crate::checkpoint::{Checkpoint, Object};
use crate::kubeclient::Kube;
use crate::pod;
use crate::tasks::blocking;
pub use store::Lookup;
use store::{FetchError, ObjectKey, Store};
use tokens::{TokenKey, TokenManager};

/// kubelet's default TTL of cached ConfigMaps and Secrets, when the Node has no
/// `node.alpha.kubernetes.io/ttl` (the TTL controller sets 0 in small clusters).
pub const OBJECT_TTL: Duration = Duration::from_secs(60);
/// The annotation the TTL controller sets on Nodes.
pub const NODE_TTL_ANNOTATION: &str = "node.alpha.kubernetes.io/ttl";
/// The API's default `expirationSeconds` of a projected token.
pub const DEFAULT_TOKEN_EXPIRATION: i64 = 3600;
/// After the API server gave no answer, how long what the checkpoint keeps is served without
/// asking the server again: every request waits its turn under kubeAPIQPS only to be refused
/// (or to time out), and a node that starts without its server fetches every pod's objects at
/// once (20 pods' objects took 1.6 s of the offline boot at 50 requests a second).
const UNREACHABLE_HOLD: Duration = Duration::from_secs(2);

/// The ConfigMaps and Secrets one container's environment references, and the Service
/// variables it gets.
/// The default (a node without an API server) has none.
#[derive(Debug, Clone)]
pub struct EnvObjects {
    pub config_maps: BTreeMap<String, Lookup<ConfigMap>>,
    pub secrets: BTreeMap<String, Lookup<Secret>>,
    pub service_env: Result<Vec<(String, String)>, String>,
}

impl Default for EnvObjects {
    fn default() -> Self {
        EnvObjects {
            config_maps: BTreeMap::new(),
            secrets: BTreeMap::new(),
            service_env: Ok(Vec::new()),
        }
    }
}

/// What a pod's configMap, secret and projected volumes need: the objects by name, and each
/// projected serviceAccountToken by (volume, source index).
#[derive(Debug, Default, Clone)]
pub struct VolumeObjects {
    pub config_maps: BTreeMap<String, Lookup<ConfigMap>>,
    pub secrets: BTreeMap<String, Lookup<Secret>>,
    pub tokens: BTreeMap<(String, usize), Result<String, String>>,
    /// The claims of `persistentVolumeClaim` and `ephemeral` volumes with their volumes, by
    /// volume name.
    pub claims: BTreeMap<String, claims::ClaimLookup>,
    /// The Secrets the claims' CSI PersistentVolumes name (`nodeStageSecretRef`,
    /// `nodePublishSecretRef`), by `(namespace, name)`: any namespace.
    pub pv_secrets: BTreeMap<(String, String), Lookup<Secret>>,
}

pub struct ObjectManager {
    kube: Kube,
    /// The node's own Node as its watch delivers it: the objects' TTL is read there (kubelet's
    /// node lister), never with a request of its own.
    node: tokio::sync::watch::Receiver<Option<k8s_openapi::api::core::v1::Node>>,
    config_maps: Store<ConfigMap>,
    secrets: Store<Secret>,
    tokens: TokenManager,
    services: services::ServiceCache,
    checkpoint: Arc<Checkpoint>,
    /// When the API server last gave no answer to a fetch.
    unreachable_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// The claims resolved for each pod's volumes, by pod UID and volume name: a pod's are
    /// resolved once, as kubelet's populator does, and forgotten when it leaves.
    claims: std::sync::Mutex<BTreeMap<(String, String), Arc<claims::BoundClaim>>>,
}

impl ObjectManager {
    pub fn new(
        kube: Kube,
        node: tokio::sync::watch::Receiver<Option<k8s_openapi::api::core::v1::Node>>,
        checkpoint: Arc<Checkpoint>,
    ) -> Arc<ObjectManager> {
        Arc::new(ObjectManager {
            checkpoint,
            kube,
            node,
            config_maps: Store::default(),
            secrets: Store::default(),
            tokens: TokenManager::default(),
            services: services::ServiceCache::new(),
            unreachable_at: std::sync::Mutex::new(None),
            claims: std::sync::Mutex::new(BTreeMap::new()),
        })
    }

    /// Whether the server is known to be away: it gave no answer within [`UNREACHABLE_HOLD`],
    /// or the node runs on pods restored from its checkpoint and has not listed the server's
    /// since. Meanwhile what the checkpoint keeps is served as it is.
    fn server_away(&self) -> bool {
        let recent = self
            .unreachable_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| t.elapsed() < UNREACHABLE_HOLD);
        recent || self.checkpoint.view().stale().is_some_and(|s| s.restored.is_some())
    }

    /// The agent has joined: the Services are watched from now on (kubelet starts its
    /// informers then), not from the first pod's start.
    pub fn watch_services(&self) {
        self.services.start(&self.kube);
    }

    fn note_unreachable(&self) {
        *self.unreachable_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
    }

    /// Note what the pod references (kubelet's RegisterPod). A new version of the pod fetches
    /// its objects anew; the same version keeps using the cache until its TTL.
    pub fn register_pod(&self, p: &Pod) {
        let (uid, version) = (pod::uid(p), p.metadata.resource_version.as_deref().unwrap_or(""));
        let (cms, secrets) = references(p);
        let ns = pod::namespace(p);
        let keys = |names: BTreeSet<String>| {
            names
                .into_iter()
                .map(|n| (ns.to_string(), n))
                .collect::<BTreeSet<ObjectKey>>()
        };
        self.config_maps.register(uid, version, keys(cms));
        self.secrets.register(uid, version, keys(secrets));
    }

    /// The pod left the node: forget its objects and tokens (kubelet's UnregisterPod and
    /// DeleteServiceAccountToken).
    pub fn unregister_pod(&self, uid: &str) {
        self.config_maps.unregister(uid);
        self.secrets.unregister(uid);
        self.tokens.forget_pod(uid);
        self.claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(u, _), _| u != uid);
    }

    pub async fn config_map(&self, ns: &str, name: &str) -> Lookup<ConfigMap> {
        if self.server_away() {
            if let Some(o) = self.checkpoint.config_map(ns, name) {
                return Ok(Some(Arc::new(o)));
            }
        }
        let ttl = self.object_ttl();
        let got = self.config_maps.get(&self.kube, ns, name, ttl).await;
        let uids = self.config_maps.pods_referencing(&(ns.to_string(), name.to_string()));
        self.kept(
            got,
            uids,
            ns,
            name,
            false,
            |cp, ns, name| cp.config_map(ns, name),
            |cp, uids, o| cp.record_object(uids, Object::ConfigMap(o)),
        )
        .await
    }

    pub async fn secret(&self, ns: &str, name: &str) -> Lookup<Secret> {
        if self.server_away() {
            if let Some(o) = self.checkpoint.secret(ns, name) {
                return Ok(Some(Arc::new(o)));
            }
        }
        let ttl = self.object_ttl();
        let got = self.secrets.get(&self.kube, ns, name, ttl).await;
        let uids = self.secrets.pods_referencing(&(ns.to_string(), name.to_string()));
        self.kept(
            got,
            uids,
            ns,
            name,
            true,
            |cp, ns, name| cp.secret(ns, name),
            |cp, uids, o| cp.record_object(uids, Object::Secret(o)),
        )
        .await
    }

    /// What a fetch of `ns/name` for the pods `uids` found, kept in the checkpoint (found:
    /// recorded with the pods; gone: forgotten); while the server cannot be reached, what the
    /// checkpoint kept.
    #[allow(clippy::too_many_arguments)]
    async fn kept<K: Clone + Send + Sync + 'static>(
        &self,
        got: Result<Option<Arc<K>>, FetchError>,
        uids: Vec<String>,
        ns: &str,
        name: &str,
        secret: bool,
        last: impl FnOnce(&Checkpoint, &str, &str) -> Option<K>,
        record: fn(&Checkpoint, &[String], &K) -> anyhow::Result<()>,
    ) -> Lookup<K> {
        let cp = self.checkpoint.clone();
        match got {
            Ok(Some(o)) => {
                if !uids.is_empty() {
                    let kept = o.clone();
                    if let Err(e) = blocking(move || record(&cp, &uids, &kept)).await {
                        tracing::warn!(namespace = ns, name, error = %format!("{e:#}"), "checkpointing an object");
                    }
                }
                Ok(Some(o))
            }
            Ok(None) => {
                let (ns2, name2) = (ns.to_string(), name.to_string());
                if let Err(e) = blocking(move || cp.forget_object(&uids, &ns2, &name2, secret)).await {
                    tracing::warn!(namespace = ns, name, error = %format!("{e:#}"), "checkpointing an object");
                }
                Ok(None)
            }
            Err(e) if e.unreachable => {
                self.note_unreachable();
                match last(&self.checkpoint, ns, name) {
                    Some(o) => {
                        tracing::debug!(namespace = ns, name, error = %e.message, "API server unreachable; serving the checkpoint's copy");
                        Ok(Some(Arc::new(o)))
                    }
                    None => Err(e.message),
                }
            }
            Err(e) => Err(e.message),
        }
    }

    /// kubelet's getTTL: the watched Node's `node.alpha.kubernetes.io/ttl` seconds, else a
    /// minute (also before the Node is known).
    fn object_ttl(&self) -> Duration {
        self.node.borrow().as_ref().map_or(OBJECT_TTL, node_ttl)
    }

    /// A token for the pod's service account as the projection asks for it.
    pub async fn token(&self, p: &Pod, t: &ServiceAccountTokenProjection) -> Result<String, String> {
        let key = TokenKey {
            namespace: pod::namespace(p).to_string(),
            service_account: pod::spec(p)
                .service_account_name
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "default".into()),
            audiences: t.audience.iter().filter(|a| !a.is_empty()).cloned().collect(),
            expiration_seconds: t.expiration_seconds.unwrap_or(DEFAULT_TOKEN_EXPIRATION),
            pod_name: pod::name(p).to_string(),
            pod_uid: pod::uid(p).to_string(),
        };
        let kept_as = format!(
            "{}|{}|{}",
            key.service_account,
            key.audiences.join(","),
            key.expiration_seconds
        );
        let uid = key.pod_uid.clone();
        if self.server_away() {
            if let Some(t) = self.checkpoint.token(&uid, &kept_as) {
                return Ok(t);
            }
        }
        match self.tokens.get(&self.kube, &key).await {
            Ok(token) => {
                if self.checkpoint.token(&uid, &kept_as).as_deref() != Some(token.as_str()) {
                    let (cp, t) = (self.checkpoint.clone(), token.clone());
                    if let Err(e) = blocking(move || cp.record_token(&uid, &kept_as, &t)).await {
                        tracing::warn!(error = %format!("{e:#}"), "checkpointing a token");
                    }
                }
                Ok(token)
            }
            // No answer: served as kept, expired or not (the pod's client retries, and the
            // next fetch renews it).
            Err(e) if e.unreachable => {
                self.note_unreachable();
                match self.checkpoint.token(&uid, &kept_as) {
                    Some(t) => {
                        tracing::debug!(pod = %key.pod_name, error = %e.message, "API server unreachable; serving the checkpoint's token");
                        Ok(t)
                    }
                    None => Err(e.message),
                }
            }
            // The server answered (Forbidden, the ServiceAccount gone, ...): that is the
            // truth, as in kubelet; the volume is not refreshed, its files stay.
            Err(e) => Err(e.message),
        }
    }

    /// What `c`'s env and envFrom reference, and the Service variables of the pod.
    pub async fn env_objects(&self, p: &Pod, c: &Container) -> EnvObjects {
        let ns = pod::namespace(p);
        let mut out = EnvObjects::default();
        let (cms, secrets) = container_references(c);
        (out.config_maps, out.secrets) = self.fetch(ns, cms, secrets).await;
        let links = pod::spec(p).enable_service_links.unwrap_or(true);
        let uid = pod::uid(p).to_string();
        if self.server_away() {
            if let Some(env) = self.checkpoint.service_env(&uid) {
                out.service_env = Ok(env);
                return out;
            }
        }
        out.service_env = match self.services.list(&self.kube).await {
            Ok(l) => {
                let env = services::env_vars(&l, ns, links);
                if self.checkpoint.service_env(&uid).as_ref() != Some(&env) {
                    let (cp, kept) = (self.checkpoint.clone(), env.clone());
                    if let Err(e) = blocking(move || cp.record_service_env(&uid, &kept)).await {
                        tracing::warn!(error = %format!("{e:#}"), "checkpointing service env vars");
                    }
                }
                Ok(env)
            }
            Err(e) if e.unreachable => {
                self.note_unreachable();
                self.checkpoint.service_env(&uid).ok_or(e.message)
            }
            Err(e) => Err(e.message),
        };
        out
    }

    /// What the pod's configMap, secret and projected volumes need.
    pub async fn volume_objects(&self, p: &Pod) -> VolumeObjects {
        let ns = pod::namespace(p);
        let mut out = VolumeObjects::default();
        let mut cms = BTreeSet::new();
        let mut secrets = BTreeSet::new();
        for v in pod::spec(p).volumes.iter().flatten() {
            if let Some(c) = &v.config_map {
                cms.insert(c.name.clone());
            }
            if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
                secrets.insert(s);
            }
            // An inline csi volume's nodePublishSecretRef (the pod's namespace).
            if let Some(r) = v.csi.as_ref().and_then(|c| c.node_publish_secret_ref.as_ref()) {
                secrets.insert(r.name.clone());
            }
            for (i, src) in v.projected.iter().flat_map(|p| p.sources.iter().flatten()).enumerate() {
                if let Some(c) = &src.config_map {
                    cms.insert(c.name.clone());
                }
                if let Some(s) = &src.secret {
                    secrets.insert(s.name.clone());
                }
                if let Some(t) = &src.service_account_token {
                    let got = self.token(p, t).await;
                    out.tokens.insert((v.name.clone(), i), got);
                }
            }
        }
        (out.config_maps, out.secrets) = self.fetch(ns, cms, secrets).await;
        for v in pod::spec(p).volumes.iter().flatten() {
            if let Some((claim, ephemeral)) = claims::claim_name(p, v) {
                let got = self.claim(p, &v.name, &claim, ephemeral).await;
                let csi = got.as_ref().ok().and_then(|b| b.volume.spec.as_ref()?.csi.clone());
                for r in csi
                    .iter()
                    .flat_map(|c| [&c.node_stage_secret_ref, &c.node_publish_secret_ref])
                {
                    let Some(r) = r else { continue };
                    let key = (
                        r.namespace.clone().unwrap_or_default(),
                        r.name.clone().unwrap_or_default(),
                    );
                    if let std::collections::btree_map::Entry::Vacant(e) = out.pv_secrets.entry(key) {
                        let (ns, name) = e.key().clone();
                        e.insert(self.secret(&ns, &name).await);
                    }
                }
                out.claims.insert(v.name.clone(), got);
            }
        }
        out
    }

    /// The claim `name` of pod `p`'s volume `volume` and the PersistentVolume bound to it: as
    /// resolved before for the pod, else from the API server (kept in the checkpoint), else,
    /// while the server cannot be reached, as the checkpoint kept it.
    async fn claim(&self, p: &Pod, volume: &str, name: &str, ephemeral: bool) -> claims::ClaimLookup {
        let uid = pod::uid(p).to_string();
        let key = (uid.clone(), volume.to_string());
        if let Some(b) = self.claims.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(b.clone());
        }
        let kept = || {
            self.checkpoint
                .claim(&uid, volume)
                .map(|(claim, volume)| Arc::new(claims::BoundClaim { claim, volume }))
        };
        if self.server_away() {
            if let Some(b) = kept() {
                return Ok(b);
            }
        }
        let ns = pod::namespace(p);
        let unreachable = |e: &kube::Error| store::unreachable(e);
        let pvcs: kube::Api<PersistentVolumeClaim> = kube::Api::namespaced(self.kube.client(), ns);
        let claim = match pvcs.get_opt(name).await {
            Ok(Some(c)) => c,
            Ok(None) => return Err(format!("persistentvolumeclaim {name:?} not found")),
            Err(e) if unreachable(&e) => {
                self.note_unreachable();
                return kept()
                    .ok_or_else(|| format!("failed to fetch PVC from API server: {}", store::api_message(&e)));
            }
            Err(e) => {
                return Err(format!(
                    "failed to fetch PVC from API server: {}",
                    store::api_message(&e)
                ))
            }
        };
        let pv_name = claims::check_claim(p, ephemeral, &claim)?;
        let pvs: kube::Api<PersistentVolume> = kube::Api::all(self.kube.client());
        let fetch_error = |e: &kube::Error| {
            format!(
                "failed to fetch PV {pv_name} from API server: {}",
                store::api_message(e)
            )
        };
        let pv = match pvs.get_opt(&pv_name).await {
            Ok(Some(v)) => v,
            Ok(None) => {
                return Err(format!(
                    "failed to fetch PV {pv_name} from API server: persistentvolumes {pv_name:?} not found"
                ))
            }
            Err(e) if unreachable(&e) => {
                self.note_unreachable();
                return kept().ok_or_else(|| fetch_error(&e));
            }
            Err(e) => return Err(fetch_error(&e)),
        };
        claims::check_volume(&claim, &pv)?;
        let bound = Arc::new(claims::BoundClaim { claim, volume: pv });
        let (cp, b, v) = (self.checkpoint.clone(), bound.clone(), volume.to_string());
        let recorded = blocking(move || cp.record_claim(&uid, &v, &b.claim, &b.volume)).await;
        if let Err(e) = recorded {
            tracing::warn!(pod = %pod::full_name(p), volume, error = %format!("{e:#}"), "checkpointing a claim");
        }
        tracing::info!(pod = %pod::full_name(p), volume, claim = name, persistent_volume = %pv_name, "claim resolved");
        self.claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, bound.clone());
        Ok(bound)
    }

    /// The named ConfigMaps and Secrets of namespace `ns`, each as found or why not.
    async fn fetch(
        &self,
        ns: &str,
        config_maps: impl IntoIterator<Item = String>,
        secrets: impl IntoIterator<Item = String>,
    ) -> (BTreeMap<String, Lookup<ConfigMap>>, BTreeMap<String, Lookup<Secret>>) {
        let mut cms = BTreeMap::new();
        for n in config_maps {
            let got = self.config_map(ns, &n).await;
            cms.insert(n, got);
        }
        let mut found = BTreeMap::new();
        for n in secrets {
            let got = self.secret(ns, &n).await;
            found.insert(n, got);
        }
        (cms, found)
    }
}

/// The TTL a Node's annotation sets (kubelet's: a non-negative whole number of seconds).
pub fn node_ttl(n: &k8s_openapi::api::core::v1::Node) -> Duration {
    n.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_TTL_ANNOTATION))
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(OBJECT_TTL)
}

/// The ConfigMaps and Secrets a container's env and envFrom name.
pub(crate) fn container_references(c: &Container) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut cms, mut secrets) = (BTreeSet::new(), BTreeSet::new());
    for e in c.env_from.iter().flatten() {
        if let Some(r) = &e.config_map_ref {
            cms.insert(r.name.clone());
        }
        if let Some(r) = &e.secret_ref {
            secrets.insert(r.name.clone());
        }
    }
    for e in c.env.iter().flatten() {
        if let Some(vf) = &e.value_from {
            if let Some(r) = &vf.config_map_key_ref {
                cms.insert(r.name.clone());
            }
            if let Some(r) = &vf.secret_key_ref {
                secrets.insert(r.name.clone());
            }
        }
    }
    (cms, secrets)
}

/// Every ConfigMap and Secret the pod names (kubelet's VisitPodConfigmapNames and
/// VisitPodSecretNames, for what ferrolet runs: volumes, projections, env, envFrom, image pull
/// secrets).
pub fn references(p: &Pod) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut cms, mut secrets) = (BTreeSet::new(), BTreeSet::new());
    let spec = pod::spec(p);
    for s in spec.image_pull_secrets.iter().flatten() {
        secrets.insert(s.name.clone());
    }
    for v in spec.volumes.iter().flatten() {
        if let Some(c) = &v.config_map {
            cms.insert(c.name.clone());
        }
        if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            secrets.insert(s);
        }
        if let Some(r) = v.csi.as_ref().and_then(|c| c.node_publish_secret_ref.as_ref()) {
            secrets.insert(r.name.clone());
        }
        for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &src.config_map {
                cms.insert(c.name.clone());
            }
            if let Some(s) = &src.secret {
                secrets.insert(s.name.clone());
            }
        }
    }
    for c in pod::all_containers(p) {
        let (a, b) = container_references(c);
        cms.extend(a);
        secrets.extend(b);
    }
    cms.retain(|n| !n.is_empty());
    secrets.retain(|n| !n.is_empty());
    (cms, secrets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use http_body_util::BodyExt;

    /// How the mock API server answers: `None` gives no answer at all (a refused connection),
    /// `Some(code)` answers every request with that status.
    type Answer = Option<u16>;

    /// An object manager over a fresh checkpoint holding pod `u1` (namespace `ns`) with Secret
    /// `s` (`pw: kept`) and a token `kept-token`, and an API server that answers as `answer`
    /// says; the paths it was asked for.
    /// What a test works with (the checkpoint's directory goes when it is dropped).
    struct Fixture {
        om: Arc<ObjectManager>,
        cp: Arc<Checkpoint>,
        asked: Arc<Mutex<Vec<String>>>,
        _dir: tempfile::TempDir,
    }

    fn manager(answer: Answer) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        cp.set_pods(&[Arc::new(pod())]).unwrap();
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s", "namespace": "ns", "resourceVersion": "1"},
            "data": {"pw": "a2VwdA=="}
        }))
        .unwrap();
        cp.record_object(&["u1".into()], Object::Secret(&secret)).unwrap();
        cp.record_token("u1", "default||600", "kept-token").unwrap();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = asked.clone();
        let service = tower::service_fn(move |req: axum::http::Request<kube::client::Body>| {
            seen.lock().unwrap().push(req.uri().path().to_string());
            async move {
                let code = answer.ok_or("connection refused")?;
                let _ = req.into_body().collect().await?;
                let reason = match code {
                    403 => "Forbidden",
                    404 => "NotFound",
                    _ => "InternalError",
                };
                let status = serde_json::json!({
                    "kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": format!("the mock says {code}"), "reason": reason, "code": code
                });
                let mut resp =
                    axum::http::Response::new(http_body_util::Full::new(bytes::Bytes::from(status.to_string())));
                *resp.status_mut() = axum::http::StatusCode::from_u16(code)?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(resp)
            }
        });
        let kube = Kube::from_client(kube::Client::new(service, "default"));
        Fixture {
            om: ObjectManager::new(kube, tokio::sync::watch::channel(None).1, cp.clone()),
            cp,
            asked,
            _dir: dir,
        }
    }

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c"}], "volumes": [{"name": "v", "secret": {"secretName": "s"}}]}
        }))
        .unwrap()
    }

    fn projection() -> ServiceAccountTokenProjection {
        serde_json::from_value(serde_json::json!({"path": "token", "expirationSeconds": 600})).unwrap()
    }

    /// Requests for the Secret and the token (not the Node's TTL).
    fn object_requests(asked: &Mutex<Vec<String>>) -> usize {
        asked
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.contains("/secrets/") || p.ends_with("/token"))
            .count()
    }

    #[tokio::test]
    async fn restored_pods_are_served_from_the_checkpoint_without_asking() {
        // Whatever the server would say, it is not asked while the node runs on restored pods.
        let Fixture { om, cp, asked, _dir } = manager(Some(200));
        cp.view().restored(1, "connection refused");
        om.register_pod(&pod());
        let s = om.secret("ns", "s").await.unwrap().expect("the checkpoint's Secret");
        assert_eq!(s.data.as_ref().unwrap()["pw"].0, b"kept");
        assert_eq!(om.token(&pod(), &projection()).await.unwrap(), "kept-token");
        assert_eq!(object_requests(&asked), 0, "asked {:?}", asked.lock().unwrap());
        // Once the server's pods are listed again, it is asked.
        cp.view().fresh();
        let _ = om.secret("ns", "s").await;
        assert_eq!(object_requests(&asked), 1);
    }

    #[tokio::test]
    async fn no_answer_serves_the_checkpoint_and_is_not_asked_again_at_once() {
        let Fixture { om, asked, _dir, .. } = manager(None);
        om.register_pod(&pod());
        let s = om.secret("ns", "s").await.unwrap().expect("the checkpoint's Secret");
        assert_eq!(s.data.as_ref().unwrap()["pw"].0, b"kept");
        assert_eq!(object_requests(&asked), 1);
        // Within UNREACHABLE_HOLD: served without asking.
        assert_eq!(om.token(&pod(), &projection()).await.unwrap(), "kept-token");
        assert!(om.secret("ns", "s").await.unwrap().is_some());
        assert_eq!(object_requests(&asked), 1, "asked {:?}", asked.lock().unwrap());
    }

    #[tokio::test]
    async fn an_answer_is_not_served_from_the_checkpoint() {
        for code in [403, 404] {
            let Fixture { om, asked, _dir, .. } = manager(Some(code));
            om.register_pod(&pod());
            let secret = om.secret("ns", "s").await;
            let token = om.token(&pod(), &projection()).await;
            // A token answered 404 is asked again a few times (the server's pod cache may lag).
            let token_asks = if code == 404 {
                1 + tokens::NOT_FOUND_RETRIES.len()
            } else {
                1
            };
            assert_eq!(object_requests(&asked), 1 + token_asks);
            match code {
                404 => assert!(matches!(secret, Ok(None)), "{secret:?}"),
                _ => assert_eq!(secret.unwrap_err(), "the mock says 403"),
            }
            let err = token.expect_err("a refused token is not the checkpoint's");
            assert!(err.contains(&format!("the mock says {code}")), "{err}");
        }
    }

    #[tokio::test]
    async fn claims_are_served_from_the_checkpoint_only_without_an_answer() {
        let claimed: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c"}], "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-p"}}]}
        }))
        .unwrap();
        let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "data-p", "namespace": "ns", "uid": "c1"},
            "spec": {"volumeName": "pv-1"}, "status": {"phase": "Bound"}
        }))
        .unwrap();
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1"}, "spec": {"local": {"path": "/disk"}, "claimRef": {"uid": "c1"}}
        }))
        .unwrap();
        for answer in [None, Some(503), Some(403), Some(404)] {
            let Fixture { om, cp, asked, _dir } = manager(answer);
            cp.record_claim("u1", "data", &pvc, &pv).unwrap();
            let got = om.volume_objects(&claimed).await.claims.remove("data").unwrap();
            assert!(asked
                .lock()
                .unwrap()
                .iter()
                .any(|p| p.ends_with("/persistentvolumeclaims/data-p")));
            match answer {
                None | Some(503) => {
                    let b = got.expect("the checkpoint's claim");
                    assert_eq!(b.volume_name(), "pv-1");
                    assert_eq!(b.claim_ref(), ("ns".to_string(), "data-p".to_string()));
                }
                Some(403) => assert_eq!(
                    got.unwrap_err(),
                    "failed to fetch PVC from API server: the mock says 403"
                ),
                _ => assert_eq!(got.unwrap_err(), "persistentvolumeclaim \"data-p\" not found"),
            }
        }
    }

    #[tokio::test]
    async fn a_csi_persistent_volumes_secrets_are_fetched_from_their_namespace() {
        let claimed: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c"}], "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-p"}}]}
        }))
        .unwrap();
        let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "data-p", "namespace": "ns", "uid": "c1"},
            "spec": {"volumeName": "pv-1"}, "status": {"phase": "Bound"}
        }))
        .unwrap();
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1"}, "spec": {"claimRef": {"uid": "c1"}, "csi": {"driver": "d", "volumeHandle": "h",
                "nodeStageSecretRef": {"namespace": "storage", "name": "stage"},
                "nodePublishSecretRef": {"namespace": "storage", "name": "publish"}}}
        }))
        .unwrap();
        let Fixture { om, cp, asked, _dir } = manager(Some(404));
        cp.record_claim("u1", "data", &pvc, &pv).unwrap();
        // The claim from the checkpoint (a boot without the server), the secrets asked for.
        cp.view().restored(1, "connection refused");
        let o = om.volume_objects(&claimed).await;
        assert!(o.claims["data"].is_ok());
        let asked = asked.lock().unwrap().clone();
        for name in ["stage", "publish"] {
            assert!(
                asked
                    .iter()
                    .any(|p| p == &format!("/api/v1/namespaces/storage/secrets/{name}")),
                "{asked:?}"
            );
            assert!(matches!(
                o.pv_secrets[&("storage".to_string(), name.to_string())],
                Ok(None)
            ));
        }
    }

    #[test]
    fn ttl_from_the_node_annotation() {
        let node = |ann: serde_json::Value| -> k8s_openapi::api::core::v1::Node {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n", "annotations": ann}})).unwrap()
        };
        assert_eq!(
            node_ttl(&node(serde_json::json!({NODE_TTL_ANNOTATION: "0"}))),
            Duration::ZERO
        );
        assert_eq!(
            node_ttl(&node(serde_json::json!({NODE_TTL_ANNOTATION: "15"}))),
            Duration::from_secs(15)
        );
        assert_eq!(
            node_ttl(&node(serde_json::json!({NODE_TTL_ANNOTATION: "x"}))),
            OBJECT_TTL
        );
        assert_eq!(node_ttl(&node(serde_json::json!({}))), OBJECT_TTL);
    }

    #[test]
    fn references_cover_volumes_projections_env_and_pull_secrets() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {
                "imagePullSecrets": [{"name": "pull"}],
                "volumes": [
                    {"name": "a", "configMap": {"name": "cm-vol"}},
                    {"name": "b", "secret": {"secretName": "sec-vol"}},
                    {"name": "c", "projected": {"sources": [
                        {"configMap": {"name": "kube-root-ca.crt"}},
                        {"secret": {"name": "sec-proj"}},
                        {"serviceAccountToken": {"path": "token"}}
                    ]}}
                ],
                "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "sec-init"}}]}],
                "containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "cm-from"}}],
                    "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm-key", "key": "k"}}},
                            {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "sec-key", "key": "k"}}}]}]
            }
        }))
        .unwrap();
        let (cms, secrets) = references(&p);
        assert_eq!(
            cms.into_iter().collect::<Vec<_>>(),
            ["cm-from", "cm-key", "cm-vol", "kube-root-ca.crt"]
        );
        assert_eq!(
            secrets.into_iter().collect::<Vec<_>>(),
            ["pull", "sec-init", "sec-key", "sec-proj", "sec-vol"]
        );
    }
}
