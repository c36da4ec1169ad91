//! The end of a pod on the node, in kubelet's two steps. SyncTerminatingPod: liveness and
//! startup probes stop, the app containers (and a running regular init container) get their
//! preStop hooks and stop signals all at once, then the sidecars in reverse order with what is
//! left of the grace period; readiness keeps being reported meanwhile. SyncTerminatedPod:
//! containers, sandbox, network, volumes, cgroup, logs and directories are removed, and the
//! pod leaves the pod table.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::lifecycle::Msg;
use super::pod_worker::PodWorker;
use crate::kuberuntime::container::pod_log_dir;
use crate::kuberuntime::kill::{kill_container, MIN_POD_GRACE};
use crate::kuberuntime::views::{ContainerView, PodContainers};
use crate::pod::{self};
use crate::prober;
use crate::tasks::blocking;

/// kubelet's order of stopping a pod: the app containers (and any running regular init
/// container) first, all at once; then the running sidecars one by one, the last declared
/// first.
pub(super) fn termination_order(p: &Pod, views: &PodContainers) -> (Vec<ContainerView>, Vec<ContainerView>) {
    let first = views
        .all()
        .filter(|v| v.is_active() && !pod::is_sidecar_name(p, &v.name))
        .cloned()
        .collect();
    let sidecars = pod::init_containers(p)
        .iter()
        .rev()
        .filter(|c| pod::is_sidecar(c))
        .filter_map(|c| views.latest(&c.name).filter(|v| v.is_running()).cloned())
        .collect();
    (first, sidecars)
}

impl PodWorker {
    pub(super) async fn sync_terminating_pod(&mut self) {
        info!(pod = %pod::full_name(&self.pod), "terminating pod");
        let grace = Duration::from_secs(pod::grace_period(&self.pod) as u64);
        self.stop_containers(grace).await;
    }

    /// Stop every container of the pod within `grace`, in kubelet's order: liveness and startup
    /// probes first (no kill may come from them now; readiness keeps running so the pod can turn
    /// not-ready while its containers wind down), then the app containers (and any running
    /// regular init container) all at once, then the sidecars in reverse order with what is
    /// left of the grace period. Each stop signal gets at least [`MIN_POD_GRACE`] (1 s), not the
    /// 2 s a container killed inside a running pod gets: kubelet passes a pod's termination its
    /// effective grace period as an override. Messages arriving meanwhile are applied.
    pub(super) async fn stop_containers(&mut self, grace: Duration) {
        let name = pod::full_name(&self.pod);
        self.probes.stop_kinds(&[prober::Kind::Liveness, prober::Kind::Startup]);
        let views = self.views().await;
        let (first, sidecars) = termination_order(&self.pod, &views);
        let first: Vec<_> = first
            .into_iter()
            .map(|v| self.kill_one(v, grace, MIN_POD_GRACE))
            .collect();
        let sidecars: Vec<_> = sidecars
            .into_iter()
            .map(|v| {
                let spec = pod::container(&self.pod, &v.name).cloned();
                (v, spec)
            })
            .collect();
        let (rt, target, pod_name) = (self.m.rt.clone(), self.target(), name.clone());
        let stopping = async move {
            // A grace period from the manifest can be anything: far enough is far enough.
            let now = tokio::time::Instant::now();
            let deadline = now
                .checked_add(grace)
                .unwrap_or(now + Duration::from_secs(86_400 * 365));
            futures::future::join_all(first).await;
            for (v, spec) in sidecars {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                kill_container(
                    rt.clone(),
                    spec,
                    target.clone(),
                    pod_name.clone(),
                    v,
                    left,
                    MIN_POD_GRACE,
                )
                .await;
            }
        };
        tokio::pin!(stopping);
        loop {
            tokio::select! {
                _ = &mut stopping => break,
                m = self.inbox.rx.recv() => match m {
                    Some(Msg::Probe(ev)) => {
                        let reason = self.probe_kill_message(&ev);
                        self.probes.apply(&ev, reason);
                        let v = self.views().await;
                        self.publish_status(&v).await;
                    }
                    // An update, a removal or a kill waits its turn: applied now, acted on
                    // once the containers are stopped.
                    Some(m) => self.take(m),
                    None => {}
                },
            }
        }
    }

    /// Remove everything the pod had on the node. Returns whether all of it went; what could not
    /// be removed is kept (containers, sandbox) for the next attempt, and the pod stays in the
    /// pod table, terminating, until then.
    pub(super) async fn sync_terminated_pod(&mut self) -> bool {
        let name = pod::full_name(&self.pod);
        self.probes.stop_all();
        let mut clean = true;
        for id in self.containers.known.clone() {
            match crate::kuberuntime::log_links::remove_container(&self.m.rt, &self.m.cfg.container_log_link_dir, &id)
                .await
            {
                Ok(()) => {
                    self.containers.known.remove(&id);
                }
                Err(e) => {
                    warn!(pod = %name, container = %id, error = %ferrolet_fsutil::chain(&e), "removing container");
                    clean = false;
                }
            }
        }
        if !clean {
            // The pod's sandbox and cgroup still hold containers: nothing more can go yet.
            return false;
        }
        let sandbox = self.resources.sandbox.clone();
        if !self.m.setup.teardown(&self.pod, &self.pod_dir, sandbox).await {
            return false;
        }
        self.resources.sandbox = None;
        let logs = pod_log_dir(&self.m.cfg, &self.pod);
        let removed = blocking(move || match std::fs::remove_dir_all(&logs) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        })
        .await;
        if let Err(e) = removed {
            warn!(pod = %name, error = %format!("{e:#}"), "removing the pod's logs");
            return false;
        }
        self.m.pods.remove(&self.uid);
        // Its devices are the next pods' (kubelet's UpdateAllocatedDevices).
        self.m.devices.free_pod(&self.uid, "the pod was removed");
        info!(pod = %name, "pod removed");
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberuntime::views::ViewState;
    use crate::worker::plan::tests::{exited, view};

    #[test]
    fn apps_and_a_running_init_container_stop_first_then_sidecars_last_declared_first() {
        let p: Pod = serde_json::from_value(serde_json::json!({"metadata":{"name":"p"},"spec":{
            "initContainers":[
                {"name":"log","image":"x","restartPolicy":"Always"},
                {"name":"setup","image":"x"},
                {"name":"proxy","image":"x","restartPolicy":"Always"},
                {"name":"gone","image":"x","restartPolicy":"Always"}],
            "containers":[{"name":"a","image":"x"},{"name":"b","image":"x"},{"name":"c","image":"x"}]}}))
        .unwrap();
        let views = PodContainers::new(vec![
            view("log", 0, ViewState::Running),
            view("setup", 0, ViewState::Running),
            view("proxy", 0, ViewState::Running),
            view("gone", 0, exited(1)),
            view("a", 0, ViewState::Running),
            view("b", 0, exited(0)),
            view("c", 0, ViewState::Running),
        ]);
        let (first, sidecars) = termination_order(&p, &views);
        let names = |vs: &[ContainerView]| vs.iter().map(|v| v.name.clone()).collect::<Vec<_>>();
        // all at once: their order does not matter
        let mut first = names(&first);
        first.sort();
        assert_eq!(first, ["a", "c", "setup"]);
        assert_eq!(names(&sidecars), ["proxy", "log"]);
    }
}
