//! What a pod needs next, decided from what runs (kubelet's computePodActions): init
//! containers one at a time in order, sidecars started in order and kept running, then the
//! app containers; restarts by restartPolicy under crash-loop back-off; a container whose spec
//! changed or whose liveness probe failed is replaced; when no app container will run again,
//! the sidecars are stopped. Pure: no I/O, so every rule has a unit test.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Container, Pod};

use crate::backoff::Backoff;
use crate::kuberuntime::labels::ContainerKind as Kind;
use crate::kuberuntime::views::{ContainerView, PodContainers, ViewState};
use crate::pod::{self, RestartPolicy};

#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    pub name: String,
    pub kind: Kind,
    pub attempt: u32,
    /// When the previous attempt finished (its restart is recorded in the back-off).
    pub previous_finished: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Kill {
    pub id: String,
    pub name: String,
    pub reason: String,
}

#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub kill: Vec<Kill>,
    pub start: Vec<Start>,
    /// Containers waiting out a crash-loop back-off: name -> (until, back-off).
    pub backing_off: BTreeMap<String, (DateTime<Utc>, Duration)>,
    /// restartPolicy Never and an init container failed: the pod has failed.
    pub init_failed: bool,
    /// No app container will run again (restartPolicy is not Always and all have ended).
    pub completed: bool,
    pub initialized: bool,
    pub wake_at: Option<DateTime<Utc>>,
}

pub struct PlanInput<'a> {
    pub pod: &'a Pod,
    pub containers: &'a PodContainers,
    pub hashes: &'a BTreeMap<String, String>,
    pub backoff: &'a Backoff,
    pub now: DateTime<Utc>,
    /// Sidecars whose startup probe has not succeeded yet.
    pub startup_pending: &'a BTreeSet<String>,
    /// Containers to restart because their liveness (or startup) probe failed: name -> reason.
    pub unhealthy: &'a BTreeMap<String, String>,
}

pub fn backoff_key(name: &str, hash: &str) -> String {
    format!("{name}_{hash}")
}

impl Plan {
    fn wake(&mut self, t: DateTime<Utc>) {
        self.wake_at = Some(self.wake_at.map_or(t, |w| w.min(t)));
    }
}

struct Planner<'a> {
    input: &'a PlanInput<'a>,
    plan: Plan,
}

impl Planner<'_> {
    fn hash(&self, name: &str) -> &str {
        self.input.hashes.get(name).map(String::as_str).unwrap_or("")
    }

    fn start_new(&mut self, c: &Container, kind: Kind, latest: Option<&ContainerView>) {
        self.plan.start.push(Start {
            name: c.name.clone(),
            kind,
            attempt: latest.map(|l| l.attempt + 1).unwrap_or(0),
            previous_finished: None,
        });
    }

    /// Restart after an exit, unless the back-off says wait.
    fn restart(&mut self, c: &Container, kind: Kind, latest: &ContainerView) {
        let finished = latest.finished_at().unwrap_or(self.input.now);
        let key = backoff_key(&c.name, self.hash(&c.name));
        match self.input.backoff.wait_until(&key, finished, self.input.now) {
            Some((until, d)) => {
                self.plan.backing_off.insert(c.name.clone(), (until, d));
                self.plan.wake(until);
            }
            None => self.plan.start.push(Start {
                name: c.name.clone(),
                kind,
                attempt: latest.attempt + 1,
                previous_finished: Some(finished),
            }),
        }
    }

    /// Only the latest attempt of a container may run (kubelet kills every running container
    /// it does not keep): an older attempt still alive, or a container the spec does not name,
    /// is stopped. Such strays come from an agent killed in the middle of a start (its zygote
    /// finishes the create) or a record that could not be read for a while.
    fn stop_strays(&mut self) {
        let cs = self.input.containers;
        for (name, attempts) in &cs.by_name {
            let in_spec =
                pod::container(self.input.pod, name).is_some() || pod::is_ephemeral_name(self.input.pod, name);
            let stray = attempts.iter().skip(if in_spec { 1 } else { 0 });
            for v in stray.filter(|v| v.is_active()) {
                let why = if in_spec {
                    "a newer attempt of the container exists"
                } else {
                    "the container is not in the pod spec"
                };
                self.kill(v, why);
            }
        }
    }

    /// Ephemeral containers (`kubectl debug`) start once each, as soon as the pod has its
    /// sandbox, initialized or not, and are never restarted (kubelet's computePodActions): one
    /// that has a runtime container, in any state, is left as it is.
    fn start_ephemeral(&mut self) {
        if self.plan.completed {
            return;
        }
        for c in pod::ephemeral_containers(self.input.pod) {
            if self.input.containers.latest(&c.name).is_none() {
                self.start_new(&c, Kind::Ephemeral, None);
            }
        }
    }

    fn kill(&mut self, v: &ContainerView, reason: &str) {
        self.plan.kill.push(Kill {
            id: v.id.clone(),
            name: v.name.clone(),
            reason: reason.to_string(),
        });
    }

    /// A running container to replace: its spec changed or a probe failed.
    fn replace_reason(&self, v: &ContainerView) -> Option<String> {
        if let Some(r) = self.input.unhealthy.get(&v.name) {
            return Some(r.clone());
        }
        let want = self.hash(&v.name);
        if !want.is_empty() && !v.hash.is_empty() && want != v.hash {
            return Some("Container spec hash changed, will be restarted".into());
        }
        None
    }
}

pub fn plan(input: &PlanInput) -> Plan {
    let mut p = Planner {
        input,
        plan: Plan::default(),
    };
    p.stop_strays();
    let pod_ = input.pod;
    let policy = pod::restart_policy(pod_);
    let inits = pod::init_containers(pod_);
    let cs = input.containers;

    let regular_done = inits.iter().filter(|c| !pod::is_sidecar(c)).all(|c| {
        cs.latest(&c.name)
            .and_then(|v| v.exit())
            .is_some_and(|e| e.exit_code == 0)
    });
    let sidecars_started = inits.iter().filter(|c| pod::is_sidecar(c)).all(|c| {
        cs.latest(&c.name)
            .is_some_and(|v| v.started_at.is_some() || v.is_running() || v.exit().is_some())
    });
    let initialized = regular_done && sidecars_started;
    p.plan.initialized = initialized;

    if !initialized {
        for c in inits {
            let latest = cs.latest(&c.name);
            let sidecar = pod::is_sidecar(c);
            let kind = if sidecar { Kind::Sidecar } else { Kind::Init };
            match latest.map(|v| &v.state) {
                None => {
                    p.start_new(c, kind, None);
                    break;
                }
                Some(ViewState::Created) => {
                    let v = latest.unwrap();
                    p.kill(v, "created but never started");
                    p.start_new(c, kind, Some(v));
                    break;
                }
                Some(ViewState::Running) => {
                    let v = latest.unwrap();
                    if let Some(r) = p.replace_reason(v) {
                        p.kill(v, &r);
                        if sidecar {
                            p.start_new(c, kind, Some(v));
                        }
                        break;
                    }
                    if sidecar && !input.startup_pending.contains(&c.name) {
                        continue;
                    }
                    break;
                }
                Some(ViewState::Exited(e)) => {
                    let v = latest.unwrap();
                    if !sidecar && e.exit_code == 0 {
                        continue;
                    }
                    if !sidecar && policy == RestartPolicy::Never {
                        p.plan.init_failed = true;
                        break;
                    }
                    p.restart(c, kind, v);
                    break;
                }
            }
        }
        if p.plan.init_failed {
            for c in inits.iter().filter(|c| pod::is_sidecar(c)).rev() {
                if let Some(v) = cs.latest(&c.name).filter(|v| v.is_running()) {
                    p.kill(v, "pod failed: an init container failed and restartPolicy is Never");
                }
            }
            p.plan.completed = true;
        }
        p.start_ephemeral();
        return p.plan;
    }

    let mut apps_active = false;
    for c in pod::containers(pod_) {
        let latest = cs.latest(&c.name);
        match latest.map(|v| &v.state) {
            None => {
                p.start_new(c, Kind::App, None);
                apps_active = true;
            }
            Some(ViewState::Created) => {
                let v = latest.unwrap();
                p.kill(v, "created but never started");
                p.start_new(c, Kind::App, Some(v));
                apps_active = true;
            }
            Some(ViewState::Running) => {
                let v = latest.unwrap();
                apps_active = true;
                if let Some(r) = p.replace_reason(v) {
                    p.kill(v, &r);
                    // The next attempt starts after the kill (the exit is seen on the next
                    // sync and restarted under back-off, as kubelet does).
                }
            }
            Some(ViewState::Exited(e)) => {
                let v = latest.unwrap();
                if policy.restarts(e.exit_code) {
                    apps_active = true;
                    p.restart(c, Kind::App, v);
                }
            }
        }
    }
    p.plan.completed = !apps_active && policy != RestartPolicy::Always;
    // Sidecars run while the app containers do; stopped in reverse order once they are done.
    for c in inits.iter().filter(|c| pod::is_sidecar(c)).rev() {
        let Some(v) = cs.latest(&c.name) else {
            if !p.plan.completed {
                p.start_new(c, Kind::Sidecar, None);
            }
            continue;
        };
        match &v.state {
            ViewState::Running if p.plan.completed => p.kill(v, "all app containers have completed"),
            ViewState::Running => {
                if let Some(r) = p.replace_reason(v) {
                    p.kill(v, &r);
                }
            }
            ViewState::Created => {
                p.kill(v, "created but never started");
                if !p.plan.completed {
                    p.start_new(c, Kind::Sidecar, Some(v));
                }
            }
            ViewState::Exited(_) if !p.plan.completed => p.restart(c, Kind::Sidecar, v),
            ViewState::Exited(_) => {}
        }
    }
    p.start_ephemeral();
    // Sidecars were listed last-first for stopping; start them in their declared order.
    p.plan.start.sort_by_key(|s| match s.kind {
        Kind::Init | Kind::Sidecar => 0,
        Kind::App => 1,
        Kind::Ephemeral => 2,
    });
    p.plan
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use ferrolet_runtime::ExitRecord;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    pub(in crate::worker) fn view(name: &str, attempt: u32, state: ViewState) -> ContainerView {
        ContainerView {
            id: format!("{name}-{attempt}"),
            name: name.into(),
            attempt,
            hash: "h".into(),
            started_at: Some(Utc::now()),
            state,
            created_at: Utc::now(),
            image_id: String::new(),
            log_path: Default::default(),
            stop_signal: None,
            termination_message_file: None,
            termination_message_policy: "File".into(),
            user: None,
        }
    }

    pub(in crate::worker) fn exited(code: i32) -> ViewState {
        ViewState::Exited(ExitRecord {
            exit_code: code,
            signal: None,
            oom_killed: false,
            finished_at: Utc::now().to_rfc3339(),
            reason: None,
        })
    }

    struct T {
        pod: Pod,
        backoff: Backoff,
        hashes: BTreeMap<String, String>,
        pending: BTreeSet<String>,
        unhealthy: BTreeMap<String, String>,
    }

    impl T {
        fn new(v: serde_json::Value) -> T {
            let pod = pod(v);
            let mut hashes = BTreeMap::new();
            for c in pod::containers(&pod).iter().chain(pod::init_containers(&pod)) {
                hashes.insert(c.name.clone(), "h".to_string());
            }
            T {
                pod,
                backoff: Backoff::new(Duration::from_secs(10), Duration::from_secs(300)),
                hashes,
                pending: BTreeSet::new(),
                unhealthy: BTreeMap::new(),
            }
        }
        fn plan(&self, views: Vec<ContainerView>) -> Plan {
            let cs = PodContainers::new(views);
            plan(&PlanInput {
                pod: &self.pod,
                containers: &cs,
                hashes: &self.hashes,
                backoff: &self.backoff,
                now: Utc::now(),
                startup_pending: &self.pending,
                unhealthy: &self.unhealthy,
            })
        }
    }

    fn names(p: &Plan) -> Vec<&str> {
        p.start.iter().map(|s| s.name.as_str()).collect()
    }

    const INIT_POD: &str = r#"{"metadata":{"name":"p"},"spec":{"restartPolicy":"Always",
        "initContainers":[{"name":"i1","image":"x"},{"name":"side","image":"x","restartPolicy":"Always"},{"name":"i2","image":"x"}],
        "containers":[{"name":"a","image":"x"},{"name":"b","image":"x"}]}}"#;

    #[test]
    fn init_containers_one_at_a_time_then_apps() {
        let t = T::new(serde_json::from_str(INIT_POD).unwrap());
        assert_eq!(names(&t.plan(vec![])), ["i1"]);
        assert!(
            t.plan(vec![view("i1", 0, ViewState::Running)]).start.is_empty(),
            "wait for i1"
        );
        assert_eq!(names(&t.plan(vec![view("i1", 0, exited(0))])), ["side"]);
        let v = vec![view("i1", 0, exited(0)), view("side", 0, ViewState::Running)];
        assert_eq!(names(&t.plan(v)), ["i2"]);
        let v = vec![
            view("i1", 0, exited(0)),
            view("side", 0, ViewState::Running),
            view("i2", 0, exited(0)),
        ];
        let p = t.plan(v);
        assert!(p.initialized);
        assert_eq!(names(&p), ["a", "b"]);
    }

    #[test]
    fn ephemeral_containers_start_once_initialized_or_not_and_never_again() {
        let t = T::new(
            serde_json::json!({"metadata":{"name":"p"},"spec":{"restartPolicy":"Always",
            "initContainers":[{"name":"i1","image":"x"}],
            "containers":[{"name":"a","image":"x"}],
            "ephemeralContainers":[{"name":"dbg","image":"x","targetContainerName":"a"}]}}),
        );
        // Before initialization, beside the first init container.
        let p = t.plan(vec![]);
        assert_eq!(names(&p), ["i1", "dbg"]);
        assert_eq!(p.start[1].kind, Kind::Ephemeral);
        // After it, after the app containers.
        assert_eq!(names(&t.plan(vec![view("i1", 0, exited(0))])), ["a", "dbg"]);
        // Running, exited (with any code) or created: left as it is, and not a stray.
        for state in [ViewState::Running, exited(1), exited(0), ViewState::Created] {
            let v = vec![
                view("i1", 0, exited(0)),
                view("a", 0, ViewState::Running),
                view("dbg", 0, state.clone()),
            ];
            let p = t.plan(v);
            assert!(p.start.is_empty() && p.kill.is_empty(), "{state:?}: {p:?}");
        }
        // A pod that completed starts none.
        let never = T::new(
            serde_json::json!({"metadata":{"name":"p"},"spec":{"restartPolicy":"Never",
            "containers":[{"name":"a","image":"x"}],
            "ephemeralContainers":[{"name":"dbg","image":"x"}]}}),
        );
        let p = never.plan(vec![view("a", 0, exited(0))]);
        assert!(p.completed && p.start.is_empty(), "{p:?}");
    }

    #[test]
    fn sidecar_startup_probe_gates_next_init() {
        let mut t = T::new(serde_json::from_str(INIT_POD).unwrap());
        t.pending.insert("side".into());
        let v = vec![view("i1", 0, exited(0)), view("side", 0, ViewState::Running)];
        assert!(t.plan(v).start.is_empty());
    }

    #[test]
    fn failed_init_restarts_or_fails_the_pod() {
        let t = T::new(serde_json::from_str(INIT_POD).unwrap());
        let p = t.plan(vec![view("i1", 0, exited(1))]);
        assert_eq!(
            p.start,
            vec![Start {
                name: "i1".into(),
                kind: Kind::Init,
                attempt: 1,
                previous_finished: p.start[0].previous_finished
            }]
        );
        let never = T::new(serde_json::from_str(&INIT_POD.replace("\"Always\",\n", "\"Never\",\n")).unwrap());
        assert_eq!(pod::restart_policy(&never.pod), RestartPolicy::Never);
        let p = never.plan(vec![view("i1", 0, exited(1))]);
        assert!(p.init_failed && p.start.is_empty());
    }

    #[test]
    fn restart_policies() {
        for (policy, code, restarts) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 1, true),
            ("Never", 1, false),
        ] {
            let t = T::new(
                serde_json::json!({"metadata":{"name":"p"},"spec":{"restartPolicy":policy,"containers":[{"name":"a","image":"x"}]}}),
            );
            let p = t.plan(vec![view("a", 0, exited(code))]);
            assert_eq!(!p.start.is_empty(), restarts, "{policy} exit {code}");
            assert_eq!(p.completed, !restarts && policy != "Always", "{policy} exit {code}");
            if restarts {
                assert_eq!(p.start[0].attempt, 1);
            }
        }
    }

    #[test]
    fn crash_loop_back_off_waits() {
        let mut t =
            T::new(serde_json::json!({"metadata":{"name":"p"},"spec":{"containers":[{"name":"a","image":"x"}]}}));
        let v = view("a", 3, exited(1));
        t.backoff.next(&backoff_key("a", "h"), v.finished_at().unwrap());
        let p = t.plan(vec![v]);
        assert!(p.start.is_empty());
        assert!(p.backing_off.contains_key("a"));
        assert!(p.wake_at.is_some());
    }

    #[test]
    fn spec_change_and_liveness_replace_running_containers() {
        let mut t =
            T::new(serde_json::json!({"metadata":{"name":"p"},"spec":{"containers":[{"name":"a","image":"x"}]}}));
        t.hashes.insert("a".into(), "new".into());
        let p = t.plan(vec![view("a", 0, ViewState::Running)]);
        assert_eq!(p.kill.len(), 1);
        t.hashes.insert("a".into(), "h".into());
        t.unhealthy.insert(
            "a".into(),
            "Container a failed liveness probe, will be restarted".into(),
        );
        let p = t.plan(vec![view("a", 0, ViewState::Running)]);
        assert!(p.kill[0].reason.contains("liveness"));
    }

    #[test]
    fn sidecars_stop_when_apps_complete() {
        let t = T::new(
            serde_json::json!({"metadata":{"name":"p"},"spec":{"restartPolicy":"Never",
            "initContainers":[{"name":"side","image":"x","restartPolicy":"Always"}],
            "containers":[{"name":"a","image":"x"}]}}),
        );
        let p = t.plan(vec![view("side", 0, ViewState::Running), view("a", 0, exited(0))]);
        assert!(p.completed);
        assert_eq!(p.kill.len(), 1);
        assert_eq!(p.kill[0].name, "side");
        // While the app runs, a crashed sidecar is restarted.
        let p = t.plan(vec![view("side", 0, exited(1)), view("a", 0, ViewState::Running)]);
        assert_eq!(names(&p), ["side"]);
    }

    #[test]
    fn only_the_latest_attempt_may_run() {
        let t = T::new(serde_json::json!({"metadata":{"name":"p"},"spec":{"containers":[{"name":"a","image":"x"}]}}));
        // Attempt 1 runs; attempt 0, left by an agent killed mid-start, is still created.
        let mut old = view("a", 0, ViewState::Created);
        old.created_at = Utc::now() - chrono::Duration::seconds(5);
        let p = t.plan(vec![view("a", 1, ViewState::Running), old]);
        assert_eq!(p.kill.len(), 1);
        assert_eq!(
            (p.kill[0].id.as_str(), p.kill[0].reason.as_str()),
            ("a-0", "a newer attempt of the container exists")
        );
        assert!(p.start.is_empty());
        // A container the spec does not name is stopped too.
        let p = t.plan(vec![
            view("a", 0, ViewState::Running),
            view("gone", 0, ViewState::Running),
        ]);
        assert_eq!(p.kill.len(), 1);
        assert_eq!(p.kill[0].name, "gone");
        // Exited older attempts are history, not strays.
        let p = t.plan(vec![view("a", 1, ViewState::Running), view("a", 0, exited(1))]);
        assert!(p.kill.is_empty());
    }
}
