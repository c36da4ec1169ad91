//! Authentication and authorization on the kubelet port, in kubelet's order: who is asking
//! ([`authn`]: client certificate, bearer token, anonymous), then whether they may
//! ([`authz`]: AlwaysAllow or a SubjectAccessReview), applied to every route by [`layer`].
//! The CLI's unix socket is owner-only and has none of this.

pub mod authn;
pub mod authz;
mod cache;
pub mod layer;

use std::collections::BTreeMap;

use crate::config::{AuthzMode, Config};
use crate::kubeclient::Kube;

/// An authenticated user (apiserver's user.Info). Handlers find it in the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    pub fn named(name: String, groups: Vec<String>) -> User {
        User {
            name,
            groups,
            ..Default::default()
        }
    }
}

/// The authenticator and authorizer of the kubelet port, and the node they guard.
pub struct Auth {
    pub authn: authn::Authenticator,
    pub authz: authz::Authorizer,
    pub node_name: String,
}

impl Auth {
    /// As configured: token review and Webhook authorization through `kube` (validation has
    /// made sure there is one when they are asked for).
    pub fn from_config(cfg: &Config, kube: Option<Kube>) -> anyhow::Result<Auth> {
        let s = &cfg.serving;
        let in_cluster = kube.is_some();
        let tokens = match (s.token_webhook(in_cluster), &kube) {
            (true, Some(k)) => Some(authn::TokenReviewer::new(k.clone(), s.authn_webhook_cache_ttl)),
            (true, None) => anyhow::bail!("authentication.webhook.enabled: token review needs an API server"),
            (false, _) => None,
        };
        let authz = match (s.authz_mode(in_cluster), kube) {
            (AuthzMode::AlwaysAllow, _) => authz::Authorizer::AlwaysAllow,
            (AuthzMode::Webhook, Some(k)) => authz::Authorizer::Webhook(authz::AccessReviewer::new(
                k,
                s.authz_cache_authorized_ttl,
                s.authz_cache_unauthorized_ttl,
            )),
            (AuthzMode::Webhook, None) => anyhow::bail!("authorization.mode: Webhook needs an API server"),
        };
        Ok(Auth {
            authn: authn::Authenticator::new(tokens, s.anonymous_auth),
            authz,
            node_name: cfg.node_name.clone(),
        })
    }
}

/// A mock API server for the reviews: answers each POSTed review with `answer(review)`.
#[cfg(test)]
pub(crate) mod mock {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use http_body_util::BodyExt;

    use crate::kubeclient::Kube;

    /// A `Kube` whose API server answers with `answer`, and the count of requests it got.
    pub fn kube(answer: fn(serde_json::Value) -> serde_json::Value) -> (Kube, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let service = tower::service_fn(move |req: axum::http::Request<kube::client::Body>| {
            let calls = counted.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let body = req.into_body().collect().await?.to_bytes();
                let review: serde_json::Value = serde_json::from_slice(&body)?;
                let out = answer(review).to_string();
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(axum::http::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from(out),
                )))
            }
        });
        (Kube::from_client(kube::Client::new(service, "default")), calls)
    }
}
