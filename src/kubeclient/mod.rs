//! The node's connection to the API server (kubelet's kubeClient and its certificate manager):
//! a kube-rs client built from the node's kubeconfig. Every part that talks to the API server
//! takes a [`Kube`] and asks it for the current client on each call, so a rotated credential
//! reaches every caller without restarting anything.
//!
//! [`Kube::connect`] does what kubelet does at start in cluster mode: the TLS bootstrap when the
//! kubeconfig is missing or expired ([`bootstrap`]), the certificate rotation in the background
//! ([`rotation`]), and the kubeAPIQPS/kubeAPIBurst rate limit on every client ([`ratelimit`]).
//!
//! As in kubelet, events go through a client of their own ([`Kube::events_client`]) that the
//! kubeAPIQPS limit does not hold: the event writer keeps eventRecordQPS/eventBurst itself, and
//! a burst of pods' events never delays their statuses, tokens or objects.

pub mod bootstrap;
pub mod certstore;
pub mod csr;
pub mod kubeconfig;
mod metrics;
pub mod ratelimit;
pub mod rotation;

mod tls;

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::{Context, Result};
use tokio::sync::watch;
use tracing::info;

use crate::config::Config;
use crate::tasks::blocking;
use certstore::CertStore;
use ratelimit::RateLimitLayer;

/// The node's clients on one credential: the one every part uses, under kubeAPIQPS, and the
/// events' one (kubelet's eventClient), whose rate the event writer keeps.
#[derive(Clone)]
pub struct Clients {
    pub api: kube::Client,
    pub events: kube::Client,
}

/// A handle on the node's API clients; cheap to clone.
#[derive(Clone)]
pub struct Kube {
    client: watch::Receiver<Clients>,
    /// Keeps the channel open while only receivers are held; the rotation holds it weakly.
    tx: Arc<watch::Sender<Clients>>,
}

impl Kube {
    fn new(clients: Clients) -> Kube {
        let (tx, rx) = watch::channel(clients);
        Kube {
            client: rx,
            tx: Arc::new(tx),
        }
    }

    /// The node's client as kubelet sets it up in cluster mode: the kubeconfig at
    /// `--kubeconfig` if its client certificate is current, else a certificate bootstrapped
    /// with `--bootstrap-kubeconfig` (and the kubeconfig written); rotated before it expires
    /// when `rotateCertificates` is on; every request under the kubeAPIQPS/kubeAPIBurst limit.
    pub async fn connect(cfg: &Config) -> Result<Kube> {
        let path = cfg
            .cluster
            .kubeconfig
            .clone()
            .context("cluster mode needs --kubeconfig")?;
        let limit = RateLimitLayer::new(f64::from(cfg.cluster.kube_api_qps), cfg.cluster.kube_api_burst);
        let store = CertStore::new(&cfg.root_dir);
        bootstrap::ensure_kubeconfig(
            &path,
            cfg.cluster.bootstrap_kubeconfig.as_deref(),
            &store,
            &cfg.node_name,
            &limit,
        )
        .await?;

        let (p, s) = (path.clone(), store.clone());
        let rotate = cfg.cluster.rotate_certificates;
        let (kc, cred) = blocking(move || {
            let kc = kubeconfig::read(&p)?;
            let mut cred = kubeconfig::client_credential(&kc).context("client certificate")?;
            // the rotation keeps its certificates in the store: one there that is current and
            // lasts longer than the kubeconfig's is the newer credential (a kubeconfig carrying
            // its certificate inline is never rewritten)
            if rotate {
                if let (Some(kc_cred), Ok(Some(stored))) = (&cred, s.current()) {
                    if stored.valid_at(SystemTime::now()) && stored.not_after > kc_cred.not_after {
                        cred = Some(stored);
                    }
                }
            }
            Ok((kc, cred))
        })
        .await
        .with_context(|| format!("--kubeconfig {}", path.display()))?;

        let config = kubeconfig::client_config(kc.clone(), cred.as_ref())
            .await
            .with_context(|| format!("--kubeconfig {}", path.display()))?;
        let kube = Kube::new(build_clients(config, &limit)?);
        match (rotate, cred) {
            (true, Some(current)) => rotation::CertificateManager::spawn(
                rotation::Rotation {
                    tx: Arc::downgrade(&kube.tx),
                    kubeconfig: kc,
                    store,
                    node: cfg.node_name.clone(),
                    limit,
                    bootstrap: cfg.cluster.bootstrap_kubeconfig.clone(),
                },
                Some(current),
            ),
            (true, None) => info!("the kubeconfig authenticates without a client certificate; nothing to rotate"),
            (false, _) => {}
        }
        Ok(kube)
    }

    /// A client from the kubeconfig at `path` (its current context), under kubelet's default
    /// rate limit; no bootstrap, no rotation.
    pub async fn from_kubeconfig(path: &Path) -> Result<Kube> {
        let kc = kubeconfig::read(path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .with_context(|| format!("kubeconfig {}", path.display()))?;
        let defaults = crate::config::ClusterConfig::default();
        let limit = RateLimitLayer::new(f64::from(defaults.kube_api_qps), defaults.kube_api_burst);
        Ok(Kube::new(build_clients(config, &limit)?))
    }

    /// A handle on `client` as it is (tests with a mock API server).
    #[cfg(test)]
    pub(crate) fn from_client(client: kube::Client) -> Kube {
        Kube::new(Clients {
            api: client.clone(),
            events: client,
        })
    }

    /// The current client.
    pub fn client(&self) -> kube::Client {
        self.client.borrow().api.clone()
    }

    /// The current client for events: not held by kubeAPIQPS (the caller keeps its own rate).
    pub fn events_client(&self) -> kube::Client {
        self.client.borrow().events.clone()
    }
}

/// A client for `config` with the rate limit in its stack.
fn build_client(config: kube::Config, limit: &RateLimitLayer) -> Result<kube::Client> {
    tls::client(config, Some(limit)).context("building the API client")
}

/// The node's clients for `config`: the API client under `limit`, the events' client without.
fn build_clients(config: kube::Config, limit: &RateLimitLayer) -> Result<Clients> {
    Ok(Clients {
        api: build_client(config.clone(), limit)?,
        events: tls::client(config, None).context("building the events' API client")?,
    })
}
