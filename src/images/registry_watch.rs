//! The registries.yaml re-read when it changes: checked every fileCheckFrequency by size,
//! modification time and content. A change that loads replaces the configuration in force; one
//! that does not keeps it (the caller logs why, once per change). A removed file is the empty
//! configuration, as at start.

use std::path::PathBuf;
use std::time::SystemTime;

use ferrolet_runtime::registry::{PullError, RegistryConfig};

type Stamp = Option<(u64, Option<SystemTime>, Vec<u8>)>;

pub struct RegistryWatch {
    path: PathBuf,
    last: Stamp,
}

fn stamp(path: &std::path::Path) -> Stamp {
    let md = std::fs::metadata(path).ok()?;
    Some((md.len(), md.modified().ok(), std::fs::read(path).ok()?))
}

impl RegistryWatch {
    /// Watch `path`, as it is now (the configuration loaded at start).
    pub fn new(path: PathBuf) -> RegistryWatch {
        let last = stamp(&path);
        RegistryWatch { path, last }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// `None`: unchanged since the last check; else the new configuration, or why it does not
    /// load.
    pub fn check(&mut self) -> Option<Result<RegistryConfig, PullError>> {
        let now = stamp(&self.path);
        if now == self.last {
            return None;
        }
        self.last = now;
        Some(RegistryConfig::load(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reloads_on_change_and_reports_a_bad_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("registries.yaml");
        let mut w = RegistryWatch::new(p.clone());
        assert!(w.check().is_none(), "missing at start and still missing");
        std::fs::write(
            &p,
            "mirrors:\n  docker.io:\n    endpoint: [\"http://127.0.0.1:5000\"]\n",
        )
        .unwrap();
        assert!(matches!(w.check(), Some(Ok(_))));
        assert!(w.check().is_none());
        std::fs::write(&p, "mirrors: [not, a, map]\n").unwrap();
        let e = w.check().unwrap().unwrap_err().to_string();
        assert!(e.contains("registries.yaml"), "{e}");
        assert!(w.check().is_none(), "a bad file is reported once, not at every check");
        std::fs::remove_file(&p).unwrap();
        assert!(matches!(w.check(), Some(Ok(_))), "removed: the empty configuration");
    }
}
