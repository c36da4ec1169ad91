//! The command line: `ferrolet run` takes kubelet's flags (defined with the configuration they
//! set, [`crate::config::RunFlags`]); `pods`, `logs`, `exec` and `top` talk to a running agent over its
//! unix socket; `images` works on the image store directly; `reset` stops and removes
//! everything an agent left on the node; `install` and `uninstall` put the agent on a machine
//! and take it off.

pub mod client;
pub mod exec;
pub mod images;
pub mod install;
pub mod join;
pub mod logs;
pub mod pods;
pub mod reset;
pub mod top;
pub mod ui;

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
    Run(Box<crate::config::RunFlags>),
    /// List pods (like `kubectl get pods`).
    Pods(PodsArgs),
    /// Print a container's logs.
    Logs(LogsArgs),
    /// Run a command in a container.
    Exec(ExecArgs),
    /// Show cpu and memory of pods or the node (like `kubectl top`).
    Top(TopArgs),
    /// Print the status page's address, or serve the page on loopback.
    Ui(ui::UiArgs),
    /// Manage the node's images.
    #[command(subcommand)]
    Images(ImagesCommand),
    /// Stop and remove every pod, container, sandbox and cgroup an agent left under the root dir.
    Reset(RootArg),
    /// Make this machine a node in one step: binary, config, manifest dir, systemd unit,
    /// completions and man pages; the unit enabled and started.
    Install(install::InstallArgs),
    /// Undo `ferrolet install`: stop the unit and the pods, remove what install added.
    Uninstall(install::UninstallArgs),
}

#[derive(Args, Debug, Clone)]
pub struct RootArg {
    /// The agent's root directory.
    #[arg(long = "root-dir", env = "FERROLET_ROOT_DIR", default_value = "/var/lib/ferrolet")]
    pub root_dir: PathBuf,
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

#[derive(Args, Debug)]
pub struct TopArgs {
    #[command(flatten)]
    pub root: RootArg,
    #[command(subcommand)]
    pub command: TopCommand,
}

#[derive(Subcommand, Debug)]
pub enum TopCommand {
    /// Cpu (millicores) and memory (working set) of pods, or of their containers.
    #[command(alias = "pod", alias = "po")]
    Pods(TopPodsArgs),
    /// Cpu and memory of the node, with their share of its capacity.
    #[command(alias = "nodes", alias = "no")]
    Node,
}

#[derive(Args, Debug)]
pub struct TopPodsArgs {
    /// Only this pod.
    pub name: Option<String>,
    /// Only this namespace (all by default).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// One line per container.
    #[arg(long)]
    pub containers: bool,
    /// Sort by cpu or memory, highest first.
    #[arg(long = "sort-by")]
    pub sort_by: Option<String>,
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
    /// Pull an image from its registry (or the mirrors registries.yaml names) into the store.
    Pull(PullArgs),
    /// Remove every image no container uses.
    Prune {
        #[command(flatten)]
        root: RootArg,
    },
}

#[derive(Args, Debug)]
pub struct PullArgs {
    #[command(flatten)]
    pub root: RootArg,
    /// The image: `busybox`, `reg.local:5000/team/app:1`, `repo@sha256:...`.
    pub reference: String,
    /// Registry mirrors, rewrites, TLS and auth (k3s registries.yaml); default
    /// <root-dir>/registries.yaml.
    #[arg(long = "registry-config")]
    pub registry_config: Option<PathBuf>,
    /// USER:PASSWORD to log in with (tried before the docker config's).
    #[arg(long)]
    pub creds: Option<String>,
    /// OS/ARCH[/VARIANT] to choose from a multi-platform image (default: this machine's).
    #[arg(long)]
    pub platform: Option<String>,
    /// A docker config.json to take credentials from (default: the node's, as the agent
    /// searches: <root-dir>/config.json, /var/lib/kubelet/config.json, ~/.docker/config.json).
    #[arg(long = "docker-config")]
    pub docker_config: Option<PathBuf>,
}
