//! HTTP from the node to a pod (kubelet's pkg/probe/http): one GET with kubelet's headers and
//! limits, over TLS without certificate verification for HTTPS (as kubelet's probes and hooks
//! do), and the httpGet probe with its redirect rules. The lifecycle hooks use [`get`] too.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction, HTTPHeader};

use super::netns::{connect, PodTarget};
use super::{resolve_port, Outcome, MAX_OUTPUT, USER_AGENT};

/// A response: status, (limited) body, Location header.
pub struct HttpResponse {
    pub status: u16,
    pub body: Vec<u8>,
    pub location: Option<String>,
}

/// One HTTP GET to `addr` (from `netns`), `https` without certificate verification.
pub async fn get(
    https: bool,
    addr: SocketAddr,
    netns: Option<std::path::PathBuf>,
    host_header: &str,
    path: &str,
    headers: &[HTTPHeader],
    timeout: Duration,
) -> Result<HttpResponse, String> {
    let fut = async {
        let stream = connect(addr, netns, timeout).await.map_err(|e| {
            format!(
                "Get \"{}://{host_header}{path}\": dial tcp {addr}: {e}",
                if https { "https" } else { "http" }
            )
        })?;
        let mut req = hyper::Request::get(if path.is_empty() { "/" } else { path });
        let mut has_ua = false;
        let mut has_accept = false;
        let mut has_host = false;
        for h in headers {
            let n = h.name.to_ascii_lowercase();
            has_ua |= n == "user-agent";
            has_accept |= n == "accept";
            has_host |= n == "host";
            req = req.header(h.name.as_str(), h.value.as_str());
        }
        if !has_ua {
            req = req.header("User-Agent", USER_AGENT);
        }
        if !has_accept {
            req = req.header("Accept", "*/*");
        }
        if !has_host {
            req = req.header("Host", host_header);
        }
        req = req.header("Connection", "close");
        let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
        let resp = if https {
            let tls = tls_connector();
            let name = rustls::pki_types::ServerName::try_from(host_header.split(':').next().unwrap_or("").to_string())
                .unwrap_or_else(|_| rustls::pki_types::ServerName::IpAddress(addr.ip().into()));
            let s = tls
                .connect(name, stream)
                .await
                .map_err(|e| format!("TLS handshake: {e}"))?;
            send(TokioIo::new(s), req).await?
        } else {
            send(TokioIo::new(stream), req).await?
        };
        let status = resp.status().as_u16();
        let location = resp
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = match Limited::new(resp.into_body(), MAX_OUTPUT).collect().await {
            Ok(b) => b.to_bytes().to_vec(),
            Err(_) => Vec::new(),
        };
        Ok(HttpResponse { status, body, location })
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "Get \"{}://{host_header}{path}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
            if https { "https" } else { "http" }
        )),
    }
}

async fn send<I>(io: I, req: hyper::Request<Empty<Bytes>>) -> Result<hyper::Response<hyper::body::Incoming>, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(|e| e.to_string())
}

/// The httpGet probe: 200-399 succeeds; redirects to the same host are followed (at most 10),
/// a redirect elsewhere ends the probe as a success with a warning.
pub async fn probe(action: &HTTPGetAction, c: &Container, target: &PodTarget, timeout: Duration) -> Outcome {
    let port = match resolve_port(&action.port, c) {
        Ok(p) => p,
        Err(e) => return Outcome::Failure(e),
    };
    let https = action.scheme.as_deref() == Some("HTTPS");
    let (mut addr, ns) = match target.resolve(action.host.as_deref(), port) {
        Ok(x) => x,
        Err(e) => return Outcome::Failure(e.to_string()),
    };
    let host = action
        .host
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| addr.ip().to_string());
    let mut host_port = format!("{host}:{}", addr.port());
    let mut path = action.path.clone().unwrap_or_else(|| "/".into());
    let headers = action.http_headers.clone().unwrap_or_default();
    for _ in 0..10 {
        let r = match get(https, addr, ns.clone(), &host_port, &path, &headers, timeout).await {
            Ok(r) => r,
            Err(e) => return Outcome::Failure(e),
        };
        if (300..400).contains(&r.status) {
            if let Some(loc) = &r.location {
                match redirect_target(loc, &host, addr.port()) {
                    Some((p, port2)) => {
                        path = p;
                        if port2 != addr.port() {
                            addr.set_port(port2);
                            host_port = format!("{host}:{port2}");
                        }
                        continue;
                    }
                    None => {
                        // kubelet does not follow redirects to another host: success, with a warning.
                        let body = String::from_utf8_lossy(&r.body).into_owned();
                        return Outcome::Success(format!("Probe terminated redirects, Response body: {body}"));
                    }
                }
            }
        }
        return match r.status {
            200..=299 => Outcome::Success(String::new()),
            300..=399 => Outcome::Success(format!(
                "Probe terminated redirects, Response body: {}",
                String::from_utf8_lossy(&r.body)
            )),
            code => Outcome::Failure(format!("HTTP probe failed with statuscode: {code}")),
        };
    }
    Outcome::Failure("stopped after 10 redirects".into())
}

/// Where a Location header points if it stays on `host`: (path, port). None for other hosts.
fn redirect_target(loc: &str, host: &str, port: u16) -> Option<(String, u16)> {
    if loc.starts_with('/') {
        return Some((loc.to_string(), port));
    }
    let rest = loc.strip_prefix("http://").or_else(|| loc.strip_prefix("https://"))?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    let (h, p) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().ok()?),
        None => (hostport, if loc.starts_with("https") { 443 } else { 80 }),
    };
    (h == host).then_some((path, p))
}

/// TLS that accepts any certificate, as kubelet's probes do.
fn tls_connector() -> tokio_rustls::TlsConnector {
    static CFG: std::sync::OnceLock<Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();
    let cfg = CFG.get_or_init(|| {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
            .with_no_client_auth();
        Arc::new(cfg)
    });
    tokio_rustls::TlsConnector::from(cfg.clone())
}

#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_stay_on_host() {
        assert_eq!(redirect_target("/x", "10.0.0.1", 80), Some(("/x".into(), 80)));
        assert_eq!(
            redirect_target("http://10.0.0.1:81/y", "10.0.0.1", 80),
            Some(("/y".into(), 81))
        );
        assert_eq!(redirect_target("http://example.com/", "10.0.0.1", 80), None);
    }
}
