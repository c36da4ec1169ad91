//! `POST /run/{namespace}/{pod}[/{uid}]/{container}?cmd=...`: run a command in a running
//! container and answer with its output (stdout then stderr), as kubelet's handleRun does:
//! `cmd` is split on spaces (kubelet's legacy parameter), a non-zero exit is a 500 naming the
//! command, the code and its stderr.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State as AxState};
use axum::http::{header, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use ferrolet_runtime::ExecSpec;
use tracing::info;

use super::remotecommand::query_pairs;
use super::{lookup_running, plain_error, Target};
use crate::server::State;

/// Output kept per stream (kubelet's ExecSync keeps all; this bounds a runaway command).
const OUTPUT_LIMIT: usize = 16 << 20;

pub async fn handle(
    AxState(st): AxState<Arc<State>>,
    Path(p): Path<Vec<(String, String)>>,
    req: Request<Body>,
) -> Response {
    let q = query_pairs(&req);
    let cmd: Vec<String> = q
        .iter()
        .find(|(k, _)| k == "cmd")
        .map(|(_, v)| v.split(' ').map(str::to_string).collect())
        .unwrap_or_default();
    let found = match lookup_running(&st, &Target::from_path(&p)) {
        Ok(f) => f,
        Err(r) => return *r,
    };
    if cmd.iter().all(|c| c.is_empty()) {
        return plain_error(StatusCode::BAD_REQUEST, "query parameter \"cmd\" is required");
    }
    info!(pod = %found.pod, container = %found.container, command = ?cmd, "run");
    let spec = ExecSpec {
        args: cmd.clone(),
        ..Default::default()
    };
    match st.rt.exec_capture(&found.container_id, &spec, None, OUTPUT_LIMIT).await {
        Ok(out) if out.exit_code == 0 => {
            let mut body = out.stdout;
            body.extend_from_slice(&out.stderr);
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Ok(out) => plain_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "command '{}' exited with {}: {}",
                cmd.join(" "),
                out.exit_code,
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Err(e) => plain_error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
    }
}
