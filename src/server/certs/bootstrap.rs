//! The serving certificate from the cluster (kubelet's serverTLSBootstrap, client-go's
//! certificate manager for the server): a certificates.k8s.io/v1 CertificateSigningRequest for
//! the `kubernetes.io/kubelet-serving` signer, `system:node:<name>` in `system:nodes`, naming
//! the node's hostname and addresses, sent with the node's own credential. The issued
//! certificate is stored as kubelet stores it (`<root>/pki/kubelet-server-<time>.pem` and the
//! `kubelet-server-current.pem` link, through the client certificate's store), served from the
//! next handshake on, and renewed by the same manager as the client certificate
//! (kubeclient::rotation::CertificateManager), at a jittered 70-90% of its lifetime. Until
//! the first one is issued handshakes fail, as kubelet's do.
//!
//! Tests shorten the wait with the client rotation's knob (`FERROLET_TEST_ROTATE_CERT_AFTER`).
//!
//! kube-controller-manager does not approve these requests by itself: a cluster operator (or
//! an approver controller) must, as with kubelet.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use tracing::{info, warn};

use crate::config::Config;
use crate::kubeclient::certstore::{CertStore, Credential};
use crate::kubeclient::{csr, rotation, Kube};
use crate::server::tls::ServingCert;
use crate::tasks::blocking;

/// The store's file name prefix (kubelet's).
pub const PAIR: &str = "kubelet-server";
/// How long one request waits for its certificate (client-go's certificateWaitTimeout).
const WAIT_LIMIT: Duration = Duration::from_secs(15 * 60);

/// The serving certificate's renewal.
struct Serving {
    kube: Kube,
    store: CertStore,
    node: String,
    dns: Vec<String>,
    ips: Vec<IpAddr>,
    cert: Arc<ServingCert>,
}

/// Serve the stored certificate if it is current, and keep one current in the background.
pub async fn start(cfg: &Config, ips: Vec<IpAddr>, kube: Kube, cert: Arc<ServingCert>) -> Result<()> {
    let store = CertStore::with_pair(&cfg.root_dir, PAIR);
    let current = {
        let s = store.clone();
        blocking(move || s.current()).await.unwrap_or_else(|e| {
            warn!("the stored serving certificate cannot be read ({e:#}); requesting a new one");
            None
        })
    };
    let current = current.filter(|c| c.valid_at(SystemTime::now()));
    if let Some(c) = &current {
        cert.set(&c.cert_pem, &c.key_pem)
            .with_context(|| format!("{}", store.current_path().display()))?;
        info!(cert = %store.current_path().display(), "serving the stored cluster-signed certificate");
    } else {
        info!("requesting a serving certificate from the cluster (signer kubernetes.io/kubelet-serving)");
    }
    let m = Serving {
        kube,
        store,
        node: cfg.node_name.clone(),
        dns: vec![cfg.node_name.clone()],
        ips,
        cert,
    };
    rotation::CertificateManager::spawn(m, current);
    Ok(())
}

impl rotation::Renewal for Serving {
    const WHAT: &'static str = "serving certificate";

    /// One request: key, CSR, wait, store, serve.
    async fn renew(&self, _current: Option<&Credential>) -> Result<Credential> {
        let key = csr::new_key()?;
        let request = csr::node_serving_request(&self.node, &key, &self.dns, &self.ips)?;
        let pem = csr::request_certificate_for(
            self.kube.client(),
            None,
            &request,
            csr::SERVING_SIGNER,
            &csr::SERVING_USAGES,
            WAIT_LIMIT,
        )
        .await?;
        let cred = Credential::new(pem, key.serialize_pem().into_bytes()).context("the issued certificate")?;
        let (store, c) = (self.store.clone(), cred.clone());
        blocking(move || store.update(&c)).await?;
        self.cert
            .set(&cred.cert_pem, &cred.key_pem)
            .context("the issued certificate")?;
        Ok(cred)
    }
}
