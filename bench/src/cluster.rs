//! Cluster mode: a real control plane (../shared/k8s/control-plane, v1.26) in the benchmark's
//! network namespace and one ferrolet node joined to it. Measured: a pod created through the API
//! (nodeName set) until the API server shows it Running, one at a time and many at once, and the
//! agent's memory while idle in cluster mode. Times come from one watch of the pods, so they are
//! what any API client would see.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;

use crate::agent::Agent;
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
}

/// Run the cluster figures: `pods` one after another, then `burst` at once.
pub fn run(script: &Path, bin: &Path, dir: &Path, cgroup_root: &str, pods: usize, burst: usize) -> Result<Results> {
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
        let admin = env
            .lines()
            .find_map(|l| l.strip_prefix("KUBECONFIG="))
            .context("control-plane printed no KUBECONFIG")?
            .trim_matches('"')
            .to_string();
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
            ],
        )?;
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let r = tokio.block_on(measure(Path::new(&admin), &agent, pods, burst));
        agent.finish();
        r
    })();
    let _ = Command::new("bash").arg(script).arg("stop").arg(&cp).output();
    result
}

fn pod(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": "bench",
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "app", "image": "busybox:1.35", "command": ["sleep", "3600"]}]
        }
    }))?)
}

async fn measure(admin: &Path, agent: &Agent, pods: usize, burst: usize) -> Result<Results> {
    let kube = ferrolet::kubeclient::Kube::from_kubeconfig(admin).await?;
    let api: Api<Pod> = Api::namespaced(kube.client(), "default");
    // One watch for all: each pod's first Running, as the API server tells it.
    let (tx, mut running) = mpsc::unbounded_channel::<(String, Instant)>();
    let watch_api = api.clone();
    tokio::spawn(async move {
        let mut seen = std::collections::HashSet::new();
        let mut w = watcher::watcher(watch_api, watcher::Config::default()).boxed();
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
    // Let the node settle (registration, lease, first status) before measuring.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_pss_mib = agent
        .processes()
        .iter()
        .map(|p| crate::procstat::pss_kib(*p))
        .sum::<u64>() as f64
        / 1024.0;

    let mut one = Vec::new();
    for i in 0..pods {
        let name = format!("one-{i}");
        let t0 = Instant::now();
        api.create(&PostParams::default(), &pod(&name)?).await?;
        let at = wait_running(&mut running, &name).await?;
        one.push(at.duration_since(t0).as_secs_f64() * 1000.0);
    }
    one.sort_by(f64::total_cmp);

    let t0 = Instant::now();
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
    let mut burst_ms: Vec<f64> = at
        .values()
        .map(|t| t.duration_since(t0).as_secs_f64() * 1000.0)
        .collect();
    burst_ms.sort_by(f64::total_cmp);
    Ok(Results {
        one_p50_ms: percentile(&one, 50.0),
        one_p90_ms: percentile(&one, 90.0),
        burst_last_ms: burst_ms.last().copied().unwrap_or(0.0),
        burst_p50_ms: percentile(&burst_ms, 50.0),
        idle_pss_mib,
    })
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
