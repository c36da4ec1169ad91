//! Registry credentials as kubelet finds them (pkg/credentialprovider): docker config files
//! ([`DockerConfig`]: `.dockerconfigjson` with `auths`, the legacy `.dockercfg` map), matched
//! to an image by kubelet's keyring rules ([`Keyring`]), from the pod's imagePullSecrets first,
//! then the node's own: the first docker config.json found ([`node_config_paths`]) and the
//! exec credential provider plugins ([`provider`]).

pub mod provider;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use base64::Engine;
use ferrolet_runtime::registry::Credentials;
use k8s_openapi::api::core::v1::Secret;
use serde_json::Value;

/// The Secret types kubelet's image pull reads (it reads the keys whatever the type says).
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
pub const DOCKER_CONFIG_KEY: &str = ".dockercfg";

/// kubelet's key for Docker Hub credentials (`https://index.docker.io/v1/` once stripped).
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// One docker config: registry location (`host[:port][/path]`, with or without scheme) to the
/// credential given for it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DockerConfig {
    pub entries: Vec<(String, Credentials)>,
}

impl DockerConfig {
    /// `{"auths": {...}}` (config.json, `.dockerconfigjson`).
    pub fn parse_json(data: &[u8], origin: &str) -> Result<DockerConfig, String> {
        let v: Value = serde_json::from_slice(data).map_err(|e| format!("{origin}: not valid JSON: {e}"))?;
        let Value::Object(m) = v else {
            return Err(format!("{origin}: expected a JSON object with \"auths\""));
        };
        match m.get("auths") {
            None | Some(Value::Null) => Ok(DockerConfig::default()),
            Some(a) => DockerConfig::from_map(a, &format!("{origin}: auths")),
        }
    }

    /// The legacy `.dockercfg` form: the map of registry to entry itself.
    pub fn parse_legacy(data: &[u8], origin: &str) -> Result<DockerConfig, String> {
        let v: Value = serde_json::from_slice(data).map_err(|e| format!("{origin}: not valid JSON: {e}"))?;
        DockerConfig::from_map(&v, origin)
    }

    fn from_map(v: &Value, origin: &str) -> Result<DockerConfig, String> {
        let Value::Object(m) = v else {
            return Err(format!("{origin}: expected a map of registry to credentials"));
        };
        let mut entries = Vec::new();
        for (loc, e) in m {
            if let Some(c) = entry(e).map_err(|err| format!("{origin}.{loc}: {err}"))? {
                entries.push((loc.clone(), c));
            }
        }
        Ok(DockerConfig { entries })
    }

    /// What an image pull secret holds: `.dockercfg` and `.dockerconfigjson` (kubelet's
    /// MakeDockerKeyring reads both keys, whatever the Secret's type).
    pub fn from_secret(s: &Secret) -> Result<DockerConfig, String> {
        let name = format!(
            "secret {}/{}",
            s.metadata.namespace.as_deref().unwrap_or("default"),
            s.metadata.name.as_deref().unwrap_or("")
        );
        let mut out = DockerConfig::default();
        let data = s.data.as_ref();
        let string_data = s.string_data.as_ref();
        let get = |k: &str| -> Option<Vec<u8>> {
            data.and_then(|d| d.get(k))
                .map(|b| b.0.clone())
                .or_else(|| string_data.and_then(|d| d.get(k)).map(|s| s.as_bytes().to_vec()))
        };
        if let Some(b) = get(DOCKER_CONFIG_KEY) {
            out.entries
                .extend(DockerConfig::parse_legacy(&b, &format!("{name}: {DOCKER_CONFIG_KEY}"))?.entries);
        }
        if let Some(b) = get(DOCKER_CONFIG_JSON_KEY) {
            out.entries
                .extend(DockerConfig::parse_json(&b, &format!("{name}: {DOCKER_CONFIG_JSON_KEY}"))?.entries);
        }
        Ok(out)
    }
}

/// A JSON value's type, for errors that must not echo the value.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One entry: `auth` (base64 of `user:password`) wins over `username`/`password`;
/// `identitytoken` and `registrytoken` as containerd reads them. An entry with nothing in it
/// gives no credential.
fn entry(v: &Value) -> Result<Option<Credentials>, String> {
    let Value::Object(m) = v else {
        return Err("expected an object with username/password, auth, identitytoken or registrytoken".into());
    };
    let s = |k: &str| -> Result<String, String> {
        match m.get(k) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            // The value itself is not repeated: it may be a password.
            Some(other) => Err(format!("{k}: expected a string, got {}", json_type(other))),
        }
    };
    let (mut username, mut password) = (s("username")?, s("password")?);
    let auth = s("auth")?;
    if !auth.is_empty() {
        (username, password) = decode_auth(&auth)?;
    }
    let (identity, registry) = (s("identitytoken")?, s("registrytoken")?);
    Ok(if !registry.is_empty() {
        Some(Credentials::RegistryToken(registry))
    } else if !identity.is_empty() {
        Some(Credentials::IdentityToken(identity))
    } else if !username.is_empty() || !password.is_empty() {
        Some(Credentials::Basic { username, password })
    } else {
        None
    })
}

/// kubelet's decodeDockerConfigFieldAuth.
pub fn decode_auth(auth: &str) -> Result<(String, String), String> {
    let engine = base64::engine::general_purpose::STANDARD;
    let raw = engine
        .decode(auth.trim())
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(auth.trim()))
        .map_err(|e| format!("auth: not base64: {e}"))?;
    let text = String::from_utf8(raw).map_err(|_| "auth: not UTF-8 once decoded".to_string())?;
    match text.split_once(':') {
        Some((u, p)) => Ok((u.to_string(), p.to_string())),
        None => Err("unable to parse auth field, must be formatted as base64(username:password)".into()),
    }
}

/// kubelet's BasicDockerKeyring: credentials by schemeless location, looked up by image.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    /// Keys, reverse-sorted so more specific paths come first.
    index: Vec<String>,
    creds: HashMap<String, Vec<Credentials>>,
}

impl Keyring {
    pub fn add(&mut self, cfg: &DockerConfig) {
        for (loc, c) in &cfg.entries {
            let key = keyring_key(loc);
            self.creds.entry(key.clone()).or_default().push(c.clone());
            if !self.index.contains(&key) {
                self.index.push(key);
            }
        }
        self.index.sort();
        self.index.reverse();
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Every credential whose location matches `image` (a repository without tag or digest,
    /// e.g. `docker.io/library/busybox`), most specific first; Docker Hub's own key for images
    /// of the default registry when nothing else matched.
    pub fn lookup(&self, image: &str) -> Vec<Credentials> {
        let mut out = Vec::new();
        for k in &self.index {
            if urls_match(k, image) {
                out.extend(self.creds[k].iter().cloned());
            }
        }
        if out.is_empty() && is_default_registry_match(image) {
            if let Some(c) = self.creds.get(DEFAULT_REGISTRY_HOST) {
                out.extend(c.iter().cloned());
            }
        }
        out
    }
}

/// A location as kubelet keys it: scheme dropped, `/v1/` or `/v2/` dropped from the path.
fn keyring_key(loc: &str) -> String {
    let rest = loc
        .strip_prefix("https://")
        .or_else(|| loc.strip_prefix("http://"))
        .unwrap_or(loc);
    let (host, path) = split_host_path(rest);
    let path = if path.starts_with("/v2/") || path.starts_with("/v1/") {
        &path[3..]
    } else {
        path
    };
    if path.is_empty() || path == "/" {
        host.to_string()
    } else {
        format!("{host}{path}")
    }
}

/// `host[:port]` and the path (with its leading `/`, or empty).
fn split_host_path(s: &str) -> (&str, &str) {
    match s.find('/') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    }
}

/// kubelet's URLsMatch on schemeless URLs: the same port, the same number of host labels each
/// matching the glob's label (`*`, `?`, `[...]` as Go's filepath.Match), and the glob's path a
/// prefix of the target's.
pub fn urls_match(glob: &str, target: &str) -> bool {
    let (gh, gp) = split_host_path(glob);
    let (th, tp) = split_host_path(target);
    let split_port = |h: &str| -> (String, String) {
        match h.rsplit_once(':') {
            Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
                (host.to_ascii_lowercase(), port.to_string())
            }
            _ => (h.to_ascii_lowercase(), String::new()),
        }
    };
    let ((ghost, gport), (thost, tport)) = (split_port(gh), split_port(th));
    if gport != tport {
        return false;
    }
    let (gl, tl): (Vec<&str>, Vec<&str>) = (ghost.split('.').collect(), thost.split('.').collect());
    if gl.len() != tl.len() || !tp.starts_with(gp) {
        return false;
    }
    gl.iter().zip(&tl).all(|(g, t)| glob_match(g.as_bytes(), t.as_bytes()))
}

/// Go's filepath.Match for one host label: `*` any run, `?` one character, `[...]` a class
/// (`^` or `!` negates, `a-z` ranges). A malformed class matches nothing.
pub fn glob_match(p: &[u8], t: &[u8]) -> bool {
    match p.first() {
        None => t.is_empty(),
        Some(b'*') => (0..=t.len()).any(|i| glob_match(&p[1..], &t[i..])),
        Some(b'?') => !t.is_empty() && glob_match(&p[1..], &t[1..]),
        Some(b'[') => {
            let Some(c) = t.first() else { return false };
            let mut i = 1;
            let negate = matches!(p.get(1), Some(b'^') | Some(b'!'));
            if negate {
                i += 1;
            }
            let mut matched = false;
            let mut first = true;
            loop {
                let Some(&lo) = p.get(i) else { return false };
                if lo == b']' && !first {
                    i += 1;
                    break;
                }
                first = false;
                let (lo, mut next) = if lo == b'\\' {
                    match p.get(i + 1) {
                        Some(&x) => (x, i + 2),
                        None => return false,
                    }
                } else {
                    (lo, i + 1)
                };
                let mut hi = lo;
                if p.get(next) == Some(&b'-') && p.get(next + 1).is_some_and(|&x| x != b']') {
                    hi = p[next + 1];
                    next += 2;
                }
                if lo <= *c && *c <= hi {
                    matched = true;
                }
                i = next;
            }
            matched != negate && glob_match(&p[i..], &t[1..])
        }
        Some(b'\\') => p.len() > 1 && t.first() == Some(&p[1]) && glob_match(&p[2..], &t[1..]),
        Some(&x) => t.first() == Some(&x) && glob_match(&p[1..], &t[1..]),
    }
}

/// kubelet's isDefaultRegistryMatch: an image Docker Hub serves.
fn is_default_registry_match(image: &str) -> bool {
    let (first, rest) = match image.split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None => (image, None),
    };
    if first.is_empty() {
        return false;
    }
    if rest.is_none() || first == "docker.io" || first == "index.docker.io" {
        return true;
    }
    !first.contains(['.', ':'])
}

/// Where the node's docker config is looked for, first found wins (kubelet's search, with
/// ferrolet's root dir first): `<root>/config.json`, `/var/lib/kubelet/config.json`,
/// `$HOME/.docker/config.json`.
pub fn node_config_paths(root_dir: &Path) -> Vec<PathBuf> {
    let mut v = vec![
        root_dir.join("config.json"),
        PathBuf::from("/var/lib/kubelet/config.json"),
    ];
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        v.push(PathBuf::from(home).join(".docker/config.json"));
    }
    v
}

/// The node's docker config: the first file of `paths` that exists. `Ok(None)`: none does.
pub fn read_node_config(paths: &[PathBuf]) -> Result<Option<(PathBuf, DockerConfig)>, String> {
    for p in paths {
        match std::fs::read(p) {
            Ok(data) => return DockerConfig::parse_json(&data, &p.display().to_string()).map(|c| Some((p.clone(), c))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", p.display())),
        }
    }
    Ok(None)
}

/// The repository an image's credentials are looked up by (kubelet's ParseImageName):
/// `busybox:1.35` -> `docker.io/library/busybox`.
pub fn repository_of(image: &str) -> String {
    ferrolet_runtime::image::Reference::parse(image)
        .map(|r| r.repository)
        .unwrap_or_else(|_| image.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(u: &str, p: &str) -> Credentials {
        Credentials::Basic {
            username: u.into(),
            password: p.into(),
        }
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn parses_dockerconfigjson_and_legacy() {
        let j = format!(
            r#"{{"auths":{{"reg.local:5000":{{"auth":"{}"}},"https://index.docker.io/v1/":{{"username":"hub","password":"pw"}},"tok.io":{{"identitytoken":"refresh"}},"rt.io":{{"registrytoken":"bearer"}},"empty.io":{{}}}}}}"#,
            b64("alice:s3:cret")
        );
        let c = DockerConfig::parse_json(j.as_bytes(), "x").unwrap();
        let get = |k: &str| c.entries.iter().find(|(l, _)| l == k).map(|(_, c)| c.clone());
        assert_eq!(
            get("reg.local:5000"),
            Some(basic("alice", "s3:cret")),
            "auth splits at the first ':'"
        );
        assert_eq!(get("https://index.docker.io/v1/"), Some(basic("hub", "pw")));
        assert_eq!(get("tok.io"), Some(Credentials::IdentityToken("refresh".into())));
        assert_eq!(get("rt.io"), Some(Credentials::RegistryToken("bearer".into())));
        assert_eq!(get("empty.io"), None);
        let legacy = format!(r#"{{"reg.local":{{"auth":"{}","email":"a@b"}}}}"#, b64("bob:pw"));
        let c = DockerConfig::parse_legacy(legacy.as_bytes(), "x").unwrap();
        assert_eq!(c.entries, vec![("reg.local".to_string(), basic("bob", "pw"))]);
        let e = DockerConfig::parse_json(br#"{"auths":{"r":{"auth":"bm9jb2xvbg=="}}}"#, "f").unwrap_err();
        assert!(
            e.contains("f: auths.r") && e.contains("base64(username:password)"),
            "{e}"
        );
        let e = DockerConfig::parse_json(b"{", "f").unwrap_err();
        assert!(e.starts_with("f: not valid JSON"), "{e}");
    }

    #[test]
    fn secrets_of_both_types() {
        use k8s_openapi::ByteString;
        let mut s = Secret::default();
        s.metadata.name = Some("pull".into());
        s.type_ = Some("kubernetes.io/dockerconfigjson".into());
        s.data = Some(
            [(
                DOCKER_CONFIG_JSON_KEY.to_string(),
                ByteString(br#"{"auths":{"r.io":{"username":"u","password":"p"}}}"#.to_vec()),
            )]
            .into(),
        );
        assert_eq!(DockerConfig::from_secret(&s).unwrap().entries[0].1, basic("u", "p"));
        s.data = Some(
            [(
                DOCKER_CONFIG_KEY.to_string(),
                ByteString(br#"{"r.io":{"username":"u2","password":"p2"}}"#.to_vec()),
            )]
            .into(),
        );
        assert_eq!(DockerConfig::from_secret(&s).unwrap().entries[0].1, basic("u2", "p2"));
        s.data = Some([(DOCKER_CONFIG_KEY.to_string(), ByteString(b"nope".to_vec()))].into());
        let e = DockerConfig::from_secret(&s).unwrap_err();
        assert!(e.contains("secret default/pull") && e.contains(".dockercfg"), "{e}");
    }

    #[test]
    fn keyring_matches_as_kubelet() {
        let mut k = Keyring::default();
        k.add(&DockerConfig {
            entries: vec![
                ("quay.io".into(), basic("quay", "1")),
                ("https://quay.io/coreos".into(), basic("coreos", "2")),
                ("*.gcr.io".into(), basic("glob", "3")),
                ("reg.local:5000".into(), basic("port", "4")),
                ("https://index.docker.io/v1/".into(), basic("hub", "5")),
                ("http://old.io/v2/team".into(), basic("team", "6")),
            ],
        });
        let users = |img: &str| -> Vec<String> {
            k.lookup(img)
                .into_iter()
                .map(|c| match c {
                    Credentials::Basic { username, .. } => username,
                    _ => unreachable!(),
                })
                .collect()
        };
        assert_eq!(
            users("quay.io/coreos/etcd"),
            ["coreos", "quay"],
            "more specific first, all tried"
        );
        assert_eq!(users("quay.io/other/x"), ["quay"]);
        assert_eq!(users("eu.gcr.io/p/img"), ["glob"]);
        assert!(users("gcr.io/p/img").is_empty(), "a glob label needs a label");
        assert!(users("a.b.gcr.io/p").is_empty(), "same number of labels");
        assert_eq!(users("reg.local:5000/x"), ["port"]);
        assert!(users("reg.local/x").is_empty(), "the port must match");
        assert!(users("reg.local:5001/x").is_empty());
        assert_eq!(users("docker.io/library/busybox"), ["hub"], "Docker Hub's key");
        assert_eq!(users("library/busybox"), ["hub"]);
        assert_eq!(users("old.io/team/app"), ["team"], "/v2/ dropped from the key");
        assert!(users("old.io/other").is_empty());
        assert!(users("ghcr.io/x").is_empty());
    }

    #[test]
    fn globs_as_go() {
        assert!(glob_match(b"*", b"abc"));
        assert!(glob_match(b"a?c", b"abc"));
        assert!(glob_match(b"[a-c]x", b"bx"));
        assert!(!glob_match(b"[^a-c]x", b"bx"));
        assert!(glob_match(b"*-ecr", b"us-ecr"));
        assert!(!glob_match(b"[a-", b"a"));
        assert!(urls_match(
            "*.dkr.ecr.*.amazonaws.com",
            "123.dkr.ecr.us-east-1.amazonaws.com/app"
        ));
        assert!(!urls_match(
            "*.dkr.ecr.*.amazonaws.com",
            "dkr.ecr.us-east-1.amazonaws.com/app"
        ));
    }

    #[test]
    fn node_config_first_found() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a.json");
        let b = d.path().join("b.json");
        std::fs::write(&b, br#"{"auths":{"r":{"username":"u","password":"p"}}}"#).unwrap();
        let (p, c) = read_node_config(&[a.clone(), b.clone()]).unwrap().unwrap();
        assert_eq!(p, b);
        assert_eq!(c.entries.len(), 1);
        std::fs::write(&a, b"{}").unwrap();
        let (p, c) = read_node_config(&[a.clone(), b]).unwrap().unwrap();
        assert_eq!((p, c.entries.len()), (a, 0));
        assert!(read_node_config(&[d.path().join("none")]).unwrap().is_none());
    }
}
