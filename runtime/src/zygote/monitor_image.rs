//! The monitor program (crate `ferrolet-monitor`, docs/runtime.md#the-monitor-image), built
//! static by build.rs for this architecture and carried inside this binary. The zygote copies
//! it into a sealed memfd once when it starts; every monitor forked from it executes that
//! copy once its container is built, so the program's pages are one copy in memory, shared by
//! all monitors.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

/// The program's bytes (a static executable of a few hundred KB).
static PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ferrolet-monitor"));

/// The sealed memfd the monitors execute, or None when one could not be made (then each
/// monitor watches its container in the forked process, as before the program existed).
static IMAGE: OnceLock<Option<OwnedFd>> = OnceLock::new();

/// Make the memfd. Called by the zygote as it starts, before it forks anything.
pub(super) fn prepare() {
    IMAGE.get_or_init(|| crate::exe_seal::sealed_memfd(c"ferrolet-monitor", &mut &PROGRAM[..]).ok());
}

/// The program to execute, if the zygote has one.
pub(super) fn image() -> Option<BorrowedFd<'static>> {
    IMAGE.get().and_then(|f| f.as_ref()).map(|f| f.as_fd())
}
