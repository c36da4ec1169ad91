//! Image pulls from real registries: Debian's docker-registry (distribution 2.8) on loopback,
//! plain, TLS with a test CA and htpasswd, or token auth with a token server of the test's own
//! (common/registry.rs); images pushed with skopeo from the archives images/build-*.sh build.
//! Through the CLI (`ferrolet images pull`) and through static pods on a standalone agent.
//! Without docker-registry, skopeo or the built images every test is skipped with a loud notice.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::registry::*;
use common::*;
use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::image::ImageStore;
use libtest_mimic::{Arguments, Trial};

const T: Duration = Duration::from_secs(60);

fn test(name: &'static str, f: fn()) -> Trial {
    common::trial(name, f)
}

fn main() {
    let args = Arguments::from_args();
    let tests = vec![
        test(
            "harness_proxy_cuts_logs_and_goes_down",
            harness_proxy_cuts_logs_and_goes_down,
        ),
        test("cli_pull_by_tag_and_by_digest", cli_pull_by_tag_and_by_digest),
        test(
            "cli_client_certificate_from_registries_yaml",
            cli_client_certificate_from_registries_yaml,
        ),
        test("cli_index_picks_the_platform", cli_index_picks_the_platform),
        test(
            "cli_layer_of_the_demo_image_is_not_fetched",
            cli_layer_of_the_demo_image_is_not_fetched,
        ),
        test("cli_token_auth", cli_token_auth),
        test(
            "cli_basic_auth_over_tls_with_the_test_ca",
            cli_basic_auth_over_tls_with_the_test_ca,
        ),
        test(
            "cli_mirror_first_then_upstream_and_rewrite",
            cli_mirror_first_then_upstream_and_rewrite,
        ),
        test("cli_interrupted_layer_is_resumed", cli_interrupted_layer_is_resumed),
        test("cli_tampered_blob_is_refused", cli_tampered_blob_is_refused),
        test(
            "pod_pull_policies_events_and_image_id",
            pod_pull_policies_events_and_image_id,
        ),
        test(
            "pod_auth_errors_back_off_and_pull_secrets",
            pod_auth_errors_back_off_and_pull_secrets,
        ),
        test("pod_image_gc_keeps_images_in_use", pod_image_gc_keeps_images_in_use),
        test("pod_registry_pull_qps", pod_registry_pull_qps),
        test(
            "pod_token_auth_from_a_credential_provider_plugin",
            pod_token_auth_from_a_credential_provider_plugin,
        ),
        test(
            "pod_stalled_download_times_out_then_resumes",
            pod_stalled_download_times_out_then_resumes,
        ),
    ];
    if args.list {
        libtest_mimic::run(&args, tests).exit();
    }
    assert!(
        nix::unistd::geteuid().is_root(),
        "the registry tests run real pods and need root"
    );
    if let Some(why) = tools_missing().or_else(images_missing) {
        eprintln!("\n!!! SKIPPING the registry tests: {why} !!!\n");
        libtest_mimic::run(&args, tests.into_iter().map(|t| t.with_ignored_flag(true)).collect()).exit();
    }
    libtest_mimic::run(&args, tests).exit();
}

// ---- helpers

fn archive(name: &str) -> PathBuf {
    images_dir().join(name)
}

/// A fresh root dir for CLI pulls (removed on drop).
fn root() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("ferrolet-pull-").tempdir().unwrap()
}

fn ferrolet(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run ferrolet")
}

/// `ferrolet images pull REF --root-dir ROOT ARGS...`
fn pull(root: &Path, reference: &str, args: &[&str]) -> Output {
    let mut a = vec!["images", "pull", reference, "--root-dir", root.to_str().unwrap()];
    a.extend_from_slice(args);
    ferrolet(&a)
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[track_caller]
fn pull_ok(root: &Path, reference: &str, args: &[&str]) -> String {
    let o = pull(root, reference, args);
    assert!(o.status.success(), "pull {reference} {args:?} failed:\n{}", text(&o));
    String::from_utf8_lossy(&o.stdout).to_string()
}

#[track_caller]
fn pull_fails(root: &Path, reference: &str, args: &[&str]) -> String {
    let o = pull(root, reference, args);
    assert!(
        !o.status.success(),
        "pull {reference} {args:?} should fail:\n{}",
        text(&o)
    );
    String::from_utf8_lossy(&o.stderr).to_string() + &String::from_utf8_lossy(&o.stdout)
}

fn store(root: &Path) -> ImageStore {
    ImageStore::open(root.join("images")).unwrap()
}

fn write_file(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

/// GOARCH of this machine.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn manifest_gets(reg_requests: &[String], repo: &str) -> usize {
    reg_requests
        .iter()
        .filter(|r| r.contains(&format!("/v2/{repo}/manifests/")))
        .count()
}

/// A raw HTTP/1.1 GET (Connection: close) with extra header lines; the whole answer as read
/// until the peer closed, and whether reading ended cleanly.
fn raw_get(host: &str, path: &str, extra: &str) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(host)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    Ok(buf)
}

/// The proxy the resume and mirror tests rely on, checked with a plain client: it logs request
/// heads, cuts one response after N bytes, passes a Range request through, and refuses
/// connections while down.
fn harness_proxy_cuts_logs_and_goes_down() {
    let r = Registry::plain("harness");
    r.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    let two = OciArchive::open(&archive("two.oci.tar"));
    let (_, layers) = two.image(&two.top());
    let size = std::fs::metadata(r.blob_file(&layers[0])).unwrap().len();
    let proxy = Proxy::start(r.port);
    let path = format!("/v2/demo/two/blobs/{}", layers[0]);
    proxy.cut_once(&layers[0], 100_000);
    let got = raw_get(&proxy.host(), &path, "").unwrap_or_default();
    assert_eq!(got.len(), 100_000, "cut after 100000 bytes");
    assert_eq!(proxy.cuts_done(), 1);
    let whole = raw_get(&proxy.host(), &path, "Range: bytes=5000-\r\n").unwrap();
    let head_end = whole.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&whole[..head_end]);
    assert!(head.starts_with("HTTP/1.1 206"), "{head}");
    assert_eq!((whole.len() - head_end - 4) as u64, size - 5000);
    let logged = proxy.requests();
    assert_eq!(logged.len(), 2, "{logged:#?}");
    assert!(logged[1].contains("Range: bytes=5000-"), "{logged:#?}");
    proxy.set_down(true);
    assert!(
        std::net::TcpStream::connect(proxy.host()).is_err(),
        "refused while down"
    );
    proxy.set_down(false);
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(proxy.host()).is_err() {
        assert!(Instant::now() < deadline, "the proxy came back");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The token flow as distribution verifies it: skopeo pushes through it.
    let t = Registry::start("harness-token", false, Auth::Token);
    t.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    let reqs = t.tokens.as_ref().unwrap().requests();
    assert!(
        reqs.iter()
            .any(|q| q.status == 200 && q.scopes.iter().any(|s| s == "repository:demo/two:pull,push")),
        "{reqs:#?}"
    );
}

// ---- CLI tests

fn cli_pull_by_tag_and_by_digest() {
    let r = Registry::plain("tag");
    r.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    r.push(&archive("two.oci.tar"), "1", "demo/two-docker:1", false, Some("v2s2"));
    let two = OciArchive::open(&archive("two.oci.tar"));
    let (config, layers) = two.image(&two.top());
    let digest = r.digest_of("demo/two:1");
    assert_eq!(digest, two.top(), "skopeo kept the manifest as built");

    let dir = root();
    let reference = format!("{}/demo/two:1", r.host());
    let o = pull(dir.path(), &reference, &[]);
    assert!(o.status.success(), "{}", text(&o));
    // Not a terminal: one plain line per step on stderr, per layer.
    let steps = String::from_utf8_lossy(&o.stderr);
    for l in &layers {
        let short = &l["sha256:".len().."sha256:".len() + 12];
        assert!(steps.contains(&format!("{short}: downloaded")), "{}", text(&o));
    }
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains(&config), "the CLI prints the image id {config}:\n{out}");
    let rec = store(dir.path())
        .find(&reference)
        .expect("the pulled image is in the store");
    assert_eq!(rec.id.to_string(), config);
    assert_eq!(
        rec.manifest.to_string(),
        digest,
        "the manifest digest the registry reports"
    );
    let have: Vec<String> = rec.layers.iter().map(|l| l.digest.to_string()).collect();
    assert_eq!(have, layers);
    for l in &layers {
        assert_eq!(r.blob_gets(l), 1, "layer {l} fetched once:\n{:#?}", r.requests());
    }
    // Layers in the store are never fetched again: a second pull reads the manifest only.
    pull_ok(dir.path(), &reference, &[]);
    for l in &layers {
        assert_eq!(r.blob_gets(l), 1, "layer {l} fetched again:\n{:#?}", r.requests());
    }
    // By digest: same image, recorded under repo@digest.
    let by_digest = format!("{}/demo/two@{digest}", r.host());
    let fresh = root();
    let out = pull_ok(fresh.path(), &by_digest, &[]);
    assert!(out.contains(&config), "{out}");
    let rec = store(fresh.path()).find(&by_digest).expect("found by digest");
    assert_eq!(rec.id.to_string(), config);
    assert!(
        r.requests()
            .iter()
            .any(|q| q.contains(&format!("/v2/demo/two/manifests/{digest}"))),
        "the manifest was asked for by digest: {:#?}",
        r.requests()
    );
    // Docker's schema 2 media types (skopeo converts): same layers, already in the first store.
    let fetched: Vec<usize> = layers.iter().map(|l| r.blob_gets(l)).collect();
    let docker_ref = format!("{}/demo/two-docker:1", r.host());
    pull_ok(dir.path(), &docker_ref, &[]);
    let rec = store(dir.path())
        .find(&docker_ref)
        .expect("docker schema 2 image in the store");
    assert_eq!(rec.manifest.to_string(), r.digest_of("demo/two-docker:1"));
    let have: Vec<String> = rec.layers.iter().map(|l| l.digest.to_string()).collect();
    assert_eq!(have, layers);
    let now: Vec<usize> = layers.iter().map(|l| r.blob_gets(l)).collect();
    assert_eq!(now, fetched, "the layers are in the store: {:#?}", r.requests());
    // A tag the registry does not have: its own words.
    let err = pull_fails(fresh.path(), &format!("{}/demo/two:nope", r.host()), &[]);
    assert!(err.contains("manifest unknown"), "{err}");
}

fn cli_index_picks_the_platform() {
    let r = Registry::plain("index");
    r.push(&archive("multi.oci.tar"), "1", "demo/multi:1", true, None);
    let multi = OciArchive::open(&archive("multi.oci.tar"));
    let index = multi.top();
    assert_eq!(r.digest_of("demo/multi:1"), index);
    let platforms = multi.platforms(&index);
    let native = platforms
        .iter()
        .find(|(p, _)| p.split('/').nth(1) == Some(host_arch()))
        .map(|(_, d)| d.clone())
        .expect("the index has this machine's architecture");
    let (native_config, native_layers) = multi.image(&native);
    let (arm_config, arm_layers) = multi.image(&platforms["linux/arm64/v8"]);

    let a = root();
    let reference = format!("{}/demo/multi:1", r.host());
    let out = pull_ok(a.path(), &reference, &[]);
    assert!(out.contains(&native_config), "{out}");
    let img = store(a.path()).resolve(&reference).unwrap();
    assert_eq!(img.config.architecture().to_string(), host_arch());
    for l in &arm_layers {
        assert_eq!(r.blob_gets(l), 0, "the other platform's layer {l} was fetched");
    }
    // Another platform asked for explicitly.
    let b = root();
    let out = pull_ok(b.path(), &reference, &["--platform", "linux/arm64"]);
    assert!(out.contains(&arm_config), "{out}");
    let img = store(b.path()).resolve(&reference).unwrap();
    assert_eq!(img.record.id.to_string(), arm_config);
    assert_eq!(img.config.architecture().to_string(), "arm64");
    for l in &arm_layers {
        assert_eq!(r.blob_gets(l), 1, "{l}");
    }
    for l in native_layers.iter().filter(|l| !arm_layers.contains(l)) {
        assert_eq!(r.blob_gets(l), 1, "{l} fetched by the first pull only");
    }
    // The arm64 layer holds Debian's arm64 busybox (an aarch64 ELF).
    let bb = img.layer_dirs[0].join("bin/busybox");
    let head = std::fs::read(&bb).unwrap();
    assert_eq!(&head[..4], b"\x7fELF");
    assert_eq!(u16::from_le_bytes([head[18], head[19]]), 183, "e_machine EM_AARCH64");
    let err = pull_fails(root().path(), &reference, &["--platform", "linux/s390x"]);
    assert!(err.contains("s390x"), "{err}");
}

fn cli_layer_of_the_demo_image_is_not_fetched() {
    let r = Registry::plain("shared");
    r.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    let two = OciArchive::open(&archive("two.oci.tar"));
    let (_, layers) = two.image(&two.top());
    let dir = root();
    let o = ferrolet(&[
        "images",
        "import",
        "--root-dir",
        dir.path().to_str().unwrap(),
        archive("busybox.oci.tar").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    pull_ok(dir.path(), &format!("{}/demo/two:1", r.host()), &[]);
    assert_eq!(r.blob_gets(&layers[0]), 0, "the busybox layer is in the store already");
    assert_eq!(r.blob_gets(&layers[1]), 1);
    // Both images share the layer; prune (no containers here) removes both and the layer.
    let st = store(dir.path());
    assert_eq!(st.list().unwrap().len(), 2);
    let o = ferrolet(&["images", "prune", "--root-dir", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        said.contains("demo/two") && said.contains("busybox"),
        "prune says what it removed:\n{said}"
    );
    assert!(st.list().unwrap().is_empty());
    assert!(
        !st.blob_path(&Digest::parse(&layers[0]).unwrap()).exists(),
        "the shared layer went with its last image"
    );
}

fn cli_token_auth() {
    let r = Registry::start("token", false, Auth::Token);
    r.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    let tokens = r.tokens.as_ref().unwrap();
    let before = tokens.requests().len();
    let reference = format!("{}/demo/two:1", r.host());
    // Anonymous: the token server gives a token without access; the registry says no.
    let err = pull_fails(root().path(), &reference, &[]);
    assert!(
        err.contains("authentication required") || err.contains("insufficient"),
        "{err}"
    );
    assert!(err.contains("401"), "{err}");
    // Wrong password: the token server refuses.
    let err = pull_fails(root().path(), &reference, &["--creds", &format!("{USER}:wrong")]);
    assert!(
        err.contains("401") || err.contains("invalid username or password"),
        "{err}"
    );
    // Right password: a token for repository:demo/two:pull.
    let dir = root();
    pull_ok(dir.path(), &reference, &["--creds", &format!("{USER}:{PASSWORD}")]);
    assert!(store(dir.path()).find(&reference).is_ok());
    let reqs = tokens.requests();
    let ours = &reqs[before..];
    assert!(
        ours.iter().any(|t| t.status == 200
            && t.account.as_deref() == Some(USER)
            && t.service == tokens.service
            && t.scopes.iter().any(|s| s == "repository:demo/two:pull")),
        "no token asked for with the account, service and pull scope: {ours:#?}"
    );
    // The same through a docker config.json (`--docker-config`).
    let cfgdir = root();
    let cfg = write_file(
        cfgdir.path(),
        "config.json",
        &format!(
            "{{\"auths\": {{\"{}\": {{\"auth\": \"{}\"}}}}}}",
            r.host(),
            b64(&format!("{USER}:{PASSWORD}"))
        ),
    );
    let d2 = root();
    pull_ok(d2.path(), &reference, &["--docker-config", cfg.to_str().unwrap()]);
    // ... and the node's, <root-dir>/config.json, with no flag.
    let d3 = root();
    std::fs::copy(&cfg, d3.path().join("config.json")).unwrap();
    pull_ok(d3.path(), &reference, &[]);
}

/// `tls.cert_file` / `key_file` of registries.yaml: a registry that asks for a client
/// certificate refuses the handshake without one and serves the pull with it.
fn cli_client_certificate_from_registries_yaml() {
    let r = Registry::start_mtls("mtls");
    r.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    let reference = format!("{}/demo/two:1", r.host());
    let ca = r.ca_file.clone().unwrap();
    let (cert, key) = r.client_cert();
    let cfgdir = root();
    let ca_only = write_file(
        cfgdir.path(),
        "ca.yaml",
        &format!(
            "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n",
            r.host(),
            ca.display()
        ),
    );
    let with_cert = write_file(
        cfgdir.path(),
        "mtls.yaml",
        &format!(
            "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n      cert_file: {}\n      key_file: {}\n",
            r.host(),
            ca.display(),
            cert.display(),
            key.display()
        ),
    );
    let err = pull_fails(
        root().path(),
        &reference,
        &["--registry-config", ca_only.to_str().unwrap()],
    );
    // The registry's TLS alert (Go's server says bad_certificate), with the endpoint.
    assert!(
        err.contains(&r.host()) && err.to_lowercase().contains("certificate"),
        "{err}"
    );
    let dir = root();
    pull_ok(
        dir.path(),
        &reference,
        &["--registry-config", with_cert.to_str().unwrap()],
    );
    assert!(store(dir.path()).find(&reference).is_ok());
}

fn cli_basic_auth_over_tls_with_the_test_ca() {
    let r = Registry::start("tls", true, Auth::Basic);
    r.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    let reference = format!("{}/demo/two:1", r.host());
    let ca = r.ca_file.clone().unwrap();
    let cfgdir = root();
    let with_auth = write_file(
        cfgdir.path(),
        "auth.yaml",
        &format!(
            "configs:\n  \"{}\":\n    auth:\n      username: {USER}\n      password: {PASSWORD}\n    tls:\n      ca_file: {}\n",
            r.host(),
            ca.display()
        ),
    );
    let tls_only = write_file(
        cfgdir.path(),
        "tls.yaml",
        &format!(
            "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n",
            r.host(),
            ca.display()
        ),
    );
    let dir = root();
    pull_ok(
        dir.path(),
        &reference,
        &["--registry-config", with_auth.to_str().unwrap()],
    );
    assert!(store(dir.path()).find(&reference).is_ok());
    // The registry's own words for a wrong password, and the endpoint.
    let err = pull_fails(
        root().path(),
        &reference,
        &[
            "--registry-config",
            tls_only.to_str().unwrap(),
            "--creds",
            &format!("{USER}:wrong"),
        ],
    );
    assert!(err.contains("authentication required"), "{err}");
    assert!(err.contains(&r.host()), "{err}");
    // No credentials at all.
    let err = pull_fails(
        root().path(),
        &reference,
        &["--registry-config", tls_only.to_str().unwrap()],
    );
    assert!(err.contains("authentication required"), "{err}");
    // Credentials from the command line.
    pull_ok(
        root().path(),
        &reference,
        &[
            "--registry-config",
            tls_only.to_str().unwrap(),
            "--creds",
            &format!("{USER}:{PASSWORD}"),
        ],
    );
    // A CA that did not sign the registry's certificate: not trusted.
    let other = TestCa::new("another");
    let other_ca = write_file(cfgdir.path(), "other-ca.pem", &other.ca_pem);
    let wrong_ca = write_file(
        cfgdir.path(),
        "wrong-ca.yaml",
        &format!(
            "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n",
            r.host(),
            other_ca.display()
        ),
    );
    let err = pull_fails(
        root().path(),
        &reference,
        &[
            "--registry-config",
            wrong_ca.to_str().unwrap(),
            "--creds",
            &format!("{USER}:{PASSWORD}"),
        ],
    );
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // No TLS configuration: loopback may fall back to plain HTTP (as containerd does for
    // localhost), which this server refuses; either way no pull.
    let err = pull_fails(root().path(), &reference, &["--creds", &format!("{USER}:{PASSWORD}")]);
    assert!(
        err.to_lowercase().contains("certificate") || err.contains("HTTP request to an HTTPS server"),
        "{err}"
    );
}

fn cli_mirror_first_then_upstream_and_rewrite() {
    let up = Registry::plain("upstream");
    let mirror = Registry::plain("mirror");
    let proxy = Proxy::start(mirror.port);
    up.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    mirror.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    mirror.push(&archive("multi.oci.tar"), "1", "mirrored/only:1", true, None);
    let cfgdir = root();
    let cfg = write_file(
        cfgdir.path(),
        "registries.yaml",
        &format!(
            "mirrors:\n  \"{}\":\n    endpoint:\n      - \"http://{}\"\n",
            up.host(),
            proxy.host()
        ),
    );
    let reference = format!("{}/demo/two:1", up.host());
    let a = root();
    pull_ok(a.path(), &reference, &["--registry-config", cfg.to_str().unwrap()]);
    let via_mirror = proxy.requests();
    assert!(
        via_mirror.iter().any(|h| h.contains("/v2/demo/two/manifests/1")),
        "the mirror was asked first: {via_mirror:#?}"
    );
    assert_eq!(
        manifest_gets(&up.requests(), "demo/two"),
        0,
        "upstream untouched: {:#?}",
        up.requests()
    );
    assert!(
        store(a.path()).find(&reference).is_ok(),
        "recorded under the name asked for"
    );
    // The mirror is down: upstream serves.
    proxy.set_down(true);
    let b = root();
    pull_ok(b.path(), &reference, &["--registry-config", cfg.to_str().unwrap()]);
    assert!(
        manifest_gets(&up.requests(), "demo/two") >= 1,
        "fell back to upstream: {:#?}",
        up.requests()
    );
    proxy.set_down(false);
    // A rewrite: demo/X on the mirror is mirrored/X; demo/only exists on the mirror only.
    let rw = write_file(
        cfgdir.path(),
        "rewrite.yaml",
        &format!(
            "mirrors:\n  \"{}\":\n    endpoint:\n      - \"http://{}\"\n    rewrite:\n      \"^demo/(.*)\": \"mirrored/$1\"\n",
            up.host(),
            proxy.host()
        ),
    );
    let only = format!("{}/demo/only:1", up.host());
    let c = root();
    pull_ok(c.path(), &only, &["--registry-config", rw.to_str().unwrap()]);
    assert!(
        proxy
            .requests()
            .iter()
            .any(|h| h.contains("/v2/mirrored/only/manifests/1")),
        "{:#?}",
        proxy.requests()
    );
    assert!(
        store(c.path()).find(&only).is_ok(),
        "recorded under the name asked for, not the rewritten one"
    );
    assert_eq!(manifest_gets(&up.requests(), "demo/only"), 0);
    // Docker Hub names through a mirror for docker.io (library/ added), and "*" for any
    // registry: neither upstream is asked (example.invalid does not even resolve).
    mirror.push(&archive("two.oci.tar"), "1", "library/two:1", false, None);
    let hub = write_file(
        cfgdir.path(),
        "hub.yaml",
        &format!(
            "mirrors:\n  docker.io:\n    endpoint:\n      - \"http://{}\"\n  \"*\":\n    endpoint:\n      - \"http://{}\"\n",
            proxy.host(),
            proxy.host()
        ),
    );
    let d = root();
    pull_ok(d.path(), "two:1", &["--registry-config", hub.to_str().unwrap()]);
    assert!(store(d.path()).find("docker.io/library/two:1").is_ok());
    assert!(proxy
        .requests()
        .iter()
        .any(|h| h.contains("/v2/library/two/manifests/1")));
    pull_ok(
        d.path(),
        "example.invalid/demo/two:1",
        &["--registry-config", hub.to_str().unwrap()],
    );
    assert!(store(d.path()).find("example.invalid/demo/two:1").is_ok());
    // A bad registries.yaml: the error names the file and the field.
    let bad = write_file(
        cfgdir.path(),
        "bad.yaml",
        &format!("mirrors:\n  \"{}\":\n    endpoint: 5\n", up.host()),
    );
    let err = pull_fails(root().path(), &reference, &["--registry-config", bad.to_str().unwrap()]);
    assert!(err.contains("bad.yaml") && err.contains("endpoint"), "{err}");
}

fn cli_interrupted_layer_is_resumed() {
    let r = Registry::plain("resume");
    r.push(&archive("multi.oci.tar"), "1", "demo/multi:1", true, None);
    let multi = OciArchive::open(&archive("multi.oci.tar"));
    let platforms = multi.platforms(&multi.top());
    let (_, arm_layers) = multi.image(&platforms["linux/arm64/v8"]);
    // The arm64 busybox layer (~800 kB): cut after 200 kB of its response.
    let big = arm_layers[0].clone();
    let size = std::fs::metadata(r.blob_file(&big)).unwrap().len();
    assert!(size > 400_000, "{size}");
    let proxy = Proxy::start(r.port);
    proxy.cut_once(&format!("/blobs/{big}"), 200_000);
    let dir = root();
    let reference = format!("{}/demo/multi:1", proxy.host());
    let first = pull(dir.path(), &reference, &["--platform", "linux/arm64"]);
    if !first.status.success() {
        // Resumed by the next attempt.
        pull_ok(dir.path(), &reference, &["--platform", "linux/arm64"]);
    }
    assert_eq!(proxy.cuts_done(), 1, "the download was cut");
    let gets: Vec<String> = proxy
        .requests()
        .into_iter()
        .filter(|h| h.starts_with("GET ") && h.contains(&format!("/blobs/{big}")))
        .collect();
    assert!(gets.len() >= 2, "{gets:#?}");
    let resumed_from: Vec<u64> = gets[1..]
        .iter()
        .filter_map(|h| {
            h.lines()
                .find(|l| l.to_ascii_lowercase().starts_with("range:"))
                .and_then(|l| l.split_once("bytes=")?.1.split('-').next()?.trim().parse().ok())
        })
        .collect();
    assert!(
        resumed_from.iter().any(|&n| n > 0 && n <= 200_000),
        "a later GET asks for the rest with Range: bytes=N- (0 < N <= 200000): {gets:#?}\nfirst attempt:\n{}",
        text(&first)
    );
    let rec = store(dir.path()).find(&reference).expect("pulled in the end");
    assert!(rec.layers.iter().any(|l| l.digest.to_string() == big));
}

fn cli_tampered_blob_is_refused() {
    let r = Registry::plain("tamper");
    r.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    let two = OciArchive::open(&archive("two.oci.tar"));
    let (_, layers) = two.image(&two.top());
    let blob = r.blob_file(&layers[1]);
    let good = std::fs::read(&blob).unwrap();
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    std::fs::write(&blob, &bad).unwrap();
    let dir = root();
    let reference = format!("{}/demo/two:1", r.host());
    let err = pull_fails(dir.path(), &reference, &[]);
    assert!(
        err.contains(&layers[1]) || err.to_lowercase().contains("digest"),
        "{err}"
    );
    assert!(store(dir.path()).find(&reference).is_err(), "no image from a bad blob");
    let blob_in_store = store(dir.path()).blob_path(&Digest::parse(&layers[1]).unwrap());
    assert!(!blob_in_store.exists(), "the bad blob was not kept");
    // Longer than the manifest says: refused too.
    let mut long = good.clone();
    long.extend_from_slice(b"trailing bytes");
    std::fs::write(&blob, &long).unwrap();
    let err = pull_fails(dir.path(), &reference, &[]);
    assert!(!err.is_empty());
    assert!(store(dir.path()).find(&reference).is_err());
    // Repaired: the pull works, nothing bad was kept.
    std::fs::write(&blob, &good).unwrap();
    pull_ok(dir.path(), &reference, &[]);
}

// ---- agent tests

fn registries_config(a_dir: &Path, yaml: &str) -> String {
    let p = write_file(a_dir, "registries.yaml", yaml);
    format!("registryConfigFile: {}\n", p.display())
}

fn pod(name: &str, image: &str, policy: &str, script: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{extra}  containers:\n  - name: c\n    image: {image}\n    imagePullPolicy: {policy}\n    command: [sh, -c, {script:?}]\n"
    )
}

fn pod_pull_policies_events_and_image_id() {
    let r = Registry::plain("policies");
    r.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    r.push(&archive("multi.oci.tar"), "1", "demo/multi:1", true, None);
    let two = OciArchive::open(&archive("two.oci.tar"));
    let (_, layers) = two.image(&two.top());
    let image = format!("{}/demo/two:1", r.host());
    let a = Agent::start_with_config("regpolicy", &[], "serializeImagePulls: false\n");
    // Two pods with the same image at once: one fetch of each blob.
    a.write(
        "always.yaml",
        &pod("always", &image, "Always", "cat /etc/two-release; sleep 3600", ""),
    );
    a.write("twin.yaml", &pod("twin", &image, "Always", "sleep 3600", ""));
    a.write(
        "never.yaml",
        &pod("never", &format!("{}/demo/absent:1", r.host()), "Never", "true", ""),
    );
    let p = a.wait_phase("always", "Running", T);
    a.wait_phase("twin", "Running", T);
    let st = container_status(&p, "c");
    assert_eq!(st.image, image);
    assert_eq!(
        st.image_id,
        format!("{}/demo/two@{}", r.host(), r.digest_of("demo/two:1"))
    );
    a.wait_logs("always", "", "two 1");
    // The busybox layer came with the demo image; the other is fetched once for both pods.
    assert_eq!(r.blob_gets(&layers[0]), 0, "{:#?}", r.requests());
    assert_eq!(
        r.blob_gets(&layers[1]),
        1,
        "fetched once for two pods: {:#?}",
        r.requests()
    );
    let log = a.agent_log();
    assert!(
        log.contains(&format!("Pulling image \\\"{image}\\\"")) || log.contains(&format!("Pulling image \"{image}\"")),
        "Pulling event:\n{}",
        tail(&log, 40)
    );
    assert!(
        log.contains("Successfully pulled image") && log.contains("Image size:"),
        "Pulled event:\n{}",
        tail(&log, 40)
    );
    let p = a.wait_for("never", "ErrImageNeverPull", T, |p| {
        waiting_reason(p, "c").as_deref() == Some("ErrImageNeverPull")
    });
    assert!(waiting_message(&p, "c").unwrap().contains("demo/absent:1"));
    assert_eq!(
        manifest_gets(&r.requests(), "demo/absent"),
        0,
        "Never does not ask the registry"
    );
    // IfNotPresent: present, so no registry request.
    let manifests = manifest_gets(&r.requests(), "demo/two");
    a.write("ifnp.yaml", &pod("ifnp", &image, "IfNotPresent", "sleep 3600", ""));
    a.wait_phase("ifnp", "Running", T);
    assert_eq!(
        manifest_gets(&r.requests(), "demo/two"),
        manifests,
        "IfNotPresent asked the registry"
    );
    assert!(a.agent_log().contains("already present on machine"));
    // Always: the registry is asked again, the blobs are not fetched again.
    a.write("again.yaml", &pod("again", &image, "Always", "sleep 3600", ""));
    a.wait_phase("again", "Running", T);
    assert!(
        manifest_gets(&r.requests(), "demo/two") > manifests,
        "Always asks the registry"
    );
    assert_eq!(
        (r.blob_gets(&layers[0]), r.blob_gets(&layers[1])),
        (0, 1),
        "no blob again"
    );
    // An index: this machine's platform, imageID names the index digest the registry reports.
    let multi = format!("{}/demo/multi:1", r.host());
    a.write(
        "multi.yaml",
        &pod("multi", &multi, "IfNotPresent", "cat /etc/platform; sleep 3600", ""),
    );
    let p = a.wait_phase("multi", "Running", T);
    assert_eq!(
        container_status(&p, "c").image_id,
        format!("{}/demo/multi@{}", r.host(), r.digest_of("demo/multi:1"))
    );
    a.wait_logs("multi", "", &format!("linux/{}", host_arch()));
    // `ferrolet images ls` shows them with size and last use.
    let o = ferrolet(&["images", "ls", "--root-dir", a.root.to_str().unwrap()]);
    let ls = String::from_utf8_lossy(&o.stdout);
    assert!(ls.contains("SIZE") && ls.contains("LAST USED"), "{}", text(&o));
    for repo in ["demo/two", "demo/multi"] {
        assert!(ls.contains(&format!("{}/{repo}", r.host())), "{}", text(&o));
    }
}

fn dockerconfigjson_secret(name: &str, host: &str, user: &str, password: &str) -> String {
    let json = format!(
        "{{\"auths\":{{\"{host}\":{{\"auth\":\"{}\"}}}}}}",
        b64(&format!("{user}:{password}"))
    );
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: default}}\ntype: kubernetes.io/dockerconfigjson\ndata:\n  .dockerconfigjson: {}\n",
        b64(&json)
    )
}

fn pod_auth_errors_back_off_and_pull_secrets() {
    let r = Registry::start("podauth", true, Auth::Basic);
    for repo in ["demo/two:1", "demo/v1:1", "demo/reload:1"] {
        r.push(&archive("two.oci.tar"), "1", repo, false, None);
    }
    let image = format!("{}/demo/two:1", r.host());
    let cfgdir = root();
    let tls = format!(
        "configs:\n  \"{}\":\n    tls:\n      ca_file: {}\n",
        r.host(),
        r.ca_file.as_ref().unwrap().display()
    );
    let config = registries_config(cfgdir.path(), &tls);
    let a = Agent::start_with_config("regauth", &[], &config);
    let host = r.host();
    a.write(
        "regcred.yaml",
        &dockerconfigjson_secret("regcred", &host, USER, PASSWORD),
    );
    a.write(
        "badcred.yaml",
        &dockerconfigjson_secret("badcred", &host, USER, "wrong"),
    );
    // kubelet's keyring: scheme and a leading /v1/ dropped (the whole host), a path scopes
    a.write(
        "v1cred.yaml",
        &dockerconfigjson_secret("v1cred", &format!("https://{host}/v1/"), USER, PASSWORD),
    );
    a.write(
        "othercred.yaml",
        &dockerconfigjson_secret("othercred", &format!("{host}/other"), USER, PASSWORD),
    );
    let with = |secret: &str| format!("  imagePullSecrets: [{{name: {secret}}}]\n");
    a.write("noauth.yaml", &pod("noauth", &image, "IfNotPresent", "sleep 3600", ""));
    a.write(
        "badsecret.yaml",
        &pod("badsecret", &image, "Always", "sleep 3600", &with("badcred")),
    );
    a.write(
        "otherpath.yaml",
        &pod("otherpath", &image, "Always", "sleep 3600", &with("othercred")),
    );
    a.write(
        "v1key.yaml",
        &pod(
            "v1key",
            &format!("{host}/demo/v1:1"),
            "Always",
            "sleep 3600",
            &with("v1cred"),
        ),
    );
    let reload_image = format!("{host}/demo/reload:1");
    a.write(
        "reload.yaml",
        &pod("reload", &reload_image, "IfNotPresent", "sleep 3600", ""),
    );
    // No credentials: ErrImagePull with the registry's words, then ImagePullBackOff.
    let p = a.wait_for("noauth", "ErrImagePull", T, |p| {
        waiting_reason(p, "c").as_deref() == Some("ErrImagePull")
    });
    let msg = waiting_message(&p, "c").unwrap();
    assert!(msg.contains("authentication required") && msg.contains(&image), "{msg}");
    let p = a.wait_for("noauth", "ImagePullBackOff", T, |p| {
        waiting_reason(p, "c").as_deref() == Some("ImagePullBackOff")
    });
    let msg = waiting_message(&p, "c").unwrap();
    assert!(msg.contains("Back-off pulling image") && msg.contains(&image), "{msg}");
    // A wrong password in the pod's secret: the registry's words again.
    let pulled_with = |name: &str| {
        let p = a.wait_for(name, "ErrImagePull", T, |p| {
            waiting_reason(p, "c").as_deref() == Some("ErrImagePull")
        });
        waiting_message(&p, "c").unwrap()
    };
    let msg = pulled_with("badsecret");
    assert!(msg.contains("authentication required"), "{msg}");
    // A secret for another path of the registry does not apply.
    let msg = pulled_with("otherpath");
    assert!(msg.contains("authentication required"), "{msg}");
    // A docker-style https://host/v1/ key covers the host.
    a.wait_phase("v1key", "Running", T);
    let log = a.agent_log();
    assert!(
        log.contains("Failed to pull image"),
        "a Failed event:\n{}",
        tail(&log, 30)
    );
    // The right secret: pulls and runs.
    a.write(
        "withsecret.yaml",
        &pod(
            "withsecret",
            &image,
            "Always",
            "cat /etc/two-release; sleep 3600",
            &with("regcred"),
        ),
    );
    a.wait_phase("withsecret", "Running", T);
    a.wait_logs("withsecret", "", "two 1");
    // registries.yaml changes: credentials for the host; the next attempt uses them.
    assert_ne!(phase_of(a.pod("reload").as_ref()), Some("Running"));
    let path = cfgdir.path().join("registries.yaml");
    let tmp = cfgdir.path().join(".registries.yaml.tmp");
    std::fs::write(
        &tmp,
        format!("{tls}    auth:\n      username: {USER}\n      password: {PASSWORD}\n"),
    )
    .unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    a.wait_phase("reload", "Running", Duration::from_secs(90));
    // noauth (IfNotPresent) finds the image on the node when its back-off ends.
    a.wait_phase("noauth", "Running", Duration::from_secs(90));
}

/// kubelet's exec credential provider (credentialprovider.kubelet.k8s.io/v1) giving the
/// credentials for a token-auth registry: the plugin hears the image, the token server the
/// account.
fn pod_token_auth_from_a_credential_provider_plugin() {
    use std::os::unix::fs::PermissionsExt;
    let r = Registry::start("plugin", false, Auth::Token);
    r.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    let host = r.host();
    let dir = root();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let request = dir.path().join("request.json");
    let plugin = bin.join("test-provider");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\ncat > {}\nprintf '%s' '{{\"kind\":\"CredentialProviderResponse\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"cacheKeyType\":\"Registry\",\"cacheDuration\":\"60s\",\"auth\":{{\"{host}\":{{\"username\":\"{USER}\",\"password\":\"{PASSWORD}\"}}}}}}'\n",
            request.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = write_file(
        dir.path(),
        "providers.yaml",
        &format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: test-provider\n  matchImages: [\"{host}\"]\n  defaultCacheDuration: 1m\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n"
        ),
    );
    let a = Agent::start(
        "regplugin",
        &[
            "--image-credential-provider-config",
            cfg.to_str().unwrap(),
            "--image-credential-provider-bin-dir",
            bin.to_str().unwrap(),
        ],
    );
    let image = format!("{host}/demo/two:1");
    a.write(
        "plugin.yaml",
        &pod("plugin", &image, "Always", "cat /etc/two-release; sleep 3600", ""),
    );
    a.wait_phase("plugin", "Running", T);
    let req = std::fs::read_to_string(&request).expect("the plugin was run");
    let v: serde_json::Value = serde_json::from_str(&req).expect("a JSON request");
    assert_eq!(v["kind"], "CredentialProviderRequest", "{req}");
    // kubelet looks credentials up by the repository (parsers.ParseImageName's repoToPull)
    assert_eq!(v["image"], format!("{host}/demo/two").as_str(), "{req}");
    let tokens = r.tokens.as_ref().unwrap().requests();
    assert!(
        tokens.iter().any(|t| t.status == 200
            && t.account.as_deref() == Some(USER)
            && t.scopes.iter().any(|s| s == "repository:demo/two:pull")),
        "{tokens:#?}"
    );
}

/// registryPullQPS / registryBurst: as kubelet's throttled image service, a pull over the rate
/// fails at once ("pull QPS exceeded") and goes to back-off; all run in the end.
fn pod_registry_pull_qps() {
    let r = Registry::plain("qps");
    for repo in ["demo/q1:1", "demo/q2:1", "demo/q3:1"] {
        r.push(&archive("two.oci.tar"), "1", repo, false, None);
    }
    let a = Agent::start_with_config(
        "regqps",
        &[],
        "registryPullQPS: 1\nregistryBurst: 1\nserializeImagePulls: false\n",
    );
    let names = ["q1", "q2", "q3"];
    for n in names {
        let image = format!("{}/demo/{n}:1", r.host());
        a.write(&format!("{n}.yaml"), &pod(n, &image, "IfNotPresent", "sleep 3600", ""));
    }
    let deadline = Instant::now() + T;
    let mut seen = None;
    while seen.is_none() {
        assert!(Instant::now() < deadline, "no pull refused over the QPS");
        for p in a.pods() {
            if let Some(m) = waiting_message(&p, "c").filter(|m| m.contains("QPS exceeded")) {
                seen = Some((waiting_reason(&p, "c"), m));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (reason, msg) = seen.unwrap();
    assert!(
        matches!(reason.as_deref(), Some("ErrImagePull") | Some("ImagePullBackOff")),
        "{reason:?}: {msg}"
    );
    for n in names {
        a.wait_phase(n, "Running", Duration::from_secs(90));
    }
}

/// `imagePullProgressTimeout`: a layer download that stalls fails the pull (ErrImagePull); the
/// next attempt resumes it with a Range request.
fn pod_stalled_download_times_out_then_resumes() {
    let r = Registry::plain("stall");
    r.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    let two = OciArchive::open(&archive("two.oci.tar"));
    let (_, layers) = two.image(&two.top());
    let proxy = Proxy::start(r.port);
    let a = Agent::start_with_config("regstall", &[], "ferrolet:\n  imagePullProgressTimeout: 2s\n");
    // Without the demo image the busybox layer (1 MB) must come from the registry.
    let o = ferrolet(&["images", "prune", "--root-dir", a.root.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let big = Digest::parse(&layers[0]).unwrap();
    assert!(!store(&a.root).blob_path(&big).exists());
    proxy.stall_once(&format!("/blobs/{}", layers[0]), 300_000);
    let image = format!("{}/demo/two:1", proxy.host());
    let t0 = Instant::now();
    a.write(
        "stall.yaml",
        &pod("stall", &image, "IfNotPresent", "cat /etc/two-release; sleep 3600", ""),
    );
    let p = a.wait_for("stall", "ErrImagePull after the stall", T, |p| {
        waiting_reason(p, "c").as_deref() == Some("ErrImagePull")
    });
    let failed_after = t0.elapsed();
    let msg = waiting_message(&p, "c").unwrap();
    assert!(msg.contains(&image), "{msg}");
    assert!(
        failed_after >= Duration::from_secs(2),
        "failed after {failed_after:?}: {msg}"
    );
    assert_eq!(proxy.cuts_done(), 1);
    a.wait_phase("stall", "Running", Duration::from_secs(90));
    a.wait_logs("stall", "", "two 1");
    let gets: Vec<String> = proxy
        .requests()
        .into_iter()
        .filter(|h| h.starts_with("GET ") && h.contains(&format!("/blobs/{}", layers[0])))
        .collect();
    let resumed = gets[1..].iter().any(|h| {
        h.lines()
            .find(|l| l.to_ascii_lowercase().starts_with("range:"))
            .and_then(|l| l.split_once("bytes=")?.1.split('-').next()?.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0 && n <= 300_000)
    });
    assert!(resumed, "the next attempt resumes with a Range request: {gets:#?}");
}

fn pod_image_gc_keeps_images_in_use() {
    let r = Registry::plain("gc");
    r.push(&archive("two.oci.tar"), "1", "demo/two:1", false, None);
    r.push(&archive("multi.oci.tar"), "1", "demo/multi:1", true, None);
    let two = OciArchive::open(&archive("two.oci.tar"));
    let (two_config, two_layers) = two.image(&two.top());
    let m = OciArchive::open(&archive("multi.oci.tar"));
    let native = m
        .platforms(&m.top())
        .into_iter()
        .find(|(p, _)| p.split('/').nth(1) == Some(host_arch()))
        .unwrap()
        .1;
    let (_, multi_layers) = m.image(&native);
    let marker = multi_layers.iter().find(|l| !two_layers.contains(l)).unwrap().clone();
    let image = format!("{}/demo/two:1", r.host());
    let multi = format!("{}/demo/multi:1", r.host());
    let mut a = Agent::start("reggc", &[]);
    // two: a running container; the demo busybox: an exited container not yet removed.
    a.write("inuse.yaml", &pod("inuse", &image, "IfNotPresent", "sleep 3600", ""));
    a.write(
        "done.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: done}\nspec:\n  restartPolicy: Never\n  containers:\n  - {name: c, image: docker.io/library/busybox:1.35, command: [\"true\"]}\n",
    );
    let p = a.wait_phase("inuse", "Running", T);
    let cid = container_status(&p, "c").container_id.clone().unwrap();
    a.wait_phase("done", "Succeeded", T);
    // multi: pulled for a pod that is then deleted, so no container uses it any more
    a.write("gone.yaml", &pod("gone", &multi, "IfNotPresent", "sleep 3600", ""));
    a.wait_phase("gone", "Running", T);
    a.remove("gone.yaml");
    a.wait_gone("gone", T);
    let st = store(&a.root);
    assert!(st.find(&multi).is_ok());
    assert!(st.blob_path(&Digest::parse(&marker).unwrap()).exists());
    // The image filesystem is over 1 %: GC frees down to 0 % what no container uses.
    let cfg = a.dir.join("kubelet.yaml");
    let mut yaml = std::fs::read_to_string(&cfg).unwrap();
    // (ferrolet.imageGCPeriod: kubelet's fixed 5 minutes made short)
    yaml.push_str(
        "imageGCHighThresholdPercent: 1\nimageGCLowThresholdPercent: 0\nimageMinimumGCAge: 0s\nferrolet:\n  imageGCPeriod: 2s\n",
    );
    std::fs::write(&cfg, yaml).unwrap();
    a.restart();
    let deadline = Instant::now() + T;
    while st.find(&multi).is_ok() {
        assert!(
            Instant::now() < deadline,
            "image GC did not remove the unused image: {:#?}\n{}",
            st.list().unwrap().iter().map(|i| i.refs.clone()).collect::<Vec<_>>(),
            tail(&a.agent_log(), 30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let kept = st.find(&image).expect("the image of the running container is kept");
    assert_eq!(kept.id.to_string(), two_config);
    assert!(
        st.find("docker.io/library/busybox:1.35").is_ok(),
        "the image of the exited container is kept"
    );
    // The store writes its index first and deletes the blobs after, under its lock; the test
    // reads without the lock, so it may look between the two.
    let marker_blob = st.blob_path(&Digest::parse(&marker).unwrap());
    while marker_blob.exists() {
        assert!(Instant::now() < deadline, "the removed image's own layer went");
        std::thread::sleep(Duration::from_millis(50));
    }
    for l in &two_layers {
        assert!(
            st.blob_path(&Digest::parse(l).unwrap()).exists(),
            "layer {l} of the kept image (the busybox one shared with the removed image)"
        );
    }
    let p = a.wait_phase("inuse", "Running", T);
    assert_eq!(
        container_status(&p, "c").container_id.as_deref(),
        Some(cid.as_str()),
        "the container was not touched"
    );
}
