//! HTTP to one registry endpoint: TLS as `configs.<host>.tls` says (rustls with ring), plain
//! http where configured or as the loopback fallback, redirects followed, and authentication
//! (anonymous, basic, bearer tokens from the registry's token realm) negotiated on 401 and
//! remembered for the session's later requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::auth::{parse_www_authenticate, Challenge, TokenResponse};
use super::config::{Endpoint, Scheme};
use super::tls::{tls_config, TlsConfig};
use super::Credentials;
use crate::digest::Digest;

pub(crate) type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

const MAX_REDIRECTS: usize = 10;
/// Error bodies and token responses are read up to this size.
const MAX_SMALL_BODY: usize = 1 << 20;

pub(crate) fn http_client(tls: &TlsConfig) -> Result<HttpClient, String> {
    let cfg = tls_config(tls)?;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(cfg)
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector))
}

/// Why a request to an endpoint failed.
#[derive(Debug, Clone)]
pub(crate) enum HttpError {
    /// The registry answered with an error status: `pulling from host H failed with status
    /// code 401 Unauthorized: unauthorized: authentication required`.
    Status {
        host: String,
        status: StatusCode,
        message: String,
    },
    /// No answer: connection refused, TLS, timeout.
    Network { host: String, message: String },
    /// The TLS handshake met something that is not TLS: a plain http server.
    NotTls { host: String, message: String },
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Status { host, status, message } => {
                write!(f, "pulling from host {host} failed with status code {status}")?;
                if !message.is_empty() {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            HttpError::Network { host, message } | HttpError::NotTls { host, message } => {
                write!(f, "pulling from host {host} failed: {message}")
            }
        }
    }
}

impl HttpError {
    pub(crate) fn status(&self) -> Option<StatusCode> {
        match self {
            HttpError::Status { status, .. } => Some(*status),
            HttpError::Network { .. } | HttpError::NotTls { .. } => None,
        }
    }
}

/// The registry's error body (`{"errors":[{"code":"UNAUTHORIZED","message":"..."}]}`) as
/// containerd shows it: `unauthorized: authentication required`.
pub(crate) fn error_message(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Errs {
        #[serde(default)]
        errors: Vec<Err1>,
    }
    #[derive(serde::Deserialize)]
    struct Err1 {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    if let Ok(e) = serde_json::from_slice::<Errs>(body) {
        if !e.errors.is_empty() {
            return e
                .errors
                .iter()
                .map(|e| {
                    let code = e.code.replace('_', " ").to_lowercase();
                    match (code.is_empty(), e.message.is_empty()) {
                        (false, false) => format!("{code}: {}", e.message),
                        (false, true) => code,
                        _ => e.message.clone(),
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.len() > 200 {
        format!(
            "{}...",
            &text[..text.char_indices().nth(200).map(|(i, _)| i).unwrap_or(text.len())]
        )
    } else {
        text.to_string()
    }
}

/// (host, service, scope, credential fingerprint).
type TokenKey = (String, String, String, String);

/// Tokens shared by all pulls: token and until when it is good, by [`TokenKey`].
#[derive(Default)]
pub(crate) struct TokenCache {
    tokens: Mutex<HashMap<TokenKey, (String, Instant)>>,
}

impl TokenCache {
    fn get(&self, key: &TokenKey) -> Option<String> {
        let mut m = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        match m.get(key) {
            Some((t, until)) if *until > Instant::now() => Some(t.clone()),
            Some(_) => {
                m.remove(key);
                None
            }
            None => None,
        }
    }

    fn put(&self, key: TokenKey, token: String, lifetime: Duration) {
        self.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (token, Instant::now() + lifetime));
    }
}

/// A fingerprint of a credential for cache keys (not the secret itself).
fn fingerprint(c: Option<&Credentials>) -> String {
    match c {
        None => "anonymous".into(),
        Some(Credentials::Basic { username, password }) => {
            Digest::of(format!("b\0{username}\0{password}").as_bytes()).to_string()
        }
        Some(Credentials::IdentityToken(t)) => Digest::of(format!("i\0{t}").as_bytes()).to_string(),
        Some(Credentials::RegistryToken(t)) => Digest::of(format!("r\0{t}").as_bytes()).to_string(),
    }
}

struct AuthState {
    /// Index into `creds` of the credential in use.
    cred: usize,
    authorization: Option<HeaderValue>,
    /// Plain http after the https attempt failed (loopback fallback).
    plain: bool,
}

/// Requests to one endpoint for one pull, authenticated with the first credential the
/// registry accepts.
pub(crate) struct Session {
    pub endpoint: Endpoint,
    client: HttpClient,
    /// The credentials to try in order; `None` is anonymous.
    creds: Vec<Option<Credentials>>,
    state: Mutex<AuthState>,
    tokens: Arc<TokenCache>,
    timeout: Option<Duration>,
}

impl Session {
    pub(crate) fn new(
        endpoint: Endpoint,
        client: HttpClient,
        credentials: &[Credentials],
        tokens: Arc<TokenCache>,
        timeout: Option<Duration>,
    ) -> Session {
        let creds = match &endpoint.config.auth {
            Some(c) => vec![Some(c.clone())],
            None if credentials.is_empty() => vec![None],
            None => credentials.iter().cloned().map(Some).collect(),
        };
        Session {
            endpoint,
            client,
            creds,
            state: Mutex::new(AuthState {
                cred: 0,
                authorization: None,
                plain: false,
            }),
            tokens,
            timeout,
        }
    }

    fn host(&self) -> String {
        self.endpoint.host.clone()
    }

    fn scope(&self) -> String {
        format!("repository:{}:pull", self.endpoint.repository)
    }

    async fn timed<F: std::future::Future>(&self, f: F) -> Result<F::Output, HttpError> {
        match self.timeout {
            Some(t) => tokio::time::timeout(t, f).await.map_err(|_| HttpError::Network {
                host: self.host(),
                message: format!("no answer within {}s", t.as_secs_f64()),
            }),
            None => Ok(f.await),
        }
    }

    /// Send one request, following redirects (Authorization dropped when the host changes).
    async fn send_once(
        &self,
        method: &Method,
        url: &str,
        headers: &[(header::HeaderName, HeaderValue)],
        authorization: Option<&HeaderValue>,
        body: Option<Bytes>,
    ) -> Result<Response<Incoming>, HttpError> {
        let mut url = url.to_string();
        let original_authority = authority(&url);
        let (mut method, mut body) = (method.clone(), body);
        for _ in 0..=MAX_REDIRECTS {
            let mut b = Request::builder().method(method.clone()).uri(&url);
            for (k, v) in headers {
                b = b.header(k, v);
            }
            if let Some(a) = authorization {
                if authority(&url) == original_authority {
                    b = b.header(header::AUTHORIZATION, a);
                }
            }
            b = b.header(header::USER_AGENT, concat!("ferrolet/", env!("CARGO_PKG_VERSION")));
            if body.is_some() {
                b = b.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
            }
            let req = b
                .body(Full::new(body.clone().unwrap_or_default()))
                .map_err(|e| HttpError::Network {
                    host: self.host(),
                    message: format!("bad request URL {url}: {e}"),
                })?;
            let resp = self.timed(self.client.request(req)).await?.map_err(|e| {
                let (host, message) = (self.host(), error_chain(&e));
                if speaks_no_tls(&e) {
                    HttpError::NotTls { host, message }
                } else {
                    HttpError::Network { host, message }
                }
            })?;
            if resp.status().is_redirection() && resp.status() != StatusCode::NOT_MODIFIED {
                if let Some(loc) = resp.headers().get(header::LOCATION).and_then(|l| l.to_str().ok()) {
                    let next = join_url(&url, loc);
                    // As Go's client: 301/302/303 turn a POST into a GET without its body
                    // (the identity token in it goes nowhere else); a body never leaves
                    // its host.
                    let see_other = matches!(
                        resp.status(),
                        StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND | StatusCode::SEE_OTHER
                    );
                    if (see_other && method != Method::GET && method != Method::HEAD)
                        || authority(&next) != authority(&url)
                    {
                        if method != Method::HEAD {
                            method = Method::GET;
                        }
                        body = None;
                    }
                    url = next;
                    continue;
                }
            }
            return Ok(resp);
        }
        Err(HttpError::Network {
            host: self.host(),
            message: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }

    /// `url` with the session's scheme (plain http after a loopback fallback).
    fn effective_url(&self, url: &str) -> String {
        let plain = self.state.lock().unwrap_or_else(|e| e.into_inner()).plain;
        match (plain, url.strip_prefix("https://")) {
            (true, Some(rest)) => format!("http://{rest}"),
            _ => url.to_string(),
        }
    }

    /// Send with the loopback https -> http fallback.
    async fn send(
        &self,
        method: &Method,
        url: &str,
        headers: &[(header::HeaderName, HeaderValue)],
        authorization: Option<&HeaderValue>,
        body: Option<Bytes>,
    ) -> Result<Response<Incoming>, HttpError> {
        let eff = self.effective_url(url);
        let res = self.send_once(method, &eff, headers, authorization, body.clone()).await;
        // Only a server that answered the handshake with something else than TLS (a plain
        // http registry) is retried over http; certificate errors stand.
        if let Err(HttpError::NotTls { .. }) = &res {
            if self.endpoint.http_fallback && eff.starts_with("https://") && self.endpoint.scheme == Scheme::Https {
                let plain = format!("http://{}", &eff["https://".len()..]);
                if let Ok(r) = self.send_once(method, &plain, headers, authorization, body).await {
                    tracing::debug!(host = %self.endpoint.host, "https failed, using plain http for a loopback registry");
                    self.state.lock().unwrap_or_else(|e| e.into_inner()).plain = true;
                    return Ok(r);
                }
            }
        }
        res
    }

    /// GET `url` (an endpoint URL) with `headers`, authenticating as the registry asks.
    /// A non-success status is an error carrying the registry's message.
    pub(crate) async fn get(
        &self,
        url: &str,
        headers: &[(header::HeaderName, HeaderValue)],
    ) -> Result<Response<Incoming>, HttpError> {
        let mut last: Option<HttpError> = None;
        let mut refreshed = false;
        loop {
            let (cred_idx, authz) = {
                let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                (s.cred, s.authorization.clone())
            };
            let resp = self.send(&Method::GET, url, headers, authz.as_ref(), None).await?;
            if resp.status() != StatusCode::UNAUTHORIZED {
                if resp.status().is_success() || resp.status() == StatusCode::PARTIAL_CONTENT {
                    return Ok(resp);
                }
                return Err(self.status_error(resp).await);
            }
            let challenges = resp
                .headers()
                .get_all(header::WWW_AUTHENTICATE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(parse_www_authenticate)
                .collect::<Vec<_>>();
            let err = self.status_error(resp).await;
            // The credential in use was refused (or none was sent yet): move on; a bearer
            // token that worked before may just have expired, so get a fresh one once.
            let bearer = challenges.iter().any(|c| c.scheme == "bearer");
            let next = match authz {
                None => cred_idx,
                Some(_) if bearer && !refreshed => {
                    refreshed = true;
                    cred_idx
                }
                Some(_) => cred_idx + 1,
            };
            let mut idx = next;
            let mut found = None;
            while idx < self.creds.len() {
                let fresh = authz.is_some() && idx == cred_idx;
                match self.authorize(&challenges, self.creds[idx].as_ref(), fresh).await {
                    Ok(Some(h)) => {
                        found = Some(h);
                        break;
                    }
                    Ok(None) => idx += 1,
                    Err(e) => {
                        last = Some(e);
                        idx += 1;
                    }
                }
            }
            match found {
                Some(h) => {
                    let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    s.cred = idx;
                    s.authorization = Some(h);
                }
                None => {
                    // Report the registry's own refusal, or the token server's if that is
                    // where the credential was refused.
                    // A token server that could not be reached or gave no usable answer is
                    // the cause to show, not the registry's 401.
                    return Err(match last.take() {
                        Some(e @ HttpError::Status { .. }) if authz.is_none() => e,
                        Some(e) if !matches!(e, HttpError::Status { .. }) => e,
                        _ => err,
                    });
                }
            }
        }
    }

    async fn status_error(&self, resp: Response<Incoming>) -> HttpError {
        let status = resp.status();
        let body = read_small(resp, self.timeout).await.unwrap_or_default();
        HttpError::Status {
            host: self.host(),
            status,
            message: error_message(&body),
        }
    }

    /// The Authorization header `cred` gives for these challenges; `None` when the
    /// credential does not fit them (e.g. a token for a Basic challenge, anonymous for Basic).
    async fn authorize(
        &self,
        challenges: &[Challenge],
        cred: Option<&Credentials>,
        fresh: bool,
    ) -> Result<Option<HeaderValue>, HttpError> {
        if let Some(c) = challenges.iter().find(|c| c.scheme == "bearer") {
            if let Some(Credentials::RegistryToken(t)) = cred {
                return Ok(HeaderValue::from_str(&format!("Bearer {t}")).ok());
            }
            let Some(realm) = c.param("realm") else {
                return Ok(None);
            };
            let service = c.param("service").unwrap_or("").to_string();
            let scope = c.param("scope").map(str::to_string).unwrap_or_else(|| self.scope());
            let key = (self.host(), service.clone(), scope.clone(), fingerprint(cred));
            if let Some(t) = self.tokens.get(&key).filter(|_| !fresh) {
                return Ok(HeaderValue::from_str(&format!("Bearer {t}")).ok());
            }
            let tr = self.fetch_token(realm, &service, &scope, cred).await?;
            let Some(token) = tr.bearer() else {
                return Err(HttpError::Network {
                    host: self.host(),
                    message: format!("the token server {realm} answered without a token"),
                });
            };
            self.tokens.put(key, token.to_string(), tr.lifetime());
            return Ok(HeaderValue::from_str(&format!("Bearer {token}")).ok());
        }
        if challenges.iter().any(|c| c.scheme == "basic") {
            if let Some(Credentials::Basic { username, password }) = cred {
                let enc = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
                return Ok(HeaderValue::from_str(&format!("Basic {enc}")).ok());
            }
        }
        Ok(None)
    }

    /// The token flow: GET the realm with basic credentials (or none), or POST an identity
    /// token as an OAuth2 refresh token.
    async fn fetch_token(
        &self,
        realm: &str,
        service: &str,
        scope: &str,
        cred: Option<&Credentials>,
    ) -> Result<TokenResponse, HttpError> {
        let realm_host = authority(realm);
        let err_host = if realm_host.is_empty() { self.host() } else { realm_host };
        let resp = match cred {
            Some(Credentials::IdentityToken(t)) => {
                let form: String = form_urlencoded::Serializer::new(String::new())
                    .append_pair("grant_type", "refresh_token")
                    .append_pair("refresh_token", t)
                    .append_pair("service", service)
                    .append_pair("scope", scope)
                    .append_pair("client_id", "ferrolet")
                    .finish();
                self.send_once(&Method::POST, realm, &[], None, Some(Bytes::from(form)))
                    .await?
            }
            other => {
                let query = {
                    let mut q = form_urlencoded::Serializer::new(String::new());
                    if !service.is_empty() {
                        q.append_pair("service", service);
                    }
                    q.append_pair("scope", scope);
                    q.finish()
                };
                let sep = if realm.contains('?') { '&' } else { '?' };
                let url = format!("{realm}{sep}{query}");
                let authz = match other {
                    Some(Credentials::Basic { username, password }) => {
                        let enc = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
                        HeaderValue::from_str(&format!("Basic {enc}")).ok()
                    }
                    _ => None,
                };
                self.send_once(&Method::GET, &url, &[], authz.as_ref(), None).await?
            }
        };
        let status = resp.status();
        let body = read_small(resp, self.timeout)
            .await
            .map_err(|message| HttpError::Network {
                host: err_host.clone(),
                message,
            })?;
        if !status.is_success() {
            return Err(HttpError::Status {
                host: err_host,
                status,
                message: error_message(&body),
            });
        }
        serde_json::from_slice(&body).map_err(|e| HttpError::Network {
            host: err_host,
            message: format!("the token server's answer is not JSON: {e}"),
        })
    }
}

/// Read a small body (error, token, manifest) up to `MAX_SMALL_BODY`.
pub(crate) async fn read_small(resp: Response<Incoming>, timeout: Option<Duration>) -> Result<Vec<u8>, String> {
    read_limited(resp, MAX_SMALL_BODY, timeout).await
}

/// Read a body of at most `limit` bytes; more is an error.
pub(crate) async fn read_limited(
    resp: Response<Incoming>,
    limit: usize,
    timeout: Option<Duration>,
) -> Result<Vec<u8>, String> {
    let mut body = resp.into_body();
    let mut out = Vec::new();
    loop {
        let frame = match timeout {
            Some(t) => tokio::time::timeout(t, body.frame())
                .await
                .map_err(|_| format!("no data for {}s", t.as_secs_f64()))?,
            None => body.frame().await,
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| error_chain(&e))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(format!("larger than {limit} bytes"));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// Whether the TLS handshake failed because the peer does not speak TLS (rustls finds an
/// invalid message, as when a plain http server answers).
fn speaks_no_tls(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        if let Some(r) = c.downcast_ref::<rustls::Error>() {
            return matches!(r, rustls::Error::InvalidMessage(_));
        }
        // io::Error hides what it wraps from source(): look inside.
        cur = match c.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => c.source(),
        };
    }
    false
}

/// An error with its causes, `a: b: c`.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// `scheme://authority` of a URL ("" when it has none).
/// `scheme://host:port` of a URL: where credentials sent to it may go (a redirect elsewhere,
/// or from https to http on the same host, gets none).
fn authority(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => format!(
            "{}://{}",
            scheme.to_ascii_lowercase(),
            rest.split(['/', '?', '#']).next().unwrap_or("")
        ),
        None => String::new(),
    }
}

/// Resolve a redirect's `Location` against the URL it came from.
pub(crate) fn join_url(base: &str, loc: &str) -> String {
    if loc.contains("://") {
        return loc.to_string();
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("https", base));
    let auth = rest.split(['/', '?', '#']).next().unwrap_or("");
    if let Some(net) = loc.strip_prefix("//") {
        return format!("{scheme}://{net}");
    }
    if loc.starts_with('/') {
        return format!("{scheme}://{auth}{loc}");
    }
    let path = &rest[auth.len()..];
    let path = path.split(['?', '#']).next().unwrap_or("");
    let dir = match path.rfind('/') {
        Some(i) => &path[..=i],
        None => "/",
    };
    format!("{scheme}://{auth}{dir}{loc}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_error_bodies_read_as_containerd_shows_them() {
        assert_eq!(
            error_message(br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":null}]}"#),
            "unauthorized: authentication required"
        );
        assert_eq!(
            error_message(br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"},{"code":"DENIED","message":"no"}]}"#),
            "manifest unknown: manifest unknown, denied: no"
        );
        assert_eq!(error_message(b"  plain text\n"), "plain text");
    }

    #[test]
    fn redirects_resolve_against_the_request() {
        assert_eq!(
            join_url("https://r:5000/v2/a/blobs/x", "https://cdn/y?sig=1"),
            "https://cdn/y?sig=1"
        );
        assert_eq!(
            join_url("https://r:5000/v2/a/blobs/x", "/other/z"),
            "https://r:5000/other/z"
        );
        assert_eq!(join_url("http://r/v2/a/blobs/x?ns=1", "y"), "http://r/v2/a/blobs/y");
        assert_eq!(join_url("https://r/v2/a", "//cdn/p"), "https://cdn/p");
        assert_eq!(authority("https://user@r:5/x?y"), "https://user@r:5");
        // Credentials follow neither another host nor a step down from https to http.
        assert_ne!(authority("https://r:5/a"), authority("http://r:5/a"));
        assert_ne!(authority("https://r:5/a"), authority("https://cdn/a"));
        assert_eq!(authority("HTTPS://r:5/a"), authority("https://r:5/b?c"));
    }
}
