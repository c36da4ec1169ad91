//! Serving HTTP connections without letting a client starve the agent: at most
//! [`MAX_CONNECTIONS`] at once per listener (more are closed at accept, so descriptors stay for
//! manifests, containers and the runtime), a request's head must arrive within
//! [`HEADER_TIMEOUT`] (slow clients) and a keep-alive connection that sends no new request
//! within it is closed (idle clients); an accept error (EMFILE, say) is logged and the listener
//! keeps going.

use std::sync::Arc;
use std::time::Duration;

use axum::serve::Listener;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tracing::debug;

/// Connections served at once by one listener.
pub const MAX_CONNECTIONS: usize = 1024;

/// How long a client may take to send a request's head, and may idle between requests.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Serve `app` on `listener` until the listener fails for good (never, in practice: axum's
/// listeners retry accept errors).
pub async fn serve<L>(mut listener: L, app: Router)
where
    L: Listener,
    L::Io: Unpin + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (io, _addr) = listener.accept().await;
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!("connection refused: {MAX_CONNECTIONS} already open");
            drop(io);
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            let _slot = slot;
            serve_connection(io, app).await;
        });
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
