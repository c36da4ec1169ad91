//! ferrolet-runtime: a minimal container runtime for an air-gapped node agent. It knows nothing
//! of Kubernetes: it stores and unpacks images, turns a container description into an OCI
//! spec, creates containers with youki's libcontainer from a single-threaded zygote, keeps a
//! monitor per container that writes CRI logs and exit codes (and outlives the agent), and
//! reads stats from cgroupfs.
//!
//! Start-up order matters: call [`fork_zygote`] first thing in `main`, before any thread
//! exists, then build the async runtime and [`Runtime::new`].

use ferrolet_monitor::anon_buffer;
pub mod apparmor;
mod attach;
pub mod cgroups;
pub mod config;
pub mod container;
mod container_cache;
pub use ferrolet_monitor::crilog;
pub mod devices;
pub mod digest;
pub mod error;
pub mod exe_seal;
pub mod idmap;
pub mod image;
mod kept_files;
pub mod migration_warmer;
mod mount_api;
pub mod mount_ns;
pub mod namespaces;
pub mod pidfd;
mod probe;
mod process;
mod proto;
pub mod registry;
pub mod rootfs;
mod runtime;
pub mod seccomp;
mod seccomp_filter;
pub mod selinux;
pub mod spec;
pub mod stats_rounds;
mod tty;
pub mod user;
mod zygote;

pub use attach::{Attach, AttachOptions, AttachOutput, AttachReader, AttachWriter};
pub use config::ContainerConfig;
pub use container::{ContainerInfo, ContainerState, ExitRecord, ProcessUser};
pub use error::{Error, Result};
pub use ferrolet_monitor::tty::resize_tty;
pub use process::trim_heap;
pub use runtime::{ExecIo, ExecOutput, ExecProcess, ExecSpec, Runtime, DEFAULT_REQUEST_TIMEOUT};
pub use zygote::{fork_zygote, ZygoteHandle};
