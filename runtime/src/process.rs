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

/// CLOCK_MONOTONIC now (`Instant` reads the same clock but does not show it): shared by the
/// agent and the processes forked from it, so a deadline can travel between them.
pub(crate) fn monotonic_now() -> std::time::Duration {
    // CLOCK_MONOTONIC always exists; a zero would only make a deadline come early.
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(std::time::Duration::from)
        .unwrap_or_default()
}

/// Set the thread name the kernel shows as `comm` (top, `ps -o comm`, /proc/PID/stat);
/// the kernel keeps 15 bytes.
pub(crate) fn set_name(name: &str) {
    let c = std::ffi::CString::new(name).unwrap_or_default();
    let _ = nix::sys::prctl::set_name(&c);
}

/// Leave without running atexit handlers or flushing stdio buffers, which belong to the
/// process this one was forked from.
pub(crate) fn exit(code: i32) -> ! {
    // SAFETY: _exit ends the process at once; nothing of Rust's runs after it. nix has no
    // _exit, and std's exit runs the atexit handlers this must not.
    unsafe { libc::_exit(code) }
}

/// Children start with default dispositions and nothing blocked, whatever the parent had.
pub(crate) fn reset_signals() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for s in Signal::iterator() {
        if s != Signal::SIGKILL && s != Signal::SIGSTOP {
            // SAFETY: installing the default disposition, which runs no code of this process.
            // nix's sigaction needs this block too (a handler could be any function).
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
            let _ = nix::unistd::dup2(f.as_raw_fd(), fd);
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
            // Closing fds this process owns; the read_dir fd may already be gone (EBADF).
            let _ = nix::unistd::close(fd);
        }
    }
}

/// Replace the command line `ps` shows for this process (/proc/PID/cmdline) with `title`,
/// keeping nothing of the inherited one (a forked helper would otherwise show the agent's
/// `ferrolet run --config ...`). Returns whether it was done.
///
/// `prctl(PR_SET_MM)` needs CAP_SYS_RESOURCE, which a node agent may not have, so this
/// rewrites the inherited argument strings in place (the setproctitle technique): the
/// environment strings, which follow them in memory, are first copied to the heap, then the
/// title is written over both areas. The kernel reads /proc/PID/cmdline from the argv area,
/// and when the area's last byte is not NUL it reads on into the environment area up to the
/// first NUL; the title is truncated if longer than both together (or than a page, all the
/// kernel shows then).
///
/// Only for the runtime's single-threaded forked helpers: it refuses to run in a process with
/// more than one thread (another thread could be reading the environment being moved).
pub(crate) fn set_title(title: &str) -> bool {
    if thread_count() != 1 {
        return false;
    }
    let Some(area) = ArgvArea::of_self() else {
        return false;
    };
    // What the kernel shows now must be what is at arg_start: then the addresses are right.
    let Ok(shown) = std::fs::read("/proc/self/cmdline") else {
        return false;
    };
    if shown.is_empty() || shown.len() > area.len() {
        return false;
    }
    // SAFETY: [start, start + len) is this process's argument (and environment) strings area
    // as the kernel reports it: mapped, writable stack memory. Only this thread runs.
    let mem = unsafe { std::slice::from_raw_parts_mut(area.start as *mut u8, area.len()) };
    if mem[..shown.len()] != shown[..] {
        return false;
    }
    // A fork of a process that did this already (a monitor of the zygote) has nothing to move.
    if area.holds_environment() {
        move_environment_to_heap();
    }

    let clean: String = title.chars().map(|c| if c.is_control() { '?' } else { c }).collect();
    // The kernel shows at most one page of a rewritten command line.
    let page = page_size();
    let mut n = clean.len().min(mem.len() - 1).min(page.max(2) - 1);
    while !clean.is_char_boundary(n) {
        n -= 1;
    }
    mem.fill(0);
    mem[..n].copy_from_slice(&clean.as_bytes()[..n]);
    // A short title ends in the argv area: mark its last byte, past the title's NUL, so the
    // kernel reads "title\0" rather than the whole area with its trailing NULs.
    let last = area.argv_len - 1;
    if last > n {
        mem[last] = b' ';
    }
    true
}

/// The kernel's page size (4 KiB on x86_64; 16 or 64 KiB on some arm64 kernels).
pub(crate) use ferrolet_monitor::sys::page_size;

/// Where the kernel keeps this process's argument and environment strings (fields 48-51 of
/// /proc/self/stat).
struct ArgvArea {
    start: usize,
    argv_len: usize,
    /// argv plus, when it follows argv directly, the environment area.
    total_len: usize,
}

extern "C" {
    /// glibc's environment: a null-terminated array of "NAME=value" strings.
    static environ: *const *const libc::c_char;
}

impl ArgvArea {
    /// Whether the environment's strings are still where the kernel put them, in this area.
    fn holds_environment(&self) -> bool {
        // SAFETY: single-threaded (checked by the caller), so `environ` is not changing; its
        // entries up to the null one are valid pointers. (glibc's variable: nix has no
        // environment access.)
        unsafe {
            let mut e = environ;
            while !e.is_null() && !(*e).is_null() {
                let at = *e as usize;
                if (self.start..self.start + self.total_len).contains(&at) {
                    return true;
                }
                e = e.add(1);
            }
        }
        false
    }

    fn of_self() -> Option<ArgvArea> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may contain spaces) start at field 3.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<usize> = rest
            .split_whitespace()
            .skip(48 - 3)
            .take(4)
            .map(|v| v.parse().ok())
            .collect::<Option<_>>()?;
        let [arg_start, arg_end, env_start, env_end] = f[..] else {
            return None;
        };
        if arg_start == 0 || arg_end <= arg_start || env_end < env_start {
            return None;
        }
        // The kernel reads on into the environment only when it follows argv directly.
        let end = if env_start == arg_end { env_end } else { arg_end };
        let total_len = end - arg_start;
        // A sanity bound: the strings area is limited by the stack rlimit, never gigabytes.
        if total_len > 64 << 20 {
            return None;
        }
        Some(ArgvArea {
            start: arg_start,
            argv_len: arg_end - arg_start,
            total_len,
        })
    }

    fn len(&self) -> usize {
        self.total_len
    }
}

/// Copy the environment strings to the heap (clearenv, then setenv each), so that nothing
/// points into the inherited environment area any more.
fn move_environment_to_heap() {
    let vars: Vec<(std::ffi::OsString, std::ffi::OsString)> = std::env::vars_os().collect();
    // SAFETY: single-threaded (checked by the caller), so nothing reads the environment
    // meanwhile; clearenv only resets `environ`. nix's clearenv needs a block for the same
    // reason.
    unsafe { libc::clearenv() };
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
}

/// Return the whole free pages of this process's heaps to the kernel (glibc's `malloc_trim`,
/// which also merges freed chunks first; on its own glibc gives back only the top of a heap).
/// Other C libraries: nothing.
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory of the allocator's arenas to the kernel.
    // nix has no allocator calls (nor has it mallopt, malloc or free, below).
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Give the chunks glibc keeps in this thread's cache back to the heap, where they merge with
/// their free neighbours and the trim can release their pages.
///
/// glibc keeps up to 7 freed chunks of each small size (64 sizes, up to 1032 bytes) in a cache
/// per thread (tcache). To the heap they are in use: `malloc_trim` neither merges nor releases
/// them. In a monitor, the build's last frees stay there, scattered over the heap, each holding
/// its page; and a fork's first allocations take the chunks the zygote freed into its cache,
/// copying the pages it shares with the zygote. With the cache emptied in the zygote before
/// each fork and in the monitor after the build, a monitor's private heap at 100 pods went from
/// 72 to 47 KiB; the thread's start writes two pages of libc's data (+8 KiB), so 131 -> 111 KiB
/// of private memory in all (docs/runtime.md, "What a monitor keeps").
///
/// No call empties a thread's cache, but a thread's exit gives its cache back to the heap. So
/// the chunks are taken out of this thread's cache (7 allocations of each size: the cached ones
/// first, then others from the heap) and freed on a short-lived thread. That thread may use the
/// main heap only: this process has no other arena, as it is (or was forked from) the zygote,
/// which the agent forks while single-threaded. It runs on a stack mapped and unmapped here.
/// About 0.25 ms. If the thread cannot start, the chunks are freed here, back into the cache.
#[cfg(target_env = "gnu")]
pub(crate) fn empty_thread_cache() {
    /// The cache's sizes: requests of 24 + 16 * i bytes, i < 64.
    const SIZES: usize = 64;
    /// The most chunks the cache holds of one size (glibc's default `tcache_count`).
    const PER_SIZE: usize = 7;
    /// The freeing thread's stack; glibc puts the thread's descriptor and static TLS at its top.
    const STACK: usize = 256 * 1024;

    extern "C" fn free_all(chunks: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: `chunks` points to the Vec below, which outlives this thread (joined there).
        let chunks = unsafe { &*chunks.cast::<Vec<*mut libc::c_void>>() };
        for &p in chunks {
            // SAFETY: each pointer came from malloc below and is freed once, here.
            unsafe { libc::free(p) };
        }
        std::ptr::null_mut()
    }

    // SAFETY: mallopt only changes a malloc parameter. One arena: the freeing thread takes its
    // cache from the main heap instead of making an arena of its own (a mapping and pages that
    // would stay); this process runs no other thread.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    let mut chunks: Vec<*mut libc::c_void> = Vec::with_capacity(SIZES * PER_SIZE);
    for i in 0..SIZES {
        for _ in 0..PER_SIZE {
            // SAFETY: plain allocation, freed once below. A size's first allocations come from
            // the cache; once it is empty they come from the heap and go back to it.
            let p = unsafe { libc::malloc(24 + 16 * i) };
            if !p.is_null() {
                chunks.push(p);
            }
        }
    }
    let arg = std::ptr::addr_of_mut!(chunks).cast::<libc::c_void>();
    if !run_on_own_stack(free_all, arg, STACK) {
        free_all(arg);
    }
}

/// Run `f(arg)` on a new thread with a stack of `len` bytes mapped for it, wait for it and unmap
/// the stack (glibc would keep a stack it allocated, pages and all, for its next thread). False
/// if the thread could not start.
#[cfg(target_env = "gnu")]
fn run_on_own_stack(
    f: extern "C" fn(*mut libc::c_void) -> *mut libc::c_void,
    arg: *mut libc::c_void,
    len: usize,
) -> bool {
    // SAFETY: a fresh private anonymous mapping, unmapped below only after the thread using it
    // was joined; the attribute object is initialised before use and destroyed once. nix has
    // no pthread calls (a thread on a stack of our own), and its mmap needs a block as well.
    unsafe {
        let stack = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        );
        if stack == libc::MAP_FAILED {
            return false;
        }
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        let mut started = false;
        if libc::pthread_attr_init(&mut attr) == 0 {
            let mut thread: libc::pthread_t = 0;
            started = libc::pthread_attr_setstack(&mut attr, stack, len) == 0
                && libc::pthread_create(&mut thread, &attr, f, arg) == 0;
            if started {
                libc::pthread_join(thread, std::ptr::null_mut());
            }
            libc::pthread_attr_destroy(&mut attr);
        }
        libc::munmap(stack, len);
        started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_area_of_self_holds_the_command_line() {
        let a = ArgvArea::of_self().expect("argv area");
        let shown = std::fs::read("/proc/self/cmdline").unwrap();
        assert!(shown.len() <= a.len() && a.argv_len <= a.len());
        // SAFETY: reading this process's own argument strings.
        let mem = unsafe { std::slice::from_raw_parts(a.start as *const u8, shown.len()) };
        assert_eq!(mem, &shown[..]);
    }

    #[test]
    fn the_environment_starts_in_the_argv_area() {
        let a = ArgvArea::of_self().expect("argv area");
        assert!(
            a.holds_environment(),
            "a fresh process's environment strings are in its argv area"
        );
    }

    #[test]
    fn set_title_refuses_a_multi_threaded_process() {
        // The test harness runs tests on threads of their own.
        assert!(thread_count() > 1);
        assert!(!set_title("nope"));
    }

    /// In a forked child (one thread, as in the zygote and a monitor): chunks freed into the
    /// thread cache are in use to the heap until emptied, then free.
    ///
    /// Measured as the heap's free bytes, not its count of free chunks: in the test harness's
    /// fragmented heap a chunk may be cut from a larger free one, and once free it merges with
    /// that free remainder, leaving the count unchanged (CI saw it once). Trimming is off, so no
    /// free byte leaves the heap between the two measures.
    #[cfg(target_env = "gnu")]
    #[test]
    fn the_thread_cache_goes_back_to_the_heap() {
        /// The chunk a 200-byte request takes: 200 + 8 bytes of header, rounded up to 16.
        const CHUNK: usize = 208;
        // SAFETY: the child only allocates, measures and exits; glibc's fork leaves its
        // allocator usable in the child.
        match unsafe { nix::unistd::fork() }.expect("fork") {
            nix::unistd::ForkResult::Child => {
                // SAFETY: mallopt only changes a parameter; mallinfo2 only reads statistics;
                // malloc/free are paired. Free bytes in the heap, which do not count those in
                // a thread's cache.
                let free_bytes = || unsafe { libc::mallinfo2().fordblks };
                let code = unsafe {
                    libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
                    let mut keep = Vec::new();
                    let mut cached = Vec::new();
                    for _ in 0..7 {
                        keep.push(libc::malloc(200));
                        cached.push(libc::malloc(200));
                    }
                    keep.push(libc::malloc(200));
                    for p in cached {
                        libc::free(p);
                    }
                    let before = free_bytes();
                    let t = std::time::Instant::now();
                    empty_thread_cache();
                    let took = t.elapsed();
                    let after = free_bytes();
                    eprintln!("{before} -> {after} free bytes, emptied in {took:?}");
                    i32::from(after < before + 7 * CHUNK)
                };
                std::process::exit(code)
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).expect("waitpid");
                assert_eq!(
                    status,
                    nix::sys::wait::WaitStatus::Exited(child, 0),
                    "the seven cached chunks did not come back to the heap as free"
                );
            }
        }
    }
}
