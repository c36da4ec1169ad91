//! `/portForward/{namespace}/{pod}[/{uid}]`: forward TCP connections to ports of a pod, as
//! kubelet's portforward package serves them.
//!
//! - SPDY (`X-Stream-Protocol-Version: portforward.k8s.io`, and the same SPDY carried in a
//!   WebSocket under the subprotocol `SPDY/3.1+portforward.k8s.io`, which kubectl 1.30+ tries
//!   first): for every connection it accepts, the client opens an error stream and a data
//!   stream with the same `requestID` header (older clients: the data stream's id is the error
//!   stream's + 2) and a `port` header. Each pair is forwarded on its own; a failure is
//!   written on that pair's error stream and leaves the others alone.
//! - WebSocket (`portforward.k8s.io`, `v4.channel.k8s.io`, `v4.base64.channel.k8s.io`): the
//!   ports are in the query (`ports=8080&ports=...` as kubelet reads `port`), two channels per
//!   port (data, error); the first message on each is the port, 2 bytes little-endian.
//!
//! A port is reached at localhost inside the pod's network namespace (the node's for
//! hostNetwork pods), as containerd's port forwarding does.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, State as AxState};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::remotecommand::{query_all, query_pairs, Output};
use super::spdy_conn::{Connection, Stream};
use super::websocket::{self, Framing};
use super::{lookup_pod, plain_error, running_id, upgrade, Target, Timeouts};
use crate::server::State;

pub const PROTOCOL_V1: &str = "portforward.k8s.io";
/// SPDY tunnelled in WebSocket binary messages (kubectl 1.30+).
pub const SPDY_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";
const WS_V4: &str = "v4.channel.k8s.io";
const WS_V4_BASE64: &str = "v4.base64.channel.k8s.io";
const WS_PROTOCOLS: &[&str] = &[SPDY_TUNNEL, PROTOCOL_V1, WS_V4, WS_V4_BASE64, ""];

/// How long connecting to a pod's port may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the pod's ports are reached.
#[derive(Debug, Clone)]
pub struct PodPorts {
    /// "name_namespace", kubelet's full name, for messages.
    pub pod: String,
    pub uid: String,
    /// The network namespace to connect from (None: the node's, for hostNetwork pods).
    pub netns: Option<PathBuf>,
}

pub async fn handle(
    AxState(st): AxState<Arc<State>>,
    Path(p): Path<Vec<(String, String)>>,
    req: Request<Body>,
) -> Response {
    let t = Target::from_path(&p);
    let entry = match lookup_pod(&st, &t) {
        Ok(e) => e,
        Err(r) => return *r,
    };
    let full_name = format!("{}_{}", t.pod, t.namespace);
    let netns = if crate::pod::host_network(&entry.pod) {
        None
    } else {
        // Any running container of the pod is in its network namespace.
        let pid = crate::pod::all_containers(&entry.pod)
            .filter_map(|c| running_id(&entry, &c.name))
            .filter_map(|id| st.rt.inspect(&id).ok())
            .filter(|i| i.is_running())
            .find_map(|i| i.monitor.map(|m| m.init_pid));
        match pid {
            Some(pid) => Some(PathBuf::from(format!("/proc/{pid}/ns/net"))),
            None => {
                return plain_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("pod not found ({full_name:?})"),
                )
            }
        }
    };
    let target = PodPorts {
        pod: full_name,
        uid: crate::pod::uid(&entry.pod).to_string(),
        netns,
    };
    serve(req, target, Timeouts::of(&st)).await
}

/// Upgrade and forward (the pod is already resolved).
pub async fn serve(mut req: Request<Body>, target: PodPorts, timeouts: Timeouts) -> Response {
    if upgrade::is_websocket(req.headers()) {
        let requested = websocket::requested_protocols(req.headers());
        let Some(protocol) = websocket::choose(&requested, WS_PROTOCOLS) else {
            return plain_error(
                StatusCode::FORBIDDEN,
                format!("requested protocol(s) are not supported: {requested:?}; supports {WS_PROTOCOLS:?}"),
            );
        };
        let ports = if protocol == SPDY_TUNNEL {
            Vec::new()
        } else {
            match ports_from_query(&query_pairs(&req)) {
                Ok(p) => p,
                Err(e) => return plain_error(StatusCode::BAD_REQUEST, e),
            }
        };
        let (mut parts, _) = req.into_parts();
        let mut ws = match axum::extract::ws::WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
            Ok(ws) => websocket::bounded(ws),
            Err(e) => return e.into_response(),
        };
        if let Ok(v) = protocol.parse() {
            if !protocol.is_empty() {
                ws.set_selected_protocol(v);
            }
        }
        return ws.on_upgrade(move |socket| async move {
            info!(pod = %target.pod, protocol = %protocol, transport = "websocket", "port-forward session");
            if protocol == SPDY_TUNNEL {
                let io = websocket::tunnel(socket);
                let (conn, streams) = Connection::start(io, timeouts.idle, MAX_SPDY_STREAMS);
                serve_spdy(conn, streams, target, timeouts).await;
            } else {
                let framing = Framing {
                    base64: protocol == WS_V4_BASE64,
                    close_signal: false,
                };
                serve_websocket(socket, framing, ports, target, timeouts).await;
            }
        });
    }
    let up = match upgrade::spdy(&mut req, &[PROTOCOL_V1]) {
        Ok(u) => u,
        Err(r) => return *r,
    };
    tokio::spawn(async move {
        match up.on_upgrade.await {
            Ok(io) => {
                info!(pod = %target.pod, protocol = %PROTOCOL_V1, transport = "spdy", "port-forward session");
                let (conn, streams) = Connection::start(TokioIo::new(io), timeouts.idle, MAX_SPDY_STREAMS);
                serve_spdy(conn, streams, target, timeouts).await;
            }
            Err(e) => debug!(error = %e, "SPDY upgrade failed"),
        }
    });
    up.response
}

/// Streams a SPDY port-forward connection may have open at once: a data and an error stream
/// for each forwarded connection, so 64 connections forwarded at a time through one
/// `kubectl port-forward`.
pub const MAX_SPDY_STREAMS: usize = 2 * 64;

/// kubelet's V4Options for WebSocket: `port` repeated, each 1-65535.
/// The most ports one WebSocket port-forward carries (channel numbers are one byte).
pub const MAX_WEBSOCKET_PORTS: usize = 100;

pub fn ports_from_query(q: &[(String, String)]) -> Result<Vec<u16>, String> {
    let raw = query_all(q, "port");
    if raw.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    // Two channels a port, numbered in one byte (and one digit character in the base64
    // framing's first byte): more ports would collide.
    if raw.len() > MAX_WEBSOCKET_PORTS {
        return Err(format!(
            "port: at most {MAX_WEBSOCKET_PORTS} ports can be forwarded on one connection, {} asked",
            raw.len()
        ));
    }
    raw.iter()
        .map(|s| match s.parse::<u16>() {
            Ok(0) => Err(format!("port {s:?} must be > 0")),
            Ok(p) => Ok(p),
            Err(e) => Err(format!("unable to parse {s:?} as a port: {e}")),
        })
        .collect()
}

#[derive(Default)]
struct Pair {
    data: Option<Stream>,
    error: Option<Stream>,
}

async fn serve_spdy(conn: Connection, mut incoming: mpsc::Receiver<Stream>, target: PodPorts, timeouts: Timeouts) {
    let target = Arc::new(target);
    let mut pending: HashMap<String, Pair> = HashMap::new();
    let (expire_tx, mut expire_rx) = mpsc::channel::<String>(16);
    loop {
        let s = tokio::select! {
            s = incoming.recv() => match s { Some(s) => s, None => break },
            Some(id) = expire_rx.recv() => {
                if let Some(p) = pending.remove(&id) {
                    let msg = format!("(request={id}) timed out waiting for streams");
                    warn!("port-forward: {msg}");
                    if let Some(e) = p.error {
                        let _ = e.tx.write(msg.as_bytes()).await;
                        e.tx.close().await;
                    }
                    if let Some(d) = p.data {
                        d.tx.reset().await;
                    }
                }
                continue;
            }
        };
        let kind = s.headers.get("streamType").unwrap_or("").to_string();
        let request_id = match s.headers.get("requestID").filter(|r| !r.is_empty()) {
            Some(r) => r.to_string(),
            // Clients before requestID: the error stream first, its data stream next.
            None if kind == "data" => s.id.saturating_sub(2).to_string(),
            None => s.id.to_string(),
        };
        if !pending.contains_key(&request_id) {
            let (tx, id) = (expire_tx.clone(), request_id.clone());
            let wait = timeouts.stream_creation;
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                let _ = tx.send(id).await;
            });
        }
        let pair = pending.entry(request_id.clone()).or_default();
        match kind.as_str() {
            "data" => pair.data = Some(s),
            "error" => pair.error = Some(s),
            other => {
                warn!(stream_type = other, "port-forward: invalid stream type");
                s.tx.reset().await;
                continue;
            }
        }
        if pair.data.is_some() && pair.error.is_some() {
            let Some(Pair {
                data: Some(data),
                error: Some(error),
            }) = pending.remove(&request_id)
            else {
                continue;
            };
            let target = target.clone();
            tokio::spawn(async move {
                let port_str = data.headers.get("port").unwrap_or("").to_string();
                let rx = data.rx.into_inner();
                let out = Output::Spdy(data.tx.clone());
                let result = match port_str.parse::<u16>() {
                    Ok(port) if port > 0 => forward(&target, port, rx, out).await,
                    _ => Err(format!("invalid port {port_str:?}")),
                };
                data.tx.close().await;
                if let Err(e) = result {
                    let msg = format!(
                        "error forwarding port {port_str} to pod {}, uid {}: {e}",
                        target.pod, target.uid
                    );
                    warn!("port-forward: {msg}");
                    let _ = error.tx.write(msg.as_bytes()).await;
                }
                error.tx.close().await;
            });
        }
    }
    conn.close().await;
}

async fn serve_websocket(
    socket: axum::extract::ws::WebSocket,
    framing: Framing,
    ports: Vec<u16>,
    target: PodPorts,
    timeouts: Timeouts,
) {
    let data_channels: Vec<u8> = (0..ports.len()).map(|i| (i * 2) as u8).collect();
    let (conn, mut rx) = websocket::start(socket, framing, &data_channels, timeouts.idle);
    let target = Arc::new(target);
    let mut tasks = Vec::new();
    for (i, port) in ports.into_iter().enumerate() {
        let (data_ch, err_ch) = ((i * 2) as u8, (i * 2 + 1) as u8);
        let data = conn.writer(data_ch);
        let error = conn.writer(err_ch);
        let _ = data.write(&port.to_le_bytes()).await;
        let _ = error.write(&port.to_le_bytes()).await;
        let input = rx.remove(&data_ch).unwrap_or_else(|| mpsc::channel(1).1);
        let target = target.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = forward(&target, port, input, Output::Ws(data)).await {
                let msg = format!(
                    "error forwarding port {port} to pod {}, uid {}: {e}",
                    target.pod, target.uid
                );
                warn!("port-forward: {msg}");
                let _ = error.write(msg.as_bytes()).await;
            }
        }));
    }
    futures::future::join_all(tasks).await;
    conn.close().await;
}

/// Connect to `port` on the pod's localhost and copy both ways until the pod's side ends.
async fn forward(target: &PodPorts, port: u16, mut rx: mpsc::Receiver<Bytes>, out: Output) -> Result<(), String> {
    let stream = connect(target, port).await?;
    info!(pod = %target.pod, port, "port-forward connection");
    let (mut r, mut w) = stream.into_split();
    let upload = tokio::spawn(async move {
        while let Some(b) = rx.recv().await {
            if w.write_all(&b).await.is_err() {
                return;
            }
        }
        // The client closed its side: so does the pod's connection, for writing.
        let _ = w.shutdown().await;
    });
    let mut buf = vec![0u8; 32 * 1024];
    let result = loop {
        match r.read(&mut buf).await {
            Ok(0) => break Ok(()),
            Ok(n) => {
                if out.write(&buf[..n]).await.is_err() {
                    break Ok(());
                }
            }
            Err(e) => break Err(format!("reading from the pod: {e}")),
        }
    };
    upload.abort();
    result
}

async fn connect(target: &PodPorts, port: u16) -> Result<tokio::net::TcpStream, String> {
    let where_ = match &target.netns {
        Some(ns) => format!("inside namespace {:?}", ns.display().to_string()),
        None => "on the node".to_string(),
    };
    // localhost is 127.0.0.1, then ::1 for servers listening on IPv6 only; the IPv4 error is
    // the one reported.
    let mut first = None;
    for ip in [
        IpAddr::from([127, 0, 0, 1]),
        IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    ] {
        let addr = SocketAddr::new(ip, port);
        match crate::probe::netns::connect(addr, target.netns.clone(), CONNECT_TIMEOUT).await {
            Ok(s) => return Ok(s),
            Err(e) => {
                // Go's wording, which kubectl users know from other kubelets.
                let why = match e.kind() {
                    std::io::ErrorKind::ConnectionRefused => "connect: connection refused".to_string(),
                    std::io::ErrorKind::TimedOut => "i/o timeout".to_string(),
                    _ => e.to_string(),
                };
                first.get_or_insert(format!(
                    "failed to connect to localhost:{port} {where_}: dial tcp {addr}: {why}"
                ));
            }
        }
    }
    Err(first.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_read_as_kubelet_reads_them() {
        let q = |s: &str| form_urlencoded::parse(s.as_bytes()).into_owned().collect::<Vec<_>>();
        assert_eq!(ports_from_query(&q("port=8080&port=9090")), Ok(vec![8080, 9090]));
        assert!(ports_from_query(&q("")).unwrap_err().contains("\"port\" is required"));
        assert!(ports_from_query(&q("port=0")).unwrap_err().contains("must be > 0"));
        assert!(ports_from_query(&q("port=70000"))
            .unwrap_err()
            .contains("unable to parse"));
    }
}
