//! Paths resolved strictly beneath a directory: the defence against symlink and `..` escapes
//! when the content of a directory is not trusted (an image layer being unpacked, a volume a
//! container can write to before its subPath is mounted).
//!
//! A path checked with `canonicalize` and then used by name is not safe: every component is
//! looked up again when it is used, and a component can be a symlink (made by the layer
//! itself, or swapped in by a container between the check and the use) that leads outside.
//! [`RootDir`] never uses a name twice. It holds an `O_PATH` fd of the root and resolves each
//! path relative to that fd in one step that refuses to leave it, then hands out fds; callers
//! create, open, link or remove the *last* component relative to the fd of its parent with
//! the `*at` system calls, so nothing is looked up by name again.
//!
//! Resolution rules (those of `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`):
//! - symlinks are followed while they stay beneath the root: a relative target that stays
//!   inside is fine, `..` that would climb above the root is refused, and so is every
//!   absolute symlink target (it is not re-rooted, as `RESOLVE_IN_ROOT` would do);
//! - `..` in the path itself is allowed as long as it does not climb above the root;
//! - absolute paths are refused (`rel` is always relative to the root);
//! - magic links (`/proc/<pid>/fd/*` and the like) are never followed;
//! - mount points are crossed.
//!
//! A refused escape is an [`Error`] whose errno is `EXDEV`
//! ([`Error::is_escape`](crate::Error::is_escape)). The kernel does this with `openat2`
//! (Linux 5.6). Where `openat2` is missing (`ENOSYS`, or `EPERM` from a seccomp filter) the
//! same rules are applied by a walk: one component at a time with `O_PATH | O_NOFOLLOW`,
//! reading each symlink with `readlinkat` and expanding it in place, keeping the fds of the
//! directories walked so far for `..`. Both ways are race-free against a component being
//! swapped for a symlink meanwhile: a swapped-in symlink is itself resolved beneath the root.
//!
//! [`RootDir::open_in_root`] resolves as if the root were `/` instead
//! (`RESOLVE_IN_ROOT`): an absolute symlink target or path starts again at the root and `..` at
//! the root stays there, as a container sees its root filesystem. Nothing escapes either way;
//! beneath refuses what in-root re-roots.
//!
//! The root itself is trusted: [`RootDir::open`] follows symlinks in its own path.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::at::{self, Mode, OFlag, ResolveFlag, SFlag};
use crate::error::{Error, Result};

/// Symlinks expanded in one resolution before it fails with `ELOOP`, as the kernel's limit.
const MAX_SYMLINKS: u32 = 40;

/// Set once `openat2` turned out to be missing: every later resolution walks.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// A directory whose content is not trusted, held open; every path given to its methods is
/// resolved beneath it: symlinks are followed only while they stay beneath it, absolute
/// symlink targets and `..` above it are refused (`EXDEV`), magic links are never followed.
/// The kernel enforces this with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`; without
/// `openat2` a component walk (`O_PATH | O_NOFOLLOW`, `readlinkat`) applies the same rules.
///
/// Typical use: create or replace the last component of `rel` without following it:
///
/// ```no_run
/// # fn main() -> ferrolet_fsutil::Result<()> {
/// use ferrolet_fsutil::RootDir;
/// let root = RootDir::open("/var/lib/x/layer")?;
/// let (dir, name) = root.create_parent("usr/bin/tool", 0o755)?;
/// // create `name` in `dir` with mknodat / symlinkat / openat(O_CREAT | O_EXCL | O_NOFOLLOW)
/// # let _ = (dir, name);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RootDir {
    fd: OwnedFd,
    path: PathBuf,
    in_root: bool,
}

impl RootDir {
    /// Open the directory `path` as a root. `path` itself is trusted (its symlinks are
    /// followed); only what lies beneath it is not.
    pub fn open(path: impl AsRef<Path>) -> Result<RootDir> {
        Self::open_mode(path.as_ref(), false)
    }

    /// Open the directory `path` as the root of a filesystem tree (a container's root
    /// filesystem): paths and absolute symlink targets are resolved from it as from `/`, and
    /// `..` at it stays at it (`RESOLVE_IN_ROOT`), so an image's `/lib -> /usr/lib` works and
    /// `/x -> /etc` is the tree's `etc`, never the host's. Otherwise as [`open`](Self::open).
    pub fn open_in_root(path: impl AsRef<Path>) -> Result<RootDir> {
        Self::open_mode(path.as_ref(), true)
    }

    fn open_mode(path: &Path, in_root: bool) -> Result<RootDir> {
        // O_RDONLY is 0: std's read access adds nothing to O_PATH (and std adds O_CLOEXEC).
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        Ok(RootDir {
            fd: file.into(),
            path: path.to_path_buf(),
            in_root,
        })
    }

    /// The root's path as given (for messages; never used to reach the root again).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Open `rel` beneath the root with `flags` (`libc::O_*`; `O_CLOEXEC` is always added).
    /// Symlinks are followed beneath the root, the last one too unless `flags` has
    /// `O_NOFOLLOW` (then, with `O_PATH`, the fd is of the symlink itself). `O_CREAT` and
    /// `O_TMPFILE` are refused (`EINVAL`): create with [`create_parent`](Self::create_parent)
    /// and the `*at` calls. An empty `rel` (or `.`) is the root itself.
    pub fn open_at(&self, rel: impl AsRef<Path>, flags: libc::c_int) -> Result<OwnedFd> {
        let rel = rel.as_ref();
        resolve(self.fd.as_fd(), rel, flags, self.in_root).map_err(|e| self.err("opening", rel, e))
    }

    /// An `O_PATH` fd of the directory `rel` (symlinks followed beneath the root).
    pub fn open_dir(&self, rel: impl AsRef<Path>) -> Result<OwnedFd> {
        self.open_at(rel, libc::O_PATH | libc::O_DIRECTORY)
    }

    /// Make the directory `rel` and any missing parents with `mode` (subject to the umask),
    /// like `mkdir -p`, each step resolved beneath the root; existing directories (and
    /// symlinks to directories beneath the root) are used as they are. Returns an `O_PATH` fd
    /// of the directory. A dangling symlink on the way is an error (`ENOENT`), not followed
    /// to create its target.
    pub fn create_dir_all(&self, rel: impl AsRef<Path>, mode: u32) -> Result<OwnedFd> {
        let rel = rel.as_ref();
        mkdir_all(self.fd.as_fd(), rel, mode, self.in_root).map_err(|e| self.err("creating directory", rel, e))
    }

    /// The directory that holds `rel`'s last component, resolved beneath the root, as an
    /// `O_PATH` fd, and that last component's name. Work on the name only with `*at` calls
    /// that do not follow it (`mknodat`, `symlinkat`, `openat` with `O_NOFOLLOW`, `unlinkat`,
    /// `fchownat` with `AT_SYMLINK_NOFOLLOW`...). `rel` must end in a name (not `.`, `..` or
    /// nothing): `EINVAL` otherwise.
    pub(crate) fn open_parent(&self, rel: impl AsRef<Path>) -> Result<(OwnedFd, OsString)> {
        let rel = rel.as_ref();
        let (parent, name) = split_last(rel).map_err(|e| self.err("opening the parent of", rel, e))?;
        let fd = resolve(self.fd.as_fd(), parent, libc::O_PATH | libc::O_DIRECTORY, self.in_root)
            .map_err(|e| self.err("opening the parent of", rel, e))?;
        Ok((fd, name))
    }

    /// Like [`open_parent`](Self::open_parent), creating missing parent directories with
    /// `mode` as [`create_dir_all`](Self::create_dir_all) does.
    pub fn create_parent(&self, rel: impl AsRef<Path>, mode: u32) -> Result<(OwnedFd, OsString)> {
        let rel = rel.as_ref();
        let (parent, name) = split_last(rel).map_err(|e| self.err("creating the parent of", rel, e))?;
        let fd = mkdir_all(self.fd.as_fd(), parent, mode, self.in_root)
            .map_err(|e| self.err("creating the parent of", rel, e))?;
        Ok((fd, name))
    }

    /// Remove `rel` and, if it is a directory, everything in it. The last component is not
    /// followed (a symlink is removed, not its target) and nothing below it is either. A
    /// missing `rel` is fine; returns whether something was removed.
    pub fn remove_all(&self, rel: impl AsRef<Path>) -> Result<bool> {
        let rel = rel.as_ref();
        let (parent, name) = match self.open_parent(rel) {
            Ok(x) => x,
            Err(e) if e.is_not_found() => return Ok(false),
            Err(e) => return Err(e),
        };
        remove_all_at(parent.as_fd(), &name).map_err(|e| self.err("removing", rel, e))
    }

    /// The error of an operation on `rel`: says what, on which path beneath which root; the
    /// cause is the system call's errno (the inner step's own context is left out).
    fn err(&self, what: &str, rel: &Path, e: Error) -> Error {
        let e = cause(e);
        let context = if e.raw_os_error() == Some(libc::EXDEV) && !self.in_root {
            format!(
                "{what} {}: it leads outside {} (through `..` or a symlink)",
                rel.display(),
                self.path.display()
            )
        } else {
            format!("{what} {} beneath {}", rel.display(), self.path.display())
        };
        Error::io(context, e)
    }
}

impl AsFd for RootDir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Remove the entry `name` of the directory `dir`, recursively if it is a directory, never
/// following a symlink. A missing entry is fine; returns whether something was removed.
pub fn remove_all_at(dir: BorrowedFd<'_>, name: &OsStr) -> Result<bool> {
    let e = match at::unlink(dir, name) {
        Ok(()) => return Ok(true),
        Err(e) => e,
    };
    match e.errno() {
        Some(libc::ENOENT) => return Ok(false),
        Some(libc::EISDIR) | Some(libc::EPERM) => {}
        _ => return Err(e),
    }
    // A directory (EPERM is what some filesystems say for unlink of a directory).
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW;
    let sub = match at::open(dir, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        // not a directory after all: the unlink's error is the one to report
        Err(_) => return Err(e),
    };
    for child in at::list(sub.as_fd())? {
        remove_all_at(sub.as_fd(), &child)?;
    }
    match at::rmdir(dir, name) {
        Err(e) if !e.is_not_found() => Err(e),
        _ => Ok(true),
    }
}

fn split_last(rel: &Path) -> Result<(&Path, OsString)> {
    match rel.components().next_back() {
        Some(Component::Normal(n)) => Ok((rel.parent().unwrap_or(Path::new("")), n.to_os_string())),
        _ => Err(errno(libc::EINVAL)),
    }
}

/// An error of a step whose context the caller gives ([`RootDir::err`]): only the errno counts.
fn errno(n: i32) -> Error {
    Error::sys("resolving", nix::errno::Errno::from_raw(n))
}

/// The cause of a step's error, as the `io::Error` the resolution's errors have always had.
fn cause(e: Error) -> io::Error {
    match e {
        Error::Io { source, .. } => source,
        Error::Sys { source, .. } => source.into(),
        e @ Error::Json { .. } => io::Error::other(e),
    }
}

fn no_nul() -> Error {
    Error::io(
        "resolving",
        io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"),
    )
}

/// Check `rel`: beneath the root an absolute path is refused like openat2 does (EXDEV); in
/// the root it starts at the root.
fn check_rel(rel: &Path, in_root: bool) -> Result<&Path> {
    if rel.as_os_str().as_bytes().contains(&0) {
        return Err(no_nul());
    }
    match rel.strip_prefix("/") {
        Ok(stripped) if in_root => Ok(stripped),
        Ok(_) => Err(errno(libc::EXDEV)),
        Err(_) => Ok(rel),
    }
}

/// Resolve `rel` beneath (or in) `root` and open it with `flags`.
fn resolve(root: BorrowedFd<'_>, rel: &Path, flags: libc::c_int, in_root: bool) -> Result<OwnedFd> {
    // O_TMPFILE includes O_DIRECTORY: compare all of its bits.
    if flags & libc::O_CREAT != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE {
        return Err(errno(libc::EINVAL));
    }
    let rel = check_rel(rel, in_root)?;
    if !NO_OPENAT2.load(Ordering::Relaxed) && !force_walk() {
        match openat2_beneath(root, rel, flags, in_root) {
            Err(e) if e.errno() == Some(libc::ENOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
            // A rename elsewhere raced with `..`: the walk below is race-free too. EPERM is
            // what some seccomp filters answer for system calls they do not know; a real
            // EPERM comes again from the walk.
            Err(e) if matches!(e.errno(), Some(libc::EAGAIN) | Some(libc::EPERM)) => {}
            r => return r,
        }
    }
    walk(root, rel, flags, in_root)
}

fn openat2_beneath(root: BorrowedFd<'_>, rel: &Path, flags: libc::c_int, in_root: bool) -> Result<OwnedFd> {
    let path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let resolve = ResolveFlag::RESOLVE_NO_MAGICLINKS
        | if in_root {
            ResolveFlag::RESOLVE_IN_ROOT
        } else {
            ResolveFlag::RESOLVE_BENEATH
        };
    for _ in 0..8 {
        match at::open_resolved(root, path, OFlag::from_bits_retain(flags), resolve) {
            Err(e) if e.errno() == Some(libc::EAGAIN) => continue,
            r => return r,
        }
    }
    Err(errno(libc::EAGAIN))
}

/// The component walk used where openat2 is missing. Same rules, same errors.
fn walk(root: BorrowedFd<'_>, rel: &Path, flags: libc::c_int, in_root: bool) -> Result<OwnedFd> {
    let nofollow = flags & libc::O_NOFOLLOW != 0;
    let mut todo: Vec<OsString> = Vec::new(); // a stack: the next component is the last element
    push_components(&mut todo, rel.as_os_str().as_bytes());
    // The directories walked into, below the root: `..` pops one.
    let mut stack: Vec<OwnedFd> = Vec::new();
    let mut links = 0;
    let dot = OsString::from(".");
    loop {
        let cur = stack.last().map(|f| f.as_fd()).unwrap_or(root);
        let Some(name) = todo.pop() else {
            // The path ended in a directory we hold (or was empty): open it with `flags`.
            return open_at_raw(cur, &dot, flags & !libc::O_NOFOLLOW);
        };
        if name == ".." {
            if stack.pop().is_none() && !in_root {
                return Err(errno(libc::EXDEV));
            }
            continue;
        }
        let last = todo.is_empty();
        if last {
            let r = open_at_raw(cur, &name, flags | libc::O_NOFOLLOW);
            let is_link = match &r {
                // With O_PATH a symlink opens as itself.
                Ok(fd) => flags & libc::O_PATH != 0 && fd_is_symlink(fd.as_fd())?,
                Err(e) if matches!(e.errno(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => at_is_symlink(cur, &name)?,
                Err(_) => false,
            };
            if !is_link || nofollow {
                return r;
            }
            let target = at::readlink(cur, &name)?;
            expand(&mut todo, &mut stack, &target, &mut links, in_root)?;
            continue;
        }
        let fd = open_at_raw(cur, &name, libc::O_PATH | libc::O_NOFOLLOW)?;
        let st = at::fstat(fd.as_fd())?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => stack.push(fd),
            libc::S_IFLNK => {
                let target = at::readlink(fd.as_fd(), "")?;
                expand(&mut todo, &mut stack, &target, &mut links, in_root)?;
            }
            _ => return Err(errno(libc::ENOTDIR)),
        }
    }
}

/// Put a symlink's target in front of what is left to resolve. An absolute target is refused
/// beneath the root and starts again at the root in it.
fn expand(
    todo: &mut Vec<OsString>,
    stack: &mut Vec<OwnedFd>,
    target: &OsStr,
    links: &mut u32,
    in_root: bool,
) -> Result<()> {
    *links += 1;
    if *links > MAX_SYMLINKS {
        return Err(errno(libc::ELOOP));
    }
    let bytes = target.as_bytes();
    if bytes.first() == Some(&b'/') {
        if !in_root {
            return Err(errno(libc::EXDEV));
        }
        stack.clear();
    }
    if bytes.is_empty() {
        return Err(errno(libc::ENOENT));
    }
    push_components(todo, bytes);
    Ok(())
}

/// Push the components of `path` so that the first one is popped first; `.` and empty
/// components are dropped.
fn push_components(todo: &mut Vec<OsString>, path: &[u8]) {
    for c in path.split(|&b| b == b'/').rev() {
        if !c.is_empty() && c != b"." {
            todo.push(OsString::from_vec(c.to_vec()));
        }
    }
}

fn open_at_raw(dir: BorrowedFd<'_>, name: &OsStr, flags: libc::c_int) -> Result<OwnedFd> {
    // No O_CREAT (refused above), so no mode.
    at::open(dir, name, OFlag::from_bits_retain(flags), Mode::empty())
}

fn fd_is_symlink(fd: BorrowedFd<'_>) -> Result<bool> {
    Ok(at::is_type(at::fstat(fd)?.st_mode, SFlag::S_IFLNK))
}

fn at_is_symlink(dir: BorrowedFd<'_>, name: &OsStr) -> Result<bool> {
    Ok(at::is_type(at::stat_nofollow(dir, name)?.st_mode, SFlag::S_IFLNK))
}

fn mkdir_all(root: BorrowedFd<'_>, rel: &Path, mode: u32, in_root: bool) -> Result<OwnedFd> {
    let rel = check_rel(rel, in_root)?;
    let dir = |p: &Path| resolve(root, p, libc::O_PATH | libc::O_DIRECTORY, in_root);
    let mut cur = dir(Path::new(""))?;
    let mut prefix = PathBuf::new();
    for c in rel.components() {
        let name = match c {
            Component::CurDir => continue,
            Component::ParentDir => {
                prefix.push("..");
                cur = dir(&prefix)?;
                continue;
            }
            Component::Normal(n) => n,
            Component::RootDir | Component::Prefix(_) => return Err(errno(libc::EXDEV)),
        };
        prefix.push(name);
        match dir(&prefix) {
            Ok(fd) => cur = fd,
            Err(e) if e.errno() == Some(libc::ENOENT) => {
                match at::mkdir(cur.as_fd(), name, Mode::from_bits_truncate(mode as libc::mode_t)) {
                    // EEXIST: made meanwhile, or a dangling symlink (then resolving fails below).
                    Err(e) if e.errno() != Some(libc::EEXIST) => return Err(e),
                    _ => {}
                }
                cur = dir(&prefix)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(cur)
}

// Tests set this to run every resolution through the walk.
#[cfg(test)]
thread_local! {
    static FORCE_WALK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
fn force_walk() -> bool {
    FORCE_WALK.with(|f| f.get())
}

#[cfg(not(test))]
fn force_walk() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    /// Run `f` once with openat2 and once with the walk.
    fn both(f: impl Fn(&str)) {
        f("openat2");
        FORCE_WALK.with(|w| w.set(true));
        f("walk");
        FORCE_WALK.with(|w| w.set(false));
    }

    /// A temp dir with `root/` (the root) and `outside/` (the victim), both empty.
    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let outside = t.path().join("outside");
        fs::create_dir(&root).unwrap();
        fs::create_dir(&outside).unwrap();
        (t, root, outside)
    }

    fn escapes(r: Result<impl std::fmt::Debug>) -> bool {
        match r {
            Err(e) => e.is_escape(),
            Ok(v) => panic!("expected an escape error, got {v:?}"),
        }
    }

    fn empty(dir: &Path) -> bool {
        fs::read_dir(dir).unwrap().next().is_none()
    }

    fn fd_path(fd: &OwnedFd) -> PathBuf {
        use std::os::fd::AsRawFd;
        fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap()
    }

    #[test]
    fn absolute_symlink_to_outside_is_refused() {
        both(|how| {
            let (_t, root, outside) = setup();
            fs::create_dir(outside.join("dir")).unwrap();
            symlink(outside.join("dir"), root.join("a")).unwrap();
            let r = RootDir::open(&root).unwrap();
            assert!(escapes(r.open_dir("a")), "{how}");
            assert!(escapes(r.create_dir_all("a/wdir", 0o755)), "{how}");
            assert!(escapes(r.create_parent("a/wdir/victim", 0o755)), "{how}");
            assert!(escapes(r.open_parent("a/victim")), "{how}");
            // An absolute symlink is refused even when its target would be inside.
            symlink(root.join("a"), root.join("b")).unwrap();
            assert!(escapes(r.open_dir("b")), "{how}");
            assert!(empty(&outside.join("dir")), "{how}: nothing created outside");
            // The symlink itself can be opened, and removed.
            let fd = r.open_at("a", libc::O_PATH | libc::O_NOFOLLOW).unwrap();
            assert!(fd_is_symlink(fd.as_fd()).unwrap());
            assert!(r.remove_all("a").unwrap());
            assert!(outside.join("dir").is_dir(), "{how}: the target stays");
        });
    }

    #[test]
    fn dotdot_chains_stay_beneath() {
        both(|how| {
            let (_t, root, outside) = setup();
            fs::create_dir_all(root.join("x/y")).unwrap();
            let r = RootDir::open(&root).unwrap();
            // Climbing and coming back down inside is fine.
            let fd = r.open_dir("x/y/../../x/./y/..").unwrap();
            assert_eq!(fd_path(&fd), root.join("x"), "{how}");
            assert_eq!(fd_path(&r.open_dir("").unwrap()), root, "{how}");
            assert!(escapes(r.open_dir("..")), "{how}");
            assert!(escapes(r.open_dir("x/../../outside")), "{how}");
            assert!(escapes(r.open_dir("x/y/../../../root/x")), "{how}");
            assert!(escapes(r.create_dir_all("x/../../outside/new", 0o755)), "{how}");
            assert!(escapes(r.open_dir("/x")), "{how}: absolute paths are refused");
            assert!(empty(&outside), "{how}");
        });
    }

    #[test]
    fn symlink_chains_are_followed_only_while_inside() {
        both(|how| {
            let (_t, root, outside) = setup();
            fs::create_dir_all(root.join("real/sub")).unwrap();
            // l1 -> l2 -> real/sub, all relative and inside.
            symlink("real/sub", root.join("l2")).unwrap();
            symlink("l2", root.join("l1")).unwrap();
            fs::create_dir(root.join("d")).unwrap();
            symlink("../l1", root.join("d/up")).unwrap();
            let r = RootDir::open(&root).unwrap();
            assert_eq!(fd_path(&r.open_dir("l1").unwrap()), root.join("real/sub"), "{how}");
            assert_eq!(fd_path(&r.open_dir("d/up").unwrap()), root.join("real/sub"), "{how}");
            let (p, n) = r.create_parent("d/up/new/file", 0o755).unwrap();
            assert_eq!(fd_path(&p), root.join("real/sub/new"), "{how}");
            assert_eq!(n, "file");
            // A chain whose last link climbs out.
            symlink("../../outside", root.join("d/out")).unwrap();
            symlink("d/out", root.join("c1")).unwrap();
            symlink("c1", root.join("c0")).unwrap();
            assert!(escapes(r.open_dir("c0")), "{how}");
            assert!(escapes(r.create_dir_all("c0/made", 0o755)), "{how}");
            // A loop is ELOOP, not a hang.
            symlink("loop2", root.join("loop1")).unwrap();
            symlink("loop1", root.join("loop2")).unwrap();
            let e = r.open_dir("loop1").unwrap_err();
            assert_eq!(e.errno(), Some(libc::ELOOP), "{how}: {e}");
            // A dangling symlink is not followed to create its target.
            symlink("nowhere", root.join("dangling")).unwrap();
            let e = r.create_dir_all("dangling/x", 0o755).unwrap_err();
            assert!(e.is_not_found(), "{how}: {e}");
            assert!(!root.join("nowhere").exists(), "{how}");
            assert!(empty(&outside), "{how}");
        });
    }

    #[test]
    fn a_symlink_swapped_in_after_a_check_is_still_refused() {
        both(|how| {
            let (_t, root, outside) = setup();
            fs::create_dir(root.join("dir")).unwrap();
            let r = RootDir::open(&root).unwrap();
            // The check a name-based unpacker would do: `dir` is a real directory inside.
            assert_eq!(fd_path(&r.open_dir("dir").unwrap()), root.join("dir"));
            // Now it is swapped for a symlink to the outside (as a container could do in a
            // volume it writes): every later use resolves again and is refused.
            fs::remove_dir(root.join("dir")).unwrap();
            symlink(&outside, root.join("dir")).unwrap();
            assert!(escapes(r.create_parent("dir/victim", 0o755)), "{how}");
            assert!(escapes(r.open_at("dir/victim", libc::O_RDONLY)), "{how}");
            // And a relative one climbing out.
            fs::remove_file(root.join("dir")).unwrap();
            symlink("../outside", root.join("dir")).unwrap();
            assert!(escapes(r.create_dir_all("dir/sub", 0o755)), "{how}");
            assert!(escapes(r.open_dir("dir")), "{how}");
            assert!(empty(&outside), "{how}");
            // A parent fd taken earlier stays what it was: the swap does not move it.
            fs::remove_file(root.join("dir")).unwrap();
            fs::create_dir(root.join("dir")).unwrap();
            let (p, name) = r.open_parent("dir/f").unwrap();
            fs::rename(root.join("dir"), root.join("moved")).unwrap();
            symlink(&outside, root.join("dir")).unwrap();
            at::mknod(p.as_fd(), &name, SFlag::S_IFIFO, Mode::from_bits_truncate(0o600), 0).unwrap();
            assert!(root.join("moved/f").exists(), "{how}");
            assert!(empty(&outside), "{how}");
        });
    }

    #[test]
    fn open_files_and_final_symlinks() {
        both(|how| {
            let (_t, root, outside) = setup();
            fs::write(root.join("f"), "inside").unwrap();
            fs::write(outside.join("secret"), "outside").unwrap();
            symlink("f", root.join("ok")).unwrap();
            symlink(outside.join("secret"), root.join("bad")).unwrap();
            let r = RootDir::open(&root).unwrap();
            let fd = r.open_at("ok", libc::O_RDONLY).unwrap();
            let mut s = String::new();
            io::Read::read_to_string(&mut fs::File::from(fd), &mut s).unwrap();
            assert_eq!(s, "inside", "{how}");
            assert!(escapes(r.open_at("bad", libc::O_RDONLY)), "{how}");
            let e = r.open_at("ok", libc::O_RDONLY | libc::O_NOFOLLOW).unwrap_err();
            assert_eq!(e.errno(), Some(libc::ELOOP), "{how}");
            let e = r.open_at("f/x", libc::O_PATH).unwrap_err();
            assert_eq!(e.errno(), Some(libc::ENOTDIR), "{how}");
            let e = r.open_at("f", libc::O_RDONLY | libc::O_CREAT).unwrap_err();
            assert_eq!(e.errno(), Some(libc::EINVAL), "{how}");
            assert!(r.open_parent("x/..").is_err(), "{how}: no last name");
        });
    }

    #[test]
    fn in_root_absolute_symlinks_and_dotdot_stay_in_the_root() {
        both(|how| {
            let (_t, root, outside) = setup();
            fs::create_dir_all(root.join("usr/lib")).unwrap();
            // Absolute targets are the tree's own paths, at every step of a chain.
            symlink("/usr/lib", root.join("lib")).unwrap();
            symlink(&outside, root.join("host")).unwrap();
            symlink("/host", root.join("hop")).unwrap();
            symlink("../../../../../..", root.join("up")).unwrap();
            let r = RootDir::open_in_root(&root).unwrap();
            assert_eq!(fd_path(&r.open_dir("lib").unwrap()), root.join("usr/lib"), "{how}");
            assert_eq!(fd_path(&r.open_dir("/lib").unwrap()), root.join("usr/lib"), "{how}");
            assert_eq!(fd_path(&r.open_dir("up").unwrap()), root, "{how}");
            assert_eq!(fd_path(&r.open_dir("../..").unwrap()), root, "{how}");
            // `/hop` dangles in the tree: an error, not the host's directory.
            let e = r.create_dir_all("/hop/sub", 0o755).unwrap_err();
            assert!(e.is_not_found(), "{how}: {e}");
            let inside = root.join(outside.strip_prefix("/").unwrap());
            fs::create_dir_all(&inside).unwrap();
            let made = r.create_dir_all("/hop/sub", 0o755).unwrap();
            assert_eq!(fd_path(&made), inside.join("sub"), "{how}");
            r.create_dir_all("up/x/../y", 0o755).unwrap();
            assert!(root.join("y").is_dir(), "{how}");
            assert!(empty(&outside), "{how}");
            fs::remove_dir_all(root.join(outside.strip_prefix("/").unwrap().iter().next().unwrap())).unwrap();
            fs::remove_dir(root.join("y")).unwrap();
            fs::remove_dir(root.join("x")).unwrap();
        });
    }

    #[test]
    fn remove_all_does_not_follow_symlinks() {
        let (_t, root, outside) = setup();
        fs::write(outside.join("keep"), "x").unwrap();
        fs::create_dir_all(root.join("tree/a/b")).unwrap();
        fs::write(root.join("tree/a/b/f"), "x").unwrap();
        symlink(&outside, root.join("tree/a/link")).unwrap();
        let r = RootDir::open(&root).unwrap();
        assert!(r.remove_all("tree").unwrap());
        assert!(!r.remove_all("tree").unwrap());
        assert!(!root.join("tree").exists());
        assert!(outside.join("keep").exists());
        assert!(escapes(r.remove_all("../outside")));
        assert!(outside.join("keep").exists());
    }

    #[test]
    fn error_messages_name_path_and_root() {
        let (_t, root, outside) = setup();
        symlink(&outside, root.join("a")).unwrap();
        let r = RootDir::open(&root).unwrap();
        let e = r.create_dir_all("a/b", 0o755).unwrap_err();
        let msg = crate::chain(&e).to_string();
        assert!(msg.starts_with("creating directory a/b: it leads outside"), "{msg}");
        assert!(msg.contains(&root.display().to_string()), "{msg}");
    }
}
