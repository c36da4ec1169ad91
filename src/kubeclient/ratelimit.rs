//! The client-side rate limit towards the API server (kubelet's kubeAPIQPS / kubeAPIBurst,
//! client-go's token-bucket rate limiter): a bucket of `burst` tokens refilled at `qps` a
//! second; every request takes one, waiting for it when the bucket is empty. A tower layer, so
//! it sits in every `kube::Client` the node builds; clients built from one layer share its
//! bucket, so a rotated credential does not reset the budget.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// The token bucket (golang.org/x/time/rate's Limiter as client-go uses it): a request reserves
/// a token at once, the bucket going negative when it is empty, and waits until the refill
/// would have covered it. Waiters are so served in the order they asked.
#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// Reserve one token at `now`; returns when the request may go.
    fn reserve(&mut self, now: Instant) -> Instant {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.last = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            now
        } else {
            now + Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

/// The layer: `qps` requests a second on average, bursts of up to `burst`.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<Bucket>>,
}

impl RateLimitLayer {
    /// `qps` must be positive and `burst` at least 1 (the config's validation sees to it); a
    /// bucket starts full.
    pub fn new(qps: f64, burst: u32) -> RateLimitLayer {
        let burst = f64::from(burst.max(1));
        RateLimitLayer {
            bucket: Arc::new(Mutex::new(Bucket {
                qps: if qps > 0.0 { qps } else { f64::MIN_POSITIVE },
                burst,
                tokens: burst,
                last: Instant::now(),
            })),
        }
    }

    fn reserve(&self) -> Instant {
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        b.reserve(Instant::now())
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            limit: self.clone(),
            wait: None,
            admitted: false,
            waited: Duration::ZERO,
        }
    }
}

/// A service that takes a token before each request it lets through.
pub struct RateLimit<S> {
    inner: S,
    limit: RateLimitLayer,
    /// The wait for the reserved token, while there is one.
    wait: Option<Pin<Box<Sleep>>>,
    /// A token is held for the next call.
    admitted: bool,
    /// How long the held token was waited for (rest_client_rate_limiter_duration_seconds).
    waited: Duration,
}

impl<S, B> Service<axum::http::Request<B>> for RateLimit<S>
where
    S: Service<axum::http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if !self.admitted {
            if self.wait.is_none() {
                let (now, at) = (Instant::now(), self.limit.reserve());
                self.waited = at.saturating_duration_since(now);
                if at > now {
                    self.wait = Some(Box::pin(tokio::time::sleep_until(at)));
                } else {
                    self.admitted = true;
                }
            }
            if let Some(wait) = self.wait.as_mut() {
                if wait.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.wait = None;
                self.admitted = true;
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<B>) -> S::Future {
        self.admitted = false;
        let host = req.uri().authority().map(|a| a.as_str()).unwrap_or_default();
        crate::metrics::global().rest_client_rate_limited(req.method().as_str(), host, self.waited);
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    /// The times (since the start) at which `n` requests sent back to back got through.
    async fn times(layer: &RateLimitLayer, n: usize) -> Vec<Duration> {
        let start = Instant::now();
        let mut svc = layer.layer(tower::service_fn(|_: axum::http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(Instant::now())
        }));
        let mut out = Vec::new();
        for _ in 0..n {
            let at = svc
                .ready()
                .await
                .unwrap()
                .call(axum::http::Request::new(()))
                .await
                .unwrap();
            out.push(at - start);
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn burst_goes_at_once_then_qps() {
        let layer = RateLimitLayer::new(10.0, 3);
        let t = times(&layer, 6).await;
        let ms: Vec<u128> = t.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, vec![0, 0, 0, 100, 200, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_refills_while_idle_up_to_burst() {
        let layer = RateLimitLayer::new(5.0, 2);
        times(&layer, 2).await;
        // idle for far longer than the refill: only `burst` tokens wait, not more
        tokio::time::sleep(Duration::from_secs(10)).await;
        let ms: Vec<u128> = times(&layer, 4).await.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, vec![0, 0, 200, 400]);
    }

    #[tokio::test(start_paused = true)]
    async fn clients_of_one_layer_share_the_bucket() {
        let layer = RateLimitLayer::new(1.0, 1);
        let first = times(&layer, 1).await;
        let second = times(&layer, 1).await;
        assert_eq!(first[0], Duration::ZERO);
        assert_eq!(second[0].as_millis(), 1000);
    }
}
