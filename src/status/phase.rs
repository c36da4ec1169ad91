//! The pod phase as kubelet's getPhase decides it from the container statuses and the
//! restart policy.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use crate::pod::{self, Phase, RestartPolicy};

/// kubelet's getPhase.
pub fn phase(p: &Pod, init: &[ContainerStatus], apps: &[ContainerStatus]) -> Phase {
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
    if failed_init > 0 && policy == RestartPolicy::Never {
        return Phase::Failed;
    }
    if pending_init > 0 || failed_init > 0 {
        return Phase::Pending;
    }
    if waiting > 0 {
        return Phase::Pending;
    }
    if running > 0 {
        return Phase::Running;
    }
    if stopped > 0 {
        if policy == RestartPolicy::Always {
            return Phase::Running;
        }
        if stopped == succeeded {
            return Phase::Succeeded;
        }
        if policy == RestartPolicy::Never {
            return Phase::Failed;
        }
        return Phase::Running;
    }
    Phase::Pending
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::generate::waiting;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated};

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
        waiting(crate::pod::reasons::CRASH_LOOP_BACK_OFF, "")
    }
    fn pod(policy: &str) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata":{"name":"p"},"spec":{"restartPolicy":policy,"containers":[{"name":"a","image":"x"}]}})).unwrap()
    }

    #[test]
    fn phases_like_kubelet() {
        assert_eq!(phase(&pod("Always"), &[], &[cs("a", running(), None)]), Phase::Running);
        assert_eq!(
            phase(&pod("Always"), &[], &[cs("a", waiting("ContainerCreating", ""), None)]),
            Phase::Pending
        );
        assert_eq!(
            phase(&pod("Always"), &[], &[cs("a", wait(), Some(term(1)))]),
            Phase::Running
        );
        assert_eq!(phase(&pod("Never"), &[], &[cs("a", term(0), None)]), Phase::Succeeded);
        assert_eq!(phase(&pod("Never"), &[], &[cs("a", term(1), None)]), Phase::Failed);
        assert_eq!(
            phase(&pod("OnFailure"), &[], &[cs("a", term(0), None)]),
            Phase::Succeeded
        );
        assert_eq!(
            phase(&pod("OnFailure"), &[], &[cs("a", wait(), Some(term(1)))]),
            Phase::Running
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
        assert_eq!(phase(&p, &[cs("i", term(1), None)], &apps), Phase::Failed);
        assert_eq!(phase(&p, &[cs("i", running(), None)], &apps), Phase::Pending);
    }
}
