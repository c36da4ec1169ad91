//! Wiring the agent together: runtime and images, pod cgroups, the pod table, sources ->
//! dispatcher -> pod workers, the HTTP API and the exec socket. Stopping the agent leaves the
//! pods running; the next start adopts them.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use ferrolet_runtime::{Runtime, ZygoteHandle};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::config::Config;
use crate::dispatcher::{Dispatcher, Event};
use crate::node::NodeInfo;
use crate::podcgroups::PodCgroups;
use crate::podmanager::PodManager;
use crate::reset::{load_record, save_record};
use crate::sources::{file::FileSource, http::HttpSource};
use crate::sync::Ctx;

/// Only one agent per root dir.
fn lock_root(root: &Path) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let path = root.join("ferrolet.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|_| anyhow!("another ferrolet is running with --root-dir {}", root.display()))
}

/// The cgroup directories the kubepods tree will need that do not exist yet (recorded so
/// `ferrolet reset` can remove exactly those).
fn missing_cgroup_dirs(rt: &Runtime, kubepods: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for dir in rt.cgroups().dirs(kubepods) {
        let mut chain = Vec::new();
        let mut cur = dir.as_path();
        while !cur.exists() {
            chain.push(cur.to_path_buf());
            match cur.parent() {
                Some(p) => cur = p,
                None => break,
            }
        }
        out.extend(chain.into_iter().rev());
    }
    out
}

pub async fn run(cfg: Config, zygote: ZygoteHandle, warnings: Vec<String>) -> Result<()> {
    for w in &warnings {
        warn!("config: {w}");
    }
    std::fs::create_dir_all(&cfg.root_dir).with_context(|| format!("creating {}", cfg.root_dir.display()))?;
    let _lock = lock_root(&cfg.root_dir)?;
    for d in [cfg.pods_dir(), cfg.pod_logs_dir.clone(), cfg.image_import_dir.clone()] {
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    }
    if let Some(p) = &cfg.static_pod_path {
        if p == Path::new("/etc/ferrolet/manifests") && !p.exists() {
            let _ = std::fs::create_dir_all(p);
        }
    }

    let rt = Arc::new(Runtime::new(&cfg.root_dir, zygote).map_err(|e| anyhow!("{}", ferrolet_fsutil::chain(&e)))?);
    let n = rt
        .remove_orphans()
        .map_err(|e| anyhow!("{}", ferrolet_fsutil::chain(&e)))?;
    if n > 0 {
        info!(count = n, "removed half-created containers from an interrupted run");
    }
    if cfg.load_demo_image {
        crate::images::load_demo(rt.images());
    }
    let mut import = crate::images::ImportDir::new(cfg.image_import_dir.clone());
    import.scan(rt.images());

    let cgroups = PodCgroups::new(&cfg, rt.cgroups())?;
    if cfg.cgroup_root.is_empty() {
        // cgroup v2: the agent's own cgroup becomes the parent of kubepods, so the agent (and
        // its zygote, and so the monitors) move into a leaf of it.
        let me = std::process::id() as i32;
        ferrolet_runtime::cgroups::vacate_own_cgroup(
            rt.cgroups(),
            cgroups.root(),
            "ferrolet.agent",
            &[me, rt.zygote_pid()],
        )
        .map_err(|e| anyhow!("{}", ferrolet_fsutil::chain(&e)))?;
    }
    let mut record = load_record(&cfg.root_dir);
    if record.cgroup_root != cgroups.root() {
        record.created_cgroup_dirs.clear();
    }
    record.cgroup_root = cgroups.root().to_string();
    record.pod_logs_dir = cfg.pod_logs_dir.clone();
    for d in missing_cgroup_dirs(&rt, &format!("{}/kubepods", cgroups.root())) {
        if !record.created_cgroup_dirs.contains(&d) {
            record.created_cgroup_dirs.push(d);
        }
    }
    save_record(&cfg.root_dir, &record)?;
    if cfg.cgroups_per_qos {
        cgroups.init().context("creating the kubepods cgroups")?;
    }
    info!(cgroup_root = %cgroups.root(), v2 = rt.cgroups().is_v2(), "pod cgroups");

    let net = crate::network::PodNetwork::new(&cfg);
    record.network = Some(serde_json::to_value(net.settings())?);
    save_record(&cfg.root_dir, &record)?;
    // Before any pod worker: collects the network of sandboxes that are gone.
    net.init().await;

    let node = NodeInfo::detect(&cfg);
    let ctx = Arc::new(Ctx {
        cfg: cfg.clone(),
        rt: rt.clone(),
        node,
        pods: Arc::new(PodManager::default()),
        cgroups,
        net,
    });

    let (ev_tx, ev_rx) = mpsc::unbounded_channel::<Event>();
    let mut expected = HashSet::new();
    if let Some(path) = &cfg.static_pod_path {
        expected.insert("file");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(FileSource::new(path.clone(), cfg.node_name.clone()).run(tx, cfg.file_check_frequency));
        forward(rx, ev_tx.clone());
    }
    if let Some(url) = &cfg.static_pod_url {
        expected.insert("http");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(
            HttpSource::new(url.clone(), cfg.static_pod_url_headers.clone(), cfg.node_name.clone())
                .run(tx, cfg.http_check_frequency),
        );
        forward(rx, ev_tx.clone());
    }
    tokio::spawn(Dispatcher::new(ctx.clone(), ev_tx.clone(), expected).run(ev_rx));
    {
        let ev_tx = ev_tx.clone();
        let every = cfg.sync_frequency;
        let check = cfg.file_check_frequency;
        let rt = rt.clone();
        tokio::spawn(async move {
            let mut last_housekeeping = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(check.min(every)).await;
                let rt2 = rt.clone();
                import = tokio::task::spawn_blocking(move || {
                    import.scan(rt2.images());
                    import
                })
                .await
                .expect("import task");
                if last_housekeeping.elapsed() >= every {
                    last_housekeeping = tokio::time::Instant::now();
                    if ev_tx.send(Event::Housekeeping).is_err() {
                        return;
                    }
                }
            }
        });
    }

    let router = crate::server::router(ctx.clone());
    {
        let r = router.clone();
        let path = cfg.socket_path();
        tokio::spawn(async move {
            if let Err(e) = crate::server::serve_unix(r, path).await {
                error!("{e:#}");
            }
        });
    }
    {
        let ctx = ctx.clone();
        let path = cfg.exec_socket_path();
        tokio::spawn(async move {
            if let Err(e) = crate::server::exec::serve(ctx, path).await {
                error!("exec socket: {e:#}");
            }
        });
    }
    if cfg.enable_server && cfg.read_only_port != 0 {
        let addr = std::net::SocketAddr::new(cfg.address, cfg.read_only_port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow!("binding the HTTP API on {addr}: {e}"))?;
        info!(%addr, "HTTP API listening");
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                error!("HTTP API: {e}");
            }
        });
    }
    info!(
        node = %cfg.node_name,
        root = %cfg.root_dir.display(),
        manifests = %cfg.static_pod_path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "-".into()),
        "ferrolet started"
    );

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    info!("shutting down; pods keep running and are adopted by the next start");
    let _ = std::fs::remove_file(cfg.socket_path());
    let _ = std::fs::remove_file(cfg.exec_socket_path());
    Ok(())
}

fn forward(mut rx: mpsc::UnboundedReceiver<crate::sources::Snapshot>, tx: mpsc::UnboundedSender<Event>) {
    tokio::spawn(async move {
        while let Some(s) = rx.recv().await {
            if tx.send(Event::Snapshot(s)).is_err() {
                return;
            }
        }
    });
}

pub fn require_root() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("ferrolet runs containers and needs root");
    }
    Ok(())
}
