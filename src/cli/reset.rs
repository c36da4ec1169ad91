//! `ferrolet reset`: stop and remove everything an agent created (pods, containers, sandboxes,
//! volumes, the pod network, the kubepods cgroup tree, pod logs, sockets, the checkpoint of the
//! API server's pods), for tearing down a
//! demo or a node. What lies outside the root dir it finds in the agent's record
//! ([`crate::agent::record`]).
//!
//! Records are not trusted to be readable. Containers are found by their state directories
//! (whose records the runtime rebuilds or leaves to the kernel), then by the kubepods cgroup
//! tree (every process in it is a container's) and by the mounts under the root dir. When
//! `agent.json` or its network settings cannot be read, reset falls back to what can be known:
//! the kubepods trees the containers' cgroups are in (or the one below its own cgroup holding
//! this root's pods), the netplug state under the root dir, the pod log directories the
//! containers' log paths are in. Whatever it could not do it says, and exits 1.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use ferrolet_fsutil::{chain, read_json, read_json_opt};
use ferrolet_netplug::{BridgeConfig, CniConfig, Mode, NetPlug};
use ferrolet_runtime::cgroups::Cgroups;
use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::{Runtime, ZygoteHandle};

use crate::agent::record::{record_path, AgentRecord};
use crate::kuberuntime::labels::LABEL_POD_UID;
use crate::podsetup::network::NetworkSettings;
use crate::podsetup::sandbox;
use crate::volumemanager::volumes;

/// Containers and the image ids they use, read from disk.
pub fn image_users(root: &Path) -> Vec<(String, Digest)> {
    ferrolet_runtime::container::list_records(root)
        .into_iter()
        .map(|r| (r.id, r.image_ref))
        .collect()
}

/// What could not be done: each printed when it happens, and counted for the exit code.
#[derive(Default)]
struct Failures(usize);

impl Failures {
    fn add(&mut self, what: String) {
        eprintln!("{what}");
        self.0 += 1;
    }
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
    let cg = Cgroups::detect()?;
    // Everything is attempted; what could not be done is said, and the exit code is 1.
    let mut failed = Failures::default();
    let rec = match read_json_opt::<AgentRecord>(&record_path(root)) {
        Ok(r) => Some(r.unwrap_or_default()),
        Err(e) => {
            failed.add(format!(
                "{}: unreadable ({}); falling back to what the containers, cgroups, mounts and network state show",
                record_path(root).display(),
                chain(&e)
            ));
            None
        }
    };

    // The containers, with what their records say (the runtime rebuilds unreadable ones).
    let containers = rt.list()?;
    let pods_dir = root.join("pods");
    // The pods this agent had: their uids name their log directories and pod cgroups.
    let mut uids: BTreeSet<String> = std::fs::read_dir(&pods_dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    uids.extend(
        containers
            .iter()
            .filter_map(|c| c.record.labels.get(LABEL_POD_UID).cloned()),
    );
    let container_ids: BTreeSet<String> = containers.iter().map(|c| c.id().to_string()).collect();
    let container_cgroups: Vec<String> = containers.iter().map(|c| c.record.cgroup_path.clone()).collect();
    let log_dirs: BTreeSet<PathBuf> = containers
        .iter()
        .filter_map(|c| pod_log_dir(&c.record.log_path, c.record.labels.get(LABEL_POD_UID)?))
        .collect();

    let mut removed = 0;
    for c in &containers {
        for problem in &c.record_errors {
            eprintln!("container {}: {problem}", c.id());
        }
        match rt.delete(c.id()).await {
            Ok(()) => removed += 1,
            Err(e) => failed.add(format!("container {}: {}", c.id(), chain(&e))),
        }
    }
    if let Err(e) = rt.remove_orphans() {
        failed.add(format!("container state: {}", chain(&e)));
    }

    // The kubepods trees: every process in them belongs to a container, with or without a
    // state directory.
    // The record's root is the truth even when empty: an agent run in a hierarchy's root
    // cgroup made `/kubepods` (its QoS children with it), which no search for pods would find
    // on a node without pods.
    let kubepods: Vec<String> = match rec.as_ref() {
        Some(r) => vec![format!("{}/kubepods", r.cgroup_root.trim_end_matches('/'))],
        None => {
            let found = find_kubepods(&cg, &container_cgroups, &uids, &container_ids);
            if rec.is_none() {
                if found.is_empty() {
                    eprintln!("no kubepods cgroup tree found without agent.json: no pod cgroup removed");
                } else {
                    eprintln!("kubepods cgroup trees found without agent.json: {}", found.join(", "));
                }
            }
            found
        }
    };
    let mut killed = 0;
    for k in &kubepods {
        let (cg2, k2) = (cg.clone(), k.clone());
        let before = cg.procs_below(k);
        let left = ferrolet_fsutil::blocking(move || {
            Ok::<_, ferrolet_fsutil::Error>(cg2.kill_all(&k2, Duration::from_secs(10)))
        })
        .await?;
        killed += before.iter().filter(|p| !left.contains(p)).count();
        if !left.is_empty() {
            failed.add(format!("processes {left:?} in {k} survived SIGKILL"));
        }
    }

    // (before the pods' namespaces are unpinned: CNI plugins get them for DEL)
    remove_network(root, rec.as_ref(), &mut failed).await;

    // Mounts left under the root dir (a container whose delete failed, pod mounts no record
    // knows): unmounted before any directory is removed, so no removal descends into them.
    let mut unmounted = 0;
    let pool_dir = crate::podsetup::pool_dir(root);
    for dir in [root.join("containers"), pods_dir.clone(), pool_dir.clone()] {
        let top = std::fs::canonicalize(&dir).unwrap_or(dir.clone());
        for m in ferrolet_runtime::rootfs::mounts_under(&dir) {
            if m == top {
                continue;
            }
            match ferrolet_runtime::rootfs::unmount(&m) {
                Ok(()) => unmounted += 1,
                Err(e) => failed.add(format!("unmounting {}: {e}", m.display())),
            }
        }
    }

    let mut pods = 0;
    for e in std::fs::read_dir(&pods_dir).into_iter().flatten().flatten() {
        let dir = e.path();
        if let Err(err) = sandbox::teardown_local(&dir) {
            failed.add(format!("pod {}: {err:#}", dir.display()));
        }
        if let Err(err) = volumes::teardown(&dir) {
            failed.add(format!("pod volumes {}: {err:#}", dir.display()));
        }
        let still = ferrolet_runtime::rootfs::mounts_under(&dir);
        if !still.is_empty() {
            failed.add(format!(
                "not removing {}: still mounted: {}",
                dir.display(),
                still
                    .iter()
                    .map(|m| m.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            continue;
        }
        if let Err(err) = std::fs::remove_dir_all(&dir) {
            failed.add(format!("removing {}: {err}", dir.display()));
        }
        pods += 1;
    }

    // The sandbox pool: its networks went with the others above.
    for f in crate::podsetup::pool::forget_all(&pool_dir).1 {
        failed.add(f);
    }
    if let Err(e) = std::fs::remove_dir(&pool_dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            failed.add(format!("removing {}: {e}", pool_dir.display()));
        }
    }

    // The checkpoint of the API server's pods (docs/offline.md): a node reset must not bring
    // them back at its next start without the server.
    if let Err(e) = ferrolet_fsutil::remove_tree(&root.join("checkpoint")) {
        failed.add(format!("the checkpoint: {}", chain(&e)));
    }

    for k in &kubepods {
        if let Err(e) = cg.remove(k) {
            failed.add(format!("kubepods cgroup: {}", chain(&e)));
        }
    }
    match &rec {
        // Innermost first (the agent's v2 leaf, then kubepods' ancestors the agent created). An
        // ancestor still in use by others (ENOTEMPTY, EBUSY) is theirs now and stays.
        Some(rec) => {
            for d in rec.created_cgroup_dirs.iter().rev() {
                match std::fs::remove_dir(d) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EBUSY)) => {}
                    Err(e) => failed.add(format!("removing cgroup {}: {e}", d.display())),
                }
            }
        }
        // Which ancestors of kubepods the agent created is not known: they stay, said.
        None => {
            for k in &kubepods {
                let parents = empty_ancestors(&cg, k);
                if !parents.is_empty() {
                    failed.add(format!(
                        "agent.json unreadable: cannot tell which parent cgroups of {k} the agent created; left (empty now): {}",
                        parents.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
    }

    match rec.as_ref().map(|r| r.pod_logs_dir.clone()) {
        Some(logs) if !logs.as_os_str().is_empty() => {
            for e in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.rsplit('_').next().is_some_and(|u| uids.contains(u)) {
                    if let Err(err) = std::fs::remove_dir_all(e.path()) {
                        failed.add(format!("removing {}: {err}", e.path().display()));
                    }
                }
            }
        }
        Some(_) => {}
        // Without the record: the pod log directories the containers' log paths are in.
        None => {
            for d in &log_dirs {
                if let Err(err) = std::fs::remove_dir_all(d) {
                    if err.kind() != std::io::ErrorKind::NotFound {
                        failed.add(format!("removing {}: {err}", d.display()));
                    }
                }
            }
            eprintln!(
                "agent.json unreadable: the pod log directory is unknown; removed the {} pod log directories containers named",
                log_dirs.len()
            );
        }
    }
    // The containers' log links: ours are those into the pod log directory, dead now.
    if let Some(r) = rec
        .as_ref()
        .filter(|r| !r.container_log_link_dir.as_os_str().is_empty())
    {
        let n = crate::kuberuntime::log_links::remove_dead_links(&r.container_log_link_dir, &r.pod_logs_dir);
        if n > 0 {
            eprintln!(
                "removed {n} container log links from {}",
                r.container_log_link_dir.display()
            );
        }
    }
    for f in ["ferrolet.sock", "exec.sock"] {
        let _ = std::fs::remove_file(root.join(f));
    }
    // The agent's bind mount of the root dir on itself (Runtime::isolate_mounts), last, once
    // nothing is mounted below it: what is left stays in sight for the next reset.
    let top = std::fs::canonicalize(root).unwrap_or(root.to_path_buf());
    if ferrolet_runtime::rootfs::mounts_under(root).iter().all(|m| *m == top) {
        match ferrolet_runtime::mount_ns::release_root(root) {
            Ok(true) => unmounted += 1,
            Ok(false) => {}
            Err(e) => failed.add(format!("the root dir's bind mount on itself: {e}")),
        }
    }
    // A readable record stays while something is left, so reset can be run again; an
    // unreadable one can teach the next run nothing: it is moved aside (and reported above).
    if rec.is_none() {
        let aside = root.join("agent.json.unreadable");
        if std::fs::rename(record_path(root), &aside).is_ok() {
            eprintln!(
                "moved the unreadable {} to {}",
                record_path(root).display(),
                aside.display()
            );
        }
    } else if failed.0 == 0 {
        let _ = std::fs::remove_file(record_path(root));
    }
    println!("removed {removed} containers and {pods} pods from {}", root.display());
    if killed > 0 {
        println!("killed {killed} processes left in the kubepods cgroups (containers without state)");
    }
    if unmounted > 0 {
        println!("unmounted {unmounted} mounts under the root dir");
    }
    if failed.0 > 0 {
        eprintln!("{} thing(s) could not be done (see above)", failed.0);
        return Ok(1);
    }
    Ok(0)
}

/// The pod log directory (`<logs>/<ns>_<name>_<uid>`) a container's log file is in.
fn pod_log_dir(log: &Path, uid: &str) -> Option<PathBuf> {
    let suffix = format!("_{uid}");
    log.ancestors()
        .find(|a| a.file_name().is_some_and(|n| n.to_string_lossy().ends_with(&suffix)))
        .map(Path::to_path_buf)
}

/// `<...>/kubepods` of a container's cgroup path, if it is in one.
fn kubepods_of(cgroup: &str) -> Option<String> {
    let i = cgroup.find("/kubepods/")?;
    Some(cgroup[..i + "/kubepods".len()].to_string())
}

/// Without the agent's record: the kubepods trees the containers' cgroups are in, else the one
/// below this process's cgroup (the agent's default root; on v2 its parent when this runs in
/// the agent's leaf) if it holds a pod of this root or a container cgroup of it.
fn find_kubepods(
    cg: &Cgroups,
    container_cgroups: &[String],
    uids: &BTreeSet<String>,
    ids: &BTreeSet<String>,
) -> Vec<String> {
    let mut found: BTreeSet<String> = container_cgroups.iter().filter_map(|c| kubepods_of(c)).collect();
    if found.is_empty() {
        if let Ok(own) = cg.own_path() {
            let own = own.trim_end_matches('/').to_string();
            let mut candidates = vec![format!("{own}/kubepods")];
            if let Some(parent) = own.strip_suffix("/ferrolet.agent") {
                candidates.push(format!("{parent}/kubepods"));
            }
            for k in candidates {
                let Some(dir) = cg.dir_for("memory", &k) else { continue };
                if holds_ours(&dir, uids, ids, 0) {
                    found.insert(k);
                }
            }
        }
    }
    found.into_iter().collect()
}

/// Whether a cgroup directory holds (at most 3 levels down) a `pod<uid>` of one of `uids` or a
/// container cgroup named by one of `ids`.
fn holds_ours(dir: &Path, uids: &BTreeSet<String>, ids: &BTreeSet<String>, depth: usize) -> bool {
    if depth > 3 {
        return false;
    }
    std::fs::read_dir(dir).into_iter().flatten().flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        e.file_type().is_ok_and(|t| t.is_dir())
            && (name.strip_prefix("pod").is_some_and(|u| uids.contains(u))
                || ids.contains(&name)
                || holds_ours(&e.path(), uids, ids, depth + 1))
    })
}

/// Ancestors of `cgroup` (every hierarchy) that exist and are empty, innermost first, below
/// this process's own cgroup's level.
fn empty_ancestors(cg: &Cgroups, cgroup: &str) -> Vec<PathBuf> {
    let own = cg.own_path().unwrap_or_else(|_| "/".into());
    let mut out = Vec::new();
    let mut cur = Path::new(cgroup).parent();
    while let Some(c) = cur {
        if c == Path::new("/") || c.as_os_str().is_empty() || Path::new(&own).starts_with(c) {
            break;
        }
        for d in cg.all_dirs(&c.to_string_lossy()) {
            let empty = std::fs::read_dir(&d).is_ok_and(|rd| !rd.flatten().any(|e| e.path().is_dir()))
                && std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|s| s.trim().is_empty());
            if empty {
                out.push(d);
            }
        }
        cur = c.parent();
    }
    out
}

/// Tear down every sandbox network and remove the bridge and the nftables table. The settings
/// come from agent.json; without them (unreadable, or no network recorded although netplug
/// state exists), from the netplug state under the root dir. `uninstall` runs even when `gc`
/// failed.
async fn remove_network(root: &Path, rec: Option<&AgentRecord>, failed: &mut Failures) {
    let recorded = rec.and_then(|r| r.network.clone());
    let settings = match recorded.map(serde_json::from_value::<NetworkSettings>) {
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => {
            failed.add(format!(
                "agent.json network settings unreadable ({e}); falling back to the netplug state under {}",
                root.display()
            ));
            None
        }
        None => None,
    };
    let mode = match settings {
        Some(s) => match mode_of(&s) {
            Ok(m) => m,
            Err(e) => {
                failed.add(format!("pod network settings: {e:#}"));
                fallback_mode(root)
            }
        },
        // No settings: only when agent.json itself could not be read is there anything to guess.
        None if rec.is_none() || rec.is_some_and(|r| r.network.is_some()) => fallback_mode(root),
        None => None,
    };
    let Some(mode) = mode else { return };
    let name = match &mode {
        Mode::Bridge(b) => format!("bridge {} ({})", b.bridge, b.subnet),
        Mode::Cni(c) => format!("CNI ({})", c.conf_dir.display()),
    };
    let plug = match NetPlug::new(mode).await {
        Ok(p) => p,
        Err(e) => {
            failed.add(format!("pod network {name}: {}", chain(&e)));
            return;
        }
    };
    match plug.gc(&[]).await {
        Ok(ids) => tracing::info!(sandboxes = ids.len(), "pod networks torn down"),
        Err(e) => failed.add(format!("tearing down pod networks ({name}): {}", chain(&e))),
    }
    if let Err(e) = plug.uninstall().await {
        failed.add(format!("removing the pod network {name} from the node: {}", chain(&e)));
    }
}

fn mode_of(s: &NetworkSettings) -> Result<Option<Mode>> {
    Ok(match s.mode.as_str() {
        "bridge" => Some(Mode::Bridge(BridgeConfig {
            bridge: s.bridge.clone(),
            subnet: s
                .subnet
                .parse()
                .map_err(|e| anyhow::anyhow!("pod subnet {:?}: {e}", s.subnet))?,
            state_dir: s.state_dir.clone(),
            ..BridgeConfig::default()
        })),
        "cni" => Some(Mode::Cni(CniConfig {
            conf_dir: s.cni_conf_dir.clone(),
            bin_dirs: s.cni_bin_dirs.clone(),
            state_dir: s.state_dir.clone(),
            ..CniConfig::default()
        })),
        _ => None,
    })
}

/// The network as the netplug state under the root dir shows it: bridge mode when
/// `<root>/network/ipam` holds a subnet (the bridge's name from a readable sandbox record, else
/// the default), CNI mode with the default configuration directories when `<root>/cni` has
/// sandbox records or cached results.
fn fallback_mode(root: &Path) -> Option<Mode> {
    let net = root.join("network");
    let subnet = ferrolet_fsutil::list_names(&net.join("ipam"))
        .unwrap_or_default()
        .into_iter()
        .find_map(|n| n.replacen('_', "/", 1).parse().ok());
    if let Some(subnet) = subnet {
        let bridge = ferrolet_fsutil::list_names(&net.join("sandboxes"))
            .unwrap_or_default()
            .into_iter()
            .find_map(|n| {
                let v: serde_json::Value = read_json(&net.join("sandboxes").join(n)).ok()?;
                v.get("bridge")?.as_str().map(str::to_string)
            });
        return Some(Mode::Bridge(BridgeConfig {
            bridge: bridge.unwrap_or_else(|| BridgeConfig::default().bridge),
            subnet,
            state_dir: net,
            ..BridgeConfig::default()
        }));
    }
    let cni = root.join("cni");
    let used = ["sandboxes", "results"]
        .iter()
        .any(|d| !ferrolet_fsutil::list_names(&cni.join(d)).unwrap_or_default().is_empty());
    used.then(|| Mode::Cni(CniConfig::new(cni)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubepods_and_log_dirs_from_container_paths() {
        assert_eq!(
            kubepods_of("/a/b/kubepods/burstable/pod1/abc").as_deref(),
            Some("/a/b/kubepods")
        );
        assert_eq!(kubepods_of("/kubepods/pod1/abc").as_deref(), Some("/kubepods"));
        assert_eq!(kubepods_of("/a/podx/abc"), None);
        assert_eq!(
            pod_log_dir(Path::new("/var/log/pods/ns_web_u-1/c/0.log"), "u-1"),
            Some(PathBuf::from("/var/log/pods/ns_web_u-1"))
        );
        assert_eq!(pod_log_dir(Path::new("/var/log/x/0.log"), "u-1"), None);
    }

    #[test]
    fn network_fallback_from_netplug_state() {
        let d = tempfile::tempdir().unwrap();
        assert!(fallback_mode(d.path()).is_none());
        std::fs::create_dir_all(d.path().join("network/ipam/10.77.0.0_16")).unwrap();
        std::fs::create_dir_all(d.path().join("network/sandboxes")).unwrap();
        std::fs::write(d.path().join("network/sandboxes/a.json"), "garbage").unwrap();
        std::fs::write(d.path().join("network/sandboxes/b.json"), r#"{"bridge":"br7"}"#).unwrap();
        match fallback_mode(d.path()) {
            Some(Mode::Bridge(b)) => {
                assert_eq!(b.bridge, "br7");
                assert_eq!(b.subnet.to_string(), "10.77.0.0/16");
                assert_eq!(b.state_dir, d.path().join("network"));
            }
            other => panic!("{other:?}"),
        }
    }
}
