//! A pod's namespaces (docs/sandbox.md): network, IPC and UTS namespaces pinned by bind mounts
//! of their `/proc/<pid>/ns/*` files, so they outlive the process that made them and the pod
//! needs no pause container; a pid namespace shared by the pod's containers
//! (`shareProcessNamespace`), which cannot be pinned like the others and so has an init process
//! of its own, [`pod_init`]; and a user namespace owning all of them (`hostUsers: false`,
//! docs/userns.md).
//!
//! A zygote worker does the work ([`pin`]): namespaces are made by `unshare`, which changes the
//! calling process, and only a single-threaded, disposable one may do that.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::sched::CloneFlags;
use nix::unistd::{fork, ForkResult, Pid};
use serde::{Deserialize, Serialize};

/// What a pod's sandbox pins, under one directory (files `net`, `ipc`, `uts`, `pid`, `user`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pins {
    /// Set in a new UTS namespace.
    pub hostname: Option<String>,
    pub net: bool,
    pub ipc: bool,
    pub uts: bool,
    /// A pid namespace for the pod, held by an init process.
    pub pid: Option<PodInit>,
    /// A user namespace owning the others, mapping container ids 0..size to host ids
    /// host..host+size (uids and gids alike).
    pub user: Option<IdRange>,
}

/// The init process of a pod's pid namespace.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodInit {
    /// `ps` shows it as `ferrolet-pod-init <display_name>`.
    pub display_name: String,
    /// The `cgroup.procs` files it is moved into (a leaf of the pod's cgroup, every hierarchy).
    pub cgroup_procs: Vec<PathBuf>,
    /// An empty directory it is confined to (chroot).
    pub root: PathBuf,
}

/// A range of ids a user namespace maps, from 0 inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdRange {
    pub host: u32,
    pub size: u32,
}

/// A process as the runtime records it: a pid is only trusted together with its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessRef {
    pub pid: i32,
    pub start: u64,
}

impl ProcessRef {
    pub fn of(pid: i32) -> Option<ProcessRef> {
        crate::pidfd::process_start_time(pid).map(|start| ProcessRef { pid, start })
    }

    /// Still the same process.
    pub fn alive(&self) -> bool {
        crate::pidfd::process_matches(self.pid, self.start)
    }

    /// SIGKILL it if it is still the same process; wait (up to `timeout`) until it is gone.
    pub fn kill(&self, timeout: std::time::Duration) -> std::io::Result<()> {
        if !self.alive() {
            return Ok(());
        }
        let pidfd = match crate::pidfd::PidFd::open(self.pid) {
            Ok(p) => p,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(()),
            Err(e) => return Err(e),
        };
        // the pidfd is of the pid now: check it is still the recorded process
        if !self.alive() {
            return Ok(());
        }
        pidfd.send_signal(libc::SIGKILL)?;
        let deadline = std::time::Instant::now() + timeout;
        while self.alive() {
            if std::time::Instant::now() > deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("process {} still there after SIGKILL", self.pid),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(())
    }
}

/// What [`pin`] made besides the pins.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Pinned {
    /// The pod's init process, when it has a pid namespace.
    pub init: Option<ProcessRef>,
}

/// The namespace files [`pin`] may create under its directory.
pub(crate) const PIN_NAMES: &[&str] = &["net", "ipc", "uts", "pid", "user"];

/// New namespaces for a pod, bind-mounted to files under `dir` (what CRI-O's pinns does), in the
/// calling process's mount namespace (the host's). Runs in a zygote worker, which it changes.
pub(crate) fn pin(dir: &Path, pins: &Pins) -> Result<Pinned, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    // The init's empty root, opened now, as the host's root: inside a user namespace the path
    // to it may not be searchable.
    let init_root = match &pins.pid {
        Some(spec) => {
            Some(std::fs::File::open(&spec.root).map_err(|e| format!("opening {}: {e}", spec.root.display()))?)
        }
        None => None,
    };
    let mut flags = CloneFlags::empty();
    for (on, f) in [
        (pins.net, CloneFlags::CLONE_NEWNET),
        (pins.ipc, CloneFlags::CLONE_NEWIPC),
        (pins.uts, CloneFlags::CLONE_NEWUTS),
        (pins.pid.is_some(), CloneFlags::CLONE_NEWPID),
    ] {
        if on {
            flags |= f;
        }
    }
    match pins.user {
        None => {
            // This worker makes them itself.
            nix::sched::unshare(flags).map_err(|e| format!("unshare: {e}"))?;
            let init = populate(pins, init_root.as_ref())?;
            bind_all(dir, pins, "self", init)?;
            finish_init(pins, init)
        }
        Some(range) => pin_in_user_namespace(dir, pins, flags, range, init_root.as_ref()),
    }
}

/// In the new namespaces: the hostname, loopback up, and the init of the pid namespace.
fn populate(pins: &Pins, init_root: Option<&std::fs::File>) -> Result<Option<Pid>, String> {
    if pins.uts {
        if let Some(h) = &pins.hostname {
            nix::unistd::sethostname(h).map_err(|e| format!("sethostname {h:?}: {e}"))?;
        }
    }
    if pins.net {
        loopback_up().map_err(|e| format!("bringing up lo: {e}"))?;
    }
    let (Some(spec), Some(root)) = (&pins.pid, init_root) else {
        return Ok(None);
    };
    // The first child after unshare(CLONE_NEWPID) is pid 1 there.
    // SAFETY: a zygote worker is single-threaded.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => pod_init::run(spec, root),
        Ok(ForkResult::Parent { child }) => Ok(Some(child)),
        Err(e) => Err(format!("forking the pod's init: {e}")),
    }
}

/// Bind-mount the namespaces of `/proc/<who>` (and the pid namespace of `init`) onto the pins.
fn bind_all(dir: &Path, pins: &Pins, who: &str, init: Option<Pid>) -> Result<(), String> {
    let wanted = [
        (pins.user.is_some(), "user", format!("/proc/{who}/ns/user")),
        (pins.net, "net", format!("/proc/{who}/ns/net")),
        (pins.ipc, "ipc", format!("/proc/{who}/ns/ipc")),
        (pins.uts, "uts", format!("/proc/{who}/ns/uts")),
        (
            init.is_some(),
            "pid",
            format!("/proc/{}/ns/pid", init.map(|p| p.as_raw()).unwrap_or(0)),
        ),
    ];
    for (on, name, src) in wanted {
        if !on {
            continue;
        }
        let target = dir.join(name);
        std::fs::File::create(&target).map_err(|e| format!("creating {}: {e}", target.display()))?;
        nix::mount::mount(
            Some(src.as_str()),
            &target,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("bind-mounting {src} on {}: {e}", target.display()))?;
    }
    Ok(())
}

/// Move the init into its cgroup (as the host's root: a process in a user namespace may not)
/// and say which process it is.
fn finish_init(pins: &Pins, init: Option<Pid>) -> Result<Pinned, String> {
    let Some(init) = init else {
        return Ok(Pinned::default());
    };
    let spec = pins.pid.as_ref().expect("an init only with a pid namespace");
    for procs in &spec.cgroup_procs {
        std::fs::write(procs, init.as_raw().to_string())
            .map_err(|e| format!("moving the pod's init into {}: {e}", procs.display()))?;
    }
    let init = ProcessRef::of(init.as_raw()).ok_or("the pod's init is gone already")?;
    Ok(Pinned { init: Some(init) })
}

/// With a user namespace: the namespaces must be made by a process inside it, so they belong
/// to it (a container's root may then mount sysfs for the pod's network namespace, set its
/// sysctls), and its id maps written by a process outside, with the host's privileges, which
/// also makes the pins in the host's mount namespace. A child makes the namespaces; this
/// worker maps and pins them, then lets the child go.
fn pin_in_user_namespace(
    dir: &Path,
    pins: &Pins,
    flags: CloneFlags,
    range: IdRange,
    init_root: Option<&std::fs::File>,
) -> Result<Pinned, String> {
    let (to_child_r, to_child_w) = pipe()?;
    let (from_child_r, from_child_w) = pipe()?;
    // SAFETY: a zygote worker is single-threaded.
    let child = match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            drop((to_child_w, from_child_r));
            let mut to_parent = std::fs::File::from(from_child_w);
            let r = in_user_namespace_child(pins, flags, to_child_r, &mut to_parent, init_root);
            if let Err(e) = r {
                let _ = to_parent.write_all(format!("E{e}\n").as_bytes());
            }
            crate::process::exit(0)
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => return Err(format!("fork: {e}")),
    };
    drop((to_child_r, from_child_w));
    let mut to_child = std::fs::File::from(to_child_w);
    let mut from_child = std::io::BufReader::new(std::fs::File::from(from_child_r));
    let result = (|| {
        expect_line(&mut from_child, "U")?;
        let map = format!("0 {} {}\n", range.host, range.size);
        for file in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{child}/{file}"), &map)
                .map_err(|e| format!("writing the pod's {file} ({map:?}): {e}"))?;
        }
        to_child
            .write_all(b"M")
            .map_err(|e| format!("to the namespace child: {e}"))?;
        let line = expect_line(&mut from_child, "R")?;
        let init = line.trim().parse::<i32>().ok().filter(|p| *p > 0).map(Pid::from_raw);
        bind_all(dir, pins, &child.to_string(), init)?;
        finish_init(pins, init)
    })();
    // The child waits for this before it exits (holding the namespaces until they are pinned).
    drop(to_child);
    let _ = nix::sys::wait::waitpid(child, None);
    result
}

fn in_user_namespace_child(
    pins: &Pins,
    flags: CloneFlags,
    from_parent: OwnedFd,
    to_parent: &mut std::fs::File,
    init_root: Option<&std::fs::File>,
) -> Result<(), String> {
    let mut from_parent = std::fs::File::from(from_parent);
    nix::sched::unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| format!("unshare(CLONE_NEWUSER): {e}"))?;
    to_parent.write_all(b"U\n").map_err(|e| e.to_string())?;
    let mut b = [0u8; 1];
    from_parent
        .read_exact(&mut b)
        .map_err(|_| "the worker did not map the user namespace".to_string())?;
    // root inside: the namespaces made now are the pod's root's
    nix::unistd::setresgid(0.into(), 0.into(), 0.into()).map_err(|e| format!("setresgid(0): {e}"))?;
    nix::unistd::setresuid(0.into(), 0.into(), 0.into()).map_err(|e| format!("setresuid(0): {e}"))?;
    nix::sched::unshare(flags).map_err(|e| format!("unshare: {e}"))?;
    let init = populate(pins, init_root)?;
    let pid = init.map(|p| p.as_raw()).unwrap_or(0);
    to_parent
        .write_all(format!("R{pid}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    // until the worker has pinned the namespaces and closes its end
    let _ = from_parent.read(&mut b);
    Ok(())
}

fn pipe() -> Result<(OwnedFd, OwnedFd), String> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))
}

/// The child's next line, which must start with `tag` (an `E` line is its error).
fn expect_line(r: &mut impl std::io::BufRead, tag: &str) -> Result<String, String> {
    let mut line = String::new();
    r.read_line(&mut line)
        .map_err(|e| format!("from the namespace child: {e}"))?;
    if let Some(e) = line.strip_prefix('E') {
        return Err(e.trim().to_string());
    }
    line.strip_prefix(tag)
        .map(str::to_string)
        .ok_or_else(|| format!("the namespace child ended early ({line:?})"))
}

fn loopback_up() -> std::io::Result<()> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    use std::os::fd::AsRawFd;
    let s = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
    // SAFETY: a zeroed ifreq is valid (all integers and arrays), "lo" fits its name.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo\0".iter().enumerate() {
        ifr.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write the ifreq given, which outlives the
    // calls, on a socket we own; reading `ifru_flags` of the union the kernel just filled.
    // nix has no interface-flags ioctls (only macros that generate raw ones).
    let r = unsafe {
        let mut r = libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut ifr);
        if r == 0 {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            r = libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS as _, &ifr);
        }
        r
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Undo [`pin`]'s mounts: unmount and remove the files. The init is the caller's to stop first.
pub fn unpin(dir: &Path) -> crate::Result<()> {
    use crate::error::Context;
    for name in PIN_NAMES {
        let f = dir.join(name);
        if f.exists() {
            crate::rootfs::unmount(&f).with_context(|| format!("unpinning {}", f.display()))?;
            let _ = std::fs::remove_file(&f);
        }
    }
    Ok(())
}

/// PID 1 of a pod's shared pid namespace: it holds the namespace (once it exits no process can
/// be created there and the kernel kills every one left) and reaps the processes orphaned in it,
/// as kubelet's pause container does. It runs nothing else and can be reached by nothing in
/// the pod: no capabilities, no new privileges, not dumpable (so no container process may
/// ptrace it, nor follow `/proc/1/root` or `/proc/1/exe`), confined to an empty directory,
/// no open files. Inside its namespace only signals it handles reach it, and it handles none:
/// only the host's SIGKILL ends it.
pub mod pod_init {
    use super::PodInit;

    pub(crate) fn run(spec: &PodInit, root: &std::fs::File) -> ! {
        crate::process::set_name("ferrolet-init");
        crate::process::set_title(&format!("ferrolet-pod-init {}", spec.display_name));
        crate::process::reset_signals();
        crate::process::detach_stdio();
        let _ = nix::unistd::setsid();
        if confine(root).is_err() {
            crate::process::exit(1);
        }
        crate::process::close_other_fds(-1);
        // Children whose parent ignores SIGCHLD are reaped by the kernel as they exit: the
        // orphans reparented to this process never linger as zombies.
        // SAFETY: SIG_IGN runs no code of this process. nix's signal() needs this block too (a
        // handler could be any function).
        unsafe {
            let _ = nix::sys::signal::signal(nix::sys::signal::Signal::SIGCHLD, nix::sys::signal::SigHandler::SigIgn);
        }
        loop {
            nix::unistd::pause();
        }
    }

    fn confine(root: &std::fs::File) -> nix::Result<()> {
        nix::unistd::fchdir(std::os::fd::AsRawFd::as_raw_fd(root))?;
        nix::unistd::chroot(".")?;
        // every capability, in every set, for good
        for cap in 0..=63 {
            // SAFETY: PR_CAPBSET_DROP takes integers only; numbers the kernel does not know
            // fail harmlessly. Neither nix nor the caps crate (which knows only the
            // capabilities it names) drops by number.
            unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        }
        let _ = caps::clear(None, caps::CapSet::Ambient);
        let _ = nix::sys::prctl::set_no_new_privs();
        for set in [
            caps::CapSet::Inheritable,
            caps::CapSet::Effective,
            caps::CapSet::Permitted,
        ] {
            caps::clear(None, set).map_err(|_| nix::Error::EPERM)?;
        }
        // Last, as credential changes reset it.
        nix::sys::prctl::set_dumpable(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_known_by_its_pid_and_start() {
        let me = ProcessRef::of(std::process::id() as i32).unwrap();
        assert!(me.alive());
        let other = ProcessRef {
            pid: me.pid,
            start: me.start + 1,
        };
        assert!(!other.alive(), "a reused pid is another process");
        // killing a process that is not there any more is done
        other.kill(std::time::Duration::from_millis(10)).unwrap();
    }
}
