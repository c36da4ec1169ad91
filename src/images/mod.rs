//! Images on the node (kubelet's image manager, pkg/kubelet/images): whether a container's
//! image is there to run, pulled from a registry when its pull policy says so, with kubelet's
//! events, reasons, messages and back-off. The rooms:
//! - [`policy`]: the decisions and the words (Never / IfNotPresent / Always);
//! - [`puller`]: serialized or parallel pulls, the registry QPS;
//! - [`credentials`]: imagePullSecrets, the node's docker config and credential plugins;
//! - [`gc`]: image garbage collection under disk thresholds;
//! - [`registry_watch`]: the registries.yaml re-read when it changes;
//! - [`local`]: images that reach a node without a registry (the demo image, the import
//!   directory).
//!
//! The back-off is kubelet's ([`crate::backoff`]), keyed by pod UID and image: a failed pull is
//! ErrImagePull and holds the next pull back 10 s, then 20 s, ... up to 300 s
//! (ImagePullBackOff meanwhile).

pub mod credentials;
pub mod gc;
pub mod local;
pub mod policy;
pub mod puller;
pub mod registry_watch;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::image::ImageStore;
use ferrolet_runtime::registry::Credentials;
use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use tracing::warn;

use crate::backoff::Backoff;
use crate::events::{Kind, Recorder};
use crate::objects::ObjectManager;
use crate::pod::reasons::{self, Waiting};
use crate::pod::{self};
use credentials::provider::Providers;
use credentials::{DockerConfig, Keyring};
use policy::PullPolicy;
use puller::{PullFn, PullLimits, PullQueue};

/// Event reasons of image pulls (kubelet's pkg/kubelet/events).
pub const EVENT_PULLING: &str = "Pulling";
pub const EVENT_PULLED: &str = "Pulled";
pub const EVENT_FAILED: &str = "Failed";
pub const EVENT_BACK_OFF: &str = "BackOff";
pub const EVENT_ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
pub const EVENT_FAILED_PULL_SECRET: &str = "FailedToRetrieveImagePullSecret";
pub const EVENT_INSPECT_FAILED: &str = "InspectFailed";

/// How soon a container whose image may never be pulled is looked at again (an archive may be
/// imported meanwhile).
const NEVER_PULL_RETRY: Duration = Duration::from_secs(5);

/// What a pull must leave free on the image store's filesystem: the hard eviction thresholds
/// of the image and node filesystems (the store is on both unless imagefs is separate), the
/// larger of each kind. A pull that would cross them is refused, so it never makes the node
/// evict pods.
pub fn pull_reserve(hard: &crate::config::EvictionHard) -> ferrolet_runtime::registry::DiskReserve {
    use crate::config::Threshold;
    let mut r = ferrolet_runtime::registry::DiskReserve::default();
    for t in [hard.imagefs_available, hard.nodefs_available].into_iter().flatten() {
        match t {
            Threshold::Quantity(q) => r.bytes = r.bytes.max(q.max(0) as u64),
            Threshold::Percent(p) => r.percent = r.percent.max(p),
        }
    }
    r
}

/// Where a pull's credentials come from besides the pod's own secrets.
pub struct CredentialSources {
    /// The node's docker config files, first found wins.
    pub node_config_paths: Vec<PathBuf>,
    /// Credential provider plugins.
    pub providers: Providers,
    /// Secrets for static pods' imagePullSecrets: the static pod directory.
    pub static_pod_path: Option<PathBuf>,
    /// In a cluster: the API server's Secrets, read as the node.
    pub objects: Option<Arc<ObjectManager>>,
}

/// The image side of starting a container.
pub struct ImageManager {
    store: Arc<ImageStore>,
    queue: PullQueue,
    sources: CredentialSources,
    events: Recorder,
    /// Failed pulls by `<pod uid>_<image>`, as kubelet keys its image back-off.
    backoff: Mutex<Backoff>,
    /// The last pull error by the same key, for the ImagePullBackOff message.
    last_error: Mutex<HashMap<String, String>>,
}

impl ImageManager {
    pub fn new(
        store: Arc<ImageStore>,
        pull: PullFn,
        limits: PullLimits,
        sources: CredentialSources,
        events: Recorder,
    ) -> ImageManager {
        ImageManager {
            store,
            queue: PullQueue::new(pull, limits),
            sources,
            events,
            backoff: Mutex::new(Backoff::new(Duration::from_secs(10), Duration::from_secs(300))),
            last_error: Mutex::new(HashMap::new()),
        }
    }

    fn event(&self, p: &Pod, c: &Container, kind: Kind, reason: &str, message: &str) {
        self.events.pod(p, Some(&c.name), kind, reason, message);
    }

    /// kubelet's EnsureImageExists: the image's id once it is in the store, pulled if the
    /// policy says so; else why not, as the container's waiting state.
    pub async fn ensure_image_exists(&self, p: &Pod, c: &Container) -> Result<Digest, Waiting> {
        let image = c.image.clone().unwrap_or_default();
        let start = Instant::now();
        if let Err(e) = ferrolet_runtime::image::Reference::parse(&image) {
            let msg = policy::invalid_name(&image, &e.to_string());
            self.event(p, c, Kind::Warning, EVENT_INSPECT_FAILED, &msg);
            self.event(
                p,
                c,
                Kind::Warning,
                EVENT_FAILED,
                &policy::error_event(reasons::INVALID_IMAGE_NAME),
            );
            // Only a change of the pod can fix it.
            return Err(Waiting::new(reasons::INVALID_IMAGE_NAME, msg));
        }
        let present = {
            let (store, image) = (self.store.clone(), image.clone());
            crate::tasks::blocking(move || Ok(store.find(&image).ok()))
                .await
                .ok()
                .flatten()
        };
        let policy = PullPolicy::of(c.image_pull_policy.as_deref(), &image);
        if !policy::should_pull(policy, present.is_some()) {
            if let Some(r) = present {
                self.event(p, c, Kind::Normal, EVENT_PULLED, &policy::already_present(&image));
                return Ok(r.id);
            }
            let msg = policy::never_pull(&image);
            self.event(p, c, Kind::Warning, EVENT_ERR_IMAGE_NEVER_PULL, &msg);
            self.event(
                p,
                c,
                Kind::Warning,
                EVENT_FAILED,
                &policy::error_event(reasons::ERR_IMAGE_NEVER_PULL),
            );
            return Err(Waiting::new(reasons::ERR_IMAGE_NEVER_PULL, msg).retry_in(NEVER_PULL_RETRY));
        }
        let key = policy::backoff_key(pod::uid(p), &image);
        let held = self
            .backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .in_backoff_since_update(&key, Utc::now());
        if let Some((until, _)) = held {
            self.event(p, c, Kind::Normal, EVENT_BACK_OFF, &policy::back_off(&image));
            self.event(
                p,
                c,
                Kind::Warning,
                EVENT_FAILED,
                &policy::error_event(reasons::IMAGE_PULL_BACK_OFF),
            );
            let last = self
                .last_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&key)
                .cloned();
            return Err(Waiting::new(
                reasons::IMAGE_PULL_BACK_OFF,
                policy::back_off_waiting(&image, last.as_deref()),
            )
            .retry_at(until));
        }
        self.event(p, c, Kind::Normal, EVENT_PULLING, &policy::pulling(&image));
        let pulled = match self.credentials(p, &image).await {
            Ok(creds) => self
                .queue
                .pull(&image, creds, None)
                .await
                .map_err(|e| policy::pull_error(&e.to_string())),
            Err(e) => Err(policy::pull_error(&e)),
        };
        match pulled {
            Ok(done) => {
                let msg = policy::pulled(&image, done.pull_duration, start.elapsed(), done.outcome.record.size);
                self.event(p, c, Kind::Normal, EVENT_PULLED, &msg);
                let mut b = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
                b.forget(&key);
                b.gc(Utc::now());
                self.last_error.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                Ok(done.outcome.record.id)
            }
            Err(err) => {
                self.event(p, c, Kind::Warning, EVENT_FAILED, &policy::failed(&image, &err));
                let wait = {
                    let mut b = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
                    b.gc(Utc::now());
                    b.next(&key, Utc::now());
                    b.current(&key).unwrap_or(Duration::from_secs(10))
                };
                {
                    // Locked in the order the success path locks them: back-off, then errors.
                    let b = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
                    let mut last = self.last_error.lock().unwrap_or_else(|e| e.into_inner());
                    // Keys of pods gone are dropped with their back-off entries.
                    last.retain(|k, _| b.current(k).is_some());
                    last.insert(key, err.clone());
                }
                self.event(
                    p,
                    c,
                    Kind::Warning,
                    EVENT_FAILED,
                    &policy::error_event(reasons::ERR_IMAGE_PULL),
                );
                Err(Waiting::new(reasons::ERR_IMAGE_PULL, err).retry_in(wait))
            }
        }
    }

    /// A container was created from image `id` (its last use, for image GC).
    pub async fn mark_used(&self, id: &Digest) {
        let (store, id) = (self.store.clone(), id.clone());
        if let Err(e) = crate::tasks::blocking(move || Ok(store.mark_used(&id)?)).await {
            warn!(error = %format!("{e:#}"), "recording an image's last use");
        }
    }

    /// The credentials to try for `image`, in kubelet's order: those of the pod's
    /// imagePullSecrets that match, then the node's (docker config.json, credential
    /// plugins). A pull secret that is not valid fails the pull (kubelet's MakeDockerKeyring).
    async fn credentials(&self, p: &Pod, image: &str) -> Result<Vec<Credentials>, String> {
        let repo = credentials::repository_of(image);
        let mut pod_keyring = Keyring::default();
        for s in self.pull_secrets(p).await {
            pod_keyring.add(&DockerConfig::from_secret(&s)?);
        }
        let mut out = pod_keyring.lookup(&repo);
        let mut node = Keyring::default();
        let paths = self.sources.node_config_paths.clone();
        match crate::tasks::blocking(move || credentials::read_node_config(&paths).map_err(anyhow::Error::msg)).await {
            Ok(Some((_, cfg))) => node.add(&cfg),
            Ok(None) => {}
            Err(e) => warn!("reading the node's docker config: {e:#}"),
        }
        for cfg in self.sources.providers.provide(&repo).await {
            node.add(&cfg);
        }
        out.extend(node.lookup(&repo));
        Ok(out)
    }

    /// The pod's imagePullSecrets as found (kubelet's getPullSecretsForPod): from the API
    /// server for API pods, from the static pod directory for static pods. Those not found are
    /// named in a warning event; the pull is tried all the same.
    async fn pull_secrets(&self, p: &Pod) -> Vec<Secret> {
        let names: Vec<String> = pod::spec(p)
            .image_pull_secrets
            .iter()
            .flatten()
            .map(|r| r.name.clone())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            return Vec::new();
        }
        let ns = pod::namespace(p).to_string();
        let mut found = Vec::new();
        let mut missing = Vec::new();
        if pod::is_static(p) {
            let dir = self.sources.static_pod_path.clone();
            let all = match dir {
                Some(d) => crate::tasks::blocking(move || Ok(crate::podconfig::file::static_secrets(&d)))
                    .await
                    .unwrap_or_default(),
                None => Vec::new(),
            };
            for n in names {
                match all.iter().find(|s| {
                    s.metadata.name.as_deref() == Some(n.as_str())
                        && s.metadata.namespace.as_deref().unwrap_or("default") == ns
                }) {
                    Some(s) => found.push(s.clone()),
                    None => missing.push(n),
                }
            }
        } else if let Some(objects) = &self.sources.objects {
            for n in names {
                match objects.secret(&ns, &n).await {
                    Ok(Some(s)) => found.push((*s).clone()),
                    Ok(None) => missing.push(n),
                    Err(e) => {
                        tracing::info!(pod = %pod::full_name(p), secret = %n, error = %e, "Unable to retrieve pull secret, the image pull may not succeed.");
                        missing.push(n)
                    }
                }
            }
        } else {
            missing = names;
        }
        if !missing.is_empty() {
            self.events.pod(
                p,
                None,
                Kind::Warning,
                EVENT_FAILED_PULL_SECRET,
                &policy::secrets_missing(&missing),
            );
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use ferrolet_runtime::registry::PullError;

    fn pod(image: &str, policy: &str) -> (Pod, Container) {
        let c = Container {
            name: "c".into(),
            image: Some(image.into()),
            image_pull_policy: Some(policy.into()),
            ..Default::default()
        };
        let mut p = Pod::default();
        p.metadata.name = Some("p".into());
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some("uid-1".into());
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            containers: vec![c.clone()],
            ..Default::default()
        });
        (p, c)
    }

    /// A store with the demo image, and a manager whose registry is unreachable (it counts
    /// the pulls asked of it).
    fn manager(pulls: Arc<AtomicUsize>) -> (tempfile::TempDir, ImageManager) {
        let root = tempfile::tempdir().unwrap();
        let store = Arc::new(ImageStore::open(root.path().join("images")).unwrap());
        local::load_demo(&store);
        let pull: PullFn = Arc::new(move |image, _creds, _p| {
            pulls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                Err(PullError::Other(format!(
                    "failed to pull and unpack image \"{image}\": registry down"
                )))
            })
        });
        let m = ImageManager::new(
            store,
            pull,
            PullLimits {
                serialize: true,
                max_parallel: None,
                qps: 0.0,
                burst: 0,
            },
            CredentialSources {
                node_config_paths: Vec::new(),
                providers: Providers::default(),
                static_pod_path: None,
                objects: None,
            },
            Recorder::standalone("n"),
        );
        (root, m)
    }

    #[tokio::test]
    async fn policies_back_off_and_messages() {
        let pulls = Arc::new(AtomicUsize::new(0));
        let (_root, m) = manager(pulls.clone());
        // A local image with IfNotPresent never asks the registry.
        let (p, c) = pod(local::DEMO_REF, "IfNotPresent");
        assert!(m.ensure_image_exists(&p, &c).await.is_ok());
        let (p, c) = pod("busybox:1.35", "Never");
        assert!(m.ensure_image_exists(&p, &c).await.is_ok(), "present under Never runs");
        assert_eq!(pulls.load(Ordering::SeqCst), 0);
        // Not a reference at all.
        let (p, c) = pod("Reg.Local/UPPER:1", "IfNotPresent");
        let w = m.ensure_image_exists(&p, &c).await.unwrap_err();
        assert_eq!(w.reason, reasons::INVALID_IMAGE_NAME);
        assert!(
            w.message
                .starts_with("Failed to apply default image tag \"Reg.Local/UPPER:1\": couldn't parse image name"),
            "{}",
            w.message
        );
        assert!(w.retry_at.is_none());
        // Absent under Never.
        let (p, c) = pod("reg.local/none:1", "Never");
        let w = m.ensure_image_exists(&p, &c).await.unwrap_err();
        assert_eq!(w.reason, reasons::ERR_IMAGE_NEVER_PULL);
        assert_eq!(
            w.message,
            "Container image \"reg.local/none:1\" is not present with pull policy of Never"
        );
        // Always asks the registry even for an image the store has; unreachable, it fails as
        // kubelet's does, then backs off.
        let (p, c) = pod(local::DEMO_REF, "Always");
        let w = m.ensure_image_exists(&p, &c).await.unwrap_err();
        assert_eq!(w.reason, reasons::ERR_IMAGE_PULL);
        assert!(w.message.contains("registry down"), "{}", w.message);
        let retry = w.retry_at.unwrap() - Utc::now();
        assert!(
            retry <= chrono::Duration::seconds(10) && retry > chrono::Duration::seconds(8),
            "{retry}"
        );
        let w = m.ensure_image_exists(&p, &c).await.unwrap_err();
        assert_eq!(w.reason, reasons::IMAGE_PULL_BACK_OFF);
        assert_eq!(
            w.message,
            format!(
                "Back-off pulling image \"{}\": failed to pull and unpack image \"{}\": registry down",
                local::DEMO_REF,
                local::DEMO_REF
            )
        );
        assert_eq!(pulls.load(Ordering::SeqCst), 1, "no pull during the back-off");
        // Another pod's back-off is its own.
        let (mut p2, c2) = pod(local::DEMO_REF, "Always");
        p2.metadata.uid = Some("uid-2".into());
        assert_eq!(
            m.ensure_image_exists(&p2, &c2).await.unwrap_err().reason,
            reasons::ERR_IMAGE_PULL
        );
        assert_eq!(pulls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_pull_reserve_is_the_hard_disk_thresholds() {
        use crate::config::{EvictionHard, Threshold};
        // kubelet's defaults: nodefs.available 10%, imagefs.available 15%.
        let r = pull_reserve(&EvictionHard::default());
        assert_eq!((r.bytes, r.percent), (0, 15.0));
        let mut h = EvictionHard::none();
        assert_eq!(pull_reserve(&h), Default::default());
        h.nodefs_available = Some(Threshold::Quantity(2 << 30));
        h.imagefs_available = Some(Threshold::Percent(5.0));
        let r = pull_reserve(&h);
        assert_eq!((r.bytes, r.percent), (2 << 30, 5.0));
        assert_eq!(r.of(100 << 30), 5 << 30);
        assert_eq!(r.of(10 << 30), 2 << 30);
    }

    #[test]
    fn the_examples_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        // The example's certificate files, made here.
        let certs = tempfile::tempdir().unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["registry.site.example".into()]).unwrap();
        for (f, pem) in [
            ("site-ca.pem", ck.cert.pem()),
            ("node.pem", ck.cert.pem()),
            ("node-key.pem", ck.signing_key.serialize_pem()),
        ] {
            std::fs::write(certs.path().join(f), pem).unwrap();
        }
        let text = std::fs::read_to_string(dir.join("registries.yaml"))
            .unwrap()
            .replace("/etc/ferrolet/certs", &certs.path().display().to_string());
        let yaml = certs.path().join("registries.yaml");
        std::fs::write(&yaml, text).unwrap();
        ferrolet_runtime::registry::RegistryConfig::load(&yaml)
            .unwrap_or_else(|e| panic!("examples/registries.yaml: {e}"));
        let m = dir.join("needs-registry/private-image.yaml");
        let data = std::fs::read_to_string(&m).unwrap();
        let (pods, err) = crate::podconfig::source::pods_from_manifest(
            &data,
            &crate::pod::manifest::Source::File(m.display().to_string()),
            "n",
        );
        assert!(err.is_none(), "{err:?}");
        assert_eq!(pods.len(), 1);
        let secrets = crate::podconfig::file::static_secrets(&m);
        assert_eq!(secrets.len(), 1);
        let cfg = super::DockerConfig::from_secret(&secrets[0]).unwrap();
        let mut k = super::Keyring::default();
        k.add(&cfg);
        assert_eq!(k.lookup("registry.site.example/team/app").len(), 1);
    }
}
