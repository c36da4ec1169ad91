//! Attaching to a running container's stdio (docs/runtime.md#terminals-and-attach), as
//! `kubectl attach` and `kubectl run -it` need. The container's monitor holds its stdio and
//! serves a unix socket in the state directory ([`server`], part of the monitor's poll
//! loop); [`Attach`] is the caller's async session on it, and splits into a reader and a
//! writer so both directions can be driven at once. The bytes on the socket are [`wire`].

pub(crate) use ferrolet_monitor::attach::{server, wire};

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

use crate::error::{Error, Result};
use wire::{Decoder, Hello, Refused, Welcome};

/// Which of the container's streams an attacher wants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttachOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

/// Output of the container, as its monitor read it. With a terminal there is only `Stdout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachOutput {
    Stdout(Bytes),
    Stderr(Bytes),
}

/// An attach session. Dropping it detaches (for a `stdinOnce` container that attached stdin,
/// this closes the container's stdin).
pub struct Attach {
    reader: AttachReader,
    writer: AttachWriter,
}

/// The receiving half of an [`Attach`].
pub struct AttachReader {
    rd: OwnedReadHalf,
    dec: Decoder,
    buf: Vec<u8>,
    tty: bool,
    done: bool,
}

/// The sending half of an [`Attach`]: stdin and resizes.
pub struct AttachWriter {
    id: String,
    wr: OwnedWriteHalf,
    tty: bool,
    stdin: bool,
    stdin_open: bool,
    stdin_closed: bool,
}

/// How long the monitor may take to answer the attach request.
const HANDSHAKE: Duration = Duration::from_secs(10);

impl Attach {
    /// Connect to the monitor's socket `<dir>/attach` and ask for `opts`.
    pub(crate) async fn connect(id: &str, dir: &Path, opts: AttachOptions) -> Result<Attach> {
        let sock = connect_in(dir, wire_name()).await.map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::container(
                id,
                "attach: the container's monitor serves no attach socket (it was started by an older ferrolet)",
            ),
            _ => Error::container(id, format!("attach: connecting to the container's monitor: {e}")),
        })?;
        let (mut rd, mut wr) = sock.into_split();
        let hello = Hello {
            stdin: opts.stdin,
            stdout: opts.stdout,
            stderr: opts.stderr,
        };
        let req = wire::frame(wire::HELLO, &serde_json::to_vec(&hello).unwrap_or_default());
        let io_err =
            |e: std::io::Error| Error::container(id, format!("attach: talking to the container's monitor: {e}"));
        wr.write_all(&req).await.map_err(io_err)?;
        let mut dec = Decoder::default();
        let mut buf = vec![0u8; 64 * 1024];
        let (kind, payload) = tokio::time::timeout(HANDSHAKE, read_frame(&mut rd, &mut dec, &mut buf))
            .await
            .map_err(|_| Error::container(id, "attach: the container's monitor did not answer"))?
            .map_err(io_err)?
            .ok_or_else(|| Error::container(id, "attach: the container exited"))?;
        match kind {
            wire::WELCOME => {
                let w: Welcome = serde_json::from_slice(&payload)
                    .map_err(|e| Error::container(id, format!("attach: bad answer from the monitor: {e}")))?;
                Ok(Attach {
                    reader: AttachReader {
                        rd,
                        dec,
                        buf,
                        tty: w.tty,
                        done: false,
                    },
                    writer: AttachWriter {
                        id: id.to_string(),
                        wr,
                        tty: w.tty,
                        stdin: opts.stdin,
                        stdin_open: w.stdin_open,
                        stdin_closed: false,
                    },
                })
            }
            wire::REFUSED => {
                let r: Refused = serde_json::from_slice(&payload).unwrap_or(Refused {
                    field: String::new(),
                    reason: "refused".into(),
                });
                if r.field.is_empty() {
                    Err(Error::container(id, format!("attach: {}", r.reason)))
                } else {
                    Err(Error::invalid_config(r.field, r.reason))
                }
            }
            k => Err(Error::container(
                id,
                format!("attach: unexpected answer {k} from the monitor"),
            )),
        }
    }

    /// Whether the container runs on a terminal (output is then only `Stdout`, and resize
    /// applies).
    pub fn tty(&self) -> bool {
        self.reader.tty
    }

    /// Whether the container's stdin was open when this session began: false for a container
    /// without `stdin`, or a `stdinOnce` container whose stdin an earlier attacher closed
    /// (what is written then is dropped, as with containerd).
    pub fn stdin_open(&self) -> bool {
        self.writer.stdin_open
    }

    /// The next output; None when the container exited (or its monitor went away).
    pub async fn next(&mut self) -> Option<AttachOutput> {
        self.reader.next().await
    }

    pub async fn write_stdin(&mut self, data: &[u8]) -> Result<()> {
        self.writer.write_stdin(data).await
    }

    pub async fn close_stdin(&mut self) -> Result<()> {
        self.writer.close_stdin().await
    }

    pub async fn resize(&mut self, width: u16, height: u16) -> Result<()> {
        self.writer.resize(width, height).await
    }

    /// Separate halves, to read output and write stdin from different tasks. Dropping the
    /// writer ends this attacher's stdin (see [`AttachWriter::close_stdin`]) while the reader
    /// still gets output; dropping both detaches.
    pub fn into_split(self) -> (AttachReader, AttachWriter) {
        (self.reader, self.writer)
    }
}

impl AttachReader {
    pub fn tty(&self) -> bool {
        self.tty
    }

    /// The next output; None when the container exited (or its monitor went away).
    pub async fn next(&mut self) -> Option<AttachOutput> {
        while !self.done {
            match read_frame(&mut self.rd, &mut self.dec, &mut self.buf).await {
                Ok(Some((wire::STDOUT, p))) => return Some(AttachOutput::Stdout(Bytes::from(p))),
                Ok(Some((wire::STDERR, p))) => return Some(AttachOutput::Stderr(Bytes::from(p))),
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => self.done = true,
            }
        }
        None
    }
}

impl AttachWriter {
    pub fn tty(&self) -> bool {
        self.tty
    }

    /// See [`Attach::stdin_open`].
    pub fn stdin_open(&self) -> bool {
        self.stdin_open
    }

    /// Write to the container's stdin. Delivered in order with other attachers' input; once
    /// the container's stdin is closed (`stdinOnce`) the bytes are dropped.
    pub async fn write_stdin(&mut self, data: &[u8]) -> Result<()> {
        if !self.stdin {
            return Err(Error::invalid_config(
                "stdin",
                "this attach session was opened without stdin",
            ));
        }
        if self.stdin_closed {
            return Err(Error::container(&self.id, "attach: stdin was already closed"));
        }
        for chunk in data.chunks(64 * 1024) {
            self.send(wire::STDIN, chunk).await?;
        }
        Ok(())
    }

    /// This attacher's stdin ended. For a `stdinOnce` container this closes the container's
    /// stdin (after what was written is delivered); otherwise the container's stdin stays open
    /// for other attachers.
    pub async fn close_stdin(&mut self) -> Result<()> {
        if !self.stdin || self.stdin_closed {
            return Ok(());
        }
        self.stdin_closed = true;
        self.send(wire::CLOSE_STDIN, &[]).await
    }

    /// Set the terminal's window size (ignored when the container has no terminal).
    pub async fn resize(&mut self, width: u16, height: u16) -> Result<()> {
        self.send(wire::RESIZE, &wire::resize_payload(width, height)).await
    }

    async fn send(&mut self, kind: u8, payload: &[u8]) -> Result<()> {
        self.wr
            .write_all(&wire::frame(kind, payload))
            .await
            .map_err(|e| Error::container(&self.id, format!("attach: the container's monitor is gone: {e}")))
    }
}

/// Ask the monitor serving `<dir>/attach` to reopen the container's CRI log (CRI's
/// ReopenContainerLog): it opens the log path anew, so a file renamed by a rotation gets no
/// more lines. Blocking; returns once the monitor has reopened it.
pub(crate) fn reopen_log(id: &str, dir: &Path, timeout: Duration) -> Result<()> {
    use std::io::{Read, Write};
    let d = std::fs::File::open(dir).map_err(|e| Error::container(id, format!("reopen log: {e}")))?;
    let short = format!("/proc/self/fd/{}/{}", d.as_raw_fd(), wire_name());
    let io = |e: std::io::Error| Error::container(id, format!("reopen log: talking to the container's monitor: {e}"));
    let mut sock = std::os::unix::net::UnixStream::connect(&short).map_err(io)?;
    drop(d);
    sock.set_read_timeout(Some(timeout)).map_err(io)?;
    sock.set_write_timeout(Some(timeout)).map_err(io)?;
    sock.write_all(&wire::frame(wire::REOPEN_LOG, &[])).map_err(io)?;
    let mut dec = Decoder::default();
    let mut buf = [0u8; 4096];
    loop {
        if let Some((kind, payload)) = dec.next_frame().map_err(|e| Error::container(id, e.to_string()))? {
            return match kind {
                wire::REOPENED if payload.is_empty() => Ok(()),
                wire::REOPENED => Err(Error::container(
                    id,
                    format!("reopen log: {}", String::from_utf8_lossy(&payload)),
                )),
                _ => continue,
            };
        }
        let n = sock.read(&mut buf).map_err(io)?;
        if n == 0 {
            return Err(Error::container(
                id,
                "reopen log: the container's monitor closed the connection",
            ));
        }
        dec.push(&buf[..n]);
    }
}

fn wire_name() -> &'static str {
    server::SOCKET_NAME
}

/// Connect to `dir/name` through `/proc/self/fd`, so a deep state directory still fits in a
/// socket address. A unix connect completes (or fails) at once.
async fn connect_in(dir: &Path, name: &str) -> std::io::Result<UnixStream> {
    let d = std::fs::File::open(dir)?;
    let short = format!("/proc/self/fd/{}/{name}", d.as_raw_fd());
    let s = UnixStream::connect(&short).await;
    drop(d);
    s
}

/// The next whole frame; None at end of stream.
/// Cancel-safe: bytes read are kept in `dec` until they form a frame.
async fn read_frame(
    rd: &mut OwnedReadHalf,
    dec: &mut Decoder,
    buf: &mut [u8],
) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    loop {
        if let Some(f) = dec.next_frame().map_err(|e| std::io::Error::other(e.to_string()))? {
            return Ok(Some(f));
        }
        let n = rd.read(buf).await?;
        if n == 0 {
            return Ok(None);
        }
        dec.push(&buf[..n]);
    }
}
