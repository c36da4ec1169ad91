//! The `ferrolet` command: parses the command line, forks the runtime's zygote before any
//! thread exists (docs/runtime.md#the-zygote) and runs the agent or a CLI command. The agent
//! itself is the library (src/lib.rs).

use std::io::Write;

use anyhow::{Context, Result};
use clap::Parser;
use ferrolet::cli::{self, Cli, Command};
use ferrolet::{agent, cm, config};

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
        .with_writer(|| LossyStderr)
        // On a failed write the subscriber would report it with eprintln!, which panics when
        // stderr is what failed: the first log line of every task would then end that task.
        .log_internal_errors(false)
        .init();
}

/// stderr for the agent's log, where a failed write (a full disk, a closed pipe) loses that
/// line and nothing else: the agent must keep running its pods whether or not it can log.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn tokio_rt(multi: bool) -> Result<tokio::runtime::Runtime> {
    let mut b = if multi {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        // The agent's periodic blocking work (stats, log rotation, GC) comes every 10 s, just
        // as tokio's default 10 s keep-alive ends the threads that did the last round: an idle
        // agent made and ended a thread every second. 15 s outlasts a round; 60 s kept every
        // thread a burst made (45-121 after 100 pods: the trickle of blocking calls reached
        // each within the minute), 15 s lets the pool go back to what the rounds use (8),
        // about 20 KiB less per pod (docs/agent.md, "The blocking pool's stacks").
        b.thread_keep_alive(std::time::Duration::from_secs(15));
        b
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    b.enable_all().build().context("starting the async runtime")
}

fn real_main() -> Result<i32> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(flags) => run_agent(&flags),
        Command::Reset(a) => reset(&a),
        Command::Pods(a) => tokio_rt(false)?.block_on(cli::pods::run(&a)),
        Command::Logs(a) => tokio_rt(false)?.block_on(cli::logs::run(&a)),
        Command::Exec(a) => cli::exec::run(&a),
        Command::Top(a) => tokio_rt(false)?.block_on(cli::top::run(&a)),
        Command::Ui(a) => tokio_rt(false)?.block_on(cli::ui::run(&a)),
        Command::Images(c) => cli::images::run(&c),
        Command::Install(a) => cli::install::install(&a),
        Command::Uninstall(a) => cli::install::uninstall(&a, |root| {
            reset(&cli::RootArg {
                root_dir: root.to_path_buf(),
            })
        }),
    }
}

// The zygote is forked from a shallow stack: every frame above `fork_zygote` stays in the
// zygote, and every page of it the zygote writes later becomes private memory in each
// container monitor forked from it. So the frames that hold the agent's (large) future are
// entered only after the fork, and never inlined into the frames that fork.

#[inline(never)]
fn run_agent(flags: &config::RunFlags) -> Result<i32> {
    // Re-executes from a copy of the binary no container can write to, before anything else
    // runs twice (docs/runtime.md#a-sealed-binary).
    let sealed = ferrolet_runtime::exe_seal::reexec_sealed()
        .context("running the agent from a sealed copy of its binary (docs/runtime.md#a-sealed-binary)")?;
    let (cfg, mut warnings) = config::load(flags)?;
    if sealed == ferrolet_runtime::exe_seal::Sealed::Memfd {
        warnings.push(
            "overlayfs could not present the binary read-only: the agent runs from a sealed memfd copy, \
             which holds the binary's size in memory"
                .into(),
        );
    }
    agent::require_root()?;
    cm::swap::check(cfg.fail_swap_on, std::path::Path::new("/proc/swaps"))?;
    // Before any thread exists (docs/runtime.md#the-zygote).
    let zygote = ferrolet_runtime::fork_zygote()?;
    serve(cfg, zygote, warnings)
}

#[inline(never)]
fn serve(cfg: config::Config, zygote: ferrolet_runtime::ZygoteHandle, warnings: Vec<String>) -> Result<i32> {
    init_logging(cfg.verbosity);
    tokio_rt(true)?.block_on(agent::run(cfg, zygote, warnings))?;
    Ok(0)
}

#[inline(never)]
fn reset(a: &cli::RootArg) -> Result<i32> {
    agent::require_root()?;
    let zygote = ferrolet_runtime::fork_zygote()?;
    reset_with(a, zygote)
}

#[inline(never)]
fn reset_with(a: &cli::RootArg, zygote: ferrolet_runtime::ZygoteHandle) -> Result<i32> {
    tokio_rt(false)?.block_on(cli::reset::run(&a.root_dir, zygote))
}

/// glibc gives every thread that contends for the allocator an arena of its own, up to eight
/// per core, and keeps what each arena once held: the agent's tokio workers and blocking
/// threads took about 3 MiB more at 50 pods that way than with two arenas (measured
/// 2026-11-23, docs/runtime.md#measured-costs). Two, unless the environment chose
/// (`MALLOC_ARENA_MAX`, `GLIBC_TUNABLES`). Set before any thread exists.
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() && std::env::var_os("GLIBC_TUNABLES").is_none() {
        // SAFETY: mallopt only changes a malloc parameter; no thread is running yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

fn main() {
    limit_malloc_arenas();
    match real_main() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "ferrolet: {e:#}");
            std::process::exit(1);
        }
    }
}
