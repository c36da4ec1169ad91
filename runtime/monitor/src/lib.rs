//! ferrolet-monitor: a container's monitor once the container is built (docs/runtime.md#the-monitor).
//! It copies the container's output into the CRI log ([`crilog`]) and to attachers
//! ([`attach`]), reaps, and records the exit ([`ExitRecord`]) in one poll loop ([`watch`]).
//!
//! The crate is both a library and a small static program. The runtime (ferrolet-runtime)
//! builds each container in a process forked from its zygote and then executes this program
//! in that process ([`handoff`]), so a monitor holds a few pages of its own for as long as its
//! container runs instead of a copy of the agent's. The runtime uses the library for the same
//! log format, attach protocol and cgroup reads. Knows nothing of Kubernetes, and depends on
//! little: every page of the program is memory per container.

pub mod anon_buffer;
pub mod attach;
pub mod cgroup;
pub mod crilog;
mod exit;
pub mod handoff;
pub mod sys;
pub mod tty;
pub mod watch;

pub use exit::ExitRecord;
