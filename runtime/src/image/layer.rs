//! Unpacking one layer (a tar, plain, gzip or zstd) into a directory that overlayfs can use as a
//! lower layer: OCI whiteouts become overlay whiteouts (`.wh.x` -> a 0/0 character device `x`,
//! `.wh..wh..opq` -> `trusted.overlay.opaque=y` on the directory). Every path is resolved
//! strictly beneath the layer root before anything is created ([`RootDir`]): entries whose path
//! or hard-link target leaves the root, directly or through a symlink of the layer, are
//! rejected. The uncompressed size is capped ([`LayerLimits`]) and the uncompressed stream must
//! hash to the image config's diff_id.

use std::cell::Cell;
use std::ffi::{CString, OsStr};
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use ferrolet_fsutil::at::{self, LinkFlags, Mode, OFlag, SFlag, TimeSpec};
use ferrolet_fsutil::RootDir;
use xattr::FileExt;

use crate::digest::{Digest, HashingReader};
use crate::error::{p, Context, Error, Result};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";

/// How a layer blob is compressed, told by its first bytes rather than its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

pub(crate) fn detect_compression(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    }
}

/// Wrap `r` in the decompressor its first bytes call for.
pub(crate) fn decompressed<'a, R: Read + 'a>(r: R) -> io::Result<Box<dyn Read + 'a>> {
    let mut br = BufReader::with_capacity(256 * 1024, r);
    let kind = detect_compression(br.fill_buf()?);
    Ok(match kind {
        Compression::None => Box::new(br),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(br)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(br)?),
    })
}

/// How far a layer may expand when unpacked. A compressed layer is a decompression bomb in
/// waiting: an 18 MB gzip of zeros is gigabytes of tar, written to disk before the diff_id
/// check could refuse it. The uncompressed stream, and the file content written from it
/// (sparse entries expand), may not exceed [`for_blob`](Self::for_blob) of the blob's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerLimits {
    /// Most bytes one layer may have uncompressed, whatever its blob size.
    pub max_bytes: u64,
    /// Most uncompressed bytes per byte of blob ...
    pub max_ratio: u64,
    /// ... once the layer is larger than this (small layers of headers and empty files
    /// compress very well).
    pub ratio_floor: u64,
}

impl Default for LayerLimits {
    /// 16 GiB in all; above 256 MiB, at most 100 times the blob (real layers compress 2 to
    /// 10 times; gzip's own limit is about 1000).
    fn default() -> Self {
        LayerLimits {
            max_bytes: 16 << 30,
            max_ratio: 100,
            ratio_floor: 256 << 20,
        }
    }
}

impl LayerLimits {
    /// The most bytes a layer whose blob has `blob_size` bytes may unpack to.
    pub(crate) fn for_blob(&self, blob_size: u64) -> u64 {
        self.for_archive(blob_size).min(self.max_bytes)
    }

    /// The most bytes a (compressed) image archive of `size` bytes may decompress to: the
    /// same ratio, without the per-layer cap (an archive holds many layers).
    pub(crate) fn for_archive(&self, size: u64) -> u64 {
        size.saturating_mul(self.max_ratio).max(self.ratio_floor)
    }
}

/// Unpack the layer blob at `blob` into `dest` (which must not exist yet). `label` names the
/// layer in errors. Returns the diff_id (sha256 of the uncompressed tar).
pub fn unpack_layer(blob: &Path, dest: &Path, label: &str, limits: &LayerLimits) -> Result<Digest> {
    let file = fs::File::open(blob).with_context(|| format!("opening layer blob {}", p(blob)))?;
    let size = file
        .metadata()
        .with_context(|| format!("reading layer blob {}", p(blob)))?
        .len();
    let reader = decompressed(file).with_context(|| format!("reading layer {label}"))?;
    unpack_stream(reader, dest, label, limits.for_blob(size))
}

/// Counts what is read through it and fails once more than `left` bytes came, setting
/// `exceeded` (the error itself may come back wrapped by the tar reader).
pub(crate) struct Limited<R> {
    pub inner: R,
    pub left: u64,
    pub exceeded: Rc<Cell<bool>>,
}

impl<R: Read> Read for Limited<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.exceeded.set(true);
            return Err(io::Error::other("layer too large"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Unpack an uncompressed layer tar into `dest` (which must not exist yet), refusing it once
/// the stream or the content written passes `max_bytes`. Every entry is created relative to
/// a directory fd resolved strictly beneath `dest` ([`RootDir`]): a symlink in the layer can
/// never lead a later entry outside, and nothing is created before its whole path was
/// resolved.
pub fn unpack_stream<R: Read>(reader: R, dest: &Path, label: &str, max_bytes: u64) -> Result<Digest> {
    fs::create_dir(dest).with_context(|| format!("creating {}", p(dest)))?;
    let root = RootDir::open(dest)?;
    let exceeded = Rc::new(Cell::new(false));
    let mut hashing = HashingReader::new(Limited {
        inner: reader,
        left: max_bytes,
        exceeded: exceeded.clone(),
    });
    let too_large = || {
        Error::invalid_image(
            "",
            format!("layer {label} is larger than {max_bytes} bytes uncompressed (the limit for its blob)"),
        )
    };
    let read_err = |e: io::Error| {
        if exceeded.get() {
            too_large()
        } else {
            Error::from(ferrolet_fsutil::Error::io(format!("reading layer {label}"), e))
        }
    };
    let mut written = 0u64;
    let mut archive = tar::Archive::new(&mut hashing);
    for entry in archive.entries().map_err(read_err)? {
        let mut entry = entry.map_err(read_err)?;
        let raw = entry.path().map_err(read_err)?.into_owned();
        let entry_err = |reason: String| Error::LayerEntry {
            layer: label.to_string(),
            path: raw.display().to_string(),
            reason,
        };
        let Some(rel) = clean_path(&raw).map_err(entry_err)? else {
            continue;
        };
        match unpack_entry(&root, &mut entry, &rel, &mut written, max_bytes) {
            Ok(()) => {}
            Err(Failure::Read(e)) => return Err(read_err(e)),
            Err(Failure::TooLarge) => return Err(too_large()),
            Err(Failure::Entry(reason)) => return Err(entry_err(reason)),
        }
    }
    let (digest, _) = hashing.finish().map_err(read_err)?;
    Ok(digest)
}

/// Why one entry could not be unpacked.
enum Failure {
    /// The archive could not be read.
    Read(io::Error),
    /// The content written passed the limit.
    TooLarge,
    /// The entry itself: what is wrong with it.
    Entry(String),
}

impl From<ferrolet_fsutil::Error> for Failure {
    fn from(e: ferrolet_fsutil::Error) -> Self {
        if e.is_escape() {
            Failure::Entry(format!("escapes the layer root: {}", ferrolet_fsutil::chain(&e)))
        } else {
            Failure::Entry(format!("could not be unpacked: {}", ferrolet_fsutil::chain(&e)))
        }
    }
}

/// An errno-carrying failure of a step on the entry (`what` says which step, and the entry's
/// path is named by the caller, so the step's own context is left out).
fn sys(what: &str, e: impl Into<Errno>) -> Failure {
    Failure::Entry(format!("could not be unpacked: {what}: {}", e.into().0))
}

/// The cause of a failed step, as an `io::Error` (the text layer errors have always had).
struct Errno(io::Error);

impl From<io::Error> for Errno {
    fn from(e: io::Error) -> Self {
        Errno(e)
    }
}

impl From<ferrolet_fsutil::Error> for Errno {
    fn from(e: ferrolet_fsutil::Error) -> Self {
        Errno(match e {
            ferrolet_fsutil::Error::Io { source, .. } => source,
            ferrolet_fsutil::Error::Sys { source, .. } => source.into(),
            e @ ferrolet_fsutil::Error::Json { .. } => io::Error::other(e),
        })
    }
}

/// Metadata applied to what an entry creates.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    xattrs: Vec<(CString, Vec<u8>)>,
}

fn meta<R: Read>(entry: &mut tar::Entry<R>) -> std::result::Result<Meta, Failure> {
    let h = entry.header();
    let bad = |what: &str| Failure::Entry(format!("has an invalid {what} in its header"));
    // Empty or unreadable numeric fields are common in hand-made archives: defaults, as tar
    // itself would extract them.
    let default_mode = if h.entry_type().is_dir() { 0o755 } else { 0o644 };
    let mode = h.mode().unwrap_or(default_mode) & 0o7777;
    let mut uid = h.uid().unwrap_or(0);
    let mut gid = h.gid().unwrap_or(0);
    let mtime = h.mtime().unwrap_or(0);
    let mut xattrs = Vec::new();
    if let Some(pax) = entry.pax_extensions().map_err(Failure::Read)? {
        for ext in pax {
            let ext = ext.map_err(|_| bad("pax extension"))?;
            let key = ext.key_bytes();
            let number = || {
                std::str::from_utf8(ext.value_bytes())
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
            };
            match key {
                b"uid" => uid = number().ok_or_else(|| bad("pax uid"))?,
                b"gid" => gid = number().ok_or_else(|| bad("pax gid"))?,
                _ => {
                    if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                        // overlayfs' own attributes are set by the whiteout conversion only:
                        // a layer must not redirect or mark its directories itself.
                        if !name.starts_with(b"trusted.overlay.") {
                            let name = CString::new(name).map_err(|_| bad("xattr name"))?;
                            xattrs.push((name, ext.value_bytes().to_vec()));
                        }
                    }
                }
            }
        }
    }
    let id = |v: u64, what: &str| u32::try_from(v).map_err(|_| bad(what));
    Ok(Meta {
        mode,
        uid: id(uid, "uid")?,
        gid: id(gid, "gid")?,
        mtime: i64::try_from(mtime).unwrap_or(i64::MAX),
        xattrs,
    })
}

fn unpack_entry<R: Read>(
    root: &RootDir,
    entry: &mut tar::Entry<R>,
    rel: &Path,
    written: &mut u64,
    max_bytes: u64,
) -> std::result::Result<(), Failure> {
    let name = rel.file_name().map(|n| n.as_bytes()).unwrap_or_default();
    let parent = rel.parent().unwrap_or(Path::new(""));
    if name == OPAQUE_MARKER.as_bytes() {
        let dir = root.create_dir_all(parent, 0o755)?;
        let dir = open_at(dir.as_fd(), OsStr::new("."), OFlag::O_RDONLY | OFlag::O_DIRECTORY)
            .map_err(|e| sys("opening", e))?;
        fs::File::from(dir)
            .set_xattr("trusted.overlay.opaque", b"y")
            .map_err(|e| sys("marking opaque", e))?;
        return Ok(());
    }
    if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(Failure::Entry("is a malformed whiteout".to_string()));
        }
        // `.wh..wh.*` other than the opaque marker are aufs bookkeeping: nothing to create.
        if hidden.starts_with(WHITEOUT_PREFIX.as_bytes()) {
            return Ok(());
        }
        let dir = root.create_dir_all(parent, 0o755)?;
        if hidden.contains(&0) {
            return Err(Failure::Entry("has a NUL in its name".into()));
        }
        let hidden = OsStr::from_bytes(hidden);
        remove_at(dir.as_fd(), hidden)?;
        at::mknod(dir.as_fd(), hidden, SFlag::S_IFCHR, Mode::empty(), 0)
            .map_err(|e| sys("creating the whiteout", e))?;
        return Ok(());
    }
    let kind = entry.header().entry_type();
    let m = meta(entry)?;
    let (dir, leaf) = root.create_parent(rel, 0o755)?;
    if leaf.as_bytes().contains(&0) {
        return Err(Failure::Entry("has a NUL in its name".into()));
    }
    let leaf = leaf.as_os_str();
    let dir = dir.as_fd();
    match kind {
        tar::EntryType::Directory => {
            let mode = Mode::from_bits_truncate(0o700);
            match at::mkdir(dir, leaf, mode) {
                Ok(()) => {}
                Err(e) if e.errno() == Some(libc::EEXIST) && is_dir_at(dir, leaf) => {}
                Err(e) if e.errno() == Some(libc::EEXIST) => {
                    remove_at(dir, leaf)?;
                    at::mkdir(dir, leaf, mode).map_err(|e| sys("creating the directory", e))?;
                }
                Err(e) => return Err(sys("creating the directory", e)),
            }
            let fd = open_at(dir, leaf, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW)
                .map_err(|e| sys("opening the directory", e))?;
            apply_fd(&fs::File::from(fd), &m)
        }
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
            remove_at(dir, leaf)?;
            let fd = open_at(
                dir,
                leaf,
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW,
            )
            .map_err(|e| sys("creating the file", e))?;
            let mut file = fs::File::from(fd);
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = entry.read(&mut buf).map_err(Failure::Read)?;
                if n == 0 {
                    break;
                }
                *written += n as u64;
                if *written > max_bytes {
                    return Err(Failure::TooLarge);
                }
                file.write_all(&buf[..n]).map_err(|e| sys("writing", e))?;
            }
            apply_fd(&file, &m)
        }
        tar::EntryType::Symlink => {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| Failure::Entry("is a symlink without a target".into()))?;
            if target.contains(&0) {
                return Err(Failure::Entry("has a NUL in its target".into()));
            }
            remove_at(dir, leaf)?;
            at::symlink(OsStr::from_bytes(&target), dir, leaf).map_err(|e| sys("creating the symlink", e))?;
            apply_at(dir, leaf, &m, false)
        }
        tar::EntryType::Link => {
            let target = entry
                .link_name()
                .map_err(Failure::Read)?
                .ok_or_else(|| Failure::Entry("is a hard link without a target".into()))?;
            let target = clean_path(&target)
                .map_err(|r| Failure::Entry(format!("hard link target {r}")))?
                .ok_or_else(|| Failure::Entry("is a hard link to the layer root".into()))?;
            // The target's own last component is not followed: a link to a symlink links
            // the symlink, as `ln` does.
            let src = root.open_at(&target, libc::O_PATH | libc::O_NOFOLLOW)?;
            remove_at(dir, leaf)?;
            link_fd(src.as_fd(), dir, leaf).map_err(|e| sys("creating the hard link", e))
        }
        tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
            let (fmt, dev) = if kind == tar::EntryType::Fifo {
                (SFlag::S_IFIFO, 0)
            } else {
                let h = entry.header();
                let major = h.device_major().ok().flatten().unwrap_or(0);
                let minor = h.device_minor().ok().flatten().unwrap_or(0);
                let fmt = if kind == tar::EntryType::Char {
                    SFlag::S_IFCHR
                } else {
                    SFlag::S_IFBLK
                };
                (fmt, libc::makedev(major, minor))
            };
            remove_at(dir, leaf)?;
            at::mknod(dir, leaf, fmt, Mode::from_bits_truncate(m.mode & 0o777), dev)
                .map_err(|e| sys("creating the device", e))?;
            apply_at(dir, leaf, &m, true)
        }
        // pax and GNU long-name headers are read by the tar crate; other types (global pax
        // headers, volume labels) create nothing.
        _ => Ok(()),
    }
}

/// Open (or, with `O_CREAT`, create with mode 0600) `name` in `dir`.
fn open_at(dir: BorrowedFd<'_>, name: &OsStr, flags: OFlag) -> ferrolet_fsutil::Result<std::os::fd::OwnedFd> {
    at::open(dir, name, flags, Mode::from_bits_truncate(0o600))
}

fn is_dir_at(dir: BorrowedFd<'_>, name: &OsStr) -> bool {
    at::stat_nofollow(dir, name).is_ok_and(|st| at::is_type(st.st_mode, SFlag::S_IFDIR))
}

/// Remove whatever `name` in `dir` is (a later entry replaces an earlier one).
fn remove_at(dir: BorrowedFd<'_>, name: &OsStr) -> std::result::Result<(), Failure> {
    ferrolet_fsutil::remove_all_at(dir, name)
        .map(|_| ())
        .map_err(|e| sys("replacing what was there", e))
}

fn link_fd(src: BorrowedFd<'_>, dir: BorrowedFd<'_>, name: &OsStr) -> ferrolet_fsutil::Result<()> {
    let e = match at::link(src, "", dir, name, LinkFlags::AT_EMPTY_PATH) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the fd's /proc link works without it.
    if !matches!(e.errno(), Some(libc::EPERM) | Some(libc::ENOENT)) {
        return Err(e);
    }
    // The /proc path is absolute: linkat ignores the directory fd given with it.
    let proc = PathBuf::from(format!("/proc/self/fd/{}", src.as_raw_fd()));
    at::link(src, &proc, dir, name, LinkFlags::AT_SYMLINK_FOLLOW).map_err(|_| e)
}

fn time(mtime: i64) -> TimeSpec {
    TimeSpec::new(mtime as _, 0)
}

/// Owner, mode, xattrs and mtime of a file or directory open as `file`. The owner goes first:
/// chown clears setuid and setgid bits.
fn apply_fd(file: &fs::File, m: &Meta) -> std::result::Result<(), Failure> {
    let fd = file.as_fd();
    at::fchown(fd, m.uid, m.gid).map_err(|e| sys("setting the owner", e))?;
    at::fchmod(fd, Mode::from_bits_truncate(m.mode)).map_err(|e| sys("setting the mode", e))?;
    for (name, value) in &m.xattrs {
        match file.set_xattr(OsStr::from_bytes(name.to_bytes()), value) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
            Err(e) => return Err(sys(&format!("setting xattr {}", name.to_string_lossy()), e)),
        }
    }
    at::futimens(fd, time(m.mtime), time(m.mtime)).map_err(|e| sys("setting the mtime", e))
}

/// Owner, mtime (and mode, for device nodes: mknod's mode is cut by the umask) of `name` in
/// `dir`, without following it.
fn apply_at(dir: BorrowedFd<'_>, name: &OsStr, m: &Meta, mode: bool) -> std::result::Result<(), Failure> {
    at::chown_nofollow(dir, name, m.uid, m.gid).map_err(|e| sys("setting the owner", e))?;
    if mode {
        // The node was just made by us in a directory resolved beneath the root, and is not
        // a symlink: fchmodat's following does not matter.
        at::chmod(dir, name, Mode::from_bits_truncate(m.mode)).map_err(|e| sys("setting the mode", e))?;
    }
    at::utimens_nofollow(dir, name, time(m.mtime), time(m.mtime)).map_err(|e| sys("setting the mtime", e))
}

/// Normalize an entry path: strip leading `/` and `./`, reject `..`. `Ok(None)` for the root.
fn clean_path(path: &Path) -> std::result::Result<Option<PathBuf>, String> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => return Err("escapes the layer root".to_string()),
            Component::Normal(n) => out.push(n),
        }
    }
    Ok(if out.as_os_str().is_empty() { None } else { Some(out) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_with(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(1);
            h.set_entry_type(tar::EntryType::Regular);
            // set_path refuses "..": write the raw name like a hostile archive would.
            let raw = &mut h.as_old_mut().name;
            raw[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// One entry of a crafted layer.
    enum E<'a> {
        File(&'a str, &'a [u8]),
        Dir(&'a str),
        Symlink(&'a str, &'a str),
        Hardlink(&'a str, &'a str),
        CharDev(&'a str, u32, u32),
    }

    /// A tar of `entries` with raw names (set_path would refuse some hostile ones).
    fn crafted(entries: &[E]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for e in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(1);
            h.set_size(0);
            let (name, data): (&str, &[u8]) = match e {
                E::File(n, d) => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(d.len() as u64);
                    (n, d)
                }
                E::Dir(n) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    (n, b"")
                }
                E::Symlink(n, t) | E::Hardlink(n, t) => {
                    h.set_entry_type(if matches!(e, E::Symlink(..)) {
                        tar::EntryType::Symlink
                    } else {
                        tar::EntryType::Link
                    });
                    h.as_old_mut().linkname[..t.len()].copy_from_slice(t.as_bytes());
                    (n, b"")
                }
                E::CharDev(n, major, minor) => {
                    h.set_entry_type(tar::EntryType::Char);
                    h.set_device_major(*major).unwrap();
                    h.set_device_minor(*minor).unwrap();
                    (n, b"")
                }
            };
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            b.append(&h, data).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// A temp dir with an empty `victim/` standing in for a host directory; returns it and
    /// the absolute path of the victim.
    fn victim() -> (tempfile::TempDir, String) {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir(t.path().join("victim")).unwrap();
        let v = t.path().join("victim").display().to_string();
        (t, v)
    }

    /// Everything under `dir`, relative, sorted.
    fn tree(dir: &Path) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in fs::read_dir(dir).unwrap().flatten() {
                let path = e.path();
                out.push(path.strip_prefix(base).unwrap().display().to_string());
                if e.file_type().unwrap().is_dir() {
                    walk(base, &path, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(dir, dir, &mut out);
        out.sort();
        out
    }

    /// Unpack `entries` into `<tmp>/layer`; the unpack must fail naming `bad`, and nothing
    /// may appear in the victim directory or beside the layer.
    fn refused(t: &tempfile::TempDir, victim: &str, entries: &[E], bad: &str) {
        let data = crafted(entries);
        let err = unpack_stream(&data[..], &t.path().join("layer"), "sha256:test", 1 << 30)
            .expect_err("a layer writing through an escaping symlink must be refused");
        let msg = ferrolet_fsutil::chain(&err).to_string();
        assert!(msg.contains(bad), "the error should name {bad}: {msg}");
        assert_eq!(tree(Path::new(victim)), Vec::<String>::new(), "written outside: {msg}");
        let mut beside = tree(t.path());
        beside.retain(|p| !p.starts_with("layer") && !p.starts_with("victim"));
        assert_eq!(beside, Vec::<String>::new());
    }

    #[test]
    fn whiteout_under_an_escaping_symlink_creates_nothing_outside() {
        let (t, v) = victim();
        refused(
            &t,
            &v,
            &[E::Symlink("a", &v), E::File("a/wdir/.wh.victim", b"")],
            "a/wdir/.wh.victim",
        );
        // A relative symlink climbing out is no better.
        let (t, v) = victim();
        refused(
            &t,
            &v,
            &[
                E::Dir("d"),
                E::Symlink("d/up", "../../victim"),
                E::File("d/up/w/.wh.x", b""),
            ],
            "d/up/w/.wh.x",
        );
    }

    #[test]
    fn opaque_marker_under_an_escaping_symlink_creates_nothing_outside() {
        let (t, v) = victim();
        refused(
            &t,
            &v,
            &[E::Symlink("a", &v), E::File("a/odir/.wh..wh..opq", b"")],
            "a/odir/.wh..wh..opq",
        );
        let (t, v) = victim();
        refused(
            &t,
            &v,
            &[E::Symlink("a", &v), E::File("a/.wh..wh..opq", b"")],
            "a/.wh..wh..opq",
        );
    }

    #[test]
    fn device_under_an_escaping_symlink_creates_nothing_outside() {
        let (t, v) = victim();
        refused(
            &t,
            &v,
            &[E::Symlink("a", &v), E::CharDev("a/ddir/null", 1, 3)],
            "a/ddir/null",
        );
        let (t, v) = victim();
        refused(&t, &v, &[E::Symlink("a", &v), E::CharDev("a/null", 1, 3)], "a/null");
    }

    #[test]
    fn files_dirs_and_links_under_an_escaping_symlink_create_nothing_outside() {
        let (t, v) = victim();
        refused(
            &t,
            &v,
            &[E::Symlink("a", &v), E::File("a/fdir/file", b"x")],
            "a/fdir/file",
        );
        let (t, v) = victim();
        refused(&t, &v, &[E::Symlink("a", &v), E::Dir("a/newdir")], "a/newdir");
        let (t, v) = victim();
        refused(&t, &v, &[E::Symlink("a", &v), E::Symlink("a/l", "x")], "a/l");
        // A hard link to a host file through the symlink would put the host file in the layer.
        let (t, v) = victim();
        fs::write(t.path().join("secret"), "host").unwrap();
        let secret_dir = t.path().display().to_string();
        let data = crafted(&[E::Symlink("s", &secret_dir), E::Hardlink("h", "s/secret")]);
        let err = unpack_stream(&data[..], &t.path().join("layer"), "sha256:test", 1 << 30).unwrap_err();
        assert!(err.to_string().contains("\"h\""), "{err}");
        assert!(!t.path().join("layer/h").exists());
        assert_eq!(tree(Path::new(&v)), Vec::<String>::new());
    }

    #[test]
    fn symlinks_inside_the_layer_still_work() {
        let t = tempfile::tempdir().unwrap();
        let data = crafted(&[
            E::Dir("usr/lib"),
            E::Symlink("lib", "usr/lib"),
            E::Symlink("etc/localtime", "/usr/share/zoneinfo/UTC"),
            E::File("usr/lib/x", b"1"),
            E::Hardlink("usr/lib/y", "usr/lib/x"),
            E::File("dir/.wh.gone", b""),
            E::File("opq/.wh..wh..opq", b""),
            E::CharDev("dev/null", 1, 3),
        ]);
        let l = t.path().join("layer");
        unpack_stream(&data[..], &l, "t", 1 << 30).unwrap();
        assert_eq!(fs::read_link(l.join("lib")).unwrap(), Path::new("usr/lib"));
        assert_eq!(
            fs::read_link(l.join("etc/localtime")).unwrap(),
            Path::new("/usr/share/zoneinfo/UTC")
        );
        assert_eq!(fs::read(l.join("usr/lib/y")).unwrap(), b"1");
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let w = fs::symlink_metadata(l.join("dir/gone")).unwrap();
        assert!(w.file_type().is_char_device() && w.rdev() == 0);
        let d = fs::symlink_metadata(l.join("dev/null")).unwrap();
        assert!(d.file_type().is_char_device() && d.rdev() == libc::makedev(1, 3));
        assert_eq!(d.mode() & 0o7777, 0o644);
    }

    #[test]
    fn a_decompression_bomb_is_refused_at_the_limit() {
        // 16 MiB of zeros in one file gzip to about 16 KiB.
        let t = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(16 << 20);
        h.set_mode(0o644);
        h.set_path("zeros").unwrap();
        h.set_cksum();
        b.append(&h, io::repeat(0).take(16 << 20)).unwrap();
        let tar = b.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        let blob = t.path().join("blob");
        fs::write(&blob, gz.finish().unwrap()).unwrap();
        let blob_size = fs::metadata(&blob).unwrap().len();
        assert!(blob_size < 1 << 20, "{blob_size}");
        let limits = LayerLimits {
            max_bytes: 1 << 30,
            max_ratio: 100,
            ratio_floor: 1 << 20,
        };
        assert_eq!(limits.for_blob(blob_size), blob_size * 100);
        let err = unpack_layer(&blob, &t.path().join("l"), "sha256:bomb", &limits).unwrap_err();
        assert!(err.to_string().contains("is larger than"), "{err}");
        // It stopped at the limit: the file holds no more than that.
        let len = fs::metadata(t.path().join("l/zeros")).map(|m| m.len()).unwrap_or(0);
        assert!(len <= limits.for_blob(blob_size), "{len}");
        // The same layer within its limit unpacks.
        let roomy = LayerLimits {
            max_ratio: 10_000,
            ..limits
        };
        let d = unpack_layer(&blob, &t.path().join("l2"), "sha256:bomb", &roomy).unwrap();
        assert_eq!(d, Digest::of(&tar));
        // The absolute cap holds whatever the ratio.
        let capped = LayerLimits {
            max_bytes: 1 << 20,
            ..roomy
        };
        assert_eq!(capped.for_blob(blob_size), 1 << 20);
        assert!(unpack_layer(&blob, &t.path().join("l3"), "sha256:bomb", &capped).is_err());
        // Nor can bytes after the end of the archive (hashed, not written) pass it.
        let mut padded = crafted(&[E::File("a", b"x")]);
        padded.extend(std::iter::repeat_n(0u8, 2 << 20));
        let err = unpack_stream(&padded[..], &t.path().join("l4"), "t", 1 << 20).unwrap_err();
        assert!(err.to_string().contains("is larger than"), "{err}");
    }

    #[test]
    fn owner_mode_setuid_and_xattrs_are_kept_but_not_overlay_ones() {
        let t = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        b.append_pax_extensions([
            ("SCHILY.xattr.user.note", &b"kept"[..]),
            ("SCHILY.xattr.trusted.overlay.redirect", &b"/etc"[..]),
        ])
        .unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(1);
        h.set_mode(0o4755);
        h.set_uid(1000);
        h.set_gid(1001);
        h.set_mtime(12345);
        h.set_path("bin/su").unwrap();
        h.set_cksum();
        b.append(&h, &b"x"[..]).unwrap();
        // A later entry of the same name replaces the earlier one.
        let data = b.into_inner().unwrap();
        let l = t.path().join("l");
        unpack_stream(&data[..], &l, "t", 1 << 30).unwrap();
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(l.join("bin/su")).unwrap();
        assert_eq!(
            (m.mode() & 0o7777, m.uid(), m.gid(), m.mtime()),
            (0o4755, 1000, 1001, 12345)
        );
        let get = |name: &str| xattr::get(l.join("bin/su"), name).unwrap();
        assert_eq!(get("user.note"), Some(b"kept".to_vec()));
        assert_eq!(get("trusted.overlay.redirect"), None);
    }

    #[test]
    fn later_entries_replace_earlier_ones() {
        let t = tempfile::tempdir().unwrap();
        let data = crafted(&[
            E::Dir("x"),
            E::File("x/inner", b"1"),
            E::File("x", b"now a file"),
            E::File("y", b"old"),
            E::Symlink("y", "x"),
        ]);
        let l = t.path().join("l");
        unpack_stream(&data[..], &l, "t", 1 << 30).unwrap();
        assert_eq!(fs::read(l.join("x")).unwrap(), b"now a file");
        assert_eq!(fs::read_link(l.join("y")).unwrap(), Path::new("x"));
    }

    #[test]
    fn clean_path_rules() {
        assert_eq!(clean_path(Path::new("./a/b")).unwrap(), Some("a/b".into()));
        assert_eq!(clean_path(Path::new("/etc/x")).unwrap(), Some("etc/x".into()));
        assert_eq!(clean_path(Path::new("./")).unwrap(), None);
        assert!(clean_path(Path::new("a/../../x")).is_err());
    }

    #[test]
    fn rejects_parent_paths_with_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let data = tar_with(&[("ok", b"1"), ("../evil", b"2")]);
        let err = unpack_stream(&data[..], &dir.path().join("l"), "sha256:test", 1 << 30).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("../evil") && msg.contains("escapes"), "{msg}");
        assert!(!dir.path().join("evil").exists());
    }

    #[test]
    fn detects_compression() {
        assert_eq!(detect_compression(&[0x1f, 0x8b, 8]), Compression::Gzip);
        assert_eq!(detect_compression(&[0x28, 0xb5, 0x2f, 0xfd]), Compression::Zstd);
        assert_eq!(detect_compression(b"ustar"), Compression::None);
    }

    #[test]
    fn diff_id_is_hash_of_uncompressed_tar() {
        let dir = tempfile::tempdir().unwrap();
        let data = tar_with(&[("a.txt", b"hello")]);
        let d = unpack_stream(&data[..], &dir.path().join("l"), "t", 1 << 30).unwrap();
        assert_eq!(d, Digest::of(&data));
        assert_eq!(fs::read(dir.path().join("l/a.txt")).unwrap(), b"hello");
    }
}
