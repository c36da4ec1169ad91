//! Device nodes a container's /dev gets beyond the defaults: the ones its config names (what
//! a device plugin allocates), and for a privileged container every node of the host's /dev,
//! as containerd's `WithHostDevices` gives it.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use oci_spec::runtime::{LinuxDevice, LinuxDeviceBuilder, LinuxDeviceType};

use super::Kind;

/// The kernel's `major()` and `minor()` of a `dev_t`.
pub fn major_minor(rdev: u64) -> (u32, u32) {
    (
        (((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff)) as u32,
        (((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff)) as u32,
    )
}

/// A device node on the host, read through symlinks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNode {
    pub kind: Kind,
    pub major: u32,
    pub minor: u32,
    /// Permission bits of the host's node.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Stat `path` on the host: it must be a block or character device.
pub fn host_node(path: &Path) -> Result<HostNode, String> {
    let md = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let ft = md.file_type();
    let kind = if ft.is_block_device() {
        Kind::Block
    } else if ft.is_char_device() {
        Kind::Char
    } else {
        return Err(format!("{} is not a device node", path.display()));
    };
    let (major, minor) = major_minor(md.rdev());
    Ok(HostNode {
        kind,
        major,
        minor,
        mode: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
    })
}

/// The OCI entry that makes the container's init create `container_path` as a node like
/// `node`. (In a user namespace, where mknod is not allowed, libcontainer bind-mounts the
/// host's node at the same path instead.)
pub(crate) fn oci_device(container_path: &str, node: &HostNode) -> LinuxDevice {
    LinuxDeviceBuilder::default()
        .path(container_path)
        .typ(match node.kind {
            Kind::Block => LinuxDeviceType::B,
            Kind::Char => LinuxDeviceType::C,
        })
        .major(node.major as i64)
        .minor(node.minor as i64)
        .file_mode(node.mode)
        .uid(node.uid)
        .gid(node.gid)
        .build()
        .expect("device entry")
}

/// Every device node under the host's /dev, as containerd lists them for a privileged
/// container: the pty, shm, mqueue and fd trees and the console are the container's own.
pub(crate) fn host_devices() -> Vec<LinuxDevice> {
    let mut out = Vec::new();
    walk(Path::new("/dev"), &mut out);
    out.sort_by(|a, b| a.path().cmp(b.path()));
    out
}

fn walk(dir: &Path, out: &mut Vec<LinuxDevice>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        let name = e.file_name();
        let name = name.to_string_lossy();
        if ft.is_dir() {
            if !matches!(
                name.as_ref(),
                "pts" | "shm" | "fd" | "mqueue" | ".lxc" | ".lxd-mounts" | ".udev"
            ) {
                walk(&e.path(), out);
            }
            continue;
        }
        if name == "console" || !(ft.is_block_device() || ft.is_char_device()) {
            continue;
        }
        let path = e.path();
        // symlinks are not followed: file_type() above is the entry's own
        if let Ok(node) = host_node(&path) {
            out.push(oci_device(&path.to_string_lossy(), &node));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_t_splits_as_the_kernel_does() {
        // makedev(8, 1), makedev(259, 3), makedev(4095, 1048575)
        assert_eq!(major_minor(0x801), (8, 1));
        assert_eq!(major_minor((259 << 8) | 3), (259, 3));
        let big = ((4095u64 & 0xfff) << 8) | (1048575 & 0xff) | ((1048575 & !0xff) << 12);
        assert_eq!(major_minor(big), (4095, 1048575));
    }

    #[test]
    fn dev_null_is_a_char_device_and_a_file_is_refused() {
        let n = host_node(Path::new("/dev/null")).unwrap();
        assert_eq!((n.kind, n.major, n.minor), (Kind::Char, 1, 3));
        let e = host_node(Path::new("/proc/self/status")).unwrap_err();
        assert!(e.contains("not a device node"), "{e}");
        let all = host_devices();
        assert!(all.iter().any(|d| d.path() == Path::new("/dev/null")));
        assert!(!all.iter().any(|d| d.path().starts_with("/dev/pts")));
    }
}
