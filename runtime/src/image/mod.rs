//! The image store of an air-gapped node: content-addressed blobs (verified on import), an index
//! of images by reference and id, and layers unpacked once and shared by every image that has
//! them. Layout under `<root>/images`:
//!
//! ```text
//! blobs/sha256/<hex>     every manifest, config and layer blob, named by its digest
//! layers/<diff_id hex>/  a layer unpacked for overlayfs (whiteouts converted)
//! index.json             the images: id (config digest), manifest, refs, layers
//! .lock                  flock held by writers (the agent and `ferrolet images` may race)
//! ```

mod import;
pub mod layer;
pub mod reference;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use oci_spec::image::ImageConfiguration;
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::{p, Context, Error, Result};
use ferrolet_fsutil::{ensure_dir, ensure_private_dir, read_json, read_json_opt, remove_tree, write_json_atomic};
pub use reference::Reference;

/// How close two uses of an image may be for the second not to be recorded (see
/// [`ImageStore::mark_used`]).
pub(crate) const LAST_USED_GRANULARITY: chrono::Duration = chrono::Duration::seconds(60);

/// One image as the index records it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageRecord {
    /// The config digest: what `docker images` calls the image id.
    pub id: Digest,
    /// Digest of the manifest the image was imported from.
    pub manifest: Digest,
    /// Normalized references (`docker.io/library/busybox:1.35`) pointing at this image.
    pub refs: Vec<String>,
    pub layers: Vec<LayerRecord>,
    /// Bytes of the blobs as stored (config + compressed layers).
    pub size: u64,
    pub imported_at: String,
    /// When a container was last created from the image (RFC 3339), for image garbage
    /// collection's least-recently-used order; `None` until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LayerRecord {
    /// Digest of the blob as stored (compressed or not).
    pub digest: Digest,
    /// Digest of the uncompressed tar: names the unpacked directory.
    pub diff_id: Digest,
    pub size: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Index {
    images: Vec<ImageRecord>,
}

/// What a container needs from its image.
#[derive(Debug, Clone)]
pub struct Image {
    pub record: ImageRecord,
    pub config: ImageConfiguration,
    /// Unpacked layer directories, bottom layer first.
    pub layer_dirs: Vec<PathBuf>,
}

impl Image {
    /// The name a pod status shows as `imageID`: `repo@manifest-digest` when the image has a
    /// name, else the id.
    pub fn image_id(&self) -> String {
        match self.record.refs.first() {
            Some(r) => {
                let repo = Reference::parse(r).map(|r| r.repository).unwrap_or_else(|_| r.clone());
                format!("{repo}@{}", self.record.manifest)
            }
            None => self.record.id.to_string(),
        }
    }
}

pub struct ImageStore {
    dir: PathBuf,
    lock: Mutex<()>,
    limits: layer::LayerLimits,
    /// Blobs a pull in this process has stored but not yet recorded: garbage collection
    /// leaves them alone (by hex, with a count per pull).
    pins: Mutex<HashMap<String, usize>>,
}

/// An image a pull fetched: its blobs are in the store, or its layers already unpacked.
#[derive(Debug, Clone)]
pub(crate) struct PulledImage {
    /// Normalized reference as pulled (`docker.io/library/busybox:1.35`, or `repo@digest`).
    pub reference: String,
    /// Digest of what the reference resolved to: the index for a multi-platform image (as
    /// containerd records it, so `repo@digest` is what the registry serves), else the manifest.
    pub manifest: Digest,
    pub config: Digest,
    /// Layer blobs, bottom first, with their sizes as the manifest gives them.
    pub layers: Vec<(Digest, u64)>,
}

/// A step of recording a pulled image, for progress reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LayerStep {
    /// The layer is being unpacked.
    Extracting,
    /// The layer is unpacked (now or before).
    Done,
}

/// How long a partial download may wait to be resumed before the store is opened and it
/// is removed.
const PARTIAL_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// A held store lock: in-process mutex plus an flock on `.lock` against other processes.
struct StoreLock<'a> {
    _guard: std::sync::MutexGuard<'a, ()>,
    _file: nix::fcntl::Flock<fs::File>,
}

impl ImageStore {
    /// Open (creating if needed) the store under `dir` (normally `<root>/images`). Its `blobs`
    /// and `layers` directories are made private (0700): unpacked layers hold device nodes
    /// and setuid files of whoever made the image, which no other user of the host may reach.
    /// `dir` itself keeps its mode: the agent's import directory may live in it.
    pub fn open(dir: impl Into<PathBuf>) -> Result<ImageStore> {
        let dir = dir.into();
        for sub in ["blobs", "layers"] {
            ensure_private_dir(&dir.join(sub))?;
        }
        for sub in ["blobs/sha256", "blobs/.tmp", "blobs/.partial"] {
            ensure_dir(&dir.join(sub))?;
        }
        let store = ImageStore {
            dir,
            lock: Mutex::new(()),
            limits: layer::LayerLimits::default(),
            pins: Mutex::new(HashMap::new()),
        };
        // Leftovers of an import that was killed half way.
        let _l = store.lock()?;
        for sub in ["blobs/.tmp", "layers"] {
            if let Ok(rd) = fs::read_dir(store.dir.join(sub)) {
                for e in rd.flatten() {
                    if e.file_name().to_string_lossy().starts_with(".tmp") || sub == "blobs/.tmp" {
                        let _ =
                            remove_tree(&e.path()).or_else(|_| fs::remove_file(e.path()).context("removing temp file"));
                    }
                }
            }
        }
        // Partial downloads are kept for a later pull to resume, but not for ever, and never
        // one larger than a layer may be (left by an older version, or the limit lowered).
        if let Ok(rd) = fs::read_dir(store.partial_dir()) {
            for e in rd.flatten() {
                let md = e.metadata().ok();
                let old = md
                    .as_ref()
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > PARTIAL_MAX_AGE);
                let over = md.is_some_and(|m| m.len() > store.limits.max_bytes);
                if old || over {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        drop(_l);
        Ok(store)
    }

    /// Where pulls keep blobs being downloaded (`<hex>`), to resume them with a range
    /// request after an interruption; left alone by [`open`](Self::open) for a day.
    pub fn partial_dir(&self) -> PathBuf {
        self.dir.join("blobs/.partial")
    }

    /// Keep `d` from garbage collection in this process until [`unpin_blob`](Self::unpin_blob).
    pub fn pin_blob(&self, d: &Digest) {
        *self
            .pins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(d.hex().to_string())
            .or_default() += 1;
    }

    pub fn unpin_blob(&self, d: &Digest) {
        let mut pins = self.pins.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = pins.get_mut(d.hex()) {
            *n -= 1;
            if *n == 0 {
                pins.remove(d.hex());
            }
        }
    }

    /// Record that a container was created from image `id` now (`last_used`). Within
    /// [`LAST_USED_GRANULARITY`] of the recorded use the index is left as it is: it is rewritten
    /// (and fsynced) whole, on a container's start path, and image GC, which orders by last use
    /// and keeps every image a container uses anyway, works in minutes.
    pub fn mark_used(&self, id: &Digest) -> Result<()> {
        let _l = self.lock()?;
        let mut index = self.read_index()?;
        let img = index
            .images
            .iter_mut()
            .find(|i| &i.id == id)
            .ok_or_else(|| Error::ImageNotFound(id.to_string()))?;
        let now = chrono::Utc::now();
        let recent = img
            .last_used
            .as_deref()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .is_some_and(|t| (now - t.with_timezone(&chrono::Utc)).abs() < LAST_USED_GRANULARITY);
        if recent {
            return Ok(());
        }
        img.last_used = Some(now.to_rfc3339());
        self.write_index(&index)
    }

    /// Record an image whose blobs a pull put into the store: the config is read and its
    /// diff_ids checked against the layers, each layer unpacked unless it is already
    /// (`on_layer` hears of it), and the image written into the index under the store lock,
    /// the reference moved to it from any other image. Layers unpacked here are removed
    /// again when it fails.
    pub(crate) fn record_pulled(
        &self,
        img: &PulledImage,
        on_layer: &mut dyn FnMut(&Digest, LayerStep),
    ) -> Result<ImageRecord> {
        let _l = self.lock()?;
        let found = import::FoundImage {
            config: img.config.clone(),
            manifest: img.manifest.clone(),
            layers: img.layers.iter().map(|(d, _)| d.clone()).collect(),
            layer_sizes: img.layers.iter().map(|(_, s)| *s).collect(),
            refs: vec![img.reference.clone()],
        };
        let mut index = self.read_index()?;
        let mut added = Vec::new();
        let res = self.add_image_locked(
            &mut index,
            &found,
            &format!("pulled as {}", img.reference),
            &mut added,
            on_layer,
        );
        let res = res.and_then(|r| {
            self.write_index(&index)?;
            Ok(r)
        });
        if res.is_err() {
            for d in &added {
                let _ = remove_tree(&self.layer_dir(d));
            }
        }
        res
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How far layers imported from now on may expand ([`layer::LayerLimits::default`] until
    /// set).
    pub fn set_layer_limits(&mut self, limits: layer::LayerLimits) {
        self.limits = limits;
    }

    pub(crate) fn layer_limits(&self) -> layer::LayerLimits {
        self.limits
    }

    fn lock(&self) -> Result<StoreLock<'_>> {
        let guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let path = self.dir.join(".lock");
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", p(&path)))?;
        let file = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .with_context(|| format!("locking {}", p(&path)))?;
        Ok(StoreLock {
            _guard: guard,
            _file: file,
        })
    }

    fn index_path(&self) -> PathBuf {
        self.dir.join("index.json")
    }

    fn read_index(&self) -> Result<Index> {
        Ok(read_json_opt(&self.index_path())?.unwrap_or_default())
    }

    fn write_index(&self, index: &Index) -> Result<()> {
        Ok(write_json_atomic(&self.index_path(), index)?)
    }

    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.dir.join("blobs/sha256").join(d.hex())
    }

    pub(crate) fn layer_dir(&self, diff_id: &Digest) -> PathBuf {
        self.dir.join("layers").join(diff_id.hex())
    }

    /// All images, newest import first.
    pub fn list(&self) -> Result<Vec<ImageRecord>> {
        let mut v = self.read_index()?.images;
        v.sort_by(|a, b| b.imported_at.cmp(&a.imported_at));
        Ok(v)
    }

    /// Find an image by reference (`busybox`, `docker.io/library/busybox:1.35`), by id
    /// (`sha256:...` or a unique hex prefix of at least 12) or by `repo@manifest-digest`.
    pub fn find(&self, reference: &str) -> Result<ImageRecord> {
        let index = self.read_index()?;
        find_in(&index, reference)
            .cloned()
            .ok_or_else(|| Error::ImageNotFound(reference.to_string()))
    }

    /// Resolve a reference to an image with its config and layer directories.
    pub fn resolve(&self, reference: &str) -> Result<Image> {
        let record = self.find(reference)?;
        let config: ImageConfiguration = read_json(&self.blob_path(&record.id))?;
        let layer_dirs = record
            .layers
            .iter()
            .map(|l| self.layer_dir(&l.diff_id))
            .collect::<Vec<_>>();
        for d in &layer_dirs {
            if !d.is_dir() {
                return Err(Error::invalid_image(
                    &record.id.to_string(),
                    format!("layer directory {} is missing; re-import the image", p(d)),
                ));
            }
        }
        Ok(Image {
            record,
            config,
            layer_dirs,
        })
    }

    /// Import every image in an OCI image layout or a `docker save` archive (a directory or a
    /// tar, optionally compressed). Returns the images imported. All or nothing: when the
    /// import fails, the blobs and layers it added are removed again; when it succeeds, so
    /// are the blobs it added that no image refers to.
    pub fn import(&self, path: &Path) -> Result<Vec<ImageRecord>> {
        let _l = self.lock()?;
        let mut added = Added::default();
        let res = self.import_locked(path, &mut added);
        let keep: std::collections::HashSet<&Digest> = match &res {
            Ok(records) => records
                .iter()
                .flat_map(|r| {
                    [&r.id, &r.manifest]
                        .into_iter()
                        .chain(r.layers.iter().map(|l| &l.digest))
                })
                .collect(),
            Err(_) => Default::default(),
        };
        for d in added.blobs.iter().filter(|d| !keep.contains(d)) {
            let _ = fs::remove_file(self.blob_path(d));
        }
        if res.is_err() {
            for d in &added.layers {
                let _ = remove_tree(&self.layer_dir(d));
            }
        }
        res
    }

    fn import_locked(&self, path: &Path, added: &mut Added) -> Result<Vec<ImageRecord>> {
        let found = import::read_archive(self, path, &mut added.blobs)?;
        let origin = format!("in {}", p(path));
        let mut index = self.read_index()?;
        let mut out: Vec<ImageRecord> = Vec::new();
        for img in found {
            let record = self.add_image_locked(&mut index, &img, &origin, &mut added.layers, &mut |_, _| {})?;
            out.retain(|o| o.id != record.id);
            out.push(record);
        }
        self.write_index(&index)?;
        Ok(out)
    }

    /// Add one image whose blobs are in the store to `index`: config read, diff_ids checked
    /// against the layers, layers unpacked (`added` gets those unpacked now), the references
    /// taken from any other image. Returns the image as recorded.
    fn add_image_locked(
        &self,
        index: &mut Index,
        img: &import::FoundImage,
        origin: &str,
        added: &mut Vec<Digest>,
        on_layer: &mut dyn FnMut(&Digest, LayerStep),
    ) -> Result<ImageRecord> {
        let config_size = fs::metadata(self.blob_path(&img.config)).map(|m| m.len()).unwrap_or(0);
        if config_size > import::MAX_META {
            return Err(Error::invalid_image(
                origin,
                format!("config {} is too large ({config_size} bytes)", img.config),
            ));
        }
        let config: ImageConfiguration = read_json(&self.blob_path(&img.config))?;
        let diff_ids = config.rootfs().diff_ids();
        if diff_ids.len() != img.layers.len() {
            return Err(Error::invalid_image(
                origin,
                format!(
                    "image {}: config lists {} diff_ids but the manifest has {} layers",
                    img.config,
                    diff_ids.len(),
                    img.layers.len()
                ),
            ));
        }
        let mut layers = Vec::new();
        let mut size = config_size;
        for (i, (blob, diff_id)) in img.layers.iter().zip(diff_ids).enumerate() {
            let diff_id = Digest::parse(diff_id).map_err(|e| Error::invalid_image(origin, format!("config: {e}")))?;
            if !self.layer_dir(&diff_id).is_dir() {
                on_layer(blob, LayerStep::Extracting);
            }
            if self.ensure_layer(blob, &diff_id)? {
                added.push(diff_id.clone());
            }
            on_layer(blob, LayerStep::Done);
            let blob_size = fs::metadata(self.blob_path(blob))
                .map(|m| m.len())
                .unwrap_or_else(|_| img.layer_sizes.get(i).copied().unwrap_or(0));
            size += blob_size;
            layers.push(LayerRecord {
                digest: blob.clone(),
                diff_id,
                size: blob_size,
            });
        }
        let record = ImageRecord {
            id: img.config.clone(),
            manifest: img.manifest.clone(),
            refs: img.refs.clone(),
            layers,
            size,
            imported_at: chrono::Utc::now().to_rfc3339(),
            last_used: None,
        };
        // A reference names one image: take it from any other image that had it.
        for other in index.images.iter_mut() {
            other.refs.retain(|r| !record.refs.contains(r));
        }
        Ok(match index.images.iter_mut().find(|i| i.id == record.id) {
            Some(existing) => {
                for r in &record.refs {
                    if !existing.refs.contains(r) {
                        existing.refs.push(r.clone());
                    }
                }
                existing.manifest = record.manifest.clone();
                existing.clone()
            }
            None => {
                index.images.push(record.clone());
                record
            }
        })
    }

    /// Unpack a layer blob unless an earlier import already did; verify its diff_id. Returns
    /// whether it unpacked the layer.
    fn ensure_layer(&self, blob: &Digest, diff_id: &Digest) -> Result<bool> {
        let dest = self.layer_dir(diff_id);
        if dest.is_dir() {
            return Ok(false);
        }
        let tmp = self
            .dir
            .join("layers")
            .join(format!(".tmp-{}", ferrolet_fsutil::unique()));
        let label = blob.to_string();
        let res = layer::unpack_layer(&self.blob_path(blob), &tmp, &label, &self.limits).and_then(|actual| {
            if &actual != diff_id {
                return Err(Error::DigestMismatch {
                    blob: format!("{label} (uncompressed, expected diff_id {diff_id})"),
                    origin: String::new(),
                    actual: actual.to_string(),
                });
            }
            fs::rename(&tmp, &dest).with_context(|| format!("renaming layer into {}", p(&dest)))?;
            Ok(true)
        });
        if res.is_err() {
            let _ = remove_tree(&tmp);
        }
        res
    }

    /// Remove an image (by any form [`find`](Self::find) takes). A reference removes just that
    /// name unless it was the image's last; an id removes the image. `users` lists the
    /// containers still using an image id; an image in use is refused. Blobs and layers no
    /// other image needs are deleted.
    pub fn remove(&self, reference: &str, users: &[(String, Digest)]) -> Result<Vec<String>> {
        let _l = self.lock()?;
        let mut index = self.read_index()?;
        let record = find_in(&index, reference)
            .cloned()
            .ok_or_else(|| Error::ImageNotFound(reference.to_string()))?;
        let normalized = Reference::parse(reference).ok().map(|r| r.normalized());
        let mut removed = Vec::new();
        let by_name = normalized.filter(|n| record.refs.contains(n) && record.refs.len() > 1);
        if let Some(n) = by_name {
            if let Some(img) = index.images.iter_mut().find(|i| i.id == record.id) {
                img.refs.retain(|r| r != &n);
            }
            removed.push(format!("Untagged: {n}"));
            self.write_index(&index)?;
            return Ok(removed);
        }
        let using: Vec<&str> = users
            .iter()
            .filter(|(_, id)| id == &record.id)
            .map(|(c, _)| c.as_str())
            .collect();
        if !using.is_empty() {
            return Err(Error::ImageInUse {
                image: reference.to_string(),
                containers: using.join(", "),
            });
        }
        index.images.retain(|i| i.id != record.id);
        for r in &record.refs {
            removed.push(format!("Untagged: {r}"));
        }
        removed.push(format!("Deleted: {}", record.id));
        self.write_index(&index)?;
        self.collect_garbage(&index)?;
        Ok(removed)
    }

    /// Delete those of `digests` that no image refers to and no pull in this process pins
    /// (the blobs of a pull that failed or was cancelled); returns the ones deleted.
    pub(crate) fn remove_unreferenced_blobs(&self, digests: &[Digest]) -> Result<Vec<Digest>> {
        let _l = self.lock()?;
        let index = self.read_index()?;
        let pins = self.pins.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let referenced = |d: &Digest| {
            index
                .images
                .iter()
                .any(|i| &i.id == d || &i.manifest == d || i.layers.iter().any(|l| &l.digest == d))
        };
        let mut gone = Vec::new();
        for d in digests {
            if pins.contains_key(d.hex()) || referenced(d) {
                continue;
            }
            match fs::remove_file(self.blob_path(d)) {
                Ok(()) => gone.push(d.clone()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => Err(e).with_context(|| format!("removing {}", p(&self.blob_path(d))))?,
            }
        }
        Ok(gone)
    }

    /// Delete blobs and unpacked layers that no image in `index` refers to.
    fn collect_garbage(&self, index: &Index) -> Result<()> {
        let mut keep_blobs: std::collections::HashSet<String> = self
            .pins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        let mut keep_layers = std::collections::HashSet::new();
        for i in &index.images {
            keep_blobs.insert(i.id.hex().to_string());
            keep_blobs.insert(i.manifest.hex().to_string());
            for l in &i.layers {
                keep_blobs.insert(l.digest.hex().to_string());
                keep_layers.insert(l.diff_id.hex().to_string());
            }
        }
        let blobs = self.dir.join("blobs/sha256");
        for e in fs::read_dir(&blobs).with_context(|| format!("listing {}", p(&blobs)))? {
            let e = e.context("listing blobs")?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !keep_blobs.contains(&name) {
                // Index blobs of multi-platform images are not recorded; they are small and
                // re-imported with the image. Remove everything unreferenced.
                let _ = fs::remove_file(e.path());
            }
        }
        let layers = self.dir.join("layers");
        for e in fs::read_dir(&layers).with_context(|| format!("listing {}", p(&layers)))? {
            let e = e.context("listing layers")?;
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with('.') && !keep_layers.contains(&name) {
                remove_tree(&e.path())?;
            }
        }
        Ok(())
    }
}

/// What one import added to the store, to take back if it fails.
#[derive(Default)]
struct Added {
    blobs: Vec<Digest>,
    layers: Vec<Digest>,
}

fn find_in<'a>(index: &'a Index, reference: &str) -> Option<&'a ImageRecord> {
    let hexpart = reference.strip_prefix("sha256:").unwrap_or(reference);
    if hexpart.len() >= 12 && hexpart.bytes().all(|b| b.is_ascii_hexdigit()) {
        let matches: Vec<_> = index
            .images
            .iter()
            .filter(|i| i.id.hex().starts_with(&hexpart.to_ascii_lowercase()))
            .collect();
        if matches.len() == 1 {
            return Some(matches[0]);
        }
    }
    let r = Reference::parse(reference).ok()?;
    if let Some(d) = &r.digest {
        if let Some(i) = index.images.iter().find(|i| &i.manifest == d || &i.id == d) {
            return Some(i);
        }
    }
    let n = r.normalized();
    index.images.iter().find(|i| i.refs.contains(&n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            // raw, so hostile names can be written
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// An OCI layout directory at `dir` with one image of `layers`, tagged `name`.
    fn oci_layout(dir: &Path, name: &str, layers: &[Vec<u8>]) {
        fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        let put = |data: &[u8]| {
            let d = Digest::of(data);
            fs::write(dir.join("blobs/sha256").join(d.hex()), data).unwrap();
            d
        };
        let digests: Vec<Digest> = layers.iter().map(|l| put(l)).collect();
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": digests.iter().map(|d| d.to_string()).collect::<Vec<_>>()},
        })
        .to_string();
        let config_d = put(config.as_bytes());
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_d.to_string(), "size": config.len()},
            "layers": digests.iter().zip(layers).map(|(d, l)| serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d.to_string(), "size": l.len()})).collect::<Vec<_>>(),
        })
        .to_string();
        let manifest_d = put(manifest.as_bytes());
        fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let index = serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_d.to_string(),
                "size": manifest.len(), "annotations": {"io.containerd.image.name": name}}],
        });
        fs::write(dir.join("index.json"), index.to_string()).unwrap();
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_failed_import_leaves_no_blobs_or_layers() {
        let t = tempfile::tempdir().unwrap();
        let store = ImageStore::open(t.path().join("images")).unwrap();
        // Layer one is fine; layer two escapes.
        let good = tar_of(&[("ok", b"1")]);
        let evil = tar_of(&[("../evil", b"2")]);
        oci_layout(&t.path().join("evil"), "localhost/evil:1", &[good.clone(), evil]);
        let err = store.import(&t.path().join("evil")).unwrap_err();
        assert!(err.to_string().contains("escapes"), "{err}");
        assert!(store.find("localhost/evil:1").is_err());
        assert_eq!(names(&store.dir().join("blobs/sha256")), Vec::<String>::new());
        assert_eq!(names(&store.dir().join("layers")), Vec::<String>::new());
        assert_eq!(names(&store.dir().join("blobs/.tmp")), Vec::<String>::new());

        // Blobs an earlier image has stay when a later import sharing them fails.
        oci_layout(&t.path().join("good"), "localhost/good:1", std::slice::from_ref(&good));
        store.import(&t.path().join("good")).unwrap();
        let before = names(&store.dir().join("blobs/sha256"));
        let layers_before = names(&store.dir().join("layers"));
        assert_eq!(layers_before.len(), 1);
        let evil2 = tar_of(&[("../evil2", b"3")]);
        oci_layout(&t.path().join("evil2"), "localhost/evil:2", &[good, evil2]);
        store.import(&t.path().join("evil2")).unwrap_err();
        assert_eq!(names(&store.dir().join("blobs/sha256")), before);
        assert_eq!(names(&store.dir().join("layers")), layers_before);
        assert!(store.resolve("localhost/good:1").is_ok());
    }

    #[test]
    fn a_failed_pulls_blobs_go_unless_referenced_or_pinned() {
        let t = tempfile::tempdir().unwrap();
        let store = ImageStore::open(t.path().join("images")).unwrap();
        oci_layout(&t.path().join("img"), "localhost/kept:1", &[tar_of(&[("f", b"1")])]);
        let img = store.import(&t.path().join("img")).unwrap().remove(0);
        let put = |data: &[u8]| {
            let d = Digest::of(data);
            fs::write(store.blob_path(&d), data).unwrap();
            d
        };
        let (orphan, pinned) = (put(b"orphan"), put(b"pinned"));
        store.pin_blob(&pinned);
        let asked = [
            img.id.clone(),
            img.layers[0].digest.clone(),
            orphan.clone(),
            pinned.clone(),
        ];
        assert_eq!(store.remove_unreferenced_blobs(&asked).unwrap(), vec![orphan.clone()]);
        assert!(!store.blob_path(&orphan).exists());
        assert!(store.blob_path(&pinned).exists() && store.blob_path(&img.id).exists());
        assert!(store.resolve("localhost/kept:1").is_ok());
        // Once unpinned it is an orphan like any other; asking again for a gone blob is fine.
        store.unpin_blob(&pinned);
        assert_eq!(store.remove_unreferenced_blobs(&asked).unwrap(), vec![pinned]);
    }

    #[test]
    fn a_use_is_recorded_once_a_minute() {
        let t = tempfile::tempdir().unwrap();
        let store = ImageStore::open(t.path().join("images")).unwrap();
        oci_layout(&t.path().join("img"), "localhost/used:1", &[tar_of(&[("f", b"1")])]);
        let id = store.import(&t.path().join("img")).unwrap().remove(0).id;
        let last = || store.find("localhost/used:1").unwrap().last_used;
        assert_eq!(last(), None);
        store.mark_used(&id).unwrap();
        let first = last().expect("recorded");
        store.mark_used(&id).unwrap();
        assert_eq!(
            last().as_ref(),
            Some(&first),
            "a second use within a minute is not written"
        );
        // A use recorded longer ago is moved to now.
        let mut index = store.read_index().unwrap();
        let old = (chrono::Utc::now() - chrono::Duration::seconds(61)).to_rfc3339();
        index.images[0].last_used = Some(old.clone());
        store.write_index(&index).unwrap();
        store.mark_used(&id).unwrap();
        let moved = last().expect("recorded");
        assert!(moved > old, "{moved} after {old}");
        assert!(store.mark_used(&Digest::of(b"none")).is_err());
    }

    #[test]
    fn a_layer_past_the_size_limit_fails_the_import() {
        let t = tempfile::tempdir().unwrap();
        let mut store = ImageStore::open(t.path().join("images")).unwrap();
        store.set_layer_limits(layer::LayerLimits {
            max_bytes: 8 << 10,
            max_ratio: 1,
            ratio_floor: 0,
        });
        let big = tar_of(&[("big", &[7u8; 16 << 10])]);
        oci_layout(&t.path().join("big"), "localhost/big:1", &[big]);
        let err = store.import(&t.path().join("big")).unwrap_err();
        assert!(err.to_string().contains("is larger than"), "{err}");
        assert_eq!(names(&store.dir().join("blobs/sha256")), Vec::<String>::new());
    }

    /// Put `data` into the layout at `dir` as a blob; its digest.
    fn put_blob(dir: &Path, data: &[u8]) -> Digest {
        let d = Digest::of(data);
        fs::write(dir.join("blobs/sha256").join(d.hex()), data).unwrap();
        d
    }

    fn index_of(media_type: &str, d: &Digest, size: usize) -> String {
        serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{"mediaType": media_type, "digest": d.to_string(), "size": size}]})
        .to_string()
    }

    #[test]
    fn deeply_nested_indexes_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let store = ImageStore::open(t.path().join("images")).unwrap();
        let dir = t.path().join("deep");
        oci_layout(&dir, "localhost/deep:1", &[tar_of(&[("f", b"1")])]);
        // Wrap the manifest in 40 indexes: an attacker can nest as deep as it likes, and
        // each level was one more stack frame.
        let index: serde_json::Value = serde_json::from_slice(&fs::read(dir.join("index.json")).unwrap()).unwrap();
        let mut d = Digest::parse(index["manifests"][0]["digest"].as_str().unwrap()).unwrap();
        let mut media = "application/vnd.oci.image.manifest.v1+json";
        for _ in 0..40 {
            let doc = index_of(media, &d, 1);
            d = put_blob(&dir, doc.as_bytes());
            media = "application/vnd.oci.image.index.v1+json";
        }
        fs::write(dir.join("index.json"), index_of(media, &d, 1)).unwrap();
        let err = store.import(&dir).unwrap_err();
        assert!(err.to_string().contains("nested"), "{err}");
    }

    #[test]
    fn a_huge_blob_named_as_a_manifest_is_not_read_into_memory() {
        let t = tempfile::tempdir().unwrap();
        let store = ImageStore::open(t.path().join("images")).unwrap();
        let dir = t.path().join("huge");
        // A layer-sized blob (8 MiB here) given as the image's manifest.
        oci_layout(&dir, "localhost/huge:1", &[]);
        let big = put_blob(&dir, &vec![b' '; 8 << 20]);
        fs::write(
            dir.join("index.json"),
            index_of("application/vnd.oci.image.manifest.v1+json", &big, 8 << 20),
        )
        .unwrap();
        let err = store.import(&dir).unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
    }

    #[test]
    fn a_compressed_archive_is_capped_like_a_layer() {
        let t = tempfile::tempdir().unwrap();
        let mut store = ImageStore::open(t.path().join("images")).unwrap();
        store.set_layer_limits(layer::LayerLimits {
            max_bytes: 1 << 30,
            max_ratio: 20,
            ratio_floor: 0,
        });
        // A gzipped archive whose one blob is 4 MiB of zeros: about 4 KiB on disk.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(4 << 20);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_path(format!("blobs/sha256/{}", "0".repeat(64))).unwrap();
        h.set_cksum();
        b.append(&h, std::io::Read::take(std::io::repeat(0), 4 << 20)).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &b.into_inner().unwrap()).unwrap();
        let archive = t.path().join("bomb.tar.gz");
        fs::write(&archive, gz.finish().unwrap()).unwrap();
        let err = store.import(&archive).unwrap_err();
        assert!(err.to_string().contains("is larger than"), "{err}");
        assert_eq!(names(&store.dir().join("blobs/.tmp")), Vec::<String>::new());
        assert_eq!(names(&store.dir().join("blobs/sha256")), Vec::<String>::new());
    }

    #[test]
    fn store_directories_are_private() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("images");
        // A store made before the directories were private is fixed when opened.
        for sub in ["blobs/sha256", "layers"] {
            fs::create_dir_all(dir.join(sub)).unwrap();
        }
        for d in [&dir.join("blobs"), &dir.join("layers")] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
        }
        ImageStore::open(&dir).unwrap();
        for d in [dir.join("blobs"), dir.join("layers")] {
            let mode = fs::metadata(&d).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", d.display());
        }
    }
}
