//! The node's heartbeat Lease (kubelet's nodelease controller, component-helpers' lease
//! controller): `kube-node-lease/<node>`, created when missing with an owner reference to the
//! Node, renewed every quarter of its duration; an update that conflicts re-reads the Lease,
//! an API server that fails is retried with back-off, and nothing ever stops the heartbeat.

use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use tracing::{debug, error, info, warn};

use crate::kubeclient::Kube;

/// Where node Leases live.
pub const NAMESPACE: &str = "kube-node-lease";
/// Updates tried per heartbeat before the heartbeat counts as failed (kubelet's
/// maxUpdateRetries).
const MAX_UPDATE_RETRIES: usize = 5;
/// The back-off of creating or reading the Lease: 200ms doubling to 7s.
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(7);

/// The Lease renewal interval for a duration: a quarter of it (kubelet's
/// NodeLeaseRenewIntervalFraction).
pub fn renew_interval(duration_seconds: i32) -> Duration {
    Duration::from_millis((duration_seconds.max(1) as u64) * 250)
}

/// One node's Lease heartbeat.
pub struct LeaseController {
    kube: Kube,
    node: String,
    duration_seconds: i32,
    /// The Lease as last written, the base of the next update.
    latest: Option<Lease>,
    /// Whether the last heartbeat failed (one log line per change).
    failing: bool,
}

impl LeaseController {
    pub fn new(kube: Kube, node: &str, duration_seconds: i32) -> LeaseController {
        LeaseController {
            kube,
            node: node.to_string(),
            duration_seconds,
            latest: None,
            failing: false,
        }
    }

    /// The Lease as last written.
    pub fn latest(&self) -> Option<&Lease> {
        self.latest.as_ref()
    }

    fn api(&self) -> Api<Lease> {
        Api::namespaced(self.kube.client(), NAMESPACE)
    }

    /// One heartbeat (kubelet's sync): renew from the Lease last written; when that fails, read
    /// (or create) the Lease with back-off and renew from it. Waits out an unreachable API server.
    pub async fn heartbeat(&mut self) {
        if let Some(base) = self.latest.clone() {
            match self.retry_update(base).await {
                Ok(()) => return self.recovered(),
                Err(e) => {
                    debug!(node = %self.node, error = %format!("{e:#}"), "renewing from the last Lease failed; reading it again")
                }
            }
        }
        let (lease, created) = self.backoff_ensure().await;
        self.latest = Some(lease.clone());
        if created {
            return self.recovered();
        }
        match self.retry_update(lease).await {
            Ok(()) => self.recovered(),
            Err(e) => {
                if !self.failing {
                    error!(node = %self.node, error = %format!("{e:#}"), "renewing the node lease failed; retrying");
                    self.failing = true;
                }
            }
        }
    }

    fn recovered(&mut self) {
        if self.failing {
            info!(node = %self.node, "renewing the node lease again");
            self.failing = false;
        }
    }

    /// Read the Lease, creating it when missing, until that works (200ms doubling to 7s).
    /// Returns it and whether it was just created.
    async fn backoff_ensure(&mut self) -> (Lease, bool) {
        let mut sleep = FIRST_RETRY;
        let mut logged = false;
        loop {
            match self.ensure().await {
                Ok(r) => return r,
                Err(e) => {
                    if !logged && !self.failing {
                        error!(node = %self.node, error = %format!("{e:#}"), retry_in = ?sleep, "failed to ensure the node lease exists; retrying with back-off");
                        logged = true;
                    }
                }
            }
            tokio::time::sleep(sleep).await;
            sleep = (sleep * 2).min(MAX_BACKOFF);
        }
    }

    async fn ensure(&self) -> Result<(Lease, bool)> {
        let api = self.api();
        if let Some(l) = api.get_opt(&self.node).await.context("getting the node lease")? {
            return Ok((l, false));
        }
        let lease = self.new_lease(None).await;
        let created = api
            .create(&PostParams::default(), &lease)
            .await
            .context("creating the node lease")?;
        info!(node = %self.node, "created the node lease");
        Ok((created, true))
    }

    /// Write a renewed `base`, up to [`MAX_UPDATE_RETRIES`] times; a conflict re-reads it first.
    async fn retry_update(&mut self, mut base: Lease) -> Result<()> {
        let mut last = anyhow!("no attempt");
        for _ in 0..MAX_UPDATE_RETRIES {
            let lease = self.new_lease(Some(&base)).await;
            match self.api().replace(&self.node, &PostParams::default(), &lease).await {
                Ok(l) => {
                    self.latest = Some(l);
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    warn!(node = %self.node, "the node lease changed under us; reading it again");
                    last = anyhow!("conflict updating the node lease");
                    base = self.backoff_ensure().await.0;
                }
                Err(e) => last = anyhow::Error::new(e).context("updating the node lease"),
            }
        }
        Err(last.context(format!("failed {MAX_UPDATE_RETRIES} attempts to update the node lease")))
    }

    /// The Lease to write: `base` (or a new one) held by this node for its duration, renewed
    /// now, owned by the Node (kubelet's setNodeOwnerFunc: set once the Node can be read).
    async fn new_lease(&self, base: Option<&Lease>) -> Lease {
        let mut lease = base.cloned().unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.node.clone()),
                namespace: Some(NAMESPACE.into()),
                ..Default::default()
            },
            spec: None,
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.node.clone());
        spec.lease_duration_seconds = Some(self.duration_seconds);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        if lease.metadata.owner_references.as_ref().is_none_or(Vec::is_empty) {
            match Api::<Node>::all(self.kube.client()).get(&self.node).await {
                Ok(node) => {
                    lease.metadata.owner_references = Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: self.node.clone(),
                        uid: node.metadata.uid.unwrap_or_default(),
                        ..Default::default()
                    }])
                }
                Err(e) => {
                    debug!(node = %self.node, error = %e, "the node lease gets its owner once the Node can be read")
                }
            }
        }
        lease
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewed_every_quarter_of_the_duration() {
        assert_eq!(renew_interval(40), Duration::from_secs(10));
        assert_eq!(renew_interval(10), Duration::from_millis(2500));
    }
}
