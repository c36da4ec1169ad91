//! kubelet's AtomicWriter (pkg/volume/util/atomic_writer.go): the files of a configMap, secret,
//! downwardAPI or projected volume change all at once or not at all. Each version lives in its
//! own timestamped directory (`..2026_11_22_23_59_59.123456789`); `..data` is a symlink to the
//! current one, replaced by a rename; what a container sees are top-level symlinks through
//! `..data` (`key -> ..data/key`). A reader that opens a file gets a whole old version or a whole
//! new one, never a mix. Unchanged content writes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// One file of a volume: its content and its permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// A volume's files by relative path (nested paths allowed).
pub type Payload = BTreeMap<String, FileProjection>;

/// The symlink naming the current version.
pub const DATA_DIR: &str = "..data";
const DATA_DIR_TMP: &str = "..data_tmp";
const MAX_PATH_LENGTH: usize = 4096;
const MAX_FILE_NAME_LENGTH: usize = 255;

/// kubelet's validatePath: relative, no `..` element, not starting with `..`, within the
/// length limits.
pub fn validate_path(p: &str) -> Result<()> {
    if p.is_empty() {
        bail!("invalid path: must not be empty: {p:?}");
    }
    if p.starts_with('/') {
        bail!("invalid path: must be relative path: {p}");
    }
    if p.len() > MAX_PATH_LENGTH {
        bail!("invalid path: must be less than or equal to {MAX_PATH_LENGTH} characters");
    }
    let items: Vec<&str> = p.split('/').collect();
    for item in &items {
        if *item == ".." {
            bail!("invalid path: must not contain '..': {p}");
        }
        if item.len() > MAX_FILE_NAME_LENGTH {
            bail!("invalid path: filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters");
        }
    }
    if items[0].starts_with("..") && items[0].len() > 2 {
        bail!("invalid path: must not start with '..': {p}");
    }
    Ok(())
}

/// The path without empty and `.` elements (filepath.Clean for a valid relative path).
fn clean(p: &str) -> String {
    p.split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect::<Vec<_>>()
        .join("/")
}

fn top_level(p: &str) -> &str {
    p.split('/').next().unwrap_or(p)
}

/// Make `target` hold exactly `payload`. `set_perms` runs on the new version's directory
/// before it becomes visible (fsGroup ownership). Returns whether anything was written.
pub fn write(target: &Path, payload: &Payload, set_perms: &dyn Fn(&Path) -> Result<()>) -> Result<bool> {
    let mut files = Payload::new();
    for (p, f) in payload {
        validate_path(p)?;
        let c = clean(p);
        if c.is_empty() {
            bail!("invalid path: {p:?}");
        }
        files.insert(c, f.clone());
    }
    let data_link = target.join(DATA_DIR);
    let old = std::fs::read_link(&data_link)
        .ok()
        .map(|l| target.join(l))
        .filter(|d| d.is_dir());
    let old_paths = match &old {
        Some(d) => relative_paths(d)?,
        None => BTreeSet::new(),
    };
    let mut new_paths = BTreeSet::new();
    for p in files.keys() {
        let mut acc = String::new();
        for part in p.split('/') {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(part);
            new_paths.insert(acc.clone());
        }
    }
    let to_remove: BTreeSet<&String> = old_paths.difference(&new_paths).collect();
    if let Some(d) = &old {
        if to_remove.is_empty() && unchanged(d, &files) {
            return Ok(false);
        }
    }

    let ts_dir = new_version_dir(target)?;
    let written = write_files(&ts_dir, &files).and_then(|()| set_perms(&ts_dir));
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&ts_dir);
        return Err(e);
    }

    // Swap: a new symlink renamed over `..data` replaces it in one step.
    let tmp_link = target.join(DATA_DIR_TMP);
    match std::fs::remove_file(&tmp_link) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", tmp_link.display()))
        }
        _ => {}
    }
    let ts_name = ts_dir.file_name().map(PathBuf::from).unwrap_or_default();
    std::os::unix::fs::symlink(&ts_name, &tmp_link).with_context(|| format!("creating {}", tmp_link.display()))?;
    std::fs::rename(&tmp_link, &data_link).with_context(|| format!("replacing {}", data_link.display()))?;

    // What the user sees: one symlink per top-level name, through `..data`.
    let tops: BTreeSet<&str> = files.keys().map(|p| top_level(p)).collect();
    for name in &tops {
        let link = target.join(name);
        let present = std::fs::symlink_metadata(&link);
        if present.as_ref().is_ok_and(|m| !m.file_type().is_symlink()) {
            // A plain file or directory (a volume written before versions existed) makes way.
            if present.as_ref().is_ok_and(|m| m.is_dir()) {
                std::fs::remove_dir_all(&link)
            } else {
                std::fs::remove_file(&link)
            }
            .with_context(|| format!("replacing {}", link.display()))?;
        }
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new(DATA_DIR).join(name), &link)
                .with_context(|| format!("creating {}", link.display()))?;
        }
    }
    for p in to_remove {
        if !p.contains('/') && !tops.contains(p.as_str()) {
            let link = target.join(p);
            match std::fs::remove_file(&link) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("removing {}", link.display()))
                }
                _ => {}
            }
        }
    }
    // Old versions (and any a crash left behind) go.
    for e in std::fs::read_dir(target).with_context(|| format!("reading {}", target.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") && name != DATA_DIR && e.path() != ts_dir && e.file_type()?.is_dir() {
            std::fs::remove_dir_all(e.path()).with_context(|| format!("removing {}", e.path().display()))?;
        }
    }
    Ok(true)
}

/// Every file and directory below `dir`, relative to it.
fn relative_paths(dir: &Path) -> Result<BTreeSet<String>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) -> Result<()> {
        for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let e = e?;
            let rel = e
                .path()
                .strip_prefix(root)
                .unwrap_or(&e.path())
                .to_string_lossy()
                .into_owned();
            out.insert(rel);
            if e.file_type()?.is_dir() {
                walk(root, &e.path(), out)?;
            }
        }
        Ok(())
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out)?;
    Ok(out)
}

/// kubelet's shouldWritePayload: whether every file is already there with this content.
fn unchanged(dir: &Path, files: &Payload) -> bool {
    files
        .iter()
        .all(|(p, f)| std::fs::read(dir.join(p)).is_ok_and(|have| have == f.data))
}

/// A new `..<UTC timestamp>` directory under `target`.
fn new_version_dir(target: &Path) -> Result<PathBuf> {
    let stamp = chrono::Utc::now().format("..%Y_%m_%d_%H_%M_%S.%9f").to_string();
    for n in 0..100 {
        let dir = match n {
            0 => target.join(&stamp),
            n => target.join(format!("{stamp}{n}")),
        };
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    bail!("no free version directory under {}", target.display())
}

fn write_files(dir: &Path, files: &Payload) -> Result<()> {
    for (p, f) in files {
        let file = dir.join(p);
        if let Some(parent) = file.parent() {
            if parent != dir {
                std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
                let mut d = parent;
                while d != dir {
                    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
                    d = d.parent().unwrap_or(dir);
                }
            }
        }
        std::fs::write(&file, &f.data).with_context(|| format!("writing {}", file.display()))?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(f.mode & 0o7777))
            .with_context(|| format!("setting the mode of {}", file.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn payload(items: &[(&str, &str, u32)]) -> Payload {
        items
            .iter()
            .map(|(p, d, m)| {
                (
                    p.to_string(),
                    FileProjection {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    fn no_perms(_: &Path) -> Result<()> {
        Ok(())
    }

    fn versions(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != DATA_DIR)
            .collect()
    }

    #[test]
    fn layout_modes_and_nested_paths() {
        let t = tempfile::tempdir().unwrap();
        let p = payload(&[("a", "1", 0o644), ("sub/dir/b", "2", 0o400)]);
        assert!(write(t.path(), &p, &no_perms).unwrap());
        let link = std::fs::read_link(t.path().join(DATA_DIR)).unwrap();
        let name = link.to_string_lossy().into_owned();
        assert!(
            name.starts_with("..20") && name.len() == "..2026_11_22_23_59_59.123456789".len(),
            "{name}"
        );
        assert_eq!(std::fs::read_link(t.path().join("a")).unwrap(), Path::new("..data/a"));
        assert_eq!(
            std::fs::read_link(t.path().join("sub")).unwrap(),
            Path::new("..data/sub")
        );
        assert_eq!(std::fs::read_to_string(t.path().join("sub/dir/b")).unwrap(), "2");
        let mode = |p: &str| std::fs::metadata(t.path().join(p)).unwrap().mode() & 0o7777;
        assert_eq!(mode("a"), 0o644);
        assert_eq!(mode("sub/dir/b"), 0o400);
        assert_eq!(mode("sub/dir"), 0o755);
        // The same content again writes nothing.
        assert!(!write(t.path(), &p, &no_perms).unwrap());
        assert_eq!(std::fs::read_link(t.path().join(DATA_DIR)).unwrap(), link);
    }

    #[test]
    fn swap_removes_old_version_and_vanished_names() {
        let t = tempfile::tempdir().unwrap();
        write(
            t.path(),
            &payload(&[("a", "1", 0o644), ("gone", "x", 0o644)]),
            &no_perms,
        )
        .unwrap();
        let first = versions(t.path());
        assert_eq!(first.len(), 1);
        write(
            t.path(),
            &payload(&[("a", "2", 0o644), ("new/c", "3", 0o644)]),
            &no_perms,
        )
        .unwrap();
        let second = versions(t.path());
        assert_eq!(second.len(), 1, "{second:?}");
        assert_ne!(first, second);
        assert_eq!(std::fs::read_to_string(t.path().join("a")).unwrap(), "2");
        assert_eq!(std::fs::read_to_string(t.path().join("new/c")).unwrap(), "3");
        assert!(std::fs::symlink_metadata(t.path().join("gone")).is_err());
        // A removed key alone is a change too.
        assert!(write(t.path(), &payload(&[("a", "2", 0o644)]), &no_perms).unwrap());
        assert!(std::fs::symlink_metadata(t.path().join("new")).is_err());
    }

    #[test]
    fn set_perms_runs_before_the_swap_and_failures_leave_the_old_version() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), &payload(&[("a", "1", 0o644)]), &no_perms).unwrap();
        let before = std::fs::read_link(t.path().join(DATA_DIR)).unwrap();
        let failing = |d: &Path| -> Result<()> {
            assert!(d.join("a").exists());
            bail!("no")
        };
        assert!(write(t.path(), &payload(&[("a", "2", 0o644)]), &failing).is_err());
        assert_eq!(std::fs::read_link(t.path().join(DATA_DIR)).unwrap(), before);
        assert_eq!(std::fs::read_to_string(t.path().join("a")).unwrap(), "1");
        assert_eq!(versions(t.path()).len(), 1);
    }

    #[test]
    fn bad_paths_refused() {
        for p in ["", "/abs", "a/../b", "..", "..hidden", &"x".repeat(256)] {
            assert!(validate_path(p).is_err(), "{p:?}");
        }
        for p in ["a", "a/b", "a..b/c", "x/..y"] {
            validate_path(p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
        }
        let t = tempfile::tempdir().unwrap();
        assert!(write(t.path(), &payload(&[("../x", "1", 0o644)]), &no_perms).is_err());
    }

    #[test]
    fn readers_never_see_a_half_state() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().to_path_buf();
        // Two files that always carry the same version, large enough that a partial write
        // would be visible.
        let version = |n: usize| {
            let body = format!("{n:08}").repeat(4096);
            payload(&[("one", &body, 0o644), ("two/nested", &body, 0o644)])
        };
        write(&dir, &version(0), &no_perms).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Through one resolution of `..data`, both files are the same version.
                    let Ok(link) = std::fs::read_link(dir.join(DATA_DIR)) else {
                        continue;
                    };
                    let v = dir.join(link);
                    let (Ok(a), Ok(b)) = (std::fs::read(v.join("one")), std::fs::read(v.join("two/nested"))) else {
                        continue; // that version was removed meanwhile
                    };
                    assert_eq!(a.len(), 8 * 4096);
                    assert_eq!(a, b);
                    // Through the user-visible name, a whole file.
                    if let Ok(c) = std::fs::read(dir.join("one")) {
                        assert_eq!(c.len(), 8 * 4096);
                        assert!(c.chunks(8).all(|w| w == &c[..8]));
                    }
                    seen += 1;
                }
                seen
            })
        };
        for n in 1..200 {
            write(&dir, &version(n), &no_perms).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
        assert_eq!(versions(&dir).len(), 1);
    }
}
