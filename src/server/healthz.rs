//! `/healthz` as kubelet serves it: named checks (`ping`, `syncloop`, and ferrolet's
//! `podworkers`), each also at `/healthz/<name>`. Plain `ok` when all pass; otherwise status 500
//! with one `[+]`/`[-]` line per check and the reasons withheld from the response (they are
//! logged), as kubelet's healthz handler does; `?verbose` lists the checks when all pass too.
//!
//! In a cluster `?verbose` also says how current the node's view of the API server is
//! (`[+]apiserver-view fresh`, or `stale since ...` while the node runs on its checkpoint):
//! a node that runs its pods without the server is healthy, so it never fails the check.

use std::sync::Arc;

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tracing::warn;

use super::State;
use crate::tasks::{POD_WORKER, SYNC_LOOP};

/// The checks, in the order they are reported.
const CHECKS: [&str; 3] = ["ping", "syncloop", "podworkers"];

fn check(st: &State, name: &str) -> Vec<String> {
    match name {
        "syncloop" => st.liveness.failures_of(SYNC_LOOP),
        "podworkers" => st.liveness.failures_of(POD_WORKER),
        _ => Vec::new(),
    }
}

#[derive(serde::Deserialize, Default)]
pub struct Params {
    verbose: Option<String>,
}

pub async fn all(axum::extract::State(st): axum::extract::State<Arc<State>>, Query(q): Query<Params>) -> Response {
    let mut lines = String::new();
    let mut failed = false;
    for name in CHECKS {
        let failures = check(&st, name);
        if failures.is_empty() {
            lines.push_str(&format!("[+]{name} ok\n"));
        } else {
            failed = true;
            for f in &failures {
                warn!(check = name, "healthz check failed: {f}");
            }
            lines.push_str(&format!("[-]{name} failed: reason withheld\n"));
        }
    }
    if failed {
        lines.push_str("healthz check failed\n");
        return (StatusCode::INTERNAL_SERVER_ERROR, lines).into_response();
    }
    if q.verbose.is_some() {
        if let Some(cp) = &st.checkpoint {
            lines.push_str(&format!("[+]apiserver-view {}\n", cp.view().describe()));
        }
        lines.push_str("healthz check passed\n");
        return lines.into_response();
    }
    "ok".into_response()
}

pub async fn one(axum::extract::State(st): axum::extract::State<Arc<State>>, Path(name): Path<String>) -> Response {
    if !CHECKS.contains(&name.as_str()) {
        return (StatusCode::NOT_FOUND, format!("no health check {name:?}\n")).into_response();
    }
    let failures = check(&st, &name);
    if failures.is_empty() {
        return "ok".into_response();
    }
    for f in &failures {
        warn!(check = %name, "healthz check failed: {f}");
    }
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal server error: reason withheld\n",
    )
        .into_response()
}
