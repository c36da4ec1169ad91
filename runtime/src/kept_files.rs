//! cgroup files kept open to be read again. The stats sampler reads about a dozen files of
//! every pod's and container's cgroups every housekeeping interval; opening and closing them
//! (a path walk through cgroupfs each time) was a third of an idle agent's CPU with 100 pods.
//! cgroupfs regenerates a file's content at every read from offset 0, so a kept descriptor
//! read with `pread(0)` gives what a fresh open would.
//!
//! A cgroup removed (or removed and made again under the same path) leaves its kept
//! descriptors dead: reading them fails (ENODEV), the descriptor is dropped and the path
//! opened afresh once, so an answer is never stale. Descriptors not read for [`IDLE`] are
//! closed (a removed cgroup's are not held for long: the kernel keeps a dying memory cgroup
//! while a file of it is open), and at most [`MAX`] are kept; past that, files are opened and
//! closed as before.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A read of fewer bytes than this is a whole cgroupfs file: half of seq_file's page, far more
/// than any one record of cgroupfs.
const SURELY_ALL: usize = 2048;

/// Descriptors not read for this long are closed.
pub const IDLE: Duration = Duration::from_secs(60);
/// At most this many descriptors are kept (a dozen per cgroup: room for 300 pods' cgroups
/// with a container each).
pub const MAX: usize = 8192;

#[derive(Debug, Default)]
pub struct KeptFiles {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// By the path's bytes: a `Path` hashes component by component, byte by byte, which was a
    /// tenth of a sampling round's time with 100 pods (a round looks up 1200 paths).
    files: HashMap<OsString, Kept>,
    last_sweep: Option<Instant>,
}

#[derive(Debug)]
struct Kept {
    file: File,
    used: Instant,
}

impl KeptFiles {
    /// The file's whole content as it is now; `None` when it cannot be opened or read.
    pub fn read(&self, path: &Path) -> Option<String> {
        let now = Instant::now();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.sweep(now);
        if let Some(k) = inner.files.get_mut(path.as_os_str()) {
            if let Some(s) = read_whole(&k.file) {
                k.used = now;
                return Some(s);
            }
            // Its cgroup is gone (or the file went bad): open the path afresh.
            inner.files.remove(path.as_os_str());
        }
        let file = File::open(path).ok()?;
        let s = read_whole(&file)?;
        if inner.files.len() < MAX {
            inner
                .files
                .insert(path.as_os_str().to_owned(), Kept { file, used: now });
        }
        Some(s)
    }

    /// How many descriptors are kept now.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).files.len()
    }
}

impl Inner {
    /// Close what was not read for [`IDLE`] (looked at once per [`IDLE`] at most).
    fn sweep(&mut self, now: Instant) {
        if self.last_sweep.is_some_and(|t| now.duration_since(t) < IDLE) {
            return;
        }
        self.last_sweep = Some(now);
        self.files.retain(|_, k| now.duration_since(k.used) < IDLE);
    }
}

/// Read from offset 0 to the end, whatever the descriptor's position. A small file is read
/// with one `pread`: cgroupfs (kernfs' seq_file) fills a page with as many records as fit, so
/// a read that returned less than [`SURELY_ALL`] bytes had nothing more to give (a stats
/// file is one record; `cgroup.procs` records are a few bytes), and the read that would
/// return nothing is not made: half the system calls of a sampling round. A longer short read
/// may have stopped at a page's end (`cgroup.procs` of many processes) and is read on.
fn read_whole(f: &File) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read_at(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len < SURELY_ALL {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seq_file of many records stops each read at a page's end: /proc/vmstat (4 KB and
    /// more of one-line records) comes back a little short of 4096 bytes from its first read
    /// though it goes on, which a "short read is the end" rule would cut.
    #[test]
    fn a_multi_page_seq_file_is_read_whole() {
        let f = File::open("/proc/vmstat").unwrap();
        let got = read_whole(&f).unwrap();
        let keys = |s: &str| {
            s.lines()
                .map(|l| l.split(' ').next().unwrap_or("").to_string())
                .collect::<Vec<_>>()
        };
        let want = std::fs::read_to_string("/proc/vmstat").unwrap();
        assert_eq!(keys(&got), keys(&want), "every counter, in order");
        assert!(got.ends_with('\n'));
    }

    #[test]
    fn a_kept_file_reads_as_it_is_now() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, "1\n").unwrap();
        let kept = KeptFiles::default();
        assert_eq!(kept.read(&p).as_deref(), Some("1\n"));
        assert_eq!(kept.kept(), 1);
        // Written in place (as the kernel regenerates a cgroup file): the kept descriptor
        // reads the new content, longer than one buffer too.
        let long = "x".repeat(10_000);
        std::fs::write(&p, &long).unwrap();
        assert_eq!(kept.read(&p).as_deref(), Some(long.as_str()));
        assert_eq!(kept.kept(), 1);
        // Past SURELY_ALL but short of the buffer, as seq_file stops at a page's end.
        let medium = "1234567\n".repeat(400);
        std::fs::write(&p, &medium).unwrap();
        assert_eq!(kept.read(&p).as_deref(), Some(medium.as_str()));
        assert_eq!(kept.read(&d.path().join("missing")), None);
        assert_eq!(kept.kept(), 1);
    }

    #[test]
    fn a_removed_cgroups_file_is_not_read_through_its_old_descriptor() {
        use crate::cgroups::{CgroupMode, Cgroups, NestedRoot};
        let cgroups = Cgroups::detect().expect("the cgroup hierarchies");
        let root = NestedRoot::create(&cgroups, &format!("kept-files-{}", std::process::id())).unwrap();
        let path = format!("{}/c", root.path());
        let (controller, file) = match cgroups.mode() {
            CgroupMode::V2 { .. } => ("memory", "memory.max"),
            CgroupMode::V1 { .. } => ("memory", "memory.limit_in_bytes"),
        };
        let make = |limit: &str| {
            for m in cgroups.mounts() {
                std::fs::create_dir_all(m.join(path.trim_start_matches('/'))).unwrap();
            }
            let dir = cgroups.dir_for(controller, &path).unwrap();
            std::fs::write(dir.join(file), limit).unwrap();
            dir.join(file)
        };
        let remove = || {
            for m in cgroups.mounts() {
                let _ = std::fs::remove_dir(m.join(path.trim_start_matches('/')));
            }
        };
        let result = std::panic::catch_unwind(|| {
            let kept = KeptFiles::default();
            let f = make("104857600");
            assert_eq!(kept.read(&f).as_deref().map(str::trim), Some("104857600"));
            // The kernel's current value through the kept descriptor.
            std::fs::write(&f, "209715200").unwrap();
            assert_eq!(kept.read(&f).as_deref().map(str::trim), Some("209715200"));
            // Removed: nothing (not the old value), and the descriptor is let go.
            remove();
            assert_eq!(kept.read(&f), None);
            assert_eq!(kept.kept(), 0);
            // Made again under the same path: the new cgroup's value.
            let f = make("314572800");
            assert_eq!(kept.read(&f).as_deref().map(str::trim), Some("314572800"));
        });
        remove();
        root.cleanup().unwrap();
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
    }
}
