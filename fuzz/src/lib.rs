//! Helpers shared by the fuzz targets in `fuzz_targets/`: a scratch directory per input and
//! the checks that an unpack wrote nothing where it must not.
//!
//! Targets of other areas (the agent's manifests and configuration) belong beside these, named
//! `<area>_<what>`.

use std::path::PathBuf;

/// A fresh directory for one input, under `TMPDIR` (scripts/fuzz points that at a tmpfs in a
/// mount namespace where everything else is read-only), with an empty `victim/` beside where
/// the input may write, standing in for a host directory.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        let dir = tempfile::Builder::new().prefix("f").tempdir().expect("scratch dir");
        std::fs::create_dir(dir.path().join("victim")).expect("victim dir");
        Scratch { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Panic if anything appeared in `victim/` or beside the names in `allowed`.
    pub fn check_nothing_outside(&self, allowed: &[&str]) {
        let victim = self.path("victim");
        let mut inside: Vec<_> = std::fs::read_dir(&victim)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        inside.sort();
        assert!(inside.is_empty(), "written into the victim directory: {inside:?}");
        for e in std::fs::read_dir(self.dir.path()).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(
                name == "victim" || allowed.contains(&name.as_str()),
                "written beside the unpack directory: {name}"
            );
        }
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::new()
    }
}

/// Panic if an error says a write hit a read-only filesystem: under scripts/fuzz everything
/// but the scratch tmpfs is read-only, so that is an attempt to write outside it.
pub fn check_not_outside(err: &(dyn std::error::Error + 'static)) {
    let msg = ferrolet_fsutil::chain(err).to_string();
    assert!(
        !msg.contains("Read-only file system"),
        "tried to write outside the scratch directory: {msg}"
    );
}
