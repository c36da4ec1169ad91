//! Device access control: which device nodes a container may open (read, write) or create
//! (mknod), as the cgroup v1 devices controller decides it (docs/devices.md).
//!
//! The OCI spec carries a list of rules (`linux.resources.devices`) that runc and the v1
//! kernel read in order: a rule of type `a` resets the list to "deny all" or "allow all",
//! any other rule adds an exception to the current default or takes access away from one.
//! [`Policy::from_rules`] reads them exactly as the v1 kernel does (`devcgroup_update_access`);
//! on cgroup v1 libcgroups writes the same rules to `devices.deny` / `devices.allow`, and on
//! cgroup v2, which has no devices controller, [`program`] turns the policy into an eBPF
//! program that [`bpf`] attaches to the container's cgroup. Either way the kernel asks the
//! same question and gets the same answer.

pub mod bpf;
pub mod nodes;
pub mod program;

use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType};
use serde::{Deserialize, Serialize};

/// mknod, read, write: the kernel's `DEVCG_ACC_*` bits (and `BPF_DEVCG_ACC_*`).
pub(crate) const ACC_MKNOD: u8 = 1;
pub(crate) const ACC_READ: u8 = 2;
pub(crate) const ACC_WRITE: u8 = 4;
const ACC_ALL: u8 = ACC_MKNOD | ACC_READ | ACC_WRITE;

/// A block or character device, the two kinds the kernel checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Kind {
    Block,
    Char,
}

impl Kind {
    /// `BPF_DEVCG_DEV_BLOCK` / `BPF_DEVCG_DEV_CHAR`.
    pub(crate) fn bpf_type(self) -> u32 {
        match self {
            Kind::Block => 1,
            Kind::Char => 2,
        }
    }
}

/// One exception to a policy's default: devices of `kind` (`None`: both) with this major and
/// minor (`None`: any), and the access it grants (or, under a default of allow, denies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Exception {
    pub kind: Option<Kind>,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    /// [`ACC_MKNOD`] | [`ACC_READ`] | [`ACC_WRITE`].
    pub access: u8,
}

impl Exception {
    fn same_device(&self, other: &Exception) -> bool {
        self.kind == other.kind && self.major == other.major && self.minor == other.minor
    }

    /// Does it cover a request for `access` on this device? Under a default of deny every
    /// requested bit must be granted (the kernel's `match_exception`); under allow, any
    /// requested bit that is listed denies (`match_exception_partial`).
    pub(crate) fn matches(&self, kind: Kind, major: u32, minor: u32, access: u8, default_allow: bool) -> bool {
        let device = self.kind.is_none_or(|k| k == kind)
            && self.major.is_none_or(|m| m == major)
            && self.minor.is_none_or(|m| m == minor);
        let access = if default_allow {
            self.access & access != 0
        } else {
            access & !self.access == 0
        };
        device && access
    }
}

/// What a container may do with devices: the default for every device, and the exceptions to
/// it, in the order the rules made them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    pub default_allow: bool,
    pub(crate) exceptions: Vec<Exception>,
}

impl Policy {
    /// Read OCI rules as the v1 kernel reads writes to `devices.allow` and `devices.deny`:
    /// starting from "allow all" (a new cgroup's state), a type `a` rule resets the default
    /// and drops every exception; a rule against the default adds its access to the exception
    /// for exactly that device (type, major, minor); a rule in line with the default takes its
    /// access away from that exception, dropping it when nothing is left. Rules of FIFO or
    /// unbuffered-char type are the kernel's `c`.
    pub fn from_rules<'a>(rules: impl IntoIterator<Item = &'a LinuxDeviceCgroup>) -> Result<Policy, String> {
        let mut p = Policy {
            default_allow: true,
            exceptions: Vec::new(),
        };
        for (i, r) in rules.into_iter().enumerate() {
            let access = parse_access(r.access().as_deref().unwrap_or("rwm"))
                .map_err(|why| format!("linux.resources.devices[{i}].access: {why}"))?;
            let kind = match r.typ().unwrap_or_default() {
                LinuxDeviceType::A => {
                    p.default_allow = r.allow();
                    p.exceptions.clear();
                    continue;
                }
                LinuxDeviceType::B => Kind::Block,
                LinuxDeviceType::C | LinuxDeviceType::U | LinuxDeviceType::P => Kind::Char,
            };
            let number = |n: Option<i64>, what: &str| -> Result<Option<u32>, String> {
                match n {
                    None | Some(-1) => Ok(None),
                    Some(v) => u32::try_from(v)
                        .map(Some)
                        .map_err(|_| format!("linux.resources.devices[{i}].{what}: {v} is not a device number")),
                }
            };
            let ex = Exception {
                kind: Some(kind),
                major: number(r.major(), "major")?,
                minor: number(r.minor(), "minor")?,
                access,
            };
            if access == 0 {
                continue;
            }
            if r.allow() != p.default_allow {
                match p.exceptions.iter_mut().find(|e| e.same_device(&ex)) {
                    Some(e) => e.access |= access,
                    None => p.exceptions.push(ex),
                }
            } else if let Some(pos) = p.exceptions.iter().position(|e| e.same_device(&ex)) {
                p.exceptions[pos].access &= !access;
                if p.exceptions[pos].access == 0 {
                    p.exceptions.remove(pos);
                }
            }
        }
        Ok(p)
    }

    /// The kernel's answer to a request for `access` on a device.
    pub fn allows(&self, kind: Kind, major: u32, minor: u32, access: u8) -> bool {
        let listed = self
            .exceptions
            .iter()
            .any(|e| e.matches(kind, major, minor, access, self.default_allow));
        if self.default_allow {
            !listed
        } else {
            listed
        }
    }

    /// Allows everything: no program is needed.
    pub(crate) fn allows_all(&self) -> bool {
        self.default_allow && self.exceptions.is_empty()
    }
}

/// `rwm` letters to access bits; empty, repeated or other letters are refused.
pub(crate) fn parse_access(s: &str) -> Result<u8, String> {
    let mut acc = 0;
    for ch in s.chars() {
        let bit = match ch {
            'r' => ACC_READ,
            'w' => ACC_WRITE,
            'm' => ACC_MKNOD,
            _ => return Err(format!("{s:?}: only the letters r, w and m are allowed")),
        };
        if acc & bit != 0 {
            return Err(format!("{s:?}: {ch:?} is given twice"));
        }
        acc |= bit;
    }
    if acc == 0 {
        return Err("empty: give some of r, w and m".into());
    }
    Ok(acc & ACC_ALL)
}

fn rule(allow: bool, typ: LinuxDeviceType, major: Option<i64>, minor: Option<i64>, access: &str) -> LinuxDeviceCgroup {
    let mut b = LinuxDeviceCgroupBuilder::default().allow(allow).typ(typ).access(access);
    if let Some(m) = major {
        b = b.major(m);
    }
    if let Some(m) = minor {
        b = b.minor(m);
    }
    b.build().expect("device rule")
}

/// The rules every unprivileged container starts from, runc's (and libcgroups', which appends
/// the same allow rules on cgroup v1 after the spec's): deny everything, then allow mknod of
/// any device (opening one is what the rules guard), and read, write and mknod of the devices
/// the OCI runtime spec gives every container (null, zero, full, random, urandom, tty,
/// console, ptmx), the pty slaves of the container's devpts (136:*), and tun/tap (10:200),
/// which runc dropped in 1.2.0 and put back in 1.2.4 for the workloads that `mknod` it.
pub fn default_rules() -> Vec<LinuxDeviceCgroup> {
    use LinuxDeviceType::{A, B, C};
    let mut v = vec![
        rule(false, A, None, None, "rwm"),
        rule(true, C, None, None, "m"),
        rule(true, B, None, None, "m"),
    ];
    for (major, minor) in [
        (1, 3),    // null
        (1, 5),    // zero
        (1, 7),    // full
        (1, 8),    // random
        (1, 9),    // urandom
        (5, 0),    // tty
        (5, 1),    // console
        (5, 2),    // ptmx
        (10, 200), // tun/tap
    ] {
        v.push(rule(true, C, Some(major), Some(minor), "rwm"));
    }
    v.push(rule(true, C, Some(136), None, "rwm"));
    v
}

/// A privileged container's one rule: every device, every access.
pub(crate) fn allow_all_rules() -> Vec<LinuxDeviceCgroup> {
    vec![rule(true, LinuxDeviceType::A, None, None, "rwm")]
}

/// The rule that lets a container use one device node the spec gives it (`linux.devices`).
pub(crate) fn device_rule(kind: Kind, major: u32, minor: u32, access: &str) -> LinuxDeviceCgroup {
    let typ = match kind {
        Kind::Block => LinuxDeviceType::B,
        Kind::Char => LinuxDeviceType::C,
    };
    rule(true, typ, Some(major as i64), Some(minor as i64), access)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acc(s: &str) -> u8 {
        parse_access(s).unwrap()
    }

    #[test]
    fn the_default_rules_allow_the_oci_devices_and_mknod_only() {
        let p = Policy::from_rules(&default_rules()).unwrap();
        assert!(!p.default_allow);
        for (major, minor) in [
            (1, 3),
            (1, 5),
            (1, 7),
            (1, 8),
            (1, 9),
            (5, 0),
            (5, 1),
            (5, 2),
            (136, 7),
            (10, 200),
        ] {
            assert!(p.allows(Kind::Char, major, minor, acc("rw")), "{major}:{minor}");
        }
        // a disk: mknod yes, open no; a char device not listed: the same
        assert!(p.allows(Kind::Block, 8, 0, ACC_MKNOD));
        assert!(!p.allows(Kind::Block, 8, 0, ACC_READ));
        assert!(!p.allows(Kind::Block, 254, 0, acc("rw")));
        assert!(!p.allows(Kind::Char, 1, 1, ACC_READ), "/dev/mem");
        assert!(!p.allows(Kind::Char, 10, 229, ACC_WRITE), "/dev/fuse");
        // mknod and read together is more than the wildcard grants
        assert!(!p.allows(Kind::Block, 8, 0, acc("rm")));
    }

    #[test]
    fn a_type_a_rule_resets_and_later_rules_build_on_it() {
        let mut rules = default_rules();
        rules.push(device_rule(Kind::Block, 254, 0, "r"));
        let p = Policy::from_rules(&rules).unwrap();
        assert!(p.allows(Kind::Block, 254, 0, ACC_READ));
        assert!(!p.allows(Kind::Block, 254, 0, ACC_WRITE));
        assert!(!p.allows(Kind::Block, 254, 1, ACC_READ));
        // allow all wipes the exceptions
        rules.extend(allow_all_rules());
        let p = Policy::from_rules(&rules).unwrap();
        assert!(p.allows_all());
        // a new cgroup allows everything until told otherwise
        assert!(Policy::from_rules(&[]).unwrap().allows_all());
    }

    #[test]
    fn rules_in_line_with_the_default_take_access_away_exactly_as_v1() {
        let mut rules = default_rules();
        rules.push(device_rule(Kind::Char, 1, 3, "rw")); // merged into null's rwm
        let mut deny = device_rule(Kind::Char, 1, 3, "w");
        deny.set_allow(false);
        rules.push(deny);
        let p = Policy::from_rules(&rules).unwrap();
        assert!(p.allows(Kind::Char, 1, 3, ACC_READ));
        assert!(!p.allows(Kind::Char, 1, 3, ACC_WRITE));
        // a deny of a wildcard touches only the wildcard exception, as in the kernel
        let mut deny_all_char = rule(false, LinuxDeviceType::C, None, None, "m");
        deny_all_char.set_allow(false);
        rules.push(deny_all_char);
        let p = Policy::from_rules(&rules).unwrap();
        assert!(!p.allows(Kind::Char, 4, 1, ACC_MKNOD));
        assert!(p.allows(Kind::Char, 1, 5, ACC_MKNOD), "zero keeps its own rwm");
        // under allow-all, denies are the exceptions and any overlap denies
        let mut black = allow_all_rules();
        let mut d = device_rule(Kind::Block, 8, 0, "rw");
        d.set_allow(false);
        black.push(d);
        let p = Policy::from_rules(&black).unwrap();
        assert!(!p.allows(Kind::Block, 8, 0, acc("rm")));
        assert!(p.allows(Kind::Block, 8, 0, ACC_MKNOD));
        assert!(p.allows(Kind::Block, 8, 1, acc("rw")));
    }

    #[test]
    fn bad_rules_name_the_field() {
        let bad = rule(true, LinuxDeviceType::C, Some(1), Some(3), "rx");
        let e = Policy::from_rules(&[bad]).unwrap_err();
        assert!(e.contains("devices[0].access") && e.contains("r, w and m"), "{e}");
        let bad = rule(true, LinuxDeviceType::C, Some(-7), None, "r");
        let e = Policy::from_rules(&[bad]).unwrap_err();
        assert!(e.contains("devices[0].major"), "{e}");
        assert!(parse_access("").is_err());
        assert!(parse_access("rr").is_err());
    }
}
