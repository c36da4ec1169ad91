//! The RuntimeDefault seccomp profile: an allow list of the system calls ordinary containers
//! make, with the same shape as the profile containerd and docker apply by default. Calls that
//! need a capability the container does not hold are left out, namespace-creating `clone`
//! flags are refused, and `clone3` answers ENOSYS so libc falls back to `clone`.
//! docs/seccomp.md compares it with containerd's, call by call.

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompBuilder, LinuxSeccompOperator,
    LinuxSyscall, LinuxSyscallBuilder,
};

/// System calls every container may make. Those of kernels 6.8 to 6.13 (`listmount`, `mseal`,
/// `getxattrat`, ...) need libseccomp 2.6: an older one does not know them, skips them, and
/// they answer EPERM.
const BASE: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "adjtimex",
    "alarm",
    "bind",
    "brk",
    "cachestat",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "chown32",
    "clock_adjtime",
    "clock_adjtime64",
    "clock_getres",
    "clock_getres_time64",
    "clock_gettime",
    "clock_gettime64",
    "clock_nanosleep",
    "clock_nanosleep_time64",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fadvise64_64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchown32",
    "fchownat",
    "fcntl",
    "fcntl64",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstat64",
    "fstatat64",
    "fstatfs",
    "fstatfs64",
    "fsync",
    "ftruncate",
    "ftruncate64",
    "futex",
    "futex_requeue",
    "futex_time64",
    "futex_wait",
    "futex_waitv",
    "futex_wake",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "getegid32",
    "geteuid",
    "geteuid32",
    "getgid",
    "getgid32",
    "getgroups",
    "getgroups32",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresgid32",
    "getresuid",
    "getresuid32",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "get_thread_area",
    "gettid",
    "gettimeofday",
    "getuid",
    "getuid32",
    "getxattr",
    "getxattrat",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "ioctl",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_pgetevents_time64",
    "ioprio_get",
    "ioprio_set",
    "io_setup",
    "io_submit",
    "ipc",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lchown32",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listmount",
    "listxattr",
    "listxattrat",
    "llistxattr",
    "_llseek",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "lstat64",
    "madvise",
    "map_shadow_stack",
    "membarrier",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mmap2",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedreceive_time64",
    "mq_timedsend",
    "mq_timedsend_time64",
    "mq_unlink",
    "mremap",
    "mseal",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "name_to_handle_at",
    "nanosleep",
    "newfstatat",
    "_newselect",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "ppoll_time64",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "pselect6",
    "pselect6_time64",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recv",
    "recvfrom",
    "recvmmsg",
    "recvmmsg_time64",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "removexattrat",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_sigtimedwait_time64",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_rr_get_interval_time64",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "semtimedop_time64",
    "send",
    "sendfile",
    "sendfile64",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsgid32",
    "setfsuid",
    "setfsuid32",
    "setgid",
    "setgid32",
    "setgroups",
    "setgroups32",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setregid32",
    "setresgid",
    "setresgid32",
    "setresuid",
    "setresuid32",
    "setreuid",
    "setreuid32",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_thread_area",
    "set_tid_address",
    "setuid",
    "setuid32",
    "setxattr",
    "setxattrat",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "sigprocmask",
    "sigreturn",
    "socketcall",
    "socketpair",
    "splice",
    "stat",
    "stat64",
    "statfs",
    "statfs64",
    "statmount",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_gettime64",
    "timer_settime",
    "timer_settime64",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_gettime64",
    "timerfd_settime",
    "timerfd_settime64",
    "times",
    "tkill",
    "truncate",
    "truncate64",
    "ugetrlimit",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "uretprobe",
    "utime",
    "utimensat",
    "utimensat_time64",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "waitpid",
    "write",
    "writev",
];

/// ptrace and reading or writing another process's memory, for every container: since Linux
/// 4.8 the filter runs again after a tracer changes a call, so tracing no longer gets around it
/// (containerd and docker allow these on 4.8 and later; ferrolet needs 5.3 for `pidfd_open`).
/// The kernel's own checks still apply (same user, Yama); CAP_SYS_PTRACE lifts them.
const TRACE: &[&str] = &["process_vm_readv", "process_vm_writev", "ptrace"];

/// x86_64's own calls, for its processes and i386 ones.
const X86_64_CALLS: &[&str] = &["arch_prctl", "modify_ldt"];

/// On aarch64, the calls 32-bit ARM processes make under their own names: `set_tls` sets every
/// ARM binary's thread pointer at start, `cacheflush` is what JITs call after writing code,
/// `arm_fadvise64_64` and `arm_sync_file_range` (`sync_file_range2`) are ARM's
/// `posix_fadvise` and `sync_file_range`.
const AARCH64_CALLS: &[&str] = &[
    "arm_fadvise64_64",
    "arm_sync_file_range",
    "sync_file_range2",
    "breakpoint",
    "cacheflush",
    "set_tls",
];

fn arch_calls() -> &'static [&'static str] {
    match std::env::consts::ARCH {
        "x86_64" => X86_64_CALLS,
        "aarch64" => AARCH64_CALLS,
        _ => &[],
    }
}

/// Calls allowed only with the capability named first.
const BY_CAPABILITY: &[(&str, &[&str])] = &[
    ("CAP_DAC_READ_SEARCH", &["open_by_handle_at"]),
    (
        "CAP_SYS_ADMIN",
        &[
            "bpf",
            "clone",
            "clone3",
            "fanotify_init",
            "fsconfig",
            "fsmount",
            "fsopen",
            "fspick",
            "lookup_dcookie",
            // docker's choice (containerd allows them to all): they do what /proc/self/attr
            // does, which AppArmor's path rules may be what guards.
            "lsm_get_self_attr",
            "lsm_list_modules",
            "lsm_set_self_attr",
            "mount",
            "mount_setattr",
            "move_mount",
            "open_tree",
            "perf_event_open",
            "quotactl",
            "quotactl_fd",
            "setdomainname",
            "sethostname",
            "setns",
            "syslog",
            "umount",
            "umount2",
            "unshare",
        ],
    ),
    ("CAP_SYS_BOOT", &["reboot"]),
    ("CAP_SYS_CHROOT", &["chroot"]),
    ("CAP_SYS_MODULE", &["delete_module", "init_module", "finit_module"]),
    ("CAP_SYS_PACCT", &["acct"]),
    (
        "CAP_SYS_PTRACE",
        &[
            "kcmp",
            "pidfd_getfd",
            "process_madvise",
            "process_vm_readv",
            "process_vm_writev",
            "ptrace",
        ],
    ),
    ("CAP_SYS_RAWIO", &["iopl", "ioperm"]),
    (
        "CAP_SYS_TIME",
        &["settimeofday", "stime", "clock_settime", "clock_settime64"],
    ),
    ("CAP_SYS_TTY_CONFIG", &["vhangup"]),
    (
        "CAP_SYS_NICE",
        &["get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"],
    ),
    ("CAP_SYSLOG", &["syslog"]),
    ("CAP_BPF", &["bpf"]),
    ("CAP_PERFMON", &["perf_event_open"]),
];

/// Namespace flags a container without CAP_SYS_ADMIN may not pass to clone.
const CLONE_NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

/// clone's flags: its second argument on s390x (the stack comes first there), else its first.
const CLONE_FLAGS_ARG: usize = if cfg!(target_arch = "s390x") { 1 } else { 0 };

/// An allow rule for `name` when its first argument compares to `value` by `op`.
fn allow_if(name: &str, op: LinuxSeccompOperator, value: u64) -> LinuxSyscall {
    LinuxSyscallBuilder::default()
        .names(vec![name.to_string()])
        .action(LinuxSeccompAction::ScmpActAllow)
        .args(vec![LinuxSeccompArgBuilder::default()
            .index(0usize)
            .value(value)
            .op(op)
            .build()
            .expect("static arg")])
        .build()
        .expect("static syscall rule")
}

fn allow(names: Vec<String>) -> LinuxSyscall {
    LinuxSyscallBuilder::default()
        .names(names)
        .action(LinuxSeccompAction::ScmpActAllow)
        .build()
        .expect("static syscall rule")
}

/// Build the RuntimeDefault profile for a container holding `capabilities` (`CAP_*` names).
pub(crate) fn runtime_default(capabilities: &[String]) -> LinuxSeccomp {
    let has = |c: &str| capabilities.iter().any(|x| x == c);
    let mut rules = vec![allow(
        BASE.iter()
            .chain(TRACE)
            .chain(arch_calls())
            .map(|s| s.to_string())
            .collect(),
    )];
    let mut extra: Vec<String> = Vec::new();
    for (cap, calls) in BY_CAPABILITY {
        if has(cap) {
            extra.extend(calls.iter().map(|s| s.to_string()));
        }
    }
    extra.sort();
    extra.dedup();
    if !extra.is_empty() {
        rules.push(allow(extra));
    }
    // socket: every family but AF_ALG (the kernel's crypto API, CVE-2026-31431) and AF_VSOCK
    // (not namespaced: it reaches the host), as containerd: three ranges, one condition each;
    // two "!=" on the same argument would become two rules (seccomp_filter.rs) and allow both.
    // i386's socketcall, allowed whole, is not covered, as in containerd.
    const _: () = assert!(libc::AF_VSOCK == libc::AF_ALG + 2);
    let (alg, vsock) = (libc::AF_ALG as u64, libc::AF_VSOCK as u64);
    rules.push(allow_if("socket", LinuxSeccompOperator::ScmpCmpLt, alg));
    rules.push(allow_if("socket", LinuxSeccompOperator::ScmpCmpEq, alg + 1));
    rules.push(allow_if("socket", LinuxSeccompOperator::ScmpCmpGt, vsock));
    // personality: only the harmless personas.
    for persona in [0x0u64, 0x0008, 0x20000, 0x20008, 0xffffffff] {
        rules.push(allow_if("personality", LinuxSeccompOperator::ScmpCmpEq, persona));
    }
    if !has("CAP_SYS_ADMIN") {
        rules.push(
            LinuxSyscallBuilder::default()
                .names(vec!["clone".to_string()])
                .action(LinuxSeccompAction::ScmpActAllow)
                .args(vec![LinuxSeccompArgBuilder::default()
                    .index(CLONE_FLAGS_ARG)
                    .value(CLONE_NAMESPACE_FLAGS)
                    .value_two(0u64)
                    .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
                    .build()
                    .expect("static arg")])
                .build()
                .expect("static syscall rule"),
        );
        rules.push(
            LinuxSyscallBuilder::default()
                .names(vec!["clone3".to_string()])
                .action(LinuxSeccompAction::ScmpActErrno)
                .errno_ret(libc::ENOSYS as u32)
                .build()
                .expect("static syscall rule"),
        );
    }
    LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActErrno)
        .default_errno_ret(libc::EPERM as u32)
        .architectures(native_arches())
        .syscalls(rules)
        .build()
        .expect("static seccomp profile")
}

/// The architectures the filter admits. On x86_64: x86_64 and i386 (32-bit binaries keep
/// working), but not x32: it triples the filter's compile time in every container's start
/// (about 15 ms here) and kernels ship with the x32 ABI disabled (Debian:
/// CONFIG_X86_X32_DISABLED); x32 system calls meet the filter's bad-architecture action.
fn native_arches() -> Vec<Arch> {
    match std::env::consts::ARCH {
        "x86_64" => vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86],
        "aarch64" => vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm],
        _ => vec![Arch::ScmpArchNative],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(p: &LinuxSeccomp, name: &str) -> bool {
        p.syscalls().as_ref().unwrap().iter().any(|r| {
            r.action() == LinuxSeccompAction::ScmpActAllow && r.args().is_none() && r.names().iter().any(|n| n == name)
        })
    }

    #[test]
    fn capability_gated_calls() {
        let plain = runtime_default(&["CAP_CHOWN".to_string()]);
        assert!(allowed(&plain, "read"));
        assert!(!allowed(&plain, "mount"));
        assert!(!allowed(&plain, "clone"), "clone only with flag restrictions");
        assert!(!allowed(&plain, "socket"), "socket only with family restrictions");
        assert!(!allowed(&plain, "chroot"));
        assert!(!allowed(&plain, "open_by_handle_at"));
        assert!(allowed(&plain, "ptrace"));
        let admin = runtime_default(&["CAP_SYS_ADMIN".to_string()]);
        assert!(allowed(&admin, "mount"));
        assert!(allowed(&admin, "clone"));
        assert!(allowed(&runtime_default(&["CAP_SYS_CHROOT".to_string()]), "chroot"));
        assert!(allowed(
            &runtime_default(&["CAP_DAC_READ_SEARCH".to_string()]),
            "open_by_handle_at"
        ));
    }

    /// Calls of kernels newer than libseccomp 2.5 knows (2.6 does).
    const NEWER_THAN_LIBSECCOMP_2_5: &[&str] = &[
        "getxattrat",
        "listmount",
        "listxattrat",
        "lsm_get_self_attr",
        "lsm_list_modules",
        "lsm_set_self_attr",
        "mseal",
        "removexattrat",
        "setxattrat",
        "statmount",
        "uretprobe",
    ];

    #[test]
    fn every_name_is_a_system_call_libseccomp_knows() {
        // The compiler skips a name libseccomp does not know, so a misspelt one would quietly
        // answer EPERM. Names of other architectures resolve too (to libseccomp's negative
        // pseudo numbers).
        let names = BASE
            .iter()
            .chain(TRACE)
            .chain(X86_64_CALLS)
            .chain(AARCH64_CALLS)
            .chain(BY_CAPABILITY.iter().flat_map(|(_, calls)| calls.iter()))
            .chain(["clone", "clone3", "personality", "socket"].iter());
        for name in names {
            assert!(
                libseccomp::ScmpSyscall::from_name(name).is_ok() || NEWER_THAN_LIBSECCOMP_2_5.contains(name),
                "libseccomp does not know {name}"
            );
        }
    }

    use crate::seccomp_filter::tests::in_child;

    fn errno(r: libc::c_long) -> i32 {
        if r >= 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
        }
    }

    #[test]
    fn the_loaded_program_refuses_what_containerd_refuses() {
        let filter = crate::seccomp_filter::Filter::compile(&runtime_default(&["CAP_CHOWN".to_string()])).unwrap();
        let code = in_child(|| {
            if filter.load().is_err() {
                return 1;
            }
            // These probes are bare system calls with arguments nix cannot express (an invalid
            // socket type, a null clone3), so the filter is seen as the kernel applies it.
            // socket with an invalid type: the kernel answers EINVAL (EAFNOSUPPORT past the
            // last family) without making a socket, the filter EPERM.
            let socket = |family: i32| errno(unsafe { libc::socket(family, 11, 0) } as libc::c_long);
            for family in [libc::AF_UNIX, libc::AF_NETLINK, 37, 39, 41, 45, 1000] {
                if socket(family) == libc::EPERM {
                    return 10 + family.min(99);
                }
            }
            for family in [libc::AF_ALG, libc::AF_VSOCK] {
                if socket(family) != libc::EPERM {
                    return 10 + family;
                }
            }
            // ptrace and process_vm_readv reach the kernel: no such process.
            let nobody = libc::pid_t::MAX;
            let peek = libc::PTRACE_PEEKDATA as libc::c_long;
            // SAFETY: a request on a process that does not exist.
            let ptrace =
                errno(unsafe { libc::syscall(libc::SYS_ptrace, peek, nobody as libc::c_long, 0usize, 0usize) });
            let mut byte = 0u8;
            let local = libc::iovec {
                iov_base: (&mut byte as *mut u8).cast(),
                iov_len: 1,
            };
            let remote = libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 1,
            };
            // SAFETY: one byte into `byte`, from a process that does not exist.
            let vm = errno(unsafe { libc::process_vm_readv(nobody, &local, 1, &remote, 1, 0) } as libc::c_long);
            if (ptrace, vm) != (libc::ESRCH, libc::ESRCH) {
                return 2;
            }
            // Without CAP_SYS_CHROOT, chroot is the filter's EPERM; clone3 answers ENOSYS.
            let chroot = nix::unistd::chroot("/").err().map_or(0, |e| e as i32);
            // SAFETY: clone3 with no arguments, refused before the kernel reads them.
            let clone3 = errno(unsafe { libc::syscall(libc::SYS_clone3, 0usize, 0usize) });
            if (chroot, clone3) != (libc::EPERM, libc::ENOSYS) {
                return 3;
            }
            0
        });
        assert_eq!(code, 0);
    }

    #[test]
    fn default_action_is_eperm() {
        let p = runtime_default(&[]);
        assert_eq!(p.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(p.default_errno_ret(), Some(libc::EPERM as u32));
    }
}
