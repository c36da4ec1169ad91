//! The per-container monitor (docs/runtime.md#the-monitor): the container's parent and the holder of its
//! stdio. Forked from the zygote into a session of its own, it mounts the rootfs, creates the
//! container through libcontainer, reports back, then copies stdout/stderr into the CRI log
//! until the container exits, and records the exit status atomically. It holds the container's
//! stdin (or its terminal's master) and serves attachers ([`crate::attach::server`]). No
//! threads, no async: a poll loop over the output, a pidfd and the attach socket
//! (docs/runtime.md#terminals-and-attach). It outlives the agent.
//!
//! A zygote worker forks it and calls [`run`]. The monitor answers the `Create` request itself
//! over [`crate::proto`] and uses the process chores of [`crate::process`]; of the zygote it
//! takes only what every fork inherits: the isolation ([`super::isolation`]) and the
//! confinement it applies ([`super::confine`]).

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use nix::unistd::Pid;

use crate::attach::server::{AttachServer, StdioSetup};
use crate::container::MonitorRecord;
use crate::crilog::LogWriter;
use crate::pidfd::process_start_time;
use crate::process::{detach_stdio, exit, set_name, set_title};
use crate::proto::{write_reply, CreateArgs, Reply};
use crate::tty::ConsoleSocket;
use ferrolet_fsutil::{chain, write_json_atomic_unsynced};
use ferrolet_monitor::watch::{KillAll, Watch};

pub(crate) fn run(args: CreateArgs, reply: OwnedFd) -> ! {
    exit(monitor(args, reply))
}

fn monitor(args: CreateArgs, reply: OwnedFd) -> i32 {
    set_name(crate::probe::MONITOR_COMM);
    set_title(&format!("ferrolet-monitor {}", args.display_name));
    detach_stdio();
    // Orphans of the container (in a shared or host pid namespace) come to us to be reaped.
    let _ = nix::sys::prctl::set_child_subreaper(true);

    let Some(Created {
        answer,
        init,
        sources,
        log,
        attach,
        state_dir,
    }) = create(&args, &reply)
    else {
        return 1;
    };
    let cgroups = super::cgroups();
    // A container in a pid namespace it does not own (the pod's, the node's) has nothing that
    // ends its other processes with its init: they are killed when it exits, as containerd's
    // shim does (ShouldKillAllOnExit).
    let kill_all = args.kill_all_on_exit.then(|| KillAll {
        cgroup: args.cgroup_path.clone(),
        dirs: cgroups.map(|c| c.all_dirs(&args.cgroup_path)).unwrap_or_default(),
    });
    let watch = Watch {
        init,
        sources,
        log,
        attach,
        exit_path: args.bundle.join("exit.json"),
        oom_events: cgroups.and_then(|c| c.oom_events_file(&args.cgroup_path)),
        kill_all,
    };
    // The program of its own (docs/runtime.md#the-monitor-image): this process's pages, a copy
    // of the agent's, go with the exec, and the program answers `Created`, so the runtime
    // only ever knows the monitor as the program. It returns only when the program cannot run
    // here: then this process answers and watches.
    if let Some(image) = super::monitor_image::image() {
        let line = serde_json::to_string(&answer).unwrap_or_default() + "\n";
        let _ = ferrolet_monitor::handoff::exec(
            image,
            &args.display_name,
            &watch,
            state_dir.as_ref().ok(),
            reply.as_fd(),
            line,
        );
    }
    write_reply(&reply, &answer);
    drop(reply);
    // The request goes before the trim (its capability lists and seccomp program are heap the
    // monitor would otherwise hold for as long as the container runs).
    drop(args);
    // create()'s frame, with libcontainer's build below it, is gone from the stack now.
    release_build_memory();
    let code = watch.run();
    drop(state_dir);
    code
}

/// What the monitor keeps of the container it created.
struct Created {
    /// `Created`, written once the monitor is what it stays (see [`monitor`]).
    answer: Reply,
    init: Pid,
    sources: [Option<File>; 2],
    log: LogWriter,
    attach: AttachServer,
    /// Held until the monitor exits (see [`create`]).
    state_dir: std::io::Result<File>,
}

/// Build the container ([`build`]; [`monitor`] answers `Created`), or answer `Failed` (then None) only once
/// everything the attempt opened is closed again: the agent removes the container's files as
/// soon as it reads the answer, and a log or state file still held open here would outlive
/// that removal for as long as this process takes to exit. Never inlined: its frame and
/// libcontainer's below it leave the stack before the monitor settles into its loop, so
/// [`release_build_memory`] can give all of that back.
#[inline(never)]
fn create(args: &CreateArgs, reply: &OwnedFd) -> Option<Created> {
    match build(args) {
        Ok(created) => Some(created),
        Err(error) => {
            write_reply(reply, &Reply::Failed { error });
            None
        }
    }
}

/// Open the log, mount the rootfs, build the container through libcontainer and record the
/// monitor, with the `Created` answer for [`monitor`] to give; an error undoes the mounts and
/// is the answer to give.
#[inline(never)]
fn build(args: &CreateArgs) -> Result<Created, String> {
    // The rootfs is the host's mount (the agent unmounts it): a fork of an isolated zygote
    // mounts it there, then builds the container in a namespace of its own (crate::mount_ns).
    let isolated = super::isolation::isolated();
    if let Some(iso) = &isolated {
        if let Err(e) = crate::mount_ns::enter_host(iso) {
            return Err(format!("entering the host's mount namespace: {e}"));
        }
    }
    // Opened in the host's namespace, as every path here: the zygote's copy lacks the disks and
    // tmpfs mounted elsewhere (a log dir on a partition of its own), and there the log would
    // go to the directory the mount hides.
    let log = match LogWriter::open(&args.log.path, args.log.max_size, args.log.max_files) {
        Ok(l) => l,
        Err(e) => return Err(format!("opening log {}: {e}", args.log.path.display())),
    };
    if let Err(e) = crate::rootfs::mount_overlay(&args.rootfs) {
        return Err(format!("rootfs: {e}"));
    }
    if let Err(e) = crate::rootfs::ensure_dir_in_root(&args.rootfs.target, &args.workdir) {
        let _ = crate::rootfs::unmount(&args.rootfs.target);
        return Err(format!("workingDir {}: {e}", args.workdir));
    }
    let stdio = match Stdio::prepare(args) {
        Ok(s) => s,
        Err(e) => {
            let _ = crate::rootfs::unmount(&args.rootfs.target);
            return Err(e);
        }
    };
    let ends = match stdio.container_ends() {
        Ok(e) => e,
        Err(e) => {
            let _ = crate::rootfs::unmount(&args.rootfs.target);
            return Err(e);
        }
    };
    let mut private = false;
    if let Some(staging) = &args.staged {
        // (a user namespace: never in the host's namespace, where its init could not reach
        // what it needs)
        let Some(iso) = &isolated else {
            let _ = crate::rootfs::unmount(&args.rootfs.target);
            return Err(
                "a container in a user namespace is built in a mount namespace of its own, and the agent \
                 builds in the host's (docs/runtime.md#mount-namespaces-the-zygotes-and-each-monitors)"
                    .into(),
            );
        };
        if let Err(e) = crate::mount_ns::enter_staged(iso, staging) {
            let _ = crate::mount_ns::enter_host(iso);
            let _ = crate::rootfs::unmount(&args.rootfs.target);
            return Err(format!("staging the container's mounts: {e}"));
        }
        private = true;
    } else if let (Some(iso), Some(paths)) = (&isolated, &args.host_paths) {
        // Ok(false): built in the host's namespace after all (crate::mount_ns::enter_private).
        match crate::mount_ns::enter_private(iso, paths) {
            Ok(true) => private = true,
            Ok(false) => {}
            Err(e) => {
                let _ = crate::rootfs::unmount(&args.rootfs.target);
                return Err(format!("mount namespace: {e}"));
            }
        }
    }
    let builder = ContainerBuilder::new(args.id.clone(), SyscallType::default()).with_root_path(&args.lc_root);
    let built = builder.and_then(|b| {
        let b = match (&stdio, ends) {
            (_, Some([i, o, e])) => b.with_stdin(i).with_stdout(o).with_stderr(e),
            (Stdio::Tty { console }, None) => b.with_console_socket(Some(console.path())),
            (Stdio::Pipes { .. }, None) => b,
        };
        // The confinement is the executor's to apply (proto::Confinement): libcontainer's
        // bundle has none.
        let executor = super::confine::ConfinedExecutor {
            confinement: args.confinement.clone(),
        };
        b.with_executor(executor)
            .as_init(&args.lc_bundle)
            .with_systemd(false)
            .with_detach(true)
            .build()
    });
    let container = match built {
        Ok(c) => c,
        Err(e) => {
            // The host's rootfs mount (the agent unmounts it too on this answer).
            if let Some(iso) = &isolated {
                let _ = crate::mount_ns::enter_host(iso);
            }
            let _ = crate::rootfs::unmount(&args.rootfs.target);
            return Err(chain(&e).to_string());
        }
    };
    let Some(init) = container.pid() else {
        return Err("libcontainer reported no init pid".into());
    };
    // Built: the container's init has a namespace of its own (a copy, pivoted into its
    // rootfs). The monitor goes back to the host's, where its log is rotated and reopened and
    // its state is written, and holds none of the copies (a memory-backed volume's pages
    // would live as long as it does).
    let mut build_mounts = None;
    if let (Some(iso), true) = (&isolated, private) {
        build_mounts = std::fs::read("/proc/self/mountinfo")
            .ok()
            .map(|t| t.iter().filter(|&&b| b == b'\n').count() as u32);
        if let Err(e) = crate::mount_ns::enter_host(iso) {
            let _ = nix::sys::signal::kill(init, nix::sys::signal::SIGKILL);
            return Err(format!("back to the host's mount namespace: {e}"));
        }
    }
    drop(isolated);
    super::isolation::forget_isolation();
    // cgroup v2 has no devices controller: the rules become a program on the container's
    // cgroup, attached before anything of the container's own can run (it waits for Start).
    if let Some((policy, cgroup)) = &args.device_program {
        if let Err(e) = crate::devices::bpf::enforce(policy, cgroup) {
            let _ = nix::sys::signal::kill(init, nix::sys::signal::SIGKILL);
            return Err(format!("device rules: {e}"));
        }
    }
    if let Some(bound) = &args.swap_bound {
        if let Err(e) = bound.apply() {
            let _ = nix::sys::signal::kill(init, nix::sys::signal::SIGKILL);
            return Err(format!("bounding swap: {e}"));
        }
    }
    // Held until the monitor exits: with it the runtime finds this monitor through /proc when
    // monitor.json cannot be read (opened after build(), so the container never inherits it).
    let state_dir = File::open(&args.bundle);
    let (sources, setup) = match stdio.into_sources(args) {
        Ok(x) => x,
        Err(e) => {
            let _ = nix::sys::signal::kill(init, nix::sys::signal::SIGKILL);
            return Err(e);
        }
    };
    // From here on a reader or attacher that went away must not kill the monitor (the
    // container, cloned above, keeps the default disposition).
    // SAFETY: SIG_IGN runs no code of this process. nix's signal() needs this block too (a
    // handler could be any function).
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    // A failed bind leaves the container unattachable, not unlogged.
    let (attach, _bind_error) = AttachServer::bind(&args.bundle, setup);
    let me = std::process::id() as i32;
    let rec = MonitorRecord {
        monitor_pid: me,
        monitor_start: process_start_time(me).unwrap_or(0),
        init_pid: init.as_raw(),
        init_start: process_start_time(init.as_raw()).unwrap_or(0),
        build_mounts,
    };
    // Not fsynced: pids mean nothing after a reboot, and a container of another boot reads as
    // gone whatever this file says (or whether it survived at all).
    if let Err(e) = write_json_atomic_unsynced(&args.bundle.join("monitor.json"), &rec) {
        let _ = nix::sys::signal::kill(init, nix::sys::signal::SIGKILL);
        return Err(format!("recording monitor state: {}", chain(&e)));
    }
    drop(container);
    Ok(Created {
        answer: Reply::Created {
            init_pid: init.as_raw(),
            monitor_pid: me,
        },
        init,
        sources,
        log,
        attach,
        state_dir,
    })
}

/// Give the memory that building the container used and freed back to the kernel: the
/// monitor lives as long as its container and from here on needs little more than its
/// buffers, so the heap and stack pages libcontainer's build dirtied would otherwise stay
/// resident, per container (measured on a debug build: 180 KiB of stack, 16 KiB of heap).
fn release_build_memory() {
    // The stack first: it reads /proc/self/maps into the heap, which the trim then gives back.
    release_unused_stack();
    #[cfg(target_env = "gnu")]
    crate::process::empty_thread_cache();
    crate::process::trim_heap();
}

/// Drop the main stack's pages well below the current frame (they fault back in zeroed if a
/// deeper call ever needs them). 8 KiB below this frame stay, for the calls made from here.
fn release_unused_stack() {
    const KEEP: usize = 8 * 1024;
    let here = std::hint::black_box(0u8);
    let sp = std::ptr::addr_of!(here) as usize;
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let Some(bottom) = maps
        .lines()
        .find(|l| l.ends_with("[stack]"))
        .and_then(|l| l.split('-').next())
        .and_then(|a| usize::from_str_radix(a, 16).ok())
    else {
        return;
    };
    let page = crate::process::page_size();
    let top = sp.saturating_sub(KEEP) & !(page - 1);
    if bottom < top && sp < bottom + (64 << 20) {
        // SAFETY: [bottom, top) is the part of this thread's stack mapping below the frames in
        // use (the stack grows down from above `sp`); MADV_DONTNEED on private anonymous
        // memory only replaces its pages with zero-filled ones on the next touch. nix's madvise
        // needs this block as well.
        unsafe {
            libc::madvise(bottom as *mut libc::c_void, top - bottom, libc::MADV_DONTNEED);
        }
    }
}

/// The container's stdio as the monitor sets it up: pipes (stdin optional), or a terminal
/// that libcontainer allocates in the container and whose master comes back over a console
/// socket in the state directory.
enum Stdio {
    Pipes {
        stdin: Option<(OwnedFd, OwnedFd)>,
        out: (OwnedFd, OwnedFd),
        err: (OwnedFd, OwnedFd),
        devnull: OwnedFd,
    },
    Tty {
        console: ConsoleSocket,
    },
}

impl Stdio {
    fn prepare(args: &CreateArgs) -> Result<Stdio, String> {
        if args.tty {
            let console = ConsoleSocket::bind(&args.bundle, "console.sock")
                .map_err(|e| format!("console socket in {}: {e}", args.bundle.display()))?;
            return Ok(Stdio::Tty { console });
        }
        let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipes: {e}"));
        let stdin = if args.stdin { Some(pipe()?) } else { None };
        let devnull = File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
        Ok(Stdio::Pipes {
            stdin,
            out: pipe()?,
            err: pipe()?,
            devnull: OwnedFd::from(devnull),
        })
    }

    /// Copies of the container's ends of the pipes for the builder, which closes them after
    /// building (the originals close in [`into_sources`](Self::into_sources)). None for a
    /// terminal: libcontainer connects stdio to the pty itself.
    fn container_ends(&self) -> Result<Option<[OwnedFd; 3]>, String> {
        let Stdio::Pipes {
            stdin,
            out,
            err,
            devnull,
            ..
        } = self
        else {
            return Ok(None);
        };
        let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| format!("dup of a stdio pipe: {e}"));
        let input = match stdin {
            Some((r, _)) => dup(r)?,
            None => dup(devnull)?,
        };
        Ok(Some([input, dup(&out.1)?, dup(&err.1)?]))
    }

    /// After build(): the monitor's read ends (stdout, stderr) and what attachers use.
    fn into_sources(self, args: &CreateArgs) -> Result<([Option<File>; 2], StdioSetup), String> {
        match self {
            Stdio::Pipes { stdin, out, err, .. } => {
                // Our copies of the container's ends close here, so EOF means the container's
                // side is gone.
                drop((out.1, err.1));
                let stdin = stdin.map(|(r, w)| {
                    drop(r);
                    w
                });
                Ok((
                    [Some(File::from(out.0)), Some(File::from(err.0))],
                    StdioSetup {
                        tty: false,
                        stdin_once: args.stdin_once,
                        stdin,
                        resize: None,
                    },
                ))
            }
            Stdio::Tty { console } => {
                let master = console
                    .receive_master(Duration::from_secs(10))
                    .map_err(|e| format!("receiving the container's terminal: {e}"))?;
                drop(console);
                let dup = |what: &str| {
                    master
                        .try_clone()
                        .map_err(|e| format!("dup of the pty master for {what}: {e}"))
                };
                let stdin = if args.stdin { Some(dup("stdin")?) } else { None };
                let resize = Some(dup("resize")?);
                Ok((
                    [Some(File::from(master)), None],
                    StdioSetup {
                        tty: true,
                        stdin_once: args.stdin_once,
                        stdin,
                        resize,
                    },
                ))
            }
        }
    }
}
