//! A container's seccomp profile compiled once to the BPF program the kernel runs, and loaded
//! from that program just before the container's (or an exec'd) process runs its own.
//!
//! libcontainer compiles the profile with libseccomp inside every container's init process and
//! every exec'd process: 3.7 ms of CPU per pod start here (perf, release build), about an
//! eighth of it, for the same RuntimeDefault program each time. The zygote compiles each
//! distinct profile once ([`FilterCache`]) and its forks (monitors and exec'd processes)
//! inherit the program; [`crate::zygote::confine`] loads it at the point libcontainer would
//! have. The translation is libcontainer 0.7's (`libcontainer::seccomp::initialize_seccomp`),
//! so the program is the one libseccomp would have loaded:
//! - the default action, and each rule's action, with its errno (EPERM when none is given);
//! - the flags LOG, SPEC_ALLOW and TSYNC go to the kernel with the program, as libseccomp
//!   passes them; waitKillableRecv only matters with a notify listener;
//! - a rule whose action is the default one is skipped; so is a system call libseccomp does
//!   not know (the kernel may lack it);
//! - argument conditions on the same argument twice become one rule per condition (libseccomp
//!   refuses them in one rule).
//!
//! A profile with a notify action is refused: it needs a listener, which ferrolet does not run.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::sync::Arc;

use libseccomp::{ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};
use oci_spec::runtime::{Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompFilterFlag, LinuxSeccompOperator};

/// A compiled profile: the BPF program and the flags to load it with.
#[derive(Debug)]
pub(crate) struct Filter {
    program: Vec<libc::sock_filter>,
    flags: libc::c_ulong,
}

impl Filter {
    /// Compile `profile` to its BPF program.
    pub(crate) fn compile(profile: &LinuxSeccomp) -> Result<Filter, String> {
        let (program, flags) = Filter::compile_program(profile)?;
        Filter::from_bytes(&program, flags)
    }

    /// The BPF program `profile` compiles to, as the kernel encodes it, and its flags.
    fn compile_program(profile: &LinuxSeccomp) -> Result<(Vec<u8>, libc::c_ulong), String> {
        if has_notify(profile) {
            return Err(NOTIFY_REFUSED.into());
        }
        let default = action(profile.default_action(), profile.default_errno_ret())?;
        let mut ctx = ScmpFilterContext::new(default).map_err(|e| format!("new seccomp filter: {e}"))?;
        let mut flags: libc::c_ulong = 0;
        for flag in profile.flags().iter().flatten() {
            flags |= match flag {
                LinuxSeccompFilterFlag::SeccompFilterFlagLog => libc::SECCOMP_FILTER_FLAG_LOG,
                LinuxSeccompFilterFlag::SeccompFilterFlagTsync => libc::SECCOMP_FILTER_FLAG_TSYNC,
                LinuxSeccompFilterFlag::SeccompFilterFlagSpecAllow => libc::SECCOMP_FILTER_FLAG_SPEC_ALLOW,
                LinuxSeccompFilterFlag::SeccompFilterFlagWaitKillableRecv => 0,
            };
        }
        for &a in profile.architectures().iter().flatten() {
            ctx.add_arch(arch(a))
                .map_err(|e| format!("seccomp architecture {a:?}: {e}"))?;
        }
        for rule in profile.syscalls().iter().flatten() {
            let act = action(rule.action(), rule.errno_ret())?;
            if act == default {
                continue;
            }
            let conditions: Vec<ScmpArgCompare> = rule
                .args()
                .iter()
                .flatten()
                .map(|a| ScmpArgCompare::new(a.index() as u32, op(a.op(), a.value_two()), a.value()))
                .collect();
            let mut indexes = HashSet::new();
            let repeated = rule.args().iter().flatten().any(|a| !indexes.insert(a.index()));
            for name in rule.names() {
                let Ok(call) = ScmpSyscall::from_name(name) else {
                    continue;
                };
                let added = if conditions.is_empty() {
                    ctx.add_rule(act, call).map(|_| ())
                } else if repeated {
                    conditions
                        .iter()
                        .try_for_each(|c| ctx.add_rule_conditional(act, call, std::slice::from_ref(c)).map(|_| ()))
                } else {
                    ctx.add_rule_conditional(act, call, &conditions).map(|_| ())
                };
                added.map_err(|e| format!("seccomp rule for {name}: {e}"))?;
            }
        }
        let (r, w) = nix::unistd::pipe().map_err(|e| format!("pipe for the seccomp program: {e}"))?;
        // A program has at most BPF_MAXINSNS (4096) instructions of 8 bytes: 32 KiB fit in a
        // pipe's default 64 KiB, so the export cannot block on a full pipe.
        ctx.export_bpf(&w)
            .map_err(|e| format!("exporting the seccomp program: {e}"))?;
        drop(w);
        let mut bytes = Vec::new();
        std::fs::File::from(r)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("reading the seccomp program: {e}"))?;
        Ok((bytes, flags))
    }

    /// Compile `profile` in a forked child, which sends the program back. libseccomp allocates
    /// and frees a lot while it compiles: in the zygote, that would leave its heap fragmented,
    /// and every fork of it (each container's monitor) would then spread its own allocations
    /// over many more of the inherited pages, each copied on write (measured: about 23 KiB more
    /// private memory per monitor). The child exits with all of that.
    pub(crate) fn compile_in_child(profile: &LinuxSeccomp) -> Result<Filter, String> {
        const FLAGS: usize = std::mem::size_of::<libc::c_ulong>();
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| format!("pipe for the seccomp compiler: {e}"))?;
        // SAFETY: the child compiles, writes to the pipe and leaves with _exit; glibc's malloc
        // stays usable after a fork.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => {
                drop(r);
                let out = match Filter::compile_program(profile) {
                    Ok((program, flags)) => {
                        let mut v = vec![0u8];
                        v.extend_from_slice(&flags.to_ne_bytes());
                        v.extend_from_slice(&program);
                        v
                    }
                    Err(e) => {
                        let mut v = vec![1u8];
                        v.extend_from_slice(e.as_bytes());
                        v
                    }
                };
                let code = i32::from(std::io::Write::write_all(&mut std::fs::File::from(w), &out).is_err());
                crate::process::exit(code)
            }
            Ok(nix::unistd::ForkResult::Parent { child }) => {
                drop(w);
                let mut out = Vec::new();
                let read = std::fs::File::from(r).read_to_end(&mut out);
                let _ = nix::sys::wait::waitpid(child, None);
                read.map_err(|e| format!("reading from the seccomp compiler: {e}"))?;
                match out.split_first() {
                    Some((0, rest)) if rest.len() >= FLAGS => {
                        let (flags, program) = rest.split_at(FLAGS);
                        let flags = libc::c_ulong::from_ne_bytes(flags.try_into().expect("the flags' size"));
                        Filter::from_bytes(program, flags)
                    }
                    Some((1, message)) => Err(String::from_utf8_lossy(message).into_owned()),
                    _ => Err("the seccomp compiler ended without an answer".into()),
                }
            }
            Err(e) => Err(format!("forking the seccomp compiler: {e}")),
        }
    }

    /// A program from the kernel's encoding of it (`struct sock_filter`, 8 bytes each).
    fn from_bytes(bytes: &[u8], flags: libc::c_ulong) -> Result<Filter, String> {
        let size = std::mem::size_of::<libc::sock_filter>();
        if bytes.is_empty() || bytes.len() % size != 0 {
            return Err(format!("a seccomp program of {} bytes", bytes.len()));
        }
        let program = bytes
            .chunks_exact(size)
            .map(|c| libc::sock_filter {
                code: u16::from_ne_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        Ok(Filter { program, flags })
    }

    #[cfg(test)]
    fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.program.len() * 8);
        for i in &self.program {
            v.extend_from_slice(&i.code.to_ne_bytes());
            v.push(i.jt);
            v.push(i.jf);
            v.extend_from_slice(&i.k.to_ne_bytes());
        }
        v
    }

    /// Install the program on the calling thread (and, with TSYNC, its process). Needs
    /// noNewPrivileges or CAP_SYS_ADMIN, as any seccomp filter does.
    pub(crate) fn load(&self) -> std::io::Result<()> {
        let prog = libc::sock_fprog {
            len: self.program.len() as libc::c_ushort,
            filter: self.program.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: `prog` points at `self.program`, which outlives the call; the kernel copies it.
        // nix has no seccomp(2).
        let r = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                self.flags,
                &prog as *const libc::sock_fprog,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Instructions in the program.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.program.len()
    }
}

/// The compiled profiles the zygote has seen, by their JSON. Kept small: a node runs few
/// distinct profiles (RuntimeDefault, per capability set, and its Localhost ones).
#[derive(Default)]
pub(crate) struct FilterCache {
    compiled: HashMap<String, Arc<Filter>>,
}

/// More distinct profiles than this and the cache starts again (each is a few KiB).
const CACHE_LIMIT: usize = 32;

impl FilterCache {
    pub(crate) fn get(&mut self, profile: &LinuxSeccomp) -> Result<Arc<Filter>, String> {
        let key = serde_json::to_string(profile).map_err(|e| format!("encoding the seccomp profile: {e}"))?;
        if let Some(f) = self.compiled.get(&key) {
            return Ok(f.clone());
        }
        let f = Arc::new(Filter::compile_in_child(profile)?);
        if self.compiled.len() >= CACHE_LIMIT {
            self.compiled.clear();
        }
        self.compiled.insert(key, f.clone());
        Ok(f)
    }
}

/// Why a profile with a notify action is refused.
pub(crate) const NOTIFY_REFUSED: &str =
    "the seccomp profile has a notify action (SCMP_ACT_NOTIFY), which needs a listener; ferrolet runs none";

pub(crate) fn has_notify(profile: &LinuxSeccomp) -> bool {
    profile.default_action() == LinuxSeccompAction::ScmpActNotify
        || profile
            .syscalls()
            .iter()
            .flatten()
            .any(|s| s.action() == LinuxSeccompAction::ScmpActNotify)
}

fn action(a: LinuxSeccompAction, errno: Option<u32>) -> Result<ScmpAction, String> {
    let errno = errno.map(|e| e as i32).unwrap_or(libc::EPERM);
    Ok(match a {
        LinuxSeccompAction::ScmpActKill | LinuxSeccompAction::ScmpActKillThread => ScmpAction::KillThread,
        LinuxSeccompAction::ScmpActKillProcess => ScmpAction::KillProcess,
        LinuxSeccompAction::ScmpActTrap => ScmpAction::Trap,
        LinuxSeccompAction::ScmpActErrno => ScmpAction::Errno(errno),
        LinuxSeccompAction::ScmpActTrace => ScmpAction::Trace(
            errno
                .try_into()
                .map_err(|_| format!("seccomp trace action: errno {errno} is out of range"))?,
        ),
        LinuxSeccompAction::ScmpActAllow => ScmpAction::Allow,
        LinuxSeccompAction::ScmpActLog => ScmpAction::Log,
        LinuxSeccompAction::ScmpActNotify => ScmpAction::Notify,
    })
}

fn op(o: LinuxSeccompOperator, value_two: Option<u64>) -> ScmpCompareOp {
    match o {
        LinuxSeccompOperator::ScmpCmpNe => ScmpCompareOp::NotEqual,
        LinuxSeccompOperator::ScmpCmpLt => ScmpCompareOp::Less,
        LinuxSeccompOperator::ScmpCmpLe => ScmpCompareOp::LessOrEqual,
        LinuxSeccompOperator::ScmpCmpEq => ScmpCompareOp::Equal,
        LinuxSeccompOperator::ScmpCmpGe => ScmpCompareOp::GreaterEqual,
        LinuxSeccompOperator::ScmpCmpGt => ScmpCompareOp::Greater,
        LinuxSeccompOperator::ScmpCmpMaskedEq => ScmpCompareOp::MaskedEqual(value_two.unwrap_or(0)),
    }
}

fn arch(a: Arch) -> ScmpArch {
    match a {
        Arch::ScmpArchNative => ScmpArch::Native,
        Arch::ScmpArchX86 => ScmpArch::X86,
        Arch::ScmpArchX86_64 => ScmpArch::X8664,
        Arch::ScmpArchX32 => ScmpArch::X32,
        Arch::ScmpArchArm => ScmpArch::Arm,
        Arch::ScmpArchAarch64 => ScmpArch::Aarch64,
        Arch::ScmpArchMips => ScmpArch::Mips,
        Arch::ScmpArchMips64 => ScmpArch::Mips64,
        Arch::ScmpArchMips64n32 => ScmpArch::Mips64N32,
        Arch::ScmpArchMipsel => ScmpArch::Mipsel,
        Arch::ScmpArchMipsel64 => ScmpArch::Mipsel64,
        Arch::ScmpArchMipsel64n32 => ScmpArch::Mipsel64N32,
        Arch::ScmpArchPpc => ScmpArch::Ppc,
        Arch::ScmpArchPpc64 => ScmpArch::Ppc64,
        Arch::ScmpArchPpc64le => ScmpArch::Ppc64Le,
        Arch::ScmpArchS390 => ScmpArch::S390,
        Arch::ScmpArchS390x => ScmpArch::S390X,
        Arch::ScmpArchRiscv64 => ScmpArch::Riscv64,
        Arch::ScmpArchParisc => ScmpArch::Parisc,
        Arch::ScmpArchParisc64 => ScmpArch::Parisc64,
        Arch::ScmpArchLoongarch64 => ScmpArch::Loongarch64,
        Arch::ScmpArchM68k => ScmpArch::M68k,
        Arch::ScmpArchSh => ScmpArch::Sh,
        Arch::ScmpArchSheb => ScmpArch::Sheb,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use oci_spec::runtime::{LinuxSeccompArgBuilder, LinuxSeccompBuilder, LinuxSyscallBuilder};

    fn profile(calls: Vec<oci_spec::runtime::LinuxSyscall>) -> LinuxSeccomp {
        LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActAllow)
            .architectures(vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32])
            .syscalls(calls)
            .build()
            .unwrap()
    }

    fn rule(names: &[&str], action: LinuxSeccompAction, errno: u32) -> oci_spec::runtime::LinuxSyscall {
        LinuxSyscallBuilder::default()
            .names(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .action(action)
            .errno_ret(errno)
            .build()
            .unwrap()
    }

    /// Run `f` in a forked child under noNewPrivileges (so that it may load filters without
    /// CAP_SYS_ADMIN) and return its exit code.
    pub(crate) fn in_child(f: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child only makes system calls and exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = if nix::sys::prctl::set_no_new_privs().is_ok() {
                    f()
                } else {
                    99
                };
                crate::process::exit(code)
            }
            nix::unistd::ForkResult::Parent { child } => match nix::sys::wait::waitpid(child, None).unwrap() {
                nix::sys::wait::WaitStatus::Exited(_, c) => c,
                other => panic!("child ended as {other:?}"),
            },
        }
    }

    #[test]
    fn runtime_default_compiles_once_per_profile() {
        let caps = vec!["CAP_CHOWN".to_string(), "CAP_KILL".to_string()];
        let p = crate::seccomp::runtime_default(&caps);
        let mut cache = FilterCache::default();
        let a = cache.get(&p).unwrap();
        assert!(a.len() > 100, "a program of {} instructions", a.len());
        let b = cache.get(&crate::seccomp::runtime_default(&caps)).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "the same profile is compiled once");
        let admin = cache
            .get(&crate::seccomp::runtime_default(&["CAP_SYS_ADMIN".to_string()]))
            .unwrap();
        assert!(!Arc::ptr_eq(&a, &admin));
        // The cache compiles in a child: the same program as compiling here.
        let here = Filter::compile(&p).unwrap();
        assert_eq!(here.to_bytes(), a.to_bytes());
        assert_eq!(here.flags, a.flags);
        // and its errors come back from the child
        let notify = profile(vec![rule(&["mkdir"], LinuxSeccompAction::ScmpActNotify, 0)]);
        let err = cache.get(&notify).unwrap_err();
        assert!(err.contains("notify"), "{err}");
    }

    #[test]
    fn the_loaded_program_does_what_the_profile_says() {
        // getppid answers EACCES, getpid stays allowed; a condition on the argument (kill with
        // signal 0 refused with ESRCH) compiles into the program as well.
        let kill0 = LinuxSyscallBuilder::default()
            .names(vec!["kill".to_string()])
            .action(LinuxSeccompAction::ScmpActErrno)
            .errno_ret(libc::ESRCH as u32)
            .args(vec![LinuxSeccompArgBuilder::default()
                .index(1usize)
                .value(0u64)
                .op(LinuxSeccompOperator::ScmpCmpEq)
                .build()
                .unwrap()])
            .build()
            .unwrap();
        let p = profile(vec![
            rule(&["getppid"], LinuxSeccompAction::ScmpActErrno, libc::EACCES as u32),
            // the default action again: skipped, as libcontainer skips it
            rule(&["getuid"], LinuxSeccompAction::ScmpActAllow, 0),
            // unknown to libseccomp: skipped
            rule(&["no_such_call"], LinuxSeccompAction::ScmpActErrno, 1),
            kill0,
        ]);
        let f = Filter::compile(&p).unwrap();
        let code = in_child(|| {
            if f.load().is_err() {
                return 1;
            }
            // SAFETY: a system call with no arguments. The bare one: glibc's getppid (which
            // nix's calls) cannot fail, so it sets no errno when the filter refuses it.
            let ppid = unsafe { libc::syscall(libc::SYS_getppid) };
            let ppid_errno = std::io::Error::last_os_error().raw_os_error();
            let pid = nix::unistd::getpid();
            let kill = nix::sys::signal::kill(pid, None);
            let term = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
            match (ppid, ppid_errno, kill, term) {
                (-1, Some(libc::EACCES), Err(nix::errno::Errno::ESRCH), Ok(())) => 0,
                _ => 2,
            }
        });
        assert_eq!(code, 0);
        // Without the filter the same calls succeed.
        let code = in_child(|| {
            // SAFETY: as above.
            let ppid = unsafe { libc::syscall(libc::SYS_getppid) };
            if ppid > 0 && nix::sys::signal::kill(nix::unistd::getpid(), None).is_ok() {
                0
            } else {
                3
            }
        });
        assert_eq!(code, 0);
    }

    #[test]
    fn notify_is_refused_and_flags_go_with_the_program() {
        let p = profile(vec![rule(&["mkdir"], LinuxSeccompAction::ScmpActNotify, 0)]);
        let err = Filter::compile(&p).unwrap_err();
        assert!(err.contains("notify"), "{err}");
        let mut p = profile(vec![rule(&["getppid"], LinuxSeccompAction::ScmpActErrno, 1)]);
        p.set_flags(Some(vec![
            LinuxSeccompFilterFlag::SeccompFilterFlagLog,
            LinuxSeccompFilterFlag::SeccompFilterFlagSpecAllow,
        ]));
        let f = Filter::compile(&p).unwrap();
        assert_eq!(
            f.flags,
            libc::SECCOMP_FILTER_FLAG_LOG | libc::SECCOMP_FILTER_FLAG_SPEC_ALLOW
        );
    }
}
