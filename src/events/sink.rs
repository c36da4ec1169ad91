//! Writing events to the API server (client-go's broadcaster and recordToSink as kubelet starts
//! them): callers put events on a bounded queue and never wait; one writer takes them in order,
//! correlates them, and creates or patches them at most `eventRecordQPS` a second (bursts of
//! `eventBurst`). An API server that cannot be reached is tried 12 times, 10 s apart (the first
//! wait jittered), then the event is given up; one that refuses the event (invalid, forbidden,
//! already there) is not asked again. A full queue drops new events, counted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::correlator::{Correlated, Correlator};
use super::token_bucket::TokenBucket;
use crate::kubeclient::Kube;

/// Events waiting to be written (client-go's maxQueuedEvents).
pub const QUEUE: usize = 1000;
/// Tries per event (client-go's maxTriesPerEvent) and the wait between them.
pub const MAX_TRIES: u32 = 12;
pub const RETRY_SLEEP: Duration = Duration::from_secs(10);

/// The callers' end of the queue; cheap to clone.
#[derive(Clone)]
pub struct Sink {
    tx: mpsc::Sender<Event>,
    dropped: Arc<AtomicU64>,
    dropping: Arc<AtomicBool>,
}

impl Sink {
    /// Start the writer (on the current tokio runtime). `qps` 0: no rate limit.
    pub fn start(kube: Kube, qps: u32, burst: u32) -> Sink {
        let (tx, rx) = mpsc::channel(QUEUE);
        let origin = Instant::now();
        let writer = Writer {
            rx,
            kube,
            correlator: Correlator::new(),
            limiter: (qps > 0).then(|| TokenBucket::new(f64::from(qps), burst.max(1), 0.0)),
            origin,
        };
        let writer = Arc::new(tokio::sync::Mutex::new(writer));
        crate::tasks::spawn_loop("event writer", Duration::from_secs(1), move || {
            let w = writer.clone();
            async move { w.lock().await.round().await }
        });
        Sink {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
            dropping: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Queue an event; dropped (and counted) when the queue is full.
    pub fn send(&self, event: Event) {
        match self.tx.try_send(event) {
            Ok(()) => {
                if self.dropping.swap(false, Ordering::Relaxed) {
                    info!(
                        dropped_total = self.dropped.load(Ordering::Relaxed),
                        "event queue has room again"
                    );
                }
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if !self.dropping.swap(true, Ordering::Relaxed) {
                    warn!(
                        queue = QUEUE,
                        dropped_total = n,
                        "event queue full (API server slow or unreachable); dropping events until it drains"
                    );
                }
            }
            // The writer is gone only when the runtime shuts down.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Events dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Why a write failed.
enum Failure {
    /// Worth another try: no answer, or the server is overloaded or failing.
    Unreachable(kube::Error),
    /// The server said no to this event; asking again would get the same answer.
    Refused(kube::Error),
}

fn classify(e: kube::Error) -> Failure {
    match &e {
        kube::Error::Api(s) if s.code == 429 || s.code >= 500 => Failure::Unreachable(e),
        kube::Error::Api(_)
        | kube::Error::BuildRequest(_)
        | kube::Error::SerdeError(_)
        | kube::Error::HttpError(_)
        | kube::Error::FromUtf8(_) => Failure::Refused(e),
        _ => Failure::Unreachable(e),
    }
}

/// A fraction in [0, 1) for the first retry's jitter.
fn jitter() -> f64 {
    let r = u32::from_str_radix(&ferrolet_fsutil::random_hex(4), 16).unwrap_or(0);
    f64::from(r) / (f64::from(u32::MAX) + 1.0)
}

fn describe(e: &Event) -> String {
    let o = &e.involved_object;
    format!(
        "{} {} {}/{}",
        e.reason.as_deref().unwrap_or(""),
        o.kind.as_deref().unwrap_or(""),
        o.namespace.as_deref().unwrap_or(""),
        o.name.as_deref().unwrap_or("")
    )
}

struct Writer {
    rx: mpsc::Receiver<Event>,
    kube: Kube,
    correlator: Correlator,
    limiter: Option<TokenBucket>,
    origin: Instant,
}

impl Writer {
    /// Write the next event; false once every sender is gone.
    async fn round(&mut self) -> bool {
        let Some(event) = self.rx.recv().await else {
            return false;
        };
        self.write(event).await;
        true
    }

    async fn write(&mut self, event: Event) {
        let what = describe(&event);
        let Some(c) = self.correlator.correlate(event, Utc::now()) else {
            debug!(event = %what, "event dropped by the spam filter (too many about one object)");
            return;
        };
        for attempt in 1..=MAX_TRIES {
            match self.record(&c).await {
                Ok(saved) => {
                    self.correlator.update_state(&saved);
                    if attempt > 1 {
                        info!(event = %what, attempt, "event written after retries");
                    }
                    return;
                }
                Err(Failure::Refused(e)) => {
                    match &e {
                        kube::Error::Api(s) if s.is_already_exists() => {
                            debug!(event = %what, "event already exists: {e}")
                        }
                        _ => warn!(event = %what, "API server refused the event (not retried): {e}"),
                    }
                    return;
                }
                Err(Failure::Unreachable(e)) => {
                    if attempt == MAX_TRIES {
                        warn!(event = %what, tries = MAX_TRIES, "giving up on the event: {e}");
                        return;
                    }
                    if attempt == 1 {
                        warn!(event = %what, "could not write the event, retrying: {e}");
                    }
                    let sleep = if attempt == 1 {
                        RETRY_SLEEP.mul_f64(jitter())
                    } else {
                        RETRY_SLEEP
                    };
                    tokio::time::sleep(sleep).await;
                }
            }
        }
    }

    /// Wait for the request rate limit.
    async fn throttle(&mut self) {
        let Some(l) = self.limiter.as_mut() else { return };
        loop {
            let now = self.origin.elapsed().as_secs_f64();
            if l.try_take(now) {
                return;
            }
            tokio::time::sleep(l.wait(now)).await;
        }
    }

    /// Patch the existing event (a repeat) or create it (new, or its old self is gone).
    async fn record(&mut self, c: &Correlated) -> Result<Event, Failure> {
        let ns = c.event.metadata.namespace.as_deref().unwrap_or("default");
        let api: Api<Event> = Api::namespaced(self.kube.client(), ns);
        if let Some(patch) = &c.patch {
            let name = c.event.metadata.name.as_deref().unwrap_or("");
            self.throttle().await;
            match api.patch(name, &PatchParams::default(), &Patch::Strategic(patch)).await {
                Ok(saved) => return Ok(saved),
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return Err(classify(e)),
            }
        }
        let mut event = c.event.clone();
        event.metadata.resource_version = None;
        self.throttle().await;
        api.create(&PostParams::default(), &event).await.map_err(classify)
    }
}
