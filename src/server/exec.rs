//! `ferrolet exec` without a copy of the data: the CLI connects to a unix socket and passes its
//! own stdin, stdout and stderr as file descriptors (SCM_RIGHTS) with the request; the agent
//! hands them through the runtime to the process it starts in the container, then reports the
//! exit code. If the CLI goes away, the process is killed.

use std::io::{IoSliceMut, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::status::RUNTIME_PREFIX;
use crate::sync::Ctx;

#[derive(Debug, Serialize, Deserialize)]
pub struct ExecRequest {
    pub namespace: String,
    pub pod: String,
    pub container: Option<String>,
    pub command: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ExecReply {
    Started { container: String },
    Exited { exit_code: i32 },
    Error { message: String },
}

pub async fn serve(ctx: Arc<Ctx>, path: std::path::PathBuf) -> Result<()> {
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).map_err(|e| anyhow!("binding {}: {e}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    loop {
        let (stream, _) = listener.accept().await?;
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let Ok(std_stream) = stream.into_std() else {
                return;
            };
            if let Err(e) = handle(ctx, std_stream).await {
                warn!(error = %format!("{e:#}"), "exec request failed");
            }
        });
    }
}

fn reply(s: &mut UnixStream, r: &ExecReply) {
    let mut line = serde_json::to_vec(r).unwrap_or_default();
    line.push(b'\n');
    let _ = s.write_all(&line);
}

async fn handle(ctx: Arc<Ctx>, stream: UnixStream) -> Result<()> {
    stream.set_nonblocking(false)?;
    let (stream, req, fds) = tokio::task::spawn_blocking(move || -> Result<_> {
        let (req, fds) = recv_with_fds(&stream)?;
        Ok((stream, req, fds))
    })
    .await??;
    let mut out = stream.try_clone()?;
    match run(&ctx, &req, fds, stream).await {
        Ok(code) => reply(&mut out, &ExecReply::Exited { exit_code: code }),
        Err(e) => reply(
            &mut out,
            &ExecReply::Error {
                message: format!("{e:#}"),
            },
        ),
    }
    Ok(())
}

async fn run(ctx: &Arc<Ctx>, req: &ExecRequest, mut fds: Vec<OwnedFd>, stream: UnixStream) -> Result<i32> {
    if fds.len() != 3 {
        bail!("exec needs stdin, stdout and stderr passed as file descriptors");
    }
    if req.command.is_empty() {
        bail!("you must specify at least one command for the container");
    }
    let entry = ctx
        .pods
        .find(&req.namespace, &req.pod, &ctx.node.name)
        .ok_or_else(|| anyhow!("pod {}/{} not found", req.namespace, req.pod))?;
    let name = crate::logs::container_name(&entry, req.container.as_deref())?;
    let statuses = entry
        .status
        .container_statuses
        .iter()
        .flatten()
        .chain(entry.status.init_container_statuses.iter().flatten());
    let cs = statuses
        .into_iter()
        .find(|c| c.name == name)
        .ok_or_else(|| anyhow!("container {name} has no status yet"))?;
    if cs.state.as_ref().and_then(|s| s.running.as_ref()).is_none() {
        bail!("container {name} is not running");
    }
    let id = cs
        .container_id
        .clone()
        .unwrap_or_default()
        .trim_start_matches(RUNTIME_PREFIX)
        .to_string();
    let stderr = fds.pop().expect("3");
    let stdout = fds.pop().expect("2");
    let stdin = fds.pop().expect("1");
    let spec = ferrolet_runtime::ExecSpec {
        args: req.command.clone(),
        ..Default::default()
    };
    let proc_ = ctx
        .rt
        .exec(&id, &spec, ferrolet_runtime::ExecIo { stdin, stdout, stderr })
        .await
        .map_err(|e| anyhow!("{}", ferrolet_fsutil::chain(&e)))?;
    info!(pod = %req.pod, container = %name, command = ?req.command, "exec");
    let pid = proc_.pid();
    {
        let mut s = stream.try_clone()?;
        reply(
            &mut s,
            &ExecReply::Started {
                container: name.clone(),
            },
        );
    }
    // The client going away (its socket reaches EOF) kills the process.
    let watcher = tokio::task::spawn_blocking(move || {
        let mut buf = [0u8; 16];
        let _ = std::io::Read::read(&mut &stream, &mut buf);
    });
    tokio::select! {
        code = proc_.wait() => Ok(code.map_err(|e| anyhow!("{}", ferrolet_fsutil::chain(&e)))?),
        _ = watcher => {
            // SAFETY: plain kill of the process we started.
            if let Ok(p) = ferrolet_runtime::pidfd::PidFd::open(pid) { let _ = p.send_signal(libc::SIGKILL); }
            Ok(137)
        }
    }
}

fn recv_with_fds(stream: &UnixStream) -> Result<(ExecRequest, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut cmsg = nix::cmsg_space!([RawFd; 3]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| anyhow!("receiving exec request: {e}"))?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(|e| anyhow!("{e}"))? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel just gave us these descriptors.
            fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let n = msg.bytes;
    let req: ExecRequest = serde_json::from_slice(&buf[..n]).map_err(|e| anyhow!("bad exec request: {e}"))?;
    Ok((req, fds))
}
