//! Idmapped mounts (Linux 5.12, `mount_setattr(MOUNT_ATTR_IDMAP)`): a copy of a mount whose
//! files' owners are shifted by a user namespace's mapping, so that what host root owns is
//! owned by the container's root (the pod's first host id) when seen through it. The image
//! layers of a container in a user namespace are mounted this way under its overlay (overlayfs
//! takes idmapped layers since 5.19), and the volumes the agent makes for it are bound this way
//! (docs/userns.md).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use crate::mount_api::{move_mount, open_tree, AT_RECURSIVE, OPEN_TREE_CLONE};

const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A detached copy of the mount at `path` (with what is below it when `recursive`), its owners
/// mapped through the user namespace `userns` (a `/proc/<pid>/ns/user` file or a pin of one).
pub(crate) fn idmapped_copy(path: &Path, userns: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let ns = std::fs::File::open(userns).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", userns.display())))?;
    let flags = OPEN_TREE_CLONE | if recursive { AT_RECURSIVE } else { 0 };
    let tree = open_tree(path, flags)
        .map_err(|e| io::Error::new(e.kind(), format!("copying the mount at {}: {e}", path.display())))?;
    set_idmap(&tree, &ns, recursive).map_err(|e| {
        let why = match e.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::EPERM) | Some(libc::EOPNOTSUPP) => {
                " (idmapped mounts need Linux 5.12, and a filesystem that takes them: ext4, xfs and btrfs \
                 do since 5.12, tmpfs since 6.3, overlayfs and most network filesystems do not)"
            }
            Some(libc::ENOSYS) => " (mount_setattr needs Linux 5.12)",
            _ => "",
        };
        io::Error::new(e.kind(), format!("idmapping the mount at {}: {e}{why}", path.display()))
    })?;
    Ok(tree)
}

fn set_idmap(tree: &OwnedFd, ns: &std::fs::File, recursive: bool) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: ns.as_raw_fd() as u64,
    };
    let flags = libc::AT_EMPTY_PATH as libc::c_uint | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: mount_setattr(fd, "", flags, attr, size) on our detached tree with a valid attr.
    // nix 0.29 has none of the new mount API.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the filesystem at `path` takes idmapped mounts through `userns` on this kernel
/// (tried on a detached copy that is dropped at once).
pub fn supported(path: &Path, userns: &Path) -> bool {
    idmapped_copy(path, userns, false).is_ok()
}

/// Attach a detached tree at `at` (which must exist).
pub fn attach(tree: &OwnedFd, at: &Path) -> io::Result<()> {
    move_mount(tree, at).map_err(|e| io::Error::new(e.kind(), format!("attaching a mount at {}: {e}", at.display())))
}
