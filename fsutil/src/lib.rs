//! ferrolet-fsutil: the small helpers every ferrolet crate needs for its state directories, in
//! one copy: crash-safe writes ([`write_atomic`]: temp file, fsync, rename, fsync of the
//! directory), JSON records, tolerant removal and listing, process-unique and random names, the
//! boot id; and the error type they return.
//!
//! Errors follow the Rust API guidelines: an [`Error`]'s `Display` says what was being done
//! ("writing /var/lib/ferrolet/x.json"), its [`source`](std::error::Error::source) is the
//! cause (the `io::Error`, `serde_json::Error` or errno). Attach the context with the
//! [`Context`] extension trait; print an error with its causes, each once, with [`chain`].
//!
//! No Kubernetes, no async: the crates that use it from async code move the blocking calls off
//! the runtime's worker threads themselves.

mod error;
mod fs;
mod ids;

pub use error::{chain, Chain, Context, Error, Result};
pub use fs::{
    ensure_dir, list_names, read_json, read_json_opt, remove_file_opt, remove_tree, safe_name, sync_dir, write_atomic,
    write_json_atomic,
};
pub use ids::{boot_id, random_hex, unique};
