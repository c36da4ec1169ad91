//! What the API server is told about the pods (kubelet's status manager syncPod / syncBatch):
//! each pod's latest status is written to its `status` subresource when it differs from what was
//! last written, and a pod whose deletion was requested is deleted once the node has finished
//! with it (grace period 0, UID precondition), as kubelet does.
//!
//! Writes never block a pod worker: they queue here, the latest status of a pod replacing an
//! unsent one, and a background task sends them, retrying with a capped back-off while the API
//! server is away, so the statuses converge within seconds of its return. A pod that is gone
//! from the API server (404, or another pod of the same name: the UID precondition's 409) is
//! forgotten. A terminal phase is never followed by a running one.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::kubeclient::Kube;
use crate::pod::{self, Phase};

/// The API object a status belongs to: for a static pod, its mirror pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl ApiPod {
    pub fn of(p: &Pod) -> ApiPod {
        ApiPod {
            namespace: pod::namespace(p).to_string(),
            name: pod::name(p).to_string(),
            uid: pod::uid(p).to_string(),
        }
    }
}

enum Request {
    Status(ApiPod, Box<PodStatus>),
    /// The node is done with the pod: write its last status, then delete it.
    Delete(ApiPod),
}

/// The queue towards the API server; cheap to clone.
#[derive(Clone)]
pub struct ApiStatusWriter {
    tx: mpsc::UnboundedSender<Request>,
}

impl ApiStatusWriter {
    /// Start the writer's task.
    pub fn start(kube: Kube) -> ApiStatusWriter {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(kube, rx));
        ApiStatusWriter { tx }
    }

    /// The pod's latest status.
    pub fn status(&self, to: ApiPod, status: PodStatus) {
        let _ = self.tx.send(Request::Status(to, Box::new(status)));
    }

    /// Delete the pod (after its last status) with grace period 0 and its UID as precondition.
    pub fn delete(&self, to: ApiPod) {
        let _ = self.tx.send(Request::Delete(to));
    }
}

/// One pod's state in the writer.
struct Entry {
    to: ApiPod,
    /// The status to write, when it differs from the last written.
    pending: Option<PodStatus>,
    written: Option<PodStatus>,
    /// The status of the write in flight, if one is.
    sending: Option<PodStatus>,
    /// A write for the pod is in flight (its status, or its deletion).
    in_flight: bool,
    delete: bool,
    /// When `pending` was last set, in arrival order: older statuses go first.
    seq: u64,
}

impl Entry {
    fn has_work(&self) -> bool {
        !self.in_flight && (self.pending.is_some() || self.delete)
    }

    /// Which goes first: a deletion or a terminal phase, then a pod turned Running, then the
    /// rest (a pod's first Pending status); older before newer. A Pending status still waiting
    /// when its Running one comes is replaced and never sent, so a burst of pods costs the
    /// API server fewer writes and its pods show Running sooner.
    fn rank(&self) -> (u8, u64) {
        let class = match self.pending.as_ref().and_then(Phase::of) {
            _ if self.delete => 0,
            Some(p) if p.is_terminal() => 0,
            Some(Phase::Running) => 1,
            _ => 2,
        };
        (class, self.seq)
    }
}

/// The pod to write next (by [`Entry::rank`]) and its job; its entry marked in flight.
fn next_job(pods: &mut BTreeMap<String, Entry>) -> Option<(String, Job)> {
    let (uid, e) = pods
        .iter_mut()
        .filter(|(_, e)| e.has_work())
        .min_by_key(|(_, e)| e.rank())?;
    e.in_flight = true;
    e.sending = e.pending.take();
    let job = Job {
        to: e.to.clone(),
        status: e.sending.clone(),
        delete: e.delete,
        was_running: e.written.as_ref().and_then(Phase::of) == Some(Phase::Running),
    };
    Some((uid.clone(), job))
}

impl Entry {
    /// The write in flight ended; `status_written` if its status reached the API server.
    fn landed(&mut self, status_written: bool) {
        self.in_flight = false;
        let sent = self.sending.take();
        if status_written && sent.is_some() {
            self.written = sent;
            if self.pending == self.written {
                self.pending = None;
            }
        } else if self.pending.is_none() {
            // Not written: it is still to be sent unless a newer one replaced it.
            self.pending = sent;
        }
    }
}

/// Longest wait between attempts while the API server fails: the status converges within this
/// of its return.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Pods whose statuses are written at once. kubelet writes one at a time; a burst of pods
/// started together then waits on the round trips one after another (50 pods, two writes
/// each, 20-30 ms apiece on a small control plane: seconds). The kubeAPIQPS limit still holds.
const IN_FLIGHT: usize = 8;

/// One write: what is sent for a pod.
struct Job {
    to: ApiPod,
    status: Option<PodStatus>,
    delete: bool,
    /// The pod's last written status was Running (for the start phase of the first one).
    was_running: bool,
}

async fn run(kube: Kube, mut rx: mpsc::UnboundedReceiver<Request>) {
    let mut pods: BTreeMap<String, Entry> = BTreeMap::new();
    let mut seq = 0u64;
    let mut writes = futures::stream::FuturesUnordered::new();
    let mut retry = Duration::from_millis(200);
    // While the API server fails: no new writes until then.
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut failing = false;
    let mut last_error: Option<String> = None;
    loop {
        if retry_at.is_none() {
            while writes.len() < IN_FLIGHT {
                let Some((uid, job)) = next_job(&mut pods) else { break };
                let client = kube.client();
                writes.push(async move {
                    let outcome = write(&client, &job).await;
                    (uid, outcome)
                });
            }
        }
        tokio::select! {
            r = rx.recv() => {
                let Some(r) = r else { return };
                take(&mut pods, r, &mut seq);
                while let Ok(r) = rx.try_recv() {
                    take(&mut pods, r, &mut seq);
                }
            }
            Some((uid, outcome)) = writes.next(), if !writes.is_empty() => {
                let Some(e) = pods.get_mut(&uid) else { continue };
                e.landed(match &outcome {
                    Outcome::Done | Outcome::Deleted => true,
                    Outcome::Failed { status_written, .. } => *status_written,
                    Outcome::Gone => false,
                });
                match outcome {
                    Outcome::Done => {
                        if failing {
                            info!("pod statuses written to the API server again");
                            failing = false;
                            last_error = None;
                            retry = Duration::from_millis(200);
                        }
                    }
                    Outcome::Gone => {
                        debug!(pod = %format!("{}/{}", e.to.namespace, e.to.name), "the pod is gone from the API server");
                        pods.remove(&uid);
                    }
                    Outcome::Deleted => {
                        pods.remove(&uid);
                    }
                    Outcome::Failed { error, .. } => {
                        // Said once per failure, and again when the failure is another.
                        if !failing || last_error.as_deref() != Some(error.as_str()) {
                            warn!(pod = %format!("{}/{}", e.to.namespace, e.to.name), error = %error, "writing the pod's status to the API server; will retry");
                        }
                        last_error = Some(error);
                        // The rest would fail the same way: wait, then retry them all. The
                        // writes already in flight end as they will.
                        if retry_at.is_none() {
                            if failing {
                                retry = (retry * 2).min(MAX_RETRY);
                            }
                            retry_at = Some(tokio::time::Instant::now() + retry);
                        }
                        failing = true;
                    }
                }
            }
            _ = tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)), if retry_at.is_some() => {
                retry_at = None;
            }
        }
    }
}

fn take(pods: &mut BTreeMap<String, Entry>, r: Request, seq: &mut u64) {
    let (to, status, delete) = match r {
        Request::Status(to, s) => (to, Some(*s), false),
        Request::Delete(to) => (to, None, true),
    };
    let e = pods.entry(to.uid.clone()).or_insert_with(|| Entry {
        to: to.clone(),
        pending: None,
        written: None,
        sending: None,
        in_flight: false,
        delete: false,
        seq: 0,
    });
    e.to = to;
    e.delete |= delete;
    if let Some(s) = status {
        // While a write is in flight the server will have its status, or still the written
        // one if it fails: a status is dropped as written only when no write is in flight.
        let latest = e.pending.as_ref().or(e.sending.as_ref()).or(e.written.as_ref());
        if e.sending.is_none() && e.written.as_ref() == Some(&s) {
            e.pending = None;
        } else if goes_back(latest, &s) {
            warn!(pod = %format!("{}/{}", e.to.namespace, e.to.name), "not writing a non-terminal phase after a terminal one");
        } else if e.pending.as_ref() != Some(&s) {
            *seq += 1;
            e.seq = *seq;
            e.pending = Some(s);
        }
    }
}

/// The status as a strategic merge patch. Conditions are merged by type, so a field the new
/// condition lacks would keep the old one's value (a Ready condition turned True kept
/// "ContainersNotReady" as its reason): each condition's reason and message are written, as
/// null when absent, which deletes them, as kubelet's two-way patch does.
///
/// `podIPs` is merged by `ip`: the IPs in `stale_ips` (the API server's that the pod no longer
/// has) are deleted, as kubelet's two-way patch deletes them.
fn status_patch(status: &PodStatus, stale_ips: &[String]) -> serde_json::Value {
    let mut v = serde_json::to_value(status).unwrap_or_default();
    if let Some(ips) = v.get_mut("podIPs").and_then(|c| c.as_array_mut()) {
        for ip in stale_ips {
            ips.push(serde_json::json!({"ip": ip, "$patch": "delete"}));
        }
    }
    if let Some(conds) = v.get_mut("conditions").and_then(|c| c.as_array_mut()) {
        for c in conds.iter_mut().filter_map(|c| c.as_object_mut()) {
            for field in ["reason", "message"] {
                c.entry(field).or_insert(serde_json::Value::Null);
            }
        }
    }
    v
}

/// kubelet never moves a pod out of Succeeded or Failed.
fn goes_back(before: Option<&PodStatus>, next: &PodStatus) -> bool {
    let terminal = |s: &PodStatus| Phase::of(s).is_some_and(Phase::is_terminal);
    before.is_some_and(terminal) && !terminal(next)
}

enum Outcome {
    /// The status (if any) is written; nothing more to do for now.
    Done,
    /// The pod is not on the API server (any more), or it is another pod now.
    Gone,
    /// The status (if any) is written and the pod deleted.
    Deleted,
    Failed {
        error: String,
        /// The job's status was written (the deletion after it failed).
        status_written: bool,
    },
}

async fn write(client: &kube::Client, e: &Job) -> Outcome {
    let api: Api<Pod> = Api::namespaced(client.clone(), &e.to.namespace);
    if let Some(status) = &e.status {
        // The UID in the patch is a precondition: a new pod of the same name is never touched.
        let patch = |stale_ips: &[String]| {
            serde_json::json!({
                "metadata": {"uid": e.to.uid},
                "status": status_patch(status, stale_ips),
            })
        };
        let mut written = api
            .patch_status(&e.to.name, &PatchParams::default(), &Patch::Strategic(&patch(&[])))
            .await;
        // A pod whose sandbox was made anew (after a reboot) has a new IP, and the merge kept
        // the old one beside it, which the API server refuses ("may specify no more than one
        // IP for each IP family"): the IPs it has are read, and those that went deleted.
        if matches!(&written, Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("status.podIPs")) {
            written = match api.get(&e.to.name).await {
                Ok(now) => {
                    let mine: Vec<&str> = status.pod_ips.iter().flatten().map(|p| p.ip.as_str()).collect();
                    let stale: Vec<String> = now
                        .status
                        .and_then(|s| s.pod_ips)
                        .unwrap_or_default()
                        .into_iter()
                        .map(|p| p.ip)
                        .filter(|ip| !mine.contains(&ip.as_str()))
                        .collect();
                    api.patch_status(&e.to.name, &PatchParams::default(), &Patch::Strategic(&patch(&stale)))
                        .await
                }
                Err(err) => Err(err),
            };
        }
        match written {
            Ok(_) => {
                if !e.was_running && Phase::of(status) == Some(Phase::Running) {
                    crate::metrics::start_phase(&e.to.name, "running_written");
                }
            }
            Err(err) if is_gone(&err) => return Outcome::Gone,
            Err(err) => {
                return Outcome::Failed {
                    error: format!("{err:#}"),
                    status_written: false,
                }
            }
        }
    }
    if e.delete {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(e.to.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        return match api.delete(&e.to.name, &dp).await {
            Ok(_) => {
                info!(pod = %format!("{}/{}", e.to.namespace, e.to.name), "pod deleted from the API server");
                Outcome::Deleted
            }
            Err(err) if is_gone(&err) => Outcome::Gone,
            Err(err) => Outcome::Failed {
                error: format!("{err:#}"),
                status_written: e.status.is_some(),
            },
        };
    }
    Outcome::Done
}

/// 404, or the UID precondition failed (409): the pod we know is not there.
fn is_gone(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 404 || s.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(phase: &str) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        }
    }

    fn to() -> ApiPod {
        ApiPod {
            namespace: "default".into(),
            name: "p".into(),
            uid: "u".into(),
        }
    }

    #[test]
    fn the_latest_status_replaces_an_unsent_one() {
        let mut m = BTreeMap::new();
        take(&mut m, Request::Status(to(), Box::new(st("Pending"))), &mut 0);
        take(&mut m, Request::Status(to(), Box::new(st("Running"))), &mut 0);
        assert_eq!(m["u"].pending, Some(st("Running")));
    }

    #[test]
    fn a_written_status_is_not_written_again() {
        let mut m = BTreeMap::new();
        take(&mut m, Request::Status(to(), Box::new(st("Running"))), &mut 0);
        let e = m.get_mut("u").unwrap();
        e.written = e.pending.take();
        take(&mut m, Request::Status(to(), Box::new(st("Running"))), &mut 0);
        assert_eq!(m["u"].pending, None);
    }

    #[test]
    fn a_terminal_phase_is_never_followed_by_a_running_one() {
        let mut m = BTreeMap::new();
        take(&mut m, Request::Status(to(), Box::new(st("Succeeded"))), &mut 0);
        take(&mut m, Request::Status(to(), Box::new(st("Running"))), &mut 0);
        assert_eq!(m["u"].pending, Some(st("Succeeded")));
        let e = m.get_mut("u").unwrap();
        e.written = e.pending.take();
        take(&mut m, Request::Status(to(), Box::new(st("Pending"))), &mut 0);
        assert_eq!(m["u"].pending, None);
        take(&mut m, Request::Status(to(), Box::new(st("Failed"))), &mut 0);
        assert_eq!(m["u"].pending, Some(st("Failed")));
    }

    #[test]
    fn the_patch_deletes_a_condition_reason_and_message_that_went() {
        let mut s = st("Running");
        s.conditions = Some(vec![
            k8s_openapi::api::core::v1::PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            },
            k8s_openapi::api::core::v1::PodCondition {
                type_: "Initialized".into(),
                status: "False".into(),
                reason: Some("ContainersNotInitialized".into()),
                ..Default::default()
            },
        ]);
        let p = status_patch(&s, &[]);
        assert_eq!(p["conditions"][0]["reason"], serde_json::Value::Null);
        assert!(p["conditions"][0].as_object().unwrap().contains_key("message"));
        assert_eq!(p["conditions"][1]["reason"], "ContainersNotInitialized");
        assert_eq!(p["phase"], "Running");
    }

    #[test]
    fn the_patch_deletes_pod_ips_that_went() {
        let mut s = st("Running");
        s.pod_ips = Some(vec![k8s_openapi::api::core::v1::PodIP { ip: "10.0.0.9".into() }]);
        assert_eq!(status_patch(&s, &[])["podIPs"], serde_json::json!([{"ip": "10.0.0.9"}]));
        let p = status_patch(&s, &["10.0.0.4".into()]);
        assert_eq!(
            p["podIPs"],
            serde_json::json!([{"ip": "10.0.0.9"}, {"ip": "10.0.0.4", "$patch": "delete"}])
        );
    }

    #[test]
    fn running_and_deletions_are_written_before_a_first_pending_status() {
        let mut m = BTreeMap::new();
        let mut seq = 0;
        let pod = |uid: &str| ApiPod {
            namespace: "default".into(),
            name: uid.into(),
            uid: uid.into(),
        };
        take(&mut m, Request::Status(pod("a"), Box::new(st("Pending"))), &mut seq);
        take(&mut m, Request::Status(pod("b"), Box::new(st("Pending"))), &mut seq);
        take(&mut m, Request::Status(pod("c"), Box::new(st("Running"))), &mut seq);
        take(&mut m, Request::Delete(pod("d")), &mut seq);
        let order: Vec<String> = std::iter::from_fn(|| next_job(&mut m).map(|(uid, _)| uid)).collect();
        assert_eq!(order, ["d", "c", "a", "b"]);
        // Each is in flight once: nothing more to pick.
        assert!(next_job(&mut m).is_none());
    }

    #[test]
    fn a_status_that_came_during_a_write_is_sent_after_it() {
        let mut m = BTreeMap::new();
        take(&mut m, Request::Status(to(), Box::new(st("Pending"))), &mut 0);
        let e = m.get_mut("u").unwrap();
        e.written = e.pending.take();
        // Running goes out; meanwhile the pod is Pending again (as the server has it now).
        take(&mut m, Request::Status(to(), Box::new(st("Running"))), &mut 0);
        let (_, job) = next_job(&mut m).unwrap();
        assert_eq!(job.status, Some(st("Running")));
        take(&mut m, Request::Status(to(), Box::new(st("Pending"))), &mut 0);
        m.get_mut("u").unwrap().landed(true);
        assert_eq!(m["u"].written, Some(st("Running")));
        assert_eq!(m["u"].pending, Some(st("Pending")));
    }

    #[test]
    fn a_failed_write_is_sent_again_unless_a_newer_status_came() {
        let mut m = BTreeMap::new();
        take(&mut m, Request::Status(to(), Box::new(st("Pending"))), &mut 0);
        next_job(&mut m).unwrap();
        m.get_mut("u").unwrap().landed(false);
        assert_eq!(m["u"].pending, Some(st("Pending")));
        assert_eq!(m["u"].written, None);
        next_job(&mut m).unwrap();
        take(&mut m, Request::Status(to(), Box::new(st("Running"))), &mut 0);
        m.get_mut("u").unwrap().landed(false);
        assert_eq!(m["u"].pending, Some(st("Running")));
    }

    #[test]
    fn deletion_is_kept_with_the_last_status() {
        let mut m = BTreeMap::new();
        take(&mut m, Request::Status(to(), Box::new(st("Running"))), &mut 0);
        take(&mut m, Request::Delete(to()), &mut 0);
        assert!(m["u"].delete);
        assert_eq!(m["u"].pending, Some(st("Running")));
    }
}
