//! From a [`ContainerConfig`] and its image to an OCI runtime spec (config.json), with the
//! defaults containerd's CRI applies: its capability set, masked and read-only /proc paths,
//! default mounts, RuntimeDefault seccomp, and Kubernetes' command/args/env merging.

use std::collections::HashSet;
use std::path::Path;

use oci_spec::image::ImageConfiguration;
use oci_spec::runtime::{
    Capabilities, Capability, LinuxBuilder, LinuxCpuBuilder, LinuxMemoryBuilder, LinuxNamespace, LinuxNamespaceBuilder,
    LinuxNamespaceType, LinuxPidsBuilder, LinuxResourcesBuilder, LinuxSeccomp, Mount as OciMount, MountBuilder,
    PosixRlimitBuilder, PosixRlimitType, ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};

use crate::config::{ContainerConfig, MountKind, NamespaceMode, Propagation, SeccompProfile};
use crate::error::{Context, Error, Result};
use crate::user::ResolvedUser;

pub(crate) const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// containerd's default capability set for unprivileged containers.
pub(crate) const DEFAULT_CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The process arguments Kubernetes runs: `command` replaces the image Entrypoint and drops its
/// Cmd; `args` replaces Cmd.
pub(crate) fn process_args(image: &ImageConfiguration, command: &[String], args: &[String]) -> Vec<String> {
    let cfg = image.config().as_ref();
    let entrypoint = cfg.and_then(|c| c.entrypoint().clone()).unwrap_or_default();
    let cmd = cfg.and_then(|c| c.cmd().clone()).unwrap_or_default();
    match (command.is_empty(), args.is_empty()) {
        (false, _) => command.iter().chain(args).cloned().collect(),
        (true, false) => entrypoint.into_iter().chain(args.iter().cloned()).collect(),
        (true, true) => entrypoint.into_iter().chain(cmd).collect(),
    }
}

/// Default PATH, then the image's environment, then the container's, a later value replacing an
/// earlier one of the same name in place.
pub(crate) fn merge_env(
    image: &ImageConfiguration,
    env: &[(String, String)],
    extra: &[(String, String)],
) -> Vec<String> {
    let mut out: Vec<(String, String)> = vec![("PATH".into(), DEFAULT_PATH.into())];
    let set = |k: &str, v: &str, out: &mut Vec<(String, String)>| match out.iter_mut().find(|(n, _)| n == k) {
        Some(slot) => slot.1 = v.to_string(),
        None => out.push((k.to_string(), v.to_string())),
    };
    if let Some(cfg) = image.config() {
        for kv in cfg.env().clone().unwrap_or_default() {
            let (k, v) = kv.split_once('=').unwrap_or((&kv, ""));
            set(k, v, &mut out);
        }
    }
    for (k, v) in extra.iter().chain(env) {
        set(k, v, &mut out);
    }
    out.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// Normalize `chown`/`CAP_CHOWN`/`ALL` to `CAP_*` names.
fn cap_name(s: &str) -> String {
    let up = s.to_ascii_uppercase();
    if up == "ALL" || up.starts_with("CAP_") {
        up
    } else {
        format!("CAP_{up}")
    }
}

/// Every capability this kernel knows.
pub(crate) fn all_capabilities() -> Vec<String> {
    let last: u8 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    let mut v: Vec<String> = caps::all()
        .into_iter()
        .filter(|c| c.index() <= last)
        .map(|c| c.to_string())
        .collect();
    v.sort();
    v
}

/// What a privileged container gets: every capability the agent has itself, as containerd's
/// `WithAllCurrentCapabilities`. Every known one would not do: the kernel grants no process a
/// capability outside the bounding set it inherits (root on these machines lacks
/// CAP_SYS_RESOURCE), and the container's start failed in capset.
pub(crate) fn current_capabilities() -> Vec<String> {
    let Ok(current) = caps::read(None, caps::CapSet::Effective) else {
        return all_capabilities();
    };
    let mut v: Vec<String> = all_capabilities()
        .into_iter()
        .filter(|name| current.iter().any(|c| c.to_string() == *name))
        .collect();
    v.sort();
    v
}

/// The capability set after Kubernetes' add/drop rules: drop ALL empties the defaults, add ALL
/// grants every one, privileged grants every one the agent has ([`current_capabilities`]).
pub(crate) fn effective_capabilities(cfg: &ContainerConfig) -> Vec<String> {
    if cfg.privileged {
        return current_capabilities();
    }
    let add: Vec<String> = cfg.capabilities.add.iter().map(|c| cap_name(c)).collect();
    let drop: Vec<String> = cfg.capabilities.drop.iter().map(|c| cap_name(c)).collect();
    let mut caps: Vec<String> = if add.iter().any(|c| c == "ALL") {
        all_capabilities()
    } else {
        DEFAULT_CAPABILITIES.iter().map(|s| s.to_string()).collect()
    };
    if drop.iter().any(|c| c == "ALL") {
        caps.clear();
    }
    for a in add.into_iter().filter(|c| c != "ALL") {
        if !caps.contains(&a) {
            caps.push(a);
        }
    }
    caps.retain(|c| !drop.contains(c));
    caps
}

fn cap_set(names: &[String]) -> Result<Capabilities> {
    names
        .iter()
        .map(|n| {
            serde_json::from_value::<Capability>(serde_json::Value::String(n.clone()))
                .map_err(|_| Error::invalid_config("capabilities", format!("unknown capability {n}")))
        })
        .collect::<Result<HashSet<_>>>()
}

fn ns(typ: LinuxNamespaceType, mode: &NamespaceMode) -> Option<LinuxNamespace> {
    let b = LinuxNamespaceBuilder::default().typ(typ);
    match mode {
        NamespaceMode::Host => None,
        NamespaceMode::Private => Some(b.build().expect("namespace")),
        NamespaceMode::Path(p) => Some(b.path(p.clone()).build().expect("namespace")),
    }
}

/// Everything [`build_spec`] needs besides the container config.
pub(crate) struct SpecInput<'a> {
    pub id: &'a str,
    pub config: &'a ContainerConfig,
    pub image: &'a ImageConfiguration,
    pub user: &'a ResolvedUser,
    pub cgroup_v2: bool,
    /// On cgroup v1: the mount point of each controller's hierarchy.
    pub cgroup_v1_mounts: Vec<std::path::PathBuf>,
}

pub(crate) fn build_spec(input: &SpecInput) -> Result<Spec> {
    let cfg = input.config;
    let image = input.image;
    let args = process_args(image, &cfg.command, &cfg.args);
    if args.is_empty() {
        return Err(Error::invalid_config(
            "command",
            "no command: the container sets none and the image has no Entrypoint or Cmd",
        ));
    }
    let mut extra_env = Vec::new();
    if let Some(h) = &cfg.hostname {
        extra_env.push(("HOSTNAME".to_string(), h.clone()));
    }
    let has_home = cfg.env.iter().any(|(k, _)| k == "HOME")
        || image
            .config()
            .as_ref()
            .and_then(|c| c.env().as_ref())
            .is_some_and(|e| e.iter().any(|kv| kv.starts_with("HOME=")));
    if !has_home {
        extra_env.push((
            "HOME".to_string(),
            input
                .user
                .home
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "/".into()),
        ));
    }
    if cfg.tty {
        // As containerd's WithTTY: programs on a terminal need to know which one.
        extra_env.push(("TERM".to_string(), "xterm".to_string()));
    }
    let env = merge_env(image, &cfg.env, &extra_env);
    let cwd = cfg
        .working_dir
        .clone()
        .filter(|w| !w.is_empty())
        .or_else(|| image.config().as_ref().and_then(|c| c.working_dir().clone()))
        .filter(|w| !w.is_empty())
        .unwrap_or_else(|| "/".to_string());
    if !cwd.starts_with('/') {
        return Err(Error::invalid_config(
            "workingDir",
            format!("{cwd:?} is not an absolute path"),
        ));
    }

    let caps = effective_capabilities(cfg);
    let capset = cap_set(&caps)?;
    let user = UserBuilder::default()
        .uid(input.user.uid)
        .gid(input.user.gid)
        .additional_gids(input.user.additional_gids.clone())
        .build()
        .context_cfg("user")?;
    let mut rlimits = Vec::new();
    for r in &cfg.rlimits {
        let typ = serde_json::from_value(serde_json::Value::String(r.kind.clone()))
            .map_err(|_| Error::invalid_config("rlimits", format!("unknown rlimit {}", r.kind)))?;
        rlimits.push(
            PosixRlimitBuilder::default()
                .typ::<PosixRlimitType>(typ)
                .soft(r.soft)
                .hard(r.hard)
                .build()
                .context_cfg("rlimits")?,
        );
    }
    let mut process = ProcessBuilder::default()
        .terminal(cfg.tty)
        .args(args)
        .env(env)
        .cwd(cwd)
        .user(user)
        .capabilities(
            oci_spec::runtime::LinuxCapabilitiesBuilder::default()
                .bounding(capset.clone())
                .effective(capset.clone())
                .permitted(capset)
                .inheritable(Capabilities::new())
                .ambient(Capabilities::new())
                .build()
                .context_cfg("capabilities")?,
        );
    if !rlimits.is_empty() {
        process = process.rlimits(rlimits);
    }
    if let Some(adj) = cfg.resources.oom_score_adj {
        process = process.oom_score_adj(allowed_oom_score_adj(adj));
    }
    if let Some(profile) = cfg.apparmor_profile.as_ref().filter(|p| !p.is_empty()) {
        process = process.apparmor_profile(profile.clone());
    }
    if let Some(label) = cfg.selinux_label.as_ref().filter(|l| !l.is_empty()) {
        crate::selinux::check_label(label).map_err(|e| Error::invalid_config("selinuxLabel", e))?;
        process = process.selinux_label(label.clone());
    }
    if let Some(label) = cfg.mount_label.as_ref().filter(|l| !l.is_empty()) {
        crate::selinux::check_label(label).map_err(|e| Error::invalid_config("mountLabel", e))?;
    }
    let mut process = process.build().context_cfg("process")?;
    // oci-spec's defaults are not a container runtime's: they set noNewPrivileges, a 1024
    // RLIMIT_NOFILE and inheritable and ambient capabilities. As containerd's and CRI-O's CRI:
    // noNewPrivileges only when asked (allowPrivilegeEscalation: false; setuid programs work
    // otherwise), rlimits inherited from the agent unless set, no inheritable capabilities
    // (CVE-2022-24769) and no ambient ones (a non-root user gets none). noNewPrivileges is
    // absent rather than false: libcontainer reads any value as "load seccomp after dropping
    // capabilities", which only noNewPrivileges permits.
    process.set_no_new_privileges(cfg.no_new_privileges.then_some(true));
    if cfg.rlimits.is_empty() {
        process.set_rlimits(None);
    }

    // Namespaces: always a new mount namespace; cgroup namespace on v2 as containerd does.
    let n = &cfg.namespaces;
    let mut namespaces: Vec<LinuxNamespace> = [
        ns(LinuxNamespaceType::Pid, &n.pid),
        ns(LinuxNamespaceType::Network, &n.network),
        ns(LinuxNamespaceType::Ipc, &n.ipc),
        ns(LinuxNamespaceType::Uts, &n.uts),
    ]
    .into_iter()
    .flatten()
    .collect();
    namespaces.push(
        LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::Mount)
            .build()
            .expect("ns"),
    );
    if let Some(u) = &cfg.user_namespace {
        namespaces.insert(
            0,
            LinuxNamespaceBuilder::default()
                .typ(LinuxNamespaceType::User)
                .path(u.path.clone())
                .build()
                .expect("ns"),
        );
    }
    if input.cgroup_v2 {
        namespaces.push(
            LinuxNamespaceBuilder::default()
                .typ(LinuxNamespaceType::Cgroup)
                .build()
                .expect("ns"),
        );
    }

    let r = &cfg.resources;
    let mut resources = LinuxResourcesBuilder::default();
    let mut cpu = LinuxCpuBuilder::default();
    let mut any_cpu = false;
    if let Some(s) = r.cpu_shares {
        cpu = cpu.shares(s);
        any_cpu = true;
    }
    if let Some(q) = r.cpu_quota {
        cpu = cpu.quota(q);
        any_cpu = true;
    }
    if let Some(p) = r.cpu_period {
        cpu = cpu.period(p);
        any_cpu = true;
    }
    if any_cpu {
        resources = resources.cpu(cpu.build().context_cfg("resources.cpu")?);
    }
    if let Some(m) = r.memory_limit {
        resources = resources.memory(
            LinuxMemoryBuilder::default()
                .limit(m)
                .build()
                .context_cfg("resources.memory")?,
        );
    }
    if let Some(pl) = r.pids_limit {
        resources = resources.pids(
            LinuxPidsBuilder::default()
                .limit(pl)
                .build()
                .context_cfg("resources.pids")?,
        );
    }
    if r.oom_group && crate::cgroups::unified_mode() {
        resources = resources.unified(std::collections::HashMap::from([(
            "memory.oom.group".to_string(),
            "1".to_string(),
        )]));
    }
    let (device_rules, device_nodes) = devices(cfg)?;
    resources = resources.devices(device_rules);

    let cgroups_path = format!("{}/{}", cfg.cgroup_parent.trim_end_matches('/'), input.id);
    if !cgroups_path.starts_with('/') {
        return Err(Error::invalid_config(
            "cgroupParent",
            format!("{:?} is not an absolute cgroup path", cfg.cgroup_parent),
        ));
    }
    let mut linux = LinuxBuilder::default()
        .devices(device_nodes)
        .namespaces(namespaces)
        .cgroups_path(cgroups_path.clone())
        .resources(resources.build().context_cfg("resources")?);
    if let Some(u) = &cfg.user_namespace {
        let (uid, gid, groups) = (input.user.uid, input.user.gid, &input.user.additional_gids);
        for (what, id) in [("runAsUser", uid), ("runAsGroup", gid)]
            .into_iter()
            .chain(groups.iter().map(|g| ("supplementalGroups", *g)))
        {
            if id >= u.range.size {
                return Err(Error::invalid_config(
                    what,
                    format!(
                        "{id} is outside the pod's user namespace, which maps ids 0-{}",
                        u.range.size - 1
                    ),
                ));
            }
        }
        let map = oci_spec::runtime::LinuxIdMappingBuilder::default()
            .container_id(0u32)
            .host_id(u.range.host)
            .size(u.range.size)
            .build()
            .context_cfg("userNamespace")?;
        linux = linux.uid_mappings(vec![map]).gid_mappings(vec![map]);
    }
    if cfg.privileged || cfg.unmasked_proc {
        linux = linux
            .masked_paths(Vec::<String>::new())
            .readonly_paths(Vec::<String>::new());
    } else {
        linux = linux
            .masked_paths(
                oci_spec::runtime::get_default_maskedpaths()
                    .into_iter()
                    .chain(["/sys/devices/virtual/powercap".to_string()])
                    .collect::<Vec<_>>(),
            )
            .readonly_paths(oci_spec::runtime::get_default_readonly_paths());
    }
    if !cfg.sysctls.is_empty() {
        linux = linux.sysctl(
            cfg.sysctls
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<std::collections::HashMap<_, _>>(),
        );
    }
    // A privileged container runs unconfined whatever profile it names, as containerd's CRI
    // has it and Kubernetes documents (docs/seccomp.md).
    match &cfg.seccomp {
        _ if cfg.privileged => {}
        SeccompProfile::RuntimeDefault => {
            linux = linux.seccomp(crate::seccomp::runtime_default(&caps));
        }
        SeccompProfile::Localhost(path) => {
            linux = linux.seccomp(load_localhost_profile(path)?);
        }
        _ => {}
    }

    let root = RootBuilder::default()
        .path("rootfs")
        .readonly(cfg.readonly_rootfs)
        .build()
        .context_cfg("root")?;

    let mut spec = SpecBuilder::default()
        .version("1.0.2")
        .process(process)
        .root(root)
        .mounts(labeled(
            cgroup_v1_binds(mounts(cfg)?, input, &cgroups_path)?,
            cfg.mount_label.as_deref(),
        ))
        .linux(linux.build().context_cfg("linux")?)
        .annotations(
            cfg.annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<std::collections::HashMap<_, _>>(),
        )
        .build()
        .context_cfg("spec")?;
    // Only a container with its own UTS namespace sets a hostname; a joined (pod) namespace
    // already has one and the node's must not be touched. (oci-spec defaults it to "youki".)
    let private_uts = matches!(n.uts, NamespaceMode::Private);
    spec.set_hostname(cfg.hostname.clone().filter(|_| private_uts));
    Ok(spec)
}

/// The device rules and extra device nodes: a privileged container gets every device and
/// every node of the host's /dev (containerd's `WithHostDevices` and allow-all); any other the
/// default rules ([`crate::devices::default_rules`]) and one allow rule and node per device its
/// config names, with exactly the access it names.
fn devices(
    cfg: &ContainerConfig,
) -> Result<(
    Vec<oci_spec::runtime::LinuxDeviceCgroup>,
    Vec<oci_spec::runtime::LinuxDevice>,
)> {
    use crate::devices::{self, nodes};
    if cfg.privileged {
        let mut host = nodes::host_devices();
        for d in &cfg.devices {
            if !host.iter().any(|h| h.path() == Path::new(&d.container_path)) {
                let node = nodes::host_node(&d.host_path).map_err(|e| Error::invalid_config("devices", e))?;
                host.push(nodes::oci_device(&d.container_path, &node));
            }
        }
        return Ok((devices::allow_all_rules(), host));
    }
    let mut rules = devices::default_rules();
    let mut added = Vec::new();
    for (i, d) in cfg.devices.iter().enumerate() {
        let field = |what: &str| format!("devices[{i}].{what}");
        if !d.container_path.starts_with("/dev/") || d.container_path.split('/').any(|c| c == "..") {
            return Err(Error::invalid_config(
                field("containerPath"),
                format!("{:?} is not a path under /dev", d.container_path),
            ));
        }
        devices::parse_access(&d.permissions).map_err(|e| Error::invalid_config(field("permissions"), e))?;
        let node = nodes::host_node(&d.host_path).map_err(|e| Error::invalid_config(field("hostPath"), e))?;
        rules.push(devices::device_rule(node.kind, node.major, node.minor, &d.permissions));
        added.push(nodes::oci_device(&d.container_path, &node));
    }
    Ok((rules, added))
}

/// Lowering oom_score_adj below this process's own needs CAP_SYS_RESOURCE; without it (some
/// sandboxes and unprivileged setups) the container gets the lowest value we may set rather
/// than failing to start.
fn allowed_oom_score_adj(want: i32) -> i32 {
    let own: i32 = std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if want >= own || caps::has_cap(None, caps::CapSet::Effective, caps::Capability::CAP_SYS_RESOURCE).unwrap_or(false)
    {
        return want;
    }
    tracing::debug!(want, own, "no CAP_SYS_RESOURCE: oom_score_adj clamped");
    own
}

/// containerd's default mounts, minus any the container replaces, then the container's own,
/// parents before children.
fn mounts(cfg: &ContainerConfig) -> Result<Vec<OciMount>> {
    let own: HashSet<&str> = cfg.mounts.iter().map(|m| m.destination.trim_end_matches('/')).collect();
    let mut out: Vec<OciMount> = oci_spec::runtime::get_default_mounts()
        .into_iter()
        .filter(|m| !own.contains(m.destination().to_string_lossy().as_ref()))
        .map(|mut m| {
            // A private network namespace is needed to mount sysfs; without one, bind it.
            if m.destination() == Path::new("/sys") && matches!(cfg.namespaces.network, NamespaceMode::Host) {
                m.set_typ(Some("bind".into()));
                m.set_source(Some("/sys".into()));
                m.set_options(Some(vec![
                    "rbind".into(),
                    "nosuid".into(),
                    "noexec".into(),
                    "nodev".into(),
                    "ro".into(),
                ]));
            }
            if cfg.privileged
                && (m.destination() == Path::new("/sys") || m.destination() == Path::new("/sys/fs/cgroup"))
            {
                if let Some(o) = m.options().clone() {
                    m.set_options(Some(o.into_iter().filter(|x| x != "ro").collect()));
                }
            }
            m
        })
        .collect();
    let mut user = cfg.mounts.clone();
    user.sort_by_key(|m| Path::new(&m.destination).components().count());
    for m in user {
        if !m.destination.starts_with('/') {
            return Err(Error::invalid_config(
                "mounts",
                format!("destination {:?} is not absolute", m.destination),
            ));
        }
        let mut opts: Vec<String> = Vec::new();
        let (typ, source) = match m.kind {
            MountKind::Bind => {
                opts.push("rbind".into());
                opts.push(
                    match m.propagation {
                        Propagation::Private => "rprivate",
                        Propagation::HostToContainer => "rslave",
                        Propagation::Bidirectional => "rshared",
                    }
                    .into(),
                );
                ("bind".to_string(), m.source.clone())
            }
            MountKind::Tmpfs => {
                opts.extend(["nosuid".to_string(), "nodev".to_string()]);
                ("tmpfs".to_string(), "tmpfs".into())
            }
        };
        if m.readonly {
            opts.push("ro".into());
        }
        opts.extend(m.options.iter().cloned());
        out.push(
            MountBuilder::default()
                .destination(m.destination.clone())
                .typ(typ)
                .source(source)
                .options(opts)
                .build()
                .context_cfg("mounts")?,
        );
    }
    Ok(out)
}

/// The container's tmpfs and devpts mounts with `context=` its SELinux mount label, as runc
/// mounts them (the rootfs overlay gets it from the monitor: rootfs.rs). Not through
/// `linux.mountLabel`: libcontainer 0.7 would put the label on every mount but proc and sysfs,
/// and the cgroup2 and mqueue superblocks, which already exist unlabeled, refuse a mount with
/// other security settings (runc mounts those two without it). libcontainer mounts these with
/// fsconfig, one option at a time, so the label's commas need no quoting.
fn labeled(mut mounts: Vec<OciMount>, label: Option<&str>) -> Vec<OciMount> {
    let Some(label) = label.filter(|l| !l.is_empty()) else {
        return mounts;
    };
    for m in &mut mounts {
        if matches!(m.typ().as_deref(), Some("tmpfs" | "devpts")) {
            let mut opts = m.options().clone().unwrap_or_default();
            opts.push(format!("context={label}"));
            m.set_options(Some(opts));
        }
    }
    mounts
}

/// On cgroup v1, a container that does not own its pid namespace (the pod's shared one, the
/// node's) gets its own cgroup of each hierarchy bound read-only under a tmpfs at
/// /sys/fs/cgroup, as runc mounts it, instead of libcontainer's `cgroup` mount: to find its
/// own cgroup that reads `/proc/<its pid in the container's namespace>` in the host's /proc
/// (libcontainer 0.7, `mount_cgroup_v1`), which names another process, or none, when the
/// namespace is not its own, and the container fails to start.
fn cgroup_v1_binds(mounts: Vec<OciMount>, input: &SpecInput, cgroups_path: &str) -> Result<Vec<OciMount>> {
    let shared_pid = !matches!(input.config.namespaces.pid, NamespaceMode::Private);
    if input.cgroup_v2 || !shared_pid || input.cgroup_v1_mounts.is_empty() {
        return Ok(mounts);
    }
    let mut out = Vec::with_capacity(mounts.len() + input.cgroup_v1_mounts.len());
    for m in mounts {
        if m.typ().as_deref() != Some("cgroup") {
            out.push(m);
            continue;
        }
        let at = m.destination().clone();
        out.push(
            MountBuilder::default()
                .destination(at.clone())
                .typ("tmpfs")
                .source("tmpfs")
                .options(
                    ["nosuid", "noexec", "nodev", "mode=755", "size=64k"]
                        .map(String::from)
                        .to_vec(),
                )
                .build()
                .context_cfg("mounts")?,
        );
        for h in &input.cgroup_v1_mounts {
            let Some(name) = h.file_name() else { continue };
            out.push(
                MountBuilder::default()
                    .destination(at.join(name))
                    .typ("bind")
                    .source(h.join(cgroups_path.trim_start_matches('/')))
                    .options(["rbind", "ro", "nosuid", "noexec", "nodev"].map(String::from).to_vec())
                    .build()
                    .context_cfg("mounts")?,
            );
        }
    }
    Ok(out)
}

/// A Localhost seccomp profile: OCI/docker JSON (`defaultAction`, `syscalls`...).
fn load_localhost_profile(path: &Path) -> Result<LinuxSeccomp> {
    let data = std::fs::read(path).with_context(|| format!("reading seccomp profile {}", path.display()))?;
    Ok(serde_json::from_slice(&data).with_context(|| format!("decoding seccomp profile {}", path.display()))?)
}

trait CfgContext<T> {
    fn context_cfg(self, field: &str) -> Result<T>;
}

impl<T, E: std::fmt::Display> CfgContext<T> for std::result::Result<T, E> {
    fn context_cfg(self, field: &str) -> Result<T> {
        self.map_err(|e| Error::invalid_config(field, e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CapabilityChanges, Mount};

    fn image(json: &str) -> ImageConfiguration {
        serde_json::from_str(json).unwrap()
    }

    const IMG: &str = r#"{"architecture":"amd64","os":"linux",
        "config":{"Entrypoint":["/bin/ep"],"Cmd":["c1","c2"],"Env":["PATH=/img/bin","A=img"],"WorkingDir":"/w"},
        "rootfs":{"type":"layers","diff_ids":[]}}"#;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn args_merge_like_kubernetes() {
        let img = image(IMG);
        assert_eq!(process_args(&img, &[], &[]), s(&["/bin/ep", "c1", "c2"]));
        assert_eq!(process_args(&img, &[], &s(&["x"])), s(&["/bin/ep", "x"]));
        assert_eq!(process_args(&img, &s(&["/cmd"]), &[]), s(&["/cmd"]));
        assert_eq!(process_args(&img, &s(&["/cmd"]), &s(&["y"])), s(&["/cmd", "y"]));
    }

    #[test]
    fn env_container_overrides_image() {
        let img = image(IMG);
        let env = merge_env(&img, &[("A".into(), "ctr".into()), ("B".into(), "b".into())], &[]);
        assert_eq!(env, s(&["PATH=/img/bin", "A=ctr", "B=b"]));
    }

    #[test]
    fn capability_rules() {
        let mut c = ContainerConfig::default();
        assert_eq!(effective_capabilities(&c).len(), DEFAULT_CAPABILITIES.len());
        c.capabilities = CapabilityChanges {
            add: s(&["NET_ADMIN"]),
            drop: s(&["chown"]),
        };
        let caps = effective_capabilities(&c);
        assert!(caps.contains(&"CAP_NET_ADMIN".to_string()));
        assert!(!caps.contains(&"CAP_CHOWN".to_string()));
        c.capabilities = CapabilityChanges {
            add: s(&["NET_BIND_SERVICE"]),
            drop: s(&["ALL"]),
        };
        assert_eq!(effective_capabilities(&c), s(&["CAP_NET_BIND_SERVICE"]));
    }

    #[test]
    fn a_privileged_container_gets_the_capabilities_the_agent_has() {
        let c = ContainerConfig {
            privileged: true,
            ..Default::default()
        };
        let mut ours: Vec<String> = caps::read(None, caps::CapSet::Effective)
            .unwrap()
            .iter()
            .map(|c| c.to_string())
            .collect();
        ours.sort();
        assert_eq!(effective_capabilities(&c), ours);
        // (a non-root test process has none: then a privileged container asks for none)
    }

    #[test]
    fn spec_has_defaults_and_limits() {
        let img = image(IMG);
        let mut c = ContainerConfig {
            cgroup_parent: "/kubepods/podx".into(),
            readonly_rootfs: true,
            ..Default::default()
        };
        c.resources.memory_limit = Some(64 << 20);
        c.mounts.push(Mount {
            destination: "/data".into(),
            source: "/tmp".into(),
            kind: MountKind::Bind,
            readonly: true,
            propagation: Propagation::Private,
            options: vec![],
            idmap: false,
        });
        let user = ResolvedUser {
            uid: 1,
            gid: 2,
            additional_gids: vec![],
            name: None,
            home: None,
        };
        let build = |c: &ContainerConfig| {
            build_spec(&SpecInput {
                id: "abc",
                config: c,
                image: &img,
                user: &user,
                cgroup_v2: false,
                cgroup_v1_mounts: vec![],
            })
            .unwrap()
        };
        let spec = build(&c);
        let linux = spec.linux().as_ref().unwrap();
        assert_eq!(
            linux.cgroups_path().as_ref().unwrap().to_str(),
            Some("/kubepods/podx/abc")
        );
        assert_eq!(
            linux.resources().as_ref().unwrap().memory().as_ref().unwrap().limit(),
            Some(64 << 20)
        );
        assert!(linux
            .masked_paths()
            .as_ref()
            .unwrap()
            .contains(&"/proc/kcore".to_string()));
        assert!(linux.seccomp().is_some());
        assert_eq!(spec.root().as_ref().unwrap().readonly(), Some(true));
        let p = spec.process().as_ref().unwrap();
        assert_eq!(p.cwd().to_str(), Some("/w"));
        assert_eq!(p.user().uid(), 1);
        // what a CRI runtime sets, not oci-spec's defaults
        assert_eq!(p.no_new_privileges(), None, "noNewPrivileges only when asked");
        assert_eq!(p.rlimits(), &None, "rlimits are inherited unless set");
        let caps = p.capabilities().as_ref().unwrap();
        assert_eq!(caps.inheritable().as_ref().map(|c| c.len()), Some(0));
        assert_eq!(caps.ambient().as_ref().map(|c| c.len()), Some(0));
        assert!(caps.bounding().as_ref().unwrap().contains(&Capability::Chown));
        c.no_new_privileges = true;
        c.rlimits.push(crate::config::Rlimit {
            kind: "RLIMIT_NOFILE".into(),
            soft: 10,
            hard: 20,
        });
        let spec = build(&c);
        let p = spec.process().as_ref().unwrap();
        assert_eq!(p.no_new_privileges(), Some(true));
        assert_eq!(p.rlimits().as_ref().unwrap()[0].hard(), 20);
        let data = spec
            .mounts()
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.destination().to_str() == Some("/data"))
            .unwrap();
        assert!(data.options().as_ref().unwrap().contains(&"ro".to_string()));
    }

    #[test]
    fn no_command_anywhere_is_an_error() {
        let img =
            image(r#"{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":[]}}"#);
        let c = ContainerConfig {
            cgroup_parent: "/x".into(),
            ..Default::default()
        };
        let user = ResolvedUser {
            uid: 0,
            gid: 0,
            additional_gids: vec![],
            name: None,
            home: None,
        };
        let e = build_spec(&SpecInput {
            id: "a",
            config: &c,
            image: &img,
            user: &user,
            cgroup_v2: true,
            cgroup_v1_mounts: vec![],
        })
        .unwrap_err();
        assert!(e.to_string().contains("command"), "{e}");
    }
}
