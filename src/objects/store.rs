//! ConfigMaps and Secrets as the node reads them (kubelet's cache-based manager, the `Cache`
//! change-detection strategy): an object fetched with the node's identity is kept for a TTL
//! (the caller's: the Node's `node.alpha.kubernetes.io/ttl`, 0 in small clusters);
//! a pod registered anew (added, or changed as the API server sent it) marks its objects stale
//! so its first use fetches them fresh; objects no registered pod references are dropped. A
//! missing object is never cached, so it is seen as soon as it is created.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, Shared};
use futures::FutureExt;
use k8s_openapi::NamespaceResourceScope;
use serde::de::DeserializeOwned;

use crate::kubeclient::Kube;

/// What a lookup found: the object, `None` when it does not exist, or why it could not be read
/// (the API server's message).
pub type Lookup<K> = Result<Option<Arc<K>>, String>;

/// Why an object could not be read from the API server.
#[derive(Debug, Clone)]
pub struct FetchError {
    /// The API server's message, else the error chain.
    pub message: String,
    /// The API server gave no answer of its own (not reached, or it answered 5xx): what the
    /// node last saw of the object still stands.
    pub unreachable: bool,
}

impl FetchError {
    /// The API server's answer, or that it gave none.
    pub fn of(e: &kube::Error) -> FetchError {
        FetchError {
            message: api_message(e),
            unreachable: unreachable(e),
        }
    }
}

/// `(namespace, name)`.
pub type ObjectKey = (String, String);

struct Entry<K> {
    object: Arc<K>,
    fetched: Instant,
}

/// A fetch of one object from the API server, shared by every caller that asks meanwhile.
type Fetch<K> = Shared<BoxFuture<'static, Result<Option<Arc<K>>, FetchError>>>;

/// The cache of one kind of object.
pub struct Store<K> {
    entries: Mutex<HashMap<ObjectKey, Entry<K>>>,
    /// Fetches in flight: a caller that finds one waits for its answer instead of asking again
    /// (a burst of pods all reading `kube-root-ca.crt` costs one request at a time, not one each).
    /// The answer is at most a round trip older than the call, fresher than the watch cache
    /// kubelet's default strategy reads from.
    fetching: Mutex<HashMap<ObjectKey, Fetch<K>>>,
    /// Pod UID -> (the pod's resourceVersion when registered, the objects it references).
    pods: Mutex<HashMap<String, (String, BTreeSet<ObjectKey>)>>,
}

impl<K> Default for Store<K> {
    fn default() -> Self {
        Store {
            entries: Mutex::new(HashMap::new()),
            fetching: Mutex::new(HashMap::new()),
            pods: Mutex::new(HashMap::new()),
        }
    }
}

impl<K> Store<K>
where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    /// Record which objects the pod (at `version`) references. A new version of the pod makes
    /// them stale (kubelet's RegisterPod invalidates on every pod update); references no pod
    /// holds any longer are forgotten.
    pub fn register(&self, uid: &str, version: &str, refs: BTreeSet<ObjectKey>) {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let stale = pods.get(uid).is_none_or(|(v, _)| v != version);
        if !stale && pods.get(uid).is_some_and(|(_, r)| *r == refs) {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if stale {
            for k in &refs {
                entries.remove(k);
            }
        }
        pods.insert(uid.to_string(), (version.to_string(), refs));
        Self::drop_unreferenced(&pods, &mut entries);
    }

    /// The pod is gone from the node.
    pub fn unregister(&self, uid: &str) {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        if pods.remove(uid).is_some() {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            Self::drop_unreferenced(&pods, &mut entries);
        }
    }

    fn drop_unreferenced(
        pods: &HashMap<String, (String, BTreeSet<ObjectKey>)>,
        entries: &mut HashMap<ObjectKey, Entry<K>>,
    ) {
        entries.retain(|k, _| pods.values().any(|(_, refs)| refs.contains(k)));
    }

    /// The pods registered as referencing `key`.
    pub fn pods_referencing(&self, key: &ObjectKey) -> Vec<String> {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        pods.iter()
            .filter(|(_, (_, refs))| refs.contains(key))
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// The object, from the cache while younger than `ttl`, else from the API server.
    pub async fn get(&self, kube: &Kube, ns: &str, name: &str, ttl: Duration) -> Result<Option<Arc<K>>, FetchError> {
        let key = (ns.to_string(), name.to_string());
        {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = entries.get(&key).filter(|e| e.fetched.elapsed() < ttl) {
                return Ok(Some(e.object.clone()));
            }
        }
        let fetch = {
            let mut fetching = self.fetching.lock().unwrap_or_else(|e| e.into_inner());
            fetching
                .entry(key.clone())
                .or_insert_with(|| {
                    let api: kube::Api<K> = kube::Api::namespaced(kube.client(), ns);
                    tracing::debug!(kind = K::kind(&()).as_ref(), namespace = ns, name, "fetching");
                    let name = name.to_string();
                    async move {
                        api.get_opt(&name)
                            .await
                            .map(|o| o.map(Arc::new))
                            .map_err(|e| FetchError::of(&e))
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        let got = fetch.clone().await;
        {
            let mut fetching = self.fetching.lock().unwrap_or_else(|e| e.into_inner());
            if fetching.get(&key).is_some_and(|f| f.ptr_eq(&fetch)) {
                fetching.remove(&key);
            }
        }
        match got {
            Ok(Some(o)) => {
                let referenced = {
                    let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
                    pods.values().any(|(_, refs)| refs.contains(&key))
                };
                if referenced {
                    let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
                    entries.insert(
                        key,
                        Entry {
                            object: o.clone(),
                            fetched: Instant::now(),
                        },
                    );
                }
                Ok(Some(o))
            }
            Ok(None) => {
                self.entries.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// The API server was not reached, or failed itself (5xx): no answer about the object.
pub fn unreachable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500,
        _ => true,
    }
}

/// The API server's own message for an API error (what kubelet shows), else the error chain.
pub fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        e => ferrolet_fsutil::chain(e).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn key(n: &str) -> ObjectKey {
        ("ns".into(), n.into())
    }

    fn seed(s: &Store<ConfigMap>, n: &str) {
        s.entries.lock().unwrap().insert(
            key(n),
            Entry {
                object: Arc::new(ConfigMap::default()),
                fetched: Instant::now(),
            },
        );
    }

    /// A store's fetches against an API server that answers each GET of ConfigMap `ns/a`
    /// after 50 ms; the number of requests it had.
    fn slow_server() -> (Kube, Arc<std::sync::atomic::AtomicUsize>) {
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = asked.clone();
        let service = tower::service_fn(move |_req: axum::http::Request<kube::client::Body>| {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "a", "namespace": "ns"}, "data": {"k": "v"}});
                Ok::<_, std::convert::Infallible>(axum::http::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from(cm.to_string()),
                )))
            }
        });
        (Kube::from_client(kube::Client::new(service, "default")), asked)
    }

    #[tokio::test]
    async fn callers_at_once_share_one_fetch_and_a_later_one_fetches_anew() {
        let (kube, asked) = slow_server();
        let s: Store<ConfigMap> = Store::default();
        s.register("u1", "1", [key("a")].into());
        let gets = (0..5).map(|_| s.get(&kube, "ns", "a", Duration::ZERO));
        for got in futures::future::join_all(gets).await {
            assert_eq!(got.unwrap().unwrap().data.as_ref().unwrap()["k"], "v");
        }
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The fetch is over: with a TTL of 0 the next call asks again.
        s.get(&kube, "ns", "a", Duration::ZERO).await.unwrap().unwrap();
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert!(s.fetching.lock().unwrap().is_empty());
    }

    #[test]
    fn registration_invalidates_on_new_pod_versions_and_forgets_unreferenced() {
        let s: Store<ConfigMap> = Store::default();
        s.register("u1", "1", [key("a"), key("b")].into());
        seed(&s, "a");
        seed(&s, "b");
        // The same version again (a resync) keeps what was fetched.
        s.register("u1", "1", [key("a"), key("b")].into());
        assert_eq!(s.entries.lock().unwrap().len(), 2);
        // A new version of the pod fetches its objects anew.
        s.register("u1", "2", [key("a")].into());
        assert!(s.entries.lock().unwrap().is_empty());
        seed(&s, "a");
        s.register("u2", "7", [key("a")].into());
        assert_eq!(s.entries.lock().unwrap().len(), 0, "u2 is new: its objects are stale");
        seed(&s, "a");
        s.unregister("u1");
        assert_eq!(s.entries.lock().unwrap().len(), 1, "u2 still references a");
        s.unregister("u2");
        assert!(s.entries.lock().unwrap().is_empty());
    }
}
