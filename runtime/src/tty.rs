//! Terminals (docs/runtime.md#terminals-and-attach). A container process that asks for a
//! terminal gets a pty allocated by libcontainer *inside* the container, from the container's
//! own devpts instance (`/dev/pts/ptmx` after pivot_root, as runc and crun do), so `tty` shows
//! `/dev/pts/N` of the container and the host's /dev/pts is never involved. libcontainer sends
//! the master back over a "console socket" (a unix stream socket it connects to, SCM_RIGHTS);
//! [`ConsoleSocket`] is the listening end of it, used by the monitor (a container's init) and
//! by exec workers. [`resize_tty`] sets a terminal's window size on the master.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

use crate::error::{Error, Result};
pub(crate) use ferrolet_monitor::tty::{bind_in, set_nonblocking};

/// The listening end of a console socket, bound in a directory under a unique name.
pub(crate) struct ConsoleSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl ConsoleSocket {
    /// Bind `dir/name`. The directory is reached through `/proc/self/fd`, so a state directory
    /// deeper than a socket address allows (108 bytes) still works; libcontainer is given the
    /// real path, which it reaches through a symlink of its own.
    pub(crate) fn bind(dir: &Path, name: &str) -> io::Result<ConsoleSocket> {
        let listener = bind_in(dir, name)?;
        Ok(ConsoleSocket {
            listener,
            path: dir.join(name),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Accept libcontainer's connection and receive the pty master it sends. Called after the
    /// builder returned: by then the process has set up its terminal, so the connection and
    /// the fd are queued; `timeout` only guards against a process that died before sending.
    pub(crate) fn receive_master(&self, timeout: Duration) -> io::Result<OwnedFd> {
        wait_readable(self.listener.as_fd(), timeout, "console socket connection")?;
        let (conn, _) = self.listener.accept()?;
        wait_readable(conn.as_fd(), timeout, "pty master")?;
        let mut buf = [0u8; 64];
        let mut iov = [IoSliceMut::new(&mut buf)];
        let mut cmsg = nix::cmsg_space!([RawFd; 1]);
        let msg = recvmsg::<()>(conn.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)
            .map_err(io::Error::from)?;
        let mut got = None;
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for fd in fds {
                    // SAFETY: the kernel installed this fd for us and nothing else holds it. nix
                    // 0.29 hands received fds over as RawFd.
                    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                    if got.is_none() {
                        got = Some(fd);
                    }
                }
            }
        }
        got.ok_or_else(|| io::Error::other("the console socket message carried no pty master"))
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Send `fd` over a connected unix socket (one byte of data with it).
pub(crate) fn send_fd(sock: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage};
    let fds = [fd.as_raw_fd()];
    let iov = [io::IoSlice::new(b"m")];
    sendmsg::<()>(
        sock.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(io::Error::from)?;
    Ok(())
}

/// Receive one fd sent with [`send_fd`] without waiting: the sender sent it before replying.
pub(crate) fn recv_fd_now(sock: BorrowedFd<'_>) -> Result<OwnedFd> {
    let mut buf = [0u8; 8];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )
    .map_err(|e| Error::Zygote(format!("receiving the pty master: {e}")))?;
    let mut got = None;
    for c in msg
        .cmsgs()
        .map_err(|e| Error::Zygote(format!("receiving the pty master: {e}")))?
    {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                // SAFETY: the kernel installed this fd for us and nothing else holds it. nix
                // 0.29 hands received fds over as RawFd.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                got.get_or_insert(fd);
            }
        }
    }
    got.ok_or_else(|| Error::Zygote("the exec worker sent no pty master".into()))
}

fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration, what: &str) -> io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = PollTimeout::try_from(timeout.as_millis().min(60_000) as i32).unwrap_or(PollTimeout::NONE);
    loop {
        let mut p = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut p, ms) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no {what} within {timeout:?}"),
                ))
            }
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_socket_receives_the_fd_sent_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let cs = ConsoleSocket::bind(dir.path(), "console.sock").unwrap();
        let c = std::os::unix::net::UnixStream::connect(cs.path()).unwrap();
        let f = std::fs::File::open("/dev/null").unwrap();
        send_fd(c.as_fd(), f.as_fd()).unwrap();
        let got = cs.receive_master(Duration::from_secs(1)).unwrap();
        let st = nix::sys::stat::fstat(got.as_raw_fd()).unwrap();
        let want = nix::sys::stat::fstat(f.as_raw_fd()).unwrap();
        assert_eq!((st.st_dev, st.st_ino), (want.st_dev, want.st_ino));
        let path = cs.path().to_path_buf();
        drop(cs);
        assert!(!path.exists());
    }
}
