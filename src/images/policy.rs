//! What kubelet's image manager decides before a pull, and the words it uses
//! (pkg/kubelet/images/image_manager.go): whether to pull under a pull policy, the event and
//! status messages, and how pull durations are written.

use std::time::Duration;

/// A container's imagePullPolicy (kubelet's defaults are applied by pod defaulting already:
/// `:latest` or no tag -> Always, else IfNotPresent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// The policy as the spec writes it; unset or unknown values get kubelet's default for
    /// the image.
    pub fn of(policy: Option<&str>, image: &str) -> PullPolicy {
        match policy.unwrap_or_else(|| crate::pod::defaults::default_pull_policy(image)) {
            "Always" => PullPolicy::Always,
            "Never" => PullPolicy::Never,
            _ => PullPolicy::IfNotPresent,
        }
    }
}

/// kubelet's shouldPullImage.
pub fn should_pull(policy: PullPolicy, present: bool) -> bool {
    match policy {
        PullPolicy::Never => false,
        PullPolicy::IfNotPresent => !present,
        PullPolicy::Always => true,
    }
}

/// kubelet's back-off key: the pod's UID and the image as the spec writes it.
pub fn backoff_key(pod_uid: &str, image: &str) -> String {
    format!("{pod_uid}_{image}")
}

pub fn already_present(image: &str) -> String {
    format!("Container image \"{image}\" already present on machine")
}

pub fn never_pull(image: &str) -> String {
    format!("Container image \"{image}\" is not present with pull policy of Never")
}

/// kubelet's InvalidImageName message.
pub fn invalid_name(image: &str, err: &str) -> String {
    format!("Failed to apply default image tag \"{image}\": couldn't parse image name \"{image}\": {err}")
}

pub fn pulling(image: &str) -> String {
    format!("Pulling image \"{image}\"")
}

/// The BackOff event's message; the container's waiting message adds the last pull's error.
pub fn back_off(image: &str) -> String {
    format!("Back-off pulling image \"{image}\"")
}

pub fn back_off_waiting(image: &str, previous: Option<&str>) -> String {
    match previous {
        Some(e) => format!("{}: {e}", back_off(image)),
        None => back_off(image),
    }
}

/// The most of a pull's error kept for events and the container's waiting message (and so the
/// pod's status): a registry chooses what goes into it (its error bodies, an index's
/// platforms), and a status is written to disk and the API server on every change.
pub const MAX_PULL_ERROR: usize = 1024;

/// A pull's error as the node shows it: at most [`MAX_PULL_ERROR`] bytes, cut on a character
/// boundary and saying how much was left out.
pub fn pull_error(err: &str) -> String {
    if err.len() <= MAX_PULL_ERROR {
        return err.to_string();
    }
    let mut cut = MAX_PULL_ERROR - 40;
    while !err.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{} ... ({} more bytes)", &err[..cut], err.len() - cut)
}

pub fn failed(image: &str, err: &str) -> String {
    format!("Failed to pull image \"{image}\": {err}")
}

pub fn pulled(image: &str, pull: Duration, total: Duration, size: u64) -> String {
    format!(
        "Successfully pulled image \"{image}\" in {} ({} including waiting). Image size: {size} bytes.",
        go_duration(truncate_ms(pull)),
        go_duration(truncate_ms(total))
    )
}

/// The "Failed" event kuberuntime records when the image step fails: `Error: <reason>`.
pub fn error_event(reason: &str) -> String {
    format!("Error: {reason}")
}

pub fn secrets_missing(names: &[String]) -> String {
    format!(
        "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
        names.join(", ")
    )
}

fn truncate_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// A duration as Go's time.Duration String writes it: `1.234s`, `523ms`, `2m3.5s`, `0s`.
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    let trim = |int: u128, frac: u128, width: usize| -> String {
        if frac == 0 {
            int.to_string()
        } else {
            let f = format!("{frac:0width$}");
            format!("{int}.{}", f.trim_end_matches('0'))
        }
    };
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim(nanos / 1_000, nanos % 1_000, 3));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", trim(nanos / 1_000_000, nanos % 1_000_000, 6));
    }
    let secs = nanos / 1_000_000_000;
    let frac = nanos % 1_000_000_000;
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let sec = format!("{}s", trim(s, frac, 9));
    if h > 0 {
        format!("{h}h{m}m{sec}")
    } else if m > 0 {
        format!("{m}m{sec}")
    } else {
        sec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_errors_are_capped() {
        assert_eq!(pull_error("short"), "short");
        let long = format!("failed to pull: {}", "é".repeat(100_000));
        let c = pull_error(&long);
        assert!(c.len() <= MAX_PULL_ERROR, "{}", c.len());
        assert!(c.starts_with("failed to pull: éé") && c.ends_with("more bytes)"), "{c}");
    }

    #[test]
    fn pull_decisions() {
        use PullPolicy::*;
        assert!(!should_pull(Never, false));
        assert!(!should_pull(Never, true));
        assert!(should_pull(IfNotPresent, false));
        assert!(!should_pull(IfNotPresent, true));
        assert!(should_pull(Always, true), "Always asks the registry every time");
        assert_eq!(PullPolicy::of(None, "busybox"), Always);
        assert_eq!(PullPolicy::of(None, "busybox:1.35"), IfNotPresent);
        assert_eq!(PullPolicy::of(Some("Never"), "busybox"), Never);
    }

    #[test]
    fn messages_as_kubelet_writes_them() {
        assert_eq!(
            pulled(
                "reg/x:1",
                Duration::from_micros(1_234_567),
                Duration::from_millis(1300),
                42
            ),
            "Successfully pulled image \"reg/x:1\" in 1.234s (1.3s including waiting). Image size: 42 bytes."
        );
        assert_eq!(back_off("x:1"), "Back-off pulling image \"x:1\"");
        assert_eq!(
            back_off_waiting("x:1", Some("boom")),
            "Back-off pulling image \"x:1\": boom"
        );
        assert_eq!(failed("x:1", "e"), "Failed to pull image \"x:1\": e");
        assert_eq!(error_event("ErrImagePull"), "Error: ErrImagePull");
        assert_eq!(already_present("b"), "Container image \"b\" already present on machine");
        assert_eq!(backoff_key("uid", "b:1"), "uid_b:1");
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(go_duration(Duration::from_millis(523)), "523ms");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(123_500)), "2m3.5s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_micros(1500)), "1.5ms");
    }
}
