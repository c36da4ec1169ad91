//! The file source: every manifest in the static pod path (a directory, or one file). Changes
//! are seen at once through inotify and again at every fileCheckFrequency re-list. Files whose
//! name starts with a dot are ignored, as kubelet does. A file that stops parsing keeps its
//! last good pods running (an editor's half-written save must not kill a pod) and is reported.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::source::{pods_from_manifest, Snapshot, SnapshotSender};
use crate::pod::manifest::Source;

const MAX_MANIFEST: u64 = 10 << 20;

pub struct FileSource {
    path: PathBuf,
    node: String,
    /// Last pods read successfully from each file.
    last_good: HashMap<PathBuf, Vec<Arc<Pod>>>,
    missing_reported: bool,
}

impl FileSource {
    pub fn new(path: PathBuf, node: String) -> FileSource {
        FileSource {
            path,
            node,
            last_good: HashMap::new(),
            missing_reported: false,
        }
    }

    fn files(&mut self) -> Vec<PathBuf> {
        let md = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(_) => {
                if !self.missing_reported {
                    warn!(path = %self.path.display(), "static pod path does not exist; watching for it");
                    self.missing_reported = true;
                }
                return Vec::new();
            }
        };
        self.missing_reported = false;
        if md.is_file() {
            return vec![self.path.clone()];
        }
        let mut v: Vec<PathBuf> = std::fs::read_dir(&self.path)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .filter(|e| e.file_type().map(|t| t.is_file() || t.is_symlink()).unwrap_or(false))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Read every manifest and produce the source's snapshot.
    pub fn scan(&mut self) -> Snapshot {
        let files = self.files();
        let mut errors = BTreeMap::new();
        let mut pods: Vec<Arc<Pod>> = Vec::new();
        self.last_good.retain(|p, _| files.contains(p));
        for f in files {
            let loc = f.display().to_string();
            let read = std::fs::metadata(&f)
                .map_err(|e| e.to_string())
                .and_then(|m| {
                    if m.len() > MAX_MANIFEST {
                        Err(format!("file is larger than {MAX_MANIFEST} bytes"))
                    } else {
                        Ok(())
                    }
                })
                .and_then(|_| std::fs::read_to_string(&f).map_err(|e| e.to_string()));
            let (got, err) = match read {
                Ok(data) => pods_from_manifest(&data, &Source::File(loc.clone()), &self.node),
                Err(e) => (Vec::new(), Some(format!("cannot read: {e}"))),
            };
            match err {
                None => {
                    self.last_good.insert(f.clone(), got.clone());
                    pods.extend(got);
                }
                Some(e) => {
                    // Keep what this file ran before; run what of it is valid now.
                    let kept = self.last_good.get(&f).cloned().unwrap_or_default();
                    let msg = if kept.is_empty() {
                        e
                    } else {
                        format!("{e} (still running its last valid version)")
                    };
                    errors.insert(loc, msg);
                    if kept.is_empty() {
                        pods.extend(got);
                    } else {
                        pods.extend(kept);
                    }
                }
            }
        }
        // Two manifests naming the same pod: the first (by file name) wins, as kubelet keeps
        // the first it saw.
        let mut seen: HashMap<(String, String), String> = HashMap::new();
        let mut unique = Vec::new();
        for p in pods {
            let key = (crate::pod::namespace(&p).to_string(), crate::pod::name(&p).to_string());
            match seen.get(&key) {
                Some(_) => {
                    errors.insert(
                        format!("pod {}/{}", key.0, key.1),
                        "duplicate pod name in the static pod path; the later manifest is ignored".to_string(),
                    );
                }
                None => {
                    seen.insert(key, crate::pod::uid(&p).to_string());
                    unique.push(p);
                }
            }
        }
        Snapshot {
            source: "file",
            pods: unique,
            errors,
        }
    }

    /// Watch and re-list until the receiver goes away.
    pub async fn run(mut self, tx: mpsc::UnboundedSender<Snapshot>, every: Duration) {
        let mut watch = Watch::new(&self.path);
        let mut out = SnapshotSender::new(tx);
        loop {
            if !out.send(self.scan()) {
                return;
            }
            watch.next_change(every).await;
            if !watch.active() {
                watch = Watch::new(&self.path);
            }
        }
    }
}

/// inotify on the manifest directory (or the file's directory), tolerant of its absence.
struct Watch {
    stream: Option<inotify::EventStream<Vec<u8>>>,
}

impl Watch {
    fn new(path: &Path) -> Watch {
        let dir = if path.is_dir() {
            path.to_path_buf()
        } else {
            path.parent().map(Path::to_path_buf).unwrap_or_default()
        };
        let stream = (|| -> std::io::Result<_> {
            let ino = inotify::Inotify::init()?;
            use inotify::WatchMask as M;
            ino.watches().add(
                &dir,
                M::CREATE
                    | M::CLOSE_WRITE
                    | M::DELETE
                    | M::MOVED_FROM
                    | M::MOVED_TO
                    | M::DELETE_SELF
                    | M::MOVE_SELF
                    | M::ATTRIB,
            )?;
            ino.into_event_stream(vec![0u8; 4096])
        })();
        match stream {
            Ok(s) => {
                info!(dir = %dir.display(), "watching static pod path");
                Watch { stream: Some(s) }
            }
            Err(_) => Watch { stream: None },
        }
    }

    fn active(&self) -> bool {
        self.stream.is_some()
    }

    /// Return on the next change (debounced), or after `every`.
    async fn next_change(&mut self, every: Duration) {
        let Some(s) = self.stream.as_mut() else {
            tokio::time::sleep(every).await;
            return;
        };
        tokio::select! {
            ev = s.next() => {
                match ev {
                    Some(Ok(e)) if e.mask.contains(inotify::EventMask::DELETE_SELF) || e.mask.contains(inotify::EventMask::MOVE_SELF) || e.mask.contains(inotify::EventMask::IGNORED) => {
                        self.stream = None;
                    }
                    Some(Ok(_)) => {}
                    _ => self.stream = None,
                }
                // Let a burst of events (an editor's save, many files at once) settle.
                tokio::time::sleep(Duration::from_millis(30)).await;
                if let Some(s) = self.stream.as_mut() {
                    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(1), s.next()).await {}
                }
            }
            _ = tokio::time::sleep(every) => {}
        }
    }
}
