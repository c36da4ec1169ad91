//! Small filesystem helpers for the state dirs. Every write of state goes through
//! [`write_atomic`]: temp file, fsync, rename, fsync of the dir, so a crash leaves either the old
//! or the new content, never a torn file.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{p, Context, Result};

/// Write `data` to `path` so that a reader sees either the old or the new content, and the new
/// content survives a crash once this returns.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}.{}", std::process::id(), unique()));
    let res = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)
            .with_context(|| format!("creating {}", p(&tmp)))?;
        f.write_all(data).with_context(|| format!("writing {}", p(&tmp)))?;
        f.sync_all().with_context(|| format!("syncing {}", p(&tmp)))?;
        fs::rename(&tmp, path).with_context(|| format!("renaming into {}", p(path)))?;
        sync_dir(dir);
        Ok(())
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// fsync a directory so a create, rename or unlink in it is durable. Best effort.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Serialize `value` as pretty JSON and write it atomically.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let data = serde_json::to_vec_pretty(value).with_context(|| format!("encoding {}", p(path)))?;
    write_atomic(path, &data)
}

/// Read and decode a JSON file; a missing file is `Ok(None)`.
pub fn read_json_opt<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match fs::read(path) {
        Ok(data) => serde_json::from_slice(&data)
            .map(Some)
            .with_context(|| format!("decoding {}", p(path))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", p(path))),
    }
}

pub fn ensure_dir(path: &Path) -> Result<()> {
    fs::create_dir_all(path).with_context(|| format!("creating directory {}", p(path)))
}

/// Remove a file; a missing file is fine. Returns whether it existed.
pub fn remove_file_opt(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("removing {}", p(path))),
    }
}

/// Names of the regular entries of `dir` (not starting with '.'); a missing dir is empty.
pub fn list_names(dir: &Path) -> Result<Vec<String>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", p(dir))),
    };
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.with_context(|| format!("listing {}", p(dir)))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// A process-unique number for temp names.
pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (N.fetch_add(1, Ordering::Relaxed) << 48)
}

/// A file name safe form of an id: keeps [A-Za-z0-9_.-], replaces anything else with '_'.
/// Ids are also checked by [`crate::validate_sandbox_id`], so this only guards against surprises.
pub fn safe_name(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_content_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("state.json");
        write_atomic(&f, b"one").unwrap();
        write_atomic(&f, b"two").unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"two");
        assert_eq!(list_names(dir.path()).unwrap(), vec!["state.json".to_string()]);
    }

    #[test]
    fn remove_missing_is_ok() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!remove_file_opt(&dir.path().join("nope")).unwrap());
    }
}
