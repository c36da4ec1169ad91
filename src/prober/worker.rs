//! One probe of one container (kubelet's prober worker): waits for the startup gate and the
//! initial delay, runs every period, counts results against the thresholds, and reports a
//! change of the result to the pod worker.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use ferrolet_runtime::Runtime;
use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use tracing::{info, warn};

use super::{Kind, ProbeEvent, Target};
use crate::metrics::ProbeResult;
use crate::pod::expansion::expand_all;
use crate::pod::reasons;
use crate::pod::{self};
use crate::probe::netns::PodTarget;
use crate::probe::{self, Outcome};

pub(super) struct ProbeWorker {
    pub(super) rt: Arc<Runtime>,
    pub(super) kind: Kind,
    pub(super) probe: Probe,
    pub(super) container: Target,
    pub(super) pod: PodId,
    pub(super) target: PodTarget,
    /// True once the startup probe succeeded (or there is none).
    pub(super) gate: tokio::sync::watch::Receiver<bool>,
}

/// The pod a probe belongs to, for logs and the prober's metrics.
#[derive(Debug, Clone)]
pub(super) struct PodId {
    /// namespace/name, for logs.
    full_name: String,
    namespace: String,
    name: String,
    uid: String,
}

impl PodId {
    pub(super) fn of(p: &Pod) -> PodId {
        PodId {
            full_name: pod::full_name(p),
            namespace: pod::namespace(p).to_string(),
            name: pod::name(p).to_string(),
            uid: pod::uid(p).to_string(),
        }
    }
}

/// One probe's metric series (prober_probe_total, prober_probe_duration_seconds), removed when
/// the worker ends, also when its task is aborted, as kubelet's prober removes them.
struct Series {
    kind: Kind,
    container: String,
    pod: PodId,
}

impl Series {
    fn record(&self, outcome: &Outcome, took: Duration) {
        let result = if outcome.ok() { "successful" } else { "failed" };
        crate::metrics::global().probe(
            ProbeResult {
                probe_type: self.kind.name().into(),
                result: result.into(),
                container: self.container.clone(),
                pod: self.pod.name.clone(),
                namespace: self.pod.namespace.clone(),
                pod_uid: self.pod.uid.clone(),
            },
            took,
        );
    }
}

impl Drop for Series {
    fn drop(&mut self) {
        crate::metrics::global().forget_probe(
            self.kind.name(),
            &self.container,
            &self.pod.name,
            &self.pod.namespace,
            &self.pod.uid,
        );
    }
}

impl ProbeWorker {
    pub(super) async fn run<F: Fn(ProbeEvent)>(mut self, send: F) {
        let series = Series {
            kind: self.kind,
            container: self.container.name.clone(),
            pod: self.pod.clone(),
        };
        let p = &self.probe;
        let period = Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64);
        let timeout = Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64);
        let initial_delay = p.initial_delay_seconds.unwrap_or(0).max(0);
        let success_threshold = p.success_threshold.unwrap_or(1).max(1) as u32;
        let failure_threshold = p.failure_threshold.unwrap_or(3).max(1) as u32;
        let mut last: Option<bool> = None;
        let mut run_len = 0u32;
        // What the pod worker currently believes: readiness starts failed, liveness succeeded,
        // startup unknown (neither started nor failed).
        let mut reported: Option<bool> = match self.kind {
            Kind::Readiness => Some(false),
            Kind::Liveness => Some(true),
            Kind::Startup => None,
        };
        loop {
            if self.kind != Kind::Startup && !*self.gate.borrow() {
                // Liveness and readiness wait for the startup probe.
                if self.gate.changed().await.is_err() {
                    return;
                }
                continue;
            }
            let since_start = Utc::now() - self.container.started_at;
            if since_start.num_seconds() < initial_delay as i64 {
                let wait = chrono::Duration::seconds(initial_delay as i64) - since_start;
                tokio::time::sleep(wait.to_std().unwrap_or(Duration::ZERO)).await;
                continue;
            }
            let began = std::time::Instant::now();
            let outcome = self.attempt(timeout).await;
            series.record(&outcome, began.elapsed());
            let ok = outcome.ok();
            match &outcome {
                Outcome::Failure(msg) => {
                    warn!(pod = %self.pod.full_name, container = %self.container.name, reason = reasons::EVENT_UNHEALTHY, "{} probe failed: {}", self.kind.name(), msg.trim_end());
                }
                Outcome::Success(w) if !w.is_empty() => {
                    info!(pod = %self.pod.full_name, container = %self.container.name, reason = reasons::EVENT_PROBE_WARNING, "{} probe warning: {w}", self.kind.name());
                }
                _ => {}
            }
            run_len = if last == Some(ok) { run_len + 1 } else { 1 };
            last = Some(ok);
            let threshold = if ok { success_threshold } else { failure_threshold };
            if run_len >= threshold && reported != Some(ok) {
                reported = Some(ok);
                send(ProbeEvent {
                    container_id: self.container.id.clone(),
                    container: self.container.name.clone(),
                    kind: self.kind,
                    success: ok,
                });
                if self.kind == Kind::Startup && ok {
                    return; // startup probes stop once they succeed
                }
                if !ok && self.kind != Kind::Readiness {
                    return; // the container is restarted; its successor gets a new worker
                }
            }
            tokio::time::sleep(period).await;
        }
    }

    /// One attempt with the probe's handler (kubelet's prober.runProbe).
    async fn attempt(&self, timeout: Duration) -> Outcome {
        let p = &self.probe;
        let c = &self.container.spec;
        if let Some(e) = &p.exec {
            let cmd = expand_all(&e.command.clone().unwrap_or_default(), &static_env(c));
            probe::exec::probe(&self.rt, &self.container.id, &cmd, timeout).await
        } else if let Some(h) = &p.http_get {
            probe::http::probe(h, c, &self.target, timeout).await
        } else if let Some(t) = &p.tcp_socket {
            probe::tcp::probe(t, c, &self.target, timeout).await
        } else if let Some(g) = &p.grpc {
            probe::grpc::probe(g, &self.target, timeout).await
        } else {
            Outcome::Failure("probe has no handler".into())
        }
    }
}

/// `$(VAR)` in an exec probe's command is expanded with the container's static env entries
/// (those with a value, not valueFrom), as kubelet does.
fn static_env(c: &Container) -> Vec<(String, String)> {
    c.env
        .iter()
        .flatten()
        .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
        .collect()
}
