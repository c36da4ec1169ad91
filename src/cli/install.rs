//! `ferrolet install` and `ferrolet uninstall`: a fresh board made a node in one step, and
//! undone. Install puts the binary, a configuration, the static pod directory, the systemd unit
//! (examples/ferrolet.service, [docs/systemd.md]), shell completions and man pages made from
//! this command line (clap_complete, clap_mangen) and the image archives shipped with it (the
//! release's demo image, into the agent's import directory) in their places, then enables and
//! starts the unit. What it adds, and only what it adds, is written to a record
//! (`/etc/ferrolet/install-record.json`), written before the unit is touched, so that an
//! install whose service fails to start is undone like any other (a file that cannot be
//! written takes back the ones before it); a file that was there already (an edited config, a
//! manifest) is kept and never recorded. Uninstall stops and disables the unit, stops and
//! removes every pod the agent ran (`ferrolet reset` of its root dir), then removes what the
//! record lists: a file only while it is as install wrote it (an edited config stays, and is
//! named), a directory only when empty. `--destdir` stages everything under another root (for
//! packaging and tests) and touches no service.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command as Process;

use anyhow::{bail, Context, Result};
use clap::{Args, CommandFactory};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Cli;

/// The unit and the configuration as shipped in examples/.
const UNIT: &str = include_str!("../../examples/ferrolet.service");
const CONFIG: &str = include_str!("../../examples/kubelet-config.yaml");
const CONFIG_DIR: &str = "etc/ferrolet";
const RECORD: &str = "etc/ferrolet/install-record.json";

#[derive(Args, Debug, Clone)]
pub struct InstallArgs {
    /// Install under this root instead of `/` (staging for a package or an image): no service
    /// is enabled or started.
    #[arg(long, value_name = "DIR")]
    pub destdir: Option<PathBuf>,
    /// Where the binary and the man pages go (`<prefix>/bin`, `<prefix>/share/man`).
    #[arg(long, value_name = "PATH", default_value = "/usr/local")]
    pub prefix: PathBuf,
    /// Install and enable the unit, but do not start it now.
    #[arg(long)]
    pub no_start: bool,
    /// Join a cluster with this bootstrap token (`kubeadm token create`), as `kubeadm join`:
    /// with --server and --ca-cert-hash.
    #[arg(long, value_name = "ID.SECRET", requires_all = ["server", "ca_cert_hash"])]
    pub bootstrap_token: Option<String>,
    /// The cluster's API server, `https://HOST:6443`.
    #[arg(long, value_name = "URL", requires = "bootstrap_token")]
    pub server: Option<String>,
    /// `sha256:<hex>` of the cluster CA's public key, as `kubeadm token create
    /// --print-join-command` prints it: the CA the server presents must match.
    #[arg(long, value_name = "sha256:HEX", requires = "bootstrap_token")]
    pub ca_cert_hash: Option<String>,
    /// An image archive (OCI layout or `docker save` tar) for the agent to import when it
    /// starts: copied into its import directory (`/var/lib/ferrolet/images/import`). May be
    /// repeated. Without it, the archives in `images/` beside this program are taken: the
    /// release tarball's demo image (busybox:1.35), which release binaries do not carry inside.
    #[arg(long = "image-archive", value_name = "FILE")]
    pub image_archives: Vec<PathBuf>,
}

/// The configuration of a node that joins a cluster: the cluster CA verifies the API server's
/// client certificate on the kubelet port, and its requests are authorized by the cluster
/// (Webhook); the node's client certificate is rotated.
const JOIN_CONFIG: &str = "\
# Written by `ferrolet install --bootstrap-token`: a node of the cluster at the server in
# bootstrap-kubeconfig. Relative paths are relative to this file.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: manifests
authentication:
  x509:
    clientCAFile: pki/ca.crt
  webhook:
    enabled: true
  anonymous:
    enabled: false
authorization:
  mode: Webhook
rotateCertificates: true
registerNode: true
failSwapOn: false
";

#[derive(Args, Debug, Clone)]
pub struct UninstallArgs {
    /// The root `ferrolet install --destdir` used.
    #[arg(long, value_name = "DIR")]
    pub destdir: Option<PathBuf>,
}

/// What install added: removed by uninstall, and nothing else.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    /// Files written, with the sha256 of what was written.
    files: Vec<(PathBuf, String)>,
    /// Directories made, parents first.
    dirs: Vec<PathBuf>,
    /// The agent's root dir (its pods are reset on uninstall).
    root_dir: PathBuf,
    /// Whether the unit was enabled (and so is disabled again).
    enabled: bool,
}

/// `dest` + an absolute path.
fn under(dest: &Path, abs: &Path) -> PathBuf {
    dest.join(abs.strip_prefix("/").unwrap_or(abs))
}

fn sha256(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

impl Record {
    fn mkdirs(&mut self, dir: &Path) -> Result<()> {
        let mut missing = Vec::new();
        let mut d = dir;
        while !d.exists() {
            missing.push(d.to_path_buf());
            match d.parent() {
                Some(p) => d = p,
                None => break,
            }
        }
        for m in missing.into_iter().rev() {
            std::fs::create_dir(&m).with_context(|| format!("creating {}", m.display()))?;
            self.dirs.push(m);
        }
        Ok(())
    }

    /// Write the record (atomically).
    fn save(&self, path: &Path) -> Result<()> {
        let data = serde_json::to_vec_pretty(self).context("encoding the install record")?;
        ferrolet_fsutil::write_atomic_mode(path, &data, 0o644)
            .with_context(|| format!("writing the install record {}", path.display()))
    }

    /// Remove what was written so far (a failed install), newest first.
    fn take_back(&self) {
        for (path, _) in self.files.iter().rev() {
            let _ = std::fs::remove_file(path);
        }
        for d in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }

    /// Write `data` at `path` unless something is there already (kept, and said).
    fn add(&mut self, path: &Path, data: &[u8], mode: u32) -> Result<()> {
        if path.exists() {
            println!("kept      {} (already there)", path.display());
            return Ok(());
        }
        self.mkdirs(path.parent().unwrap_or(Path::new("/")))?;
        ferrolet_fsutil::write_atomic_mode(path, data, mode).with_context(|| format!("writing {}", path.display()))?;
        println!("installed {}", path.display());
        self.files.push((path.to_path_buf(), sha256(data)));
        Ok(())
    }
}

/// The shell completions and man pages of this command line: (path under `/`, content).
fn generated(prefix: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>> {
    use clap_complete::Shell;
    let mut out = Vec::new();
    for (shell, path) in [
        (Shell::Bash, "/usr/share/bash-completion/completions/ferrolet"),
        (Shell::Zsh, "/usr/share/zsh/vendor-completions/_ferrolet"),
        (Shell::Fish, "/usr/share/fish/vendor_completions.d/ferrolet.fish"),
    ] {
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "ferrolet", &mut buf);
        out.push((PathBuf::from(path), buf));
    }
    let man = prefix.join("share/man/man8");
    let mut cmd = Cli::command();
    cmd.build();
    let mut pages = vec![("ferrolet".to_string(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        pages.push((format!("ferrolet-{}", sub.get_name()), sub.clone()));
    }
    for (name, c) in pages {
        let mut buf = Vec::new();
        clap_mangen::Man::new(c.name(name.clone()))
            .section("8")
            .render(&mut buf)
            .with_context(|| format!("rendering the man page {name}"))?;
        out.push((man.join(format!("{name}.8")), buf));
    }
    Ok(out)
}

pub fn install(a: &InstallArgs) -> Result<i32> {
    let dest = a.destdir.clone().unwrap_or_else(|| PathBuf::from("/"));
    let record_path = dest.join(RECORD);
    if record_path.exists() {
        bail!(
            "ferrolet is installed already ({} exists); `ferrolet uninstall` first",
            record_path.display()
        );
    }
    let mut r = Record {
        root_dir: PathBuf::from("/var/lib/ferrolet"),
        ..Default::default()
    };
    // Files first; one that cannot be written takes back the ones before it, so a failed
    // install leaves nothing behind.
    if let Err(e) = place(a, &dest, &mut r) {
        r.take_back();
        return Err(e);
    }
    // The record before any service is touched: from here on `ferrolet uninstall` undoes it,
    // even when the unit fails to start.
    r.save(&record_path)?;
    if a.destdir.is_none() {
        systemctl(&["daemon-reload"])?;
        systemctl(&["enable", "ferrolet.service"])?;
        r.enabled = true;
        r.save(&record_path)?;
        if !a.no_start {
            systemctl(&["start", "ferrolet.service"]).context(
                "ferrolet is installed and enabled, but its service did not start (`journalctl -u ferrolet` says why; \
                 `ferrolet uninstall` removes it)",
            )?;
        }
    }
    println!(
        "ferrolet is installed: put static pods in {}, or join a cluster (README: Joining a cluster); \
         `ferrolet uninstall` removes what was added",
        dest.join(CONFIG_DIR).join("manifests").display()
    );
    Ok(0)
}

/// The binary, the configuration (a joining node's too), the unit, completions and man pages,
/// each recorded in `r` as it is written.
fn place(a: &InstallArgs, dest: &Path, r: &mut Record) -> Result<()> {
    let config_dir = dest.join(CONFIG_DIR);
    // Joining: the cluster's CA, found and checked before anything is written.
    let joined = match (&a.bootstrap_token, &a.server, &a.ca_cert_hash) {
        (Some(t), Some(server), Some(hash)) => {
            let token: super::join::Token = t.parse()?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let ca = rt.block_on(super::join::discover(server, &token, hash))?;
            println!("the cluster at {server} is the one --ca-cert-hash names, and knows the token");
            Some((super::join::bootstrap_kubeconfig(server, &ca, &token), ca))
        }
        _ => None,
    };
    let bin = a.prefix.join("bin/ferrolet");
    let exe = std::fs::read("/proc/self/exe").context("reading this program's binary")?;
    r.add(&under(dest, &bin), &exe, 0o755)?;
    let archives = match a.image_archives.is_empty() {
        true => shipped_archives()?,
        false => a.image_archives.clone(),
    };
    let import = under(dest, &r.root_dir.join("images/import"));
    for archive in &archives {
        let name = archive
            .file_name()
            .with_context(|| format!("--image-archive {}: not a file name", archive.display()))?;
        let data =
            std::fs::read(archive).with_context(|| format!("reading the image archive {}", archive.display()))?;
        let placed = import.join(name);
        let there_before = placed.exists();
        r.add(&placed, &data, 0o644)?;
        if there_before {
            // Kept as it is (said by add): not install's to touch.
            continue;
        }
        // With the archive's own time, as `cp -p` copies: the agent leaves a file modified in the
        // last second for its next scan (it may still be being copied in), and the unit starts
        // right after this, so a fresh time would leave the first pods without the image.
        let kept_time = std::fs::metadata(archive)
            .and_then(|m| m.modified())
            .and_then(|t| std::fs::File::options().write(true).open(&placed)?.set_modified(t));
        if let Err(e) = kept_time {
            println!(
                "note      {} has a fresh time ({e}): the agent imports it at its next scan, not at once",
                placed.display()
            );
        }
    }
    let mut unit = UNIT.replace("/usr/local/bin/ferrolet", &bin.display().to_string());
    match &joined {
        Some((kubeconfig, ca)) => {
            r.add(&config_dir.join("config.yaml"), JOIN_CONFIG.as_bytes(), 0o644)?;
            r.add(&config_dir.join("pki/ca.crt"), ca, 0o644)?;
            r.add(&config_dir.join("bootstrap-kubeconfig"), kubeconfig.as_bytes(), 0o600)?;
            unit = unit.replace(
                "run --config /etc/ferrolet/config.yaml",
                "run --config /etc/ferrolet/config.yaml --bootstrap-kubeconfig /etc/ferrolet/bootstrap-kubeconfig --kubeconfig /var/lib/ferrolet/kubeconfig",
            );
        }
        None => r.add(&config_dir.join("config.yaml"), CONFIG.as_bytes(), 0o644)?,
    }
    r.mkdirs(&config_dir.join("manifests"))?;
    r.add(
        &dest.join("etc/systemd/system/ferrolet.service"),
        unit.as_bytes(),
        0o644,
    )?;
    for (path, data) in generated(&a.prefix)? {
        r.add(&under(dest, &path), &data, 0o644)?;
    }
    Ok(())
}

/// The image archives shipped beside this program (`images/*.tar` in the release tarball),
/// in name order; none when there is no such directory.
fn shipped_archives() -> Result<Vec<PathBuf>> {
    let exe = std::env::current_exe().context("finding this program's binary")?;
    let Some(dir) = exe.parent().map(|d| d.join("images")) else {
        return Ok(Vec::new());
    };
    let mut out: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "tar"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    out.sort();
    Ok(out)
}

fn systemctl(args: &[&str]) -> Result<()> {
    let st = Process::new("systemctl")
        .args(args)
        .status()
        .with_context(|| format!("running systemctl {}", args.join(" ")))?;
    if !st.success() {
        bail!("systemctl {} failed ({st})", args.join(" "));
    }
    Ok(())
}

/// Stop the service, then `reset(root_dir)` (stops and removes the pods), then remove what the
/// record lists.
pub fn uninstall(a: &UninstallArgs, reset: impl FnOnce(&Path) -> Result<i32>) -> Result<i32> {
    let dest = a.destdir.clone().unwrap_or_else(|| PathBuf::from("/"));
    let record_path = dest.join(RECORD);
    let r: Record = ferrolet_fsutil::read_json(&record_path).with_context(|| {
        format!(
            "ferrolet was not installed by `ferrolet install` here ({})",
            record_path.display()
        )
    })?;
    if r.enabled {
        systemctl(&["disable", "--now", "ferrolet.service"])?;
    }
    if a.destdir.is_none() && r.root_dir.exists() {
        reset(&r.root_dir)?;
    }
    let mut kept = Vec::new();
    for (path, sum) in &r.files {
        match std::fs::read(path) {
            Ok(now) if sha256(&now) == *sum => {
                std::fs::remove_file(path).with_context(|| format!("removing {}", path.display()))?;
                println!("removed   {}", path.display());
            }
            Ok(_) => kept.push(path.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
    std::fs::remove_file(&record_path).with_context(|| format!("removing {}", record_path.display()))?;
    for d in r.dirs.iter().rev() {
        // Only when empty: what the user put there stays.
        if std::fs::remove_dir(d).is_ok() {
            println!("removed   {}/", d.display());
        }
    }
    if r.enabled {
        let _ = systemctl(&["daemon-reload"]);
    }
    for k in &kept {
        println!("kept      {} (changed since it was installed)", k.display());
    }
    let _ = std::io::stdout().flush();
    Ok(0)
}
