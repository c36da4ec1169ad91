//! The monitor's descriptor chores: the attach socket's listener, non-blocking descriptors and
//! a terminal's window size.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Set the window size of the terminal whose master is `master` (`TIOCSWINSZ`); the
/// foreground process group on it gets `SIGWINCH`.
pub fn resize_tty(master: BorrowedFd<'_>, width: u16, height: u16) -> ferrolet_fsutil::Result<()> {
    let ws = libc::winsize {
        ws_row: height,
        ws_col: width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which outlives the call. nix has
    // no window-size call (only macros that generate raw ioctls).
    let r = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if r != 0 {
        return Err(ferrolet_fsutil::Error::io(
            format!("resizing terminal to {width}x{height}"),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Bind a unix stream listener at `dir/name` (removing a stale file of that name), through
/// `/proc/self/fd/N/name` so the directory's depth does not matter, owner-only.
pub fn bind_in(dir: &Path, name: &str) -> io::Result<UnixListener> {
    let d = std::fs::File::open(dir)?;
    let short = format!("/proc/self/fd/{}/{name}", d.as_raw_fd());
    let _ = std::fs::remove_file(&short);
    let listener = UnixListener::bind(&short)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Make `fd` non-blocking (the monitor polls it and must never block on it).
pub fn set_nonblocking(fd: BorrowedFd<'_>) {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    // F_GETFL does not fail on an open fd; if it did, -1 goes on as libc's result did before.
    let fl = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL).unwrap_or(-1);
    let _ = fcntl(
        fd.as_raw_fd(),
        FcntlArg::F_SETFL(OFlag::from_bits_retain(fl) | OFlag::O_NONBLOCK),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn resize_sets_the_window_size_seen_on_the_slave() {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        resize_tty(pty.master.as_fd(), 132, 43).expect("resize");
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ writes one winsize.
        assert_eq!(
            unsafe { libc::ioctl(pty.slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) },
            0
        );
        assert_eq!((ws.ws_col, ws.ws_row), (132, 43));
    }

    #[test]
    fn resize_of_a_non_terminal_is_an_error() {
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(resize_tty(f.as_fd(), 80, 24).is_err());
    }
}
