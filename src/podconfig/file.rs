//! The file source: every manifest in the static pod path (a directory, or one file). Changes
//! are seen at once through inotify and again at every fileCheckFrequency re-list. Files whose
//! name starts with a dot are ignored, as kubelet does; only regular files are read, at most
//! 10 MiB, off the async threads. A file that stops parsing keeps its last good pods running (an
//! editor's half-written save must not kill a pod) and is reported; a directory that cannot be
//! listed (out of descriptors, say) keeps every pod it had: an error never means "no pods".

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
    /// Tests make listing fail with this (root cannot be refused a directory listing here).
    #[cfg(test)]
    fail_listing: Option<std::io::ErrorKind>,
}

impl FileSource {
    pub fn new(path: PathBuf, node: String) -> FileSource {
        FileSource {
            path,
            node,
            last_good: HashMap::new(),
            missing_reported: false,
            #[cfg(test)]
            fail_listing: None,
        }
    }

    /// The manifests to read: the path itself when it is a file, else the directory's entries
    /// whose name does not start with a dot, in name order. A path that does not exist has no
    /// manifests (its pods go, as kubelet's); any other failure to look (EMFILE, EACCES...) is an
    /// error, and the caller keeps what it had.
    fn files(&mut self) -> std::io::Result<Vec<PathBuf>> {
        #[cfg(test)]
        if let Some(kind) = self.fail_listing {
            return Err(kind.into());
        }
        let md = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !self.missing_reported {
                    warn!(path = %self.path.display(), "static pod path does not exist; watching for it");
                    self.missing_reported = true;
                }
                return Ok(Vec::new());
            }
            Err(e) => return Err(e),
        };
        self.missing_reported = false;
        if !md.is_dir() {
            return Ok(vec![self.path.clone()]);
        }
        let mut v = Vec::new();
        for e in std::fs::read_dir(&self.path)? {
            let e = e?;
            if !e.file_name().to_string_lossy().starts_with('.') && !e.file_type()?.is_dir() {
                v.push(e.path());
            }
        }
        v.sort();
        Ok(v)
    }

    /// Read every manifest and produce the source's snapshot. A file that cannot be read or
    /// parsed keeps the pods it had; when the path itself cannot be listed, every file does.
    pub fn scan(&mut self) -> Snapshot {
        let mut errors = BTreeMap::new();
        let files = match self.files() {
            Ok(files) => files,
            Err(e) => {
                errors.insert(
                    self.path.display().to_string(),
                    format!("cannot list the static pod path: {e} (its pods keep running as they were)"),
                );
                let mut kept: Vec<PathBuf> = self.last_good.keys().cloned().collect();
                kept.sort();
                return self.assemble(kept, Vec::new(), errors);
            }
        };
        self.last_good.retain(|p, _| files.contains(p));
        let mut fresh = Vec::new();
        for f in &files {
            let loc = f.display().to_string();
            let (got, err) = match read_manifest(f) {
                Ok(data) => pods_from_manifest(&data, &Source::File(loc.clone()), &self.node),
                Err(e) => (Vec::new(), Some(e)),
            };
            match err {
                None => {
                    self.last_good.insert(f.clone(), got);
                }
                Some(e) => {
                    // Keep what this file ran before; run what of it is valid now.
                    let kept = self.last_good.contains_key(f);
                    errors.insert(
                        loc,
                        if kept {
                            format!("{e} (still running its last valid version)")
                        } else {
                            e
                        },
                    );
                    if !kept {
                        fresh.push((f.clone(), got));
                    }
                }
            }
        }
        self.assemble(files, fresh, errors)
    }

    /// The snapshot of `files` (in order): each file's last good pods, or what of it is valid
    /// now (`fresh`) when it never had good ones. Two manifests naming the same pod: the first
    /// (by file name) wins, as kubelet keeps the first it saw.
    fn assemble(
        &self,
        files: Vec<PathBuf>,
        fresh: Vec<(PathBuf, Vec<Arc<Pod>>)>,
        mut errors: BTreeMap<String, String>,
    ) -> Snapshot {
        let mut pods: Vec<Arc<Pod>> = Vec::new();
        for f in &files {
            match self.last_good.get(f) {
                Some(good) => pods.extend(good.iter().cloned()),
                None => pods.extend(
                    fresh
                        .iter()
                        .filter(|(p, _)| p == f)
                        .flat_map(|(_, g)| g.iter().cloned()),
                ),
            }
        }
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
    pub async fn run(self, tx: mpsc::UnboundedSender<Snapshot>, every: Duration) {
        let mut watch = Watch::new(&self.path);
        let mut out = SnapshotSender::new(tx);
        let mut source = self;
        loop {
            // Listing and reading files blocks (a slow disk, a hung mount): off the async threads.
            let scanned = crate::tasks::blocking(move || {
                let snap = source.scan();
                Ok((source, snap))
            })
            .await;
            let Ok((back, snap)) = scanned else {
                return;
            };
            source = back;
            if !out.send(snap) {
                return;
            }
            watch.next_change(every).await;
            if !watch.active() {
                watch = Watch::new(&source.path);
            }
        }
    }
}

/// A manifest's text. Only regular files are read (a symlink to a FIFO, a device or
/// /dev/zero is refused before a byte is read), opened without blocking on a FIFO swapped in,
/// and never more than [`MAX_MANIFEST`] bytes.
fn read_manifest(path: &Path) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("cannot read: {e}"))?;
    let md = f.metadata().map_err(|e| format!("cannot read: {e}"))?;
    if !md.is_file() {
        return Err("not a regular file; only regular files are read".into());
    }
    let mut data = Vec::new();
    f.take(MAX_MANIFEST + 1)
        .read_to_end(&mut data)
        .map_err(|e| format!("cannot read: {e}"))?;
    if data.len() as u64 > MAX_MANIFEST {
        return Err(format!("file is larger than {MAX_MANIFEST} bytes"));
    }
    String::from_utf8(data).map_err(|_| "not UTF-8 text".into())
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

/// The Secrets placed in the static pod path: what static pods' imagePullSecrets name (the
/// same objects their volumes and environment use, see [`static_objects`]).
pub fn static_secrets(path: &Path) -> Vec<k8s_openapi::api::core::v1::Secret> {
    static_objects(path).secrets
}

/// The ConfigMaps and Secrets placed in the static pod path (documents of `kind: ConfigMap` and
/// `kind: Secret` in its manifests, YAML or JSON, beside pods or in files of their own), for
/// the static pods of a node without an API server. Files that cannot be read or parsed are
/// skipped (the file source reports them); an object that does not decode is logged with its
/// file and left out (a pod naming it then reports it missing).
pub fn static_objects(path: &Path) -> StaticObjects {
    let files: Vec<PathBuf> = match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            let mut v: Vec<PathBuf> = std::fs::read_dir(path)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| e.path())
                .collect();
            v.sort();
            v
        }
        Ok(_) => vec![path.to_path_buf()],
        Err(_) => Vec::new(),
    };
    let mut out = StaticObjects::default();
    for f in files {
        let Ok(data) = read_manifest(&f) else { continue };
        let docs: Vec<serde_json::Value> = if data.trim_start().starts_with('{') {
            serde_json::Deserializer::from_str(&data)
                .into_iter::<serde_json::Value>()
                .filter_map(Result::ok)
                .collect()
        } else {
            serde_saphyr::from_multiple(&data).unwrap_or_default()
        };
        for d in docs {
            match d.get("kind").and_then(|k| k.as_str()) {
                Some("Secret") => match serde_json::from_value::<k8s_openapi::api::core::v1::Secret>(d) {
                    Ok(s) => out.secrets.push(s),
                    Err(e) => warn!(manifest = %f.display(), "a Secret in the static pod path is not valid: {e}"),
                },
                Some("ConfigMap") => match serde_json::from_value::<k8s_openapi::api::core::v1::ConfigMap>(d) {
                    Ok(c) => out.config_maps.push(c),
                    Err(e) => warn!(manifest = %f.display(), "a ConfigMap in the static pod path is not valid: {e}"),
                },
                _ => {}
            }
        }
    }
    out
}

/// What [`static_objects`] found, in file order.
#[derive(Debug, Default, Clone)]
pub struct StaticObjects {
    pub config_maps: Vec<k8s_openapi::api::core::v1::ConfigMap>,
    pub secrets: Vec<k8s_openapi::api::core::v1::Secret>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: NAME}\nspec:\n  containers: [{name: c, image: x}]\n";

    fn names(s: &Snapshot) -> Vec<String> {
        s.pods.iter().map(|p| crate::pod::name(p).to_string()).collect()
    }

    #[test]
    fn special_files_are_refused_without_reading_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        let fifo = dir.path().join(".fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        std::os::unix::fs::symlink(&fifo, dir.path().join("fifo.yaml")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.yaml")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = dir.path().to_path_buf();
        // Before: reading the FIFO hung forever and /dev/zero grew without bound.
        std::thread::spawn(move || {
            let _ = tx.send(FileSource::new(path, "n".into()).scan());
        });
        let snap = rx.recv_timeout(Duration::from_secs(10)).expect("the scan hung");
        assert_eq!(names(&snap), ["a-n"]);
        for f in ["fifo.yaml", "zero.yaml"] {
            let e = &snap.errors[&dir.path().join(f).display().to_string()];
            assert!(e.contains("not a regular file"), "{f}: {e}");
        }
    }

    #[test]
    fn a_directory_that_cannot_be_listed_keeps_its_pods() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        std::fs::write(dir.path().join("b.yaml"), POD.replace("NAME", "b")).unwrap();
        let mut src = FileSource::new(dir.path().to_path_buf(), "n".into());
        assert_eq!(names(&src.scan()), ["a-n", "b-n"]);
        // Out of descriptors: before, this was an empty list and every pod was deleted.
        src.fail_listing = Some(std::io::ErrorKind::Other);
        let snap = src.scan();
        assert_eq!(names(&snap), ["a-n", "b-n"]);
        assert!(snap.errors[&dir.path().display().to_string()].contains("cannot list"));
        // A path that is gone is different: its pods go, as kubelet's do.
        src.fail_listing = None;
        drop(dir);
        assert!(src.scan().pods.is_empty());
    }

    #[test]
    fn oversized_manifests_are_not_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.yaml");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_MANIFEST + 1).unwrap();
        let e = read_manifest(&big).unwrap_err();
        assert!(e.contains("larger than"), "{e}");
    }

    #[test]
    fn secrets_beside_the_manifests_serve_static_pods() {
        let dir = tempfile::tempdir().unwrap();
        let secret = "apiVersion: v1\nkind: Secret\nmetadata: {name: regcred}\ntype: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{\"auths\":{}}'\n";
        std::fs::write(
            dir.path().join("p.yaml"),
            format!("{}---\n{secret}", POD.replace("NAME", "p")),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("s.json"),
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"other","namespace":"kube-system"},"data":{".dockercfg":"e30="}}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), secret.replace("regcred", "hidden")).unwrap();
        let mut found: Vec<(String, String)> = static_secrets(dir.path())
            .into_iter()
            .map(|s| {
                (
                    s.metadata.namespace.unwrap_or_default(),
                    s.metadata.name.unwrap_or_default(),
                )
            })
            .collect();
        found.sort();
        assert_eq!(
            found,
            [
                ("".to_string(), "regcred".to_string()),
                ("kube-system".into(), "other".into())
            ]
        );
        // The Secret is not a pod and not an error of the manifest.
        let snap = FileSource::new(dir.path().to_path_buf(), "n".into()).scan();
        assert_eq!(names(&snap), ["p-n"]);
        assert!(snap.errors.is_empty(), "{:?}", snap.errors);
    }
}
