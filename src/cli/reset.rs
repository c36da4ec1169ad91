//! `ferrolet reset`: stop and remove everything an agent created (pods, containers, sandboxes,
//! volumes, the pod network, the kubepods cgroup tree, pod logs, sockets), for tearing down a
//! demo or a node. What lies outside the root dir it finds in the agent's record
//! ([`crate::agent::record`]).

use std::path::Path;

use anyhow::Result;
use ferrolet_runtime::cgroups::Cgroups;
use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::{Runtime, ZygoteHandle};

use crate::agent::record::load_record;
use crate::kuberuntime::labels::LABEL_POD_UID;
use crate::podsetup::network::{self, NetworkSettings};
use crate::podsetup::{sandbox, volumes};

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
    let rt = Runtime::new(root, zygote)?;
    let rec = load_record(root);
    // The pods this agent had: their uids name their log directories.
    let mut uids: std::collections::BTreeSet<String> = std::fs::read_dir(root.join("pods"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for c in ferrolet_runtime::container::list_records(root) {
        if let Some(u) = c.labels.get(LABEL_POD_UID) {
            uids.insert(u.clone());
        }
    }
    // Everything is attempted; what could not be removed is said, and the exit code is 1.
    let mut failed = 0;
    let mut fail = |what: String| {
        eprintln!("{what}");
        failed += 1;
    };
    let mut removed = 0;
    for c in rt.list()? {
        match rt.delete(c.id()).await {
            Ok(()) => removed += 1,
            Err(e) => fail(format!("container {}: {}", c.id(), ferrolet_fsutil::chain(&e))),
        }
    }
    rt.remove_orphans()?;
    if let Some(v) = rec.network.clone() {
        match serde_json::from_value::<NetworkSettings>(v) {
            Ok(settings) => {
                if let Err(e) = network::remove_all(&settings).await {
                    fail(format!("pod network: {e:#}"));
                }
            }
            Err(e) => fail(format!("agent.json network: {e}")),
        }
    }
    let pods_dir = root.join("pods");
    let mut pods = 0;
    for e in std::fs::read_dir(&pods_dir).into_iter().flatten().flatten() {
        let dir = e.path();
        if let Err(err) = sandbox::teardown_local(&dir) {
            fail(format!("pod {}: {err:#}", dir.display()));
        }
        if let Err(err) = volumes::teardown(&dir) {
            fail(format!("pod volumes {}: {err:#}", dir.display()));
        }
        if let Err(err) = std::fs::remove_dir_all(&dir) {
            fail(format!("removing {}: {err}", dir.display()));
        }
        pods += 1;
    }
    if !rec.cgroup_root.is_empty() {
        let cg = Cgroups::detect()?;
        let kubepods = format!("{}/kubepods", rec.cgroup_root.trim_end_matches('/'));
        if let Err(e) = cg.remove(&kubepods) {
            fail(format!("kubepods cgroup: {}", ferrolet_fsutil::chain(&e)));
        }
        // Innermost first (the agent's v2 leaf, then kubepods' ancestors the agent created). An
        // ancestor still in use by others (ENOTEMPTY, EBUSY) is theirs now and stays.
        for d in rec.created_cgroup_dirs.iter().rev() {
            match std::fs::remove_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EBUSY)) => {}
                Err(e) => fail(format!("removing cgroup {}: {e}", d.display())),
            }
        }
    }
    if !rec.pod_logs_dir.as_os_str().is_empty() {
        for e in std::fs::read_dir(&rec.pod_logs_dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.rsplit('_').next().is_some_and(|u| uids.contains(u)) {
                if let Err(err) = std::fs::remove_dir_all(e.path()) {
                    fail(format!("removing {}: {err}", e.path().display()));
                }
            }
        }
    }
    for f in ["ferrolet.sock", "exec.sock"] {
        let _ = std::fs::remove_file(root.join(f));
    }
    // The record stays while something is left, so reset can be run again.
    if failed == 0 {
        let _ = std::fs::remove_file(crate::agent::record::record_path(root));
    }
    println!("removed {removed} containers and {pods} pods from {}", root.display());
    if failed > 0 {
        eprintln!("{failed} thing(s) could not be removed (see above)");
        return Ok(1);
    }
    Ok(0)
}
