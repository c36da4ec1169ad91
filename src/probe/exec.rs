//! The exec handler: a command run in the container through the runtime (kubelet's
//! pkg/probe/exec). Output beyond [`MAX_OUTPUT`] is dropped, as kubelet drops it.

use std::time::Duration;

use ferrolet_runtime::{ExecSpec, Runtime};

use super::{Outcome, MAX_OUTPUT};
use crate::pod::units::format_duration;

/// Run `cmd` in container `id`: exit code 0 succeeds; a timeout or any other code fails, with
/// the command's output (or its exit code) as the message.
pub async fn probe(rt: &Runtime, id: &str, cmd: &[String], timeout: Duration) -> Outcome {
    let spec = ExecSpec {
        args: cmd.to_vec(),
        ..Default::default()
    };
    let run = rt.exec_capture(id, &spec, Some(timeout), MAX_OUTPUT);
    match crate::metrics::global().time_runtime("exec_sync", run).await {
        Err(e) => Outcome::Failure(ferrolet_fsutil::chain(&e).to_string()),
        Ok(o) if o.timed_out => Outcome::Failure(format!(
            "command timed out: {:?} timed out after {}",
            cmd.join(" "),
            format_duration(timeout)
        )),
        Ok(o) => {
            let mut out = o.stdout;
            out.extend_from_slice(&o.stderr);
            out.truncate(MAX_OUTPUT);
            let text = String::from_utf8_lossy(&out).into_owned();
            if o.exit_code == 0 {
                Outcome::Success(String::new())
            } else if text.trim().is_empty() {
                Outcome::Failure(format!("command {:?} exited with {}", cmd.join(" "), o.exit_code))
            } else {
                Outcome::Failure(text)
            }
        }
    }
}
