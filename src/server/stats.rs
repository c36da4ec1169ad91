//! The stats endpoints: `/stats/summary` (and `?only_cpu_and_memory=true`), `/metrics/resource`
//! and `/metrics/cadvisor`, all served from the sampler's latest snapshot.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State as AxState};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::State;
use crate::stats::{Snapshot, View};

/// The Prometheus text format's content type.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The stats routes, for every listener that serves them (the CLI socket, kubelet's port).
pub fn routes() -> Router<Arc<State>> {
    Router::new()
        .route("/stats/summary", get(summary))
        .route("/metrics/resource", get(resource))
        .route("/metrics/cadvisor", get(cadvisor))
}

/// The latest snapshot; before the sampler's first round, one taken now.
async fn snapshot(st: &State) -> Result<Arc<Snapshot>, Response> {
    if let Some(s) = st.stats.latest() {
        return Ok(s);
    }
    let stats = st.stats.clone();
    crate::tasks::blocking(move || Ok(stats.sample_now()))
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")).into_response())
}

async fn summary(AxState(st): AxState<Arc<State>>, Query(q): Query<HashMap<String, String>>) -> Response {
    let snap = match snapshot(&st).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    // kubelet takes only the exact value "true".
    let view = match q.get("only_cpu_and_memory").map(String::as_str) {
        Some("true") => View::CpuAndMemory,
        _ => View::Summary,
    };
    ([(header::CONTENT_TYPE, "application/json")], snap.render(view)).into_response()
}

async fn resource(AxState(st): AxState<Arc<State>>) -> Response {
    prometheus(&st, View::ResourceMetrics).await
}

async fn cadvisor(AxState(st): AxState<Arc<State>>) -> Response {
    prometheus(&st, View::Cadvisor).await
}

async fn prometheus(st: &State, view: View) -> Response {
    match snapshot(st).await {
        Ok(s) => ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], s.render(view)).into_response(),
        Err(r) => r,
    }
}
