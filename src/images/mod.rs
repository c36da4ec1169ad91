//! Images on the node (kubelet's image manager, pkg/kubelet/images): whether a container's
//! image is there to run, with kubelet's pull policies, reasons and back-off; and how images
//! reach a node without a registry ([`local`]: the demo image in the binary, the import
//! directory).

pub mod local;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use ferrolet_runtime::Runtime;
use k8s_openapi::api::core::v1::Container;

use crate::backoff::Backoff;
use crate::pod::reasons::{self, Waiting};
use crate::pod::units::format_duration;

/// The image side of starting a container.
pub struct ImageManager {
    rt: Arc<Runtime>,
    import_dir: PathBuf,
    /// Failed "pulls" by `<pod uid>_<image>`, as kubelet keys its image back-off.
    backoff: Mutex<Backoff>,
}

impl ImageManager {
    pub fn new(rt: Arc<Runtime>, import_dir: PathBuf) -> ImageManager {
        ImageManager {
            rt,
            import_dir,
            backoff: Mutex::new(Backoff::new(Duration::from_secs(10), Duration::from_secs(300))),
        }
    }

    /// kubelet's EnsureImageExists for a node without registry access: the image must be in
    /// the local store. A missing one is ErrImageNeverPull (policy Never), or ErrImagePull and
    /// then ImagePullBackOff, retried under back-off (an archive may be imported meanwhile).
    pub fn ensure_image_exists(&self, pod_uid: &str, c: &Container) -> Result<(), Waiting> {
        let image = c.image.clone().unwrap_or_default();
        let key = format!("{pod_uid}_{image}");
        let mut backoff = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
        let now = Utc::now();
        backoff.gc(now);
        if self.rt.images().find(&image).is_ok() {
            backoff.forget(&key);
            return Ok(());
        }
        if c.image_pull_policy.as_deref() == Some("Never") {
            return Err(Waiting::new(
                reasons::ERR_IMAGE_NEVER_PULL,
                format!("Container image \"{image}\" is not present with pull policy of Never"),
            )
            .retry_in(Duration::from_secs(5)));
        }
        if let Some((until, d)) = backoff.wait_until(&key, now, now) {
            return Err(Waiting::new(
                reasons::IMAGE_PULL_BACK_OFF,
                format!("Back-off pulling image \"{image}\": waiting {}", format_duration(d)),
            )
            .retry_at(until));
        }
        backoff.next(&key, now);
        let d = backoff.current(&key).unwrap_or(Duration::from_secs(10));
        Err(Waiting::new(
            reasons::ERR_IMAGE_PULL,
            format!(
                "image \"{image}\" is not in the node's image store and this node pulls from no registry; import it with `ferrolet images import` or drop the archive in {}",
                self.import_dir.display()
            ),
        )
        .retry_in(d))
    }
}
