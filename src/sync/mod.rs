//! Pod workers: one task per pod, updates applied in order, and a sync loop that converges
//! what runs to what the pod asks for (kubelet's podWorkers + SyncPod): pod cgroup, sandbox,
//! volumes, then containers as [`plan`] decides, then status. Container exits, back-off
//! expiries and the periodic resync wake the worker; deletion runs the termination sequence
//! and removes everything the pod had.

pub mod backoff;
pub mod container;
pub mod dns;
pub mod env;
pub mod hooks;
pub mod plan;
pub mod sandbox;
pub mod views;
pub mod volumes;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ferrolet_fsutil::{read_json_opt, write_json_atomic};
use ferrolet_runtime::Runtime;
use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::config::Config;
use crate::node::NodeInfo;
use crate::pod;
use crate::podcgroups::PodCgroups;
use crate::podmanager::PodManager;
use backoff::Backoff;
use plan::{Kind, Plan, PlanInput, Start};
use sandbox::Sandbox;
use views::{ContainerView, PodContainers};
use volumes::VolumeHost;

/// What every worker shares.
pub struct Ctx {
    pub cfg: Config,
    pub rt: Arc<Runtime>,
    pub node: NodeInfo,
    pub pods: Arc<PodManager>,
    pub cgroups: PodCgroups,
    pub net: crate::network::PodNetwork,
}

impl Ctx {
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.cfg.pods_dir().join(uid)
    }
}

#[derive(Debug)]
pub enum Msg {
    /// A new version of the pod (same UID).
    Update(Arc<Pod>),
    /// The pod is no longer wanted: terminate it and clean up.
    Delete,
    /// Something changed (a container exited): sync now.
    Wake,
    /// A probe result changed.
    Probe(crate::probe::ProbeEvent),
}

pub struct Worker {
    ctx: Arc<Ctx>,
    uid: String,
    pod: Arc<Pod>,
    pod_dir: PathBuf,
    rx: mpsc::UnboundedReceiver<Msg>,
    tx: mpsc::UnboundedSender<Msg>,
    /// Runtime container ids of this pod.
    known: BTreeSet<String>,
    watched: HashSet<String>,
    backoff: Backoff,
    image_backoff: Backoff,
    /// Why a container waits: name -> (reason, message).
    waiting: BTreeMap<String, (String, String)>,
    /// Termination messages by container id.
    messages: BTreeMap<String, String>,
    sandbox: Option<Sandbox>,
    volumes: BTreeMap<String, VolumeHost>,
    rejected: Option<(String, String)>,
    start_time: Option<DateTime<Utc>>,
    status: Option<PodStatus>,
    deleting: bool,
    initialized: bool,
    probes: crate::probe::Probes,
}

/// The least time a container gets between its stop signal and SIGKILL (kubelet's).
const MIN_GRACE: Duration = Duration::from_secs(2);

/// The first resync after a failure that needs a retry.
const RETRY: Duration = Duration::from_secs(5);

impl Worker {
    /// A worker for `pod`, adopting `known` containers (found in the runtime at start).
    pub fn spawn(
        ctx: Arc<Ctx>,
        pod: Arc<Pod>,
        known: Vec<String>,
        rejected: Option<(String, String)>,
        deleting: bool,
    ) -> mpsc::UnboundedSender<Msg> {
        let (tx, rx) = mpsc::unbounded_channel();
        let uid = pod::uid(&pod).to_string();
        let pod_dir = ctx.pod_dir(&uid);
        let previous: Option<PersistedStatus> = read_json_opt(&pod_dir.join("status.json")).ok().flatten();
        let w = Worker {
            backoff: Backoff::new(
                ctx.cfg.initial_container_restart_period,
                ctx.cfg.max_container_restart_period,
            ),
            image_backoff: Backoff::new(Duration::from_secs(10), Duration::from_secs(300)),
            sandbox: sandbox::load(&pod_dir),
            start_time: previous.as_ref().and_then(|p| p.start_time),
            status: previous.map(|p| p.status),
            ctx,
            uid,
            pod,
            pod_dir,
            rx,
            tx: tx.clone(),
            known: known.into_iter().collect(),
            watched: HashSet::new(),
            waiting: BTreeMap::new(),
            messages: BTreeMap::new(),
            volumes: BTreeMap::new(),
            rejected,
            deleting,
            initialized: false,
            probes: crate::probe::Probes::default(),
        };
        tokio::spawn(w.run());
        tx
    }

    async fn run(mut self) {
        self.ctx.pods.upsert(&self.uid, self.pod.clone(), self.status.clone());
        loop {
            if self.deleting {
                self.terminate().await;
                return;
            }
            let wake = self.sync().await;
            let now = Utc::now();
            let mut delay = self.ctx.cfg.sync_frequency;
            if let Some(w) = wake {
                let d = (w - now).to_std().unwrap_or(Duration::ZERO) + Duration::from_millis(50);
                delay = delay.min(d);
            }
            tokio::select! {
                m = self.rx.recv() => match m {
                    None => return,
                    Some(m) => self.handle(m),
                },
                _ = tokio::time::sleep(delay) => {}
            }
            // Coalesce whatever else is queued into one sync.
            while let Ok(m) = self.rx.try_recv() {
                self.handle(m);
            }
        }
    }

    fn handle(&mut self, m: Msg) {
        match m {
            Msg::Update(p) => {
                self.pod = p;
                self.ctx.pods.upsert(&self.uid, self.pod.clone(), None);
            }
            Msg::Delete => {
                self.deleting = true;
                self.ctx.pods.set_terminating(&self.uid);
            }
            Msg::Wake => {}
            Msg::Probe(ev) => {
                let reason = self.probe_kill_message(&ev);
                if !ev.success && ev.kind != crate::probe::Kind::Readiness {
                    self.event("Killing", &reason);
                }
                self.probes.apply(&ev, reason);
            }
        }
    }

    /// kubelet's words for a kill a liveness or startup probe causes.
    fn probe_kill_message(&self, ev: &crate::probe::ProbeEvent) -> String {
        let kind = ev.kind.name().to_ascii_lowercase();
        let sidecar = pod::init_containers(&self.pod)
            .iter()
            .any(|c| c.name == ev.container && pod::is_sidecar(c));
        if sidecar {
            format!("Init container {} failed {kind} probe", ev.container)
        } else if pod::restart_policy(&self.pod) == "Never" {
            format!("Container {} failed {kind} probe", ev.container)
        } else {
            format!("Container {} failed {kind} probe, will be restarted", ev.container)
        }
    }

    /// Where the pod's ports are reached (probes, hooks).
    fn target(&self) -> crate::netns::PodTarget {
        crate::netns::PodTarget {
            ip: self.pod_ips().first().and_then(|ip| ip.parse().ok()),
            netns: self.sandbox.as_ref().and_then(|s| s.net.clone()),
        }
    }

    /// The pod's IPs: the node's for hostNetwork pods.
    fn pod_ips(&self) -> Vec<String> {
        if pod::host_network(&self.pod) {
            return self.ctx.node.ip_strings();
        }
        self.sandbox.as_ref().map(|s| s.pod_ips.clone()).unwrap_or_default()
    }

    /// Start and stop probe tasks to match the running containers; returns them.
    fn sync_probes(&mut self, views: &PodContainers) -> Vec<crate::probe::Target> {
        let targets = self.probe_targets(views);
        let tx = self.tx.clone();
        let target = self.target();
        self.probes
            .sync(&self.ctx.rt, &pod::full_name(&self.pod), &target, &targets, move |ev| {
                let _ = tx.send(Msg::Probe(ev));
            });
        targets
    }

    /// Running app containers and sidecars, for the probes.
    fn probe_targets(&self, views: &PodContainers) -> Vec<crate::probe::Target> {
        pod::containers(&self.pod)
            .iter()
            .chain(pod::init_containers(&self.pod).iter().filter(|c| pod::is_sidecar(c)))
            .filter_map(|c| {
                let v = views.latest(&c.name).filter(|v| v.is_running())?;
                Some(crate::probe::Target {
                    name: c.name.clone(),
                    id: v.id.clone(),
                    started_at: v.started_at.unwrap_or(v.created_at),
                    spec: c.clone(),
                })
            })
            .collect()
    }

    fn event(&self, reason: &str, message: &str) {
        info!(pod = %pod::full_name(&self.pod), reason, "{message}");
    }

    fn views(&mut self) -> PodContainers {
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for id in &self.known {
            match self.ctx.rt.inspect(id) {
                Ok(info) => {
                    if let Some(v) = ContainerView::from_info(&info) {
                        out.push(v);
                    }
                }
                Err(e) if e.is_not_found() => gone.push(id.clone()),
                Err(e) => {
                    warn!(pod = %pod::full_name(&self.pod), container = %id, error = %ferrolet_fsutil::chain(&e), "reading container state")
                }
            }
        }
        for id in gone {
            self.known.remove(&id);
        }
        PodContainers::new(out)
    }

    fn watch(&mut self, id: &str) {
        if !self.watched.insert(id.to_string()) {
            return;
        }
        let rt = self.ctx.rt.clone();
        let tx = self.tx.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let _ = rt.wait(&id).await;
            let _ = tx.send(Msg::Wake);
        });
    }

    fn hashes(&self) -> BTreeMap<String, String> {
        pod::containers(&self.pod)
            .iter()
            .chain(pod::init_containers(&self.pod))
            .map(|c| (c.name.clone(), container::hash(c)))
            .collect()
    }

    fn container_spec(&self, name: &str) -> Option<Container> {
        pod::containers(&self.pod)
            .iter()
            .chain(pod::init_containers(&self.pod))
            .find(|c| c.name == name)
            .cloned()
    }

    fn facts(&self) -> env::PodFacts {
        env::PodFacts {
            pod_ips: self.sandbox.as_ref().map(|s| s.pod_ips.clone()).unwrap_or_default(),
            host_ips: self.ctx.node.ip_strings(),
            node_cpu_milli: self.ctx.node.allocatable_cpu_milli,
            node_memory: self.ctx.node.allocatable_memory,
            node_ephemeral_storage: self.ctx.node.ephemeral_storage,
        }
    }

    /// One pass of convergence. Returns when the worker wants to run again (back-off expiry).
    async fn sync(&mut self) -> Option<DateTime<Utc>> {
        if self.start_time.is_none() {
            self.start_time = Some(Utc::now());
        }
        if let Some((reason, message)) = self.rejected.clone() {
            let st = crate::status::rejected(&self.pod, &reason, &message, &self.ctx.node.ip_strings());
            self.publish(st);
            return None;
        }
        match self.prepare_pod().await {
            Ok(()) => {}
            Err(e) => {
                warn!(pod = %pod::full_name(&self.pod), error = %format!("{e:#}"), "pod setup failed; will retry");
                for c in pod::containers(&self.pod).iter().chain(pod::init_containers(&self.pod)) {
                    self.waiting
                        .insert(c.name.clone(), ("ContainerCreating".into(), format!("{e:#}")));
                }
                let views = self.views();
                self.publish_status(&views);
                return Some(Utc::now() + chrono::Duration::from_std(RETRY).unwrap_or_default());
            }
        }
        let views = self.views();
        for v in views.all() {
            if v.is_running() || matches!(v.state, views::ViewState::Created) {
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
            backoff: &self.backoff,
            now: Utc::now(),
            startup_pending: &startup_pending,
            unhealthy: &unhealthy,
        });
        self.initialized = plan.initialized;
        let wake = self.execute(&plan, &views).await;
        let views = self.views();
        self.gc(&views).await;
        let views = self.views();
        // Containers started just now get their probes at once, not at the next resync.
        self.sync_probes(&views);
        self.publish_status(&views);
        wake
    }

    /// Pod cgroup, sandbox, volumes and the managed files.
    async fn prepare_pod(&mut self) -> anyhow::Result<()> {
        use anyhow::Context;
        std::fs::create_dir_all(&self.pod_dir).with_context(|| format!("creating {}", self.pod_dir.display()))?;
        write_json_atomic(&self.pod_dir.join("pod.json"), &*self.pod)
            .map_err(|e| anyhow::anyhow!("{}", ferrolet_fsutil::chain(&e)))?;
        self.ctx.cgroups.ensure_pod(&self.pod, self.ctx.cfg.pod_pids_limit)?;
        let net = &self.ctx.net;
        let want = net.enabled().then(|| net.settings().mode.as_str());
        let live = self.sandbox.as_ref().is_some_and(|s| s.is_live(want));
        if !live {
            if let Some(old) = self.sandbox.clone() {
                self.event(
                    "SandboxChanged",
                    "Pod sandbox changed, it will be killed and re-created.",
                );
                self.kill_all("the pod sandbox changed").await;
                // Kept until released: a failed release is retried with the next sync.
                self.detach_network(&old).await?;
                self.sandbox = None;
            }
            let sb = sandbox::create(&self.ctx.rt, &self.ctx.net, &self.pod, &self.pod_dir).await?;
            self.sandbox = Some(sb);
        }
        let facts = self.facts();
        self.volumes = volumes::setup(&self.pod, &self.pod_dir, &facts, self.ctx.node.allocatable_memory)?;
        dns::write_files(&self.pod_dir, &self.pod, &facts.pod_ips, &self.ctx.cfg)
            .context("writing /etc/hosts and resolv.conf")?;
        Ok(())
    }

    /// Release a sandbox's network (IPs, interfaces, hostPorts) when it had one.
    async fn detach_network(&self, sb: &Sandbox) -> anyhow::Result<()> {
        if sb.network.is_none() && !(sb.net.is_some() && self.ctx.net.enabled()) {
            return Ok(());
        }
        self.ctx.net.detach(&sb.id).await
    }

    async fn execute(&mut self, plan: &Plan, views: &PodContainers) -> Option<DateTime<Utc>> {
        let mut wake = plan.wake_at;
        // Kill first (spec changes, failed probes, completed pods' sidecars).
        let kills: Vec<_> = plan
            .kill
            .iter()
            .filter_map(|k| {
                let v = views.all().find(|v| v.id == k.id).cloned()?;
                self.event("Killing", &format!("Stopping container {}: {}", k.name, k.reason));
                // A probe's own terminationGracePeriodSeconds applies to the kill it causes.
                let spec = self.container_spec(&k.name);
                let probe_grace = spec.as_ref().and_then(|c| {
                    [c.liveness_probe.as_ref(), c.startup_probe.as_ref()]
                        .into_iter()
                        .flatten()
                        .find_map(|p| p.termination_grace_period_seconds)
                });
                let grace = match probe_grace {
                    Some(g) if k.reason.contains("probe") => g.max(1) as u64,
                    _ => pod::grace_period(&self.pod) as u64,
                };
                Some(self.kill_one(v, Duration::from_secs(grace)))
            })
            .collect();
        futures::future::join_all(kills).await;

        // Waiting reasons: back-offs from this plan; started containers lose theirs below.
        for (name, (_, d)) in &plan.backing_off {
            let msg = format!(
                "back-off {} restarting failed container={name} pod={}",
                crate::units::format_duration(*d),
                pod::full_name(&self.pod)
            );
            if self.waiting.get(name).map(|w| w.0.as_str()) != Some("CrashLoopBackOff") {
                self.event("BackOff", &format!("Back-off restarting failed container {name}"));
            }
            self.waiting.insert(name.clone(), ("CrashLoopBackOff".into(), msg));
        }
        // A container no longer waiting (running, or exited for good) has no waiting reason.
        let waiting_names: Vec<String> = self.waiting.keys().cloned().collect();
        for name in waiting_names {
            let starting = plan.start.iter().any(|s| s.name == name);
            if !plan.backing_off.contains_key(&name) && !starting {
                if let Some(v) = views.latest(&name) {
                    if v.is_running() || v.exit().is_some() {
                        self.waiting.remove(&name);
                    }
                }
            }
        }
        for s in &plan.start {
            match self.start_one(s, views).await {
                Ok(()) => {
                    self.waiting.remove(&s.name);
                }
                Err((reason, message, retry_at)) => {
                    warn!(pod = %pod::full_name(&self.pod), container = %s.name, reason, "{message}");
                    self.waiting.insert(s.name.clone(), (reason, message));
                    if let Some(t) = retry_at {
                        wake = Some(wake.map_or(t, |w: DateTime<Utc>| w.min(t)));
                    }
                    // An init container that cannot start blocks the ones after it.
                    if s.kind != Kind::App {
                        break;
                    }
                }
            }
        }
        wake
    }

    /// Create and start one container. Errors: (reason, message, when to retry).
    async fn start_one(
        &mut self,
        s: &Start,
        _views: &PodContainers,
    ) -> Result<(), (String, String, Option<DateTime<Utc>>)> {
        let Some(c) = self.container_spec(&s.name) else {
            return Err((
                "CreateContainerConfigError".into(),
                format!("container {} is not in the pod spec", s.name),
                None,
            ));
        };
        let image = c.image.clone().unwrap_or_default();
        self.check_image(&c)?;
        let Some(sandbox) = self.sandbox.clone() else {
            return Err((
                "ContainerCreating".into(),
                "the pod sandbox is not ready".into(),
                Some(Utc::now()),
            ));
        };
        let pod_cgroup = self.ctx.cgroups.pod_path(&self.pod);
        let facts = self.facts();
        let cfg = match container::build(&container::BuildInput {
            cfg: &self.ctx.cfg,
            pod: &self.pod,
            container: &c,
            kind: s.kind,
            attempt: s.attempt,
            sandbox: &sandbox,
            pod_cgroup: &pod_cgroup,
            pod_dir: &self.pod_dir,
            volumes: &self.volumes,
            facts: &facts,
            node_memory: self.ctx.node.allocatable_memory,
        }) {
            Ok(cfg) => cfg,
            Err(e) => {
                return Err((
                    "CreateContainerConfigError".into(),
                    format!("{e:#}"),
                    Some(self.retry_at()),
                ))
            }
        };
        let timeout = self.ctx.cfg.runtime_request_timeout;
        let created = match tokio::time::timeout(timeout, self.ctx.rt.create(&cfg)).await {
            Ok(Ok(info)) => info,
            Ok(Err(ferrolet_runtime::Error::InvalidConfig { field, reason })) => {
                return Err((
                    "CreateContainerConfigError".into(),
                    format!("{field}: {reason}"),
                    Some(self.retry_at()),
                ))
            }
            Ok(Err(e)) => {
                return Err((
                    "CreateContainerError".into(),
                    ferrolet_fsutil::chain(&e).to_string(),
                    Some(self.retry_at()),
                ))
            }
            Err(_) => {
                return Err((
                    "CreateContainerError".into(),
                    format!("context deadline exceeded ({timeout:?})"),
                    Some(self.retry_at()),
                ))
            }
        };
        let id = created.id().to_string();
        self.known.insert(id.clone());
        self.event("Created", &format!("Created container {}", c.name));
        if let Some(t) = s.previous_finished {
            self.backoff.next(&plan::backoff_key(&c.name, &container::hash(&c)), t);
        }
        if let Err(e) = self.ctx.rt.start(&id).await {
            let _ = self.ctx.rt.delete(&id).await;
            self.known.remove(&id);
            return Err((
                "RunContainerError".into(),
                ferrolet_fsutil::chain(&e).to_string(),
                Some(self.retry_at()),
            ));
        }
        self.watch(&id);
        self.event("Started", &format!("Started container {} (image {image})", c.name));
        if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let timeout = self.ctx.cfg.runtime_request_timeout;
            let pod_name = pod::full_name(&self.pod);
            if let Err(msg) = hooks::run(&self.ctx.rt, h, &id, &c, &pod_name, &self.target(), timeout).await {
                warn!(pod = %pod::full_name(&self.pod), container = %c.name, reason = "FailedPostStartHook", "{msg}");
                let grace = Duration::from_secs(pod::grace_period(&self.pod) as u64);
                let signal = self.ctx.rt.inspect(&id).ok().and_then(|i| i.record.stop_signal);
                stop_container(self.ctx.rt.clone(), id.clone(), signal, grace).await;
                // The restart that follows waits out the crash-loop back-off.
                self.backoff
                    .next(&plan::backoff_key(&c.name, &container::hash(&c)), Utc::now());
                return Err(("PostStartHookError".into(), msg, Some(self.retry_at())));
            }
        }
        Ok(())
    }

    /// Stop one container: its preStop hook first (inside the grace period), then the stop
    /// signal, then SIGKILL when the rest of the grace period is over (at least 2 seconds
    /// remain for the signal, as in kubelet).
    fn kill_one(&self, v: ContainerView, grace: Duration) -> impl std::future::Future<Output = ()> + 'static {
        kill_container(
            self.ctx.rt.clone(),
            self.container_spec(&v.name),
            self.target(),
            pod::full_name(&self.pod),
            v,
            grace,
        )
    }

    fn retry_at(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::from_std(RETRY).unwrap_or_default()
    }

    /// kubelet's EnsureImageExists for a node without registry access: the image must be in
    /// the local store; a missing one is ErrImageNeverPull (policy Never) or ErrImagePull and
    /// then ImagePullBackOff, retried under back-off (an archive may be imported meanwhile).
    fn check_image(&mut self, c: &Container) -> Result<(), (String, String, Option<DateTime<Utc>>)> {
        let image = c.image.clone().unwrap_or_default();
        if self.ctx.rt.images().find(&image).is_ok() {
            self.image_backoff.forget(&image);
            return Ok(());
        }
        let policy = c.image_pull_policy.as_deref().unwrap_or("IfNotPresent");
        if policy == "Never" {
            return Err((
                "ErrImageNeverPull".into(),
                format!("Container image \"{image}\" is not present with pull policy of Never"),
                Some(self.retry_at()),
            ));
        }
        let now = Utc::now();
        if let Some((until, d)) = self.image_backoff.wait_until(&image, now, now) {
            return Err((
                "ImagePullBackOff".into(),
                format!(
                    "Back-off pulling image \"{image}\": waiting {}",
                    crate::units::format_duration(d)
                ),
                Some(until),
            ));
        }
        self.image_backoff.next(&image, now);
        let d = self.image_backoff.current(&image).unwrap_or(Duration::from_secs(10));
        Err((
            "ErrImagePull".into(),
            format!(
                "image \"{image}\" is not in the node's image store and this node pulls from no registry; import it with `ferrolet images import` or drop the archive in {}",
                self.ctx.cfg.image_import_dir.display()
            ),
            Some(now + chrono::Duration::from_std(d).unwrap_or_default()),
        ))
    }

    /// Keep the newest two attempts of each container (the current one and the one behind
    /// `lastState` / `logs --previous`); delete older ones and their logs.
    async fn gc(&mut self, views: &PodContainers) {
        for list in views.by_name.values() {
            for v in list.iter().skip(2) {
                if v.is_running() {
                    continue;
                }
                match self.ctx.rt.delete(&v.id).await {
                    Ok(()) => {
                        self.known.remove(&v.id);
                        self.messages.remove(&v.id);
                        let _ = std::fs::remove_file(&v.log_path);
                        for r in ferrolet_runtime::crilog::rotated_files(&v.log_path) {
                            let _ = std::fs::remove_file(r);
                        }
                    }
                    Err(e) => warn!(container = %v.id, error = %ferrolet_fsutil::chain(&e), "removing dead container"),
                }
            }
        }
    }

    /// Read the termination message of each container that exited, once (the file may go
    /// with the container).
    fn record_termination_messages(&mut self, views: &PodContainers) {
        for v in views.all() {
            if v.exit().is_some() && !self.messages.contains_key(&v.id) {
                let m = termination_message(v);
                self.messages.insert(v.id.clone(), m);
            }
        }
    }

    fn publish_status(&mut self, views: &PodContainers) {
        // A container may have exited since the sync began: its message goes out with its
        // terminated state, never in a later update.
        self.record_termination_messages(views);
        let targets = self.probe_targets(views);
        let readiness = self.probes.readiness(&targets);
        let startup_pending = self.probes.startup_pending(&targets);
        let pod_ips = self.pod_ips();
        let host_ips = self.ctx.node.ip_strings();
        let st = crate::status::compute(&crate::status::StatusInput {
            pod: &self.pod,
            containers: views,
            waiting: &self.waiting,
            readiness: &readiness,
            startup_pending: &startup_pending,
            messages: &self.messages,
            sandbox_ready: self.sandbox.is_some(),
            initialized: self.initialized,
            pod_ips: &pod_ips,
            host_ips: &host_ips,
            start_time: self.start_time,
            previous: self.status.as_ref(),
        });
        self.publish(st);
    }

    fn publish(&mut self, st: PodStatus) {
        let changed = self.status.as_ref() != Some(&st);
        if changed {
            let phase_before = self.status.as_ref().and_then(|s| s.phase.clone());
            if phase_before != st.phase {
                info!(pod = %pod::full_name(&self.pod), phase = st.phase.as_deref().unwrap_or(""), "pod phase");
            }
            if self.pod_dir.exists() {
                let rec = PersistedStatus {
                    start_time: self.start_time,
                    status: st.clone(),
                };
                if let Err(e) = write_json_atomic(&self.pod_dir.join("status.json"), &rec) {
                    warn!(pod = %pod::full_name(&self.pod), error = %ferrolet_fsutil::chain(&e), "saving status");
                }
            }
        }
        self.ctx.pods.set_status(&self.uid, st.clone());
        self.status = Some(st);
    }

    /// Stop every container of the pod (sandbox change).
    async fn kill_all(&mut self, why: &str) {
        let views = self.views();
        let grace = Duration::from_secs(pod::grace_period(&self.pod) as u64);
        let stops = views
            .all()
            .filter(|v| v.is_running() || matches!(v.state, views::ViewState::Created))
            .map(|v| {
                info!(pod = %pod::full_name(&self.pod), container = %v.name, "stopping: {why}");
                self.kill_one(v.clone(), grace)
            })
            .collect::<Vec<_>>();
        futures::future::join_all(stops).await;
    }

    /// The termination sequence, then removal of everything the pod had on the node.
    async fn terminate(&mut self) {
        let name = pod::full_name(&self.pod);
        info!(pod = %name, "terminating pod");
        // Liveness and startup probes stop (no kill may come from them now); readiness keeps
        // running so the pod can turn not-ready while its containers wind down.
        self.probes
            .stop_kinds(&[crate::probe::Kind::Liveness, crate::probe::Kind::Startup]);
        let grace = Duration::from_secs(pod::grace_period(&self.pod) as u64);
        let views = self.views();
        let is_sidecar = |n: &str| {
            pod::init_containers(&self.pod)
                .iter()
                .any(|c| c.name == n && pod::is_sidecar(c))
        };
        // App containers (and any running regular init container) first, all at once...
        let first: Vec<_> = views
            .all()
            .filter(|v| (v.is_running() || matches!(v.state, views::ViewState::Created)) && !is_sidecar(&v.name))
            .map(|v| self.kill_one(v.clone(), grace))
            .collect();
        // ...then sidecars in reverse order with what is left of the grace period.
        let sidecars: Vec<_> = pod::init_containers(&self.pod)
            .iter()
            .rev()
            .filter(|c| pod::is_sidecar(c))
            .filter_map(|c| views.latest(&c.name).filter(|v| v.is_running()).cloned())
            .map(|v| {
                let spec = self.container_spec(&v.name);
                (v, spec)
            })
            .collect();
        let (rt, target, pod_name) = (self.ctx.rt.clone(), self.target(), name.clone());
        let stopping = async move {
            let deadline = tokio::time::Instant::now() + grace;
            futures::future::join_all(first).await;
            for (v, spec) in sidecars {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                kill_container(rt.clone(), spec, target.clone(), pod_name.clone(), v, left).await;
            }
        };
        tokio::pin!(stopping);
        loop {
            tokio::select! {
                _ = &mut stopping => break,
                m = self.rx.recv() => {
                    if let Some(Msg::Probe(ev)) = m {
                        let reason = self.probe_kill_message(&ev);
                        self.probes.apply(&ev, reason);
                        let v = self.views();
                        self.publish_status(&v);
                    }
                }
            }
        }
        self.probes.stop_all();
        for id in self.known.clone() {
            if let Err(e) = self.ctx.rt.delete(&id).await {
                warn!(pod = %name, container = %id, error = %ferrolet_fsutil::chain(&e), "removing container");
            }
        }
        self.known.clear();
        if let Some(sb) = self.sandbox.take() {
            if let Err(e) = self.detach_network(&sb).await {
                warn!(pod = %name, error = %format!("{e:#}"), "tearing down the pod network");
            }
        }
        if let Err(e) = sandbox::teardown_local(&self.pod_dir) {
            warn!(pod = %name, error = %format!("{e:#}"), "tearing down sandbox");
        }
        if let Err(e) = volumes::teardown(&self.pod_dir) {
            warn!(pod = %name, error = %format!("{e:#}"), "tearing down volumes");
        }
        if let Err(e) = self.ctx.cgroups.remove_pod(&self.pod) {
            warn!(pod = %name, error = %format!("{e:#}"), "removing pod cgroup");
        }
        let _ = std::fs::remove_dir_all(container::pod_log_dir(&self.ctx.cfg, &self.pod));
        if let Err(e) = std::fs::remove_dir_all(&self.pod_dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(pod = %name, error = %e, "removing pod directory");
            }
        }
        self.ctx.pods.remove(&self.uid);
        info!(pod = %name, "pod removed");
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct PersistedStatus {
    start_time: Option<DateTime<Utc>>,
    status: PodStatus,
}

/// Signal a container (its image's StopSignal, else SIGTERM), wait up to `grace`, then SIGKILL.
pub async fn stop_container(rt: Arc<Runtime>, id: String, stop_signal: Option<String>, grace: Duration) {
    let sig = stop_signal
        .as_deref()
        .and_then(|s| nix::sys::signal::Signal::from_str(s).ok())
        .map(|s| s as i32)
        .unwrap_or(libc::SIGTERM);
    if let Err(e) = rt.stop(&id, sig, grace).await {
        if !e.is_not_found() {
            warn!(container = %id, error = %ferrolet_fsutil::chain(&e), "stopping container");
        }
    }
}

/// The terminated state's message: the termination message file, or with
/// FallbackToLogsOnError and a failure, the end of the log (80 lines, at most 2048 bytes).
fn termination_message(v: &ContainerView) -> String {
    const MAX: usize = 4096;
    let from_file = v
        .termination_message_file
        .as_ref()
        .and_then(|f| std::fs::read(f).ok())
        .map(|d| String::from_utf8_lossy(&d[d.len().saturating_sub(MAX)..]).into_owned())
        .unwrap_or_default();
    let failed = v.exit().is_some_and(|e| e.exit_code != 0);
    if from_file.is_empty() && failed && v.termination_message_policy == "FallbackToLogsOnError" {
        return log_tail(&v.log_path, 80, 2048);
    }
    from_file
}

/// The last `lines` lines of a container's log, at most `max` bytes, as kubelet's
/// FallbackToLogsOnError reads them.
pub fn log_tail(path: &std::path::Path, lines: usize, max: usize) -> String {
    let Ok(data) = std::fs::read(path) else {
        return String::new();
    };
    let recs = ferrolet_runtime::crilog::read_records(&data);
    let start = recs.len().saturating_sub(lines);
    let mut out = String::new();
    for r in &recs[start..] {
        out.push_str(&String::from_utf8_lossy(&r.message));
        out.push('\n');
    }
    if out.len() > max {
        let cut = out.len() - max;
        let mut i = cut;
        while !out.is_char_boundary(i) {
            i += 1;
        }
        out = out[i..].to_string();
    }
    out
}

/// See [`Worker::kill_one`]; owns everything so it can run beside the worker's own loop.
async fn kill_container(
    rt: Arc<Runtime>,
    spec: Option<Container>,
    target: crate::netns::PodTarget,
    pod_name: String,
    v: ContainerView,
    grace: Duration,
) {
    let mut left = grace;
    // preStop only for a running container, and only with a grace period to run in.
    if let (true, Some(c)) = (v.is_running() && !grace.is_zero(), spec) {
        if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
            let t0 = tokio::time::Instant::now();
            match tokio::time::timeout(grace, hooks::run(&rt, h, &v.id, &c, &pod_name, &target, grace)).await {
                Ok(Ok(())) => {}
                Ok(Err(msg)) => {
                    warn!(pod = %pod_name, container = %v.name, reason = "FailedPreStopHook", "PreStopHook failed: {msg}")
                }
                Err(_) => {
                    warn!(pod = %pod_name, container = %v.name, reason = "FailedPreStopHook", "PreStopHook did not finish within the grace period")
                }
            }
            left = grace.saturating_sub(t0.elapsed());
        }
    }
    // kubelet's minimumGracePeriodInSeconds: the stop signal always gets 2 seconds.
    stop_container(rt, v.id.clone(), v.stop_signal.clone(), left.max(MIN_GRACE)).await;
}
