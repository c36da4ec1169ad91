//! The attach socket's wire format, spoken between a container's monitor
//! ([`super::server`]) and an attacher ([`super::client`]): frames of a one-byte kind, a
//! big-endian u32 length and the payload. The first frame from the attacher is `HELLO`
//! (which streams it wants, JSON); the monitor answers `WELCOME` (JSON) or `REFUSED` (JSON,
//! naming the field) and then sends output frames until the container exits, when it closes
//! the connection.

use serde::{Deserialize, Serialize};

/// Largest payload accepted; bigger frames are a protocol error.
pub const MAX_PAYLOAD: usize = 1 << 20;
const HEADER: usize = 5;

// attacher -> monitor
pub const HELLO: u8 = 1;
pub const STDIN: u8 = 2;
pub const CLOSE_STDIN: u8 = 3;
/// Payload: width and height, u16 big-endian each.
pub const RESIZE: u8 = 4;
/// Instead of HELLO: reopen the CRI log file (CRI's ReopenContainerLog, after the caller
/// renamed it); answered with REOPENED.
pub const REOPEN_LOG: u8 = 6;

// monitor -> attacher
pub const WELCOME: u8 = 1;
pub const STDOUT: u8 = 2;
pub const STDERR: u8 = 3;
pub const REFUSED: u8 = 5;
/// Payload: empty when the log was reopened, else why not (UTF-8).
pub const REOPENED: u8 = 6;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hello {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Welcome {
    pub tty: bool,
    /// False when the container has no stdin or it was closed (stdinOnce); writes are dropped.
    pub stdin_open: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Refused {
    /// The attach option at fault (`stdin`), empty when it is not about one.
    pub field: String,
    pub reason: String,
}

/// Append one frame to `out`.
pub fn encode(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

pub fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + payload.len());
    encode(&mut v, kind, payload);
    v
}

pub fn resize_payload(width: u16, height: u16) -> [u8; 4] {
    let (w, h) = (width.to_be_bytes(), height.to_be_bytes());
    [w[0], w[1], h[0], h[1]]
}

pub fn parse_resize(p: &[u8]) -> Option<(u16, u16)> {
    (p.len() == 4).then(|| (u16::from_be_bytes([p[0], p[1]]), u16::from_be_bytes([p[2], p[3]])))
}

#[derive(Debug, PartialEq, Eq)]
pub struct BadFrame(pub usize);

impl std::fmt::Display for BadFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "attach frame of {} bytes exceeds {MAX_PAYLOAD}", self.0)
    }
}

/// Accumulates bytes read from a stream and yields whole frames.
#[derive(Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes waiting that do not form a whole frame yet.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// The next whole frame, if there is one.
    pub fn next_frame(&mut self) -> Result<Option<(u8, Vec<u8>)>, BadFrame> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(BadFrame(len));
        }
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        let kind = self.buf[0];
        let payload = self.buf[HEADER..HEADER + len].to_vec();
        self.buf.drain(..HEADER + len);
        Ok(Some((kind, payload)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_in_any_split() {
        let mut wire = Vec::new();
        encode(&mut wire, STDOUT, b"hello");
        encode(&mut wire, RESIZE, &resize_payload(80, 24));
        encode(&mut wire, CLOSE_STDIN, b"");
        for cut in 0..wire.len() {
            let mut d = Decoder::default();
            let mut got = Vec::new();
            d.push(&wire[..cut]);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
            d.push(&wire[cut..]);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
            assert_eq!(
                got,
                vec![
                    (STDOUT, b"hello".to_vec()),
                    (RESIZE, vec![0, 80, 0, 24]),
                    (CLOSE_STDIN, vec![])
                ]
            );
            assert_eq!(d.pending(), 0);
        }
        assert_eq!(parse_resize(&[0, 80, 0, 24]), Some((80, 24)));
        assert_eq!(parse_resize(&[1]), None);
    }

    #[test]
    fn oversized_frame_is_refused() {
        let mut d = Decoder::default();
        d.push(&[STDIN, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(d.next_frame(), Err(BadFrame(0xffff_ffff)));
    }
}
