//! ferrolet: a Kubernetes node agent with its own container runtime.
//!
//! The data path reads like kubelet's: sources (manifest dir, URL) -> dispatcher (pod config
//! and admission) -> one worker per pod -> sync (cgroup, sandbox, volumes, containers) ->
//! status, served by the HTTP API. The runtime crate creates the containers; it needs its
//! zygote forked before any thread exists, so `main` does that before starting tokio.

mod agent;
mod cli;
mod config;
mod dispatcher;
mod images;
mod logs;
mod netns;
mod network;
mod node;
mod pod;
mod podcgroups;
mod podmanager;
mod probe;
mod reset;
mod server;
mod sources;
mod status;
mod sync;
mod units;

use anyhow::{anyhow, Result};
use clap::Parser;
use cli::{Cli, Command};

fn init_logging(verbosity: u8) {
    let default = match verbosity {
        0..=3 => "info",
        4..=5 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "ferrolet={default},ferrolet_runtime={default},ferrolet_netplug={default},warn"
        ))
    });
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

fn build_config(flags: &cli::RunFlags) -> Result<(config::Config, Vec<String>)> {
    let mut cfg = config::Config::default();
    let mut warnings = Vec::new();
    if let Some(path) = &flags.config {
        warnings = config::apply_file(&mut cfg, path)?;
    }
    config::apply_flags(&mut cfg, flags)?;
    if flags.root_dir.is_none()
        && flags.image_import_dir.is_none()
        && cfg.image_import_dir == config::Config::default().image_import_dir
    {
        cfg.image_import_dir = cfg.root_dir.join("images/import");
    }
    cfg.validate()?;
    Ok((cfg, warnings))
}

fn tokio_rt(multi: bool) -> Result<tokio::runtime::Runtime> {
    let mut b = if multi {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    b.enable_all()
        .build()
        .map_err(|e| anyhow!("starting the async runtime: {e}"))
}

fn real_main() -> Result<i32> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(flags) => {
            let (cfg, warnings) = build_config(&flags)?;
            agent::require_root()?;
            // Before any thread exists (DESIGN.md §1).
            let zygote = ferrolet_runtime::fork_zygote().map_err(|e| anyhow!("{}", ferrolet_fsutil::chain(&e)))?;
            init_logging(cfg.verbosity);
            tokio_rt(true)?.block_on(agent::run(cfg, zygote, warnings))?;
            Ok(0)
        }
        Command::Reset(a) => {
            agent::require_root()?;
            let zygote = ferrolet_runtime::fork_zygote().map_err(|e| anyhow!("{}", ferrolet_fsutil::chain(&e)))?;
            tokio_rt(false)?.block_on(reset::run(&a.root_dir, zygote))
        }
        Command::Pods(a) => tokio_rt(false)?.block_on(cli::pods::run(&a)),
        Command::Logs(a) => tokio_rt(false)?.block_on(cli::logs::run(&a)),
        Command::Exec(a) => cli::exec::run(&a),
        Command::Images(c) => cli::images::run(&c),
    }
}

fn main() {
    match real_main() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("ferrolet: {e:#}");
            std::process::exit(1);
        }
    }
}
