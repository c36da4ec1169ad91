//! How pulls are let through (kubelet's serialImagePuller / parallelImagePuller and its
//! throttledImageService): one at a time in arrival order (serializeImagePulls, the default),
//! or up to maxParallelImagePulls at once (unset: no limit); and a token bucket of
//! registryPullQPS / registryBurst checked when a pull starts: a pull over the rate fails at
//! once with kubelet's "pull QPS exceeded" (and goes to back-off), it does not wait.
//! Only the pod worker asking waits for its pull; other pods' workers wait only for a slot.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrolet_runtime::registry::{Credentials, ProgressFn, PullError, PullOutcome};
use futures::future::BoxFuture;
use tokio::sync::Semaphore;

use crate::events::token_bucket::TokenBucket;

/// The registry client's pull (ferrolet_runtime::registry::Puller::pull).
pub type PullFn = Arc<
    dyn Fn(String, Vec<Credentials>, Option<ProgressFn>) -> BoxFuture<'static, Result<PullOutcome, PullError>>
        + Send
        + Sync,
>;

/// The limits on pulls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PullLimits {
    pub serialize: bool,
    /// With `serialize` off: pulls at once (`None`: no limit).
    pub max_parallel: Option<u32>,
    /// Pulls a second (0: no limit) and the burst.
    pub qps: f64,
    pub burst: u32,
}

/// A pull done: the outcome and how long the pull itself took (without the wait for a slot).
pub struct Pulled {
    pub outcome: PullOutcome,
    pub pull_duration: Duration,
}

pub struct PullQueue {
    pull: PullFn,
    slots: Option<Arc<Semaphore>>,
    bucket: Option<Mutex<TokenBucket>>,
    epoch: Instant,
}

impl PullQueue {
    pub fn new(pull: PullFn, limits: PullLimits) -> PullQueue {
        let slots = if limits.serialize {
            Some(1)
        } else {
            limits.max_parallel.map(|n| n.max(1) as usize)
        };
        PullQueue {
            pull,
            slots: slots.map(|n| Arc::new(Semaphore::new(n))),
            bucket: (limits.qps > 0.0).then(|| Mutex::new(TokenBucket::new(limits.qps, limits.burst.max(1), 0.0))),
            epoch: Instant::now(),
        }
    }

    /// Pull `image` once a slot is free.
    pub async fn pull(
        &self,
        image: &str,
        creds: Vec<Credentials>,
        progress: Option<ProgressFn>,
    ) -> Result<Pulled, PullError> {
        let _slot = match &self.slots {
            Some(s) => Some(
                s.clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| PullError::Other("the image puller is shut down".into()))?,
            ),
            None => None,
        };
        if let Some(b) = &self.bucket {
            let now = self.epoch.elapsed().as_secs_f64();
            if !b.lock().unwrap_or_else(|e| e.into_inner()).try_take(now) {
                return Err(PullError::Other("pull QPS exceeded".into()));
            }
        }
        let start = Instant::now();
        let outcome = (self.pull)(image.to_string(), creds, progress).await?;
        Ok(Pulled {
            outcome,
            pull_duration: start.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A pull that takes 100 ms and records how many ran at once; it fails with "no store"
    /// (no image store here), which is all these tests look at besides timing.
    fn slow_pull(now: Arc<AtomicUsize>, peak: Arc<AtomicUsize>) -> PullFn {
        Arc::new(move |_r, _c, _p| {
            let (now, peak) = (now.clone(), peak.clone());
            Box::pin(async move {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                Err(PullError::Other("no store".into()))
            })
        })
    }

    async fn peak_with(limits: PullLimits, n: usize) -> usize {
        let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let q = Arc::new(PullQueue::new(slow_pull(now, peak.clone()), limits));
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let q = q.clone();
                tokio::spawn(async move {
                    q.pull(&format!("img{i}"), Vec::new(), None)
                        .await
                        .err()
                        .unwrap()
                        .to_string()
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), "no store");
        }
        peak.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn serialized_parallel_and_unlimited() {
        let base = PullLimits {
            serialize: true,
            max_parallel: None,
            qps: 0.0,
            burst: 0,
        };
        assert_eq!(peak_with(base, 4).await, 1);
        let par = PullLimits {
            serialize: false,
            max_parallel: Some(2),
            ..base
        };
        assert_eq!(peak_with(par, 5).await, 2);
        let free = PullLimits {
            serialize: false,
            ..base
        };
        assert_eq!(peak_with(free, 4).await, 4);
    }

    /// A pod deleted while its image is pulled drops the pull (the worker's select): the drop
    /// must reach the registry client's future, which then cancels the download when no
    /// other pull waits for it. Nothing in between may detach the pull onto a task.
    #[tokio::test]
    async fn dropping_a_pull_drops_the_registry_clients_future() {
        struct Flag(Arc<AtomicUsize>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let (started, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (s2, d2) = (started.clone(), dropped.clone());
        let pull: PullFn = Arc::new(move |_r, _c, _p| {
            let (s, d) = (s2.clone(), d2.clone());
            Box::pin(async move {
                let _f = Flag(d);
                s.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
                Err(PullError::Other("never".into()))
            })
        });
        let q = PullQueue::new(
            pull,
            PullLimits {
                serialize: true,
                max_parallel: None,
                qps: 0.0,
                burst: 0,
            },
        );
        let r = tokio::time::timeout(Duration::from_millis(100), q.pull("x", Vec::new(), None)).await;
        assert!(r.is_err(), "still pulling when dropped");
        assert_eq!(started.load(Ordering::SeqCst), 1);
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "the client's future went with it");
        // And the slot is free again for the next pull.
        let r = tokio::time::timeout(Duration::from_millis(100), q.pull("y", Vec::new(), None)).await;
        assert!(r.is_err());
        assert_eq!(started.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn qps_exceeded_fails_at_once() {
        let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let q = PullQueue::new(
            slow_pull(now, peak),
            PullLimits {
                serialize: false,
                max_parallel: None,
                qps: 0.5,
                burst: 2,
            },
        );
        let mut errs = Vec::new();
        for _ in 0..3 {
            errs.push(q.pull("x", Vec::new(), None).await.err().unwrap().to_string());
        }
        assert_eq!(errs, ["no store", "no store", "pull QPS exceeded"]);
    }
}
