//! A container's output through the monitor's path: the line splitter (fed in chunks), the
//! CRI log writer with size rotation, and the reader. What the reader gets back from the kept
//! files must be the container's lines, in order, with nothing lost but whole old files, and
//! the newest line always kept.
#![no_main]

use chrono::TimeZone;
use ferrolet_runtime::crilog::{read_records, rotated_files, LineSplitter, LogWriter, Stream, MAX_LINE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [chunk, repeat, size, files, ref body @ ..] = *data else {
        return;
    };
    // Lines longer than MAX_LINE (16 KiB) from short inputs: repeat the body.
    let mut input = Vec::new();
    for _ in 0..(1 + repeat as usize % 40) {
        input.extend_from_slice(body);
    }
    let chunk = 1 + chunk as usize * 37;
    let max_size = 64 + size as u64 * 97;
    let max_files = 2 + files as u32 % 4;

    // The splitter: every piece at most MAX_LINE, and the pieces are the input again.
    let mut pieces: Vec<(Vec<u8>, bool)> = Vec::new();
    let mut split = LineSplitter::default();
    for c in input.chunks(chunk) {
        split.push(c, &mut |l: &[u8], p: bool| pieces.push((l.to_vec(), p)));
    }
    split.finish(&mut |l: &[u8], p: bool| pieces.push((l.to_vec(), p)));
    let mut again = Vec::new();
    for (l, partial) in &pieces {
        assert!(l.len() <= MAX_LINE, "a piece of {} bytes", l.len());
        again.extend_from_slice(l);
        if !partial {
            again.push(b'\n');
        }
    }
    // An unterminated last line stays unterminated (a partial piece, as containerd tags it).
    assert_eq!(again, input, "the splitter lost or changed bytes");

    // The writer, rotating many times a second; the reader over the kept files.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("0.log");
    let mut w = LogWriter::open(&path, max_size, max_files).unwrap();
    let now = chrono::Utc.timestamp_opt(1_700_000_000, 0).unwrap();
    for (l, partial) in &pieces {
        w.write(now, Stream::Stdout, *partial, l).unwrap();
    }
    let mut kept = Vec::new();
    let rotated = rotated_files(&path);
    assert!(
        rotated.len() < max_files as usize,
        "{} rotated files kept",
        rotated.len()
    );
    for f in rotated.iter().chain(std::iter::once(&path)) {
        kept.extend(std::fs::read(f).unwrap());
    }
    let got: Vec<Vec<u8>> = read_records(&kept).into_iter().map(|r| r.message).collect();
    // Whole lines as the container wrote them; rotation may cut the oldest piece of a line.
    let lines: Vec<Vec<u8>> = {
        let mut v = Vec::new();
        let mut cur = Vec::new();
        for (l, partial) in &pieces {
            cur.extend_from_slice(l);
            if !partial {
                v.push(std::mem::take(&mut cur));
            }
        }
        // The unterminated end of the output is a line too (its pieces are all partial).
        if !cur.is_empty() {
            v.push(cur);
        }
        v
    };
    // Rotation keeps exactly max_files - 1 rotated files once it has rotated that often (a
    // file is rotated after the write that takes it to max_size; each record line is the
    // piece plus a 20-byte timestamp, " stdout", " F " and a newline).
    let mut rotations = 0usize;
    let mut size = 0u64;
    for (l, _) in &pieces {
        size += l.len() as u64 + 31;
        if size >= max_size {
            rotations += 1;
            size = 0;
        }
    }
    assert_eq!(
        rotated.len(),
        rotations.min(max_files as usize - 1),
        "rotated files kept"
    );
    // The newest line is kept: whole, or, when that one line is larger than all kept files
    // together, its newest part.
    if let Some(last) = lines.last() {
        let g = got.last().expect("the newest line is kept");
        if got.len() > 1 {
            assert_eq!(g, last, "the newest line is kept");
        } else {
            assert!(last.ends_with(g), "the newest line's end is kept");
        }
    }
    // Everything but the first record read is a whole line, and they are the newest lines
    // in order.
    assert!(got.len() <= lines.len());
    let tail = &lines[lines.len() - got.len()..];
    for (i, (g, l)) in got.iter().zip(tail).enumerate() {
        if i == 0 {
            assert!(l.ends_with(g), "the oldest kept record is the end of a line");
        } else {
            assert_eq!(g, l, "record {i} of {}", got.len());
        }
    }
});
