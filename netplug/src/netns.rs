//! Network namespaces without touching the process's own: a netlink socket stays bound to the
//! namespace it was created in, so to work inside a pod's namespace a short-lived dedicated
//! thread `setns`es into it, creates the socket (or does a small blocking job) and exits. The
//! calling thread, the tokio workers and the rest of the process never change namespace.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd};
use std::path::{Path, PathBuf};

use nix::sched::{setns, CloneFlags};
use rtnetlink::Handle;

use crate::error::{Context, Error, Result};

/// Open a network namespace file, checking that it is one. Errors name the path; a missing
/// file is an `Fs` error for which [`Error::is_not_found`] is true.
pub(crate) fn open_netns(path: &Path) -> Result<File> {
    let f = File::open(path).with_context(|| format!("opening network namespace {}", path.display()))?;
    let st = nix::sys::statfs::fstatfs(f.as_fd())
        .with_context(|| format!("statfs of network namespace {}", path.display()))?;
    if st.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
        return Err(Error::netns(
            path,
            "not a namespace file (expected a bind mount of /proc/<pid>/ns/net)",
        ));
    }
    // SAFETY: NS_GET_NSTYPE takes no argument and returns the CLONE_NEW* type of the namespace.
    // nix has no namespace ioctls (only macros that generate raw ones).
    let ty = unsafe { libc::ioctl(f.as_raw_fd(), NS_GET_NSTYPE as _) };
    if ty >= 0 && ty != libc::CLONE_NEWNET {
        return Err(Error::netns(path, "not a network namespace"));
    }
    Ok(f)
}

// _IO(0xb7, 0x3)
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// True when `path` opens as a network namespace file (a pinned netns that still exists).
pub(crate) fn netns_exists(path: &Path) -> bool {
    open_netns(path).is_ok()
}

/// Run `f` on a fresh thread that has joined the network namespace at `path`, and return what
/// it returns. The thread exits afterwards, so nothing else ever runs in that namespace.
pub(crate) async fn run_in_netns<T, F>(path: &Path, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    let ns = open_netns(path)?;
    let owned: PathBuf = path.to_path_buf();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("netns".into())
        .spawn(move || {
            let res = setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("entering network namespace {}", owned.display()))
                .map_err(Error::from)
                .and_then(|()| f());
            let _ = tx.send(res);
        })
        .context("spawning a thread for a network namespace")?;
    rx.await
        .map_err(|_| Error::netns(path, "namespace thread ended without an answer"))?
}

/// A netlink (route) connection of the process's own network namespace.
pub fn node_handle() -> Result<Handle> {
    let (conn, handle, _) = rtnetlink::new_connection().context("opening a netlink socket")?;
    tokio::spawn(conn);
    Ok(handle)
}

/// A netlink (route) connection bound to the network namespace at `path`.
pub(crate) async fn netns_handle(path: &Path) -> Result<Handle> {
    let fd = run_in_netns(path, || {
        let sock = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE)
            .context("opening a netlink socket in the pod namespace")?;
        Ok(sock.into_raw_fd())
    })
    .await?;
    // SAFETY: `fd` is a netlink socket we own, handed over from the namespace thread. Not libc:
    // netlink-sys has no safe conversion from its Socket to its TokioSocket.
    let sock = unsafe { netlink_sys::TokioSocket::from_raw_fd(fd) };
    let (conn, handle, _) = rtnetlink::from_socket(sock);
    tokio::spawn(conn);
    Ok(handle)
}
