//! What the registry client does with a manifest or index a registry serves
//! (`ferrolet_runtime::registry::select_manifest`): decoding under the content type it came
//! with, the node's entry of an index, an image's config and layers with their sizes checked
//! against the layer limit. Byte 0 picks the content type, byte 1 the node's platform, byte 2
//! the layer limit (2^n bytes); the rest is the body. An error, never a panic; an error short
//! enough for a pod's status (it quotes the registry's words); an index entry small enough to
//! be fetched as a manifest; no layer over the limit; the same answer twice.
#![no_main]

use ferrolet_runtime::registry::{select_manifest, Platform, Selected};
use libfuzzer_sys::fuzz_target;

const CONTENT_TYPES: [&str; 6] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.v1+prettyjws",
    "",
];
const PLATFORMS: [&str; 4] = ["linux/amd64", "linux/arm64", "linux/arm/v7", "linux/386"];

fuzz_target!(|data: &[u8]| {
    let [ct, pf, lim, body @ ..] = data else { return };
    let content_type = CONTENT_TYPES[*ct as usize % CONTENT_TYPES.len()];
    let platform = Platform::parse(PLATFORMS[*pf as usize % PLATFORMS.len()]).expect("platform");
    let limit = 1u64 << (*lim % 64);
    let got = select_manifest(body, content_type, &platform, limit);
    match &got {
        Err(e) => assert!(e.len() <= 1024, "a {}-byte error: {e:.300}", e.len()),
        Ok(Selected::Entry(_, size)) => assert!(*size <= 4 << 20, "an index entry of {size} bytes"),
        Ok(Selected::Image { layers, .. }) => {
            for (d, size) in layers {
                assert!(*size <= limit, "layer {d} of {size} bytes passed a limit of {limit}");
            }
        }
    }
    assert_eq!(
        got,
        select_manifest(body, content_type, &platform, limit),
        "the same answer twice"
    );
});
