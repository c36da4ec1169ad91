//! A SPDY/3.1 session on arbitrary client bytes: the agent's connection
//! (`spdy_conn::Connection`) reads them as a client's frames while a handler keeps every
//! stream it is given and reads their data. The session must end (no hang: the fuzzer's
//! -timeout and the harness's own 10 s), must not panic, and must never hand the handler more
//! streams than the connection's limit, whatever the client sends: floods of SYN_STREAM,
//! data past the window, resets, header bombs.
#![no_main]

use std::time::Duration;

use ferrolet::server::streaming::spdy_conn::{Connection, Stream};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// As an exec connection.
const MAX_STREAMS: usize = 5;

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let input = data.to_vec();
    let streams = rt.block_on(async move {
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let (_conn, mut incoming) = Connection::start(server_io, Duration::ZERO, MAX_STREAMS);
        let (mut rd, mut wr) = tokio::io::split(client_io);
        // The client: everything at once, then the end of its side.
        let client = tokio::spawn(async move {
            let _ = wr.write_all(&input).await;
            let _ = wr.shutdown().await;
        });
        // What the server writes back is read and thrown away.
        let drain = tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * 1024];
            while matches!(rd.read(&mut buf).await, Ok(n) if n > 0) {}
        });
        let handler = async {
            let mut held = Vec::new();
            while let Some(Stream { mut rx, tx, .. }) = incoming.recv().await {
                tokio::spawn(async move { while rx.recv().await.is_some() {} });
                // The writer keeps the stream open on the agent's side.
                held.push(tx);
            }
            held.len()
        };
        let n = tokio::time::timeout(Duration::from_secs(10), handler)
            .await
            .expect("the session ends once the client's bytes do");
        let _ = client.await;
        drain.abort();
        n
    });
    assert!(
        streams <= MAX_STREAMS,
        "{streams} streams handed out, the limit is {MAX_STREAMS}"
    );
});
