//! The filter in front of every kubelet-port route (kubelet's InstallAuthFilter): 401
//! `Unauthorized` when no user can be made out, 403 `Forbidden (user=..., ...)` when the
//! authorizer says no, 500 `Authorization error (...)` when it cannot answer; otherwise the
//! request goes on with its [`User`](super::User) in its extensions.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::{debug, error, info};

use super::authn::AuthnError;
use super::{authz, Auth};
use crate::server::tls::PeerCertificates;

fn plain(code: StatusCode, msg: String) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], msg).into_response()
}

pub async fn filter(State(auth): State<Arc<Auth>>, mut req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<PeerCertificates>().cloned().unwrap_or_default();
    let user = match auth.authn.authenticate(&peer, req.headers()).await {
        Ok(u) => u,
        Err(AuthnError::NoCredentials) => {
            debug!(path = %req.uri().path(), "request without credentials refused");
            return plain(StatusCode::UNAUTHORIZED, "Unauthorized".into());
        }
        Err(AuthnError::Failed(e)) => {
            info!(path = %req.uri().path(), "unable to authenticate the request: {e:#}");
            return plain(StatusCode::UNAUTHORIZED, "Unauthorized".into());
        }
    };
    let attrs = authz::attributes(user, req.method(), req.uri().path(), &auth.node_name);
    match auth.authz.authorize(&attrs).await {
        Ok(d) if d.allowed => {}
        Ok(d) => {
            let msg = authz::forbidden_message(&attrs);
            debug!(reason = %d.reason, "{msg}");
            return plain(StatusCode::FORBIDDEN, msg);
        }
        Err(e) => {
            let msg = authz::error_message(&attrs);
            error!(error = %format!("{e:#}"), "{msg}");
            return plain(StatusCode::INTERNAL_SERVER_ERROR, msg);
        }
    }
    req.extensions_mut().insert(attrs.user);
    next.run(req).await
}
