//! Who is asking (kubelet's authenticator, apiserver's DelegatingAuthenticatorConfig): the
//! client certificate verified at the handshake (user = CN, groups = O), else a bearer token
//! checked with a TokenReview (authentication.k8s.io/v1) through the node's API client, its
//! answer cached for cacheTTL whether it says yes or no (errors are not cached). Authenticated
//! users get the `system:authenticated` group. With neither credential, the request is
//! `system:anonymous` in `system:unauthenticated` when anonymous auth is on, else it is refused.
//! A credential that fails (a bad token) is refused even with anonymous auth on.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use axum::http::{header, HeaderMap};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use tracing::debug;

use super::cache::TtlCache;
use super::User;
use crate::kubeclient::Kube;
use crate::server::clientcert;
use crate::server::tls::PeerCertificates;

pub const AUTHENTICATED: &str = "system:authenticated";
pub const ANONYMOUS: &str = "system:anonymous";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";

/// Tries of a TokenReview before the request fails (kubelet's webhook retry back-off takes
/// five steps from 500 ms).
const REVIEW_TRIES: u32 = 3;

pub struct Authenticator {
    /// Bearer tokens are reviewed when set (authentication.webhook.enabled).
    tokens: Option<TokenReviewer>,
    anonymous: bool,
}

/// Why a request is not authenticated.
#[derive(Debug)]
pub enum AuthnError {
    /// No credential, and anonymous requests are off.
    NoCredentials,
    /// A credential that does not authenticate, or the review failed.
    Failed(anyhow::Error),
}

impl Authenticator {
    pub fn new(tokens: Option<TokenReviewer>, anonymous: bool) -> Authenticator {
        Authenticator { tokens, anonymous }
    }

    /// The request's user, from the connection's verified client certificate and the
    /// request's headers.
    pub async fn authenticate(&self, peer: &PeerCertificates, headers: &HeaderMap) -> Result<User, AuthnError> {
        let mut errors = Vec::new();
        // x509 first, as kubelet's union of authenticators
        if let Some(chain) = &peer.0 {
            match chain.first().and_then(|leaf| clientcert::user_of(leaf)) {
                Some((name, groups)) => return Ok(authenticated(User::named(name, groups))),
                None => errors.push(anyhow!("the client certificate names no user (empty common name)")),
            }
        }
        if let (Some(reviewer), Some(token)) = (&self.tokens, bearer_token(headers)) {
            match reviewer.review(token).await {
                Ok(Some(user)) => return Ok(authenticated(user)),
                Ok(None) => errors.push(anyhow!("invalid bearer token")),
                Err(e) => errors.push(e),
            }
        }
        if let Some(e) = errors.into_iter().next() {
            return Err(AuthnError::Failed(e));
        }
        if self.anonymous {
            return Ok(User::named(ANONYMOUS.into(), vec![UNAUTHENTICATED.into()]));
        }
        Err(AuthnError::NoCredentials)
    }
}

fn authenticated(mut u: User) -> User {
    if !u.groups.iter().any(|g| g == AUTHENTICATED) {
        u.groups.push(AUTHENTICATED.into());
    }
    u
}

/// The token of an `Authorization: Bearer <token>` header (the scheme in any case), if any.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let mut parts = value.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Bearer tokens checked by the API server, answers cached per token (by its hash).
pub struct TokenReviewer {
    kube: Kube,
    ttl: Duration,
    cache: TtlCache<[u8; 32], Option<User>>,
}

impl TokenReviewer {
    pub fn new(kube: Kube, ttl: Duration) -> TokenReviewer {
        TokenReviewer {
            kube,
            ttl,
            cache: TtlCache::default(),
        }
    }

    /// The token's user, `None` if the API server says it does not authenticate.
    pub async fn review(&self, token: &str) -> Result<Option<User>> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(answer) = self.cache.get(&key) {
            return Ok(answer);
        }
        let mut delay = Duration::from_millis(500);
        let mut tries = 0;
        let answer = loop {
            tries += 1;
            match self.ask(token).await {
                Ok(a) => break a,
                Err(e) if tries >= REVIEW_TRIES => return Err(e),
                Err(e) => {
                    debug!(error = %format!("{e:#}"), "token review failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = delay.mul_f64(1.5);
                }
            }
        };
        self.cache.insert(key, answer.clone(), self.ttl);
        Ok(answer)
    }

    async fn ask(&self, token: &str) -> Result<Option<User>> {
        let api: Api<TokenReview> = Api::all(self.kube.client());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .context("creating a TokenReview")?;
        let Some(status) = answer.status else {
            bail!("the TokenReview came back without a status");
        };
        if status.authenticated != Some(true) {
            if let Some(e) = status.error.filter(|e| !e.is_empty()) {
                debug!(error = %e, "token review: not authenticated");
            }
            return Ok(None);
        }
        let u = status.user.unwrap_or_default();
        let name = u.username.unwrap_or_default();
        if name.is_empty() {
            return Ok(None);
        }
        Ok(Some(User {
            name,
            uid: u.uid.unwrap_or_default(),
            groups: u.groups.unwrap_or_default(),
            extra: u.extra.unwrap_or_default(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use std::sync::Arc;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        h
    }

    #[test]
    fn bearer_tokens_as_kubelet_reads_them() {
        assert_eq!(bearer_token(&headers("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&headers("bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&headers("Bearer abc extra")), Some("abc"));
        assert_eq!(bearer_token(&headers("Basic abc")), None);
        assert_eq!(bearer_token(&headers("Bearer ")), None);
        assert_eq!(bearer_token(&headers("Bearer")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_are_reviewed_and_both_answers_cached() {
        use std::sync::atomic::Ordering;
        let (kube, calls) = crate::server::auth::mock::kube(|mut r| {
            r["status"] = if r["spec"]["token"] == "good" {
                serde_json::json!({"authenticated": true, "user": {"username": "system:serviceaccount:d:s", "uid": "u1", "groups": ["system:serviceaccounts"]}})
            } else {
                serde_json::json!({"authenticated": false, "error": "invalid"})
            };
            r
        });
        let authn = Authenticator::new(Some(TokenReviewer::new(kube, Duration::from_secs(120))), true);
        let none = PeerCertificates(None);
        let u = authn.authenticate(&none, &headers("Bearer good")).await.unwrap();
        assert_eq!(u.name, "system:serviceaccount:d:s");
        assert_eq!(u.uid, "u1");
        assert_eq!(
            u.groups,
            vec!["system:serviceaccounts".to_string(), AUTHENTICATED.to_string()]
        );
        // a bad token is refused even though anonymous requests are allowed
        assert!(matches!(
            authn.authenticate(&none, &headers("Bearer bad")).await,
            Err(AuthnError::Failed(_))
        ));
        authn.authenticate(&none, &headers("Bearer good")).await.unwrap();
        let _ = authn.authenticate(&none, &headers("Bearer bad")).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2, "yes and no are cached");
        tokio::time::advance(Duration::from_secs(121)).await;
        authn.authenticate(&none, &headers("Bearer good")).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 3, "until cacheTTL");
        // no token at all: anonymous
        let u = authn.authenticate(&none, &HeaderMap::new()).await.unwrap();
        assert_eq!(u.name, ANONYMOUS);
    }

    #[tokio::test]
    async fn certificates_then_anonymous_when_allowed() {
        let (cert, _) = crate::kubeclient::certstore::tests::self_signed("alice", 1_000_000_000, 4_000_000_000);
        let der = x509_parser::pem::parse_x509_pem(cert.as_bytes()).unwrap().1.contents;
        let peer = PeerCertificates(Some(Arc::new(vec![der.into()])));
        let strict = Authenticator::new(None, false);
        let u = strict.authenticate(&peer, &HeaderMap::new()).await.unwrap();
        assert_eq!(u.name, "alice");
        assert_eq!(u.groups, vec![AUTHENTICATED.to_string()]);
        assert!(matches!(
            strict.authenticate(&PeerCertificates(None), &HeaderMap::new()).await,
            Err(AuthnError::NoCredentials)
        ));
        // without a token reviewer a bearer token is no credential
        assert!(matches!(
            strict.authenticate(&PeerCertificates(None), &headers("Bearer x")).await,
            Err(AuthnError::NoCredentials)
        ));
        let open = Authenticator::new(None, true);
        let u = open
            .authenticate(&PeerCertificates(None), &HeaderMap::new())
            .await
            .unwrap();
        assert_eq!(
            (u.name.as_str(), u.groups.clone()),
            (ANONYMOUS, vec![UNAUTHENTICATED.to_string()])
        );
    }
}
