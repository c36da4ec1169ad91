//! `/attach/{namespace}/{pod}[/{uid}]/{container}?input=1&output=1&error=1&tty=1`: connect
//! to the streams of a container's main process (a container with `stdin`/`tty` in its spec),
//! over the same protocols as exec, through the runtime's attach session with the container's
//! monitor (output as the monitor reads it, stdin, stdin's end, terminal sizes).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State as AxState};
use axum::http::{Request, StatusCode};
use axum::response::Response;
use ferrolet_runtime::{AttachOptions, AttachOutput, Runtime};
use tracing::info;

use super::remotecommand::{self, Options, Outcome, Session};
use super::Timeouts;
use super::{lookup_running, plain_error, Target};
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
    let found = match lookup_running(&st, &Target::from_path(&p)) {
        Ok(t) => t,
        Err(resp) => return *resp,
    };
    let rt = st.rt.clone();
    remotecommand::serve(req, opts, Timeouts::of(&st), move |session| async move {
        info!(pod = %found.pod, container = %found.container, tty = session.tty, protocol = %session.protocol, "attach");
        attach_session(rt, found.container_id, session).await
    })
    .await
}

/// Connect the session to the container's main process until it exits or the client leaves
/// (the container goes on running; a `stdinOnce` container's stdin is closed when this
/// attacher's stdin ends, by the monitor).
pub async fn attach_session(rt: Arc<Runtime>, id: String, mut session: Session) -> Outcome {
    let gone = session.client_gone();
    let opts = AttachOptions {
        stdin: session.stdin.is_some(),
        stdout: session.stdout.is_some(),
        stderr: session.stderr.is_some(),
    };
    let attach = match rt.attach(&id, opts).await {
        Ok(a) => a,
        Err(e) => return Outcome::Error(format!("{e:#}")),
    };
    let (mut reader, mut writer) = attach.into_split();
    let (mut stdin, mut resize) = (session.stdin.take(), session.resize.take());
    // Input: the client's stdin and terminal sizes, until both end. The writer lives as long
    // as this task: dropping it would detach.
    let input = tokio::spawn(async move {
        while stdin.is_some() || resize.is_some() {
            tokio::select! {
                b = async { stdin.as_mut()?.recv().await }, if stdin.is_some() => match b {
                    Some(b) => {
                        if writer.write_stdin(&b).await.is_err() {
                            stdin = None;
                        }
                    }
                    None => {
                        let _ = writer.close_stdin().await;
                        stdin = None;
                    }
                },
                s = async { resize.as_mut()?.recv().await }, if resize.is_some() => match s {
                    Some(s) => {
                        let _ = writer.resize(s.width, s.height).await;
                    }
                    None => resize = None,
                },
            }
        }
        writer
    });
    let (stdout, stderr) = (session.stdout.take(), session.stderr.take());
    tokio::pin!(gone);
    loop {
        let out = tokio::select! {
            o = reader.next() => o,
            _ = &mut gone => break,
        };
        let (data, to) = match out {
            Some(AttachOutput::Stdout(b)) => (b, stdout.as_ref()),
            // With a terminal everything is stdout; without one, stderr goes where asked.
            Some(AttachOutput::Stderr(b)) => (b, stderr.as_ref()),
            None => break,
        };
        if let Some(to) = to {
            if to.write(&data).await.is_err() {
                break;
            }
        }
    }
    input.abort();
    Outcome::Success
}
