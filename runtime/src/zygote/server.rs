//! The zygote: a single-threaded process forked before the agent starts any thread. It does one
//! thing, fork a worker per request, so every libcontainer call (which clones and runs Rust code
//! in the child before exec) happens in a process with exactly one thread (docs/runtime.md#the-zygote).
//! Workers for `Create` detach (setsid + double fork) and become the container's monitor, which
//! outlives the agent.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::syscall::syscall::SyscallType;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use ferrolet_fsutil::chain;

use super::confine::ConfinedExecutor;
use crate::anon_buffer::AnonBuffer;
use crate::process::{exit, reset_signals, set_name, set_title};
use crate::proto::{recv_request, write_reply, ExecArgs, PinArgs, Reply, Request, EXEC_WORKER_GRACE, MAX_MESSAGE};
use crate::seccomp_filter::FilterCache;

/// Serve requests until the agent closes the socket. Never returns.
pub(crate) fn serve(sock: OwnedFd) -> ! {
    set_name("ferrolet-zygote");
    set_title("ferrolet-zygote");
    let mut buf = AnonBuffer::new(MAX_MESSAGE);
    let mut filters = FilterCache::default();
    loop {
        reap_children();
        let mut pfd = [nix::poll::PollFd::new(
            std::os::fd::AsFd::as_fd(&sock),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(1000u16)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e @ (nix::errno::Errno::ENOMEM | nix::errno::Errno::EAGAIN)) => {
                // Short of memory for a moment: the agent has no other zygote, keep serving.
                say(format_args!("poll: {e}; retrying"));
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            Err(e) => {
                // Anything else means the socket is unusable: waiting would only spin.
                say(format_args!("poll: {e}; the zygote exits"));
                exit(1);
            }
        }
        let (req, mut fds) = match recv_request(sock.as_raw_fd(), buf.as_mut_slice()) {
            Ok(Some(x)) => x,
            Ok(None) => exit(0),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => {
                say(format_args!("bad request: {e}"));
                continue;
            }
        };
        if fds.is_empty() {
            say(format_args!("request without a reply pipe dropped"));
            continue;
        }
        let reply = fds.remove(0);
        if let Request::Isolate { root } = &req {
            write_reply(&reply, &super::isolation::isolate(root));
            continue;
        }
        let mut req = req;
        if let Err(error) = compile_seccomp(&mut filters, &mut req) {
            write_reply(&reply, &Reply::Failed { error });
            continue;
        }
        // SAFETY: this process has one thread, so the child may run arbitrary code.
        match unsafe { fork() } {
            Ok(ForkResult::Child) => {
                drop(sock);
                // The request is parsed: the zygote writes its next one into these pages,
                // which would leave this fork holding its own copy of each for as long as it
                // lives (a monitor: as long as its container).
                buf.release_in_fork();
                reset_signals();
                let code = worker(req, reply, fds);
                exit(code)
            }
            Ok(ForkResult::Parent { .. }) => {
                // The worker holds its own copies; ours close here.
            }
            Err(e) => {
                write_reply(
                    &reply,
                    &Reply::Failed {
                        error: format!("zygote fork failed: {e}"),
                    },
                );
            }
        }
    }
}

/// The container's seccomp profile of a `Create` or `Exec`, compiled here once per profile so
/// that the fork, and the container processes it makes, inherit the program
/// (docs/runtime.md#exec). The first compilation of a profile takes a few ms of this loop.
fn compile_seccomp(filters: &mut FilterCache, req: &mut Request) -> Result<(), String> {
    let confinement = match req {
        Request::Create(a) => &mut a.confinement,
        Request::Exec(a) => &mut a.confinement,
        _ => return Ok(()),
    };
    // The profile itself is dropped here: the program is all the fork needs, and a monitor
    // would otherwise keep hundreds of system call names in its heap for as long as it runs.
    if let Some(profile) = confinement.seccomp.take() {
        confinement.compiled = Some(filters.get(&profile)?);
    }
    Ok(())
}

/// One request, in a fork of the zygote. The handlers are never inlined here: a `Create`
/// worker becomes the container's monitor below this frame, and every page of stack above the
/// monitor is memory it holds for as long as its container runs.
fn worker(req: Request, reply: OwnedFd, fds: Vec<OwnedFd>) -> i32 {
    match req {
        Request::Create(args) => {
            // Detach: new session, and let the monitor be re-parented away from the zygote so
            // that neither the zygote nor the agent dying touches it.
            let _ = nix::unistd::setsid();
            // SAFETY: still single-threaded.
            match unsafe { fork() } {
                Ok(ForkResult::Child) => super::monitor::run(*args, reply),
                Ok(ForkResult::Parent { .. }) => 0,
                Err(e) => {
                    write_reply(
                        &reply,
                        &Reply::Failed {
                            error: format!("forking monitor: {e}"),
                        },
                    );
                    1
                }
            }
        }
        Request::Start { id, lc_root } => start(&id, &lc_root, &reply),
        Request::Isolate { .. } => {
            write_reply(
                &reply,
                &Reply::Failed {
                    error: "isolate is the zygote's own request".into(),
                },
            );
            1
        }
        Request::Exec(args) => exec(*args, reply, fds),
        Request::Hostname { uts, hostname } => match set_hostname(&uts, &hostname) {
            Ok(()) => {
                write_reply(&reply, &Reply::Ok);
                0
            }
            Err(e) => {
                write_reply(&reply, &Reply::Failed { error: e });
                1
            }
        },
        Request::Pin(args) => match pin(&args) {
            Ok(pinned) => {
                write_reply(&reply, &Reply::Pinned(pinned));
                0
            }
            Err(e) => {
                write_reply(&reply, &Reply::Failed { error: e });
                1
            }
        },
    }
}

#[inline(never)]
fn start(id: &str, lc_root: &std::path::Path, reply: &OwnedFd) -> i32 {
    let r = Container::load(lc_root.join(id)).and_then(|mut c| c.start());
    answer(reply, r.map(|_| Reply::Ok))
}

fn answer(reply: &OwnedFd, r: Result<Reply, libcontainer::error::LibcontainerError>) -> i32 {
    match r {
        Ok(rep) => {
            write_reply(reply, &rep);
            0
        }
        Err(e) => {
            write_reply(
                reply,
                &Reply::Failed {
                    error: chain(&e).to_string(),
                },
            );
            1
        }
    }
}

/// Run `args.process` in the container as a tenant: libcontainer joins its namespaces and
/// cgroup from the process.json written here, and [`ConfinedExecutor`] applies the container's
/// capabilities, noNewPrivileges and seccomp before exec. fds: reply, then stdin, stdout and
/// stderr; or, on a terminal, reply and the socket the pty master goes back over.
#[inline(never)]
fn exec(args: ExecArgs, reply: OwnedFd, fds: Vec<OwnedFd>) -> i32 {
    let failed = |error: String| {
        write_reply(&reply, &Reply::Failed { error });
        1
    };
    let left = match args.start_by_ns {
        0 => None,
        by => match Duration::from_nanos(by).checked_sub(crate::process::monotonic_now()) {
            Some(left) if !left.is_zero() => Some(left),
            // The agent has stopped waiting (the zygote was slow to get to this request).
            _ => return failed("the exec's start deadline passed before the zygote got to it".into()),
        },
    };
    let dir = args.lc_root.join(&args.id);
    let me = std::process::id();
    // libcontainer takes `terminal` only from a whole process.json, and hands the pty master
    // (allocated in the container's devpts) to a console socket: listen on one in libcontainer's
    // directory of the container, then pass the master on to the agent.
    let (stdio, terminal) = if args.process.terminal() == Some(true) {
        let Ok([console_out]) = <[OwnedFd; 1]>::try_from(fds) else {
            return failed("a terminal exec needs the socket for the pty master".into());
        };
        match crate::tty::ConsoleSocket::bind(&dir, &format!("ferrolet-exec-{me}.sock")) {
            Ok(console) => (None, Some((console, console_out))),
            Err(e) => return failed(format!("console socket in {}: {e}", dir.display())),
        }
    } else {
        match <[OwnedFd; 3]>::try_from(fds) {
            Ok(stdio) => (Some(stdio), None),
            Err(_) => return failed("exec needs stdin, stdout and stderr".into()),
        }
    };
    let process_json = dir.join(format!("ferrolet-exec-{me}.json"));
    let written = serde_json::to_vec(&args.process)
        .map_err(|e| format!("encoding the exec process: {e}"))
        .and_then(|data| {
            std::fs::write(&process_json, data).map_err(|e| format!("writing {}: {e}", process_json.display()))
        });
    if let Err(e) = written {
        return failed(e);
    }
    let mut confinement = args.confinement;
    // held until the build is done: the tenant's init joins it by fd (crate::proto::JoinUser)
    let _userns = match confinement.join_user.as_mut() {
        Some(j) => match open_in_host(&j.path) {
            Ok(f) => {
                j.fd = Some(std::os::fd::AsRawFd::as_raw_fd(&f));
                Some(f)
            }
            Err(e) => return failed(format!("opening the user namespace {}: {e}", j.path.display())),
        },
        None => None,
    };
    let executor = ConfinedExecutor { confinement };
    // libcontainer waits for the process it starts without a bound (a frozen cgroup keeps it
    // from ever reporting): past the deadline the agent has given up, and a little later this
    // worker ends itself, removing its files.
    if let Some(left) = left {
        let console = terminal.as_ref().map(|(c, _)| c.path().to_path_buf());
        give_up_after(left + EXEC_WORKER_GRACE, &[Some(process_json.clone()), console]);
    }
    let built = ContainerBuilder::new(args.id.clone(), SyscallType::default())
        .with_root_path(&args.lc_root)
        .and_then(|b| {
            let b = match (stdio, &terminal) {
                (Some([i, o, e]), _) => b.with_stdin(i).with_stdout(o).with_stderr(e),
                (None, Some((console, _))) => b.with_console_socket(Some(console.path())),
                (None, None) => b,
            };
            b.with_executor(executor)
                .as_tenant()
                .with_process(Some(&process_json))
                .with_detach(true)
                .build()
        });
    if left.is_some() {
        disarm_give_up();
    }
    let _ = std::fs::remove_file(&process_json);
    if let Some((console, _)) = &terminal {
        remove_tenant_links(&dir, console.path());
    }
    let pid = match built {
        Ok(pid) => pid,
        Err(e) => {
            remove_stale_notify_sockets(&dir);
            return failed(chain(&e).to_string());
        }
    };
    if let Some((console, console_out)) = terminal {
        let sent = console
            .receive_master(std::time::Duration::from_secs(10))
            .and_then(|master| crate::tty::send_fd(console_out.as_fd(), master.as_fd()));
        if let Err(e) = sent {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::SIGKILL);
            let _ = waitpid(pid, None);
            return failed(format!("passing on the terminal: {e}"));
        }
    }
    // A closed reply pipe is an answer from here on, not this worker's death: the agent has
    // given up (or is gone), and the process must not run on unwatched. Ignored only now, so
    // the exec'd process did not inherit the disposition.
    // SAFETY: setting a signal's disposition to ignore runs no code of this process.
    let _ =
        unsafe { nix::sys::signal::signal(nix::sys::signal::Signal::SIGPIPE, nix::sys::signal::SigHandler::SigIgn) };
    if !write_reply(&reply, &Reply::ExecStarted { pid: pid.as_raw() }) {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::SIGKILL);
    }
    remove_stale_notify_sockets(&dir);
    wait_exec(pid, &reply)
}

/// libcontainer's tenant builder binds a `tenant-notify-<random>.sock` in the container's
/// directory per exec (the exec'd process waits on it for "start") and never removes it: one
/// file per exec, for as long as the container lives (an exec probe every 10 s makes thousands
/// a day), and one more per exec that never started. Removed here once no socket is bound to
/// it any more: /proc/net/unix lists every bound socket of this network namespace (the
/// zygote's, where they are bound) by the name it was bound with, which for these is the bare
/// file name (libcontainer binds from inside the directory). A concurrent exec's socket is
/// bound, listed, and kept.
fn remove_stale_notify_sockets(dir: &std::path::Path) {
    const PREFIX: &str = "tenant-notify-";
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let files: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(PREFIX))
        .collect();
    if files.is_empty() {
        return;
    }
    // Read after the directory: a socket bound in between is in both.
    let Ok(bound) = std::fs::read_to_string("/proc/net/unix") else {
        return;
    };
    let bound: std::collections::HashSet<&str> = bound
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(7))
        .map(|p| p.rsplit('/').next().unwrap_or(p))
        .filter(|n| n.starts_with(PREFIX))
        .collect();
    for f in files.iter().filter(|f| !bound.contains(f.as_str())) {
        let _ = std::fs::remove_file(dir.join(f));
    }
}

/// What a stuck exec worker's timer handler needs, made before the timer is armed (the
/// handler may not allocate): its own children list in /proc and the files to remove.
struct GiveUp {
    children: std::ffi::CString,
    files: Vec<std::ffi::CString>,
}

static GIVE_UP: std::sync::OnceLock<GiveUp> = std::sync::OnceLock::new();

/// SIGALRM in an exec worker: its process did not start in time and the agent has given up.
/// The worker's children are what libcontainer started for the exec, all waiting on it (the
/// process that would exec waits for the worker's "start" forever once the worker is gone):
/// killed. Then its files go, and the worker. Only async-signal-safe calls (open, read, close,
/// kill, unlink, write, _exit), on the stack.
extern "C" fn give_up(_: libc::c_int) {
    if let Some(g) = GIVE_UP.get() {
        let mut buf = [0u8; 512];
        // SAFETY: open/read/close of a NUL-terminated path into a stack buffer of its length.
        let n = unsafe {
            let fd = libc::open(g.children.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            let n = if fd >= 0 {
                libc::read(fd, buf.as_mut_ptr().cast(), buf.len())
            } else {
                0
            };
            if fd >= 0 {
                libc::close(fd);
            }
            n.max(0) as usize
        };
        let mut pid: libc::pid_t = 0;
        for &b in buf[..n].iter().chain(b" ") {
            if b.is_ascii_digit() {
                pid = pid.saturating_mul(10).saturating_add((b - b'0') as libc::pid_t);
            } else {
                if pid > 0 {
                    // SAFETY: SIGKILL to a child of this process (not reaped, so not reused).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                pid = 0;
            }
        }
        for f in &g.files {
            // SAFETY: unlink of a NUL-terminated path made before the handler was installed.
            unsafe { libc::unlink(f.as_ptr()) };
        }
    }
    const MSG: &[u8] = b"ferrolet-zygote: an exec's process did not start in time; its worker gives up\n";
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is static.
    unsafe {
        libc::write(2, MSG.as_ptr().cast(), MSG.len());
        libc::_exit(124);
    }
}

/// End this worker with [`give_up`] after `after`, removing `files` (those given).
fn give_up_after(after: Duration, files: &[Option<std::path::PathBuf>]) {
    use std::os::unix::ffi::OsStrExt;
    let me = std::process::id();
    let g = GiveUp {
        children: std::ffi::CString::new(format!("/proc/{me}/task/{me}/children")).unwrap_or_default(),
        files: files
            .iter()
            .flatten()
            .filter_map(|p| std::ffi::CString::new(p.as_os_str().as_bytes()).ok())
            .collect(),
    };
    // A worker handles one request: this is set once.
    let _ = GIVE_UP.set(g);
    let handler = nix::sys::signal::SigAction::new(
        nix::sys::signal::SigHandler::Handler(give_up),
        nix::sys::signal::SaFlags::empty(),
        nix::sys::signal::SigSet::empty(),
    );
    // SAFETY: the handler makes only async-signal-safe calls (see give_up).
    let _ = unsafe { nix::sys::signal::sigaction(nix::sys::signal::Signal::SIGALRM, &handler) };
    set_timer(after);
}

/// The exec's process started (or failed to): the timer is off.
fn disarm_give_up() {
    set_timer(Duration::ZERO);
}

/// ITIMER_REAL to fire once after `after` (zero: off). nix has no setitimer.
fn set_timer(after: Duration) {
    let value = libc::itimerval {
        it_interval: libc::timeval { tv_sec: 0, tv_usec: 0 },
        it_value: libc::timeval {
            // (`as _`: libc's time_t and suseconds_t are deprecated on musl, their width to
            // change; whatever the target's timeval holds)
            tv_sec: after.as_secs() as _,
            tv_usec: after.subsec_micros() as _,
        },
    };
    // SAFETY: setitimer reads the itimerval given and writes no old value (null).
    unsafe { libc::setitimer(libc::ITIMER_REAL, &value, std::ptr::null_mut()) };
}

/// libcontainer leaves a `tenant-tty-*.sock` symlink to the console socket per exec.
/// Open a host path the zygote's copy of the mounts may lack (a namespace pin).
fn open_in_host(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    match super::isolation::isolated() {
        Some(iso) => crate::mount_ns::in_host(&iso, || std::fs::File::open(path))?,
        None => std::fs::File::open(path),
    }
}

fn remove_tenant_links(dir: &std::path::Path, target: &std::path::Path) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with("tenant-tty-")
            && std::fs::read_link(e.path()).is_ok_and(|t| t == target)
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Wait for an exec'd process and reply how it ended.
fn wait_exec(pid: Pid, reply: &OwnedFd) -> i32 {
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => {
                write_reply(
                    reply,
                    &Reply::Exited {
                        exit_code: code,
                        signal: None,
                    },
                );
                return 0;
            }
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                write_reply(
                    reply,
                    &Reply::Exited {
                        exit_code: 128 + sig as i32,
                        signal: Some(sig as i32),
                    },
                );
                return 0;
            }
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                write_reply(
                    reply,
                    &Reply::Failed {
                        error: format!("waiting for exec process: {e}"),
                    },
                );
                return 1;
            }
        }
    }
}

/// The pod's namespaces (crate::namespaces), made in the host's mount namespace: the pins
/// are the host's mounts, which the agent unmounts and monitors copy.
#[inline(never)]
fn pin(args: &PinArgs) -> Result<crate::namespaces::Pinned, String> {
    if let Some(iso) = super::isolation::isolated() {
        crate::mount_ns::enter_host(&iso).map_err(|e| e.to_string())?;
    }
    crate::namespaces::pin(&args.dir, &args.pins)
}

/// In the agent's mount namespace (where the pins are), join the pinned UTS namespace and name
/// it. This worker is disposable: the namespaces it joins go with it.
fn set_hostname(uts: &std::path::Path, hostname: &str) -> Result<(), String> {
    if let Some(iso) = super::isolation::isolated() {
        crate::mount_ns::enter_host(&iso).map_err(|e| e.to_string())?;
    }
    let f = std::fs::File::open(uts).map_err(|e| format!("opening {}: {e}", uts.display()))?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWUTS)
        .map_err(|e| format!("joining the UTS namespace {}: {e}", uts.display()))?;
    nix::unistd::sethostname(hostname).map_err(|e| format!("sethostname {hostname:?}: {e}"))
}

fn reap_children() {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => continue,
        }
    }
}

/// A line on stderr (the agent's), lost if stderr is gone: eprintln! would panic and end the
/// zygote, and with it every container operation.
fn say(msg: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "ferrolet-zygote: {msg}");
}
