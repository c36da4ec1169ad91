//! Pod volumes on the node (kubelet's volume manager): emptyDir (a directory, or tmpfs for
//! `medium: Memory`), hostPath with its type checks, and the volumes made of files from the pod
//! and from API objects: downwardAPI and configMap on disk, secret and projected on tmpfs (never
//! on disk), each written through the [`atomic_writer`](super::atomic_writer) so that a resync
//! updates them in place, all at once. Then each container's volumeMounts become bind mounts
//! (subPath, readOnly, mountPropagation). Directories live where kubelet keeps them:
//! `<root>/pods/<uid>/volumes/<plugin>/<name>`.

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use ferrolet_runtime::config::{Mount, MountKind, Propagation};
use k8s_openapi::api::core::v1::{Container, Pod};

use super::atomic_writer::{self, Payload};
use crate::pod;
use crate::pod::expansion::expand;

#[derive(Debug, Clone)]
pub struct VolumeHost {
    pub path: PathBuf,
    /// configMap, secret, downwardAPI and projected volumes are always read-only in the container.
    pub readonly: bool,
    /// emptyDir: subPaths may be created inside it.
    pub writable_by_us: bool,
    /// A pod in a user namespace: bound idmapped (the agent's volumes where the filesystem
    /// takes idmapped mounts; never a hostPath). docs/userns.md
    pub idmap: bool,
}

pub fn pod_volumes_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("volumes")
}

/// A volume that could not be set up, in kubelet's words (the FailedMount event's message).
#[derive(Debug)]
pub struct SetUpFailed {
    pub volume: String,
    pub message: String,
}

impl std::fmt::Display for SetUpFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MountVolume.SetUp failed for volume {:?} : {}",
            self.volume, self.message
        )
    }
}

impl std::error::Error for SetUpFailed {}

/// kubelet's calculateEmptyDirMemorySize: a memory-backed volume (emptyDir `medium: Memory`,
/// and the tmpfs of secret and projected volumes) is as large as node allocatable memory, or
/// the pod's memory limit when it has one and it is smaller, or the volume's sizeLimit when it
/// is positive and smaller still.
pub fn empty_dir_memory_size(node_allocatable: i64, pod_limit: Option<i64>, size_limit: Option<i64>) -> i64 {
    let mut size = node_allocatable;
    if let Some(l) = pod_limit.filter(|l| *l > 0 && *l <= size) {
        size = l;
    }
    if let Some(l) = size_limit.filter(|l| *l > 0 && *l <= size) {
        size = l;
    }
    size
}

/// An emptyDir: its directory (world-writable, as kubelet makes it), a tmpfs of `tmpfs_size`
/// bytes over it for `medium: Memory` unless one is there already (an agent restart finds it
/// mounted and keeps its content), then the fsGroup ownership.
pub fn set_up_empty_dir(dir: &Path, tmpfs_size: Option<i64>, fs_group: Option<FsGroup>) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if let Some(size) = tmpfs_size {
        if !is_mountpoint(dir) {
            mount_tmpfs(dir, &format!("mode=0777,size={}", size.max(4096)))?;
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))?;
    if let Some(g) = fs_group {
        set_volume_ownership(dir, g, false)?;
    }
    Ok(())
}

/// A volume of files: its directory (a tmpfs of `tmpfs_size` bytes for secrets and projected
/// volumes, which never touch the disk), the payload written atomically, the group ownership of
/// fsGroup (read-only) on what was written. Returns whether anything was written.
pub fn write_files_volume(
    dir: &Path,
    tmpfs_size: Option<i64>,
    payload: &Payload,
    fs_group: Option<i64>,
) -> Result<bool> {
    if !dir.is_dir() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))?;
    }
    if let Some(size) = tmpfs_size {
        if !is_mountpoint(dir) {
            mount_tmpfs(dir, &format!("size={}", size.max(4096)))?;
        }
    }
    let gid = fs_group.map(|g| g as u32);
    let set_perms = |version: &Path| match gid {
        // kubelet's atomic writer sets ownership with no change policy: always.
        Some(g) => set_volume_ownership(
            version,
            FsGroup {
                gid: g,
                on_root_mismatch: false,
            },
            true,
        ),
        None => Ok(()),
    };
    let written = atomic_writer::write(dir, payload, &set_perms)?;
    if written {
        tracing::info!(volume = %dir.display(), files = payload.len(), "volume contents written");
        if let Some(g) = gid {
            let md = std::fs::metadata(dir)?;
            if md.gid() != g {
                std::os::unix::fs::lchown(dir, None, Some(g))?;
            }
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode((md.mode() & 0o7777) | 0o2550))?;
        }
    }
    Ok(written)
}

fn mount_tmpfs(dir: &Path, opts: &str) -> Result<()> {
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(opts),
    )
    .with_context(|| format!("mounting tmpfs on {}", dir.display()))
}

/// kubelet's hostPath checkType, with its error texts: an unset type checks nothing; the
/// `...OrCreate` types make what is missing (directories 0755, files 0644).
pub fn check_host_path(path: &Path, typ: &str) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let p = path.display();
    let ft = std::fs::metadata(path).ok().map(|m| m.file_type());
    let is = |f: fn(&std::fs::FileType) -> bool| ft.as_ref().is_some_and(f);
    match typ {
        "" => Ok(()),
        "DirectoryOrCreate" if ft.is_none() => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(path)
                .with_context(|| format!("creating {p}"))?;
            Ok(())
        }
        "DirectoryOrCreate" | "Directory" if !is(std::fs::FileType::is_dir) => {
            bail!("hostPath type check failed: {p} is not a directory")
        }
        "FileOrCreate" if ft.is_none() => {
            if let Some(parent) = path.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o644)
                .open(path)
                .with_context(|| format!("creating {p}"))?;
            Ok(())
        }
        "FileOrCreate" | "File" if !is(std::fs::FileType::is_file) => {
            bail!("hostPath type check failed: {p} is not a file")
        }
        "Socket" if !is(FileTypeExt::is_socket) => bail!("hostPath type check failed: {p} is not a socket file"),
        "CharDevice" if !is(FileTypeExt::is_char_device) => {
            bail!("hostPath type check failed: {p} is not a character device")
        }
        "BlockDevice" if !is(FileTypeExt::is_block_device) => {
            bail!("hostPath type check failed: {p} is not a block device")
        }
        "DirectoryOrCreate" | "Directory" | "FileOrCreate" | "File" | "Socket" | "CharDevice" | "BlockDevice" => Ok(()),
        other => bail!("{other} is an invalid volume type"),
    }
}

/// A local PersistentVolume's path: a directory of the node (kubelet also mounts a block
/// device there with its fsType; ferrolet takes directories only).
pub fn check_local_volume(pv: &str, path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(md) if md.is_dir() => Ok(()),
        Ok(_) => bail!(
            "local volume path {:?} of PersistentVolume {pv:?} is not a directory (block device local volumes are not supported)",
            path.display().to_string()
        ),
        Err(e) => bail!(
            "local volume path {:?} of PersistentVolume {pv:?}: {e}",
            path.display().to_string()
        ),
    }
}

/// The pod's fsGroup as a volume's ownership is set from it: the group, and whether
/// `fsGroupChangePolicy: OnRootMismatch` lets a volume whose root is right already alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsGroup {
    pub gid: u32,
    pub on_root_mismatch: bool,
}

impl FsGroup {
    pub fn of(p: &Pod) -> Option<FsGroup> {
        let sc = pod::spec(p).security_context.as_ref()?;
        Some(FsGroup {
            gid: sc.fs_group? as u32,
            on_root_mismatch: sc.fs_group_change_policy.as_deref() == Some("OnRootMismatch"),
        })
    }
}

const RW_MASK: u32 = 0o660;
const RO_MASK: u32 = 0o440;
const EXEC_MASK: u32 = 0o110;

/// kubelet's requiresPermissionChange: the volume's root is not a directory of the group with
/// (at least) the group's and owner's bits and setgid.
pub fn requires_permission_change(root: &Path, gid: u32, readonly: bool) -> bool {
    let Ok(md) = std::fs::metadata(root) else {
        return true;
    };
    if md.gid() != gid || !md.is_dir() {
        return true;
    }
    let want = (if readonly { RO_MASK } else { RW_MASK }) | libc::S_ISGID;
    md.mode() & want != want
}

/// kubelet's SetVolumeOwnership: every file and directory of the volume gets group `gid`,
/// the owner's and group's read (and write unless read-only) bits, directories also their
/// search bits and setgid; symlinks are re-owned but never followed or chmod'ed. With
/// OnRootMismatch a root that is right already means nothing is walked.
pub fn set_volume_ownership(dir: &Path, g: FsGroup, readonly: bool) -> Result<()> {
    if g.on_root_mismatch && !requires_permission_change(dir, g.gid, readonly) {
        tracing::debug!(volume = %dir.display(), "fsGroupChangePolicy OnRootMismatch: the volume root is right, skipping");
        return Ok(());
    }
    let mask = if readonly { RO_MASK } else { RW_MASK };
    let change = |path: &Path, md: &std::fs::Metadata| -> Result<()> {
        if md.gid() != g.gid {
            std::os::unix::fs::lchown(path, None, Some(g.gid)).with_context(|| format!("chown {}", path.display()))?;
        }
        if md.file_type().is_symlink() {
            return Ok(());
        }
        let mut mode = (md.mode() & 0o7777) | mask;
        if md.is_dir() {
            mode |= libc::S_ISGID | EXEC_MASK;
        }
        if mode != md.mode() & 0o7777 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("chmod {}", path.display()))?;
        }
        Ok(())
    };
    fn walk(path: &Path, change: &dyn Fn(&Path, &std::fs::Metadata) -> Result<()>) -> Result<()> {
        let md = std::fs::symlink_metadata(path)?;
        change(path, &md)?;
        if md.is_dir() {
            for e in std::fs::read_dir(path)?.flatten() {
                walk(&e.path(), change)?;
            }
        }
        Ok(())
    }
    walk(dir, &change)
}

/// Own every regular file under `dir` by `uid` (symlinks left alone).
pub fn chown_files(dir: &Path, uid: u32) -> Result<()> {
    for e in std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
    {
        let path = e.path();
        let md = std::fs::symlink_metadata(&path)?;
        if md.is_dir() {
            chown_files(&path, uid)?;
        } else if md.is_file() && md.uid() != uid {
            std::os::unix::fs::lchown(&path, Some(uid), None).with_context(|| format!("chown {}", path.display()))?;
        }
    }
    Ok(())
}

/// A container's volumeMounts as runtime bind mounts.
/// `subPathExpr` is expanded with the container's environment (`$(VAR)`), as kubelet does.
pub fn mounts_for(
    c: &Container,
    volumes: &BTreeMap<String, VolumeHost>,
    privileged: bool,
    env: &[(String, String)],
    subpaths: &Path,
) -> Result<Vec<Mount>> {
    let mut out = Vec::new();
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        let v = volumes
            .get(&m.name)
            .ok_or_else(|| anyhow!("volumeMounts[{i}]: volume {:?} not found", m.name))?;
        let mut source = v.path.clone();
        let expanded = match m.sub_path_expr.as_deref().filter(|s| !s.is_empty()) {
            Some(e) => Some(expand_sub_path(e, env)?),
            None => None,
        };
        if let Some(sp) = expanded.as_deref().or(m.sub_path.as_deref()).filter(|s| !s.is_empty()) {
            let create = v.writable_by_us || v.path.is_dir();
            let target = subpaths.join(&m.name).join(&c.name).join(i.to_string());
            source = bind_sub_path(&v.path, sp, create, &target)
                .with_context(|| format!("volumeMounts[{i}]: subPath {sp:?} of volume {:?}", m.name))?;
        }
        let propagation = match m.mount_propagation.as_deref() {
            None | Some("None") => Propagation::Private,
            Some("HostToContainer") => Propagation::HostToContainer,
            Some("Bidirectional") if privileged => Propagation::Bidirectional,
            Some("Bidirectional") => {
                bail!("volumeMounts[{i}]: Bidirectional mount propagation is available only to privileged containers")
            }
            Some(o) => bail!("volumeMounts[{i}]: unknown mountPropagation {o:?}"),
        };
        let read_only = m.read_only.unwrap_or(false);
        let recursive = recursive_read_only(
            read_only,
            m.recursive_read_only.as_deref(),
            propagation,
            mount_setattr_supported(),
        )
        .map_err(|e| anyhow!("volumeMounts[{i}] (volume {:?}): {e}", m.name))?;
        out.push(Mount {
            destination: m.mount_path.clone(),
            source,
            kind: MountKind::Bind,
            readonly: read_only || v.readonly,
            propagation,
            // libcontainer's `rro`: mount_setattr(MOUNT_ATTR_RDONLY, AT_RECURSIVE) on the bind.
            options: if recursive { vec!["rro".to_string()] } else { Vec::new() },
            idmap: v.idmap,
        });
    }
    Ok(out)
}

/// Whether a read-only volumeMount is made read-only recursively (its submounts too), from
/// `recursiveReadOnly` (kubelet's semantics: `Enabled` needs readOnly, no propagation, and a
/// kernel with mount_setattr, else the container is refused; `IfPossible` is recursive when it
/// can be). Unset, ferrolet makes a readOnly mount recursive wherever it can: a read-only
/// hostPath of a tree with mounts in it stays read-only all the way down. `Disabled` keeps
/// kubelet's plain read-only bind.
pub fn recursive_read_only(
    read_only: bool,
    mode: Option<&str>,
    propagation: Propagation,
    supported: bool,
) -> Result<bool> {
    let possible = read_only && propagation == Propagation::Private && supported;
    match mode {
        Some("Disabled") => Ok(false),
        None | Some("") | Some("IfPossible") => Ok(possible),
        Some("Enabled") => {
            if !read_only {
                bail!("recursiveReadOnly Enabled needs readOnly: true");
            }
            if propagation != Propagation::Private {
                bail!("recursiveReadOnly Enabled needs mountPropagation None");
            }
            if !supported {
                bail!("recursiveReadOnly Enabled, but the kernel has no mount_setattr (Linux 5.12 or later) to make it so");
            }
            Ok(true)
        }
        Some(o) => bail!("unknown recursiveReadOnly {o:?} (Disabled, IfPossible or Enabled)"),
    }
}

/// Whether the kernel has mount_setattr(2) (asked once: a call with no mount gets EBADF, not
/// ENOSYS).
pub fn mount_setattr_supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        // SAFETY: an invalid descriptor and no attributes: the kernel touches no memory.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                -1,
                c"".as_ptr(),
                0,
                std::ptr::null_mut::<libc::c_void>(),
                0usize,
            )
        };
        !(r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS))
    })
}

/// Where a pod's subPath bind mounts live: `<pod dir>/volume-subpaths/<volume>/<container>/<n>`
/// (kubelet's layout).
pub fn subpaths_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("volume-subpaths")
}

/// kubelet's safe subPath: `sp` is resolved (and, for a volume the agent manages, created as
/// directories) strictly beneath the volume's root, so a symlink a container planted in the
/// volume cannot lead out of it, and nothing is created outside it; then the opened object
/// itself (`/proc/self/fd/N`) is bind-mounted onto `target`, which is what the container
/// mounts: what it gets is what was checked, whatever the volume holds a moment later. A
/// `target` already bound to the same object (the container's earlier attempt) is reused.
fn bind_sub_path(volume: &Path, sp: &str, create: bool, target: &Path) -> Result<PathBuf> {
    use std::os::fd::AsRawFd;
    let root = ferrolet_fsutil::RootDir::open(volume)?;
    let opened = match root.open_at(sp, libc::O_PATH) {
        Ok(fd) => fd,
        Err(e) if e.is_not_found() && create => {
            let fd = root.create_dir_all(sp, 0o777)?;
            // Created with the umask: a subPath directory is everyone's, as kubelet makes it.
            std::fs::set_permissions(
                format!("/proc/self/fd/{}", fd.as_raw_fd()),
                std::fs::Permissions::from_mode(0o777),
            )
            .context("setting the subPath directory's mode")?;
            fd
        }
        Err(e) if e.is_not_found() => bail!("it does not exist in the volume"),
        Err(e) if e.errno() == Some(libc::EXDEV) || e.errno() == Some(libc::ELOOP) => {
            bail!("it resolves outside the volume")
        }
        Err(e) => return Err(e.into()),
    };
    let magic = PathBuf::from(format!("/proc/self/fd/{}", opened.as_raw_fd()));
    let object = std::fs::metadata(&magic).context("inspecting the subPath")?;
    if let Ok(bound) = std::fs::metadata(target) {
        if bound.dev() == object.dev() && bound.ino() == object.ino() && is_mountpoint(target) {
            return Ok(target.to_path_buf());
        }
        if is_mountpoint(target) {
            ferrolet_runtime::rootfs::unmount(target).with_context(|| format!("unmounting {}", target.display()))?;
        }
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    if object.is_dir() {
        match std::fs::create_dir(target) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(e).with_context(|| format!("creating {}", target.display()))
            }
            _ => {}
        }
    } else {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(target)
            .with_context(|| format!("creating {}", target.display()))?;
    }
    nix::mount::mount(
        Some(&magic),
        target,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .with_context(|| format!("bind-mounting the subPath onto {}", target.display()))?;
    Ok(target.to_path_buf())
}

/// Expand a subPathExpr as kubelet does: every referenced variable must have a non-empty
/// value, and the result must be a relative path without `..`.
pub fn expand_sub_path(expr: &str, env: &[(String, String)]) -> Result<String> {
    let value = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut missing = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("$(") {
        let escaped = i > 0 && rest.as_bytes()[i - 1] == b'$';
        let after = &rest[i + 2..];
        let Some(j) = after.find(')') else { break };
        let name = &after[..j];
        if !escaped && value(name).is_none_or(|v| v.is_empty()) {
            missing.push(name.to_string());
        }
        rest = &after[j + 1..];
    }
    if !missing.is_empty() {
        missing.sort();
        missing.dedup();
        bail!("missing value for {}", missing.join(", "));
    }
    let p = expand(expr, &|n: &str| value(n));
    if p.starts_with('/') {
        bail!("error SubPath `{p}` must not be an absolute path");
    }
    if p.split('/').any(|c| c == "..") {
        bail!("unable to provision SubPath `{p}`: must not contain '..'");
    }
    Ok(p)
}

/// Unmount the subPath binds and the tmpfs volumes, and remove the pod's volume directories
/// (hostPaths are untouched).
pub fn teardown(pod_dir: &Path) -> Result<()> {
    let subpaths = subpaths_dir(pod_dir);
    for m in ferrolet_runtime::rootfs::mounts_under(&subpaths) {
        ferrolet_runtime::rootfs::unmount(&m).with_context(|| format!("unmounting {}", m.display()))?;
    }
    match std::fs::remove_dir_all(&subpaths) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).context("removing the subPath mounts");
        }
        _ => {}
    }
    // tmpfs: memory emptyDirs, secrets, projected volumes.
    for plugin in [
        "kubernetes.io~empty-dir",
        "kubernetes.io~secret",
        "kubernetes.io~projected",
    ] {
        let base = pod_volumes_dir(pod_dir).join(plugin);
        if let Ok(rd) = std::fs::read_dir(&base) {
            for e in rd.flatten() {
                if is_mountpoint(&e.path()) {
                    ferrolet_runtime::rootfs::unmount(&e.path())
                        .with_context(|| format!("unmounting {}", e.path().display()))?;
                }
            }
        }
    }
    // Anything still mounted (a CSI volume its driver did not unpublish) would be emptied
    // through its mount: stop instead.
    let dir = pod_volumes_dir(pod_dir);
    let top = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
    let still = ferrolet_runtime::rootfs::mounts_under(&dir);
    if let Some(m) = still.iter().find(|m| **m != top) {
        anyhow::bail!("not removing the pod's volumes: {} is still mounted", m.display());
    }
    match std::fs::remove_dir_all(pod_volumes_dir(pod_dir)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).context("removing pod volumes"),
    }
}

pub fn is_mountpoint(p: &Path) -> bool {
    let (Ok(a), Ok(b)) = (
        std::fs::metadata(p),
        p.parent()
            .map(std::fs::metadata)
            .unwrap_or_else(|| Err(std::io::Error::other("root"))),
    ) else {
        return false;
    };
    a.dev() != b.dev()
        || std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
            let s = p.display().to_string();
            m.lines().any(|l| l.split(' ').nth(4) == Some(s.as_str()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_path_expr_rules() {
        let env = vec![
            ("POD".to_string(), "p1".to_string()),
            ("EMPTY".to_string(), String::new()),
            ("UP".to_string(), "..".into()),
        ];
        assert_eq!(expand_sub_path("logs/$(POD)", &env).unwrap(), "logs/p1");
        assert_eq!(expand_sub_path("$$(POD)", &env).unwrap(), "$(POD)");
        let e = expand_sub_path("$(EMPTY)/$(NOPE)", &env).unwrap_err().to_string();
        assert_eq!(e, "missing value for EMPTY, NOPE");
        let e = expand_sub_path("$(UP)", &env).unwrap_err().to_string();
        assert!(e.contains("must not contain '..'"), "{e}");
        assert!(expand_sub_path("/abs", &env)
            .unwrap_err()
            .to_string()
            .contains("absolute"));
    }

    #[test]
    fn memory_volume_size_is_kubelets() {
        let gi = 1i64 << 30;
        assert_eq!(empty_dir_memory_size(8 * gi, None, None), 8 * gi);
        assert_eq!(
            empty_dir_memory_size(8 * gi, Some(gi), None),
            gi,
            "the pod's memory limit"
        );
        assert_eq!(empty_dir_memory_size(8 * gi, Some(gi), Some(64 << 20)), 64 << 20);
        assert_eq!(
            empty_dir_memory_size(8 * gi, None, Some(16 * gi)),
            8 * gi,
            "never above allocatable"
        );
        assert_eq!(empty_dir_memory_size(8 * gi, Some(gi), Some(2 * gi)), gi);
        assert_eq!(empty_dir_memory_size(8 * gi, Some(0), Some(0)), 8 * gi);
    }

    #[test]
    fn host_path_types_with_kubelets_messages() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("made/dir");
        check_host_path(&d, "DirectoryOrCreate").unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o755);
        let f = t.path().join("made/f");
        check_host_path(&f, "FileOrCreate").unwrap();
        assert!(f.is_file());
        let msg = |p: &Path, t: &str| check_host_path(p, t).unwrap_err().to_string();
        assert_eq!(
            msg(&f, "Directory"),
            format!("hostPath type check failed: {} is not a directory", f.display())
        );
        assert_eq!(
            msg(&d, "FileOrCreate"),
            format!("hostPath type check failed: {} is not a file", d.display())
        );
        assert_eq!(
            msg(&d, "Socket"),
            format!("hostPath type check failed: {} is not a socket file", d.display())
        );
        assert_eq!(
            msg(&d, "CharDevice"),
            format!("hostPath type check failed: {} is not a character device", d.display())
        );
        assert_eq!(
            msg(&d, "BlockDevice"),
            format!("hostPath type check failed: {} is not a block device", d.display())
        );
        let gone = t.path().join("gone");
        assert_eq!(
            msg(&gone, "Directory"),
            format!("hostPath type check failed: {} is not a directory", gone.display())
        );
        assert_eq!(msg(&d, "Dir"), "Dir is an invalid volume type");
        check_host_path(Path::new("/dev/null"), "CharDevice").unwrap();
        check_host_path(&gone, "").unwrap();
        assert!(!gone.exists());
    }

    #[test]
    fn fs_group_ownership_and_on_root_mismatch() {
        let t = tempfile::tempdir().unwrap();
        let v = t.path().join("v");
        std::fs::create_dir_all(v.join("sub")).unwrap();
        std::fs::write(v.join("sub/f"), "x").unwrap();
        std::fs::set_permissions(v.join("sub/f"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", v.join("link")).unwrap();
        let g = FsGroup {
            gid: 4321,
            on_root_mismatch: true,
        };
        assert!(requires_permission_change(&v, 4321, false));
        set_volume_ownership(&v, g, false).unwrap();
        let f = std::fs::metadata(v.join("sub/f")).unwrap();
        assert_eq!((f.gid(), f.mode() & 0o7777), (4321, 0o660));
        let d = std::fs::metadata(v.join("sub")).unwrap();
        assert_eq!(d.mode() & 0o2770, 0o2770);
        assert_ne!(
            std::fs::metadata("/etc/passwd").unwrap().gid(),
            4321,
            "symlinks are not followed"
        );
        assert!(!requires_permission_change(&v, 4321, false));
        // OnRootMismatch: the root is right, a file changed since is left alone.
        std::os::unix::fs::lchown(v.join("sub/f"), None, Some(0)).unwrap();
        set_volume_ownership(&v, g, false).unwrap();
        assert_eq!(std::fs::metadata(v.join("sub/f")).unwrap().gid(), 0);
        // Always walks everything again.
        set_volume_ownership(
            &v,
            FsGroup {
                on_root_mismatch: false,
                ..g
            },
            false,
        )
        .unwrap();
        assert_eq!(std::fs::metadata(v.join("sub/f")).unwrap().gid(), 4321);
    }

    #[test]
    fn recursive_read_only_modes() {
        let p = Propagation::Private;
        assert!(recursive_read_only(true, None, p, true).unwrap());
        assert!(!recursive_read_only(true, None, p, false).unwrap());
        assert!(!recursive_read_only(false, None, p, true).unwrap());
        assert!(!recursive_read_only(true, Some("Disabled"), p, true).unwrap());
        assert!(!recursive_read_only(true, Some("IfPossible"), Propagation::HostToContainer, true).unwrap());
        assert!(recursive_read_only(true, Some("Enabled"), p, true).unwrap());
        assert!(recursive_read_only(false, Some("Enabled"), p, true).is_err());
        let e = recursive_read_only(true, Some("Enabled"), p, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("mount_setattr"), "{e}");
        assert!(recursive_read_only(true, Some("Enabled"), Propagation::HostToContainer, true).is_err());
        assert!(mount_setattr_supported(), "this kernel has mount_setattr");
    }
}
