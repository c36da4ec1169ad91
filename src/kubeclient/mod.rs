//! The node's connection to the API server (kubelet's kubeClient and its certificate manager):
//! a kube-rs client built from the node's kubeconfig. Every part that talks to the API server
//! takes a [`Kube`] and asks it for the current client on each call, so a rotated credential
//! reaches every caller without restarting anything.

mod tls;

use std::path::Path;

use anyhow::{Context, Result};
use tokio::sync::watch;

/// A handle on the node's API client; cheap to clone.
#[derive(Clone)]
pub struct Kube {
    client: watch::Receiver<kube::Client>,
    /// Keeps the channel open while only receivers are held.
    _tx: std::sync::Arc<watch::Sender<kube::Client>>,
}

impl Kube {
    /// A client from the kubeconfig at `path` (its current context).
    pub async fn from_kubeconfig(path: &Path) -> Result<Kube> {
        let kc = kube::config::Kubeconfig::read_from(path)
            .with_context(|| format!("reading kubeconfig {}", path.display()))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .with_context(|| format!("kubeconfig {}", path.display()))?;
        let client = tls::client(config).context("building the API client")?;
        let (tx, rx) = watch::channel(client);
        Ok(Kube {
            client: rx,
            _tx: std::sync::Arc::new(tx),
        })
    }

    /// The current client.
    pub fn client(&self) -> kube::Client {
        self.client.borrow().clone()
    }
}
