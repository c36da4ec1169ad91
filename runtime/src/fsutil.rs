//! Small filesystem helpers shared by the store, the monitors and the agent.
//! Every write of state goes through [`write_atomic`]: temp file, fsync, rename, fsync of the dir.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{p, Context, Result};

/// Write `data` to `path` so that a reader sees either the old or the new content, never a mix,
/// and the new content survives a crash once this returns.
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
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// Serialize `value` as pretty JSON and write it atomically.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let data = serde_json::to_vec_pretty(value).with_context(|| format!("encoding {}", p(path)))?;
    write_atomic(path, &data)
}

/// Read and decode a JSON file; the error names the file.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let data = fs::read(path).with_context(|| format!("reading {}", p(path)))?;
    serde_json::from_slice(&data).with_context(|| format!("decoding {}", p(path)))
}

/// Like [`read_json`] but a missing file is `Ok(None)`.
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

/// Remove a directory tree; a missing tree is fine.
pub fn remove_tree(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", p(path))),
    }
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

/// A random lowercase hex string of `bytes` random bytes (from the kernel).
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    let mut filled = 0;
    while filled < bytes {
        // SAFETY: the pointer and length describe the unfilled part of `buf`.
        let n = unsafe { libc::getrandom(buf[filled..].as_mut_ptr() as *mut libc::c_void, bytes - filled, 0) };
        if n > 0 {
            filled += n as usize;
        }
    }
    hex::encode(buf)
}

/// This boot's id; containers recorded under another boot id are gone.
pub fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat), used with
/// the pid to tell a live process from a later one that reused its pid.
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// True when `pid` is alive and started at `start_time`.
pub fn process_matches(pid: i32, start_time: u64) -> bool {
    pid > 0 && process_start_time(pid) == Some(start_time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_content() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("state.json");
        write_atomic(&f, b"one").unwrap();
        write_atomic(&f, b"two").unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"two");
        // no temp files left behind
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn start_time_of_self_is_stable() {
        let me = std::process::id() as i32;
        let t = process_start_time(me).unwrap();
        assert!(process_matches(me, t));
        assert!(!process_matches(me, t + 1));
    }

    #[test]
    fn random_hex_has_requested_length() {
        let a = random_hex(16);
        assert_eq!(a.len(), 32);
        assert_ne!(a, random_hex(16));
    }
}
