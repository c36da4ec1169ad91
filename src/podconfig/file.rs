//! The file source: every manifest in the static pod path (a directory, or one file). Changes
//! are seen at once through inotify and again at every fileCheckFrequency re-list. Files whose
//! name starts with a dot are ignored, as kubelet does; only regular files are read, at most
//! 10 MiB, off the async threads. A file that stops parsing keeps its last good pods running (an
//! editor's half-written save must not kill a pod) and is reported; a directory that cannot be
//! listed (out of descriptors, say) keeps every pod it had: an error never means "no pods".
//!
//! A change is acted on at once and only the files it names are read again: the directory is
//! listed (cheap) but a file whose identity ([`FileKey`]) is unchanged keeps what it parsed to,
//! so a pod's start does not cost a parse of every other manifest on the node (nor of the ones
//! written in the last second, which only a re-list distrusts, see [`FileSource::reported`]). A regular file
//! just created is not taken until its writer closes it (IN_CLOSE_WRITE); a file renamed in
//! (IN_MOVED_TO) is taken at once. The periodic re-list is the safety net for whatever inotify
//! cannot see: it reads again every file whose identity changed or was stamped within
//! [`RACY`] of its last read, and, every [`FULL_RELIST_EVERY`], every file (docs/start-path.md).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::{FutureExt, StreamExt};
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
    /// What each file parsed to when last read, and the identity it had then.
    parsed: HashMap<PathBuf, Parsed>,
    /// Files created and not closed yet by their writer: not taken until they are.
    writing: HashSet<PathBuf>,
    /// When inotify reported the change this scan is for (for the start phases).
    event_at: Option<SystemTime>,
    /// This scan follows inotify's report of what changed since the files were read: a later
    /// write to a file would have been reported too, so an unchanged identity is trusted even
    /// when the file was written within [`RACY`] of its read. False for the first scan and
    /// after a re-list.
    reported: bool,
    /// When every file was last read regardless of its identity (the first scan reads them all).
    last_full_read: SystemTime,
    missing_reported: bool,
    /// Tests make listing fail with this (root cannot be refused a directory listing here).
    #[cfg(test)]
    fail_listing: Option<std::io::ErrorKind>,
    /// Manifests read so far (tests count them).
    #[cfg(test)]
    reads: usize,
}

impl FileSource {
    pub fn new(path: PathBuf, node: String) -> FileSource {
        FileSource {
            path,
            node,
            last_good: HashMap::new(),
            parsed: HashMap::new(),
            writing: HashSet::new(),
            event_at: None,
            reported: false,
            last_full_read: SystemTime::now(),
            missing_reported: false,
            #[cfg(test)]
            fail_listing: None,
            #[cfg(test)]
            reads: 0,
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
        // A file its writer has not closed yet is not there as far as pods go.
        let files: Vec<PathBuf> = files.into_iter().filter(|f| !self.writing.contains(f)).collect();
        let listed: HashSet<&PathBuf> = files.iter().collect();
        self.last_good.retain(|p, _| listed.contains(p));
        self.parsed.retain(|p, _| listed.contains(p));
        let mut fresh = Vec::new();
        for f in &files {
            let loc = f.display().to_string();
            let key = FileKey::of_path(f);
            let (got, err) = match self.parsed.get(f) {
                Some(p) if key.is_some_and(|k| k == p.key && (self.reported || p.still_valid(&k))) => {
                    (p.pods.clone(), p.error.clone())
                }
                _ => {
                    let read_at = SystemTime::now();
                    #[cfg(test)]
                    {
                        self.reads += 1;
                    }
                    let (got, err) = match read_manifest(f) {
                        Ok(data) => pods_from_manifest(&data, &Source::File(loc.clone()), &self.node),
                        Err(e) => (Vec::new(), Some(e)),
                    };
                    if let Some(at) = self.event_at.filter(|_| crate::metrics::start_phases_enabled()) {
                        for p in &got {
                            crate::metrics::start_phase_at(crate::pod::name(p), "inotify", at);
                            crate::metrics::start_phase(crate::pod::name(p), "parsed");
                        }
                    }
                    match key {
                        Some(key) => {
                            self.parsed.insert(
                                f.clone(),
                                Parsed {
                                    key,
                                    read_at,
                                    pods: got.clone(),
                                    error: err.clone(),
                                },
                            );
                        }
                        None => {
                            self.parsed.remove(f);
                        }
                    }
                    (got, err)
                }
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
            match watch.next_change(every).await {
                Change::Files(changed) => {
                    source.event_at = Some(SystemTime::now());
                    source.changed(changed);
                }
                Change::All => {
                    source.event_at = None;
                    source.forget();
                }
            }
            if !watch.active() {
                watch = Watch::new(&source.path);
            }
        }
    }

    /// inotify named these files: they are read again at the next scan (a regular file just
    /// created waits for its writer to close it).
    fn changed(&mut self, changed: Vec<(PathBuf, FileEvent)>) {
        self.reported = true;
        for (path, ev) in changed {
            self.parsed.remove(&path);
            match ev {
                FileEvent::Created => {
                    // `open(O_CREAT)`: being written. A symlink, a hard link, a FIFO... is
                    // complete as it appears (no IN_CLOSE_WRITE will come for it).
                    let being_written = std::fs::symlink_metadata(&path).is_ok_and(|m| {
                        use std::os::unix::fs::MetadataExt;
                        m.file_type().is_file() && m.nlink() == 1
                    });
                    if being_written {
                        self.writing.insert(path);
                    }
                }
                FileEvent::Done | FileEvent::Gone => {
                    self.writing.remove(&path);
                }
            }
        }
    }

    /// The periodic re-list (or a watch that lost events). Without inotify's word, a file is
    /// read again when its identity changed or is too recent to tell ([`Parsed::still_valid`]);
    /// with 100 manifests, parsing them all at every fileCheckFrequency was a tenth of an idle
    /// agent's CPU. Every [`FULL_RELIST_EVERY`] every file is read, as kubelet reads them at
    /// every re-list: the net under a file system whose timestamps do not follow its content.
    fn forget(&mut self) {
        self.reported = false;
        self.writing.clear();
        let now = SystemTime::now();
        // A clock set back makes it due too.
        if now.duration_since(self.last_full_read).unwrap_or(Duration::MAX) >= FULL_RELIST_EVERY {
            self.parsed.clear();
            self.last_full_read = now;
        }
    }
}

/// What a file parsed to when it was last read.
struct Parsed {
    key: FileKey,
    read_at: SystemTime,
    pods: Vec<Arc<Pod>>,
    error: Option<String>,
}

impl Parsed {
    /// Unchanged since it was read: same identity, and not changed so close to the read that a
    /// later write could carry the same timestamps (file systems stamp with a coarse clock; a
    /// second covers the coarsest).
    fn still_valid(&self, now: &FileKey) -> bool {
        *now == self.key && now.changed_before(self.read_at - RACY)
    }
}

/// How close to a read a file's timestamps make its cached parse untrustworthy.
const RACY: Duration = Duration::from_secs(1);

/// How often a re-list reads every manifest whatever its identity says.
const FULL_RELIST_EVERY: Duration = Duration::from_secs(10 * 60);

/// A file's identity for "has it changed": any write changes its ctime and mtime, a rename
/// over it its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileKey {
    /// The key of what `path` names (symlinks followed), or None when it cannot be looked at.
    pub(crate) fn of_path(path: &Path) -> Option<FileKey> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileKey {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// Both timestamps are before `t`.
    fn changed_before(&self, t: SystemTime) -> bool {
        let Ok(t) = t.duration_since(SystemTime::UNIX_EPOCH) else {
            return false;
        };
        let t = (t.as_secs() as i64, t.subsec_nanos() as i64);
        self.mtime < t && self.ctime < t
    }
}

/// What inotify said of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileEvent {
    /// IN_CREATE.
    Created,
    /// IN_CLOSE_WRITE, IN_MOVED_TO, IN_ATTRIB: complete as it is now.
    Done,
    /// IN_DELETE, IN_MOVED_FROM.
    Gone,
}

/// What [`Watch::next_change`] saw.
enum Change {
    /// These files changed (possibly several times; the last event of each counts).
    Files(Vec<(PathBuf, FileEvent)>),
    /// Read everything: the periodic re-list, or the watch lost events or ended.
    All,
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
    dir: PathBuf,
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
                Watch { dir, stream: Some(s) }
            }
            Err(_) => Watch { dir, stream: None },
        }
    }

    fn active(&self) -> bool {
        self.stream.is_some()
    }

    /// Wait for the next change, or `every`. A change is returned at once, with whatever other
    /// events are already queued; only when all it saw are creations of files still being
    /// written does it wait (for their IN_CLOSE_WRITE, up to [`SETTLE`]).
    async fn next_change(&mut self, every: Duration) -> Change {
        let Some(s) = self.stream.as_mut() else {
            tokio::time::sleep(every).await;
            return Change::All;
        };
        let mut seen: Vec<(PathBuf, FileEvent)> = Vec::new();
        let first = tokio::select! {
            ev = s.next() => ev,
            _ = tokio::time::sleep(every) => return Change::All,
        };
        let mut lost = self.take(first, &mut seen);
        // What is queued already comes along, without waiting.
        while !lost {
            let Some(s) = self.stream.as_mut() else { break };
            match s.next().now_or_never() {
                Some(ev) => lost = self.take(ev, &mut seen),
                None => break,
            }
        }
        if !lost && !seen.is_empty() && seen.iter().all(|(_, e)| *e == FileEvent::Created) {
            let deadline = tokio::time::Instant::now() + SETTLE;
            while !lost && seen.iter().any(|(_, e)| *e == FileEvent::Created) {
                let Some(s) = self.stream.as_mut() else { break };
                match tokio::time::timeout_at(deadline, s.next()).await {
                    Ok(ev) => lost = self.take(ev, &mut seen),
                    Err(_) => break,
                }
            }
        }
        if lost {
            return Change::All;
        }
        Change::Files(seen)
    }

    /// Note one event in `seen`; true when the watch lost events or ended (read everything).
    fn take(&mut self, ev: Option<std::io::Result<inotify::EventOwned>>, seen: &mut Vec<(PathBuf, FileEvent)>) -> bool {
        use inotify::EventMask as E;
        let e = match ev {
            Some(Ok(e)) => e,
            _ => {
                self.stream = None;
                return true;
            }
        };
        if e.mask.intersects(E::DELETE_SELF | E::MOVE_SELF | E::IGNORED) {
            self.stream = None;
            return true;
        }
        if e.mask.contains(E::Q_OVERFLOW) {
            return true;
        }
        let Some(name) = e.name else { return false };
        let what = if e.mask.contains(E::CREATE) {
            FileEvent::Created
        } else if e.mask.intersects(E::DELETE | E::MOVED_FROM) {
            FileEvent::Gone
        } else {
            FileEvent::Done
        };
        let path = self.dir.join(name);
        seen.retain(|(p, _)| *p != path);
        seen.push((path, what));
        false
    }
}

/// How long a burst of only creations waits for the files' writers to close them.
const SETTLE: Duration = Duration::from_millis(30);

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
    for f in &files {
        for d in object_documents(f) {
            match d.get("kind").and_then(|k| k.as_str()) {
                Some("Secret") => match ferrolet_fsutil::json::decode_value::<k8s_openapi::api::core::v1::Secret>(&d) {
                    Ok(s) => out.secrets.push(s),
                    Err(e) => warn!(manifest = %f.display(), "a Secret in the static pod path is not valid: {e}"),
                },
                Some("ConfigMap") => {
                    match ferrolet_fsutil::json::decode_value::<k8s_openapi::api::core::v1::ConfigMap>(&d) {
                        Ok(c) => out.config_maps.push(c),
                        Err(e) => {
                            warn!(manifest = %f.display(), "a ConfigMap in the static pod path is not valid: {e}")
                        }
                    }
                }
                _ => {}
            }
        }
    }
    // Files gone from the path leave the cache.
    let listed: HashSet<&PathBuf> = files.iter().collect();
    OBJECT_DOCUMENTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|p, _| !p.starts_with(path) || listed.contains(p));
    out
}

/// The Secret and ConfigMap documents of each manifest read, by file: a pod's volumes and env
/// are looked up at every sync and container start, and parsing every manifest of the node
/// each time made a pod's start cost O(pods) (docs/start-path.md). A file is parsed again when
/// its identity changed, or changed too close to the last read to tell ([`Parsed::still_valid`]).
#[allow(clippy::type_complexity)]
static OBJECT_DOCUMENTS: std::sync::LazyLock<
    Mutex<HashMap<PathBuf, (FileKey, SystemTime, Arc<Vec<serde_json::Value>>)>>,
> = std::sync::LazyLock::new(|| Mutex::new(HashMap::new()));

/// The `kind: Secret` and `kind: ConfigMap` documents of manifest `f` (none when it cannot be
/// read or parsed).
fn object_documents(f: &Path) -> Vec<serde_json::Value> {
    let key = FileKey::of_path(f);
    if let Some(key) = key {
        let cache = OBJECT_DOCUMENTS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((k, read_at, docs)) = cache.get(f) {
            if *k == key && key.changed_before(*read_at - RACY) {
                return docs.as_ref().clone();
            }
        }
    }
    let read_at = SystemTime::now();
    let Ok(data) = read_manifest(f) else {
        OBJECT_DOCUMENTS.lock().unwrap_or_else(|e| e.into_inner()).remove(f);
        return Vec::new();
    };
    let docs: Vec<serde_json::Value> = if data.trim_start().starts_with('{') {
        serde_json::Deserializer::from_str(&data)
            .into_iter::<serde_json::Value>()
            .filter_map(Result::ok)
            .collect()
    } else {
        serde_saphyr::from_multiple(&data).unwrap_or_default()
    };
    let docs: Vec<serde_json::Value> = docs
        .into_iter()
        .filter(|d| matches!(d.get("kind").and_then(|k| k.as_str()), Some("Secret" | "ConfigMap")))
        .collect();
    let mut cache = OBJECT_DOCUMENTS.lock().unwrap_or_else(|e| e.into_inner());
    match key {
        Some(key) => {
            cache.insert(f.to_path_buf(), (key, read_at, Arc::new(docs.clone())));
        }
        None => {
            cache.remove(f);
        }
    }
    docs
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
    fn only_changed_files_are_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.yaml");
        std::fs::write(&a, POD.replace("NAME", "a")).unwrap();
        std::fs::write(dir.path().join("b.yaml"), POD.replace("NAME", "b")).unwrap();
        // Files changed within RACY of a read are read again whatever their identity says.
        std::thread::sleep(RACY + Duration::from_millis(100));
        let mut src = FileSource::new(dir.path().to_path_buf(), "n".into());
        assert_eq!(names(&src.scan()), ["a-n", "b-n"]);
        assert_eq!(src.reads, 2);
        assert_eq!(names(&src.scan()), ["a-n", "b-n"]);
        assert_eq!(src.reads, 2, "unchanged files were parsed again");
        // inotify named a.yaml: it alone is read.
        src.changed(vec![(a.clone(), FileEvent::Done)]);
        assert_eq!(names(&src.scan()), ["a-n", "b-n"]);
        assert_eq!(src.reads, 3);
        // A change inotify did not report shows in the file's identity.
        std::fs::write(&a, POD.replace("NAME", "c")).unwrap();
        assert_eq!(names(&src.scan()), ["c-n", "b-n"]);
        assert_eq!(src.reads, 4);
        // The periodic re-list reads what it cannot trust: a.yaml, written just now.
        src.forget();
        src.scan();
        assert_eq!(src.reads, 5);
        std::thread::sleep(RACY + Duration::from_millis(100));
        src.forget();
        src.scan();
        assert_eq!(src.reads, 6);
        src.forget();
        assert_eq!(names(&src.scan()), ["c-n", "b-n"]);
        assert_eq!(src.reads, 6, "a re-list parsed unchanged files again");
        // Once every FULL_RELIST_EVERY, a re-list reads every file.
        src.last_full_read = SystemTime::now() - FULL_RELIST_EVERY;
        src.forget();
        assert_eq!(names(&src.scan()), ["c-n", "b-n"]);
        assert_eq!(src.reads, 8);
        src.forget();
        src.scan();
        assert_eq!(src.reads, 8);
        // Removed files remove their pods.
        std::fs::remove_file(&a).unwrap();
        src.changed(vec![(a, FileEvent::Gone)]);
        assert_eq!(names(&src.scan()), ["b-n"]);
    }

    #[test]
    fn recent_files_inotify_did_not_name_are_not_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.yaml");
        std::fs::write(&a, POD.replace("NAME", "a")).unwrap();
        std::fs::write(dir.path().join("b.yaml"), POD.replace("NAME", "b")).unwrap();
        let mut src = FileSource::new(dir.path().to_path_buf(), "n".into());
        assert_eq!(names(&src.scan()), ["a-n", "b-n"]);
        assert_eq!(src.reads, 2);
        // Written within RACY of their read: without inotify's word, their identity could hide
        // a later write, and both are read again.
        src.scan();
        assert_eq!(src.reads, 4);
        // After inotify's report, a later write would have been named: a.yaml alone is read,
        // and b.yaml, however recent, is not.
        src.changed(vec![(a.clone(), FileEvent::Done)]);
        assert_eq!(names(&src.scan()), ["a-n", "b-n"]);
        assert_eq!(src.reads, 5);
        // A change whose report has not come yet shows in the file's identity.
        std::fs::write(&a, POD.replace("NAME", "longer")).unwrap();
        assert_eq!(names(&src.scan()), ["longer-n", "b-n"]);
        assert_eq!(src.reads, 6);
        // The re-list trusts no identity stamped within RACY of its read.
        src.forget();
        src.scan();
        assert_eq!(src.reads, 8);
        src.scan();
        assert_eq!(src.reads, 10);
    }

    #[test]
    fn a_file_being_written_is_taken_once_closed() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path().join("c.yaml");
        let mut f = std::fs::File::create(&c).unwrap();
        let full = POD.replace("NAME", "c");
        // Half of it: a valid pod already, with the rest of the manifest still to come.
        f.write_all(&full.as_bytes()[..full.len() - 10]).unwrap();
        let mut src = FileSource::new(dir.path().to_path_buf(), "n".into());
        src.changed(vec![(c.clone(), FileEvent::Created)]);
        let snap = src.scan();
        assert!(snap.pods.is_empty() && snap.errors.is_empty(), "{snap:?}");
        f.write_all(&full.as_bytes()[full.len() - 10..]).unwrap();
        drop(f);
        src.changed(vec![(c.clone(), FileEvent::Done)]);
        assert_eq!(names(&src.scan()), ["c-n"]);
        // A symlink is complete as it appears: no IN_CLOSE_WRITE comes for it.
        let l = dir.path().join("l.yaml");
        let target = dir.path().join(".target");
        std::fs::write(&target, POD.replace("NAME", "l")).unwrap();
        std::os::unix::fs::symlink(&target, &l).unwrap();
        src.changed(vec![(l, FileEvent::Created)]);
        assert_eq!(names(&src.scan()), ["c-n", "l-n"]);
    }

    #[tokio::test]
    async fn a_manifest_renamed_in_is_reported_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Watch::new(dir.path());
        assert!(w.active());
        let tmp = dir.path().join(".p.tmp");
        std::fs::write(&tmp, POD.replace("NAME", "p")).unwrap();
        let p = dir.path().join("p.yaml");
        std::fs::rename(&tmp, &p).unwrap();
        let Change::Files(files) = w.next_change(Duration::from_secs(30)).await else {
            panic!("a full re-list instead of the file");
        };
        assert!(files.contains(&(p, FileEvent::Done)), "{files:?}");
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
