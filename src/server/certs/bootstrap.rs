//! The serving certificate from the cluster (kubelet's serverTLSBootstrap, client-go's
//! certificate manager for the server): a certificates.k8s.io/v1 CertificateSigningRequest for
//! the `kubernetes.io/kubelet-serving` signer, `system:node:<name>` in `system:nodes`, naming
//! the node's hostname and addresses, sent with the node's own credential. The issued
//! certificate is stored as kubelet stores it (`<root>/pki/kubelet-server-<time>.pem` and the
//! `kubelet-server-current.pem` link, through the client certificate's store), served from the
//! next handshake on, and renewed at the same jittered 70-90% of its lifetime as the client
//! certificate. Until the first one is issued handshakes fail, as kubelet's do.
//!
//! Tests shorten the wait with the client rotation's knob (`FERROLET_TEST_ROTATE_CERT_AFTER`).
//!
//! kube-controller-manager does not approve these requests by itself: a cluster operator (or
//! an approver controller) must, as with kubelet.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use futures::FutureExt;
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
const BACKOFF_INITIAL: Duration = Duration::from_secs(2);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

struct Manager {
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
    let m = Manager {
        kube,
        store,
        node: cfg.node_name.clone(),
        dns: vec![cfg.node_name.clone()],
        ips,
        cert,
    };
    tokio::spawn(m.run(current));
    Ok(())
}

impl Manager {
    async fn run(self, mut current: Option<Credential>) {
        loop {
            if let Some(c) = &current {
                let at = rotation::rotation_time(c.not_before, c.not_after);
                info!(
                    expires = %chrono::DateTime::<chrono::Utc>::from(c.not_after).to_rfc3339(),
                    rotation = %chrono::DateTime::<chrono::Utc>::from(at).to_rfc3339(),
                    "waiting to rotate the serving certificate"
                );
                rotation::sleep_until_wall(at, || false).await;
            }
            let mut backoff = BACKOFF_INITIAL;
            let mut last_error: Option<String> = None;
            loop {
                let attempt = std::panic::AssertUnwindSafe(self.renew()).catch_unwind().await;
                let attempt =
                    attempt.unwrap_or_else(|p| Err(anyhow::anyhow!("panicked: {}", crate::tasks::panic_message(p))));
                match attempt {
                    Ok(cred) => {
                        info!(
                            expires = %chrono::DateTime::<chrono::Utc>::from(cred.not_after).to_rfc3339(),
                            "serving certificate issued"
                        );
                        current = Some(cred);
                        break;
                    }
                    Err(e) => {
                        let msg = format!("{e:#}");
                        if last_error.as_deref() != Some(msg.as_str()) {
                            warn!("requesting the serving certificate failed: {msg}; retrying with back-off");
                            last_error = Some(msg);
                        }
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    /// One request: key, CSR, wait, store, serve.
    async fn renew(&self) -> Result<Credential> {
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
