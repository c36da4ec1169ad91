//! The puller: resolve a reference at the first endpoint that has it, choose the platform's
//! manifest, fetch config and layers (bounded, shared between concurrent pulls, resumed from
//! partial downloads) into the image store with digests and sizes verified while streaming,
//! then record the image.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures::future::FutureExt;
use http::{header, HeaderValue, StatusCode};
use http_body_util::BodyExt;
use serde::Deserialize;
use sha2::Digest as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use super::client::{self, HttpClient, HttpError, Session, TokenCache};
use super::config::{Endpoint, RegistryConfig, TlsConfig};
use super::flight::Flights;
use super::space::{human, Claim, Space};
use super::{Credentials, Platform, Progress, ProgressFn, PullError, PullOutcome, PullerOptions};
use crate::digest::Digest;
use crate::image::reference::Reference;
use crate::image::{ImageStore, LayerStep, PulledImage};

/// Manifests and indexes larger than this are refused (containerd's limit too).
const MAX_MANIFEST: usize = 4 << 20;
/// Image configs likewise.
const MAX_CONFIG: u64 = 4 << 20;
/// Indexes nested deeper than this are refused.
const MAX_NESTING: usize = 4;
/// Resumes of one blob within one pull after its connection broke.
const BODY_RETRIES: usize = 3;
/// While streaming a blob, the filesystem is measured again after this many bytes.
const SPACE_CHECK_EVERY: u64 = 8 << 20;

pub(crate) const MEDIA_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const MEDIA_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const MEDIA_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub(crate) const MEDIA_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const MEDIA_DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1";

/// Pulls images into an [`ImageStore`]. `Send + Sync`; share it as `Arc<Puller>`.
pub struct Puller {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<ImageStore>,
    registries: RwLock<Arc<RegistryConfig>>,
    opts: PullerOptions,
    downloads: Arc<Semaphore>,
    tokens: Arc<TokenCache>,
    /// HTTP clients by TLS configuration (rebuilt when the registries change).
    clients: Mutex<HashMap<String, HttpClient>>,
    /// Pulls under way: (reference, credentials) -> the pull and its listeners.
    pulls: Flights<String, PullOutcome, Listeners>,
    /// Blob downloads under way.
    blobs: Flights<Digest, u64, ()>,
    /// Room on the store's filesystem for downloads.
    space: Arc<Space>,
}

/// Progress callbacks of everyone waiting on one pull.
#[derive(Clone, Default)]
struct Listeners(Arc<Mutex<Vec<ProgressFn>>>);

impl Listeners {
    fn emit(&self, p: Progress) {
        let fns = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for f in fns {
            f(p.clone());
        }
    }
}

impl Puller {
    pub fn new(store: Arc<ImageStore>, registries: RegistryConfig, opts: PullerOptions) -> Puller {
        let permits = opts.max_concurrent_downloads.max(1);
        let space = Space::new(store.partial_dir(), opts.reserve);
        Puller {
            inner: Arc::new(Inner {
                store,
                registries: RwLock::new(Arc::new(registries)),
                downloads: Arc::new(Semaphore::new(permits)),
                opts,
                tokens: Arc::new(TokenCache::default()),
                clients: Mutex::new(HashMap::new()),
                pulls: Flights::default(),
                blobs: Flights::default(),
                space,
            }),
        }
    }

    /// Replace the registry configuration; pulls started from now on use it.
    pub fn set_registries(&self, registries: RegistryConfig) {
        *self.inner.registries.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(registries);
        self.inner.clients.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Pull `reference` (any form [`Reference::parse`] takes). Endpoints are tried in order:
    /// the mirrors `registries.yaml` lists for the reference's registry (or `"*"`), then the
    /// registry itself (docker.io is https://registry-1.docker.io). Per endpoint, its
    /// `configs` auth if present, else each of `credentials` in order until one is accepted
    /// (none: anonymous). Returns when the image is in the store. The same reference pulled
    /// again while this pull runs (with the same credentials) waits for this pull. Dropping
    /// the returned future stops waiting; when no caller waits any more the pull is
    /// cancelled, its downloads with it (unless another pull waits for a blob).
    pub async fn pull(
        &self,
        reference: &str,
        credentials: &[Credentials],
        progress: Option<ProgressFn>,
    ) -> Result<PullOutcome, PullError> {
        let r = Reference::parse(reference)?;
        let key = format!(
            "{}\0{}\0{:?}",
            r.normalized(),
            self.inner.opts.platform,
            credentials
                .iter()
                .map(|c| match c {
                    Credentials::Basic { username, password } =>
                        Digest::of(format!("{username}:{password}").as_bytes()),
                    Credentials::IdentityToken(t) | Credentials::RegistryToken(t) => Digest::of(t.as_bytes()),
                })
                .collect::<Vec<_>>()
        );
        let inner = self.inner.clone();
        let creds = credentials.to_vec();
        // The pull runs on its own task, shared by every caller of the same key, while one
        // of them waits.
        let (fut, _waiter, leader) = self.inner.pulls.join(
            &key,
            Listeners::default,
            |l| {
                if let Some(p) = &progress {
                    l.0.lock().unwrap_or_else(|e| e.into_inner()).push(p.clone());
                }
            },
            move |listeners| async move { inner.pull(&r, &creds, &listeners).await.map_err(|e| e.to_string()) }.boxed(),
        );
        match fut.await {
            Ok(mut o) => {
                if !leader {
                    o.downloaded = 0;
                }
                Ok(o)
            }
            Err(e) => Err(PullError::Other(e)),
        }
    }
}

/// What a reference resolved to at an endpoint.
struct Resolved {
    /// Digest of what the reference names (an index or a manifest) and its bytes.
    top: Digest,
    top_bytes: Bytes,
    /// The platform's manifest (the same as `top` without an index) and its bytes.
    leaf: Digest,
    leaf_bytes: Bytes,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Debug, Deserialize, Clone)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    platform: Option<PlatformDoc>,
}

#[derive(Debug, Deserialize, Clone)]
struct PlatformDoc {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    #[serde(default)]
    variant: Option<String>,
}

#[derive(Debug, Deserialize, Clone)]
struct ManifestDoc {
    #[serde(rename = "schemaVersion", default)]
    schema_version: Option<u32>,
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
}

#[derive(Deserialize)]
struct ConfigDoc {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    #[serde(default)]
    variant: Option<String>,
}

/// How an endpoint failed: try the next, or stop.
enum Failure {
    Next(HttpError),
    Fatal(String),
}

/// The digest of a descriptor; the error quotes at most a little of what the registry wrote.
fn digest_of(d: &Descriptor, what: &str) -> Result<Digest, String> {
    Digest::parse(&d.digest).map_err(|mut e| {
        cap_in_place(&mut e, 200);
        format!("{what}: {e}")
    })
}

impl Inner {
    fn client(&self, tls: &TlsConfig) -> Result<HttpClient, String> {
        let key = format!(
            "{:?}{:?}{:?}{}",
            tls.ca_file, tls.cert_file, tls.key_file, tls.insecure_skip_verify
        );
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = clients.get(&key) {
            return Ok(c.clone());
        }
        let c = client::http_client(tls)?;
        clients.insert(key, c.clone());
        Ok(c)
    }

    fn timeout(&self) -> Option<Duration> {
        (!self.opts.progress_timeout.is_zero()).then_some(self.opts.progress_timeout)
    }

    fn session(&self, ep: &Endpoint, creds: &[Credentials]) -> Result<Arc<Session>, String> {
        let c = self.client(&ep.config.tls)?;
        Ok(Arc::new(Session::new(
            ep.clone(),
            c,
            creds,
            self.tokens.clone(),
            self.timeout(),
        )))
    }

    async fn pull(
        self: &Arc<Self>,
        r: &Reference,
        creds: &[Credentials],
        listeners: &Listeners,
    ) -> Result<PullOutcome, PullError> {
        let name = r.normalized();
        let fail = |msg: String| PullError::Other(format!("failed to pull and unpack image {name:?}: {msg}"));
        let registries = self.registries.read().unwrap_or_else(|e| e.into_inner()).clone();
        let endpoints = registries.endpoints(r)?;
        let started = std::time::Instant::now();

        // Resolve at the first endpoint that has the reference.
        let mut errors: Vec<HttpError> = Vec::new();
        let mut chosen = None;
        for (i, ep) in endpoints.iter().enumerate() {
            let session = self.session(ep, creds).map_err(|e| fail(format!("{}: {e}", ep.host)))?;
            match self.resolve(&session, r).await {
                Ok(res) => {
                    chosen = Some((i, session, res));
                    break;
                }
                Err(Failure::Fatal(msg)) => return Err(fail(msg)),
                Err(Failure::Next(e)) => {
                    tracing::info!(image = %name, endpoint = %ep.base(), error = %e, "resolving the image failed at this endpoint");
                    errors.push(e);
                }
            }
        }
        let Some((chosen_idx, session, res)) = chosen else {
            return Err(fail(resolve_message(&name, &errors)));
        };
        tracing::info!(image = %name, endpoint = %session.endpoint.base(), digest = %res.top, "resolved");
        let manifest_digest = res.top.clone();
        let config = digest_of(&res.config, "config").map_err(fail)?;
        let mut layers = Vec::new();
        let limit = self.store.layer_limits().max_bytes;
        for l in &res.layers {
            let d = digest_of(l, "layer").map_err(fail)?;
            // A layer's blob is never larger than the layer it unpacks to (give or take the
            // compression's few bytes): one over the layer limit is refused before any byte.
            if l.size > limit {
                return Err(fail(over_limit(&d, l.size, limit)));
            }
            layers.push((d, l.size));
        }
        // The blobs the store lacks must fit together, or the pull would fail half way after
        // filling the disk with the first ones.
        // What partial files hold already is not asked for again.
        let missing: u64 = layers
            .iter()
            .filter(|(d, _)| !self.store.blob_path(d).is_file())
            .map(|(d, s)| {
                let have = std::fs::metadata(self.store.partial_dir().join(d.hex())).map_or(0, |m| m.len());
                s.saturating_sub(have)
            })
            .fold(res.config.size.min(MAX_CONFIG), u64::saturating_add);
        match self.space.check(missing) {
            Ok(Ok(())) => {}
            Ok(Err(short)) => {
                return Err(fail(format!(
                    "image {manifest_digest} needs {} for its blobs, more than the {} the node can spare: {short}; refused before downloading",
                    human(missing),
                    human(short.room())
                )))
            }
            Err(e) => return Err(fail(format!("measuring the image filesystem: {e}"))),
        }
        listeners.emit(Progress::Resolved {
            manifest: manifest_digest.clone(),
            layers: layers.clone(),
        });

        // Other endpoints to fetch blobs from if the chosen one fails, in order.
        let mut sessions = vec![session];
        for ep in endpoints.iter().skip(chosen_idx + 1) {
            if let Ok(s) = self.session(ep, creds) {
                sessions.push(s);
            }
        }
        let sessions = Arc::new(sessions);

        let mut pins = Pins::new(self.store.clone());
        pins.add(&config);
        for (d, _) in &layers {
            pins.add(d);
        }
        let mut downloaded = 0u64;

        // The config first: its diff_ids say which layers are already unpacked.
        if res.config.size > MAX_CONFIG {
            return Err(fail(format!(
                "config {config} is too large ({} bytes)",
                res.config.size
            )));
        }
        pins.note_added(&config);
        downloaded += self
            .fetch_blob(&sessions, &config, res.config.size, listeners)
            .await
            .map_err(fail)?;
        let config_bytes =
            std::fs::read(self.store.blob_path(&config)).map_err(|e| fail(format!("reading config {config}: {e}")))?;
        let cfg: ConfigDoc =
            serde_json::from_slice(&config_bytes).map_err(|e| fail(format!("config {config}: {e}")))?;
        if !cfg.os.is_empty()
            && self
                .opts
                .platform
                .rank(&cfg.os, &cfg.architecture, cfg.variant.as_deref())
                .is_none()
        {
            return Err(fail(format!(
                "no match for platform in manifest: image {manifest_digest} is for {}/{}{}, this node is {}",
                cfg.os,
                cfg.architecture,
                cfg.variant.as_deref().map(|v| format!("/{v}")).unwrap_or_default(),
                self.opts.platform
            )));
        }
        let diff_ids: Vec<String> = serde_json::from_slice::<serde_json::Value>(&config_bytes)
            .ok()
            .and_then(|v| {
                v.pointer("/rootfs/diff_ids").and_then(|d| d.as_array()).map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect::<Vec<_>>()
                })
            })
            .unwrap_or_default();

        // Layers, in parallel up to the download limit.
        let mut jobs = Vec::new();
        for (i, (d, size)) in layers.iter().enumerate() {
            let unpacked = diff_ids
                .get(i)
                .and_then(|s| Digest::parse(s).ok())
                .is_some_and(|id| self.store.layer_dir(&id).is_dir());
            if unpacked || self.store.blob_path(d).is_file() {
                listeners.emit(Progress::Exists { digest: d.clone() });
                continue;
            }
            pins.note_added(d);
            jobs.push(self.fetch_blob(&sessions, d, *size, listeners));
        }
        for n in futures::future::try_join_all(jobs).await.map_err(fail)? {
            downloaded += n;
        }

        // The manifest blobs, so `repo@digest` names what the registry serves.
        for (d, bytes) in [(&res.top, &res.top_bytes), (&res.leaf, &res.leaf_bytes)] {
            pins.add(d);
            pins.note_added(d);
            self.store_small(d, bytes).map_err(fail)?;
        }
        let pulled = PulledImage {
            reference: name.clone(),
            manifest: manifest_digest.clone(),
            config: config.clone(),
            layers: layers.clone(),
        };
        let store = self.store.clone();
        let l2 = listeners.clone();
        let record = ferrolet_fsutil::spawn_blocking(move || {
            store.record_pulled(&pulled, &mut |d, step| {
                l2.emit(match step {
                    LayerStep::Extracting => Progress::Extracting { digest: d.clone() },
                    LayerStep::Done => Progress::Done { digest: d.clone() },
                })
            })
        })
        .await
        .map_err(|e| fail(format!("recording the image: {e}")))?
        .map_err(|e| fail(ferrolet_fsutil::chain(&e).to_string()))?;
        pins.recorded = true;
        drop(pins);
        tracing::info!(image = %name, id = %record.id, downloaded, elapsed = ?started.elapsed(), "pulled");
        Ok(PullOutcome { record, downloaded })
    }
}

/// Pins of blobs against garbage collection, released when dropped; and the blobs the pull
/// put into the store, removed again when it ends without recording its image (failed or
/// cancelled) unless an image refers to them or another pull pins them: a failed pull leaves
/// no orphans for `images prune` to find.
struct Pins {
    store: Arc<ImageStore>,
    pinned: Mutex<Vec<Digest>>,
    /// Blobs the store lacked when the pull went to fetch them.
    added: Vec<Digest>,
    recorded: bool,
}

impl Pins {
    fn new(store: Arc<ImageStore>) -> Pins {
        Pins {
            store,
            pinned: Mutex::new(Vec::new()),
            added: Vec::new(),
            recorded: false,
        }
    }

    fn add(&self, d: &Digest) {
        self.store.pin_blob(d);
        self.pinned.lock().unwrap_or_else(|e| e.into_inner()).push(d.clone());
    }

    /// `d` is about to be fetched: if the store lacks it, it is this pull's to take back.
    fn note_added(&mut self, d: &Digest) {
        if !self.store.blob_path(d).is_file() && !self.added.contains(d) {
            self.added.push(d.clone());
        }
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        for d in self.pinned.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            self.store.unpin_blob(&d);
        }
        if self.recorded || self.added.is_empty() {
            return;
        }
        let (store, added) = (self.store.clone(), std::mem::take(&mut self.added));
        let clean = move || match store.remove_unreferenced_blobs(&added) {
            Ok(gone) if !gone.is_empty() => {
                tracing::info!(blobs = ?gone, "removed the blobs of a pull that did not finish")
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %ferrolet_fsutil::chain(&e), "removing the blobs of a pull that did not finish")
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(clean);
            }
            Err(_) => clean(),
        }
    }
}

fn resolve_message(name: &str, errors: &[HttpError]) -> String {
    let Some(last) = errors.last() else {
        return format!("failed to resolve reference {name:?}: no endpoint");
    };
    let mut msg = format!("failed to resolve reference {name:?}: ");
    if last.status() == Some(StatusCode::NOT_FOUND) {
        msg.push_str(&format!("{name}: not found: "));
    }
    msg.push_str(&last.to_string());
    if errors.len() > 1 {
        let earlier: Vec<String> = errors[..errors.len() - 1].iter().map(|e| e.to_string()).collect();
        msg.push_str(&format!(" (mirrors tried first: {})", earlier.join("; ")));
    }
    msg
}

impl Inner {
    /// Put a verified small blob (a manifest) into the store.
    fn store_small(&self, d: &Digest, data: &[u8]) -> Result<(), String> {
        let dest = self.store.blob_path(d);
        if dest.is_file() {
            return Ok(());
        }
        ferrolet_fsutil::write_atomic(&dest, data).map_err(|e| format!("storing {d}: {}", ferrolet_fsutil::chain(&e)))
    }

    /// GET a manifest or index by tag or digest: at most 4 MiB, its digest checked against
    /// the one asked for (or the registry's Docker-Content-Digest for a tag).
    async fn get_manifest(
        &self,
        session: &Session,
        reference: &str,
        expected: Option<&Digest>,
    ) -> Result<(Digest, Bytes, ManifestDoc), Failure> {
        let url = session.endpoint.url("manifests", reference);
        let accept = HeaderValue::from_str(&format!(
            "{MEDIA_OCI_INDEX}, {MEDIA_OCI_MANIFEST}, {MEDIA_DOCKER_LIST}, {MEDIA_DOCKER_MANIFEST}, */*;q=0.1"
        ))
        .expect("ascii");
        let resp = session
            .get(&url, &[(header::ACCEPT, accept)])
            .await
            .map_err(Failure::Next)?;
        let host = session.endpoint.host.clone();
        let content_type = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let header_digest = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| Digest::parse(v).ok());
        if let Some(len) = resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            if len > MAX_MANIFEST as u64 {
                return Err(Failure::Fatal(format!(
                    "manifest {reference} from {host} is too large ({len} bytes, at most {MAX_MANIFEST})"
                )));
            }
        }
        let body = client::read_limited(resp, MAX_MANIFEST, self.timeout())
            .await
            .map_err(|e| {
                Failure::Next(HttpError::Network {
                    host: host.clone(),
                    message: format!("reading manifest {reference}: {e}"),
                })
            })?;
        let digest = Digest::of(&body);
        if let Some(exp) = expected {
            if exp != &digest {
                return Err(Failure::Fatal(format!(
                    "manifest {exp} from {host}: content hashes to {digest}; it was tampered with or corrupted"
                )));
            }
        } else if let Some(hd) = &header_digest {
            if hd != &digest {
                return Err(Failure::Fatal(format!(
                    "manifest {reference} from {host}: content hashes to {digest}, the registry says {hd}"
                )));
            }
        }
        let doc = parse_manifest(&body, &content_type, reference, &host).map_err(Failure::Fatal)?;
        Ok((digest, Bytes::from(body), doc))
    }

    /// Resolve `r` at this endpoint, down to the platform's manifest.
    async fn resolve(&self, session: &Session, r: &Reference) -> Result<Resolved, Failure> {
        let by = match (&r.digest, &r.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".to_string(),
        };
        let (top, top_bytes, mut doc) = self.get_manifest(session, &by, r.digest.as_ref()).await?;
        let (mut leaf, mut leaf_bytes) = (top.clone(), top_bytes.clone());
        let mut depth = 0;
        while is_index(&doc) {
            depth += 1;
            if depth > MAX_NESTING {
                return Err(Failure::Fatal(format!(
                    "indexes nested more than {MAX_NESTING} deep at {leaf}"
                )));
            }
            let (child, d) = choose_entry(&self.opts.platform, &doc, &leaf).map_err(Failure::Fatal)?;
            let (got, bytes, next) = self.get_manifest(session, &d.to_string(), Some(&d)).await?;
            if bytes.len() as u64 != child.size {
                return Err(Failure::Fatal(format!(
                    "manifest {d} has {} bytes, the index says {}",
                    bytes.len(),
                    child.size
                )));
            }
            leaf = got;
            leaf_bytes = bytes;
            doc = next;
        }
        let (config, layers) = image_parts(&doc, &leaf).map_err(Failure::Fatal)?;
        Ok(Resolved {
            top,
            top_bytes,
            leaf,
            leaf_bytes,
            config,
            layers,
        })
    }

    #[cfg(test)]
    fn choose(&self, manifests: &[Descriptor]) -> Option<Descriptor> {
        choose(&self.opts.platform, manifests)
    }

    /// Make sure blob `d` is in the store: present already, fetched by a concurrent pull, or
    /// downloaded now from the first of `sessions` that serves it. Returns bytes downloaded.
    /// The download is shared with concurrent pulls of the blob and runs while one of them
    /// waits: dropping this future leaves it to the others, or cancels it.
    async fn fetch_blob(
        self: &Arc<Self>,
        sessions: &Arc<Vec<Arc<Session>>>,
        d: &Digest,
        size: u64,
        listeners: &Listeners,
    ) -> Result<u64, String> {
        for attempt in 0..2 {
            if self.store.blob_path(d).is_file() {
                listeners.emit(Progress::Exists { digest: d.clone() });
                return Ok(0);
            }
            let inner = self.clone();
            let (sessions, d2, l2) = (sessions.clone(), d.clone(), listeners.clone());
            let (fut, _waiter, mine) = self.blobs.join(
                d,
                || (),
                |_| {},
                move |_| async move { inner.download(&sessions, &d2, size, &l2).await }.boxed(),
            );
            match fut.await {
                Ok(n) if mine => return Ok(n),
                Ok(_) => {
                    listeners.emit(Progress::Exists { digest: d.clone() });
                    return Ok(0);
                }
                // Another pull's download failed (its endpoint or credentials, maybe): try
                // with ours once.
                Err(e) if !mine && attempt == 0 => {
                    tracing::debug!(blob = %d, error = %e, "a concurrent download failed; fetching it ourselves");
                }
                Err(e) => return Err(e),
            }
        }
        Err(format!("downloading {d}: gave up"))
    }

    /// Download blob `d` under the download limit, from the first session that serves it.
    async fn download(
        &self,
        sessions: &[Arc<Session>],
        d: &Digest,
        size: u64,
        listeners: &Listeners,
    ) -> Result<u64, String> {
        let _permit = self
            .downloads
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| "the puller is shutting down".to_string())?;
        let mut errors = Vec::new();
        for s in sessions {
            match self.download_from(s, d, size, listeners).await {
                Ok(n) => {
                    listeners.emit(Progress::Downloaded { digest: d.clone() });
                    return Ok(n);
                }
                Err(Failure::Fatal(m)) => return Err(m),
                Err(Failure::Next(e)) => {
                    tracing::info!(blob = %d, endpoint = %s.endpoint.base(), error = %e, "downloading a blob failed at this endpoint");
                    errors.push(format!("{e}"));
                }
            }
        }
        Err(format!("failed to copy blob {d}: {}", errors.join("; ")))
    }

    /// Download `d` from one endpoint into `blobs/.partial/<hex>`, resuming what is there,
    /// verifying size and digest while streaming; rename it into the store when it matches.
    /// Whatever way it ends (an error, or the future dropped because nothing waits for the
    /// blob any more), the partial file stays to be resumed only while it is under the cap.
    async fn download_from(&self, s: &Session, d: &Digest, size: u64, listeners: &Listeners) -> Result<u64, Failure> {
        let mut guard = PartialGuard {
            path: self.store.partial_dir().join(d.hex()),
            digest: d.clone(),
            space: self.space.clone(),
            limit: self.store.layer_limits().max_bytes,
            claim: None,
            cancelled: true,
        };
        let res = self.download_into(s, d, size, listeners, &mut guard).await;
        guard.cancelled = false;
        res
    }

    async fn download_into(
        &self,
        s: &Session,
        d: &Digest,
        size: u64,
        listeners: &Listeners,
        guard: &mut PartialGuard,
    ) -> Result<u64, Failure> {
        let partial = guard.path.clone();
        let host = s.endpoint.host.clone();
        let io_fail = |what: &str, e: std::io::Error| Failure::Fatal(format!("{what} {}: {e}", partial.display()));
        let limit = self.store.layer_limits().max_bytes;
        if size > limit {
            return Err(Failure::Fatal(over_limit(d, size, limit)));
        }
        let mut fetched = 0u64;
        let mut retries = 0;
        loop {
            // What is there already, re-hashed: it may be from an earlier pull.
            let (mut hasher, mut offset) = rehash(&partial).await.map_err(|e| io_fail("reading", e))?;
            if offset > size {
                offset = 0;
                hasher = sha2::Sha256::new();
            }
            if guard.claim.is_none() {
                // Room for the rest before the first byte: a blob the filesystem cannot hold
                // without eating the reserve is refused, not downloaded until the disk is full.
                let need = size - offset;
                match self
                    .space
                    .claim(need)
                    .map_err(|e| io_fail("measuring the filesystem of", e))?
                {
                    Ok(c) => guard.claim = Some(c),
                    Err(short) => {
                        let _ = tokio::fs::remove_file(&partial).await;
                        return Err(Failure::Fatal(format!(
                            "blob {d} is {} and {} more must be downloaded, more than the {} the node can spare: {short}; refused before downloading",
                            human(size),
                            human(need),
                            human(short.room())
                        )));
                    }
                }
            }
            if offset == size && size > 0 {
                return self.finish(&partial, d, size, hasher, &host).await.map(|_| fetched);
            }
            let mut headers = vec![];
            if offset > 0 {
                headers.push((
                    header::RANGE,
                    HeaderValue::from_str(&format!("bytes={offset}-")).expect("ascii"),
                ));
            }
            let url = s.endpoint.url("blobs", &d.to_string());
            let resp = match s.get(&url, &headers).await {
                Ok(r) => r,
                Err(e) if e.status() == Some(StatusCode::RANGE_NOT_SATISFIABLE) && offset > 0 => {
                    tracing::info!(blob = %d, "the registry refused to resume; starting over");
                    let _ = tokio::fs::remove_file(&partial).await;
                    continue;
                }
                Err(e) => return Err(Failure::Next(e)),
            };
            let resumed = resp.status() == StatusCode::PARTIAL_CONTENT;
            if resumed {
                let start = resp
                    .headers()
                    .get(header::CONTENT_RANGE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(content_range_start);
                if start != Some(offset) {
                    return Err(Failure::Next(HttpError::Network {
                        host,
                        message: format!("blob {d}: asked for bytes from {offset}, got range {start:?}"),
                    }));
                }
            } else {
                // 200: the whole blob, from the start.
                if offset > 0 {
                    tracing::info!(blob = %d, offset, "the registry sent the whole blob instead of the rest; starting over");
                }
                offset = 0;
                hasher = sha2::Sha256::new();
            }
            let file = tokio::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(!resumed)
                .append(resumed)
                .open(&partial)
                .await
                .map_err(|e| io_fail("opening", e))?;
            // Chunks arrive in kilobytes: write in megabytes.
            let mut file = tokio::io::BufWriter::with_capacity(1 << 20, file);
            if offset > 0 {
                tracing::info!(blob = %d, offset, total = size, "resuming a partial download");
            }
            let mut body = resp.into_body();
            let mut done = offset;
            let mut last_report = 0u64;
            let mut unchecked = 0u64;
            listeners.emit(Progress::Downloading {
                digest: d.clone(),
                done,
                total: size,
            });
            let broke = loop {
                let frame = match self.timeout() {
                    Some(t) => match tokio::time::timeout(t, body.frame()).await {
                        Ok(f) => f,
                        Err(_) => {
                            file.flush().await.map_err(|e| io_fail("writing", e))?;
                            return Err(Failure::Fatal(format!(
                                "failed to copy blob {d} from {host}: no progress for {}s (image pull progress timeout); {done} of {size} bytes kept to resume",
                                t.as_secs_f64()
                            )));
                        }
                    },
                    None => body.frame().await,
                };
                let Some(frame) = frame else { break None };
                let frame = match frame {
                    Ok(f) => f,
                    Err(e) => break Some(client::error_chain(&e)),
                };
                let Ok(data) = frame.into_data() else { continue };
                if done + data.len() as u64 > size {
                    discard(file, &partial).await;
                    return Err(Failure::Fatal(format!(
                        "blob {d} from {host} is larger than the {size} bytes the manifest gives; it was tampered with or corrupted"
                    )));
                }
                hasher.update(&data);
                file.write_all(&data).await.map_err(|e| io_fail("writing", e))?;
                done += data.len() as u64;
                fetched += data.len() as u64;
                unchecked += data.len() as u64;
                if unchecked >= SPACE_CHECK_EVERY {
                    // Something else may be filling the filesystem: stop before the reserve.
                    let claim = guard.claim.as_mut().expect("claimed above");
                    claim.wrote(unchecked);
                    unchecked = 0;
                    if let Err(short) = claim
                        .still_fits()
                        .map_err(|e| io_fail("measuring the filesystem of", e))?
                    {
                        discard(file, &partial).await;
                        return Err(Failure::Fatal(format!(
                            "stopped downloading blob {d} ({}) after {done} bytes: {short}; the partial download was deleted",
                            human(size)
                        )));
                    }
                }
                if done - last_report >= 512 * 1024 || done == size {
                    last_report = done;
                    listeners.emit(Progress::Downloading {
                        digest: d.clone(),
                        done,
                        total: size,
                    });
                }
            };
            file.flush().await.map_err(|e| io_fail("writing", e))?;
            file.get_ref().sync_all().await.map_err(|e| io_fail("syncing", e))?;
            drop(file);
            match broke {
                None if done == size => return self.finish(&partial, d, size, hasher, &host).await.map(|_| fetched),
                None => {
                    // The body ended early: keep what came and resume.
                    if retries >= BODY_RETRIES {
                        return Err(Failure::Next(HttpError::Network {
                            host,
                            message: format!("blob {d}: the body ended after {done} of {size} bytes"),
                        }));
                    }
                }
                Some(e) => {
                    if retries >= BODY_RETRIES {
                        return Err(Failure::Next(HttpError::Network {
                            host,
                            message: format!("blob {d}: reading after {done} of {size} bytes: {e}"),
                        }));
                    }
                    tracing::info!(blob = %d, done, total = size, error = %e, "the download broke off; resuming");
                }
            }
            retries += 1;
        }
    }

    /// Check the complete partial file's digest and move it into the store; a mismatch
    /// deletes it.
    async fn finish(
        &self,
        partial: &std::path::Path,
        d: &Digest,
        size: u64,
        hasher: sha2::Sha256,
        host: &str,
    ) -> Result<(), Failure> {
        let actual = Digest::from_hex(&hex::encode(hasher.finalize())).expect("sha256 hex");
        if &actual != d {
            let _ = tokio::fs::remove_file(partial).await;
            return Err(Failure::Fatal(format!(
                "blob {d} from {host}: content ({size} bytes) hashes to {actual}; it was tampered with or corrupted and was deleted"
            )));
        }
        let dest = self.store.blob_path(d);
        tokio::fs::rename(partial, &dest)
            .await
            .map_err(|e| Failure::Fatal(format!("storing blob {}: {e}", dest.display())))?;
        Ok(())
    }
}

/// A blob whose declared size is over the layer limit.
fn over_limit(d: &Digest, size: u64, limit: u64) -> String {
    format!(
        "blob {d} declares {}, more than the layer limit of {}; refused before downloading",
        human(size),
        human(limit)
    )
}

/// A download's partial file and the room it claimed. When the download ends without
/// moving the file into the store (an error, or cancelled: its future dropped), the file stays
/// to be resumed only while it is under the cap: no larger than the layer limit, and the
/// filesystem still keeping its reserve (plus what other downloads claimed).
struct PartialGuard {
    path: std::path::PathBuf,
    digest: Digest,
    space: Arc<Space>,
    limit: u64,
    claim: Option<Claim>,
    /// Still set when the download's future was dropped before it returned.
    cancelled: bool,
}

impl Drop for PartialGuard {
    fn drop(&mut self) {
        // Give the unwritten claim back first: the check below is about what is on disk.
        self.claim = None;
        let Ok(md) = std::fs::metadata(&self.path) else { return };
        let len = md.len();
        let fits = len <= self.limit && self.space.keeps_reserve().unwrap_or(false);
        if fits {
            if self.cancelled {
                tracing::info!(blob = %self.digest, bytes = len, "download cancelled (no pull waits for it); the partial file is kept to be resumed");
            }
            return;
        }
        tracing::info!(blob = %self.digest, bytes = len, cancelled = self.cancelled, "partial download over the cap deleted");
        let path = self.path.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(move || std::fs::remove_file(path));
            }
            Err(_) => {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// Platforms an index without a match is said to have, at most: an index may list thousands,
/// and the message ends up in the pod's status.
const PLATFORMS_LISTED: usize = 8;

/// Decode a manifest or index body as the registry served it (`content_type`); schema 1 is
/// refused with a message that says so.
fn parse_manifest(body: &[u8], content_type: &str, reference: &str, host: &str) -> Result<ManifestDoc, String> {
    if content_type.starts_with(MEDIA_DOCKER_SCHEMA1) {
        return Err(schema1_message(reference));
    }
    let doc: ManifestDoc = serde_json::from_slice(body).map_err(|e| {
        let mut e = e.to_string();
        cap_in_place(&mut e, 200);
        format!("manifest {reference} from {host} is not valid: {e}")
    })?;
    if doc.schema_version == Some(1) {
        return Err(schema1_message(reference));
    }
    Ok(doc)
}

/// Cut `s` to at most `max` bytes on a character boundary, saying so.
fn cap_in_place(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
}

/// The index entry for `platform` (see [`choose`]) and its digest; the entry must be small
/// enough to be a manifest. No match names the platforms the index has, the first few.
fn choose_entry(platform: &Platform, doc: &ManifestDoc, leaf: &Digest) -> Result<(Descriptor, Digest), String> {
    let manifests = doc.manifests.as_deref().unwrap_or_default();
    let Some(child) = choose(platform, manifests) else {
        let mut have: Vec<String> = Vec::new();
        let mut total = 0usize;
        for p in manifests.iter().filter_map(|m| m.platform.as_ref()) {
            let mut name = format!(
                "{}/{}{}",
                p.os,
                p.architecture,
                p.variant.as_deref().map(|v| format!("/{v}")).unwrap_or_default()
            );
            if have.contains(&name) {
                continue;
            }
            total += 1;
            if have.len() < PLATFORMS_LISTED {
                // A platform's fields are the registry's words: a few dozen bytes is plenty.
                cap_in_place(&mut name, 64);
                have.push(name);
            }
            if total > 10_000 {
                break;
            }
        }
        let mut listed = if have.is_empty() {
            "none".to_string()
        } else {
            have.join(", ")
        };
        if total > have.len() {
            listed.push_str(&format!(" and {} more", total - have.len()));
        }
        return Err(format!(
            "no match for platform in manifest: index {leaf} has no image for {platform} (it has {listed})"
        ));
    };
    let d = digest_of(&child, "index entry")?;
    if child.size > MAX_MANIFEST as u64 {
        return Err(format!("manifest {d} is too large ({} bytes)", child.size));
    }
    Ok((child, d))
}

/// The config and layers of an image manifest, refused when it is not a container image.
fn image_parts(doc: &ManifestDoc, leaf: &Digest) -> Result<(Descriptor, Vec<Descriptor>), String> {
    let config = doc
        .config
        .clone()
        .ok_or_else(|| format!("manifest {leaf} has no config"))?;
    let cm = config.media_type.as_str();
    if !(cm.is_empty()
        || cm == "application/vnd.oci.image.config.v1+json"
        || cm == "application/vnd.docker.container.image.v1+json")
    {
        let mut cm = cm.to_string();
        cap_in_place(&mut cm, 100);
        return Err(format!("manifest {leaf} is not a container image (its config is {cm})"));
    }
    let layers = doc.layers.clone().unwrap_or_default();
    for l in &layers {
        let m = l.media_type.as_str();
        if !(m.is_empty() || m.contains(".tar") || m.ends_with(".tar") || m.contains("rootfs.diff.tar")) {
            let (mut m, mut ld) = (m.to_string(), l.digest.clone());
            cap_in_place(&mut m, 100);
            cap_in_place(&mut ld, 80);
            return Err(format!(
                "manifest {leaf}: layer {ld} has media type {m}, not a filesystem layer"
            ));
        }
    }
    Ok((config, layers))
}

/// The index entry for `platform`: the most preferred platform that matches, the first such
/// entry; entries without a platform match last.
fn choose(platform: &Platform, manifests: &[Descriptor]) -> Option<Descriptor> {
    let mut best: Option<(usize, &Descriptor)> = None;
    for m in manifests {
        let rank = match &m.platform {
            Some(p) => match platform.rank(&p.os, &p.architecture, p.variant.as_deref()) {
                Some(r) => r,
                None => continue,
            },
            None => usize::MAX,
        };
        if best.is_none_or(|(b, _)| rank < b) {
            best = Some((rank, m));
        }
    }
    best.map(|(_, m)| m.clone())
}

/// What the puller makes of one manifest or index document, without the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selected {
    /// An index: the entry for the platform, to fetch next (digest, size).
    Entry(Digest, u64),
    /// An image manifest: its config and layers (digest, declared size), every layer within
    /// the layer limit.
    Image {
        config: (Digest, u64),
        layers: Vec<(Digest, u64)>,
    },
}

/// The decisions [`Puller`] takes on a manifest or index body served with `content_type`:
/// decoding (schema 1 refused), the platform's entry of an index, or an image's config and
/// layers with their media types and sizes checked against `layer_limit` (as a pull checks
/// them before downloading). The errors are the pull's. For fuzzing and tests.
pub fn select_manifest(
    body: &[u8],
    content_type: &str,
    platform: &Platform,
    layer_limit: u64,
) -> Result<Selected, String> {
    if body.len() > MAX_MANIFEST {
        return Err(format!(
            "manifest is too large ({} bytes, at most {MAX_MANIFEST})",
            body.len()
        ));
    }
    let digest = Digest::of(body);
    let doc = parse_manifest(body, content_type, "fuzz", "fuzz")?;
    if is_index(&doc) {
        let (child, d) = choose_entry(platform, &doc, &digest)?;
        return Ok(Selected::Entry(d, child.size));
    }
    let (config, layers) = image_parts(&doc, &digest)?;
    let config = (digest_of(&config, "config")?, config.size);
    let mut out = Vec::new();
    for l in &layers {
        let d = digest_of(l, "layer")?;
        if l.size > layer_limit {
            return Err(over_limit(&d, l.size, layer_limit));
        }
        out.push((d, l.size));
    }
    Ok(Selected::Image { config, layers: out })
}

fn schema1_message(reference: &str) -> String {
    format!(
        "manifest {reference} is Docker image manifest schema 1, which is deprecated and not supported; \
         push the image again with a current client (schema 2 or OCI)"
    )
}

fn is_index(doc: &ManifestDoc) -> bool {
    match doc.media_type.as_deref() {
        Some(MEDIA_OCI_INDEX) | Some(MEDIA_DOCKER_LIST) => true,
        Some(_) => false,
        None => doc.manifests.is_some() && doc.config.is_none(),
    }
}

/// `bytes 100-199/200` -> 100.
fn content_range_start(v: &str) -> Option<u64> {
    let r = v.trim().strip_prefix("bytes")?.trim_start();
    r.split('-').next()?.trim().parse().ok()
}

/// Delete a partial download being written. Its space comes back only when the file is
/// closed, and a dropped tokio file closes later, on the blocking pool, once a write in
/// flight ends: wait for that first, so the room the reserve was promised is free again
/// when the pull's error is seen. What is still buffered is thrown away unwritten.
async fn discard(file: tokio::io::BufWriter<tokio::fs::File>, partial: &std::path::Path) {
    drop(file.into_inner().into_std().await);
    let _ = tokio::fs::remove_file(partial).await;
}

/// Hash what `path` holds: (hasher over it, its length); nothing there is (fresh, 0).
async fn rehash(path: &std::path::Path) -> std::io::Result<(sha2::Sha256, u64)> {
    let mut f = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((sha2::Sha256::new(), 0)),
        Err(e) => return Err(e),
    };
    let mut h = sha2::Sha256::new();
    let mut n = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let k = f.read(&mut buf).await?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((h, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Platform;

    #[test]
    fn content_ranges() {
        assert_eq!(content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(content_range_start("bytes 0-0/*"), Some(0));
        assert_eq!(content_range_start("items 1-2/3"), None);
    }

    #[tokio::test]
    async fn rehash_covers_the_partial_prefix() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("x");
        let (h, n) = rehash(&p).await.unwrap();
        assert_eq!((hex::encode(h.finalize()), n), (Digest::of(b"").hex().to_string(), 0));
        std::fs::write(&p, b"hello ").unwrap();
        let (mut h, n) = rehash(&p).await.unwrap();
        assert_eq!(n, 6);
        h.update(b"world");
        assert_eq!(hex::encode(h.finalize()), Digest::of(b"hello world").hex());
    }

    fn desc(os: &str, arch: &str, variant: Option<&str>, n: u8) -> Descriptor {
        Descriptor {
            media_type: MEDIA_OCI_MANIFEST.into(),
            digest: format!("sha256:{}", format!("{n:02x}").repeat(32)),
            size: 1,
            platform: Some(PlatformDoc {
                os: os.into(),
                architecture: arch.into(),
                variant: variant.map(str::to_string),
            }),
        }
    }

    #[test]
    fn index_entries_chosen_by_platform_preference() {
        let store = Arc::new(ImageStore::open(tempfile::tempdir().unwrap().keep().join("images")).unwrap());
        let mk = |p: &str| {
            Puller::new(
                store.clone(),
                RegistryConfig::default(),
                PullerOptions {
                    max_concurrent_downloads: 3,
                    progress_timeout: Duration::from_secs(60),
                    platform: Platform::parse(p).unwrap(),
                    reserve: Default::default(),
                },
            )
        };
        let list = vec![
            desc("unknown", "unknown", None, 0),
            desc("linux", "arm", Some("v6"), 1),
            desc("linux", "arm", Some("v7"), 2),
            desc("linux", "amd64", None, 3),
            desc("linux", "arm64", Some("v8"), 4),
            desc("linux", "386", None, 5),
        ];
        let pick = |p: &str, l: &[Descriptor]| mk(p).inner.choose(l).map(|d| d.digest[7..9].to_string());
        assert_eq!(pick("linux/amd64", &list).as_deref(), Some("03"));
        assert_eq!(pick("linux/arm64", &list).as_deref(), Some("04"));
        assert_eq!(pick("linux/arm/v7", &list).as_deref(), Some("02"));
        assert_eq!(pick("linux/arm/v6", &list).as_deref(), Some("01"));
        assert_eq!(pick("linux/arm64", &list[..3]).as_deref(), Some("02"));
        assert_eq!(pick("linux/amd64", &list[..3]), None);
        assert_eq!(pick("linux/amd64", &[list[5].clone()]).as_deref(), Some("05"));
        let _ = std::fs::remove_dir_all(store.dir().parent().unwrap());
    }

    #[test]
    fn a_huge_index_without_the_platform_gives_a_short_message() {
        // 10,000 entries, none for this platform (about 1.6 MB of JSON).
        let entries: Vec<serde_json::Value> = (0..10_000)
            .map(|i| {
                serde_json::json!({"mediaType": MEDIA_OCI_MANIFEST, "digest": format!("sha256:{}", "a".repeat(64)),
                    "size": 100, "platform": {"os": "plan9", "architecture": format!("arch{i}")}})
            })
            .collect();
        let body =
            serde_json::json!({"schemaVersion": 2, "mediaType": MEDIA_OCI_INDEX, "manifests": entries}).to_string();
        let err = select_manifest(
            body.as_bytes(),
            MEDIA_OCI_INDEX,
            &Platform::parse("linux/amd64").unwrap(),
            16 << 30,
        )
        .unwrap_err();
        assert!(err.len() < 1024, "{} bytes: {err}", err.len());
        assert!(err.contains("plan9/arch0, plan9/arch1"), "{err}");
        assert!(err.ends_with("and 9992 more)"), "{err}");
        // Long platform fields are cut too.
        let body = serde_json::json!({"schemaVersion": 2, "manifests": (0..20).map(|i| serde_json::json!(
            {"digest": format!("sha256:{}", "b".repeat(64)), "size": 1,
             "platform": {"os": "x".repeat(100_000), "architecture": format!("{i}")}})).collect::<Vec<_>>()})
        .to_string();
        let err = select_manifest(body.as_bytes(), "", &Platform::parse("linux/amd64").unwrap(), 1).unwrap_err();
        assert!(err.len() < 1024, "{} bytes", err.len());
    }

    #[test]
    fn a_layer_over_the_limit_is_refused_from_the_manifest() {
        let body = serde_json::json!({"schemaVersion": 2, "mediaType": MEDIA_OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{}", "c".repeat(64)), "size": 10},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": format!("sha256:{}", "d".repeat(64)), "size": 1u64 << 62}]})
        .to_string();
        let p = Platform::parse("linux/amd64").unwrap();
        let err = select_manifest(body.as_bytes(), MEDIA_OCI_MANIFEST, &p, 16 << 30).unwrap_err();
        assert!(
            err.contains("declares 4611686018427387904 bytes")
                && err.contains("layer limit of 17179869184 bytes (16.0 GiB)"),
            "{err}"
        );
        let ok = select_manifest(body.as_bytes(), MEDIA_OCI_MANIFEST, &p, u64::MAX).unwrap();
        assert!(matches!(ok, Selected::Image { layers, .. } if layers[0].1 == 1 << 62));
    }

    #[test]
    fn index_detection() {
        let d: ManifestDoc = serde_json::from_str(r#"{"schemaVersion":2,"manifests":[]}"#).unwrap();
        assert!(is_index(&d));
        let d: ManifestDoc = serde_json::from_str(&format!(
            r#"{{"schemaVersion":2,"mediaType":"{MEDIA_DOCKER_MANIFEST}","config":{{"digest":"sha256:{}","size":1}},"layers":[]}}"#,
            "a".repeat(64)
        ))
        .unwrap();
        assert!(!is_index(&d));
    }
}
