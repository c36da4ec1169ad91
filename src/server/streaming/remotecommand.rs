//! The remotecommand protocols (exec and attach) as kubelet serves them
//! (pkg/kubelet/cri/streaming/remotecommand): which streams a request asks for, setting them
//! up over SPDY (the client opens one stream per `streamType`: error, stdin, stdout, stderr,
//! resize; the server waits for all it expects, up to the stream creation timeout) or over
//! WebSocket (fixed channels 0-4), and the end: the outcome written on the error stream (v4
//! and v5: a metav1.Status in JSON carrying the exit code; older: the error's text, nothing on
//! success), the output streams closed, then the connection.

use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::spdy_conn::{Connection, StreamWriter};
use super::websocket::{self, ChannelWriter, Framing, WsConn};
use super::{upgrade, Timeouts};

pub const V1: &str = "channel.k8s.io";
pub const V2: &str = "v2.channel.k8s.io";
pub const V3: &str = "v3.channel.k8s.io";
pub const V4: &str = "v4.channel.k8s.io";
pub const V5: &str = "v5.channel.k8s.io";
pub const BASE64_V1: &str = "base64.channel.k8s.io";
pub const BASE64_V4: &str = "v4.base64.channel.k8s.io";

/// SPDY subprotocols, most preferred first (kubelet's SupportedStreamingProtocols).
pub const SPDY_PROTOCOLS: &[&str] = &[V4, V3, V2, V1];
/// WebSocket subprotocols ("" is a client that asks for none: channel.k8s.io framing).
pub const WS_PROTOCOLS: &[&str] = &[V5, V4, BASE64_V4, V1, BASE64_V1, ""];

/// Streams an exec or attach connection may have open at once: kubelet's error, stdin,
/// stdout, stderr and resize.
pub const MAX_SPDY_STREAMS: usize = 5;

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;

/// Which streams the request asks for: `input=1` (stdin), `output=1` (stdout), `error=1`
/// (stderr), `tty=1`, the parameter names the API server passes on (core/v1's Exec*Param).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl Options {
    /// From the query's pairs; kubelet drops stderr with a tty and needs at least one stream.
    pub fn from_query(q: &[(String, String)]) -> Result<Options, String> {
        let on = |k: &str| q.iter().any(|(n, v)| n == k && v == "1");
        let tty = on("tty");
        let o = Options {
            stdin: on("input"),
            stdout: on("output"),
            stderr: on("error") && !tty,
            tty,
        };
        if !o.stdin && !o.stdout && !o.stderr {
            return Err("you must specify at least 1 of stdin, stdout, stderr".into());
        }
        Ok(o)
    }
}

/// A terminal size as the client sends it on the resize stream (Go's TerminalSize).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct TermSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// How the command ended, for the status on the error stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Exit code 0.
    Success,
    /// The command exited non-zero; `command` names it in the message.
    ExitCode { code: i32, command: Vec<String> },
    /// It could not run (kubelet: an internal error).
    Error(String),
}

/// An output stream of the session, whichever transport carries it.
#[derive(Clone)]
pub enum Output {
    Spdy(StreamWriter),
    Ws(ChannelWriter),
}

impl Output {
    pub async fn write(&self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Output::Spdy(w) => w.write(data).await,
            Output::Ws(w) => w.write(data).await,
        }
    }

    async fn close(&self) {
        if let Output::Spdy(w) = self {
            w.close().await;
        }
    }
}

#[derive(Clone)]
enum Conn {
    Spdy(Connection),
    Ws(WsConn),
}

impl Conn {
    async fn close(&self) {
        match self {
            Conn::Spdy(c) => c.close().await,
            Conn::Ws(c) => c.close().await,
        }
    }
    async fn closed(&self) {
        match self {
            Conn::Spdy(c) => c.closed().await,
            Conn::Ws(c) => c.closed().await,
        }
    }
}

/// What the process side (exec, attach) gets: its input, its outputs and terminal sizes.
pub struct Session {
    /// Data from the client until it closes stdin (`None`).
    pub stdin: Option<mpsc::Receiver<Bytes>>,
    pub stdout: Option<Output>,
    pub stderr: Option<Output>,
    pub resize: Option<mpsc::Receiver<TermSize>>,
    pub tty: bool,
    /// The negotiated subprotocol ("" for a WebSocket client that asked for none).
    pub protocol: String,
    conn: Conn,
}

impl Session {
    /// Resolves when the client has gone (the connection ended).
    pub fn client_gone(&self) -> impl Future<Output = ()> + Send + 'static {
        let c = self.conn.clone();
        async move { c.closed().await }
    }
}

/// The error stream and how to write the outcome on it.
struct Finish {
    conn: Conn,
    error: Output,
    json_status: bool,
    outputs: Vec<Output>,
    stdin: Option<Output>,
}

/// Serve a remotecommand request: upgrade (WebSocket or SPDY), set the streams up, run `job`
/// with them, write its outcome and close. The returned response is the upgrade's answer (or
/// the refusal).
pub async fn serve<F, Fut>(mut req: Request<Body>, opts: Options, timeouts: Timeouts, job: F) -> Response
where
    F: FnOnce(Session) -> Fut + Send + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    if upgrade::is_websocket(req.headers()) {
        let requested = websocket::requested_protocols(req.headers());
        let Some(protocol) = websocket::choose(&requested, WS_PROTOCOLS) else {
            return (
                StatusCode::FORBIDDEN,
                format!("requested protocol(s) are not supported: {requested:?}; supports {WS_PROTOCOLS:?}"),
            )
                .into_response();
        };
        let (mut parts, _) = req.into_parts();
        let ws = match axum::extract::ws::WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
            Ok(ws) => websocket::bounded(ws),
            Err(e) => return e.into_response(),
        };
        let mut ws = ws;
        if !protocol.is_empty() {
            if let Ok(v) = protocol.parse() {
                ws.set_selected_protocol(v);
            }
        }
        return ws.on_upgrade(move |socket| async move {
            let framing = Framing {
                base64: protocol.contains("base64"),
                close_signal: protocol == V5,
            };
            let mut readable = vec![RESIZE];
            if opts.stdin {
                readable.push(STDIN);
            }
            let (conn, mut rx) = websocket::start(socket, framing, &readable, timeouts.idle);
            let out = |on: bool, ch: u8| on.then(|| Output::Ws(conn.writer(ch)));
            // The lowest writable channel gets an empty message: the client's cue that the
            // streams are ready.
            let ready = if opts.stdout {
                STDOUT
            } else if opts.stderr {
                STDERR
            } else {
                ERROR
            };
            let _ = conn.writer(ready).write(&[]).await;
            let resize = rx.remove(&RESIZE).filter(|_| opts.tty).map(decode_resize);
            let session = Session {
                stdin: rx.remove(&STDIN),
                stdout: out(opts.stdout, STDOUT),
                stderr: out(opts.stderr, STDERR),
                resize,
                tty: opts.tty,
                protocol: protocol.clone(),
                conn: Conn::Ws(conn.clone()),
            };
            let finish = Finish {
                conn: Conn::Ws(conn.clone()),
                error: Output::Ws(conn.writer(ERROR)),
                json_status: matches!(protocol.as_str(), V5 | V4 | BASE64_V4),
                outputs: Vec::new(),
                stdin: None,
            };
            run(session, finish, job).await;
        });
    }

    let up = match upgrade::spdy(&mut req, SPDY_PROTOCOLS) {
        Ok(u) => u,
        Err(resp) => return *resp,
    };
    let protocol = up.protocol.clone();
    tokio::spawn(async move {
        let io = match up.on_upgrade.await {
            Ok(io) => io,
            Err(e) => {
                debug!(error = %e, "SPDY upgrade failed");
                return;
            }
        };
        let (conn, streams) = Connection::start(TokioIo::new(io), timeouts.idle, MAX_SPDY_STREAMS);
        match spdy_streams(conn.clone(), streams, &protocol, opts, timeouts.stream_creation).await {
            Some((session, finish)) => run(session, finish, job).await,
            None => conn.close().await,
        }
    });
    up.response
}

/// Wait for the streams the request asked for (kubelet counts error + each of stdin, stdout,
/// stderr, + resize with a tty from v3 on).
async fn spdy_streams(
    conn: Connection,
    mut incoming: mpsc::Receiver<super::spdy_conn::Stream>,
    protocol: &str,
    opts: Options,
    creation_timeout: Duration,
) -> Option<(Session, Finish)> {
    let resizing = matches!(protocol, V4 | V3);
    let expected = 1 + [opts.stdin, opts.stdout, opts.stderr, opts.tty && resizing]
        .iter()
        .filter(|b| **b)
        .count();
    let (mut error, mut stdin, mut stdout, mut stderr, mut resize) = (None, None, None, None, None);
    let mut received = 0;
    let deadline = tokio::time::sleep(creation_timeout);
    tokio::pin!(deadline);
    while received < expected {
        let s = tokio::select! {
            s = incoming.recv() => s?,
            _ = &mut deadline => {
                warn!("timed out waiting for client to create streams");
                return None;
            }
        };
        let kind = s.headers.get("streamType").unwrap_or("").to_string();
        let slot = match kind.as_str() {
            "error" => &mut error,
            "stdin" => &mut stdin,
            "stdout" => &mut stdout,
            "stderr" => &mut stderr,
            "resize" if resizing => &mut resize,
            other => {
                debug!(stream_type = other, "unexpected stream type");
                continue;
            }
        };
        *slot = Some(s);
        received += 1;
    }
    let error = error?;
    let stdin_writer = stdin.as_ref().map(|s| Output::Spdy(s.tx.clone()));
    let stdout = stdout.map(|s| Output::Spdy(s.tx));
    let stderr = stderr.map(|s| Output::Spdy(s.tx));
    let session = Session {
        stdin: stdin.map(|s| s.rx.into_inner()),
        stdout: stdout.clone(),
        stderr: stderr.clone(),
        resize: resize.filter(|_| opts.tty).map(|s| decode_resize(s.rx.into_inner())),
        tty: opts.tty,
        protocol: protocol.to_string(),
        conn: Conn::Spdy(conn.clone()),
    };
    let finish = Finish {
        conn: Conn::Spdy(conn),
        error: Output::Spdy(error.tx),
        json_status: protocol == V4,
        outputs: stdout.into_iter().chain(stderr).collect(),
        stdin: stdin_writer,
    };
    Some((session, finish))
}

/// Decode the resize stream: a sequence of JSON objects (Go's json.Decoder), ending at the
/// first one that does not parse.
fn decode_resize(mut rx: mpsc::Receiver<Bytes>) -> mpsc::Receiver<TermSize> {
    let (tx, out) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut buf: Vec<u8> = Vec::new();
        while let Some(b) = rx.recv().await {
            buf.extend_from_slice(&b);
            let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<TermSize>();
            let mut used = 0;
            loop {
                match it.next() {
                    Some(Ok(size)) => {
                        used = it.byte_offset();
                        if tx.send(size).await.is_err() {
                            return;
                        }
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    Some(Err(_)) => return,
                    None => break,
                }
            }
            buf.drain(..used);
        }
    });
    out
}

/// The status kubelet writes for an outcome (metav1.Status, as JSON).
pub fn status_json(outcome: &Outcome) -> serde_json::Value {
    match outcome {
        Outcome::Success => serde_json::json!({"metadata": {}, "status": "Success"}),
        Outcome::ExitCode { code, command } => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": format!(
                "command terminated with non-zero exit code: error executing command {command:?}, exit code {code}"
            ),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        Outcome::Error(e) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("Internal error occurred: {e}"),
            "reason": "InternalError",
            "details": {"causes": [{"message": e}]},
            "code": 500,
        }),
    }
}

/// The status for the pre-v4 protocols: the error's text; nothing on success.
fn status_text(outcome: &Outcome) -> Option<String> {
    match status_json(outcome).get("message") {
        Some(serde_json::Value::String(m)) if *outcome != Outcome::Success => Some(m.clone()),
        _ => None,
    }
}

async fn run<F, Fut>(session: Session, finish: Finish, job: F)
where
    F: FnOnce(Session) -> Fut,
    Fut: Future<Output = Outcome>,
{
    let outcome = job(session).await;
    // The job has written all output: close the output streams, then say how it ended.
    for o in &finish.outputs {
        o.close().await;
    }
    if let Some(s) = &finish.stdin {
        s.close().await;
    }
    let msg = if finish.json_status {
        Some(status_json(&outcome).to_string())
    } else {
        status_text(&outcome)
    };
    if let Some(m) = msg {
        let _ = finish.error.write(m.as_bytes()).await;
    }
    finish.error.close().await;
    finish.conn.close().await;
}

/// Shared by the handlers: the request's query as pairs (repeated keys kept, in order).
pub fn query_pairs(req: &Request<Body>) -> Vec<(String, String)> {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// The values of a repeated query parameter.
pub fn query_all(q: &[(String, String)], key: &str) -> Vec<String> {
    q.iter().filter(|(k, _)| k == key).map(|(_, v)| v.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Vec<(String, String)> {
        form_urlencoded::parse(s.as_bytes()).into_owned().collect()
    }

    #[test]
    fn options_as_kubelet_reads_them() {
        let o = Options::from_query(&q("input=1&output=1&error=1&tty=1&command=sh")).unwrap();
        assert_eq!(
            o,
            Options {
                stdin: true,
                stdout: true,
                stderr: false,
                tty: true
            }
        );
        assert!(Options::from_query(&q("command=ls&tty=1")).is_err());
        assert!(Options::from_query(&q("output=true")).is_err());
        assert!(Options::from_query(&q("stdout=1")).is_err());
        assert_eq!(
            query_all(&q("command=sh&command=-c&command=a%20b"), "command"),
            ["sh", "-c", "a b"]
        );
    }

    #[test]
    fn exit_code_status_is_what_kubectl_reads() {
        let s = status_json(&Outcome::ExitCode {
            code: 3,
            command: vec!["sh".into(), "-c".into(), "exit 3".into()],
        });
        assert_eq!(s["status"], "Failure");
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(s["details"]["causes"][0]["message"], "3");
        assert_eq!(status_json(&Outcome::Success)["status"], "Success");
        assert_eq!(status_text(&Outcome::Success), None);
        assert_eq!(
            status_text(&Outcome::Error("boom".into())).as_deref(),
            Some("Internal error occurred: boom")
        );
    }

    /// A client on the other end of an in-memory connection: opens the v4 streams, sends
    /// stdin with FIN, and reads everything until the server closes.
    #[tokio::test]
    async fn spdy_session_echoes_stdin_and_ends_with_the_v4_status() {
        use super::super::spdy::{self, Frame, HeaderDecoder, HeaderEncoder, Headers};
        use tokio::io::AsyncWriteExt;

        let (server_io, client_io) = tokio::io::duplex(1 << 16);
        let (conn, incoming) = Connection::start(server_io, Duration::from_secs(60), MAX_SPDY_STREAMS);
        let opts = Options {
            stdin: true,
            stdout: true,
            stderr: false,
            tty: false,
        };
        let server = tokio::spawn(async move {
            let (session, finish) = spdy_streams(conn, incoming, V4, opts, Duration::from_secs(5))
                .await
                .expect("the streams");
            run(session, finish, |mut s: Session| async move {
                let mut stdin = s.stdin.take().unwrap();
                let out = s.stdout.take().unwrap();
                while let Some(b) = stdin.recv().await {
                    out.write(&b).await.unwrap();
                }
                Outcome::ExitCode {
                    code: 3,
                    command: vec!["cat".into()],
                }
            })
            .await;
        });

        let (mut rd, mut wr) = tokio::io::split(client_io);
        let mut enc = HeaderEncoder::new();
        let mut send = Vec::new();
        for (id, kind) in [(1u32, "error"), (3, "stdin"), (5, "stdout")] {
            let f = Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: Headers(vec![("streamType".into(), kind.into())]),
            };
            send.extend(spdy::encode(&f, &mut enc).unwrap());
        }
        send.extend(spdy::encode(&Frame::Ping { id: 1 }, &mut enc).unwrap());
        let data = Frame::Data {
            stream_id: 3,
            fin: true,
            data: Bytes::from_static(b"hi\n"),
        };
        send.extend(spdy::encode(&data, &mut enc).unwrap());
        wr.write_all(&send).await.unwrap();

        let mut dec = HeaderDecoder::new();
        let (mut replies, mut stdout, mut error, mut fins, mut pong, mut goaway) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), false, false);
        while let Some(f) = spdy::read_frame(&mut rd, &mut dec).await.unwrap() {
            match f {
                Frame::SynReply { stream_id, .. } => replies.push(stream_id),
                Frame::Data { stream_id, fin, data } => {
                    match stream_id {
                        5 => stdout.extend_from_slice(&data),
                        1 => error.extend_from_slice(&data),
                        _ => {}
                    }
                    if fin {
                        fins.push(stream_id);
                    }
                }
                Frame::Ping { id: 1 } => pong = true,
                Frame::GoAway { .. } => goaway = true,
                other => panic!("unexpected {other:?}"),
            }
        }
        server.await.unwrap();
        assert_eq!(replies, [1, 3, 5]);
        assert!(pong);
        assert_eq!(stdout, b"hi\n");
        // Output closed before the status, the error stream last, then GOAWAY.
        assert_eq!(fins, [5, 3, 1]);
        assert!(goaway);
        let status: serde_json::Value = serde_json::from_slice(&error).unwrap();
        assert_eq!(status["details"]["causes"][0]["message"], "3");
    }

    #[tokio::test]
    async fn resize_events_decode_across_chunks() {
        let (tx, rx) = mpsc::channel(4);
        let mut sizes = decode_resize(rx);
        tx.send(Bytes::from_static(b"{\"Width\":80,\"Hei")).await.unwrap();
        tx.send(Bytes::from_static(b"ght\":24}{\"Width\":100,\"Height\":40}"))
            .await
            .unwrap();
        assert_eq!(sizes.recv().await, Some(TermSize { width: 80, height: 24 }));
        assert_eq!(sizes.recv().await, Some(TermSize { width: 100, height: 40 }));
        drop(tx);
        assert_eq!(sizes.recv().await, None);
    }
}
