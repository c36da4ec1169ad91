//! TLS on the kubelet port: the rustls server configuration (kubelet's tlsMinVersion, HTTP/1.1,
//! optional client certificates checked by [`super::clientcert`]), the serving certificate held
//! behind a resolver so a rotated one is served from the next handshake on without a restart,
//! and the accept loop that hands each connection's verified client chain to the handlers as a
//! request extension ([`PeerCertificates`]).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use axum::Router;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use tracing::debug;

use super::clientcert::ClientCaVerifier;
use super::conn::{self, Budget, HANDSHAKE_TIMEOUT};
use crate::config::TlsVersion;

/// The client's certificate chain, verified during the handshake (leaf first); `None` when the
/// client sent none.
#[derive(Clone, Debug, Default)]
pub struct PeerCertificates(pub Option<Arc<Vec<CertificateDer<'static>>>>);

/// The serving certificate, replaceable while serving. Empty (every handshake fails) until a
/// requested certificate is issued.
#[derive(Debug, Default)]
pub struct ServingCert(RwLock<Option<Arc<CertifiedKey>>>);

impl ServingCert {
    /// Serve the chain and key in `cert_pem` / `key_pem` from now on.
    pub fn set(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<()> {
        let key = certified_key(cert_pem, key_pem)?;
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(key));
        Ok(())
    }

    pub fn is_set(&self) -> bool {
        self.0.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let key = self.0.read().unwrap_or_else(|e| e.into_inner()).clone();
        if key.is_none() {
            debug!("TLS handshake refused: no serving certificate yet");
        }
        key
    }
}

/// A rustls signing key and chain from PEM.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("not PEM certificates: {e}"))?;
    if chain.is_empty() {
        return Err(anyhow!("no certificate in the PEM data"));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| anyhow!("no PEM private key: {e}"))?;
    let signer = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)
        .context("the private key")?;
    let key = CertifiedKey::new(chain, signer);
    key.keys_match()
        .context("the private key does not belong to the certificate")?;
    Ok(key)
}

/// The server's TLS configuration: `cert` served, client certificates verified against
/// `client_ca` when given (optional: clients without one still connect), TLS `min` and up.
pub fn server_config(
    cert: Arc<ServingCert>,
    client_ca: Option<Arc<ClientCaVerifier>>,
    min: TlsVersion,
) -> Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&'static rustls::SupportedProtocolVersion] = match min {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .context("TLS versions")?;
    let builder = match client_ca {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_client_cert_verifier(WebPkiClientVerifier::no_client_auth()),
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // No session resumption: a resumed session skips the client certificate's verification,
    // so a certificate that expired (or whose CA left clientCAFile) would keep working on
    // tickets. kubelet, too, checks the certificate on every connection.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// Serve `app` over TLS on `listener`: each accepted connection is handshaken within
/// [`HANDSHAKE_TIMEOUT`], counted in the handshake budget ([`conn::HANDSHAKES`]) meanwhile and
/// in the connection budget ([`conn::API`]) only once the handshake is done, then served as
/// [`super::conn`] serves plain ones, with upgrades, every request carrying the connection's
/// [`PeerCertificates`].
pub async fn serve(listener: TcpListener, config: Arc<rustls::ServerConfig>, app: Router) {
    let acceptor = TlsAcceptor::from(config);
    let handshakes = Budget::new("kubelet API handshakes", conn::HANDSHAKES);
    let connections = Budget::new("kubelet API", conn::API);
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                debug!(error = %e, "accepting a TLS connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let ip = peer.ip().to_canonical();
        let Some(handshaking) = handshakes.admit(Some(ip)) else {
            continue;
        };
        let (acceptor, app, connections) = (acceptor.clone(), app.clone(), connections.clone());
        tokio::spawn(async move {
            let evicted = handshaking.evicted();
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(handshaking.watch(tcp)));
            let tls = tokio::select! {
                r = handshake => match r {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                },
                _ = evicted => {
                    debug!(%peer, "a silent connection gave its handshake slot to a newer one");
                    return;
                }
            };
            drop(handshaking);
            let Some(slot) = connections.admit(Some(ip)) else {
                return;
            };
            let certs = PeerCertificates(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .map(|c| Arc::new(c.iter().map(|d| d.clone().into_owned()).collect())),
            );
            let app = app.map_request(move |mut req: axum::extract::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(certs.clone());
                req
            });
            let evicted = slot.evicted();
            tokio::select! {
                _ = conn::serve_connection(slot.watch(tls), app) => {}
                _ = evicted => debug!(%peer, "a silent connection gave its slot to a newer one"),
            }
        });
        // Let the handshake read its ClientHello before more are admitted (conn::serve).
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Handshake a TLS 1.2-only client that trusts `cred` with a server of minimum `min`.
    async fn handshake_tls12(cred: &crate::kubeclient::certstore::Credential, min: TlsVersion) -> bool {
        let cert = Arc::new(ServingCert::default());
        cert.set(&cred.cert_pem, &cred.key_pem).unwrap();
        let server = TlsAcceptor::from(server_config(cert, None, min).unwrap());
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&cred.cert_pem) {
            roots.add(c.unwrap()).unwrap();
        }
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let (a, b) = tokio::io::duplex(64 * 1024);
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let (s, c) = tokio::join!(server.accept(a), connector.connect(name, b));
        s.is_ok() && c.is_ok()
    }

    #[tokio::test]
    async fn the_minimum_version_is_enforced_and_the_certificate_swaps_live() {
        let root = tempfile::tempdir().unwrap();
        let cred = crate::server::certs::self_signed(root.path(), "node-a", &[]).unwrap();
        assert!(handshake_tls12(&cred, TlsVersion::Tls12).await);
        assert!(!handshake_tls12(&cred, TlsVersion::Tls13).await);

        // an empty resolver refuses handshakes; a set one serves the newest pair
        let cert = ServingCert::default();
        assert!(!cert.is_set());
        cert.set(&cred.cert_pem, &cred.key_pem).unwrap();
        assert!(cert.is_set());
        let other = tempfile::tempdir().unwrap();
        let cred2 = crate::server::certs::self_signed(other.path(), "node-a", &[]).unwrap();
        assert!(
            cert.set(&cred.cert_pem, &cred2.key_pem).is_err(),
            "a key of another certificate"
        );
        cert.set(&cred2.cert_pem, &cred2.key_pem).unwrap();
        let served = cert.0.read().unwrap().clone().unwrap();
        let want = CertificateDer::pem_slice_iter(&cred2.cert_pem).next().unwrap().unwrap();
        assert_eq!(served.cert[0], want);
    }
}
