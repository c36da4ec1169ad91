//! A container's root filesystem: an overlay of the image's unpacked layers (read-only lowers)
//! with an upper and work directory in the container's state directory.
//!
//! The mount runs in the container's monitor, a single-threaded process, so it may `chdir` into
//! the layer directory and name the lowers relatively: that keeps the mount options under the
//! kernel's one-page limit for deep images.

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RootfsSpec {
    /// Directory holding the unpacked layers; lowers are named relative to it.
    pub layers_dir: PathBuf,
    /// Layer directory names, top layer first (overlayfs order).
    pub lowers: Vec<String>,
    /// An empty directory used as the lower of an image without layers.
    pub empty: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub target: PathBuf,
}

/// Mount the overlay. Changes the working directory of the calling process: call it only in a
/// process of its own (the monitor).
pub fn mount_overlay(spec: &RootfsSpec) -> io::Result<()> {
    for d in [&spec.upper, &spec.work, &spec.target] {
        fs::create_dir_all(d)?;
    }
    let lowers = if spec.lowers.is_empty() {
        fs::create_dir_all(&spec.empty)?;
        spec.empty.display().to_string()
    } else {
        std::env::set_current_dir(&spec.layers_dir)?;
        spec.lowers.join(":")
    };
    let data = format!(
        "lowerdir={lowers},upperdir={},workdir={}",
        spec.upper.display(),
        spec.work.display()
    );
    let r = nix::mount::mount(
        Some("overlay"),
        &spec.target,
        Some("overlay"),
        nix::mount::MsFlags::empty(),
        Some(data.as_str()),
    );
    let _ = std::env::set_current_dir("/");
    r.map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("mounting overlay on {}: {e}", spec.target.display()),
        )
    })
}

/// Unmount (lazily, so a process still holding it does not block deletion).
pub fn unmount(target: &Path) -> io::Result<()> {
    match nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(io::Error::new(
            io::Error::from(e).kind(),
            format!("unmounting {}: {e}", target.display()),
        )),
    }
}

/// Mount points at or below `dir` in this process's mount namespace (from
/// `/proc/self/mountinfo`), deepest first, so they can be unmounted in that order. Finds what a
/// state directory still has mounted when no record says so (`ferrolet reset`).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(base) = fs::canonicalize(dir) else {
        return Vec::new();
    };
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(crate::cgroups::unescape(m)))
        .filter(|m| m.starts_with(&base))
        .collect();
    out.sort_by(|a, b| {
        b.components()
            .count()
            .cmp(&a.components().count())
            .then_with(|| a.cmp(b))
    });
    out.dedup();
    out
}

/// Create `dir` (absolute in the container) inside `rootfs` if missing, as runc does for a
/// working directory the image lacks. Symlinks on the way are resolved inside the rootfs.
pub fn ensure_dir_in_root(rootfs: &Path, dir: &str) -> io::Result<()> {
    let mut cur = PathBuf::from("/");
    for c in Path::new(dir).components() {
        let Component::Normal(name) = c else { continue };
        let next = cur.join(name);
        let host = rootfs.join(next.strip_prefix("/").expect("absolute"));
        match fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = fs::read_link(&host)?;
                let resolved = if target.is_absolute() { target } else { cur.join(target) };
                // Normalize without touching the node's filesystem.
                let mut norm = PathBuf::from("/");
                for rc in resolved.components() {
                    match rc {
                        Component::ParentDir => {
                            norm.pop();
                        }
                        Component::Normal(n) => norm.push(n),
                        _ => {}
                    }
                }
                cur = norm;
            }
            Ok(m) if m.is_dir() => cur = next,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists in the image and is not a directory", next.display()),
                ))
            }
            Err(_) => {
                fs::create_dir(&host)?;
                cur = next;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_missing_workdir_through_symlinks_inside_root() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        fs::create_dir_all(root.join("real")).unwrap();
        std::os::unix::fs::symlink("/real", root.join("link")).unwrap();
        ensure_dir_in_root(root, "/link/app/data").unwrap();
        assert!(root.join("real/app/data").is_dir());
        fs::write(root.join("file"), "x").unwrap();
        assert!(ensure_dir_in_root(root, "/file/x").is_err());
    }

    #[test]
    fn mounts_under_a_fresh_dir_and_the_root() {
        let d = tempfile::tempdir().unwrap();
        assert!(mounts_under(d.path()).is_empty());
        let all = mounts_under(Path::new("/"));
        assert_eq!(all.last().map(PathBuf::as_path), Some(Path::new("/")), "{all:?}");
    }
}
