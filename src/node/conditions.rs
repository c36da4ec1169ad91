//! The Node's conditions (kubelet's nodestatus setters MemoryPressureCondition,
//! DiskPressureCondition, PIDPressureCondition and ReadyCondition; the pressures are the
//! eviction manager's, src/eviction/): kubelet's reasons and messages, the heartbeat moved on every computation,
//! the transition time only when the status changes, and the node event each change records.

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Which pressures the node is under.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

struct PressureStrings {
    kind: &'static str,
    on: (&'static str, &'static str, &'static str),
    off: (&'static str, &'static str, &'static str),
}

const MEMORY: PressureStrings = PressureStrings {
    kind: "MemoryPressure",
    on: (
        "KubeletHasInsufficientMemory",
        "kubelet has insufficient memory available",
        "NodeHasInsufficientMemory",
    ),
    off: (
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
        "NodeHasSufficientMemory",
    ),
};
const DISK: PressureStrings = PressureStrings {
    kind: "DiskPressure",
    on: (
        "KubeletHasDiskPressure",
        "kubelet has disk pressure",
        "NodeHasDiskPressure",
    ),
    off: (
        "KubeletHasNoDiskPressure",
        "kubelet has no disk pressure",
        "NodeHasNoDiskPressure",
    ),
};
const PID: PressureStrings = PressureStrings {
    kind: "PIDPressure",
    on: (
        "KubeletHasInsufficientPID",
        "kubelet has insufficient PID available",
        "NodeHasInsufficientPID",
    ),
    off: (
        "KubeletHasSufficientPID",
        "kubelet has sufficient PID available",
        "NodeHasSufficientPID",
    ),
};

/// kubelet's Ready reasons and messages.
pub const KUBELET_READY: &str = "KubeletReady";
pub const KUBELET_READY_MESSAGE: &str = "kubelet is posting ready status";
pub const KUBELET_NOT_READY: &str = "KubeletNotReady";
/// The node events the Ready condition records.
pub const NODE_READY: &str = "NodeReady";
pub const NODE_NOT_READY: &str = "NodeNotReady";

/// Set the three pressure conditions (in kubelet's order) from `pressure`; returns the events
/// to record (their reasons), one per condition whose status changed.
pub fn set_pressure(conditions: &mut Vec<NodeCondition>, pressure: Pressure, now: &Time) -> Vec<&'static str> {
    let mut events = Vec::new();
    for (strings, on) in [(&MEMORY, pressure.memory), (&DISK, pressure.disk), (&PID, pressure.pid)] {
        let c = condition(conditions, strings.kind, "Unknown");
        c.last_heartbeat_time = Some(now.clone());
        let (status, (reason, message, event)) = if on {
            ("True", strings.on)
        } else {
            ("False", strings.off)
        };
        if c.status != status {
            c.status = status.into();
            c.reason = Some(reason.into());
            c.message = Some(message.into());
            c.last_transition_time = Some(now.clone());
            events.push(event);
        }
    }
    events
}

/// Set the Ready condition: ready when `errors` is empty, else KubeletNotReady with the errors
/// (one as it is, several as `[a, b]`, as Go's aggregate error prints them). The transition time
/// moves only when the status changes; a change of status records NodeReady / NodeNotReady (a
/// condition set for the first time records nothing, as in kubelet).
pub fn set_ready(conditions: &mut Vec<NodeCondition>, errors: &[String], now: &Time) -> Option<&'static str> {
    let (status, reason, message) = match errors {
        [] => ("True", KUBELET_READY, KUBELET_READY_MESSAGE.to_string()),
        [one] => ("False", KUBELET_NOT_READY, one.clone()),
        many => ("False", KUBELET_NOT_READY, format!("[{}]", many.join(", "))),
    };
    let existed = conditions.iter().any(|c| c.type_ == "Ready");
    let c = condition(conditions, "Ready", status);
    let changed = c.status != status;
    if !existed || changed {
        c.last_transition_time = Some(now.clone());
    }
    c.status = status.into();
    c.reason = Some(reason.into());
    c.message = Some(message);
    c.last_heartbeat_time = Some(now.clone());
    match (existed && changed, status) {
        (false, _) => None,
        (true, "True") => Some(NODE_READY),
        (true, _) => Some(NODE_NOT_READY),
    }
}

/// The condition of type `kind`, appended with `status` when missing.
fn condition<'a>(conditions: &'a mut Vec<NodeCondition>, kind: &str, status: &str) -> &'a mut NodeCondition {
    let i = match conditions.iter().position(|c| c.type_ == kind) {
        Some(i) => i,
        None => {
            conditions.push(NodeCondition {
                type_: kind.into(),
                status: status.into(),
                ..Default::default()
            });
            conditions.len() - 1
        }
    };
    &mut conditions[i]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + secs).unwrap())
    }

    fn get<'a>(c: &'a [NodeCondition], kind: &str) -> &'a NodeCondition {
        c.iter().find(|c| c.type_ == kind).unwrap()
    }

    #[test]
    fn pressure_conditions_start_sufficient_and_record_their_events() {
        let mut c = Vec::new();
        let ev = set_pressure(&mut c, Pressure::default(), &t(0));
        assert_eq!(
            ev,
            [
                "NodeHasSufficientMemory",
                "NodeHasNoDiskPressure",
                "NodeHasSufficientPID"
            ]
        );
        let kinds: Vec<_> = c.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(kinds, ["MemoryPressure", "DiskPressure", "PIDPressure"]);
        let m = get(&c, "MemoryPressure");
        assert_eq!(m.status, "False");
        assert_eq!(m.reason.as_deref(), Some("KubeletHasSufficientMemory"));
        assert_eq!(m.message.as_deref(), Some("kubelet has sufficient memory available"));
        assert_eq!(
            get(&c, "DiskPressure").message.as_deref(),
            Some("kubelet has no disk pressure")
        );
        assert_eq!(
            get(&c, "PIDPressure").reason.as_deref(),
            Some("KubeletHasSufficientPID")
        );

        // Unchanged: heartbeat moves, transition stays, no event.
        assert!(set_pressure(&mut c, Pressure::default(), &t(10)).is_empty());
        let m = get(&c, "MemoryPressure");
        assert_eq!(m.last_heartbeat_time, Some(t(10)));
        assert_eq!(m.last_transition_time, Some(t(0)));

        let ev = set_pressure(
            &mut c,
            Pressure {
                disk: true,
                ..Default::default()
            },
            &t(20),
        );
        assert_eq!(ev, ["NodeHasDiskPressure"]);
        let d = get(&c, "DiskPressure");
        assert_eq!(
            (d.status.as_str(), d.reason.as_deref()),
            ("True", Some("KubeletHasDiskPressure"))
        );
        assert_eq!(d.last_transition_time, Some(t(20)));
    }

    #[test]
    fn ready_transitions_only_on_status_change() {
        let mut c = Vec::new();
        let net = "container runtime network not ready: NetworkReady=false".to_string();
        assert_eq!(set_ready(&mut c, std::slice::from_ref(&net), &t(0)), None);
        let r = get(&c, "Ready");
        assert_eq!(r.status, "False");
        assert_eq!(r.reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(r.message.as_deref(), Some(net.as_str()));
        assert_eq!(r.last_transition_time, Some(t(0)));

        assert_eq!(set_ready(&mut c, &[net.clone(), "b".into()], &t(5)), None);
        let r = get(&c, "Ready");
        assert_eq!(r.message.as_deref(), Some(format!("[{net}, b]").as_str()));
        assert_eq!(r.last_transition_time, Some(t(0)));
        assert_eq!(r.last_heartbeat_time, Some(t(5)));

        assert_eq!(set_ready(&mut c, &[], &t(10)), Some("NodeReady"));
        let r = get(&c, "Ready");
        assert_eq!(
            (r.status.as_str(), r.reason.as_deref(), r.message.as_deref()),
            ("True", Some("KubeletReady"), Some("kubelet is posting ready status"))
        );
        assert_eq!(r.last_transition_time, Some(t(10)));
        assert_eq!(set_ready(&mut c, &[], &t(20)), None);
        assert_eq!(get(&c, "Ready").last_transition_time, Some(t(10)));
        assert_eq!(set_ready(&mut c, &["down".into()], &t(30)), Some("NodeNotReady"));
    }
}
