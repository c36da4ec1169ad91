//! Process-level chores of the runtime's forked, single-threaded helpers (the zygote, its
//! workers and the container monitors): naming the process, resetting what a fork inherits
//! (signal dispositions, stdio, open fds) and leaving with `_exit`. Both the zygote and the
//! monitor use these; neither owns them.

use std::os::fd::AsRawFd;

/// Number of threads of this process, from /proc/self/status (0 if unreadable).
pub(crate) fn thread_count() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:").map(|v| v.trim().parse().unwrap_or(0)))
        })
        .unwrap_or(0)
}

/// Set the thread name the kernel shows as `comm` (top, `ps -o comm`, /proc/PID/stat);
/// the kernel keeps 15 bytes.
pub(crate) fn set_name(name: &str) {
    let c = std::ffi::CString::new(name).unwrap_or_default();
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

/// Leave without running atexit handlers or flushing stdio buffers, which belong to the
/// process this one was forked from.
pub(crate) fn exit(code: i32) -> ! {
    // SAFETY: _exit ends the process at once; nothing of Rust's runs after it.
    unsafe { libc::_exit(code) }
}

/// Children start with default dispositions and nothing blocked, whatever the parent had.
pub(crate) fn reset_signals() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for s in Signal::iterator() {
        if s != Signal::SIGKILL && s != Signal::SIGSTOP {
            // SAFETY: installing the default handler.
            let _ = unsafe { sigaction(s, &dfl) };
        }
    }
    let _ = nix::sys::signal::sigprocmask(nix::sys::signal::SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
}

/// Point stdin/stdout/stderr at /dev/null: a process that outlives the agent must not hold
/// the agent's terminal or pipes open.
pub(crate) fn detach_stdio() {
    if let Ok(f) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors.
            unsafe { libc::dup2(f.as_raw_fd(), fd) };
        }
    }
}

/// Keep only stdio and `keep`: whatever else the parent had open must not leak into workers,
/// monitors and containers.
pub(crate) fn close_other_fds(keep: i32) {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in fds {
        if fd > 2 && fd != keep {
            // SAFETY: closing fds this process owns; the read_dir fd may already be gone.
            unsafe { libc::close(fd) };
        }
    }
}
