//! Probes (kubelet's prober and probe workers): one task per probe of each running container.
//! Results count against successThreshold / failureThreshold before they change; readiness
//! starts failed, liveness and startup start succeeded; nothing but the startup probe runs
//! until the startup probe has succeeded; initialDelaySeconds counts from the container's
//! start. A failed liveness or startup probe asks the pod worker to restart the container; the
//! probe then waits for the next container. Every failed attempt is logged as kubelet's event
//! message ("Liveness probe failed: ...").

mod worker;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use ferrolet_runtime::Runtime;
use k8s_openapi::api::core::v1::{Container, Pod, Probe};

use crate::probe::netns::PodTarget;
use worker::ProbeWorker;

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

pub(crate) fn probe_of(c: &Container, k: Kind) -> Option<&Probe> {
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
    pub fn sync<F>(&mut self, rt: &Arc<Runtime>, pod: &Pod, target: &PodTarget, running: &[Target], send: F)
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
                    pod: worker::PodId::of(pod),
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
