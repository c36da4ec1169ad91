//! The agent's servers (kubelet's pkg/kubelet/server). kubelet's read-only port, off unless
//! `readOnlyPort` is set, serves only what any local user may see: `/healthz` and `/pods` (a v1
//! PodList as kubelet returns it). The CLI's unix socket (owner-only) also serves
//! `/containerLogs/{namespace}/{pod}/{container}` and the `/ferrolet/...` extras (pods with
//! manifest errors, logs with a default container) and the stats endpoints
//! ([`crate::stats::routes`]). The exec socket is [`exec`].

mod conn;
pub mod exec;
mod healthz;

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
    /// The stats cache (/stats/summary, /metrics/resource, /metrics/cadvisor).
    pub stats: Arc<Stats>,
}

impl State {
    pub fn new(
        rt: Arc<Runtime>,
        pods: Arc<PodManager>,
        node_name: String,
        liveness: Arc<Liveness>,
        stats: Arc<Stats>,
    ) -> Arc<State> {
        Arc::new(State {
            rt,
            pods,
            node_name,
            liveness,
            stats,
        })
    }
}

/// Start every server the configuration asks for: the CLI socket (every endpoint, owner-only)
/// and the exec socket always; kubelet's read-only endpoints on `address:readOnlyPort` when it
/// is set (kubelet's default, 0, is off; a port that cannot be bound stops the agent). Each
/// runs in the background and is restarted if it panics.
pub async fn serve_all(cfg: &Config, state: Arc<State>) -> anyhow::Result<()> {
    {
        let (app, path) = (local_router(state.clone()), cfg.socket_path());
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
    if cfg.enable_server && cfg.read_only_port != 0 {
        let addr = std::net::SocketAddr::new(cfg.address, cfg.read_only_port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the HTTP API on {addr}"))?;
        info!(%addr, "HTTP API listening");
        tokio::spawn(conn::serve(listener, read_only_router(state)));
    }
    Ok(())
}

/// kubelet's read-only endpoints, unauthenticated: what any local user may see.
pub fn read_only_router(state: Arc<State>) -> Router {
    Router::new()
        .route("/healthz", get(healthz::all))
        .route("/healthz/{check}", get(healthz::one))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .with_state(state)
}

/// Everything, for the CLI's socket (owner-only): also container logs and the manifest errors.
pub fn local_router(state: Arc<State>) -> Router {
    read_only_router(state.clone()).merge(
        Router::new()
            .route("/containerLogs/{namespace}/{pod}/{container}", get(container_logs))
            .route("/ferrolet/pods", get(ferrolet_pods))
            .route("/ferrolet/logs/{namespace}/{pod}", get(ferrolet_logs))
            .merge(crate::stats::routes())
            .with_state(state),
    )
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
            p.status = Some(e.status);
            serde_json::json!({"pod": p, "terminating": e.terminating})
        }).collect::<Vec<_>>(),
        "manifestErrors": st.pods.source_errors(),
    });
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
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
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    ([(header::CONTENT_TYPE, "text/plain")], Body::from_stream(stream)).into_response()
}

/// Serve `router` on a unix socket (owner-only).
pub async fn serve_unix(router: Router, path: std::path::PathBuf) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    conn::serve(listener, router).await;
    Ok(())
}
