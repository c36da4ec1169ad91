//! Writing events to the API server (client-go's broadcaster and recordToSink as kubelet starts
//! them): callers put events on a bounded queue and never wait; one writer takes them in order,
//! correlates them, and creates or patches them at most `eventRecordQPS` a second (bursts of
//! `eventBurst`). One that the API server refuses (invalid, forbidden, already there) is not
//! asked again.
//!
//! Unlike client-go, which gives an event up after 12 tries, an API server that cannot be
//! reached is tried again (10 s apart, the first wait jittered) until it answers: an edge node
//! away from its server for hours posts what happened meanwhile, in order, once it is back.
//! The queue holds [`QUEUE`] events; when it is full the oldest waiting one is dropped for the
//! new one, counted ([`Sink::dropped`] and the `ferrolet_events_dropped_total` metric) and logged
//! once per overflow. The event the writer holds (being tried) is not in the queue: it is
//! posted first when the server returns, then the queue's events, oldest first.
//!
//! Tests make the queue smaller with `FERROLET_TEST_EVENT_QUEUE=<events>`, so that an outage
//! overflows it with a handful of pods.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use super::correlator::{Correlated, Correlator};
use super::token_bucket::TokenBucket;
use crate::kubeclient::Kube;

/// Events waiting to be written (client-go's maxQueuedEvents).
pub const QUEUE: usize = 1000;
/// The wait between tries of an event the API server did not answer.
pub const RETRY_SLEEP: Duration = Duration::from_secs(10);
/// The test knob: the queue's capacity instead of [`QUEUE`].
pub const TEST_QUEUE_ENV: &str = "FERROLET_TEST_EVENT_QUEUE";

/// The queue's capacity: [`QUEUE`], unless the test knob sets a number.
fn capacity() -> usize {
    let Ok(v) = std::env::var(TEST_QUEUE_ENV) else {
        return QUEUE;
    };
    match v.trim().parse::<usize>() {
        Ok(n) if n > 0 => {
            warn!(
                queue = n,
                "{TEST_QUEUE_ENV} set: the event queue holds {n} events (a test knob)"
            );
            n
        }
        _ => {
            warn!(value = %v, "{TEST_QUEUE_ENV} is not a positive number; ignored");
            QUEUE
        }
    }
}

/// The events waiting, oldest first.
struct Queue {
    events: Mutex<VecDeque<Event>>,
    capacity: usize,
    /// Told when an event is queued.
    queued: Notify,
    dropped: AtomicU64,
    /// The queue overflowed and has not drained since (its warning is said once).
    dropping: std::sync::atomic::AtomicBool,
}

impl Queue {
    fn new(capacity: usize) -> Queue {
        Queue {
            events: Mutex::new(VecDeque::new()),
            capacity: capacity.max(1),
            queued: Notify::new(),
            dropped: AtomicU64::new(0),
            dropping: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Event>> {
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `event`; when full, the oldest waiting event makes room (returned).
    fn push(&self, event: Event) -> Option<Event> {
        let oldest = {
            let mut q = self.lock();
            q.push_back(event);
            (q.len() > self.capacity).then(|| q.pop_front()).flatten()
        };
        self.queued.notify_one();
        if oldest.is_some() {
            crate::metrics::global().event_dropped();
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if !self.dropping.swap(true, Ordering::Relaxed) {
                warn!(
                    queue = self.capacity,
                    dropped_total = n,
                    "event queue full (API server slow or unreachable); dropping the oldest events until it drains"
                );
            }
        }
        oldest
    }

    /// The oldest waiting event, waiting for one.
    async fn pop(&self) -> Event {
        loop {
            let next = self.lock().pop_front();
            if let Some(e) = next {
                return e;
            }
            if self.dropping.swap(false, Ordering::Relaxed) {
                info!(
                    dropped_total = self.dropped.load(Ordering::Relaxed),
                    "event queue drained"
                );
            }
            self.queued.notified().await;
        }
    }
}

/// The callers' end of the queue; cheap to clone.
#[derive(Clone)]
pub struct Sink {
    queue: Arc<Queue>,
}

impl Sink {
    /// Start the writer (on the current tokio runtime). `qps` 0: no rate limit.
    pub fn start(kube: Kube, qps: u32, burst: u32) -> Sink {
        let queue = Arc::new(Queue::new(capacity()));
        let origin = Instant::now();
        let writer = Writer {
            queue: queue.clone(),
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
        Sink { queue }
    }

    /// Queue an event; when the queue is full the oldest waiting one is dropped (counted).
    pub fn send(&self, event: Event) {
        if let Some(old) = self.queue.push(event) {
            debug!(event = %describe(&old), "event dropped: the queue is full");
        }
    }

    /// Events dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.queue.dropped.load(Ordering::Relaxed)
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
    queue: Arc<Queue>,
    kube: Kube,
    correlator: Correlator,
    limiter: Option<TokenBucket>,
    origin: Instant,
}

impl Writer {
    /// Write the next event.
    async fn round(&mut self) -> bool {
        let event = self.queue.pop().await;
        self.write(event).await;
        true
    }

    async fn write(&mut self, event: Event) {
        let what = describe(&event);
        let Some(c) = self.correlator.correlate(event, Utc::now()) else {
            debug!(event = %what, "event dropped by the spam filter (too many about one object)");
            return;
        };
        let mut attempt = 1u64;
        loop {
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
                    if attempt == 1 {
                        warn!(event = %what, "could not write the event; retrying until the API server answers: {e}");
                    }
                    let sleep = if attempt == 1 {
                        RETRY_SLEEP.mul_f64(jitter())
                    } else {
                        RETRY_SLEEP
                    };
                    attempt += 1;
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
        let api: Api<Event> = Api::namespaced(self.kube.events_client(), ns);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: usize) -> Event {
        Event {
            reason: Some(format!("R{n}")),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_the_oldest_and_keeps_the_order() {
        let q = Queue::new(3);
        for n in 0..5 {
            let dropped = q.push(event(n));
            assert_eq!(
                dropped.map(|e| e.reason.unwrap()),
                (n >= 3).then(|| format!("R{}", n - 3))
            );
        }
        assert_eq!(q.dropped.load(Ordering::Relaxed), 2);
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(q.pop().await.reason.unwrap());
        }
        assert_eq!(got, ["R2", "R3", "R4"]);
        // An empty queue waits for the next event.
        let waiting = tokio::time::timeout(Duration::from_millis(50), q.pop()).await;
        assert!(waiting.is_err());
        q.push(event(9));
        assert_eq!(q.pop().await.reason.unwrap(), "R9");
    }
}
