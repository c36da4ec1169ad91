//! Everything a pod needs on the node before its containers can run, and its removal after:
//! the pod cgroup (kubelet's pod container manager, in [`crate::cm`]), the sandbox namespaces and
//! /dev/shm ([`sandbox`]), the pod network ([`network`]), volumes (the [`crate::volumemanager`])
//! and the files kubelet manages for every pod ([`dns`]). [`PodSetup`] puts them together in kubelet's order
//! and keeps the blocking parts (mounts, cgroupfs, fsync'd writes) off the async threads.

pub mod dns;
pub mod network;
pub mod pool;
pub mod sandbox;
pub mod selinux;
pub mod userns;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use ferrolet_runtime::Runtime;
use k8s_openapi::api::core::v1::{Container, Pod};
use tracing::warn;

use crate::cm::pod_container_manager::PodCgroups;
use crate::config::Config;
use crate::objects::local::LocalObjects;
use crate::objects::{EnvObjects, ObjectManager, VolumeObjects};
use crate::pod::{self, fieldpath::PodFacts};
use crate::tasks::blocking;
use crate::volumemanager::volumes::VolumeHost;
use crate::volumemanager::VolumeManager;
use ferrolet_runtime::migration_warmer::{MigrationWarmer, WarmHold};
use network::PodNetwork;
use sandbox::Sandbox;

pub struct PodSetup {
    cfg: Arc<Config>,
    rt: Arc<Runtime>,
    cgroups: PodCgroups,
    network: PodNetwork,
    /// ConfigMaps, Secrets, tokens and Services: only on a node in a cluster.
    objects: Option<Arc<ObjectManager>>,
    /// ConfigMaps and Secrets of static pods, from the static pod path.
    local: Option<LocalObjects>,
    volumes: Arc<VolumeManager>,
    /// The QoS tiers, updated as pod cgroups come and go.
    qos: Option<Arc<crate::cm::qos::QosManager>>,
    warmer: MigrationWarmer,
    /// The host id ranges of pods with `hostUsers: false`.
    userns: Arc<userns::UserNamespaces>,
    /// Sandboxes built ahead of time (ferrolet.sandboxPool > 0).
    pool: Option<pool::SandboxPool>,
}

impl PodSetup {
    /// Fails when a pod's recorded user namespace ids cannot be read back ([`userns`]).
    /// `network_status`: where the pod network says whether it is ready (the Node's Ready
    /// condition reads it).
    pub fn new(
        cfg: Arc<Config>,
        rt: Arc<Runtime>,
        cgroups: PodCgroups,
        network_status: network::NetworkStatus,
    ) -> Result<PodSetup> {
        // The network learns which sandboxes are live from their records under the pods dir
        // and the pool's.
        let (pods_dir, pooled) = (cfg.pods_dir(), pool_dir(&cfg.root_dir));
        let network = PodNetwork::new(
            &cfg,
            Arc::new(move || {
                let mut ids = sandbox::recorded_ids(&pods_dir);
                ids.extend(sandbox::recorded_ids(&pooled));
                ids
            }),
            network_status,
        );
        let pool =
            (cfg.sandbox_pool > 0).then(|| pool::SandboxPool::new(pool_dir(&cfg.root_dir), cfg.sandbox_pool as usize));
        let local = cfg.static_pod_path.clone().map(LocalObjects::new);
        let volumes = Arc::new(VolumeManager::new(&cfg.pods_dir()));
        let warmer = MigrationWarmer::new(cgroups.runtime().clone());
        let userns = Arc::new(userns::UserNamespaces::load(&cfg.pods_dir())?);
        Ok(PodSetup {
            cfg,
            rt,
            cgroups,
            network,
            objects: None,
            local,
            volumes,
            qos: None,
            warmer,
            userns,
            pool,
        })
    }

    /// Keep the QoS tiers in step with the pod cgroups this creates and removes.
    pub fn with_qos(mut self, qos: Arc<crate::cm::qos::QosManager>) -> PodSetup {
        self.qos = Some(qos);
        self
    }

    /// The node's CSI drivers, for csi volumes.
    pub fn with_csi(self, client: crate::volumemanager::csi::client::CsiClient) -> PodSetup {
        self.volumes.set_csi(client);
        self
    }

    /// In a cluster: where pods' ConfigMaps, Secrets, tokens and Services come from.
    pub fn with_objects(mut self, objects: Arc<ObjectManager>) -> PodSetup {
        self.objects = Some(objects);
        self
    }

    pub fn objects(&self) -> Option<&Arc<ObjectManager>> {
        self.objects.as_ref()
    }

    pub fn cgroups(&self) -> &PodCgroups {
        &self.cgroups
    }

    /// The volume manager (what is set up, for the volumes' stats).
    pub fn volumes(&self) -> &Arc<VolumeManager> {
        &self.volumes
    }

    /// Containers are about to be created: keep the kernel's cgroup migration lock warm
    /// until the hold is dropped, so that their migrations do not wait for a grace period
    /// ([`MigrationWarmer`]; docs/start-path.md).
    pub fn warm_cgroup_migrations(&self) -> WarmHold {
        self.warmer.hold()
    }

    pub fn network(&self) -> &PodNetwork {
        &self.network
    }

    /// The pod's directory with its `pod.json` (what a later start knows the pod by), and its
    /// cgroup, created or updated to the pod's limits. `pod.json` is written only when it
    /// changed: every resync comes here, and an atomic write is a rename and two fsyncs (6% of
    /// an idle agent's CPU with 100 pods, and wear on a board's flash). `pod_json_written`:
    /// the caller wrote it for this very object before, so it is not encoded and compared
    /// again while it is there.
    pub async fn prepare(&self, p: &Arc<Pod>, pod_dir: &Path, pod_json_written: bool) -> Result<()> {
        // An idle resync: two stats answer it in place, with no hand-off to the blocking pool.
        if pod_json_written && pod_dir.join("pod.json").is_file() && self.cgroups.pod_settled(p) {
            return Ok(());
        }
        let (p, dir, cgroups) = (p.clone(), pod_dir.to_path_buf(), self.cgroups.clone());
        let qos = self.qos.clone();
        blocking(move || {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let pod_json = dir.join("pod.json");
            if !(pod_json_written && pod_json.is_file()) {
                ferrolet_fsutil::write_json_atomic_if_changed(&pod_json, &*p)?;
            }
            // A new pod cgroup: the QoS tiers first take its requests in (kubelet's syncPod
            // updates the QoS cgroups before it creates a pod cgroup).
            if let Some(qos) = qos.as_ref().filter(|_| !cgroups.pod_exists(&p)) {
                qos.update(Some(&p), None);
            }
            cgroups.ensure_pod(&p)?;
            Ok(())
        })
        .await
    }

    /// Whether `sb` can still serve its pod: same boot, namespaces still pinned, attached to the
    /// network pods get now.
    pub fn sandbox_usable(&self, sb: &Sandbox) -> bool {
        let want = self.network.enabled().then(|| self.network.settings().mode.as_str());
        sb.is_live(want)
    }

    /// A new sandbox for `p`: namespaces pinned under the pod's directory, /dev/shm, the record,
    /// then the pod network. A network that fails leaves nothing behind; the next sync retries.
    pub async fn create_sandbox(&self, p: &Arc<Pod>, pod_dir: &Path) -> Result<Sandbox> {
        if let Some(sb) = self.take_pooled(p, pod_dir).await {
            return Ok(sb);
        }
        let sb = self.build_sandbox(p, pod_dir).await;
        if let Some(pool) = &self.pool {
            pool.used();
        }
        sb
    }

    async fn build_sandbox(&self, p: &Arc<Pod>, pod_dir: &Path) -> Result<Sandbox> {
        let own = sandbox::own_namespaces(p);
        let dir = {
            let pod_dir = pod_dir.to_path_buf();
            blocking(move || sandbox::prepare_dir(&pod_dir)).await?
        };
        let user = if own.user {
            let (uns, uid, pod_dir) = (self.userns.clone(), pod::uid(p).to_string(), pod_dir.to_path_buf());
            Some(blocking(move || uns.get_or_create(&uid, &pod_dir)).await?)
        } else {
            None
        };
        let mut init = None;
        if own.net || own.ipc || own.uts || own.pid {
            let pod_init = if own.pid {
                Some(self.pod_init(p, pod_dir).await?)
            } else {
                None
            };
            let pins = ferrolet_runtime::namespaces::Pins {
                hostname: Some(dns::uts_hostname_or_short(p, &self.cfg.cluster_domain)),
                net: own.net,
                ipc: own.ipc,
                uts: own.uts,
                pid: pod_init,
                user,
            };
            let pinned = crate::metrics::global()
                .time_runtime("run_podsandbox", self.rt.pin_namespaces(&dir, &pins))
                .await;
            crate::metrics::global().pod_sandbox_started(pinned.is_ok());
            init = pinned.context("creating pod namespaces")?.init;
        }
        let mut sb = {
            let (p, pod_dir) = (p.clone(), pod_dir.to_path_buf());
            blocking(move || sandbox::finish(&p, &pod_dir, &own, init, user)).await?
        };
        crate::metrics::start_phase(pod::name(p), "sandbox");
        if let (Some(netns), true) = (sb.net.clone(), self.network.enabled()) {
            match self.network.attach(&sb.id, &netns, p).await {
                Ok(ips) => {
                    sb.pod_ips = ips;
                    sb.network = Some(self.network.settings().mode.clone());
                    let (rec, pod_dir) = (sb.clone(), pod_dir.to_path_buf());
                    blocking(move || sandbox::save(&pod_dir, &rec)).await?;
                    crate::metrics::start_phase(pod::name(p), "network");
                }
                Err(e) => {
                    // Setup leaves nothing behind on error; the namespaces go too, and the next
                    // sync makes a new sandbox.
                    let pod_dir = pod_dir.to_path_buf();
                    blocking(move || sandbox::teardown_local(&pod_dir)).await?;
                    return Err(e.context("Failed to create pod sandbox"));
                }
            }
        }
        Ok(sb)
    }

    /// What the init of a pod's shared pid namespace needs: its empty root and its cgroup, a
    /// leaf of the pod's.
    async fn pod_init(&self, p: &Arc<Pod>, pod_dir: &Path) -> Result<ferrolet_runtime::namespaces::PodInit> {
        let root = sandbox::init_root(pod_dir);
        let cgroup = format!("{}/{}", self.cgroups.pod_path(p), sandbox::INIT_CGROUP);
        let (cgroups, root2, cgroup2) = (self.cgroups.runtime().clone(), root.clone(), cgroup.clone());
        let procs = blocking(move || {
            std::fs::create_dir_all(&root2).with_context(|| format!("creating {}", root2.display()))?;
            std::fs::set_permissions(&root2, std::os::unix::fs::PermissionsExt::from_mode(0o555))?;
            cgroups
                .create(&cgroup2, &Default::default())
                .with_context(|| format!("creating the pod init's cgroup {cgroup2}"))?;
            Ok(cgroups
                .all_dirs(&cgroup2)
                .into_iter()
                .map(|d| d.join("cgroup.procs"))
                .filter(|f| f.exists())
                .collect::<Vec<_>>())
        })
        .await?;
        Ok(ferrolet_runtime::namespaces::PodInit {
            display_name: format!("{}/{}", pod::namespace(p), pod::name(p)),
            cgroup_procs: procs,
            root,
        })
    }

    /// Release a sandbox's network (IPs, interfaces, hostPorts) when it had one.
    pub async fn release_network(&self, sb: &Sandbox) -> Result<()> {
        if sb.network.is_none() && !(sb.net.is_some() && self.network.enabled()) {
            return Ok(());
        }
        self.network.detach(&sb.id).await
    }

    /// Set up every volume of the pod through the volume manager (on every sync: configMap,
    /// secret, projected and downwardAPI volumes follow their sources); returns where each
    /// lives on the node. `node` is the Node its PersistentVolumes' node affinity is checked
    /// against. An error from a volume is a [`crate::volumemanager::volumes::SetUpFailed`].
    pub async fn mount_volumes(
        &self,
        p: &Arc<Pod>,
        pod_dir: &Path,
        facts: &PodFacts,
        sandbox: Option<&Sandbox>,
        node: Option<k8s_openapi::api::core::v1::Node>,
    ) -> Result<BTreeMap<String, VolumeHost>> {
        let userns = sandbox.and_then(|sb| {
            Some(crate::volumemanager::reconciler::PodUserNamespace {
                pin: sb.user.clone()?,
                range: sb.userns?,
            })
        });
        // A static pod's objects are files of the node: read on the same blocking thread as
        // the mounts (one hand-off a resync, not two).
        let local = self.local.clone().filter(|_| pod::is_static(p));
        if let (None, Some(o)) = (&local, &self.objects) {
            o.register_pod(p);
        }
        if let Some(none) = self.volumes.mount_pod_without_volumes(p, pod_dir) {
            return Ok(none);
        }
        let fetched = match (&local, &self.objects) {
            (None, Some(o)) => o.volume_objects(p).await,
            _ => VolumeObjects::default(),
        };
        let (p, dir, facts, vm) = (p.clone(), pod_dir.to_path_buf(), facts.clone(), self.volumes.clone());
        blocking(move || {
            let objects = match local {
                Some(local) => local.volume_objects(&p),
                None => fetched,
            };
            vm.mount_pod(&p, &dir, &facts, &objects, userns.as_ref(), node.as_ref())
        })
        .await
    }

    /// The ConfigMaps and Secrets `c`'s env and envFrom name (and the Service variables): from
    /// the static pod path for a static pod, from the API server for the others.
    pub async fn env_objects(&self, p: &Arc<Pod>, c: &Container) -> EnvObjects {
        match (&self.local, &self.objects) {
            (Some(local), _) if pod::is_static(p) => {
                let (local, p2, c2) = (local.clone(), p.clone(), c.clone());
                blocking(move || Ok(local.env_objects(&p2, &c2)))
                    .await
                    .unwrap_or_default()
            }
            (_, Some(o)) => o.env_objects(p, c).await,
            _ => EnvObjects::default(),
        }
    }

    /// /etc/hosts, /etc/resolv.conf and /etc/hostname for the pod's containers.
    pub async fn write_managed_files(&self, p: &Arc<Pod>, pod_dir: &Path, pod_ips: &[String]) -> Result<()> {
        let (p, dir, ips, cfg) = (p.clone(), pod_dir.to_path_buf(), pod_ips.to_vec(), self.cfg.clone());
        blocking(move || dns::write_files(&dir, &p, &ips, &cfg)).await
    }

    /// Release what a pod stopped for good no longer needs while it stays on the node (kubelet
    /// stops a killed pod's sandbox and unmounts its volumes): its network (IPs, interfaces,
    /// hostPorts) and its volumes. Its containers are stopped already; their records, the
    /// namespaces and the cgroup stay until the pod is removed. Returns whether all of it went.
    pub async fn release(&self, p: &Arc<Pod>, pod_dir: &Path, sb: Option<&Sandbox>) -> bool {
        let name = pod::full_name(p);
        if let Some(o) = &self.objects {
            o.unregister_pod(pod::uid(p));
        }
        let mut clean = true;
        if let Some(sb) = sb {
            if let Err(e) = self.release_network(sb).await {
                warn!(pod = %name, error = %format!("{e:#}"), "releasing the network of a stopped pod");
                clean = false;
            }
        }
        let (dir, uid, vm) = (pod_dir.to_path_buf(), pod::uid(p).to_string(), self.volumes.clone());
        if let Err(e) = blocking(move || vm.unmount_pod(&uid, &dir)).await {
            warn!(pod = %name, error = %format!("{e:#}"), "releasing the volumes of a stopped pod");
            clean = false;
        }
        clean
    }

    /// Remove what [`prepare`](Self::prepare), [`create_sandbox`](Self::create_sandbox) and
    /// [`mount_volumes`](Self::mount_volumes) made: network, namespaces and /dev/shm, volumes,
    /// the pod cgroup and the pod's directory. The containers must be gone already. Each part is
    /// tried even when an earlier one fails; returns whether all of them went.
    pub async fn teardown(&self, p: &Arc<Pod>, pod_dir: &Path, sb: Option<Sandbox>) -> bool {
        let name = pod::full_name(p);
        if let Some(o) = &self.objects {
            o.unregister_pod(pod::uid(p));
        }
        let mut clean = true;
        let mut failed = |what: &str, e: anyhow::Error| {
            warn!(pod = %name, error = %format!("{e:#}"), "{what}");
            clean = false;
        };
        if let Some(sb) = sb {
            if let Err(e) = self.release_network(&sb).await {
                failed("tearing down the pod network", e);
            }
        }
        let (p2, dir, cgroups, vm) = (
            p.clone(),
            pod_dir.to_path_buf(),
            self.cgroups.clone(),
            self.volumes.clone(),
        );
        let (qos, uns) = (self.qos.clone(), self.userns.clone());
        let results = blocking(move || {
            Ok(vec![
                ("tearing down sandbox", {
                    let r = sandbox::teardown_local(&dir);
                    // the ids go once nothing of the pod can run under them
                    if r.is_ok() {
                        uns.release(pod::uid(&p2), &dir);
                    }
                    r
                }),
                ("tearing down volumes", vm.unmount_pod(pod::uid(&p2), &dir)),
                ("removing pod cgroup", {
                    let r = cgroups.remove_pod(&p2);
                    // The pod's requests leave the QoS tiers with it.
                    if let Some(qos) = &qos {
                        qos.update(None, Some(crate::pod::uid(&p2)));
                    }
                    r
                }),
                ("removing pod directory", remove_dir(&dir)),
            ])
        })
        .await;
        match results {
            Ok(results) => {
                for (what, r) in results {
                    if let Err(e) = r {
                        failed(what, e);
                    }
                }
            }
            Err(e) => failed("removing the pod from the node", e),
        }
        clean
    }
}

/// Where the sandbox pool keeps its entries.
pub fn pool_dir(root: &Path) -> std::path::PathBuf {
    root.join("sandbox-pool")
}

fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}
