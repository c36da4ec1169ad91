//! The layer unpacker on hostile tars: plain, gzip-compressed by the harness (so tar mutations
//! reach the unpacker through the gzip path) or raw blobs (the decompressors themselves).
//! Nothing may be written outside the layer directory, the size limit holds, and a layer that
//! unpacks hashes to the sha256 of its uncompressed stream.
#![no_main]

use std::io::Write;

use ferrolet_fuzz::{check_not_outside, Scratch};
use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::image::layer::{unpack_layer, unpack_stream, LayerLimits};
use libfuzzer_sys::fuzz_target;

/// Small, so a bomb is refused quickly.
const LIMITS: LayerLimits = LayerLimits {
    max_bytes: 32 << 20,
    max_ratio: 100,
    ratio_floor: 1 << 20,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let s = Scratch::new();
    let dest = s.path("layer");
    let res = match mode % 3 {
        0 => unpack_stream(body, &dest, "fuzz", LIMITS.max_bytes).map(|d| {
            assert_eq!(d, Digest::of(body), "the diff_id is the sha256 of the tar");
        }),
        1 => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(body).unwrap();
            let blob = s.path("blob");
            std::fs::write(&blob, gz.finish().unwrap()).unwrap();
            unpack_layer(&blob, &dest, "fuzz", &LIMITS).map(|d| {
                assert_eq!(d, Digest::of(body), "the diff_id is the sha256 of the tar");
            })
        }
        _ => {
            let blob = s.path("blob");
            std::fs::write(&blob, body).unwrap();
            unpack_layer(&blob, &dest, "fuzz", &LIMITS).map(|_| ())
        }
    };
    if std::env::var_os("FUZZ_DEBUG").is_some() {
        eprintln!("{:?}", res.as_ref().map_err(|e| ferrolet_fsutil::chain(e).to_string()));
    }
    if let Err(e) = &res {
        check_not_outside(e);
    }
    s.check_nothing_outside(&["layer", "blob"]);
});
