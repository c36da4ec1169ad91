//! Unpacking one layer (a tar, plain, gzip or zstd) into a directory that overlayfs can use as a
//! lower layer: OCI whiteouts become overlay whiteouts (`.wh.x` -> a 0/0 character device `x`,
//! `.wh..wh..opq` -> `trusted.overlay.opaque=y` on the directory). Entries whose path or link
//! target leaves the layer root are rejected, and the uncompressed stream must hash to the
//! image config's diff_id.

use std::ffi::CString;
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

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

pub fn detect_compression(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    }
}

/// Wrap `r` in the decompressor its first bytes call for.
pub fn decompressed<'a, R: Read + 'a>(r: R) -> io::Result<Box<dyn Read + 'a>> {
    let mut br = BufReader::with_capacity(256 * 1024, r);
    let kind = detect_compression(br.fill_buf()?);
    Ok(match kind {
        Compression::None => Box::new(br),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(br)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(br)?),
    })
}

/// Unpack the layer blob at `blob` into `dest` (which must not exist yet). `label` names the
/// layer in errors. Returns the diff_id (sha256 of the uncompressed tar).
pub fn unpack_layer(blob: &Path, dest: &Path, label: &str) -> Result<Digest> {
    let file = fs::File::open(blob).with_context(|| format!("opening layer blob {}", p(blob)))?;
    let reader = decompressed(file).with_context(|| format!("reading layer {label}"))?;
    unpack_stream(reader, dest, label)
}

pub fn unpack_stream<R: Read>(reader: R, dest: &Path, label: &str) -> Result<Digest> {
    fs::create_dir(dest).with_context(|| format!("creating {}", p(dest)))?;
    let mut hashing = HashingReader::new(reader);
    let mut archive = tar::Archive::new(&mut hashing);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_unpack_xattrs(true);
    archive.set_overwrite(true);
    let root = fs::canonicalize(dest).with_context(|| format!("resolving {}", p(dest)))?;
    let read_err = |e: io::Error| Error::from(ferrolet_fsutil::Error::io(format!("reading layer {label}"), e));
    for entry in archive.entries().map_err(read_err)? {
        let mut entry = entry.map_err(read_err)?;
        let raw = entry.path().map_err(read_err)?.into_owned();
        let rel = clean_path(&raw).map_err(|reason| Error::LayerEntry {
            layer: label.to_string(),
            path: raw.display().to_string(),
            reason,
        })?;
        let entry_err = |reason: String| Error::LayerEntry {
            layer: label.to_string(),
            path: raw.display().to_string(),
            reason,
        };
        let Some(rel) = rel else { continue };
        if let Some(target) = entry.link_name().map_err(read_err)? {
            if entry.header().entry_type().is_hard_link() {
                clean_path(&target).map_err(|r| entry_err(format!("hard link target {}", r)))?;
            }
        }
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name == OPAQUE_MARKER {
            let dir = root.join(rel.parent().unwrap_or(Path::new("")));
            ensure_inside(&root, &dir).map_err(entry_err)?;
            fs::create_dir_all(&dir).with_context(|| format!("creating {}", p(&dir)))?;
            set_xattr(&dir, "trusted.overlay.opaque", b"y").with_context(|| format!("marking {} opaque", p(&dir)))?;
            continue;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            if hidden.is_empty() || hidden == "." || hidden == ".." {
                return Err(entry_err("is a malformed whiteout".to_string()));
            }
            let dir = root.join(rel.parent().unwrap_or(Path::new("")));
            ensure_inside(&root, &dir).map_err(entry_err)?;
            fs::create_dir_all(&dir).with_context(|| format!("creating {}", p(&dir)))?;
            let target = dir.join(hidden);
            remove_any(&target)?;
            mknod(&target, libc::S_IFCHR, 0).with_context(|| format!("creating whiteout {}", p(&target)))?;
            continue;
        }
        let kind = entry.header().entry_type();
        if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
            let target = root.join(&rel);
            let dir = target.parent().unwrap_or(&root).to_path_buf();
            fs::create_dir_all(&dir).with_context(|| format!("creating {}", p(&dir)))?;
            ensure_inside(&root, &dir).map_err(entry_err)?;
            remove_any(&target)?;
            let mode = entry.header().mode().unwrap_or(0o644) & 0o7777;
            let (fmt, dev) = if kind.is_fifo() {
                (libc::S_IFIFO, 0)
            } else {
                let major = entry.header().device_major().ok().flatten().unwrap_or(0);
                let minor = entry.header().device_minor().ok().flatten().unwrap_or(0);
                let fmt = if kind.is_character_special() {
                    libc::S_IFCHR
                } else {
                    libc::S_IFBLK
                };
                (fmt, libc::makedev(major, minor))
            };
            mknod(&target, fmt | mode, dev).with_context(|| format!("creating device {}", p(&target)))?;
            let uid = entry.header().uid().unwrap_or(0) as u32;
            let gid = entry.header().gid().unwrap_or(0) as u32;
            std::os::unix::fs::lchown(&target, Some(uid), Some(gid))
                .with_context(|| format!("chown {}", p(&target)))?;
            continue;
        }
        let unpacked = entry
            .unpack_in(&root)
            // tar wraps the cause: show all of it
            .map_err(|e| entry_err(format!("could not be unpacked: {}", ferrolet_fsutil::chain(&e))))?;
        if !unpacked {
            return Err(entry_err("escapes the layer root".to_string()));
        }
    }
    let (digest, _) = hashing.finish().map_err(read_err)?;
    Ok(digest)
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

/// `dir` (which exists) must resolve inside `root`, through whatever symlinks the layer made.
fn ensure_inside(root: &Path, dir: &Path) -> std::result::Result<(), String> {
    match fs::canonicalize(dir) {
        Ok(real) if real.starts_with(root) => Ok(()),
        Ok(real) => Err(format!(
            "escapes the layer root through a symlink (resolves to {})",
            real.display()
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot be resolved: {e}")),
    }
}

fn remove_any(path: &Path) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(fs::remove_dir_all(path).with_context(|| format!("removing {}", p(path)))?),
        Ok(_) => Ok(fs::remove_file(path).with_context(|| format!("removing {}", p(path)))?),
        Err(_) => Ok(()),
    }
}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

fn mknod(path: &Path, mode: libc::mode_t, dev: libc::dev_t) -> io::Result<()> {
    let c = cpath(path)?;
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::mknod(c.as_ptr(), mode, dev) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let c = cpath(path)?;
    let n = CString::new(name).expect("xattr name has no NUL");
    // SAFETY: valid C strings and a buffer of the given length.
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr() as *const libc::c_void,
            value.len(),
            0,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
        let err = unpack_stream(&data[..], &dir.path().join("l"), "sha256:test").unwrap_err();
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
        let d = unpack_stream(&data[..], &dir.path().join("l"), "t").unwrap();
        assert_eq!(d, Digest::of(&data));
        assert_eq!(fs::read(dir.path().join("l/a.txt")).unwrap(), b"hello");
    }
}
