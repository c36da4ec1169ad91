//! Images on an air-gapped node: the demo image built into this binary, and archives dropped
//! into the image import directory, imported at start and whenever the directory is checked.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::image::ImageStore;
use tracing::{info, warn};

static DEMO_IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/demo-image.tar"));

/// The reference the demo image is tagged with.
pub const DEMO_REF: &str = "docker.io/library/busybox:1.35";

/// The image id (config digest) of the built-in demo image, read from the archive in this
/// binary (`None` when it carries none). Image GC never removes that image: a node that
/// cannot reach a registry could not get it back until the agent restarts.
pub fn demo_image_id() -> Option<Digest> {
    static ID: OnceLock<Option<Digest>> = OnceLock::new();
    ID.get_or_init(|| oci_archive_config(DEMO_IMAGE)).clone()
}

/// The config digest of the first image of an OCI layout in a plain tar: index.json's first
/// manifest, then that manifest's config. Our own build output, so a plain walk of the tar
/// headers (name, octal size, 512-byte blocks) is enough.
fn oci_archive_config(tar: &[u8]) -> Option<Digest> {
    let file = |want: &str| -> Option<&[u8]> {
        let mut at = 0usize;
        while at + 512 <= tar.len() {
            let h = &tar[at..at + 512];
            if h.iter().all(|b| *b == 0) {
                return None;
            }
            let name_end = h[..100].iter().position(|b| *b == 0).unwrap_or(100);
            let name = std::str::from_utf8(&h[..name_end]).ok()?;
            let size_field = std::str::from_utf8(&h[124..136]).ok()?;
            let size = u64::from_str_radix(size_field.trim_matches(|c: char| c == '\0' || c == ' '), 8).ok()? as usize;
            let data = at + 512;
            if name.trim_start_matches("./") == want {
                return tar.get(data..data.checked_add(size)?);
            }
            at = data + size.div_ceil(512) * 512;
        }
        None
    };
    let index: serde_json::Value = serde_json::from_slice(file("index.json")?).ok()?;
    let manifest = Digest::parse(index.pointer("/manifests/0/digest")?.as_str()?).ok()?;
    let m: serde_json::Value = serde_json::from_slice(file(&format!("blobs/sha256/{}", manifest.hex()))?).ok()?;
    Digest::parse(m.pointer("/config/digest")?.as_str()?).ok()
}

/// Import the built-in demo image unless the store has it.
pub fn load_demo(store: &ImageStore) {
    if DEMO_IMAGE.is_empty() || store.find(DEMO_REF).is_ok() {
        return;
    }
    let tmp = store.dir().join(".demo-image.tar");
    let res = std::fs::write(&tmp, DEMO_IMAGE)
        .map_err(|e| e.to_string())
        .and_then(|_| store.import(&tmp).map_err(|e| ferrolet_fsutil::chain(&e).to_string()));
    let _ = std::fs::remove_file(&tmp);
    match res {
        Ok(imgs) => {
            info!(refs = ?imgs.iter().flat_map(|i| i.refs.clone()).collect::<Vec<_>>(), "loaded the built-in demo image")
        }
        Err(e) => warn!("loading the built-in demo image: {e}"),
    }
}

/// Watches the import directory: each new or changed archive is imported once.
pub struct ImportDir {
    dir: PathBuf,
    seen: HashMap<PathBuf, (u64, SystemTime)>,
}

impl ImportDir {
    pub fn new(dir: PathBuf) -> ImportDir {
        ImportDir {
            dir,
            seen: HashMap::new(),
        }
    }

    pub fn scan(&mut self, store: &ImageStore) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in rd.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let Ok(md) = e.metadata() else { continue };
            let stamp = (md.len(), md.modified().unwrap_or(SystemTime::UNIX_EPOCH));
            if self.seen.get(&path) == Some(&stamp) {
                continue;
            }
            // A file still being copied in: wait until it stops changing.
            if md
                .modified()
                .ok()
                .and_then(|m| m.elapsed().ok())
                .is_some_and(|age| age < Duration::from_secs(1))
            {
                continue;
            }
            self.seen.insert(path.clone(), stamp);
            match store.import(&path) {
                Ok(imgs) => {
                    for i in imgs {
                        info!(archive = %path.display(), refs = ?i.refs, id = %i.id, "imported image");
                    }
                }
                Err(err) => warn!(archive = %path.display(), "image import failed: {}", ferrolet_fsutil::chain(&err)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_image_id_is_read_from_the_embedded_archive() {
        if DEMO_IMAGE.is_empty() {
            eprintln!("SKIPPED: this binary carries no demo image (busybox-static missing at build time)");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let store = ImageStore::open(t.path().join("images")).unwrap();
        load_demo(&store);
        assert_eq!(demo_image_id(), Some(store.find(DEMO_REF).unwrap().id));
        assert_eq!(oci_archive_config(b"not a tar"), None);
    }
}
