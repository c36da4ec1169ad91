//! The agent's servers (kubelet's pkg/kubelet/server), see docs/server.md:
//! - the kubelet API on `address:port` (10250): TLS ([`tls`], [`certs`]), every request
//!   authenticated and authorized ([`auth`]), serving [`kubelet_router`]; with
//!   `enableDebuggingHandlers` off its debugging routes answer 405 as kubelet's;
//! - `/healthz` alone, plain, on `healthzBindAddress:healthzPort` (127.0.0.1:10248; 0 is off);
//! - kubelet's read-only port, off unless `readOnlyPort` is set: kubelet's default handlers,
//!   `/healthz`, `/pods`, `/spec`, the stats ([`stats`]) and the metrics
//!   ([`metrics`]), none of the debugging ones (logs, exec...);
//! - the CLI's unix socket (owner-only, no authentication): the kubelet endpoints and the
//!   `/ferrolet/...` extras (pods with manifest errors, logs with a default container);
//! - the exec socket, [`exec`];
//! - the status page ([`ui`], `/ui`) on the CLI socket and the read-only port.

pub mod auth;
pub mod certs;
pub mod clientcert;
mod conn;
pub mod exec;
mod healthz;
pub mod metrics;
mod node;
pub mod node_logs;
pub mod podresources;
mod stats;
pub mod streaming;
pub mod tls;
pub mod ui;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ferrolet_runtime::Runtime;
use tracing::{error, info};

use axum::body::Body;
use axum::extract::{Path, Query};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::kubeclient::Kube;
use crate::kuberuntime::logs::{self, LogOptions};
use crate::pod::manager::PodManager;
use crate::stats::Stats;
use crate::tasks::{supervise, Liveness};

/// What the servers read: the pod table and the runtime (for logs and exec).
pub struct State {
    pub rt: Arc<Runtime>,
    pub pods: Arc<PodManager>,
    /// The node's name (a static pod's name ends with it).
    pub node_name: String,
    /// The agent's duties, for /healthz.
    pub liveness: Arc<Liveness>,
    /// Static pods have mirror pods (the agent is in a cluster), for kubelet_mirror_pods.
    pub mirrors_enabled: bool,
    /// The effective configuration (for /configz).
    pub config: Arc<Config>,
    /// The stats cache (/stats/summary, /metrics/resource, /metrics/cadvisor).
    pub stats: Arc<Stats>,
    /// The eviction manager's node conditions (/ferrolet/node).
    pub eviction: crate::eviction::Eviction,
    /// Why the node is not ready (the runtime, the pod network), for /ferrolet/node's Ready.
    pub readiness: crate::node::cluster::Readiness,
    /// In a cluster: the checkpoint, whose view of the API server /healthz?verbose shows.
    pub checkpoint: Option<Arc<crate::checkpoint::Checkpoint>>,
    /// The event recorder, whose recent events the status page lists.
    pub events: crate::events::Recorder,
    /// The device plugins' resources, in /ferrolet/node's capacity and allocatable.
    pub devices: crate::cm::devicemanager::DeviceManager,
}

impl State {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rt: Arc<Runtime>,
        pods: Arc<PodManager>,
        node_name: String,
        liveness: Arc<Liveness>,
        mirrors_enabled: bool,
        config: Arc<Config>,
        stats: Arc<Stats>,
        eviction: crate::eviction::Eviction,
        readiness: crate::node::cluster::Readiness,
        checkpoint: Option<Arc<crate::checkpoint::Checkpoint>>,
        events: crate::events::Recorder,
        devices: crate::cm::devicemanager::DeviceManager,
    ) -> Arc<State> {
        Arc::new(State {
            rt,
            pods,
            node_name,
            liveness,
            mirrors_enabled,
            config,
            stats,
            eviction,
            readiness,
            checkpoint,
            events,
            devices,
        })
    }
}

/// Start every server the configuration asks for: the CLI socket (every endpoint, owner-only)
/// and the exec socket always; the kubelet API on `address:port` unless `enableServer` is off;
/// healthz on `healthzBindAddress:healthzPort` unless the port is 0; kubelet's read-only
/// endpoints on `address:readOnlyPort` when it is set. A port that cannot be bound stops the
/// agent. `kube` is the node's API client (token and access reviews, the serving certificate
/// bootstrap), `node_ips` the node's addresses (the serving certificate's names). Each runs in
/// the background; the unix sockets are restarted if they fail.
pub async fn serve_all(
    cfg: &Config,
    state: Arc<State>,
    kube: Option<Kube>,
    node_ips: Vec<IpAddr>,
) -> anyhow::Result<()> {
    {
        let app =
            local_router(state.clone()).layer(axum::middleware::from_fn(|r, n| metrics::instrument("local", r, n)));
        let (app, path) = (app, cfg.socket_path());
        supervise("API socket", Duration::from_secs(1), move || {
            let (app, path) = (app.clone(), path.clone());
            async move {
                if let Err(e) = serve_unix(app, path).await {
                    error!("{e:#}");
                }
            }
        });
    }
    {
        let (state, path) = (state.clone(), cfg.exec_socket_path());
        supervise("exec socket", Duration::from_secs(1), move || {
            let (state, path) = (state.clone(), path.clone());
            async move {
                if let Err(e) = exec::serve(state, path).await {
                    error!("exec socket: {e:#}");
                }
            }
        });
    }
    let s = &cfg.serving;
    if cfg.enable_server {
        let addr = SocketAddr::new(cfg.address, s.port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("port: binding the kubelet API on {addr}"))?;
        let auth = Arc::new(auth::Auth::from_config(cfg, kube.clone())?);
        let client_ca = match &s.client_ca_file {
            Some(p) => Some(Arc::new(clientcert::ClientCaVerifier::from_file(p.clone())?)),
            None => None,
        };
        let cert = certs::serving_cert(cfg, node_ips, kube).await?;
        let tls = tls::server_config(cert, client_ca, s.tls_min_version)?;
        let app = kubelet_router(state.clone())
            .layer(axum::middleware::from_fn_with_state(auth, auth::layer::filter))
            .layer(axum::middleware::from_fn(|r, n| metrics::instrument("readwrite", r, n)));
        info!(
            %addr,
            authentication = %authn_summary(cfg),
            authorization = s.authz_mode(cfg.in_cluster()).name(),
            "kubelet API listening (TLS)"
        );
        tokio::spawn(tls::serve(listener, tls, app));
    }
    if s.healthz_port != 0 {
        let addr = SocketAddr::new(s.healthz_bind_address, s.healthz_port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("healthzPort: binding the healthz endpoint on {addr}"))?;
        info!(%addr, "healthz listening");
        // A budget of its own: squatting the kubelet port does not reach the probes.
        tokio::spawn(conn::serve(
            listener,
            healthz_router(state.clone()),
            "healthz",
            conn::HEALTHZ,
        ));
    }
    if cfg.enable_server && cfg.read_only_port != 0 {
        let addr = SocketAddr::new(cfg.address, cfg.read_only_port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("readOnlyPort: binding the read-only API on {addr}"))?;
        info!(%addr, "read-only HTTP API listening");
        let app =
            read_only_router(state).layer(axum::middleware::from_fn(|r, n| metrics::instrument("readonly", r, n)));
        tokio::spawn(conn::serve(listener, app, "read-only", conn::API));
    }
    Ok(())
}

/// Which credentials the kubelet port accepts, for the start-up log.
fn authn_summary(cfg: &Config) -> String {
    let s = &cfg.serving;
    let mut parts = Vec::new();
    if s.client_ca_file.is_some() {
        parts.push("x509");
    }
    if s.token_webhook(cfg.in_cluster()) {
        parts.push("token-webhook");
    }
    if s.anonymous_auth {
        parts.push("anonymous");
    }
    if parts.is_empty() {
        "none (every request is refused)".into()
    } else {
        parts.join(",")
    }
}

/// The kubelet API served on `port` behind authentication and authorization. Every route
/// added here is guarded: the filter is applied to the whole router where it is served. With
/// `enableDebuggingHandlers` off the debugging routes answer as kubelet's disabled ones.
pub fn kubelet_router(state: Arc<State>) -> Router {
    let debugging = if state.config.serving.enable_debugging_handlers {
        debugging_routes()
    } else {
        debugging_disabled_routes()
    };
    default_routes().merge(debugging).with_state(state)
}

/// What kubelet's InstallDefaultHandlers serves whatever `enableDebuggingHandlers` says:
/// health, pods, spec, metrics, stats.
fn default_routes() -> Router<Arc<State>> {
    Router::new()
        .route("/healthz", get(healthz::all))
        .route("/healthz/{check}", get(healthz::one))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .route("/spec/", get(node::spec))
        .route("/spec", get(node::spec))
        .merge(metrics::routes())
        .merge(stats::routes())
}

/// kubelet's InstallDebuggingHandlers (and the system log handler it installs with them):
/// exec, attach, port-forward, run, container and node logs, /configz, /runningpods/.
fn debugging_routes() -> Router<Arc<State>> {
    Router::new()
        .route("/runningpods/", get(node::runningpods))
        .route("/configz", get(node::configz))
        .route("/logs/", get(system_logs))
        .route("/logs/{*path}", get(system_logs))
        .route("/containerLogs/{namespace}/{pod}/{container}", get(container_logs))
        .merge(streaming::routes())
}

/// kubelet's InstallDebuggingDisabledHandlers: each debugging path, and everything under it,
/// answers any method with 405 "Debug endpoints are disabled." (Go's http.Error: plain text,
/// a newline at the end). /configz is not served at all, as kubelet registers it only with
/// the debugging handlers.
fn debugging_disabled_routes() -> Router<Arc<State>> {
    const PATHS: [&str; 8] = [
        "/run/",
        "/exec/",
        "/attach/",
        "/portForward/",
        "/containerLogs/",
        "/runningpods/",
        "/debug/pprof/",
        "/logs/",
    ];
    PATHS.iter().fold(Router::new(), |r, p| {
        r.route(p, axum::routing::any(debugging_disabled))
            .route(&format!("{p}{{*rest}}"), axum::routing::any(debugging_disabled))
    })
}

async fn debugging_disabled() -> Response {
    streaming::plain_error(StatusCode::METHOD_NOT_ALLOWED, DEBUGGING_DISABLED)
}

/// kubelet's body for a debugging route when `enableDebuggingHandlers` is off.
pub const DEBUGGING_DISABLED: &str = "Debug endpoints are disabled.\n";

/// `/logs/...`: files and listings under /var/log.
async fn system_logs(uri: axum::http::Uri) -> Response {
    let path = uri.path();
    let rel = path.strip_prefix("/logs/").unwrap_or("");
    node_logs::serve(std::path::Path::new(node_logs::LOG_DIR), rel, path).await
}

/// `/healthz` alone, for the plain healthz port.
pub fn healthz_router(state: Arc<State>) -> Router {
    Router::new()
        .route("/healthz", get(healthz::all))
        .route("/healthz/{check}", get(healthz::one))
        .with_state(state)
}

/// kubelet's read-only endpoints, unauthenticated (kubelet's default handlers: health, pods,
/// spec, stats, metrics; no logs, exec or configuration), and the status page, which shows
/// what those do and the recent events (docs/server.md).
pub fn read_only_router(state: Arc<State>) -> Router {
    Router::new()
        .route("/healthz", get(healthz::all))
        .route("/healthz/{check}", get(healthz::one))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .route("/spec/", get(node::spec))
        .route("/spec", get(node::spec))
        .merge(metrics::routes())
        .merge(stats::routes())
        .merge(ui::routes())
        .with_state(state)
}

/// Everything, for the CLI's socket (owner-only, no authentication): the kubelet endpoints,
/// the debugging ones whatever `enableDebuggingHandlers` says (it guards the network port;
/// `ferrolet logs` and the operator's own tools keep working), and the manifest errors.
pub fn local_router(state: Arc<State>) -> Router {
    default_routes()
        .merge(debugging_routes())
        .route("/ferrolet/pods", get(ferrolet_pods))
        .route("/ferrolet/node", get(ferrolet_node))
        .route("/ferrolet/logs/{namespace}/{pod}", get(ferrolet_logs))
        .merge(ui::routes())
        .with_state(state)
}

fn error(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, msg.into()).into_response()
}

async fn pods(axum::extract::State(st): axum::extract::State<Arc<State>>) -> Response {
    let list = serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": st.pods.pods(),
    });
    ([(header::CONTENT_TYPE, "application/json")], list.to_string()).into_response()
}

async fn ferrolet_pods(axum::extract::State(st): axum::extract::State<Arc<State>>) -> Response {
    let body = serde_json::json!({
        "node": st.node_name,
        "items": st.pods.entries().into_iter().map(|e| {
            let mut p = (*e.pod).clone();
            p.status = Some(Arc::unwrap_or_clone(e.status));
            serde_json::json!({"pod": p, "terminating": e.terminating})
        }).collect::<Vec<_>>(),
        "manifestErrors": st.pods.source_errors(),
    });
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// The node as a standalone agent has it: the Node it would register, with the eviction
/// manager's pressure conditions (MemoryPressure, DiskPressure, PIDPressure), Ready, capacity
/// and allocatable (the device plugins' resources among them, as a cluster's Node has them).
async fn ferrolet_node(axum::extract::State(st): axum::extract::State<Arc<State>>) -> Response {
    let node = node_object(&st).await;
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(&node).unwrap_or_default(),
    )
        .into_response()
}

/// The Node of /ferrolet/node and the status page.
async fn node_object(st: &State) -> k8s_openapi::api::core::v1::Node {
    let mut node = crate::node::register::initial_node(&st.config);
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let status = node.status.get_or_insert_with(Default::default);
    crate::node::conditions::set_pressure(
        status.conditions.get_or_insert_with(Vec::new),
        st.eviction.pressure(),
        &now,
    );
    // The Ready condition as a cluster's Node has it (the runtime's and the pod network's
    // state), and what the machine has and pods may have, as its status says them.
    let (readiness, cfg) = (st.readiness.clone(), st.config.clone());
    let (not_ready, info) =
        match crate::tasks::blocking(move || Ok((readiness(), crate::node::NodeInfo::detect(&cfg)))).await {
            Ok((not_ready, info)) => (not_ready, Some(info)),
            Err(e) => (vec![format!("{e:#}")], None),
        };
    crate::node::conditions::set_ready(status.conditions.get_or_insert_with(Vec::new), &not_ready, &now);
    if let Some(info) = info {
        let (mut capacity, mut allocatable) = (info.capacity.to_list(), info.allocatable.to_list());
        let (devices, healthy) = st.devices.extended().to_lists();
        capacity.extend(devices);
        allocatable.extend(healthy);
        status.capacity = Some(capacity);
        status.allocatable = Some(allocatable);
    }
    node
}

async fn container_logs(
    axum::extract::State(st): axum::extract::State<Arc<State>>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(mut opts): Query<LogOptions>,
) -> Response {
    opts.container = Some(container);
    serve_logs(st, &namespace, &pod, opts).await
}

async fn ferrolet_logs(
    axum::extract::State(st): axum::extract::State<Arc<State>>,
    Path((namespace, pod)): Path<(String, String)>,
    Query(opts): Query<LogOptions>,
) -> Response {
    serve_logs(st, &namespace, &pod, opts).await
}

async fn serve_logs(st: Arc<State>, namespace: &str, pod: &str, opts: LogOptions) -> Response {
    if let Err(e) = opts.validate() {
        return error(StatusCode::BAD_REQUEST, e);
    }
    let Some(entry) = st.pods.find(namespace, pod, &st.node_name) else {
        return error(StatusCode::NOT_FOUND, format!("pod {namespace}/{pod} not found"));
    };
    let name = match logs::container_name(&entry, opts.container.as_deref()) {
        Ok(n) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("{e:#}")),
    };
    let (path, id) = match logs::locate(&st.rt, &entry, &name, opts.previous) {
        Ok(x) => x,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("{e:#}")),
    };
    let (tx, rx) = mpsc::channel::<bytes::Bytes>(16);
    tokio::spawn(logs::stream(st.rt.clone(), path, id, opts, tx));
    (
        [(header::CONTENT_TYPE, "text/plain")],
        Body::from_stream(flushed_before_the_end(rx)),
    )
        .into_response()
}

/// The chunks `rx` yields as a response body whose last data chunk is flushed before the
/// chunked encoding's terminating chunk is written, as kubelet's flushing writer does (each
/// write flushed, the terminator sent when the handler returns). Written together, the two
/// share a TLS record, and Go's chunked reader (net/http/internal/chunked.go) then returns
/// the data together with io.EOF; the API server's WebSocket log copier (wsstream's
/// messageCopy) checks the error before the count and drops that data, so a log read
/// through the API server over WebSocket (binary.k8s.io) came back empty while `kubectl
/// logs` (io.Copy, which keeps it) worked. hyper flushes what it has written whenever the body
/// is not ready, so the stream is not ready once before it ends.
fn flushed_before_the_end(
    rx: mpsc::Receiver<bytes::Bytes>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    futures::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Some(b) => Some((Ok(b), rx)),
            None => {
                tokio::task::yield_now().await;
                None
            }
        }
    })
}

/// Serve `router` on a unix socket (owner-only).
pub async fn serve_unix(router: Router, path: std::path::PathBuf) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    conn::serve(listener, router, "API socket", conn::LOCAL).await;
    Ok(())
}
