//! Names and ids: process-unique numbers for temp files, random hex ids, the boot id.

use std::fmt::Write;

/// A process-unique number for temp names.
pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (N.fetch_add(1, Ordering::Relaxed) << 48)
}

/// A random lowercase hex string of `bytes` random bytes (from the kernel).
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    let mut filled = 0;
    while filled < bytes {
        // SAFETY: the pointer and length describe the unfilled part of `buf`, which outlives
        // the call. nix 0.29 has no getrandom(2) (and std's randomness is not public).
        let n = unsafe { libc::getrandom(buf[filled..].as_mut_ptr() as *mut libc::c_void, bytes - filled, 0) };
        if n > 0 {
            filled += n as usize;
        }
    }
    let mut s = String::with_capacity(bytes * 2);
    for b in buf {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// This boot's id (empty if unreadable); state recorded under another boot id is from before
/// a reboot. Read once per process (no process outlives a reboot): listing containers asks
/// for it once per container.
pub fn boot_id() -> String {
    static BOOT_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if let Some(id) = BOOT_ID.get() {
        return id.clone();
    }
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    if !id.is_empty() {
        // A read that failed is tried again next time.
        let _ = BOOT_ID.set(id.clone());
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_hex_has_requested_length() {
        let a = random_hex(16);
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, random_hex(16));
        assert_eq!(random_hex(0), "");
    }

    #[test]
    fn unique_numbers_differ() {
        assert_ne!(unique(), unique());
    }

    #[test]
    fn boot_id_is_stable() {
        let b = boot_id();
        assert_eq!(b.len(), 36, "{b:?}");
        assert_eq!(b, boot_id(), "the cached id");
        let file = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        assert_eq!(b, file.trim());
    }
}
