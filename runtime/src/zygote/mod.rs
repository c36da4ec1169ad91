//! The agent's side of the zygote: [`fork_zygote`] must run while the process still has one
//! thread (first thing in `main`, before tokio); [`ZygoteClient`] sends requests from async
//! code and reads the worker's replies from a pipe without blocking a runtime thread. The
//! zygote's side is [`server`]; what travels between them is [`crate::proto`].

pub(crate) mod confine;
mod isolation;
mod monitor;
mod monitor_image;
mod server;

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use nix::unistd::{fork, ForkResult};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use crate::error::{Error, Result};
use crate::process::{close_other_fds, thread_count};
use crate::proto::{self, Reply, Request};

/// A forked zygote, before the async runtime exists.
pub struct ZygoteHandle {
    sock: OwnedFd,
    pid: i32,
}

impl ZygoteHandle {
    pub fn pid(&self) -> i32 {
        self.pid
    }
}

/// Fork the zygote. Must be called while this process has exactly one thread: first thing in
/// `main`, before tokio or anything else starts a thread.
pub fn fork_zygote() -> Result<ZygoteHandle> {
    let n = thread_count();
    if n != 1 {
        return Err(Error::Zygote(format!(
            "fork_zygote needs a single-threaded process, this one has {n} threads; call it first in main()"
        )));
    }
    let (parent, child) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .map_err(|e| Error::Zygote(format!("socketpair: {e}")))?;
    // SAFETY: the process is single-threaded (checked above).
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            drop(parent);
            // Die with the agent; the monitors it forked are in their own sessions and do not.
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            close_other_fds(child.as_raw_fd());
            monitor_image::prepare();
            let _ = CGROUPS.set(crate::cgroups::Cgroups::detect().ok());
            server::serve(child)
        }
        Ok(ForkResult::Parent { child: pid }) => {
            drop(child);
            Ok(ZygoteHandle {
                sock: parent,
                pid: pid.as_raw(),
            })
        }
        Err(e) => Err(Error::Zygote(format!("fork: {e}"))),
    }
}

/// The node's cgroup hierarchies, found once when the zygote starts (they do not move while
/// it runs): a monitor hands its container's cgroup files to the monitor program without
/// reading `/proc/self/mountinfo` again, a read that grows with every container's mounts.
static CGROUPS: std::sync::OnceLock<Option<crate::cgroups::Cgroups>> = std::sync::OnceLock::new();

/// The hierarchies the zygote found, if any.
pub(crate) fn cgroups() -> Option<&'static crate::cgroups::Cgroups> {
    CGROUPS.get().and_then(Option::as_ref)
}

pub(crate) struct ZygoteClient {
    sock: Mutex<OwnedFd>,
    pid: i32,
}

/// Replies of one request, read asynchronously.
pub(crate) struct Replies {
    reader: BufReader<tokio::net::unix::pipe::Receiver>,
}

impl Replies {
    pub(crate) async fn next(&mut self) -> Result<Reply> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .await
            .map_err(|e| Error::Zygote(format!("reading reply: {e}")))?;
        if n == 0 {
            return Err(Error::Zygote("worker exited without replying".into()));
        }
        serde_json::from_str(&line).map_err(|e| Error::Zygote(format!("bad reply {line:?}: {e}")))
    }

    /// Wait, at most `limit`, until every process holding the reply pipe has let go of it: a
    /// worker that failed has then exited, and closed what it had opened (a log file).
    pub(crate) async fn closed(mut self, limit: std::time::Duration) {
        let drain = async {
            let mut rest = Vec::new();
            let _ = self.reader.read_to_end(&mut rest).await;
        };
        let _ = tokio::time::timeout(limit, drain).await;
    }
}

impl ZygoteClient {
    pub(crate) fn new(handle: ZygoteHandle) -> ZygoteClient {
        ZygoteClient {
            sock: Mutex::new(handle.sock),
            pid: handle.pid,
        }
    }

    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// Send a request with `fds` (after the reply pipe) and return its reply stream.
    pub(crate) fn call(&self, req: &Request, fds: &[&OwnedFd]) -> Result<Replies> {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
            .map_err(|e| Error::Zygote(format!("pipe: {e}")))?;
        // The worker writes blocking; only our end is non-blocking.
        {
            use nix::fcntl::{fcntl, FcntlArg, OFlag};
            // F_GETFL does not fail on an open fd; if it did, -1 goes on as libc's did before.
            let fl = fcntl(w.as_raw_fd(), FcntlArg::F_GETFL).unwrap_or(-1);
            let _ = fcntl(
                w.as_raw_fd(),
                FcntlArg::F_SETFL(OFlag::from_bits_retain(fl) & !OFlag::O_NONBLOCK),
            );
        }
        let mut raw = vec![w.as_raw_fd()];
        raw.extend(fds.iter().map(|f| f.as_raw_fd()));
        {
            let sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
            proto::send_request(sock.as_raw_fd(), req, &raw)
                .map_err(|e| Error::Zygote(format!("sending request (is the zygote alive?): {e}")))?;
        }
        drop(w);
        let receiver = tokio::net::unix::pipe::Receiver::from_owned_fd(r)
            .map_err(|e| Error::Zygote(format!("reply pipe: {e}")))?;
        Ok(Replies {
            reader: BufReader::new(receiver),
        })
    }

    /// A request answered with one `Ok` (or `Failed`).
    pub(crate) async fn call_ok(&self, req: &Request) -> Result<()> {
        let mut r = self.call(req, &[])?;
        match r.next().await? {
            Reply::Ok => Ok(()),
            Reply::Failed { error } => Err(Error::Zygote(error)),
            other => Err(Error::Zygote(format!("unexpected reply {other:?}"))),
        }
    }
}
