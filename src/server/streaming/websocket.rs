//! Kubernetes' channel framing over WebSocket (apiserver's wsstream, as kubelet serves it):
//! every message starts with the channel number (0 stdin, 1 stdout, 2 stderr, 3 error,
//! 4 resize for remotecommand; two per port for port-forward). The base64 protocols send text
//! messages whose first character is the channel digit and the rest the payload in base64.
//! `v5.channel.k8s.io` adds the CLOSE signal: a message `[255, channel]` half-closes that
//! channel (kubectl sends it at the end of stdin). A connection with no message in either
//! direction for the idle timeout is closed, as wsstream's deadline does.
//!
//! Also the "SPDY/3.1+portforward.k8s.io" tunnel kubectl 1.30+ opens for port-forward: SPDY
//! frames carried as a byte stream in binary messages ([`tunnel`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use base64::Engine;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tracing::debug;

/// The CLOSE signal's channel number (v5).
pub const CLOSE_CHANNEL: u8 = 255;

/// Largest WebSocket message (and frame) accepted; a larger one ends the connection. kubectl
/// sends its 32 KiB reads (43 KiB in base64), the SPDY tunnel its SPDY frames.
pub const MAX_MESSAGE: usize = 256 * 1024;

/// Messages queued per readable channel before the reader waits for the channel's consumer
/// (and so stops reading the connection): with [`MAX_MESSAGE`], at most 512 KiB a channel.
const CHANNEL_QUEUE: usize = 2;

/// `ws` with the message and frame size bounded by [`MAX_MESSAGE`] (tungstenite's defaults are
/// 64 MiB and 16 MiB).
pub fn bounded(ws: axum::extract::ws::WebSocketUpgrade) -> axum::extract::ws::WebSocketUpgrade {
    // fuzz/fuzz_targets/websocket_frames.rs reads frames with the same two bounds.
    ws.max_message_size(MAX_MESSAGE).max_frame_size(MAX_MESSAGE)
}

/// Pick the protocol as wsstream does: the first the client asks for that the server speaks;
/// no protocol asked for selects "" when "" is supported.
pub fn choose(requested: &[String], supported: &[&str]) -> Option<String> {
    if requested.is_empty() {
        return supported.contains(&"").then(String::new);
    }
    requested
        .iter()
        .find(|p| !p.is_empty() && supported.contains(&p.as_str()))
        .cloned()
}

/// The protocols a WebSocket upgrade request asks for, in its order.
pub fn requested_protocols(headers: &axum::http::HeaderMap) -> Vec<String> {
    headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// How messages are framed under a protocol.
#[derive(Debug, Clone, Copy)]
pub struct Framing {
    pub base64: bool,
    /// v5: `[255, channel]` closes a channel.
    pub close_signal: bool,
}

enum WsOut {
    Data(u8, Bytes),
    Close,
}

/// Writes on one channel; clonable.
#[derive(Clone)]
pub struct ChannelWriter {
    ch: u8,
    out: mpsc::Sender<WsOut>,
}

impl ChannelWriter {
    pub async fn write(&self, data: &[u8]) -> std::io::Result<()> {
        self.out
            .send(WsOut::Data(self.ch, Bytes::copy_from_slice(data)))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "websocket closed"))
    }
}

/// The connection: [`WsConn::close`] sends a close message after everything queued.
#[derive(Clone)]
pub struct WsConn {
    out: mpsc::Sender<WsOut>,
    gone: watch::Receiver<bool>,
}

impl WsConn {
    pub fn writer(&self, ch: u8) -> ChannelWriter {
        ChannelWriter {
            ch,
            out: self.out.clone(),
        }
    }

    pub async fn close(&self) {
        let _ = self.out.send(WsOut::Close).await;
    }

    /// Resolves when the connection has ended.
    pub async fn closed(&self) {
        let mut g = self.gone.clone();
        let _ = g.wait_for(|v| *v).await;
    }
}

/// Run the channel framing on `socket`. Messages on the channels in `readable` arrive on the
/// returned receivers (which end at the channel's CLOSE signal or the connection's end);
/// messages on other channels are dropped, as wsstream does.
pub fn start(
    socket: WebSocket,
    framing: Framing,
    readable: &[u8],
    idle_timeout: Duration,
) -> (WsConn, HashMap<u8, mpsc::Receiver<Bytes>>) {
    let (mut sink, mut stream) = socket.split();
    let (out_tx, mut out_rx) = mpsc::channel::<WsOut>(64);
    let (gone_tx, gone_rx) = watch::channel(false);
    let gone_tx = Arc::new(gone_tx);
    let activity = Arc::new(Mutex::new(Instant::now()));
    let mut senders = HashMap::new();
    let mut receivers = HashMap::new();
    for &ch in readable {
        let (tx, rx) = mpsc::channel::<Bytes>(CHANNEL_QUEUE);
        senders.insert(ch, tx);
        receivers.insert(ch, rx);
    }
    let touch = |a: &Arc<Mutex<Instant>>| *a.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();

    // Writer.
    {
        let (activity, gone_tx) = (activity.clone(), gone_tx.clone());
        let mut gone = gone_rx.clone();
        tokio::spawn(async move {
            loop {
                let o = tokio::select! {
                    o = out_rx.recv() => o,
                    _ = gone.wait_for(|v| *v) => None,
                };
                let Some(o) = o else { break };
                let msg = match o {
                    WsOut::Data(ch, data) => encode(framing, ch, &data),
                    WsOut::Close => {
                        let _ = sink
                            .send(Message::Close(Some(CloseFrame {
                                code: 1000,
                                reason: "".into(),
                            })))
                            .await;
                        break;
                    }
                };
                if sink.send(msg).await.is_err() {
                    break;
                }
                touch(&activity);
            }
            let _ = sink.close().await;
            let _ = gone_tx.send(true);
        });
    }
    // Reader.
    {
        let mut gone = gone_rx.clone();
        tokio::spawn(async move {
            let mut senders = senders;
            loop {
                let left = if idle_timeout.is_zero() {
                    Duration::from_secs(u64::MAX / 4)
                } else {
                    idle_timeout.saturating_sub(activity.lock().unwrap_or_else(|e| e.into_inner()).elapsed())
                };
                let msg = tokio::select! {
                    m = stream.next() => m,
                    _ = tokio::time::sleep(left) => {
                        if activity.lock().unwrap_or_else(|e| e.into_inner()).elapsed() >= idle_timeout {
                            debug!("websocket idle for {idle_timeout:?}, closing");
                            break;
                        }
                        continue;
                    }
                    _ = gone.wait_for(|v| *v) => break,
                };
                let data: Bytes = match msg {
                    Some(Ok(Message::Binary(b))) => b,
                    Some(Ok(Message::Text(t))) => Bytes::from(t),
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => continue,
                };
                touch(&activity);
                let Some((ch, payload)) = decode(framing, &data) else {
                    continue;
                };
                if framing.close_signal && ch == CLOSE_CHANNEL {
                    if let Some(&closed) = payload.first() {
                        senders.remove(&closed);
                    }
                    continue;
                }
                if payload.is_empty() {
                    continue;
                }
                if let Some(tx) = senders.get(&ch) {
                    if tx.send(payload).await.is_err() {
                        senders.remove(&ch);
                    }
                }
            }
            drop(senders);
            let _ = gone_tx.send(true);
        });
    }
    (
        WsConn {
            out: out_tx,
            gone: gone_rx,
        },
        receivers,
    )
}

fn encode(framing: Framing, ch: u8, data: &[u8]) -> Message {
    if framing.base64 {
        let mut s = String::with_capacity(1 + data.len() * 4 / 3 + 4);
        s.push((b'0' + ch) as char);
        base64::engine::general_purpose::STANDARD.encode_string(data, &mut s);
        Message::Text(s.into())
    } else {
        let mut v = Vec::with_capacity(1 + data.len());
        v.push(ch);
        v.extend_from_slice(data);
        Message::Binary(v.into())
    }
}

/// A message's channel and payload; `None` for an empty or undecodable message. The input is
/// the peer's (public for the fuzz target).
pub fn decode(framing: Framing, msg: &[u8]) -> Option<(u8, Bytes)> {
    let (&first, rest) = msg.split_first()?;
    if framing.base64 {
        let ch = first.wrapping_sub(b'0');
        if framing.close_signal && first == CLOSE_CHANNEL {
            return Some((CLOSE_CHANNEL, Bytes::copy_from_slice(rest)));
        }
        let data = base64::engine::general_purpose::STANDARD.decode(rest).ok()?;
        Some((ch, Bytes::from(data)))
    } else {
        Some((first, Bytes::copy_from_slice(rest)))
    }
}

/// Carry a byte stream in binary messages: what is written to the returned end goes out as
/// messages, the payloads of messages that arrive are read from it. The SPDY tunnel runs a
/// SPDY connection on it.
pub fn tunnel(socket: WebSocket) -> tokio::io::DuplexStream {
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let (mut sink, mut stream) = socket.split();
    let (mut rd, mut wr) = tokio::io::split(ours);
    tokio::spawn(async move {
        while let Some(Ok(msg)) = stream.next().await {
            let data = match msg {
                Message::Binary(b) => b,
                Message::Text(t) => Bytes::from(t),
                Message::Close(_) => break,
                _ => continue,
            };
            if wr.write_all(&data).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink
                        .send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code: 1000,
                reason: "".into(),
            })))
            .await;
        let _ = sink.close().await;
    });
    theirs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on loopback whose channel 0 is read by a consumer that reports what it got;
    /// the client sends `sizes` (binary framing, channel 0), then waits for the server to end
    /// the connection. What the consumer got, by size.
    async fn send_messages(sizes: &[usize]) -> Vec<usize> {
        use axum::extract::ws::WebSocketUpgrade;
        use tokio_tungstenite::tungstenite::Message as M;
        let (got_tx, mut got_rx) = mpsc::unbounded_channel::<usize>();
        let app = axum::Router::new().route(
            "/ws",
            axum::routing::get(move |ws: WebSocketUpgrade| async move {
                bounded(ws).on_upgrade(move |socket| async move {
                    let f = Framing {
                        base64: false,
                        close_signal: false,
                    };
                    let (conn, mut rx) = start(socket, f, &[0], Duration::from_secs(60));
                    let mut ch = rx.remove(&0).unwrap();
                    while let Some(b) = ch.recv().await {
                        let _ = got_tx.send(b.len());
                    }
                    conn.close().await;
                })
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut client, _) = tokio_tungstenite::client_async(format!("ws://{addr}/ws"), tcp)
            .await
            .unwrap();
        for &n in sizes {
            if client.send(M::Binary(vec![0u8; n].into())).await.is_err() {
                break;
            }
        }
        let _ = client.close(None).await;
        // The server ends the connection either way (after a message too large, at once).
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(Ok(_)) = client.next().await {}
        })
        .await
        .expect("the server ends the connection");
        server.abort();
        let mut got = Vec::new();
        while let Ok(n) = got_rx.try_recv() {
            got.push(n);
        }
        got
    }

    #[tokio::test]
    async fn messages_past_the_bound_end_the_connection() {
        // Payloads are the message less its channel byte.
        let got = send_messages(&[32 * 1024, MAX_MESSAGE]).await;
        assert_eq!(got, [32 * 1024 - 1, MAX_MESSAGE - 1]);
        let got = send_messages(&[1024, 4 * MAX_MESSAGE, 1024]).await;
        assert_eq!(got, [1023], "nothing from the message too large or after it");
    }

    #[test]
    fn protocol_choice_follows_the_client_order() {
        let s = ["v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io", ""];
        let req = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            choose(&req(&["v4.channel.k8s.io", "v5.channel.k8s.io"]), &s).as_deref(),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(choose(&req(&[]), &s).as_deref(), Some(""));
        assert_eq!(choose(&req(&["SPDY/3.1+portforward.k8s.io"]), &s), None);
        assert_eq!(choose(&req(&[]), &["portforward.k8s.io"]), None);
    }

    #[test]
    fn binary_framing_round_trips() {
        let f = Framing {
            base64: false,
            close_signal: true,
        };
        let Message::Binary(m) = encode(f, 1, b"hi") else {
            panic!()
        };
        assert_eq!(&m[..], &[1, b'h', b'i']);
        assert_eq!(decode(f, &m), Some((1, Bytes::from_static(b"hi"))));
        assert_eq!(decode(f, &[255, 0]), Some((255, Bytes::from_static(&[0]))));
        assert_eq!(decode(f, &[]), None);
    }

    #[test]
    fn base64_framing_round_trips() {
        let f = Framing {
            base64: true,
            close_signal: false,
        };
        let Message::Text(m) = encode(f, 2, b"foo\n") else {
            panic!()
        };
        assert_eq!(m.as_str(), "2Zm9vCg==");
        assert_eq!(decode(f, m.as_bytes()), Some((2, Bytes::from_static(b"foo\n"))));
        assert_eq!(decode(f, b"0!!"), None);
    }

    #[test]
    fn requested_protocols_split_on_commas() {
        let mut h = axum::http::HeaderMap::new();
        h.append(
            "sec-websocket-protocol",
            "v5.channel.k8s.io, v4.channel.k8s.io".parse().unwrap(),
        );
        h.append("sec-websocket-protocol", "channel.k8s.io".parse().unwrap());
        assert_eq!(
            requested_protocols(&h),
            vec!["v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io"]
        );
    }
}
