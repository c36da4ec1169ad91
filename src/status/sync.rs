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
    delete: bool,
}

/// Longest wait between attempts while the API server fails: the status converges within this
/// of its return.
const MAX_RETRY: Duration = Duration::from_secs(5);

async fn run(kube: Kube, mut rx: mpsc::UnboundedReceiver<Request>) {
    let mut pods: BTreeMap<String, Entry> = BTreeMap::new();
    let mut retry = Duration::from_millis(200);
    let mut failing = false;
    let mut last_error: Option<String> = None;
    loop {
        // Wait for work, or for the retry when something is left.
        let busy = pods.values().any(|e| e.pending.is_some() || e.delete);
        let req = if busy && failing {
            tokio::select! {
                r = rx.recv() => r.map(Some),
                _ = tokio::time::sleep(retry) => Some(None),
            }
        } else if busy {
            Some(rx.try_recv().ok())
        } else {
            rx.recv().await.map(Some)
        };
        let Some(req) = req else { return };
        if let Some(r) = req {
            take(&mut pods, r);
            while let Ok(r) = rx.try_recv() {
                take(&mut pods, r);
            }
        }
        let client = kube.client();
        let mut all_ok = true;
        let uids: Vec<String> = pods.keys().cloned().collect();
        for uid in uids {
            let Some(e) = pods.get_mut(&uid) else { continue };
            match write(&client, e).await {
                Outcome::Done => {}
                Outcome::Gone => {
                    debug!(pod = %format!("{}/{}", e.to.namespace, e.to.name), "the pod is gone from the API server");
                    pods.remove(&uid);
                }
                Outcome::Deleted => {
                    pods.remove(&uid);
                }
                Outcome::Failed(err) => {
                    // Said once per failure, and again when the failure is another.
                    if !failing || last_error.as_deref() != Some(err.as_str()) {
                        warn!(pod = %format!("{}/{}", e.to.namespace, e.to.name), error = %err, "writing the pod's status to the API server; will retry");
                    }
                    last_error = Some(err);
                    all_ok = false;
                    // The rest would fail the same way: wait and retry them all.
                    break;
                }
            }
        }
        if all_ok {
            if failing {
                info!("pod statuses written to the API server again");
            }
            failing = false;
            last_error = None;
            retry = Duration::from_millis(200);
        } else {
            failing = true;
            retry = (retry * 2).min(MAX_RETRY);
        }
    }
}

fn take(pods: &mut BTreeMap<String, Entry>, r: Request) {
    let (to, status, delete) = match r {
        Request::Status(to, s) => (to, Some(*s), false),
        Request::Delete(to) => (to, None, true),
    };
    let e = pods.entry(to.uid.clone()).or_insert_with(|| Entry {
        to: to.clone(),
        pending: None,
        written: None,
        delete: false,
    });
    e.to = to;
    e.delete |= delete;
    if let Some(s) = status {
        if e.written.as_ref() == Some(&s) {
            e.pending = None;
        } else if goes_back(e.written.as_ref().or(e.pending.as_ref()), &s) {
            warn!(pod = %format!("{}/{}", e.to.namespace, e.to.name), "not writing a non-terminal phase after a terminal one");
        } else {
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
    /// Nothing (more) to do for now.
    Done,
    /// The pod is not on the API server (any more), or it is another pod now.
    Gone,
    Deleted,
    Failed(String),
}

async fn write(client: &kube::Client, e: &mut Entry) -> Outcome {
    let api: Api<Pod> = Api::namespaced(client.clone(), &e.to.namespace);
    if let Some(status) = e.pending.clone() {
        // The UID in the patch is a precondition: a new pod of the same name is never touched.
        let patch = |stale_ips: &[String]| {
            serde_json::json!({
                "metadata": {"uid": e.to.uid},
                "status": status_patch(&status, stale_ips),
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
                e.written = Some(status);
                e.pending = None;
            }
            Err(err) if is_gone(&err) => return Outcome::Gone,
            Err(err) => return Outcome::Failed(format!("{err:#}")),
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
            Err(err) => Outcome::Failed(format!("{err:#}")),
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
        take(&mut m, Request::Status(to(), Box::new(st("Pending"))));
        take(&mut m, Request::Status(to(), Box::new(st("Running"))));
        assert_eq!(m["u"].pending, Some(st("Running")));
    }

    #[test]
    fn a_written_status_is_not_written_again() {
        let mut m = BTreeMap::new();
        take(&mut m, Request::Status(to(), Box::new(st("Running"))));
        let e = m.get_mut("u").unwrap();
        e.written = e.pending.take();
        take(&mut m, Request::Status(to(), Box::new(st("Running"))));
        assert_eq!(m["u"].pending, None);
    }

    #[test]
    fn a_terminal_phase_is_never_followed_by_a_running_one() {
        let mut m = BTreeMap::new();
        take(&mut m, Request::Status(to(), Box::new(st("Succeeded"))));
        take(&mut m, Request::Status(to(), Box::new(st("Running"))));
        assert_eq!(m["u"].pending, Some(st("Succeeded")));
        let e = m.get_mut("u").unwrap();
        e.written = e.pending.take();
        take(&mut m, Request::Status(to(), Box::new(st("Pending"))));
        assert_eq!(m["u"].pending, None);
        take(&mut m, Request::Status(to(), Box::new(st("Failed"))));
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
    fn deletion_is_kept_with_the_last_status() {
        let mut m = BTreeMap::new();
        take(&mut m, Request::Status(to(), Box::new(st("Running"))));
        take(&mut m, Request::Delete(to()));
        assert!(m["u"].delete);
        assert_eq!(m["u"].pending, Some(st("Running")));
    }
}
