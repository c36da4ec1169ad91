//! SPDY/3.1 frames on arbitrary bytes (what a client on the kubelet port may send before or
//! after the upgrade): parsing frame after frame with one header decompressor, as a
//! connection does, must not panic or spin; every frame that parses must encode, and survive
//! a second encode and decode unchanged (the first may lowercase header names).
#![no_main]

use ferrolet::server::streaming::spdy::{decode_frame, encode, frame_len, Frame, HeaderDecoder, HeaderEncoder};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut dec = HeaderDecoder::new();
    let mut rest = data;
    while rest.len() >= 8 {
        let head: [u8; 8] = rest[..8].try_into().unwrap();
        let len = frame_len(&head).min(rest.len() - 8);
        let body = rest[8..8 + len].to_vec();
        rest = &rest[8 + len..];
        let Ok(frame) = decode_frame(head, body, &mut dec) else {
            // A connection ends at the first bad frame.
            return;
        };
        if matches!(frame, Frame::Unknown { .. }) {
            continue;
        }
        let once = round_trip(&frame);
        assert_eq!(round_trip(&once), once);
    }
});

fn round_trip(frame: &Frame) -> Frame {
    let wire = encode(frame, &mut HeaderEncoder::new()).expect("a parsed frame encodes");
    let head: [u8; 8] = wire[..8].try_into().unwrap();
    assert_eq!(frame_len(&head), wire.len() - 8);
    decode_frame(head, wire[8..].to_vec(), &mut HeaderDecoder::new()).expect("an encoded frame decodes")
}
