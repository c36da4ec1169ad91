//! Cluster mode: a real control plane (../shared/k8s/control-plane, v1.26) in the benchmark's
//! network namespace and one ferrolet node joined to it. Measured: a pod created through the API
//! (nodeName set) until the API server shows it Running, one at a time and many at once, and the
//! agent's memory while idle in cluster mode. Times come from one watch of the pods, so they are
//! what any API client would see.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;

use crate::agent::{ms_between, Agent};
use crate::procstat::percentile;

/// The control-plane script of this checkout, if it has ../shared.
pub fn script() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/k8s/control-plane");
    p.exists().then_some(p)
}

pub struct Results {
    pub one_p50_ms: f64,
    pub one_p90_ms: f64,
    pub burst_last_ms: f64,
    pub burst_p50_ms: f64,
    pub idle_pss_mib: f64,
    /// The node's API requests per minute while idle with no pods.
    pub idle_requests_per_min: f64,
    /// The node's API requests from the burst's creation to its last pod Running.
    pub burst_requests: f64,
    /// Seconds those requests waited in all for the node's kubeAPIQPS rate limit.
    pub burst_rate_limited_s: f64,
    /// CPU seconds over the burst (creation to last Running): the agent and its zygote (with
    /// the children they reaped), and the API server with etcd.
    pub burst_cpu_agent_s: f64,
    pub burst_cpu_server_s: f64,
    /// Markdown: where the starts' time went, phase by phase.
    pub phase_table: String,
}

/// How long the idle node's API requests are counted.
const IDLE: Duration = Duration::from_secs(60);

/// The phases of an API pod's start, in order, after the create request: the agent's
/// `ferrolet::start_phase` events (docs/start-path.md) and, last, the bench's own watch.
const PHASES: [(&str, &str); 15] = [
    ("watched", "create request sent -> pod seen in the node's watch"),
    ("checkpointed", "pod written to the node's checkpoint, snapshot sent"),
    ("admitted", "snapshot merged (pod config), ADD dispatched, admitted"),
    ("worker", "pod worker task running its first sync"),
    ("cgroup", "pod dir, pod.json, QoS tiers, pod cgroup"),
    ("sandbox", "sandbox: namespaces pinned, /dev/shm, record"),
    ("network", "pod network attached (bridge)"),
    ("volumes", "volumes set up (the ServiceAccount token requested)"),
    ("managed_files", "hosts, resolv.conf, hostname written"),
    ("status", "first status computed and saved"),
    ("image", "image ensured present"),
    ("created", "container built: rootfs, spec, libcontainer create"),
    ("started", "container started (libcontainer start, log links)"),
    ("running_written", "Running status written to the API server"),
    ("seen", "Running seen in a watch of the pods (the bench's)"),
];

/// The pods of the cluster figures: `pods` one after another, then `burst` at once; with a
/// sandbox pool of `pool` entries (`--sandbox-pool`), filled before the burst.
pub struct Load {
    pub pods: usize,
    pub burst: usize,
    pub pool: usize,
}

/// Run the cluster figures.
pub fn run(script: &Path, bin: &Path, dir: &Path, cgroup_root: &str, load: &Load) -> Result<Results> {
    // The API server wants an address with a default route; the namespace is the benchmark's own.
    for args in [
        "link add node0 type veth peer name node0-peer",
        "link set node0 up",
        "link set node0-peer up",
        "addr add 198.51.100.10/24 dev node0",
        "route add default via 198.51.100.1",
    ] {
        let ok = Command::new("ip").args(args.split(' ')).status()?.success();
        if !ok {
            bail!("ip {args}");
        }
    }
    let cp = dir.join("control-plane");
    let out = Command::new("bash").arg(script).arg("start").arg(&cp).output()?;
    if !out.status.success() {
        bail!("control-plane start: {}", String::from_utf8_lossy(&out.stderr));
    }
    let result = (|| {
        let env = String::from_utf8_lossy(&out.stdout).into_owned();
        let admin = control_plane_var(&env, "KUBECONFIG")?;
        let node_kc = Command::new("bash")
            .arg(script)
            .args(["node-kubeconfig"])
            .arg(&cp)
            .arg("bench")
            .output()?;
        let node_kc = String::from_utf8_lossy(&node_kc.stdout).trim().to_string();
        let agent_dir = dir.join("cluster-agent");
        std::fs::create_dir_all(&agent_dir)?;
        let agent = Agent::start_with(
            bin,
            &agent_dir,
            cgroup_root,
            "bridge",
            &dir.join("cluster-agent.log"),
            &[
                "--kubeconfig".into(),
                node_kc,
                "--node-ip".into(),
                "198.51.100.10".into(),
                "--sandbox-pool".into(),
                load.pool.to_string(),
            ],
        )?;
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let r = tokio.block_on(measure(Path::new(&admin), &agent, &dir.join("cluster-agent.log"), load));
        agent.finish();
        r
    })();
    let _ = Command::new("bash").arg(script).arg("stop").arg(&cp).output();
    // The benchmark's directory goes when it ends: the agent's log is kept.
    let kept = std::env::temp_dir().join("ferrolet-bench-cluster-agent.log");
    match std::fs::copy(dir.join("cluster-agent.log"), &kept) {
        Ok(_) => eprintln!("   (the cluster agent's log is kept in {})", kept.display()),
        Err(e) => eprintln!("   (the cluster agent's log could not be kept: {e})"),
    }
    result
}

/// A variable `control-plane start` printed (`NAME=value`, the value maybe quoted).
pub fn control_plane_var(printed: &str, name: &str) -> Result<String> {
    printed
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
        .map(|v| v.trim_matches('"').to_string())
        .with_context(|| format!("control-plane printed no {name}"))
}

fn pod(name: &str) -> Result<Pod> {
    pod_on(name, "bench")
}

/// The benchmark's API pod `name`, bound to `node`: busybox `sleep`, no grace period.
pub fn pod_on(name: &str, node: &str) -> Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "app", "image": "busybox:1.35", "command": ["sleep", "3600"]}]
        }
    }))?)
}

async fn measure(admin: &Path, agent: &Agent, log: &Path, load: &Load) -> Result<Results> {
    let (pods, burst) = (load.pods, load.burst);
    let kube = ferrolet::kubeclient::Kube::from_kubeconfig(admin).await?;
    let api: Api<Pod> = Api::namespaced(kube.client(), "default");
    let mut running = watch_running(api.clone());
    // Let the node settle (registration, lease, first status) before measuring.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_pss_mib = agent
        .processes()
        .iter()
        .map(|p| crate::procstat::pss_kib(*p))
        .sum::<u64>() as f64
        / 1024.0;
    // What an idle node asks of the API server in a minute (Lease renewals, Node status,
    // watches re-opened), beside kubelet's defaults (docs/agent.md).
    let idle0 = node_requests(agent);
    tokio::time::sleep(IDLE).await;
    let (idle, idle_lines) = requests_since(&idle0, &node_requests(agent));
    let idle_requests_per_min = idle * 60.0 / IDLE.as_secs_f64();
    eprintln!(
        "   the idle node's API requests over {} s:\n     {}",
        IDLE.as_secs(),
        idle_lines.join("\n     ")
    );

    let mut one = Vec::new();
    let mut one_starts = Vec::new();
    for i in 0..pods {
        let name = format!("one-{i}");
        let (t0, wall0) = (Instant::now(), SystemTime::now());
        api.create(&PostParams::default(), &pod(&name)?).await?;
        let at = wait_running(&mut running, &name).await?;
        one.push(at.duration_since(t0).as_secs_f64() * 1000.0);
        one_starts.push((name, wall0, wall0 + at.duration_since(t0)));
    }
    one.sort_by(f64::total_cmp);
    if load.pool > 0 {
        let wait = Duration::from_secs(120);
        tokio::task::block_in_place(|| agent.wait_pool_full(load.pool, wait))?;
    }

    let requests_before = node_requests(agent);
    let limited_before = rate_limited_seconds(agent);
    let agent_procs: Vec<i32> = agent.processes().into_iter().take(2).collect();
    let server_procs: Vec<i32> = ["kube-apiserver", "etcd"]
        .iter()
        .flat_map(|c| crate::procstat::pids_named(c))
        .collect();
    let ticks = |pids: &[i32]| {
        pids.iter()
            .map(|p| crate::procstat::cpu_ticks_with_children(*p))
            .sum::<u64>() as f64
            / crate::procstat::ticks_per_second() as f64
    };
    let cpu_before = (ticks(&agent_procs), ticks(&server_procs));
    let machine_before = crate::procstat::cpu_busy_total();
    let (t0, wall0) = (Instant::now(), SystemTime::now());
    let creates = (0..burst).map(|i| {
        let api = api.clone();
        async move {
            api.create(&PostParams::default(), &pod(&format!("burst-{i}"))?)
                .await
                .map_err(anyhow::Error::from)
        }
    });
    for r in futures::future::join_all(creates).await {
        r?;
    }
    let mut at: HashMap<String, Instant> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while at.len() < burst {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, running.recv()).await {
            Ok(Some((n, t))) if n.starts_with("burst-") => {
                at.insert(n, t);
            }
            Ok(Some(_)) => {}
            _ => bail!("only {} of {burst} pods were Running after 300 s", at.len()),
        }
    }
    let cpu_after = (ticks(&agent_procs), ticks(&server_procs));
    if let (Some((b0, t0)), Some((b1, t1))) = (machine_before, crate::procstat::cpu_busy_total()) {
        eprintln!(
            "   the machine's CPUs were {:.0}% busy over the burst",
            100.0 * (b1 - b0) as f64 / (t1 - t0).max(1) as f64
        );
    }
    let (burst_requests, burst_lines) = requests_since(&requests_before, &node_requests(agent));
    let burst_rate_limited_s = rate_limited_seconds(agent) - limited_before;
    eprintln!(
        "   the node's API requests over the burst:\n     {}",
        burst_lines.join("\n     ")
    );
    let mut burst_ms: Vec<f64> = at
        .values()
        .map(|t| t.duration_since(t0).as_secs_f64() * 1000.0)
        .collect();
    burst_ms.sort_by(f64::total_cmp);
    let burst_starts: Vec<(String, SystemTime, SystemTime)> = at
        .iter()
        .map(|(n, t)| (n.clone(), wall0, wall0 + t.duration_since(t0)))
        .collect();
    let events = crate::phases::read_log(log);
    let one_shares = shares(&events, &one_starts);
    let burst_shares = shares(&events, &burst_starts);
    Ok(Results {
        one_p50_ms: percentile(&one, 50.0),
        one_p90_ms: percentile(&one, 90.0),
        burst_last_ms: burst_ms.last().copied().unwrap_or(0.0),
        burst_p50_ms: percentile(&burst_ms, 50.0),
        idle_pss_mib,
        idle_requests_per_min,
        burst_requests,
        burst_rate_limited_s,
        burst_cpu_agent_s: cpu_after.0 - cpu_before.0,
        burst_cpu_server_s: cpu_after.1 - cpu_before.1,
        phase_table: render(&one_shares, &burst_shares, burst),
    })
}

/// One watch for all the pods of `api`: each pod's name when it is first Running, as the API
/// server tells it, and when that was seen.
pub fn watch_running(api: Api<Pod>) -> mpsc::UnboundedReceiver<(String, Instant)> {
    let (tx, running) = mpsc::unbounded_channel::<(String, Instant)>();
    tokio::spawn(async move {
        let mut seen = std::collections::HashSet::new();
        let mut w = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = w.next().await {
            let (Ok(Event::Apply(p)) | Ok(Event::InitApply(p))) = ev else {
                continue;
            };
            let name = p.metadata.name.clone().unwrap_or_default();
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            if phase == Some("Running") && seen.insert(name.clone()) && tx.send((name, Instant::now())).is_err() {
                return;
            }
        }
    });
    running
}

/// The node's API requests so far: its `rest_client_requests_total` by labels (code, host,
/// method).
pub fn node_requests(agent: &Agent) -> BTreeMap<String, f64> {
    metrics_text(agent)
        .lines()
        .filter(|l| l.starts_with("rest_client_requests_total"))
        .filter_map(|l| {
            let (labels, v) = l.rsplit_once(' ')?;
            Some((labels.to_string(), v.parse::<f64>().ok()?))
        })
        .collect()
}

/// The seconds the node's requests have waited so far for its client-side rate limit (the sum
/// of `rest_client_rate_limiter_duration_seconds`, all verbs).
pub fn rate_limited_seconds(agent: &Agent) -> f64 {
    metrics_text(agent)
        .lines()
        .filter(|l| l.starts_with("rest_client_rate_limiter_duration_seconds_sum"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The agent's /metrics as text (empty when it did not answer).
fn metrics_text(agent: &Agent) -> String {
    agent
        .get("/metrics")
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The requests made between two counts: in all, and one line per labels that grew.
pub fn requests_since(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> (f64, Vec<String>) {
    let grown: Vec<(&String, f64)> = after
        .iter()
        .map(|(l, v)| (l, v - before.get(l).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    let total = grown.iter().map(|(_, d)| d).sum();
    (total, grown.iter().map(|(l, d)| format!("{l} +{d}")).collect())
}

/// Each phase's share (ms) in each start `(pod, create sent, Running seen)` that has it.
fn shares(
    events: &HashMap<String, HashMap<String, SystemTime>>,
    starts: &[(String, SystemTime, SystemTime)],
) -> Vec<Vec<f64>> {
    let mut cols = vec![Vec::new(); PHASES.len()];
    for (name, t0, seen) in starts {
        let Some(ev) = events.get(name) else { continue };
        let mut prev = *t0;
        for (i, (p, _)) in PHASES.iter().enumerate() {
            let at = if *p == "seen" { Some(*seen) } else { ev.get(*p).copied() };
            if let Some(t) = at {
                cols[i].push(ms_between(prev, t));
                prev = t;
            }
        }
    }
    cols
}

fn render(one: &[Vec<f64>], burst: &[Vec<f64>], n: usize) -> String {
    let stat = |v: &[f64], p: f64| {
        if v.is_empty() {
            "-".to_string()
        } else {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            format!("{:.1}", percentile(&v, p))
        }
    };
    let mut out = format!(
        "| phase (ms) | one at a time, p50 | {n} at once, p50 | {n} at once, max | what it covers |\n|---|---|---|---|---|\n"
    );
    for (i, (p, what)) in PHASES.iter().enumerate() {
        out.push_str(&format!(
            "| {p} | {} | {} | {} | {what} |\n",
            stat(&one[i], 50.0),
            stat(&burst[i], 50.0),
            stat(&burst[i], 100.0)
        ));
    }
    out
}

async fn wait_running(running: &mut mpsc::UnboundedReceiver<(String, Instant)>, name: &str) -> Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, running.recv()).await {
            Ok(Some((n, t))) if n == name => return Ok(t),
            Ok(Some(_)) => {}
            _ => bail!("pod {name} was not Running after 120 s"),
        }
    }
}
