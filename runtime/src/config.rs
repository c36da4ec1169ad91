//! What a caller asks the runtime to run: a container description with no Kubernetes types in
//! it. The agent translates a Pod's container into this; the runtime turns it into an OCI spec.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerConfig {
    /// A name for logs and listings (the Kubernetes container name).
    pub name: String,
    /// Shown by `ps` as the container's monitor process, `ferrolet-monitor <display_name>`
    /// (e.g. `default/web-node1/nginx`); the runtime does not interpret it. Empty: `name`.
    pub display_name: String,
    /// Image reference or id, resolved in the image store.
    pub image: String,
    /// The image id (config digest) the caller made sure of before creating: the container is
    /// made from that image even if `image`'s tag moved since (a concurrent pull); `image`
    /// stays the name the container record shows.
    #[serde(default)]
    pub image_ref: Option<crate::digest::Digest>,
    /// Replaces the image's Entrypoint when non-empty (Kubernetes `command`).
    pub command: Vec<String>,
    /// Replaces the image's Cmd when non-empty (Kubernetes `args`).
    pub args: Vec<String>,
    /// Added to the image's environment; a name already there is replaced.
    pub env: Vec<(String, String)>,
    /// Defaults to the image's WorkingDir, then `/`.
    pub working_dir: Option<String>,
    pub user: UserConfig,
    /// Set only when the container has its own UTS namespace or the sandbox's.
    pub hostname: Option<String>,
    pub rlimits: Vec<Rlimit>,
    pub capabilities: CapabilityChanges,
    pub privileged: bool,
    pub readonly_rootfs: bool,
    pub no_new_privileges: bool,
    pub seccomp: SeccompProfile,
    /// The AppArmor profile the process is confined by (OCI `process.apparmorProfile`), loaded
    /// in the kernel already; `None` leaves it as its parent's (unconfined).
    #[serde(default)]
    pub apparmor_profile: Option<String>,
    /// The SELinux context the container's processes run in (OCI `process.selinuxLabel`),
    /// its first one and every exec'd one; `None` leaves it as the parent's. Set only where
    /// SELinux is enabled (crate::selinux).
    #[serde(default)]
    pub selinux_label: Option<String>,
    /// The SELinux context of the files the container is given (OCI `linux.mountLabel`): its
    /// rootfs overlay and the tmpfs and devpts mounts made for it are mounted with it
    /// (`context=`). The caller relabels the directories it binds in.
    #[serde(default)]
    pub mount_label: Option<String>,
    /// Leave /proc paths unmasked (Kubernetes `procMount: Unmasked`).
    pub unmasked_proc: bool,
    pub namespaces: Namespaces,
    /// The pod's user namespace to join (Kubernetes `hostUsers: false`): the container's ids
    /// are the namespace's, its image layers are idmapped onto them, and it is built from a
    /// staged copy of everything it names (docs/userns.md).
    #[serde(default)]
    pub user_namespace: Option<UserNamespace>,
    /// Absolute cgroup path of the parent (e.g. `/kubepods/besteffort/pod<uid>`); the
    /// container's cgroup is `<cgroup_parent>/<container id>`.
    pub cgroup_parent: String,
    pub resources: Resources,
    pub mounts: Vec<Mount>,
    /// Host device nodes the container gets besides the defaults (what a device plugin
    /// allocates; CRI's `Device`), each created in its /dev and allowed by its device rules.
    pub devices: Vec<Device>,
    pub sysctls: BTreeMap<String, String>,
    /// Caller's labels, kept with the container and returned by `list` (the agent stores the
    /// pod uid, container name and restart count here to find its containers after a restart).
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub log: LogConfig,
    /// Keep the container's stdin open for attachers (Kubernetes `stdin`); without it stdin is
    /// `/dev/null`.
    pub stdin: bool,
    /// Close the container's stdin when the first attacher that wrote to it detaches
    /// (Kubernetes `stdinOnce`).
    pub stdin_once: bool,
    /// Run the container's process on a terminal (Kubernetes `tty`): its stdin, stdout and
    /// stderr are the slave of a pty whose master the monitor holds; the log gets the output
    /// as stdout.
    pub tty: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct UserConfig {
    /// Overrides the image's user (Kubernetes `runAsUser`).
    pub uid: Option<u32>,
    /// Overrides the primary group (Kubernetes `runAsGroup`).
    pub gid: Option<u32>,
    /// Extra groups (Kubernetes `supplementalGroups` and `fsGroup`).
    pub supplemental_groups: Vec<u32>,
    /// Whether the user's memberships in the image's /etc/group are added (Kubernetes
    /// `supplementalGroupsPolicy`).
    pub supplemental_groups_policy: SupplementalGroupsPolicy,
    /// Refuse to run as uid 0 (Kubernetes `runAsNonRoot`).
    pub require_non_root: bool,
}

/// Kubernetes' `supplementalGroupsPolicy` as CRI passes it on.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum SupplementalGroupsPolicy {
    /// The primary gid, the image's /etc/group memberships of the user, then the supplemental
    /// groups.
    #[default]
    Merge,
    /// The primary gid and the supplemental groups only.
    Strict,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Rlimit {
    /// `RLIMIT_NOFILE` style name.
    pub kind: String,
    pub soft: u64,
    pub hard: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CapabilityChanges {
    /// Capability names with or without `CAP_`; `ALL` is every capability.
    pub add: Vec<String>,
    pub drop: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub enum SeccompProfile {
    /// The runtime's default profile (Kubernetes `RuntimeDefault`).
    #[default]
    RuntimeDefault,
    Unconfined,
    /// An OCI/docker seccomp JSON file on the node (Kubernetes `Localhost`).
    Localhost(PathBuf),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub enum NamespaceMode {
    /// A new namespace for this container.
    #[default]
    Private,
    /// The node's namespace.
    Host,
    /// Join the namespace at this path (a pinned pod namespace).
    Path(PathBuf),
}

/// A user namespace a container joins, pinned at `path`, mapping ids 0.. to `range`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UserNamespace {
    pub path: PathBuf,
    pub range: crate::namespaces::IdRange,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Namespaces {
    pub network: NamespaceMode,
    pub ipc: NamespaceMode,
    pub uts: NamespaceMode,
    pub pid: NamespaceMode,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Resources {
    /// cgroup v1 cpu.shares (2..262144); converted to cpu.weight on v2.
    pub cpu_shares: Option<u64>,
    /// CFS quota in microseconds per `cpu_period`.
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    /// Bytes; None is unlimited.
    pub memory_limit: Option<i64>,
    pub pids_limit: Option<i64>,
    pub oom_score_adj: Option<i32>,
    /// On cgroup v2, kill the whole container when the kernel OOM-kills one of its processes
    /// (`memory.oom.group`, as kubelet sets it unless singleProcessOOMKill). Ignored on v1.
    pub oom_group: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub destination: String,
    /// Host path for binds, ignored for tmpfs.
    pub source: PathBuf,
    pub kind: MountKind,
    pub readonly: bool,
    pub propagation: Propagation,
    /// Extra mount options (e.g. `size=64m` for tmpfs).
    #[serde(default)]
    pub options: Vec<String>,
    /// In a user namespace: bind an idmapped copy of the source, so that what host root owns
    /// there is the container root's (the agent's volumes; never a hostPath).
    #[serde(default)]
    pub idmap: bool,
}

/// A host device node given to a container (CRI's `Device`, a device plugin's `DeviceSpec`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The node on the host (symlinks followed).
    pub host_path: PathBuf,
    /// Where it appears in the container, under /dev.
    pub container_path: String,
    /// Some of `r`, `w`, `m` (read, write, mknod), as the cgroup rule grants them.
    pub permissions: String,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum MountKind {
    #[default]
    Bind,
    Tmpfs,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Propagation {
    #[default]
    Private,
    /// rslave: host mounts appear in the container (Kubernetes `HostToContainer`).
    HostToContainer,
    /// rshared (Kubernetes `Bidirectional`).
    Bidirectional,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LogConfig {
    /// Where the CRI-format log goes; the monitor creates the directory.
    pub path: PathBuf,
    /// Rotate when the file grows past this many bytes (0: never).
    pub max_size: u64,
    /// Files kept, the live one included (kubelet's containerLogMaxFiles).
    pub max_files: u32,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            path: PathBuf::new(),
            max_size: 10 << 20,
            max_files: 5,
        }
    }
}
