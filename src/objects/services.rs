//! Service environment variables (kubelet's getServiceEnvVarMap and envvars.FromServices): the
//! Docker-link style variables of every Service with a cluster IP in the pod's namespace (when
//! `enableServiceLinks`), and always those of the `kubernetes` Service in `default`. The node
//! watches the Services (kubelet's service lister: one list, then a watch), so a pod's start
//! asks the API server nothing; until the first list has come in, there are no variables to
//! give and the container waits, as under kubelet.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use tokio::sync::watch;

use super::store::{unreachable, FetchError};
use crate::kubeclient::Kube;

const MASTER_NAMESPACE: &str = "default";
const MASTER_SERVICE: &str = "kubernetes";

/// kubelet's words when the Services have not been listed yet.
const NOT_SYNCED: &str = "services have not yet been read at least once, cannot construct envvars";

/// How long a start waits for the first list while nothing has gone wrong yet (the agent
/// has just started).
const FIRST_LIST_WAIT: Duration = Duration::from_secs(5);

/// Where the watch of the Services stands.
#[derive(Clone, Debug, PartialEq)]
enum Listing {
    Starting,
    /// The first list is in: the store answers from now on, the API server away or not.
    Listed,
    /// No list yet, and the last try failed; `unreachable`: no answer (not a refusal).
    Failing {
        unreachable: bool,
    },
}

struct Watched {
    store: Store<Service>,
    sync: watch::Receiver<Listing>,
}

#[derive(Default)]
pub struct ServiceCache {
    watched: OnceLock<Watched>,
}

impl ServiceCache {
    pub fn new() -> ServiceCache {
        ServiceCache::default()
    }

    /// Start the watch now (the agent joining its cluster, as kubelet starts its informer),
    /// not at the first pod's start.
    pub fn start(&self, kube: &Kube) {
        self.watched.get_or_init(|| start(kube));
    }

    /// Every Service in the cluster, from the watch (started here if it was not yet).
    pub async fn list(&self, kube: &Kube) -> Result<Vec<Arc<Service>>, FetchError> {
        let w = self.watched.get_or_init(|| start(kube));
        let mut sync = w.sync.clone();
        let waited = tokio::time::timeout(FIRST_LIST_WAIT, sync.wait_for(|s| *s != Listing::Starting)).await;
        match waited.ok().and_then(|r| r.ok()).map(|s| s.clone()) {
            Some(Listing::Listed) => Ok(w.store.state()),
            Some(Listing::Failing { unreachable }) => Err(FetchError {
                message: NOT_SYNCED.to_string(),
                unreachable,
            }),
            Some(Listing::Starting) | None => Err(FetchError {
                message: NOT_SYNCED.to_string(),
                unreachable: true,
            }),
        }
    }
}

/// The watch of every Service into a store, on a task of its own for the agent's life.
fn start(kube: &Kube) -> Watched {
    let (store, writer) = reflector::store();
    let (tx, sync) = watch::channel(Listing::Starting);
    let api: kube::Api<Service> = kube::Api::all(kube.client());
    let events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut failing = false;
        while let Some(ev) = events.next().await {
            match ev {
                Ok(Event::InitDone) => {
                    if failing {
                        tracing::info!("watching services again");
                        failing = false;
                    }
                    tx.send_if_modified(|s| {
                        let first = *s != Listing::Listed;
                        *s = Listing::Listed;
                        first
                    });
                }
                Ok(_) => {}
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "watching services; retrying");
                        failing = true;
                    }
                    let unreachable = match &e {
                        watcher::Error::InitialListFailed(k)
                        | watcher::Error::WatchStartFailed(k)
                        | watcher::Error::WatchFailed(k) => unreachable(k),
                        watcher::Error::WatchError(s) => s.code >= 500,
                        _ => true,
                    };
                    tx.send_if_modified(|s| {
                        if *s == Listing::Listed {
                            return false;
                        }
                        *s = Listing::Failing { unreachable };
                        true
                    });
                }
            }
        }
    });
    Watched { store, sync }
}

fn cluster_ip(s: &Service) -> Option<&str> {
    s.spec
        .as_ref()
        .and_then(|sp| sp.cluster_ip.as_deref())
        .filter(|ip| !ip.is_empty() && *ip != "None")
}

/// The variables a pod in `ns` gets from `services`, sorted by service name (kubelet's order
/// within a service; its map makes the order across services arbitrary).
pub fn env_vars(services: &[Arc<Service>], ns: &str, enable_service_links: bool) -> Vec<(String, String)> {
    let mut picked: std::collections::BTreeMap<&str, &Service> = Default::default();
    for s in services {
        if cluster_ip(s).is_none() {
            continue;
        }
        let name = s.metadata.name.as_deref().unwrap_or("");
        let sns = s.metadata.namespace.as_deref().unwrap_or("");
        if sns == MASTER_NAMESPACE && name == MASTER_SERVICE {
            picked.entry(name).or_insert(s);
        } else if sns == ns && enable_service_links {
            picked.insert(name, s);
        }
    }
    let mut out = Vec::new();
    for (name, s) in picked {
        let (Some(ip), Some(ports)) = (cluster_ip(s), s.spec.as_ref().and_then(|sp| sp.ports.as_ref())) else {
            continue;
        };
        let Some(first) = ports.first() else { continue };
        let prefix = var_name(name);
        out.push((format!("{prefix}_SERVICE_HOST"), ip.to_string()));
        let port_var = format!("{prefix}_SERVICE_PORT");
        out.push((port_var.clone(), first.port.to_string()));
        for p in ports {
            if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((format!("{port_var}_{}", var_name(n)), p.port.to_string()));
            }
        }
        for (i, p) in ports.iter().enumerate() {
            let proto = p.protocol.as_deref().filter(|p| !p.is_empty()).unwrap_or("TCP");
            let lower = proto.to_lowercase();
            let host_port = if ip.contains(':') {
                format!("[{ip}]:{}", p.port)
            } else {
                format!("{ip}:{}", p.port)
            };
            if i == 0 {
                out.push((format!("{prefix}_PORT"), format!("{lower}://{host_port}")));
            }
            let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
            out.push((pp.clone(), format!("{lower}://{host_port}")));
            out.push((format!("{pp}_PROTO"), lower.clone()));
            out.push((format!("{pp}_PORT"), p.port.to_string()));
            out.push((format!("{pp}_ADDR"), ip.to_string()));
        }
    }
    out
}

fn var_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> Arc<Service> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": ns},
                "spec": {"clusterIP": ip, "ports": ports}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn docker_link_variables() {
        let services = vec![
            svc(
                "default",
                "kubernetes",
                "10.96.0.1",
                serde_json::json!([{"name": "https", "port": 443}]),
            ),
            svc(
                "web",
                "my-db",
                "10.96.0.9",
                serde_json::json!([
                    {"port": 5432},
                    {"name": "metrics-http", "port": 9187, "protocol": "UDP"}
                ]),
            ),
            svc("web", "headless", "None", serde_json::json!([{"port": 80}])),
            svc("other", "elsewhere", "10.96.0.7", serde_json::json!([{"port": 80}])),
        ];
        let env = env_vars(&services, "web", true);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT"), Some("tcp://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_ADDR"), Some("10.96.0.1"));
        assert_eq!(get("MY_DB_SERVICE_HOST"), Some("10.96.0.9"));
        assert_eq!(get("MY_DB_SERVICE_PORT"), Some("5432"));
        assert_eq!(get("MY_DB_SERVICE_PORT_METRICS_HTTP"), Some("9187"));
        assert_eq!(get("MY_DB_PORT"), Some("tcp://10.96.0.9:5432"));
        assert_eq!(get("MY_DB_PORT_9187_UDP"), Some("udp://10.96.0.9:9187"));
        assert_eq!(get("MY_DB_PORT_9187_UDP_PROTO"), Some("udp"));
        assert_eq!(get("MY_DB_PORT_5432_TCP_PORT"), Some("5432"));
        assert_eq!(get("HEADLESS_SERVICE_HOST"), None);
        assert_eq!(get("ELSEWHERE_SERVICE_HOST"), None);
        // Without service links only the master service's variables.
        let env = env_vars(&services, "web", false);
        assert!(env.iter().all(|(k, _)| k.starts_with("KUBERNETES_")), "{env:?}");
        assert_eq!(env.len(), 8);
    }
}
