//! `/metrics` and `/metrics/probes` (kubelet's own metrics, [`crate::metrics`]), and the
//! instrumentation of every HTTP request the kubelet API serves (kubelet_http_requests_*).

use std::sync::Arc;

use axum::extract::{Request, State as AxState};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use k8s_openapi::api::core::v1::ContainerStatus;

use super::State;
use crate::metrics::{self, HttpRequest, PodCounts};
use crate::pod;
use crate::pod::manager::PodEntry;

/// `/metrics` and `/metrics/probes`.
pub fn routes() -> Router<Arc<State>> {
    Router::new()
        .route("/metrics", get(kubelet_metrics))
        .route("/metrics/probes", get(probe_metrics))
}

async fn kubelet_metrics(AxState(st): AxState<Arc<State>>) -> Response {
    let counts = pod_counts(&st.pods.entries(), st.mirrors_enabled);
    let body = metrics::global().encode(&st.node_name, &counts);
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], body).into_response()
}

async fn probe_metrics() -> Response {
    let body = metrics::global().encode_probes();
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], body).into_response()
}

/// The state gauges, from the pod table: pods with a running container; containers by state
/// (an exited one is a terminated current or kept previous attempt); pods by source.
pub fn pod_counts(entries: &[PodEntry], mirrors: bool) -> PodCounts {
    let mut c = PodCounts::default();
    for e in entries {
        let statics = pod::is_static(&e.pod);
        if !e.terminating {
            if statics {
                c.desired_static += 1;
                if mirrors {
                    c.mirror_pods += 1;
                }
            } else {
                c.desired_api += 1;
            }
        }
        let st = &e.status;
        let all = st
            .container_statuses
            .iter()
            .flatten()
            .chain(st.init_container_statuses.iter().flatten())
            .chain(st.ephemeral_container_statuses.iter().flatten());
        let mut running = false;
        for cs in all {
            let (r, exited) = container_states(cs);
            running |= r;
            if r {
                c.containers_running += 1;
            }
            c.containers_exited += exited;
        }
        if running {
            c.running_pods += 1;
        }
    }
    c
}

/// Whether the container's current attempt runs, and how many dead attempts it has on the node
/// (the current one if it ended, the previous one kept for `logs --previous`).
fn container_states(cs: &ContainerStatus) -> (bool, i64) {
    let state = cs.state.as_ref();
    let running = state.is_some_and(|s| s.running.is_some());
    let mut exited = i64::from(state.is_some_and(|s| s.terminated.is_some()));
    exited += i64::from(cs.last_state.as_ref().is_some_and(|s| s.terminated.is_some()));
    (running, exited)
}

/// Record each request (kubelet's server metrics): the path label is the route's first segment
/// ("pods", "stats", "exec"...), as kubelet labels it, so pod names never become label values.
/// The roots of the routes served, the only values the path label takes (kubelet's metric
/// buckets): anything else is "other", so requests for made-up paths cannot grow the registry.
const PATH_BUCKETS: [&str; 14] = [
    "healthz",
    "pods",
    "runningpods",
    "configz",
    "spec",
    "logs",
    "containerLogs",
    "stats",
    "metrics",
    "exec",
    "attach",
    "portForward",
    "run",
    "ferrolet",
];

/// The path label of a request: its route's root, `metrics/<x>` for the metrics endpoints.
fn path_bucket(path: &str) -> &'static str {
    let mut parts = path.trim_start_matches('/').split('/');
    let root = parts.next().unwrap_or("");
    if root == "metrics" {
        return match parts.next() {
            Some("cadvisor") => "metrics/cadvisor",
            Some("probes") => "metrics/probes",
            Some("resource") => "metrics/resource",
            _ => "metrics",
        };
    }
    PATH_BUCKETS.iter().find(|b| **b == root).copied().unwrap_or("other")
}

/// The method label: the standard methods, else "other" (kubelet's method buckets).
fn method_bucket(m: &axum::http::Method) -> &'static str {
    const KNOWN: [&str; 9] = [
        "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "TRACE",
    ];
    KNOWN.iter().find(|k| **k == m.as_str()).copied().unwrap_or("other")
}

pub async fn instrument(server_type: &'static str, req: Request, next: Next) -> Response {
    let first = path_bucket(req.uri().path());
    let long_running = matches!(first, "exec" | "attach" | "portForward" | "run")
        || req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "follow=true" || kv == "follow=1"));
    let _timer = metrics::global().http_request(HttpRequest {
        method: method_bucket(req.method()).to_string(),
        path: first.to_string(),
        server_type: server_type.to_string(),
        long_running: long_running.to_string(),
    });
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStateTerminated, Pod, PodStatus};

    fn entry(name: &str, statics: bool, statuses: Vec<ContainerStatus>) -> PodEntry {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name,
                         "annotations": {"kubernetes.io/config.source": if statics {"file"} else {"api"}}},
        }))
        .unwrap();
        p.spec = Some(Default::default());
        PodEntry {
            pod: Arc::new(p),
            status: Arc::new(PodStatus {
                container_statuses: Some(statuses),
                ..Default::default()
            }),
            terminating: false,
        }
    }

    fn cs(running: bool, previous: bool) -> ContainerStatus {
        let terminated = || ContainerState {
            terminated: Some(ContainerStateTerminated::default()),
            ..Default::default()
        };
        ContainerStatus {
            state: Some(if running {
                ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..Default::default()
                }
            } else {
                terminated()
            }),
            last_state: previous.then(terminated),
            ..Default::default()
        }
    }

    #[test]
    fn request_labels_take_only_known_values() {
        assert_eq!(path_bucket("/pods"), "pods");
        assert_eq!(path_bucket("/exec/ns/pod/c"), "exec");
        assert_eq!(path_bucket("/metrics"), "metrics");
        assert_eq!(path_bucket("/metrics/resource"), "metrics/resource");
        assert_eq!(path_bucket("/metrics/nonsense"), "metrics");
        assert_eq!(path_bucket("/x8f2a9"), "other");
        assert_eq!(path_bucket("/"), "other");
        let odd = axum::http::Method::from_bytes(b"FOO").unwrap();
        assert_eq!(method_bucket(&odd), "other");
        assert_eq!(method_bucket(&axum::http::Method::GET), "GET");
    }

    #[test]
    fn counts_pods_and_containers_by_state_and_source() {
        let entries = vec![
            entry("a", true, vec![cs(true, true), cs(false, false)]),
            entry("b", false, vec![cs(false, true)]),
        ];
        let c = pod_counts(&entries, true);
        assert_eq!(c.running_pods, 1);
        assert_eq!(c.containers_running, 1);
        assert_eq!(c.containers_exited, 4);
        assert_eq!((c.desired_static, c.desired_api, c.mirror_pods), (1, 1, 1));
        assert_eq!(pod_counts(&entries, false).mirror_pods, 0);
    }
}
