//! IP address management of the bridge mode: one file per allocated IP under
//! `<state_dir>/ipam/<subnet>/`, named by the address and holding the owning sandbox id.
//!
//! An allocation is made before any interface is configured, and it is made by creating the
//! IP's file exclusively: the file is written complete under a temp name and then hard-linked
//! to its final name. `link(2)` fails with EEXIST when the name exists, exactly like
//! `open(O_CREAT|O_EXCL)`, but the file can never be seen empty (a crash between an exclusive
//! create and its write would leave an IP owned by nobody). So two concurrent allocations, in
//! one process or several, can never get the same IP, and a crash at any point leaves either no
//! allocation or one that names its sandbox, which `gc` then collects.
//!
//! Addresses are handed out round-robin from a cursor (like CNI's host-local), so a released
//! IP is not reused at once: stale ARP entries and conntrack state of the old pod do not
//! reach the new one. The network, gateway and (IPv4) broadcast addresses are never handed out.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use tracing::{debug, info, warn};

use crate::error::{p, Context, Error, Result};
use crate::types::validate_sandbox_id;
use ferrolet_fsutil as fsutil;

const CURSOR: &str = "last_reserved_ip";

/// The allocator of one subnet.
#[derive(Debug, Clone)]
pub(crate) struct Ipam {
    dir: PathBuf,
    subnet: IpNet,
    gateway: IpAddr,
}

/// The numeric range of assignable host addresses of a subnet, as u128 offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostRange {
    pub first: u128,
    pub last: u128,
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_u128(v: u128, like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4((v as u32).into()),
        IpAddr::V6(_) => IpAddr::V6(v.into()),
    }
}

/// The assignable range of `subnet`: without the network address and, for IPv4, the
/// broadcast address. `None` when the subnet is too small to hold a gateway and one pod.
pub(crate) fn host_range(subnet: &IpNet) -> Option<HostRange> {
    let net = to_u128(subnet.network());
    let bcast = to_u128(subnet.broadcast());
    let (first, last) = match subnet {
        IpNet::V4(_) => (net + 1, bcast.checked_sub(1)?),
        IpNet::V6(_) => (net + 1, bcast),
    };
    // a gateway and at least one pod
    (last > first).then_some(HostRange { first, last })
}

/// The default gateway of a subnet: its first host address.
pub(crate) fn default_gateway(subnet: &IpNet) -> Option<IpAddr> {
    host_range(subnet).map(|r| from_u128(r.first, subnet.network()))
}

/// Why `ip` can not be given to a pod of `subnet` with `gateway`, if it can't.
pub(crate) fn unassignable_reason(subnet: &IpNet, gateway: IpAddr, ip: IpAddr) -> Option<String> {
    if !subnet.contains(&ip) {
        return Some(format!("not in subnet {subnet}"));
    }
    if ip == gateway {
        return Some("it is the gateway".into());
    }
    if ip == subnet.network() {
        return Some("it is the network address".into());
    }
    if matches!(subnet, IpNet::V4(_)) && ip == subnet.broadcast() {
        return Some("it is the broadcast address".into());
    }
    None
}

/// Order in which candidates are tried: everything after `cursor`, wrapping around to the
/// start of the range, `cursor` itself last. Lazy: a /8 is not materialised.
pub(crate) fn candidates(range: HostRange, cursor: Option<u128>) -> impl Iterator<Item = u128> {
    let start = match cursor {
        Some(c) if c >= range.first && c < range.last => c + 1,
        _ => range.first,
    };
    (start..=range.last).chain(range.first..start)
}

impl Ipam {
    /// The allocator of `subnet` storing under `state_dir/ipam/`. `gateway` is never allocated.
    pub(crate) fn new(state_dir: &Path, subnet: IpNet, gateway: IpAddr) -> Result<Self> {
        if host_range(&subnet).is_none() {
            return Err(Error::invalid_config(
                "subnet",
                format!("{subnet} is too small for a gateway and a pod"),
            ));
        }
        let dir = state_dir
            .join("ipam")
            .join(fsutil::safe_name(&subnet.trunc().to_string().replace('/', "_")));
        fsutil::ensure_dir(&dir)?;
        Ok(Ipam { dir, subnet, gateway })
    }

    #[cfg(test)]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file(&self, ip: IpAddr) -> PathBuf {
        // IPv6 addresses contain ':', fine in file names on Linux.
        self.dir.join(ip.to_string())
    }

    /// Allocate one IP to `sandbox_id`: a requested IP of this subnet's family if any (error
    /// when it is taken or unassignable), else the next free one. An IP already owned by the
    /// sandbox (a setup retried after a crash) is returned again instead of taking another.
    pub(crate) fn allocate(&self, sandbox_id: &str, requested: &[IpAddr]) -> Result<IpAddr> {
        let owned = self.owned_by(sandbox_id)?;
        let wanted: Vec<IpAddr> = requested
            .iter()
            .copied()
            .filter(|ip| ip.is_ipv4() == self.subnet.network().is_ipv4())
            .collect();
        if wanted.len() > 1 {
            return Err(Error::invalid_config(
                "requested_ips",
                format!("{wanted:?}: at most one IP per family can be requested"),
            ));
        }
        if let Some(&ip) = wanted.first() {
            if let Some(reason) = unassignable_reason(&self.subnet, self.gateway, ip) {
                return Err(Error::IpUnavailable {
                    ip,
                    subnet: self.subnet.to_string(),
                    reason,
                });
            }
            if owned.contains(&ip) {
                return Ok(ip);
            }
            self.release_all(sandbox_id)?;
            return match self.try_claim(ip, sandbox_id)? {
                Claim::Won => {
                    info!(sandbox = sandbox_id, %ip, "allocated requested IP");
                    Ok(ip)
                }
                Claim::Taken(owner) => Err(Error::IpTaken { ip, owner }),
            };
        }
        if let Some(&ip) = owned.first() {
            debug!(sandbox = sandbox_id, %ip, "IP already allocated to the sandbox");
            return Ok(ip);
        }

        let range = host_range(&self.subnet).expect("checked in new");
        let taken: HashSet<String> = fsutil::list_names(&self.dir)?.into_iter().collect();
        let cursor = self.read_cursor();
        let gw = to_u128(self.gateway);
        for n in candidates(range, cursor) {
            if n == gw {
                continue;
            }
            let ip = from_u128(n, self.subnet.network());
            if taken.contains(&ip.to_string()) {
                continue;
            }
            match self.try_claim(ip, sandbox_id)? {
                Claim::Won => {
                    self.write_cursor(ip);
                    info!(sandbox = sandbox_id, %ip, "allocated IP");
                    return Ok(ip);
                }
                Claim::Taken(_) => continue, // lost a race: try the next one
            }
        }
        Err(Error::SubnetExhausted {
            subnet: self.subnet.to_string(),
        })
    }

    fn try_claim(&self, ip: IpAddr, sandbox_id: &str) -> Result<Claim> {
        let path = self.file(ip);
        let tmp = self
            .dir
            .join(format!(".claim.{}.{}", std::process::id(), fsutil::unique()));
        let res = (|| -> Result<Claim> {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&tmp)
                .with_context(|| format!("creating {}", p(&tmp)))?;
            f.write_all(format!("{sandbox_id}\n").as_bytes())
                .with_context(|| format!("writing {}", p(&tmp)))?;
            f.sync_all().with_context(|| format!("syncing {}", p(&tmp)))?;
            match fs::hard_link(&tmp, &path) {
                Ok(()) => {
                    fsutil::sync_dir(&self.dir);
                    Ok(Claim::Won)
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(Claim::Taken(match self.holder(ip) {
                    Some(Holder::Sandbox(s)) => s,
                    Some(Holder::Unreadable(_)) => "(unreadable allocation)".into(),
                    None => "(released)".into(),
                })),
                Err(e) => Err(e)
                    .with_context(|| format!("allocating {ip}: linking {}", p(&path)))
                    .map_err(Error::from),
            }
        })();
        let _ = fs::remove_file(&tmp);
        res
    }

    /// What the file of `ip` says: `None` when the IP is free.
    pub(crate) fn holder(&self, ip: IpAddr) -> Option<Holder> {
        let path = self.file(ip);
        match fs::read(&path) {
            Ok(data) => Some(holder_of(&data)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => Some(Holder::Unreadable(format!("reading {}: {e}", p(&path)))),
        }
    }

    /// The sandbox holding `ip`, if any. An IP file that names no sandbox (torn, garbage,
    /// unreadable) is an error; see [`Ipam::holder`].
    pub(crate) fn owner(&self, ip: IpAddr) -> Result<Option<String>> {
        match self.holder(ip) {
            None => Ok(None),
            Some(Holder::Sandbox(s)) => Ok(Some(s)),
            Some(Holder::Unreadable(why)) => Err(unreadable(&self.file(ip), &why)),
        }
    }

    /// Every allocation: (ip, owner), and apart the IPs whose file names no sandbox, with
    /// why. Those stay allocated (a live pod may hold the IP) until
    /// [`Ipam::release_unreadable`].
    pub(crate) fn scan(&self) -> Result<Scan> {
        let mut scan = Scan::default();
        for name in fsutil::list_names(&self.dir)? {
            let Ok(ip) = name.parse::<IpAddr>() else { continue };
            match self.holder(ip) {
                Some(Holder::Sandbox(owner)) => scan.owned.push((ip, owner)),
                Some(Holder::Unreadable(why)) => scan.unreadable.push((ip, why)),
                None => {}
            }
        }
        Ok(scan)
    }

    /// Every allocation whose file names a sandbox: (ip, owner). Unreadable IP files are left
    /// out (with a warning), not an error: one torn file must not stop every allocation,
    /// teardown and gc.
    pub(crate) fn allocations(&self) -> Result<Vec<(IpAddr, String)>> {
        let Scan { owned, unreadable } = self.scan()?;
        for (ip, why) in unreadable {
            warn!(%ip, subnet = %self.subnet, problem = %why, "IP allocation names no sandbox; the IP stays taken");
        }
        Ok(owned)
    }

    /// IPs owned by `sandbox_id`.
    pub(crate) fn owned_by(&self, sandbox_id: &str) -> Result<Vec<IpAddr>> {
        Ok(self
            .allocations()?
            .into_iter()
            .filter(|(_, o)| o == sandbox_id)
            .map(|(ip, _)| ip)
            .collect())
    }

    /// Release `ip` if `sandbox_id` owns it. Returns whether something was released. An IP
    /// whose file names no sandbox is not released here (it may be a live pod's).
    pub(crate) fn release(&self, ip: IpAddr, sandbox_id: &str) -> Result<bool> {
        match self.holder(ip) {
            Some(Holder::Sandbox(owner)) if owner == sandbox_id => {
                let released = fsutil::remove_file_opt(&self.file(ip))?;
                if released {
                    fsutil::sync_dir(&self.dir);
                    info!(sandbox = sandbox_id, %ip, "released IP");
                }
                Ok(released)
            }
            _ => Ok(false),
        }
    }

    /// Release `ip` when its file (still) names no sandbox: for when no sandbox is live, so the
    /// IP can be no one's. Returns whether it was released.
    pub(crate) fn release_unreadable(&self, ip: IpAddr) -> Result<bool> {
        match self.holder(ip) {
            Some(Holder::Unreadable(why)) => {
                let released = fsutil::remove_file_opt(&self.file(ip))?;
                if released {
                    fsutil::sync_dir(&self.dir);
                    warn!(%ip, problem = %why, "released an IP whose allocation named no sandbox");
                }
                Ok(released)
            }
            _ => Ok(false),
        }
    }

    /// Release every IP of `sandbox_id`; returns them.
    pub(crate) fn release_all(&self, sandbox_id: &str) -> Result<Vec<IpAddr>> {
        let mut out = Vec::new();
        for ip in self.owned_by(sandbox_id)? {
            if self.release(ip, sandbox_id)? {
                out.push(ip);
            }
        }
        Ok(out)
    }

    fn read_cursor(&self) -> Option<u128> {
        let s = fs::read_to_string(self.dir.join(CURSOR)).ok()?;
        let ip: IpAddr = s.trim().parse().ok()?;
        self.subnet.contains(&ip).then(|| to_u128(ip))
    }

    fn write_cursor(&self, ip: IpAddr) {
        // Best effort: the cursor only spreads allocations, correctness rests on the IP files.
        let _ = fsutil::write_atomic(&self.dir.join(CURSOR), ip.to_string().as_bytes());
    }
}

enum Claim {
    Won,
    Taken(String),
}

/// Every allocation file of a subnet, by what it says.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// (ip, sandbox id)
    pub owned: Vec<(IpAddr, String)>,
    /// (ip, why): files that name no sandbox.
    pub unreadable: Vec<(IpAddr, String)>,
}

/// What an IP's allocation file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    Sandbox(String),
    /// The file does not name a sandbox (torn write, garbage, I/O error): why.
    Unreadable(String),
}

fn holder_of(data: &[u8]) -> Holder {
    let Ok(text) = std::str::from_utf8(data) else {
        return Holder::Unreadable("not text".into());
    };
    let id = text.lines().next().unwrap_or("").trim();
    match validate_sandbox_id(id) {
        Ok(()) => Holder::Sandbox(id.to_string()),
        Err(_) if id.is_empty() => Holder::Unreadable("empty".into()),
        Err(_) => Holder::Unreadable(format!(
            "{:?} is not a sandbox id",
            id.chars().take(40).collect::<String>()
        )),
    }
}

fn unreadable(path: &Path, why: &str) -> Error {
    let e: std::io::Result<()> = Err(std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string()));
    e.with_context(|| format!("IP allocation {} names no sandbox", p(path)))
        .unwrap_err()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn host_range_skips_network_and_broadcast() {
        let r = host_range(&net("10.88.0.0/16")).unwrap();
        assert_eq!(from_u128(r.first, ip("0.0.0.0")), ip("10.88.0.1"));
        assert_eq!(from_u128(r.last, ip("0.0.0.0")), ip("10.88.255.254"));
        assert!(host_range(&net("10.0.0.0/31")).is_none());
        assert!(host_range(&net("10.0.0.0/32")).is_none());
        let r = host_range(&net("10.0.0.0/30")).unwrap();
        assert_eq!(r.last - r.first, 1);
        let r6 = host_range(&net("fd00::/120")).unwrap();
        assert_eq!(from_u128(r6.last, ip("::")), ip("fd00::ff"));
        assert_eq!(default_gateway(&net("10.88.0.0/16")), Some(ip("10.88.0.1")));
        // a subnet written with host bits still has the right network
        assert_eq!(default_gateway(&net("10.88.3.7/16")), Some(ip("10.88.0.1")));
    }

    #[test]
    fn candidate_order_wraps_after_cursor() {
        let r = HostRange { first: 1, last: 5 };
        assert_eq!(candidates(r, None).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        assert_eq!(candidates(r, Some(3)).collect::<Vec<_>>(), vec![4, 5, 1, 2, 3]);
        assert_eq!(candidates(r, Some(5)).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        assert_eq!(candidates(r, Some(99)).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn unassignable_addresses() {
        let n = net("10.1.0.0/24");
        let gw = ip("10.1.0.1");
        assert!(unassignable_reason(&n, gw, ip("10.1.0.0")).unwrap().contains("network"));
        assert!(unassignable_reason(&n, gw, ip("10.1.0.255"))
            .unwrap()
            .contains("broadcast"));
        assert!(unassignable_reason(&n, gw, ip("10.1.0.1")).unwrap().contains("gateway"));
        assert!(unassignable_reason(&n, gw, ip("10.2.0.1"))
            .unwrap()
            .contains("not in subnet"));
        assert!(unassignable_reason(&n, gw, ip("10.1.0.9")).is_none());
    }

    #[test]
    fn allocate_exhaust_release_reuse() {
        let dir = tempfile::tempdir().unwrap();
        // /29: .0 network, .7 broadcast, .1 gateway -> .2 ..= .6 for pods
        let ipam = Ipam::new(dir.path(), net("10.9.0.0/29"), ip("10.9.0.1")).unwrap();
        let mut got = Vec::new();
        for i in 0..5 {
            got.push(ipam.allocate(&format!("s{i}"), &[]).unwrap());
        }
        assert_eq!(
            got,
            ["10.9.0.2", "10.9.0.3", "10.9.0.4", "10.9.0.5", "10.9.0.6"]
                .map(ip)
                .to_vec()
        );
        let e = ipam.allocate("s5", &[]).unwrap_err();
        assert!(matches!(e, Error::SubnetExhausted { .. }), "{e}");
        assert!(e.to_string().contains("10.9.0.0/29"));
        assert!(ipam.release(ip("10.9.0.4"), "s2").unwrap());
        assert_eq!(ipam.allocate("s5", &[]).unwrap(), ip("10.9.0.4"));
        // releasing with the wrong owner does nothing
        assert!(!ipam.release(ip("10.9.0.4"), "s2").unwrap());
        assert_eq!(ipam.owner(ip("10.9.0.4")).unwrap().as_deref(), Some("s5"));
    }

    #[test]
    fn round_robin_does_not_reuse_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let ipam = Ipam::new(dir.path(), net("10.9.0.0/24"), ip("10.9.0.1")).unwrap();
        let a = ipam.allocate("a", &[]).unwrap();
        ipam.release_all("a").unwrap();
        let b = ipam.allocate("b", &[]).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn requested_ip_is_honoured_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ipam = Ipam::new(dir.path(), net("10.9.0.0/24"), ip("10.9.0.1")).unwrap();
        assert_eq!(ipam.allocate("a", &[ip("10.9.0.77")]).unwrap(), ip("10.9.0.77"));
        // idempotent for the owner
        assert_eq!(ipam.allocate("a", &[ip("10.9.0.77")]).unwrap(), ip("10.9.0.77"));
        let e = ipam.allocate("b", &[ip("10.9.0.77")]).unwrap_err();
        assert_eq!(e.to_string(), "IP 10.9.0.77 is already allocated to sandbox a");
        let e = ipam.allocate("b", &[ip("10.9.0.1")]).unwrap_err().to_string();
        assert!(e.contains("10.9.0.1") && e.contains("gateway"), "{e}");
        let e = ipam.allocate("b", &[ip("10.10.0.5")]).unwrap_err().to_string();
        assert!(e.contains("not in subnet"), "{e}");
        // an IP of the other family is not this allocator's business
        let b = ipam.allocate("b", &[ip("fd00::5")]).unwrap();
        assert!(b.is_ipv4());
    }

    #[test]
    fn retried_allocation_returns_the_same_ip() {
        let dir = tempfile::tempdir().unwrap();
        let ipam = Ipam::new(dir.path(), net("10.9.0.0/24"), ip("10.9.0.1")).unwrap();
        let a = ipam.allocate("a", &[]).unwrap();
        assert_eq!(ipam.allocate("a", &[]).unwrap(), a);
        assert_eq!(ipam.owned_by("a").unwrap(), vec![a]);
    }

    #[test]
    fn concurrent_allocations_never_collide() {
        let dir = tempfile::tempdir().unwrap();
        let ipam = Arc::new(Ipam::new(dir.path(), net("10.9.0.0/24"), ip("10.9.0.1")).unwrap());
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let ipam = ipam.clone();
                std::thread::spawn(move || {
                    (0..25)
                        .map(|i| ipam.allocate(&format!("t{t}-{i}"), &[]).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<IpAddr> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        assert_eq!(all.len(), 200);
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 200, "an IP was handed out twice");
        assert_eq!(ipam.allocations().unwrap().len(), 200);
        // no claim temp files left
        assert!(fsutil::list_names(ipam.dir())
            .unwrap()
            .iter()
            .all(|n| !n.starts_with(".claim")));
    }

    #[test]
    fn unreadable_allocation_files_stay_taken_and_stop_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let ipam = Ipam::new(dir.path(), net("10.9.0.0/29"), ip("10.9.0.1")).unwrap();
        let a = ipam.allocate("a", &[]).unwrap();
        // .3 torn (empty), .4 garbage
        fs::write(ipam.dir().join("10.9.0.3"), "").unwrap();
        fs::write(ipam.dir().join("10.9.0.4"), b"\xff\xfe junk").unwrap();
        let Scan { owned, unreadable: bad } = ipam.scan().unwrap();
        assert_eq!(owned, vec![(a, "a".to_string())]);
        assert_eq!(
            bad.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![ip("10.9.0.3"), ip("10.9.0.4")]
        );
        // allocation, lookup and release of the others go on; the unreadable IPs are not handed out
        let b = ipam.allocate("b", &[]).unwrap();
        assert_eq!(b, ip("10.9.0.5"));
        assert_eq!(ipam.owned_by("a").unwrap(), vec![a]);
        assert!(ipam.owner(ip("10.9.0.3")).is_err());
        assert!(!ipam.release(ip("10.9.0.3"), "").unwrap());
        let e = ipam.allocate("c", &[ip("10.9.0.4")]).unwrap_err();
        assert!(e.to_string().contains("unreadable"), "{e}");
        // released only on purpose
        assert!(ipam.release_unreadable(ip("10.9.0.4")).unwrap());
        assert!(!ipam.release_unreadable(a).unwrap());
        assert_eq!(ipam.allocate("c", &[ip("10.9.0.4")]).unwrap(), ip("10.9.0.4"));
    }

    #[test]
    fn ipv6_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let ipam = Ipam::new(dir.path(), net("fd00:88::/64"), ip("fd00:88::1")).unwrap();
        assert_eq!(ipam.allocate("a", &[]).unwrap(), ip("fd00:88::2"));
    }
}
