//! The command line: `ferrolet run` takes kubelet's flags; `pods`, `logs` and `exec` talk to a
//! running agent over its unix socket; `images` works on the image store directly; `reset`
//! stops and removes everything an agent left on the node.

pub mod client;
pub mod exec;
pub mod images;
pub mod logs;
pub mod pods;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "ferrolet",
    version,
    about = "A Kubernetes node agent with its own container runtime"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the agent (kubelet's flags).
    Run(Box<RunFlags>),
    /// List pods (like `kubectl get pods`).
    Pods(PodsArgs),
    /// Print a container's logs.
    Logs(LogsArgs),
    /// Run a command in a container.
    Exec(ExecArgs),
    /// Manage the node's images.
    #[command(subcommand)]
    Images(ImagesCommand),
    /// Stop and remove every pod, container, sandbox and cgroup an agent left under the root dir.
    Reset(RootArg),
}

#[derive(Args, Debug, Clone)]
pub struct RootArg {
    /// The agent's root directory.
    #[arg(long = "root-dir", env = "FERROLET_ROOT_DIR", default_value = "/var/lib/ferrolet")]
    pub root_dir: PathBuf,
}

/// Flags named as kubelet names them. Unset flags leave the config file's (or the default)
/// value alone.
#[derive(Args, Debug, Default)]
pub struct RunFlags {
    /// KubeletConfiguration file (kubelet.config.k8s.io/v1beta1).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory (or file) of static pod manifests.
    #[arg(long = "pod-manifest-path")]
    pub pod_manifest_path: Option<PathBuf>,
    /// URL of static pod manifests (kubelet's manifestURL).
    #[arg(long = "manifest-url")]
    pub manifest_url: Option<String>,
    /// key:value header for --manifest-url (repeatable).
    #[arg(long = "manifest-url-header")]
    pub manifest_url_header: Vec<String>,
    #[arg(long = "root-dir")]
    pub root_dir: Option<PathBuf>,
    #[arg(long = "hostname-override")]
    pub hostname_override: Option<String>,
    /// Log verbosity (kubelet's -v / --v).
    #[arg(long = "v", short = 'v')]
    pub v: Option<u8>,
    #[arg(long = "file-check-frequency")]
    pub file_check_frequency: Option<String>,
    #[arg(long = "http-check-frequency")]
    pub http_check_frequency: Option<String>,
    #[arg(long = "sync-frequency")]
    pub sync_frequency: Option<String>,
    #[arg(long = "cgroup-root")]
    pub cgroup_root: Option<String>,
    #[arg(long = "cgroups-per-qos", num_args = 0..=1, default_missing_value = "true")]
    pub cgroups_per_qos: Option<bool>,
    #[arg(long = "max-pods")]
    pub max_pods: Option<u32>,
    #[arg(long = "pod-max-pids")]
    pub pod_max_pids: Option<i64>,
    #[arg(long = "read-only-port")]
    pub read_only_port: Option<u16>,
    #[arg(long = "address")]
    pub address: Option<std::net::IpAddr>,
    #[arg(long = "cluster-dns", value_delimiter = ',')]
    pub cluster_dns: Vec<std::net::IpAddr>,
    #[arg(long = "cluster-domain")]
    pub cluster_domain: Option<String>,
    #[arg(long = "resolv-conf")]
    pub resolv_conf: Option<PathBuf>,
    #[arg(long = "pod-cidr")]
    pub pod_cidr: Option<String>,
    #[arg(long = "node-ip")]
    pub node_ip: Option<std::net::IpAddr>,
    #[arg(long = "runtime-request-timeout")]
    pub runtime_request_timeout: Option<String>,
    #[arg(long = "container-log-max-size")]
    pub container_log_max_size: Option<String>,
    #[arg(long = "container-log-max-files")]
    pub container_log_max_files: Option<u32>,
    /// Pod network: bridge (built in), cni, or none.
    #[arg(long = "network")]
    pub network: Option<String>,
    #[arg(long = "cni-conf-dir")]
    pub cni_conf_dir: Option<PathBuf>,
    #[arg(long = "cni-bin-dir", value_delimiter = ',')]
    pub cni_bin_dir: Vec<PathBuf>,
    /// Image archives dropped here are imported.
    #[arg(long = "image-import-dir")]
    pub image_import_dir: Option<PathBuf>,
    /// First crash-loop back-off (kubelet's is 10s).
    #[arg(long = "initial-container-restart-period", hide = true)]
    pub initial_container_restart_period: Option<String>,
}

#[derive(Args, Debug)]
pub struct PodsArgs {
    #[command(flatten)]
    pub root: RootArg,
    /// Only this namespace.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Output format: wide, json or yaml.
    #[arg(short = 'o', long)]
    pub output: Option<String>,
}

#[derive(Args, Debug)]
pub struct LogsArgs {
    #[command(flatten)]
    pub root: RootArg,
    pub pod: String,
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    #[arg(short = 'c', long)]
    pub container: Option<String>,
    #[arg(short = 'f', long)]
    pub follow: bool,
    #[arg(short = 'p', long)]
    pub previous: bool,
    /// Lines from the end (-1: all).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub tail: i64,
    #[arg(long)]
    pub timestamps: bool,
}

#[derive(Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    pub root: RootArg,
    pub pod: String,
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    #[arg(short = 'c', long)]
    pub container: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(Subcommand, Debug)]
pub enum ImagesCommand {
    /// Import OCI image layouts or docker-save archives (dir or tar, gzip/zstd ok).
    Import {
        #[command(flatten)]
        root: RootArg,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// List images.
    Ls {
        #[command(flatten)]
        root: RootArg,
    },
    /// Remove images (a name untags; the last name or the id removes the image).
    Rm {
        #[command(flatten)]
        root: RootArg,
        #[arg(required = true)]
        refs: Vec<String>,
    },
}
