//! ServiceAccount tokens for projected volumes (kubelet's token manager): a TokenRequest bound
//! to the pod, cached per (service account, audiences, expiration, pod) and requested anew once
//! 80% of its lifetime has passed or it is older than 24 hours (with a jitter of up to 10 s, as
//! kubelet's). A refresh that fails keeps serving the cached token until it expires. A failure
//! says whether the API server answered it ([`FetchError::unreachable`]): only a server that gave
//! no answer lets the caller fall back to the checkpoint's copy.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use tracing::{debug, info, warn};

use super::store::{api_message, FetchError};
use crate::kubeclient::Kube;

/// kubelet's maxTTL: a token is refreshed after a day whatever its expiration.
const MAX_TTL: Duration = Duration::hours(24);
/// kubelet's maxJitter.
const MAX_JITTER_SECS: f64 = 10.0;
/// The waits before a TokenRequest answered 404 is asked again (1.55 s in all).
pub(super) const NOT_FOUND_RETRIES: [std::time::Duration; 5] = [
    std::time::Duration::from_millis(50),
    std::time::Duration::from_millis(100),
    std::time::Duration::from_millis(200),
    std::time::Duration::from_millis(400),
    std::time::Duration::from_millis(800),
];

/// What a token is asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenKey {
    pub namespace: String,
    pub service_account: String,
    pub audiences: Vec<String>,
    pub expiration_seconds: i64,
    pub pod_name: String,
    pub pod_uid: String,
}

#[derive(Clone)]
struct Issued {
    token: String,
    expires: DateTime<Utc>,
    expiration_seconds: i64,
}

#[derive(Default)]
pub struct TokenManager {
    cache: Mutex<HashMap<TokenKey, Issued>>,
}

/// kubelet's requiresRefresh: past 24 h since issue, or within the last 20% of the lifetime
/// (both brought forward by `jitter`).
pub fn requires_refresh(now: DateTime<Utc>, expires: DateTime<Utc>, expiration_seconds: i64, jitter: Duration) -> bool {
    let issued = expires - Duration::seconds(expiration_seconds);
    if now > issued + MAX_TTL - jitter {
        return true;
    }
    now > expires - Duration::seconds(expiration_seconds * 20 / 100) - jitter
}

fn jitter() -> Duration {
    // Whole seconds, as kubelet truncates it.
    let r = (ferrolet_fsutil::unique() % 1_000_000) as f64 / 1_000_000.0;
    Duration::seconds((r * MAX_JITTER_SECS) as i64)
}

impl TokenManager {
    /// The token for `key`, cached or freshly requested.
    pub async fn get(&self, kube: &Kube, key: &TokenKey) -> Result<String, FetchError> {
        let now = Utc::now();
        let cached = {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            cache.retain(|_, t| t.expires > now);
            cache.get(key).cloned()
        };
        if let Some(t) = &cached {
            if !requires_refresh(now, t.expires, t.expiration_seconds, jitter()) {
                return Ok(t.token.clone());
            }
        }
        match request(kube, key).await {
            Ok(t) => {
                info!(namespace = %key.namespace, service_account = %key.service_account, pod = %key.pod_name,
                    expires = %t.expires, "service account token issued");
                let token = t.token.clone();
                self.cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key.clone(), t);
                Ok(token)
            }
            Err(e) => match cached {
                None => Err(FetchError {
                    message: format!("failed to fetch token: {}", e.message),
                    ..e
                }),
                Some(t) if t.expires <= Utc::now() => Err(FetchError {
                    message: format!(
                        "token {}/{} expired and refresh failed: {}",
                        key.namespace, key.service_account, e.message
                    ),
                    ..e
                }),
                Some(t) => {
                    warn!(namespace = %key.namespace, service_account = %key.service_account, pod = %key.pod_name,
                        error = %e.message, "couldn't update token; keeping the current one");
                    Ok(t.token)
                }
            },
        }
    }

    /// Drop the tokens of a pod that left the node (kubelet's DeleteServiceAccountToken).
    pub fn forget_pod(&self, uid: &str) {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| k.pod_uid != uid);
    }
}

async fn request(kube: &Kube, key: &TokenKey) -> Result<Issued, FetchError> {
    // What came back and could not be used is an answer all the same.
    let answered = |message: &str| FetchError {
        message: message.to_string(),
        unreachable: false,
    };
    let api: kube::Api<ServiceAccount> = kube::Api::namespaced(kube.client(), &key.namespace);
    let tr = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: (!key.audiences.is_empty()).then(|| key.audiences.clone()),
            expiration_seconds: Some(key.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(key.pod_name.clone()),
                uid: Some(key.pod_uid.clone()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    // The API server checks the bound pod against its own caches (the NodeRestriction
    // admission's pod lister), which may lag behind the watch that brought the pod here: a
    // burst of new pods gets `pod "..." not found` for some. kubelet retries the whole sync
    // after its back-off (seconds); the request is asked again here a few times first.
    let mut waits = NOT_FOUND_RETRIES.iter();
    let got = loop {
        let e = match api
            .create_token_request(&key.service_account, &Default::default(), &tr)
            .await
        {
            Ok(got) => break got,
            Err(e) => e,
        };
        let wait = match &e {
            kube::Error::Api(s) if s.code == 404 => waits.next(),
            _ => None,
        };
        let Some(wait) = wait else {
            return Err(FetchError::of(&e));
        };
        debug!(namespace = %key.namespace, pod = %key.pod_name, error = %api_message(&e),
            "the TokenRequest's pod or service account is not found yet; asking again");
        tokio::time::sleep(*wait).await;
    };
    let status = got
        .status
        .ok_or_else(|| answered("the TokenRequest came back without a status"))?;
    let (Some(token), Some(exp)) = (status.token, status.expiration_timestamp) else {
        return Err(answered("the TokenRequest came back without a token or its expiration"));
    };
    let expires = DateTime::from_timestamp(exp.0.as_second(), exp.0.subsec_nanosecond().max(0) as u32)
        .ok_or_else(|| answered("the token's expiration is out of range"))?;
    Ok(Issued {
        token,
        expires,
        // What the API server granted (it may extend or shorten the request).
        expiration_seconds: got
            .spec
            .and_then(|s| s.expiration_seconds)
            .unwrap_or(key.expiration_seconds),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_at_eighty_percent_or_after_a_day() {
        let t0 = Utc::now();
        let none = Duration::zero();
        // One hour token: refreshed after 48 min (80%).
        let exp = t0 + Duration::seconds(3600);
        assert!(!requires_refresh(t0, exp, 3600, none));
        assert!(!requires_refresh(t0 + Duration::minutes(47), exp, 3600, none));
        assert!(requires_refresh(
            t0 + Duration::minutes(48) + Duration::seconds(1),
            exp,
            3600,
            none
        ));
        // The jitter brings it forward.
        assert!(requires_refresh(
            t0 + Duration::minutes(47) + Duration::seconds(55),
            exp,
            3600,
            Duration::seconds(10)
        ));
        // A one-year token (the API server's extension of 3607 s tokens): refreshed after 24 h.
        let year = 365 * 24 * 3600;
        let exp = t0 + Duration::seconds(year);
        assert!(!requires_refresh(t0 + Duration::hours(23), exp, year, none));
        assert!(requires_refresh(
            t0 + Duration::hours(24) + Duration::seconds(1),
            exp,
            year,
            none
        ));
    }

    #[test]
    fn jitter_stays_within_kubelets_bound() {
        for _ in 0..100 {
            let j = jitter();
            assert!(j >= Duration::zero() && j < Duration::seconds(10));
        }
    }
}
