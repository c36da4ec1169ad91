//! `ferrolet reset`: stop and remove everything an agent created under its root dir (pods,
//! containers, sandboxes, volumes, pod cgroups, sockets), for tearing down a demo or a node.
//! Also the record the agent keeps of what it created outside the root dir.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use ferrolet_fsutil::{read_json_opt, write_json_atomic};
use ferrolet_runtime::cgroups::Cgroups;
use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::{Runtime, ZygoteHandle};
use serde::{Deserialize, Serialize};

/// What the agent created outside its root dir, so `reset` can remove it.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentRecord {
    pub cgroup_root: String,
    /// cgroup directories (in every hierarchy) created for the kubepods tree, outermost first.
    pub created_cgroup_dirs: Vec<PathBuf>,
    pub pod_logs_dir: PathBuf,
    #[serde(default)]
    pub network: Option<serde_json::Value>,
}

pub fn record_path(root: &Path) -> PathBuf {
    root.join("agent.json")
}

pub fn load_record(root: &Path) -> AgentRecord {
    read_json_opt(&record_path(root)).ok().flatten().unwrap_or_default()
}

pub fn save_record(root: &Path, rec: &AgentRecord) -> Result<()> {
    write_json_atomic(&record_path(root), rec).map_err(|e| anyhow!("{}", ferrolet_fsutil::chain(&e)))
}

/// Containers and the image ids they use, read from disk.
pub fn image_users(root: &Path) -> Vec<(String, Digest)> {
    ferrolet_runtime::container::list_records(root)
        .into_iter()
        .map(|r| (r.id, r.image_ref))
        .collect()
}

pub async fn run(root: &Path, zygote: ZygoteHandle) -> Result<i32> {
    if !root.exists() {
        println!("nothing to reset: {} does not exist", root.display());
        return Ok(0);
    }
    if let Ok(mut s) = std::os::unix::net::UnixStream::connect(root.join("ferrolet.sock")) {
        let _ = std::io::Write::write_all(&mut s, b"GET /healthz HTTP/1.0\r\n\r\n");
        anyhow::bail!("an agent is running on {} (stop it first)", root.display());
    }
    let rt = Runtime::new(root, zygote).map_err(|e| anyhow!("{}", ferrolet_fsutil::chain(&e)))?;
    let rec = load_record(root);
    // The pods this agent had: their uids name their log directories.
    let mut uids: std::collections::BTreeSet<String> = std::fs::read_dir(root.join("pods"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for c in ferrolet_runtime::container::list_records(root) {
        if let Some(u) = c.labels.get(crate::sync::views::LABEL_POD_UID) {
            uids.insert(u.clone());
        }
    }
    let mut removed = 0;
    for c in rt.list().map_err(|e| anyhow!("{}", ferrolet_fsutil::chain(&e)))? {
        match rt.delete(c.id()).await {
            Ok(()) => removed += 1,
            Err(e) => eprintln!("container {}: {}", c.id(), ferrolet_fsutil::chain(&e)),
        }
    }
    rt.remove_orphans()
        .map_err(|e| anyhow!("{}", ferrolet_fsutil::chain(&e)))?;
    if let Some(v) = rec.network.clone() {
        match serde_json::from_value::<crate::network::NetworkSettings>(v) {
            Ok(settings) => {
                if let Err(e) = crate::network::remove_all(&settings).await {
                    eprintln!("pod network: {e:#}");
                }
            }
            Err(e) => eprintln!("agent.json network: {e}"),
        }
    }
    let pods_dir = root.join("pods");
    let mut pods = 0;
    for e in std::fs::read_dir(&pods_dir).into_iter().flatten().flatten() {
        let dir = e.path();
        if let Err(err) = crate::sync::sandbox::teardown_local(&dir) {
            eprintln!("pod {}: {err:#}", dir.display());
        }
        if let Err(err) = crate::sync::volumes::teardown(&dir) {
            eprintln!("pod volumes {}: {err:#}", dir.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
        pods += 1;
    }
    if !rec.cgroup_root.is_empty() {
        let cg = Cgroups::detect().map_err(|e| anyhow!("{}", ferrolet_fsutil::chain(&e)))?;
        let kubepods = format!("{}/kubepods", rec.cgroup_root.trim_end_matches('/'));
        if let Err(e) = cg.remove(&kubepods) {
            eprintln!("{}", ferrolet_fsutil::chain(&e));
        }
        for d in rec.created_cgroup_dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
    if !rec.pod_logs_dir.as_os_str().is_empty() {
        for e in std::fs::read_dir(&rec.pod_logs_dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.rsplit('_').next().is_some_and(|u| uids.contains(u)) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    for f in ["ferrolet.sock", "exec.sock", "agent.json"] {
        let _ = std::fs::remove_file(root.join(f));
    }
    println!("removed {removed} containers and {pods} pods from {}", root.display());
    Ok(0)
}
