//! Images on an air-gapped node: the demo image built into this binary, and archives dropped
//! into the image import directory, imported at start and whenever the directory is checked.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use ferrolet_runtime::image::ImageStore;
use tracing::{info, warn};

static DEMO_IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/demo-image.tar"));

/// The reference the demo image is tagged with.
pub const DEMO_REF: &str = "docker.io/library/busybox:1.35";

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
