//! Loading a device program and attaching it to a cgroup v2 directory, with the `bpf(2)`
//! system call directly: two commands (`BPF_PROG_LOAD`, `BPF_PROG_ATTACH`) with a few fields
//! each do not need libbpf, whose C build (with libelf and zlib) every static and cross build
//! of the agent would have to carry (docs/devices.md).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use super::program::Insn;

const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_ATTACH: libc::c_int = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
/// Programs of ancestors and others on the same cgroup all run; each must allow.
const BPF_F_ALLOW_MULTI: u32 = 2;

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to `expected_attach_type` (Linux 4.17; older
/// kernels take the zero tail).
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` for `BPF_PROG_ATTACH`.
#[repr(C)]
#[derive(Default)]
struct ProgAttach {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

fn bpf<T>(cmd: libc::c_int, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: attr is a live, initialised bpf_attr prefix of the size given; the kernel reads
    // (and for a verifier log writes through a pointer in it to) memory we own. nix has no
    // bpf(2).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Load `prog` as a cgroup device program. On a refusal by the verifier the error carries its
/// log.
pub fn load(prog: &[Insn]) -> Result<OwnedFd, String> {
    let license = CString::new("Apache-2.0").expect("no NUL");
    let mut name = [0u8; 16];
    name[..12].copy_from_slice(b"ferrolet_dev");
    let attempt = |log: Option<&mut Vec<u8>>| {
        let mut attr = ProgLoad {
            prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
            insn_cnt: prog.len() as u32,
            insns: prog.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_name: name,
            ..Default::default()
        };
        if let Some(buf) = log {
            attr.log_level = 1;
            attr.log_size = buf.len() as u32;
            attr.log_buf = buf.as_mut_ptr() as u64;
        }
        bpf(BPF_PROG_LOAD, &mut attr)
    };
    match attempt(None) {
        // SAFETY: a new fd the kernel just returned, owned by nobody else.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) || e.raw_os_error() == Some(libc::EACCES) => {
            let mut log = vec![0u8; 64 * 1024];
            let again = attempt(Some(&mut log));
            let text = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)]).into_owned();
            match again {
                // SAFETY: as above.
                Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
                Err(e) => Err(format!("loading the device program: {e}; verifier: {}", text.trim())),
            }
        }
        Err(e) => Err(load_error(e)),
    }
}

fn load_error(e: std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSYS) => "loading the device program: this kernel has no bpf(2) (CONFIG_BPF_SYSCALL); \
             cgroup v2 cannot enforce device rules without it"
            .into(),
        Some(libc::EPERM) => format!(
            "loading the device program: {e} (needs CAP_SYS_ADMIN or CAP_BPF, and on kernels before 5.11 \
             RLIMIT_MEMLOCK room)"
        ),
        _ => format!("loading the device program: {e}"),
    }
}

/// Attach a loaded program to the cgroup v2 directory `cgroup` (an absolute path in cgroupfs).
/// It stays attached, and the program loaded, for as long as the cgroup exists.
pub fn attach(prog: &OwnedFd, cgroup: &Path) -> Result<(), String> {
    let dir = std::fs::File::open(cgroup).map_err(|e| format!("opening cgroup {}: {e}", cgroup.display()))?;
    let mut attr = ProgAttach {
        target_fd: dir.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
    };
    bpf(BPF_PROG_ATTACH, &mut attr).map_err(|e| {
        let hint = if e.raw_os_error() == Some(libc::EINVAL) {
            " (a kernel without CONFIG_CGROUP_BPF cannot enforce device rules on cgroup v2)"
        } else {
            ""
        };
        format!("attaching the device program to {}: {e}{hint}", cgroup.display())
    })?;
    Ok(())
}

/// Kernels before 5.11 charge BPF programs to the locked-memory limit of the user that loads
/// them, summed over every program that user has loaded; the default 64 KiB runs out after a
/// few dozen containers. Raised for the calling process only (a monitor, after its container
/// was cloned: the container keeps its own limit).
pub(crate) fn raise_memlock_limit() {
    use nix::sys::resource::{setrlimit, Resource, RLIM_INFINITY};
    // Failing leaves the old limit.
    let _ = setrlimit(Resource::RLIMIT_MEMLOCK, RLIM_INFINITY, RLIM_INFINITY);
}

/// Load the program for `policy` and attach it to `cgroup`: what a monitor does on cgroup v2
/// before it reports its container created.
pub fn enforce(policy: &super::Policy, cgroup: &Path) -> Result<(), String> {
    if policy.allows_all() {
        return Ok(());
    }
    raise_memlock_limit();
    let prog = load(&super::program::compile(policy))?;
    attach(&prog, cgroup)
}
