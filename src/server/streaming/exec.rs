//! `/exec/{namespace}/{pod}[/{uid}]/{container}?command=...&input=1&output=1&error=1&tty=1`:
//! run a command in a running container through the runtime and connect its stdio to the
//! session's streams. Without a tty: pipes (stdin only when asked for, else /dev/null), the
//! client's end of stdin closes the pipe so `echo hi | kubectl exec -i ... cat` ends; stdout
//! and stderr copied until both reach EOF; the exit code becomes the status. With a tty: the
//! runtime's pty (one stream, stderr merged, resize events applied to it). The client going
//! away kills the process.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State as AxState};
use axum::http::{Request, StatusCode};
use axum::response::Response;
use ferrolet_runtime::{ExecIo, ExecSpec, Runtime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tracing::info;

use super::remotecommand::{self, Options, Outcome, Output, Session};
use super::{lookup_running, plain_error, Target, Timeouts};
use crate::server::State;

pub async fn handle(
    AxState(st): AxState<Arc<State>>,
    Path(p): Path<Vec<(String, String)>>,
    req: Request<Body>,
) -> Response {
    let q = remotecommand::query_pairs(&req);
    let opts = match Options::from_query(&q) {
        Ok(o) => o,
        Err(e) => return plain_error(StatusCode::BAD_REQUEST, e),
    };
    let command = remotecommand::query_all(&q, "command");
    let target = match lookup_running(&st, &Target::from_path(&p)) {
        Ok(t) => t,
        Err(resp) => return *resp,
    };
    let rt = st.rt.clone();
    let timeouts = Timeouts::of(&st);
    remotecommand::serve(req, opts, timeouts, move |session| async move {
        info!(pod = %target.pod, container = %target.container, ?command, tty = session.tty, protocol = %session.protocol, "exec");
        run(rt, target.container_id, command, session).await
    })
    .await
}

/// Run `command` in the container and stream its stdio over `session`.
pub async fn run(rt: Arc<Runtime>, id: String, command: Vec<String>, session: Session) -> Outcome {
    if command.is_empty() {
        return Outcome::Error("you must specify at least one command for the container".into());
    }
    let spec = ExecSpec {
        args: command.clone(),
        ..Default::default()
    };
    let result = if session.tty {
        run_tty(&rt, &id, &spec, session).await
    } else {
        run_pipes(&rt, &id, &spec, session).await
    };
    match result {
        Ok(0) => Outcome::Success,
        Ok(code) => Outcome::ExitCode { code, command },
        Err(e) => Outcome::Error(format!("error executing command in container: {e:#}")),
    }
}

fn pipe() -> anyhow::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

fn dev_null() -> anyhow::Result<OwnedFd> {
    Ok(OwnedFd::from(std::fs::File::open("/dev/null")?))
}

fn nonblocking(fd: &OwnedFd) -> anyhow::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_truncate(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Copy what the client sends into `w` until it closes stdin, then close `w`.
async fn pump_stdin(mut rx: mpsc::Receiver<bytes::Bytes>, mut w: impl tokio::io::AsyncWrite + Unpin) {
    while let Some(b) = rx.recv().await {
        if w.write_all(&b).await.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
}

/// Copy `r` to the client until EOF.
async fn pump_output(mut r: impl tokio::io::AsyncRead + Unpin, out: Output) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if out.write(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn run_pipes(rt: &Runtime, id: &str, spec: &ExecSpec, session: Session) -> anyhow::Result<i32> {
    use tokio::net::unix::pipe;
    let gone = session.client_gone();
    let (stdin_child, stdin_ours) = match session.stdin {
        Some(_) => {
            let (r, w) = pipe()?;
            (r, Some(w))
        }
        None => (dev_null()?, None),
    };
    let mut outputs = Vec::new();
    let mut child_out = Vec::new();
    for out in [session.stdout, session.stderr] {
        match out {
            Some(o) => {
                let (r, w) = pipe()?;
                nonblocking(&r)?;
                outputs.push((pipe::Receiver::from_owned_fd(r)?, o));
                child_out.push(w);
            }
            None => child_out.push(OwnedFd::from(
                std::fs::OpenOptions::new().write(true).open("/dev/null")?,
            )),
        }
    }
    let [stdout, stderr]: [OwnedFd; 2] = child_out.try_into().map_err(|_| anyhow::anyhow!("stdio setup"))?;
    let proc_ = rt
        .exec(
            id,
            spec,
            ExecIo {
                stdin: stdin_child,
                stdout,
                stderr,
            },
        )
        .await?;
    let pid = proc_.pid();
    let stdin_task = match (session.stdin, stdin_ours) {
        (Some(rx), Some(w)) => {
            nonblocking(&w)?;
            Some(tokio::spawn(pump_stdin(rx, pipe::Sender::from_owned_fd(w)?)))
        }
        _ => None,
    };
    let copies: Vec<_> = outputs
        .into_iter()
        .map(|(r, o)| tokio::spawn(pump_output(r, o)))
        .collect();
    let all_output = futures::future::join_all(copies);
    let wait = proc_.wait();
    tokio::pin!(gone, wait, all_output);
    let code = tokio::select! {
        code = &mut wait => code?,
        _ = &mut gone => {
            kill(pid);
            return Ok(128 + libc::SIGKILL);
        }
    };
    if let Some(t) = stdin_task {
        t.abort();
    }
    // Output still in the pipes is the command's; the client leaving stops the wait.
    tokio::select! {
        _ = &mut all_output => {}
        _ = &mut gone => {}
    }
    Ok(code)
}

fn kill(pid: i32) {
    if let Ok(p) = ferrolet_runtime::pidfd::PidFd::open(pid) {
        let _ = p.send_signal(libc::SIGKILL);
    }
}

/// Connect a pty master to the session: stdin into it, its output to stdout, resize events
/// applied to it; ends when the output reaches EOF (the pty's last holder exited).
pub async fn pump_pty(master: OwnedFd, mut session: Session) -> anyhow::Result<()> {
    if let Some(mut rx) = session.resize.take() {
        let fd = master.try_clone()?;
        tokio::spawn(async move {
            while let Some(s) = rx.recv().await {
                if let Err(e) = ferrolet_runtime::resize_tty(fd.as_fd(), s.width, s.height) {
                    tracing::debug!(error = %e, "exec: resizing the terminal");
                }
            }
        });
    }
    // Two descriptors: a tokio File runs one blocking operation at a time, and a read that
    // waits for output must not hold up stdin.
    let w = tokio::fs::File::from_std(std::fs::File::from(master.try_clone()?));
    let r = tokio::fs::File::from_std(std::fs::File::from(master));
    if let Some(rx) = session.stdin.take() {
        tokio::spawn(pump_stdin(rx, w));
    }
    if let Some(out) = session.stdout.take() {
        pump_output(r, out).await;
    }
    Ok(())
}

async fn run_tty(rt: &Runtime, id: &str, spec: &ExecSpec, session: Session) -> anyhow::Result<i32> {
    let gone = session.client_gone();
    let (proc_, master) = rt.exec_tty(id, spec).await?;
    let pid = proc_.pid();
    // The terminal is pumped (input, output, resizes) while the process runs: a process
    // writing more than the terminal buffers would otherwise wait for the exit that waits
    // for it, and a resize would only arrive at the end.
    let mut output = tokio::spawn(pump_pty(master, session));
    let wait = proc_.wait();
    tokio::pin!(gone, wait);
    let code = tokio::select! {
        code = &mut wait => code?,
        _ = &mut gone => {
            kill(pid);
            output.abort();
            return Ok(128 + libc::SIGKILL);
        }
    };
    // What the process wrote before it exited is still in the terminal.
    tokio::select! {
        _ = &mut output => {}
        _ = &mut gone => output.abort(),
    }
    Ok(code)
}
