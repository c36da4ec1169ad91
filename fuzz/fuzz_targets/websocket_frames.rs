//! WebSocket frames as a client on the kubelet port may send them after an exec, attach or
//! port-forward upgrade: read as the agent reads them (tungstenite, server role, with the
//! agent's bounds: `websocket::MAX_MESSAGE` per message and per frame), each message then
//! split into channel and payload by the channel framing (binary, base64, v5's CLOSE signal).
//! No panic, no spin, and no message past the bound ever comes out.
#![no_main]

use std::io::{self, Read, Write};

use ferrolet::server::streaming::websocket::{decode, Framing, MAX_MESSAGE};
use libfuzzer_sys::fuzz_target;
use tungstenite::protocol::{Role, WebSocketConfig};
use tungstenite::{Message, WebSocket};

/// The client's bytes in, the agent's answers (pongs, the close) thrown away.
struct Wire<'a> {
    input: &'a [u8],
}

impl Read for Wire<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Wire<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, input)) = data.split_first() else {
        return;
    };
    let framing = Framing {
        base64: mode & 1 != 0,
        close_signal: mode & 2 != 0,
    };
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    let mut ws = WebSocket::from_raw_socket(Wire { input }, Role::Server, Some(config));
    loop {
        let payload = match ws.read() {
            Ok(Message::Binary(b)) => b,
            Ok(Message::Text(t)) => bytes::Bytes::from(t),
            Ok(_) => continue,
            // The connection ends at the first error (a message too large among them) or at
            // the end of the input.
            Err(_) => return,
        };
        assert!(payload.len() <= MAX_MESSAGE, "a message of {} bytes", payload.len());
        if let Some((_, data)) = decode(framing, &payload) {
            assert!(data.len() < MAX_MESSAGE);
        }
    }
});
