//! Letting go of the agent's own code pages it no longer runs (docs/agent.md, "Code pages").
//!
//! Most of the agent's resident memory when idle is not data but its binary: about 13 of the
//! idle agent's 14 MiB PSS are the executable's pages, mapped while starting up (flag and
//! config parsing, TLS setup, the first list of every source, the server's routes) and never
//! run again; the steady state touches about 2.5 MiB of them. The kernel maps code 64 KiB at
//! a time around each fault (fault-around), and a mapped executable page is kept over
//! unmapped page cache when memory runs short.
//!
//! [`release`] unmaps the executable's clean, read-only mappings of this process
//! (`MADV_DONTNEED`). The pages stay in the page cache like any file's; code that runs again
//! is mapped again by a minor fault. Only mappings without a single private (copied) page are
//! touched: text and read-only data never written, never the relocated RELRO data, `.data` or
//! `.bss`, which `MADV_DONTNEED` would reset.

use std::path::Path;
use std::time::Duration;

/// How often the agent lets go of its code pages after the first time, once started.
pub const EVERY: Duration = Duration::from_secs(60);

/// How long after pods last started, changed, stopped or went the agent lets go of what the
/// burst mapped and freed: the code of starting and stopping pods does not run again until the
/// next one. After a burst of 100 pods that was 8 MiB of the agent's 23 MiB PSS (measured).
pub const SETTLE: Duration = Duration::from_secs(1);

/// One mapping of `/proc/self/smaps` that may be released.
#[derive(Debug, PartialEq)]
pub(crate) struct Mapping {
    pub start: usize,
    pub end: usize,
    /// Its resident size, in KiB.
    pub rss_kib: u64,
}

/// The mappings of `exe` in `smaps` (the text of `/proc/self/smaps`) that are read-only
/// (`r--p` or `r-xp`) and hold no private page.
pub(crate) fn releasable(smaps: &str, exe: &Path) -> Vec<Mapping> {
    let exe = exe.to_string_lossy();
    let mut out = Vec::new();
    // The read-only mapping of exe being read, and its count of private pages once seen.
    let mut cur: Option<(Mapping, Option<u64>)> = None;
    for line in smaps.lines() {
        let mut fields = line.split_ascii_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((a, b)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            out.extend(cur.take().filter(|(_, anon)| *anon == Some(0)).map(|(m, _)| m));
            let perms = fields.next().unwrap_or("");
            // offset, device, inode, then the path (which may hold spaces).
            let path = line.splitn(6, ' ').nth(5).unwrap_or("").trim_start();
            if matches!(perms, "r--p" | "r-xp") && path == exe {
                if let (Ok(start), Ok(end)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                    cur = Some((Mapping { start, end, rss_kib: 0 }, None));
                }
            }
            continue;
        }
        let value = fields.next().and_then(|v| v.parse::<u64>().ok());
        if let (Some((m, anon)), Some(v)) = (cur.as_mut(), value) {
            match first {
                "Rss:" => m.rss_kib = v,
                "Anonymous:" => *anon = Some(v),
                _ => {}
            }
        }
    }
    out.extend(cur.filter(|(_, anon)| *anon == Some(0)).map(|(m, _)| m));
    out
}

/// Unmap the executable's read-only pages from this process; returns the KiB that were
/// resident in what was released.
pub fn release() -> std::io::Result<u64> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    unmap(&releasable(&smaps, &exe))
}

/// Drop the pages of `mappings` (as [`releasable`] found them) from this process.
fn unmap(mappings: &[Mapping]) -> std::io::Result<u64> {
    let mut released = 0;
    for m in mappings {
        // SAFETY: the range is a whole private, read-only file mapping with no private page
        // ([`releasable`]), so dropping its pages loses nothing: any access maps the same file
        // contents again. No Rust object lives in it.
        let r = unsafe { libc::madvise(m.start as *mut libc::c_void, m.end - m.start, libc::MADV_DONTNEED) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        released += m.rss_kib;
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0a0000000-55d0a0400000 r--p 00000000 fe:01 1234                       /usr/bin/ferrolet agent
Size:               4096 kB
Rss:                1200 kB
Anonymous:             0 kB
VmFlags: rd mr mw me sd
55d0a0400000-55d0a1000000 r-xp 00400000 fe:01 1234                       /usr/bin/ferrolet agent
Size:              12288 kB
Rss:                9000 kB
Anonymous:             0 kB
55d0a1000000-55d0a1100000 r--p 01000000 fe:01 1234                       /usr/bin/ferrolet agent
Rss:                 800 kB
Anonymous:           700 kB
55d0a1100000-55d0a1200000 rw-p 01100000 fe:01 1234                       /usr/bin/ferrolet agent
Rss:                 100 kB
Anonymous:           100 kB
7f0000000000-7f0000100000 r-xp 00000000 fe:01 99                         /usr/lib/libc.so.6
Rss:                 500 kB
Anonymous:             0 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Rss:                  12 kB
Anonymous:            12 kB
";

    #[test]
    fn only_clean_read_only_mappings_of_the_executable() {
        let got = releasable(SMAPS, Path::new("/usr/bin/ferrolet agent"));
        assert_eq!(
            got,
            vec![
                Mapping {
                    start: 0x55d0a0000000,
                    end: 0x55d0a0400000,
                    rss_kib: 1200
                },
                Mapping {
                    start: 0x55d0a0400000,
                    end: 0x55d0a1000000,
                    rss_kib: 9000
                },
            ]
        );
        assert!(releasable(SMAPS, Path::new("/usr/bin/other")).is_empty());
    }

    #[test]
    fn a_mapping_whose_anonymous_count_is_missing_is_kept() {
        let smaps = "1000-2000 r-xp 00000000 fe:01 1 /bin/x\nRss: 4 kB\n";
        assert!(releasable(smaps, Path::new("/bin/x")).is_empty());
    }

    #[test]
    fn unmapped_pages_leave_the_resident_set_and_read_the_same() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        // A read-only private mapping of a file of our own: nothing else touches it, unlike
        // the test binary's code, which tests running beside this one map again at once.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("code");
        let data: Vec<u8> = (0..64 * 4096u32).map(|i| (i % 251) as u8).collect();
        std::fs::File::create(&path).unwrap().write_all(&data).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: a fresh private read-only mapping of a file this test owns, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                data.len(),
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: the mapping is data.len() readable bytes until munmap below.
        let mapped = unsafe { std::slice::from_raw_parts(p as *const u8, data.len()) };
        let ours = || {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            releasable(&smaps, &path)
        };
        assert_eq!(mapped, &data[..]);
        let before = ours();
        assert_eq!(before.len(), 1, "{before:?}");
        assert_eq!(before[0].rss_kib, 256, "read whole, the mapping is resident");
        assert_eq!(unmap(&before).unwrap(), 256);
        assert_eq!(ours()[0].rss_kib, 0, "unmapped");
        assert_eq!(mapped, &data[..], "mapped again from the file as it is read");
        // SAFETY: p and len are the mapping made above; `mapped` is not used after this.
        unsafe { libc::munmap(p, data.len()) };
    }

    #[test]
    fn releasing_the_executable_keeps_the_process_running() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        assert!(
            !releasable(&smaps, &exe).is_empty(),
            "the test binary has read-only mappings"
        );
        assert!(release().unwrap() > 0);
        // Code and read-only data are mapped again as they are used.
        let v: Vec<String> = (0..3).map(|i| format!("{i}")).collect();
        assert_eq!(v.join(","), "0,1,2");
    }
}
