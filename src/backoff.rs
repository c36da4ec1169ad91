//! kubelet's back-off (client-go's flowcontrol.Backoff as kubelet uses it), for crash-looping
//! containers and failing image pulls: the first retry is immediate, each later one waits
//! twice as long as the previous (10s, 20s, 40s... capped at 300s), and an entry untouched for
//! twice the cap starts over.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

#[derive(Debug, Clone)]
struct Entry {
    backoff: Duration,
    last_update: DateTime<Utc>,
}

#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    fn expired(&self, event: DateTime<Utc>, last: DateTime<Utc>) -> bool {
        (event - last).to_std().map(|d| d > self.max * 2).unwrap_or(false)
    }

    /// When a container that finished at `finished` may restart, if it must wait: `Some(until,
    /// current back-off)`. `None`: restart now.
    pub fn wait_until(
        &self,
        key: &str,
        finished: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Option<(DateTime<Utc>, Duration)> {
        let e = self.entries.get(key)?;
        if self.expired(finished, e.last_update) {
            return None;
        }
        let until = finished + chrono::Duration::from_std(e.backoff).ok()?;
        if now < until {
            Some((until, e.backoff))
        } else {
            None
        }
    }

    /// kubelet's IsInBackOffSinceUpdate (the image pull back-off): `Some(until, back-off)` while
    /// less than the current back-off has passed since the last [`next`](Self::next).
    pub fn in_backoff_since_update(&self, key: &str, now: DateTime<Utc>) -> Option<(DateTime<Utc>, Duration)> {
        let e = self.entries.get(key)?;
        if self.expired(now, e.last_update) {
            return None;
        }
        let until = e.last_update + chrono::Duration::from_std(e.backoff).ok()?;
        (now < until).then_some((until, e.backoff))
    }

    /// Record a restart of a container that finished at `finished`.
    pub fn next(&mut self, key: &str, finished: DateTime<Utc>) {
        let now = Utc::now();
        let fresh = match self.entries.get(key) {
            None => true,
            Some(e) => self.expired(finished, e.last_update),
        };
        let backoff = if fresh {
            self.initial
        } else {
            let e = &self.entries[key];
            (e.backoff * 2).min(self.max)
        };
        self.entries.insert(
            key.to_string(),
            Entry {
                backoff,
                last_update: now,
            },
        );
    }

    /// The back-off the next restart of `key` would wait (for messages).
    pub fn current(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.backoff)
    }

    pub fn forget(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Drop entries that would start over anyway (kubelet's Backoff.GC), so keys of pods that
    /// are gone do not pile up.
    pub fn gc(&mut self, now: DateTime<Utc>) {
        let max = self.max;
        self.entries
            .retain(|_, e| (now - e.last_update).to_std().map(|d| d <= max * 2).unwrap_or(true));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_and_caps() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(40));
        let t0 = Utc::now();
        assert!(b.wait_until("c", t0, t0).is_none(), "first restart is immediate");
        b.next("c", t0);
        let (until, d) = b.wait_until("c", t0, t0).unwrap();
        assert_eq!(d, Duration::from_secs(10));
        assert_eq!(until, t0 + chrono::Duration::seconds(10));
        assert!(b.wait_until("c", t0, until).is_none());
        b.next("c", t0);
        assert_eq!(b.current("c"), Some(Duration::from_secs(20)));
        b.next("c", t0);
        b.next("c", t0);
        assert_eq!(b.current("c"), Some(Duration::from_secs(40)), "capped");
    }

    #[test]
    fn image_pull_back_off_counts_from_the_last_failure() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let t0 = Utc::now();
        assert!(
            b.in_backoff_since_update("p_img", t0).is_none(),
            "the first pull is not held back"
        );
        b.next("p_img", t0);
        let (until, d) = b.in_backoff_since_update("p_img", Utc::now()).unwrap();
        assert_eq!(d, Duration::from_secs(10));
        assert!(b.in_backoff_since_update("p_img", until).is_none());
        b.next("p_img", until);
        assert_eq!(
            b.in_backoff_since_update("p_img", Utc::now()).unwrap().1,
            Duration::from_secs(20)
        );
        for _ in 0..10 {
            b.next("p_img", Utc::now());
        }
        assert_eq!(b.current("p_img"), Some(Duration::from_secs(300)), "capped at 300 s");
    }

    #[test]
    fn resets_after_long_run() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let t0 = Utc::now();
        b.next("c", t0);
        b.next("c", t0);
        let much_later = t0 + chrono::Duration::seconds(601);
        assert!(b.wait_until("c", much_later, much_later).is_none());
        b.next("c", much_later);
        assert_eq!(b.current("c"), Some(Duration::from_secs(10)));
    }
}
