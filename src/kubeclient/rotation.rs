//! Certificate rotation (client-go's util/certificate Manager): one [`CertificateManager`]
//! renews a certificate at a jittered 70-90% of its lifetime; failures (a panic in an attempt
//! among them) are retried with a doubling back-off (2 s to 5 min) and logged once per change
//! of error. Two certificates use it, each with its [`Renewal`]: the client certificate
//! (kubelet's rotateCertificates, [`Rotation`]: a new key and a CertificateSigningRequest sent
//! with the node's own current credential, the bootstrap credential once that has expired; the
//! issued certificate goes to the store and a client built on it replaces the one every
//! [`super::Kube`] hands out) and the serving certificate (server::certs::bootstrap).
//!
//! Tests shorten the wait with `FERROLET_TEST_ROTATE_CERT_AFTER=<seconds>`: each certificate is
//! then renewed that long after it came into use instead of at its deadline (a control plane
//! signs for a year).

use std::sync::Weak;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use futures::FutureExt;
use tokio::sync::watch;
use tracing::{info, warn};

use super::certstore::{CertStore, Credential};
use super::ratelimit::RateLimitLayer;
use super::{csr, kubeconfig};
use crate::tasks::blocking;

/// The test knob (seconds after a certificate comes into use).
pub const TEST_ROTATE_AFTER_ENV: &str = "FERROLET_TEST_ROTATE_CERT_AFTER";
/// How long a renewal waits for its certificate (client-go's certificateWaitTimeout).
const WAIT_LIMIT: Duration = Duration::from_secs(15 * 60);
const BACKOFF_INITIAL: Duration = Duration::from_secs(2);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// When a certificate valid from `not_before` to `not_after` is renewed, for a jitter `r` in
/// [0, 1): at 70% + r x 20% of its lifetime (client-go's nextRotationDeadline).
pub fn deadline(not_before: SystemTime, not_after: SystemTime, r: f64) -> SystemTime {
    let total = not_after.duration_since(not_before).unwrap_or_default();
    not_before + total.mul_f64(0.7 + 0.2 * r.clamp(0.0, 1.0))
}

/// A uniform number in [0, 1) from the kernel's randomness.
pub fn jitter() -> f64 {
    let n = u64::from_str_radix(&ferrolet_fsutil::random_hex(8), 16).unwrap_or(0);
    (n >> 11) as f64 / (1u64 << 53) as f64
}

/// The shortened wait the test knob asks for, if set.
pub fn test_rotate_after() -> Option<Duration> {
    let v = std::env::var(TEST_ROTATE_AFTER_ENV).ok()?;
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Some(Duration::from_secs_f64(s)),
        _ => {
            warn!("{TEST_ROTATE_AFTER_ENV}={v:?} is not a number of seconds; ignored");
            None
        }
    }
}

/// When to rotate a certificate valid from `not_before` to `not_after`: client-go's jittered
/// 70–90 % of its life, or sooner under the test knob. Both the client and the serving
/// certificate's managers use it.
pub fn rotation_time(not_before: SystemTime, not_after: SystemTime) -> SystemTime {
    match test_rotate_after() {
        Some(after) => SystemTime::now() + after,
        None => deadline(not_before, not_after, jitter()),
    }
}

/// Sleep until the wall-clock time `at`, rechecked at least hourly (a suspended machine's
/// monotonic clock lags); `stop` is asked after each nap and ends the wait early when true.
pub async fn sleep_until_wall(at: SystemTime, stop: impl Fn() -> bool) {
    loop {
        let left = at.duration_since(SystemTime::now()).unwrap_or_default();
        if left.is_zero() || stop() {
            return;
        }
        tokio::time::sleep(left.min(Duration::from_secs(3600))).await;
    }
}

/// One kind of certificate's renewal, which [`CertificateManager`] runs: the client
/// certificate ([`Rotation`]) and the serving certificate (server::certs::bootstrap).
pub trait Renewal: Send + Sync + 'static {
    /// What is renewed, for the log ("client certificate").
    const WHAT: &'static str;

    /// Whether the certificate is still needed; false ends the manager.
    fn wanted(&self) -> bool {
        true
    }

    /// One renewal: a new key, a CertificateSigningRequest, the issued certificate stored and
    /// put in use. `current`: the certificate in use, if any.
    fn renew(&self, current: Option<&Credential>) -> impl std::future::Future<Output = Result<Credential>> + Send;
}

/// client-go's certificate Manager, for either certificate: the current one renewed at its
/// rotation time ([`rotation_time`]); without one, or after a failure, renewal attempts with a
/// doubling back-off (2 s to 5 min), each failure (a panic among them) logged once per change
/// of error.
pub struct CertificateManager<R: Renewal> {
    renewal: R,
    current: Option<Credential>,
}

impl<R: Renewal> CertificateManager<R> {
    pub fn spawn(renewal: R, current: Option<Credential>) {
        tokio::spawn(CertificateManager { renewal, current }.run());
    }

    async fn run(mut self) {
        loop {
            if let Some(c) = &self.current {
                let at = rotation_time(c.not_before, c.not_after);
                info!(
                    expires = %chrono::DateTime::<chrono::Utc>::from(c.not_after).to_rfc3339(),
                    rotation = %chrono::DateTime::<chrono::Utc>::from(at).to_rfc3339(),
                    "waiting to rotate the {}",
                    R::WHAT
                );
                sleep_until_wall(at, || !self.renewal.wanted()).await;
            }
            let mut backoff = BACKOFF_INITIAL;
            let mut last_error: Option<String> = None;
            loop {
                // Nobody holds the certificate any more: nothing to renew it for.
                if !self.renewal.wanted() {
                    return;
                }
                let attempt = std::panic::AssertUnwindSafe(self.renewal.renew(self.current.as_ref()))
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|p| Err(anyhow::anyhow!("panicked: {}", crate::tasks::panic_message(p))));
                match attempt {
                    Ok(cred) => {
                        info!(
                            expires = %chrono::DateTime::<chrono::Utc>::from(cred.not_after).to_rfc3339(),
                            "{} issued",
                            R::WHAT
                        );
                        self.current = Some(cred);
                        break;
                    }
                    Err(e) => {
                        let msg = format!("{e:#}");
                        if last_error.as_deref() != Some(msg.as_str()) {
                            warn!("rotating the {} failed: {msg}; retrying with back-off", R::WHAT);
                            last_error = Some(msg);
                        }
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// The client certificate's renewal (kubelet's rotateCertificates).
pub(super) struct Rotation {
    /// The channel every `Kube` reads its client from; gone when they all are.
    pub tx: Weak<watch::Sender<super::Clients>>,
    /// The node's kubeconfig: server and CA for the clients built on new certificates.
    pub kubeconfig: kube::config::Kubeconfig,
    pub store: CertStore,
    pub node: String,
    pub limit: RateLimitLayer,
    /// The bootstrap kubeconfig, if any: renewals ask with it once the current certificate has
    /// expired (kubelet's clientset function falls back to the bootstrap credential).
    pub bootstrap: Option<std::path::PathBuf>,
}

impl Renewal for Rotation {
    const WHAT: &'static str = "client certificate";

    fn wanted(&self) -> bool {
        self.tx.strong_count() > 0
    }

    /// Request, store, swap the client every `Kube` hands out.
    async fn renew(&self, current: Option<&Credential>) -> Result<Credential> {
        let tx = self.tx.upgrade().context("no client is in use any more")?;
        let client = match &self.bootstrap {
            Some(path) if !current.is_some_and(|c| c.valid_at(SystemTime::now())) => {
                let p = path.clone();
                let kc = blocking(move || kubeconfig::read(&p)).await?;
                let config = kubeconfig::client_config(kc, None).await?;
                super::build_client(config, &self.limit).context("the bootstrap credential")?
            }
            _ => tx.borrow().api.clone(),
        };
        let key = csr::new_key()?;
        let request = csr::node_request(&self.node, &key)?;
        let cert = csr::request_certificate(client, None, &request, WAIT_LIMIT).await?;
        let cred = Credential::new(cert, key.serialize_pem().into_bytes()).context("the issued certificate")?;
        let (store, c) = (self.store.clone(), cred.clone());
        blocking(move || store.update(&c)).await?;
        let config = kubeconfig::client_config(self.kubeconfig.clone(), Some(&cred)).await?;
        tx.send_replace(super::build_clients(config, &self.limit)?);
        Ok(cred)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_is_between_70_and_90_percent_of_the_lifetime() {
        let nb = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let na = nb + Duration::from_secs(1000);
        assert_eq!(deadline(nb, na, 0.0), nb + Duration::from_secs(700));
        assert_eq!(deadline(nb, na, 0.5), nb + Duration::from_secs(800));
        assert!(deadline(nb, na, 0.999_999) < nb + Duration::from_secs(900));
        for _ in 0..1000 {
            let at = deadline(nb, na, jitter());
            assert!(at >= nb + Duration::from_secs(700) && at < nb + Duration::from_secs(900));
        }
        // a certificate whose end precedes its start is renewed at once
        assert_eq!(deadline(na, nb, 0.3), na);
    }

    #[test]
    fn jitter_spreads_over_the_unit_interval() {
        let draws: Vec<f64> = (0..2000).map(|_| jitter()).collect();
        assert!(draws.iter().all(|r| (0.0..1.0).contains(r)));
        assert!(draws.iter().any(|r| *r < 0.1) && draws.iter().any(|r| *r > 0.9));
    }
}
