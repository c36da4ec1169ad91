//! The few system calls the monitor makes that neither std nor nix has: pidfds, and the page
//! size its buffers are measured in.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The page size (sysconf), 4 KiB if it cannot be asked.
pub fn page_size() -> usize {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE) {
        Ok(Some(n)) => usize::try_from(n).unwrap_or(4096),
        _ => 4096,
    }
}

/// A pidfd for `pid`: readable once the process has exited, and a way to signal it that a
/// reused pid cannot redirect.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments. nix 0.29 has no pidfd calls.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// Signal the process of `pidfd`; a process already gone is not an error for a kill.
pub fn pidfd_send_signal(pidfd: &OwnedFd, signal: i32) -> io::Result<()> {
    // SAFETY: valid pidfd, null siginfo, no flags. nix 0.29 has no pidfd calls.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ESRCH) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}
