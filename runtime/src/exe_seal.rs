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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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
    let argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).chain([std::ptr::null()]).collect();
    let envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).chain([std::ptr::null()]).collect();
    // SAFETY: argv and envp are NUL-terminated arrays of valid C strings that outlive the call;
    // on success the call does not return.
    check(unsafe {
        libc::syscall(
            libc::SYS_execveat,
            fd.as_raw_fd(),
            c"".as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    })?;
    unreachable!("execveat returned without an error");
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
    // SAFETY: fsopen with a static NUL-terminated name.
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
        let name = cstr(name.as_bytes())?;
        // SAFETY: openat below the mount's root with a NUL-terminated name.
        let fd = unsafe { libc::openat(mnt.as_raw_fd(), name.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os_error());
        }
        // SAFETY: a new fd we own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
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
    const MFD_EXEC: libc::c_uint = 0x10;
    let create = |flags: libc::c_uint| {
        // SAFETY: memfd_create with a static name.
        unsafe { libc::memfd_create(c"ferrolet".as_ptr(), flags) }
    };
    let base = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // Linux 6.3 and later may refuse executable memfds unless asked for one; older kernels do
    // not know the flag.
    let mut fd = create(base | MFD_EXEC);
    if fd < 0 {
        fd = create(base);
    }
    if fd < 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: a new fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut copy = std::fs::File::from(fd);
    std::io::copy(&mut std::fs::File::open("/proc/self/exe")?, &mut copy)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on our fd.
    if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(Error::last_os_error());
    }
    Ok(OwnedFd::from(copy))
}
