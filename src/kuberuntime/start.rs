//! Starting a container, in kubelet's steps (kuberuntime's startContainer): make sure the
//! image is there (the worker asks the image manager first), generate the container's config, create it, start it, run its postStart
//! hook. Each step that fails says why as the container's waiting state, with kubelet's reason.
//! The pod worker calls the steps one by one because it keeps track of what was created.

use std::time::Duration;

use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::Runtime;
use k8s_openapi::api::core::v1::{Container, Pod};
use tracing::warn;

use super::container::{self, BuildInput};
use super::kill::stop_container;
use crate::images::ImageManager;
use crate::lifecycle;
use crate::pod::reasons::{self, Waiting};
use crate::pod::{self};
use crate::probe::netns::PodTarget;

/// How soon a failed start is tried again (the crash-loop back-off applies on top for
/// containers that ran).
pub const RETRY: Duration = Duration::from_secs(5);

/// Config and create, once [`ImageManager::ensure_image_exists`] has the image (`image_id`):
/// the id of a created (not yet started) container.
pub async fn create_container(
    rt: &Runtime,
    images: &ImageManager,
    input: BuildInput,
    image_id: Digest,
) -> Result<String, Waiting> {
    let timeout = input.cfg.runtime_request_timeout;
    let link_dir = input.cfg.container_log_link_dir.clone();
    let mut cfg = crate::tasks::blocking(move || container::build(&input))
        .await
        .map_err(|e| Waiting::new(reasons::CREATE_CONTAINER_CONFIG_ERROR, format!("{e:#}")).retry_in(RETRY))?;
    // The image the image manager made sure of, as kubelet creates from the imageRef it got
    // back: another pod's pull may move the tag meanwhile.
    cfg.image_ref = Some(image_id.clone());
    let created = crate::metrics::global().time_runtime("create_container", rt.create(&cfg));
    match tokio::time::timeout(timeout, created).await {
        Ok(Ok(info)) => {
            super::log_links::create(&link_dir, &info);
            images.mark_used(&image_id).await;
            Ok(info.id().to_string())
        }
        Ok(Err(ferrolet_runtime::Error::InvalidConfig { field, reason })) => {
            Err(Waiting::new(reasons::CREATE_CONTAINER_CONFIG_ERROR, format!("{field}: {reason}")).retry_in(RETRY))
        }
        Ok(Err(e)) => {
            Err(Waiting::new(reasons::CREATE_CONTAINER_ERROR, ferrolet_fsutil::chain(&e).to_string()).retry_in(RETRY))
        }
        Err(_) => Err(Waiting::new(
            reasons::CREATE_CONTAINER_ERROR,
            format!("context deadline exceeded ({timeout:?})"),
        )
        .retry_in(RETRY)),
    }
}

/// Let a created container run. A container that fails to start is deleted (with its log
/// link, kept in `link_dir`).
pub async fn start_created(rt: &Runtime, link_dir: &std::path::Path, id: &str) -> Result<(), Waiting> {
    let m = crate::metrics::global();
    if let Err(e) = m.time_runtime("start_container", rt.start(id)).await {
        let message = ferrolet_fsutil::chain(&e).to_string();
        if let Err(e) = super::log_links::remove_container(rt, link_dir, id).await {
            warn!(container = %id, error = %ferrolet_fsutil::chain(&e), "removing a container that failed to start");
        }
        return Err(Waiting::new(reasons::RUN_CONTAINER_ERROR, message).retry_in(RETRY));
    }
    Ok(())
}

/// Run the container's postStart hook, if it has one. When the hook fails the container is
/// stopped (within the pod's grace period) and the failure is returned.
pub async fn run_post_start(
    rt: &std::sync::Arc<Runtime>,
    pod: &Pod,
    c: &Container,
    id: &str,
    target: &PodTarget,
    timeout: Duration,
) -> Result<(), Waiting> {
    let Some(h) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) else {
        return Ok(());
    };
    let pod_name = pod::full_name(pod);
    if let Err(e) = lifecycle::run(rt, h, id, c, &pod_name, target, timeout).await {
        warn!(pod = %pod_name, container = %c.name, reason = reasons::EVENT_FAILED_POST_START_HOOK, "{e}");
        // kubelet kills it without an override: the 2 s minimum applies.
        let grace = Duration::from_secs(pod::grace_period(pod) as u64).max(super::kill::MIN_GRACE);
        let signal = rt.inspect(id).ok().and_then(|i| i.record.stop_signal);
        stop_container(rt.clone(), id.to_string(), signal, grace).await;
        return Err(Waiting::new(reasons::POST_START_HOOK_ERROR, e.0).retry_in(RETRY));
    }
    Ok(())
}
