//! The agent's HTTP API, served on a loopback port (kubelet's read-only port) and on a unix
//! socket for the CLI: `/healthz`, `/pods` (a v1 PodList as kubelet returns it),
//! `/containerLogs/{namespace}/{pod}/{container}`, and `/ferrolet/...` extras the CLI uses
//! (pods with manifest errors, logs with a default container).

pub mod exec;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::mpsc;

use crate::logs::{self, LogOptions};
use crate::sync::Ctx;

pub fn router(ctx: Arc<Ctx>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .route("/containerLogs/{namespace}/{pod}/{container}", get(container_logs))
        .route("/ferrolet/pods", get(ferrolet_pods))
        .route("/ferrolet/logs/{namespace}/{pod}", get(ferrolet_logs))
        .with_state(ctx)
}

fn error(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, msg.into()).into_response()
}

async fn pods(State(ctx): State<Arc<Ctx>>) -> Response {
    let list = serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": ctx.pods.pods(),
    });
    ([(header::CONTENT_TYPE, "application/json")], list.to_string()).into_response()
}

async fn ferrolet_pods(State(ctx): State<Arc<Ctx>>) -> Response {
    let body = serde_json::json!({
        "node": ctx.node.name,
        "items": ctx.pods.entries().into_iter().map(|e| {
            let mut p = (*e.pod).clone();
            p.status = Some(e.status);
            serde_json::json!({"pod": p, "terminating": e.terminating})
        }).collect::<Vec<_>>(),
        "manifestErrors": ctx.pods.source_errors(),
    });
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

async fn container_logs(
    State(ctx): State<Arc<Ctx>>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(mut opts): Query<LogOptions>,
) -> Response {
    opts.container = Some(container);
    serve_logs(ctx, &namespace, &pod, opts).await
}

async fn ferrolet_logs(
    State(ctx): State<Arc<Ctx>>,
    Path((namespace, pod)): Path<(String, String)>,
    Query(opts): Query<LogOptions>,
) -> Response {
    serve_logs(ctx, &namespace, &pod, opts).await
}

async fn serve_logs(ctx: Arc<Ctx>, namespace: &str, pod: &str, opts: LogOptions) -> Response {
    let Some(entry) = ctx.pods.find(namespace, pod, &ctx.node.name) else {
        return error(StatusCode::NOT_FOUND, format!("pod {namespace}/{pod} not found"));
    };
    let name = match logs::container_name(&entry, opts.container.as_deref()) {
        Ok(n) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let (path, id) = match logs::locate(&ctx.rt, &entry, &name, opts.previous) {
        Ok(x) => x,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let (tx, rx) = mpsc::channel::<bytes::Bytes>(16);
    tokio::spawn(logs::stream(ctx.rt.clone(), path, id, opts, tx));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    ([(header::CONTENT_TYPE, "text/plain")], Body::from_stream(stream)).into_response()
}

/// Serve `router` on a unix socket (owner-only).
pub async fn serve_unix(router: Router, path: std::path::PathBuf) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(&path);
    let listener =
        tokio::net::UnixListener::bind(&path).map_err(|e| anyhow::anyhow!("binding {}: {e}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    axum::serve(listener, router)
        .await
        .map_err(|e| anyhow::anyhow!("unix API: {e}"))
}
