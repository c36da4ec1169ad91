//! kubelet's exec credential provider plugins (`--image-credential-provider-config`,
//! `--image-credential-provider-bin-dir`; CredentialProviderConfig kubelet.config.k8s.io/v1 and
//! the credentialprovider.kubelet.k8s.io/v1 protocol): a plugin whose `matchImages` match the
//! image is run from the bin dir with a CredentialProviderRequest on stdin and answers a
//! CredentialProviderResponse on stdout; its `auth` map joins the node's keyring. Answers are
//! cached by image, registry or globally as the plugin says, for its `cacheDuration` (the
//! provider's `defaultCacheDuration` when it gives none; 0: not cached). A plugin that fails,
//! times out or answers nonsense gives no credentials (logged); the pull goes on without.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use tokio::io::AsyncWriteExt;
use tracing::warn;

use super::{entry, urls_match, DockerConfig};
use crate::pod::units::parse_duration;

/// How long a plugin may run (kubelet's exec timeout).
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

const CONFIG_API_VERSIONS: &[&str] = &[
    "kubelet.config.k8s.io/v1",
    "kubelet.config.k8s.io/v1beta1",
    "kubelet.config.k8s.io/v1alpha1",
];
const PLUGIN_API_VERSIONS: &[&str] = &[
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
];

/// One `providers[]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSpec {
    pub name: String,
    pub match_images: Vec<String>,
    pub default_cache_duration: Duration,
    pub api_version: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// What a plugin's answer is cached under (its `cacheKeyType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKeyType {
    Image,
    Registry,
    Global,
}

/// A plugin's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub cache_key_type: CacheKeyType,
    /// `None`: the provider's default.
    pub cache_duration: Option<Duration>,
    pub auth: DockerConfig,
}

/// Parse a CredentialProviderConfig (YAML or JSON); errors name the file and field.
pub fn parse_config(text: &str, origin: &str) -> Result<Vec<ProviderSpec>, String> {
    let v: Value = serde_saphyr::from_str(text).map_err(|e| format!("{origin}: not valid YAML or JSON: {e}"))?;
    let Value::Object(m) = v else {
        return Err(format!("{origin}: expected a CredentialProviderConfig object"));
    };
    let s = |m: &Map<String, Value>, k: &str, f: &str| -> Result<String, String> {
        match m.get(k) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(o) => Err(format!("{origin}: {f}: expected a string, got {o}")),
        }
    };
    if s(&m, "kind", "kind")? != "CredentialProviderConfig" {
        return Err(format!("{origin}: kind: expected CredentialProviderConfig"));
    }
    let av = s(&m, "apiVersion", "apiVersion")?;
    if !CONFIG_API_VERSIONS.contains(&av.as_str()) {
        return Err(format!("{origin}: apiVersion: {av:?} is not kubelet.config.k8s.io/v1"));
    }
    for k in m.keys() {
        if !matches!(k.as_str(), "kind" | "apiVersion" | "providers") {
            return Err(format!("{origin}: unknown field {k:?}"));
        }
    }
    let list = match m.get("providers") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        _ => return Err(format!("{origin}: providers: at least one provider is required")),
    };
    let mut out: Vec<ProviderSpec> = Vec::new();
    for (i, p) in list.iter().enumerate() {
        let f = format!("providers[{i}]");
        let Value::Object(p) = p else {
            return Err(format!("{origin}: {f}: expected an object"));
        };
        for k in p.keys() {
            if !matches!(
                k.as_str(),
                "name" | "matchImages" | "defaultCacheDuration" | "apiVersion" | "args" | "env" | "tokenAttributes"
            ) {
                return Err(format!("{origin}: {f}: unknown field {k:?}"));
            }
        }
        if p.contains_key("tokenAttributes") {
            return Err(format!(
                "{origin}: {f}.tokenAttributes: service account tokens for credential providers are not supported"
            ));
        }
        let name = s(p, "name", &format!("{f}.name"))?;
        if name.is_empty() {
            return Err(format!("{origin}: {f}.name: name is required"));
        }
        if name.contains('/') || name.contains(' ') || name == "." || name == ".." {
            return Err(format!(
                "{origin}: {f}.name: {name:?} must be a file name (no '/', no spaces, not '.' or '..')"
            ));
        }
        if out.iter().any(|o| o.name == name) {
            return Err(format!("{origin}: {f}.name: duplicate provider name {name:?}"));
        }
        let match_images: Vec<String> = match p.get("matchImages") {
            Some(Value::Array(a)) if !a.is_empty() => a
                .iter()
                .enumerate()
                .map(|(j, x)| {
                    x.as_str()
                        .filter(|s| !s.is_empty() && !s.contains("://"))
                        .map(str::to_string)
                        .ok_or_else(|| {
                            format!("{origin}: {f}.matchImages[{j}]: expected an image pattern such as *.registry.io")
                        })
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(format!("{origin}: {f}.matchImages: at least one pattern is required")),
        };
        let dcd = s(p, "defaultCacheDuration", &format!("{f}.defaultCacheDuration"))?;
        if dcd.is_empty() {
            return Err(format!("{origin}: {f}.defaultCacheDuration: required"));
        }
        let default_cache_duration =
            parse_duration(&dcd).map_err(|e| format!("{origin}: {f}.defaultCacheDuration: {e}"))?;
        let api_version = s(p, "apiVersion", &format!("{f}.apiVersion"))?;
        if !PLUGIN_API_VERSIONS.contains(&api_version.as_str()) {
            return Err(format!(
                "{origin}: {f}.apiVersion: {api_version:?} is not credentialprovider.kubelet.k8s.io/v1"
            ));
        }
        let args = match p.get("args") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(j, x)| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| format!("{origin}: {f}.args[{j}]: expected a string"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(format!("{origin}: {f}.args: expected a list of strings")),
        };
        let env = match p.get("env") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(j, x)| {
                    let n = x.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
                    let v = x.get("value").and_then(Value::as_str).unwrap_or("");
                    n.map(|n| (n.to_string(), v.to_string()))
                        .ok_or_else(|| format!("{origin}: {f}.env[{j}].name: required"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(format!("{origin}: {f}.env: expected a list of name/value")),
        };
        out.push(ProviderSpec {
            name,
            match_images,
            default_cache_duration,
            api_version,
            args,
            env,
        });
    }
    Ok(out)
}

/// The request a plugin reads on stdin.
pub fn request(api_version: &str, image: &str) -> Value {
    json!({"kind": "CredentialProviderRequest", "apiVersion": api_version, "image": image})
}

/// Parse a plugin's stdout.
pub fn parse_response(data: &[u8], api_version: &str) -> Result<Response, String> {
    let v: Value = serde_json::from_slice(data).map_err(|e| format!("invalid response: {e}"))?;
    if v.get("kind").and_then(Value::as_str) != Some("CredentialProviderResponse") {
        return Err("invalid response: kind is not CredentialProviderResponse".into());
    }
    let av = v.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if av != api_version {
        return Err(format!(
            "invalid response: apiVersion {av:?} does not match the request's {api_version:?}"
        ));
    }
    let cache_key_type = match v.get("cacheKeyType").and_then(Value::as_str) {
        Some("Image") => CacheKeyType::Image,
        Some("Registry") => CacheKeyType::Registry,
        Some("Global") => CacheKeyType::Global,
        other => {
            return Err(format!(
                "invalid response: cacheKeyType {other:?} is not Image, Registry or Global"
            ))
        }
    };
    let cache_duration = match v.get("cacheDuration") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(parse_duration(s).map_err(|e| format!("invalid response: cacheDuration: {e}"))?),
        Some(o) => return Err(format!("invalid response: cacheDuration: expected a duration, got {o}")),
    };
    let mut auth = DockerConfig::default();
    if let Some(Value::Object(m)) = v.get("auth") {
        for (k, e) in m {
            if let Some(c) = entry(e).map_err(|err| format!("invalid response: auth.{k}: {err}"))? {
                auth.entries.push((k.clone(), c));
            }
        }
    }
    Ok(Response {
        cache_key_type,
        cache_duration,
        auth,
    })
}

/// The registry part of an image (kubelet's parseRegistry).
fn registry_of(image: &str) -> &str {
    image.split('/').next().unwrap_or(image)
}

const GLOBAL_KEY: &str = "global";

/// One plugin with its cache.
pub struct Plugin {
    pub spec: ProviderSpec,
    bin: PathBuf,
    timeout: Duration,
    /// Cache key -> (expiry, credentials).
    cache: Mutex<HashMap<String, (Instant, DockerConfig)>>,
    /// One run at a time: pulls asking at once wait for the first answer and find it in the
    /// cache (kubelet runs a plugin once per image at a time, with singleflight).
    running: tokio::sync::Mutex<()>,
}

impl Plugin {
    pub fn new(spec: ProviderSpec, bin_dir: &Path, timeout: Duration) -> Result<Plugin, String> {
        let bin = bin_dir.join(&spec.name);
        if !bin.is_file() {
            return Err(format!(
                "credential provider {:?}: plugin binary {} does not exist",
                spec.name,
                bin.display()
            ));
        }
        Ok(Plugin {
            spec,
            bin,
            timeout,
            cache: Mutex::new(HashMap::new()),
            running: tokio::sync::Mutex::new(()),
        })
    }

    /// Whether one of `matchImages` matches `image` (a repository like `reg.io/team/app`).
    pub fn matches(&self, image: &str) -> bool {
        self.spec.match_images.iter().any(|m| urls_match(m, image))
    }

    fn cached(&self, image: &str) -> Option<DockerConfig> {
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        c.retain(|_, (exp, _)| *exp > now);
        [image, registry_of(image), GLOBAL_KEY]
            .iter()
            .find_map(|k| c.get(*k).map(|(_, d)| d.clone()))
    }

    /// The plugin's credentials for `image`, from the cache or by running it.
    pub async fn provide(&self, image: &str) -> Result<DockerConfig, String> {
        if let Some(d) = self.cached(image) {
            return Ok(d);
        }
        let _running = self.running.lock().await;
        if let Some(d) = self.cached(image) {
            return Ok(d);
        }
        let out = self.exec(image).await?;
        let r = parse_response(&out, &self.spec.api_version)?;
        let key = match r.cache_key_type {
            CacheKeyType::Image => image.to_string(),
            CacheKeyType::Registry => registry_of(image).to_string(),
            CacheKeyType::Global => GLOBAL_KEY.to_string(),
        };
        let ttl = r.cache_duration.unwrap_or(self.spec.default_cache_duration);
        if !ttl.is_zero() {
            self.cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, (crate::tasks::std_after(Instant::now(), ttl), r.auth.clone()));
        }
        Ok(r.auth)
    }

    async fn exec(&self, image: &str) -> Result<Vec<u8>, String> {
        let name = &self.spec.name;
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(&self.spec.args)
            .envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("credential provider {name}: running {}: {e}", self.bin.display()))?;
        let req = serde_json::to_vec(&request(&self.spec.api_version, image)).unwrap_or_default();
        let mut stdin = child.stdin.take();
        let run = async move {
            if let Some(s) = stdin.as_mut() {
                // A plugin that does not read its request still gets to answer.
                let _ = s.write_all(&req).await;
            }
            drop(stdin);
            child.wait_with_output().await
        };
        let out = match tokio::time::timeout(self.timeout, run).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => return Err(format!("credential provider {name}: {e}")),
            Err(_) => {
                return Err(format!(
                    "credential provider {name}: timed out after {}",
                    crate::pod::units::format_duration(self.timeout)
                ))
            }
        };
        if !out.status.success() {
            return Err(format!(
                "credential provider {name} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(out.stdout)
    }
}

/// The configured plugins.
#[derive(Default)]
pub struct Providers {
    plugins: Vec<Plugin>,
}

impl Providers {
    /// Load `config` (plugins from `bin_dir`); errors name the file and field.
    pub fn load(config: &Path, bin_dir: &Path, timeout: Duration) -> Result<Providers, String> {
        let text = std::fs::read_to_string(config).map_err(|e| format!("{}: {e}", config.display()))?;
        let specs = parse_config(&text, &config.display().to_string())?;
        let plugins = specs
            .into_iter()
            .map(|s| Plugin::new(s, bin_dir, timeout))
            .collect::<Result<_, _>>()?;
        Ok(Providers { plugins })
    }

    pub fn is_empty(&self) -> bool {
        self.plugins.is_empty()
    }

    /// What every plugin matching `image` provides, in configuration order.
    pub async fn provide(&self, image: &str) -> Vec<DockerConfig> {
        let mut out = Vec::new();
        for p in self.plugins.iter().filter(|p| p.matches(image)) {
            match p.provide(image).await {
                Ok(d) => out.push(d),
                Err(e) => warn!(image, "{e}"),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrolet_runtime::registry::Credentials;

    const CFG: &str = "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: test-plugin\n  matchImages: ['*.example.io', 'reg.local:5000']\n  defaultCacheDuration: 10m\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  args: [get-credentials]\n  env:\n  - name: PLUGIN_MODE\n    value: Registry\n";

    #[test]
    fn config_parses_and_errors_name_fields() {
        let p = parse_config(CFG, "c.yaml").unwrap();
        assert_eq!(p[0].name, "test-plugin");
        assert_eq!(p[0].default_cache_duration, Duration::from_secs(600));
        assert_eq!(p[0].env, vec![("PLUGIN_MODE".to_string(), "Registry".to_string())]);
        for (bad, field) in [
            (CFG.replace("name: test-plugin", "name: a/b"), "providers[0].name"),
            (CFG.replace("10m", "ten"), "providers[0].defaultCacheDuration"),
            (
                CFG.replace("credentialprovider.kubelet.k8s.io/v1", "x/v1"),
                "providers[0].apiVersion",
            ),
            (
                CFG.replace("  matchImages: ['*.example.io', 'reg.local:5000']\n", ""),
                "providers[0].matchImages",
            ),
            (CFG.replace("kind: CredentialProviderConfig", "kind: Other"), "kind"),
            (CFG.replace("  args:", "  bogus: 1\n  args:"), "unknown field \"bogus\""),
        ] {
            let e = parse_config(&bad, "c.yaml").unwrap_err();
            assert!(e.starts_with("c.yaml: ") && e.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn response_and_cache_keys() {
        let av = "credentialprovider.kubelet.k8s.io/v1";
        let r = parse_response(
            br#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Registry","cacheDuration":"5m","auth":{"*.example.io":{"username":"u","password":"p"}}}"#,
            av,
        )
        .unwrap();
        assert_eq!(r.cache_key_type, CacheKeyType::Registry);
        assert_eq!(r.cache_duration, Some(Duration::from_secs(300)));
        assert_eq!(
            r.auth.entries,
            vec![(
                "*.example.io".to_string(),
                Credentials::Basic {
                    username: "u".into(),
                    password: "p".into()
                }
            )]
        );
        let e = parse_response(br#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Pod"}"#, av).unwrap_err();
        assert!(e.contains("cacheKeyType"), "{e}");
        let e = parse_response(br#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1beta1","cacheKeyType":"Image"}"#, av).unwrap_err();
        assert!(e.contains("apiVersion"), "{e}");
        assert_eq!(request(av, "reg.io/a/b")["kind"], "CredentialProviderRequest");
        assert_eq!(registry_of("reg.io:5000/a/b"), "reg.io:5000");
    }

    /// A real plugin: a shell script that records its request and arguments, answers with the
    /// cache key type it is told in its environment, and counts its runs.
    #[tokio::test]
    async fn runs_a_real_plugin_and_honours_its_cache() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let log = dir.path().join("runs");
        let script = format!(
            "#!/bin/sh\nread -r req\necho \"$1 $req\" >> {log}\nprintf '{{\"kind\":\"CredentialProviderResponse\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"cacheKeyType\":\"%s\",\"auth\":{{\"*.example.io\":{{\"username\":\"plugin-user\",\"password\":\"pw\"}}}}}}' \"$PLUGIN_MODE\"\n",
            log = log.display()
        );
        let path = bin.join("test-plugin");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let cfg = dir.path().join("cfg.yaml");
        std::fs::write(&cfg, CFG).unwrap();
        let providers = Providers::load(&cfg, &bin, Duration::from_secs(10)).unwrap();
        let runs = || std::fs::read_to_string(&log).unwrap_or_default().lines().count();

        assert!(providers.provide("other.io/x").await.is_empty(), "not matched: not run");
        assert_eq!(runs(), 0);
        let got = providers.provide("a.example.io/team/app").await;
        assert_eq!(got.len(), 1);
        let mut k = super::super::Keyring::default();
        k.add(&got[0]);
        assert!(
            matches!(&k.lookup("a.example.io/team/app")[..], [Credentials::Basic { username, .. }] if username == "plugin-user")
        );
        let first = std::fs::read_to_string(&log).unwrap();
        assert!(first.starts_with("get-credentials {"), "{first}");
        assert!(
            first.contains(r#""image":"a.example.io/team/app""#) && first.contains("CredentialProviderRequest"),
            "{first}"
        );
        // Cached by registry: another repository of the same registry does not run it again,
        // nor do two asking at once for a third registry.
        providers.provide("a.example.io/other").await;
        assert_eq!(runs(), 1);
        let (x, y) = tokio::join!(providers.provide("z.example.io/a"), providers.provide("z.example.io/b"));
        assert_eq!((x.len(), y.len(), runs()), (1, 1, 2));
        providers.provide("b.example.io/other").await;
        assert_eq!(runs(), 3, "another registry runs it");

        // A plugin that hangs is cut off at the timeout.
        std::fs::write(&path, "#!/bin/sh\nexec sleep 30\n").unwrap();
        let slow = Plugin::new(
            parse_config(CFG, "c").unwrap().remove(0),
            &bin,
            Duration::from_millis(300),
        )
        .unwrap();
        let t = Instant::now();
        let e = slow.provide("c.example.io/x").await.unwrap_err();
        assert!(e.contains("timed out"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        // A missing binary is refused at load.
        std::fs::remove_file(&path).unwrap();
        let e = Providers::load(&cfg, &bin, PLUGIN_TIMEOUT).err().unwrap();
        assert!(e.contains("does not exist"), "{e}");
    }
}
