//! The status page (docs/status-page.md) with real pods: one running, one that keeps failing
//! with `<script>` in its termination message. The page is read without JavaScript over the
//! agent's socket, then through `ferrolet ui` (loopback) in headless Chromium, whose DOM after
//! the page's script ran is checked (names, restart counts, charts with points, the live
//! refresh) and whose screenshot goes to the test's output directory.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const FAST: &[&str] = &["--housekeeping-interval", "1s", "--volume-stats-agg-period", "2s"];

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser"].iter().find_map(|b| {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join(b))
            .find(|p| p.is_file())
    })
}

/// Headless Chromium on `url` with `args` (a fresh profile each run); its stdout.
fn run_chromium(bin: &Path, profile: &Path, args: &[&str], url: &str) -> String {
    let _ = std::fs::remove_dir_all(profile);
    std::fs::create_dir_all(profile).unwrap();
    let out = Command::new("timeout")
        .arg("120")
        .arg(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium {args:?} {url}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The number of vertices of the first polyline after `marker` in `html`.
fn polyline_points_after(html: &str, marker: &str) -> usize {
    let Some(at) = html.find(marker) else { return 0 };
    let rest = &html[at..];
    let Some(p) = rest.find("<polyline") else { return 0 };
    let rest = &rest[p..];
    let Some(q) = rest.find("points=\"") else { return 0 };
    let rest = &rest[q + 8..];
    rest[..rest.find('"').unwrap_or(0)].split_whitespace().count()
}

/// The restart count the page shows for the pod `full` (`namespace/name`).
fn restarts_shown(html: &str, full: &str) -> Option<i32> {
    let row = &html[html.find(&format!("data-pod=\"{full}\""))?..];
    let cell = &row[row.find("restarts\">")? + 10..];
    cell[..cell.find('<')?].trim().parse().ok()
}

struct UiServer(Child);

impl Drop for UiServer {
    fn drop(&mut self) {
        stop_child(&mut self.0, Duration::from_secs(5));
    }
}

#[test]
fn status_page_in_headless_chromium() {
    let a = Agent::start("ui", FAST);
    // Bursts of a little cpu, so its chart has a shape.
    a.write(
        "web.yaml",
        &pod_yaml(
            "web",
            "Always",
            "while true; do i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done; sleep 2; done",
        ),
    );
    a.write(
        "crashy.yaml",
        &pod_yaml(
            "crashy",
            "Always",
            "echo '<script>alert(1)</script>' > /dev/termination-log; sleep 1; exit 3",
        ),
    );
    let node = a.node.clone();
    let (web, crashy) = (format!("default/web-{node}"), format!("default/crashy-{node}"));
    a.wait_for("web", "running", Duration::from_secs(60), |p| running(p, "main"));
    a.wait_for("crashy", "restarted", Duration::from_secs(90), |p| {
        restarts(p, "main") >= 1
    });

    // Without JavaScript: the socket's answer holds the tables and the charts' points.
    let deadline = Instant::now() + Duration::from_secs(60);
    let page = loop {
        let (code, body) = a.get("/ui").expect("GET /ui");
        assert_eq!(code, 200);
        let page = String::from_utf8(body).unwrap();
        if polyline_points_after(&page, &format!("data-pod=\"{web}\"")) >= 5
            && polyline_points_after(&page, "id=\"node\"") >= 5
        {
            break page;
        }
        assert!(Instant::now() < deadline, "no chart with 5 points in a minute:\n{page}");
        std::thread::sleep(Duration::from_millis(500));
    };
    for want in [
        "<table",
        "id=\"resources\"",
        "id=\"conditions\"",
        "id=\"containers\"",
        "id=\"events\"",
        &web,
        &crashy,
        "busybox:1.35",
        "MemoryPressure",
        // the termination message, as text
        "&lt;script&gt;alert(1)&lt;/script&gt;",
    ] {
        assert!(page.contains(want), "the page lacks {want:?}:\n{page}");
    }
    // The node's capacity and allocatable, as /ferrolet/node (the Node's status) has them.
    let (_, node_json) = a.get("/ferrolet/node").expect("/ferrolet/node");
    let node_json: serde_json::Value = serde_json::from_slice(&node_json).unwrap();
    for resource in ["pods", "cpu", "memory"] {
        let cap = node_json["status"]["capacity"][resource].as_str().expect("capacity");
        let alloc = node_json["status"]["allocatable"][resource]
            .as_str()
            .expect("allocatable");
        let row = format!("<tr><td>{resource}</td><td class=\"mono\" title=\"{cap}\">");
        assert!(
            page.contains(&row),
            "the page lacks {resource}'s capacity {cap}:\n{page}"
        );
        let row_rest = &page[page.find(&row).unwrap()..];
        let row_rest = &row_rest[..row_rest.find("</tr>").unwrap()];
        assert!(
            row_rest.contains(&format!("title=\"{alloc}\"")),
            "{resource}'s allocatable {alloc}: {row_rest}"
        );
    }
    assert!(!page.contains("<script>alert"), "unescaped: {page}");
    let shown = restarts_shown(&page, &crashy).expect("crashy's restarts");
    assert!(shown >= 1, "restarts shown: {shown}");
    assert_eq!(restarts_shown(&page, &web), Some(0));
    let (code, js) = a.get("/ui/live.js").unwrap();
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&js).contains("DOMParser"));

    // `ferrolet ui` with the read-only port off serves the page on loopback.
    let mut child = Command::new(BIN)
        .args(["ui", "--root-dir"])
        .arg(&a.root)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("ferrolet ui");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ui = UiServer(child);
    let url = line.trim().to_string();
    assert!(url.starts_with("http://127.0.0.1:") && url.ends_with("/ui"), "{url:?}");
    let (code, body) = curl_with(Command::new("curl"), &[], &url);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(&crashy));
    // only the page's paths are passed on to the owner's socket
    let base = url.trim_end_matches("/ui");
    let (code, _) = curl_with(Command::new("curl"), &[], &format!("{base}/configz"));
    assert_eq!(code, 404);

    // More history before the screenshot, for the one in docs/ (STATUS_PAGE_SETTLE_SECS).
    if let Some(secs) = std::env::var("STATUS_PAGE_SETTLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        std::thread::sleep(Duration::from_secs(secs));
    }
    let Some(bin) = chromium() else {
        skip_loudly(
            "status_page_in_headless_chromium (the browser part)",
            "no chromium on PATH (scripts/setup.sh installs Debian's chromium)",
        );
        return;
    };
    let profile = a.dir.join("chromium-profile");
    // The DOM after the script ran and refreshed the page at least once (virtual time).
    let dom = run_chromium(&bin, &profile, &["--virtual-time-budget=12000", "--dump-dom"], &url);
    assert!(
        dom.contains("data-live=\"on\""),
        "the page's script did not run:\n{dom}"
    );
    assert!(dom.contains("data-refreshes="), "no live refresh happened:\n{dom}");
    assert!(dom.contains(&web) && dom.contains(&crashy), "{dom}");
    let shown = restarts_shown(&dom, &crashy).expect("crashy's restarts in the DOM");
    assert!(shown >= 1);
    let points = polyline_points_after(&dom, &format!("data-pod=\"{web}\""));
    assert!(points >= 5, "web's cpu chart has {points} points");
    assert!(polyline_points_after(&dom, "id=\"node\"") >= 5);
    assert!(!dom.contains("<script>alert"), "unescaped in the DOM");

    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status_page");
    std::fs::create_dir_all(&out_dir).unwrap();
    let png = out_dir.join("status-page.png");
    let _ = std::fs::remove_file(&png);
    run_chromium(
        &bin,
        &profile,
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1280,1600",
            "--virtual-time-budget=4000",
            "--run-all-compositor-stages-before-draw",
        ],
        &url,
    );
    let meta = std::fs::metadata(&png).expect("the screenshot");
    assert!(meta.len() > 10_000, "a screenshot of {} bytes", meta.len());
    eprintln!("status page screenshot: {}", png.display());
}

#[test]
fn read_only_port_serves_the_page() {
    let port = free_port();
    let a = Agent::start_with_config("uiro", FAST, &format!("readOnlyPort: {port}\n"));
    a.write("idle.yaml", &pod_yaml("idle", "Always", "sleep 3600"));
    a.wait_for("idle", "running", Duration::from_secs(60), |p| running(p, "main"));
    // `ferrolet ui` only says where the page already is.
    let out = a.cli(&["ui"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(url, format!("http://127.0.0.1:{port}/ui"));
    let (code, body) = curl_with(Command::new("curl"), &["-D", "-"], &url);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(&format!("default/idle-{}", a.node)), "{body}");
    assert!(
        body.to_ascii_lowercase()
            .contains("content-security-policy: default-src 'none'"),
        "{body}"
    );
    // a non-loopback --listen is refused
    let out = a.cli(&["ui", "--listen", "0.0.0.0:0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
}
