//! The new mount API's system calls (Linux 5.2) the runtime uses, on paths: `open_tree` (a
//! detached copy of a mount tree) and `move_mount` (attaching one). libc has their numbers, not
//! wrappers.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub(crate) const OPEN_TREE_CLONE: libc::c_uint = 1;
pub(crate) const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))
}

/// A detached copy of the mount tree at `p` (`OPEN_TREE_CLONE`, with `AT_RECURSIVE` its
/// submounts too; without `OPEN_TREE_CLONE`, an `O_PATH`-like handle of it).
pub(crate) fn open_tree(p: &Path, flags: libc::c_uint) -> io::Result<OwnedFd> {
    let c = cstr(p)?;
    // SAFETY: open_tree takes a dirfd, a C string and flags, and returns a new fd or -1. nix
    // 0.29 has none of the new mount API (open_tree, move_mount).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd the kernel returned, owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Attach a detached tree at `to`.
pub(crate) fn move_mount(tree: &OwnedFd, to: &Path) -> io::Result<()> {
    let c = cstr(to)?;
    let empty = c"";
    // SAFETY: move_mount takes (fd, "", dirfd, path, flags); both strings are valid.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
