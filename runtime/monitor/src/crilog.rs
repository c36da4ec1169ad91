//! The CRI container log format kubelet reads: one line per record,
//! `<RFC3339Nano timestamp> <stdout|stderr> <P|F> <message>`, where `P` marks a partial line
//! (split because it was longer than [`MAX_LINE`] bytes) and `F` the final piece. The writer
//! side runs in the container monitors (no async, no allocation per byte); the reader side
//! serves `ferrolet logs` and termination messages.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use chrono::{DateTime, SecondsFormat, Utc};

/// containerd's default max_container_log_line_size.
pub const MAX_LINE: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Go's RFC3339Nano: nanoseconds with trailing zeros dropped.
pub fn timestamp(t: DateTime<Utc>) -> String {
    let s = t.to_rfc3339_opts(SecondsFormat::Nanos, true);
    // "2024-01-01T00:00:00.120000000Z" -> "2024-01-01T00:00:00.12Z"
    match s.find('.') {
        Some(dot) => {
            let frac = &s[dot + 1..s.len() - 1];
            let trimmed = frac.trim_end_matches('0');
            if trimmed.is_empty() {
                format!("{}Z", &s[..dot])
            } else {
                format!("{}.{}Z", &s[..dot], trimmed)
            }
        }
        None => s,
    }
}

/// Splits a byte stream into lines of at most [`MAX_LINE`] bytes; the pieces of a longer line
/// come out as partial.
#[derive(Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
}

impl LineSplitter {
    /// Feed bytes; `emit(line, partial)` is called for each complete line or full chunk.
    pub fn push(&mut self, mut data: &[u8], emit: &mut dyn FnMut(&[u8], bool)) {
        while !data.is_empty() {
            match data.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    let line = &data[..i];
                    if self.buf.is_empty() {
                        Self::emit_split(line, emit);
                    } else {
                        self.buf.extend_from_slice(line);
                        let whole = std::mem::take(&mut self.buf);
                        Self::emit_split(&whole, emit);
                    }
                    data = &data[i + 1..];
                }
                None => {
                    self.buf.extend_from_slice(data);
                    data = &[];
                    while self.buf.len() >= MAX_LINE {
                        let rest = self.buf.split_off(MAX_LINE);
                        emit(&self.buf, true);
                        self.buf = rest;
                    }
                }
            }
        }
    }

    fn emit_split(line: &[u8], emit: &mut dyn FnMut(&[u8], bool)) {
        let mut rest = line;
        while rest.len() > MAX_LINE {
            emit(&rest[..MAX_LINE], true);
            rest = &rest[MAX_LINE..];
        }
        emit(rest, false);
    }

    /// End of stream: what is left without a newline is a partial line, as containerd writes
    /// it (its redirectLogs tags the unterminated last line `P`): `kubectl logs` and the
    /// FallbackToLogsOnError message show it without a newline the container never wrote.
    pub fn finish(&mut self, emit: &mut dyn FnMut(&[u8], bool)) {
        if !self.buf.is_empty() {
            let whole = std::mem::take(&mut self.buf);
            emit(&whole, true);
        }
    }
}

/// A [`LogWriter`] described for another program (crate::handoff).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LogParts {
    pub fd: Option<std::os::fd::RawFd>,
    pub path: PathBuf,
    pub size: u64,
    pub max_size: u64,
    pub max_files: u32,
}

/// Appends CRI lines to a log file and rotates it by size, keeping `max_files` files (the live
/// one included). Rotated files are named `<path>.<YYYYMMDD-HHMMSS>` as kubelet's log manager
/// names them; a file rotated in a second that already has one (or when the clock went back)
/// gets a sequence number, `<path>.<YYYYMMDD-HHMMSS>.<NNNNNN>`, so that every new name sorts
/// after every older one ([`rotated_files`]) and the newest is never the one deleted.
pub struct LogWriter {
    path: PathBuf,
    file: Option<File>,
    size: u64,
    max_size: u64,
    max_files: u32,
    line: Vec<u8>,
}

impl LogWriter {
    pub fn open(path: &Path, max_size: u64, max_files: u32) -> io::Result<LogWriter> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let file = open_log(path)?;
        let size = file.metadata()?.len();
        Ok(LogWriter {
            path: path.to_path_buf(),
            file: Some(file),
            size,
            max_size,
            max_files,
            line: Vec::with_capacity(256),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What [`from_parts`](LogWriter::from_parts) needs to go on writing in another program:
    /// the open file's descriptor (None while a failed rotation left none open) and the path
    /// and limits.
    pub fn parts(&self) -> LogParts {
        use std::os::fd::AsRawFd;
        LogParts {
            fd: self.file.as_ref().map(|f| f.as_raw_fd()),
            path: self.path.clone(),
            size: self.size,
            max_size: self.max_size,
            max_files: self.max_files,
        }
    }

    /// The writer [`parts`](LogWriter::parts) describes.
    ///
    /// # Safety
    /// `parts.fd`, if any, must be an open descriptor of the log file that nothing else in
    /// this process owns; the writer takes it over.
    pub unsafe fn from_parts(parts: LogParts) -> LogWriter {
        use std::os::fd::FromRawFd;
        LogWriter {
            path: parts.path,
            // SAFETY: the caller hands the descriptor over.
            file: parts.fd.map(|fd| unsafe { File::from_raw_fd(fd) }),
            size: parts.size,
            max_size: parts.max_size,
            max_files: parts.max_files,
            line: Vec::with_capacity(256),
        }
    }

    pub fn write(&mut self, now: DateTime<Utc>, stream: Stream, partial: bool, msg: &[u8]) -> io::Result<()> {
        self.line.clear();
        self.line.extend_from_slice(timestamp(now).as_bytes());
        self.line.push(b' ');
        self.line.extend_from_slice(stream.as_str().as_bytes());
        self.line.extend_from_slice(if partial { b" P " } else { b" F " });
        self.line.extend_from_slice(msg);
        self.line.push(b'\n');
        let f = match &mut self.file {
            Some(f) => f,
            // (rotation failed last time) reopen
            None => self.file.insert(open_log(&self.path)?),
        };
        f.write_all(&self.line)?;
        self.size += self.line.len() as u64;
        if self.max_size > 0 && self.size >= self.max_size {
            self.rotate(now)?;
        }
        Ok(())
    }

    /// Open the log path anew (it was renamed by a rotation outside): later lines go to a new
    /// file there. On failure the old file stays in use and the next write tries again.
    pub fn reopen(&mut self) -> io::Result<()> {
        let f = open_log(&self.path)?;
        self.size = f.metadata()?.len();
        self.file = Some(f);
        Ok(())
    }

    fn rotate(&mut self, now: DateTime<Utc>) -> io::Result<()> {
        self.file = None;
        let rotated = next_rotated_name(&self.path, now);
        fs::rename(&self.path, &rotated)?;
        let keep = self.max_files.saturating_sub(1) as usize;
        let mut old = rotated_files(&self.path);
        while old.len() > keep {
            let _ = fs::remove_file(old.remove(0));
        }
        self.file = Some(open_log(&self.path)?);
        self.size = 0;
        Ok(())
    }
}

fn open_log(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).mode(0o640).open(path)
}

/// The name for the file rotated now: `<path>.<stamp>`, or with a sequence number when that
/// would not sort after the newest rotated file (a second rotation in the same second, the
/// clock stepped back): then the newest one's stamp and sequence plus one.
fn next_rotated_name(path: &Path, now: DateTime<Utc>) -> PathBuf {
    let mut key = (now.format("%Y%m%d-%H%M%S").to_string(), 0u64);
    if let Some(newest) = rotated_files(path).last().and_then(|f| rotation_key(path, f)) {
        if key <= newest {
            key = (newest.0, newest.1 + 1);
        }
    }
    loop {
        let name = match key.1 {
            0 => format!("{}.{}", path.display(), key.0),
            n => format!("{}.{}.{n:06}", path.display(), key.0),
        };
        // Only a file rotation_key does not read could be in the way.
        if !Path::new(&name).exists() {
            return PathBuf::from(name);
        }
        key.1 += 1;
    }
}

/// Where a rotated file of `path` sorts: its stamp and sequence number (0 for none). `None`
/// for a name that is not `<path>.<YYYYMMDD-HHMMSS>[.<digits>]`.
fn rotation_key(path: &Path, rotated: &Path) -> Option<(String, u64)> {
    let name = path.file_name()?.to_str()?;
    let rest = rotated.file_name()?.to_str()?.strip_prefix(name)?.strip_prefix('.')?;
    let (stamp, seq) = match rest.split_once('.') {
        Some((stamp, seq)) => (stamp, seq),
        None => (rest, ""),
    };
    let b = stamp.as_bytes();
    let stamp_ok = b.len() == 15 && b[8] == b'-' && b.iter().enumerate().all(|(i, c)| i == 8 || c.is_ascii_digit());
    if !stamp_ok {
        return None;
    }
    let seq = match seq {
        "" if !rest.ends_with('.') => 0,
        s if !s.is_empty() && s.len() <= 19 && s.bytes().all(|c| c.is_ascii_digit()) => s.parse().ok()?,
        _ => return None,
    };
    Some((stamp.to_string(), seq))
}

/// Rotated files of `path` (`<path>.<YYYYMMDD-HHMMSS>` with an optional `.<sequence>`), oldest
/// first.
pub fn rotated_files(path: &Path) -> Vec<PathBuf> {
    let Some(dir) = path.parent() else {
        return Vec::new();
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let mut v: Vec<((String, u64), PathBuf)> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let f = path.with_file_name(e.file_name());
                    rotation_key(path, &f).map(|k| (k, f))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.into_iter().map(|(_, f)| f).collect()
}

/// One parsed CRI log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub timestamp: String,
    pub stream: Stream,
    pub partial: bool,
    pub message: Vec<u8>,
}

pub fn parse_line(line: &[u8]) -> Option<LogLine> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let mut parts = line.splitn(4, |&b| b == b' ');
    let ts = std::str::from_utf8(parts.next()?).ok()?.to_string();
    let stream = match parts.next()? {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        _ => return None,
    };
    let (partial, msg) = match parts.next()? {
        b"P" => (true, parts.next().unwrap_or(b"")),
        b"F" => (false, parts.next().unwrap_or(b"")),
        // Older runtimes wrote no tag: the rest is the message.
        other => {
            let mut m = other.to_vec();
            if let Some(rest) = parts.next() {
                m.push(b' ');
                m.extend_from_slice(rest);
            }
            return Some(LogLine {
                timestamp: ts,
                stream,
                partial: false,
                message: m,
            });
        }
    };
    Some(LogLine {
        timestamp: ts,
        stream,
        partial,
        message: msg.to_vec(),
    })
}

/// Whole log records (partial pieces joined), in file order.
pub fn read_records(data: &[u8]) -> Vec<LogLine> {
    let mut out: Vec<LogLine> = Vec::new();
    let mut pending: [Option<LogLine>; 2] = [None, None];
    for raw in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let Some(l) = parse_line(raw) else { continue };
        let slot = &mut pending[l.stream as usize];
        match slot {
            Some(acc) => {
                acc.message.extend_from_slice(&l.message);
                if !l.partial {
                    acc.partial = false;
                    out.extend(slot.take());
                }
            }
            None if l.partial => *slot = Some(l),
            None => out.push(l),
        }
    }
    out.extend(pending.into_iter().flatten());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn timestamp_trims_zeros_like_go() {
        let t = Utc.timestamp_opt(1_700_000_000, 120_000_000).unwrap();
        assert_eq!(timestamp(t), "2023-11-14T22:13:20.12Z");
        let t = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        assert_eq!(timestamp(t), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn splitter_lines_and_partials() {
        let mut s = LineSplitter::default();
        let mut got: Vec<(Vec<u8>, bool)> = Vec::new();
        let mut emit = |l: &[u8], p: bool| got.push((l.to_vec(), p));
        s.push(b"a\nb", &mut emit);
        s.push(b"c\n\nlast", &mut emit);
        s.finish(&mut emit);
        assert_eq!(
            got,
            vec![
                (b"a".to_vec(), false),
                (b"bc".to_vec(), false),
                (b"".to_vec(), false),
                (b"last".to_vec(), true)
            ]
        );
    }

    #[test]
    fn long_lines_split_at_16k() {
        let mut s = LineSplitter::default();
        let mut got: Vec<(usize, bool)> = Vec::new();
        let mut emit = |l: &[u8], p: bool| got.push((l.len(), p));
        let mut data = vec![b'x'; MAX_LINE * 2 + 10];
        data.push(b'\n');
        s.push(&data[..100], &mut emit);
        s.push(&data[100..], &mut emit);
        assert_eq!(got, vec![(MAX_LINE, true), (MAX_LINE, true), (10, false)]);
    }

    #[test]
    fn write_parse_and_rotate() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c/0.log");
        let mut w = LogWriter::open(&p, 200, 2).unwrap();
        let now = Utc::now();
        for i in 0..10 {
            w.write(now, Stream::Stdout, false, format!("line {i}").as_bytes())
                .unwrap();
        }
        w.write(now, Stream::Stderr, true, b"par").unwrap();
        w.write(now, Stream::Stderr, false, b"tial").unwrap();
        assert_eq!(rotated_files(&p).len(), 1, "max_files=2 keeps one rotated file");
        let recs = read_records(&fs::read(&p).unwrap());
        let last = recs.last().unwrap();
        assert_eq!(last.message, b"partial");
        assert_eq!(last.stream, Stream::Stderr);
    }

    /// Write numbered lines and check that what the files keep (rotated oldest first, then
    /// the live file) is an unbroken run ending with the newest line.
    fn check_no_gap(p: &Path, written: usize) {
        let mut seen = Vec::new();
        for f in rotated_files(p).iter().chain(std::iter::once(&p.to_path_buf())) {
            for r in read_records(&fs::read(f).unwrap()) {
                seen.push(String::from_utf8(r.message).unwrap().parse::<usize>().unwrap());
            }
        }
        assert_eq!(seen.last(), Some(&(written - 1)), "the newest line is kept");
        let first = seen[0];
        assert_eq!(
            seen,
            (first..written).collect::<Vec<_>>(),
            "files kept: {:?}",
            rotated_files(p)
        );
    }

    #[test]
    fn many_rotations_in_one_second_never_drop_the_newest() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("0.log");
        let mut w = LogWriter::open(&p, 120, 3).unwrap();
        let now = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        for i in 0..200 {
            w.write(now, Stream::Stdout, false, format!("{i}").as_bytes()).unwrap();
            check_no_gap(&p, i + 1);
        }
        assert_eq!(rotated_files(&p).len(), 2, "max_files=3 keeps two rotated files");
        // Names stay kubelet's `<log>.<YYYYMMDD-HHMMSS>`, with a sequence within a second.
        for f in rotated_files(&p) {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            assert!(name.starts_with("0.log.20231114-221320"), "{name}");
        }
    }

    #[test]
    fn rotation_order_survives_a_clock_going_back() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("0.log");
        let mut w = LogWriter::open(&p, 60, 4).unwrap();
        let t0 = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        let mut n = 0;
        for step in [0i64, 1, -3600, -3600, 2, -86400] {
            for _ in 0..7 {
                w.write(
                    t0 + chrono::Duration::seconds(step),
                    Stream::Stdout,
                    false,
                    format!("{n}").as_bytes(),
                )
                .unwrap();
                n += 1;
                check_no_gap(&p, n);
            }
        }
    }

    #[test]
    fn rotated_files_sort_by_age_and_ignore_others() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("0.log");
        for name in [
            "0.log.20231114-221321",
            "0.log.20231114-221320.000010",
            "0.log.20231114-221320.000002",
            "0.log.20231114-221320",
            "0.log.tmp",
            "0.log.20231114-221320.x",
            "10.log.20231114-221320",
            "0.log",
        ] {
            fs::write(d.path().join(name), "").unwrap();
        }
        let names: Vec<String> = rotated_files(&p)
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "0.log.20231114-221320",
                "0.log.20231114-221320.000002",
                "0.log.20231114-221320.000010",
                "0.log.20231114-221321"
            ]
        );
    }

    #[test]
    fn parse_rejects_garbage() {
        assert!(parse_line(b"nonsense").is_none());
        let l = parse_line(b"2023-01-01T00:00:00Z stdout F hello world").unwrap();
        assert_eq!(l.message, b"hello world");
    }
}
