//! Filesystem numbers: what a filesystem holds (statvfs, cheap) and what a directory tree uses
//! (a `du` walk, slow). The walks run on their own period (kubelet's fsResourceAnalyzer,
//! `volumeStatsAggPeriod`, 1m by default) and their results are kept here for the samples.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::summary::{FsStats, Time};

/// A filesystem's size, free space and inodes (`statvfs` of a path on it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsInfo {
    pub capacity: u64,
    pub available: u64,
    /// Bytes used on the whole filesystem (capacity less free blocks).
    pub usage: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

/// statvfs of `path`; `None` when it cannot be read.
pub fn fs_info(path: &Path) -> Option<FsInfo> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    let frag = s.fragment_size();
    Some(FsInfo {
        capacity: (s.blocks() as u64).saturating_mul(frag),
        available: (s.blocks_available() as u64).saturating_mul(frag),
        usage: (s.blocks() as u64)
            .saturating_sub(s.blocks_free() as u64)
            .saturating_mul(frag),
        inodes: s.files() as u64,
        inodes_free: s.files_free() as u64,
    })
}

/// What a directory tree uses: bytes allocated (st_blocks, each inode once) and inodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirUsage {
    pub bytes: u64,
    pub inodes: u64,
}

/// Walk `root` without following symlinks or leaving its filesystem (as `du -x`, like
/// kubelet's volume metrics do); a missing root is `None`. Entries that vanish meanwhile are
/// skipped.
pub fn dir_usage(root: &Path) -> Option<DirUsage> {
    let meta = std::fs::symlink_metadata(root).ok()?;
    let dev = meta.dev();
    let mut seen = HashSet::new();
    let mut u = DirUsage::default();
    let mut stack = vec![(root.to_path_buf(), meta)];
    while let Some((path, m)) = stack.pop() {
        if m.nlink() > 1 && !m.is_dir() && !seen.insert((m.dev(), m.ino())) {
            continue;
        }
        u.bytes = u.bytes.saturating_add(m.blocks().saturating_mul(512));
        u.inodes += 1;
        if !m.is_dir() {
            continue;
        }
        let Ok(rd) = std::fs::read_dir(&path) else {
            continue;
        };
        for e in rd.flatten() {
            if let Ok(cm) = e.metadata() {
                if cm.dev() == dev {
                    stack.push((e.path(), cm));
                }
            }
        }
    }
    Some(u)
}

/// The results of the last walks, by directory, with when each was taken.
#[derive(Debug, Default)]
pub struct UsageCache {
    by_dir: HashMap<PathBuf, (DirUsage, Time)>,
}

impl UsageCache {
    pub fn get(&self, dir: &Path) -> Option<(DirUsage, Time)> {
        self.by_dir.get(dir).copied()
    }

    /// Replace everything with a new round of walks.
    pub fn replace(&mut self, by_dir: HashMap<PathBuf, (DirUsage, Time)>) {
        self.by_dir = by_dir;
    }
}

/// FsStats of a directory tree on a filesystem: the tree's own usage (from the last walk) and
/// the filesystem's capacity, free space and inodes (kubelet reports both in one struct).
pub fn tree_stats(usage: Option<(DirUsage, Time)>, fs: Option<FsInfo>, now: Time) -> Option<FsStats> {
    if usage.is_none() && fs.is_none() {
        return None;
    }
    let mut st = fs_stats(fs, now);
    if let Some((u, at)) = usage {
        st.time = at;
        st.used_bytes = Some(u.bytes);
        st.inodes_used = Some(u.inodes);
    } else {
        st.used_bytes = None;
        st.inodes_used = None;
    }
    Some(st)
}

/// FsStats of a whole filesystem (nodefs, imageFs).
pub fn fs_stats(fs: Option<FsInfo>, now: Time) -> FsStats {
    match fs {
        Some(f) => FsStats {
            time: now,
            available_bytes: Some(f.available),
            capacity_bytes: Some(f.capacity),
            used_bytes: Some(f.usage),
            inodes_free: Some(f.inodes_free),
            inodes: Some(f.inodes),
            inodes_used: Some(f.inodes.saturating_sub(f.inodes_free)),
        },
        None => FsStats {
            time: now,
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_count_blocks_and_inodes_once() {
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("a");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("f"), vec![1u8; 1 << 20]).unwrap();
        std::fs::hard_link(sub.join("f"), d.path().join("f2")).unwrap();
        std::os::unix::fs::symlink("/etc", d.path().join("l")).unwrap();
        let u = dir_usage(d.path()).unwrap();
        // root, a, f (once for both links), the symlink
        assert_eq!(u.inodes, 4);
        assert!(u.bytes >= 1 << 20 && u.bytes < 2 << 20, "{u:?}");
        assert!(dir_usage(&d.path().join("missing")).is_none());
    }

    #[test]
    fn filesystem_numbers_hold_together() {
        let f = fs_info(Path::new("/")).unwrap();
        assert!(f.capacity > 0 && f.available <= f.capacity && f.usage <= f.capacity);
        let s = fs_stats(Some(f), Time::default());
        assert_eq!(s.inodes_used, Some(f.inodes - f.inodes_free));
    }
}
