//! The fleet: N ferrolet nodes, each in a network namespace of its own, against one control
//! plane (../shared/k8s, v1.26) in the benchmark's namespace. Measured: what a node costs the
//! control plane, idle and per pod start. Requests are counted twice: by each node
//! (`rest_client_requests_total` on its /metrics) and by the API server
//! (`apiserver_request_total`, less what the control plane asks of itself, measured first with
//! no node). The CPU is the API server's and etcd's, less theirs with no node. kubelet cannot
//! run here (it needs a CRI runtime), so its side is what its defaults imply
//! (docs/start-path.md, "A fleet of nodes").
//!
//! The wiring: a bridge `fleet0` (203.0.113.1/24) in the benchmark's namespace, one veth per
//! node (203.0.113.10 + i). The API server listens on 127.0.0.1 only, so a DNAT rule in the
//! benchmark's namespace (never the host's) takes 203.0.113.1:PORT there, and the nodes'
//! kubeconfigs name the server `localhost`, which its certificate holds.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use nix::sched::CloneFlags;

use crate::agent::{Agent, Launch};
use crate::cluster::{control_plane_var, node_requests, pod_on, requests_since, watch_running};
use crate::procstat;

/// The fleet's size and load.
pub struct Load {
    pub nodes: usize,
    /// Pods created at once on each node, after the idle window.
    pub pods_per_node: usize,
    /// Each measured idle window (the control plane alone, then with the nodes).
    pub idle: Duration,
}

pub struct Results {
    /// The control plane alone: API requests (its controllers' and scheduler's) and the API
    /// server's and etcd's CPU seconds, per minute.
    pub alone_requests_per_min: f64,
    pub alone_cpu_per_min: f64,
    /// Per idle node and minute: requests by the node's count and by the server's (beyond the
    /// control plane alone), the server's and etcd's CPU seconds beyond theirs alone.
    pub idle_node_requests: f64,
    pub idle_server_requests: f64,
    pub idle_cpu: f64,
    /// Watches each node holds open on the API server.
    pub idle_watches: f64,
    /// Per pod started (all nodes' pods created at once): the nodes' requests, the server's
    /// (less the creates and the idle traffic of the window), the server's and etcd's CPU (the
    /// creates included, the idle share not).
    pub start_node_requests: f64,
    pub start_server_requests: f64,
    pub start_cpu: f64,
    /// From the creates to the last pod Running in the API.
    pub all_running_ms: f64,
    /// Markdown: the requests by verb and resource, beside kubelet's defaults.
    pub section: String,
}

/// The benchmark namespace's side of the fleet's wire.
const GATEWAY: &str = "203.0.113.1";
/// The nftables table of the DNAT rule (benchmark namespace).
const TABLE: &str = "ferrolet_fleet";

fn node_ip(i: usize) -> String {
    format!("203.0.113.{}", 10 + i)
}

fn node_name(i: usize) -> String {
    format!("fleet-{i}")
}

/// Run `args` (a program and its arguments), in `netns` if given.
fn sh(netns: Option<&OwnedFd>, args: &[&str]) -> Result<()> {
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..]);
    if let Some(ns) = netns {
        let fd = ns.try_clone()?;
        // SAFETY: setns only, between fork and exec.
        unsafe {
            cmd.pre_exec(move || nix::sched::setns(fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from));
        }
    }
    let out = cmd.output().with_context(|| args.join(" "))?;
    if !out.status.success() {
        bail!("{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// A new network namespace, held by the returned fd (it goes when the fd and its processes
/// do): made on a thread of its own, which leaves the benchmark's namespace alone.
fn new_netns() -> Result<OwnedFd> {
    std::thread::spawn(|| -> Result<OwnedFd> {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET).context("unshare(CLONE_NEWNET)")?;
        Ok(std::fs::File::open("/proc/thread-self/ns/net")?.into())
    })
    .join()
    .map_err(|_| anyhow!("the namespace thread panicked"))?
}

/// The bridge and the route the API server wants at its start (an address with a default
/// route), in the benchmark's namespace.
fn wire_gateway() -> Result<()> {
    for args in [
        "ip link add fleet0 type bridge",
        "ip addr add 203.0.113.1/24 dev fleet0",
        "ip link set fleet0 up",
        "ip route replace default via 203.0.113.254 dev fleet0 onlink",
        // Packets to and from 127.0.0.1 may cross fleet0 (the DNAT's).
        "sysctl -qw net.ipv4.conf.all.route_localnet=1 net.ipv4.conf.fleet0.route_localnet=1",
    ] {
        sh(None, &args.split(' ').collect::<Vec<_>>())?;
    }
    Ok(())
}

/// The gateway's API port taken to the API server's loopback one (benchmark namespace).
fn forward_api(api_port: u16) -> Result<()> {
    let rules = format!(
        "table ip {TABLE} {{\n  chain prerouting {{\n    type nat hook prerouting priority dstnat; policy accept;\n    ip daddr {GATEWAY} tcp dport {api_port} dnat to 127.0.0.1:{api_port}\n  }}\n}}\n"
    );
    let mut nft = Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("nft")?;
    std::io::Write::write_all(&mut nft.stdin.take().context("nft's stdin")?, rules.as_bytes())?;
    if !nft.wait()?.success() {
        bail!("nft -f: the fleet's DNAT rule was refused");
    }
    Ok(())
}

fn unwire_gateway() {
    let _ = sh(None, &["nft", "delete", "table", "ip", TABLE]);
    let _ = sh(None, &["ip", "link", "del", "fleet0"]);
}

/// Node `i`'s namespace: loopback up, a veth whose other end joins fleet0, its address and
/// a default route through the gateway.
fn wire_node(i: usize) -> Result<OwnedFd> {
    let ns = new_netns()?;
    let (peer, ip) = (format!("fleet0-{i}"), format!("{}/24", node_ip(i)));
    let me = std::process::id().to_string();
    sh(Some(&ns), &["ip", "link", "set", "lo", "up"])?;
    sh(
        Some(&ns),
        &[
            "ip", "link", "add", "eth0", "type", "veth", "peer", "name", &peer, "netns", &me,
        ],
    )?;
    sh(None, &["ip", "link", "set", &peer, "master", "fleet0", "up"])?;
    sh(Some(&ns), &["ip", "addr", "add", &ip, "dev", "eth0"])?;
    sh(Some(&ns), &["ip", "link", "set", "eth0", "up"])?;
    sh(Some(&ns), &["ip", "route", "add", "default", "via", GATEWAY])?;
    Ok(ns)
}

/// `control-plane node-kubeconfig` for node `name`, rewritten to reach the API server
/// through the gateway under the name its certificate holds.
fn node_kubeconfig(script: &Path, cp: &Path, name: &str, api_port: u16) -> Result<std::path::PathBuf> {
    let out = Command::new("bash")
        .arg(script)
        .arg("node-kubeconfig")
        .arg(cp)
        .arg(name)
        .output()?;
    if !out.status.success() {
        bail!("node-kubeconfig {name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let path = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let text = std::fs::read_to_string(&path)?;
    let from = format!("server: \"https://127.0.0.1:{api_port}\"");
    if !text.contains(&from) {
        bail!("{}: no {from}", path.display());
    }
    let to = format!("tls-server-name: localhost, server: \"https://{GATEWAY}:{api_port}\"");
    let fleet = path.with_extension("fleet.kubeconfig");
    std::fs::write(&fleet, text.replace(&from, &to))?;
    Ok(fleet)
}

/// The control plane's processes that serve the API: the API server and etcd, from the pids
/// its script wrote.
fn server_pids(cp: &Path) -> Vec<i32> {
    std::fs::read_to_string(cp.join("pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| matches!(c.trim(), "kube-apiserver" | "etcd"))
        })
        .collect()
}

fn cpu_s(pids: &[i32]) -> f64 {
    pids.iter().map(|p| procstat::cpu_ticks(*p)).sum::<u64>() as f64 / procstat::ticks_per_second() as f64
}

/// One reading of the API server: its finished requests by "VERB resource[/subresource]"
/// (resource requests only: the benchmark's own /metrics reads are not among them), and its
/// open watches.
struct ServerCount {
    requests: BTreeMap<String, f64>,
    watches: f64,
    cpu_s: f64,
    at: Instant,
}

/// The labels of one Prometheus sample line `name{a="x",b="y"} v`, and its value.
fn sample(line: &str) -> Option<(HashMap<&str, &str>, f64)> {
    let (head, v) = line.rsplit_once(' ')?;
    let labels = head.split_once('{')?.1.strip_suffix('}')?;
    let mut map = HashMap::new();
    for pair in labels.split("\",") {
        let (k, v) = pair.split_once("=\"")?;
        map.insert(k, v.trim_end_matches('"'));
    }
    Some((map, v.parse().ok()?))
}

async fn server_count(client: &kube::Client, pids: &[i32]) -> Result<ServerCount> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await.context("the API server's /metrics")?;
    let mut requests = BTreeMap::new();
    let mut watches = 0.0;
    for line in text.lines() {
        let long = line.starts_with("apiserver_longrunning_requests{");
        if !(long || line.starts_with("apiserver_request_total{")) {
            continue;
        }
        let Some((l, v)) = sample(line) else { continue };
        let resource = l.get("resource").copied().unwrap_or_default();
        if resource.is_empty() {
            continue;
        }
        if long {
            if l.get("verb") == Some(&"WATCH") {
                watches += v;
            }
            continue;
        }
        let sub = l.get("subresource").copied().unwrap_or_default();
        let key = match sub {
            "" => format!("{} {resource}", l.get("verb").copied().unwrap_or_default()),
            s => format!("{} {resource}/{s}", l.get("verb").copied().unwrap_or_default()),
        };
        *requests.entry(key).or_insert(0.0) += v;
    }
    Ok(ServerCount {
        requests,
        watches,
        cpu_s: cpu_s(pids),
        at: Instant::now(),
    })
}

/// What grew from `a` to `b`, by key, per minute of the time between them.
fn rate(a: &ServerCount, b: &ServerCount) -> BTreeMap<String, f64> {
    let min = b.at.duration_since(a.at).as_secs_f64() / 60.0;
    b.requests
        .iter()
        .map(|(k, v)| (k.clone(), (v - a.requests.get(k).copied().unwrap_or(0.0)) / min))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

fn total(m: &BTreeMap<String, f64>) -> f64 {
    m.values().sum()
}

/// `m` less `less` (each key), scaled by `scale`, the keys that stay above 0.
fn minus(m: &BTreeMap<String, f64>, less: &BTreeMap<String, f64>, scale: f64) -> BTreeMap<String, f64> {
    m.iter()
        .map(|(k, v)| (k.clone(), (v - less.get(k).copied().unwrap_or(0.0)) * scale))
        .filter(|(_, v)| *v > 0.005)
        .collect()
}

/// The sum of the nodes' own request counts.
fn nodes_requests(agents: &[Agent]) -> BTreeMap<String, f64> {
    let mut all = BTreeMap::new();
    for a in agents {
        for (k, v) in node_requests(a) {
            *all.entry(k).or_insert(0.0) += v;
        }
    }
    all
}

/// Run the fleet figures.
pub fn run(script: &Path, bin: &Path, dir: &Path, cgroup_root: &str, load: &Load) -> Result<Results> {
    let cp = dir.join("fleet-control-plane");
    if let Err(e) = wire_gateway() {
        unwire_gateway();
        return Err(e);
    }
    let out = Command::new("bash").arg(script).arg("start").arg(&cp).output()?;
    if !out.status.success() {
        unwire_gateway();
        bail!("control-plane start: {}", String::from_utf8_lossy(&out.stderr));
    }
    let env = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut namespaces = Vec::new();
    let mut agents = Vec::new();
    let result = (|| {
        let admin = control_plane_var(&env, "KUBECONFIG")?;
        let api_port: u16 = control_plane_var(&env, "K8S_APISERVER")?
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .context("K8S_APISERVER's port")?;
        forward_api(api_port)?;
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let kube = tokio.block_on(ferrolet::kubeclient::Kube::from_kubeconfig(Path::new(&admin)))?;
        let client = kube.client();
        let pids = server_pids(&cp);
        if pids.len() != 2 {
            bail!("the API server and etcd among the control plane's pids: found {pids:?}");
        }

        // The control plane alone, once its start has settled.
        std::thread::sleep(Duration::from_secs(10));
        eprintln!("   the control plane alone, {} s", load.idle.as_secs());
        let a0 = tokio.block_on(server_count(&client, &pids))?;
        std::thread::sleep(load.idle);
        let a1 = tokio.block_on(server_count(&client, &pids))?;
        let alone = rate(&a0, &a1);
        let alone_min = a1.at.duration_since(a0.at).as_secs_f64() / 60.0;
        let alone_cpu = (a1.cpu_s - a0.cpu_s) / alone_min;

        eprintln!("   {} nodes joining", load.nodes);
        for i in 0..load.nodes {
            let name = node_name(i);
            namespaces.push(wire_node(i)?);
            let kc = node_kubeconfig(script, &cp, &name, api_port)?;
            let node_dir = dir.join(&name);
            std::fs::create_dir_all(&node_dir)?;
            let extra = [
                "--kubeconfig".to_string(),
                kc.display().to_string(),
                "--node-ip".into(),
                node_ip(i),
            ];
            agents.push(Agent::launch(&Launch {
                bin,
                dir: &node_dir,
                cgroup_root: &format!("{cgroup_root}/{name}"),
                network: "bridge",
                log: &dir.join(format!("{name}.log")),
                extra: &extra,
                node: &name,
                netns: namespaces.last().map(|n| n.as_fd()),
            })?);
        }
        let nodes: Api<Node> = Api::all(client.clone());
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let list = tokio.block_on(nodes.list(&ListParams::default()))?;
            let ready = list
                .items
                .iter()
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .count();
            if ready >= load.nodes {
                break;
            }
            if Instant::now() > deadline {
                bail!("only {ready} of {} nodes Ready after 180 s", load.nodes);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        // Registration, the first statuses and the CIDRs settle before the idle window.
        std::thread::sleep(Duration::from_secs(10));

        eprintln!("   {} idle nodes, {} s", load.nodes, load.idle.as_secs());
        let n = load.nodes as f64;
        let (c0, s0) = (nodes_requests(&agents), tokio.block_on(server_count(&client, &pids))?);
        std::thread::sleep(load.idle);
        let (c1, s1) = (nodes_requests(&agents), tokio.block_on(server_count(&client, &pids))?);
        let idle_min = s1.at.duration_since(s0.at).as_secs_f64() / 60.0;
        let idle_node_requests = requests_since(&c0, &c1).0 / idle_min / n;
        let idle_rate = rate(&s0, &s1);
        let idle_by_kind = minus(&idle_rate, &alone, 1.0 / n);
        let idle_server_requests = (total(&idle_rate) - total(&alone)) / n;
        let idle_cpu = ((s1.cpu_s - s0.cpu_s) / idle_min - alone_cpu) / n;
        let idle_watches = (s1.watches - a1.watches) / n;

        let pods = load.nodes * load.pods_per_node;
        eprintln!("   {pods} pods created at once, {} on each node", load.pods_per_node);
        let api: Api<Pod> = Api::namespaced(client.clone(), "default");
        // The benchmark's watch lists and opens before the window.
        let mut running = {
            let _rt = tokio.enter();
            watch_running(api.clone())
        };
        std::thread::sleep(Duration::from_secs(2));
        let (c2, s2) = (nodes_requests(&agents), tokio.block_on(server_count(&client, &pids))?);
        let t0 = Instant::now();
        let last = tokio.block_on(async {
            let names = (0..load.nodes).flat_map(|i| (0..load.pods_per_node).map(move |j| (i, j)));
            let creates = names.map(|(i, j)| {
                let api = api.clone();
                async move {
                    let p = pod_on(&format!("{}-{j}", node_name(i)), &node_name(i))?;
                    api.create(&PostParams::default(), &p)
                        .await
                        .map_err(anyhow::Error::from)
                }
            });
            for r in futures::future::join_all(creates).await {
                r?;
            }
            let mut seen = 0;
            let mut last = t0;
            let deadline = Instant::now() + Duration::from_secs(300);
            while seen < pods {
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, running.recv()).await {
                    Ok(Some((_, at))) => {
                        seen += 1;
                        last = at;
                    }
                    _ => bail!("only {seen} of {pods} pods were Running after 300 s"),
                }
            }
            Ok(last)
        })?;
        // The events and status writes a start leaves behind its Running.
        std::thread::sleep(Duration::from_secs(5));
        let (c3, s3) = (nodes_requests(&agents), tokio.block_on(server_count(&client, &pids))?);
        let window_min = s3.at.duration_since(s2.at).as_secs_f64() / 60.0;
        let mut start = minus(&rate(&s2, &s3), &idle_rate, window_min / pods as f64);
        // The benchmark's own creates.
        if let Some(v) = start.get_mut("POST pods") {
            *v -= 1.0;
        }
        start.retain(|_, v| *v > 0.005);
        let start_node_requests = (requests_since(&c2, &c3).0 - idle_node_requests * n * window_min) / pods as f64;
        let start_server_requests = total(&start);
        let start_cpu = ((s3.cpu_s - s2.cpu_s) - (alone_cpu + idle_cpu * n) * window_min) / pods as f64;
        let all_running_ms = last.duration_since(t0).as_secs_f64() * 1000.0;

        let section = render(load, &alone, &idle_by_kind, &start, idle_watches);
        Ok(Results {
            alone_requests_per_min: total(&alone),
            alone_cpu_per_min: alone_cpu,
            idle_node_requests,
            idle_server_requests,
            idle_cpu,
            idle_watches,
            start_node_requests,
            start_server_requests,
            start_cpu,
            all_running_ms,
            section,
        })
    })();
    // The agents stop side by side (each SIGTERM, then `ferrolet reset`).
    std::thread::scope(|s| {
        for a in agents.drain(..) {
            s.spawn(move || a.finish());
        }
    });
    drop(namespaces);
    let _ = Command::new("bash").arg(script).arg("stop").arg(&cp).output();
    unwire_gateway();
    // The benchmark's directory goes when it ends: the nodes' logs are kept.
    let kept = std::env::temp_dir().join("ferrolet-bench-fleet-logs");
    let _ = std::fs::remove_dir_all(&kept);
    let copied = std::fs::create_dir_all(&kept).and_then(|_| {
        for i in 0..load.nodes {
            let name = format!("{}.log", node_name(i));
            if dir.join(&name).exists() {
                std::fs::copy(dir.join(&name), kept.join(&name))?;
            }
        }
        Ok(())
    });
    match copied {
        Ok(()) => eprintln!("   (the nodes' logs are kept in {})", kept.display()),
        Err(e) => eprintln!("   (the nodes' logs could not be kept: {e})"),
    }
    result
}

/// The requests by kind beside kubelet's defaults.
fn render(
    load: &Load,
    alone: &BTreeMap<String, f64>,
    idle: &BTreeMap<String, f64>,
    start: &BTreeMap<String, f64>,
    watches: f64,
) -> String {
    let list = |m: &BTreeMap<String, f64>| {
        let mut v: Vec<(&String, &f64)> = m.iter().collect();
        v.sort_by(|a, b| b.1.total_cmp(a.1));
        v.iter()
            .map(|(k, v)| format!("{k} {v:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "What a node costs the control plane ({} nodes, each in its own network namespace, one API server), \
         counted by the API server (`apiserver_request_total`) by verb and resource:\n\n\
         | | ferrolet, measured | kubelet 1.26's defaults imply |\n|---|---|---|\n\
         | requests per idle node per minute | {} | about 12.2: Lease `PUT` every 10 s (renewInterval, a quarter of leaseDurationSeconds 40): 6; Node `GET` every nodeStatusUpdateFrequency (10 s): 6; Node status `PATCH` on change or every nodeStatusReportFrequency (5 min): 0.2; its watches re-opened every 5-10 min |\n\
         | watches each node holds open | {watches:.1} | about 6 (informers): its pods, its Node, Services, CSIDrivers, RuntimeClasses, and one for each ConfigMap or Secret its pods use (configMapAndSecretChangeDetectionStrategy Watch; `kube-root-ca.crt` of each namespace with pods) |\n\
         | requests per pod start ({} pods at once) | {} | about 8: 1 TokenRequest `POST`; 3 event `POST`s (Pulled, Created, Started); 2 status writes, each a `GET` of the pod and a `PATCH` (status_manager.go syncPod); ConfigMaps from a watch |\n\
         | the control plane alone, per minute (subtracted above) | {} | |\n",
        load.nodes,
        list(idle),
        load.nodes * load.pods_per_node,
        list(start),
        list(alone),
    )
}
