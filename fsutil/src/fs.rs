//! State files. Every write of state goes through [`write_atomic`]: temp file, fsync, rename,
//! fsync of the directory, so a crash leaves either the old or the new content, never a torn
//! file. Records that mean nothing after a reboot (a process's pids, files regenerated on every
//! pass) use [`write_atomic_unsynced`]: the same temp file and rename, so a killed writer still
//! leaves the old or the new content, but no fsync, so a power loss may lose them. Every function
//! here blocks: call them from async code through `spawn_blocking`.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Context, Result};
use crate::ids::unique;

/// Write `data` to `path` so that a reader sees either the old or the new content, never a mix,
/// and the new content survives a crash once this returns.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    write_atomic_mode(path, data, 0o644)
}

/// [`write_atomic`] with the new file's permission bits (0o600 for a private key: the file never
/// exists with wider ones, not even as the temp file).
pub fn write_atomic_mode(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    replace(path, data, mode, true)?;
    sync_dir(dir);
    Ok(())
}

/// Write several files of one directory, each as [`write_atomic`] does, with one fsync of the
/// directory for all of them (a new directory's files: one wait instead of one per file). When
/// this returns, all of them survive a crash; an error may leave the earlier ones written.
pub fn write_atomic_in(dir: &Path, files: &[(&str, &[u8])]) -> Result<()> {
    write_atomic_in_mode(dir, files, 0o644)
}

/// [`write_atomic_in`] with the new files' permission bits. All the files' data is sent to the
/// disk before the first fsync waits, so on a journalling file system (ext4) the first fsync's
/// commit carries every file and the others find nothing left to commit: 50 files take about a
/// third of the time of 50 [`write_atomic`]s. No file is renamed in before all are durable.
pub fn write_atomic_in_mode(dir: &Path, files: &[(&str, &[u8])], mode: u32) -> Result<()> {
    let mut temps: Vec<(PathBuf, File)> = Vec::with_capacity(files.len());
    let res = (|| {
        for (name, data) in files {
            let tmp = temp_path(dir, name);
            let f = create_temp(&tmp, mode)?;
            temps.push((tmp, f));
            let (tmp, f) = temps.last_mut().expect("just pushed");
            f.write_all(data)
                .with_context(|| format!("writing {}", tmp.display()))?;
            start_writeback(f);
        }
        for (tmp, f) in &temps {
            f.sync_all().with_context(|| format!("syncing {}", tmp.display()))?;
        }
        for ((tmp, _), (name, _)) in temps.iter().zip(files) {
            let path = dir.join(name);
            fs::rename(tmp, &path).with_context(|| format!("renaming into {}", path.display()))?;
        }
        Ok(())
    })();
    if res.is_err() {
        for (tmp, _) in &temps {
            let _ = fs::remove_file(tmp);
        }
    }
    sync_dir(dir);
    res
}

/// Ask the kernel to start writing `f`'s dirty pages now, without waiting (best effort: a file
/// system that does not support it is synced by the fsync that follows all the same). nix has
/// no `sync_file_range`.
fn start_writeback(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the call reads no memory of ours.
    unsafe {
        libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Write `data` to `path` so that a reader sees either the old or the new content, never a mix,
/// even when the writer is killed, but without waiting for the disk: after a power loss or a
/// kernel crash the file may hold the old content, be empty or be missing. For records whose
/// meaning ends with the boot (pids, start times of live processes) or that are written again
/// from their source on every pass.
pub fn write_atomic_unsynced(path: &Path, data: &[u8]) -> Result<()> {
    replace(path, data, 0o644, false)
}

/// [`write_json_atomic`] without the fsyncs: see [`write_atomic_unsynced`].
pub fn write_json_atomic_unsynced<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<()> {
    let data = serde_json::to_vec_pretty(value).with_context(|| format!("encoding {}", path.display()))?;
    write_atomic_unsynced(path, &data)
}

/// The temp file (fsynced when `sync`) renamed over `path`.
fn replace(path: &Path, data: &[u8], mode: u32, sync: bool) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = temp_path(dir, &name);
    let res = (|| {
        let mut f = create_temp(&tmp, mode)?;
        f.write_all(data)
            .with_context(|| format!("writing {}", tmp.display()))?;
        if sync {
            f.sync_all().with_context(|| format!("syncing {}", tmp.display()))?;
        }
        fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// A hidden temp name beside `name` in `dir`, unique to this process and call.
fn temp_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(".{name}.tmp.{}.{}", std::process::id(), unique()))
}

fn create_temp(tmp: &Path, mode: u32) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(tmp)
        .with_context(|| format!("creating {}", tmp.display()))
}

/// fsync a directory so a create, rename or unlink in it is durable. Best effort.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Serialize `value` as pretty JSON and write it atomically.
pub fn write_json_atomic<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<()> {
    let data = serde_json::to_vec_pretty(value).with_context(|| format!("encoding {}", path.display()))?;
    write_atomic(path, &data)
}

/// [`write_json_atomic`], skipped when the file already holds exactly that JSON: for records
/// written again and again with the same content (a pod's record at every resync), where a
/// rename and two fsyncs each time cost CPU and a board's flash. True when it wrote.
pub fn write_json_atomic_if_changed<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<bool> {
    let data = serde_json::to_vec_pretty(value).with_context(|| format!("encoding {}", path.display()))?;
    if fs::read(path).ok().as_deref() == Some(data.as_slice()) {
        return Ok(false);
    }
    write_atomic(path, &data)?;
    Ok(true)
}

/// Read and decode a JSON file; the error names the file.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let data = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    crate::json::decode_text(&data).with_context(|| format!("decoding {}", path.display()))
}

/// Like [`read_json`] but a missing file is `Ok(None)`.
pub fn read_json_opt<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match fs::read(path) {
        Ok(data) => crate::json::decode_text(&data)
            .map(Some)
            .with_context(|| format!("decoding {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Create a directory and its parents; an existing one is fine.
pub fn ensure_dir(path: &Path) -> Result<()> {
    fs::create_dir_all(path).with_context(|| format!("creating directory {}", path.display()))
}

/// Create a directory and its parents, and make it private to its owner (0700) whether it
/// was there or not. Parents made on the way get the default mode.
pub fn ensure_private_dir(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    ensure_dir(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} private", path.display()))
}

/// Remove a directory tree; a missing tree is fine.
pub fn remove_tree(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// Remove a file; a missing file is fine. Returns whether it existed.
pub fn remove_file_opt(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// Names of the entries of `dir` not starting with '.' (temp files are hidden that way),
/// sorted; a missing dir is empty.
pub fn list_names(dir: &Path) -> Result<Vec<String>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// A file-name-safe form of an id: keeps [A-Za-z0-9_.-], replaces anything else with '_'.
/// Callers validate their ids too; this only guards against surprises.
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
    fn a_record_with_the_same_content_is_not_written_again() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pod.json");
        let v = serde_json::json!({"spec": {"containers": [{"name": "c"}]}});
        assert!(write_json_atomic_if_changed(&f, &v).unwrap());
        let ino = fs::metadata(&f).unwrap().ino();
        // The same content: the file is left as it is (an atomic write would be a new inode).
        assert!(!write_json_atomic_if_changed(&f, &v).unwrap());
        assert_eq!(fs::metadata(&f).unwrap().ino(), ino);
        // Changed, or damaged on disk: written again.
        let changed = serde_json::json!({"spec": {"containers": [{"name": "d"}]}});
        assert!(write_json_atomic_if_changed(&f, &changed).unwrap());
        assert_ne!(fs::metadata(&f).unwrap().ino(), ino);
        assert_eq!(read_json::<serde_json::Value>(&f).unwrap(), changed);
        fs::write(&f, b"{torn").unwrap();
        assert!(write_json_atomic_if_changed(&f, &changed).unwrap());
        assert_eq!(read_json::<serde_json::Value>(&f).unwrap(), changed);
    }

    #[test]
    fn unsynced_and_grouped_writes_replace_content_and_leave_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("monitor.json");
        write_atomic_unsynced(&f, b"one").unwrap();
        write_json_atomic_unsynced(&f, &serde_json::json!({"pid": 2})).unwrap();
        assert_eq!(read_json::<serde_json::Value>(&f).unwrap()["pid"], 2);
        write_atomic_in(dir.path(), &[("config.json", b"{}"), ("container.json", b"[]")]).unwrap();
        assert_eq!(fs::read(dir.path().join("config.json")).unwrap(), b"{}");
        assert_eq!(fs::read(dir.path().join("container.json")).unwrap(), b"[]");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 3);
        let e = write_atomic_unsynced(&dir.path().join("missing/x.json"), b"x").unwrap_err();
        assert!(e.to_string().contains("missing/.x.json.tmp"), "{e}");
    }

    #[test]
    fn a_batch_is_written_whole_with_its_mode_or_not_at_all() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<String> = (0..20).map(|i| format!("pod-{i}.json")).collect();
        let data: Vec<Vec<u8>> = (0..20).map(|i| format!("{{\"n\": {i}}}").into_bytes()).collect();
        let files: Vec<(&str, &[u8])> = names
            .iter()
            .map(String::as_str)
            .zip(data.iter().map(Vec::as_slice))
            .collect();
        write_atomic_in_mode(dir.path(), &files, 0o600).unwrap();
        assert_eq!(list_names(dir.path()).unwrap().len(), 20);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 20, "no temp file is left");
        for (name, data) in &files {
            let f = dir.path().join(name);
            assert_eq!(fs::read(&f).unwrap(), *data);
            assert_eq!(fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
        }
        // A file that cannot be made fails the batch before anything is renamed in: the files
        // already there keep their content, and the batch's temp files are gone.
        let bad: Vec<(&str, &[u8])> = vec![("pod-0.json", b"new"), ("missing/pod.json", b"x")];
        let e = write_atomic_in_mode(dir.path(), &bad, 0o600).unwrap_err();
        assert!(
            e.to_string().starts_with("creating ") && e.to_string().contains("missing"),
            "{e}"
        );
        assert_eq!(fs::read(dir.path().join("pod-0.json")).unwrap(), b"{\"n\": 0}");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 20);
    }

    #[test]
    fn atomic_write_replaces_content_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("state.json");
        write_atomic(&f, b"one").unwrap();
        write_atomic(&f, b"two").unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"two");
        assert_eq!(list_names(dir.path()).unwrap(), vec!["state.json".to_string()]);
        // not even hidden temp files
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn failed_write_names_the_file_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let e = write_atomic(&dir.path().join("missing/state.json"), b"x").unwrap_err();
        assert!(e.is_not_found(), "{e:?}");
        assert!(e.to_string().starts_with("creating "), "{e}");
        assert!(e.to_string().contains("missing/.state.json.tmp."), "{e}");
    }

    #[test]
    fn json_round_trip_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("r.json");
        assert_eq!(read_json_opt::<Vec<u32>>(&f).unwrap(), None);
        let e = read_json::<Vec<u32>>(&f).unwrap_err();
        assert!(e.is_not_found());
        assert_eq!(e.to_string(), format!("reading {}", f.display()));
        write_json_atomic(&f, &vec![1u32, 2]).unwrap();
        assert_eq!(read_json::<Vec<u32>>(&f).unwrap(), vec![1, 2]);
        assert_eq!(read_json_opt::<Vec<u32>>(&f).unwrap(), Some(vec![1, 2]));
        fs::write(&f, "garbage").unwrap();
        let e = read_json_opt::<Vec<u32>>(&f).unwrap_err();
        assert_eq!(e.to_string(), format!("decoding {}", f.display()));
        assert!(!e.is_not_found());
    }

    #[test]
    fn removal_and_listing_tolerate_missing_things() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!remove_file_opt(&dir.path().join("nope")).unwrap());
        remove_tree(&dir.path().join("nope")).unwrap();
        assert!(list_names(&dir.path().join("nope")).unwrap().is_empty());
        ensure_dir(&dir.path().join("a/b")).unwrap();
        fs::write(dir.path().join("a/b/f"), "x").unwrap();
        fs::write(dir.path().join("a/.hidden"), "x").unwrap();
        assert_eq!(list_names(&dir.path().join("a")).unwrap(), vec!["b".to_string()]);
        assert!(remove_file_opt(&dir.path().join("a/b/f")).unwrap());
        remove_tree(&dir.path().join("a")).unwrap();
        assert!(!dir.path().join("a").exists());
    }

    #[test]
    fn private_dirs_are_0700_new_or_old() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let new = dir.path().join("a/new");
        ensure_private_dir(&new).unwrap();
        assert_eq!(mode(&new), 0o700);
        let old = dir.path().join("old");
        fs::create_dir(&old).unwrap();
        fs::set_permissions(&old, fs::Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(&old).unwrap();
        assert_eq!(mode(&old), 0o700);
    }

    #[test]
    fn safe_names() {
        assert_eq!(safe_name("net-abc_1.2"), "net-abc_1.2");
        assert_eq!(safe_name("10.88.0.0/16"), "10.88.0.0_16");
        assert_eq!(safe_name("a b:c"), "a_b_c");
    }
}
