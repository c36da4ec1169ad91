//! A KubeletConfiguration file on arbitrary text: reading it onto the defaults, and the checks
//! across fields after, must answer with an error, never panic.
#![no_main]

use std::path::Path;

use ferrolet::config::{file::apply_text, Config};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut cfg = Config::default();
    if apply_text(&mut cfg, text, Path::new("/etc/ferrolet")).is_ok() {
        let _ = cfg.validate();
    }
});
