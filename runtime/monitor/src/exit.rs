//! `exit.json`: what a monitor records when its container's init has exited.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExitRecord {
    /// The exit code, or 128 + signal number when killed by a signal.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub oom_killed: bool,
    pub finished_at: String,
    /// Set when the runtime, not the process, decided the outcome (e.g. the node rebooted).
    #[serde(default)]
    pub reason: Option<String>,
}
