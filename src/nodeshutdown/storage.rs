//! kubelet's graceful node shutdown state (pkg/kubelet/nodeshutdown/storage.go): the file
//! `graceful_node_shutdown_state` in the root dir, `{"startTime": ..., "endTime": ...}`, written
//! when a shutdown begins (the start, no end) and when its pods have been stopped (both), and
//! read at start, so the shutdown metrics of the last shutdown survive the reboot it was for.
//! The times are Go's `time.Time` in JSON (RFC 3339, nanoseconds), Go's zero time
//! `0001-01-01T00:00:00Z` meaning "none", so a file written by kubelet reads here and the other
//! way round.

use std::path::{Path, PathBuf};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// kubelet's localStorageStateFile, in the root dir.
pub const STATE_FILE: &str = "graceful_node_shutdown_state";

/// The file in `root_dir`.
pub fn path(root_dir: &Path) -> PathBuf {
    root_dir.join(STATE_FILE)
}

/// The last graceful shutdown: when it began and when its pods had stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    #[serde(rename = "startTime", default, with = "go_time")]
    pub start: Option<DateTime<Utc>>,
    #[serde(rename = "endTime", default, with = "go_time")]
    pub end: Option<DateTime<Utc>>,
}

/// The state in `path`; a missing file is the empty state (no shutdown seen yet). The error
/// names the file.
pub fn load(path: &Path) -> ferrolet_fsutil::Result<State> {
    Ok(ferrolet_fsutil::read_json_opt(path)?.unwrap_or_default())
}

/// Write `state` to `path` atomically and durably (the end is written just before the machine
/// powers off). The error names the file.
pub fn store(path: &Path, state: &State) -> ferrolet_fsutil::Result<()> {
    let data = serde_json::to_vec(state)
        .map_err(|e| ferrolet_fsutil::Error::json(format!("encoding {}", path.display()), e))?;
    ferrolet_fsutil::write_atomic(path, &data)
}

/// kubelet's timestamp(): whole seconds since the epoch, 0 for no time.
pub fn seconds(t: Option<DateTime<Utc>>) -> f64 {
    t.map(|t| t.timestamp() as f64).unwrap_or(0.0)
}

/// `Option<DateTime<Utc>>` as Go's `time.Time` in JSON: `None` is Go's zero time.
mod go_time {
    use super::*;

    const ZERO: &str = "0001-01-01T00:00:00Z";

    pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
            None => s.serialize_str(ZERO),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        // Go reads `null` as "no change", which leaves the zero time.
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        let t = DateTime::parse_from_rfc3339(&text)
            .map_err(|e| serde::de::Error::custom(format!("{text:?} is not an RFC 3339 time: {e}")))?
            .with_timezone(&Utc);
        let zero = DateTime::parse_from_rfc3339(ZERO).map(|z| z.with_timezone(&Utc)).ok();
        Ok((Some(t) != zero).then_some(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Option<DateTime<Utc>> {
        Some(DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc))
    }

    #[test]
    fn the_state_round_trips_in_kubelets_format() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path());
        assert_eq!(load(&file).unwrap(), State::default(), "no file: no shutdown yet");

        let begun = State {
            start: at("2026-11-27T07:09:37.123456789Z"),
            end: None,
        };
        store(&file, &begun).unwrap();
        let raw = std::fs::read_to_string(&file).unwrap();
        assert_eq!(
            raw,
            r#"{"startTime":"2026-11-27T07:09:37.123456789Z","endTime":"0001-01-01T00:00:00Z"}"#
        );
        assert_eq!(load(&file).unwrap(), begun);

        let ended = State {
            end: at("2026-11-27T07:09:51Z"),
            ..begun
        };
        store(&file, &ended).unwrap();
        assert_eq!(load(&file).unwrap(), ended);
        assert_eq!(seconds(ended.start), 1_795_763_377.0);
        assert_eq!(seconds(ended.end), 1_795_763_391.0);
        assert_eq!(seconds(None), 0.0);
    }

    #[test]
    fn a_file_kubelet_wrote_reads() {
        // Go writes the local offset and trims the fraction's zeros; the zero time is "none".
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path());
        std::fs::write(
            &file,
            r#"{"startTime":"2026-11-27T08:09:37.1+01:00","endTime":"0001-01-01T00:00:00Z"}"#,
        )
        .unwrap();
        assert_eq!(
            load(&file).unwrap(),
            State {
                start: at("2026-11-27T07:09:37.1Z"),
                end: None
            }
        );
        std::fs::write(&file, r#"{"startTime":null}"#).unwrap();
        assert_eq!(load(&file).unwrap(), State::default());
    }

    #[test]
    fn a_bad_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path());
        for bad in [
            &b"{\"startTime\": \"yesterday\"}"[..],
            b"{\"startTime\": 5}",
            b"not json",
            b"",
            b"\xff\xfe",
        ] {
            std::fs::write(&file, bad).unwrap();
            let e = load(&file).expect_err("a bad file");
            let text = ferrolet_fsutil::chain(&e).to_string();
            assert!(
                text.contains(&file.display().to_string()),
                "{text:?} does not name the file"
            );
        }
        // A directory where the file should be: unreadable, and said so.
        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir(&file).unwrap();
        let e = load(&file).expect_err("a directory");
        assert!(ferrolet_fsutil::chain(&e).to_string().contains(STATE_FILE));
    }
}
