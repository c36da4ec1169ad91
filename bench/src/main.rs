//! ferrolet's benchmarks, printed as numbers and ratios against peers measured in the same run
//! (crun, runc, podman from Debian). Nothing here passes or fails. Run as root:
//! `scripts/bench` (installs the peers, builds release binaries, writes bench/RESULTS.md).
//!
//! Everything runs inside a private network namespace (the agent's bridge and podman's
//! networks never touch the node) and below this process's own cgroup.

mod agent;
mod cluster;
mod fleet;
mod peers;
mod phases;
mod procstat;
mod pull;
mod stats;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use ferrolet_runtime::cgroups::{Cgroups, NestedRoot};
use ferrolet_runtime::{ContainerConfig, Runtime};

use agent::{ms_between, pod_manifest, wait_mark, Agent};
use procstat::percentile;

#[derive(Parser, Debug)]
#[command(about = "ferrolet benchmarks beside crun, runc and podman")]
struct Opts {
    /// Pods created one after another for the latency figures.
    #[arg(long, default_value_t = 50)]
    pods: usize,
    /// Pods written at once for the burst figures.
    #[arg(long, default_value_t = 100)]
    burst: usize,
    /// Container create+start+delete runs for the runtime floor.
    #[arg(long, default_value_t = 50)]
    runs: usize,
    /// Seconds of steady state for the CPU figure.
    #[arg(long, default_value_t = 60)]
    cpu_seconds: u64,
    /// Skip podman (crun and runc still run).
    #[arg(long)]
    skip_podman: bool,
    /// Skip the cluster-mode figures (they need ../shared/k8s/control-plane).
    #[arg(long)]
    skip_cluster: bool,
    /// Only the cluster-mode figures.
    #[arg(long)]
    only_cluster: bool,
    /// Only the stats figures (scrape cost and the agent's CPU with pods running).
    #[arg(long)]
    only_stats: bool,
    /// Only the image pull figures (a local docker-registry; ferrolet beside skopeo).
    #[arg(long)]
    only_pull: bool,
    /// Only the start-path figures: latency with N pods already running, and where it goes.
    #[arg(long)]
    only_start: bool,
    /// Pods already running for the start-path figures (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "0,50,100")]
    running: Vec<usize>,
    /// Pause between one measured start and the next in the start-path figures (ms): a start
    /// is measured alone, as a person would write one manifest; 0 starts the next at once.
    #[arg(long, default_value_t = 50)]
    start_gap_ms: u64,
    /// Pod networks for the start-path figures (comma-separated: none, bridge, and each with
    /// `+pool`: a sandbox pool of `--start-pods` entries, filled before the measured starts);
    /// each gets its own agent and its own columns.
    #[arg(long, value_delimiter = ',', default_value = "none,bridge,none+pool,bridge+pool")]
    start_network: Vec<String>,
    /// Pods started one after another at each count of running pods (start-path figures).
    #[arg(long, default_value_t = 20)]
    start_pods: usize,
    /// Only the runtime floor (ferrolet's runtime crate beside crun and runc).
    #[arg(long)]
    only_floor: bool,
    /// Only ferrolet's memory: idle, a burst of `--burst` pods 2 s after it and after
    /// `--cpu-seconds` idle, split by process (agent code and data, zygote, monitors), and the
    /// CPU of each part over the second half of the idle time.
    #[arg(long)]
    only_memory: bool,
    /// Skip the image pull figures.
    #[arg(long)]
    skip_pull: bool,
    /// Pulls (and cold pod starts) measured for the pull figures.
    #[arg(long, default_value_t = 10)]
    pull_runs: usize,
    /// Pods running for the stats figures.
    #[arg(long, default_value_t = 50)]
    stats_pods: usize,
    /// Scrapes of each endpoint for the stats figures.
    #[arg(long, default_value_t = 200)]
    stats_scrapes: usize,
    /// Pods created through the API server one after another (cluster mode).
    #[arg(long, default_value_t = 20)]
    cluster_pods: usize,
    /// Pods created through the API server at once (cluster mode).
    #[arg(long, default_value_t = 50)]
    cluster_burst: usize,
    /// A sandbox pool of this many entries for the cluster agent (0: none), filled before the
    /// burst.
    #[arg(long, default_value_t = 0)]
    cluster_pool: usize,
    /// Only the fleet figures: `--fleet-nodes` nodes against one control plane.
    #[arg(long)]
    only_fleet: bool,
    /// Skip the fleet figures.
    #[arg(long)]
    skip_fleet: bool,
    /// Nodes of the fleet, each in a network namespace of its own.
    #[arg(long, default_value_t = 20)]
    fleet_nodes: usize,
    /// Pods created at once on each fleet node, for the requests per pod start.
    #[arg(long, default_value_t = 2)]
    fleet_pods_per_node: usize,
    /// The ferrolet binary (release build).
    #[arg(long, default_value = "target/release/ferrolet")]
    ferrolet: PathBuf,
    /// The demo image archives.
    #[arg(long, default_value = "images/out")]
    images: PathBuf,
    /// Where to write the results as Markdown (the last one given wins).
    #[arg(long, default_value = "bench/RESULTS.md", overrides_with = "out")]
    out: PathBuf,
}

/// One line of the results table.
struct Row {
    metric: String,
    ferrolet: Option<f64>,
    podman: Option<f64>,
    crun: Option<f64>,
    runc: Option<f64>,
    skopeo: Option<f64>,
    /// Which peer the ratio compares with.
    against: &'static str,
    unit: &'static str,
}

impl Row {
    fn new(metric: impl Into<String>, unit: &'static str, against: &'static str) -> Row {
        Row {
            metric: metric.into(),
            ferrolet: None,
            podman: None,
            crun: None,
            runc: None,
            skopeo: None,
            against,
            unit,
        }
    }
    fn ratio(&self) -> String {
        let peer = match self.against {
            "podman" => self.podman,
            "crun" => self.crun,
            "runc" => self.runc,
            "skopeo" => self.skopeo,
            _ => None,
        };
        match (self.ferrolet, peer) {
            (Some(f), Some(p)) if p > 0.0 => format!("{:.2}× {}", f / p, self.against),
            _ => "-".into(),
        }
    }
}

fn fmt(v: Option<f64>, unit: &str) -> String {
    match v {
        Some(x) if x.is_finite() => {
            if x >= 100.0 {
                format!("{x:.0} {unit}")
            } else if x >= 10.0 {
                format!("{x:.1} {unit}")
            } else {
                format!("{x:.2} {unit}")
            }
        }
        Some(_) => "n/a".into(),
        None => "-".into(),
    }
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    (percentile(&v, 50.0), percentile(&v, 90.0), percentile(&v, 99.0))
}

fn loopback_up() {
    // SAFETY: socket/ioctl on a zeroed ifreq naming "lo".
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            ifr.ifr_name[i] = *b as libc::c_char;
        }
        if libc::ioctl(s, libc::SIOCGIFFLAGS as _, &mut ifr) == 0 {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            libc::ioctl(s, libc::SIOCSIFFLAGS as _, &ifr);
        }
        libc::close(s);
    }
}

fn main() -> Result<()> {
    let opts = Opts::parse();
    // The runtime floor goes through the runtime crate: its zygote first (docs/runtime.md#the-zygote).
    let zygote = ferrolet_runtime::fork_zygote().map_err(anyhow::Error::from)?;
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("the benchmarks run containers and need root");
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).context("entering a private network namespace")?;
    loopback_up();
    let dir = std::env::temp_dir().join(format!("ferrolet-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let cgroups = Cgroups::detect().map_err(anyhow::Error::from)?;
    let cg =
        NestedRoot::create(&cgroups, &format!("ferrolet-bench-{}", std::process::id())).map_err(anyhow::Error::from)?;
    // Clean up after a panic too: the run happens behind catch_unwind.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&opts, zygote, &dir, &cgroups, &cg)))
        .unwrap_or_else(|_| Err(anyhow!("the benchmark panicked")));
    let _ = cg.cleanup();
    let _ = ferrolet_runtime::mount_ns::release_root(&dir.join("rt"));
    let _ = std::fs::remove_dir_all(&dir);
    let (rows, sections) = result?;
    let table = render(&rows);
    println!("\n{table}");
    let mut phase_md = String::new();
    for s in &sections {
        println!("\n{s}");
        phase_md.push('\n');
        phase_md.push_str(s);
    }
    let md = format!("{}\n{table}{phase_md}\n{}", header(), notes(&opts));
    std::fs::write(&opts.out, md).with_context(|| format!("writing {}", opts.out.display()))?;
    println!("written to {}", opts.out.display());
    Ok(())
}

fn run(
    opts: &Opts,
    zygote: ferrolet_runtime::ZygoteHandle,
    dir: &Path,
    cgroups: &Cgroups,
    cg: &NestedRoot,
) -> Result<(Vec<Row>, Vec<String>)> {
    if opts.only_start {
        let bin = std::fs::canonicalize(&opts.ferrolet)
            .with_context(|| format!("{} (build with cargo build --release)", opts.ferrolet.display()))?;
        let (rows, table) = start_rows(opts, &bin, dir, cg)?;
        return Ok((rows, vec![start_section(opts, &table)]));
    }
    if opts.only_cluster {
        let bin = std::fs::canonicalize(&opts.ferrolet)
            .with_context(|| format!("{} (build with cargo build --release)", opts.ferrolet.display()))?;
        let (rows, section) = cluster_rows(opts, &bin, dir, cg)?;
        return Ok((rows, section.into_iter().collect()));
    }
    if opts.only_fleet {
        let bin = std::fs::canonicalize(&opts.ferrolet)
            .with_context(|| format!("{} (build with cargo build --release)", opts.ferrolet.display()))?;
        let (rows, section) = fleet_rows(opts, &bin, dir, cg)?;
        return Ok((rows, section.into_iter().collect()));
    }
    if opts.only_stats {
        let bin = std::fs::canonicalize(&opts.ferrolet)
            .with_context(|| format!("{} (build with cargo build --release)", opts.ferrolet.display()))?;
        return Ok((stats_rows(opts, &bin, dir, cg)?, Vec::new()));
    }
    if opts.only_memory {
        let bin = std::fs::canonicalize(&opts.ferrolet)
            .with_context(|| format!("{} (build with cargo build --release)", opts.ferrolet.display()))?;
        return Ok((memory_rows(opts, &bin, dir, cg)?, Vec::new()));
    }
    if opts.only_pull {
        let bin = std::fs::canonicalize(&opts.ferrolet)
            .with_context(|| format!("{} (build with cargo build --release)", opts.ferrolet.display()))?;
        return Ok((pull_rows(opts, &bin, dir, cg)?, Vec::new()));
    }
    let mut rows = Vec::new();
    let oci_tar = opts.images.join("busybox.oci.tar");
    let docker_tar = opts.images.join("busybox.docker.tar");
    let image = "docker.io/library/busybox:1.35";

    // 1. The runtime floor: create+start+wait+delete of `true`.
    settle_before("the runtime floor");
    eprintln!("== runtime floor ({} runs each)", opts.runs);
    let mut floor = Row::new("container create+start+delete, p50", "ms", "runc");
    let spec: serde_json::Value;
    {
        let rt = Runtime::new(dir.join("rt"), zygote).map_err(anyhow::Error::from)?;
        rt.images().import(&oci_tar).map_err(anyhow::Error::from)?;
        let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        // Containers built as the agent builds them: in mount namespaces of their own.
        tokio.block_on(rt.isolate_mounts()).map_err(anyhow::Error::from)?;
        let cfg = ContainerConfig {
            name: "floor".into(),
            image: image.into(),
            command: vec!["true".into()],
            cgroup_parent: cg.path().to_string(),
            ..Default::default()
        };
        // The spec ferrolet generates for this container: the peers run the same one.
        spec = tokio
            .block_on(async {
                let c = rt.create(&cfg).await?;
                let spec = std::fs::read(rt.root().join("containers").join(c.id()).join("config.json"));
                rt.delete(c.id()).await?;
                Ok::<_, ferrolet_runtime::Error>(spec)
            })
            .map_err(anyhow::Error::from)
            .and_then(|r| Ok(serde_json::from_slice(&r?)?))?;
        let mut v = Vec::new();
        // Each step's own time too: create, start, wait, delete.
        let mut steps: [Vec<f64>; 4] = Default::default();
        for _ in 0..opts.runs {
            let t = Instant::now();
            let lap = tokio
                .block_on(async {
                    let mut lap = [0.0; 4];
                    let mut at = Instant::now();
                    let mut mark = |i: usize| {
                        lap[i] = at.elapsed().as_secs_f64() * 1000.0;
                        at = Instant::now();
                    };
                    let c = rt.create(&cfg).await?;
                    mark(0);
                    rt.start(c.id()).await?;
                    mark(1);
                    rt.wait(c.id()).await?;
                    mark(2);
                    rt.delete(c.id()).await?;
                    mark(3);
                    Ok::<_, ferrolet_runtime::Error>(lap)
                })
                .map_err(anyhow::Error::from)?;
            v.push(t.elapsed().as_secs_f64() * 1000.0);
            for (s, l) in steps.iter_mut().zip(lap) {
                s.push(l);
            }
        }
        let (p50, p90, _) = stats(v);
        let [c, s, w, d] = steps.map(|s| stats(s).0);
        eprintln!(
            "   ferrolet: p50 {p50:.1} ms, p90 {p90:.1} ms (p50 of each step: create {c:.1}, start {s:.1}, wait {w:.1}, delete {d:.1} ms)"
        );
        floor.ferrolet = Some(p50);
    }
    let rootfs = dir.join("rootfs");
    peers::unpack_rootfs(&oci_tar, &rootfs)?;
    for name in ["crun", "runc"] {
        let r = peers::OciRuntime::new(name, dir, &rootfs, cgroups, cg.path(), &spec).and_then(|rt| {
            let v = (0..opts.runs).map(|i| rt.run_once(i)).collect::<Result<Vec<_>>>()?;
            let (p50, p90, _) = stats(v);
            eprintln!("   {name}: p50 {p50:.1} ms, p90 {p90:.1} ms");
            Ok(p50)
        });
        let val = match r {
            Ok(v) => Some(v),
            Err(e) => {
                eprintln!("   {name}: {e:#}");
                Some(f64::NAN)
            }
        };
        if name == "crun" {
            floor.crun = val;
        } else {
            floor.runc = val;
        }
    }
    rows.push(floor);
    if opts.only_floor {
        return Ok((rows, Vec::new()));
    }

    // 2.-6. ferrolet without a pod network: latency, memory, burst, CPU.
    let bin = std::fs::canonicalize(&opts.ferrolet)
        .with_context(|| format!("{} (build with cargo build --release)", opts.ferrolet.display()))?;
    let mut lat = [
        Row::new(
            format!(
                "pod start latency p50 ({} pods, one after another, no pod network)",
                opts.pods
            ),
            "ms",
            "podman",
        ),
        Row::new("pod start latency p90", "ms", "podman"),
        Row::new("pod start latency p99", "ms", "podman"),
    ];
    let mut lat_net = [
        Row::new(
            format!("pod start latency p50 ({} pods, with pod network)", opts.pods),
            "ms",
            "podman",
        ),
        Row::new("pod start latency p90, with pod network", "ms", "podman"),
        Row::new("pod start latency p99, with pod network", "ms", "podman"),
    ];
    let mut burst_up = Row::new(
        format!("burst: {} pods written at once, all running", opts.burst),
        "s",
        "podman",
    );
    let mut burst_down = Row::new(format!("burst: {} pods deleted, all gone", opts.burst), "s", "podman");
    let mut mem_idle = Row::new("memory (PSS): idle agent", "MiB", "podman");
    let mut mem_10 = Row::new("memory (PSS): 10 pods", "MiB", "podman");
    let mut mem_100 = Row::new(format!("memory (PSS): {} pods", opts.burst), "MiB", "podman");
    let mut mem_per_pod = Row::new("memory (PSS) per pod", "KiB", "podman");
    // The same after the CPU minute: what stays once the burst's after-effects are over.
    let mut mem_later = [
        Row::new(
            format!("memory (PSS): {} pods, after a minute idle", opts.burst),
            "MiB",
            "podman",
        ),
        Row::new("memory (PSS) per pod, after a minute idle", "KiB", "podman"),
    ];
    let mut cpu = Row::new(
        format!("CPU per minute, {} idle pods (agent + monitors / conmons)", opts.burst),
        "s",
        "podman",
    );

    eprintln!("== ferrolet: {} pods one after another, no pod network", opts.pods);
    {
        let a = Agent::start(
            &bin,
            &dir.join("ferrolet-nonet"),
            &format!("{}/nonet", cg.path()),
            "none",
            &dir.join("agent-nonet.log"),
        )?;
        std::thread::sleep(Duration::from_secs(2));
        mem_idle.ferrolet = Some(pss_mib(&a.processes()));
        settle_before("the pod starts");
        let mut v = Vec::new();
        for i in 0..opts.pods {
            let name = format!("seq{i}");
            let t0 = a.add(&name, &pod_manifest(&name, &a.marks, image))?;
            v.push(ms_between(t0, wait_mark(&a.marks, &name, Duration::from_secs(60))?));
            if i + 1 == 10 {
                std::thread::sleep(Duration::from_millis(500));
                mem_10.ferrolet = Some(pss_mib(&a.processes()));
            }
        }
        let (p50, p90, p99) = stats(v);
        lat[0].ferrolet = Some(p50);
        lat[1].ferrolet = Some(p90);
        lat[2].ferrolet = Some(p99);
        for i in 0..opts.pods {
            a.remove(&format!("seq{i}"))?;
        }
        wait_until(Duration::from_secs(120), || a.pod_count() == 0)?;

        settle_before("the burst");
        eprintln!("== ferrolet: burst of {}", opts.burst);
        let t0 = SystemTime::now();
        for i in 0..opts.burst {
            let name = format!("burst{i}");
            a.add(&name, &pod_manifest(&name, &a.marks, image))?;
        }
        let mut last = t0;
        for i in 0..opts.burst {
            last = last.max(wait_mark(&a.marks, &format!("burst{i}"), Duration::from_secs(300))?);
        }
        burst_up.ferrolet = Some(ms_between(t0, last) / 1000.0);
        std::thread::sleep(Duration::from_secs(2));
        let procs = a.processes();
        mem_100.ferrolet = Some(pss_mib(&procs));
        if let (Some(idle), Some(full)) = (mem_idle.ferrolet, mem_100.ferrolet) {
            mem_per_pod.ferrolet = Some((full - idle) * 1024.0 / opts.burst as f64);
        }
        eprintln!("== ferrolet: CPU over {}s with {} pods", opts.cpu_seconds, opts.burst);
        cpu.ferrolet = Some(cpu_per_minute(&procs, opts.cpu_seconds));
        mem_later[0].ferrolet = Some(pss_mib(&a.processes()));
        if let (Some(idle), Some(full)) = (mem_idle.ferrolet, mem_later[0].ferrolet) {
            mem_later[1].ferrolet = Some((full - idle) * 1024.0 / opts.burst as f64);
        }
        let t = Instant::now();
        for i in 0..opts.burst {
            a.remove(&format!("burst{i}"))?;
        }
        wait_until(Duration::from_secs(300), || {
            a.pod_count() == 0 && container_count(&a.root) == 0
        })?;
        burst_down.ferrolet = Some(t.elapsed().as_secs_f64());
        a.finish();
    }

    eprintln!(
        "== ferrolet: {} pods one after another, built-in bridge network",
        opts.pods
    );
    let net = (|| -> Result<(f64, f64, f64)> {
        let a = Agent::start(
            &bin,
            &dir.join("ferrolet-net"),
            &format!("{}/net", cg.path()),
            "bridge",
            &dir.join("agent-net.log"),
        )?;
        settle_before("the pod starts with a pod network");
        let mut v = Vec::new();
        for i in 0..opts.pods {
            let name = format!("net{i}");
            let t0 = a.add(&name, &pod_manifest(&name, &a.marks, image))?;
            v.push(ms_between(t0, wait_mark(&a.marks, &name, Duration::from_secs(60))?));
            if i == 0 {
                std::thread::sleep(Duration::from_millis(300));
                if a.pod_ips().is_empty() {
                    a.finish();
                    anyhow::bail!("the agent gave its pods no IP: no pod network to measure");
                }
            }
        }
        for i in 0..opts.pods {
            a.remove(&format!("net{i}"))?;
        }
        wait_until(Duration::from_secs(120), || a.pod_count() == 0)?;
        a.finish();
        Ok(stats(v))
    })();
    match net {
        Ok((p50, p90, p99)) => {
            lat_net[0].ferrolet = Some(p50);
            lat_net[1].ferrolet = Some(p90);
            lat_net[2].ferrolet = Some(p99);
        }
        Err(e) => eprintln!("   bridge network: {e:#}"),
    }

    if !opts.skip_podman {
        if let Err(e) = podman(
            opts,
            dir,
            cgroups,
            &docker_tar,
            image,
            &mut lat,
            &mut lat_net,
            &mut burst_up,
            &mut burst_down,
            &mut mem_10,
            &mut mem_100,
            &mut mem_per_pod,
            &mut mem_later,
            &mut cpu,
        ) {
            eprintln!("   podman: {e:#}");
        }
    }
    rows.extend(lat);
    rows.extend(lat_net);
    rows.extend([burst_up, burst_down, mem_idle, mem_10, mem_100, mem_per_pod]);
    rows.extend(mem_later);
    rows.push(cpu);

    if !opts.skip_pull {
        rows.extend(pull_rows(opts, &bin, dir, cg)?);
    }
    let (start, phase_table) = start_rows(opts, &bin, dir, cg)?;
    rows.extend(start);
    rows.extend(stats_rows(opts, &bin, dir, cg)?);
    let (cluster, cluster_section) = cluster_rows(opts, &bin, dir, cg)?;
    rows.extend(cluster);
    let (fleet, fleet_section) = fleet_rows(opts, &bin, dir, cg)?;
    rows.extend(fleet);
    rows.push(size_row(&bin));
    let mut sections = vec![start_section(opts, &phase_table)];
    sections.extend(cluster_section);
    sections.extend(fleet_section);
    Ok((rows, sections))
}

/// The per-phase table of static pod starts, with what it shows.
fn start_section(opts: &Opts, table: &str) -> String {
    format!(
        "Where a pod's start goes: p50 of each phase's share, from the agent's own `ferrolet::start_phase` \
         timestamps (docs/start-path.md), {} pods started one after another with N pods already running (pod networks: {}):\n\n{table}",
        opts.start_pods,
        opts.start_network.join(", ")
    )
}

/// The size on disk of the ferrolet binary the benchmark ran (Cargo.toml's release profile),
/// beside the peers' own binaries found on PATH: podman's alone (its conmon
/// and OCI runtime are more files), crun and runc single binaries.
fn size_row(bin: &Path) -> Row {
    let mb = |p: &Path| std::fs::metadata(p).ok().map(|m| m.len() as f64 / 1e6);
    let peer = |name: &str| {
        let path = std::env::var_os("PATH")?;
        let found = std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())?;
        mb(&found)
    };
    let mut row = Row::new("binary size (release build)", "MB", "podman");
    row.ferrolet = mb(bin);
    row.podman = peer("podman");
    row.crun = peer("crun");
    row.runc = peer("runc");
    row
}

/// Pod start latency with N pods already running, and the per-phase table of those starts
/// from the agent's own timestamps.
fn start_rows(opts: &Opts, bin: &Path, dir: &Path, cg: &NestedRoot) -> Result<(Vec<Row>, String)> {
    let image = "docker.io/library/busybox:1.35";
    let mut running = opts.running.clone();
    running.sort_unstable();
    let mut rows = Vec::new();
    let mut sets = Vec::new();
    for network in &opts.start_network {
        let (what, suffix, pool) = match network.as_str() {
            "none" => ("no pod network", "", 0),
            "bridge" => ("built-in bridge", ", bridge", 0),
            "none+pool" => ("no pod network, sandbox pool", ", pool", opts.start_pods),
            "bridge+pool" => ("built-in bridge, sandbox pool", ", bridge, pool", opts.start_pods),
            other => anyhow::bail!("--start-network {other}: none, bridge, none+pool or bridge+pool"),
        };
        let mode = network.trim_end_matches("+pool");
        let name = network.replace('+', "-");
        let log = dir.join(format!("agent-start-{name}.log"));
        let a = Agent::start_with(
            bin,
            &dir.join(format!("ferrolet-start-{name}")),
            &format!("{}/start-{name}", cg.path()),
            mode,
            &log,
            &["--sandbox-pool".to_string(), pool.to_string()],
        )?;
        std::thread::sleep(Duration::from_secs(1));
        for &n in &running {
            eprintln!(
                "== ferrolet: {} pods one after another with {n} pods already running ({what})",
                opts.start_pods
            );
            let starts = phases::starts_with_running(
                &a,
                image,
                &format!("run{n}s"),
                n,
                opts.start_pods,
                Duration::from_millis(opts.start_gap_ms),
                pool,
            )?;
            wait_until(Duration::from_secs(120), || a.pod_count() == n)?;
            let v: Vec<f64> = starts.iter().map(|s| ms_between(s.t0, s.first)).collect();
            let (p50, p90, _) = stats(v);
            let mut r = Row::new(
                format!(
                    "pod start latency p50 with {n} pods already running ({} pods, {what})",
                    opts.start_pods
                ),
                "ms",
                "none",
            );
            r.ferrolet = Some(p50);
            rows.push(r);
            let mut r = Row::new(
                format!("pod start latency p90 with {n} pods already running{suffix}"),
                "ms",
                "none",
            );
            r.ferrolet = Some(p90);
            rows.push(r);
            sets.push((format!("{n} running{suffix}"), phases::shares(&log, &starts)));
        }
        a.finish();
    }
    Ok((rows, phases::render(&sets)))
}

/// Image pulls from a local docker-registry, beside `skopeo copy` to a directory, and the cold
/// start of a pod whose image must be pulled.
fn pull_rows(opts: &Opts, bin: &Path, dir: &Path, cg: &NestedRoot) -> Result<Vec<Row>> {
    settle_before("the pulls");
    eprintln!(
        "== pulls: the two-layer image from a local docker-registry, {} runs each",
        opts.pull_runs
    );
    let r = pull::run_all(
        bin,
        &opts.images,
        &dir.join("pull"),
        &format!("{}/pull", cg.path()),
        opts.pull_runs,
    )?;
    let mut whole = Row::new(
        format!(
            "pull: two-layer image ({} KiB) from a local registry into an empty store, p50",
            r.image_bytes / 1024
        ),
        "ms",
        "skopeo",
    );
    whole.ferrolet = Some(r.ferrolet_ms);
    whole.skopeo = Some(r.skopeo_ms);
    let mut cold = Row::new(
        format!("pod start, image pulled first (cold), p50 of {}", r.runs),
        "ms",
        "none",
    );
    cold.ferrolet = Some(r.cold_start_ms);
    let mut warm = Row::new("pod start, same image already on the node, p50", "ms", "none");
    warm.ferrolet = Some(r.warm_start_ms);
    Ok(vec![whole, cold, warm])
}

/// The stats endpoints with `stats_pods` pods: numbers only (no peer serves kubelet's stats).
fn stats_rows(opts: &Opts, bin: &Path, dir: &Path, cg: &NestedRoot) -> Result<Vec<Row>> {
    eprintln!(
        "== stats: {} pods, {} scrapes of each endpoint, agent CPU over {}s idle and scraped every 10s",
        opts.stats_pods, opts.stats_scrapes, opts.cpu_seconds
    );
    let r = stats::run(
        bin,
        &dir.join("ferrolet-stats"),
        &format!("{}/stats", cg.path()),
        "docker.io/library/busybox:1.35",
        opts.stats_pods,
        opts.stats_scrapes,
        opts.cpu_seconds,
    )?;
    let mut rows = Vec::new();
    let mut row = |metric: String, unit: &'static str, v: f64| {
        let mut x = Row::new(metric, unit, "none");
        x.ferrolet = Some(v);
        rows.push(x);
    };
    let n = opts.stats_pods;
    row(
        format!(
            "stats: one /stats/summary scrape, {n} pods, p50 ({} KiB)",
            r.summary_bytes / 1024
        ),
        "ms",
        r.summary_p50_ms,
    );
    row(
        format!("stats: one /stats/summary scrape, {n} pods, p99"),
        "ms",
        r.summary_p99_ms,
    );
    row(
        format!("stats: one /metrics/resource scrape, {n} pods, p50"),
        "ms",
        r.resource_p50_ms,
    );
    row(
        format!("stats: one /metrics/resource scrape, {n} pods, p99"),
        "ms",
        r.resource_p99_ms,
    );
    row(
        format!("stats: agent CPU per minute, {n} pods, no scrapes"),
        "s",
        r.cpu_idle_s_per_min,
    );
    row(
        format!("stats: agent CPU per minute, {n} pods, both endpoints scraped every 10 s"),
        "s",
        r.cpu_scraped_s_per_min,
    );
    Ok(rows)
}

#[allow(clippy::too_many_arguments)]
fn podman(
    opts: &Opts,
    dir: &Path,
    cgroups: &Cgroups,
    docker_tar: &Path,
    image: &str,
    lat: &mut [Row; 3],
    lat_net: &mut [Row; 3],
    burst_up: &mut Row,
    burst_down: &mut Row,
    mem_10: &mut Row,
    mem_100: &mut Row,
    mem_per_pod: &mut Row,
    mem_later: &mut [Row; 2],
    cpu: &mut Row,
) -> Result<()> {
    eprintln!(
        "== podman kube play: {} pods one after another, no pod network",
        opts.pods
    );
    let p = peers::Podman::new(dir, cgroups, docker_tar)?;
    let marks = dir.join("podman-marks");
    std::fs::create_dir_all(&marks)?;
    let manifests = dir.join("podman-manifests");
    std::fs::create_dir_all(&manifests)?;
    let play = |name: &str, net: bool| -> Result<SystemTime> {
        let f = manifests.join(format!("{name}.yaml"));
        std::fs::write(&f, pod_manifest(name, &marks, image))?;
        let t0 = SystemTime::now();
        let f = f.display().to_string();
        if net {
            p.run(&["kube", "play", &f])?;
        } else {
            p.run(&["kube", "play", "--network", "none", &f])?;
        }
        Ok(t0)
    };
    settle_before("podman's pod starts");
    let mut v = Vec::new();
    for i in 0..opts.pods {
        let name = format!("seq{i}");
        let t0 = play(&name, false)?;
        v.push(ms_between(t0, wait_mark(&marks, &name, Duration::from_secs(60))?));
        if i + 1 == 10 {
            std::thread::sleep(Duration::from_millis(500));
            mem_10.podman = Some(pss_mib(&p.processes()));
        }
    }
    let (p50, p90, p99) = stats(v);
    lat[0].podman = Some(p50);
    lat[1].podman = Some(p90);
    lat[2].podman = Some(p99);
    p.run(&["pod", "rm", "-af", "-t", "0"])?;

    settle_before("podman's burst");
    eprintln!("== podman kube play: burst of {}", opts.burst);
    let all = manifests.join("burst.yaml");
    let docs: Vec<String> = (0..opts.burst)
        .map(|i| pod_manifest(&format!("burst{i}"), &marks, image))
        .collect();
    std::fs::write(&all, docs.join("---\n"))?;
    let t0 = SystemTime::now();
    p.run(&["kube", "play", "--network", "none", &all.display().to_string()])?;
    let mut last = t0;
    for i in 0..opts.burst {
        last = last.max(wait_mark(&marks, &format!("burst{i}"), Duration::from_secs(600))?);
    }
    burst_up.podman = Some(ms_between(t0, last) / 1000.0);
    std::thread::sleep(Duration::from_secs(2));
    let procs = p.processes();
    mem_100.podman = Some(pss_mib(&procs));
    mem_per_pod.podman = mem_100.podman.map(|m| m * 1024.0 / opts.burst as f64);
    eprintln!("== podman: CPU over {}s with {} pods", opts.cpu_seconds, opts.burst);
    cpu.podman = Some(cpu_per_minute(&procs, opts.cpu_seconds));
    mem_later[0].podman = Some(pss_mib(&p.processes()));
    mem_later[1].podman = mem_later[0].podman.map(|m| m * 1024.0 / opts.burst as f64);
    let t = Instant::now();
    p.run(&["kube", "down", &all.display().to_string()])?;
    burst_down.podman = Some(t.elapsed().as_secs_f64());

    eprintln!(
        "== podman kube play: {} pods one after another, default pod network",
        opts.pods
    );
    settle_before("podman's pod starts with a pod network");
    let mut v = Vec::new();
    for i in 0..opts.pods {
        let name = format!("net{i}");
        let t0 = play(&name, true)?;
        v.push(ms_between(t0, wait_mark(&marks, &name, Duration::from_secs(60))?));
    }
    let (p50, p90, p99) = stats(v);
    lat_net[0].podman = Some(p50);
    lat_net[1].podman = Some(p90);
    lat_net[2].podman = Some(p99);
    p.finish();
    Ok(())
}

/// Wait (up to a minute) for the machine to go quiet before a latency section, and say so.
fn settle_before(what: &str) {
    let waited = procstat::settle(Duration::from_secs(60));
    eprintln!(
        "   (waited {:.1} s for a quiet machine before {what})",
        waited.as_secs_f64()
    );
}

fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() > deadline {
            anyhow::bail!("timed out after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn container_count(root: &Path) -> usize {
    std::fs::read_dir(root.join("containers"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// ferrolet's memory alone, split by process: what the per-pod figure is made of.
fn memory_rows(opts: &Opts, bin: &Path, dir: &Path, cg: &NestedRoot) -> Result<Vec<Row>> {
    let image = "docker.io/library/busybox:1.35";
    let a = Agent::start(
        bin,
        &dir.join("ferrolet-memory"),
        &format!("{}/memory", cg.path()),
        "none",
        &dir.join("agent-memory.log"),
    )?;
    std::thread::sleep(Duration::from_secs(2));
    let mut rows = Vec::new();
    let n = opts.burst as f64;
    let idle = procstat::Split::of(a.pid(), &a.processes(), &a.root);
    rows.extend(idle.rows("idle agent", None));
    settle_before("the burst");
    eprintln!("== ferrolet: burst of {}, memory", opts.burst);
    for i in 0..opts.burst {
        let name = format!("mem{i}");
        a.add(&name, &pod_manifest(&name, &a.marks, image))?;
    }
    for i in 0..opts.burst {
        wait_mark(&a.marks, &format!("mem{i}"), Duration::from_secs(300))?;
    }
    std::thread::sleep(Duration::from_secs(2));
    let full = procstat::Split::of(a.pid(), &a.processes(), &a.root);
    rows.extend(full.rows(&format!("{} pods, 2 s after the burst", opts.burst), Some((&idle, n))));
    eprintln!("== ferrolet: {}s idle with {} pods", opts.cpu_seconds, opts.burst);
    // The CPU of each part over the second half of the idle time: the burst's after-effects
    // (first resyncs, code paged in) are over by then.
    std::thread::sleep(Duration::from_secs(opts.cpu_seconds / 2));
    let procs = a.processes();
    let before = procstat::cpu_split(a.pid(), &procs, &a.root);
    let window = opts.cpu_seconds - opts.cpu_seconds / 2;
    std::thread::sleep(Duration::from_secs(window));
    let after = procstat::cpu_split(a.pid(), &procs, &a.root);
    let per_minute = |i: usize| {
        after[i].saturating_sub(before[i]) as f64 / procstat::ticks_per_second() as f64 * 60.0 / window as f64
    };
    let mut total = Row::new(
        format!("CPU per minute, {} idle pods, all parts", opts.burst),
        "s",
        "podman",
    );
    total.ferrolet = Some((0..3).map(per_minute).sum());
    rows.push(total);
    for (i, part) in ["agent", "zygote", "monitors"].iter().enumerate() {
        let mut r = Row::new(
            format!("  CPU per minute, {} idle pods: {part}", opts.burst),
            "s",
            "podman",
        );
        r.ferrolet = Some(per_minute(i));
        rows.push(r);
    }
    let later = procstat::Split::of(a.pid(), &a.processes(), &a.root);
    rows.extend(later.rows(
        &format!("{} pods, after {} s idle", opts.burst, opts.cpu_seconds),
        Some((&idle, n)),
    ));
    for i in 0..opts.burst {
        a.remove(&format!("mem{i}"))?;
    }
    wait_until(Duration::from_secs(300), || {
        a.pod_count() == 0 && container_count(&a.root) == 0
    })?;
    a.finish();
    Ok(rows)
}

fn pss_mib(pids: &[i32]) -> f64 {
    pids.iter().map(|p| procstat::pss_kib(*p)).sum::<u64>() as f64 / 1024.0
}

/// CPU seconds the processes used per minute, measured over `secs`.
fn cpu_per_minute(pids: &[i32], secs: u64) -> f64 {
    let before: u64 = pids.iter().map(|p| procstat::cpu_ticks(*p)).sum();
    std::thread::sleep(Duration::from_secs(secs));
    let after: u64 = pids.iter().map(|p| procstat::cpu_ticks(*p)).sum();
    (after.saturating_sub(before)) as f64 / procstat::ticks_per_second() as f64 * 60.0 / secs as f64
}

fn render(rows: &[Row]) -> String {
    let mut s =
        String::from("| metric | ferrolet | podman | crun | runc | skopeo | ratio |\n|---|---|---|---|---|---|---|\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.metric,
            fmt(r.ferrolet, r.unit),
            fmt(r.podman, r.unit),
            fmt(r.crun, r.unit),
            fmt(r.runc, r.unit),
            fmt(r.skopeo, r.unit),
            r.ratio()
        ));
    }
    s
}

fn header() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
        })
        .map(|k| k / 1024 / 1024)
        .unwrap_or(0);
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let cg = Cgroups::detect()
        .map(|c| if c.is_v2() { "cgroup v2" } else { "cgroup v1 (hybrid)" })
        .unwrap_or("?");
    format!(
        "# ferrolet benchmark results\n\nMeasured {} on {cpu}, {cores} cores, {mem} GiB RAM, Linux {kernel}, {cg}.\nProduced by `scripts/bench` (see the README's Benchmarks section for what each number means).\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    )
}

/// Cluster mode: no peer runs here (kubelet needs a CRI runtime), so these are numbers only.
/// Also returns the per-phase table of the burst's starts.
fn cluster_rows(opts: &Opts, bin: &Path, dir: &Path, cg: &NestedRoot) -> Result<(Vec<Row>, Option<String>)> {
    let mut rows = Vec::new();
    let mut section = None;
    match cluster::script().filter(|_| !opts.skip_cluster) {
        None => eprintln!("== cluster mode: skipped (--skip-cluster, or no ../shared/k8s/control-plane)"),
        Some(script) => {
            eprintln!(
                "== cluster mode: {} pods through the API one after another, {} at once",
                opts.cluster_pods, opts.cluster_burst
            );
            let r = cluster::run(
                &script,
                bin,
                dir,
                &format!("{}/cluster", cg.path()),
                &cluster::Load {
                    pods: opts.cluster_pods,
                    burst: opts.cluster_burst,
                    pool: opts.cluster_pool,
                },
            )?;
            let mut row = |metric: String, unit: &'static str, v: f64| {
                let mut x = Row::new(metric, unit, "none");
                x.ferrolet = Some(v);
                rows.push(x);
            };
            row(
                "cluster: API pod created -> Running in the API, p50".into(),
                "ms",
                r.one_p50_ms,
            );
            row(
                "cluster: API pod created -> Running in the API, p90".into(),
                "ms",
                r.one_p90_ms,
            );
            let pool = match opts.cluster_pool {
                0 => String::new(),
                n => format!(" (sandbox pool of {n})"),
            };
            row(
                format!("cluster: {} API pods at once{pool}, p50", opts.cluster_burst),
                "ms",
                r.burst_p50_ms,
            );
            row(
                format!("cluster: {} API pods at once{pool}, last Running", opts.cluster_burst),
                "ms",
                r.burst_last_ms,
            );
            row("cluster: memory (PSS), idle agent".into(), "MiB", r.idle_pss_mib);
            row(
                "cluster: API requests by the node per minute, idle with no pods".into(),
                "requests",
                r.idle_requests_per_min,
            );
            row(
                format!(
                    "cluster: API requests by the node for {} pods at once",
                    opts.cluster_burst
                ),
                "requests",
                r.burst_requests,
            );
            row(
                format!(
                    "cluster: time those requests waited for the node's kubeAPIQPS limit, in all, {} pods at once",
                    opts.cluster_burst
                ),
                "s",
                r.burst_rate_limited_s,
            );
            row(
                format!(
                    "cluster: CPU over the {} pods at once, agent and zygote",
                    opts.cluster_burst
                ),
                "s",
                r.burst_cpu_agent_s,
            );
            row(
                format!(
                    "cluster: CPU over the {} pods at once, API server and etcd",
                    opts.cluster_burst
                ),
                "s",
                r.burst_cpu_server_s,
            );
            section = Some(format!(
                "Where an API pod's start goes in cluster mode: each phase's share (ms) from the agent's own \
                 `ferrolet::start_phase` timestamps, p50 over the {} pods one after another and p50 and maximum \
                 over the {} created at once, the first phase timed from the create request:\n\n{}",
                opts.cluster_pods, opts.cluster_burst, r.phase_table
            ));
        }
    }
    Ok((rows, section))
}

/// The fleet: what each of `--fleet-nodes` nodes costs one control plane. No peer runs here
/// (kubelet needs a CRI runtime); its defaults' cost is in the section.
fn fleet_rows(opts: &Opts, bin: &Path, dir: &Path, cg: &NestedRoot) -> Result<(Vec<Row>, Option<String>)> {
    let Some(script) = cluster::script().filter(|_| !opts.skip_fleet) else {
        eprintln!("== fleet: skipped (--skip-fleet, or no ../shared/k8s/control-plane)");
        return Ok((Vec::new(), None));
    };
    eprintln!(
        "== fleet: {} nodes against one control plane, {} pods at once",
        opts.fleet_nodes,
        opts.fleet_nodes * opts.fleet_pods_per_node
    );
    let r = fleet::run(
        &script,
        bin,
        dir,
        &format!("{}/fleet", cg.path()),
        &fleet::Load {
            nodes: opts.fleet_nodes,
            pods_per_node: opts.fleet_pods_per_node,
            idle: Duration::from_secs(opts.cpu_seconds),
        },
    )?;
    let n = opts.fleet_nodes;
    let pods = n * opts.fleet_pods_per_node;
    let mut rows = Vec::new();
    let mut row = |metric: String, unit: &'static str, v: f64| {
        let mut x = Row::new(metric, unit, "none");
        x.ferrolet = Some(v);
        rows.push(x);
    };
    row(
        format!("fleet of {n}: API requests per idle node per minute, the node's count"),
        "requests",
        r.idle_node_requests,
    );
    row(
        format!("fleet of {n}: API requests per idle node per minute, the API server's count"),
        "requests",
        r.idle_server_requests,
    );
    row(
        format!("fleet of {n}: watches each node holds open"),
        "watches",
        r.idle_watches,
    );
    row(
        format!("fleet of {n}: API server and etcd CPU per idle node per minute"),
        "s",
        r.idle_cpu,
    );
    row(
        format!("fleet of {n}: API requests per pod start ({pods} at once), the nodes' count"),
        "requests",
        r.start_node_requests,
    );
    row(
        format!("fleet of {n}: API requests per pod start, the API server's count"),
        "requests",
        r.start_server_requests,
    );
    row(
        format!("fleet of {n}: API server and etcd CPU per pod start (its create included)"),
        "s",
        r.start_cpu,
    );
    row(
        format!("fleet of {n}: {pods} pods at once, last Running in the API"),
        "ms",
        r.all_running_ms,
    );
    row(
        "fleet: the control plane alone, API requests per minute".into(),
        "requests",
        r.alone_requests_per_min,
    );
    row(
        "fleet: the control plane alone, API server and etcd CPU per minute".into(),
        "s",
        r.alone_cpu_per_min,
    );
    Ok((rows, Some(r.section)))
}

fn notes(opts: &Opts) -> String {
    format!(
        "Notes:\n\
- Before each latency section (runtime floor, pod starts, bursts, pulls; podman's as well) the harness waits for a quiet machine: two half-second windows in a row with the CPUs at most 10% busy, up to 60 s. Without it, the kernel's teardown of the previous section's containers (namespaces, mounts, cgroups, ext4 discards) landed in the next section's numbers.\n\
- Pod start latency: from the manifest landing in the watched directory (ferrolet) or `podman kube play` being invoked, to the container's first command creating a file (its mtime): p50/p90/p99 over {} pods created one after another, each waited for.\n\
- Burst: {} pods written at once (ferrolet: {1} files; podman: one {1}-document `kube play`), to the last container running; deletion: files removed (ferrolet) or `kube down` (podman), to nothing left. The pods' `sleep` runs as PID 1 and ignores SIGTERM, so each is killed when its terminationGracePeriodSeconds (1 s) ends: no deletion of these pods can take less than 1 s.\n\
- Memory: PSS from /proc/*/smaps_rollup of the agent, its zygote and every container monitor (ferrolet) versus conmon and catatonit (podman has no daemon; its per-pod processes are what stays resident). Per pod: (PSS with {1} pods - idle) / {1} for ferrolet, PSS / {1} for podman. Idle is 2 s after the agent answers /healthz; {1} pods 2 s after the burst's last container ran, and again after the CPU minute (\"after a minute idle\"). The agent unmaps its executable's read-only pages once started and every minute (docs/agent.md, \"Code pages\"), so the second figure no longer holds the code the burst ran.\n\
- CPU: user+system time of the same processes over {2}s of steady state, scaled to one minute.\n\
- Runtime floor: create+start+wait+delete of `/bin/true` in a busybox container: ferrolet's runtime crate in-process versus `crun run` / `runc run` on the OCI spec ferrolet generated for the same container (same namespaces, mounts, capabilities, masked paths and RuntimeDefault seccomp profile; rootfs unpacked read-only instead of an overlay; no device rules, which these runtimes would need a devices cgroup for here), {3} runs, p50. On a hybrid node crun runs in a private mount namespace with the cgroup2 mount hidden (it refuses hybrid layouts), so it uses the same v1 controllers as the others.\n\
- podman 4.3 runs with runc (crun refuses this machine's hybrid cgroups), the cgroupfs manager, inside a private mount and cgroup namespace rooted below the benchmark's cgroup (its /run, /var/lib and CNI config in the benchmark's directory), with explicit nofile/nproc ulimits (its defaults need CAP_SYS_RESOURCE). Its no-network runs use `--network none`.\n\
- Cluster mode: a v1.26 control plane (etcd, kube-apiserver, controller-manager, scheduler from ../shared/k8s) in the benchmark's namespace and one ferrolet node with a node credential and the built-in bridge; pods (busybox `sleep`, nodeName set, a ServiceAccount token volume as the API server adds it) created with the admin credential, timed from just before the create request to the moment a watch of the pods shows phase Running: {4} one after another, then {5} at once. Memory: the agent, zygote and monitors 10 s after joining, no pods. API requests: the node's own count (`rest_client_requests_total` on its /metrics) over the minute after that while idle, and from the burst's creates to its last pod Running (events included: they have their own client and rate, as kubelet's); the time they waited for the node's kubeAPIQPS/kubeAPIBurst limit is the growth of the sum of its `rest_client_rate_limiter_duration_seconds`, client-go's histogram). CPU over the burst: utime+stime (and reaped children's) of the agent and its zygote, and of kube-apiserver and etcd. The per-phase table after the results reads the agent's start phases (docs/start-path.md).\n\
- Fleet: {9} ferrolet nodes, each in a network namespace of its own with a veth on one bridge, its own node credential and the built-in bridge for its pods, against one v1.26 control plane in the benchmark's namespace (reached through a DNAT rule there to the API server's loopback port). First the control plane alone for {2} s, then the same with the nodes idle and Ready, then {10} pods created at once on each node until the last is Running in the API and 5 s more. Requests counted by each node (`rest_client_requests_total`) and by the API server (`apiserver_request_total`, resource requests only; the control plane's own rate, the idle rate over the window and the benchmark's creates subtracted); CPU: utime+stime of kube-apiserver and etcd, less theirs alone. kubelet's side is what its defaults imply (the section after the results): it cannot run here without a CRI runtime.\n\
- Stats: {6} pods (bridge network) on one agent sampling at its default 10 s housekeeping interval; one scrape is a GET over the CLI socket from request to last byte, p50/p99 over {7} scrapes of each endpoint; agent CPU is the agent process's user+system time (/proc/PID/stat) over {2}s with no scrapes, then over {2}s with /stats/summary and /metrics/resource scraped every 10 s, scaled to one minute.\n\
- Pulls: Debian's docker-registry 2.8 on the benchmark namespace's loopback (plain HTTP, filesystem storage) serving the two-layer image of images/build-registry.sh. `ferrolet images pull` into an empty root dir (resolve, fetch both layers and the config with digests verified, unpack into the store) beside `skopeo copy docker://... dir:` into an empty directory (fetch and verify only, no unpacking), alternated, after one warm-up pair; whole processes timed, p50 of {8} each.\n\
- Pod start with a pull: a static pod whose image is not on the node (every unused image pruned first, the demo image included, so both layers come from the registry), from the manifest landing to its first command, beside the same pod right after with the image present (IfNotPresent); the store is pruned empty between rounds. No peer: podman would need its own registries.conf for an insecure local registry.\n\
- Binary size: the ferrolet binary the benchmark ran (`cargo build --release`: fat LTO, opt-level s, no symbols or debug info, as Cargo.toml's release profile says; docs/static-build.md has the variants and the static musl build) in MB of 10^6 bytes, beside the podman, crun and runc binaries on PATH (podman alone: it also needs conmon and an OCI runtime, crun or runc, which are not counted in its figure).\n\
- Everything ran inside a private network namespace; ratios are ferrolet ÷ the named peer (below 1 means ferrolet is faster or smaller).\n",
        opts.pods,
        opts.burst,
        opts.cpu_seconds,
        opts.runs,
        opts.cluster_pods,
        opts.cluster_burst,
        opts.stats_pods,
        opts.stats_scrapes,
        opts.pull_runs,
        opts.fleet_nodes,
        opts.fleet_pods_per_node
    )
}
