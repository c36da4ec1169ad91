//! A container's root filesystem: an overlay of the image's unpacked layers (read-only lowers)
//! with an upper and work directory in the container's state directory.
//!
//! The mount runs in the container's monitor, a single-threaded process, so it may `chdir` into
//! the layer directory and name the lowers relatively: that keeps the mount options under the
//! kernel's one-page limit for deep images.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RootfsSpec {
    /// Directory holding the unpacked layers; lowers are named relative to it.
    pub layers_dir: PathBuf,
    /// Layer directory names, top layer first (overlayfs order).
    pub lowers: Vec<String>,
    /// An empty directory used as the lower of an image without layers.
    pub empty: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub target: PathBuf,
    /// A container in a user namespace: its layers are idmapped through it, and its upper
    /// directory's root is owned by the container's root (host ids `uid`, `gid`).
    #[serde(default)]
    pub idmap: Option<RootIdmap>,
    /// The container's SELinux mount label: the overlay is mounted with `context=` it.
    #[serde(default)]
    pub mount_label: Option<String>,
}

impl RootfsSpec {
    /// The `context=` option of the mount label, quoted (a level has commas), with a leading
    /// comma to append to the overlay's options; empty without a label.
    fn context_option(&self) -> String {
        match &self.mount_label {
            Some(l) if !l.is_empty() => format!(",context=\"{l}\""),
            _ => String::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RootIdmap {
    pub userns: PathBuf,
    pub uid: u32,
    pub gid: u32,
}

/// Mount the overlay. Changes the working directory of the calling process: call it only in a
/// process of its own (the monitor).
pub(crate) fn mount_overlay(spec: &RootfsSpec) -> io::Result<()> {
    for d in [&spec.upper, &spec.work, &spec.target] {
        fs::create_dir_all(d)?;
    }
    if let Some(idmap) = &spec.idmap {
        return mount_idmapped_overlay(spec, idmap);
    }
    let lowers = if spec.lowers.is_empty() {
        fs::create_dir_all(&spec.empty)?;
        spec.empty.display().to_string()
    } else {
        std::env::set_current_dir(&spec.layers_dir)?;
        spec.lowers.join(":")
    };
    let data = format!(
        "lowerdir={lowers},upperdir={},workdir={}{}",
        spec.upper.display(),
        spec.work.display(),
        spec.context_option()
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

/// The overlay over idmapped copies of the layers (Linux 5.19): each layer's copy is attached
/// under `<upper>/../idmapped/<n>` for as long as the overlay mount takes (overlayfs keeps
/// private clones of its layers), then detached.
fn mount_idmapped_overlay(spec: &RootfsSpec, idmap: &RootIdmap) -> io::Result<()> {
    let staging = spec.upper.with_file_name("idmapped");
    fs::create_dir_all(&staging)?;
    let layers: Vec<PathBuf> = if spec.lowers.is_empty() {
        fs::create_dir_all(&spec.empty)?;
        vec![spec.empty.clone()]
    } else {
        spec.lowers.iter().map(|l| spec.layers_dir.join(l)).collect()
    };
    let mut attached = Vec::new();
    let result = (|| {
        for (i, layer) in layers.iter().enumerate() {
            let tree = crate::idmap::idmapped_copy(layer, &idmap.userns, false)?;
            let at = staging.join(i.to_string());
            fs::create_dir_all(&at)?;
            crate::idmap::attach(&tree, &at)?;
            attached.push(at);
        }
        std::os::unix::fs::chown(&spec.upper, Some(idmap.uid), Some(idmap.gid))?;
        std::env::set_current_dir(&staging)?;
        let lowers: Vec<String> = (0..layers.len()).map(|i| i.to_string()).collect();
        let data = format!(
            "lowerdir={},upperdir={},workdir={}{}",
            lowers.join(":"),
            spec.upper.display(),
            spec.work.display(),
            spec.context_option()
        );
        nix::mount::mount(
            Some("overlay"),
            &spec.target,
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(data.as_str()),
        )
        .map_err(|e| {
            let hint = if e == nix::errno::Errno::EINVAL {
                " (overlayfs takes idmapped layers since Linux 5.19)"
            } else {
                ""
            };
            io::Error::new(
                io::Error::from(e).kind(),
                format!(
                    "mounting overlay on {} over idmapped layers: {e}{hint}",
                    spec.target.display()
                ),
            )
        })
    })();
    let _ = std::env::set_current_dir("/");
    for at in attached.iter().rev() {
        let _ = nix::mount::umount2(at.as_path(), nix::mount::MntFlags::MNT_DETACH);
        let _ = fs::remove_dir(at);
    }
    let _ = fs::remove_dir(&staging);
    result
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
    try_mounts_under(dir).unwrap_or_default()
}

/// [`mounts_under`], with the error when `dir` cannot be resolved or the mount table read.
pub(crate) fn try_mounts_under(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let base = fs::canonicalize(dir)?;
    let info = fs::read_to_string("/proc/self/mountinfo")?;
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
    Ok(out)
}

/// Create `dir` (absolute in the container) inside `rootfs` if missing, as runc does for a
/// working directory the image lacks. The path and the image's symlinks are resolved in the
/// rootfs as the container sees it (absolute targets from its `/`, `..` stopping there), with
/// [`ferrolet_fsutil::RootDir::open_in_root`]: a crafted image cannot make the host's
/// directories.
pub(crate) fn ensure_dir_in_root(rootfs: &Path, dir: &str) -> io::Result<()> {
    let fs_err = |e: ferrolet_fsutil::Error| {
        let kind = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<io::Error>())
            .map(|s| s.kind())
            .unwrap_or(io::ErrorKind::Other);
        io::Error::new(kind, ferrolet_fsutil::chain(&e).to_string())
    };
    let root = ferrolet_fsutil::RootDir::open_in_root(rootfs).map_err(fs_err)?;
    root.create_dir_all(dir, 0o755).map_err(fs_err)?;
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

    #[test]
    fn a_workdir_through_chained_absolute_symlinks_stays_in_the_root() {
        // The image's config names the workingDir; its layers hold the symlinks. An absolute
        // target is the container's path: it must be resolved in the rootfs at every step,
        // not on the host.
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("rootfs");
        let victim = d.path().join("victim");
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&victim).unwrap();
        std::os::unix::fs::symlink(&victim, root.join("hop")).unwrap();
        std::os::unix::fs::symlink("/hop", root.join("lnk")).unwrap();
        std::os::unix::fs::symlink("../../../../../../../..", root.join("up")).unwrap();
        let _ = ensure_dir_in_root(&root, "/lnk/sub");
        let _ = ensure_dir_in_root(&root, "/up/sub2");
        assert!(
            fs::read_dir(&victim).unwrap().next().is_none(),
            "created outside the rootfs"
        );
        // In the container /lnk -> /hop -> <victim's path>, which the image lacks: an error.
        // Where the image has it, it is made there, inside the rootfs.
        let inside = root.join(victim.strip_prefix("/").unwrap());
        fs::create_dir_all(&inside).unwrap();
        ensure_dir_in_root(&root, "/lnk/sub").unwrap();
        assert!(inside.join("sub").is_dir());
        assert!(root.join("sub2").is_dir(), "`..` above / stays at /");
    }
}
