//! The runtime's public face: create, start, signal, wait for, exec in, delete and list
//! containers, and pin pod namespaces. Everything that needs libcontainer goes through the
//! zygote; everything else (spec generation, state files, cgroup reads) happens here.

use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::attach::{Attach, AttachOptions};
use crate::cgroups::{CgroupStats, Cgroups};
use crate::config::ContainerConfig;
use crate::container::{self, ContainerInfo, ContainerRecord, ContainerState, ExitRecord, StartedRecord};
use crate::container_cache::ContainerCache;
use crate::digest::Digest;
use crate::error::{p, Context, Error, Result};
use crate::image::ImageStore;
use crate::pidfd::{process_matches, PidFd};
use crate::proto::{Confinement, CreateArgs, ExecArgs, PinArgs, Reply, Request, EXEC_WORKER_GRACE};
use crate::rootfs::RootfsSpec;
use crate::spec::{build_spec, SpecInput};
use crate::user::{resolve_user, ImageFiles};
use crate::zygote::{Replies, ZygoteClient, ZygoteHandle};
use ferrolet_fsutil::{
    chain, ensure_dir, ensure_private_dir, random_hex, read_json, remove_tree, write_atomic_in,
    write_json_atomic_unsynced,
};

/// The overlay upper directory's name in a container's state directory.
const UPPER_DIR: &str = "upper";
/// libcontainer's bundle inside a container's directory: its config.json (see `prepare`).
const LC_BUNDLE_DIR: &str = "lc-bundle";

pub struct Runtime {
    root: PathBuf,
    lc_root: PathBuf,
    images: std::sync::Arc<ImageStore>,
    zygote: ZygoteClient,
    cgroups: Cgroups,
    /// How long a request that waits on the zygote may take (kubelet's runtimeRequestTimeout):
    /// an exec whose process has not started by then fails.
    request_timeout: Duration,
    /// Container states read before, reused while unchanged (`list`, `inspect`).
    states: ContainerCache,
}

/// kubelet's default runtimeRequestTimeout.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// A process to run inside a running container.
#[derive(Debug, Clone, Default)]
pub struct ExecSpec {
    pub args: Vec<String>,
    /// Added to (and overriding) the container's environment.
    pub env: Vec<(String, String)>,
    /// Defaults to the container's working directory.
    pub cwd: Option<String>,
    /// Defaults to the container's user.
    pub user: Option<(u32, u32)>,
    /// How long the process may take to start; the runtime's request timeout when unset.
    pub start_timeout: Option<Duration>,
}

/// Where an exec'd process's stdio goes.
pub struct ExecIo {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// A running exec'd process. Dropped before [`ExecProcess::wait`] has seen it exit (the
/// session it belongs to ended: its client went away, its handler was cancelled), it is killed
/// with SIGKILL, as kubelet's exec kills the process when the stream ends: nothing outlives
/// the session it was started for.
pub struct ExecProcess {
    pid: i32,
    pidfd: Option<PidFd>,
    replies: Replies,
    /// The exit was seen: nothing to kill.
    exited: bool,
}

impl Drop for ExecProcess {
    fn drop(&mut self) {
        if self.exited {
            return;
        }
        if let Some(p) = &self.pidfd {
            // The pidfd names this process even if the pid was reused; ESRCH once it is gone.
            match p.send_signal(libc::SIGKILL) {
                Ok(()) => tracing::info!(pid = self.pid, "exec: the session ended, killed the process"),
                Err(e) => tracing::debug!(pid = self.pid, error = %e, "exec: killing the process"),
            }
        }
    }
}

impl ExecProcess {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn kill(&self, signal: i32) -> Result<()> {
        if let Some(p) = &self.pidfd {
            p.send_signal(signal).context("signalling exec process")?;
        }
        Ok(())
    }

    /// Wait for the process; its exit code (128 + signal when killed).
    pub async fn wait(mut self) -> Result<i32> {
        match self.replies.next().await? {
            Reply::Exited { exit_code, .. } => {
                self.exited = true;
                Ok(exit_code)
            }
            Reply::Failed { error } => Err(Error::Zygote(error)),
            other => Err(Error::Zygote(format!("unexpected reply {other:?}"))),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The timeout passed and the process was killed.
    pub timed_out: bool,
}

impl Runtime {
    /// Open the runtime state under `root` (e.g. /var/lib/ferrolet), using a zygote forked
    /// earlier with [`crate::fork_zygote`].
    pub fn new(root: impl Into<PathBuf>, zygote: ZygoteHandle) -> Result<Runtime> {
        let root = root.into();
        for sub in ["libcontainer", "sandboxes", STAGE_DIR] {
            ensure_dir(&root.join(sub))?;
        }
        // What a staged container's spec names as its rootfs must exist where it is exec'd
        // into (libcontainer canonicalizes it), though nothing there is used.
        ensure_dir(&root.join(STAGE_DIR).join("rootfs"))?;
        // Containers' root filesystems are mounted in here, setuid files and device nodes of
        // their images included: no other user of the host may reach them.
        ensure_private_dir(&root.join("containers"))?;
        let rt = Runtime {
            lc_root: root.join("libcontainer"),
            images: std::sync::Arc::new(ImageStore::open(root.join("images"))?),
            zygote: ZygoteClient::new(zygote),
            cgroups: Cgroups::detect()?,
            root,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            states: ContainerCache::default(),
        };
        Ok(rt)
    }

    /// Bound requests that wait on the zygote with `timeout` (the agent's
    /// runtimeRequestTimeout) instead of [`DEFAULT_REQUEST_TIMEOUT`].
    pub fn with_request_timeout(mut self, timeout: Duration) -> Runtime {
        self.request_timeout = timeout;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn images(&self) -> &ImageStore {
        &self.images
    }

    /// The same store as [`images`](Self::images), shared: a registry
    /// [`Puller`](crate::registry::Puller) writes into it.
    pub fn image_store(&self) -> std::sync::Arc<ImageStore> {
        self.images.clone()
    }

    pub fn cgroups(&self) -> &Cgroups {
        &self.cgroups
    }

    pub fn zygote_pid(&self) -> i32 {
        self.zygote.pid()
    }

    fn dir(&self, id: &str) -> PathBuf {
        container::state_dir(&self.root, id)
    }

    /// The container's writable layer (the overlay's upper directory): what its rootfs uses on
    /// disk beyond the image.
    pub fn upper_dir(&self, id: &str) -> PathBuf {
        self.dir(id).join(UPPER_DIR)
    }

    /// Create a container (its process waits for [`start`](Self::start)).
    pub async fn create(&self, cfg: &ContainerConfig) -> Result<ContainerInfo> {
        let id = random_hex(32);
        let prepared = {
            let id = id.clone();
            let cfg = cfg.clone();
            let images_dir = self.images.dir().to_path_buf();
            let dir = self.dir(&id);
            let lc_root = self.lc_root.clone();
            let cgroups = self.cgroups.clone();
            let stage = self.root.join(STAGE_DIR);
            ferrolet_fsutil::spawn_blocking(move || prepare(&id, &cfg, &images_dir, &dir, &lc_root, &cgroups, &stage))
                .await
                .map_err(|e| Error::Zygote(format!("prepare task: {e}")))?
        };
        let args = match prepared {
            Ok(a) => a,
            Err(e) => {
                let dir = self.dir(&id);
                let _ = blocking(move || remove_tree(&dir)).await;
                return Err(e);
            }
        };
        let target = args.rootfs.target.clone();
        let mut replies = self.zygote.call(&Request::Create(Box::new(args)), &[])?;
        match replies.next().await {
            Ok(Reply::Created { .. }) => container::load(&self.dir(&id), &self.cgroups),
            Ok(Reply::Failed { error }) => {
                // The monitor answers, then exits: until it has, it holds the log file open
                // (a caller that removes the log would not get its inode back yet).
                replies.closed(Duration::from_secs(5)).await;
                self.undo_create(&id, target).await;
                Err(Error::container(&id, error))
            }
            Ok(other) => Err(Error::container(&id, format!("unexpected reply {other:?}"))),
            Err(e) => {
                self.undo_create(&id, target).await;
                Err(e)
            }
        }
    }

    /// A failed creation leaves nothing behind: its rootfs mount and directory, and when the
    /// monitor failed after libcontainer had built the container (its state could not be
    /// recorded, say, on a full disk), the container's cgroup and libcontainer's state too.
    async fn undo_create(&self, id: &str, target: PathBuf) {
        let cgroup = container::load(&self.dir(id), &self.cgroups)
            .map(|i| i.record.cgroup_path)
            .unwrap_or_default();
        let (cgroups, lc_dir, dir) = (self.cgroups.clone(), self.lc_root.join(id), self.dir(id));
        let undone = blocking(move || {
            remove_built(&cgroups, &cgroup, &lc_dir)?;
            let _ = crate::rootfs::unmount(&target);
            remove_tree(&dir)?;
            Ok::<_, Error>(())
        })
        .await;
        if let Err(e) = undone {
            tracing::warn!(container = id, error = %chain(&e), "cleaning up after a failed creation");
        }
    }

    /// Let a created container's process run.
    pub async fn start(&self, id: &str) -> Result<()> {
        let info = self.inspect(id)?;
        if !matches!(info.state, ContainerState::Created) {
            return Err(Error::container(
                id,
                format!("cannot start a container in state {:?}", info.state),
            ));
        }
        self.zygote
            .call_ok(&Request::Start {
                id: id.to_string(),
                lc_root: self.lc_root.clone(),
            })
            .await
            .map_err(|e| Error::container(id, format!("start: {}", chain(&e))))?;
        let started = StartedRecord {
            started_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
        };
        let path = self.dir(id).join("started.json");
        // Not fsynced: after a reboot the container is gone whether it started or not (the boot
        // id says so), and while the node is up the page cache holds it for the next reader.
        blocking(move || write_json_atomic_unsynced(&path, &started)).await
    }

    /// Send `signal` to the container's init process. A container that already exited is not
    /// an error. A container in state [`ContainerState::Unknown`] (no usable record of its
    /// init) gets the signal in every process of its cgroup.
    pub fn kill(&self, id: &str, signal: i32) -> Result<()> {
        let info = self.inspect(id)?;
        if matches!(info.state, ContainerState::Unknown { .. }) {
            let cgroup = self.cgroup_of(&info);
            if !cgroup.is_empty() {
                self.cgroups.signal_all(&cgroup, signal);
            }
            return Ok(());
        }
        let Some(m) = &info.monitor else {
            return Ok(());
        };
        if m.init_pid == 0 && info.state.may_be_alive() {
            // The monitor was found through the kernel but not the container's init: signal
            // what runs in its cgroup rather than nothing.
            let cgroup = self.cgroup_of(&info);
            if !cgroup.is_empty() {
                self.cgroups.signal_all(&cgroup, signal);
            }
            return Ok(());
        }
        if !info.state.may_be_alive() || !process_matches(m.init_pid, m.init_start) {
            return Ok(());
        }
        let pfd = match PidFd::open(m.init_pid) {
            Ok(p) => p,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(()),
            Err(e) => return Err(ferrolet_fsutil::Error::io(format!("opening pidfd of container {id}"), e).into()),
        };
        // Re-check after opening: the pidfd now pins the process we verified.
        if !process_matches(m.init_pid, m.init_start) {
            return Ok(());
        }
        Ok(pfd
            .send_signal(signal)
            .with_context(|| format!("signalling container {id}"))?)
    }

    /// The container's cgroup: as recorded, else the cgroup of a process named after it (empty
    /// when neither is known).
    fn cgroup_of(&self, info: &ContainerInfo) -> String {
        if !info.record.cgroup_path.is_empty() {
            return info.record.cgroup_path.clone();
        }
        crate::probe::cgroup_named(info.id()).unwrap_or_default()
    }

    /// Wait for the container to exit and return how it ended ([`ContainerState::Exited`] or
    /// [`ContainerState::ExitUnknown`]). A container in state [`ContainerState::Unknown`] is
    /// polled until the kernel shows it gone.
    pub async fn wait(&self, id: &str) -> Result<ExitRecord> {
        loop {
            let info = self.inspect(id)?;
            match info.state {
                ContainerState::Exited(e) | ContainerState::ExitUnknown(e) => return Ok(e),
                ContainerState::Incomplete => {
                    return Err(Error::container(id, "creation did not complete"));
                }
                ContainerState::Unknown { .. } => tokio::time::sleep(Duration::from_millis(250)).await,
                ContainerState::Created | ContainerState::Running => {
                    // (load() derives these states from a live monitor, so it is there)
                    let Some(m) = info.monitor else {
                        return Err(Error::container(id, "running without a monitor record"));
                    };
                    match PidFd::open(m.monitor_pid) {
                        Ok(pfd) if process_matches(m.monitor_pid, m.monitor_start) => {
                            pfd.exited().await.context("waiting for monitor")?;
                        }
                        // Gone in between: the next inspect tells how it ended.
                        _ => {}
                    }
                }
            }
        }
    }

    /// Signal, wait up to `grace`, then SIGKILL and wait.
    pub async fn stop(&self, id: &str, signal: i32, grace: Duration) -> Result<ExitRecord> {
        self.kill(id, signal)?;
        match tokio::time::timeout(grace, self.wait(id)).await {
            Ok(r) => r,
            Err(_) => {
                self.kill(id, libc::SIGKILL)?;
                self.wait(id).await
            }
        }
    }

    /// Remove a container: kill what runs, remove its cgroup, rootfs and state. The log file
    /// stays (it belongs to the caller). Works when its records cannot be read: what runs is
    /// killed by cgroup, libcontainer's part is removed by hand if libcontainer cannot load it.
    pub async fn delete(&self, id: &str) -> Result<()> {
        let dir = self.dir(id);
        if !dir.exists() {
            return Ok(());
        }
        let info = match self.inspect(id) {
            Ok(i) => i,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        // (before the kill: without a record, the cgroup is found through its processes)
        let cgroup = self.cgroup_of(&info);
        if info.state.may_be_alive() {
            self.kill(id, libc::SIGKILL)?;
            // The monitor records the exit; do not wait forever on a wedged one.
            let _ = tokio::time::timeout(Duration::from_secs(10), self.wait(id)).await;
        }
        // What libcontainer's own delete would do for these containers, done here without
        // forking a worker to load it (`remove_built`). It would also build a cgroup manager that
        // re-reads the mount table once per controller (docs/start-path.md), and it cannot
        // delete a container whose state is gone.
        let (cgroups, cg, lc_dir) = (self.cgroups.clone(), cgroup.clone(), self.lc_root.join(id));
        blocking(move || remove_built(&cgroups, &cg, &lc_dir))
            .await
            .map_err(|e| Error::container(id, format!("delete: {}", chain(&e))))?;
        let id = id.to_string();
        blocking(move || {
            crate::rootfs::unmount(&dir.join("rootfs")).with_context(|| format!("container {id}"))?;
            remove_tree(&dir)
        })
        .await
    }

    /// Every container directory, oldest first, each with its state. A container whose records
    /// cannot be read is listed too (with [`ContainerInfo::record_errors`], its state decided by
    /// the kernel), so a live container never vanishes from the list.
    pub fn list(&self) -> Result<Vec<ContainerInfo>> {
        let base = self.root.join("containers");
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for e in std::fs::read_dir(&base).with_context(|| format!("listing {}", p(&base)))? {
            let e = e.with_context(|| format!("listing {}", p(&base)))?;
            let id = e.file_name().to_string_lossy().into_owned();
            if id.starts_with('.') {
                continue;
            }
            match self.load(&id, &e.path()) {
                Ok(i) => {
                    seen.insert(id);
                    out.push(i)
                }
                // deleted meanwhile, or not a directory
                Err(err) if err.is_not_found() => {}
                Err(err) => {
                    seen.insert(id);
                    tracing::warn!(dir = %e.path().display(), error = %chain(&err), "reading container state")
                }
            }
        }
        self.states.retain(&seen);
        out.sort_by(|a, b| a.record.created_at.cmp(&b.record.created_at));
        Ok(out)
    }

    /// The container's record and state. Not found only when its state directory does not
    /// exist: unreadable records give a rebuilt record and a state the kernel decides.
    pub fn inspect(&self, id: &str) -> Result<ContainerInfo> {
        if id.is_empty() || id.contains('/') || id.starts_with('.') {
            return Err(Error::ContainerNotFound(id.to_string()));
        }
        self.load(id, &self.dir(id))
    }

    /// The container's state when what was read of it before still holds (its directory's
    /// stat unchanged, its monitor's pidfd not readable): one `statx` and one `poll`, cheap
    /// enough for an async task to call without a hand-off to the blocking pool. `None` when
    /// it has to be read ([`inspect`](Self::inspect)).
    pub fn inspect_cached(&self, id: &str) -> Option<ContainerInfo> {
        if id.is_empty() || id.contains('/') || id.starts_with('.') {
            return None;
        }
        let meta = std::fs::metadata(self.dir(id)).ok().filter(|m| m.is_dir())?;
        self.states.get(id, &meta)
    }

    /// One container's state: as read before when nothing it was read from has changed
    /// (container_cache), else from its records and the kernel.
    fn load(&self, id: &str, dir: &Path) -> Result<ContainerInfo> {
        let read_at = std::time::SystemTime::now();
        let meta = match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => m,
            _ => {
                self.states.forget(id);
                return Err(Error::ContainerNotFound(id.to_string()));
            }
        };
        if let Some(info) = self.states.get(id, &meta) {
            return Ok(info);
        }
        let info = container::load(dir, &self.cgroups)?;
        self.states.put(id, &meta, read_at, &info);
        Ok(info)
    }

    /// Remove state directories of creations interrupted before the container record was
    /// written: no `container.json`, and nothing that shows the creation went further (no
    /// monitor record, libcontainer state, mount, or monitor holding it). A directory that lost
    /// its record later is kept: [`list`](Self::list) shows it and [`delete`](Self::delete)
    /// removes it. Returns how many were removed. Only while no creation is under way (the
    /// agent's start, reset): a creation in flight has no record yet either.
    pub fn remove_orphans(&self) -> Result<usize> {
        let base = self.root.join("containers");
        let mut n = 0;
        for e in std::fs::read_dir(&base)
            .with_context(|| format!("listing {}", p(&base)))?
            .flatten()
        {
            let (dir, name) = (e.path(), e.file_name().to_string_lossy().into_owned());
            if name.starts_with('.') || !self.is_orphan(&name) {
                continue;
            }
            let _ = crate::rootfs::unmount(&dir.join("rootfs"));
            remove_tree(&dir)?;
            n += 1;
        }
        Ok(n)
    }

    /// Whether container `id`'s state directory is what [`remove_orphans`](Self::remove_orphans)
    /// removes: no `container.json`, and nothing showing the creation went further (a
    /// directory that went further is kept, and said). No directory is no orphan.
    pub fn is_orphan(&self, id: &str) -> bool {
        let dir = self.root.join("containers").join(id);
        if !dir.is_dir() || dir.join("container.json").exists() {
            return false;
        }
        let went_further = ["monitor.json", "started.json", "exit.json"]
            .iter()
            .any(|f| dir.join(f).exists())
            || self.lc_root.join(id).exists()
            || !crate::rootfs::mounts_under(&dir).is_empty()
            || crate::probe::monitor_holding(&dir).is_some();
        if went_further {
            tracing::warn!(dir = %dir.display(), "container directory without container.json kept: creation went further");
        }
        !went_further
    }

    /// Usage numbers of a container's cgroup.
    pub fn stats(&self, id: &str) -> Result<CgroupStats> {
        let info = self.inspect(id)?;
        Ok(self.cgroups.stats(&info.record.cgroup_path))
    }

    /// Image ids used by existing containers, with the container ids (for image removal).
    pub fn image_users(&self) -> Result<Vec<(String, Digest)>> {
        Ok(self
            .list()?
            .into_iter()
            .map(|c| (c.record.id.clone(), c.record.image_ref.clone()))
            .collect())
    }

    /// Start a process in a running container with the given stdio.
    pub async fn exec(&self, id: &str, spec: &ExecSpec, io: ExecIo) -> Result<ExecProcess> {
        let (args, limit) = self.exec_args(id, spec, false)?;
        let replies = self
            .zygote
            .call(&Request::Exec(Box::new(args)), &[&io.stdin, &io.stdout, &io.stderr])?;
        drop(io);
        let (pid, replies) = Self::exec_started(id, replies, limit).await?;
        Ok(ExecProcess {
            pid,
            pidfd: PidFd::open(pid).ok(),
            replies,
            exited: false,
        })
    }

    /// Start a process in a running container on a new terminal: it is a session leader with
    /// the terminal as its controlling tty and stdin, stdout and stderr. The terminal is
    /// allocated inside the container, from the container's own devpts (`tty` prints
    /// `/dev/pts/N` of the container). Returns the process and the pty master (blocking,
    /// close-on-exec): the caller reads the output from it and writes the input to it, and
    /// resizes with [`crate::resize_tty`]. `TERM=xterm` is set unless `spec.env` sets `TERM`.
    pub async fn exec_tty(&self, id: &str, spec: &ExecSpec) -> Result<(ExecProcess, OwnedFd)> {
        let (args, limit) = self.exec_args(id, spec, true)?;
        let (ours, theirs) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .context("creating the socket for the pty master")?;
        let replies = self.zygote.call(&Request::Exec(Box::new(args)), &[&theirs])?;
        drop(theirs);
        let (pid, replies) = Self::exec_started(id, replies, limit).await?;
        // Made first: a process whose terminal cannot be had is killed with it.
        let proc_ = ExecProcess {
            pid,
            pidfd: PidFd::open(pid).ok(),
            replies,
            exited: false,
        };
        // The worker sent the master before it replied.
        let master = crate::tty::recv_fd_now(std::os::fd::AsFd::as_fd(&ours))
            .map_err(|e| Error::container(id, format!("exec: {}", chain(&e))))?;
        Ok((proc_, master))
    }

    /// Attach to a running container's stdio through its monitor: output from now on (stdout
    /// and stderr, or the terminal's output as stdout), and stdin when the container was
    /// created with `stdin` (asking for stdin otherwise is an error naming `stdin`).
    pub async fn attach(&self, id: &str, opts: AttachOptions) -> Result<Attach> {
        let info = self.inspect(id)?;
        if !info.is_running() {
            return Err(Error::container(
                id,
                format!(
                    "cannot attach: the container is not running (state {})",
                    state_word(&info.state)
                ),
            ));
        }
        Attach::connect(id, &self.dir(id), opts).await
    }

    /// CRI's ReopenContainerLog: the running container's monitor reopens its log path (after
    /// the caller renamed the file to rotate it). Blocking, at most `timeout`.
    pub fn reopen_container_log(&self, id: &str, timeout: Duration) -> Result<()> {
        let info = self.inspect(id)?;
        if !info.is_running() {
            return Err(Error::container(
                id,
                "cannot reopen the log: the container is not running",
            ));
        }
        crate::attach::reopen_log(id, &self.dir(id), timeout)
    }

    /// What the zygote needs to run `spec` in container `id`: the whole OCI process, built the
    /// way runc builds an exec'd one from the container's (its environment with the exec's on
    /// top, its user unless `spec.user` says otherwise, its rlimits, OOM score and AppArmor
    /// profile, `TERM=xterm` on a terminal unless set), and the container's confinement
    /// (capabilities, noNewPrivileges, seccomp), applied by the zygote right before exec; and
    /// how long the process may take to start.
    fn exec_args(&self, id: &str, spec: &ExecSpec, tty: bool) -> Result<(ExecArgs, Duration)> {
        let info = self.inspect(id)?;
        if !info.is_running() {
            return Err(Error::container(id, "cannot exec: the container is not running"));
        }
        if spec.args.is_empty() {
            return Err(Error::invalid_config("exec.command", "empty"));
        }
        let mut oci: oci_spec::runtime::Spec = read_json(&self.dir(id).join("config.json"))?;
        let mut confinement = Confinement::take(&mut oci);
        let base = oci.process().clone().unwrap_or_default();
        let mut process = exec_process(&base, spec, tty)?;
        let userns = oci
            .linux()
            .as_ref()
            .and_then(|l| l.namespaces().as_ref())
            .and_then(|nss| {
                nss.iter()
                    .find(|n| n.typ() == oci_spec::runtime::LinuxNamespaceType::User)
            })
            .and_then(|n| n.path().clone());
        if let Some(path) = userns {
            let user = process.user().clone();
            confinement.join_user = Some(crate::proto::JoinUser {
                path,
                uid: user.uid(),
                gid: user.gid(),
                additional_gids: user.additional_gids().clone().unwrap_or_default(),
                fd: None,
            });
            process.set_user(
                oci_spec::runtime::UserBuilder::default()
                    .uid(0u32)
                    .gid(0u32)
                    .build()
                    .map_err(|e| Error::invalid_config("exec.user", e.to_string()))?,
            );
        }
        let limit = spec.start_timeout.unwrap_or(self.request_timeout);
        let start_by_ns = u64::try_from((crate::process::monotonic_now() + limit).as_nanos()).unwrap_or(u64::MAX);
        Ok((
            ExecArgs {
                id: id.to_string(),
                lc_root: self.lc_root.clone(),
                process: Box::new(process),
                confinement,
                start_by_ns,
            },
            limit,
        ))
    }

    /// The worker's first reply: the process's pid once it runs, within `limit`. Past it the
    /// exec fails; the worker, if it is stuck, ends itself a little later (its timer), and a
    /// process that starts after all, just too late, is killed here.
    async fn exec_started(id: &str, mut replies: Replies, limit: Duration) -> Result<(i32, Replies)> {
        let reply = match tokio::time::timeout(limit, replies.next()).await {
            Ok(r) => r?,
            Err(_) => {
                tracing::warn!(container = %id, ?limit, "exec: the process did not start in time; giving up");
                tokio::spawn(kill_late_exec(replies, EXEC_WORKER_GRACE + Duration::from_secs(1)));
                return Err(Error::container(
                    id,
                    format!("exec: the process did not start within {limit:?}"),
                ));
            }
        };
        match reply {
            Reply::ExecStarted { pid } => Ok((pid, replies)),
            Reply::Failed { error } => Err(Error::container(id, format!("exec: {error}"))),
            other => Err(Error::container(id, format!("exec: unexpected reply {other:?}"))),
        }
    }

    /// Run a process in a container and collect its output (at most `limit` bytes of each
    /// stream are kept). With a timeout, the process is killed when it passes.
    pub async fn exec_capture(
        &self,
        id: &str,
        spec: &ExecSpec,
        timeout: Option<Duration>,
        limit: usize,
    ) -> Result<ExecOutput> {
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let stdin = OwnedFd::from(std::fs::File::open("/dev/null").context("opening /dev/null")?);
        let proc_ = self
            .exec(
                id,
                spec,
                ExecIo {
                    stdin,
                    stdout: out_w,
                    stderr: err_w,
                },
            )
            .await?;
        let out_task = tokio::spawn(read_limited(out_r, limit));
        let err_task = tokio::spawn(read_limited(err_r, limit));
        // A second handle for the timeout path: wait() consumes the process.
        let killer = PidFd::open(proc_.pid()).ok();
        let mut timed_out = false;
        let code = match timeout {
            None => proc_.wait().await?,
            Some(t) => {
                let wait = proc_.wait();
                tokio::pin!(wait);
                match tokio::time::timeout(t, &mut wait).await {
                    Ok(r) => r?,
                    Err(_) => {
                        timed_out = true;
                        if let Some(k) = &killer {
                            let _ = k.send_signal(libc::SIGKILL);
                        }
                        wait.await.unwrap_or(128 + libc::SIGKILL)
                    }
                }
            }
        };
        // Children of the process may keep the pipes open: do not wait for them long.
        let grab = |t: tokio::task::JoinHandle<Vec<u8>>| async move {
            tokio::time::timeout(Duration::from_secs(1), t)
                .await
                .ok()
                .and_then(|r| r.ok())
                .unwrap_or_default()
        };
        Ok(ExecOutput {
            exit_code: code,
            stdout: grab(out_task).await,
            stderr: grab(err_task).await,
            timed_out,
        })
    }

    /// Create a pod's namespaces pinned under `dir` (crate::namespaces: files `net`, `ipc`,
    /// `uts`, `pid`, `user`), with the init of its pid namespace when it has one.
    pub async fn pin_namespaces(
        &self,
        dir: &Path,
        pins: &crate::namespaces::Pins,
    ) -> Result<crate::namespaces::Pinned> {
        let mut replies = self.zygote.call(
            &Request::Pin(PinArgs {
                dir: dir.to_path_buf(),
                pins: pins.clone(),
            }),
            &[],
        )?;
        let fail = |e: String| Error::container(dir.display().to_string(), format!("pinning namespaces: {e}"));
        match replies.next().await {
            Ok(Reply::Pinned(p)) => Ok(p),
            Ok(Reply::Failed { error }) => Err(fail(error)),
            Ok(other) => Err(fail(format!("unexpected reply {other:?}"))),
            Err(e) => Err(fail(chain(&e).to_string())),
        }
    }

    /// Name the UTS namespace pinned at `uts` (a sandbox built before its pod was known).
    pub async fn set_hostname(&self, uts: &Path, hostname: &str) -> Result<()> {
        self.zygote
            .call_ok(&Request::Hostname {
                uts: uts.to_path_buf(),
                hostname: hostname.to_string(),
            })
            .await
            .map_err(|e| {
                Error::container(
                    uts.display().to_string(),
                    format!("setting the hostname: {}", chain(&e)),
                )
            })
    }

    /// Build containers from now on in mount namespaces without the other pods' mounts
    /// (crate::mount_ns): make the root a private mount (a bind mount of itself if need be),
    /// then move the zygote into a namespace of its own. Call once, before the first pod.
    /// An error leaves containers built in the host's namespace, as before: the agent runs on.
    /// [`crate::mount_ns::release_root`] undoes the root's bind mount.
    pub async fn isolate_mounts(&self) -> Result<()> {
        let root = self.root.clone();
        blocking(move || crate::mount_ns::make_root_private(&root).context("the root's mount")).await?;
        self.zygote
            .call_ok(&Request::Isolate {
                root: self.root.clone(),
            })
            .await
            .map_err(|e| Error::Zygote(format!("the zygote's mount namespace: {}", chain(&e))))
    }

    /// Undo [`pin_namespaces`](Self::pin_namespaces): unmount and remove the files. A pod init
    /// is the caller's to stop first.
    pub fn unpin_namespaces(dir: &Path) -> Result<()> {
        crate::namespaces::unpin(dir)
    }
}

/// [`ferrolet_fsutil::blocking`], with this crate's error.
async fn blocking<T, E, F>(f: F) -> Result<T>
where
    T: Send + 'static,
    E: Into<Error> + Send + 'static,
    F: FnOnce() -> std::result::Result<T, E> + Send + 'static,
{
    ferrolet_fsutil::blocking(move || f().map_err(Into::into)).await
}

/// What libcontainer leaves of a container it built, removed: whatever still runs in its
/// cgroup is killed (a shared pid namespace's processes, a container whose monitor is gone, an
/// init its monitor could not record), then the cgroup (every hierarchy, named ones too) and
/// libcontainer's state directory go. Its specs carry no hooks and no Intel RDT, so that is
/// all its own delete would do.
fn remove_built(cgroups: &Cgroups, cgroup: &str, lc_dir: &Path) -> Result<()> {
    if !cgroup.trim_matches('/').is_empty() {
        let left = cgroups.kill_all(cgroup, Duration::from_secs(5));
        if !left.is_empty() {
            return Err(Error::Cgroup {
                path: cgroup.to_string(),
                reason: format!("processes {left:?} survived SIGKILL"),
            });
        }
        cgroups.remove(cgroup)?;
    }
    remove_tree(lc_dir)?;
    Ok(())
}

/// Everything before the zygote: image, user, spec, state files. Runs on a blocking thread.
fn prepare(
    id: &str,
    cfg: &ContainerConfig,
    images_dir: &Path,
    dir: &Path,
    lc_root: &Path,
    cgroups: &Cgroups,
    stage_root: &Path,
) -> Result<CreateArgs> {
    let cgroup_v2 = cgroups.is_v2();
    if cfg.cgroup_parent.is_empty() {
        return Err(Error::invalid_config("cgroupParent", "required"));
    }
    let store = ImageStore::open(images_dir)?;
    let image = match &cfg.image_ref {
        Some(id) => store.resolve(&id.to_string())?,
        None => store.resolve(&cfg.image)?,
    };
    let files = ImageFiles::new(&image.layer_dirs);
    let image_user = image
        .config
        .config()
        .as_ref()
        .and_then(|c| c.user().clone())
        .unwrap_or_default();
    let user = resolve_user(
        &files,
        &image_user,
        cfg.user.uid,
        cfg.user.gid,
        &cfg.user.supplemental_groups,
        cfg.user.supplemental_groups_policy == crate::config::SupplementalGroupsPolicy::Merge,
    )?;
    let mut spec = build_spec(&SpecInput {
        id,
        config: cfg,
        image: &image.config,
        user: &user,
        cgroup_v2,
        cgroup_v1_mounts: if cgroup_v2 { Vec::new() } else { cgroups.dirs("/") },
    })?;
    if let Some(profile) = spec.linux().as_ref().and_then(|l| l.seccomp().as_ref()) {
        if crate::seccomp_filter::has_notify(profile) {
            return Err(Error::invalid_config("seccomp", crate::seccomp_filter::NOTIFY_REFUSED));
        }
    }
    ensure_dir(dir)?;
    let log_path = if cfg.log.path.as_os_str().is_empty() {
        dir.join("container.log")
    } else {
        cfg.log.path.clone()
    };
    let cgroup_path = spec
        .linux()
        .as_ref()
        .and_then(|l| l.cgroups_path().clone())
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let record = ContainerRecord {
        id: id.to_string(),
        name: cfg.name.clone(),
        image: cfg.image.clone(),
        image_ref: image.record.id.clone(),
        image_id: image.image_id(),
        labels: cfg.labels.clone(),
        annotations: cfg.annotations.clone(),
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
        log_path: log_path.clone(),
        cgroup_path: cgroup_path.clone(),
        stop_signal: image.config.config().as_ref().and_then(|c| c.stop_signal().clone()),
        boot_id: ferrolet_fsutil::boot_id(),
        user: Some(container::ProcessUser {
            uid: user.uid,
            gid: user.gid,
            supplemental_groups: user.additional_gids.clone(),
        }),
    };
    // A copy of the record in the spec (and so in libcontainer's state): what an unreadable
    // container.json is rebuilt from.
    let mut annotations = spec.annotations().clone().unwrap_or_default();
    annotations.insert(
        container::RECORD_ANNOTATION.to_string(),
        serde_json::to_string(&record).context("encoding the container record")?,
    );
    spec.set_annotations(Some(annotations));
    let data = serde_json::to_vec_pretty(&spec).context("encoding config.json")?;
    let record_data = serde_json::to_vec_pretty(&record).context("encoding container.json")?;
    // Both durable, with one fsync of the new directory for the two.
    write_atomic_in(dir, &[("config.json", &data), ("container.json", &record_data)])?;
    // libcontainer's copy: without the confinement the zygote applies (Confinement), and with
    // the rootfs named absolutely, since it sits one directory down. Not fsynced: it is
    // config.json less three fields, and read only while the container is being built or
    // exec'd into, in this boot.
    let workdir = spec
        .process()
        .as_ref()
        .map(|p| p.cwd().display().to_string())
        .unwrap_or_else(|| "/".into());
    let mut lc_spec = spec;
    let confinement = Confinement::take(&mut lc_spec);
    if let Some(root) = lc_spec.root_mut().as_mut() {
        let abs = dir.join(root.path());
        root.set_path(abs);
    }
    let staged = match &cfg.user_namespace {
        Some(userns) => Some(stage(&mut lc_spec, cfg, stage_root, &userns.path)?),
        None => None,
    };
    let host_paths = if staged.is_some() { None } else { host_paths(&lc_spec) };
    let device_program = if cgroup_v2 {
        device_program(&lc_spec, cgroups, &cgroup_path)?
    } else {
        None
    };
    let swap_bound = cfg
        .resources
        .memory_limit
        .filter(|l| *l > 0)
        .and_then(|limit| crate::cgroups::SwapBound::for_limit(cgroups, &cgroup_path, limit));
    let lc_bundle = dir.join(LC_BUNDLE_DIR);
    ensure_dir(&lc_bundle)?;
    write_json_atomic_unsynced(&lc_bundle.join("config.json"), &lc_spec)?;
    let mut log = cfg.log.clone();
    log.path = log_path;
    let display_name = [&cfg.display_name, &cfg.name]
        .into_iter()
        .find(|n| !n.is_empty())
        .cloned()
        .unwrap_or_else(|| id.to_string());
    Ok(CreateArgs {
        id: id.to_string(),
        display_name,
        bundle: dir.to_path_buf(),
        lc_bundle,
        confinement,
        lc_root: lc_root.to_path_buf(),
        rootfs: RootfsSpec {
            layers_dir: store.dir().join("layers"),
            lowers: image
                .record
                .layers
                .iter()
                .rev()
                .map(|l| l.diff_id.hex().to_string())
                .collect(),
            empty: dir.join("empty"),
            upper: dir.join(UPPER_DIR),
            work: dir.join("work"),
            target: dir.join("rootfs"),
            idmap: cfg.user_namespace.as_ref().map(|u| crate::rootfs::RootIdmap {
                userns: u.path.clone(),
                uid: u.range.host,
                gid: u.range.host,
            }),
            mount_label: cfg.mount_label.clone().filter(|l| !l.is_empty()),
        },
        workdir,
        log,
        cgroup_path,
        stdin: cfg.stdin,
        stdin_once: cfg.stdin_once,
        tty: cfg.tty,
        host_paths,
        device_program,
        swap_bound,
        kill_all_on_exit: !matches!(cfg.namespaces.pid, crate::config::NamespaceMode::Private),
        staged,
    })
}

/// Where a monitor stages what a container in a user namespace is built from, in its own mount
/// namespace (crate::mount_ns::Staging); an empty directory of the root dir on the host.
const STAGE_DIR: &str = "stage";

/// Point `spec` at staged copies of the host paths it names (rootfs, namespace files, bind
/// mount sources other than cgroupfs), idmapped where the config asks, and say what to stage.
/// The init of a container in a user namespace must reach the staging directory: the root dir
/// and its ancestors must let others through.
fn stage(
    spec: &mut oci_spec::runtime::Spec,
    cfg: &ContainerConfig,
    stage_root: &Path,
    userns: &Path,
) -> Result<crate::mount_ns::Staging> {
    use std::os::unix::fs::PermissionsExt;
    for dir in stage_root.ancestors().skip(1) {
        let mode = std::fs::metadata(dir).map(|m| m.permissions().mode()).unwrap_or(0o755);
        if mode & 0o001 == 0 {
            return Err(Error::invalid_config(
                "userNamespace",
                format!(
                    "{} (mode {:o}) does not let other users through, and a container in a user namespace \
                     is built from {}",
                    dir.display(),
                    mode & 0o7777,
                    stage_root.display()
                ),
            ));
        }
    }
    let mut items = Vec::new();
    let mut item = |from: PathBuf, name: String, idmap: bool| {
        let to = stage_root.join(name);
        items.push(crate::mount_ns::StageItem {
            from,
            to: to.clone(),
            idmap,
        });
        to
    };
    if let Some(root) = spec.root_mut().as_mut() {
        let to = item(root.path().clone(), "rootfs".into(), false);
        root.set_path(to);
    }
    if let Some(linux) = spec.linux_mut().as_mut() {
        if let Some(nss) = linux.namespaces_mut().as_mut() {
            for ns in nss.iter_mut() {
                if let Some(p) = ns.path().clone() {
                    let to = item(p, format!("ns-{:?}", ns.typ()).to_lowercase(), false);
                    ns.set_path(Some(to));
                }
            }
        }
    }
    if let Some(mounts) = spec.mounts_mut().as_mut() {
        for (i, m) in mounts.iter_mut().enumerate() {
            let options = m.options().clone().unwrap_or_default();
            let bind = m.typ().as_deref() == Some("bind") || options.iter().any(|o| o == "bind" || o == "rbind");
            let Some(src) = m
                .source()
                .clone()
                .filter(|s| bind && s.is_absolute() && !s.starts_with("/sys/fs/cgroup"))
            else {
                continue;
            };
            let idmap = cfg
                .mounts
                .iter()
                .any(|c| c.idmap && Path::new(&c.destination) == m.destination().as_path());
            let to = item(src, format!("m{i}"), idmap);
            m.set_source(Some(to));
        }
    }
    Ok(crate::mount_ns::Staging {
        root: stage_root.to_path_buf(),
        items,
        userns: userns.to_path_buf(),
    })
}

/// What cgroup v2 enforces of the spec's device rules, as cgroup v1 would: libcgroups writes
/// the spec's rules to the v1 devices controller and then its default allow rules (the same as
/// [`crate::devices::default_rules`] less the deny-all), so the policy is read from both.
/// None when it allows every device.
fn device_program(
    spec: &oci_spec::runtime::Spec,
    cgroups: &Cgroups,
    cgroup_path: &str,
) -> Result<Option<(crate::devices::Policy, PathBuf)>> {
    let rules = spec
        .linux()
        .as_ref()
        .and_then(|l| l.resources().as_ref())
        .and_then(|r| r.devices().clone())
        .unwrap_or_default();
    let defaults = crate::devices::default_rules();
    let policy = crate::devices::Policy::from_rules(rules.iter().chain(defaults.iter().skip(1)))
        .map_err(|e| Error::invalid_config("devices", e))?;
    if policy.allows_all() {
        return Ok(None);
    }
    let dir = cgroups
        .dirs(cgroup_path)
        .into_iter()
        .next()
        .ok_or_else(|| Error::invalid_config("cgroupParent", "no cgroup v2 hierarchy"))?;
    Ok(Some((policy, dir)))
}

/// The host paths a container's spec names: its rootfs, the namespaces it joins, the sources of
/// its bind mounts. A monitor building it in a mount namespace of its own brings along the
/// mounts these are on (crate::mount_ns). None for a container whose mounts must propagate
/// back to the host (`shared` or `rshared`: Kubernetes' Bidirectional), which only the host's
/// namespace can give: it is built there.
fn host_paths(spec: &oci_spec::runtime::Spec) -> Option<Vec<PathBuf>> {
    let shared = |o: &str| o == "rshared" || o == "shared";
    let mut out = Vec::new();
    if let Some(root) = spec.root() {
        out.push(root.path().clone());
    }
    if let Some(linux) = spec.linux() {
        if linux.rootfs_propagation().as_deref().is_some_and(shared) {
            return None;
        }
        for ns in linux.namespaces().iter().flatten() {
            if let Some(p) = ns.path() {
                out.push(p.clone());
            }
        }
    }
    for m in spec.mounts().iter().flatten() {
        let options = m.options().as_deref().unwrap_or_default();
        if options.iter().any(|o| shared(o)) {
            return None;
        }
        let bind = m.typ().as_deref() == Some("bind") || options.iter().any(|o| o == "bind" || o == "rbind");
        // A container's own cgroup (spec::cgroup_v1_binds) exists only once libcontainer made
        // it, and lies in the cgroup hierarchies the zygote's copy has: nothing to bring.
        let cgroup = |s: &Path| s.starts_with("/sys/fs/cgroup");
        if let Some(src) = m.source().as_ref().filter(|s| bind && s.is_absolute() && !cgroup(s)) {
            out.push(src.clone());
        }
    }
    out.retain(|p| p.is_absolute());
    Some(out)
}

/// After the agent gave up on an exec's start: the worker's replies read on for at most
/// `limit`, so that a process that started after all, just too late for anyone to wait for it,
/// is killed rather than left running on its own. A worker still stuck by then has ended itself.
async fn kill_late_exec(mut replies: Replies, limit: Duration) {
    let read_on = async {
        while let Ok(reply) = replies.next().await {
            if let Reply::ExecStarted { pid } = reply {
                tracing::warn!(
                    pid,
                    "exec: the process started after the runtime gave up on it; killing it"
                );
                if let Ok(p) = PidFd::open(pid) {
                    let _ = p.send_signal(libc::SIGKILL);
                }
            }
        }
    };
    let _ = tokio::time::timeout(limit, read_on).await;
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("creating pipe")?;
    // Our read end is polled by tokio.
    crate::tty::set_nonblocking(r.as_fd());
    Ok((r, w))
}

async fn read_limited(fd: OwnedFd, limit: usize) -> Vec<u8> {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match rx.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => {
                let room = limit.saturating_sub(out.len());
                out.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

/// A state as a word for messages.
fn state_word(s: &ContainerState) -> &'static str {
    match s {
        ContainerState::Created => "created",
        ContainerState::Running => "running",
        ContainerState::Exited(_) => "exited",
        ContainerState::ExitUnknown(_) => "exited",
        ContainerState::Unknown { .. } => "unknown",
        ContainerState::Incomplete => "incomplete",
    }
}

/// The OCI process of an exec in a container whose own process is `base` (see
/// [`Runtime::exec_args`]). Capabilities and noNewPrivileges are left out: the zygote applies
/// them together with seccomp, in the order the kernel allows (docs/runtime.md#exec).
fn exec_process(base: &oci_spec::runtime::Process, spec: &ExecSpec, tty: bool) -> Result<oci_spec::runtime::Process> {
    let mut env: Vec<(String, String)> = base
        .env()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (kv, String::new()),
        })
        .collect();
    let mut set = |k: &str, v: &str| match env.iter_mut().find(|(n, _)| n == k) {
        Some(slot) => slot.1 = v.to_string(),
        None => env.push((k.to_string(), v.to_string())),
    };
    if tty {
        set("TERM", "xterm");
    }
    for (k, v) in &spec.env {
        set(k, v);
    }
    let (uid, gid) = spec.user.unwrap_or((base.user().uid(), base.user().gid()));
    let user = oci_spec::runtime::UserBuilder::default()
        .uid(uid)
        .gid(gid)
        .additional_gids(base.user().additional_gids().clone().unwrap_or_default())
        .build()
        .map_err(|e| Error::invalid_config("exec.user", e.to_string()))?;
    let cwd = spec
        .cwd
        .clone()
        .map(PathBuf::from)
        .unwrap_or_else(|| base.cwd().clone());
    let mut p = oci_spec::runtime::ProcessBuilder::default()
        .terminal(tty)
        .args(spec.args.clone())
        .env(env.into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>())
        .cwd(cwd)
        .user(user);
    if let Some(adj) = base.oom_score_adj() {
        p = p.oom_score_adj(adj);
    }
    if let Some(profile) = base.apparmor_profile() {
        p = p.apparmor_profile(profile.clone());
    }
    let mut process = p.build().map_err(|e| Error::invalid_config("exec", e.to_string()))?;
    // ProcessBuilder's defaults carry capabilities and noNewPrivileges, which the zygote
    // applies, and a 1024 RLIMIT_NOFILE: the container's rlimits or none.
    process
        .set_capabilities(None)
        .set_no_new_privileges(None)
        .set_rlimits(base.rlimits().clone());
    Ok(process)
}
