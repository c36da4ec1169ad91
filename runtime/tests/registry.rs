//! The registry client against Debian's real `docker-registry` (CNCF distribution) on
//! 127.0.0.1, with the busybox image `images/build-busybox.sh` builds pushed by skopeo.
//! Skips (loudly) when docker-registry, skopeo or the image archive is missing.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::image::ImageStore;
use ferrolet_runtime::registry::{Credentials, Platform, Progress, ProgressFn, Puller, PullerOptions, RegistryConfig};

const REGISTRY: &str = "/usr/bin/docker-registry";

fn archive() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("FERROLET_BUSYBOX_OCI").map(PathBuf::from),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/out/busybox.oci.tar")),
    ];
    candidates.into_iter().flatten().find(|p| p.is_file())
}

fn prerequisites() -> Option<PathBuf> {
    if !Path::new(REGISTRY).exists() || Command::new("skopeo").arg("--version").output().is_err() {
        eprintln!("SKIPPED: {REGISTRY} or skopeo is not installed (scripts/setup.sh installs them)");
        return None;
    }
    let a = archive();
    if a.is_none() {
        eprintln!("SKIPPED: images/out/busybox.oci.tar is missing (images/build-busybox.sh builds it)");
    }
    a
}

/// A docker-registry on 127.0.0.1, stopped and removed when dropped.
struct Registry {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
    creds: Option<(String, String)>,
    ca: Option<PathBuf>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Registry {
    /// Start one; with `auth`, htpasswd basic auth for that user; with `tls`, a test CA's
    /// certificate for 127.0.0.1.
    fn start(auth: Option<(&str, &str)>, tls: bool) -> Registry {
        Registry::start_with(auth, tls, None)
    }

    /// With `token`, the registry's token auth against that token server instead of htpasswd.
    fn start_with(auth: Option<(&str, &str)>, tls: bool, token: Option<&TokenServer>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut cfg = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        );
        let mut ca = None;
        if tls {
            let ca_key = rcgen::KeyPair::generate().unwrap();
            let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            ca_params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "ferrolet test CA");
            let ca_cert = ca_params.self_signed(&ca_key).unwrap();
            let key = rcgen::KeyPair::generate().unwrap();
            let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
            let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
            let cert = params.signed_by(&key, &issuer).unwrap();
            std::fs::write(dir.path().join("ca.pem"), ca_cert.pem()).unwrap();
            std::fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
            std::fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
            cfg.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.path().join("cert.pem").display(),
                dir.path().join("key.pem").display()
            ));
            ca = Some(dir.path().join("ca.pem"));
        }
        if let Some(t) = token {
            cfg.push_str(&format!(
                "auth:\n  token:\n    realm: http://127.0.0.1:{}/token\n    service: ferrolet-test\n    issuer: ferrolet-test-issuer\n    rootcertbundle: {}\n",
                t.port,
                t.bundle.display()
            ));
        } else if let Some((u, p)) = auth {
            let hash = bcrypt::hash(p, 4).unwrap();
            std::fs::write(dir.path().join("htpasswd"), format!("{u}:{hash}\n")).unwrap();
            cfg.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: ferrolet-test\n    path: {}\n",
                dir.path().join("htpasswd").display()
            ));
        }
        std::fs::write(dir.path().join("config.yml"), cfg).unwrap();
        let child = Command::new(REGISTRY)
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let reg = Registry {
            child,
            dir,
            port,
            creds: auth.map(|(u, p)| (u.to_string(), p.to_string())),
            ca,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "docker-registry did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        reg
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn push(&self, archive: &Path, name: &str) {
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "--quiet", "--dest-tls-verify=false"]);
        if let Some((u, p)) = &self.creds {
            cmd.arg(format!("--dest-creds={u}:{p}"));
        }
        let out = cmd
            .arg(format!("oci-archive:{}:1.35", archive.display()))
            .arg(format!("docker://{}/{name}", self.host()))
            .output()
            .unwrap();
        assert!(out.status.success(), "skopeo: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// The registry's own file of a blob (filesystem storage driver).
    fn blob_file(&self, d: &Digest) -> PathBuf {
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&d.hex()[..2])
            .join(d.hex())
            .join("data")
    }
}

fn puller(store: &Arc<ImageStore>, registries: RegistryConfig) -> Puller {
    Puller::new(
        store.clone(),
        registries,
        PullerOptions {
            max_concurrent_downloads: 3,
            progress_timeout: Duration::from_secs(30),
            platform: Platform::parse("linux/amd64").unwrap(),
            reserve: Default::default(),
        },
    )
}

fn new_store() -> (tempfile::TempDir, Arc<ImageStore>) {
    let t = tempfile::tempdir().unwrap();
    let s = Arc::new(ImageStore::open(t.path().join("images")).unwrap());
    (t, s)
}

fn recorder() -> (ProgressFn, Arc<Mutex<Vec<Progress>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let e2 = events.clone();
    (Arc::new(move |p| e2.lock().unwrap().push(p)), events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_by_tag_and_digest_resume_and_share() {
    let Some(archive) = prerequisites() else { return };
    let reg = Registry::start(None, false);
    reg.push(&archive, "library/busybox:1.35");
    let reference = format!("{}/library/busybox:1.35", reg.host());

    // By tag, over plain http (a loopback registry: https is tried first).
    let (_t, store) = new_store();
    let p = puller(&store, RegistryConfig::default());
    let (progress, events) = recorder();
    let out = p.pull(&reference, &[], Some(progress)).await.unwrap();
    assert!(out.downloaded > 0);
    assert_eq!(out.record.refs, vec![reference.clone()]);
    let img = store.resolve(&reference).unwrap();
    assert!(img.layer_dirs[0].join("bin/busybox").exists());
    assert!(store.blob_path(&out.record.manifest).is_file());
    let events = events.lock().unwrap().clone();
    assert!(matches!(events[0], Progress::Resolved { .. }), "{events:?}");
    assert!(events.iter().any(|e| matches!(e, Progress::Downloaded { .. })));
    assert!(matches!(events.last(), Some(Progress::Done { .. })), "{events:?}");
    // The manifest digest is the registry's.
    let manifest = out.record.manifest.clone();
    let layer = out.record.layers[0].clone();

    // Again: nothing is fetched.
    let again = p.pull(&reference, &[], None).await.unwrap();
    assert_eq!(again.downloaded, 0);
    assert_eq!(again.record.id, out.record.id);

    // By digest, into a fresh store.
    let (_t2, store2) = new_store();
    let p2 = puller(&store2, RegistryConfig::default());
    let by_digest = format!("{}/library/busybox@{manifest}", reg.host());
    let out2 = p2.pull(&by_digest, &[], None).await.unwrap();
    assert_eq!(out2.record.id, out.record.id);
    assert_eq!(out2.record.manifest, manifest);
    assert!(store2.find(&by_digest).is_ok());

    // Resume: half the layer is already in a partial file; only the rest is fetched.
    let (_t3, store3) = new_store();
    let data = std::fs::read(reg.blob_file(&layer.digest)).unwrap();
    let half = data.len() / 2;
    std::fs::write(store3.partial_dir().join(layer.digest.hex()), &data[..half]).unwrap();
    let p3 = puller(&store3, RegistryConfig::default());
    let (progress, events) = recorder();
    let out3 = p3.pull(&reference, &[], Some(progress)).await.unwrap();
    let config_size = std::fs::metadata(store3.blob_path(&out3.record.id)).unwrap().len();
    assert_eq!(out3.downloaded, (data.len() - half) as u64 + config_size);
    let first = events.lock().unwrap().iter().find_map(|e| match e {
        Progress::Downloading { digest, done, .. } if digest == &layer.digest => Some(*done),
        _ => None,
    });
    assert_eq!(first, Some(half as u64));
    assert!(!store3.partial_dir().join(layer.digest.hex()).exists());

    // A partial file that is garbage fails the digest check, is deleted, and the pull
    // names the blob.
    let (_t4, store4) = new_store();
    std::fs::write(store4.partial_dir().join(layer.digest.hex()), vec![b'x'; half]).unwrap();
    let p4 = puller(&store4, RegistryConfig::default());
    let err = p4.pull(&reference, &[], None).await.unwrap_err().to_string();
    assert!(
        err.contains(&layer.digest.to_string()) && err.contains("tampered"),
        "{err}"
    );
    assert!(!store4.partial_dir().join(layer.digest.hex()).exists());
    // ... so the next pull starts over and succeeds.
    p4.pull(&reference, &[], None).await.unwrap();

    // Two pulls of the same reference at once are one pull.
    let (_t5, store5) = new_store();
    let p5 = Arc::new(puller(&store5, RegistryConfig::default()));
    let (a, b) = tokio::join!(p5.pull(&reference, &[], None), p5.pull(&reference, &[], None));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.record.id, b.record.id);
    assert_eq!(a.downloaded.min(b.downloaded), 0);
    assert_eq!(a.downloaded.max(b.downloaded), out.downloaded);

    // A missing tag: the registry's message.
    let err = p
        .pull(&format!("{}/library/busybox:nope", reg.host()), &[], None)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("not found") && msg.contains("manifest unknown"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_blob_is_refused() {
    let Some(archive) = prerequisites() else { return };
    let reg = Registry::start(None, false);
    reg.push(&archive, "library/busybox:1.35");
    let reference = format!("{}/library/busybox:1.35", reg.host());
    let (_t, store) = new_store();
    let p = puller(&store, RegistryConfig::default());
    // Find the layer via a first pull into another store.
    let (_t0, store0) = new_store();
    let layer = puller(&store0, RegistryConfig::default())
        .pull(&reference, &[], None)
        .await
        .unwrap()
        .record
        .layers[0]
        .digest
        .clone();
    let f = reg.blob_file(&layer);
    let mut data = std::fs::read(&f).unwrap();
    let n = data.len();
    data[n / 2] ^= 0xff;
    std::fs::write(&f, &data).unwrap();
    let err = p.pull(&reference, &[], None).await.unwrap_err().to_string();
    assert!(err.contains(&layer.to_string()) && err.contains("tampered"), "{err}");
    assert!(!store.blob_path(&layer).exists());
    assert!(!store.partial_dir().join(layer.hex()).exists());
    assert!(store.find(&reference).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_basic_auth_and_mirrors() {
    let Some(archive) = prerequisites() else { return };
    let reg = Registry::start(Some(("ferrolet", "s3cret")), true);
    reg.push(&archive, "library/busybox:1.35");
    let reference = format!("{}/library/busybox:1.35", reg.host());
    let ca = reg.ca.clone().unwrap();
    let yaml = format!(
        "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n",
        reg.host(),
        ca.display()
    );
    let cfg = RegistryConfig::parse(&yaml, "registries.yaml").unwrap();
    let (_t, store) = new_store();
    let p = puller(&store, cfg);

    // Anonymous and a wrong password: the registry's refusal.
    let err = p.pull(&reference, &[], None).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "pulling from host {} failed with status code 401 Unauthorized: unauthorized: authentication required",
            reg.host()
        )),
        "{err}"
    );
    let wrong = Credentials::Basic {
        username: "ferrolet".into(),
        password: "wrong".into(),
    };
    let right = Credentials::Basic {
        username: "ferrolet".into(),
        password: "s3cret".into(),
    };
    let err = p
        .pull(&reference, std::slice::from_ref(&wrong), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("401 Unauthorized"), "{err}");
    // The next credential is tried.
    let out = p.pull(&reference, &[wrong, right.clone()], None).await.unwrap();
    assert!(out.downloaded > 0);

    // Without the CA the certificate is refused.
    let (_t2, store2) = new_store();
    let err = puller(&store2, RegistryConfig::default())
        .pull(&reference, std::slice::from_ref(&right), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.to_lowercase().contains("certificate"), "{err}");

    // A mirror for docker.io: a dead endpoint first, then the TLS registry with the
    // credentials from registries.yaml; `busybox:1.35` comes from it.
    let dead = free_port();
    let yaml = format!(
        "mirrors:\n  docker.io:\n    endpoint:\n      - \"http://127.0.0.1:{dead}\"\n      - \"https://{host}\"\nconfigs:\n  \"{host}\":\n    auth: {{username: ferrolet, password: s3cret}}\n    tls: {{ca_file: {ca}}}\n",
        host = reg.host(),
        ca = ca.display()
    );
    let cfg = RegistryConfig::parse(&yaml, "registries.yaml").unwrap();
    let (_t3, store3) = new_store();
    let out = puller(&store3, cfg).pull("busybox:1.35", &[], None).await.unwrap();
    assert_eq!(out.record.refs, vec!["docker.io/library/busybox:1.35".to_string()]);
    assert!(store3.resolve("busybox:1.35").is_ok());
}

/// A token server for docker-registry's token auth (distribution's token spec): checks
/// basic credentials and grants the scope asked for in an ES256 JWT whose x5c certificate is
/// the registry's `rootcertbundle`.
struct TokenServer {
    port: u16,
    bundle: PathBuf,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
    issued: Arc<Mutex<usize>>,
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn b64url(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

impl TokenServer {
    async fn start(user: &'static str, password: &'static str) -> TokenServer {
        use base64::Engine as _;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["ferrolet-token".to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "ferrolet token signer");
        let cert = params.self_signed(&key).unwrap();
        let bundle = dir.path().join("token-ca.pem");
        std::fs::write(&bundle, cert.pem()).unwrap();
        let x5c = base64::engine::general_purpose::STANDARD.encode(cert.der());
        let rng = ring::rand::SystemRandom::new();
        let signer = Arc::new(
            ring::signature::EcdsaKeyPair::from_pkcs8(
                &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                &key.serialize_der(),
                &rng,
            )
            .unwrap(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let issued = Arc::new(Mutex::new(0usize));
        let issued2 = issued.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let signer = signer.clone();
                let x5c = x5c.clone();
                let issued = issued2.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    let req = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let length: usize = req
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().to_string())
                        })
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + length {
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let post = req.starts_with("POST ");
                    let target = req.split_whitespace().nth(1).unwrap_or("").to_string();
                    // GET: the query; POST (an OAuth2 refresh token): the form body.
                    let form = if post {
                        buf[head_end..head_end + length].to_vec()
                    } else {
                        target.split_once('?').map(|(_, q)| q).unwrap_or("").as_bytes().to_vec()
                    };
                    let params: Vec<(String, String)> = form_urlencoded::parse(&form).into_owned().collect();
                    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
                    let expected = format!(
                        "Basic {}",
                        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
                    );
                    let authorized = if post {
                        get("grant_type").as_deref() == Some("refresh_token")
                            && get("refresh_token").as_deref() == Some(REFRESH_TOKEN)
                    } else {
                        req.lines()
                            .any(|l| l.to_ascii_lowercase().starts_with("authorization:") && l[14..].trim() == expected)
                    };
                    let (status, body) = if !authorized {
                        (
                            "401 Unauthorized",
                            r#"{"errors":[{"code":"UNAUTHORIZED","message":"invalid username or password"}]}"#
                                .to_string(),
                        )
                    } else {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .unwrap()
                            .as_secs();
                        let access: Vec<serde_json::Value> = get("scope")
                            .into_iter()
                            .filter_map(|s| {
                                let mut it = s.splitn(3, ':');
                                let (t, n, a) = (it.next()?, it.next()?, it.next()?);
                                Some(serde_json::json!({"type": t, "name": n, "actions": a.split(',').collect::<Vec<_>>()}))
                            })
                            .collect();
                        let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [x5c]});
                        let claims = serde_json::json!({
                            "iss": "ferrolet-test-issuer", "sub": user, "aud": get("service").unwrap_or_default(),
                            "exp": now + 300, "nbf": now - 10, "iat": now, "jti": format!("{now}-{}", rand_id()),
                            "access": access,
                        });
                        let input = format!(
                            "{}.{}",
                            b64url(header.to_string().as_bytes()),
                            b64url(claims.to_string().as_bytes())
                        );
                        let sig = signer.sign(&ring::rand::SystemRandom::new(), input.as_bytes()).unwrap();
                        *issued.lock().unwrap() += 1;
                        (
                            "200 OK",
                            if post {
                                serde_json::json!({"access_token": format!("{input}.{}", b64url(sig.as_ref())), "expires_in": 300})
                            } else {
                                serde_json::json!({"token": format!("{input}.{}", b64url(sig.as_ref())), "expires_in": 300})
                            }
                            .to_string(),
                        )
                    };
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(resp.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        TokenServer {
            port,
            bundle,
            _dir: dir,
            task,
            issued,
        }
    }
}

/// The identity token (OAuth2 refresh token) the test token server accepts.
const REFRESH_TOKEN: &str = "ferrolet-refresh-token";

fn rand_id() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_flow() {
    let Some(archive) = prerequisites() else { return };
    let tokens = TokenServer::start("ferrolet", "s3cret").await;
    let reg = Registry::start_with(Some(("ferrolet", "s3cret")), false, Some(&tokens));
    let host = reg.host();
    let archive2 = archive.clone();
    let reg_push = tokio::task::spawn_blocking(move || {
        reg.push(&archive2, "library/busybox:1.35");
        reg
    });
    let reg = reg_push.await.unwrap();
    let reference = format!("{host}/library/busybox:1.35");
    let (_t, store) = new_store();
    let p = puller(&store, RegistryConfig::default());

    // Anonymously the token server refuses: its message is the error.
    let err = p.pull(&reference, &[], None).await.unwrap_err().to_string();
    assert!(
        err.contains("401 Unauthorized") && err.contains("invalid username or password"),
        "{err}"
    );
    // A wrong password, then the right one: the token for the right one is used and cached.
    let before = *tokens.issued.lock().unwrap();
    let creds = [
        Credentials::Basic {
            username: "ferrolet".into(),
            password: "nope".into(),
        },
        Credentials::Basic {
            username: "ferrolet".into(),
            password: "s3cret".into(),
        },
    ];
    let out = p.pull(&reference, &creds, None).await.unwrap();
    assert!(out.downloaded > 0);
    assert_eq!(
        *tokens.issued.lock().unwrap() - before,
        1,
        "one token for the whole pull"
    );
    drop(reg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_mirror_times_out() {
    let Some(archive) = prerequisites() else { return };
    let reg = Registry::start(None, false);
    reg.push(&archive, "library/busybox:1.35");
    // Connections to it are accepted by the kernel and never answered.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let yaml = format!(
        "mirrors:\n  docker.io:\n    endpoint: [\"http://{}\", \"http://{}\"]\n",
        silent.local_addr().unwrap(),
        reg.host()
    );
    let (_t, store) = new_store();
    let p = Puller::new(
        store.clone(),
        RegistryConfig::parse(&yaml, "registries.yaml").unwrap(),
        PullerOptions {
            max_concurrent_downloads: 1,
            progress_timeout: Duration::from_secs(1),
            platform: Platform::parse("linux/amd64").unwrap(),
            reserve: Default::default(),
        },
    );
    let started = Instant::now();
    p.pull("busybox:1.35", &[], None).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(started.elapsed() < Duration::from_secs(20));

    // Only the silent one: the error says it timed out.
    let yaml = format!(
        "mirrors:\n  \"127.0.0.1:{}\":\n    endpoint: [\"http://{}\"]\n",
        free_port(),
        silent.local_addr().unwrap()
    );
    p.set_registries(RegistryConfig::parse(&yaml, "registries.yaml").unwrap());
    let dead = yaml.split('"').nth(1).unwrap().to_string();
    let err = p.pull(&format!("{dead}/x:1"), &[], None).await.unwrap_err().to_string();
    assert!(err.contains("no answer within 1s"), "{err}");
}

/// A TCP proxy in front of a registry that cuts the first connection which has carried more
/// than `cut_after` bytes of answer, and notes the Range requests it relays.
struct CuttingProxy {
    port: u16,
    ranges: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CuttingProxy {
    async fn start(upstream: u16, cut_after: usize) -> CuttingProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let ranges = Arc::new(Mutex::new(Vec::new()));
        let cut_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r2 = ranges.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let ranges = r2.clone();
                let cut_done = cut_done.clone();
                let up = tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        let text = String::from_utf8_lossy(&buf[..n]).to_string();
                        for l in text.lines() {
                            if l.to_ascii_lowercase().starts_with("range:") {
                                ranges.lock().unwrap().push(l[6..].trim().to_string());
                            }
                        }
                        if sw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    let mut relayed = 0usize;
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        relayed += n;
                        if relayed > cut_after && !cut_done.swap(true, std::sync::atomic::Ordering::SeqCst) {
                            break;
                        }
                    }
                    up.abort();
                    let _ = cw.shutdown().await;
                });
            }
        });
        CuttingProxy { port, ranges, task }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_cut_mid_layer_is_resumed() {
    let Some(archive) = prerequisites() else { return };
    let reg = Registry::start(None, false);
    reg.push(&archive, "library/busybox:1.35");
    let proxy = CuttingProxy::start(reg.port, 256 * 1024).await;
    let reference = format!("127.0.0.1:{}/library/busybox:1.35", proxy.port);
    let (_t, store) = new_store();
    let (progress, events) = recorder();
    let out = puller(&store, RegistryConfig::default())
        .pull(&reference, &[], Some(progress))
        .await
        .unwrap();
    let layer = &out.record.layers[0];
    assert!(layer.size > 256 * 1024, "the layer is too small to cut");
    let ranges = proxy.ranges.lock().unwrap().clone();
    assert_eq!(ranges.len(), 1, "{ranges:?}");
    let offset: u64 = ranges[0]
        .strip_prefix("bytes=")
        .and_then(|r| r.strip_suffix('-'))
        .unwrap()
        .parse()
        .unwrap();
    assert!(offset > 0 && offset < layer.size, "{offset}");
    // The resumed download started where the first stopped.
    let resumed_from = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            Progress::Downloading { digest, done, .. } if digest == &layer.digest => Some(*done),
            _ => None,
        })
        .filter(|d| *d == offset)
        .count();
    assert!(resumed_from >= 1);
    assert!(store.resolve(&reference).unwrap().layer_dirs[0]
        .join("bin/busybox")
        .exists());
}
