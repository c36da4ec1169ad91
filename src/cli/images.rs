//! `ferrolet images import|ls|rm|pull|prune`, straight on the image store under the root dir
//! (the agent need not run; it sees the changes at once).

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Result};
use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::image::{ImageStore, Reference};
use ferrolet_runtime::registry::{Credentials, Platform, Progress, ProgressFn, Puller, PullerOptions, RegistryConfig};

use super::{ImagesCommand, PullArgs};
use crate::images::credentials::{self, DockerConfig, Keyring};

fn human(bytes: u64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1000.0 && u < units.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else {
        format!("{v:.3}{}", units[u]).replace(".000", "")
    }
}

pub fn run(cmd: &ImagesCommand) -> Result<i32> {
    match cmd {
        ImagesCommand::Import { root, files } => {
            let store = ImageStore::open(root.root_dir.join("images"))?;
            let mut failed = 0;
            for f in files {
                match store.import(f) {
                    Ok(imgs) => {
                        for i in imgs {
                            let names = if i.refs.is_empty() {
                                "<none>".to_string()
                            } else {
                                i.refs.join(", ")
                            };
                            println!("imported {names} ({})", i.id);
                        }
                    }
                    Err(e) => {
                        eprintln!("{}: {e}", f.display());
                        failed += 1;
                    }
                }
            }
            Ok(if failed > 0 { 1 } else { 0 })
        }
        ImagesCommand::Pull(a) => pull(a),
        ImagesCommand::Prune { root } => prune(&root.root_dir),
        ImagesCommand::Ls { root } => {
            let store = ImageStore::open(root.root_dir.join("images"))?;
            let now = chrono::Utc::now();
            println!(
                "{:<50} {:<15} {:<14} {:<10} LAST USED",
                "IMAGE", "TAG", "IMAGE ID", "SIZE"
            );
            for i in store.list()? {
                let names: Vec<(String, String)> = if i.refs.is_empty() {
                    vec![("<none>".into(), "<none>".into())]
                } else {
                    i.refs
                        .iter()
                        .map(|r| {
                            let p = Reference::parse(r).ok();
                            (
                                p.as_ref().map(|p| p.repository.clone()).unwrap_or_else(|| r.clone()),
                                p.and_then(|p| p.tag).unwrap_or_else(|| "<none>".into()),
                            )
                        })
                        .collect()
                };
                let used = last_used(i.last_used.as_deref(), now);
                for (repo, tag) in names {
                    println!(
                        "{:<50} {:<15} {:<14} {:<10} {used}",
                        repo,
                        tag,
                        i.id.short(),
                        human(i.size)
                    );
                }
            }
            Ok(0)
        }
        ImagesCommand::Rm { root, refs } => {
            let store = ImageStore::open(root.root_dir.join("images"))?;
            let users = super::reset::image_users(&root.root_dir);
            // A container whose record was rebuilt from what survived may use any image.
            let unknown = ferrolet_runtime::digest::Digest::of(b"");
            if let Some((id, _)) = users.iter().find(|(_, d)| *d == unknown) {
                eprintln!(
                    "container {id} uses an image that is not known (its record was rebuilt); remove the container (or `ferrolet reset`) before removing images"
                );
                return Ok(1);
            }
            let mut failed = 0;
            for r in refs {
                match store.remove(r, &users) {
                    Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
                    Err(e) => {
                        eprintln!("{r}: {e}");
                        failed += 1;
                    }
                }
            }
            Ok(if failed > 0 { 1 } else { 0 })
        }
    }
}

/// When an image last had a container created from it, as docker words ages.
fn last_used(t: Option<&str>, now: chrono::DateTime<chrono::Utc>) -> String {
    let Some(t) = t.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) else {
        return "never".into();
    };
    let secs = (now - t.with_timezone(&chrono::Utc)).num_seconds().max(0);
    match secs {
        0..=59 => format!("{secs} seconds ago"),
        60..=3599 => format!("{} minutes ago", secs / 60),
        3600..=86399 => format!("{} hours ago", secs / 3600),
        _ => format!("{} days ago", secs / 86400),
    }
}

/// The containers under `root` and the image each uses; refused when one's image is unknown.
fn users(root: &std::path::Path) -> Result<Vec<(String, Digest)>> {
    let users = super::reset::image_users(root);
    // A container whose record was rebuilt from what survived may use any image.
    let unknown = Digest::of(b"");
    if let Some((id, _)) = users.iter().find(|(_, d)| *d == unknown) {
        return Err(anyhow!(
            "container {id} uses an image that is not known (its record was rebuilt); remove the container (or `ferrolet reset`) before removing images"
        ));
    }
    Ok(users)
}

/// `ferrolet images prune`: every image no container uses goes.
fn prune(root: &std::path::Path) -> Result<i32> {
    let store = ImageStore::open(root.join("images"))?;
    let users = match users(root) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("{e}");
            return Ok(1);
        }
    };
    let (mut freed, mut failed) = (0u64, 0);
    for i in store.list()? {
        if users.iter().any(|(_, d)| *d == i.id) {
            continue;
        }
        match store.remove(&i.id.to_string(), &users) {
            Ok(lines) => {
                lines.iter().for_each(|l| println!("{l}"));
                freed += i.size;
            }
            Err(e) => {
                eprintln!("{}: {e}", i.id);
                failed += 1;
            }
        }
    }
    println!("Total reclaimed space: {}", human(freed));
    Ok(if failed > 0 { 1 } else { 0 })
}

/// The credentials to try for `reference`: `--creds` first, then the docker config's that
/// match (the file given, else the node's as the agent finds it).
fn pull_credentials(a: &PullArgs) -> Result<Vec<Credentials>> {
    let mut out = Vec::new();
    if let Some(c) = &a.creds {
        let (u, p) = c
            .split_once(':')
            .ok_or_else(|| anyhow!("--creds: expected USER:PASSWORD"))?;
        out.push(Credentials::Basic {
            username: u.to_string(),
            password: p.to_string(),
        });
    }
    let cfg = match &a.docker_config {
        Some(p) => {
            let data = std::fs::read(p).map_err(|e| anyhow!("--docker-config: {}: {e}", p.display()))?;
            Some(
                DockerConfig::parse_json(&data, &p.display().to_string())
                    .map_err(|e| anyhow!("--docker-config: {e}"))?,
            )
        }
        None => credentials::read_node_config(&credentials::node_config_paths(&a.root.root_dir))
            .map_err(anyhow::Error::msg)?
            .map(|(_, c)| c),
    };
    if let Some(cfg) = cfg {
        let mut k = Keyring::default();
        k.add(&cfg);
        out.extend(k.lookup(&credentials::repository_of(&a.reference)));
    }
    Ok(out)
}

/// Progress as it comes: a bar per layer on a terminal, a line per step otherwise (stderr;
/// stdout gets the image id alone).
fn progress_printer() -> ProgressFn {
    if std::io::stderr().is_terminal() {
        let multi = indicatif::MultiProgress::new();
        let style = indicatif::ProgressStyle::with_template("{prefix:.bold} [{bar:30}] {bytes}/{total_bytes} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
        let bars: Mutex<HashMap<Digest, indicatif::ProgressBar>> = Mutex::new(HashMap::new());
        Arc::new(move |p: Progress| {
            let mut bars = bars.lock().unwrap_or_else(|e| e.into_inner());
            let mut bar = |d: &Digest, total: u64| {
                bars.entry(d.clone())
                    .or_insert_with(|| {
                        let b = multi.add(indicatif::ProgressBar::new(total));
                        b.set_style(style.clone());
                        b.set_prefix(d.short().to_string());
                        b
                    })
                    .clone()
            };
            match p {
                Progress::Resolved { layers, .. } => {
                    for (d, size) in layers {
                        bar(&d, size).set_message("waiting");
                    }
                }
                Progress::Downloading { digest, done, total } => {
                    let b = bar(&digest, total);
                    b.set_length(total);
                    b.set_position(done);
                    b.set_message("downloading");
                }
                Progress::Exists { digest } => {
                    let b = bar(&digest, 0);
                    b.finish_with_message("already exists");
                }
                Progress::Downloaded { digest } => bar(&digest, 0).set_message("verified"),
                Progress::Extracting { digest } => bar(&digest, 0).set_message("extracting"),
                Progress::Done { digest } => {
                    let b = bar(&digest, 0);
                    if let Some(l) = b.length() {
                        b.set_position(l);
                    }
                    b.finish_with_message("done");
                }
            }
        })
    } else {
        Arc::new(|p: Progress| match p {
            Progress::Resolved { manifest, layers } => {
                let total: u64 = layers.iter().map(|(_, s)| s).sum();
                eprintln!("resolved {manifest}: {} layers, {}", layers.len(), human(total));
            }
            Progress::Downloading { .. } => {}
            Progress::Exists { digest } => eprintln!("{}: already exists", digest.short()),
            Progress::Downloaded { digest } => eprintln!("{}: downloaded", digest.short()),
            Progress::Extracting { digest } => eprintln!("{}: extracting", digest.short()),
            Progress::Done { digest } => eprintln!("{}: done", digest.short()),
        })
    }
}

/// `ferrolet images pull`.
fn pull(a: &PullArgs) -> Result<i32> {
    let root = &a.root.root_dir;
    let store = Arc::new(ImageStore::open(root.join("images"))?);
    let reg_path = a
        .registry_config
        .clone()
        .unwrap_or_else(|| root.join("registries.yaml"));
    let registries = RegistryConfig::load(&reg_path).map_err(|e| anyhow!("{e}"))?;
    let platform = match &a.platform {
        Some(p) => Platform::parse(p).map_err(|e| anyhow!("--platform: {e}"))?,
        None => Platform::host(),
    };
    let creds = pull_credentials(a)?;
    let defaults = crate::config::ImageConfig::default();
    let puller = Puller::new(
        store,
        registries,
        PullerOptions {
            max_concurrent_downloads: defaults.max_concurrent_downloads as usize,
            progress_timeout: defaults.image_pull_progress_timeout,
            platform,
            // No reserve: the CLI does not read the agent's configuration, and kubelet's
            // default thresholds would refuse every pull on a node configured below them
            // (blobs are still capped by the layer limit and the free space).
            reserve: Default::default(),
        },
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let start = std::time::Instant::now();
    match rt.block_on(puller.pull(&a.reference, &creds, Some(progress_printer()))) {
        Ok(o) => {
            eprintln!(
                "pulled {} in {} ({} downloaded, image size {})",
                a.reference,
                crate::images::policy::go_duration(
                    std::time::Duration::from_millis(start.elapsed().as_millis() as u64)
                ),
                human(o.downloaded),
                human(o.record.size)
            );
            println!("{}", o.record.id);
            Ok(0)
        }
        Err(e) => {
            eprintln!("ferrolet: {e}");
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_used_in_words() {
        let now = chrono::Utc::now();
        assert_eq!(last_used(None, now), "never");
        let t = (now - chrono::Duration::minutes(5)).to_rfc3339();
        assert_eq!(last_used(Some(&t), now), "5 minutes ago");
        let t = (now - chrono::Duration::hours(50)).to_rfc3339();
        assert_eq!(last_used(Some(&t), now), "2 days ago");
    }
}
