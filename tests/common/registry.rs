//! Real registries for the pull tests: Debian's `docker-registry` (CNCF distribution 2.8) on
//! 127.0.0.1 with a free port and a config of its own in a temp dir (filesystem storage), as
//! - plain HTTP without auth (a mirror, or a registry on localhost),
//! - TLS with a test CA (rcgen) and htpasswd (bcrypt) basic auth,
//! - token auth (`auth: token`), the tokens issued by [`TokenServer`] in this process.
//!
//! Images are pushed with skopeo from the OCI archives images/build-*.sh build. [`Proxy`] is a
//! TCP proxy in front of a plain registry that logs every request head, can cut one response
//! after N bytes (an interrupted download) and can be switched off (a mirror that is down).
//! Every guard kills what it started by pid and removes its directory on drop.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;

use super::free_port;

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
pub const USER: &str = "ferro";
pub const PASSWORD: &str = "s3cret-pull";

/// Why the registry tests cannot run here (a tool missing), or None.
pub fn tools_missing() -> Option<String> {
    let mut missing = Vec::new();
    if !Path::new(REGISTRY_BIN).exists() {
        missing.push("docker-registry (/usr/bin/docker-registry)");
    }
    if Command::new("skopeo")
        .arg("--version")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        missing.push("skopeo");
    }
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// The test images built by images/build-*.sh (scripts/setup.sh runs them).
pub fn images_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("images/out")
}

/// Why the test images are not there, or None.
pub fn images_missing() -> Option<String> {
    let d = images_dir();
    let missing: Vec<String> = ["busybox.oci.tar", "two.oci.tar", "multi.oci.tar"]
        .iter()
        .filter(|f| !d.join(f).exists())
        .map(|f| f.to_string())
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{} missing in {} (scripts/setup.sh builds them with images/build-registry.sh)",
            missing.join(", "),
            d.display()
        )
    })
}

/// How a registry authenticates clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Auth {
    None,
    /// htpasswd with [`USER`] / [`PASSWORD`].
    Basic,
    /// `auth: token`, tokens from a [`TokenServer`] that knows [`USER`] / [`PASSWORD`].
    Token,
}

/// A test CA and a server certificate for 127.0.0.1 and localhost.
pub struct TestCa {
    /// PEM of the CA certificate.
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// A client certificate of the same CA (clientAuth), for registries that ask for one.
    pub client_cert_pem: String,
    pub client_key_pem: String,
}

impl TestCa {
    pub fn new(cn: &str) -> TestCa {
        let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, format!("{cn} CA"));
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = p.signed_by(&key, &issuer).unwrap();
        let client_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut c = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        c.distinguished_name
            .push(rcgen::DnType::CommonName, "ferrolet test node");
        c.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let client = c.signed_by(&client_key, &issuer).unwrap();
        TestCa {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            client_cert_pem: client.pem(),
            client_key_pem: client_key.serialize_pem(),
        }
    }
}

/// One docker-registry process.
pub struct Registry {
    pub name: String,
    pub dir: PathBuf,
    pub port: u16,
    pub tls: bool,
    pub auth: Auth,
    /// The CA file clients trust (TLS registries).
    pub ca_file: Option<PathBuf>,
    /// The token server (token auth).
    pub tokens: Option<TokenServer>,
    /// The network namespace the registry (and skopeo talking to it) runs in; None: this one.
    pub netns: Option<PathBuf>,
    child: Option<Child>,
}

impl Registry {
    /// A plain-HTTP registry without auth.
    pub fn plain(name: &str) -> Registry {
        Registry::start(name, false, Auth::None)
    }

    pub fn start(name: &str, tls: bool, auth: Auth) -> Registry {
        Registry::start_in(name, tls, auth, None)
    }

    /// A registry on the loopback of the network namespace pinned at `netns` (the cluster
    /// tests' namespace, where their nodes pull from it); no token auth there (its token
    /// server listens here).
    pub fn start_in(name: &str, tls: bool, auth: Auth, netns: Option<&Path>) -> Registry {
        Registry::launch(name, tls, auth, netns, false)
    }

    /// A TLS registry that asks every client for a certificate of its CA (`http.tls.clientcas`);
    /// [`Registry::client_cert`] has one.
    pub fn start_mtls(name: &str) -> Registry {
        Registry::launch(name, true, Auth::None, None, true)
    }

    /// The client certificate and key files a registry from [`Registry::start_mtls`] accepts.
    pub fn client_cert(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("client.crt"), self.dir.join("client.key"))
    }

    fn launch(name: &str, tls: bool, auth: Auth, netns: Option<&Path>, mtls: bool) -> Registry {
        assert!(
            netns.is_none() || auth != Auth::Token,
            "token auth only in the test's own namespace"
        );
        let dir = std::env::temp_dir().join(format!("ferrolet-reg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let port = free_port();
        let mut cfg = format!(
            "version: 0.1\nlog:\n  level: info\n  fields:\n    service: {name}\nstorage:\n  filesystem:\n    rootdirectory: {}\n  maintenance:\n    uploadpurging:\n      enabled: false\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n  secret: ferrolet-test-{name}\n",
            dir.join("data").display()
        );
        let mut ca_file = None;
        if tls {
            let ca = TestCa::new(&format!("ferrolet test registry {name}"));
            std::fs::write(dir.join("server.crt"), &ca.cert_pem).unwrap();
            std::fs::write(dir.join("server.key"), &ca.key_pem).unwrap();
            std::fs::create_dir_all(dir.join("certs")).unwrap();
            // skopeo's --dest-cert-dir takes *.crt as CAs
            std::fs::write(dir.join("certs/ca.crt"), &ca.ca_pem).unwrap();
            std::fs::write(dir.join("ca.pem"), &ca.ca_pem).unwrap();
            ca_file = Some(dir.join("ca.pem"));
            cfg.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.join("server.crt").display(),
                dir.join("server.key").display()
            ));
            if mtls {
                cfg.push_str(&format!("    clientcas:\n      - {}\n", dir.join("ca.pem").display()));
                std::fs::write(dir.join("client.crt"), &ca.client_cert_pem).unwrap();
                std::fs::write(dir.join("client.key"), &ca.client_key_pem).unwrap();
                // skopeo's cert dirs take a client pair as *.cert + *.key
                std::fs::write(dir.join("certs/client.cert"), &ca.client_cert_pem).unwrap();
                std::fs::write(dir.join("certs/client.key"), &ca.client_key_pem).unwrap();
            }
        }
        let mut tokens = None;
        match auth {
            Auth::None => {}
            Auth::Basic => {
                let hash = bcrypt::hash(PASSWORD, 4).unwrap();
                std::fs::write(dir.join("htpasswd"), format!("{USER}:{hash}\n")).unwrap();
                cfg.push_str(&format!(
                    "auth:\n  htpasswd:\n    realm: ferrolet-test\n    path: {}\n",
                    dir.join("htpasswd").display()
                ));
            }
            Auth::Token => {
                let t = TokenServer::start(&dir, &format!("registry-{name}"));
                cfg.push_str(&format!(
                    "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
                    t.realm,
                    t.service,
                    t.issuer,
                    t.root_bundle.display()
                ));
                tokens = Some(t);
            }
        }
        std::fs::write(dir.join("config.yml"), &cfg).unwrap();
        let log = std::fs::File::create(dir.join("registry.log")).unwrap();
        let mut cmd = Command::new(REGISTRY_BIN);
        cmd.arg("serve")
            .arg(dir.join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if let Some(ns) = netns {
            super::enter_netns(&mut cmd, ns);
        }
        let child = cmd.spawn().expect("start docker-registry");
        let mut r = Registry {
            name: name.to_string(),
            dir,
            port,
            tls,
            auth,
            ca_file,
            tokens,
            netns: netns.map(Path::to_path_buf),
            child: Some(child),
        };
        r.wait_ready();
        r
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if self.listening() {
                return;
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("docker-registry {} exited ({st}):\n{}", self.name, self.log());
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry {} did not listen:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    /// Whether the registry's port takes connections (in its namespace).
    fn listening(&self) -> bool {
        let port = self.port;
        let Some(ns) = self.netns.clone() else {
            return TcpStream::connect(("127.0.0.1", port)).is_ok();
        };
        std::thread::spawn(move || {
            let fd = std::fs::File::open(&ns).expect("open netns");
            nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .join()
        .expect("namespace thread")
    }

    /// skopeo, in the registry's namespace.
    fn skopeo(&self) -> Command {
        let mut cmd = Command::new("skopeo");
        if let Some(ns) = &self.netns {
            super::enter_netns(&mut cmd, ns);
        }
        cmd
    }

    /// `127.0.0.1:PORT`, the registry host of references to this registry.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self) -> String {
        format!("{}://{}", if self.tls { "https" } else { "http" }, self.host())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
    }

    /// Request lines (`GET /v2/...`) the registry served, from its access log.
    pub fn requests(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter_map(|l| {
                let start = l.find("\"GET ").or_else(|| l.find("\"HEAD "))?;
                let rest = &l[start + 1..];
                rest.find(" HTTP/").map(|e| rest[..e].to_string())
            })
            .collect()
    }

    /// How many times the registry served `GET` of blob `digest` (any repository).
    pub fn blob_gets(&self, digest: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.starts_with("GET ") && r.contains("/blobs/") && r.ends_with(digest))
            .count()
    }

    /// Push `archive` (an OCI archive of images/out, reference name `oci_ref`) as `repo:tag`;
    /// `all` pushes every image of an index (`skopeo copy --all`); `format` "v2s2" converts to
    /// Docker's schema 2 media types.
    pub fn push(&self, archive: &Path, oci_ref: &str, repo_tag: &str, all: bool, format: Option<&str>) {
        let mut cmd = self.skopeo();
        cmd.arg("copy").arg("--retry-times").arg("2");
        if all {
            cmd.arg("--all");
        }
        if let Some(f) = format {
            cmd.arg("--format").arg(f);
        }
        if self.tls {
            cmd.arg("--dest-cert-dir").arg(self.dir.join("certs"));
        } else {
            cmd.arg("--dest-tls-verify=false");
        }
        if self.auth != Auth::None {
            cmd.arg("--dest-creds").arg(format!("{USER}:{PASSWORD}"));
        }
        cmd.arg(format!("oci-archive:{}:{oci_ref}", archive.display()))
            .arg(format!("docker://{}/{repo_tag}", self.host()));
        let out = cmd.output().expect("run skopeo");
        assert!(
            out.status.success(),
            "skopeo push to {} failed:\n{}{}\n--- registry log ---\n{}",
            self.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            super::tail(&self.log(), 30)
        );
    }

    /// The digest the registry reports for `repo:tag` (its `Docker-Content-Digest`), as skopeo
    /// reads it.
    pub fn digest_of(&self, repo_tag: &str) -> String {
        let mut cmd = self.skopeo();
        cmd.arg("inspect").arg("--raw");
        if self.tls {
            cmd.arg("--cert-dir").arg(self.dir.join("certs"));
        } else {
            cmd.arg("--tls-verify=false");
        }
        if self.auth != Auth::None {
            cmd.arg("--creds").arg(format!("{USER}:{PASSWORD}"));
        }
        let out = cmd
            .arg(format!("docker://{}/{repo_tag}", self.host()))
            .output()
            .expect("run skopeo");
        assert!(
            out.status.success(),
            "skopeo inspect: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        use sha2::Digest;
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(&out.stdout)))
    }

    /// The file in the registry's storage holding blob `digest` (`sha256:...`).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
        self.dir
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Stop the registry (a down upstream); its storage stays until drop.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            super::stop_child(&mut c, Duration::from_secs(5));
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "--- registry {} log (tail) ---\n{}",
                self.name,
                super::tail(&self.log(), 25)
            );
        }
        self.tokens.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One request the token server answered.
#[derive(Debug, Clone)]
pub struct TokenRequest {
    pub method: String,
    pub service: String,
    pub scopes: Vec<String>,
    /// The account the client authenticated as (basic auth or the OAuth2 password grant).
    pub account: Option<String>,
    /// The HTTP status answered.
    pub status: u16,
}

/// The registry token flow's authorization server (docs.docker.com/registry/spec/auth/token):
/// `GET realm?service=..&scope=..` with basic auth, and the OAuth2 `POST` (password and
/// refresh_token grants). It issues JWTs as distribution 2.8's token access controller verifies
/// them (registry/auth/token/token.go): ES256, the signing certificate in the header's `x5c`,
/// chained to a CA in the registry's `rootcertbundle`, `iss` = the configured issuer, `aud` =
/// the service, `exp`/`nbf` within 60 s of leeway, and `access` listing the granted actions.
/// Valid [`USER`]/[`PASSWORD`] get what they ask for; anonymous clients get a token with no
/// access (the registry then answers 401 itself); a wrong password gets 401 here.
pub struct TokenServer {
    pub realm: String,
    pub service: String,
    pub issuer: String,
    pub root_bundle: PathBuf,
    pub log: Arc<Mutex<Vec<TokenRequest>>>,
    rt: Option<tokio::runtime::Runtime>,
}

struct Signer {
    key: ring::signature::EcdsaKeyPair,
    x5c: String,
    service: String,
    issuer: String,
}

impl Signer {
    fn token(&self, subject: &str, access: &[(String, String, Vec<String>)]) -> String {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
        let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [self.x5c]});
        let access: Vec<serde_json::Value> = access
            .iter()
            .map(|(t, n, a)| serde_json::json!({"type": t, "name": n, "actions": a}))
            .collect();
        let claims = serde_json::json!({
            "iss": self.issuer, "sub": subject, "aud": self.service,
            "exp": now + 300, "nbf": now - 10, "iat": now,
            "jti": format!("ferrolet-{now}-{}", rand_u64()), "access": access,
        });
        let input = format!(
            "{}.{}",
            b64.encode(serde_json::to_vec(&header).unwrap()),
            b64.encode(serde_json::to_vec(&claims).unwrap())
        );
        let sig = self
            .key
            .sign(&ring::rand::SystemRandom::new(), input.as_bytes())
            .expect("sign token");
        format!("{input}.{}", b64.encode(sig.as_ref()))
    }
}

fn rand_u64() -> u64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    ring::rand::SystemRandom::new().fill(&mut b).unwrap();
    u64::from_le_bytes(b)
}

impl TokenServer {
    pub fn start(dir: &Path, service: &str) -> TokenServer {
        // A CA (the registry's rootcertbundle) and the signing certificate it issued.
        let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "ferrolet test token CA");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer_ca = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "ferrolet test token signer");
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        let cert = p.signed_by(&key, &issuer_ca).unwrap();
        let root_bundle = dir.join("token-ca.pem");
        std::fs::write(&root_bundle, ca_cert.pem()).unwrap();
        let signing = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &key.serialize_der(),
            &ring::rand::SystemRandom::new(),
        )
        .expect("token signing key");
        let issuer = "ferrolet-test-issuer".to_string();
        let signer = Arc::new(Signer {
            key: signing,
            x5c: base64::engine::general_purpose::STANDARD.encode(cert.der()),
            service: service.to_string(),
            issuer: issuer.clone(),
        });
        let log: Arc<Mutex<Vec<TokenRequest>>> = Arc::default();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("token server listener");
        let port = listener.local_addr().unwrap().port();
        let app = {
            use axum::routing::get;
            let (s1, l1) = (signer.clone(), log.clone());
            let (s2, l2) = (signer.clone(), log.clone());
            axum::Router::new().route(
                "/token",
                get(move |headers: axum::http::HeaderMap, q: axum::extract::RawQuery| {
                    let (s, l) = (s1.clone(), l1.clone());
                    async move {
                        let pairs = parse_form(q.0.as_deref().unwrap_or(""));
                        let basic = headers
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.strip_prefix("Basic "))
                            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b.trim()).ok())
                            .and_then(|b| String::from_utf8(b).ok())
                            .and_then(|s| s.split_once(':').map(|(u, p)| (u.to_string(), p.to_string())));
                        answer(&s, &l, "GET", &pairs, basic, false)
                    }
                })
                .post(move |body: String| {
                    let (s, l) = (s2.clone(), l2.clone());
                    async move {
                        let pairs = parse_form(&body);
                        let one = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
                        let creds = match one("grant_type").as_deref() {
                            Some("password") => one("username").zip(one("password")),
                            // the refresh token this server hands out is the account name
                            Some("refresh_token") => one("refresh_token").and_then(|t| {
                                t.strip_prefix("refresh-")
                                    .map(|u| (u.to_string(), PASSWORD.to_string()))
                            }),
                            _ => None,
                        };
                        answer(&s, &l, "POST", &pairs, creds, true)
                    }
                }),
            )
        };
        rt.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        TokenServer {
            realm: format!("http://127.0.0.1:{port}/token"),
            service: service.to_string(),
            issuer,
            root_bundle,
            log,
            rt: Some(rt),
        }
    }

    pub fn requests(&self) -> Vec<TokenRequest> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn parse_form(s: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(s.as_bytes()).into_owned().collect()
}

fn answer(
    signer: &Signer,
    log: &Mutex<Vec<TokenRequest>>,
    method: &str,
    pairs: &[(String, String)],
    creds: Option<(String, String)>,
    oauth: bool,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let service = pairs
        .iter()
        .find(|(k, _)| k == "service")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let scopes: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| k == "scope")
        .flat_map(|(_, v)| v.split(' ').map(str::to_string).collect::<Vec<_>>())
        .filter(|s| !s.is_empty())
        .collect();
    let mut rec = TokenRequest {
        method: method.to_string(),
        service: service.clone(),
        scopes: scopes.clone(),
        account: creds.as_ref().map(|(u, _)| u.clone()),
        status: 200,
    };
    if service != signer.service {
        rec.status = 400;
        log.lock().unwrap().push(rec);
        return (
            axum::http::StatusCode::BAD_REQUEST,
            axum::Json(serde_json::json!({"errors": [{"code": "UNSUPPORTED", "message": format!("unknown service {service:?}")}]})),
        )
            .into_response();
    }
    let access: Vec<(String, String, Vec<String>)> = match &creds {
        Some((u, p)) if u == USER && p == PASSWORD => scopes
            .iter()
            .filter_map(|s| {
                // type:name:actions; the name may hold a ':' (a port), the actions never do
                let (rest, actions) = s.rsplit_once(':')?;
                let (t, n) = rest.split_once(':')?;
                Some((
                    t.to_string(),
                    n.to_string(),
                    actions.split(',').map(str::to_string).collect(),
                ))
            })
            .collect(),
        Some(_) => {
            rec.status = 401;
            log.lock().unwrap().push(rec);
            return (
                axum::http::StatusCode::UNAUTHORIZED,
                axum::Json(serde_json::json!({"errors": [{"code": "UNAUTHORIZED", "message": "token server: invalid username or password"}]})),
            )
                .into_response();
        }
        None => Vec::new(),
    };
    let subject = creds.as_ref().map(|(u, _)| u.as_str()).unwrap_or("");
    let token = signer.token(subject, &access);
    log.lock().unwrap().push(rec);
    let now = chrono::Utc::now().to_rfc3339();
    let mut body = serde_json::json!({"token": token, "access_token": token, "expires_in": 300, "issued_at": now});
    if oauth && !subject.is_empty() {
        body["refresh_token"] = format!("refresh-{subject}").into();
    }
    axum::Json(body).into_response()
}

/// A TCP proxy on 127.0.0.1 in front of a plain-HTTP registry: logs request heads, cuts or
/// stalls one response after N bytes, refuses connections while down.
pub struct Proxy {
    pub port: u16,
    inner: Arc<ProxyInner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct ProxyInner {
    target: SocketAddr,
    down: AtomicBool,
    stop: AtomicBool,
    /// Request heads seen, in order.
    log: Mutex<Vec<String>>,
    /// Cut (or stall, `.2`) the response to the next request whose request line contains `.0`,
    /// after `.1` bytes.
    cut: Mutex<Option<(String, u64, bool)>>,
    cuts: AtomicUsize,
    /// Response bytes passed to clients.
    bytes: AtomicU64,
}

impl Proxy {
    pub fn start(target_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let inner = Arc::new(ProxyInner {
            target: SocketAddr::from(([127, 0, 0, 1], target_port)),
            down: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            log: Mutex::new(Vec::new()),
            cut: Mutex::new(None),
            cuts: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
        });
        let i = inner.clone();
        let thread = std::thread::spawn(move || accept_loop(listener, port, i));
        Proxy {
            port,
            inner,
            thread: Some(thread),
        }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Down: the port refuses connections (the listener is closed) until set up again.
    pub fn set_down(&self, down: bool) {
        self.inner.down.store(down, Ordering::SeqCst);
        // the accept loop notices within its poll interval
        std::thread::sleep(Duration::from_millis(60));
    }

    /// Cut the connection carrying the response to the next request whose request line
    /// contains `path_part`, after `after` bytes of that response (head included).
    pub fn cut_once(&self, path_part: &str, after: u64) {
        *self.inner.cut.lock().unwrap() = Some((path_part.to_string(), after, false));
    }

    /// Like [`Proxy::cut_once`], but the connection stays open and silent after `after` bytes
    /// (a stalled download) until the client closes it.
    pub fn stall_once(&self, path_part: &str, after: u64) {
        *self.inner.cut.lock().unwrap() = Some((path_part.to_string(), after, true));
    }

    pub fn cuts_done(&self) -> usize {
        self.inner.cuts.load(Ordering::SeqCst)
    }

    /// Every request head (request line and headers) the proxy forwarded.
    pub fn requests(&self) -> Vec<String> {
        self.inner.log.lock().unwrap().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, port: u16, inner: Arc<ProxyInner>) {
    let mut listener = Some(listener);
    while !inner.stop.load(Ordering::SeqCst) {
        if inner.down.load(Ordering::SeqCst) {
            listener = None;
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        if listener.is_none() {
            match TcpListener::bind(("127.0.0.1", port)) {
                Ok(l) => listener = Some(l),
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            }
        }
        let l = listener.as_ref().unwrap();
        l.set_nonblocking(true).unwrap();
        match l.accept() {
            Ok((client, _)) => {
                client.set_nonblocking(false).ok();
                let i = inner.clone();
                std::thread::spawn(move || serve_conn(client, i));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// Per connection: the response byte budget left before the cut (None = no cut armed), and
/// whether to stall instead of cutting.
type CutState = Arc<Mutex<Option<(u64, bool)>>>;

fn serve_conn(client: TcpStream, inner: Arc<ProxyInner>) {
    let Ok(server) = TcpStream::connect(inner.target) else {
        return;
    };
    let cut: CutState = Arc::default();
    let closed = Arc::new(AtomicBool::new(false));
    let (c2, s2, cut2, inner2, closed2) = (
        client.try_clone().unwrap(),
        server.try_clone().unwrap(),
        cut.clone(),
        inner.clone(),
        closed.clone(),
    );
    // server -> client, cut when the armed budget runs out
    let down = std::thread::spawn(move || {
        let (mut from, mut to) = (s2, c2);
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut send = n;
            let mut cut_now = None;
            if let Some((left, stall)) = cut2.lock().unwrap().as_mut() {
                if (n as u64) >= *left {
                    send = *left as usize;
                    cut_now = Some(*stall);
                } else {
                    *left -= n as u64;
                }
            }
            if to.write_all(&buf[..send]).is_err() {
                break;
            }
            inner2.bytes.fetch_add(send as u64, Ordering::Relaxed);
            if let Some(stall) = cut_now {
                inner2.cuts.fetch_add(1, Ordering::SeqCst);
                if stall {
                    // silent until the client gives up (its side closed) or the proxy stops
                    let deadline = Instant::now() + Duration::from_secs(120);
                    while !closed2.load(Ordering::SeqCst)
                        && !inner2.stop.load(Ordering::SeqCst)
                        && Instant::now() < deadline
                    {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
    // client -> server: log each request head (pull clients send GET/HEAD without bodies)
    let (mut from, mut to) = (client, server);
    let mut buf = vec![0u8; 16 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).to_string();
            pending.drain(..end + 4);
            let line = head.lines().next().unwrap_or("").to_string();
            let mut armed = inner.cut.lock().unwrap();
            if armed.as_ref().is_some_and(|(part, _, _)| line.contains(part.as_str())) {
                let (_, after, stall) = armed.take().unwrap();
                *cut.lock().unwrap() = Some((after, stall));
            }
            drop(armed);
            inner.log.lock().unwrap().push(head);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    closed.store(true, Ordering::SeqCst);
    let _ = to.shutdown(Shutdown::Write);
    let _ = down.join();
}

/// An OCI archive of images/out, unpacked to read its index, manifests and configs.
pub struct OciArchive {
    dir: tempfile::TempDir,
}

impl OciArchive {
    pub fn open(path: &Path) -> OciArchive {
        let dir = tempfile::tempdir().unwrap();
        let st = Command::new("tar")
            .arg("-xf")
            .arg(path)
            .arg("-C")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "unpacking {}", path.display());
        OciArchive { dir }
    }

    pub fn json(&self, digest: &str) -> serde_json::Value {
        let hex = digest.strip_prefix("sha256:").unwrap();
        serde_json::from_slice(&std::fs::read(self.dir.path().join("blobs/sha256").join(hex)).unwrap()).unwrap()
    }

    /// The digest the layout's index.json names first.
    pub fn top(&self) -> String {
        let idx: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.dir.path().join("index.json")).unwrap()).unwrap();
        idx["manifests"][0]["digest"].as_str().unwrap().to_string()
    }

    /// For an image manifest: (config digest, layer digests).
    pub fn image(&self, manifest: &str) -> (String, Vec<String>) {
        let m = self.json(manifest);
        (
            m["config"]["digest"].as_str().unwrap().to_string(),
            m["layers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["digest"].as_str().unwrap().to_string())
                .collect(),
        )
    }

    /// For an index: platform ("os/arch[/variant]") -> manifest digest.
    pub fn platforms(&self, index: &str) -> HashMap<String, String> {
        self.json(index)["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let p = &m["platform"];
                let mut k = format!("{}/{}", p["os"].as_str().unwrap(), p["architecture"].as_str().unwrap());
                if let Some(v) = p["variant"].as_str() {
                    k.push('/');
                    k.push_str(v);
                }
                (k, m["digest"].as_str().unwrap().to_string())
            })
            .collect()
    }
}
