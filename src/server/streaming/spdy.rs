//! SPDY/3.1 frames as the API server and kubectl speak them to a kubelet (Go's spdystream):
//! the frame layout, and name/value header blocks compressed with zlib and the dictionary the
//! SPDY/3 draft defines (section 2.6.10.1), one compression context per direction for the
//! whole connection. No maintained Rust crate speaks SPDY (see docs/streaming.md).
//!
//! Control frame: `1 | version(15) | type(16) | flags(8) | length(24) | data`.
//! Data frame:    `0 | stream id(31)           | flags(8) | length(24) | data`.

use std::io;

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt};

pub const VERSION: u16 = 3;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

pub const FLAG_FIN: u8 = 0x01;
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;

/// Largest frame payload accepted (the length field allows 16 MiB). kubectl's data frames are
/// its 32 KiB copy buffer, its header blocks a few hundred bytes; a larger frame ends the
/// connection. Also bounds what one frame costs before it is parsed.
pub const MAX_FRAME: usize = 256 * 1024;

/// Largest header block once inflated. A SYN_STREAM from kubectl carries three or four short
/// headers; inflating stops past this size (a zlib bomb costs at most this much).
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;

/// Most name/value pairs in one header block.
pub const MAX_HEADER_ENTRIES: usize = 64;

/// RST_STREAM status codes (SPDY/3 section 2.6.3).
pub mod rst {
    pub const PROTOCOL_ERROR: u32 = 1;
    pub const INVALID_STREAM: u32 = 2;
    pub const REFUSED_STREAM: u32 = 3;
    pub const CANCEL: u32 = 5;
}

/// A header block: names (lowercase on the wire) and values (several values of one name are
/// joined by NUL, as the draft says).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Headers(pub Vec<(String, String)>);

impl Headers {
    /// The first value of `name`, compared without regard to case (Go canonicalizes
    /// `streamType` to `Streamtype`, the wire carries `streamtype`).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.split('\0').next().unwrap_or(""))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Data {
        stream_id: u32,
        fin: bool,
        data: Bytes,
    },
    SynStream {
        stream_id: u32,
        associated_to: u32,
        priority: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream_id: u32,
        fin: bool,
        headers: Headers,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        flags: u8,
        /// (flags, id, value)
        entries: Vec<(u8, u32, u32)>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        fin: bool,
        headers: Headers,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    /// A control frame of a type this side does not know; the draft says to ignore it.
    Unknown {
        kind: u16,
    },
}

/// The SPDY/3 header dictionary: length-prefixed words, then a run of plain text.
fn dictionary() -> &'static [u8] {
    static DICT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    DICT.get_or_init(|| {
        const WORDS: &[&str] = &[
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TAIL: &str = concat!(
            "100101201202205206300302303304305306307402405406407408409410411412413414415416417",
            "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently",
            "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error",
            "501 Not Implemented503 Service Unavailable",
            "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
            "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
            "chunked,text/html,image/png,image/jpg,image/gif,application/xml,",
            "application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
            "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
        );
        let mut d = Vec::with_capacity(1423);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    })
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// The outgoing header compressor of one connection.
pub struct HeaderEncoder {
    z: Compress,
}

impl Default for HeaderEncoder {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderEncoder {
    pub fn new() -> HeaderEncoder {
        let mut z = Compress::new(Compression::default(), true);
        // Cannot fail on a fresh stream with a valid dictionary.
        let _ = z.set_dictionary(dictionary());
        HeaderEncoder { z }
    }

    /// Compress one header block, flushed so the peer can decode it alone (SYNC_FLUSH).
    pub fn encode(&mut self, h: &Headers) -> io::Result<Vec<u8>> {
        let mut raw = Vec::new();
        raw.extend_from_slice(&(h.0.len() as u32).to_be_bytes());
        for (n, v) in &h.0 {
            let n = n.to_ascii_lowercase();
            raw.extend_from_slice(&(n.len() as u32).to_be_bytes());
            raw.extend_from_slice(n.as_bytes());
            raw.extend_from_slice(&(v.len() as u32).to_be_bytes());
            raw.extend_from_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut input = &raw[..];
        loop {
            out.reserve(256);
            let before = self.z.total_in();
            self.z
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|e| bad(format!("compressing a header block: {e}")))?;
            input = &input[(self.z.total_in() - before) as usize..];
            // Done when all input is consumed and the flush left spare room.
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

/// The incoming header decompressor of one connection.
pub struct HeaderDecoder {
    z: Decompress,
}

impl Default for HeaderDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderDecoder {
    pub fn new() -> HeaderDecoder {
        HeaderDecoder {
            z: Decompress::new(true),
        }
    }

    fn inflate(&mut self, mut input: &[u8]) -> io::Result<Vec<u8>> {
        // One byte of room past the cap tells a block at the cap from one beyond it.
        let cap = MAX_HEADER_BLOCK + 1;
        let mut out = Vec::with_capacity((input.len() * 4 + 64).min(cap));
        loop {
            if out.len() == out.capacity() {
                out.reserve_exact(out.capacity().max(1024).min(cap - out.len()));
            }
            let (in0, out0) = (self.z.total_in(), out.len());
            let mut dictionary_set = false;
            match self.z.decompress_vec(input, &mut out, FlushDecompress::Sync) {
                Ok(Status::StreamEnd) => return Err(bad("header block ended the zlib stream")),
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.z
                        .set_dictionary(dictionary())
                        .map_err(|e| bad(format!("header block dictionary: {e}")))?;
                    dictionary_set = true;
                }
                Err(e) => return Err(bad(format!("decompressing a header block: {e}"))),
            }
            input = &input[(self.z.total_in() - in0) as usize..];
            if out.len() > MAX_HEADER_BLOCK {
                return Err(bad(format!("header block inflates past {MAX_HEADER_BLOCK} bytes")));
            }
            // Done when all input is consumed and the output was not cut short.
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(out);
            }
            let progressed = out.len() > out0 || self.z.total_in() > in0 || dictionary_set;
            if !progressed {
                if input.is_empty() {
                    return Ok(out);
                }
                return Err(bad("header block does not decompress"));
            }
        }
    }

    /// Decompress and parse one header block.
    pub fn decode(&mut self, block: &[u8]) -> io::Result<Headers> {
        let raw = self.inflate(block)?;
        parse_block(&raw)
    }
}

fn parse_block(raw: &[u8]) -> io::Result<Headers> {
    let mut p = raw;
    let take_u32 = |p: &mut &[u8]| -> io::Result<u32> {
        if p.len() < 4 {
            return Err(bad("truncated header block"));
        }
        let v = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
        *p = &p[4..];
        Ok(v)
    };
    let n = take_u32(&mut p)? as usize;
    if n > MAX_HEADER_ENTRIES {
        return Err(bad(format!(
            "header block of {n} entries (at most {MAX_HEADER_ENTRIES})"
        )));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let field = |p: &mut &[u8]| -> io::Result<String> {
            let len = take_u32(p)? as usize;
            if p.len() < len {
                return Err(bad("truncated header block"));
            }
            let s = String::from_utf8_lossy(&p[..len]).into_owned();
            *p = &p[len..];
            Ok(s)
        };
        let name = field(&mut p)?;
        let value = field(&mut p)?;
        out.push((name, value));
    }
    Ok(Headers(out))
}

fn u32_at(b: &[u8], at: usize) -> io::Result<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| bad("control frame too short"))
}

/// Read one frame; `Ok(None)` at a clean end of the connection (between frames).
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, dec: &mut HeaderDecoder) -> io::Result<Option<Frame>> {
    let mut head = [0u8; 8];
    match r.read_exact(&mut head[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    r.read_exact(&mut head[1..]).await?;
    let len = frame_len(&head);
    if len > MAX_FRAME {
        return Err(bad(format!("frame of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    decode_frame(head, body, dec).map(Some)
}

/// The length of the frame whose 8-byte head is `head`.
pub fn frame_len(head: &[u8; 8]) -> usize {
    u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize
}

/// Parse one frame from its head and body (header blocks through `dec`, which must see every
/// block of the connection in order). The input is the peer's: anything may be in it.
pub fn decode_frame(head: [u8; 8], body: Vec<u8>, dec: &mut HeaderDecoder) -> io::Result<Frame> {
    let flags = head[4];
    if head[0] & 0x80 == 0 {
        return Ok(Frame::Data {
            stream_id: u32::from_be_bytes([head[0], head[1], head[2], head[3]]) & 0x7fff_ffff,
            fin: flags & FLAG_FIN != 0,
            data: Bytes::from(body),
        });
    }
    let version = u16::from_be_bytes([head[0], head[1]]) & 0x7fff;
    if version != VERSION {
        return Err(bad(format!("SPDY version {version}, only 3 is spoken")));
    }
    let kind = u16::from_be_bytes([head[2], head[3]]);
    let b = &body[..];
    let sid = |at| u32_at(b, at).map(|v| v & 0x7fff_ffff);
    Ok(match kind {
        SYN_STREAM => {
            if b.len() < 10 {
                return Err(bad("SYN_STREAM too short"));
            }
            Frame::SynStream {
                stream_id: sid(0)?,
                associated_to: sid(4)?,
                priority: b[8] >> 5,
                flags,
                headers: dec.decode(&b[10..])?,
            }
        }
        SYN_REPLY => Frame::SynReply {
            stream_id: sid(0)?,
            fin: flags & FLAG_FIN != 0,
            headers: dec.decode(b.get(4..).unwrap_or_default())?,
        },
        HEADERS => Frame::Headers {
            stream_id: sid(0)?,
            fin: flags & FLAG_FIN != 0,
            headers: dec.decode(b.get(4..).unwrap_or_default())?,
        },
        RST_STREAM => Frame::RstStream {
            stream_id: sid(0)?,
            status: u32_at(b, 4)?,
        },
        SETTINGS => {
            let n = u32_at(b, 0)? as usize;
            let mut entries = Vec::new();
            for i in 0..n {
                let at = 4 + i * 8;
                let idf = u32_at(b, at)?;
                entries.push(((idf >> 24) as u8, idf & 0x00ff_ffff, u32_at(b, at + 4)?));
            }
            Frame::Settings { flags, entries }
        }
        PING => Frame::Ping { id: u32_at(b, 0)? },
        GOAWAY => Frame::GoAway {
            last_good_stream_id: sid(0)?,
            status: u32_at(b, 4).unwrap_or(0),
        },
        WINDOW_UPDATE => Frame::WindowUpdate {
            stream_id: sid(0)?,
            delta: u32_at(b, 4)? & 0x7fff_ffff,
        },
        other => Frame::Unknown { kind: other },
    })
}

fn control(kind: u16, flags: u8, body: &[u8]) -> io::Result<Vec<u8>> {
    if body.len() >= MAX_FRAME {
        return Err(bad("control frame too large"));
    }
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.push(flags);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(body);
    Ok(out)
}

/// Serialize one frame (header blocks through `enc`, which must see every block in order).
pub fn encode(f: &Frame, enc: &mut HeaderEncoder) -> io::Result<Vec<u8>> {
    let fin = |b: bool| if b { FLAG_FIN } else { 0 };
    Ok(match f {
        Frame::Data {
            stream_id,
            fin: f,
            data,
        } => {
            if data.len() >= MAX_FRAME {
                return Err(bad("data frame too large"));
            }
            let mut out = Vec::with_capacity(8 + data.len());
            out.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
            out.push(fin(*f));
            out.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
            out.extend_from_slice(data);
            out
        }
        Frame::SynStream {
            stream_id,
            associated_to,
            priority,
            flags,
            headers,
        } => {
            let mut b = Vec::new();
            b.extend_from_slice(&stream_id.to_be_bytes());
            b.extend_from_slice(&associated_to.to_be_bytes());
            b.push(priority << 5);
            b.push(0);
            b.extend(enc.encode(headers)?);
            control(SYN_STREAM, *flags, &b)?
        }
        Frame::SynReply {
            stream_id,
            fin: f,
            headers,
        } => {
            let mut b = stream_id.to_be_bytes().to_vec();
            b.extend(enc.encode(headers)?);
            control(SYN_REPLY, fin(*f), &b)?
        }
        Frame::Headers {
            stream_id,
            fin: f,
            headers,
        } => {
            let mut b = stream_id.to_be_bytes().to_vec();
            b.extend(enc.encode(headers)?);
            control(HEADERS, fin(*f), &b)?
        }
        Frame::RstStream { stream_id, status } => {
            let mut b = stream_id.to_be_bytes().to_vec();
            b.extend_from_slice(&status.to_be_bytes());
            control(RST_STREAM, 0, &b)?
        }
        Frame::Settings { flags, entries } => {
            let mut b = (entries.len() as u32).to_be_bytes().to_vec();
            for (f, id, v) in entries {
                b.extend_from_slice(&((u32::from(*f) << 24) | (id & 0x00ff_ffff)).to_be_bytes());
                b.extend_from_slice(&v.to_be_bytes());
            }
            control(SETTINGS, *flags, &b)?
        }
        Frame::Ping { id } => control(PING, 0, &id.to_be_bytes())?,
        Frame::GoAway {
            last_good_stream_id,
            status,
        } => {
            let mut b = last_good_stream_id.to_be_bytes().to_vec();
            b.extend_from_slice(&status.to_be_bytes());
            control(GOAWAY, 0, &b)?
        }
        Frame::WindowUpdate { stream_id, delta } => {
            let mut b = stream_id.to_be_bytes().to_vec();
            b.extend_from_slice(&delta.to_be_bytes());
            control(WINDOW_UPDATE, 0, &b)?
        }
        Frame::Unknown { .. } => return Err(bad("cannot encode an unknown frame")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Headers {
        Headers(pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect())
    }

    async fn round_trip(frames: &[Frame]) -> Vec<Frame> {
        let mut enc = HeaderEncoder::new();
        let mut wire = Vec::new();
        for f in frames {
            wire.extend(encode(f, &mut enc).unwrap());
        }
        let mut dec = HeaderDecoder::new();
        let mut r = &wire[..];
        let mut out = Vec::new();
        while let Some(f) = read_frame(&mut r, &mut dec).await.unwrap() {
            out.push(f);
        }
        out
    }

    #[test]
    fn dictionary_is_the_drafts() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(&d[..11], b"\0\0\0\x07options");
        assert!(d.ends_with(b"utf-,*,enq=0."));
    }

    #[tokio::test]
    async fn frames_round_trip_with_one_compression_context() {
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: h(&[("streamtype", "error")]),
            },
            Frame::SynStream {
                stream_id: 3,
                associated_to: 0,
                priority: 2,
                flags: FLAG_FIN,
                headers: h(&[("streamtype", "stdout"), ("port", "8080"), ("requestid", "0")]),
            },
            Frame::SynReply {
                stream_id: 1,
                fin: false,
                headers: Headers::default(),
            },
            Frame::Data {
                stream_id: 3,
                fin: true,
                data: Bytes::from_static(b"hello"),
            },
            Frame::Data {
                stream_id: 5,
                fin: false,
                data: Bytes::new(),
            },
            Frame::RstStream {
                stream_id: 7,
                status: rst::CANCEL,
            },
            Frame::Settings {
                flags: 0,
                entries: vec![(0, 7, 65536), (1, 4, 100)],
            },
            Frame::Ping { id: 1 },
            Frame::GoAway {
                last_good_stream_id: 9,
                status: 0,
            },
            Frame::Headers {
                stream_id: 3,
                fin: false,
                headers: h(&[("a", "b\0c")]),
            },
            Frame::WindowUpdate {
                stream_id: 3,
                delta: 1 << 20,
            },
        ];
        assert_eq!(round_trip(&frames).await, frames);
    }

    #[tokio::test]
    async fn header_names_lowercase_on_the_wire_and_match_any_case() {
        let out = round_trip(&[Frame::SynReply {
            stream_id: 1,
            fin: false,
            headers: h(&[("streamType", "stdin"), ("Multi", "a\0b")]),
        }])
        .await;
        let Frame::SynReply { headers, .. } = &out[0] else {
            panic!("{out:?}")
        };
        assert_eq!(headers.0[0].0, "streamtype");
        assert_eq!(headers.get("StreamType"), Some("stdin"));
        assert_eq!(headers.get("multi"), Some("a"));
        assert_eq!(headers.get("missing"), None);
    }

    /// The fuzz seeds are written by Python's zlib with the dictionary (fuzz/seeds/make.py):
    /// another implementation's header blocks decode here.
    #[tokio::test]
    async fn header_blocks_from_another_zlib_decode() {
        let wire = include_bytes!("../../../fuzz/seeds/spdy_frames/exec");
        let mut dec = HeaderDecoder::new();
        let mut r = &wire[..];
        let mut kinds = Vec::new();
        while let Some(f) = read_frame(&mut r, &mut dec).await.unwrap() {
            if let Frame::SynStream { headers, .. } = &f {
                kinds.push(headers.get("streamType").unwrap().to_string());
            }
        }
        assert_eq!(kinds, ["error", "stdin", "stdout"]);
    }

    /// A SYN_STREAM whose header block is `raw` (uncompressed), compressed as a client would.
    fn syn_with_raw_block(raw: &[u8]) -> Vec<u8> {
        let mut z = Compress::new(Compression::best(), true);
        z.set_dictionary(dictionary()).unwrap();
        let mut block = Vec::with_capacity(raw.len() + 1024);
        z.compress_vec(raw, &mut block, FlushCompress::Sync).unwrap();
        let mut body = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        body.extend(block);
        control(SYN_STREAM, 0, &body).unwrap()
    }

    #[tokio::test]
    async fn hostile_header_blocks_are_refused_within_their_bounds() {
        // A zlib bomb: 16 MiB of one value compresses to about 16 KiB; inflating stops at
        // the cap instead of allocating the lot.
        let mut raw = Vec::new();
        raw.extend_from_slice(&1u32.to_be_bytes());
        raw.extend_from_slice(&1u32.to_be_bytes());
        raw.push(b'a');
        raw.extend_from_slice(&(16u32 << 20).to_be_bytes());
        raw.resize(raw.len() + (16 << 20), b'x');
        let wire = syn_with_raw_block(&raw);
        assert!(wire.len() <= MAX_FRAME, "the bomb fits in a frame: {}", wire.len());
        let err = read_frame(&mut &wire[..], &mut HeaderDecoder::new()).await.unwrap_err();
        assert!(err.to_string().contains("inflates past"), "{err}");

        // More entries than allowed, each tiny.
        let n = MAX_HEADER_ENTRIES as u32 + 1;
        let mut raw = n.to_be_bytes().to_vec();
        for _ in 0..n {
            raw.extend_from_slice(&[0, 0, 0, 1, b'a', 0, 0, 0, 1, b'b']);
        }
        let err = read_frame(&mut &syn_with_raw_block(&raw)[..], &mut HeaderDecoder::new())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("entries"), "{err}");

        // At the bounds it still decodes.
        let headers = Headers(
            (0..MAX_HEADER_ENTRIES)
                .map(|i| (format!("h{i}"), "v".repeat(512)))
                .collect(),
        );
        let frames = [Frame::SynStream {
            stream_id: 1,
            associated_to: 0,
            priority: 0,
            flags: 0,
            headers,
        }];
        assert_eq!(round_trip(&frames).await, frames);

        // A frame longer than MAX_FRAME is refused from its head, before its body is read.
        let mut head = [0x80u8, 3, 0, 1, 0, 0, 0, 0];
        head[5..8].copy_from_slice(&((MAX_FRAME + 1) as u32).to_be_bytes()[1..]);
        let err = read_frame(&mut &head[..], &mut HeaderDecoder::new()).await.unwrap_err();
        assert!(err.to_string().contains("frame of"), "{err}");
    }

    #[tokio::test]
    async fn truncated_and_foreign_input_is_an_error() {
        let mut dec = HeaderDecoder::new();
        // A SPDY/2 control frame.
        let wire = [0x80u8, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1];
        assert!(read_frame(&mut &wire[..], &mut dec).await.is_err());
        // A frame cut short.
        let wire = [0x80u8, 3, 0, 6, 0, 0, 0, 4, 0, 0];
        assert!(read_frame(&mut &wire[..], &mut dec).await.is_err());
        // A header block that is not zlib.
        let wire = [0x80u8, 3, 0, 2, 0, 0, 0, 8, 0, 0, 0, 1, 1, 2, 3, 4];
        assert!(read_frame(&mut &wire[..], &mut dec).await.is_err());
    }
}
