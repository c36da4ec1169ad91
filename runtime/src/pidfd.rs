//! pidfds: a handle on a process that cannot be confused with a later process reusing its pid.
//! Used to wait for monitors (readable when the process exits) and to signal containers.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::unix::AsyncFd;

pub struct PidFd {
    fd: OwnedFd,
    pid: i32,
}

impl PidFd {
    /// Open a pidfd for `pid`. Callers check the process start time first when the pid came
    /// from a file, so a reused pid is not mistaken for the process recorded there.
    pub fn open(pid: i32) -> io::Result<PidFd> {
        // SAFETY: plain syscall with integer arguments.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new fd that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(r as RawFd) };
        Ok(PidFd { fd, pid })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn send_signal(&self, signal: i32) -> io::Result<()> {
        // SAFETY: valid pidfd, null siginfo, no flags.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            // Already gone is not an error for a kill.
            if e.raw_os_error() == Some(libc::ESRCH) {
                return Ok(());
            }
            return Err(e);
        }
        Ok(())
    }

    /// True once the process has exited.
    pub fn has_exited(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let r = unsafe { libc::poll(&mut pfd, 1, 0) };
        r > 0 && pfd.revents & libc::POLLIN != 0
    }

    /// Wait until the process exits (the pidfd becomes readable).
    pub async fn exited(self) -> io::Result<()> {
        // SAFETY: OwnedFd always returns the same valid fd for its whole life.
        let afd = unsafe { AsyncFd::register_with_interest(self.fd, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        let _guard = afd.readable().await?;
        Ok(())
    }

    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}
