//! HTTP requests to a running agent over its unix socket.

use std::path::Path;

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// GET `path` from the agent's socket: the response, its body not read yet.
pub async fn request(socket: &Path, path: &str) -> Result<hyper::Response<hyper::body::Incoming>> {
    let stream = tokio::net::UnixStream::connect(socket).await.with_context(|| {
        format!(
            "connecting to the agent at {} (is `ferrolet run` running with this --root-dir?)",
            socket.display()
        )
    })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = hyper::Request::get(path)
        .header("host", "ferrolet")
        .body(Empty::<bytes::Bytes>::new())?;
    sender
        .send_request(req)
        .await
        .with_context(|| format!("request {path}"))
}

/// GET `path` and return the response body as a stream of chunks through `on_chunk`.
pub async fn get(socket: &Path, path: &str, mut on_chunk: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
    let mut resp = request(socket, path).await?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp.into_body().collect().await?.to_bytes();
        bail!("{}", String::from_utf8_lossy(&body).trim());
    }
    while let Some(frame) = resp.body_mut().frame().await {
        let frame = frame?;
        if let Some(d) = frame.data_ref() {
            on_chunk(d)?;
        }
    }
    Ok(())
}

pub async fn get_json(socket: &Path, path: &str) -> Result<serde_json::Value> {
    let mut buf = Vec::new();
    get(socket, path, |c| {
        buf.extend_from_slice(c);
        Ok(())
    })
    .await?;
    serde_json::from_slice(&buf).context("decoding the agent's answer")
}
