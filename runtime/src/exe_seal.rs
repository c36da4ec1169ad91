//! The binary that starts containers must not be writable from one (the CVE-2019-5736 class,
//! docs/runtime.md#a-sealed-binary). Every process the runtime puts into a container's
//! namespaces before it `exec`s (libcontainer's init and exec'd processes, forked from the
//! zygote) runs this binary until then, and a container that makes such a process run a
//! script starting `#!/proc/self/exe` gets this binary running inside it, with
//! `/proc/<pid>/exe` open to it: through that link it could rewrite the host's binary, which
//! the host then runs as root.
//!
//! [`reexec_sealed`] runs first in `main` and re-executes the process from a copy that cannot
//! be written: the same file seen through a read-only overlayfs mount that is attached
//! nowhere (no page is copied: the file's pages are the host file's), or, where overlayfs
//! cannot be mounted, a sealed memfd copy. Then the zygote and everything it forks have
//! `/proc/self/exe` pointing at that copy, and a write through it fails with EROFS (EPERM for
//! the memfd).

use std::ffi::CString;
use std::io::{Error, ErrorKind, Result};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Set in the environment of the re-executed process (and removed from it at once).
const MARKER: &str = "_FERROLET_SEALED_EXE";

/// How the running binary is sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sealed {
    /// A read-only overlayfs mount attached nowhere.
    Overlay,
    /// A memfd copy with write, grow, shrink and seal seals.
    Memfd,
}

fn cstr(b: &[u8]) -> Result<CString> {
    CString::new(b).map_err(|_| Error::new(ErrorKind::InvalidInput, "a NUL in a path or argument"))
}

fn check(r: libc::c_long) -> Result<libc::c_long> {
    if r < 0 {
        Err(Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Unless this process already runs from a sealed copy, re-execute it from one, with the same
/// arguments and environment. Call it first thing in `main`, single-threaded. Returns how the
/// binary is sealed (only ever in the re-executed process), or the error that left it as it
/// was: no copy could be made, or the exec failed.
pub fn reexec_sealed() -> Result<Sealed> {
    if let Some(how) = std::env::var_os(MARKER) {
        // SAFETY: called first in main, before any thread exists.
        unsafe { std::env::remove_var(MARKER) };
        return Ok(if how == "memfd" { Sealed::Memfd } else { Sealed::Overlay });
    }
    let (fd, how) = match overlay_copy() {
        Ok(fd) => (fd, "overlay"),
        Err(overlay) => match memfd_copy() {
            Ok(fd) => (fd, "memfd"),
            Err(memfd) => {
                return Err(Error::new(
                    memfd.kind(),
                    format!("no sealed copy of the binary: overlayfs: {overlay}; memfd: {memfd}"),
                ))
            }
        },
    };
    let args: Vec<CString> = std::env::args_os().map(|a| cstr(a.as_bytes())).collect::<Result<_>>()?;
    let mut env: Vec<CString> = std::env::vars_os()
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            cstr(kv.as_bytes())
        })
        .collect::<Result<_>>()?;
    env.push(cstr(format!("{MARKER}={how}").as_bytes())?);
    let Err(e) = nix::unistd::execveat(
        Some(fd.as_raw_fd()),
        c"",
        &args,
        &env,
        nix::fcntl::AtFlags::AT_EMPTY_PATH,
    );
    Err(e.into())
}

/// The binary, its path on the host: `/proc/self/exe` read as a link. None when it is not a
/// plain path any more (deleted, or already a copy).
fn exe_path() -> Option<PathBuf> {
    let p = std::fs::read_link("/proc/self/exe").ok()?;
    let s = p.as_os_str().as_bytes();
    (p.is_absolute() && !s.ends_with(b" (deleted)") && p.exists()).then_some(p)
}

/// The binary opened through a new overlayfs mount of its directory, read-only and attached
/// nowhere (`fsopen`, `fsmount`: Linux 5.2). overlayfs needs two lower layers when it has no
/// upper one; the second is an empty directory of the same mount, which the layer checks
/// allow, and which is removed again at once (the mount holds it).
fn overlay_copy() -> Result<OwnedFd> {
    let exe = exe_path().ok_or_else(|| Error::new(ErrorKind::NotFound, "/proc/self/exe is not a path"))?;
    let (dir, name) = (
        exe.parent().unwrap_or(Path::new("/")),
        exe.file_name().unwrap_or_default(),
    );
    // SAFETY: fsopen with a static NUL-terminated name. nix 0.29 has none of the new mount
    // API (fsopen, fsconfig, fsmount).
    let fs = check(unsafe { libc::syscall(libc::SYS_fsopen, c"overlay".as_ptr(), libc::FSOPEN_CLOEXEC) })?;
    // SAFETY: a new fd we own.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
    let empty = tempdir_beside()?;
    let result = (|| {
        let set = |key: &std::ffi::CStr, value: &std::ffi::CStr| {
            // SAFETY: fsconfig on our fs fd with NUL-terminated strings.
            check(unsafe {
                libc::syscall(
                    libc::SYS_fsconfig,
                    fs.as_raw_fd(),
                    libc::FSCONFIG_SET_STRING,
                    key.as_ptr(),
                    value.as_ptr(),
                    0,
                )
            })
        };
        let mut lower = dir.as_os_str().as_bytes().to_vec();
        lower.push(b':');
        lower.extend_from_slice(empty.as_os_str().as_bytes());
        if lower.contains(&b',') {
            return Err(Error::new(ErrorKind::InvalidInput, "a comma in the binary's path"));
        }
        set(c"lowerdir", &cstr(&lower)?)?;
        set(c"source", c"ferrolet-exe")?;
        // SAFETY: as above, a command without arguments.
        check(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                libc::FSCONFIG_CMD_CREATE,
                std::ptr::null::<libc::c_char>(),
                std::ptr::null::<libc::c_void>(),
                0,
            )
        })?;
        let attrs = libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOSUID;
        // SAFETY: fsmount of our configured context.
        let mnt = check(unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), libc::FSMOUNT_CLOEXEC, attrs) })?;
        // SAFETY: a new fd we own.
        let mnt = unsafe { OwnedFd::from_raw_fd(mnt as i32) };
        use ferrolet_fsutil::at::{Mode, OFlag};
        ferrolet_fsutil::at::open(mnt.as_fd(), name, OFlag::O_RDONLY, Mode::empty())
            .map_err(|e| Error::from_raw_os_error(e.errno().unwrap_or(libc::EIO)))
    })();
    let _ = std::fs::remove_dir(&empty);
    result
}

/// An empty directory beside nothing of ours: under /run when it exists (a tmpfs), else the
/// temp dir.
fn tempdir_beside() -> Result<PathBuf> {
    let base = [Path::new("/run"), &std::env::temp_dir()]
        .into_iter()
        .find(|p| p.is_dir())
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!(".ferrolet-exe-{}", std::process::id()));
    match std::fs::create_dir(&dir) {
        Ok(()) => Ok(dir),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(dir),
        Err(e) => Err(e),
    }
}

/// A copy of the binary in a memfd, sealed against writes, growing, shrinking and new seals
/// (Linux 3.17). Costs the binary's size in memory, once.
fn memfd_copy() -> Result<OwnedFd> {
    sealed_memfd(c"ferrolet", &mut std::fs::File::open("/proc/self/exe")?)
}

/// A memfd named `name` holding what `content` reads, executable, sealed against writes,
/// growing, shrinking and new seals (Linux 3.17): a program that no process, a container's
/// included, can change through `/proc/<pid>/exe`.
pub(crate) fn sealed_memfd(name: &std::ffi::CStr, content: &mut impl std::io::Read) -> Result<OwnedFd> {
    use nix::fcntl::{FcntlArg, SealFlag};
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    // MFD_EXEC (Linux 6.3), which nix 0.29 does not name.
    const MFD_EXEC: MemFdCreateFlag = MemFdCreateFlag::from_bits_retain(0x10);
    let base = MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING;
    // Linux 6.3 and later may refuse executable memfds unless asked for one; older kernels do
    // not know the flag.
    let fd = memfd_create(name, base | MFD_EXEC).or_else(|_| memfd_create(name, base))?;
    let mut copy = std::fs::File::from(fd);
    std::io::copy(content, &mut copy)?;
    let seals = SealFlag::F_SEAL_SEAL | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_WRITE;
    nix::fcntl::fcntl(copy.as_raw_fd(), FcntlArg::F_ADD_SEALS(seals))?;
    Ok(OwnedFd::from(copy))
}
