//! The registry client against a hostile registry written here: a raw HTTP/1.1 server on
//! 127.0.0.1 that declares absurd layer sizes, streams zeros for ever, stalls, lists 10,000
//! platforms. What is checked: blobs are capped (the layer limit, the free space less the
//! reserve, the declared size) before and while they stream, a download nobody waits for is
//! cancelled, no partial over the cap is kept, a failed pull leaves no orphan blobs, and error
//! messages stay short. The disk-space tests put the store on a tmpfs of their own (as root;
//! skipped with a notice otherwise), so free space is exact and nothing else on the machine
//! can move it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::image::ImageStore;
use ferrolet_runtime::registry::{DiskReserve, Platform, Puller, PullerOptions, RegistryConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// What the hostile registry answers on a path.
#[derive(Clone)]
enum Resp {
    /// A document or small blob, with its digest in Docker-Content-Digest.
    Doc {
        content_type: String,
        body: Vec<u8>,
    },
    /// Zeros with no Content-Length (the body ends when the connection does): `chunk` bytes
    /// every `pause`, at most `limit` bytes (then it stalls, holding the connection open).
    Zeros {
        chunk: usize,
        pause: Duration,
        limit: u64,
    },
    NotFound,
}

#[derive(Default)]
struct State {
    routes: Mutex<HashMap<String, Resp>>,
    /// Request lines, in order.
    requests: Mutex<Vec<String>>,
    /// Zero bytes sent, all connections together.
    sent: AtomicU64,
    /// A connection streaming zeros saw the client go away.
    closed: AtomicBool,
}

struct Hostile {
    port: u16,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Hostile {
    async fn start() -> Hostile {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let s2 = state.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((c, _)) = l.accept().await {
                conns.spawn(serve(c, s2.clone()));
            }
        });
        Hostile { port, state, task }
    }

    fn route(&self, path: &str, r: Resp) {
        self.state.routes.lock().unwrap().insert(path.to_string(), r);
    }

    fn reference(&self) -> String {
        format!("127.0.0.1:{}/hostile:1", self.port)
    }

    fn requests(&self) -> Vec<String> {
        self.state.requests.lock().unwrap().clone()
    }

    /// An image manifest at the tag `1` with `layers` (digest, declared size) and a config
    /// listing as many diff_ids, the config served too. Returns the config's digest.
    fn image(&self, layers: &[(Digest, u64)]) -> Digest {
        let config = serde_json::json!({"architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|(d, _)| d.to_string()).collect::<Vec<_>>()}})
        .to_string()
        .into_bytes();
        let cd = Digest::of(&config);
        let manifest = serde_json::json!({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd.to_string(), "size": config.len()},
            "layers": layers.iter().map(|(d, s)| serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d.to_string(), "size": s})).collect::<Vec<_>>()})
        .to_string()
        .into_bytes();
        self.route(
            "/v2/hostile/manifests/1",
            Resp::Doc {
                content_type: OCI_MANIFEST.into(),
                body: manifest,
            },
        );
        self.route(
            &format!("/v2/hostile/blobs/{cd}"),
            Resp::Doc {
                content_type: "application/octet-stream".into(),
                body: config,
            },
        );
        cd
    }

    fn blob_requests(&self, d: &Digest) -> usize {
        let p = format!("/v2/hostile/blobs/{d}");
        self.requests().iter().filter(|r| r.contains(&p)).count()
    }
}

async fn serve(mut c: TcpStream, state: Arc<State>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        // The client tries TLS first on loopback: answer in plain HTTP, as a plain
        // registry does, and it falls back to http.
        if head.first() == Some(&0x16) || head.len() > 64 << 10 {
            let _ = c
                .write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
                .await;
            return;
        }
    }
    let line = String::from_utf8_lossy(&head)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    state.requests.lock().unwrap().push(line.clone());
    let path = line
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .split('?')
        .next()
        .unwrap_or("")
        .to_string();
    let resp = state
        .routes
        .lock()
        .unwrap()
        .get(&path)
        .cloned()
        .unwrap_or(Resp::NotFound);
    match resp {
        Resp::NotFound => {
            let body = br#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown to registry"}]}"#;
            let _ = c
                .write_all(
                    format!(
                        "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
            let _ = c.write_all(body).await;
        }
        Resp::Doc { content_type, body } => {
            let h = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nDocker-Content-Digest: {}\r\nConnection: close\r\n\r\n",
                body.len(),
                Digest::of(&body)
            );
            let _ = c.write_all(h.as_bytes()).await;
            let _ = c.write_all(&body).await;
        }
        Resp::Zeros { chunk, pause, limit } => {
            let h = "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n";
            if c.write_all(h.as_bytes()).await.is_err() {
                return;
            }
            let zeros = vec![0u8; chunk];
            let mut sent = 0u64;
            while sent < limit {
                let n = chunk.min((limit - sent) as usize);
                if c.write_all(&zeros[..n]).await.is_err() {
                    state.closed.store(true, Ordering::SeqCst);
                    return;
                }
                sent += n as u64;
                state.sent.fetch_add(n as u64, Ordering::SeqCst);
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            // Stall, holding the connection until the client goes.
            let mut b = [0u8; 1024];
            loop {
                match c.read(&mut b).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            state.closed.store(true, Ordering::SeqCst);
        }
    }
}

fn puller(store: &Arc<ImageStore>, reserve: DiskReserve) -> Puller {
    Puller::new(
        store.clone(),
        RegistryConfig::default(),
        PullerOptions {
            max_concurrent_downloads: 3,
            progress_timeout: Duration::from_secs(20),
            platform: Platform::parse("linux/amd64").unwrap(),
            reserve,
        },
    )
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Bytes used on the filesystem holding `dir`.
fn used(dir: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(dir).unwrap();
    (st.blocks() - st.blocks_free()) as u64 * st.fragment_size() as u64
}

/// A tmpfs of `mib` MiB on a temp dir, unmounted when dropped (pass or fail).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn new(mib: u64) -> Option<Tmpfs> {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("SKIPPED: mounting a tmpfs for the store needs root");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        nix::mount::mount(
            Some("ferrolet-test"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(format!("size={mib}m,mode=0700").as_str()),
        )
        .unwrap();
        Some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

fn store_in(dir: &Path) -> Arc<ImageStore> {
    Arc::new(ImageStore::open(dir.join("images")).unwrap())
}

fn partials(store: &ImageStore) -> Vec<String> {
    names(&store.partial_dir())
}

fn blobs(store: &ImageStore) -> Vec<String> {
    names(&store.dir().join("blobs/sha256"))
}

/// Wait up to 5 s for `cond`.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn zeros_for_ever() -> Resp {
    Resp::Zeros {
        chunk: 64 << 10,
        pause: Duration::ZERO,
        limit: u64::MAX,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_declared_past_the_layer_limit_is_refused_before_a_byte() {
    let reg = Hostile::start().await;
    let layer = Digest::of(b"2^62 bytes of zeros");
    reg.image(&[(layer.clone(), 1 << 62)]);
    reg.route(&format!("/v2/hostile/blobs/{layer}"), zeros_for_ever());
    let t = tempfile::tempdir().unwrap();
    let store = store_in(t.path());
    let started = Instant::now();
    let err = puller(&store, DiskReserve::default())
        .pull(&reg.reference(), &[], None)
        .await
        .unwrap_err()
        .to_string();
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(
        err.contains(&format!("blob {layer} declares 4611686018427387904 bytes"))
            && err.contains("more than the layer limit of 17179869184 bytes (16.0 GiB)"),
        "{err}"
    );
    assert_eq!(reg.blob_requests(&layer), 0, "{:?}", reg.requests());
    assert_eq!(reg.state.sent.load(Ordering::SeqCst), 0);
    assert!(partials(&store).is_empty() && blobs(&store).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_that_would_eat_the_reserve_is_refused_before_a_byte() {
    let Some(fs) = Tmpfs::new(64) else { return };
    let reg = Hostile::start().await;
    let layer = Digest::of(b"40 MiB");
    reg.image(&[(layer.clone(), 40 << 20)]);
    reg.route(&format!("/v2/hostile/blobs/{layer}"), zeros_for_ever());
    let store = store_in(fs.path());
    // 64 MiB, 32 MiB of which must stay free: 40 MiB cannot fit.
    let reserve = DiskReserve {
        bytes: 0,
        percent: 50.0,
    };
    let err = puller(&store, reserve)
        .pull(&reg.reference(), &[], None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("needs 41943") && err.contains("the node can spare") && err.contains("must keep 33554432 bytes"),
        "{err}"
    );
    assert_eq!(reg.blob_requests(&layer), 0);
    assert!(partials(&store).is_empty() && blobs(&store).is_empty());
    // Without the reserve it fits, so it is fetched: the zeros are cut at the declared size
    // and refused (the digest cannot match), and nothing is kept.
    let err = puller(&store, DiskReserve::default())
        .pull(&reg.reference(), &[], None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is larger than the 41943040 bytes the manifest gives"),
        "{err}"
    );
    eventually("no blob or partial left", || {
        partials(&store).is_empty() && blobs(&store).is_empty()
    })
    .await;
    assert!(used(fs.path()) < 4 << 20, "{} bytes used", used(fs.path()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_stops_when_the_disk_fills_under_it() {
    let Some(fs) = Tmpfs::new(96) else { return };
    let reg = Hostile::start().await;
    let layer = Digest::of(b"48 MiB, slowly");
    reg.image(&[(layer.clone(), 48 << 20)]);
    reg.route(
        &format!("/v2/hostile/blobs/{layer}"),
        Resp::Zeros {
            chunk: 256 << 10,
            pause: Duration::from_millis(20),
            limit: u64::MAX,
        },
    );
    let store = store_in(fs.path());
    let reserve = DiskReserve {
        bytes: 16 << 20,
        percent: 0.0,
    };
    let p = Arc::new(puller(&store, reserve));
    let (p2, r) = (p.clone(), reg.reference());
    let pull = tokio::spawn(async move { p2.pull(&r, &[], None).await });
    let st = reg.state.clone();
    eventually("2 MiB streamed", || st.sent.load(Ordering::SeqCst) >= 2 << 20).await;
    // Something else takes 40 MiB: 48 - 2 - 40 + ... leaves less than the reserve plus the
    // rest of the layer.
    std::fs::write(fs.path().join("filler"), vec![1u8; 40 << 20]).unwrap();
    let err = tokio::time::timeout(Duration::from_secs(20), pull)
        .await
        .expect("the download stopped")
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("stopped downloading blob {layer}")) && err.contains("the partial download was deleted"),
        "{err}"
    );
    assert!(
        reg.state.sent.load(Ordering::SeqCst) < 24 << 20,
        "stopped within the check interval"
    );
    eventually("no partial left", || partials(&store).is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_nobody_waits_for_stops_downloading() {
    let Some(fs) = Tmpfs::new(64) else { return };
    let reg = Hostile::start().await;
    let layer = Digest::of(b"32 MiB that stall");
    reg.image(&[(layer.clone(), 32 << 20)]);
    // 3 MiB, then silence with the connection open: only the client can end it.
    reg.route(
        &format!("/v2/hostile/blobs/{layer}"),
        Resp::Zeros {
            chunk: 64 << 10,
            pause: Duration::ZERO,
            limit: 3 << 20,
        },
    );
    let store = store_in(fs.path());
    let reserve = DiskReserve {
        bytes: 8 << 20,
        percent: 0.0,
    };
    let p = Arc::new(puller(&store, reserve));
    let spawn_pull = || {
        let (p, r) = (p.clone(), reg.reference());
        tokio::spawn(async move { p.pull(&r, &[], None).await })
    };
    // Two pods pull the same image; one is deleted: the download goes on for the other.
    let (a, b) = (spawn_pull(), spawn_pull());
    let st = reg.state.clone();
    eventually("3 MiB streamed", || st.sent.load(Ordering::SeqCst) >= 3 << 20).await;
    let partial = store.partial_dir().join(layer.hex());
    eventually("the partial file written", || {
        std::fs::metadata(&partial).is_ok_and(|m| m.len() >= 1 << 20)
    })
    .await;
    a.abort();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!reg.state.closed.load(Ordering::SeqCst), "the other pull still waits");
    // The last one goes: the connection is closed; the partial, under the cap, stays.
    b.abort();
    let st = reg.state.clone();
    eventually("the connection closed", || st.closed.load(Ordering::SeqCst)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        partials(&store),
        vec![layer.hex().to_string()],
        "under the cap: kept to resume"
    );
    assert_eq!(reg.blob_requests(&layer), 1, "one download for both pulls");

    // Again, and this time something fills the disk before the pull is dropped: the partial
    // is then over the cap (the filesystem no longer keeps its reserve) and is deleted.
    reg.state.closed.store(false, Ordering::SeqCst);
    let c = spawn_pull();
    let st = reg.state.clone();
    eventually("the second download streaming", || {
        st.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.contains(layer.hex()))
            .count()
            == 2
    })
    .await;
    eventually("the partial file written", || {
        std::fs::metadata(&partial).is_ok_and(|m| m.len() >= 1 << 20)
    })
    .await;
    let room = nix::sys::statvfs::statvfs(fs.path()).unwrap();
    let available = room.blocks_available() as u64 * room.fragment_size() as u64;
    std::fs::write(fs.path().join("filler"), vec![1u8; (available - (4 << 20)) as usize]).unwrap();
    c.abort();
    let st = reg.state.clone();
    eventually("the connection closed", || st.closed.load(Ordering::SeqCst)).await;
    eventually("the partial over the cap deleted", || partials(&store).is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pull_leaves_no_orphan_blobs() {
    let reg = Hostile::start().await;
    let good = b"a layer blob that is fine".to_vec();
    let gd = Digest::of(&good);
    let missing = Digest::of(b"a layer the registry does not have");
    let config = reg.image(&[(gd.clone(), good.len() as u64), (missing.clone(), 10)]);
    reg.route(
        &format!("/v2/hostile/blobs/{gd}"),
        Resp::Doc {
            content_type: "application/octet-stream".into(),
            body: good,
        },
    );
    let t = tempfile::tempdir().unwrap();
    let store = store_in(t.path());
    let err = puller(&store, DiskReserve::default())
        .pull(&reg.reference(), &[], None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("blob unknown to registry"), "{err}");
    assert_eq!(reg.blob_requests(&config), 1, "the config was downloaded");
    eventually("the config and the good layer removed", || blobs(&store).is_empty()).await;

    // A blob another pull (here: a pin, as a pull under way holds) still needs stays.
    store.pin_blob(&config);
    puller(&store, DiskReserve::default())
        .pull(&reg.reference(), &[], None)
        .await
        .unwrap_err();
    assert_eq!(reg.blob_requests(&config), 2);
    eventually("the good layer removed", || {
        !blobs(&store).contains(&gd.hex().to_string())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(blobs(&store), vec![config.hex().to_string()]);
    store.unpin_blob(&config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_of_ten_thousand_foreign_platforms_gives_a_short_error() {
    let reg = Hostile::start().await;
    let entries: Vec<serde_json::Value> = (0..10_000)
        .map(|i| {
            serde_json::json!({"mediaType": OCI_MANIFEST, "digest": Digest::of(format!("m{i}").as_bytes()).to_string(),
                "size": 500, "platform": {"os": "linux", "architecture": format!("hostile{i}"), "variant": "v".repeat(50)}})
        })
        .collect();
    let body = serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
        .to_string()
        .into_bytes();
    reg.route(
        "/v2/hostile/manifests/1",
        Resp::Doc {
            content_type: OCI_INDEX.into(),
            body,
        },
    );
    let t = tempfile::tempdir().unwrap();
    let store = store_in(t.path());
    let err = puller(&store, DiskReserve::default())
        .pull(&reg.reference(), &[], None)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.len() < 1024, "{} bytes: {err}", err.len());
    assert!(err.contains("no match for platform in manifest"), "{err}");
    assert!(err.contains("and 9992 more"), "{err}");
}
