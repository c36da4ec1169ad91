//! Messages between the agent and its zygote. A request travels as one SOCK_SEQPACKET message
//! (JSON) with file descriptors attached: always a reply pipe first, then any stdio. The forked
//! worker writes its replies, one JSON line each, to the reply pipe.
//!
//! Three parties speak it: the agent's client ([`crate::zygote`]), the zygote's workers
//! (`zygote::server`) and the container monitors (`zygote::monitor`), which answer a `Create`
//! themselves. So it belongs to none of them. The monitor lives with the zygote that forks it
//! (though it outlives the zygote and the agent), and takes from it only the isolation and the
//! confinement every fork inherits. With the protocol here and the process chores in
//! [`crate::process`], the imports run one way: zygote server -> monitor -> {isolation,
//! confine, proto, process}.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};

use crate::config::LogConfig;
use crate::rootfs::RootfsSpec;

pub(crate) const MAX_MESSAGE: usize = 1 << 20;
pub(crate) const MAX_FDS: usize = 8;

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CreateArgs {
    pub id: String,
    /// The monitor shows itself as `ferrolet-monitor <display_name>`.
    pub display_name: String,
    /// The bundle directory: the container's state directory with config.json.
    pub bundle: PathBuf,
    pub lc_root: PathBuf,
    pub rootfs: RootfsSpec,
    /// Created inside the rootfs if the image lacks it.
    pub workdir: String,
    pub log: LogConfig,
    pub cgroup_path: String,
    /// What libcontainer builds from: config.json without the confinement below (see
    /// [`Confinement`]), in a directory of its own under `bundle`.
    pub lc_bundle: PathBuf,
    pub confinement: Confinement,
    /// Keep a stdin for attachers (else /dev/null).
    #[serde(default)]
    pub stdin: bool,
    #[serde(default)]
    pub stdin_once: bool,
    /// Run on a terminal: libcontainer allocates it and sends the master back.
    #[serde(default)]
    pub tty: bool,
    /// What the spec names on the host (rootfs, namespace files, bind mount sources): the
    /// monitor of an isolated zygote brings the mounts they are on into a mount namespace of
    /// its own (crate::mount_ns). None: build the container in the host's namespace.
    #[serde(default)]
    pub host_paths: Option<Vec<PathBuf>>,
    /// On cgroup v2: the device policy the monitor attaches to the container's cgroup (this
    /// directory) as an eBPF program before it reports the container created. None on v1,
    /// where libcgroups writes the rules to the devices controller, and for a container that
    /// may use every device.
    #[serde(default)]
    pub device_program: Option<(crate::devices::Policy, PathBuf)>,
    /// A container with a memory limit may not swap beyond it: what the monitor writes to its
    /// cgroup before it reports the container created ([`crate::cgroups::SwapBound`]).
    #[serde(default)]
    pub swap_bound: Option<crate::cgroups::SwapBound>,
    /// Kill what is left in the container's cgroup when its init exits: it shares a pid
    /// namespace (the pod's or the node's), so nothing else would.
    #[serde(default)]
    pub kill_all_on_exit: bool,
    /// A container in a user namespace is built from staged copies of what it names
    /// (crate::mount_ns::Staging) instead of [`Self::host_paths`].
    #[serde(default)]
    pub staged: Option<crate::mount_ns::Staging>,
}

/// How long after an exec's start deadline a worker still stuck on it ends itself (its timer),
/// and about how long the agent reads its replies after giving up (to kill a process that
/// started just too late).
pub(crate) const EXEC_WORKER_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ExecArgs {
    pub id: String,
    pub lc_root: PathBuf,
    /// The whole OCI process to run, written to a process.json for libcontainer's tenant
    /// builder, without capabilities and noNewPrivileges (`confinement` carries them). With
    /// `terminal` set, libcontainer allocates the terminal and the master goes back over the
    /// console fd.
    pub process: Box<oci_spec::runtime::Process>,
    pub confinement: Confinement,
    /// When the process must have started, CLOCK_MONOTONIC in nanoseconds (the agent and the
    /// zygote share the clock): the agent gives up waiting then, and the worker, still stuck a
    /// little later, is ended by its own timer (zygote/server.rs, `exec`). 0: no bound.
    #[serde(default)]
    pub start_by_ns: u64,
}

/// What confines the container's processes: its first one and every exec'd one. libcontainer
/// gets neither (its tenant builder drops the seccomp profile, and it would compile the profile
/// in every process); the zygote compiles the profile once and [`ConfinedExecutor`] applies all
/// three just before exec (docs/runtime.md#exec).
///
/// [`ConfinedExecutor`]: crate::zygote::confine::ConfinedExecutor
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Confinement {
    pub capabilities: Option<oci_spec::runtime::LinuxCapabilities>,
    pub no_new_privileges: bool,
    pub seccomp: Option<oci_spec::runtime::LinuxSeccomp>,
    /// `seccomp` compiled, filled in by the zygote from its cache before it forks (it drops
    /// `seccomp` then).
    #[serde(skip)]
    pub compiled: Option<std::sync::Arc<crate::seccomp_filter::Filter>>,
    /// An exec'd process of a container in a user namespace joins it here, then becomes the
    /// process's user inside: libcontainer's tenant builder joins every namespace of the
    /// container but that one (0.7: its list has no `user`), and was given user 0 to keep the
    /// host's privileges until then.
    #[serde(default)]
    pub join_user: Option<JoinUser>,
    /// The SELinux context the process is to run in (`process.selinuxLabel`, which
    /// libcontainer 0.7 does not apply), set for its execve.
    #[serde(default)]
    pub selinux_label: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct JoinUser {
    pub path: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub additional_gids: Vec<u32>,
    /// `path` opened by the worker, in the host's mount namespace, before libcontainer enters
    /// the container's (where the path is not, or is whatever the container put there).
    #[serde(skip)]
    pub fd: Option<i32>,
}

impl Confinement {
    /// Take the confinement out of `spec`, leaving it as libcontainer is to see it.
    pub(crate) fn take(spec: &mut oci_spec::runtime::Spec) -> Confinement {
        let mut c = Confinement::default();
        if let Some(p) = spec.process_mut().as_mut() {
            c.capabilities = p.capabilities().clone();
            c.no_new_privileges = p.no_new_privileges() == Some(true);
            c.selinux_label = p.selinux_label().clone().filter(|l| !l.is_empty());
            p.set_selinux_label(None);
            p.set_capabilities(None);
            p.set_no_new_privileges(None);
        }
        if let Some(l) = spec.linux_mut().as_mut() {
            c.seccomp = l.seccomp_mut().take();
        }
        c
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PinArgs {
    pub dir: PathBuf,
    pub pins: crate::namespaces::Pins,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Request {
    /// Fork a monitor that mounts the rootfs and creates the container (fds: reply).
    Create(Box<CreateArgs>),
    /// Let a created container run (fds: reply).
    Start { id: String, lc_root: PathBuf },
    /// Run a process in a running container (fds: reply, stdin, stdout, stderr; or, with
    /// a terminal `process`, reply and a unix socket the pty master is sent over).
    Exec(Box<ExecArgs>),
    /// Create pod namespaces and bind-mount them under a directory (fds: reply).
    Pin(PinArgs),
    /// Set the hostname of a pinned UTS namespace (a pre-built sandbox given to a pod; fds:
    /// reply).
    Hostname { uts: PathBuf, hostname: String },
    /// Move the zygote into a mount namespace of its own without the (private) mount of the
    /// runtime's root (fds: reply). Served by the zygote itself, not a fork.
    Isolate { root: PathBuf },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) enum Reply {
    Ok,
    Created { init_pid: i32, monitor_pid: i32 },
    ExecStarted { pid: i32 },
    Exited { exit_code: i32, signal: Option<i32> },
    Pinned(crate::namespaces::Pinned),
    Failed { error: String },
}

pub(crate) fn send_request(sock: RawFd, req: &Request, fds: &[RawFd]) -> std::io::Result<()> {
    let data = serde_json::to_vec(req).map_err(std::io::Error::other)?;
    let iov = [IoSlice::new(&data)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    sendmsg::<()>(
        sock,
        &iov,
        if fds.is_empty() { &[] } else { &cmsg },
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(std::io::Error::from)?;
    Ok(())
}

/// Receive one request. `Ok(None)` when the agent closed its end.
pub(crate) fn recv_request(sock: RawFd, buf: &mut [u8]) -> std::io::Result<Option<(Request, Vec<OwnedFd>)>> {
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg =
        recvmsg::<()>(sock, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC).map_err(std::io::Error::from)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel installed these fds for us and nothing else holds them. nix
            // 0.29 hands received fds over as RawFd.
            fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let n = msg.bytes;
    if n == 0 {
        return Ok(None);
    }
    let req = serde_json::from_slice(&buf[..n]).map_err(std::io::Error::other)?;
    Ok(Some((req, fds)))
}

/// Write one reply line (blocking; used in forked workers). Whether the whole line was
/// written: not when the agent has closed its end (it gave up waiting).
pub(crate) fn write_reply(fd: &OwnedFd, reply: &Reply) -> bool {
    let mut line = serde_json::to_vec(reply).unwrap_or_default();
    line.push(b'\n');
    // write_all's loop: short writes go on, EINTR tries again, any other error gives up.
    let mut rest = &line[..];
    while !rest.is_empty() {
        match nix::unistd::write(fd, rest) {
            Ok(0) => break,
            Ok(n) => rest = &rest[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    rest.is_empty()
}
