//! ferrolet-fsutil: the small helpers every ferrolet crate needs for its state directories, in
//! one copy: crash-safe writes ([`write_atomic`]: temp file, fsync, rename, fsync of the
//! directory), JSON records, tolerant removal and listing, process-unique and random names, the
//! boot id; [`RootDir`], which resolves, creates, opens and removes paths strictly beneath a
//! directory whose content is not trusted (image layers, volumes), refusing symlink and `..`
//! escapes, over [`at`], the `*at` system calls as safe functions; and the error type they
//! return.
//!
//! Errors follow the Rust API guidelines: an [`Error`]'s `Display` says what was being done
//! ("writing /var/lib/ferrolet/x.json"), its [`source`](std::error::Error::source) is the
//! cause (the `io::Error`, `serde_json::Error` or errno). Attach the context with the
//! [`Context`] extension trait; print an error with its causes, each once, with [`chain`].
//!
//! No Kubernetes. From async code, run these calls through [`blocking`], which moves them off
//! the async runtime's worker threads (and gives back the stack pages a deep call left on the
//! pool's thread).

pub mod at;
mod beneath;
#[cfg(feature = "blocking")]
mod blocking;
mod error;
mod fs;
mod ids;
pub mod json;

pub use beneath::{remove_all_at, RootDir};
#[cfg(feature = "blocking")]
pub use blocking::{blocking, spawn_blocking};
pub use error::{chain, Chain, Context, Error, Result};
pub use fs::{
    ensure_dir, ensure_private_dir, list_names, read_json, read_json_opt, remove_file_opt, remove_tree, safe_name,
    sync_dir, write_atomic, write_atomic_in, write_atomic_in_mode, write_atomic_mode, write_atomic_unsynced,
    write_json_atomic, write_json_atomic_if_changed, write_json_atomic_unsynced,
};
pub use ids::{boot_id, random_hex, unique};
