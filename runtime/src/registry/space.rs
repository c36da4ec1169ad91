//! Room on the image store's filesystem for downloads. A blob may take only what the
//! filesystem has available less the reserve the caller asks to keep (the agent's hard
//! eviction thresholds for the image and node filesystems) less what downloads under way
//! have already claimed; a download claims its declared size before its first byte, gives
//! back what it wrote as it writes, and checks while it streams that the filesystem still
//! has the room (something else may be filling it).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Space the image store's filesystem must keep free whatever is pulled: the larger of a
/// number of bytes and a percentage of the filesystem's capacity. The default keeps nothing
/// back (the CLI outside an agent); the agent passes its eviction thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DiskReserve {
    pub bytes: u64,
    /// 0 to 100.
    pub percent: f64,
}

impl DiskReserve {
    /// The reserve on a filesystem of `capacity` bytes.
    pub fn of(&self, capacity: u64) -> u64 {
        let pct = (capacity as f64 * self.percent.clamp(0.0, 100.0) / 100.0).ceil() as u64;
        self.bytes.max(pct)
    }
}

/// What the filesystem looked like when room was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Short {
    pub available: u64,
    pub reserve: u64,
    /// Claimed by other downloads under way and not yet written.
    pub claimed: u64,
}

impl Short {
    /// The most a new download could have had.
    pub(crate) fn room(&self) -> u64 {
        self.available.saturating_sub(self.reserve).saturating_sub(self.claimed)
    }
}

impl std::fmt::Display for Short {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the image filesystem has {} available, must keep {} free (eviction threshold), and {} is claimed by other downloads",
            human(self.available),
            human(self.reserve),
            human(self.claimed)
        )
    }
}

/// `17179869184 bytes (16.0 GiB)`.
pub(crate) fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} bytes")
    } else {
        format!("{n} bytes ({v:.1} {})", UNITS[u])
    }
}

pub(super) struct Space {
    dir: PathBuf,
    reserve: DiskReserve,
    /// Bytes claimed by downloads under way and not yet written.
    claimed: Mutex<u64>,
}

impl Space {
    pub(crate) fn new(dir: PathBuf, reserve: DiskReserve) -> Arc<Space> {
        Arc::new(Space {
            dir,
            reserve,
            claimed: Mutex::new(0),
        })
    }

    /// (available, reserve) of the filesystem now.
    fn measure(&self) -> std::io::Result<(u64, u64)> {
        let st = nix::sys::statvfs::statvfs(&self.dir).map_err(std::io::Error::from)?;
        let frag = st.fragment_size() as u64;
        let capacity = (st.blocks() as u64).saturating_mul(frag);
        let available = (st.blocks_available() as u64).saturating_mul(frag);
        Ok((available, self.reserve.of(capacity)))
    }

    /// Whether `need` more bytes fit now, besides the claims of downloads under way.
    pub(crate) fn check(&self, need: u64) -> std::io::Result<Result<(), Short>> {
        let claimed = *self.claimed.lock().unwrap_or_else(|e| e.into_inner());
        let (available, reserve) = self.measure()?;
        let short = Short {
            available,
            reserve,
            claimed,
        };
        Ok(if need <= short.room() { Ok(()) } else { Err(short) })
    }

    /// Whether the filesystem still keeps its reserve, besides the claims of downloads under
    /// way: what decides if a partial download may stay.
    pub(crate) fn keeps_reserve(&self) -> std::io::Result<bool> {
        let claimed = *self.claimed.lock().unwrap_or_else(|e| e.into_inner());
        let (available, reserve) = self.measure()?;
        Ok(available >= reserve.saturating_add(claimed))
    }

    /// Claim `need` bytes for a download, or say why they do not fit.
    pub(crate) fn claim(self: &Arc<Self>, need: u64) -> std::io::Result<Result<Claim, Short>> {
        let mut claimed = self.claimed.lock().unwrap_or_else(|e| e.into_inner());
        let (available, reserve) = self.measure()?;
        let short = Short {
            available,
            reserve,
            claimed: *claimed,
        };
        if need > short.room() {
            return Ok(Err(short));
        }
        *claimed += need;
        Ok(Ok(Claim {
            space: self.clone(),
            left: need,
        }))
    }
}

/// Room claimed by one download; what it did not write is given back when dropped.
pub(super) struct Claim {
    space: Arc<Space>,
    left: u64,
}

impl Claim {
    /// `n` of the claimed bytes are now on disk.
    pub(crate) fn wrote(&mut self, n: u64) {
        let n = n.min(self.left);
        self.left -= n;
        let mut c = self.space.claimed.lock().unwrap_or_else(|e| e.into_inner());
        *c = c.saturating_sub(n);
    }

    /// Whether the filesystem still has the reserve plus every claim (this one's included):
    /// something else writing to it makes a download stop before it eats the reserve.
    pub(crate) fn still_fits(&self) -> std::io::Result<Result<(), Short>> {
        let claimed = *self.space.claimed.lock().unwrap_or_else(|e| e.into_inner());
        let (available, reserve) = self.space.measure()?;
        let short = Short {
            available,
            reserve,
            claimed: claimed.saturating_sub(self.left),
        };
        Ok(if self.left <= short.room() { Ok(()) } else { Err(short) })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut c = self.space.claimed.lock().unwrap_or_else(|e| e.into_inner());
        *c = c.saturating_sub(self.left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_is_the_larger_of_bytes_and_percent() {
        let r = DiskReserve {
            bytes: 100,
            percent: 10.0,
        };
        assert_eq!(r.of(500), 100);
        assert_eq!(r.of(5000), 500);
        assert_eq!(DiskReserve::default().of(1 << 40), 0);
    }

    #[test]
    fn claims_add_up_and_are_given_back() {
        let t = tempfile::tempdir().unwrap();
        let s = Space::new(t.path().to_path_buf(), DiskReserve::default());
        let (available, _) = s.measure().unwrap();
        let mut a = s.claim(available / 2).unwrap().unwrap();
        // Two claims of more than half of what is free never both fit.
        let short = s
            .claim(available / 2 + available / 4)
            .unwrap()
            .err()
            .expect("does not fit");
        assert_eq!(short.claimed, available / 2);
        assert!(s.check(available / 2 + available / 4).unwrap().is_err());
        a.wrote(available / 4);
        assert_eq!(*s.claimed.lock().unwrap(), available / 2 - available / 4);
        drop(a);
        assert_eq!(*s.claimed.lock().unwrap(), 0);
        assert!(s.check(available / 2).unwrap().is_ok());
        assert!(human(17 << 30).ends_with("(17.0 GiB)"));
    }
}
