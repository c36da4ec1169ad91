//! `/attach/{namespace}/{pod}[/{uid}]/{container}?input=1&output=1&error=1&tty=1`: connect
//! to the streams of a container's main process (a container with `stdin`/`tty` in its spec),
//! over the same protocols as exec. The session with the container's monitor comes from the
//! runtime's attach; [`attach_session`] is where it plugs in.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State as AxState};
use axum::http::{Request, StatusCode};
use axum::response::Response;
use ferrolet_runtime::Runtime;
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

/// Connect the session to the container's main process until it exits or the client leaves.
pub async fn attach_session(_rt: Arc<Runtime>, id: String, _session: Session) -> Outcome {
    // The runtime's attach (Runtime::attach) plugs in here.
    Outcome::Error(format!(
        "attaching to container {id} is not supported by this runtime yet"
    ))
}
