//! The TLS side of the node's API client: the cluster's CA as the only trust root and the
//! node's client certificate presented as it is. The kubeconfig parsing is kube-rs's; the
//! connection is built here because kube-rs hands the client certificate to rustls's
//! `with_client_auth_cert`, which refuses X.509 v1 certificates (what `openssl x509 -req`
//! signs without extensions) although the API server (Go) accepts them, as kubelet does.

use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use base64::Engine;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;
use tower::ServiceBuilder;

/// How long a connection to the API server may take to open.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A kube-rs client for `config`, presenting its client certificate (if any) without checks
/// beyond the server's, every request under `limit` when there is one.
pub fn client(config: kube::Config, limit: Option<&super::ratelimit::RateLimitLayer>) -> Result<kube::Client> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?;
    let mut roots = rustls::RootCertStore::empty();
    for der in config.root_cert.iter().flatten() {
        roots
            .add(CertificateDer::from(der.clone()))
            .context("the cluster's certificate authority")?;
    }
    let builder = builder.with_root_certificates(roots);
    let tls = match identity(&config.auth_info)? {
        Some((chain, key)) => {
            let signer = provider.key_provider.load_private_key(key).context("the client key")?;
            builder.with_client_cert_resolver(Arc::new(Identity(Arc::new(CertifiedKey::new(chain, signer)))))
        }
        None => builder.with_no_client_auth(),
    };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    let http_client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .option_layer(limit.cloned())
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().context("the kubeconfig's credentials")?)
        .layer(config.extra_headers_layer().context("the kubeconfig's headers")?)
        .layer(super::metrics::RequestMetricsLayer)
        .map_err(tower::BoxError::from)
        .service(http_client);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// The client certificate chain and key of a kubeconfig user, from data or files.
fn identity(a: &kube::config::AuthInfo) -> Result<Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>> {
    let cert = pem_of(
        a.client_certificate_data.as_deref(),
        a.client_certificate.as_deref(),
        "client-certificate",
    )?;
    let key_data = a
        .client_key_data
        .as_ref()
        .map(|s| secrecy::ExposeSecret::expose_secret(s).to_string());
    let key = pem_of(key_data.as_deref(), a.client_key.as_deref(), "client-key")?;
    let (cert, key) = match (cert, key) {
        (None, None) => return Ok(None),
        (Some(c), Some(k)) => (c, k),
        _ => {
            return Err(anyhow!(
                "the kubeconfig user has a client certificate without a key, or a key without one"
            ))
        }
    };
    let chain = CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<Vec<_>, _>>()
        .context("client-certificate: not PEM certificates")?;
    if chain.is_empty() {
        return Err(anyhow!("client-certificate: no certificate in it"));
    }
    let key = PrivateKeyDer::from_pem_slice(&key).context("client-key: no PEM private key in it")?;
    Ok(Some((chain, key)))
}

/// PEM text from a kubeconfig's base64 `*-data` field or its file.
fn pem_of(data: Option<&str>, file: Option<&str>, field: &str) -> Result<Option<Vec<u8>>> {
    if let Some(d) = data {
        return base64::engine::general_purpose::STANDARD
            .decode(d.trim())
            .map(Some)
            .with_context(|| format!("{field}-data: not base64"));
    }
    match file {
        Some(f) => std::fs::read(f)
            .map(Some)
            .with_context(|| format!("{field}: reading {f}")),
        None => Ok(None),
    }
}

/// Always the one certificate the node has.
#[derive(Debug)]
struct Identity(Arc<CertifiedKey>);

impl ResolvesClientCert for Identity {
    fn resolve(&self, _root_hint_subjects: &[&[u8]], _sigschemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}
