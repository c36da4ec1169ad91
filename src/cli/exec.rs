//! `ferrolet exec POD [-c NAME] -- CMD...`: pass this process's stdin/stdout/stderr to the
//! agent (SCM_RIGHTS) and exit with the command's exit code.

use std::io::{BufRead, BufReader, IoSlice};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use anyhow::{anyhow, Context, Result};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use super::ExecArgs;
use crate::server::exec::{ExecReply, ExecRequest};

pub fn run(args: &ExecArgs) -> Result<i32> {
    let socket = args.root.root_dir.join("exec.sock");
    let stream = UnixStream::connect(&socket).with_context(|| {
        format!(
            "connecting to the agent at {} (is `ferrolet run` running?)",
            socket.display()
        )
    })?;
    let req = ExecRequest {
        namespace: args.namespace.clone(),
        pod: args.pod.clone(),
        container: args.container.clone(),
        command: args.command.clone(),
    };
    let data = serde_json::to_vec(&req)?;
    let fds = [0, 1, 2];
    sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(&data)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .context("sending the exec request")?;
    let reader = BufReader::new(&stream);
    for line in reader.lines() {
        let line = line?;
        match serde_json::from_str::<ExecReply>(&line)? {
            ExecReply::Started { .. } => {}
            ExecReply::Exited { exit_code } => return Ok(exit_code),
            ExecReply::Error { message } => return Err(anyhow!("{message}")),
        }
    }
    Err(anyhow!("the agent closed the connection"))
}
