//! The `*at` system calls as safe functions over nix: each takes the directory as a
//! [`BorrowedFd`] and the name beneath it as a path, returns fds as [`OwnedFd`], and fails
//! with an [`Error`] that says what was being done to which name (its
//! [`errno`](Error::errno) is the call's). [`RootDir`](crate::RootDir) and the layer unpacker
//! create, open and remove through these, so nothing else needs a raw system call for them.
//!
//! Every fd opened here is close-on-exec (`O_CLOEXEC` is always added). Names are used as
//! given: resolve them with [`RootDir`](crate::RootDir) first when the directory is not
//! trusted, and use the `nofollow` forms on its last component.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub use nix::fcntl::{OFlag, ResolveFlag};
pub use nix::sys::stat::{FileStat, Mode, SFlag};
pub use nix::sys::time::TimeSpec;

use nix::fcntl::{AtFlags, OpenHow};
use nix::sys::stat::{FchmodatFlags, UtimensatFlags};
use nix::unistd::{Gid, Uid, UnlinkatFlags};

use crate::error::{Context, Result};

/// Take over a fresh fd returned by a nix call (nix 0.29 returns `RawFd`, not `OwnedFd`).
fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful open of nix's and nothing else holds
    // it; from here the `OwnedFd` closes it once. nix 0.29's `openat`/`openat2` return a
    // `RawFd` (0.30 returns `OwnedFd`), so taking ownership is left to the caller.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn shown(name: &Path) -> std::path::Display<'_> {
    name.display()
}

/// `openat(dir, name, flags | O_CLOEXEC, mode)`; `mode` matters only with `O_CREAT` or
/// `O_TMPFILE`.
pub fn open(dir: BorrowedFd<'_>, name: impl AsRef<Path>, flags: OFlag, mode: Mode) -> Result<OwnedFd> {
    let name = name.as_ref();
    nix::fcntl::openat(Some(dir.as_raw_fd()), name, flags | OFlag::O_CLOEXEC, mode)
        .map(owned)
        .with_context(|| format!("opening {}", shown(name)))
}

/// `openat2(dir, path, {flags | O_CLOEXEC, mode 0, resolve})` (Linux 5.6): `path` resolved
/// under the rules of `resolve` (`RESOLVE_BENEATH`, `RESOLVE_IN_ROOT`, `RESOLVE_NO_SYMLINKS`,
/// `RESOLVE_NO_MAGICLINKS`...). Errors as the kernel's: `EXDEV` for an escape, `EAGAIN` when
/// a rename raced with `..` (try again), `ENOSYS` on older kernels.
pub(crate) fn open_resolved(
    dir: BorrowedFd<'_>,
    path: impl AsRef<Path>,
    flags: OFlag,
    resolve: ResolveFlag,
) -> Result<OwnedFd> {
    let path = path.as_ref();
    let how = OpenHow::new().flags(flags | OFlag::O_CLOEXEC).resolve(resolve);
    nix::fcntl::openat2(dir.as_raw_fd(), path, how)
        .map(owned)
        .with_context(|| format!("opening {}", shown(path)))
}

/// `mkdirat(dir, name, mode)`: the mode is cut by the umask.
pub fn mkdir(dir: BorrowedFd<'_>, name: impl AsRef<Path>, mode: Mode) -> Result<()> {
    let name = name.as_ref();
    nix::sys::stat::mkdirat(Some(dir.as_raw_fd()), name, mode)
        .with_context(|| format!("creating directory {}", shown(name)))
}

/// `mknodat(dir, name, kind | perm, dev)`: a device node, fifo or socket (or, with `S_IFCHR`
/// and device 0, an overlay whiteout). `perm` is cut by the umask.
pub fn mknod(dir: BorrowedFd<'_>, name: impl AsRef<Path>, kind: SFlag, perm: Mode, dev: libc::dev_t) -> Result<()> {
    let name = name.as_ref();
    nix::sys::stat::mknodat(Some(dir.as_raw_fd()), name, kind, perm, dev)
        .with_context(|| format!("creating the node {}", shown(name)))
}

/// `symlinkat(target, dir, name)`: `name` in `dir` becomes a symlink to `target` (which is
/// not looked at).
pub fn symlink(target: impl AsRef<Path>, dir: BorrowedFd<'_>, name: impl AsRef<Path>) -> Result<()> {
    let (target, name) = (target.as_ref(), name.as_ref());
    nix::unistd::symlinkat(target, Some(dir.as_raw_fd()), name)
        .with_context(|| format!("creating the symlink {} -> {}", shown(name), shown(target)))
}

/// `linkat(src_dir, src, dir, name, flags)`. With `AT_EMPTY_PATH` and an empty `src` the
/// file open as `src_dir` is linked (needs `CAP_DAC_READ_SEARCH`); with `AT_SYMLINK_FOLLOW`
/// a symlink `src` is followed.
pub fn link(
    src_dir: BorrowedFd<'_>,
    src: impl AsRef<Path>,
    dir: BorrowedFd<'_>,
    name: impl AsRef<Path>,
    flags: AtFlags,
) -> Result<()> {
    let (src, name) = (src.as_ref(), name.as_ref());
    nix::unistd::linkat(Some(src_dir.as_raw_fd()), src, Some(dir.as_raw_fd()), name, flags)
        .with_context(|| format!("linking {} to {}", shown(name), shown(src)))
}

/// `linkat` flags, for [`link`].
pub use nix::fcntl::AtFlags as LinkFlags;

/// `unlinkat(dir, name, 0)`: remove a file, symlink or node (not a directory).
pub fn unlink(dir: BorrowedFd<'_>, name: impl AsRef<Path>) -> Result<()> {
    let name = name.as_ref();
    nix::unistd::unlinkat(Some(dir.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir)
        .with_context(|| format!("removing {}", shown(name)))
}

/// `unlinkat(dir, name, AT_REMOVEDIR)`: remove an empty directory.
pub fn rmdir(dir: BorrowedFd<'_>, name: impl AsRef<Path>) -> Result<()> {
    let name = name.as_ref();
    nix::unistd::unlinkat(Some(dir.as_raw_fd()), name, UnlinkatFlags::RemoveDir)
        .with_context(|| format!("removing directory {}", shown(name)))
}

/// The flags of [`rename`] (`renameat2`'s). nix 0.29 has them, and the call, for glibc only;
/// the static musl builds (scripts/release) need them too, so they are the kernel's here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags(libc::c_uint);

impl RenameFlags {
    /// Fail with `EEXIST` rather than replace an existing `new`.
    pub const RENAME_NOREPLACE: Self = Self(libc::RENAME_NOREPLACE);
    /// Swap `old` and `new` atomically (both must exist).
    pub const RENAME_EXCHANGE: Self = Self(libc::RENAME_EXCHANGE);

    /// No flags: `renameat`.
    pub const fn empty() -> Self {
        Self(0)
    }
}

impl std::ops::BitOr for RenameFlags {
    type Output = Self;
    fn bitor(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

/// `renameat2(old_dir, old, new_dir, new, flags)` (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`...).
pub fn rename(
    old_dir: BorrowedFd<'_>,
    old: impl AsRef<Path>,
    new_dir: BorrowedFd<'_>,
    new: impl AsRef<Path>,
    flags: RenameFlags,
) -> Result<()> {
    use nix::NixPath as _;
    let (old, new) = (old.as_ref(), new.as_ref());
    old.with_nix_path(|o| {
        new.with_nix_path(|n| {
            // SAFETY: renameat2 reads the two NUL-terminated paths, alive for the call, and
            // takes the two borrowed fds; it writes no memory of ours. A raw system call
            // because neither nix (glibc only) nor every libc has a wrapper.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_renameat2,
                    old_dir.as_raw_fd(),
                    o.as_ptr(),
                    new_dir.as_raw_fd(),
                    n.as_ptr(),
                    flags.0,
                )
            };
            nix::errno::Errno::result(rc).map(drop)
        })
    })
    .and_then(|r| r)
    .and_then(|r| r)
    .with_context(|| format!("renaming {} to {}", shown(old), shown(new)))
}

/// `fchownat(dir, name, uid, gid, AT_SYMLINK_NOFOLLOW)`: the owner of `name` itself, a symlink
/// too.
pub fn chown_nofollow(dir: BorrowedFd<'_>, name: impl AsRef<Path>, uid: u32, gid: u32) -> Result<()> {
    let name = name.as_ref();
    nix::unistd::fchownat(
        Some(dir.as_raw_fd()),
        name,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .with_context(|| format!("setting the owner of {}", shown(name)))
}

/// `fchmodat(dir, name, mode, 0)`: follows a symlink `name` (Linux cannot change a symlink's
/// mode), so use it only on what is known not to be one.
pub fn chmod(dir: BorrowedFd<'_>, name: impl AsRef<Path>, mode: Mode) -> Result<()> {
    let name = name.as_ref();
    nix::sys::stat::fchmodat(Some(dir.as_raw_fd()), name, mode, FchmodatFlags::FollowSymlink)
        .with_context(|| format!("setting the mode of {}", shown(name)))
}

/// `utimensat(dir, name, [atime, mtime], AT_SYMLINK_NOFOLLOW)`: the times of `name` itself.
pub fn utimens_nofollow(dir: BorrowedFd<'_>, name: impl AsRef<Path>, atime: TimeSpec, mtime: TimeSpec) -> Result<()> {
    let name = name.as_ref();
    nix::sys::stat::utimensat(
        Some(dir.as_raw_fd()),
        name,
        &atime,
        &mtime,
        UtimensatFlags::NoFollowSymlink,
    )
    .with_context(|| format!("setting the times of {}", shown(name)))
}

/// `readlinkat(dir, name)`: a symlink's target. An empty `name` reads the symlink open as
/// `dir` (an `O_PATH | O_NOFOLLOW` fd).
pub fn readlink(dir: BorrowedFd<'_>, name: impl AsRef<Path>) -> Result<OsString> {
    let name = name.as_ref();
    nix::fcntl::readlinkat(Some(dir.as_raw_fd()), name).with_context(|| format!("reading the symlink {}", shown(name)))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: the status of `name` itself.
pub fn stat_nofollow(dir: BorrowedFd<'_>, name: impl AsRef<Path>) -> Result<FileStat> {
    let name = name.as_ref();
    nix::sys::stat::fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .with_context(|| format!("reading the status of {}", shown(name)))
}

/// `fstat(fd)`.
pub fn fstat(fd: BorrowedFd<'_>) -> Result<FileStat> {
    nix::sys::stat::fstat(fd.as_raw_fd()).context("reading the status of an open file")
}

/// `fchown(fd, uid, gid)`.
pub fn fchown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> Result<()> {
    nix::unistd::fchown(fd.as_raw_fd(), Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
        .context("setting the owner of an open file")
}

/// `fchmod(fd, mode)`.
pub fn fchmod(fd: BorrowedFd<'_>, mode: Mode) -> Result<()> {
    nix::sys::stat::fchmod(fd.as_raw_fd(), mode).context("setting the mode of an open file")
}

/// `futimens(fd, [atime, mtime])`.
pub fn futimens(fd: BorrowedFd<'_>, atime: TimeSpec, mtime: TimeSpec) -> Result<()> {
    nix::sys::stat::futimens(fd.as_raw_fd(), &atime, &mtime).context("setting the times of an open file")
}

/// The names in the directory open as `dir` (any fd of it, `O_PATH` too), without `.` and
/// `..`, in the order the filesystem gives them.
pub fn list(dir: BorrowedFd<'_>) -> Result<Vec<OsString>> {
    let ctx = "listing an open directory";
    // The directory stream needs an fd opened for reading, and owns the one it is given.
    let fd = open(dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())?;
    let mut d = nix::dir::Dir::from(fd).context(ctx)?;
    let mut names = Vec::new();
    for ent in d.iter() {
        let ent = ent.context(ctx)?;
        let name = ent.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    Ok(names)
}

/// Whether `mode` (an `st_mode`) is of the file type `kind`.
pub fn is_type(mode: libc::mode_t, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) == kind
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::fd::AsFd;

    fn root() -> (tempfile::TempDir, OwnedFd) {
        let t = tempfile::tempdir().unwrap();
        let fd = OwnedFd::from(fs::File::open(t.path()).unwrap());
        (t, fd)
    }

    #[test]
    fn create_inspect_and_remove() {
        let (t, d) = root();
        let d = d.as_fd();
        mkdir(d, "dir", Mode::from_bits_truncate(0o755)).unwrap();
        let f = open(
            d,
            "dir/f",
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
            Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        fchmod(f.as_fd(), Mode::from_bits_truncate(0o640)).unwrap();
        futimens(f.as_fd(), TimeSpec::new(5, 0), TimeSpec::new(7, 0)).unwrap();
        let st = fstat(f.as_fd()).unwrap();
        assert!(is_type(st.st_mode, SFlag::S_IFREG));
        assert_eq!((st.st_mode & 0o7777, st.st_mtime), (0o640, 7));
        symlink("dir/f", d, "l").unwrap();
        assert_eq!(readlink(d, "l").unwrap(), "dir/f");
        assert!(is_type(stat_nofollow(d, "l").unwrap().st_mode, SFlag::S_IFLNK));
        utimens_nofollow(d, "l", TimeSpec::new(1, 0), TimeSpec::new(2, 0)).unwrap();
        assert_eq!(stat_nofollow(d, "l").unwrap().st_mtime, 2);
        chown_nofollow(d, "l", nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw()).unwrap();
        mknod(d, "fifo", SFlag::S_IFIFO, Mode::from_bits_truncate(0o600), 0).unwrap();
        chmod(d, "fifo", Mode::from_bits_truncate(0o644)).unwrap();
        link(d, "dir/f", d, "hard", LinkFlags::empty()).unwrap();
        rename(d, "hard", d, "moved", RenameFlags::RENAME_NOREPLACE).unwrap();
        let mut names = list(d).unwrap();
        names.sort();
        assert_eq!(names, ["dir", "fifo", "l", "moved"]);
        unlink(d, "moved").unwrap();
        unlink(d, "dir/f").unwrap();
        rmdir(d, "dir").unwrap();
        assert!(!t.path().join("dir").exists());
    }

    #[test]
    fn errors_name_the_operation_and_the_name() {
        let (_t, d) = root();
        let e = mkdir(d.as_fd(), "a/b", Mode::from_bits_truncate(0o755)).unwrap_err();
        assert_eq!(e.to_string(), "creating directory a/b");
        assert!(e.is_not_found());
        let e = open_resolved(
            d.as_fd(),
            "../x",
            OFlag::O_PATH,
            ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        )
        .unwrap_err();
        // EXDEV from the kernel; ENOSYS/EPERM where openat2 is missing or filtered.
        assert!(
            e.is_escape() || matches!(e.errno(), Some(libc::ENOSYS) | Some(libc::EPERM)),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "opening ../x");
        let e = unlink(d.as_fd(), "nothing").unwrap_err();
        assert_eq!(
            crate::chain(&e).to_string(),
            "removing nothing: ENOENT: No such file or directory"
        );
    }
}
