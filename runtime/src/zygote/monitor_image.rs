//! The monitor program (crate `ferrolet-monitor`, docs/runtime.md#the-monitor-image), built
//! static by build.rs for this architecture and carried inside this binary. The zygote copies
//! it into a sealed memfd once when it starts; every monitor forked from it executes that
//! copy once its container is built, so the program's pages are one copy in memory, shared by
//! all monitors.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

/// The program's bytes (a static executable of a few hundred KB; none in a binary built with
/// FERROLET_MONITOR_PROGRAM=none).
static PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ferrolet-monitor"));

/// The sealed memfd the monitors execute, or None when one could not be made (then each
/// monitor watches its container in the forked process, as before the program existed).
static IMAGE: OnceLock<Option<OwnedFd>> = OnceLock::new();

/// Make the memfd. Called by the zygote as it starts, before it forks anything. A memfd the
/// kernel will not execute (`vm.memfd_noexec = 2` makes every memfd non-executable) is no
/// image: the monitors then stay forks, and the zygote says so once.
pub(super) fn prepare() {
    IMAGE.get_or_init(|| {
        if PROGRAM.is_empty() {
            eprintln!(
                "ferrolet-zygote: this binary carries no monitor program (built with \
                 FERROLET_MONITOR_PROGRAM=none): monitors stay copies of the agent"
            );
            return None;
        }
        let made = crate::exe_seal::sealed_memfd(c"ferrolet-monitor", &mut &PROGRAM[..]).and_then(|fd| {
            let mode = nix::sys::stat::fstat(fd.as_raw_fd())?.st_mode;
            if mode & 0o111 == 0 {
                return Err(std::io::Error::other(
                    "the kernel made the memfd non-executable (vm.memfd_noexec)",
                ));
            }
            Ok(fd)
        });
        match made {
            Ok(fd) => Some(fd),
            Err(e) => {
                eprintln!(
                    "ferrolet-zygote: no monitor program ({e}): monitors stay copies of the agent \
                     (docs/runtime.md#the-monitor-image)"
                );
                None
            }
        }
    });
}

/// The program to execute, if the zygote has one.
pub(super) fn image() -> Option<BorrowedFd<'static>> {
    IMAGE.get().and_then(|f| f.as_ref()).map(|f| f.as_fd())
}
