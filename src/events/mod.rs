//! Events (client-go's record.EventRecorder as kubelet uses it): what happened to a pod or to the
//! node, with kubelet's reasons. Standalone, an event is a log line; in a cluster it is also
//! posted to the API server as a core/v1 Event, correlated (repeats counted, similar ones
//! combined, spam dropped) and rate-limited as client-go's recorder does, without ever making
//! the caller wait.

mod correlator;
mod lru;
mod object;
mod sink;
pub(crate) mod token_bucket;

pub use correlator::{Correlated, Correlator};
pub use object::{event_name, make, node_reference, pod_reference, COMPONENT};

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use crate::kubeclient::Kube;
use crate::pod;

/// An event's type, as the API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Warning,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Normal => "Normal",
            Kind::Warning => "Warning",
        }
    }

    /// The type of a pod event with `reason` (one of [`pod::reasons`]): Warning for those
    /// kubelet records as warnings, else Normal.
    pub fn of_reason(reason: &str) -> Kind {
        use pod::reasons::{
            EVENT_BACK_OFF, EVENT_FAILED_POST_START_HOOK, EVENT_FAILED_PRE_STOP_HOOK, EVENT_INVALID_ENV_VAR_NAMES,
            EVENT_PROBE_WARNING, EVENT_UNHEALTHY,
        };
        match reason {
            EVENT_BACK_OFF
            | EVENT_UNHEALTHY
            | EVENT_PROBE_WARNING
            | EVENT_FAILED_POST_START_HOOK
            | EVENT_FAILED_PRE_STOP_HOOK
            | EVENT_INVALID_ENV_VAR_NAMES => Kind::Warning,
            r if r.starts_with("Failed") => Kind::Warning,
            _ => Kind::Normal,
        }
    }
}

/// Events the recorder keeps in memory for the status page, newest last.
pub const RECENT: usize = 100;

/// An event as the status page lists it.
#[derive(Debug, Clone)]
pub struct Recent {
    pub time: DateTime<Utc>,
    pub kind: Kind,
    /// `namespace/name` of the pod (with `/container` when it concerns one), or `node/<name>`.
    pub object: String,
    pub reason: String,
    pub message: String,
}

/// Where events go; cheap to clone, never blocks the caller.
#[derive(Clone)]
pub struct Recorder {
    node: Arc<str>,
    sink: Option<sink::Sink>,
    recent: Arc<Mutex<VecDeque<Recent>>>,
}

impl Recorder {
    /// A recorder that only logs (no API server).
    pub fn standalone(node: &str) -> Recorder {
        Recorder {
            node: node.into(),
            sink: None,
            recent: Arc::default(),
        }
    }

    /// A recorder that logs and posts events to the API server as kubelet on `node`, at most
    /// `qps` writes a second with bursts of `burst` (kubelet's eventRecordQPS / eventBurst; `qps`
    /// 0: no limit). Starts its writer on the current tokio runtime.
    pub fn cluster(kube: Kube, node: &str, qps: u32, burst: u32) -> Recorder {
        Recorder {
            node: node.into(),
            sink: Some(sink::Sink::start(kube, qps, burst)),
            recent: Arc::default(),
        }
    }

    /// An event about a pod (`container`: the container it concerns, if any).
    pub fn pod(&self, p: &Pod, container: Option<&str>, kind: Kind, reason: &str, message: &str) {
        let full = pod::full_name(p);
        match kind {
            Kind::Normal => info!(pod = %full, container, reason, "{message}"),
            Kind::Warning => warn!(pod = %full, container, reason, "{message}"),
        }
        let object = format!("{}/{}", pod::namespace(p), pod::name(p));
        let object = match container {
            Some(c) => format!("{object}/{c}"),
            None => object,
        };
        self.remember(kind, object, reason, message);
        if let Some(s) = &self.sink {
            s.send(make(
                pod_reference(p, container),
                &self.node,
                kind,
                reason,
                message,
                Utc::now(),
            ));
        }
    }

    /// An event about the node.
    pub fn node(&self, kind: Kind, reason: &str, message: &str) {
        match kind {
            Kind::Normal => info!(node = %self.node, reason, "{message}"),
            Kind::Warning => warn!(node = %self.node, reason, "{message}"),
        }
        self.remember(kind, format!("node/{}", self.node), reason, message);
        if let Some(s) = &self.sink {
            s.send(make(
                node_reference(&self.node),
                &self.node,
                kind,
                reason,
                message,
                Utc::now(),
            ));
        }
    }

    /// Keep the event for [`Recorder::recent`], the oldest going past [`RECENT`].
    fn remember(&self, kind: Kind, object: String, reason: &str, message: &str) {
        let mut q = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() == RECENT {
            q.pop_front();
        }
        q.push_back(Recent {
            time: Utc::now(),
            kind,
            object,
            reason: reason.to_string(),
            message: message.to_string(),
        });
    }

    /// The last [`RECENT`] events, newest first.
    pub fn recent(&self) -> Vec<Recent> {
        let q = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        q.iter().rev().cloned().collect()
    }

    /// Events dropped because the queue to the API server was full (0 standalone).
    pub fn dropped(&self) -> u64 {
        self.sink.as_ref().map_or(0, sink::Sink::dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_events_are_bounded_newest_first() {
        let r = Recorder::standalone("n1");
        for i in 0..RECENT + 5 {
            r.node(Kind::Normal, "Tick", &format!("{i}"));
        }
        let recent = r.recent();
        assert_eq!(recent.len(), RECENT);
        assert_eq!(recent[0].message, format!("{}", RECENT + 4));
        assert_eq!(recent[RECENT - 1].message, "5");
        assert_eq!(recent[0].object, "node/n1");
        // clones share the list
        r.clone().node(Kind::Warning, "Last", "x");
        assert_eq!(r.recent()[0].reason, "Last");
    }
}
