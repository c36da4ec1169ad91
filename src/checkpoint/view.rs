//! How current the node's view of the API server is: fresh while the pod watch is listed and
//! live; stale from the moment the node runs on its checkpoint (a start without the server) or
//! loses the watch, until the server has been listed again.

use std::sync::Mutex;
use std::time::SystemTime;

/// Why the view is stale, and since when.
#[derive(Debug, Clone, PartialEq)]
pub struct Stale {
    pub since: SystemTime,
    /// The pods were restored from the checkpoint (none of them seen from the server yet).
    pub restored: Option<usize>,
    /// The last error reaching the server.
    pub error: String,
}

#[derive(Default)]
pub struct View {
    stale: Mutex<Option<Stale>>,
}

impl View {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Stale>> {
        self.stale.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stale now, if it is.
    pub fn stale(&self) -> Option<Stale> {
        self.lock().clone()
    }

    /// The server cannot be reached: stale from now on (or still, since it became so).
    pub fn unreachable(&self, error: &str) {
        let mut s = self.lock();
        match s.as_mut() {
            Some(s) => s.error = error.to_string(),
            None => {
                *s = Some(Stale {
                    since: SystemTime::now(),
                    restored: None,
                    error: error.to_string(),
                })
            }
        }
    }

    /// `n` pods run from the checkpoint.
    pub fn restored(&self, n: usize, error: &str) {
        self.unreachable(error);
        if let Some(s) = self.lock().as_mut() {
            s.restored = Some(n);
        }
    }

    /// The server's pods are listed again.
    pub fn fresh(&self) -> Option<Stale> {
        self.lock().take()
    }

    /// The line `/healthz?verbose` shows.
    pub fn describe(&self) -> String {
        match self.stale() {
            None => "fresh".into(),
            Some(s) => {
                let since =
                    chrono::DateTime::<chrono::Utc>::from(s.since).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                let restored = match s.restored {
                    Some(n) => format!("; {n} pods restored from the local checkpoint"),
                    None => String::new(),
                };
                format!("stale since {since} (API server unreachable: {}){restored}", s.error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_from_the_first_failure_until_fresh() {
        let v = View::default();
        assert_eq!(v.describe(), "fresh");
        v.unreachable("connection refused");
        let since = v.stale().unwrap().since;
        v.restored(3, "still refused");
        let s = v.stale().unwrap();
        assert_eq!(
            (s.since, s.restored, s.error.as_str()),
            (since, Some(3), "still refused")
        );
        assert!(v.describe().starts_with("stale since "), "{}", v.describe());
        assert!(v.describe().ends_with("3 pods restored from the local checkpoint"));
        assert!(v.fresh().is_some());
        assert_eq!(v.describe(), "fresh");
    }
}
