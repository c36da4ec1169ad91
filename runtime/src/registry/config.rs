//! Registry configuration in k3s's `registries.yaml` format, and the endpoints a reference is
//! pulled from. Semantics follow k3s (which writes containerd's hosts.toml from this file):
//!
//! - `mirrors.<registry>.endpoint`: URLs tried in order before the registry itself (the
//!   "default endpoint", always tried last, never rewritten). `"*"` applies to registries
//!   without an entry of their own. An endpoint without a scheme is `http` for a loopback
//!   host on a port other than 443, else `https`; its path is the API root (`""`, `/` and
//!   `/v2` mean `/v2`). A mirror endpoint equal to the default endpoint is the default.
//! - `mirrors.<registry>.rewrite`: `regex: replacement` maps applied to the repository path
//!   (not the tag) for the mirror endpoints; patterns are tried in sorted order and the first
//!   that changes the path wins.
//! - `configs.<host>`: `auth` (username/password, `auth` as base64 of `user:password`,
//!   `identity_token`, `token`) and `tls` (`ca_file`, `cert_file` + `key_file`,
//!   `insecure_skip_verify`) for the endpoint with that host (`docker.io` for
//!   registry-1.docker.io); `"*"` for hosts without an entry.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use regex::Regex;
use serde::Deserialize;

pub(crate) use super::tls::TlsConfig;
use super::{Credentials, PullError};
use crate::image::reference::{Reference, DEFAULT_REGISTRY};

/// docker.io's API endpoint.
pub(crate) const DOCKER_HUB_HOST: &str = "registry-1.docker.io";

/// A parsed `registries.yaml`.
#[derive(Debug, Clone, Default)]
pub struct RegistryConfig {
    /// Where it was read from, for messages (the file name).
    pub origin: String,
    /// Mirrors by registry host (`docker.io`, `registry.example.com:5000`, `*`).
    pub mirrors: BTreeMap<String, Mirror>,
    /// Credentials and TLS by endpoint host.
    pub(crate) configs: BTreeMap<String, HostConfig>,
}

#[derive(Debug, Clone, Default)]
pub struct Mirror {
    /// Endpoint URLs as written, in the order they are tried.
    pub endpoints: Vec<String>,
    /// Repository path rewrites for the mirror endpoints, in the order they are tried.
    pub rewrites: Vec<Rewrite>,
}

#[derive(Clone)]
pub struct Rewrite {
    pub pattern: String,
    pub replacement: String,
    regex: Regex,
}

impl fmt::Debug for Rewrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} -> {:?}", self.pattern, self.replacement)
    }
}

/// `configs.<host>`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct HostConfig {
    /// Used instead of the pull's own credentials for this host.
    pub auth: Option<Credentials>,
    pub tls: TlsConfig,
}

// The file as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    mirrors: Option<BTreeMap<String, Option<RawMirror>>>,
    #[serde(default)]
    configs: Option<BTreeMap<String, Option<RawConfig>>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawMirror {
    #[serde(default)]
    endpoint: Option<Vec<String>>,
    #[serde(default)]
    rewrite: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    auth: Option<RawAuth>,
    #[serde(default)]
    tls: Option<RawTls>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    auth: Option<String>,
    #[serde(default, alias = "identitytoken")]
    identity_token: Option<String>,
    #[serde(default)]
    token: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTls {
    #[serde(default)]
    ca_file: Option<String>,
    #[serde(default)]
    cert_file: Option<String>,
    #[serde(default)]
    key_file: Option<String>,
    #[serde(default)]
    insecure_skip_verify: Option<bool>,
}

fn bad(origin: &str, field: &str, reason: impl fmt::Display) -> PullError {
    PullError::Config(format!("{origin}: {field}: {reason}"))
}

impl RegistryConfig {
    /// Read `path`; a missing file is an empty configuration.
    pub fn load(path: &Path) -> Result<RegistryConfig, PullError> {
        match std::fs::read_to_string(path) {
            Ok(text) => RegistryConfig::parse(&text, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(RegistryConfig {
                origin: path.display().to_string(),
                ..Default::default()
            }),
            Err(e) => Err(PullError::Config(format!("reading {}: {e}", path.display()))),
        }
    }

    /// Parse the YAML (or JSON) `yaml`; `origin` names it in errors.
    pub fn parse(yaml: &str, origin: &str) -> Result<RegistryConfig, PullError> {
        let value: serde_json::Value = if yaml.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_saphyr::from_str(yaml).map_err(|e| PullError::Config(format!("{origin}: not valid YAML: {e}")))?
        };
        let raw: RawFile = if value.is_null() {
            RawFile::default()
        } else {
            ferrolet_fsutil::json::decode_value(&value).map_err(|e| {
                let field = if e.path.is_empty() { "(top level)" } else { &e.path };
                bad(origin, field, e.reason)
            })?
        };
        let mut out = RegistryConfig {
            origin: origin.to_string(),
            ..Default::default()
        };
        for (host, m) in raw.mirrors.unwrap_or_default() {
            let m = m.unwrap_or_default();
            let mut mirror = Mirror::default();
            for (i, ep) in m.endpoint.unwrap_or_default().into_iter().enumerate() {
                let field = format!("mirrors.{host:?}.endpoint[{i}]");
                normalize_endpoint(&ep).map_err(|e| bad(origin, &field, e))?;
                mirror.endpoints.push(ep);
            }
            for (pattern, replacement) in m.rewrite.unwrap_or_default() {
                let regex = Regex::new(&pattern)
                    .map_err(|e| bad(origin, &format!("mirrors.{host:?}.rewrite.{pattern:?}"), e))?;
                mirror.rewrites.push(Rewrite {
                    pattern,
                    replacement,
                    regex,
                });
            }
            out.mirrors.insert(host, mirror);
        }
        for (host, c) in raw.configs.unwrap_or_default() {
            let c = c.unwrap_or_default();
            let field = |f: &str| format!("configs.{host:?}.{f}");
            let auth = match c.auth {
                None => None,
                Some(a) => parse_auth(a).map_err(|e| bad(origin, &field("auth"), e))?,
            };
            let mut tls = TlsConfig::default();
            if let Some(t) = c.tls {
                let read = |f: &str, p: &Option<String>| -> Result<Option<(PathBuf, Vec<u8>)>, PullError> {
                    match p.as_deref().filter(|p| !p.is_empty()) {
                        None => Ok(None),
                        Some(p) => std::fs::read(p)
                            .map(|data| Some((PathBuf::from(p), data)))
                            .map_err(|e| bad(origin, &field(&format!("tls.{f}")), format!("reading {p}: {e}"))),
                    }
                };
                if let Some((p, data)) = read("ca_file", &t.ca_file)? {
                    tls.ca_file = Some(p);
                    tls.ca_pem = Some(data);
                }
                if let Some((p, data)) = read("cert_file", &t.cert_file)? {
                    tls.cert_file = Some(p);
                    tls.cert_pem = Some(data);
                }
                if let Some((p, data)) = read("key_file", &t.key_file)? {
                    tls.key_file = Some(p);
                    tls.key_pem = Some(data);
                }
                if tls.cert_file.is_some() != tls.key_file.is_some() {
                    return Err(bad(
                        origin,
                        &field("tls"),
                        "cert_file and key_file must be given together",
                    ));
                }
                tls.insecure_skip_verify = t.insecure_skip_verify.unwrap_or(false);
                // Check the material now, so a bad file is reported where it is named.
                super::tls::tls_config(&tls).map_err(|e| bad(origin, &field("tls"), e))?;
            }
            out.configs.insert(host, HostConfig { auth, tls });
        }
        Ok(out)
    }

    /// The endpoints `reference` is pulled from, in order: the mirrors of its registry (or of
    /// `"*"`), then the registry itself.
    pub(crate) fn endpoints(&self, reference: &Reference) -> Result<Vec<Endpoint>, PullError> {
        let (registry, path) = split_repository(&reference.repository);
        let default = default_endpoint(registry, path);
        let mut out = Vec::new();
        if let Some(mirror) = self.mirrors.get(registry).or_else(|| self.mirrors.get("*")) {
            let rewritten = mirror.rewrite(path);
            for (i, ep) in mirror.endpoints.iter().enumerate() {
                let (scheme, host, api_path) = normalize_endpoint(ep)
                    .map_err(|e| bad(&self.origin, &format!("mirrors.{registry:?}.endpoint[{i}]"), e))?;
                if scheme == default.scheme && host == default.host && api_path == default.api_path {
                    continue;
                }
                out.push(Endpoint {
                    scheme,
                    config: self.config_for(&host).cloned().unwrap_or_default(),
                    host,
                    api_path,
                    repository: rewritten.clone(),
                    namespace: Some(registry.to_string()),
                    http_fallback: false,
                });
            }
        }
        let mut default = default;
        default.config = self.config_for(&default.host).cloned().unwrap_or_default();
        out.push(default);
        Ok(out)
    }

    /// `configs` for an endpoint host: its own entry, docker.io's for registry-1.docker.io,
    /// else `"*"`.
    fn config_for(&self, host: &str) -> Option<&HostConfig> {
        self.configs
            .get(host)
            .or_else(|| {
                (host == DOCKER_HUB_HOST)
                    .then(|| self.configs.get(DEFAULT_REGISTRY))
                    .flatten()
            })
            .or_else(|| self.configs.get("*"))
    }
}

impl Mirror {
    /// The repository path as the mirror endpoints know it.
    pub fn rewrite(&self, path: &str) -> String {
        for r in &self.rewrites {
            let out = r.regex.replace_all(path, r.replacement.as_str());
            if out != path {
                return out.into_owned();
            }
        }
        path.to_string()
    }
}

fn parse_auth(a: RawAuth) -> Result<Option<Credentials>, String> {
    let some = |s: &Option<String>| s.as_deref().filter(|s| !s.is_empty()).map(str::to_string);
    if let Some(t) = some(&a.identity_token) {
        return Ok(Some(Credentials::IdentityToken(t)));
    }
    if let Some(t) = some(&a.token) {
        return Ok(Some(Credentials::RegistryToken(t)));
    }
    if let Some(enc) = some(&a.auth) {
        let dec = base64::engine::general_purpose::STANDARD
            .decode(enc.trim())
            .map_err(|e| format!("auth is not base64: {e}"))?;
        let dec = String::from_utf8(dec).map_err(|_| "auth is not UTF-8 once decoded".to_string())?;
        let (u, p) = dec
            .split_once(':')
            .ok_or_else(|| "auth must be base64 of user:password".to_string())?;
        return Ok(Some(Credentials::Basic {
            username: u.to_string(),
            password: p.to_string(),
        }));
    }
    match (some(&a.username), a.password.unwrap_or_default()) {
        (Some(username), password) => Ok(Some(Credentials::Basic { username, password })),
        (None, p) if !p.is_empty() => Err("password without username".to_string()),
        _ => Ok(None),
    }
}

/// `docker.io/library/busybox` -> (`docker.io`, `library/busybox`).
pub(crate) fn split_repository(repository: &str) -> (&str, &str) {
    repository.split_once('/').unwrap_or((DEFAULT_REGISTRY, repository))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// One place to pull from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Endpoint {
    pub scheme: Scheme,
    /// `host[:port]` as in the URL.
    pub host: String,
    /// The API root, `/v2` unless the endpoint's URL gave another path.
    pub api_path: String,
    /// The repository path at this endpoint (rewritten for mirrors).
    pub repository: String,
    /// For a mirror, the registry it stands in for: sent as the `ns` query parameter, as
    /// containerd does.
    pub namespace: Option<String>,
    /// The registry itself on a loopback host: https first, then plain http if the TLS
    /// handshake fails (containerd's behaviour for localhost).
    pub http_fallback: bool,
    pub config: HostConfig,
}

impl Endpoint {
    /// `https://host/v2`.
    pub(crate) fn base(&self) -> String {
        format!("{}://{}{}", self.scheme.as_str(), self.host, self.api_path)
    }

    /// The URL of `kind` (`manifests`, `blobs`) `reference` in this endpoint's repository.
    pub(crate) fn url(&self, kind: &str, reference: &str) -> String {
        let mut u = format!("{}/{}/{kind}/{reference}", self.base(), self.repository);
        if let Some(ns) = &self.namespace {
            u.push_str("?ns=");
            u.push_str(&form_urlencoded::byte_serialize(ns.as_bytes()).collect::<String>());
        }
        u
    }
}

fn default_endpoint(registry: &str, path: &str) -> Endpoint {
    let host = if registry == DEFAULT_REGISTRY {
        DOCKER_HUB_HOST.to_string()
    } else {
        registry.to_string()
    };
    Endpoint {
        scheme: Scheme::Https,
        http_fallback: is_loopback(&host),
        host,
        api_path: "/v2".to_string(),
        repository: path.to_string(),
        namespace: None,
        config: HostConfig::default(),
    }
}

/// `localhost`, 127.0.0.0/8 or ::1, with or without a port.
pub(crate) fn is_loopback(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else if host.matches(':').count() > 1 {
        host
    } else {
        host.split(':').next().unwrap_or("")
    };
    name == "localhost" || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn port_of(host: &str) -> Option<&str> {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once("]:").map(|(_, p)| p);
    }
    if host.matches(':').count() == 1 {
        return host.split_once(':').map(|(_, p)| p);
    }
    None
}

/// An endpoint as k3s normalizes it: scheme, `host[:port]` (docker.io becomes
/// registry-1.docker.io), API path.
fn normalize_endpoint(ep: &str) -> Result<(Scheme, String, String), String> {
    let ep = ep.trim();
    let (scheme, rest) = match ep.split_once("://") {
        Some(("http", r)) => (Some(Scheme::Http), r),
        Some(("https", r)) => (Some(Scheme::Https), r),
        Some((other, _)) => return Err(format!("{ep:?}: scheme {other:?} is not http or https")),
        None => (None, ep),
    };
    let (host, path) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if path.contains(['?', '#']) {
        return Err(format!("{ep:?}: a query or fragment is not allowed"));
    }
    if host.is_empty() || host.contains('@') || host.contains(char::is_whitespace) {
        return Err(format!("{ep:?}: no valid host"));
    }
    if let Some(p) = port_of(host) {
        if p.parse::<u16>().is_err() {
            return Err(format!("{ep:?}: port {p:?} is not a number"));
        }
    }
    let scheme = scheme.unwrap_or_else(|| {
        if is_loopback(host) && port_of(host).is_some_and(|p| p != "443") {
            Scheme::Http
        } else {
            Scheme::Https
        }
    });
    let host = if host == DEFAULT_REGISTRY {
        DOCKER_HUB_HOST.to_string()
    } else {
        host.to_ascii_lowercase()
    };
    let path = match path {
        "" | "/" | "/v2" | "/v2/" => "/v2".to_string(),
        p => p.trim_end_matches('/').to_string(),
    };
    Ok((scheme, host, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eps(cfg: &RegistryConfig, r: &str) -> Vec<String> {
        cfg.endpoints(&Reference::parse(r).unwrap())
            .unwrap()
            .iter()
            .map(|e| e.url("manifests", "1"))
            .collect()
    }

    #[test]
    fn endpoints_in_order_with_rewrites_for_mirrors_only() {
        let cfg = RegistryConfig::parse(
            r#"
mirrors:
  docker.io:
    endpoint:
      - "https://mirror.example:5000"
      - "http://10.0.0.1:5001/v2"
      - "127.0.0.1:5002"
      - "https://registry-1.docker.io"
    rewrite:
      "^rancher/(.*)": "mirrorproject/rancher-images/$1"
  "*":
    endpoint: ["https://catchall.example"]
"#,
            "registries.yaml",
        )
        .unwrap();
        assert_eq!(
            eps(&cfg, "rancher/pause:3.6"),
            [
                "https://mirror.example:5000/v2/mirrorproject/rancher-images/pause/manifests/1?ns=docker.io",
                "http://10.0.0.1:5001/v2/mirrorproject/rancher-images/pause/manifests/1?ns=docker.io",
                "http://127.0.0.1:5002/v2/mirrorproject/rancher-images/pause/manifests/1?ns=docker.io",
                "https://registry-1.docker.io/v2/rancher/pause/manifests/1",
            ]
        );
        assert_eq!(
            eps(&cfg, "quay.io/a/b:1"),
            [
                "https://catchall.example/v2/a/b/manifests/1?ns=quay.io",
                "https://quay.io/v2/a/b/manifests/1",
            ]
        );
        let e = cfg.endpoints(&Reference::parse("localhost:5000/x").unwrap()).unwrap();
        assert!(e.last().unwrap().http_fallback);
        let e = cfg.endpoints(&Reference::parse("example.com/x").unwrap()).unwrap();
        assert!(!e.last().unwrap().http_fallback);
    }

    #[test]
    fn endpoint_paths_override_the_api_root() {
        let cfg = RegistryConfig::parse(
            "mirrors:\n  ghcr.io:\n    endpoint: [\"https://harbor.example/v2/ghcr-proxy/\"]\n",
            "r.yaml",
        )
        .unwrap();
        assert_eq!(
            eps(&cfg, "ghcr.io/o/app:1")[0],
            "https://harbor.example/v2/ghcr-proxy/o/app/manifests/1?ns=ghcr.io"
        );
    }

    #[test]
    fn configs_by_endpoint_host_with_wildcard_and_docker_alias() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = RegistryConfig::parse(
            &format!(
                r#"
configs:
  "docker.io":
    auth: {{username: hub, password: pw}}
  "reg.example:5000":
    auth: {{auth: "{}"}}
  "*":
    tls: {{insecure_skip_verify: true}}
"#,
                base64::engine::general_purpose::STANDARD.encode("u:p:w")
            ),
            &dir.path().join("r.yaml").display().to_string(),
        )
        .unwrap();
        let hub = cfg.endpoints(&Reference::parse("busybox").unwrap()).unwrap();
        assert_eq!(
            hub[0].config.auth,
            Some(Credentials::Basic {
                username: "hub".into(),
                password: "pw".into()
            })
        );
        let r = cfg.endpoints(&Reference::parse("reg.example:5000/a").unwrap()).unwrap();
        assert_eq!(
            r[0].config.auth,
            Some(Credentials::Basic {
                username: "u".into(),
                password: "p:w".into()
            })
        );
        let q = cfg.endpoints(&Reference::parse("quay.io/a/b").unwrap()).unwrap();
        assert!(q[0].config.tls.insecure_skip_verify && q[0].config.auth.is_none());
    }

    #[test]
    fn errors_name_the_file_and_field() {
        let e = RegistryConfig::parse("mirrors:\n  docker.io:\n    endpoints: [x]\n", "/etc/r.yaml").unwrap_err();
        assert!(e.to_string().starts_with("/etc/r.yaml: mirrors.docker.io"), "{e}");
        assert!(e.to_string().contains("endpoints"), "{e}");
        let e = RegistryConfig::parse("mirrors:\n  docker.io:\n    endpoint: [\"ftp://x\"]\n", "r.yaml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "r.yaml: mirrors.\"docker.io\".endpoint[0]: \"ftp://x\": scheme \"ftp\" is not http or https"
        );
        let e = RegistryConfig::parse("mirrors:\n  a.io:\n    rewrite: {\"(\": x}\n", "r.yaml").unwrap_err();
        assert!(
            e.to_string().starts_with("r.yaml: mirrors.\"a.io\".rewrite.\"(\""),
            "{e}"
        );
        let e = RegistryConfig::parse("configs:\n  a.io:\n    tls: {ca_file: /nonexistent/ca.pem}\n", "r.yaml")
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("r.yaml: configs.\"a.io\".tls.ca_file: reading /nonexistent/ca.pem"),
            "{e}"
        );
        let e = RegistryConfig::parse("configs:\n  a.io:\n    auth: {auth: \"!!\"}\n", "r.yaml").unwrap_err();
        assert!(e.to_string().contains("auth is not base64"), "{e}");
        let e = RegistryConfig::parse("mirrors: [1]\n", "r.yaml").unwrap_err();
        assert!(e.to_string().starts_with("r.yaml: mirrors"), "{e}");
        assert!(RegistryConfig::parse("", "r.yaml").unwrap().mirrors.is_empty());
        assert!(RegistryConfig::load(Path::new("/nonexistent/registries.yaml"))
            .unwrap()
            .mirrors
            .is_empty());
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost",
            "localhost:5000",
            "127.0.0.1:5000",
            "127.1.2.3",
            "[::1]:5000",
            "::1",
        ] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["example.com", "10.0.0.1:5000", "[fe80::1]:5000", "localhost.example"] {
            assert!(!is_loopback(h), "{h}");
        }
    }
}
