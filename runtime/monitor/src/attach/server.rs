//! The monitor's side of attach: a unix socket in the container's state directory
//! (`<state dir>/attach`, owner-only) served from the monitor's single poll loop, no threads.
//!
//! - Any number of attachers receive the output the monitor reads (stdout and stderr tagged;
//!   with a terminal there is only the pty's output, sent as stdout). Each has a bounded queue
//!   ([`MAX_QUEUE`]); output that does not fit is dropped for that attacher only, so a slow
//!   attacher never holds up the CRI log or the container.
//! - Attachers that asked for stdin write to the container's stdin (the write end of its stdin
//!   pipe, or the pty master). Bytes wait in one bounded buffer; while it is full, attachers
//!   are not read (back-pressure to them, never a blocked monitor).
//! - `stdinOnce`: when the first attacher that had stdin detaches or closes its stdin, the
//!   container's stdin is closed once what it wrote is delivered. With a terminal that means
//!   hanging up the terminal, as containerd's shim does (the container's session gets
//!   `SIGHUP`).
//! - Resize (`TIOCSWINSZ`) for a terminal.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::poll::PollFlags;
use nix::sys::socket::MsgFlags;

use super::wire::{self, Decoder, Hello, Refused, Welcome};
use crate::crilog::Stream;

/// Output queued for one attacher at most; more is dropped for it.
pub const MAX_QUEUE: usize = 1 << 20;
/// Stdin bytes waiting for the container at most before attachers stop being read.
const MAX_PENDING_STDIN: usize = 256 * 1024;
/// Attachers served at once; further connections are closed.
const MAX_CLIENTS: usize = 64;
/// The name of the socket in the container's state directory.
pub const SOCKET_NAME: &str = "attach";

/// What the container's stdio looks like to attachers.
pub struct StdioSetup {
    pub tty: bool,
    pub stdin_once: bool,
    /// Where attachers' stdin goes: the write end of the stdin pipe, or a dup of the pty
    /// master. None when the container has no stdin.
    pub stdin: Option<OwnedFd>,
    /// A dup of the pty master for resizes (terminal only).
    pub resize: Option<OwnedFd>,
}

struct Client {
    sock: UnixStream,
    dec: Decoder,
    out: VecDeque<u8>,
    hello: Option<Hello>,
    /// Its stdin ended (CLOSE_STDIN, or it shut down its sending side); later STDIN frames
    /// are ignored.
    stdin_done: bool,
    /// It shut down its sending side: nothing more to read, but it may still take output
    /// (a caller that dropped only its writer half).
    input_done: bool,
    /// Refused: flush the refusal, then close.
    closing: bool,
    gone: bool,
    /// It asked for the log to be reopened and waits for the answer.
    wants_reopen: bool,
}

/// An [`AttachServer`] that has served nobody yet, described for another program.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AttachParts {
    pub listener: Option<std::os::fd::RawFd>,
    pub path: PathBuf,
    pub tty: bool,
    pub stdin_once: bool,
    pub stdin: Option<std::os::fd::RawFd>,
    pub resize: Option<std::os::fd::RawFd>,
}

/// A pollable descriptor of the server and what it stands for.
#[derive(Clone, Copy, Debug)]
pub enum Slot {
    Listener,
    Client(usize),
    Stdin,
}

pub struct AttachServer {
    listener: Option<UnixListener>,
    path: PathBuf,
    clients: Vec<Client>,
    tty: bool,
    stdin_once: bool,
    has_stdin: bool,
    stdin: Option<File>,
    resize: Option<OwnedFd>,
    pending: Vec<u8>,
    close_when_flushed: bool,
    /// A terminal's stdin was closed: the monitor must close its pty master as well.
    hangup: bool,
    /// A caller asked for the CRI log to be reopened.
    reopen: bool,
    /// What a client's frames are read into, allocated at the first read: on the stack it
    /// would make the monitor's loop frame 32 KiB deeper, resident for the container's life.
    read_buf: Vec<u8>,
}

impl AttachServer {
    /// Bind `<dir>/attach`. A failure leaves a server without a listener: the container runs
    /// and logs, it just cannot be attached to.
    pub fn bind(dir: &Path, setup: StdioSetup) -> (AttachServer, Option<std::io::Error>) {
        let (listener, err) = match crate::tty::bind_in(dir, SOCKET_NAME) {
            Ok(l) => match l.set_nonblocking(true) {
                Ok(()) => (Some(l), None),
                Err(e) => (None, Some(e)),
            },
            Err(e) => (None, Some(e)),
        };
        for fd in [&setup.stdin, &setup.resize].into_iter().flatten() {
            crate::tty::set_nonblocking(fd.as_fd());
        }
        let server = AttachServer {
            listener,
            path: dir.join(SOCKET_NAME),
            clients: Vec::new(),
            tty: setup.tty,
            stdin_once: setup.stdin_once,
            has_stdin: setup.stdin.is_some(),
            stdin: setup.stdin.map(File::from),
            resize: setup.resize,
            pending: Vec::new(),
            close_when_flushed: false,
            hangup: false,
            reopen: false,
            read_buf: Vec::new(),
        };
        (server, err)
    }

    /// The server described for another program (crate::handoff): its listener, stdin and
    /// resize descriptors and settings. None once anything has connected or is queued: only a
    /// server that has served nobody yet moves.
    pub fn parts(&self) -> Option<AttachParts> {
        use std::os::fd::AsRawFd;
        if !self.clients.is_empty() || !self.pending.is_empty() || self.close_when_flushed || self.hangup || self.reopen
        {
            return None;
        }
        Some(AttachParts {
            listener: self.listener.as_ref().map(|l| l.as_raw_fd()),
            path: self.path.clone(),
            tty: self.tty,
            stdin_once: self.stdin_once,
            stdin: self.stdin.as_ref().map(|f| f.as_raw_fd()),
            resize: self.resize.as_ref().map(|f| f.as_raw_fd()),
        })
    }

    /// The server [`parts`](AttachServer::parts) describes.
    ///
    /// # Safety
    /// Every descriptor in `parts` must be open, be what it was when described, and be owned
    /// by nothing else in this process: the server takes them over.
    pub unsafe fn from_parts(parts: AttachParts) -> AttachServer {
        use std::os::fd::FromRawFd;
        AttachServer {
            // SAFETY (all three): the caller hands the descriptors over.
            listener: parts.listener.map(|fd| unsafe { UnixListener::from_raw_fd(fd) }),
            path: parts.path,
            clients: Vec::new(),
            tty: parts.tty,
            stdin_once: parts.stdin_once,
            has_stdin: parts.stdin.is_some(),
            stdin: parts.stdin.map(|fd| unsafe { File::from_raw_fd(fd) }),
            resize: parts.resize.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            pending: Vec::new(),
            close_when_flushed: false,
            hangup: false,
            reopen: false,
            read_buf: Vec::new(),
        }
    }

    /// The descriptors to poll and for what.
    pub fn fds(&self) -> Vec<(BorrowedFd<'_>, PollFlags, Slot)> {
        let mut v = Vec::new();
        if let Some(l) = &self.listener {
            v.push((l.as_fd(), PollFlags::POLLIN, Slot::Listener));
        }
        let read_more = self.pending.len() < MAX_PENDING_STDIN;
        for (i, c) in self.clients.iter().enumerate() {
            let mut f = PollFlags::empty();
            if !c.closing && !c.input_done && (read_more || c.hello.is_none()) {
                f |= PollFlags::POLLIN;
            }
            if !c.out.is_empty() {
                f |= PollFlags::POLLOUT;
            }
            v.push((c.sock.as_fd(), f, Slot::Client(i)));
        }
        if let (Some(s), false) = (&self.stdin, self.pending.is_empty()) {
            v.push((s.as_fd(), PollFlags::POLLOUT, Slot::Stdin));
        }
        v
    }

    /// Act on what poll reported for `slot`. Call [`sweep`](Self::sweep) after the round.
    pub fn ready(&mut self, slot: Slot, revents: PollFlags) {
        match slot {
            Slot::Listener => self.accept(),
            Slot::Client(i) => {
                let hup = revents.intersects(PollFlags::POLLHUP | PollFlags::POLLERR);
                if revents.contains(PollFlags::POLLIN) && !self.clients[i].input_done {
                    // Before a hang-up, take everything it sent (its last stdin).
                    while self.read_client(i) && hup {}
                }
                if hup {
                    // Closed entirely (a half-close is only end of input): detached.
                    self.clients[i].gone = true;
                } else if revents.contains(PollFlags::POLLOUT) {
                    flush_client(&mut self.clients[i]);
                }
            }
            Slot::Stdin => self.flush_stdin(),
        }
    }

    /// Drop attachers that left, closing stdin for `stdinOnce`.
    pub fn sweep(&mut self) {
        let mut i = 0;
        while i < self.clients.len() {
            let c = &self.clients[i];
            let done = c.gone || (c.closing && c.out.is_empty());
            if done {
                let had_stdin = c.hello.is_some_and(|h| h.stdin) && !c.stdin_done && !c.closing;
                self.clients.swap_remove(i);
                if had_stdin {
                    self.stdin_ended();
                }
            } else {
                i += 1;
            }
        }
        self.flush_stdin();
    }

    /// True once after a caller asked for the CRI log to be reopened: the monitor reopens it
    /// and answers with [`reopened`](Self::reopened).
    pub fn take_reopen(&mut self) -> bool {
        std::mem::take(&mut self.reopen)
    }

    /// Answer every caller waiting for a reopen (`Err`: why it failed), then close them.
    pub fn reopened(&mut self, result: Result<(), String>) {
        let payload = result.err().unwrap_or_default();
        for c in self.clients.iter_mut().filter(|c| c.wants_reopen && !c.closing) {
            c.out.extend(wire::frame(wire::REOPENED, payload.as_bytes()));
            c.closing = true;
            flush_client(c);
        }
    }

    /// True once, when a terminal's stdin was closed (`stdinOnce`): the caller closes its
    /// master so the terminal hangs up.
    pub fn take_hangup(&mut self) -> bool {
        std::mem::take(&mut self.hangup)
    }

    /// Queue container output for every attacher that wants `stream`.
    pub fn output(&mut self, stream: Stream, data: &[u8]) {
        let kind = match stream {
            Stream::Stdout => wire::STDOUT,
            Stream::Stderr => wire::STDERR,
        };
        for c in &mut self.clients {
            let Some(h) = c.hello else { continue };
            let wanted = match stream {
                Stream::Stdout => h.stdout,
                Stream::Stderr => h.stderr,
            };
            if !wanted || c.closing || c.gone {
                continue;
            }
            if c.out.len() + data.len() + 5 > MAX_QUEUE {
                // This attacher does not keep up: it misses this output, nobody waits for it.
                continue;
            }
            c.out.extend(wire::frame(kind, data));
            flush_client(c);
        }
    }

    /// The container is gone: give attachers up to `limit` to take what is queued for them,
    /// then close every connection and remove the socket.
    pub fn finish(&mut self, limit: Duration) {
        self.listener = None;
        let _ = std::fs::remove_file(&self.path);
        let deadline = Instant::now() + limit;
        loop {
            self.clients.retain(|c| !c.gone && !c.out.is_empty());
            if self.clients.is_empty() {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut pfds: Vec<nix::poll::PollFd> = self
                .clients
                .iter()
                .map(|c| nix::poll::PollFd::new(c.sock.as_fd(), PollFlags::POLLOUT))
                .collect();
            let ms = nix::poll::PollTimeout::try_from(left.as_millis().min(1000) as i32)
                .unwrap_or(nix::poll::PollTimeout::ZERO);
            let ready: Vec<bool> = match nix::poll::poll(&mut pfds, ms) {
                Ok(_) => pfds
                    .iter()
                    .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
                    .collect(),
                Err(_) => vec![false; pfds.len()],
            };
            drop(pfds);
            for (c, r) in self.clients.iter_mut().zip(ready) {
                if r {
                    flush_client(c);
                }
            }
        }
        self.clients.clear();
    }

    fn accept(&mut self) {
        let Some(l) = &self.listener else { return };
        loop {
            match l.accept() {
                Ok((sock, _)) => {
                    if self.clients.len() >= MAX_CLIENTS || sock.set_nonblocking(true).is_err() {
                        continue;
                    }
                    self.clients.push(Client {
                        sock,
                        dec: Decoder::default(),
                        out: VecDeque::new(),
                        hello: None,
                        stdin_done: false,
                        input_done: false,
                        closing: false,
                        gone: false,
                        wants_reopen: false,
                    });
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }

    /// Read once and act on the whole frames; true when there may be more to read.
    fn read_client(&mut self, i: usize) -> bool {
        if self.read_buf.is_empty() {
            self.read_buf = vec![0u8; 32 * 1024];
        }
        let n = match self.clients[i].sock.read(&mut self.read_buf) {
            Ok(0) => {
                // End of its input: its stdin ends, its output goes on until it closes.
                let c = &mut self.clients[i];
                c.input_done = true;
                if c.hello.is_none() {
                    c.gone = true;
                } else if c.hello.is_some_and(|h| h.stdin) && !c.stdin_done {
                    c.stdin_done = true;
                    self.stdin_ended();
                }
                return false;
            }
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => return true,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => {
                self.clients[i].gone = true;
                return false;
            }
        };
        self.clients[i].dec.push(&self.read_buf[..n]);
        loop {
            let frame = match self.clients[i].dec.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => return true,
                Err(_) => {
                    self.clients[i].gone = true;
                    return false;
                }
            };
            self.frame(i, frame.0, &frame.1);
            if self.clients[i].gone || self.clients[i].closing {
                return false;
            }
        }
    }

    fn frame(&mut self, i: usize, kind: u8, payload: &[u8]) {
        let Some(hello) = self.clients[i].hello else {
            if kind == wire::REOPEN_LOG && !self.clients[i].wants_reopen {
                self.clients[i].wants_reopen = true;
                self.reopen = true;
                return;
            }
            if kind != wire::HELLO {
                self.clients[i].gone = true;
                return;
            }
            self.hello(i, payload);
            return;
        };
        match kind {
            wire::STDIN => {
                let c = &self.clients[i];
                if hello.stdin && !c.stdin_done && self.stdin.is_some() && !self.close_when_flushed {
                    self.pending.extend_from_slice(payload);
                    self.flush_stdin();
                }
            }
            wire::CLOSE_STDIN => {
                if hello.stdin && !self.clients[i].stdin_done {
                    self.clients[i].stdin_done = true;
                    self.stdin_ended();
                }
            }
            wire::RESIZE => {
                if let (Some(fd), Some((w, h))) = (&self.resize, wire::parse_resize(payload)) {
                    let _ = crate::tty::resize_tty(fd.as_fd(), w, h);
                }
            }
            _ => self.clients[i].gone = true,
        }
    }

    fn hello(&mut self, i: usize, payload: &[u8]) {
        let c = &mut self.clients[i];
        let hello: Hello = match serde_json::from_slice(payload) {
            Ok(h) => h,
            Err(e) => {
                refuse(c, "", &format!("bad attach request: {e}"));
                return;
            }
        };
        if hello.stdin && !self.has_stdin {
            refuse(
                c,
                "stdin",
                "the container was not created with stdin (stdin: false), so there is no stdin to attach to",
            );
            return;
        }
        let welcome = Welcome {
            tty: self.tty,
            stdin_open: self.stdin.is_some() && !self.close_when_flushed,
        };
        c.hello = Some(hello);
        c.out.extend(wire::frame(
            wire::WELCOME,
            &serde_json::to_vec(&welcome).unwrap_or_default(),
        ));
        flush_client(c);
    }

    /// An attacher's stdin ended (it detached or closed it).
    fn stdin_ended(&mut self) {
        if self.stdin_once && self.stdin.is_some() {
            self.close_when_flushed = true;
            self.flush_stdin();
        }
    }

    fn flush_stdin(&mut self) {
        let Some(s) = &mut self.stdin else {
            self.pending.clear();
            return;
        };
        while !self.pending.is_empty() {
            match s.write(&self.pending) {
                Ok(0) => break,
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => {
                    // The container closed its stdin (EPIPE) or the terminal hung up.
                    self.pending.clear();
                    self.stdin = None;
                    return;
                }
            }
        }
        if self.close_when_flushed {
            self.stdin = None;
            if self.tty {
                self.resize = None;
                self.hangup = true;
            }
        }
    }
}

fn refuse(c: &mut Client, field: &str, reason: &str) {
    let r = Refused {
        field: field.into(),
        reason: reason.into(),
    };
    c.out
        .extend(wire::frame(wire::REFUSED, &serde_json::to_vec(&r).unwrap_or_default()));
    c.closing = true;
    flush_client(c);
}

/// Write what is queued without blocking (MSG_NOSIGNAL: a vanished attacher is not a signal).
fn flush_client(c: &mut Client) {
    while !c.out.is_empty() {
        let (a, _) = c.out.as_slices();
        match nix::sys::socket::send(
            std::os::fd::AsRawFd::as_raw_fd(&c.sock),
            a,
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(n) => {
                c.out.drain(..n);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => return,
            Err(_) => {
                c.gone = true;
                c.out.clear();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Run the server's side of one poll round over whatever is ready now.
    fn round(s: &mut AttachServer) {
        let fds = s.fds();
        let mut pfds: Vec<nix::poll::PollFd> = fds.iter().map(|(fd, f, _)| nix::poll::PollFd::new(*fd, *f)).collect();
        let slots: Vec<Slot> = fds.iter().map(|(_, _, s)| *s).collect();
        nix::poll::poll(&mut pfds, nix::poll::PollTimeout::from(200u16)).unwrap();
        let rev: Vec<PollFlags> = pfds.iter().map(|p| p.revents().unwrap_or(PollFlags::empty())).collect();
        drop(pfds);
        drop(fds);
        for (slot, r) in slots.into_iter().zip(rev) {
            if !r.is_empty() {
                s.ready(slot, r);
            }
        }
        s.sweep();
    }

    fn hello(c: &mut UnixStream, stdin: bool) {
        let h = Hello {
            stdin,
            stdout: true,
            stderr: false,
        };
        c.write_all(&wire::frame(wire::HELLO, &serde_json::to_vec(&h).unwrap()))
            .unwrap();
    }

    fn read_frames(c: &mut UnixStream) -> Vec<(u8, Vec<u8>)> {
        c.set_nonblocking(true).unwrap();
        let mut d = Decoder::default();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match c.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => d.push(&buf[..n]),
                Err(_) => break,
            }
        }
        let mut v = Vec::new();
        while let Some(f) = d.next_frame().unwrap() {
            v.push(f);
        }
        v
    }

    #[test]
    fn a_slow_attacher_is_bounded_and_a_stdin_once_detach_closes_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        let (mut s, err) = AttachServer::bind(
            dir.path(),
            StdioSetup {
                tty: false,
                stdin_once: true,
                stdin: Some(w),
                resize: None,
            },
        );
        assert!(err.is_none());
        let mut slow = UnixStream::connect(dir.path().join(SOCKET_NAME)).unwrap();
        let mut fast = UnixStream::connect(dir.path().join(SOCKET_NAME)).unwrap();
        hello(&mut slow, true);
        hello(&mut fast, false);
        for _ in 0..5 {
            round(&mut s);
        }
        assert_eq!(s.clients.len(), 2);
        // 8 MiB of output while `slow` reads nothing: its queue stays bounded.
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..128 {
            s.output(Stream::Stdout, &chunk);
            s.output(Stream::Stderr, &chunk);
            // `fast` keeps up.
            let _ = read_frames(&mut fast);
        }
        assert!(s.clients.iter().all(|c| c.out.len() <= MAX_QUEUE));
        let frames = read_frames(&mut slow);
        assert_eq!(frames[0].0, wire::WELCOME);
        assert!(
            frames[1..].iter().all(|(k, _)| *k == wire::STDOUT),
            "stderr was not asked for"
        );
        // stdin reaches the container's pipe; detaching closes it (stdinOnce).
        slow.write_all(&wire::frame(wire::STDIN, b"hello\n")).unwrap();
        round(&mut s);
        drop(slow);
        for _ in 0..3 {
            round(&mut s);
        }
        assert_eq!(s.clients.len(), 1);
        let mut got = String::new();
        std::fs::File::from(r).read_to_string(&mut got).unwrap();
        assert_eq!(got, "hello\n", "stdin delivered, then closed (EOF)");
    }

    #[test]
    fn stdin_is_refused_by_name_without_a_container_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = AttachServer::bind(
            dir.path(),
            StdioSetup {
                tty: false,
                stdin_once: false,
                stdin: None,
                resize: None,
            },
        );
        let mut c = UnixStream::connect(dir.path().join(SOCKET_NAME)).unwrap();
        hello(&mut c, true);
        for _ in 0..3 {
            round(&mut s);
        }
        let frames = read_frames(&mut c);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].0, wire::REFUSED);
        let r: Refused = serde_json::from_slice(&frames[0].1).unwrap();
        assert_eq!(r.field, "stdin");
        assert!(s.clients.is_empty(), "a refused attacher is dropped");
        let mode = std::fs::metadata(dir.path().join(SOCKET_NAME)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode.permissions().mode() & 0o777, 0o600);
    }
}
