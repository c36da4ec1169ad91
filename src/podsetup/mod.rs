//! Everything a pod needs on the node before its containers can run, and its removal after:
//! the pod cgroup ([`cgroups`], kubelet's pod container manager), the sandbox namespaces and
//! /dev/shm ([`sandbox`]), the pod network ([`network`]), volumes ([`volumes`], their files from
//! [`payloads`] written by the [`atomic_writer`]) and the files kubelet manages for every pod
//! ([`dns`]). [`PodSetup`] puts them together in kubelet's order
//! and keeps the blocking parts (mounts, cgroupfs, fsync'd writes) off the async threads.

pub mod atomic_writer;
pub mod cgroups;
pub mod dns;
pub mod network;
pub mod payloads;
pub mod sandbox;
pub mod volumes;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use ferrolet_runtime::Runtime;
use k8s_openapi::api::core::v1::Pod;
use tracing::warn;

use crate::config::Config;
use crate::objects::{ObjectManager, VolumeObjects};
use crate::pod::{self, fieldpath::PodFacts};
use crate::tasks::blocking;
use cgroups::PodCgroups;
use network::PodNetwork;
use sandbox::Sandbox;
use volumes::VolumeHost;

pub struct PodSetup {
    cfg: Arc<Config>,
    rt: Arc<Runtime>,
    cgroups: PodCgroups,
    network: PodNetwork,
    /// ConfigMaps, Secrets, tokens and Services: only on a node in a cluster.
    objects: Option<Arc<ObjectManager>>,
}

impl PodSetup {
    pub fn new(cfg: Arc<Config>, rt: Arc<Runtime>, cgroups: PodCgroups) -> PodSetup {
        // The network learns which sandboxes are live from their records under the pods dir.
        let pods_dir = cfg.pods_dir();
        let network = PodNetwork::new(&cfg, Arc::new(move || sandbox::recorded_ids(&pods_dir)));
        PodSetup {
            cfg,
            rt,
            cgroups,
            network,
            objects: None,
        }
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

    pub fn network(&self) -> &PodNetwork {
        &self.network
    }

    /// The pod's directory with its `pod.json` (what a later start knows the pod by), and its
    /// cgroup, created or updated to the pod's limits.
    pub async fn prepare(&self, p: &Arc<Pod>, pod_dir: &Path) -> Result<()> {
        let (p, dir, cgroups) = (p.clone(), pod_dir.to_path_buf(), self.cgroups.clone());
        let pids_limit = self.cfg.pod_pids_limit;
        blocking(move || {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            ferrolet_fsutil::write_json_atomic(&dir.join("pod.json"), &*p)?;
            cgroups.ensure_pod(&p, pids_limit)?;
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
        let own = sandbox::own_namespaces(p);
        let dir = {
            let pod_dir = pod_dir.to_path_buf();
            blocking(move || sandbox::prepare_dir(&pod_dir)).await?
        };
        if own.net || own.ipc || own.uts {
            let hostname = dns::hostname(p);
            let pinned = crate::metrics::global()
                .time_runtime(
                    "run_podsandbox",
                    self.rt.pin_namespaces(&dir, Some(&hostname), own.net, own.ipc, own.uts),
                )
                .await;
            crate::metrics::global().pod_sandbox_started(pinned.is_ok());
            pinned.context("creating pod namespaces")?;
        }
        let mut sb = {
            let (p, pod_dir) = (p.clone(), pod_dir.to_path_buf());
            blocking(move || sandbox::finish(&p, &pod_dir, &own)).await?
        };
        if let (Some(netns), true) = (sb.net.clone(), self.network.enabled()) {
            match self.network.attach(&sb.id, &netns, p).await {
                Ok(ips) => {
                    sb.pod_ips = ips;
                    sb.network = Some(self.network.settings().mode.clone());
                    let (rec, pod_dir) = (sb.clone(), pod_dir.to_path_buf());
                    blocking(move || sandbox::save(&pod_dir, &rec)).await?;
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

    /// Release a sandbox's network (IPs, interfaces, hostPorts) when it had one.
    pub async fn release_network(&self, sb: &Sandbox) -> Result<()> {
        if sb.network.is_none() && !(sb.net.is_some() && self.network.enabled()) {
            return Ok(());
        }
        self.network.detach(&sb.id).await
    }

    /// Set up every volume of the pod (on every sync: configMap, secret, projected and
    /// downwardAPI volumes follow their sources); returns where each lives on the node. An error
    /// from a volume is a [`volumes::SetUpFailed`].
    pub async fn mount_volumes(
        &self,
        p: &Arc<Pod>,
        pod_dir: &Path,
        facts: &PodFacts,
    ) -> Result<BTreeMap<String, VolumeHost>> {
        let objects = match &self.objects {
            Some(o) => {
                o.register_pod(p);
                o.volume_objects(p).await
            }
            None => VolumeObjects::default(),
        };
        let (p, dir, facts) = (p.clone(), pod_dir.to_path_buf(), facts.clone());
        blocking(move || volumes::setup(&p, &dir, &facts, facts.node_memory, &objects)).await
    }

    /// /etc/hosts, /etc/resolv.conf and /etc/hostname for the pod's containers.
    pub async fn write_managed_files(&self, p: &Arc<Pod>, pod_dir: &Path, pod_ips: &[String]) -> Result<()> {
        let (p, dir, ips, cfg) = (p.clone(), pod_dir.to_path_buf(), pod_ips.to_vec(), self.cfg.clone());
        blocking(move || dns::write_files(&dir, &p, &ips, &cfg)).await
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
        let (p2, dir, cgroups) = (p.clone(), pod_dir.to_path_buf(), self.cgroups.clone());
        let results = blocking(move || {
            Ok(vec![
                ("tearing down sandbox", sandbox::teardown_local(&dir)),
                ("tearing down volumes", volumes::teardown(&dir)),
                ("removing pod cgroup", cgroups.remove_pod(&p2)),
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

fn remove_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}
