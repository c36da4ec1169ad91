//! Pod status as kubelet computes it (generateAPIPodStatus / getPhase): phase from the
//! container states, the conditions (PodReadyToStartContainers, Initialized, ContainersReady,
//! Ready, PodScheduled) with stable transition times, and a ContainerStatus per container with
//! state, lastState, reasons, restart count and ids.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use ferrolet_runtime::image::Reference;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::pod::{self, qos};
use crate::sync::views::{ContainerView, PodContainers, ViewState};

pub const RUNTIME_PREFIX: &str = "ferrolet://";

pub fn ktime(t: DateTime<Utc>) -> Time {
    let secs = t.timestamp();
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
}

fn ktime_str(s: &str) -> Option<Time> {
    crate::sync::views::parse_time(s).map(ktime)
}

/// Everything the status is computed from.
pub struct StatusInput<'a> {
    pub pod: &'a Pod,
    pub containers: &'a PodContainers,
    /// Why a container is waiting, when the worker knows better than "ContainerCreating":
    /// name -> (reason, message).
    pub waiting: &'a BTreeMap<String, (String, String)>,
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
        "OOMKilled"
    } else if e.reason.is_some() {
        "Unknown"
    } else if e.exit_code == 0 {
        "Completed"
    } else {
        "Error"
    };
    let message = messages
        .get(&v.id)
        .cloned()
        .filter(|m| !m.is_empty())
        .or_else(|| e.reason.clone());
    Some(ContainerStateTerminated {
        container_id: Some(format!("{RUNTIME_PREFIX}{}", v.id)),
        exit_code: e.exit_code,
        signal: e.signal.filter(|s| *s != 0),
        reason: Some(reason.into()),
        message,
        started_at: v.started_at.map(ktime),
        finished_at: ktime_str(&e.finished_at),
    })
}

fn waiting(reason: &str, message: &str) -> ContainerState {
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
        let (r, m) = input
            .waiting
            .get(&c.name)
            .cloned()
            .unwrap_or_else(|| (default_waiting.to_string(), String::new()));
        st.state = Some(waiting(&r, &m));
        return st;
    };
    st.restart_count = v.attempt as i32;
    st.image_id = v.image_id.clone();
    st.container_id = Some(format!("{RUNTIME_PREFIX}{}", v.id));
    let prev_terminated = || {
        input
            .containers
            .previous(&c.name)
            .and_then(|p| terminated(p, input.messages))
    };
    match &v.state {
        ViewState::Created => {
            st.state = Some(waiting("ContainerCreating", ""));
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
                Some((r, m)) => {
                    st.state = Some(waiting(r, m));
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

/// kubelet's getPhase.
pub fn phase(p: &Pod, init: &[ContainerStatus], apps: &[ContainerStatus]) -> &'static str {
    let policy = pod::restart_policy(p);
    let mut pending_init = 0;
    let mut failed_init = 0;
    for (c, s) in pod::init_containers(p).iter().zip(init) {
        if pod::is_sidecar(c) {
            if s.state.as_ref().is_none_or(|x| x.running.is_none())
                && s.last_state.is_none()
                && s.container_id.is_none()
            {
                pending_init += 1;
            }
            continue;
        }
        let state = s.state.clone().unwrap_or_default();
        if state.running.is_some() {
            pending_init += 1;
        } else if let Some(t) = &state.terminated {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else if state.waiting.is_some() {
            match s.last_state.as_ref().and_then(|l| l.terminated.as_ref()) {
                Some(t) if t.exit_code == 0 => {}
                Some(_) => failed_init += 1,
                None => pending_init += 1,
            }
        } else {
            pending_init += 1;
        }
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in apps {
        let state = s.state.clone().unwrap_or_default();
        if state.running.is_some() {
            running += 1;
        } else if let Some(t) = &state.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if state.waiting.is_some() {
            if s.last_state.as_ref().and_then(|l| l.terminated.as_ref()).is_some() {
                stopped += 1;
            } else {
                waiting += 1;
            }
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    if pending_init > 0 || failed_init > 0 {
        return "Pending";
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        if policy == "Always" {
            return "Running";
        }
        if stopped == succeeded {
            return "Succeeded";
        }
        if policy == "Never" {
            return "Failed";
        }
        return "Running";
    }
    "Pending"
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
        .map(|c| container_status(input, c, "PodInitializing"))
        .collect();
    let init_pending = !input.initialized;
    let apps: Vec<ContainerStatus> = pod::containers(p)
        .iter()
        .map(|c| {
            container_status(
                input,
                c,
                if init_pending && !init.is_empty() {
                    "PodInitializing"
                } else {
                    "ContainerCreating"
                },
            )
        })
        .collect();
    let phase = phase(p, &init, &apps);
    let completed = phase == "Succeeded" || phase == "Failed";
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
    let ready_reason = if completed {
        Some("PodCompleted")
    } else if ready {
        None
    } else {
        Some("ContainersNotReady")
    };
    let ready_msg = (!ready && !completed).then(|| format!("containers with unready status: [{}]", unready.join(" ")));
    let conditions = vec![
        condition(prev, "PodReadyToStartContainers", input.sandbox_ready, None, None, now),
        condition(
            prev,
            "Initialized",
            initialized,
            (!initialized).then_some("ContainersNotInitialized"),
            (!initialized).then(|| format!("containers with incomplete status: [{}]", incomplete.join(" "))),
            now,
        ),
        condition(prev, "Ready", ready, ready_reason, ready_msg.clone(), now),
        condition(prev, "ContainersReady", ready, ready_reason, ready_msg, now),
        condition(prev, "PodScheduled", true, None, None, now),
    ];
    PodStatus {
        phase: Some(phase.into()),
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
        ..Default::default()
    }
}

/// The status of a pod the agent refused to run.
pub fn rejected(p: &Pod, reason: &str, message: &str, host_ips: &[String]) -> PodStatus {
    PodStatus {
        phase: Some("Failed".into()),
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

    fn cs(name: &str, state: ContainerState, last: Option<ContainerState>) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(state),
            last_state: last,
            ..Default::default()
        }
    }
    fn running() -> ContainerState {
        ContainerState {
            running: Some(Default::default()),
            ..Default::default()
        }
    }
    fn term(code: i32) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
    fn wait() -> ContainerState {
        waiting("CrashLoopBackOff", "")
    }
    fn pod(policy: &str) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata":{"name":"p"},"spec":{"restartPolicy":policy,"containers":[{"name":"a","image":"x"}]}})).unwrap()
    }

    #[test]
    fn phases_like_kubelet() {
        assert_eq!(phase(&pod("Always"), &[], &[cs("a", running(), None)]), "Running");
        assert_eq!(
            phase(&pod("Always"), &[], &[cs("a", waiting("ContainerCreating", ""), None)]),
            "Pending"
        );
        assert_eq!(phase(&pod("Always"), &[], &[cs("a", wait(), Some(term(1)))]), "Running");
        assert_eq!(phase(&pod("Never"), &[], &[cs("a", term(0), None)]), "Succeeded");
        assert_eq!(phase(&pod("Never"), &[], &[cs("a", term(1), None)]), "Failed");
        assert_eq!(phase(&pod("OnFailure"), &[], &[cs("a", term(0), None)]), "Succeeded");
        assert_eq!(
            phase(&pod("OnFailure"), &[], &[cs("a", wait(), Some(term(1)))]),
            "Running"
        );
    }

    #[test]
    fn init_failure_with_never_fails_the_pod() {
        let p: Pod = serde_json::from_value(
            serde_json::json!({"metadata":{"name":"p"},"spec":{"restartPolicy":"Never",
            "initContainers":[{"name":"i","image":"x"}],"containers":[{"name":"a","image":"x"}]}}),
        )
        .unwrap();
        let apps = [cs("a", waiting("PodInitializing", ""), None)];
        assert_eq!(phase(&p, &[cs("i", term(1), None)], &apps), "Failed");
        assert_eq!(phase(&p, &[cs("i", running(), None)], &apps), "Pending");
    }
}
