//! The `/var/log/containers/<pod>_<namespace>_<container>-<id>.log` symlinks to the containers'
//! CRI log files, which log shippers (fluent-bit, vector, promtail) read, as kubelet's
//! kuberuntime makes them (legacyLogSymlink): made right after the container is created,
//! removed with the container. Every removal of a container goes through
//! [`remove_container`] so its link goes with it. docs/agent.md#container-log-links

use std::path::{Path, PathBuf};

use ferrolet_runtime::{ContainerInfo, Runtime};
use tracing::{debug, warn};

use super::labels::{LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE};

/// ext4's longest file name; kubelet cuts the link's name to fit.
const MAX_FILE_NAME: usize = 255;
const SUFFIX: &str = ".log";

/// kubelet's logSymlink: `<dir>/<pod>_<namespace>_<container>-<container id>.log`, the part
/// before `.log` cut so that the name stays within 255 bytes.
pub fn link_path(dir: &Path, pod: &str, namespace: &str, container: &str, id: &str) -> PathBuf {
    let mut name = format!("{pod}_{namespace}_{container}-{id}");
    if name.len() > MAX_FILE_NAME - SUFFIX.len() {
        let mut cut = MAX_FILE_NAME - SUFFIX.len();
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
    }
    dir.join(name + SUFFIX)
}

/// The link of a container, from the labels the agent put on it (none for a container that is
/// not a pod's or lost its labels).
pub fn link_of(dir: &Path, info: &ContainerInfo) -> Option<PathBuf> {
    let l = &info.record.labels;
    Some(link_path(
        dir,
        l.get(LABEL_POD_NAME)?,
        l.get(LABEL_POD_NAMESPACE)?,
        l.get(LABEL_CONTAINER_NAME)?,
        &info.record.id,
    ))
}

/// Make the link of a just created container. A failure is logged, as kubelet does: the
/// container runs without it.
pub fn create(dir: &Path, info: &ContainerInfo) {
    let Some(link) = link_of(dir, info) else { return };
    let target = &info.record.log_path;
    if target.as_os_str().is_empty() {
        return;
    }
    let made = std::fs::create_dir_all(dir).and_then(|()| {
        // A link left by an earlier try with the same id is replaced.
        match std::fs::remove_file(&link) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::os::unix::fs::symlink(target, &link)
    });
    match made {
        Ok(()) => debug!(link = %link.display(), target = %target.display(), "container log link made"),
        Err(e) => warn!(
            link = %link.display(),
            target = %target.display(),
            error = %e,
            "failed to create the container log symlink"
        ),
    }
}

/// Remove a container's link (gone already is fine).
pub fn remove(dir: &Path, info: &ContainerInfo) {
    let Some(link) = link_of(dir, info) else { return };
    match std::fs::remove_file(&link) {
        Ok(()) => debug!(link = %link.display(), "container log link removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => warn!(link = %link.display(), error = %e, "failed to remove the container log symlink"),
    }
}

/// Remove a container from the runtime and what the agent keeps beside it outside the runtime
/// (its log link): the one way containers are removed.
pub async fn remove_container(rt: &Runtime, link_dir: &Path, id: &str) -> ferrolet_runtime::Result<()> {
    let info = rt.inspect(id).ok();
    crate::metrics::global()
        .time_runtime("remove_container", rt.delete(id))
        .await?;
    if let Some(info) = info {
        remove(link_dir, &info);
    }
    Ok(())
}

/// Remove the links in `dir` that point into `pod_logs_dir` at files that no longer exist
/// (kubelet's container GC removes such dead links): what an agent stopped between removing a
/// container and its link leaves behind. Returns how many went.
pub fn remove_dead_links(dir: &Path, pod_logs_dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().and_then(|x| x.to_str()) != Some("log") {
            continue;
        }
        let Ok(target) = std::fs::read_link(&path) else {
            continue;
        };
        if target.starts_with(pod_logs_dir) && !target.exists() && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_kubelet_and_cut_to_ext4s_limit() {
        let p = link_path(Path::new("/var/log/containers"), "web", "default", "nginx", "abc123");
        assert_eq!(p, Path::new("/var/log/containers/web_default_nginx-abc123.log"));
        let long = "p".repeat(300);
        let p = link_path(Path::new("/d"), &long, "ns", "c", "id");
        let name = p.file_name().unwrap().to_str().unwrap();
        assert_eq!(name.len(), 255);
        assert!(name.ends_with("pp.log"), "{name}");
    }

    #[test]
    fn dead_links_into_the_pod_logs_go_and_others_stay() {
        let d = tempfile::tempdir().unwrap();
        let (links, logs) = (d.path().join("containers"), d.path().join("pods"));
        std::fs::create_dir_all(&links).unwrap();
        std::fs::create_dir_all(logs.join("ns_p_u/c")).unwrap();
        let live = logs.join("ns_p_u/c/0.log");
        std::fs::write(&live, "").unwrap();
        std::os::unix::fs::symlink(&live, links.join("p_ns_c-1.log")).unwrap();
        std::os::unix::fs::symlink(logs.join("ns_p_u/c/1.log"), links.join("p_ns_c-2.log")).unwrap();
        // Another agent's (or kubelet's) dead link is none of ours.
        std::os::unix::fs::symlink("/var/log/pods/x/0.log", links.join("x_ns_c-3.log")).unwrap();
        assert_eq!(remove_dead_links(&links, &logs), 1);
        assert!(links.join("p_ns_c-1.log").symlink_metadata().is_ok());
        assert!(links.join("p_ns_c-2.log").symlink_metadata().is_err());
        assert!(links.join("x_ns_c-3.log").symlink_metadata().is_ok());
    }
}
