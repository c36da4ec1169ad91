//! One probe attempt, by handler type, with kubelet's semantics and messages: exec (exit code
//! 0 succeeds; a timeout fails), httpGet (200-399 succeeds; redirects to the same host are
//! followed, others end the probe as a success with a warning; TLS is not verified), tcpSocket
//! (a connection succeeds) and grpc (grpc.health.v1 Check answering SERVING). The HTTP client
//! is shared with lifecycle hooks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrolet_runtime::{ExecSpec, Runtime};
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::{Container, ExecAction, GRPCAction, HTTPGetAction, HTTPHeader, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::netns::{connect, PodTarget};

/// kubelet's limit on what it keeps of a probe's output.
pub const MAX_OUTPUT: usize = 10 * 1024;
pub const USER_AGENT: &str = "kube-probe/1.37";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Success; the text is a warning worth an event (e.g. a redirect not followed).
    Success(String),
    Failure(String),
}

impl Outcome {
    pub fn ok(&self) -> bool {
        matches!(self, Outcome::Success(_))
    }
}

/// A port given by number or by the name of one of the container's ports.
pub fn resolve_port(port: &IntOrString, c: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("invalid port number: {n}")),
        IntOrString::String(s) => {
            if let Ok(n) = s.parse::<u16>() {
                return Ok(n);
            }
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(s.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("couldn't find port: {s} in {}", c.name))
        }
    }
}

/// `$(VAR)` in an exec probe's command is expanded with the container's static env entries
/// (those with a value, not valueFrom), as kubelet does.
pub async fn exec(rt: &Runtime, id: &str, action: &ExecAction, c: &Container, timeout: Duration) -> Outcome {
    let static_env: Vec<(String, String)> = c
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
        .collect();
    let cmd = crate::sync::env::expand_all(&action.command.clone().unwrap_or_default(), &static_env);
    let spec = ExecSpec {
        args: cmd.clone(),
        ..Default::default()
    };
    match rt.exec_capture(id, &spec, Some(timeout), MAX_OUTPUT).await {
        Err(e) => Outcome::Failure(ferrolet_fsutil::chain(&e).to_string()),
        Ok(o) if o.timed_out => Outcome::Failure(format!(
            "command timed out: {:?} timed out after {}",
            cmd.join(" "),
            crate::units::format_duration(timeout)
        )),
        Ok(o) => {
            let mut out = o.stdout;
            out.extend_from_slice(&o.stderr);
            out.truncate(MAX_OUTPUT);
            let text = String::from_utf8_lossy(&out).into_owned();
            if o.exit_code == 0 {
                Outcome::Success(String::new())
            } else if text.trim().is_empty() {
                Outcome::Failure(format!("command {:?} exited with {}", cmd.join(" "), o.exit_code))
            } else {
                Outcome::Failure(text)
            }
        }
    }
}

pub async fn tcp(action: &TCPSocketAction, c: &Container, target: &PodTarget, timeout: Duration) -> Outcome {
    let port = match resolve_port(&action.port, c) {
        Ok(p) => p,
        Err(e) => return Outcome::Failure(e),
    };
    let (addr, ns) = match target.resolve(action.host.as_deref(), port) {
        Ok(x) => x,
        Err(e) => return Outcome::Failure(e.to_string()),
    };
    match connect(addr, ns, timeout).await {
        Ok(_) => Outcome::Success(String::new()),
        Err(e) => Outcome::Failure(format!("dial tcp {addr}: {e}")),
    }
}

/// A response: status, (limited) body, Location header.
pub struct HttpResponse {
    pub status: u16,
    pub body: Vec<u8>,
    pub location: Option<String>,
}

/// One HTTP GET to `addr` (from `netns`), `https` without certificate verification.
pub async fn http_get_once(
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

pub async fn http(action: &HTTPGetAction, c: &Container, target: &PodTarget, timeout: Duration) -> Outcome {
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
        let r = match http_get_once(https, addr, ns.clone(), &host_port, &path, &headers, timeout).await {
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

pub async fn grpc(action: &GRPCAction, target: &PodTarget, timeout: Duration) -> Outcome {
    let Ok(port) = u16::try_from(action.port) else {
        return Outcome::Failure(format!("invalid port number: {}", action.port));
    };
    let (addr, ns) = match target.resolve(None, port) {
        Ok(x) => x,
        Err(e) => return Outcome::Failure(e.to_string()),
    };
    let service = action.service.clone().unwrap_or_default();
    let secs = timeout.as_secs().max(1);
    let fut = async {
        let stream = connect(addr, ns, timeout)
            .await
            .map_err(|e| format!("error: failed to connect service at {:?}: {e}", addr.to_string()))?;
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| format!("error: failed to connect service at {:?}: {e}", addr.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        // HealthCheckRequest { string service = 1; } in a gRPC frame.
        let mut msg = Vec::new();
        if !service.is_empty() {
            msg.push(0x0a);
            push_varint(&mut msg, service.len() as u64);
            msg.extend_from_slice(service.as_bytes());
        }
        let mut frame = vec![0u8];
        frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        frame.extend_from_slice(&msg);
        let req = hyper::Request::post(format!("http://{addr}/grpc.health.v1.Health/Check"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("user-agent", USER_AGENT)
            .body(Full::new(Bytes::from(frame)))
            .map_err(|e| e.to_string())?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("error: health rpc probe failed: {e}"))?;
        let (parts, body) = resp.into_parts();
        let collected = body
            .collect()
            .await
            .map_err(|e| format!("error: health rpc probe failed: {e}"))?;
        let trailers = collected.trailers().cloned();
        let data = collected.to_bytes();
        let grpc_status = trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| parts.headers.get("grpc-status"))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(if parts.status.is_success() { 0 } else { 2 });
        if grpc_status != 0 {
            let m = trailers
                .as_ref()
                .and_then(|t| t.get("grpc-message"))
                .or_else(|| parts.headers.get("grpc-message"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            if grpc_status == 12 {
                return Err(format!(
                    "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {m}"
                ));
            }
            return Err(format!(
                "error: health rpc probe failed: rpc error: code = {} desc = {m}",
                grpc_code_name(grpc_status)
            ));
        }
        let status = data.get(5..).map(parse_status).unwrap_or(0);
        Ok(status)
    };
    match tokio::time::timeout(timeout, fut).await {
        Err(_) => Outcome::Failure(format!("timeout: health rpc did not complete within {secs}s")),
        Ok(Err(e)) => Outcome::Failure(e),
        Ok(Ok(1)) => Outcome::Success(String::new()),
        Ok(Ok(s)) => Outcome::Failure(format!(
            "service unhealthy (responded with {:?})",
            serving_status_name(s)
        )),
    }
}

fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// `status` (field 1, varint) of a HealthCheckResponse.
fn parse_status(b: &[u8]) -> u64 {
    let mut i = 0;
    while i < b.len() {
        let key = b[i];
        i += 1;
        let (v, n) = read_varint(&b[i..]);
        if key == 0x08 {
            return v;
        }
        i += n;
        if key & 7 == 2 {
            i += v as usize;
        }
    }
    0
}

fn read_varint(b: &[u8]) -> (u64, usize) {
    let mut v = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        v |= ((byte & 0x7f) as u64) << (7 * i);
        if byte & 0x80 == 0 {
            return (v, i + 1);
        }
    }
    (v, b.len())
}

fn serving_status_name(s: u64) -> &'static str {
    match s {
        0 => "UNKNOWN",
        1 => "SERVING",
        2 => "NOT_SERVING",
        3 => "SERVICE_UNKNOWN",
        _ => "UNKNOWN",
    }
}

fn grpc_code_name(c: u32) -> &'static str {
    [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ]
    .get(c as usize)
    .copied()
    .unwrap_or("Unknown")
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
    fn named_and_numbered_ports() {
        let c: Container =
            serde_json::from_value(serde_json::json!({"name":"c","ports":[{"name":"http","containerPort":8080}]}))
                .unwrap();
        assert_eq!(resolve_port(&IntOrString::Int(80), &c), Ok(80));
        assert_eq!(resolve_port(&IntOrString::String("http".into()), &c), Ok(8080));
        assert!(resolve_port(&IntOrString::String("nope".into()), &c).is_err());
        assert!(resolve_port(&IntOrString::Int(0), &c).is_err());
    }

    #[test]
    fn redirects_stay_on_host() {
        assert_eq!(redirect_target("/x", "10.0.0.1", 80), Some(("/x".into(), 80)));
        assert_eq!(
            redirect_target("http://10.0.0.1:81/y", "10.0.0.1", 80),
            Some(("/y".into(), 81))
        );
        assert_eq!(redirect_target("http://example.com/", "10.0.0.1", 80), None);
    }

    #[test]
    fn health_response_parsing() {
        assert_eq!(parse_status(&[0x08, 0x01]), 1);
        assert_eq!(parse_status(&[0x08, 0x02]), 2);
        assert_eq!(parse_status(&[]), 0);
        let mut v = Vec::new();
        push_varint(&mut v, 300);
        assert_eq!(read_varint(&v), (300, 2));
    }
}
