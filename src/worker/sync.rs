//! SyncPod (kubelet's SyncPod and kuberuntime's SyncPod): one round of converging what runs to
//! what the pod asks for. The pod's cgroup, sandbox, volumes and files first; then the plan
//! ([`super::plan`]) from the containers as they are, its kills and starts; then the dead
//! attempts nobody needs are removed and the status is published.

use std::time::Duration;

use chrono::{DateTime, Utc};
use ferrolet_runtime::digest::Digest;
use tracing::warn;

use super::lifecycle::{Lifecycle, RETRY};
use super::plan::{self, Plan, PlanInput, Start};
use super::pod_worker::PodWorker;
use crate::kuberuntime::container::BuildInput;
use crate::kuberuntime::kill::MIN_GRACE;
use crate::kuberuntime::labels::{self, ContainerKind};
use crate::kuberuntime::start;
use crate::kuberuntime::views::PodContainers;
use crate::pod::reasons::{self, Waiting};
use crate::pod::units::format_duration;
use crate::pod::{self};

impl PodWorker {
    /// One round of SyncPod. Returns when the worker wants to run again (a back-off expiry).
    pub(super) async fn sync_pod(&mut self) -> Option<DateTime<Utc>> {
        if self.report.start_time.is_none() {
            self.report.start_time = Some(Utc::now());
            crate::metrics::start_phase(pod::name(&self.pod), "worker");
        }
        let deadline = self.check_active_deadline();
        if self.report.killed.is_some() {
            self.sync_killed_pod().await;
            return None;
        }
        if let Some(mirrors) = self.m.mirrors.as_ref().filter(|_| pod::is_static(&self.pod)) {
            mirrors.ensure(self.pod.clone());
        }
        if let Err(e) = self.prepare_pod().await {
            warn!(pod = %pod::full_name(&self.pod), error = %format!("{e:#}"), "pod setup failed; will retry");
            let views = self.views().await;
            // A container that runs keeps running and says so: a refresh that failed (a
            // ConfigMap the API server would not give for a while) is no reason to show it as
            // being created again.
            for c in pod::all_containers(&self.pod) {
                if !views.latest(&c.name).is_some_and(|v| v.is_active()) {
                    self.report.waiting.insert(
                        c.name.clone(),
                        Waiting::new(reasons::CONTAINER_CREATING, format!("{e:#}")),
                    );
                }
            }
            self.publish_status(&views).await;
            return Some(Utc::now() + chrono::Duration::from_std(RETRY).unwrap_or_default());
        }
        let views = self.views().await;
        if self.report.last.is_none() {
            // A new pod has a status before its first container starts (kubelet's SyncPod
            // publishes before the runtime's): a pod of many containers takes a while.
            self.publish_status(&views).await;
            crate::metrics::start_phase(pod::name(&self.pod), "status");
        }
        for v in views.all() {
            if v.is_active() {
                self.watch(&v.id.clone());
            }
        }
        self.record_termination_messages(&views);
        let targets = self.sync_probes(&views);
        let startup_pending = self.probes.startup_pending(&targets);
        let unhealthy = self.probes.unhealthy(&targets);
        let hashes = self.hashes();
        let plan = plan::plan(&PlanInput {
            pod: &self.pod,
            containers: &views,
            hashes: &hashes,
            backoff: &self.restarts,
            now: Utc::now(),
            startup_pending: &startup_pending,
            unhealthy: &unhealthy,
        });
        self.report.initialized = plan.initialized;
        let wake = self.execute(&plan, &views).await;
        // Read again only when this round changed what runs (an idle resync reads once).
        let mut views = if plan.kill.is_empty() && plan.start.is_empty() {
            views
        } else {
            self.views().await
        };
        if self.remove_dead(&views).await {
            views = self.views().await;
        }
        // Containers started just now get their probes at once, not at the next resync.
        self.sync_probes(&views);
        self.publish_status(&views).await;
        match (wake, deadline) {
            (Some(w), Some(d)) => Some(w.min(d)),
            (w, d) => w.or(d),
        }
    }

    /// Pod directory and cgroup, sandbox (recreated when it no longer serves), volumes and the
    /// files kubelet manages.
    async fn prepare_pod(&mut self) -> anyhow::Result<()> {
        let m = self.m.clone();
        // The phases of a pod's first start (docs/start-path.md), not of every resync.
        let first = self.report.last.is_none();
        let pod_json_written = self.resources.done.pod_json_for(&self.pod);
        m.setup.prepare(&self.pod, &self.pod_dir, pod_json_written).await?;
        self.resources.done.pod_json = Some(self.pod.clone());
        if first {
            crate::metrics::start_phase(pod::name(&self.pod), "cgroup");
            // A new pod: its containers come after the sandbox and the rest of this round.
            self.warm_cgroup_migrations();
        }
        let usable = self
            .resources
            .sandbox
            .as_ref()
            .is_some_and(|s| m.setup.sandbox_usable(s));
        if self.resources.sandbox_unreadable {
            // The containers run in namespaces (and on an IP) nobody can name any more: never
            // start new ones beside them in a new sandbox as if nothing had happened.
            self.event(
                None,
                reasons::EVENT_SANDBOX_CHANGED,
                "Pod sandbox record unreadable, it will be killed and re-created.",
            );
            self.kill_all("the pod sandbox record is unreadable").await;
            if m.setup.network().enabled() {
                // Without a readable record the old network is not live: collected as a leak.
                m.setup.network().collect_garbage().await?;
            }
            self.resources.sandbox_unreadable = false;
        } else if !usable {
            if let Some(old) = self.resources.sandbox.clone() {
                self.event(
                    None,
                    reasons::EVENT_SANDBOX_CHANGED,
                    "Pod sandbox changed, it will be killed and re-created.",
                );
                self.kill_all("the pod sandbox changed").await;
                // Kept until released: a failed release is retried with the next sync.
                m.setup.release_network(&old).await?;
                self.resources.sandbox = None;
            }
        }
        if !usable {
            // kubelet's generatePodSandboxConfig: a sandbox that cannot be configured is not
            // made, and the pod stays Pending.
            if let Err(why) = crate::podsetup::dns::uts_hostname(&self.pod, &m.cfg.cluster_domain) {
                let message = format!("Failed to create pod sandbox: {why}");
                self.event(None, reasons::EVENT_FAILED_CREATE_POD_SANDBOX, &message);
                anyhow::bail!(message);
            }
            self.resources.sandbox = Some(m.setup.create_sandbox(&self.pod, &self.pod_dir).await?);
        }
        let facts = self.facts();
        // The Node, for the node affinity of the pod's PersistentVolumes.
        let node = crate::objects::claims::has_claims(&self.pod).then(|| m.node_object());
        self.resources.volumes = match m
            .setup
            .mount_volumes(&self.pod, &self.pod_dir, &facts, self.resources.sandbox.as_ref(), node)
            .await
        {
            Ok(v) => v,
            Err(e) => {
                if let Some(f) = e.downcast_ref::<crate::volumemanager::volumes::SetUpFailed>() {
                    self.event(None, reasons::EVENT_FAILED_MOUNT, &f.to_string());
                }
                return Err(e);
            }
        };
        if first {
            crate::metrics::start_phase(pod::name(&self.pod), "volumes");
        }
        // kubelet writes these files once, when the sandbox is made; here they follow the pod
        // and its IPs, and an idle resync has nothing to write.
        if !self.resources.done.managed_files_for(&self.pod, &facts.pod_ips) {
            m.setup
                .write_managed_files(&self.pod, &self.pod_dir, &facts.pod_ips)
                .await?;
            self.resources.done.managed_files = Some((self.pod.clone(), facts.pod_ips.clone()));
        }
        if first {
            crate::metrics::start_phase(pod::name(&self.pod), "managed_files");
        }
        Ok(())
    }

    /// Carry out a plan: kills first, then starts in order. Returns the earliest time a
    /// container waiting out a back-off or a failed start should be tried again.
    async fn execute(&mut self, plan: &Plan, views: &PodContainers) -> Option<DateTime<Utc>> {
        let mut wake = plan.wake_at;
        // Kill first (spec changes, failed probes, completed pods' sidecars).
        let kills: Vec<_> = plan
            .kill
            .iter()
            .filter_map(|k| {
                let v = views.all().find(|v| v.id == k.id).cloned()?;
                self.event(
                    Some(&k.name),
                    reasons::EVENT_KILLING,
                    &format!("Stopping container {}: {}", k.name, k.reason),
                );
                // A probe's own terminationGracePeriodSeconds applies to the kill it causes.
                let probe_grace = pod::container(&self.pod, &k.name).and_then(|c| {
                    [c.liveness_probe.as_ref(), c.startup_probe.as_ref()]
                        .into_iter()
                        .flatten()
                        .find_map(|p| p.termination_grace_period_seconds)
                });
                let grace = match probe_grace {
                    Some(g) if k.reason.contains("probe") => g.max(1) as u64,
                    _ => pod::grace_period(&self.pod) as u64,
                };
                Some(self.kill_one(v, Duration::from_secs(grace), MIN_GRACE))
            })
            .collect();
        futures::future::join_all(kills).await;

        // Waiting reasons: back-offs from this plan; started containers lose theirs below.
        for (name, (_, d)) in &plan.backing_off {
            let msg = format!(
                "back-off {} restarting failed container={name} pod={}",
                format_duration(*d),
                pod::full_name(&self.pod)
            );
            if self.report.waiting.get(name).map(|w| w.reason) != Some(reasons::CRASH_LOOP_BACK_OFF) {
                self.event(
                    Some(name),
                    reasons::EVENT_BACK_OFF,
                    &format!("Back-off restarting failed container {name}"),
                );
            }
            self.report
                .waiting
                .insert(name.clone(), Waiting::new(reasons::CRASH_LOOP_BACK_OFF, msg));
        }
        // A container no longer waiting (running, or exited for good) has no waiting reason.
        let waiting_names: Vec<String> = self.report.waiting.keys().cloned().collect();
        for name in waiting_names {
            let starting = plan.start.iter().any(|s| s.name == name);
            if !plan.backing_off.contains_key(&name) && !starting {
                if let Some(v) = views.latest(&name) {
                    if v.is_running() || v.exit().is_some() {
                        self.report.waiting.remove(&name);
                    }
                }
            }
        }
        if !plan.start.is_empty() {
            self.warm_cgroup_migrations();
        }
        let mut published = std::time::Instant::now();
        for s in &plan.start {
            // The pod was asked to stop (or killed) while an image was being pulled.
            if self.stopping() {
                break;
            }
            // A long round (many containers) shows its progress at most every second.
            if published.elapsed() >= Duration::from_secs(1) {
                let v = self.views().await;
                self.publish_status(&v).await;
                published = std::time::Instant::now();
            }
            let started = self.start_one(s).await;
            let container_type = match s.kind {
                ContainerKind::App => "container",
                ContainerKind::Ephemeral => "ephemeral_container",
                ContainerKind::Init | ContainerKind::Sidecar => "init_container",
            };
            crate::metrics::global().container_started(container_type, started.as_ref().err().map(|w| w.reason));
            match started {
                Ok(()) => {
                    self.report.waiting.remove(&s.name);
                }
                Err(w) => {
                    warn!(pod = %pod::full_name(&self.pod), container = %s.name, reason = w.reason, "{}", w.message);
                    if let Some(t) = w.retry_at {
                        wake = Some(wake.map_or(t, |x: DateTime<Utc>| x.min(t)));
                    }
                    self.report.waiting.insert(s.name.clone(), w);
                    // An init container that cannot start blocks the ones after it.
                    if matches!(s.kind, ContainerKind::Init | ContainerKind::Sidecar) {
                        break;
                    }
                }
            }
        }
        wake
    }

    /// The image of `c`, pulled if need be, while the pod's messages are still taken: a pod
    /// asked to stop meanwhile cancels the pull (kubelet cancels the sync's context).
    async fn pull_unless_stopped(&mut self, c: &k8s_openapi::api::core::v1::Container) -> Result<Digest, Waiting> {
        let (m, pod, c) = (self.m.clone(), self.pod.clone(), c.clone());
        let pull = async move { m.images.ensure_image_exists(&pod, &c).await };
        self.unless_stopped(pull, "the image pull").await?
    }

    /// Run `work` while the pod's messages are still taken: a pod asked to stop meanwhile
    /// cancels it (`what`, for the waiting message) and the start waits.
    async fn unless_stopped<T>(
        &mut self,
        work: impl std::future::Future<Output = T>,
        what: &str,
    ) -> Result<T, Waiting> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                r = &mut work => return Ok(r),
                msg = self.inbox.rx.recv() => match msg {
                    Some(msg) => {
                        self.take(msg);
                        if self.stopping() {
                            return Err(Waiting::new(
                                reasons::CONTAINER_CREATING,
                                format!("the pod is being stopped; {what} was cancelled"),
                            )
                            .retry_at(Utc::now()));
                        }
                    }
                    None => return Ok((&mut work).await),
                },
            }
        }
    }

    /// Containers are about to be created: keep cgroup migrations warm for the rest of the
    /// round (docs/start-path.md, "The cgroup migration wait").
    fn warm_cgroup_migrations(&mut self) {
        if self.warm.is_none() {
            self.warm = Some(self.m.setup.warm_cgroup_migrations());
        }
    }

    /// The pod is to stop: removed, or killed for good.
    fn stopping(&self) -> bool {
        self.inbox.lifecycle != Lifecycle::Syncing || self.report.killed.is_some()
    }

    /// Create, start and hook one container (kubelet's startContainer), keeping track of what
    /// was created.
    async fn start_one(&mut self, s: &Start) -> Result<(), Waiting> {
        let Some(c) = pod::container_spec(&self.pod, &s.name) else {
            return Err(Waiting::new(
                reasons::CREATE_CONTAINER_CONFIG_ERROR,
                format!("container {} is not in the pod spec", s.name),
            ));
        };
        let Some(sandbox) = self.resources.sandbox.clone() else {
            return Err(Waiting::new(reasons::CONTAINER_CREATING, "the pod sandbox is not ready").retry_at(Utc::now()));
        };
        let m = self.m.clone();
        // The image first, as kubelet's startContainer. A pull may take long (it has its own
        // progress timeout): /healthz must not call the worker stuck meanwhile, so the round's
        // clock stops during it and starts again after.
        let duty = self.duty();
        m.liveness.done(&duty);
        let image = self.pull_unless_stopped(&c).await;
        m.liveness.busy(&duty, self.round_limit());
        let image_id = image?;
        let first = s.attempt == 0;
        if first {
            crate::metrics::start_phase(pod::name(&self.pod), "image");
        }
        let pod_cgroup = m.setup.cgroups().pod_path(&self.pod);
        let facts = self.facts();
        let env_objects = m.setup.env_objects(&self.pod, &c).await;
        for w in crate::kuberuntime::env::invalid_env_from_keys(&self.pod, &c, &env_objects) {
            self.event(None, reasons::EVENT_INVALID_ENV_VAR_NAMES, &w);
        }
        let pid_namespace = match s.kind {
            ContainerKind::Ephemeral => self.target_pid_namespace(&s.name).await?,
            _ => None,
        };
        // Device plugins' devices, asked for (and kept) at the first start (kubelet allocates
        // them at admission), and their plugins' PreStartContainer at every start. Every call
        // has a deadline; a failure waits here, is a Warning event naming the resource and its
        // plugin (kubelet's Failed "Error: ..." of a container whose config cannot be made),
        // and is retried after a pause, so a plugin that fails at once is not called in a loop.
        // The calls are cancelled when the pod is asked to stop meanwhile (a choice held for an
        // Allocate never answered is chosen again, or freed with the pod).
        let allocating = {
            let (m, pod, c) = (m.clone(), self.pod.clone(), c.clone());
            async move { m.devices.allocate(&pod, &c).await }
        };
        let devices = match self.unless_stopped(allocating, "the device plugins' calls").await? {
            Ok(d) => d,
            Err(e) => {
                let message = format!("allocating devices: {e}");
                self.event(Some(&c.name), reasons::EVENT_FAILED, &format!("Error: {message}"));
                return Err(Waiting::new(reasons::CREATE_CONTAINER_CONFIG_ERROR, message).retry_in(start::RETRY));
            }
        };
        let input = BuildInput {
            cfg: m.cfg.clone(),
            pod: self.pod.clone(),
            container: c.clone(),
            kind: s.kind,
            attempt: s.attempt,
            sandbox,
            pod_cgroup,
            pod_dir: self.pod_dir.clone(),
            volumes: self.resources.volumes.clone(),
            facts,
            node_memory: m.node.capacity.memory,
            env_objects,
            pid_namespace,
            devices,
        };
        let id = start::create_container(&m.rt, &m.images, input, image_id).await?;
        if first {
            crate::metrics::start_phase(pod::name(&self.pod), "created");
        }
        self.containers.known.insert(id.clone());
        self.event(
            Some(&c.name),
            reasons::EVENT_CREATED,
            &format!("Created container {}", c.name),
        );
        let backoff_key = plan::backoff_key(&c.name, &labels::hash(&c));
        if let Some(t) = s.previous_finished {
            self.restarts.next(&backoff_key, t);
        }
        if let Err(w) = start::start_created(&m.rt, &m.cfg.container_log_link_dir, &id).await {
            self.containers.known.remove(&id);
            return Err(w);
        }
        if first {
            crate::metrics::start_phase(pod::name(&self.pod), "started");
        }
        self.watch(&id);
        let image = c.image.clone().unwrap_or_default();
        self.event(
            Some(&c.name),
            reasons::EVENT_STARTED,
            &format!("Started container {} (image {image})", c.name),
        );
        // Ephemeral containers have no lifecycle hooks (the API refuses them).
        if s.kind == ContainerKind::Ephemeral {
            return Ok(());
        }
        let timeout = m.cfg.runtime_request_timeout;
        if let Err(w) = start::run_post_start(&m.rt, &self.pod, &c, &id, &self.target(), timeout).await {
            // The restart that follows waits out the crash-loop back-off.
            self.restarts.next(&backoff_key, Utc::now());
            return Err(w);
        }
        Ok(())
    }

    /// The process namespace of the container the ephemeral container `name` targets
    /// (`targetContainerName`), through its init: it must be running, as kubelet requires
    /// (the start is retried until it is).
    async fn target_pid_namespace(&mut self, name: &str) -> Result<Option<std::path::PathBuf>, Waiting> {
        let Some(target) = pod::ephemeral_target(&self.pod, name).map(str::to_string) else {
            return Ok(None);
        };
        let not_running = || {
            Waiting::new(
                reasons::CREATE_CONTAINER_CONFIG_ERROR,
                format!("the target container {target:?} of ephemeral container {name:?} is not running"),
            )
            .retry_in(start::RETRY)
        };
        let views = self.views().await;
        let v = views
            .latest(&target)
            .filter(|v| v.is_running())
            .ok_or_else(not_running)?;
        let pid = self
            .m
            .rt
            .inspect(&v.id)
            .ok()
            .and_then(|i| i.monitor)
            .map(|m| m.init_pid)
            .filter(|p| *p > 0)
            .ok_or_else(not_running)?;
        Ok(Some(std::path::PathBuf::from(format!("/proc/{pid}/ns/pid"))))
    }

    /// Keep the newest two attempts of each container (the current one and the one behind
    /// `lastState` / `logs --previous`); delete older ones and their logs. Returns whether any
    /// went.
    async fn remove_dead(&mut self, views: &PodContainers) -> bool {
        let mut removed = false;
        for list in views.by_name.values() {
            for v in list.iter().skip(2) {
                if v.is_running() {
                    continue;
                }
                match crate::kuberuntime::gc::remove_container(
                    &self.m.rt,
                    &self.m.cfg.container_log_link_dir,
                    &v.id,
                    &v.log_path,
                )
                .await
                {
                    Ok(()) => {
                        removed = true;
                        self.containers.known.remove(&v.id);
                        self.containers.messages.remove(&v.id);
                    }
                    Err(e) => warn!(container = %v.id, error = %ferrolet_fsutil::chain(&e), "removing dead container"),
                }
            }
        }
        removed
    }
}
