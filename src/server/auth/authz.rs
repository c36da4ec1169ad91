//! What a user may do (kubelet's authorizer): every request is an action on the node object —
//! verb from the HTTP method, resource `nodes`, name the node, subresource from the path
//! (kubelet 1.26's pkg/kubelet/server/auth.go: `/stats` stats, `/metrics` metrics, `/logs` log,
//! anything else proxy) — decided by AlwaysAllow or by a SubjectAccessReview
//! (authorization.k8s.io/v1) to the API server, allowed answers cached for cacheAuthorizedTTL
//! and denied ones for cacheUnauthorizedTTL (errors are not cached).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::http::Method;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

use super::cache::TtlCache;
use super::User;
use crate::kubeclient::Kube;

/// The authorization attributes of a request to the kubelet API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub user: User,
    /// The API verb; empty for methods kubelet does not map (HEAD, OPTIONS...).
    pub verb: &'static str,
    pub subresource: &'static str,
    /// The node's name.
    pub name: String,
}

/// kubelet's isSubpath: `path` is `prefix` or below it.
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
    path == prefix || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// kubelet's nodeAuthorizerAttributesGetter.
pub fn attributes(user: User, method: &Method, path: &str, node: &str) -> Attributes {
    let verb = match *method {
        Method::POST => "create",
        Method::GET => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    };
    let subresource = if is_subpath(path, "/stats/") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs/") {
        "log"
    } else {
        "proxy"
    };
    Attributes {
        user,
        verb,
        subresource,
        name: node.to_string(),
    }
}

/// An authorization decision; `reason` is what the API server said, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

pub enum Authorizer {
    AlwaysAllow,
    Webhook(AccessReviewer),
}

impl Authorizer {
    pub async fn authorize(&self, attrs: &Attributes) -> Result<Decision> {
        match self {
            Authorizer::AlwaysAllow => Ok(Decision {
                allowed: true,
                reason: String::new(),
            }),
            Authorizer::Webhook(r) => r.review(attrs).await,
        }
    }
}

/// SubjectAccessReviews through the node's API client, with the decision cache.
pub struct AccessReviewer {
    kube: Kube,
    allowed_ttl: Duration,
    denied_ttl: Duration,
    cache: TtlCache<String, Decision>,
}

impl AccessReviewer {
    pub fn new(kube: Kube, allowed_ttl: Duration, denied_ttl: Duration) -> AccessReviewer {
        AccessReviewer {
            kube,
            allowed_ttl,
            denied_ttl,
            cache: TtlCache::default(),
        }
    }

    pub async fn review(&self, attrs: &Attributes) -> Result<Decision> {
        let spec = review_spec(attrs);
        // the whole spec is the key, as apiserver's webhook authorizer keys its cache
        let key = serde_json::to_string(&spec).context("encoding the SubjectAccessReview")?;
        if let Some(d) = self.cache.get(&key) {
            return Ok(d);
        }
        let api: Api<SubjectAccessReview> = Api::all(self.kube.client());
        let review = SubjectAccessReview {
            spec,
            ..Default::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .context("creating a SubjectAccessReview")?;
        let Some(status) = answer.status else {
            bail!("the SubjectAccessReview came back without a status");
        };
        if let Some(e) = status.evaluation_error.as_deref().filter(|e| !e.is_empty()) {
            tracing::debug!(error = %e, "subject access review evaluation error");
        }
        let decision = Decision {
            allowed: status.allowed && status.denied != Some(true),
            reason: status.reason.unwrap_or_default(),
        };
        let ttl = if decision.allowed {
            self.allowed_ttl
        } else {
            self.denied_ttl
        };
        self.cache.insert(key, decision.clone(), ttl);
        Ok(decision)
    }
}

/// The SubjectAccessReview spec kubelet's webhook authorizer sends for `attrs`.
pub fn review_spec(attrs: &Attributes) -> SubjectAccessReviewSpec {
    SubjectAccessReviewSpec {
        user: Some(attrs.user.name.clone()),
        uid: Some(attrs.user.uid.clone()).filter(|u| !u.is_empty()),
        groups: Some(attrs.user.groups.clone()),
        extra: Some(attrs.user.extra.clone()).filter(|e| !e.is_empty()),
        resource_attributes: Some(ResourceAttributes {
            namespace: None,
            verb: Some(attrs.verb.to_string()),
            group: None,
            version: Some("v1".into()),
            resource: Some("nodes".into()),
            subresource: Some(attrs.subresource.to_string()),
            name: Some(attrs.name.clone()),
            ..Default::default()
        }),
        non_resource_attributes: None,
    }
}

/// kubelet's 403 body.
pub fn forbidden_message(attrs: &Attributes) -> String {
    format!(
        "Forbidden (user={}, verb={}, resource=nodes, subresource={})",
        attrs.user.name, attrs.verb, attrs.subresource
    )
}

/// kubelet's 500 body when the decision could not be made.
pub fn error_message(attrs: &Attributes) -> String {
    format!(
        "Authorization error (user={}, verb={}, resource=nodes, subresource={})",
        attrs.user.name, attrs.verb, attrs.subresource
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sub(method: Method, path: &str) -> (&'static str, &'static str) {
        let a = attributes(User::named("u".into(), vec![]), &method, path, "n1");
        assert_eq!(a.name, "n1");
        (a.verb, a.subresource)
    }

    #[test]
    fn verbs_and_subresources_as_kubelet_maps_them() {
        assert_eq!(sub(Method::GET, "/stats/summary"), ("get", "stats"));
        assert_eq!(sub(Method::GET, "/stats"), ("get", "stats"));
        assert_eq!(sub(Method::GET, "/stats/"), ("get", "stats"));
        assert_eq!(sub(Method::GET, "/statsx"), ("get", "proxy"));
        assert_eq!(sub(Method::GET, "/metrics"), ("get", "metrics"));
        assert_eq!(sub(Method::GET, "/metrics/cadvisor"), ("get", "metrics"));
        assert_eq!(sub(Method::GET, "/metrics/resource"), ("get", "metrics"));
        assert_eq!(sub(Method::GET, "/metricsfoo"), ("get", "proxy"));
        assert_eq!(sub(Method::GET, "/logs/"), ("get", "log"));
        assert_eq!(sub(Method::GET, "/logs/syslog"), ("get", "log"));
        assert_eq!(sub(Method::GET, "/logs"), ("get", "log"));
        assert_eq!(sub(Method::GET, "/containerLogs/ns/p/c"), ("get", "proxy"));
        assert_eq!(sub(Method::GET, "/pods"), ("get", "proxy"));
        assert_eq!(sub(Method::GET, "/spec/"), ("get", "proxy"));
        assert_eq!(sub(Method::GET, "/configz"), ("get", "proxy"));
        assert_eq!(sub(Method::POST, "/exec/ns/p/c"), ("create", "proxy"));
        assert_eq!(sub(Method::PUT, "/x"), ("update", "proxy"));
        assert_eq!(sub(Method::PATCH, "/x"), ("patch", "proxy"));
        assert_eq!(sub(Method::DELETE, "/x"), ("delete", "proxy"));
        assert_eq!(sub(Method::HEAD, "/pods"), ("", "proxy"));
    }

    #[tokio::test(start_paused = true)]
    async fn decisions_are_cached_for_their_ttl() {
        use std::sync::atomic::Ordering;
        let (kube, calls) = super::super::mock::kube(|mut r| {
            let allowed = r["spec"]["user"] == "alice";
            r["status"] = serde_json::json!({"allowed": allowed, "reason": "test"});
            r
        });
        let reviewer = AccessReviewer::new(kube, Duration::from_secs(300), Duration::from_secs(30));
        let alice = attributes(User::named("alice".into(), vec![]), &Method::GET, "/pods", "n1");
        let bob = attributes(User::named("bob".into(), vec![]), &Method::GET, "/pods", "n1");
        assert!(reviewer.review(&alice).await.unwrap().allowed);
        assert!(!reviewer.review(&bob).await.unwrap().allowed);
        assert!(reviewer.review(&alice).await.unwrap().allowed);
        assert!(!reviewer.review(&bob).await.unwrap().allowed);
        assert_eq!(calls.load(Ordering::SeqCst), 2, "both answers cached");
        // another subresource is another question
        let stats = attributes(
            User::named("alice".into(), vec![]),
            &Method::GET,
            "/stats/summary",
            "n1",
        );
        reviewer.review(&stats).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        tokio::time::advance(Duration::from_secs(31)).await;
        reviewer.review(&alice).await.unwrap();
        reviewer.review(&bob).await.unwrap();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            4,
            "the denial expired after 30s, the grant did not"
        );
        tokio::time::advance(Duration::from_secs(270)).await;
        reviewer.review(&alice).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 5, "the grant expired after 5m");
    }

    #[test]
    fn review_spec_and_messages() {
        let mut user = User::named("system:serviceaccount:d:s".into(), vec!["g".into()]);
        user.uid = "123".into();
        let a = attributes(user, &Method::GET, "/stats/summary", "node-a");
        let spec = serde_json::to_value(review_spec(&a)).unwrap();
        assert_eq!(
            spec,
            serde_json::json!({
                "user": "system:serviceaccount:d:s",
                "uid": "123",
                "groups": ["g"],
                "resourceAttributes": {"verb": "get", "version": "v1", "resource": "nodes", "subresource": "stats", "name": "node-a"},
            })
        );
        assert_eq!(
            forbidden_message(&a),
            "Forbidden (user=system:serviceaccount:d:s, verb=get, resource=nodes, subresource=stats)"
        );
        assert_eq!(
            error_message(&a),
            "Authorization error (user=system:serviceaccount:d:s, verb=get, resource=nodes, subresource=stats)"
        );
    }
}
