//! Serving HTTP connections without letting a client starve the agent or lock others out.
//! Each listener has its own [`Budget`] of connections (the healthz port's is not the kubelet
//! port's), and within it:
//! - at most [`Limits::per_peer`] connections from one IP address, so one host cannot take
//!   the whole budget;
//! - a connection that has sent nothing is *silent*; one silent for [`Limits::first_byte`] is
//!   closed, and when the budget (or its peer's share) is full a new connection takes the slot
//!   of the oldest silent one instead of being turned away: idle connections cannot squat;
//! - a request's head must arrive within [`HEADER_TIMEOUT`] (slow clients) and a keep-alive
//!   connection that sends no new request within it is closed (idle clients);
//! - an accept error (EMFILE, say) is logged and the listener keeps going.
//!
//! The TLS listener ([`super::tls`]) counts a connection in its budget only once the handshake
//! is done; handshakes have a smaller budget of their own ([`HANDSHAKES`]) with a short
//! timeout.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

/// How many connections a listener serves, and how.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once.
    pub max: usize,
    /// Connections from one IP address at once (unix sockets have no peer address and are
    /// not counted per peer).
    pub per_peer: usize,
    /// A connection that has sent no byte for this long is closed.
    pub first_byte: Duration,
}

/// The kubelet port and the read-only port (after the TLS handshake, for the kubelet port).
pub const API: Limits = Limits {
    max: 1024,
    per_peer: 256,
    first_byte: Duration::from_secs(5),
};

/// TLS handshakes in progress on the kubelet port: a ClientHello must come within
/// `first_byte`, the whole handshake within [`HANDSHAKE_TIMEOUT`].
pub const HANDSHAKES: Limits = Limits {
    max: 256,
    per_peer: 64,
    first_byte: Duration::from_secs(5),
};

/// How long a client may take to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The healthz port: probes send their request at once and leave.
pub const HEALTHZ: Limits = Limits {
    max: 256,
    per_peer: 64,
    first_byte: Duration::from_secs(5),
};

/// The unix sockets (owner-only): no peers to tell apart.
pub const LOCAL: Limits = Limits {
    max: 1024,
    per_peer: usize::MAX,
    first_byte: Duration::from_secs(30),
};

/// How long a client may take to send a request's head, and may idle between requests.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// One listener's connections: who holds a slot, from where, and whether they have spoken.
pub struct Budget {
    name: &'static str,
    limits: Limits,
    inner: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    /// In the order they were admitted.
    held: Vec<Held>,
    per_peer: HashMap<IpAddr, usize>,
    next_id: u64,
    /// Connections are being turned away (logged when it starts and when it stops).
    refusing: bool,
}

struct Held {
    id: u64,
    peer: Option<IpAddr>,
    silent: Arc<AtomicBool>,
    evict: Arc<Notify>,
}

/// A connection's slot in a [`Budget`], released when dropped.
pub struct Admission {
    budget: Arc<Budget>,
    id: u64,
    /// Cleared by [`FirstByte`] at the connection's first byte.
    silent: Arc<AtomicBool>,
    /// Notified when a newer connection took this one's slot while it was still silent.
    evict: Arc<Notify>,
}

impl Admission {
    /// Resolves when the connection lost its slot to a newer one (it had sent nothing).
    pub fn evicted(&self) -> impl Future<Output = ()> + Send + 'static {
        let n = self.evict.clone();
        async move { n.notified().await }
    }

    /// `io` with this connection's first-byte deadline, marking it spoken at its first byte.
    pub fn watch<I>(&self, io: I) -> FirstByte<I> {
        FirstByte::new(io, self.budget.limits.first_byte, self.silent.clone())
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut s = self.budget.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = s.held.iter().position(|h| h.id == self.id) {
            let h = s.held.remove(i);
            s.release_peer(h.peer);
        }
    }
}

impl Slots {
    fn release_peer(&mut self, peer: Option<IpAddr>) {
        if let Some(p) = peer {
            if let Some(n) = self.per_peer.get_mut(&p) {
                *n -= 1;
                if *n == 0 {
                    self.per_peer.remove(&p);
                }
            }
        }
    }

    /// Take the slot of the oldest connection that has sent nothing (from `peer` when given).
    fn evict_silent(&mut self, peer: Option<IpAddr>) -> bool {
        let found = self
            .held
            .iter()
            .position(|h| h.silent.load(Ordering::Acquire) && (peer.is_none() || h.peer == peer));
        let Some(i) = found else { return false };
        let h = self.held.remove(i);
        self.release_peer(h.peer);
        h.evict.notify_one();
        true
    }
}

impl Budget {
    pub fn new(name: &'static str, limits: Limits) -> Arc<Budget> {
        Arc::new(Budget {
            name,
            limits,
            inner: Mutex::new(Slots::default()),
        })
    }

    /// A slot for a new connection from `peer`: a free one, or the oldest silent one's (of
    /// the same peer when the peer has its share); `None` when every slot is held by a
    /// connection that has spoken.
    pub fn admit(self: &Arc<Self>, peer: Option<IpAddr>) -> Option<Admission> {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let peer_full = peer.is_some_and(|p| s.per_peer.get(&p).copied().unwrap_or(0) >= self.limits.per_peer);
        let room = if peer_full {
            s.evict_silent(peer)
        } else {
            s.held.len() < self.limits.max || s.evict_silent(None)
        };
        if !room {
            if !s.refusing {
                s.refusing = true;
                warn!(
                    listener = self.name,
                    max = self.limits.max,
                    per_peer = self.limits.per_peer,
                    ?peer,
                    peer_full,
                    "connections refused: every slot is taken by a connection that is being served"
                );
            }
            return None;
        }
        if s.refusing {
            s.refusing = false;
            info!(listener = self.name, "connections accepted again");
        }
        let (id, silent, evict) = (s.next_id, Arc::new(AtomicBool::new(true)), Arc::new(Notify::new()));
        s.next_id += 1;
        if let Some(p) = peer {
            *s.per_peer.entry(p).or_default() += 1;
        }
        s.held.push(Held {
            id,
            peer,
            silent: silent.clone(),
            evict: evict.clone(),
        });
        Some(Admission {
            budget: self.clone(),
            id,
            silent,
            evict,
        })
    }
}

/// A connection that must send its first byte before a deadline: reads fail with `TimedOut`
/// once it passes with nothing read; after the first byte it is a plain pass-through.
pub struct FirstByte<I> {
    io: I,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    silent: Arc<AtomicBool>,
}

impl<I> FirstByte<I> {
    fn new(io: I, within: Duration, silent: Arc<AtomicBool>) -> FirstByte<I> {
        FirstByte {
            io,
            deadline: Some(Box::pin(tokio::time::sleep(within))),
            silent,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for FirstByte<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let me = &mut *self;
        match Pin::new(&mut me.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before && me.deadline.take().is_some() {
                    me.silent.store(false, Ordering::Release);
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let passed = match me.deadline.as_mut() {
                    Some(d) => d.as_mut().poll(cx).is_ready(),
                    None => false,
                };
                if passed {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client sent nothing in time",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for FirstByte<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The IP address of a listener's peer, if it has one.
pub trait PeerIp {
    fn peer_ip(&self) -> Option<IpAddr>;
}

impl PeerIp for std::net::SocketAddr {
    fn peer_ip(&self) -> Option<IpAddr> {
        Some(self.ip().to_canonical())
    }
}

impl PeerIp for tokio::net::unix::SocketAddr {
    fn peer_ip(&self) -> Option<IpAddr> {
        None
    }
}

/// Serve `app` on `listener` within `limits` until the listener fails for good (never, in
/// practice: axum's listeners retry accept errors).
pub async fn serve<L>(mut listener: L, app: Router, name: &'static str, limits: Limits)
where
    L: Listener,
    L::Io: Unpin + Send + 'static,
    L::Addr: PeerIp,
{
    let budget = Budget::new(name, limits);
    loop {
        let (io, addr) = listener.accept().await;
        let Some(slot) = budget.admit(addr.peer_ip()) else {
            drop(io);
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            let evicted = slot.evicted();
            tokio::select! {
                _ = serve_connection(slot.watch(io), app) => {}
                _ = evicted => debug!(listener = name, "a silent connection gave its slot to a newer one"),
            }
        });
        // Let the connection read what its client sent before more are admitted: one that
        // has spoken is no longer the next to give way.
        tokio::task::yield_now().await;
    }
}

/// Serve one connection (HTTP/1.1, upgrades allowed: exec, attach and port-forward take the
/// connection over) until it closes.
pub async fn serve_connection<I, S, B>(io: I, service: S)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<hyper::Request<hyper::body::Incoming>, Response = hyper::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(service))
        .with_upgrades();
    if let Err(e) = conn.await {
        debug!(error = %e, "HTTP connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    const SMALL: Limits = Limits {
        max: 4,
        per_peer: 2,
        first_byte: Duration::from_secs(5),
    };

    #[tokio::test]
    async fn a_peer_gets_its_share_and_silent_connections_give_way() {
        let b = Budget::new("test", SMALL);
        let a1 = b.admit(ip("10.0.0.1")).unwrap();
        let a2 = b.admit(ip("10.0.0.1")).unwrap();
        // a1 has spoken, a2 has not: a third from the same peer takes a2's slot.
        a1.silent.store(false, Ordering::Release);
        let evicted = a2.evicted();
        let a3 = b.admit(ip("10.0.0.1")).unwrap();
        tokio::time::timeout(Duration::from_secs(1), evicted)
            .await
            .expect("the silent one is told to go");
        // Both of the peer's connections have spoken: a fourth is refused...
        a3.silent.store(false, Ordering::Release);
        assert!(b.admit(ip("10.0.0.1")).is_none());
        // ...while another peer still gets in, up to the budget.
        let b1 = b.admit(ip("10.0.0.2")).unwrap();
        let b2 = b.admit(ip("10.0.0.2")).unwrap();
        b1.silent.store(false, Ordering::Release);
        // Full: a newcomer from a third peer takes the oldest silent slot (b2's).
        let c1 = b.admit(ip("10.0.0.3")).unwrap();
        c1.silent.store(false, Ordering::Release);
        assert!(b.admit(ip("10.0.0.4")).is_none(), "every slot has spoken");
        // Dropping one frees its slot; dropping an evicted one frees nothing twice.
        drop(a2);
        drop(b2);
        assert!(b.admit(ip("10.0.0.4")).is_none());
        drop(a1);
        assert!(b.admit(ip("10.0.0.4")).is_some());
        let s = b.inner.lock().unwrap();
        assert_eq!(s.per_peer.get(&"10.0.0.1".parse().unwrap()), Some(&1));
        assert_eq!(s.per_peer.values().sum::<usize>(), s.held.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_sends_nothing_times_out() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let b = Budget::new("test", SMALL);
        let slot = b.admit(None).unwrap();
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut io = slot.watch(ours);
        let mut buf = [0u8; 4];
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);

        let slot = b.admit(None).unwrap();
        let (ours, mut theirs2) = tokio::io::duplex(64);
        let mut io = slot.watch(ours);
        theirs2.write_all(b"G").await.unwrap();
        assert_eq!(io.read(&mut buf).await.unwrap(), 1);
        assert!(!slot.silent.load(Ordering::Acquire));
        // Spoken: no deadline any more.
        let waited = tokio::time::timeout(Duration::from_secs(60), io.read(&mut buf)).await;
        assert!(waited.is_err(), "still waiting for the client, without a deadline");
        theirs.shutdown().await.unwrap();
    }
}
