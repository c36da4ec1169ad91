//! Containers built in a mount namespace that holds none of the other pods' mounts.
//!
//! Every pod adds mounts under the runtime's root directory (its namespace pins, its /dev/shm,
//! an overlay per container, memory-backed volumes): a node with 100 pods has some 500 more
//! mount table entries than an empty one. Building a container reads and copies that table
//! several times over: libcontainer's cgroup v1 manager parses `/proc/self/mountinfo` once per
//! controller it looks up (the whole table for each controller the node does not mount), the
//! container's init parses it again, and the kernel copies it into the new mount namespace and
//! detaches it after `pivot_root`. A pod's start grew with the pods already running
//! (docs/start-path.md).
//!
//! So, when the agent asks for it ([`crate::Runtime::isolate_mounts`]):
//! - the root directory is a mount of its own with private propagation (a bind mount of itself
//!   if it is not a mount point yet, made only while nothing is mounted below it): the pods'
//!   mounts under it no longer propagate into any other mount namespace;
//! - the zygote moves into a mount namespace of its own, a slave of the host's (mounts made
//!   elsewhere on the host still reach it, and through it the containers), where the root is
//!   a copy of the root's mount alone: it sees the root's files, none of the pods' mounts; and
//!   of the host's other mounts it keeps only `/`, /proc, /sys, /dev and the mounts the root
//!   lies on (`kept_in_copy`), so that it holds no disk or tmpfs the host unmounts;
//! - a monitor mounts its container's rootfs in the host's namespace as before, takes detached
//!   copies (`open_tree`) of the host's mounts its container's spec names (under the root:
//!   rootfs, namespace pins, /dev/shm, volumes; elsewhere: the sources of bind mounts, as the
//!   host has them now), then enters a namespace of its own made from the zygote's and
//!   attaches them (`move_mount`) at the same paths. libcontainer then builds the container
//!   from a table of a few dozen entries, whatever the node runs, and the monitor goes back to
//!   the host's namespace.
//!
//! A container whose mounts must propagate back to the host (`rshared`, Kubernetes'
//! Bidirectional) is built in the host's namespace, as are all containers when the kernel
//! lacks `open_tree` (Linux < 5.2) or the setup fails, and a container whose mounts cannot all
//! be copied (a bind mount of `/`, a path whose directory the zygote's copy lacks).

use std::ffi::CString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::mount_api::{move_mount, open_tree, AT_RECURSIVE, OPEN_TREE_CLONE};

/// Marks a root directory whose mount is a bind mount of itself made by
/// [`make_root_private`]: [`release_root`] undoes only that.
const SELF_BIND_MARK: &str = ".self-bind";

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))
}

fn with_path(e: io::Error, what: &str, p: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()))
}

/// The mount id of the mount `p` is on (statx `STATX_MNT_ID`), following symlinks.
pub(crate) fn mount_id(p: &Path) -> io::Result<u64> {
    let c = cstr(p)?;
    // SAFETY: statx fills the zeroed struct; the path is a valid C string. nix 0.29 has no
    // statx (the mount id is only there).
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_MNT_ID, &mut st) };
    if r != 0 {
        return Err(with_path(io::Error::last_os_error(), "statx", p));
    }
    if st.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "statx gives no mount id"));
    }
    Ok(st.stx_mnt_id)
}

/// Whether `p` (resolved) is a mount point: its mount is not its parent directory's.
fn is_mount_point(p: &Path) -> io::Result<bool> {
    match p.parent() {
        Some(parent) => Ok(mount_id(p)? != mount_id(parent)?),
        None => Ok(true),
    }
}

/// The host's mounts the zygote's copy of its namespace keeps, besides the root's own mount
/// (alone): what the namespace a container is built in must have, /proc, /sys with the cgroup
/// hierarchies, /dev with its pts, shm and mqueue, the mounts the root dir lies on (`/` among
/// them), and those the zygote's working directory lies on (the agent's, which holds them
/// anyway; libcontainer asks for it, and a detached one has no path). Every other mount is
/// detached from the copy: held there, a disk or a tmpfs the host unmounts would live on
/// (other roots' pods' mounts, private by design, among them).
fn kept_in_copy(root: &Path, cwd: Option<&Path>, at: &Path) -> bool {
    ["/proc", "/sys", "/dev"].iter().any(|k| at.starts_with(k))
        || root.starts_with(at)
        || cwd.is_some_and(|c| c.starts_with(at))
}

/// Make `root` a mount with private propagation: a bind mount of itself if it is not a mount
/// point (marked, so [`release_root`] can undo it), else the mount it is. Refused while
/// something is mounted below a root that is not a mount point: a bind made over them would
/// hide them from the agent (their unmounts and the reset would miss them).
pub fn make_root_private(root: &Path) -> io::Result<()> {
    let root = std::fs::canonicalize(root).map_err(|e| with_path(e, "resolving", root))?;
    if !is_mount_point(&root)? {
        let below = crate::rootfs::mounts_under(&root);
        if !below.is_empty() {
            return Err(io::Error::other(format!(
                "{} mounts are below {} (the first: {}), which is not a mount point of its own; pods' mounts go on being made in the host's mount namespace until an agent starts with none",
                below.len(),
                root.display(),
                below[0].display()
            )));
        }
        // The mark first: an agent killed in between leaves a mark without a bind mount, which
        // release_root passes over, never a bind mount it would not undo.
        std::fs::write(root.join(SELF_BIND_MARK), b"").map_err(|e| with_path(e, "marking", &root))?;
        nix::mount::mount(
            Some(root.as_path()),
            root.as_path(),
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| with_path(e.into(), "bind-mounting on itself", &root))?;
    }
    nix::mount::mount(
        None::<&str>,
        root.as_path(),
        None::<&str>,
        nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| with_path(e.into(), "making private the mount of", &root))
}

/// Undo [`make_root_private`]'s bind mount, once nothing is mounted below it any more.
/// Returns whether there was one to undo.
pub fn release_root(root: &Path) -> io::Result<bool> {
    let mark = root.join(SELF_BIND_MARK);
    if !mark.exists() {
        return Ok(false);
    }
    let root = std::fs::canonicalize(root).map_err(|e| with_path(e, "resolving", root))?;
    if is_mount_point(&root)? {
        // Busy (a process's working directory in it): detached instead, which hides nothing,
        // as the mount shows the very directory it covers.
        nix::mount::umount(root.as_path())
            .or_else(|e| match e {
                nix::errno::Errno::EBUSY => nix::mount::umount2(root.as_path(), nix::mount::MntFlags::MNT_DETACH),
                e => Err(e),
            })
            .map_err(|e| with_path(e.into(), "unmounting", &root))?;
    }
    // The mark is in the directory itself, seen with or without the bind mount.
    std::fs::remove_file(&mark).map_err(|e| with_path(e, "removing", &mark))?;
    Ok(true)
}

/// What the zygote keeps once it has its own mount namespace: the host's and its own, for
/// its forks to go between.
pub(crate) struct Isolated {
    pub host: OwnedFd,
    pub own: OwnedFd,
    pub root: PathBuf,
    /// The working directory the zygote had (and its forks have), resolved.
    pub cwd: Option<PathBuf>,
}

fn open_ns(path: &str) -> io::Result<OwnedFd> {
    let f = std::fs::File::open(path).map_err(|e| with_path(e, "opening", Path::new(path)))?;
    Ok(f.into())
}

fn setns(fd: &OwnedFd) -> io::Result<()> {
    use std::os::fd::AsFd;
    nix::sched::setns(fd.as_fd(), nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("setns (mount): {e}")))
}

/// In the zygote (one thread): leave the host's mount namespace for a slave copy of it without
/// the root directory's mount. The root must be a private mount already
/// ([`make_root_private`]). Called in the host's namespace; on failure the zygote is back in
/// it.
pub(crate) fn isolate(root: &Path) -> io::Result<Isolated> {
    // The kernel must have open_tree for the monitors (Linux 5.2): ask it with a harmless call.
    open_tree(Path::new("/"), 0).map_err(|e| io::Error::new(e.kind(), format!("open_tree: {e}")))?;
    let host = open_ns("/proc/self/ns/mnt")?;
    let root = std::fs::canonicalize(root).map_err(|e| with_path(e, "resolving", root))?;
    if !is_mount_point(&root)? {
        return Err(io::Error::other(format!("{} is not a mount point", root.display())));
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| io::Error::other(format!("unshare (mount): {e}")))?;
    let undo = |e: io::Error| {
        let _ = setns(&host);
        e
    };
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| undo(io::Error::other(format!("making / a slave mount: {e}"))))?;
    // The root's own mount without what is mounted below it: a copy of it alone replaces it
    // with everything below. (A root that is a disk of its own shows its files; a bind mount
    // of itself, the same directory the host's `/` has there.)
    let alone = open_tree(&root, OPEN_TREE_CLONE).map_err(|e| undo(with_path(e, "copying the mount", &root)))?;
    nix::mount::umount2(root.as_path(), nix::mount::MntFlags::MNT_DETACH)
        .map_err(|e| undo(with_path(e.into(), "detaching", &root)))?;
    move_mount(&alone, &root).map_err(|e| undo(with_path(e, "attaching the mount copy at", &root)))?;
    let cwd = std::env::current_dir().ok();
    detach_unkept(&root, cwd.as_deref()).map_err(undo)?;
    let own = open_ns("/proc/self/ns/mnt").map_err(undo)?;
    Ok(Isolated { host, own, root, cwd })
}

/// In the zygote's new namespace: detach every mount [`kept_in_copy`] does not keep, outermost
/// first (a detach takes what is below it along). A slave's unmounts do not reach the host.
fn detach_unkept(root: &Path, cwd: Option<&Path>) -> io::Result<()> {
    let mut points = crate::rootfs::try_mounts_under(Path::new("/"))
        .map_err(|e| io::Error::new(e.kind(), format!("reading the zygote's mount table: {e}")))?;
    points.reverse();
    let mut gone: Vec<PathBuf> = Vec::new();
    for m in points {
        if kept_in_copy(root, cwd, &m) || m.starts_with(root) || gone.iter().any(|g| m.starts_with(g)) {
            continue;
        }
        match nix::mount::umount2(m.as_path(), nix::mount::MntFlags::MNT_DETACH) {
            Ok(()) => gone.push(m),
            // Not a mount point at that path any more: a mount hidden under a later one at
            // the same place, or one that went with an ancestor.
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(with_path(e.into(), "detaching from the zygote's copy", &m)),
        }
    }
    Ok(())
}

/// A host mount a container's namespace needs a copy of.
#[derive(Debug, PartialEq)]
struct Needed {
    at: PathBuf,
    /// With whatever is mounted below it (else the mount alone).
    below: bool,
}

/// Of `paths` (what a container's spec names: rootfs, namespace files, mount sources), the
/// host's mounts to bring along, as they are now, outermost first:
/// - below `root`, for each path that is not on the root's own mount, the outermost mount point
///   between the root and it, with what is below it;
/// - elsewhere, the path itself with whatever is mounted below it (the zygote's copy may
///   predate a disk the host mounted since), after each mount it lies in that the zygote's copy
///   lacks ([`kept_in_copy`]), alone: a hostPath on a disk of its own needs that disk's mount
///   for its directory to be there.
///
/// Paths under /proc (another container's namespaces) are the same everywhere and need
/// nothing. `/` itself is refused: a copy of everything, which could not be attached over the
/// namespace's root anyway.
fn mounts_needed(root: &Path, cwd: Option<&Path>, paths: &[PathBuf]) -> io::Result<Vec<Needed>> {
    let root_id = mount_id(root)?;
    let mut out: Vec<Needed> = Vec::new();
    let mut add = |at: &Path, below: bool| {
        if out
            .iter()
            .any(|o| (o.below && at.starts_with(&o.at)) || (!below && o.at == at))
        {
            return;
        }
        if below {
            out.retain(|o| !o.at.starts_with(at));
        }
        out.push(Needed {
            at: at.to_path_buf(),
            below,
        });
    };
    for p in paths {
        // Resolved as the root is (symlinks, `..`): the spec names paths as it was given them.
        // A namespace file under /proc resolves to no path: its directory does.
        let p = std::fs::canonicalize(p)
            .or_else(|_| match (p.parent(), p.file_name()) {
                (Some(dir), Some(name)) => std::fs::canonicalize(dir).map(|d| d.join(name)),
                _ => Ok(p.clone()),
            })
            .unwrap_or_else(|_| p.clone());
        let Ok(rel) = p.strip_prefix(root) else {
            if p == Path::new("/") {
                return Err(io::Error::new(io::ErrorKind::Unsupported, "a bind mount of /"));
            }
            if p.starts_with("/proc") || p.symlink_metadata().is_err() {
                continue;
            }
            let mut at = PathBuf::from("/");
            let mut outer = mount_id(&at)?;
            for part in p.parent().into_iter().flat_map(Path::components).skip(1) {
                at.push(part);
                let id = mount_id(&at)?;
                if id != outer && !kept_in_copy(root, cwd, &at) {
                    add(&at, false);
                }
                outer = id;
            }
            add(&p, true);
            continue;
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        // The outermost ancestor (or the path itself) whose mount is not the root's.
        let mut at = root.to_path_buf();
        for part in rel.components() {
            at.push(part);
            match mount_id(&at) {
                Ok(id) if id != root_id => {
                    add(&at, true);
                    break;
                }
                Ok(_) => {}
                // Missing: nothing to bring (libcontainer reports the path if it matters).
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) => return Err(e),
            }
        }
    }
    out.sort_by_key(|n| n.at.components().count());
    Ok(out)
}

/// In a monitor forked from an isolated zygote, before libcontainer builds the container:
/// copy the host's mounts that `paths` need ([`mounts_needed`]; taken in the host's
/// namespace, where the rootfs was just mounted), then move into a namespace of this process's
/// own, made from the zygote's, and attach them at the same paths. Called in the host's
/// namespace. Ok(false): something could not be copied or attached (a path inside a mount the
/// zygote's copy lacks, say), and the process is back in the host's namespace, to build the
/// container there as without isolation. An error only when it could not get back.
pub(crate) fn enter_private(iso: &Isolated, paths: &[PathBuf]) -> io::Result<bool> {
    let trees = || -> io::Result<Vec<(PathBuf, OwnedFd)>> {
        let mut trees = Vec::new();
        for m in mounts_needed(&iso.root, iso.cwd.as_deref(), paths)? {
            let flags = OPEN_TREE_CLONE | if m.below { AT_RECURSIVE } else { 0 };
            let fd = open_tree(&m.at, flags).map_err(|e| with_path(e, "copying the mount", &m.at))?;
            trees.push((m.at, fd));
        }
        Ok(trees)
    };
    let Ok(trees) = trees() else {
        return Ok(false);
    };
    let attached = (|| -> io::Result<()> {
        setns(&iso.own)?;
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
            .map_err(|e| io::Error::other(format!("unshare (mount): {e}")))?;
        for (m, fd) in &trees {
            move_mount(fd, m).map_err(|e| with_path(e, "attaching the mount copy at", m))?;
        }
        Ok(())
    })();
    match attached {
        Ok(()) => Ok(true),
        Err(_) => enter_host(iso).map(|()| false),
    }
}

/// What a container in a user namespace is built from: copies of the host paths its spec names,
/// attached under a tmpfs at `root` in the monitor's namespace, where its spec names them. Its
/// init, root of the user namespace and nothing on the host, could not always reach them
/// where they are (a private directory on the way; runc passes it mount fds for that reason):
/// it finds each at the root of a mount of its own.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Staging {
    pub root: PathBuf,
    pub items: Vec<StageItem>,
    /// The user namespace the idmapped items are mapped through.
    pub userns: PathBuf,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StageItem {
    pub from: PathBuf,
    pub to: PathBuf,
    #[serde(default)]
    pub idmap: bool,
}

/// In a monitor of an isolated zygote, in the host's namespace: copy every item (idmapped where
/// asked), then enter a new namespace of the zygote's, mount a tmpfs at the staging root and
/// attach the copies there.
pub(crate) fn enter_staged(iso: &Isolated, staging: &Staging) -> io::Result<()> {
    let mut trees = Vec::with_capacity(staging.items.len());
    for item in &staging.items {
        let tree = if item.idmap {
            crate::idmap::idmapped_copy(&item.from, &staging.userns, true)?
        } else {
            open_tree(&item.from, OPEN_TREE_CLONE | AT_RECURSIVE)
                .map_err(|e| with_path(e, "copying the mount", &item.from))?
        };
        let dir = std::fs::metadata(&item.from).map(|m| m.is_dir()).unwrap_or(true);
        trees.push((tree, dir));
    }
    setns(&iso.own)?;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| io::Error::other(format!("unshare (mount): {e}")))?;
    nix::mount::mount(
        Some("ferrolet-stage"),
        &staging.root,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some("mode=0755,size=64k"),
    )
    .map_err(|e| with_path(e.into(), "mounting the staging tmpfs on", &staging.root))?;
    for (item, (tree, dir)) in staging.items.iter().zip(&trees) {
        if *dir {
            std::fs::create_dir_all(&item.to)?;
        } else {
            if let Some(parent) = item.to.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::File::create(&item.to)?;
        }
        move_mount(tree, &item.to).map_err(|e| with_path(e, "attaching the staged copy at", &item.to))?;
    }
    Ok(())
}

/// Run `f` in the host's mount namespace and come back to the zygote's: what a worker opens
/// there (a pinned namespace: the zygote's copy has only the files the pins are mounted on).
pub(crate) fn in_host<T>(iso: &Isolated, f: impl FnOnce() -> T) -> io::Result<T> {
    enter_host(iso)?;
    let out = f();
    setns(&iso.own)?;
    Ok(out)
}

/// Enter the host's mount namespace (a fork of an isolated zygote that mounts for the host:
/// a monitor's rootfs, a pod's namespace pins).
pub(crate) fn enter_host(iso: &Isolated) -> io::Result<()> {
    setns(&iso.host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_ids_tell_mounts_apart() {
        assert_eq!(mount_id(Path::new("/")).unwrap(), mount_id(Path::new("/")).unwrap());
        assert_ne!(mount_id(Path::new("/")).unwrap(), mount_id(Path::new("/proc")).unwrap());
        assert_eq!(
            mount_id(Path::new("/proc/self")).unwrap(),
            mount_id(Path::new("/proc")).unwrap()
        );
        assert!(mount_id(Path::new("/no/such/path")).is_err());
    }

    #[test]
    fn the_zygotes_copy_keeps_what_containers_are_built_from() {
        let root = Path::new("/var/lib/ferrolet");
        let kept = [
            "/",
            "/var",
            "/var/lib",
            "/var/lib/ferrolet",
            "/proc",
            "/proc/sys/fs/binfmt_misc",
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/memory",
            "/dev",
            "/dev/shm",
            "/dev/pts",
        ];
        for kept in kept {
            assert!(kept_in_copy(root, None, Path::new(kept)), "{kept}");
        }
        for gone in [
            "/var/log",
            "/data",
            "/devices",
            "/mnt/disk",
            "/run",
            "/var/lib/other-root",
        ] {
            assert!(!kept_in_copy(root, None, Path::new(gone)), "{gone}");
        }
        let cwd = Some(Path::new("/data/build/repo"));
        for kept in ["/data", "/data/build/repo"] {
            assert!(kept_in_copy(root, cwd, Path::new(kept)), "{kept}");
        }
        assert!(!kept_in_copy(root, cwd, Path::new("/data/other")));
    }

    #[test]
    fn mount_points_are_told_from_directories() {
        assert!(is_mount_point(Path::new("/")).unwrap());
        assert!(is_mount_point(Path::new("/proc")).unwrap());
        assert!(!is_mount_point(Path::new("/proc/self")).unwrap());
    }

    #[test]
    fn the_mounts_a_container_needs_copied() {
        // /proc stands for a mount below the root "/".
        let root = Path::new("/");
        let paths = [
            PathBuf::from("/proc/self/ns/net"),
            PathBuf::from("/proc/self/ns/ipc"),
            PathBuf::from("/proc"),
            PathBuf::from("/etc/hostname"),
            PathBuf::from("/no/such/path"),
            PathBuf::from("/elsewhere").join(".."),
            PathBuf::from("/etc/../proc/self/ns/uts"),
        ];
        let needed = mounts_needed(root, None, &paths).unwrap();
        let whole = |at: &str| Needed {
            at: PathBuf::from(at),
            below: true,
        };
        assert_eq!(needed, vec![whole("/proc")]);
        // Outside the root: the path itself with what is below it, except under /proc.
        let elsewhere = Path::new("/proc/self");
        let paths = [
            PathBuf::from("/etc/hostname"),
            PathBuf::from("/etc"),
            PathBuf::from("/proc/self/ns/net"),
            PathBuf::from("/no/such/path"),
        ];
        assert_eq!(mounts_needed(elsewhere, None, &paths).unwrap(), vec![whole("/etc")]);
        let all = [PathBuf::from("/")];
        assert!(
            mounts_needed(elsewhere, None, &all).is_err(),
            "a bind mount of / is refused"
        );
    }
}
