//! Pod status: computed as kubelet computes it from what runs ([`generate`], [`phase`]) and
//! recorded by the status manager ([`manager`]) for the API, the CLI and the next start.

pub mod generate;
pub mod killed;
pub mod manager;
pub mod phase;
pub mod sync;

pub use generate::{compute, gate_conditions, killed, rejected, unready_gates, StatusInput, DISRUPTION_TARGET};
pub use killed::Killed;
pub use manager::{PersistedStatus, StatusManager};
