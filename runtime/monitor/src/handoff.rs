//! How a built container's monitor becomes the small program (docs/runtime.md#the-monitor-image).
//!
//! The runtime builds a container in a process forked from its zygote, a copy of the whole
//! agent: its heap, stack and data pages, each written one private to every monitor for as
//! long as its container runs. Once the container is built, that process executes this
//! crate's program instead ([`exec`]): the same process (its pid, start time, children,
//! session and mount namespace stay, so `monitor.json` and the container's parentage hold), a
//! fresh address space of a few pages. It keeps only the descriptors the watch needs, which it
//! describes in one JSON value in the environment ([`ENV`]); the program takes them over
//! ([`receive`]) and runs the same [`Watch`] the forked process would have run.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::attach::server::{AttachParts, AttachServer};
use crate::crilog::{LogParts, LogWriter};
use crate::watch::{KillAll, Watch};

/// The environment variable that carries the [`Handoff`]; the program's only one.
pub const ENV: &str = "FERROLET_MONITOR";

/// The name (`comm`) of every monitor, forked or executed: how the runtime tells a monitor
/// among the processes in `/proc`.
pub const COMM: &str = "ferrolet-mon";

/// A [`Watch`] described by descriptor numbers, which survive `execve`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Handoff {
    pub init: i32,
    pub sources: [Option<RawFd>; 2],
    pub log: LogParts,
    pub attach: AttachParts,
    /// The container's state directory, held open until the monitor exits (how the runtime
    /// finds the monitor when `monitor.json` cannot be read).
    pub state_dir: Option<RawFd>,
    pub exit_path: PathBuf,
    pub oom_events: Option<PathBuf>,
    pub kill_all: Option<KillAll>,
    /// The runtime's request socket and the answer to write on it (one line), written by the
    /// program once it runs: the runtime learns that the container is created only from a
    /// monitor that is already this program.
    pub reply: Option<(RawFd, String)>,
}

impl Handoff {
    /// Every descriptor handed over.
    fn fds(&self) -> Vec<RawFd> {
        let [out, err] = self.sources;
        [
            out,
            err,
            self.log.fd,
            self.attach.listener,
            self.attach.stdin,
            self.attach.resize,
            self.state_dir,
            self.reply.as_ref().map(|r| r.0),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// What the program takes over.
pub struct Received {
    pub watch: Watch,
    /// Held until the monitor exits.
    pub state_dir: Option<File>,
    /// The socket to answer on, and the answer.
    pub reply: Option<(OwnedFd, String)>,
}

impl Received {
    /// Write the answer the runtime waits for, and close its socket.
    pub fn answer(&mut self) {
        if let Some((fd, line)) = self.reply.take() {
            let mut rest = line.as_bytes();
            // Short writes go on, EINTR tries again, any other error gives up.
            while !rest.is_empty() {
                match nix::unistd::write(&fd, rest) {
                    Ok(0) => break,
                    Ok(n) => rest = &rest[n..],
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(_) => break,
                }
            }
        }
    }
}

/// Execute the monitor program in `image` (a sealed memfd holding it) to watch `watch`,
/// keeping `state_dir` open; the program writes `answer` (one line) on `reply` once it runs.
/// The program's command line is `ferrolet-monitor <title>`, cut to a page as the kernel shows
/// it. Returns only when it could not: then `watch` is as it was, and the answer unwritten, for
/// this process to see to.
pub fn exec(
    image: BorrowedFd<'_>,
    title: &str,
    watch: &Watch,
    state_dir: Option<&File>,
    reply: BorrowedFd<'_>,
    answer: String,
) -> io::Error {
    let Some(attach) = watch.attach.parts() else {
        return io::Error::new(
            io::ErrorKind::WouldBlock,
            "the attach server has already served someone",
        );
    };
    let handoff = Handoff {
        init: watch.init.as_raw(),
        sources: [0, 1].map(|i| watch.sources[i].as_ref().map(|f| f.as_raw_fd())),
        log: watch.log.parts(),
        attach,
        state_dir: state_dir.map(|f| f.as_raw_fd()),
        exit_path: watch.exit_path.clone(),
        oom_events: watch.oom_events.clone(),
        kill_all: watch.kill_all.clone(),
        reply: Some((reply.as_raw_fd(), answer)),
    };
    for fd in handoff.fds() {
        // The descriptors were opened close-on-exec; these must stay open across it.
        if let Err(e) = fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())) {
            return io::Error::from(e);
        }
    }
    let json = match serde_json::to_string(&handoff) {
        Ok(j) => j,
        Err(e) => return io::Error::other(e),
    };
    // One argument, as the forked monitor's rewritten command line was: `ps` and
    // /proc/<pid>/cmdline show the title as it is.
    let mut line: String = format!("ferrolet-monitor {title}")
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    let page = crate::sys::page_size() - 1;
    if line.len() > page {
        let mut end = page;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
    }
    let (Ok(argv0), Ok(env)) = (CString::new(line), CString::new(format!("{ENV}={json}"))) else {
        return io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the monitor's handoff");
    };
    let Err(e) = nix::unistd::execveat(
        Some(image.as_raw_fd()),
        c"",
        &[argv0],
        &[env],
        nix::fcntl::AtFlags::AT_EMPTY_PATH,
    );
    io::Error::from(e)
}

/// In the program: what the runtime handed over.
pub fn receive() -> Result<Received, String> {
    let json = std::env::var(ENV).map_err(|e| format!("{ENV}: {e}"))?;
    let h: Handoff = serde_json::from_str(&json).map_err(|e| format!("{ENV}: {e}"))?;
    let mut seen = Vec::new();
    for fd in h.fds() {
        // Each descriptor is taken over once, and only one this process has open.
        if fd < 3 || seen.contains(&fd) || fcntl(fd, FcntlArg::F_GETFD).is_err() {
            return Err(format!("{ENV}: descriptor {fd} is not one handed over"));
        }
        seen.push(fd);
    }
    for &fd in &seen {
        // Not handed on to anything this program starts (it starts nothing).
        let _ = fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    }
    // SAFETY (all): each descriptor was checked above to be open, distinct and not stdio;
    // the runtime kept exactly these open across the exec for this program to own.
    let watch = Watch {
        init: Pid::from_raw(h.init),
        sources: h.sources.map(|fd| fd.map(|fd| unsafe { File::from_raw_fd(fd) })),
        log: unsafe { LogWriter::from_parts(h.log) },
        attach: unsafe { AttachServer::from_parts(h.attach) },
        exit_path: h.exit_path,
        oom_events: h.oom_events,
        kill_all: h.kill_all,
    };
    Ok(Received {
        watch,
        state_dir: h.state_dir.map(|fd| unsafe { File::from_raw_fd(fd) }),
        reply: h.reply.map(|(fd, line)| (unsafe { OwnedFd::from_raw_fd(fd) }, line)),
    })
}
