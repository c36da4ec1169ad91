//! pidfds: a handle on a process that cannot be confused with a later process reusing its pid.
//! Used to wait for monitors (readable when the process exits) and to signal containers. Pids
//! read from state files are checked against their recorded start time first
//! ([`process_matches`]).

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use tokio::io::unix::AsyncFd;

pub struct PidFd {
    fd: OwnedFd,
    pid: i32,
}

impl PidFd {
    /// Open a pidfd for `pid`. Callers check the process start time first when the pid came
    /// from a file, so a reused pid is not mistaken for the process recorded there.
    pub fn open(pid: i32) -> io::Result<PidFd> {
        Ok(PidFd {
            fd: ferrolet_monitor::sys::pidfd_open(pid)?,
            pid,
        })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Already gone is not an error for a kill.
    pub fn send_signal(&self, signal: i32) -> io::Result<()> {
        ferrolet_monitor::sys::pidfd_send_signal(&self.fd, signal)
    }

    /// True once the process has exited (the pidfd is readable; a zombie has exited too).
    pub fn has_exited(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        loop {
            match poll(&mut fds, PollTimeout::ZERO) {
                Ok(n) => return n > 0,
                Err(nix::errno::Errno::EINTR) => continue,
                // Cannot tell: say exited, so the caller looks at the process afresh.
                Err(_) => return true,
            }
        }
    }

    /// Wait until the process exits (the pidfd becomes readable).
    pub async fn exited(self) -> io::Result<()> {
        // SAFETY: OwnedFd always returns the same valid fd for its whole life.
        let afd = unsafe { AsyncFd::register_with_interest(self.fd, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        let _guard = afd.readable().await?;
        Ok(())
    }
}

/// Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat), used with
/// the pid to tell a live process from a later one that reused its pid.
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// True when `pid` is alive (not a zombie waiting to be reaped) and started at `start_time`.
pub fn process_matches(pid: i32, start_time: u64) -> bool {
    if pid <= 0 {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    // state (a dead process whose parent has not reaped it yet is 'Z' or 'X')
    if matches!(fields.next(), Some("Z") | Some("X") | None) {
        return false;
    }
    fields.nth(18).and_then(|t| t.parse::<u64>().ok()) == Some(start_time)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_of_self_is_stable() {
        let me = std::process::id() as i32;
        let t = process_start_time(me).unwrap();
        assert!(process_matches(me, t));
        assert!(!process_matches(me, t + 1));
        assert!(!process_matches(0, t));
    }

    #[test]
    fn a_zombie_does_not_match() {
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let t = process_start_time(pid).unwrap();
        // not reaped yet: a zombie once it exited
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while process_matches(pid, t) {
            assert!(std::time::Instant::now() < deadline, "child never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(process_start_time(pid), Some(t), "still there as a zombie");
        let mut child = child;
        child.wait().unwrap();
    }

    #[test]
    fn a_pidfd_says_when_its_process_exited_zombie_or_reaped() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let fd = PidFd::open(child.id() as i32).unwrap();
        assert!(!fd.has_exited());
        child.kill().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        // Killed, not reaped yet: a zombie has exited.
        while !fd.has_exited() {
            assert!(std::time::Instant::now() < deadline, "the pidfd never became readable");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.wait().unwrap();
        assert!(fd.has_exited());
    }
}
