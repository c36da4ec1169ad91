//! Probes (kubelet's prober and probe workers): one task per probe of each running container.
//! Results count against successThreshold / failureThreshold before they change; readiness
//! starts failed, liveness and startup start succeeded; nothing but the startup probe runs
//! until the startup probe has succeeded; initialDelaySeconds counts from the container's
//! start. A failed liveness or startup probe asks the pod worker to restart the container; the
//! probe then waits for the next container. Every failed attempt is logged as kubelet's event
//! message ("Liveness probe failed: ...").

pub mod run;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ferrolet_runtime::Runtime;
use k8s_openapi::api::core::v1::{Container, Probe};
use tracing::{info, warn};

use crate::netns::PodTarget;
use run::Outcome;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Startup,
    Liveness,
    Readiness,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Startup => "Startup",
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
        }
    }
}

/// A probe's reported result changed.
#[derive(Debug, Clone)]
pub struct ProbeEvent {
    pub container_id: String,
    pub container: String,
    pub kind: Kind,
    pub success: bool,
}

fn probe_of(c: &Container, k: Kind) -> Option<&Probe> {
    match k {
        Kind::Startup => c.startup_probe.as_ref(),
        Kind::Liveness => c.liveness_probe.as_ref(),
        Kind::Readiness => c.readiness_probe.as_ref(),
    }
}

/// A running container the probes look at.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub id: String,
    pub started_at: DateTime<Utc>,
    pub spec: Container,
}

/// Probe state of one pod.
#[derive(Default)]
pub struct Probes {
    tasks: HashMap<(String, Kind), tokio::task::JoinHandle<()>>,
    /// Readiness of container ids with a readiness probe.
    ready: HashMap<String, bool>,
    /// Container ids whose startup probe has succeeded.
    started: BTreeSet<String>,
    /// Container ids a liveness or startup probe wants restarted: reason.
    failed: HashMap<String, String>,
    /// The shared "started" gate for each container's liveness/readiness tasks.
    gates: HashMap<String, tokio::sync::watch::Sender<bool>>,
    /// Kinds stopped for good (a terminating pod runs no liveness or startup probe).
    stopped: Vec<Kind>,
}

impl Probes {
    /// Start probe tasks for `running` containers that have none; stop those of containers no
    /// longer running.
    pub fn sync<F>(&mut self, rt: &Arc<Runtime>, pod_name: &str, target: &PodTarget, running: &[Target], send: F)
    where
        F: Fn(ProbeEvent) + Clone + Send + Sync + 'static,
    {
        let live: BTreeSet<&str> = running.iter().map(|r| r.id.as_str()).collect();
        self.tasks.retain(|(id, _), h| {
            let keep = live.contains(id.as_str());
            if !keep {
                h.abort();
            }
            keep
        });
        self.ready.retain(|id, _| live.contains(id.as_str()));
        self.started.retain(|id| live.contains(id.as_str()));
        self.failed.retain(|id, _| live.contains(id.as_str()));
        self.gates.retain(|id, _| live.contains(id.as_str()));
        for r in running {
            let has_startup = r.spec.startup_probe.is_some();
            let gate = self
                .gates
                .entry(r.id.clone())
                .or_insert_with(|| tokio::sync::watch::channel(!has_startup).0)
                .clone();
            for k in [Kind::Startup, Kind::Liveness, Kind::Readiness] {
                let Some(probe) = probe_of(&r.spec, k).cloned() else {
                    continue;
                };
                if self.stopped.contains(&k) || self.tasks.contains_key(&(r.id.clone(), k)) {
                    continue;
                }
                let w = ProbeWorker {
                    rt: rt.clone(),
                    kind: k,
                    probe,
                    container: r.clone(),
                    pod: pod_name.to_string(),
                    target: target.clone(),
                    gate: gate.subscribe(),
                };
                let send = send.clone();
                self.tasks.insert((r.id.clone(), k), tokio::spawn(w.run(send)));
            }
        }
    }

    /// Apply a result; true when something the pod status or sync depends on changed.
    /// `kill_reason` says why a failed liveness/startup probe kills the container.
    pub fn apply(&mut self, ev: &ProbeEvent, kill_reason: String) -> bool {
        match ev.kind {
            Kind::Readiness => self.ready.insert(ev.container_id.clone(), ev.success) != Some(ev.success),
            Kind::Startup if ev.success => {
                if let Some(g) = self.gates.get(&ev.container_id) {
                    let _ = g.send(true);
                }
                self.started.insert(ev.container_id.clone())
            }
            Kind::Startup | Kind::Liveness => {
                if ev.success {
                    return self.failed.remove(&ev.container_id).is_some();
                }
                self.failed.insert(ev.container_id.clone(), kill_reason);
                true
            }
        }
    }

    /// name -> ready, for running containers with a readiness probe.
    pub fn readiness(&self, running: &[Target]) -> BTreeMap<String, bool> {
        running
            .iter()
            .filter(|r| r.spec.readiness_probe.is_some())
            .map(|r| (r.name.clone(), self.ready.get(&r.id).copied().unwrap_or(false)))
            .collect()
    }

    /// Running containers whose startup probe has not succeeded yet.
    pub fn startup_pending(&self, running: &[Target]) -> BTreeSet<String> {
        running
            .iter()
            .filter(|r| r.spec.startup_probe.is_some() && !self.started.contains(&r.id))
            .map(|r| r.name.clone())
            .collect()
    }

    /// Running containers to restart: name -> reason.
    pub fn unhealthy(&self, running: &[Target]) -> BTreeMap<String, String> {
        running
            .iter()
            .filter_map(|r| self.failed.get(&r.id).map(|m| (r.name.clone(), m.clone())))
            .collect()
    }

    /// Stop the probes of these kinds for good (pod termination).
    pub fn stop_kinds(&mut self, kinds: &[Kind]) {
        self.tasks.retain(|(_, k), h| {
            let stop = kinds.contains(k);
            if stop {
                h.abort();
            }
            !stop
        });
        self.stopped.extend(kinds.iter().copied());
    }

    pub fn stop_all(&mut self) {
        for (_, h) in self.tasks.drain() {
            h.abort();
        }
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        self.stop_all();
    }
}

struct ProbeWorker {
    rt: Arc<Runtime>,
    kind: Kind,
    probe: Probe,
    container: Target,
    pod: String,
    target: PodTarget,
    /// True once the startup probe succeeded (or there is none).
    gate: tokio::sync::watch::Receiver<bool>,
}

impl ProbeWorker {
    async fn run<F: Fn(ProbeEvent)>(mut self, send: F) {
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
            let outcome = self.attempt(timeout).await;
            let ok = outcome.ok();
            match &outcome {
                Outcome::Failure(msg) => {
                    warn!(pod = %self.pod, container = %self.container.name, reason = "Unhealthy", "{} probe failed: {}", self.kind.name(), msg.trim_end());
                }
                Outcome::Success(w) if !w.is_empty() => {
                    info!(pod = %self.pod, container = %self.container.name, reason = "ProbeWarning", "{} probe warning: {w}", self.kind.name());
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

    async fn attempt(&self, timeout: Duration) -> Outcome {
        let p = &self.probe;
        let c = &self.container.spec;
        if let Some(e) = &p.exec {
            run::exec(&self.rt, &self.container.id, e, c, timeout).await
        } else if let Some(h) = &p.http_get {
            run::http(h, c, &self.target, timeout).await
        } else if let Some(t) = &p.tcp_socket {
            run::tcp(t, c, &self.target, timeout).await
        } else if let Some(g) = &p.grpc {
            run::grpc(g, &self.target, timeout).await
        } else {
            Outcome::Failure("probe has no handler".into())
        }
    }
}
