//! A Kubernetes container of a pod turned into what the runtime runs (kubelet's
//! generateContainerConfig): command/args/env with $(VAR) expansion, user and groups from the
//! security contexts, capabilities, seccomp, read-only rootfs, the sandbox's namespaces, cgroup
//! limits from requests and limits, volume mounts plus the files kubelet manages (/etc/hosts,
//! /etc/hostname, /etc/resolv.conf, /dev/shm, the termination message file), and labels that
//! let the agent find the container again after a restart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, Result};
use ferrolet_runtime::config::{
    CapabilityChanges, ContainerConfig, LogConfig, Mount, MountKind, NamespaceMode, Namespaces, Propagation, Resources,
    SeccompProfile, SupplementalGroupsPolicy, UserConfig,
};
use k8s_openapi::api::core::v1::{Container, Pod, SeccompProfile as K8sSeccomp};

use super::env;
use super::labels::{container_annotations, container_labels, ContainerKind, TerminationMessage};
use crate::config::Config;
use crate::pod::expansion::expand_all;
use crate::pod::fieldpath::PodFacts;
use crate::pod::{self, qos};
use crate::podsetup::dns;
use crate::podsetup::sandbox::Sandbox;
use crate::podsetup::selinux;
use crate::volumemanager::volumes::{self, VolumeHost};

/// Where a pod's container logs go: `<podLogsDir>/<ns>_<name>_<uid>/<container>/<attempt>.log`.
pub fn pod_log_dir(cfg: &Config, p: &Pod) -> PathBuf {
    cfg.pod_logs_dir
        .join(format!("{}_{}_{}", pod::namespace(p), pod::name(p), pod::uid(p)))
}

/// Everything a container's config is generated from; owned, so the build (which writes files
/// and makes subPath mounts) can run on the blocking pool.
pub struct BuildInput {
    pub cfg: Arc<Config>,
    pub pod: Arc<Pod>,
    pub container: Container,
    pub kind: ContainerKind,
    pub attempt: u32,
    pub sandbox: Sandbox,
    pub pod_cgroup: String,
    pub pod_dir: PathBuf,
    pub volumes: BTreeMap<String, VolumeHost>,
    pub facts: PodFacts,
    /// The machine's memory capacity: containers' oom_score_adj scales by it, as kubelet's
    /// GetContainerOOMScoreAdjust does (not by allocatable).
    pub node_memory: i64,
    /// The ConfigMaps, Secrets and Service variables the environment uses (fetched already).
    pub env_objects: crate::objects::EnvObjects,
    /// The process namespace to join instead of the pod's (or one of its own): an ephemeral
    /// container's target's (`targetContainerName`).
    pub pid_namespace: Option<PathBuf>,
    /// What device plugins gave the container: device nodes, mounts, env, annotations.
    pub devices: Option<crate::cm::devicemanager::allocation::Allocated>,
}

/// Errors here are kubelet's CreateContainerConfigError.
pub fn build(input: &BuildInput) -> Result<ContainerConfig> {
    let (p, c, cfg) = (&*input.pod, &input.container, &*input.cfg);
    let spec = pod::spec(p);
    let psc = spec.security_context.clone().unwrap_or_default();
    let csc = c.security_context.clone().unwrap_or_default();

    let mut env = env::build(p, c, &input.facts, &input.env_objects).map_err(anyhow::Error::msg)?;
    // The device plugins' variables come after the container's own, as kubelet appends them.
    if let Some(a) = &input.devices {
        for (k, v) in &a.envs {
            env.retain(|(name, _)| name != k);
            env.push((k.clone(), v.clone()));
        }
    }
    let command = expand_all(c.command.as_deref().unwrap_or(&[]), &env);
    let args = expand_all(c.args.as_deref().unwrap_or(&[]), &env);

    let uid = csc.run_as_user.or(psc.run_as_user);
    let gid = csc.run_as_group.or(psc.run_as_group);
    let to_u32 =
        |v: i64, what: &str| u32::try_from(v).map_err(|_| anyhow!("securityContext.{what}: {v} is out of range"));
    let mut groups: Vec<u32> = Vec::new();
    for g in psc.supplemental_groups.iter().flatten() {
        groups.push(to_u32(*g, "supplementalGroups")?);
    }
    if let Some(fg) = psc.fs_group {
        groups.push(to_u32(fg, "fsGroup")?);
    }
    let groups_policy = match psc.supplemental_groups_policy.as_deref() {
        None | Some("Merge") => SupplementalGroupsPolicy::Merge,
        Some("Strict") => SupplementalGroupsPolicy::Strict,
        // kubelet's generatePodSandboxLinuxConfig, word for word.
        Some(other) => return Err(anyhow!("unsupported supplementalGroupsPolicy: {other}")),
    };
    let privileged = csc.privileged.unwrap_or(false);

    let seccomp = match csc.seccomp_profile.as_ref().or(psc.seccomp_profile.as_ref()) {
        Some(s) => seccomp_of(s, cfg)?,
        None if cfg.seccomp_default => SeccompProfile::RuntimeDefault,
        None => SeccompProfile::Unconfined,
    };

    let apparmor_profile = apparmor_profile(p, c, privileged, &cfg.root_dir)?;
    let pods_dir = input.pod_dir.parent().unwrap_or(&input.pod_dir);
    let selinux_labels = selinux::container_labels(input.sandbox.selinux.as_ref(), c, || {
        crate::podsetup::sandbox::selinux_levels(pods_dir)
    })
    .map_err(anyhow::Error::msg)?;

    let ns_of = |p: &Option<PathBuf>| match p {
        Some(p) => NamespaceMode::Path(p.clone()),
        None => NamespaceMode::Host,
    };
    let namespaces = Namespaces {
        network: ns_of(&input.sandbox.net),
        ipc: ns_of(&input.sandbox.ipc),
        uts: ns_of(&input.sandbox.uts),
        // shareProcessNamespace: the pod's, held by its init (docs/sandbox.md)
        pid: match (&input.sandbox.pid, spec.host_pid.unwrap_or(false)) {
            (_, true) => NamespaceMode::Host,
            (Some(pin), false) => NamespaceMode::Path(pin.clone()),
            (None, false) => match &input.pid_namespace {
                Some(target) => NamespaceMode::Path(target.clone()),
                None => NamespaceMode::Private,
            },
        },
    };

    let qos_class = qos::qos_class(p);
    let cpu_req = qos::request(c, "cpu");
    let cpu_lim = qos::limit(c, "cpu");
    let mem_lim = qos::limit(c, "memory");
    let cfs_period_us = cfg.cm.cpu_cfs_quota_period.as_micros() as u64;
    let resources = Resources {
        cpu_shares: Some(qos::milli_cpu_to_shares(if cpu_req == 0 { cpu_lim } else { cpu_req })),
        // cpuCFSQuota off: no quota, as kubelet sets none.
        cpu_quota: (cpu_lim > 0 && cfg.cm.cpu_cfs_quota)
            .then(|| qos::milli_cpu_to_quota_with_period(cpu_lim, cfs_period_us)),
        cpu_period: (cpu_lim > 0 && cfg.cm.cpu_cfs_quota).then_some(cfs_period_us),
        memory_limit: (mem_lim > 0).then_some(mem_lim),
        pids_limit: None,
        oom_score_adj: Some(qos::oom_score_adj(
            qos_class,
            qos::request(c, "memory"),
            input.node_memory,
        )),
        // kubelet sets memory.oom.group on cgroup v2 unless singleProcessOOMKill.
        oom_group: !cfg.cm.single_process_oom_kill,
    };

    // Volume mounts first; the files kubelet manages only where the container has none.
    let subpaths = volumes::subpaths_dir(&input.pod_dir);
    let mut mounts = volumes::mounts_for(c, &input.volumes, privileged, &env, &subpaths)?;
    let taken = |path: &str, mounts: &[Mount]| mounts.iter().any(|m| m.destination.trim_end_matches('/') == path);
    // hostUsers: false: the pod's user namespace, and the files the agent makes for the pod
    // idmapped onto it where their filesystem takes that (docs/userns.md).
    let user_namespace = match (&input.sandbox.user, input.sandbox.userns) {
        (Some(path), Some(range)) => Some(ferrolet_runtime::config::UserNamespace {
            path: path.clone(),
            range,
        }),
        _ => None,
    };
    let idmap_managed = user_namespace
        .as_ref()
        .is_some_and(|u| ferrolet_runtime::idmap::supported(&input.pod_dir, &u.path));
    let bind = |dest: &str, source: PathBuf, readonly: bool| Mount {
        destination: dest.to_string(),
        source,
        kind: MountKind::Bind,
        readonly,
        propagation: Propagation::Private,
        options: Vec::new(),
        idmap: idmap_managed,
    };
    for (dest, file) in [
        ("/etc/hosts", "etc-hosts"),
        ("/etc/hostname", "hostname"),
        ("/etc/resolv.conf", "resolv.conf"),
    ] {
        if !taken(dest, &mounts) {
            mounts.push(bind(dest, input.pod_dir.join(file), false));
        }
    }
    if !taken("/dev/shm", &mounts) {
        // a world-writable tmpfs: nothing to idmap (and tmpfs takes it only since Linux 6.3)
        mounts.push(Mount {
            idmap: false,
            ..bind("/dev/shm", input.sandbox.shm.clone(), false)
        });
    }
    let tm_path = c
        .termination_message_path
        .clone()
        .unwrap_or_else(|| "/dev/termination-log".into());
    let tm_file = termination_message_file(&input.pod_dir, &c.name)?;
    if !tm_path.is_empty() && !taken(&tm_path, &mounts) {
        mounts.push(bind(&tm_path, tm_file.clone(), false));
    }
    // What device plugins mount for the container's devices (kubelet's deviceplugin mounts).
    for (host, path, readonly) in input.devices.iter().flat_map(|a| &a.mounts) {
        if !taken(path, &mounts) {
            mounts.push(bind(path, PathBuf::from(host), *readonly));
        }
    }
    if let Some(l) = &selinux_labels {
        // What the agent made for the pod, labeled for this container (containerd's
        // SelinuxRelabel, which kubelet asks for on these); never a hostPath.
        let own_volumes = c
            .volume_mounts
            .iter()
            .flatten()
            .filter_map(|m| input.volumes.get(&m.name))
            .map(|v| v.path.as_path())
            .filter(|v| v.starts_with(&input.pod_dir));
        let managed = mounts.iter().map(|m| m.source.as_path()).filter(|s| {
            *s == tm_file
                || ["etc-hosts", "hostname", "resolv.conf"]
                    .iter()
                    .any(|f| *s == input.pod_dir.join(f))
        });
        selinux::relabel_all(own_volumes.chain(managed), &l.mount.to_string())?;
    }

    // In the dotted form, as kubelet sends them (sysctl.d's slash form converted).
    let sysctls: BTreeMap<String, String> = psc
        .sysctls
        .iter()
        .flatten()
        .map(|s| (crate::pod::sysctl::to_dots(&s.name), s.value.clone()))
        .collect();

    let labels = container_labels(p, c);
    let mut annotations = container_annotations(
        c,
        input.kind,
        input.attempt,
        &TerminationMessage {
            path: &tm_path,
            file: &tm_file,
        },
    );
    if let Some(a) = &input.devices {
        annotations.extend(a.annotations.clone());
    }

    Ok(ContainerConfig {
        name: c.name.clone(),
        display_name: format!("{}/{}/{}", crate::pod::namespace(p), crate::pod::name(p), c.name),
        image: c.image.clone().unwrap_or_default(),
        image_ref: None,
        command,
        args,
        env,
        working_dir: c.working_dir.clone().filter(|w| !w.is_empty()),
        user: UserConfig {
            uid: uid.map(|u| to_u32(u, "runAsUser")).transpose()?,
            gid: gid.map(|g| to_u32(g, "runAsGroup")).transpose()?,
            supplemental_groups: groups,
            supplemental_groups_policy: groups_policy,
            require_non_root: csc.run_as_non_root.or(psc.run_as_non_root).unwrap_or(false),
        },
        hostname: Some(dns::uts_hostname_or_short(p, &cfg.cluster_domain)),
        rlimits: Vec::new(),
        capabilities: CapabilityChanges {
            add: csc
                .capabilities
                .as_ref()
                .and_then(|c| c.add.clone())
                .unwrap_or_default(),
            drop: csc
                .capabilities
                .as_ref()
                .and_then(|c| c.drop.clone())
                .unwrap_or_default(),
        },
        privileged,
        readonly_rootfs: csc.read_only_root_filesystem.unwrap_or(false),
        no_new_privileges: csc.allow_privilege_escalation == Some(false),
        seccomp,
        apparmor_profile,
        selinux_label: selinux_labels.as_ref().map(|l| l.process.to_string()),
        mount_label: selinux_labels.as_ref().map(|l| l.mount.to_string()),
        unmasked_proc: csc.proc_mount.as_deref() == Some("Unmasked"),
        namespaces,
        user_namespace,
        cgroup_parent: input.pod_cgroup.clone(),
        resources,
        mounts,
        devices: input
            .devices
            .iter()
            .flat_map(|a| &a.devices)
            .map(|(host, path, permissions)| ferrolet_runtime::config::Device {
                host_path: host.into(),
                container_path: path.clone(),
                permissions: permissions.clone(),
            })
            .collect(),
        sysctls,
        labels,
        annotations,
        log: LogConfig {
            path: pod_log_dir(cfg, p).join(&c.name).join(format!("{}.log", input.attempt)),
            // The agent's log manager rotates (kuberuntime::log_rotation), as kubelet's does:
            // the monitor only reopens the file when asked.
            max_size: 0,
            max_files: cfg.container_log_max_files,
        },
        // As in CRI: stdinOnce only means something with stdin.
        stdin: c.stdin == Some(true),
        stdin_once: c.stdin == Some(true) && c.stdin_once == Some(true),
        tty: c.tty == Some(true),
    })
}

fn seccomp_of(s: &K8sSeccomp, cfg: &Config) -> Result<SeccompProfile> {
    Ok(match s.type_.as_str() {
        "RuntimeDefault" => SeccompProfile::RuntimeDefault,
        "Unconfined" => SeccompProfile::Unconfined,
        "Localhost" => {
            let rel = s
                .localhost_profile
                .as_deref()
                .filter(|p| !p.is_empty())
                .ok_or_else(|| anyhow!("seccompProfile: localhostProfile is required for type Localhost"))?;
            if rel.starts_with('/') || rel.split('/').any(|c| c == "..") {
                return Err(anyhow!(
                    "seccompProfile.localhostProfile {rel:?} must be relative to <root-dir>/seccomp"
                ));
            }
            let path = cfg.root_dir.join("seccomp").join(rel);
            if !path.is_file() {
                return Err(anyhow!(
                    "seccompProfile: localhost profile {} does not exist",
                    path.display()
                ));
            }
            SeccompProfile::Localhost(path)
        }
        other => {
            return Err(anyhow!(
                "seccompProfile.type {other:?} is not RuntimeDefault, Unconfined or Localhost"
            ))
        }
    })
}

/// The profile that confines the container on a node whose kernel enforces AppArmor, as
/// containerd picks it: Localhost profiles must be loaded already; RuntimeDefault, and nothing
/// asked for, is ferrolet's default profile ([`DEFAULT_APPARMOR_PROFILE`], loaded the first time
/// a container needs it), except for a privileged container, which runs unconfined; Unconfined:
/// none. On a node without AppArmor, admission refused every pod that asks for more than
/// Unconfined (src/podconfig/lsm.rs). docs/apparmor.md
fn apparmor_profile(p: &Pod, c: &Container, privileged: bool, root_dir: &Path) -> Result<Option<String>> {
    use crate::podconfig::lsm::{self, Profile};
    if !lsm::Host::detect().apparmor {
        return Ok(None);
    }
    let name = match lsm::profile(p, c) {
        Some(Profile::Unconfined) => return Ok(None),
        None | Some(Profile::RuntimeDefault) if privileged => return Ok(None),
        None | Some(Profile::RuntimeDefault) => {
            ferrolet_runtime::apparmor::ensure_default_loaded(&root_dir.join("apparmor")).map_err(|e| anyhow!(e))?;
            DEFAULT_APPARMOR_PROFILE.to_string()
        }
        Some(Profile::Localhost(Some(n))) if !n.trim().is_empty() => n,
        Some(other) => return Err(anyhow!("appArmorProfile: {other:?} cannot be applied")),
    };
    if !lsm::apparmor_profile_loaded(&name) {
        // containerd's message.
        return Err(anyhow!("apparmor profile not found {name}"));
    }
    Ok(Some(name))
}

/// The AppArmor profile RuntimeDefault stands for (containerd's is cri-containerd.apparmor.d).
pub const DEFAULT_APPARMOR_PROFILE: &str = ferrolet_runtime::apparmor::DEFAULT_PROFILE;

/// The file behind a container's terminationMessagePath (one per container name, truncated for
/// each new attempt).
fn termination_message_file(pod_dir: &Path, name: &str) -> Result<PathBuf> {
    let dir = pod_dir.join("containers").join(name);
    std::fs::create_dir_all(&dir)?;
    let f = dir.join(format!("termination-log-{}", ferrolet_fsutil::random_hex(4)));
    std::fs::write(&f, b"")?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666))?;
    Ok(f)
}
