//! The server side of a SPDY/3.1 connection, as Go's spdystream behaves toward kubelet: the
//! client opens every stream (SYN_STREAM), each is answered at once with an empty SYN_REPLY
//! (apimachinery's spdy connection replies as soon as its handler accepts a stream), data
//! frames carry bytes until one with FIN half-closes the stream, pings are echoed, GOAWAY or
//! the end of the connection ends all streams. A connection with no frame in either direction
//! for the idle timeout (kubelet's streamingConnectionIdleTimeout) is closed with GOAWAY.
//!
//! The client is not trusted to be polite (anyone with `pods/exec` on a pod of the node can
//! speak here), so what it can make the agent hold is bounded:
//! - Receive flow control: each stream has a window of [`STREAM_WINDOW`] bytes (SPDY/3.1's
//!   initial window). Data waits in the stream's queue until its consumer takes it; a frame
//!   that would take the queue past the window makes the reader stop reading the connection
//!   until the consumer has made room, and what the consumer takes is granted back to the
//!   client with WINDOW_UPDATE. A client that honours windows never overruns; one that does
//!   not (spdystream ignores windows) is held back by TCP, never by more memory.
//! - Streams: at most the `max_streams` given to [`Connection::start`] at once; a SYN_STREAM
//!   past it is refused with RST_STREAM REFUSED_STREAM. A stream counts until the client has
//!   finished it and its handler has dropped both halves.
//! - Frames and header blocks: [`spdy::MAX_FRAME`], [`spdy::MAX_HEADER_BLOCK`] inflated,
//!   [`spdy::MAX_HEADER_ENTRIES`]; a frame past them ends the connection.
//!
//! The send direction is not flow controlled: spdystream never sends WINDOW_UPDATE, so a server
//! that waited for one would stall after 64 KiB; back-pressure there comes from TCP.
//!
//! One task reads frames (owning the inflate context), one writes them (owning the deflate
//! context): header compression state is per direction for the whole connection.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};
use tracing::{debug, warn};

use super::spdy::{self, Frame, HeaderDecoder, HeaderEncoder, Headers};

/// Largest data frame sent (spdystream reads any size; small frames keep latency low).
const MAX_DATA_FRAME: usize = 32 * 1024;
/// Bytes of one incoming stream queued for its consumer before the connection stops reading:
/// the stream's receive window (SPDY/3.1's initial window size).
pub const STREAM_WINDOW: usize = 64 * 1024;

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
/// Taking data makes room in the stream's window and grants it back to the client.
pub struct StreamReader {
    id: u32,
    rx: mpsc::UnboundedReceiver<Bytes>,
    inbox: Arc<Inbox>,
    out: mpsc::Sender<Out>,
    /// Taken but not yet granted back with WINDOW_UPDATE.
    ungranted: usize,
}

/// What the connection's reader and a stream's consumer share: the bytes queued (bounded by
/// [`STREAM_WINDOW`] through the reader waiting for room) and whether the consumer is gone.
#[derive(Default)]
struct Inbox {
    queued: AtomicUsize,
    reader_gone: AtomicBool,
    /// Woken when the consumer takes data or goes away.
    room: Notify,
}

impl Inbox {
    /// `n` more bytes fit: within the window, or the queue is empty (one frame always fits,
    /// frames being at most [`spdy::MAX_FRAME`]).
    fn fits(&self, n: usize) -> bool {
        let q = self.queued.load(Ordering::Acquire);
        q == 0 || q + n <= STREAM_WINDOW
    }

    fn gone(&self) -> bool {
        self.reader_gone.load(Ordering::Acquire)
    }
}

impl StreamReader {
    pub async fn recv(&mut self) -> Option<Bytes> {
        let b = self.rx.recv().await?;
        self.inbox.queued.fetch_sub(b.len(), Ordering::AcqRel);
        self.inbox.room.notify_one();
        self.ungranted += b.len();
        if self.ungranted >= STREAM_WINDOW / 2 {
            let delta = std::mem::take(&mut self.ungranted) as u32;
            let _ = self
                .out
                .send(Out::Frame(Frame::WindowUpdate {
                    stream_id: self.id,
                    delta,
                }))
                .await;
        }
        Some(b)
    }

    /// The stream's data on a plain channel (for consumers written against one). A task
    /// carries the data over one frame at a time, so the window still bounds what waits.
    pub fn into_inner(self) -> mpsc::Receiver<Bytes> {
        let (tx, rx) = mpsc::channel(1);
        let mut me = self;
        tokio::spawn(async move {
            while let Some(b) = me.recv().await {
                if tx.send(b).await.is_err() {
                    break;
                }
            }
        });
        rx
    }
}

impl Drop for StreamReader {
    fn drop(&mut self) {
        self.inbox.reader_gone.store(true, Ordering::Release);
        self.inbox.room.notify_one();
    }
}

/// The outgoing half of a stream (clonable: every clone queues on the same connection).
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    out: mpsc::Sender<Out>,
    state: Arc<StreamState>,
}

struct StreamState {
    /// FIN sent or the peer reset the stream: nothing more may be written.
    done: AtomicBool,
    /// The stream counts against the connection's limit while this lives.
    _open: OpenSlot,
}

/// One of the connection's open streams; released when the stream's last handle goes.
struct OpenSlot(Arc<AtomicUsize>);

impl OpenSlot {
    fn take(open: &Arc<AtomicUsize>) -> OpenSlot {
        open.fetch_add(1, Ordering::AcqRel);
        OpenSlot(open.clone())
    }
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What the reader keeps of a stream the client may still send on.
struct Incoming {
    tx: mpsc::UnboundedSender<Bytes>,
    inbox: Arc<Inbox>,
    state: Arc<StreamState>,
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
    /// when the connection does. At most `max_streams` are open at once; more are refused.
    pub fn start<T>(io: T, idle_timeout: Duration, max_streams: usize) -> (Connection, mpsc::Receiver<Stream>)
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
        let limits = Limits {
            idle_timeout,
            max_streams,
        };
        tokio::spawn(read_loop(r, out_tx, stream_tx, activity, limits, conn.clone()));
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

struct Limits {
    idle_timeout: Duration,
    max_streams: usize,
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut r: R,
    out: mpsc::Sender<Out>,
    accept: mpsc::Sender<Stream>,
    activity: Arc<Mutex<Instant>>,
    limits: Limits,
    conn: Connection,
) {
    let idle_timeout = limits.idle_timeout;
    let mut dec = HeaderDecoder::new();
    let mut streams: HashMap<u32, Incoming> = HashMap::new();
    let open = Arc::new(AtomicUsize::new(0));
    let mut refusing = false;
    let mut accept = Some(accept);
    'frames: loop {
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
                if open.load(Ordering::Acquire) >= limits.max_streams {
                    // Streams whose handler dropped them, held only here, no longer count.
                    streams.retain(|_, s| !(s.inbox.gone() && Arc::strong_count(&s.state) == 1));
                }
                if open.load(Ordering::Acquire) >= limits.max_streams {
                    if !refusing {
                        warn!(
                            max_streams = limits.max_streams,
                            "SPDY: the client opens more streams than allowed at once; refusing the extra ones"
                        );
                        refusing = true;
                    }
                    let _ = out
                        .send(Out::Frame(Frame::RstStream {
                            stream_id,
                            status: spdy::rst::REFUSED_STREAM,
                        }))
                        .await;
                    continue;
                }
                conn.last_good.fetch_max(u64::from(stream_id), Ordering::AcqRel);
                let (tx, rx) = mpsc::unbounded_channel();
                let inbox = Arc::new(Inbox::default());
                let state = Arc::new(StreamState {
                    done: AtomicBool::new(flags & spdy::FLAG_UNIDIRECTIONAL != 0),
                    _open: OpenSlot::take(&open),
                });
                // Reply before anything else is written on the stream.
                let _ = out
                    .send(Out::Frame(Frame::SynReply {
                        stream_id,
                        fin: false,
                        headers: Headers::default(),
                    }))
                    .await;
                if flags & spdy::FLAG_FIN == 0 {
                    streams.insert(
                        stream_id,
                        Incoming {
                            tx,
                            inbox: inbox.clone(),
                            state: state.clone(),
                        },
                    );
                }
                let stream = Stream {
                    id: stream_id,
                    headers,
                    rx: StreamReader {
                        id: stream_id,
                        rx,
                        inbox,
                        out: out.clone(),
                        ungranted: 0,
                    },
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
                if let Some(s) = streams.get(&stream_id) {
                    if !data.is_empty() {
                        // Wait for the consumer to make room in the window: the connection is
                        // not read meanwhile, so the client is held back by TCP.
                        while !s.inbox.gone() && !s.inbox.fits(data.len()) {
                            tokio::select! {
                                _ = s.inbox.room.notified() => {}
                                _ = conn.closed() => break 'frames,
                            }
                        }
                        // A consumer that has gone drops what comes.
                        if !s.inbox.gone() {
                            s.inbox.queued.fetch_add(data.len(), Ordering::AcqRel);
                            let _ = s.tx.send(data);
                        }
                    }
                    if fin {
                        streams.remove(&stream_id);
                    }
                }
            }
            Frame::RstStream { stream_id, status } => {
                debug!(stream_id, status, "SPDY: stream reset by the peer");
                if let Some(s) = streams.remove(&stream_id) {
                    s.state.done.store(true, Ordering::Release);
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
    for (_, s) in streams.drain() {
        s.state.done.store(true, Ordering::Release);
    }
    drop(accept);
    let _ = out.send(Out::Close).await;
    conn.mark_closed();
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};

    type Client = (ReadHalf<tokio::io::DuplexStream>, WriteHalf<tokio::io::DuplexStream>);

    fn syn(id: u32, kind: &str, enc: &mut HeaderEncoder) -> Vec<u8> {
        spdy::encode(
            &Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: Headers(vec![("streamType".into(), kind.into())]),
            },
            enc,
        )
        .unwrap()
    }

    fn data(id: u32, bytes: &[u8]) -> Vec<u8> {
        let f = Frame::Data {
            stream_id: id,
            fin: false,
            data: Bytes::copy_from_slice(bytes),
        };
        spdy::encode(&f, &mut HeaderEncoder::new()).unwrap()
    }

    /// A server on one end of an in-memory pipe whose buffers hold `buffer` bytes each way.
    fn serve(buffer: usize, max_streams: usize) -> (Connection, mpsc::Receiver<Stream>, Client) {
        let (server_io, client_io) = tokio::io::duplex(buffer);
        let (conn, streams) = Connection::start(server_io, Duration::from_secs(60), max_streams);
        (conn, streams, tokio::io::split(client_io))
    }

    /// Read frames until `done` says so, within `limit`.
    async fn read_until(
        rd: &mut ReadHalf<tokio::io::DuplexStream>,
        dec: &mut HeaderDecoder,
        mut done: impl FnMut(&Frame) -> bool,
    ) {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let f = spdy::read_frame(rd, dec).await.unwrap().expect("a frame");
                if done(&f) {
                    return;
                }
            }
        })
        .await
        .expect("the frames in time");
    }

    /// A client floods a stream whose consumer does not read (stdin of a process that never
    /// reads it): the server stops reading once the stream's window is queued, so the
    /// client's writes stall instead of the agent buffering them; when the consumer reads,
    /// everything arrives in order and the window is granted back with WINDOW_UPDATE.
    #[tokio::test]
    async fn a_flooded_stream_holds_the_client_back_at_its_window() {
        let (_conn, mut streams, (mut rd, mut wr)) = serve(16 * 1024, 5);
        let mut enc = HeaderEncoder::new();
        wr.write_all(&syn(1, "stdin", &mut enc)).await.unwrap();
        let mut stream = streams.recv().await.unwrap();
        let mut dec = HeaderDecoder::new();
        read_until(&mut rd, &mut dec, |f| matches!(f, Frame::SynReply { stream_id: 1, .. })).await;

        let chunk: Vec<u8> = (0..32 * 1024).map(|i| (i % 251) as u8).collect();
        let total = 8 << 20;
        let (wrote_tx, mut wrote_rx) = mpsc::unbounded_channel();
        let flood = {
            let frame = data(1, &chunk);
            tokio::spawn(async move {
                let mut sent = 0;
                while sent < total {
                    wr.write_all(&frame).await.unwrap();
                    sent += chunk.len();
                    let _ = wrote_tx.send(sent);
                }
                wr
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut sent = 0;
        while let Ok(n) = wrote_rx.try_recv() {
            sent = n;
        }
        // What the client got out: the window queued, one frame the reader holds, and the
        // pipe's buffer; nowhere near the 8 MiB it wanted to send.
        assert!(
            sent <= STREAM_WINDOW + spdy::MAX_FRAME + 64 * 1024,
            "the client wrote {sent} bytes to a stream nobody reads"
        );
        assert!(!flood.is_finished());

        // The consumer reads: all of it arrives, in order, and windows are granted back.
        let reader = tokio::spawn(async move {
            let mut got = 0usize;
            while got < total {
                let b = stream.rx.recv().await.unwrap();
                for (i, x) in b.iter().enumerate() {
                    assert_eq!(*x, ((got + i) % (32 * 1024) % 251) as u8);
                }
                got += b.len();
            }
            got
        });
        let mut granted = 0usize;
        read_until(&mut rd, &mut dec, |f| {
            if let Frame::WindowUpdate { stream_id: 1, delta } = f {
                granted += *delta as usize;
            }
            granted + STREAM_WINDOW >= total
        })
        .await;
        assert_eq!(reader.await.unwrap(), total);
        flood.await.unwrap();
    }

    /// 20,000 SYN_STREAMs on a connection whose handler keeps the streams it got: five are
    /// served, the rest refused with REFUSED_STREAM; once the handler drops its streams and
    /// the client has finished them, new ones are accepted again. (100,000 took over the 10 s
    /// limit of a debug build beside CI's other stages.)
    #[tokio::test]
    async fn streams_past_the_limit_are_refused() {
        let (_conn, mut streams, (mut rd, mut wr)) = serve(1 << 20, 5);
        let writer = tokio::spawn(async move {
            let mut enc = HeaderEncoder::new();
            let mut batch = Vec::new();
            for i in 0..20_000u32 {
                batch.extend(syn(2 * i + 1, "stdout", &mut enc));
                if batch.len() > 64 * 1024 {
                    wr.write_all(&batch).await.unwrap();
                    batch.clear();
                }
            }
            wr.write_all(&batch).await.unwrap();
            (wr, enc)
        });
        let mut held = Vec::new();
        let (mut replies, mut refused) = (0, 0);
        let mut dec = HeaderDecoder::new();
        read_until(&mut rd, &mut dec, |f| {
            match f {
                Frame::SynReply { .. } => replies += 1,
                Frame::RstStream {
                    status: spdy::rst::REFUSED_STREAM,
                    ..
                } => refused += 1,
                other => panic!("unexpected {other:?}"),
            }
            replies + refused == 20_000
        })
        .await;
        let (mut wr, mut enc) = writer.await.unwrap();
        while let Ok(s) = streams.try_recv() {
            held.push(s);
        }
        assert_eq!((replies, refused, held.len()), (5, 19_995, 5));

        // The handler lets go and the client finishes its streams: room for new ones.
        let ids: Vec<u32> = held.iter().map(|s| s.id).collect();
        drop(held);
        for id in ids {
            let fin = Frame::Data {
                stream_id: id,
                fin: true,
                data: Bytes::new(),
            };
            wr.write_all(&spdy::encode(&fin, &mut enc).unwrap()).await.unwrap();
        }
        wr.write_all(&syn(300_001, "stdout", &mut enc)).await.unwrap();
        read_until(&mut rd, &mut dec, |f| {
            assert!(!matches!(f, Frame::RstStream { .. }), "{f:?}");
            matches!(f, Frame::SynReply { stream_id: 300_001, .. })
        })
        .await;
        assert_eq!(streams.recv().await.unwrap().id, 300_001);
    }

    /// Streams the handler drops at once (kinds it does not want) do not use up the limit,
    /// even when the client never finishes them.
    #[tokio::test]
    async fn streams_the_handler_drops_do_not_count() {
        let (_conn, mut streams, (mut rd, mut wr)) = serve(1 << 20, 2);
        let handler = tokio::spawn(async move {
            let mut n = 0;
            while let Some(s) = streams.recv().await {
                drop(s);
                n += 1;
                if n == 50 {
                    return n;
                }
            }
            n
        });
        let mut dec = HeaderDecoder::new();
        let mut enc = HeaderEncoder::new();
        for i in 0..50u32 {
            wr.write_all(&syn(2 * i + 1, "bogus", &mut enc)).await.unwrap();
            read_until(&mut rd, &mut dec, |f| {
                assert!(!matches!(f, Frame::RstStream { .. }), "stream {}: {f:?}", 2 * i + 1);
                matches!(f, Frame::SynReply { .. })
            })
            .await;
            // Let the handler drop it before the next one arrives.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(handler.await.unwrap(), 50);
    }
}
