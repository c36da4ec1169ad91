//! `ferrolet exec` without a copy of the data: the CLI connects to a unix socket and passes its
//! own stdin, stdout and stderr as file descriptors (SCM_RIGHTS) with the request; the agent
//! hands them through the runtime to the process it starts in the container, then reports the
//! exit code. If the CLI goes away, the process is killed.

use std::io::{IoSliceMut, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::State;
use crate::kuberuntime::logs::container_name;
use crate::kuberuntime::runtime_container_id;

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

pub async fn serve(st: Arc<State>, path: std::path::PathBuf) -> Result<()> {
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let slots = Arc::new(tokio::sync::Semaphore::new(super::conn::LOCAL.max));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors, say: refuse this one, keep serving.
                warn!(error = %e, "exec socket: accepting a connection");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let st = st.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let Ok(std_stream) = stream.into_std() else {
                return;
            };
            if let Err(e) = handle(st, std_stream).await {
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

async fn handle(st: Arc<State>, stream: UnixStream) -> Result<()> {
    stream.set_nonblocking(false)?;
    let (stream, req, fds) = ferrolet_fsutil::spawn_blocking(move || -> Result<_> {
        let (req, fds) = recv_with_fds(&stream)?;
        Ok((stream, req, fds))
    })
    .await??;
    let mut out = stream.try_clone()?;
    match run(&st, &req, fds, stream).await {
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

async fn run(st: &Arc<State>, req: &ExecRequest, fds: Vec<OwnedFd>, stream: UnixStream) -> Result<i32> {
    let Ok::<[OwnedFd; 3], _>([stdin, stdout, stderr]) = fds.try_into() else {
        bail!("exec needs stdin, stdout and stderr passed as file descriptors");
    };
    if req.command.is_empty() {
        bail!("you must specify at least one command for the container");
    }
    let entry = st
        .pods
        .find(&req.namespace, &req.pod, &st.node_name)
        .ok_or_else(|| anyhow!("pod {}/{} not found", req.namespace, req.pod))?;
    let name = container_name(&entry, req.container.as_deref())?;
    let cs = crate::pod::all_statuses(&entry.status)
        .find(|c| c.name == name)
        .ok_or_else(|| anyhow!("container {name} has no status yet"))?;
    if cs.state.as_ref().and_then(|s| s.running.as_ref()).is_none() {
        bail!("container {name} is not running");
    }
    let id = runtime_container_id(cs.container_id.as_deref().unwrap_or_default()).to_string();
    let spec = ferrolet_runtime::ExecSpec {
        args: req.command.clone(),
        ..Default::default()
    };
    let proc_ = st
        .rt
        .exec(&id, &spec, ferrolet_runtime::ExecIo { stdin, stdout, stderr })
        .await?;
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
    let watcher = ferrolet_fsutil::spawn_blocking(move || {
        let mut buf = [0u8; 16];
        let _ = std::io::Read::read(&mut &stream, &mut buf);
    });
    tokio::select! {
        code = proc_.wait() => Ok(code?),
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
    .context("receiving exec request")?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().context("reading the passed descriptors")? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel just gave us these descriptors.
            fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let n = msg.bytes;
    let req: ExecRequest = serde_json::from_slice(&buf[..n]).context("bad exec request")?;
    Ok((req, fds))
}
