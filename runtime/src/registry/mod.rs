//! Pulling images from registries (the OCI distribution API), as containerd does for
//! kubelet: mirrors and rewrites from a k3s-style `registries.yaml`, anonymous, basic and
//! bearer-token authentication, platform choice in indexes, blobs streamed into the image
//! store with their digest and size verified, resumed downloads, one fetch per blob at a time.
//! Knows nothing of Kubernetes: credentials come in as [`Credentials`].
//!
//! The design note is docs/images.md ("Pulling from registries").

mod auth;
mod client;
pub mod config;
mod flight;
mod platform;
mod pull;
mod space;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use crate::digest::Digest;
use crate::image::ImageRecord;

pub use config::{Mirror, RegistryConfig, Rewrite};
pub use pull::{select_manifest, Puller, Selected};
pub use space::DiskReserve;

/// One credential to try against a registry host, as a docker config.json entry or a
/// credential provider gives it.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// `username` / `password` (or `auth`, base64 of `user:password`).
    Basic { username: String, password: String },
    /// `identitytoken`: an OAuth2 refresh token, sent to the token realm.
    IdentityToken(String),
    /// `registrytoken`: a bearer token sent as is.
    RegistryToken(String),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            Credentials::IdentityToken(_) => f.write_str("IdentityToken(<redacted>)"),
            Credentials::RegistryToken(_) => f.write_str("RegistryToken(<redacted>)"),
        }
    }
}

/// The platform whose image is chosen from an index: this machine's by default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    /// GOARCH spelling: `amd64`, `arm64`, `arm`, ...
    pub architecture: String,
    /// `v7`, `v8`, ... (arm only).
    pub variant: Option<String>,
}

/// Progress of one pull, reported as it happens.
#[derive(Debug, Clone)]
pub enum Progress {
    /// The manifest is known: the layers to have, with their compressed sizes, bottom first.
    Resolved {
        manifest: Digest,
        layers: Vec<(Digest, u64)>,
    },
    /// Bytes of a layer (or the config) now on disk, of `total`.
    Downloading { digest: Digest, done: u64, total: u64 },
    /// A layer was already in the store (or fetched by a concurrent pull): nothing to download.
    Exists { digest: Digest },
    /// Downloaded and verified.
    Downloaded { digest: Digest },
    /// Being unpacked.
    Extracting { digest: Digest },
    /// Unpacked (or was already).
    Done { digest: Digest },
}

pub type ProgressFn = Arc<dyn Fn(Progress) + Send + Sync>;

/// How pulls are made.
#[derive(Debug, Clone)]
pub struct PullerOptions {
    /// Blobs downloaded at once, across all pulls.
    pub max_concurrent_downloads: usize,
    /// A download that makes no progress for this long fails (containerd's
    /// image_pull_progress_timeout); so does a request with no answer for this long. Zero: no
    /// limit.
    pub progress_timeout: Duration,
    pub platform: Platform,
    /// What the image store's filesystem keeps free whatever is pulled: a blob that would eat
    /// into it is refused before its first byte, and a download stops when the filesystem
    /// fills up under it (the agent passes its hard eviction thresholds for the image and node
    /// filesystems, so a pull never makes the node evict pods).
    pub reserve: DiskReserve,
}

impl Default for PullerOptions {
    /// containerd's defaults: 3 downloads at once, a 1 minute progress timeout, this node's
    /// platform; no reserve.
    fn default() -> Self {
        PullerOptions {
            max_concurrent_downloads: 3,
            progress_timeout: Duration::from_secs(60),
            platform: Platform::host(),
            reserve: DiskReserve::default(),
        }
    }
}

/// What a pull did.
#[derive(Debug, Clone)]
pub struct PullOutcome {
    /// The image as the store now records it (the pulled reference among its `refs`).
    pub record: ImageRecord,
    /// Bytes fetched from the network by this pull (0 when everything was in the store).
    pub downloaded: u64,
}

/// Why a pull failed. `Display` is what kubelet shows after "Failed to pull image ...: ".
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// A bad reference (kubelet's InvalidImageName), or a store error.
    #[error(transparent)]
    Invalid(#[from] crate::Error),
    /// The pull failed: the registry's answer, the network, a tampered blob, ...
    #[error("{0}")]
    Other(String),
    /// Bad registry configuration (`registries.yaml`, a platform): names the file and field.
    #[error("{0}")]
    Config(String),
}
