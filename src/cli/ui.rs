//! `ferrolet ui`: where to see the status page. With the read-only port on, the page is
//! already served there and its address is printed; otherwise (or with `--listen`) the page
//! is served on a loopback address, each request passed to the agent's owner-only socket.
//! Only the page's own paths are passed on: the socket's other routes (logs, exec,
//! configuration) stay the owner's. docs/status-page.md.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use axum::body::Body;
use axum::http::{header, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use clap::Args;
use http_body_util::BodyExt;
use tracing::debug;

use super::RootArg;

#[derive(Args, Debug, Clone)]
pub struct UiArgs {
    #[command(flatten)]
    pub root: RootArg,
    /// Serve the page on this loopback address (a port of 0 picks a free one), even when
    /// the read-only port serves it already.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<SocketAddr>,
}

/// The page's paths, passed on to the agent.
const PATHS: [&str; 3] = ["/ui", "/ui/", "/ui/live.js"];

/// The response headers passed back from the agent.
const KEPT: [header::HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::CACHE_CONTROL,
    header::CONTENT_SECURITY_POLICY,
    header::X_CONTENT_TYPE_OPTIONS,
];

pub async fn run(args: &UiArgs) -> Result<i32> {
    let socket = args.root.root_dir.join("ferrolet.sock");
    if args.listen.is_none() {
        let cfg = super::client::get_json(&socket, "/configz").await?;
        if let Some(addr) = read_only_address(&cfg["kubeletconfig"]) {
            println!("http://{addr}/ui");
            return Ok(0);
        }
    }
    let listen = args
        .listen
        .unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0));
    if !listen.ip().is_loopback() {
        bail!(
            "--listen {listen}: the page is served on loopback only (it is the owner's socket's); \
             set readOnlyPort to serve it on the node's address"
        );
    }
    // Fail now, not on the first request, when no agent is there.
    super::client::get(&socket, "/healthz", |_| Ok(())).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr()?;
    println!("http://{addr}/ui");
    use std::io::Write;
    std::io::stdout().flush()?;
    let app = PATHS
        .iter()
        .fold(Router::new(), |r, p| {
            let socket = socket.clone();
            r.route(p, get(move |req: Request<Body>| pass_on(socket.clone(), req)))
        })
        .route("/", get(|| async { Redirect::to("/ui") }));
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("serving the status page")?;
    Ok(0)
}

/// `http://address:readOnlyPort` when the read-only port is on (loopback for an address that
/// means every address).
fn read_only_address(cfg: &serde_json::Value) -> Option<SocketAddr> {
    if cfg["enableServer"] == serde_json::Value::Bool(false) {
        return None;
    }
    let port = cfg["readOnlyPort"].as_u64().filter(|p| *p != 0)?;
    let port = u16::try_from(port).ok()?;
    let ip: IpAddr = cfg["address"].as_str().and_then(|a| a.parse().ok())?;
    let ip = match ip {
        IpAddr::V4(v) if v.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v) if v.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Some(SocketAddr::new(ip, port))
}

/// GET the request's path from the agent's socket and answer with what it said.
async fn pass_on(socket: PathBuf, req: Request<Body>) -> Response {
    let path = req.uri().path().to_string();
    match fetch(&socket, &path).await {
        Ok(r) => r,
        Err(e) => {
            debug!(error = %format!("{e:#}"), "status page request");
            (StatusCode::BAD_GATEWAY, format!("{e:#}\n")).into_response()
        }
    }
}

async fn fetch(socket: &Path, path: &str) -> Result<Response> {
    let resp = super::client::request(socket, path).await?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.context("reading the agent's answer")?.to_bytes();
    let mut out = Response::new(Body::from(body));
    *out.status_mut() = parts.status;
    for h in KEPT {
        if let Some(v) = parts.headers.get(&h) {
            out.headers_mut().insert(h, v.clone());
        }
    }
    out.headers_mut()
        .insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_only_port_when_on() {
        let v = serde_json::json!({"readOnlyPort": 10255, "address": "0.0.0.0"});
        assert_eq!(read_only_address(&v), Some("127.0.0.1:10255".parse().unwrap()));
        let v = serde_json::json!({"readOnlyPort": 10255, "address": "10.0.0.7"});
        assert_eq!(read_only_address(&v), Some("10.0.0.7:10255".parse().unwrap()));
        let v = serde_json::json!({"readOnlyPort": 10255, "address": "::"});
        assert_eq!(read_only_address(&v), Some("[::1]:10255".parse().unwrap()));
        let v = serde_json::json!({"readOnlyPort": 0, "address": "0.0.0.0"});
        assert_eq!(read_only_address(&v), None);
        let v = serde_json::json!({"readOnlyPort": 10255, "address": "0.0.0.0", "enableServer": false});
        assert_eq!(read_only_address(&v), None);
    }
}
