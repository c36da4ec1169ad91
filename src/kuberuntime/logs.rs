//! Container logs as kubelet serves them (`/containerLogs`): read the CRI log file of the
//! current (or previous) attempt, join partial lines, honour tailLines / limitBytes /
//! sinceSeconds / timestamps, and with follow keep reading as the file grows (and rotates)
//! until the container stops.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use bytes::Bytes;
use ferrolet_runtime::crilog::{self, LogLine};
use ferrolet_runtime::Runtime;
use std::os::unix::fs::MetadataExt;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;

use super::runtime_container_id;
use super::views::parse_time;
use crate::pod::manager::PodEntry;
use crate::pod::reasons;

/// kubelet's PodLogOptions, as they come in a query string.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<i64>,
    pub limit_bytes: Option<i64>,
    pub since_seconds: Option<i64>,
    /// RFC 3339.
    pub since_time: Option<String>,
    pub container: Option<String>,
}

impl LogOptions {
    /// Kubernetes' ValidatePodLogOptions, with its messages: a bad option is refused (400), not
    /// quietly ignored.
    pub fn validate(&self) -> Result<(), String> {
        let mut errs = Vec::new();
        if let Some(n) = self.tail_lines.filter(|n| *n < 0) {
            errs.push(format!(
                "tailLines: Invalid value: {n}: must be greater than or equal to 0"
            ));
        }
        if let Some(n) = self.limit_bytes.filter(|n| *n < 1) {
            errs.push(format!("limitBytes: Invalid value: {n}: must be greater than 0"));
        }
        if let Some(n) = self.since_seconds.filter(|n| *n < 1) {
            errs.push(format!("sinceSeconds: Invalid value: {n}: must be greater than 0"));
        }
        if let Some(t) = &self.since_time {
            if parse_time(t).is_none() {
                errs.push(format!("sinceTime: Invalid value: {t:?}: must be an RFC 3339 time"));
            }
            if self.since_seconds.is_some() {
                errs.push("sinceTime: Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified".into());
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.join(", "))
        }
    }

    /// The earliest log time to show, from sinceSeconds or sinceTime.
    fn since(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        match (self.since_seconds, &self.since_time) {
            (Some(s), _) => Some(chrono::Utc::now() - chrono::Duration::seconds(s)),
            (None, Some(t)) => parse_time(t),
            (None, None) => None,
        }
    }
}

/// Pick the container: the named one, or the pod's only (or default-annotated) container.
pub fn container_name(entry: &PodEntry, requested: Option<&str>) -> Result<String> {
    let p = &entry.pod;
    let all: Vec<&str> = crate::pod::all_containers(p).map(|c| c.name.as_str()).collect();
    if let Some(r) = requested.filter(|r| !r.is_empty()) {
        if all.contains(&r) || crate::pod::is_ephemeral_name(p, r) {
            return Ok(r.to_string());
        }
        bail!("container {r} is not valid for pod {}", crate::pod::name(p));
    }
    if let Some(d) = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("kubectl.kubernetes.io/default-container"))
    {
        return Ok(d.clone());
    }
    let apps: Vec<&str> = crate::pod::containers(p).iter().map(|c| c.name.as_str()).collect();
    match apps.as_slice() {
        [one] => Ok(one.to_string()),
        [] => bail!("pod {} has no containers", crate::pod::name(p)),
        many => Ok(many[0].to_string()),
    }
}

/// The log file and container id to read, from the pod's status.
pub fn locate(rt: &Runtime, entry: &PodEntry, container: &str, previous: bool) -> Result<(PathBuf, String)> {
    let st = &entry.status;
    let cs = crate::pod::all_statuses(st)
        .find(|c| c.name == container)
        .ok_or_else(|| anyhow!("container {container:?} has no status yet"))?;
    let id = if previous {
        cs.last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .and_then(|t| t.container_id.clone())
            .ok_or_else(|| {
                anyhow!(
                    "previous terminated container {container:?} in pod {:?} not found",
                    crate::pod::name(&entry.pod)
                )
            })?
    } else {
        cs.container_id.clone().ok_or_else(|| {
            let why = cs
                .state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.clone())
                .unwrap_or_else(|| reasons::CONTAINER_CREATING.into());
            anyhow!(
                "container {container:?} in pod {:?} is waiting to start: {why}",
                crate::pod::name(&entry.pod)
            )
        })?
    };
    let id = runtime_container_id(&id).to_string();
    let info = rt.inspect(&id)?;
    Ok((info.record.log_path.clone(), id))
}

fn render(l: &LogLine, timestamps: bool, out: &mut Vec<u8>) {
    if timestamps {
        out.extend_from_slice(l.timestamp.as_bytes());
        out.push(b' ');
    }
    out.extend_from_slice(&l.message);
    if !l.partial {
        out.push(b'\n');
    }
}

fn since_ok(l: &LogLine, since: Option<chrono::DateTime<chrono::Utc>>) -> bool {
    match since {
        None => true,
        Some(t) => parse_time(&l.timestamp).is_none_or(|ts| ts >= t),
    }
}

/// Stream a container's log into `tx`, following while the container runs if asked.
pub async fn stream(rt: Arc<Runtime>, path: PathBuf, id: String, opts: LogOptions, tx: mpsc::Sender<Bytes>) {
    let since = opts.since();
    let mut budget = opts.limit_bytes.map(|n| n.max(0) as usize).unwrap_or(usize::MAX);
    // The inode of the file read, to find it among the rotated files once it was rotated.
    let (data, mut ino) = match tokio::fs::File::open(&path).await {
        Ok(mut f) => {
            let ino = f.metadata().await.map(|m| m.ino()).unwrap_or(0);
            let mut data = Vec::new();
            let _ = f.read_to_end(&mut data).await;
            (data, ino)
        }
        Err(_) => (Vec::new(), 0),
    };
    let mut offset = data.len() as u64;
    // Only complete lines now; a trailing partial line is re-read when followed.
    let complete = data.iter().rposition(|&b| b == b'\n').map(|i| i + 1).unwrap_or(0);
    if opts.follow {
        offset = complete as u64;
    }
    let mut recs: Vec<LogLine> = crilog::read_records(&data[..if opts.follow { complete } else { data.len() }])
        .into_iter()
        .filter(|l| since_ok(l, since))
        .collect();
    if let Some(n) = opts.tail_lines {
        let skip = recs.len().saturating_sub(n.max(0) as usize);
        recs.drain(..skip);
    }
    let mut buf = Vec::new();
    for r in &recs {
        render(r, opts.timestamps, &mut buf);
    }
    if !send_limited(&tx, buf, &mut budget).await || !opts.follow {
        return;
    }
    // Follow: poll the file; when it was rotated, finish it (and any rotated after it) from
    // the rotated files, then read the new one from its start; stop once the container has
    // stopped and the file has been drained.
    let mut pending = Vec::new();
    loop {
        let running = rt.inspect(&id).map(|i| i.is_running()).unwrap_or(false);
        let mut chunk = Vec::new();
        if let Ok(mut f) = tokio::fs::File::open(&path).await {
            let md = f.metadata().await.ok();
            let cur = md.as_ref().map(|m| m.ino()).unwrap_or(0);
            if cur != ino {
                let (p, old) = (path.clone(), ino);
                chunk = ferrolet_fsutil::spawn_blocking(move || rotated_tail(&p, old, offset))
                    .await
                    .unwrap_or_default();
                ino = cur;
                offset = 0;
            }
            let len = md.map(|m| m.len()).unwrap_or(0);
            if len < offset {
                offset = 0;
            }
            if len > offset && f.seek(std::io::SeekFrom::Start(offset)).await.is_ok() {
                let _ = f.read_to_end(&mut chunk).await;
                offset += chunk.len() as u64;
            }
        }
        if !chunk.is_empty() {
            pending.extend_from_slice(&chunk);
            let cut = pending.iter().rposition(|&b| b == b'\n').map(|i| i + 1).unwrap_or(0);
            let ready: Vec<u8> = pending.drain(..cut).collect();
            let mut out = Vec::new();
            for r in crilog::read_records(&ready).iter().filter(|l| since_ok(l, since)) {
                render(r, opts.timestamps, &mut out);
            }
            if !send_limited(&tx, out, &mut budget).await {
                return;
            }
        } else if !running {
            return;
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn send_limited(tx: &mpsc::Sender<Bytes>, mut data: Vec<u8>, budget: &mut usize) -> bool {
    if data.is_empty() {
        return !tx.is_closed();
    }
    if data.len() > *budget {
        data.truncate(*budget);
    }
    *budget -= data.len();
    tx.send(Bytes::from(data)).await.is_ok() && *budget > 0
}

/// What was written to the file with inode `ino` after `offset`, and to every file rotated
/// after it, once it has been rotated away from `path` (empty if it was deleted already).
fn rotated_tail(path: &std::path::Path, ino: u64, offset: u64) -> Vec<u8> {
    use std::io::{Read, Seek};
    let rotated = crilog::rotated_files(path);
    let Some(at) = rotated
        .iter()
        .position(|f| std::fs::metadata(f).is_ok_and(|m| m.ino() == ino))
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, f) in rotated[at..].iter().enumerate() {
        if let Ok(mut file) = std::fs::File::open(f) {
            let start = if i == 0 { offset } else { 0 };
            if file.seek(std::io::SeekFrom::Start(start)).is_ok() {
                let _ = file.read_to_end(&mut out);
            }
        }
    }
    out
}

#[cfg(test)]
mod rotation_tests {
    use super::*;
    use ferrolet_runtime::crilog::{LogWriter, Stream};

    #[test]
    fn a_follower_finishes_the_rotated_files_before_the_new_one() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("0.log");
        let mut w = LogWriter::open(&p, 100, 5).unwrap();
        let now = chrono::Utc::now();
        w.write(now, Stream::Stdout, false, b"0").unwrap();
        // The follower has read line 0 of this file.
        let ino = std::fs::metadata(&p).unwrap().ino();
        let offset = std::fs::metadata(&p).unwrap().len();
        // Several rotations in the same second before it looks again.
        for i in 1..10 {
            w.write(now, Stream::Stdout, false, i.to_string().as_bytes()).unwrap();
        }
        let mut data = rotated_tail(&p, ino, offset);
        data.extend(std::fs::read(&p).unwrap());
        let lines: Vec<String> = crilog::read_records(&data)
            .into_iter()
            .map(|r| String::from_utf8(r.message).unwrap())
            .collect();
        assert_eq!(lines, (1..10).map(|i| i.to_string()).collect::<Vec<_>>());
        // A file already deleted gives nothing rather than something wrong.
        assert!(rotated_tail(&p, 1, 0).is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(q: &str) -> LogOptions {
        serde_json::from_value(serde_json::from_str(q).unwrap()).unwrap()
    }

    #[test]
    fn bad_options_are_refused_with_kubernetes_messages() {
        assert!(opts(r#"{"sinceSeconds": 5, "tailLines": 0, "limitBytes": 1}"#)
            .validate()
            .is_ok());
        assert!(opts(r#"{"sinceTime": "2026-01-02T03:04:05Z"}"#).validate().is_ok());
        let e = opts(r#"{"sinceSeconds": -5}"#).validate().unwrap_err();
        assert_eq!(e, "sinceSeconds: Invalid value: -5: must be greater than 0");
        let e = opts(r#"{"sinceTime": "yesterday"}"#).validate().unwrap_err();
        assert!(e.starts_with("sinceTime: Invalid value: \"yesterday\""), "{e}");
        let e = opts(r#"{"sinceTime": "2026-01-02T03:04:05Z", "sinceSeconds": 1}"#)
            .validate()
            .unwrap_err();
        assert!(e.contains("at most one of `sinceTime` or `sinceSeconds`"), "{e}");
        assert!(opts(r#"{"tailLines": -1}"#).validate().is_err());
        assert!(opts(r#"{"limitBytes": 0}"#).validate().is_err());
    }
}
