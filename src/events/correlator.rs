//! client-go's EventCorrelator, as every kubelet event goes through it before it is written:
//!
//! - **aggregation**: more than 10 events that differ only in their message (same source,
//!   object, type and reason) within 10 minutes become one event whose message says
//!   `(combined from similar events): <latest message>`;
//! - **deduplication**: an event identical to one already written (same source, object and
//!   field path, type, reason, message) is not written again: the existing one gets its
//!   `count` raised and its `lastTimestamp` moved, by a patch;
//! - **spam filter**: each object has a token bucket (25 events, refilled by one every 5
//!   minutes) per source; an event over it is dropped.
//!
//! Pure: the caller gives the time, so tests drive the clock.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::lru::Lru;
use super::object;
use super::token_bucket::TokenBucket;

/// client-go's cache size for each of the three.
const CACHE_ENTRIES: usize = 4096;
/// Distinct messages of one reason within [`AGGREGATE_INTERVAL`] before they are combined.
pub const AGGREGATE_MAX_EVENTS: usize = 10;
pub const AGGREGATE_INTERVAL: Duration = Duration::seconds(600);
pub const AGGREGATE_PREFIX: &str = "(combined from similar events): ";
/// Events a source may burst about one object, and the refill rate (one per 5 minutes).
pub const SPAM_BURST: u32 = 25;
pub const SPAM_QPS: f64 = 1.0 / 300.0;

/// What to write: a new event (`patch` none) or a patch to an existing one.
#[derive(Debug, Clone, PartialEq)]
pub struct Correlated {
    pub event: Event,
    /// For a repeat: the strategic merge patch (`count`, `lastTimestamp`, `message`) to the
    /// event named in `event`.
    pub patch: Option<serde_json::Value>,
}

struct Aggregate {
    messages: BTreeSet<String>,
    last: DateTime<Utc>,
}

/// What was written last for an event key.
struct Observation {
    count: i32,
    first: Option<Time>,
    name: Option<String>,
    resource_version: Option<String>,
}

pub struct Correlator {
    aggregates: Lru<Aggregate>,
    observed: Lru<Observation>,
    spam: Lru<TokenBucket>,
}

impl Default for Correlator {
    fn default() -> Self {
        Correlator::new()
    }
}

fn s(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("")
}

fn source(e: &Event) -> [&str; 2] {
    let src = e.source.as_ref();
    [
        src.and_then(|x| x.component.as_deref()).unwrap_or(""),
        src.and_then(|x| x.host.as_deref()).unwrap_or(""),
    ]
}

/// Source and object (client-go's getSpamKey).
fn spam_key(e: &Event) -> String {
    let o = &e.involved_object;
    let [component, host] = source(e);
    [
        component,
        host,
        s(&o.kind),
        s(&o.namespace),
        s(&o.name),
        s(&o.uid),
        s(&o.api_version),
    ]
    .join("\0")
}

/// Everything that makes two events the same one (client-go's getEventKey).
fn event_key(e: &Event) -> String {
    let o = &e.involved_object;
    let [component, host] = source(e);
    [
        component,
        host,
        s(&o.kind),
        s(&o.namespace),
        s(&o.name),
        s(&o.field_path),
        s(&o.uid),
        s(&o.api_version),
        s(&e.type_),
        s(&e.reason),
        s(&e.message),
    ]
    .join("\0")
}

/// Everything but the message (client-go's EventAggregatorByReasonFunc).
fn aggregate_key(e: &Event) -> String {
    let o = &e.involved_object;
    let [component, host] = source(e);
    [
        component,
        host,
        s(&o.kind),
        s(&o.namespace),
        s(&o.name),
        s(&o.uid),
        s(&o.api_version),
        s(&e.type_),
        s(&e.reason),
        s(&e.reporting_component),
        s(&e.reporting_instance),
    ]
    .join("\0")
}

fn seconds(t: DateTime<Utc>) -> f64 {
    t.timestamp() as f64 + f64::from(t.timestamp_subsec_nanos()) / 1e9
}

impl Correlator {
    pub fn new() -> Correlator {
        Correlator {
            aggregates: Lru::new(CACHE_ENTRIES),
            observed: Lru::new(CACHE_ENTRIES),
            spam: Lru::new(CACHE_ENTRIES),
        }
    }

    /// What to write for `event` at `now`; none when the spam filter drops it.
    pub fn correlate(&mut self, event: Event, now: DateTime<Utc>) -> Option<Correlated> {
        let (event, key) = self.aggregate(event, now);
        let observed = self.observe(event, key);
        if self.spam_filtered(&observed.event, now) {
            return None;
        }
        Some(observed)
    }

    /// Record what the API server holds after a write (its name, resource version and count).
    pub fn update_state(&mut self, saved: &Event) {
        self.observed.insert(
            event_key(saved),
            Observation {
                count: saved.count.unwrap_or(1),
                first: saved.first_timestamp.clone(),
                name: saved.metadata.name.clone(),
                resource_version: saved.metadata.resource_version.clone(),
            },
        );
    }

    /// The event to go on with and its observation key: the event itself under its full key,
    /// or, past the threshold, a combined event under the aggregate key.
    fn aggregate(&mut self, event: Event, now: DateTime<Utc>) -> (Event, String) {
        let full = event_key(&event);
        let agg = aggregate_key(&event);
        let message = event.message.clone().unwrap_or_default();
        let fresh = || Aggregate {
            messages: BTreeSet::new(),
            last: now,
        };
        let mut record = match self.aggregates.get_mut(&agg) {
            Some(r) if now - r.last <= AGGREGATE_INTERVAL => std::mem::replace(r, fresh()),
            _ => fresh(),
        };
        record.messages.insert(message.clone());
        record.last = now;
        let combine = record.messages.len() >= AGGREGATE_MAX_EVENTS;
        if combine {
            // The set never grows past the threshold.
            record.messages.pop_first();
        }
        self.aggregates.insert(agg.clone(), record);
        if !combine {
            return (event, full);
        }
        let combined = Event {
            metadata: ObjectMeta {
                name: Some(object::event_name(s(&event.involved_object.name), now)),
                namespace: event.metadata.namespace.clone(),
                ..Default::default()
            },
            count: Some(1),
            first_timestamp: Some(object::time(now)),
            last_timestamp: Some(object::time(now)),
            message: Some(format!("{AGGREGATE_PREFIX}{message}")),
            involved_object: event.involved_object,
            type_: event.type_,
            reason: event.reason,
            source: event.source,
            reporting_component: event.reporting_component,
            reporting_instance: event.reporting_instance,
            ..Default::default()
        };
        (combined, agg)
    }

    /// A repeat of an event already written becomes a patch of it with the count raised.
    fn observe(&mut self, mut event: Event, key: String) -> Correlated {
        let mut patch = None;
        if let Some(last) = self.observed.get_mut(&key).filter(|o| o.count > 0) {
            event.metadata.name = last.name.clone();
            event.metadata.resource_version = last.resource_version.clone();
            event.first_timestamp = last.first.clone();
            event.count = Some(last.count + 1);
            patch = Some(serde_json::json!({
                "count": event.count,
                "lastTimestamp": event.last_timestamp,
                "message": event.message,
            }));
        }
        self.observed.insert(
            key,
            Observation {
                count: event.count.unwrap_or(1),
                first: event.first_timestamp.clone(),
                name: event.metadata.name.clone(),
                resource_version: event.metadata.resource_version.clone(),
            },
        );
        Correlated { event, patch }
    }

    fn spam_filtered(&mut self, event: &Event, now: DateTime<Utc>) -> bool {
        let key = spam_key(event);
        let t = seconds(now);
        let mut bucket = match self.spam.get_mut(&key) {
            Some(b) => b.clone(),
            None => TokenBucket::new(SPAM_QPS, SPAM_BURST, t),
        };
        let allowed = bucket.try_take(t);
        self.spam.insert(key, bucket);
        !allowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Kind;
    use chrono::TimeZone;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(name: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "c"}]}
        }))
        .unwrap()
    }

    fn ev(p: &Pod, reason: &str, message: &str, now: DateTime<Utc>) -> Event {
        object::make(
            object::pod_reference(p, Some("c")),
            "n1",
            Kind::Warning,
            reason,
            message,
            now,
        )
    }

    fn t0() -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000, 0).unwrap()
    }

    /// What the API server would hand back for a write.
    fn saved(c: &Correlated, rv: u32) -> Event {
        let mut e = c.event.clone();
        e.metadata.resource_version = Some(rv.to_string());
        e
    }

    #[test]
    fn an_identical_event_patches_the_count_and_last_timestamp() {
        let mut c = Correlator::new();
        let p = pod("web");
        let first = c
            .correlate(ev(&p, "BackOff", "Back-off restarting", t0()), t0())
            .unwrap();
        assert_eq!(first.patch, None);
        c.update_state(&saved(&first, 7));
        let later = t0() + Duration::seconds(30);
        let second = c
            .correlate(ev(&p, "BackOff", "Back-off restarting", later), later)
            .unwrap();
        assert_eq!(
            second.event.metadata.name, first.event.metadata.name,
            "the same object is patched"
        );
        assert_eq!(second.event.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(second.event.count, Some(2));
        assert_eq!(second.event.first_timestamp, first.event.first_timestamp);
        let patch = second.patch.unwrap();
        assert_eq!(patch["count"], 2);
        assert_eq!(patch["message"], "Back-off restarting");
        assert_eq!(
            patch["lastTimestamp"],
            serde_json::to_value(object::time(later)).unwrap()
        );
        let third = c
            .correlate(ev(&p, "BackOff", "Back-off restarting", later), later)
            .unwrap();
        assert_eq!(third.event.count, Some(3));
    }

    #[test]
    fn a_different_container_or_message_is_a_new_event() {
        let mut c = Correlator::new();
        let p = pod("web");
        c.correlate(ev(&p, "Started", "m", t0()), t0()).unwrap();
        let other_msg = c.correlate(ev(&p, "Started", "m2", t0()), t0()).unwrap();
        assert_eq!(other_msg.patch, None);
        let mut e = ev(&p, "Started", "m", t0());
        e.involved_object.field_path = Some("spec.containers{d}".into());
        assert_eq!(c.correlate(e, t0()).unwrap().patch, None);
    }

    #[test]
    fn similar_events_are_combined_past_ten_distinct_messages_in_ten_minutes() {
        let mut c = Correlator::new();
        let p = pod("web");
        let mut now = t0();
        for i in 0..AGGREGATE_MAX_EVENTS - 1 {
            let r = c
                .correlate(ev(&p, "Unhealthy", &format!("probe failed {i}"), now), now)
                .unwrap();
            assert_eq!(r.event.message.as_deref(), Some(format!("probe failed {i}").as_str()));
            assert_eq!(r.patch, None);
            now += Duration::seconds(1);
        }
        // The tenth distinct message in the interval is combined.
        let combined = c.correlate(ev(&p, "Unhealthy", "probe failed 9", now), now).unwrap();
        assert_eq!(
            combined.event.message.as_deref(),
            Some("(combined from similar events): probe failed 9")
        );
        assert_eq!(combined.event.count, Some(1));
        assert_eq!(combined.patch, None);
        c.update_state(&saved(&combined, 3));
        // Further ones patch the combined event, with the latest message.
        now += Duration::seconds(1);
        let again = c.correlate(ev(&p, "Unhealthy", "probe failed 10", now), now).unwrap();
        assert_eq!(again.event.metadata.name, combined.event.metadata.name);
        assert_eq!(again.event.count, Some(2));
        assert_eq!(
            again.patch.unwrap()["message"],
            "(combined from similar events): probe failed 10"
        );
        // Another reason is not part of it.
        let other = c.correlate(ev(&p, "Killing", "probe failed 11", now), now).unwrap();
        assert_eq!(other.event.message.as_deref(), Some("probe failed 11"));
    }

    #[test]
    fn the_aggregation_window_restarts_after_ten_quiet_minutes() {
        let mut c = Correlator::new();
        let p = pod("web");
        for i in 0..AGGREGATE_MAX_EVENTS - 1 {
            c.correlate(ev(&p, "Unhealthy", &format!("m{i}"), t0()), t0()).unwrap();
        }
        let later = t0() + AGGREGATE_INTERVAL + Duration::seconds(1);
        let r = c.correlate(ev(&p, "Unhealthy", "m-late", later), later).unwrap();
        assert_eq!(r.event.message.as_deref(), Some("m-late"));
    }

    #[test]
    fn the_spam_filter_allows_a_burst_of_25_per_object_then_one_per_five_minutes() {
        let mut c = Correlator::new();
        let p = pod("web");
        let q = pod("other");
        let passed = (0..40)
            .filter(|i| c.correlate(ev(&p, &format!("R{i}"), "m", t0()), t0()).is_some())
            .count();
        assert_eq!(passed, SPAM_BURST as usize);
        // Another object has a bucket of its own.
        assert!(c.correlate(ev(&q, "R", "m", t0()), t0()).is_some());
        let almost = t0() + Duration::seconds(299);
        assert!(c.correlate(ev(&p, "R", "m", almost), almost).is_none());
        let refilled = t0() + Duration::seconds(300);
        assert!(c.correlate(ev(&p, "R", "m", refilled), refilled).is_some());
        assert!(c.correlate(ev(&p, "R", "m", refilled), refilled).is_none());
    }
}
