//! The CRI log reader on arbitrary bytes (a log file a container could have filled with
//! anything): `read_records` and `parse_line` must not panic, and what they return must be
//! consistent with the input.
#![no_main]

use ferrolet_runtime::crilog::{parse_line, read_records};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let records = read_records(data);
    let mut parsed = 0;
    for line in data.split(|&b| b == b'\n') {
        if let Some(l) = parse_line(line) {
            parsed += 1;
            assert!(!l.message.contains(&b'\n'));
            assert!(!l.timestamp.contains(' '));
        }
    }
    // Joining partial lines only ever merges records.
    assert!(records.len() <= parsed, "{} records from {parsed} lines", records.len());
    let total: usize = records.iter().map(|r| r.message.len()).sum();
    assert!(total <= data.len());
});
