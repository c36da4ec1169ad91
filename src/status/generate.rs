//! Pod status as kubelet computes it (generateAPIPodStatus): the phase ([`super::phase`]) from
//! the container states, the conditions (PodReadyToStartContainers, Initialized, ContainersReady,
//! Ready, PodScheduled) with stable transition times, and a ContainerStatus per container with
//! state, lastState, reasons, restart count and ids.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use ferrolet_runtime::image::Reference;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    ContainerUser, HostIP, LinuxContainerUser, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::phase::phase;
use crate::kuberuntime::status_container_id;
use crate::kuberuntime::views::{parse_time, ContainerView, PodContainers, ViewState};
use crate::pod::reasons::{self, Waiting};
use crate::pod::{self, qos, Phase};

pub fn ktime(t: DateTime<Utc>) -> Time {
    let secs = t.timestamp();
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
}

fn ktime_str(s: &str) -> Option<Time> {
    parse_time(s).map(ktime)
}

/// Everything the status is computed from.
pub struct StatusInput<'a> {
    pub pod: &'a Pod,
    pub containers: &'a PodContainers,
    /// Why a container is waiting, when the worker knows better than "ContainerCreating":
    /// by container name.
    pub waiting: &'a BTreeMap<String, Waiting>,
    /// Readiness of containers with a readiness probe (absent: ready when running).
    pub readiness: &'a BTreeMap<String, bool>,
    /// Containers with a startup probe that has not succeeded yet.
    pub startup_pending: &'a BTreeSet<String>,
    /// Termination messages by container id.
    pub messages: &'a BTreeMap<String, String>,
    pub sandbox_ready: bool,
    pub initialized: bool,
    pub pod_ips: &'a [String],
    pub host_ips: &'a [String],
    pub start_time: Option<DateTime<Utc>>,
    pub previous: Option<&'a PodStatus>,
}

fn terminated(v: &ContainerView, messages: &BTreeMap<String, String>) -> Option<ContainerStateTerminated> {
    let e = v.exit()?;
    let reason = if e.oom_killed {
        reasons::OOM_KILLED
    } else if e.reason.is_some() {
        reasons::UNKNOWN
    } else if e.exit_code == 0 {
        reasons::COMPLETED
    } else {
        reasons::ERROR
    };
    let message = messages
        .get(&v.id)
        .cloned()
        .filter(|m| !m.is_empty())
        .or_else(|| e.reason.clone());
    Some(ContainerStateTerminated {
        container_id: Some(status_container_id(&v.id)),
        exit_code: e.exit_code,
        signal: e.signal.filter(|s| *s != 0),
        reason: Some(reason.into()),
        message,
        started_at: v.started_at.map(ktime),
        finished_at: ktime_str(&e.finished_at),
    })
}

pub(super) fn waiting(reason: &str, message: &str) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message: Some(message.to_string()).filter(|m| !m.is_empty()),
        }),
        ..Default::default()
    }
}

fn container_status(input: &StatusInput, c: &Container, default_waiting: &str) -> ContainerStatus {
    let image = c.image.clone().unwrap_or_default();
    let image = Reference::parse(&image).map(|r| r.normalized()).unwrap_or(image);
    let latest = input.containers.latest(&c.name);
    let mut st = ContainerStatus {
        name: c.name.clone(),
        image,
        image_id: String::new(),
        ready: false,
        restart_count: 0,
        started: Some(false),
        ..Default::default()
    };
    let Some(v) = latest else {
        st.state = Some(match input.waiting.get(&c.name) {
            Some(w) => waiting(w.reason, &w.message),
            None => waiting(default_waiting, ""),
        });
        return st;
    };
    st.restart_count = v.attempt as i32;
    st.image_id = v.image_id.clone();
    // kubelet's convertContainerStatusUser (SupplementalGroupsPolicy, on by default): the
    // identity the runtime gave the process.
    st.user = v.user.as_ref().map(|u| ContainerUser {
        linux: Some(LinuxContainerUser {
            uid: u.uid.into(),
            gid: u.gid.into(),
            supplemental_groups: Some(u.supplemental_groups.iter().map(|g| i64::from(*g)).collect()),
        }),
    });
    st.container_id = Some(status_container_id(&v.id));
    let prev_terminated = || {
        input
            .containers
            .previous(&c.name)
            .and_then(|p| terminated(p, input.messages))
    };
    match &v.state {
        ViewState::Created => {
            st.state = Some(waiting(reasons::CONTAINER_CREATING, ""));
            st.last_state = prev_terminated().map(|t| ContainerState {
                terminated: Some(t),
                ..Default::default()
            });
        }
        ViewState::Running => {
            st.state = Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: v.started_at.map(ktime),
                }),
                ..Default::default()
            });
            let started = !input.startup_pending.contains(&c.name);
            st.started = Some(started);
            st.ready = started && input.readiness.get(&c.name).copied().unwrap_or(true);
            st.last_state = prev_terminated().map(|t| ContainerState {
                terminated: Some(t),
                ..Default::default()
            });
        }
        ViewState::Exited(_) => {
            let t = terminated(v, input.messages);
            match input.waiting.get(&c.name) {
                // About to be restarted (e.g. CrashLoopBackOff): waiting, with the exit as lastState.
                Some(w) => {
                    st.state = Some(waiting(w.reason, &w.message));
                    st.last_state = t.map(|t| ContainerState {
                        terminated: Some(t),
                        ..Default::default()
                    });
                }
                None => {
                    st.state = Some(ContainerState {
                        terminated: t,
                        ..Default::default()
                    });
                    st.last_state = prev_terminated().map(|t| ContainerState {
                        terminated: Some(t),
                        ..Default::default()
                    });
                }
            }
        }
    }
    st
}

fn condition(
    prev: Option<&PodStatus>,
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    now: DateTime<Utc>,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let previous = prev
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_));
    let transition = match previous {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Some(ktime(now)),
    };
    PodCondition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.map(str::to_string),
        message,
        last_transition_time: transition,
        last_probe_time: None,
        observed_generation: None,
    }
}

pub fn compute(input: &StatusInput) -> PodStatus {
    let p = input.pod;
    let now = Utc::now();
    let init: Vec<ContainerStatus> = pod::init_containers(p)
        .iter()
        .map(|c| {
            let mut st = container_status(input, c, reasons::POD_INITIALIZING);
            // kubelet's prober manager (UpdatePodStatus): an init container that is not a
            // sidecar is ready once it has terminated with exit code 0.
            if !pod::is_sidecar(c) {
                st.ready = st
                    .state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0);
            }
            st
        })
        .collect();
    let init_pending = !input.initialized;
    let apps: Vec<ContainerStatus> = pod::containers(p)
        .iter()
        .map(|c| {
            container_status(
                input,
                c,
                if init_pending && !init.is_empty() {
                    reasons::POD_INITIALIZING
                } else {
                    reasons::CONTAINER_CREATING
                },
            )
        })
        .collect();
    let phase = phase(p, &init, &apps);
    let completed = phase.is_terminal();
    let unready: Vec<&str> = apps
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .chain(
            init.iter()
                .zip(pod::init_containers(p))
                .filter(|(s, c)| pod::is_sidecar(c) && !s.ready)
                .map(|(s, _)| s.name.as_str()),
        )
        .collect();
    let incomplete: Vec<&str> = pod::init_containers(p)
        .iter()
        .zip(&init)
        .filter(|(c, s)| {
            !pod::is_sidecar(c)
                && s.state
                    .as_ref()
                    .and_then(|x| x.terminated.as_ref())
                    .is_none_or(|t| t.exit_code != 0)
        })
        .map(|(c, _)| c.name.as_str())
        .collect();
    let initialized = input.initialized;
    let prev = input.previous;
    let ready = unready.is_empty() && !completed;
    let ready_reason = if phase == Phase::Failed {
        // kubelet: a failed pod's containers may still be stopping; never ready.
        Some(reasons::POD_FAILED)
    } else if completed {
        Some(reasons::POD_COMPLETED)
    } else if ready {
        None
    } else {
        Some(reasons::CONTAINERS_NOT_READY)
    };
    let ready_msg = (!ready && !completed).then(|| format!("containers with unready status: [{}]", unready.join(" ")));
    // kubelet's GeneratePodReadyCondition: ready containers make the pod Ready only when every
    // readiness gate's condition (set by others, through the API) is True too.
    let gates = unready_gates(p);
    let (pod_ready, pod_ready_reason, pod_ready_msg) = if ready && !gates.is_empty() {
        (false, Some(reasons::READINESS_GATES_NOT_READY), Some(gates.join(", ")))
    } else {
        (ready, ready_reason, ready_msg.clone())
    };
    let conditions = vec![
        condition(prev, "PodReadyToStartContainers", input.sandbox_ready, None, None, now),
        condition(
            prev,
            "Initialized",
            initialized,
            (!initialized).then_some(reasons::CONTAINERS_NOT_INITIALIZED),
            (!initialized).then(|| format!("containers with incomplete status: [{}]", incomplete.join(" "))),
            now,
        ),
        condition(prev, "Ready", pod_ready, pod_ready_reason, pod_ready_msg, now),
        condition(prev, "ContainersReady", ready, ready_reason, ready_msg, now),
        condition(prev, "PodScheduled", true, None, None, now),
    ];
    PodStatus {
        phase: Some(phase.as_str().into()),
        conditions: Some(conditions),
        host_ip: input.host_ips.first().cloned(),
        host_ips: Some(input.host_ips.iter().map(|ip| HostIP { ip: ip.clone() }).collect())
            .filter(|v: &Vec<_>| !v.is_empty()),
        pod_ip: input.pod_ips.first().cloned(),
        pod_ips: Some(input.pod_ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect())
            .filter(|v: &Vec<_>| !v.is_empty()),
        start_time: input.start_time.map(ktime),
        qos_class: Some(qos::qos_class(p).as_str().into()),
        init_container_statuses: Some(init).filter(|v| !v.is_empty()),
        container_statuses: Some(apps),
        ephemeral_container_statuses: Some(ephemeral_statuses(input)).filter(|v| !v.is_empty()),
        ..Default::default()
    }
}

/// kubelet's ephemeralContainerStatuses: the same shape as the others, never ready (they have
/// no readiness probe and count for no condition), started while running.
fn ephemeral_statuses(input: &StatusInput) -> Vec<ContainerStatus> {
    pod::ephemeral_containers(input.pod)
        .iter()
        .map(|c| {
            let mut st = container_status(input, c, reasons::CONTAINER_CREATING);
            st.ready = false;
            st.started = Some(st.state.as_ref().is_some_and(|s| s.running.is_some()));
            st
        })
        .collect()
}

/// kubelet's words for each readiness gate of `p` whose condition is not True in the pod's
/// status as its source last had it.
pub fn unready_gates(p: &Pod) -> Vec<String> {
    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    pod::spec(p)
        .readiness_gates
        .iter()
        .flatten()
        .filter_map(|g| {
            let t = &g.condition_type;
            match conditions.and_then(|cs| cs.iter().find(|c| c.type_ == *t)) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate {t:?} does not exist."
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate {t:?} is not \"True\", but {}",
                    c.status
                )),
                Some(_) => None,
            }
        })
        .collect()
}

/// The gate conditions of `p` (type and status), to tell whether a new object of the pod
/// changes its readiness (kubelet's NeedToReconcilePodReadiness).
pub fn gate_conditions(p: &Pod) -> Vec<(String, String)> {
    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    pod::spec(p)
        .readiness_gates
        .iter()
        .flatten()
        .map(|g| {
            let status = conditions
                .and_then(|cs| cs.iter().find(|c| c.type_ == g.condition_type))
                .map(|c| c.status.clone())
                .unwrap_or_default();
            (g.condition_type.clone(), status)
        })
        .collect()
}

/// The condition kubelet adds to a pod it stops for the node's sake (an eviction).
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// Its reason when the kubelet itself did it.
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";

/// The status of a pod the node stopped for good (kubelet's status function of killPodNow,
/// the active deadline's ShouldEvict): phase Failed with the pod-level reason and message;
/// an eviction also carries the DisruptionTarget condition.
pub fn killed(mut st: PodStatus, reason: &str, message: &str, disruption: bool, prev: Option<&PodStatus>) -> PodStatus {
    st.phase = Some(Phase::Failed.as_str().into());
    st.reason = Some(reason.into());
    st.message = Some(message.into());
    if disruption {
        let c = condition(
            prev,
            DISRUPTION_TARGET,
            true,
            Some(TERMINATION_BY_KUBELET),
            Some(message.to_string()),
            Utc::now(),
        );
        st.conditions.get_or_insert_with(Vec::new).insert(0, c);
    }
    // kubelet's ready conditions of a Failed pod: false with reason PodFailed, whatever its
    // containers are doing while they stop.
    for c in st.conditions.iter_mut().flatten() {
        if c.type_ == "Ready" || c.type_ == "ContainersReady" {
            *c = condition(prev, &c.type_, false, Some(reasons::POD_FAILED), None, Utc::now());
        }
    }
    st
}

/// The status of a pod the agent refused to run.
pub fn rejected(p: &Pod, reason: &str, message: &str, host_ips: &[String]) -> PodStatus {
    PodStatus {
        phase: Some(Phase::Failed.as_str().into()),
        reason: Some(reason.into()),
        message: Some(message.into()),
        host_ip: host_ips.first().cloned(),
        qos_class: Some(qos::qos_class(p).as_str().into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrolet_runtime::{ExitRecord, ProcessUser};

    fn view(name: &str, state: ViewState) -> ContainerView {
        ContainerView {
            id: format!("{name}-id"),
            name: name.into(),
            attempt: 0,
            hash: "h".into(),
            state,
            created_at: Utc::now(),
            started_at: Some(Utc::now()),
            image_id: String::new(),
            log_path: Default::default(),
            stop_signal: None,
            termination_message_file: None,
            termination_message_policy: "File".into(),
            user: Some(ProcessUser {
                uid: 1000,
                gid: 3000,
                supplemental_groups: vec![3000, 2000],
            }),
        }
    }

    fn exited(code: i32) -> ViewState {
        ViewState::Exited(ExitRecord {
            exit_code: code,
            signal: None,
            oom_killed: false,
            finished_at: "2024-01-01T00:00:00Z".into(),
            reason: None,
        })
    }

    fn status(pod: &Pod, views: Vec<ContainerView>) -> PodStatus {
        let containers = PodContainers::new(views);
        compute(&StatusInput {
            pod,
            containers: &containers,
            waiting: &BTreeMap::new(),
            readiness: &BTreeMap::new(),
            startup_pending: &BTreeSet::new(),
            messages: &BTreeMap::new(),
            sandbox_ready: true,
            initialized: true,
            pod_ips: &[],
            host_ips: &[],
            start_time: None,
            previous: None,
        })
    }

    #[test]
    fn readiness_gates_hold_the_pod_back_until_their_conditions_are_true() {
        let pod = |conditions: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "default", "uid": "u"},
                "spec": {
                    "readinessGates": [{"conditionType": "example.com/a"}, {"conditionType": "example.com/b"}],
                    "containers": [{"name": "app", "image": "i"}],
                },
                "status": {"conditions": conditions},
            }))
            .unwrap()
        };
        let cond = |st: &PodStatus, t: &str| st.conditions.iter().flatten().find(|c| c.type_ == t).cloned().unwrap();
        let p = pod(serde_json::json!([{"type": "example.com/a", "status": "False"}]));
        let st = status(&p, vec![view("app", ViewState::Running)]);
        let ready = cond(&st, "Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("ReadinessGatesNotReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("the status of pod readiness gate \"example.com/a\" is not \"True\", but False, corresponding condition of pod readiness gate \"example.com/b\" does not exist.")
        );
        assert_eq!(cond(&st, "ContainersReady").status, "True");
        let p = pod(serde_json::json!([
            {"type": "example.com/a", "status": "True"},
            {"type": "example.com/b", "status": "True"},
        ]));
        let st = status(&p, vec![view("app", ViewState::Running)]);
        assert_eq!(cond(&st, "Ready").status, "True");
        assert_ne!(gate_conditions(&p), gate_conditions(&pod(serde_json::json!([]))));
    }

    #[test]
    fn init_containers_that_succeeded_are_ready() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {
                "initContainers": [
                    {"name": "ok", "image": "i"},
                    {"name": "failed", "image": "i"},
                    {"name": "side", "image": "i", "restartPolicy": "Always"},
                ],
                "containers": [{"name": "app", "image": "i"}],
            }
        }))
        .unwrap();
        let st = status(
            &pod,
            vec![
                view("ok", exited(0)),
                view("failed", exited(1)),
                view("side", exited(0)),
                view("app", ViewState::Running),
            ],
        );
        let init = st.init_container_statuses.unwrap();
        let ready: Vec<(&str, bool)> = init.iter().map(|s| (s.name.as_str(), s.ready)).collect();
        // A sidecar that exited is not ready (it is meant to run).
        assert_eq!(ready, vec![("ok", true), ("failed", false), ("side", false)]);
        let app = &st.container_statuses.unwrap()[0];
        let user = app.user.as_ref().unwrap().linux.as_ref().unwrap();
        assert_eq!((user.uid, user.gid), (1000, 3000));
        assert_eq!(user.supplemental_groups.as_deref(), Some(&[3000, 2000][..]));
    }
}
