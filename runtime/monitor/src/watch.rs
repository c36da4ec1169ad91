//! The monitor's life once its container is built ([`Watch::run`]): copy the container's
//! output into its CRI log and to attachers, serve the attach socket, reap, and when init has
//! exited and its output is drained, record the exit (docs/runtime.md#the-monitor). One poll
//! loop, no threads, no async. It runs in the program the runtime executes for each container
//! ([`crate::handoff`]), or in the forked monitor itself when that cannot be executed.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::attach::server::{AttachServer, Slot};
use crate::crilog::{LineSplitter, LogWriter, Stream};
use crate::ExitRecord;

/// How long output is still collected after the container's init exits, for processes that
/// inherited its stdout (a host-PID container's daemons).
const DRAIN: Duration = Duration::from_secs(2);

/// A container in a pid namespace it does not own (the pod's, the node's) has nothing that
/// ends its other processes with its init: they are killed when it exits, as containerd's shim
/// does (ShouldKillAllOnExit).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KillAll {
    /// The container's cgroup, as `/proc/<pid>/cgroup` names it.
    pub cgroup: String,
    /// Its directory in each hierarchy.
    pub dirs: Vec<PathBuf>,
}

/// What a monitor watches once its container is built.
pub struct Watch {
    pub init: Pid,
    /// The read ends of stdout and stderr, or a terminal's master as stdout.
    pub sources: [Option<File>; 2],
    pub log: LogWriter,
    pub attach: AttachServer,
    /// Where the exit is recorded (`exit.json` in the container's state directory).
    pub exit_path: PathBuf,
    /// The cgroup file counting its OOM kills (crate::cgroup::oom_kills).
    pub oom_events: Option<PathBuf>,
    pub kill_all: Option<KillAll>,
}

impl Watch {
    /// Watch the container until it has exited and its output is drained, record the exit,
    /// let attachers see the end. Returns the monitor's exit code: 0 when the exit is recorded.
    pub fn run(self) -> i32 {
        let Watch {
            init,
            sources,
            mut log,
            mut attach,
            exit_path,
            oom_events,
            kill_all,
        } = self;
        let status = pump(init, sources, &mut log, &mut attach, kill_all.as_ref());
        let (exit_code, signal, reason) = match status {
            Some(WaitStatus::Exited(_, c)) => (c, None, None),
            Some(WaitStatus::Signaled(_, s, _)) => (128 + s as i32, Some(s as i32), None),
            // Reads as an unknown exit, never as a real exit code 255.
            _ => (
                255,
                None,
                Some("the monitor could not collect init's exit status".to_string()),
            ),
        };
        let oom_killed = oom_events
            .as_deref()
            .and_then(crate::cgroup::oom_kills)
            .is_some_and(|n| n > 0);
        let exit = ExitRecord {
            exit_code,
            signal,
            oom_killed,
            finished_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
            reason,
        };
        let recorded = ferrolet_fsutil::write_json_atomic(&exit_path, &exit);
        // Attachers see the end of their session only after the exit is recorded.
        attach.finish(Duration::from_secs(1));
        match recorded {
            Ok(()) => 0,
            Err(_) => 1,
        }
    }
}

/// Copy output into the log (and to attachers) until the container has exited and its
/// output is drained, serving the attach socket meanwhile. Returns the init process's wait
/// status.
fn pump(
    init: Pid,
    sources: [Option<File>; 2],
    log: &mut LogWriter,
    attach: &mut AttachServer,
    kill_all: Option<&KillAll>,
) -> Option<WaitStatus> {
    let pidfd = crate::sys::pidfd_open(init.as_raw()).ok();
    let mut pipes = sources;
    let mut split = [LineSplitter::default(), LineSplitter::default()];
    let streams = [Stream::Stdout, Stream::Stderr];
    let mut status: Option<WaitStatus> = None;
    let mut deadline: Option<Instant> = None;
    // Output is read into a mapping of its own: a quiet container's monitor holds one or two of
    // its 16 pages (crate::anon_buffer).
    let mut output = crate::anon_buffer::AnonBuffer::new(64 * 1024);
    let buf = output.as_mut_slice();
    loop {
        reap(init, &mut status);
        if status.is_some() && deadline.is_none() {
            deadline = Some(Instant::now() + DRAIN);
            if let Some(k) = kill_all {
                crate::cgroup::signal_all(&k.dirs, &k.cgroup, libc::SIGKILL);
            }
        }
        if pipes.iter().all(Option::is_none) && status.is_some() {
            break;
        }
        let timeout = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                PollTimeout::try_from(left.as_millis().min(60_000) as i32).unwrap_or(PollTimeout::NONE)
            }
            // Without a pidfd nothing wakes us when init exits: look often.
            None if pidfd.is_none() => PollTimeout::from(100u16),
            // A container in a pid namespace it does not own (kill_all): its orphans come to
            // this subreaper. Wake up now and then to reap them even if nothing else happens.
            None if kill_all.is_some() => PollTimeout::from(5000u16),
            // In a pid namespace of its own, every orphan goes to the container's init, never
            // here, and the pidfd says when init exits: nothing to wake up for. (100 idle pods'
            // monitors woke 1200 times a minute for nothing.)
            None => PollTimeout::NONE,
        };
        let mut idx = Vec::new();
        let mut pfds = Vec::new();
        for (i, p) in pipes.iter().enumerate() {
            if let Some(f) = p {
                pfds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
                idx.push(i);
            }
        }
        let pidfd_slot = match (&pidfd, status.is_none()) {
            (Some(fd), true) => {
                pfds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                Some(pfds.len() - 1)
            }
            _ => None,
        };
        let attach_base = pfds.len();
        let attach_fds = attach.fds();
        let slots: Vec<Slot> = attach_fds.iter().map(|(_, _, s)| *s).collect();
        pfds.extend(attach_fds.into_iter().map(|(fd, flags, _)| PollFd::new(fd, flags)));
        match poll(&mut pfds, timeout) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => {
                // (ENOMEM, say) Giving up would record an exit for a container still running
                // and stop its log: try again; reap() above still notices the exit.
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        let revents: Vec<PollFlags> = pfds.iter().map(|p| p.revents().unwrap_or(PollFlags::empty())).collect();
        drop(pfds);
        for (k, &i) in idx.iter().enumerate() {
            if revents[k].is_empty() {
                continue;
            }
            let n = pipes[i].as_mut().map(|f| f.read(buf)).unwrap_or(Ok(0));
            let stream = streams[i];
            let mut emit = |line: &[u8], partial: bool| {
                let _ = log.write(chrono::Utc::now(), stream, partial, line);
            };
            match n {
                Ok(n) if n > 0 => {
                    split[i].push(&buf[..n], &mut emit);
                    attach.output(stream, &buf[..n]);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) => {}
                // End of output (EIO is how a pty master says the terminal's last user left).
                Ok(_) | Err(_) => {
                    split[i].finish(&mut emit);
                    pipes[i] = None;
                }
            }
        }
        for (k, slot) in slots.into_iter().enumerate() {
            let r = revents[attach_base + k];
            if !r.is_empty() {
                attach.ready(slot, r);
            }
        }
        if attach.take_reopen() {
            // CRI's ReopenContainerLog: the agent renamed the log to rotate it.
            let r = log
                .reopen()
                .map_err(|e| format!("reopening {}: {e}", args_log_path(log)));
            attach.reopened(r);
        }
        attach.sweep();
        if attach.take_hangup() {
            // stdinOnce on a terminal: closing every master fd hangs the terminal up.
            let stream = streams[0];
            split[0].finish(&mut |line: &[u8], partial: bool| {
                let _ = log.write(chrono::Utc::now(), stream, partial, line);
            });
            pipes[0] = None;
        }
        if let Some(s) = pidfd_slot {
            if !revents[s].is_empty() && status.is_none() {
                if let Ok(ws) = waitpid(init, None) {
                    status = Some(ws);
                }
            }
        }
    }
    for (i, s) in split.iter_mut().enumerate() {
        let stream = streams[i];
        s.finish(&mut |line: &[u8], partial: bool| {
            let _ = log.write(chrono::Utc::now(), stream, partial, line);
        });
    }
    status
}

fn args_log_path(log: &LogWriter) -> String {
    log.path().display().to_string()
}

/// Reap every exited child; note the init's status when it is among them.
fn reap(init: Pid, status: &mut Option<WaitStatus>) {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(ws) => {
                if ws.pid() == Some(init) && status.is_none() {
                    *status = Some(ws);
                }
            }
        }
    }
}
