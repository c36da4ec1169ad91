//! kubelet's streaming endpoints as the API server reaches them (docs/streaming.md):
//! `/exec`, `/attach` and `/portForward` upgrade to SPDY/3.1 or WebSocket and multiplex the
//! command's or the ports' streams on the connection; `/run` runs a command and returns its
//! output. kubelet hands these to its CRI streaming server; ferrolet serves them in-process.
//!
//! - [`spdy`]: SPDY/3 frames and compressed header blocks; [`spdy_conn`]: the server side of
//!   a SPDY connection (streams, replies, pings, GOAWAY, idle timeout).
//! - [`websocket`]: the channel framing of the `*.channel.k8s.io` protocols and the SPDY
//!   tunnel kubectl uses for port-forward over WebSocket.
//! - [`upgrade`]: the HTTP upgrade handshakes.
//! - [`remotecommand`]: exec and attach's protocols, streams and status.
//! - [`exec`], [`attach`], [`portforward`], [`run`]: the endpoints.

pub mod attach;
pub mod exec;
pub mod portforward;
pub mod remotecommand;
pub mod run;
pub mod spdy;
pub mod spdy_conn;
pub mod upgrade;
pub mod websocket;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use super::State;
use crate::kuberuntime::runtime_container_id;
use crate::pod::manager::PodEntry;

/// kubelet's defaults: streamingConnectionIdleTimeout 4h, the stream creation timeout 30 s.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// A connection with no traffic for this long is closed (zero: never).
    pub idle: Duration,
    /// How long the client has to open the streams it asked for.
    pub stream_creation: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            idle: Duration::from_secs(4 * 3600),
            stream_creation: Duration::from_secs(30),
        }
    }
}

impl Timeouts {
    /// From the configuration (streamingConnectionIdleTimeout).
    pub fn of(st: &State) -> Timeouts {
        Timeouts {
            idle: st.config.streaming_connection_idle_timeout,
            ..Default::default()
        }
    }
}

/// The streaming routes (kubelet's paths; GET and POST as kubelet registers them).
pub fn routes() -> Router<Arc<State>> {
    Router::new()
        .route(
            "/exec/{namespace}/{pod}/{container}",
            get(exec::handle).post(exec::handle),
        )
        .route(
            "/exec/{namespace}/{pod}/{uid}/{container}",
            get(exec::handle).post(exec::handle),
        )
        .route(
            "/attach/{namespace}/{pod}/{container}",
            get(attach::handle).post(attach::handle),
        )
        .route(
            "/attach/{namespace}/{pod}/{uid}/{container}",
            get(attach::handle).post(attach::handle),
        )
        .route(
            "/portForward/{namespace}/{pod}",
            get(portforward::handle).post(portforward::handle),
        )
        .route(
            "/portForward/{namespace}/{pod}/{uid}",
            get(portforward::handle).post(portforward::handle),
        )
        .route("/run/{namespace}/{pod}/{container}", post(run::handle))
        .route("/run/{namespace}/{pod}/{uid}/{container}", post(run::handle))
}

pub(crate) fn plain_error(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], msg.into()).into_response()
}

/// The pod (and container) a streaming path names.
#[derive(Debug, Clone, Default)]
pub struct Target {
    pub namespace: String,
    pub pod: String,
    pub uid: Option<String>,
    pub container: Option<String>,
}

impl Target {
    pub fn from_path(p: &[(String, String)]) -> Target {
        let get = |k: &str| p.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        Target {
            namespace: get("namespace").unwrap_or_default(),
            pod: get("pod").unwrap_or_default(),
            uid: get("uid").filter(|u| !u.is_empty()),
            container: get("container"),
        }
    }
}

/// The pod a path names: 404 "pod does not exist" as kubelet, also when the path's uid is not
/// the pod's.
pub fn lookup_pod(st: &State, t: &Target) -> Result<PodEntry, Box<Response>> {
    let missing = || Box::new(plain_error(StatusCode::NOT_FOUND, "pod does not exist"));
    let entry = st.pods.find(&t.namespace, &t.pod, &st.node_name).ok_or_else(missing)?;
    if let Some(uid) = &t.uid {
        if crate::pod::uid(&entry.pod) != uid {
            return Err(missing());
        }
    }
    Ok(entry)
}

/// A running container found for a request.
#[derive(Debug, Clone)]
pub struct Found {
    pub pod: String,
    pub container: String,
    /// The runtime's id.
    pub container_id: String,
    pub entry: PodEntry,
}

/// The running container a path names. Like kubelet, which looks among running containers, a
/// container that is not running is "container not found" (500).
pub fn lookup_running(st: &State, t: &Target) -> Result<Found, Box<Response>> {
    let entry = lookup_pod(st, t)?;
    let name = t.container.clone().unwrap_or_default();
    let not_found = || {
        Box::new(plain_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("container not found ({name:?})"),
        ))
    };
    let id = running_id(&entry, &name).ok_or_else(not_found)?;
    let info = st.rt.inspect(&id).map_err(|_| not_found())?;
    if !info.is_running() {
        return Err(not_found());
    }
    Ok(Found {
        pod: t.pod.clone(),
        container: name.clone(),
        container_id: id,
        entry,
    })
}

/// The runtime id of `name` in the pod's status when it is running.
pub(crate) fn running_id(entry: &PodEntry, name: &str) -> Option<String> {
    let cs = crate::pod::all_statuses(&entry.status).find(|c| c.name == name)?;
    cs.state.as_ref()?.running.as_ref()?;
    Some(runtime_container_id(cs.container_id.as_deref()?).to_string())
}
