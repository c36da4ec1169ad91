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
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
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
        .https_or_http();
    // tls-server-name: the name the server's certificate is checked for, instead of the
    // server URL's host (client-go's TLSClientConfig.ServerName).
    let https = match &config.tls_server_name {
        Some(name) => {
            let name = ServerName::try_from(name.clone()).with_context(|| format!("tls-server-name {name:?}"))?;
            https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => https,
    };
    let https = https.enable_http1().wrap_connector(http);
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// `openssl s_server -www` on a free loopback port, with a certificate (signed by a CA of
    /// its own) that names only `apiserver.test`: the CA's PEM, the port, the server.
    fn server(dir: &Path) -> (String, u16, Child) {
        let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(rcgen::DnType::CommonName, "test-ca");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["apiserver.test".to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        std::fs::write(dir.join("srv.crt"), leaf.pem()).unwrap();
        std::fs::write(dir.join("srv.key"), key.serialize_pem()).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("openssl")
            .current_dir(dir)
            .args([
                "s_server", "-quiet", "-www", "-cert", "srv.crt", "-key", "srv.key", "-accept",
            ])
            .arg(format!("127.0.0.1:{port}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "s_server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        (ca_pem, port, child)
    }

    /// A GET of / through the node's client for a kubeconfig naming the server by address.
    async fn get(ca: &str, port: u16, server_name: Option<&str>) -> Result<String, String> {
        use base64::Engine;
        let mut cluster = serde_json::json!({
            "server": format!("https://127.0.0.1:{port}"),
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca),
        });
        if let Some(n) = server_name {
            cluster["tls-server-name"] = n.into();
        }
        let kc = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        });
        let kc: kube::config::Kubeconfig = serde_json::from_value(kc).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
        let client = super::client(config, None).map_err(|e| format!("{e:#}"))?;
        let req = axum::http::Request::get("/").body(Vec::new()).unwrap();
        client
            .request_text(req)
            .await
            .map_err(|e| format!("{:#}", anyhow::Error::from(e)))
    }

    /// kubeconfig's tls-server-name: the server's certificate is checked for that name, not
    /// for the server URL's host (the API server behind an address its certificate lacks).
    #[tokio::test]
    async fn the_certificate_is_checked_for_tls_server_name() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, port, mut s) = server(dir.path());
        let by_address = get(&ca, port, None).await;
        let by_name = get(&ca, port, Some("apiserver.test")).await;
        let other = get(&ca, port, Some("other.test")).await;
        let _ = s.kill();
        let _ = s.wait();
        let err = by_address.expect_err("127.0.0.1 is not in the certificate");
        assert!(err.contains("not valid for name"), "{err}");
        let page = by_name.expect("the certificate names apiserver.test");
        assert!(page.contains("s_server"), "{page}");
        let err = other.expect_err("other.test is not in the certificate");
        assert!(err.contains("not valid for name \"other.test\""), "{err}");
    }
}
