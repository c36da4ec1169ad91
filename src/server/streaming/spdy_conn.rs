//! The server side of a SPDY/3.1 connection, as Go's spdystream behaves toward kubelet: the
//! client opens every stream (SYN_STREAM), each is answered at once with an empty SYN_REPLY
//! (apimachinery's spdy connection replies as soon as its handler accepts a stream), data
//! frames carry bytes until one with FIN half-closes the stream, pings are echoed, GOAWAY or
//! the end of the connection ends all streams. Flow control: spdystream neither sends nor
//! honours WINDOW_UPDATE, so windows are not enforced in either direction (incoming updates are
//! ignored); back-pressure comes from TCP and the bounded per-stream queues here. A connection
//! with no frame in either direction for the idle timeout (kubelet's
//! streamingConnectionIdleTimeout) is closed with GOAWAY.
//!
//! One task reads frames (owning the inflate context), one writes them (owning the deflate
//! context): header compression state is per direction for the whole connection.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tracing::debug;

use super::spdy::{self, Frame, HeaderDecoder, HeaderEncoder, Headers};

/// Largest data frame sent (spdystream reads any size; small frames keep latency low).
const MAX_DATA_FRAME: usize = 32 * 1024;
/// Data frames queued per incoming stream before the reader waits for its consumer.
const STREAM_QUEUE: usize = 64;

enum Out {
    Frame(Frame),
    /// Flush, shut the write side down and stop.
    Close,
}

/// A stream the client opened.
pub struct Stream {
    pub id: u32,
    pub headers: Headers,
    pub rx: StreamReader,
    pub tx: StreamWriter,
}

/// The incoming half of a stream: data until FIN (`None`), a reset or the connection's end.
pub struct StreamReader {
    rx: mpsc::Receiver<Bytes>,
}

impl StreamReader {
    pub async fn recv(&mut self) -> Option<Bytes> {
        self.rx.recv().await
    }

    pub fn into_inner(self) -> mpsc::Receiver<Bytes> {
        self.rx
    }
}

/// The outgoing half of a stream (clonable: every clone queues on the same connection).
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    out: mpsc::Sender<Out>,
    state: Arc<StreamState>,
}

#[derive(Default)]
struct StreamState {
    /// FIN sent or the peer reset the stream: nothing more may be written.
    done: AtomicBool,
}

impl StreamWriter {
    /// Queue `data` on the stream (split into frames of at most 32 KiB).
    pub async fn write(&self, data: &[u8]) -> io::Result<()> {
        for chunk in data.chunks(MAX_DATA_FRAME) {
            self.send(false, Bytes::copy_from_slice(chunk)).await?;
        }
        Ok(())
    }

    async fn send(&self, fin: bool, data: Bytes) -> io::Result<()> {
        if self.state.done.load(Ordering::Acquire) {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "stream closed"));
        }
        if fin {
            self.state.done.store(true, Ordering::Release);
        }
        self.out
            .send(Out::Frame(Frame::Data {
                stream_id: self.id,
                fin,
                data,
            }))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "connection closed"))
    }

    /// Half-close: an empty data frame with FIN (idempotent).
    pub async fn close(&self) {
        if !self.state.done.load(Ordering::Acquire) {
            let _ = self.send(true, Bytes::new()).await;
        }
    }

    /// Abort the stream (RST_STREAM CANCEL).
    pub async fn reset(&self) {
        if !self.state.done.swap(true, Ordering::AcqRel) {
            let _ = self
                .out
                .send(Out::Frame(Frame::RstStream {
                    stream_id: self.id,
                    status: spdy::rst::CANCEL,
                }))
                .await;
        }
    }
}

/// The connection: closing it sends GOAWAY after everything already queued.
#[derive(Clone)]
pub struct Connection {
    out: mpsc::Sender<Out>,
    last_good: Arc<AtomicU64>,
    closed: Arc<tokio::sync::Notify>,
    is_closed: Arc<AtomicBool>,
}

impl Connection {
    /// Serve SPDY on `io`; streams the client opens arrive on the returned receiver, which ends
    /// when the connection does.
    pub fn start<T>(io: T, idle_timeout: Duration) -> (Connection, mpsc::Receiver<Stream>)
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (r, w) = tokio::io::split(io);
        let (out_tx, out_rx) = mpsc::channel::<Out>(256);
        let (stream_tx, stream_rx) = mpsc::channel::<Stream>(16);
        let activity = Arc::new(Mutex::new(Instant::now()));
        let conn = Connection {
            out: out_tx.clone(),
            last_good: Arc::new(AtomicU64::new(0)),
            closed: Arc::new(tokio::sync::Notify::new()),
            is_closed: Arc::new(AtomicBool::new(false)),
        };
        tokio::spawn(write_loop(w, out_rx, activity.clone(), conn.clone()));
        tokio::spawn(read_loop(r, out_tx, stream_tx, activity, idle_timeout, conn.clone()));
        (conn, stream_rx)
    }

    /// Send GOAWAY after the frames already queued and close the connection.
    pub async fn close(&self) {
        let last = self.last_good.load(Ordering::Acquire) as u32;
        let _ = self
            .out
            .send(Out::Frame(Frame::GoAway {
                last_good_stream_id: last,
                status: 0,
            }))
            .await;
        let _ = self.out.send(Out::Close).await;
    }

    /// Resolves when the connection has ended (closed by either side or failed).
    pub async fn closed(&self) {
        let wait = self.closed.notified();
        if self.is_closed.load(Ordering::Acquire) {
            return;
        }
        wait.await
    }

    fn mark_closed(&self) {
        self.is_closed.store(true, Ordering::Release);
        self.closed.notify_waiters();
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::Receiver<Out>,
    activity: Arc<Mutex<Instant>>,
    conn: Connection,
) {
    let mut enc = HeaderEncoder::new();
    while let Some(o) = rx.recv().await {
        match o {
            Out::Frame(f) => {
                let bytes = match spdy::encode(&f, &mut enc) {
                    Ok(b) => b,
                    Err(e) => {
                        debug!(error = %e, "SPDY: encoding a frame");
                        break;
                    }
                };
                if let Err(e) = w.write_all(&bytes).await {
                    debug!(error = %e, "SPDY: writing a frame");
                    break;
                }
                // Flush when nothing else is queued, so frames leave in batches.
                if rx.is_empty() && w.flush().await.is_err() {
                    break;
                }
                *activity.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            }
            Out::Close => break,
        }
    }
    let _ = w.flush().await;
    let _ = w.shutdown().await;
    conn.mark_closed();
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut r: R,
    out: mpsc::Sender<Out>,
    accept: mpsc::Sender<Stream>,
    activity: Arc<Mutex<Instant>>,
    idle_timeout: Duration,
    conn: Connection,
) {
    let mut dec = HeaderDecoder::new();
    let mut streams: HashMap<u32, (mpsc::Sender<Bytes>, Arc<StreamState>)> = HashMap::new();
    let mut accept = Some(accept);
    loop {
        let idle_left = {
            let last = *activity.lock().unwrap_or_else(|e| e.into_inner());
            idle_timeout.saturating_sub(last.elapsed())
        };
        let frame = tokio::select! {
            f = spdy::read_frame(&mut r, &mut dec) => f,
            _ = tokio::time::sleep(idle_left), if !idle_timeout.is_zero() => {
                let last = *activity.lock().unwrap_or_else(|e| e.into_inner());
                if last.elapsed() >= idle_timeout {
                    debug!("SPDY: connection idle for {idle_timeout:?}, closing");
                    conn.close().await;
                    break;
                }
                continue;
            }
            _ = conn.closed() => break,
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                debug!(error = %e, "SPDY: reading a frame");
                let _ = out
                    .send(Out::Frame(Frame::GoAway {
                        last_good_stream_id: conn.last_good.load(Ordering::Acquire) as u32,
                        status: 1,
                    }))
                    .await;
                let _ = out.send(Out::Close).await;
                break;
            }
        };
        *activity.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        match frame {
            Frame::SynStream {
                stream_id,
                flags,
                headers,
                ..
            } => {
                let Some(acc) = &accept else {
                    let _ = out
                        .send(Out::Frame(Frame::RstStream {
                            stream_id,
                            status: spdy::rst::REFUSED_STREAM,
                        }))
                        .await;
                    continue;
                };
                if stream_id == 0 || streams.contains_key(&stream_id) {
                    let _ = out
                        .send(Out::Frame(Frame::RstStream {
                            stream_id,
                            status: spdy::rst::PROTOCOL_ERROR,
                        }))
                        .await;
                    continue;
                }
                conn.last_good.fetch_max(u64::from(stream_id), Ordering::AcqRel);
                let (tx, rx) = mpsc::channel(STREAM_QUEUE);
                let state = Arc::new(StreamState::default());
                if flags & spdy::FLAG_UNIDIRECTIONAL != 0 {
                    state.done.store(true, Ordering::Release);
                }
                // Reply before anything else is written on the stream.
                let _ = out
                    .send(Out::Frame(Frame::SynReply {
                        stream_id,
                        fin: false,
                        headers: Headers::default(),
                    }))
                    .await;
                if flags & spdy::FLAG_FIN == 0 {
                    streams.insert(stream_id, (tx, state.clone()));
                }
                let stream = Stream {
                    id: stream_id,
                    headers,
                    rx: StreamReader { rx },
                    tx: StreamWriter {
                        id: stream_id,
                        out: out.clone(),
                        state,
                    },
                };
                if acc.send(stream).await.is_err() {
                    accept = None;
                }
            }
            Frame::Data { stream_id, fin, data } => {
                if let Some((tx, _)) = streams.get(&stream_id) {
                    if !data.is_empty() && tx.send(data).await.is_err() {
                        // Nobody reads this stream any more: drop what comes.
                    }
                    if fin {
                        streams.remove(&stream_id);
                    }
                }
            }
            Frame::RstStream { stream_id, status } => {
                debug!(stream_id, status, "SPDY: stream reset by the peer");
                if let Some((_, st)) = streams.remove(&stream_id) {
                    st.done.store(true, Ordering::Release);
                }
            }
            Frame::Ping { id } => {
                let _ = out.send(Out::Frame(Frame::Ping { id })).await;
            }
            Frame::GoAway { .. } => {
                // No new streams; the open ones finish.
                accept = None;
            }
            Frame::Headers { .. }
            | Frame::SynReply { .. }
            | Frame::Settings { .. }
            | Frame::WindowUpdate { .. }
            | Frame::Unknown { .. } => {}
        }
    }
    // Readers see the end of every stream; writers fail from now on.
    for (_, (_, st)) in streams.drain() {
        st.done.store(true, Ordering::Release);
    }
    drop(accept);
    let _ = out.send(Out::Close).await;
    conn.mark_closed();
}
