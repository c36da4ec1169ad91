//! Pod volumes on the node (kubelet's volume manager): emptyDir (a directory, or tmpfs for
//! `medium: Memory`), hostPath with its type checks, and the volumes made of files from the pod
//! and from API objects: downwardAPI and configMap on disk, secret and projected on tmpfs (never
//! on disk), each written through the [`atomic_writer`](super::atomic_writer) so that a resync
//! updates them in place, all at once. Then each container's volumeMounts become bind mounts
//! (subPath, readOnly, mountPropagation). Directories live where kubelet keeps them:
//! `<root>/pods/<uid>/volumes/<plugin>/<name>`.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use ferrolet_runtime::config::{Mount, MountKind, Propagation};
use k8s_openapi::api::core::v1::{Container, Pod, Volume};

use super::atomic_writer::{self, Payload};
use super::payloads;
use crate::objects::VolumeObjects;
use crate::pod;
use crate::pod::expansion::expand;
use crate::pod::fieldpath::PodFacts;

#[derive(Debug, Clone)]
pub struct VolumeHost {
    pub path: PathBuf,
    /// configMap, secret, downwardAPI and projected volumes are always read-only in the container.
    pub readonly: bool,
    /// emptyDir: subPaths may be created inside it.
    pub writable_by_us: bool,
}

pub fn pod_volumes_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("volumes")
}

/// A volume that could not be set up, in kubelet's words (the FailedMount event's message).
#[derive(Debug)]
pub struct SetUpFailed {
    pub volume: String,
    pub message: String,
}

impl std::fmt::Display for SetUpFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MountVolume.SetUp failed for volume {:?} : {}",
            self.volume, self.message
        )
    }
}

impl std::error::Error for SetUpFailed {}

/// Set up every volume of the pod (again on every sync: object-backed volumes are rewritten
/// when their content changed); returns where each lives on the node. `objects` holds what
/// configMap, secret and projected volumes need.
pub fn setup(
    p: &Pod,
    pod_dir: &Path,
    facts: &PodFacts,
    node_memory: i64,
    objects: &VolumeObjects,
) -> Result<BTreeMap<String, VolumeHost>> {
    let mut out = BTreeMap::new();
    let fs_group = pod::spec(p).security_context.as_ref().and_then(|s| s.fs_group);
    for v in pod::spec(p).volumes.iter().flatten() {
        let host = setup_one(p, v, pod_dir, facts, node_memory, fs_group, objects).map_err(|e| SetUpFailed {
            volume: v.name.clone(),
            message: format!("{e:#}"),
        })?;
        out.insert(v.name.clone(), host);
    }
    Ok(out)
}

fn setup_one(
    p: &Pod,
    v: &Volume,
    pod_dir: &Path,
    facts: &PodFacts,
    node_memory: i64,
    fs_group: Option<i64>,
    objects: &VolumeObjects,
) -> Result<VolumeHost> {
    let base = pod_volumes_dir(pod_dir);
    if let Some(e) = &v.empty_dir {
        let dir = base.join("kubernetes.io~empty-dir").join(&v.name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        if e.medium.as_deref() == Some("Memory") && !is_mountpoint(&dir) {
            let size = match &e.size_limit {
                Some(q) => crate::pod::units::bytes(&q.0).map_err(|e| anyhow!("sizeLimit: {e}"))?,
                None => node_memory,
            };
            mount_tmpfs(&dir, &format!("mode=0777,size={}", size.max(4096)))?;
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
        if let Some(g) = fs_group {
            apply_fs_group(&dir, g as u32, false)?;
        }
        return Ok(VolumeHost {
            path: dir,
            readonly: false,
            writable_by_us: true,
        });
    }
    if let Some(h) = &v.host_path {
        let path = PathBuf::from(&h.path);
        check_host_path(&path, h.type_.as_deref().unwrap_or(""))?;
        return Ok(VolumeHost {
            path,
            readonly: false,
            writable_by_us: false,
        });
    }
    // The volumes of files: (plugin directory, on tmpfs, content).
    let (plugin, memory, payload) = if let Some(d) = &v.downward_api {
        let mode = d.default_mode.unwrap_or(payloads::DEFAULT_MODE);
        let files = payloads::downward_api(p, d.items.as_deref().unwrap_or(&[]), mode, facts);
        ("kubernetes.io~downward-api", false, files)
    } else if let Some(c) = &v.config_map {
        ("kubernetes.io~configmap", false, payloads::config_map(c, objects))
    } else if let Some(s) = &v.secret {
        ("kubernetes.io~secret", true, payloads::secret(s, objects))
    } else if let Some(pr) = &v.projected {
        let files = payloads::projected(p, &v.name, pr, objects, facts, fs_group.is_some());
        ("kubernetes.io~projected", true, files)
    } else {
        bail!("unsupported volume type")
    };
    let payload = payload.map_err(anyhow::Error::msg)?;
    let dir = base.join(plugin).join(&v.name);
    write_files_volume(&dir, memory, node_memory, &payload, fs_group)?;
    Ok(VolumeHost {
        path: dir,
        readonly: true,
        writable_by_us: false,
    })
}

/// A volume of files: its directory (tmpfs for secrets), the payload written atomically, the
/// group ownership of fsGroup (read-only) on what was written.
fn write_files_volume(
    dir: &Path,
    memory: bool,
    node_memory: i64,
    payload: &Payload,
    fs_group: Option<i64>,
) -> Result<()> {
    if !dir.is_dir() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))?;
    }
    if memory && !is_mountpoint(dir) {
        mount_tmpfs(dir, &format!("size={}", node_memory.max(4096)))?;
    }
    let gid = fs_group.map(|g| g as u32);
    let set_perms = |version: &Path| match gid {
        Some(g) => apply_fs_group(version, g, true),
        None => Ok(()),
    };
    if atomic_writer::write(dir, payload, &set_perms)? {
        tracing::info!(volume = %dir.display(), files = payload.len(), "volume contents written");
        if let Some(g) = gid {
            let md = std::fs::metadata(dir)?;
            if md.gid() != g {
                std::os::unix::fs::lchown(dir, None, Some(g))?;
            }
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode((md.mode() & 0o7777) | 0o2550))?;
        }
    }
    Ok(())
}

fn mount_tmpfs(dir: &Path, opts: &str) -> Result<()> {
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(opts),
    )
    .with_context(|| format!("mounting tmpfs on {}", dir.display()))
}

fn check_host_path(path: &Path, typ: &str) -> Result<()> {
    let md = std::fs::metadata(path);
    use std::os::unix::fs::FileTypeExt;
    match typ {
        "" => Ok(()),
        "DirectoryOrCreate" => {
            if md.is_err() {
                std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
                return Ok(());
            }
            if !md?.is_dir() {
                bail!("hostPath type check failed: {} is not a directory", path.display());
            }
            Ok(())
        }
        "FileOrCreate" => {
            if md.is_err() {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(path)?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))?;
                return Ok(());
            }
            if !md?.is_file() {
                bail!("hostPath type check failed: {} is not a file", path.display());
            }
            Ok(())
        }
        "Directory" | "File" | "Socket" | "CharDevice" | "BlockDevice" => {
            let md = md.map_err(|_| anyhow!("hostPath type check failed: {} does not exist", path.display()))?;
            let ft = md.file_type();
            let ok = match typ {
                "Directory" => ft.is_dir(),
                "File" => ft.is_file(),
                "Socket" => ft.is_socket(),
                "CharDevice" => ft.is_char_device(),
                _ => ft.is_block_device(),
            };
            if !ok {
                bail!("hostPath type check failed: {} is not a {typ}", path.display());
            }
            Ok(())
        }
        other => bail!("hostPath type {other:?} is not a known type"),
    }
}

/// kubelet's SetVolumeOwnership: group fsGroup, group rw (read for read-only volumes), setgid
/// on directories; symlinks are left alone.
fn apply_fs_group(dir: &Path, gid: u32, readonly: bool) -> Result<()> {
    let (dir_bits, file_bits) = if readonly { (0o2550, 0o440) } else { (0o2070, 0o060) };
    let md = std::fs::symlink_metadata(dir)?;
    if md.gid() != gid {
        std::os::unix::fs::lchown(dir, None, Some(gid))?;
    }
    let mode = md.mode() & 0o7777;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | dir_bits))?;
    if md.is_dir() {
        for e in std::fs::read_dir(dir)?.flatten() {
            let t = e.file_type()?;
            if t.is_symlink() {
                continue;
            }
            if t.is_dir() {
                apply_fs_group(&e.path(), gid, readonly)?;
            } else {
                let m = e.metadata()?;
                if m.gid() != gid {
                    std::os::unix::fs::lchown(e.path(), None, Some(gid))?;
                }
                std::fs::set_permissions(
                    e.path(),
                    std::fs::Permissions::from_mode((m.mode() & 0o7777) | file_bits),
                )?;
            }
        }
    }
    Ok(())
}

/// A container's volumeMounts as runtime bind mounts.
/// `subPathExpr` is expanded with the container's environment (`$(VAR)`), as kubelet does.
pub fn mounts_for(
    c: &Container,
    volumes: &BTreeMap<String, VolumeHost>,
    privileged: bool,
    env: &[(String, String)],
    subpaths: &Path,
) -> Result<Vec<Mount>> {
    let mut out = Vec::new();
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        let v = volumes
            .get(&m.name)
            .ok_or_else(|| anyhow!("volumeMounts[{i}]: volume {:?} not found", m.name))?;
        let mut source = v.path.clone();
        let expanded = match m.sub_path_expr.as_deref().filter(|s| !s.is_empty()) {
            Some(e) => Some(expand_sub_path(e, env)?),
            None => None,
        };
        if let Some(sp) = expanded.as_deref().or(m.sub_path.as_deref()).filter(|s| !s.is_empty()) {
            let create = v.writable_by_us || v.path.is_dir();
            let target = subpaths.join(&m.name).join(&c.name).join(i.to_string());
            source = bind_sub_path(&v.path, sp, create, &target)
                .with_context(|| format!("volumeMounts[{i}]: subPath {sp:?} of volume {:?}", m.name))?;
        }
        let propagation = match m.mount_propagation.as_deref() {
            None | Some("None") => Propagation::Private,
            Some("HostToContainer") => Propagation::HostToContainer,
            Some("Bidirectional") if privileged => Propagation::Bidirectional,
            Some("Bidirectional") => {
                bail!("volumeMounts[{i}]: Bidirectional mount propagation is available only to privileged containers")
            }
            Some(o) => bail!("volumeMounts[{i}]: unknown mountPropagation {o:?}"),
        };
        out.push(Mount {
            destination: m.mount_path.clone(),
            source,
            kind: MountKind::Bind,
            readonly: m.read_only.unwrap_or(false) || v.readonly,
            propagation,
            options: Vec::new(),
        });
    }
    Ok(out)
}

/// Where a pod's subPath bind mounts live: `<pod dir>/volume-subpaths/<volume>/<container>/<n>`
/// (kubelet's layout).
pub fn subpaths_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("volume-subpaths")
}

/// kubelet's safe subPath: `sp` is resolved (and, for a volume the agent manages, created as
/// directories) strictly beneath the volume's root, so a symlink a container planted in the
/// volume cannot lead out of it, and nothing is created outside it; then the opened object
/// itself (`/proc/self/fd/N`) is bind-mounted onto `target`, which is what the container
/// mounts: what it gets is what was checked, whatever the volume holds a moment later. A
/// `target` already bound to the same object (the container's earlier attempt) is reused.
fn bind_sub_path(volume: &Path, sp: &str, create: bool, target: &Path) -> Result<PathBuf> {
    use std::os::fd::AsRawFd;
    let root = ferrolet_fsutil::RootDir::open(volume)?;
    let opened = match root.open_at(sp, libc::O_PATH) {
        Ok(fd) => fd,
        Err(e) if e.is_not_found() && create => {
            let fd = root.create_dir_all(sp, 0o777)?;
            // Created with the umask: a subPath directory is everyone's, as kubelet makes it.
            std::fs::set_permissions(
                format!("/proc/self/fd/{}", fd.as_raw_fd()),
                std::fs::Permissions::from_mode(0o777),
            )
            .context("setting the subPath directory's mode")?;
            fd
        }
        Err(e) if e.is_not_found() => bail!("it does not exist in the volume"),
        Err(e) if e.errno() == Some(libc::EXDEV) || e.errno() == Some(libc::ELOOP) => {
            bail!("it resolves outside the volume")
        }
        Err(e) => return Err(e.into()),
    };
    let magic = PathBuf::from(format!("/proc/self/fd/{}", opened.as_raw_fd()));
    let object = std::fs::metadata(&magic).context("inspecting the subPath")?;
    if let Ok(bound) = std::fs::metadata(target) {
        if bound.dev() == object.dev() && bound.ino() == object.ino() && is_mountpoint(target) {
            return Ok(target.to_path_buf());
        }
        if is_mountpoint(target) {
            ferrolet_runtime::rootfs::unmount(target).with_context(|| format!("unmounting {}", target.display()))?;
        }
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    if object.is_dir() {
        match std::fs::create_dir(target) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(e).with_context(|| format!("creating {}", target.display()))
            }
            _ => {}
        }
    } else {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(target)
            .with_context(|| format!("creating {}", target.display()))?;
    }
    nix::mount::mount(
        Some(&magic),
        target,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .with_context(|| format!("bind-mounting the subPath onto {}", target.display()))?;
    Ok(target.to_path_buf())
}

/// Expand a subPathExpr as kubelet does: every referenced variable must have a non-empty
/// value, and the result must be a relative path without `..`.
pub fn expand_sub_path(expr: &str, env: &[(String, String)]) -> Result<String> {
    let value = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut missing = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("$(") {
        let escaped = i > 0 && rest.as_bytes()[i - 1] == b'$';
        let after = &rest[i + 2..];
        let Some(j) = after.find(')') else { break };
        let name = &after[..j];
        if !escaped && value(name).is_none_or(|v| v.is_empty()) {
            missing.push(name.to_string());
        }
        rest = &after[j + 1..];
    }
    if !missing.is_empty() {
        missing.sort();
        missing.dedup();
        bail!("missing value for {}", missing.join(", "));
    }
    let p = expand(expr, &|n: &str| value(n));
    if p.starts_with('/') {
        bail!("error SubPath `{p}` must not be an absolute path");
    }
    if p.split('/').any(|c| c == "..") {
        bail!("unable to provision SubPath `{p}`: must not contain '..'");
    }
    Ok(p)
}

/// Unmount the subPath binds and the tmpfs volumes, and remove the pod's volume directories
/// (hostPaths are untouched).
pub fn teardown(pod_dir: &Path) -> Result<()> {
    let subpaths = subpaths_dir(pod_dir);
    for m in ferrolet_runtime::rootfs::mounts_under(&subpaths) {
        ferrolet_runtime::rootfs::unmount(&m).with_context(|| format!("unmounting {}", m.display()))?;
    }
    match std::fs::remove_dir_all(&subpaths) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).context("removing the subPath mounts");
        }
        _ => {}
    }
    // tmpfs: memory emptyDirs, secrets, projected volumes.
    for plugin in [
        "kubernetes.io~empty-dir",
        "kubernetes.io~secret",
        "kubernetes.io~projected",
    ] {
        let base = pod_volumes_dir(pod_dir).join(plugin);
        if let Ok(rd) = std::fs::read_dir(&base) {
            for e in rd.flatten() {
                if is_mountpoint(&e.path()) {
                    ferrolet_runtime::rootfs::unmount(&e.path())
                        .with_context(|| format!("unmounting {}", e.path().display()))?;
                }
            }
        }
    }
    match std::fs::remove_dir_all(pod_volumes_dir(pod_dir)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).context("removing pod volumes"),
    }
}

pub fn is_mountpoint(p: &Path) -> bool {
    let (Ok(a), Ok(b)) = (
        std::fs::metadata(p),
        p.parent()
            .map(std::fs::metadata)
            .unwrap_or_else(|| Err(std::io::Error::other("root"))),
    ) else {
        return false;
    };
    a.dev() != b.dev()
        || std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
            let s = p.display().to_string();
            m.lines().any(|l| l.split(' ').nth(4) == Some(s.as_str()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_path_expr_rules() {
        let env = vec![
            ("POD".to_string(), "p1".to_string()),
            ("EMPTY".to_string(), String::new()),
            ("UP".to_string(), "..".into()),
        ];
        assert_eq!(expand_sub_path("logs/$(POD)", &env).unwrap(), "logs/p1");
        assert_eq!(expand_sub_path("$$(POD)", &env).unwrap(), "$(POD)");
        let e = expand_sub_path("$(EMPTY)/$(NOPE)", &env).unwrap_err().to_string();
        assert_eq!(e, "missing value for EMPTY, NOPE");
        let e = expand_sub_path("$(UP)", &env).unwrap_err().to_string();
        assert!(e.contains("must not contain '..'"), "{e}");
        assert!(expand_sub_path("/abs", &env)
            .unwrap_err()
            .to_string()
            .contains("absolute"));
    }

    #[test]
    fn config_map_and_downward_api_volumes_update_in_place() {
        let t = tempfile::tempdir().unwrap();
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c"}], "volumes": [
                {"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "k", "path": "conf/k.txt"}]}},
                {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}
            ]}
        }))
        .unwrap();
        let objects = |v: &str| {
            let cm: k8s_openapi::api::core::v1::ConfigMap =
                serde_json::from_value(serde_json::json!({"metadata": {"name": "cfg"}, "data": {"k": v}})).unwrap();
            let mut o = VolumeObjects::default();
            o.config_maps.insert("cfg".into(), Ok(Some(std::sync::Arc::new(cm))));
            o
        };
        let hosts = setup(&p, t.path(), &PodFacts::default(), 1 << 30, &objects("one")).unwrap();
        let cfg = &hosts["cfg"];
        assert!(cfg.readonly && cfg.path.ends_with("volumes/kubernetes.io~configmap/cfg"));
        assert_eq!(std::fs::read_to_string(cfg.path.join("conf/k.txt")).unwrap(), "one");
        assert_eq!(
            std::fs::read_link(cfg.path.join("conf")).unwrap(),
            Path::new("..data/conf")
        );
        let info = &hosts["info"];
        assert_eq!(
            std::fs::read_to_string(info.path.join("labels")).unwrap(),
            "app=\"web\""
        );
        let before = std::fs::read_link(cfg.path.join(atomic_writer::DATA_DIR)).unwrap();
        setup(&p, t.path(), &PodFacts::default(), 1 << 30, &objects("two")).unwrap();
        assert_eq!(std::fs::read_to_string(cfg.path.join("conf/k.txt")).unwrap(), "two");
        assert_ne!(
            std::fs::read_link(cfg.path.join(atomic_writer::DATA_DIR)).unwrap(),
            before
        );
        // A missing configMap names itself as kubelet does.
        let mut none = VolumeObjects::default();
        none.config_maps.insert("cfg".into(), Ok(None));
        let e = setup(&p, t.path(), &PodFacts::default(), 1 << 30, &none).unwrap_err();
        assert_eq!(
            e.to_string(),
            "MountVolume.SetUp failed for volume \"cfg\" : configmap \"cfg\" not found"
        );
        teardown(t.path()).unwrap();
    }
}
