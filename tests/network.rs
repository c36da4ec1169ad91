//! Pod networking with real pods: the agent runs inside a network namespace each test creates
//! (standing in for the node, see common/net.rs), in the built-in bridge mode and in CNI mode
//! with Debian's containernetworking-plugins. Pods serve HTTP with busybox httpd.

mod common;

use std::time::Duration;

use common::net::{allocations, TestNet, NODE_IP};
use common::*;
use k8s_openapi::api::core::v1::Pod;

const T: Duration = Duration::from_secs(40);

/// A pod serving "hello from NAME" on `port`, with optional extra spec lines for the container.
fn web(name: &str, port: u16, container_extra: &str, pod_extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{pod_extra}  containers:\n  - name: web\n    image: {IMAGE}\n    command: [sh, -c, \"mkdir -p /www && echo hello from {name} > /www/index.html && exec httpd -f -p {port} -h /www\"]\n{container_extra}"
    )
}

fn pod_ip(p: &Pod) -> String {
    p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default()
}

fn running_with_ip(a: &Agent, name: &str) -> Pod {
    a.wait_for(name, "running with an IP", T, |p| {
        running(p, "web") && !pod_ip(p).is_empty()
    })
}

fn in_subnet(ip: &str, prefix: &str) -> bool {
    ip.starts_with(prefix)
}

fn exec(a: &Agent, pod: &str, cmd: &[&str]) -> String {
    let full = format!("{pod}-{}", a.node);
    let mut args = vec!["exec", full.as_str(), "--"];
    args.extend_from_slice(cmd);
    let out = a.cli(&args);
    assert!(
        out.status.success(),
        "exec {cmd:?} in {pod}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const BRIDGE_CONFIG: &str = "ferrolet:\n  podSubnet: 10.66.0.0/24\n";

#[test]
fn bridge_pods_get_ips_reachable_from_node_and_pods() {
    let net = TestNet::create("bridge");
    let a = Agent::start_in_netns("netbridge", &net.path, "bridge", &[], BRIDGE_CONFIG);
    a.write(
        "a.yaml",
        &web("a", 8080, "    ports: [{containerPort: 8080, hostPort: 18080}]\n", ""),
    );
    a.write("b.yaml", &web("b", 8080, "", ""));
    let pa = running_with_ip(&a, "a");
    let pb = running_with_ip(&a, "b");
    let (ipa, ipb) = (pod_ip(&pa), pod_ip(&pb));
    assert!(
        in_subnet(&ipa, "10.66.0.") && in_subnet(&ipb, "10.66.0."),
        "{ipa} {ipb}"
    );
    assert_ne!(ipa, ipb);
    let st = pa.status.as_ref().unwrap();
    assert_eq!(st.pod_ips.as_ref().unwrap()[0].ip, ipa);
    assert_eq!(st.host_ip.as_deref(), Some(NODE_IP));

    // node -> pod
    let body = net.http_get_eventually(&format!("{ipa}:8080"), "/", T).unwrap();
    assert_eq!(body.trim(), "hello from a");
    // pod -> pod
    let got = exec(&a, "b", &["wget", "-q", "-O-", &format!("http://{ipa}:8080/")]);
    assert_eq!(got.trim(), "hello from a");
    // the pod's view: eth0 with its IP, a default route, /etc/hosts naming it
    let addrs = exec(&a, "b", &["ip", "-o", "addr", "show", "eth0"]);
    assert!(addrs.contains(&format!("{ipb}/24")), "{addrs}");
    let hosts = exec(&a, "b", &["cat", "/etc/hosts"]);
    assert!(hosts.contains(&format!("{ipb}\tb-node-netbridge")), "{hosts}");
    // hostPort from the node side, on the node's address and on localhost
    let body = net.http_get_eventually(&format!("{NODE_IP}:18080"), "/", T).unwrap();
    assert_eq!(body.trim(), "hello from a");
    let body = net.http_get_eventually("127.0.0.1:18080", "/", T).unwrap();
    assert_eq!(body.trim(), "hello from a");
    // hairpin: the pod reaches itself through its hostPort
    let got = exec(&a, "a", &["wget", "-q", "-O-", &format!("http://{NODE_IP}:18080/")]);
    assert_eq!(got.trim(), "hello from a");
    assert_eq!(net.bridge_ports("ferrolet0").len(), 2);

    // Deleting a pod takes its veth, IP and hostPort with it.
    a.remove("a.yaml");
    a.wait_gone("a", T);
    assert_eq!(net.bridge_ports("ferrolet0").len(), 1);
    let ipam = a.root.join("network/ipam/10.66.0.0_24");
    assert_eq!(allocations(&ipam), vec![ipb.clone()]);
    let maps = net.nft(&["list", "table", "inet", "ferrolet"]).unwrap();
    assert!(!maps.contains("18080"), "hostPort left behind:\n{maps}");
    assert!(net.http_get(&format!("{NODE_IP}:18080"), "/").is_err());
}

/// What `scripts/demo` runs: every manifest in examples/manifests, as a user copies them, runs
/// on a fresh machine with the built-in image (none waits on a registry it cannot reach), and
/// the web example answers on its hostPort.
#[test]
fn every_example_manifest_runs() {
    let net = TestNet::create("examples");
    let a = Agent::start_in_netns("examples", &net.path, "bridge", &[], BRIDGE_CONFIG);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/manifests");
    let mut names = Vec::new();
    for f in std::fs::read_dir(&dir).unwrap().flatten() {
        let text = std::fs::read_to_string(f.path()).unwrap();
        for doc in text.split("\n---") {
            let v: serde_json::Value = serde_saphyr::from_str(doc).unwrap();
            if v["kind"] == "Pod" {
                names.push(v["metadata"]["name"].as_str().unwrap().to_string());
            }
        }
        a.write(&f.file_name().to_string_lossy(), &text);
    }
    assert!(names.len() >= 2, "{names:?}");
    for n in &names {
        a.wait_for(n, "Running with every container ready", Duration::from_secs(60), |p| {
            let st = p.status.as_ref();
            st.and_then(|s| s.phase.as_deref()) == Some("Running")
                && st
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|cs| cs.iter().all(|c| c.ready))
        });
    }
    let body = net.http_get_eventually("127.0.0.1:30080", "/", T).unwrap();
    assert!(body.contains("on ferrolet"), "{body}");
}

#[test]
fn host_network_pod_uses_the_node_namespace() {
    let net = TestNet::create("hostnet");
    let a = Agent::start_in_netns("hostnet", &net.path, "bridge", &[], BRIDGE_CONFIG);
    a.write("h.yaml", &web("h", 18081, "", "  hostNetwork: true\n"));
    let p = a.wait_for("h", "running", T, |p| running(p, "web"));
    assert_eq!(pod_ip(&p), NODE_IP, "a hostNetwork pod has the node's IP");
    let body = net.http_get_eventually("127.0.0.1:18081", "/", T).unwrap();
    assert_eq!(body.trim(), "hello from h");
    assert!(
        net.bridge_ports("ferrolet0").is_empty(),
        "no veth for a hostNetwork pod"
    );
}

#[test]
fn ips_are_released_and_reused() {
    let net = TestNet::create("reuse");
    // A /29 has five addresses for pods: three rounds of four pods need them back.
    let a = Agent::start_in_netns(
        "netreuse",
        &net.path,
        "bridge",
        &[],
        "ferrolet:\n  podSubnet: 10.66.1.0/29\n",
    );
    let ipam = a.root.join("network/ipam/10.66.1.0_29");
    for round in 0..3 {
        let names: Vec<String> = (0..4).map(|i| format!("r{round}p{i}")).collect();
        for n in &names {
            a.write(&format!("{n}.yaml"), &web(n, 8080, "", ""));
        }
        let mut ips: Vec<String> = names.iter().map(|n| pod_ip(&running_with_ip(&a, n))).collect();
        ips.sort();
        ips.dedup();
        assert_eq!(ips.len(), 4, "round {round}: distinct IPs {ips:?}");
        assert_eq!(allocations(&ipam), ips);
        for n in &names {
            a.remove(&format!("{n}.yaml"));
        }
        for n in &names {
            a.wait_gone(n, T);
        }
        assert!(allocations(&ipam).is_empty(), "round {round}: {:?}", allocations(&ipam));
        assert!(net.bridge_ports("ferrolet0").is_empty());
    }
}

#[test]
fn agent_crash_leaves_no_double_allocation() {
    let net = TestNet::create("crash");
    let mut a = Agent::start_in_netns("netcrash", &net.path, "bridge", &[], BRIDGE_CONFIG);
    let ipam = a.root.join("network/ipam/10.66.0.0_24");
    a.write("keep.yaml", &web("keep", 8080, "", ""));
    a.write("gone.yaml", &web("gone", 8080, "", ""));
    let keep = pod_ip(&running_with_ip(&a, "keep"));
    let gone = pod_ip(&running_with_ip(&a, "gone"));

    // Killed while idle; a pod deleted while the agent is down is collected at the next start.
    a.kill9();
    a.remove("gone.yaml");
    a.restart_with_env(Vec::new());
    a.wait_gone("gone", T);
    // The pod never reaches the restarted agent's pod table, so "gone" holds at once; its
    // address goes with the orphan cleanup that follows.
    let deadline = std::time::Instant::now() + T;
    while allocations(&ipam) != vec![keep.clone()] && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(allocations(&ipam), vec![keep.clone()]);
    assert_eq!(
        pod_ip(&running_with_ip(&a, "keep")),
        keep,
        "the pod kept its IP across the restart"
    );

    // Killed in the middle of a setup: IP allocated and veth created, nothing else.
    a.restart_with_env(vec![("FERROLET_NETPLUG_FAILPOINT".into(), "bridge-after-veth".into())]);
    a.write("mid.yaml", &web("mid", 8080, "", ""));
    a.wait_log("failpoint reached", T);
    a.restart_with_env(Vec::new());
    let mid = pod_ip(&running_with_ip(&a, "mid"));
    assert_ne!(mid, keep);
    let mut want = vec![keep.clone(), mid.clone()];
    want.sort();
    assert_eq!(
        allocations(&ipam),
        want,
        "one IP per pod, nothing leaked ({gone} was freed)"
    );
    assert_eq!(net.bridge_ports("ferrolet0").len(), 2, "one veth per pod");
    let body = net.http_get_eventually(&format!("{mid}:8080"), "/", T).unwrap();
    assert_eq!(body.trim(), "hello from mid");
}

#[test]
fn bad_network_config_shows_in_pod_status_and_spares_other_pods() {
    let net = TestNet::create("badnet");
    // The pod subnet overlaps the node's own route on node0.
    let a = Agent::start_in_netns(
        "badnet",
        &net.path,
        "bridge",
        &[],
        "ferrolet:\n  podSubnet: 198.51.100.0/25\n",
    );
    a.write("p.yaml", &web("p", 8080, "", ""));
    a.write("h.yaml", &web("h", 18082, "", "  hostNetwork: true\n"));
    a.wait_for("h", "hostNetwork pod running", T, |p| running(p, "web"));
    let p = a.wait_for("p", "waiting with the network error", T, |p| {
        waiting_message(p, "web").is_some_and(|m| m.contains("overlaps"))
    });
    assert_eq!(waiting_reason(&p, "web").as_deref(), Some("ContainerCreating"));
    let msg = waiting_message(&p, "web").unwrap();
    assert!(msg.contains("198.51.100.0/25") && msg.contains("node0"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// CNI mode

fn cni_config(net: &TestNet, subnet: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    cni_config_on(net, subnet, "cni-it0")
}

/// [`cni_config`] with the pods on `bridge`.
fn cni_config_on(net: &TestNet, subnet: &str, bridge: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let conf = net.dir.join("net.d");
    let ipam = net.dir.join("cni-ipam");
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(
        conf.join("10-it.conflist"),
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "ferrolet-it",
            "plugins": [
                {"type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": true, "hairpinMode": true,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": ipam}},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        })
        .to_string(),
    )
    .unwrap();
    (conf, ipam.join("ferrolet-it"))
}

fn cni_agent(name: &str, net: &TestNet, conf: &std::path::Path) -> Agent {
    Agent::start_in_netns(
        name,
        &net.path,
        "cni",
        &[],
        &format!(
            "ferrolet:\n  cniConfDir: {}\n  cniBinDirs: [/usr/lib/cni, /opt/cni/bin]\n",
            conf.display()
        ),
    )
}

#[test]
fn cni_pods_get_ips_hostports_and_release_them() {
    let net = TestNet::create("cni");
    let (conf, ipam) = cni_config(&net, "10.67.0.0/24");
    let a = cni_agent("netcni", &net, &conf);
    a.write(
        "a.yaml",
        &web("a", 8080, "    ports: [{containerPort: 8080, hostPort: 18090}]\n", ""),
    );
    a.write("b.yaml", &web("b", 8080, "", ""));
    let ipa = pod_ip(&running_with_ip(&a, "a"));
    let ipb = pod_ip(&running_with_ip(&a, "b"));
    assert!(
        in_subnet(&ipa, "10.67.0.") && in_subnet(&ipb, "10.67.0."),
        "{ipa} {ipb}"
    );
    let body = net.http_get_eventually(&format!("{ipa}:8080"), "/", T).unwrap();
    assert_eq!(body.trim(), "hello from a");
    let got = exec(&a, "b", &["wget", "-q", "-O-", &format!("http://{ipa}:8080/")]);
    assert_eq!(got.trim(), "hello from a");
    let body = net.http_get_eventually(&format!("{NODE_IP}:18090"), "/", T).unwrap();
    assert_eq!(body.trim(), "hello from a");
    let mut both = vec![ipa.clone(), ipb.clone()];
    both.sort();
    assert_eq!(allocations(&ipam), both);

    // DEL releases the IP (host-local) and the hostPort (portmap).
    a.remove("a.yaml");
    a.wait_gone("a", T);
    assert_eq!(allocations(&ipam), vec![ipb]);
    assert!(net.http_get(&format!("{NODE_IP}:18090"), "/").is_err());
}

#[test]
fn cni_bad_config_is_reported_then_fixed() {
    let net = TestNet::create("cnibad");
    let conf = net.dir.join("net.d");
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(conf.join("10-bad.conflist"), "{ not json").unwrap();
    let a = cni_agent("netcnibad", &net, &conf);
    a.write("p.yaml", &web("p", 8080, "", ""));
    a.write("h.yaml", &web("h", 18083, "", "  hostNetwork: true\n"));
    a.wait_for("h", "hostNetwork pod running", T, |p| running(p, "web"));
    let p = a.wait_for("p", "waiting with the CNI config error", T, |p| {
        waiting_message(p, "web").is_some_and(|m| m.contains("10-bad.conflist"))
    });
    assert_eq!(waiting_reason(&p, "web").as_deref(), Some("ContainerCreating"));
    // The node is NotReady for it, as kubelet's Ready condition takes the network's state.
    let (status, message) = node_ready(&a);
    assert_eq!(status, "False");
    assert!(
        message.starts_with("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: ")
            && message.contains("10-bad.conflist"),
        "{message}"
    );

    // An unknown plugin is named too.
    std::fs::remove_file(conf.join("10-bad.conflist")).unwrap();
    std::fs::write(
        conf.join("20-unknown.conflist"),
        r#"{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"no-such-plugin"}]}"#,
    )
    .unwrap();
    a.wait_for("p", "waiting with the unknown plugin", T, |p| {
        waiting_message(p, "web").is_some_and(|m| m.contains("no-such-plugin"))
    });

    // Fixed: the next sync builds the network and the pod runs.
    std::fs::remove_file(conf.join("20-unknown.conflist")).unwrap();
    let (_, ipam) = cni_config(&net, "10.67.1.0/24");
    let ip = pod_ip(&running_with_ip(&a, "p"));
    assert!(in_subnet(&ip, "10.67.1."), "{ip}");
    assert_eq!(allocations(&ipam), vec![ip.clone()]);
    assert_eq!(node_ready(&a).0, "True", "the node is Ready with its network");

    // Changed in place, without a restart: the next pod is on the new config's subnet
    // (kubelet's network status sync loads the directory again every 5 s).
    cni_config_on(&net, "10.67.2.0/24", "cni-it1");
    a.write("q.yaml", &web("q", 8081, "", ""));
    let ip_q = pod_ip(&running_with_ip(&a, "q"));
    assert!(in_subnet(&ip_q, "10.67.2."), "a pod after the change: {ip_q}");
    // Broken in place: the node goes NotReady with the error, a new pod waits with it, and a
    // pod made with the old config is still torn down with it (its lease goes).
    std::fs::write(
        conf.join("10-it.conflist"),
        r#"{"cniVersion":"1.0.0","name":"ferrolet-it","plugins":[{"type":"no-such-plugin"}]}"#,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + T;
    while !node_ready(&a).1.contains("no-such-plugin") {
        assert!(
            std::time::Instant::now() < deadline,
            "the node never went NotReady for the broken config: {:?}",
            node_ready(&a)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(node_ready(&a).0, "False");
    a.write("r.yaml", &web("r", 8082, "", ""));
    a.wait_for("r", "waiting with the broken config", T, |p| {
        waiting_message(p, "web").is_some_and(|m| m.contains("no-such-plugin"))
    });
    a.remove("p.yaml");
    a.wait_gone("p", T);
    assert!(allocations(&ipam).iter().all(|i| *i != ip), "p's lease was left");
    // Fixed again: ready, and the waiting pod runs.
    cni_config_on(&net, "10.67.2.0/24", "cni-it1");
    let ip_r = pod_ip(&running_with_ip(&a, "r"));
    assert!(in_subnet(&ip_r, "10.67.2."), "{ip_r}");
    assert_eq!(node_ready(&a).0, "True");
}

/// The node's Ready condition (status, message) as the agent reports it (standalone:
/// /ferrolet/node).
fn node_ready(a: &Agent) -> (String, String) {
    let (code, body) = a.get("/ferrolet/node").expect("/ferrolet/node");
    assert_eq!(code, 200);
    let n: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let c = n["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready").cloned())
        .unwrap_or_default();
    (
        c["status"].as_str().unwrap_or_default().to_string(),
        c["message"].as_str().unwrap_or_default().to_string(),
    )
}

#[test]
fn an_unreadable_sandbox_record_is_a_sandbox_change_not_a_silent_new_ip() {
    // Issue 11.2: a garbled sandbox.json made the agent set up a second sandbox beside the
    // first: the running container stayed in the old namespace on the old IP, the pod reported
    // a new IP, and the old IP stayed allocated.
    let net = TestNet::create("garbled");
    let mut a = Agent::start_in_netns("garbled", &net.path, "bridge", &[], BRIDGE_CONFIG);
    let ipam = a.root.join("network/ipam/10.66.0.0_24");
    a.write("g.yaml", &web("g", 8080, "", ""));
    let before = running_with_ip(&a, "g");
    let uid = before.metadata.uid.clone().unwrap();
    let old_container = container_status(&before, "web").container_id.clone().unwrap();
    a.kill9();
    std::fs::write(a.root.join("pods").join(&uid).join("sandbox.json"), b"\0garbage{").unwrap();
    a.restart_with_env(Vec::new());
    let after = a.wait_for("g", "running again in a new sandbox", T, |p| {
        running(p, "web") && container_status(p, "web").container_id.as_deref() != Some(old_container.as_str())
    });
    let ip = pod_ip(&after);
    assert_eq!(allocations(&ipam), vec![ip.clone()], "one IP, the old one released");
    assert_eq!(net.bridge_ports("ferrolet0").len(), 1, "one veth");
    assert_eq!(restarts(&after, "web"), 1, "the change restarted the container");
    let body = net.http_get_eventually(&format!("{ip}:8080"), "/", T).unwrap();
    assert_eq!(body.trim(), "hello from g");
}

#[test]
fn reset_survives_garbled_network_records() {
    let net = TestNet::create("rsn");
    let mut a = Agent::start_in_netns(
        "rsn",
        &net.path,
        "bridge",
        &[],
        "ferrolet:\n  podSubnet: 10.66.9.0/24\n",
    );
    a.write("w.yaml", &pod_yaml("w", "Always", "sleep 3600"));
    a.write("v.yaml", &pod_yaml("v", "Always", "sleep 3600"));
    a.wait_phase("w", "Running", T);
    a.wait_phase("v", "Running", T);
    a.stop();
    let recs = a.root.join("network/sandboxes");
    let mut n = 0;
    for e in std::fs::read_dir(&recs).unwrap().flatten() {
        std::fs::write(e.path(), "garbage").unwrap();
        n += 1;
    }
    assert_eq!(n, 2);
    let ipam = a.root.join("network/ipam/10.66.9.0_24");
    let ipfile = std::fs::read_dir(&ipam)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("10."))
        .unwrap()
        .path();
    std::fs::write(&ipfile, b"\xff\xfe").unwrap();
    // Issue 11.2: a garbled network record stopped reset half-way (bridge and table left).
    let out = a.reset().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        net.nft(&["list", "table", "inet", "ferrolet"]).is_err(),
        "nft table left"
    );
    let links = net.ip(&["-o", "link"]);
    assert!(!links.contains("ferrolet0"), "bridge left: {links}");
    assert!(!links.contains("veth"), "veths left: {links}");
    let left: Vec<_> = std::fs::read_dir(&ipam)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.iter().all(|n| n == "last_reserved_ip"), "{left:?}");
}

/// The pool entries on disk, by id, with the IPs their records hold.
fn pool_entries(a: &Agent) -> Vec<(String, Vec<String>)> {
    let mut v: Vec<(String, Vec<String>)> = std::fs::read_dir(a.root.join("sandbox-pool"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let rec: serde_json::Value =
                serde_json::from_slice(&std::fs::read(e.path().join("sandbox.json")).ok()?).ok()?;
            let ips = rec["podIps"]
                .as_array()?
                .iter()
                .filter_map(|i| i.as_str().map(String::from))
                .collect();
            Some((e.file_name().to_string_lossy().into_owned(), ips))
        })
        .collect();
    v.sort();
    v
}

/// The IPs the pods and a full pool of two hold (sorted), once the IPAM holds exactly those,
/// and the entries.
fn pods_and_entries_ips(a: &Agent, ipam: &std::path::Path, pods: &[&str]) -> (Vec<String>, Vec<(String, Vec<String>)>) {
    let entries = wait_pool_full(a, 2);
    let mut want: Vec<String> = pods.iter().map(|n| pod_ip(&running_with_ip(a, n))).collect();
    want.extend(entries.iter().flat_map(|(_, ips)| ips.clone()));
    want.sort();
    let deadline = std::time::Instant::now() + T;
    while allocations(ipam) != want && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    (want, entries)
}

fn wait_pool_full(a: &Agent, n: usize) -> Vec<(String, Vec<String>)> {
    let deadline = std::time::Instant::now() + T;
    loop {
        let e = pool_entries(a);
        if e.len() == n && e.iter().all(|(_, ips)| ips.len() == 1) {
            return e;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the pool did not fill to {n}: {e:?}\n{}",
            tail(&a.agent_log(), 30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The sandbox id a pod's record names.
fn sandbox_id(a: &Agent, p: &Pod) -> String {
    let uid = p.metadata.uid.clone().unwrap();
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.root.join("pods").join(uid).join("sandbox.json")).unwrap()).unwrap();
    rec["id"].as_str().unwrap().to_string()
}

#[test]
fn pooled_sandboxes_are_handed_to_pods_that_fit_and_never_outlive_the_agent() {
    let net = TestNet::create("pool");
    let mut a = Agent::start_in_netns(
        "netpool",
        &net.path,
        "bridge",
        &[],
        "ferrolet:\n  podSubnet: 10.66.3.0/24\n  sandboxPool: 2\n",
    );
    let ipam = a.root.join("network/ipam/10.66.3.0_24");
    let first = wait_pool_full(&a, 2);
    assert_eq!(allocations(&ipam).len(), 2, "each pooled sandbox holds an IP");
    assert_eq!(net.bridge_ports("ferrolet0").len(), 2, "and a veth on the bridge");

    // Two pods take the two entries: each gets its own, named with its own hostname.
    a.write("a.yaml", &web("a", 8080, "", ""));
    let pa = running_with_ip(&a, "a");
    a.write("b.yaml", &web("b", 8080, "", ""));
    let pb = running_with_ip(&a, "b");
    let pooled: Vec<String> = first.iter().map(|(id, _)| id.clone()).collect();
    let (sa, sb) = (sandbox_id(&a, &pa), sandbox_id(&a, &pb));
    assert!(
        pooled.contains(&sa) && pooled.contains(&sb) && sa != sb,
        "{sa} {sb} from {pooled:?}"
    );
    let pooled_ips: Vec<String> = first.iter().flat_map(|(_, ips)| ips.clone()).collect();
    assert!(pooled_ips.contains(&pod_ip(&pa)) && pooled_ips.contains(&pod_ip(&pb)));
    for (name, p) in [("a", &pa), ("b", &pb)] {
        let full = format!("{name}-node-netpool");
        assert_eq!(exec(&a, name, &["hostname"]).trim(), full);
        assert_eq!(exec(&a, name, &["cat", "/etc/hostname"]).trim(), full);
        // the files written on take name the pod and the IP the entry brought
        let hosts = exec(&a, name, &["cat", "/etc/hosts"]);
        assert!(hosts.contains(&format!("{}\t{full}", pod_ip(p))), "{hosts}");
        let addrs = exec(&a, name, &["ip", "-o", "addr", "show", "eth0"]);
        assert!(addrs.contains(&format!("{}/24", pod_ip(p))), "{addrs}");
        let body = net.http_get_eventually(&format!("{}:8080", pod_ip(p)), "/", T).unwrap();
        assert_eq!(body.trim(), format!("hello from {name}"));
    }
    // pod -> pod, System V IPC apart: each pod's IPC namespace is its own
    let got = exec(
        &a,
        "b",
        &["wget", "-q", "-O-", &format!("http://{}:8080/", pod_ip(&pa))],
    );
    assert_eq!(got.trim(), "hello from a");
    exec(&a, "a", &["sh", "-c", "echo a > /dev/shm/mark"]);
    let shm_b = exec(&a, "b", &["ls", "/dev/shm"]);
    assert!(!shm_b.contains("mark"), "pod b sees pod a's /dev/shm: {shm_b}");

    // The pool fills again with new entries once the node is quiet.
    let refilled = wait_pool_full(&a, 2);
    assert!(refilled.iter().all(|(id, _)| !pooled.contains(id)), "{refilled:?}");
    assert_eq!(allocations(&ipam).len(), 4);

    // A pod with a hostPort does not fit (its port mapping is the pod's own): it builds its own.
    a.write(
        "c.yaml",
        &web("c", 8080, "    ports: [{containerPort: 8080, hostPort: 18081}]\n", ""),
    );
    let pc = running_with_ip(&a, "c");
    assert!(!sandbox_id(&a, &pc).starts_with("pool-"));
    let body = net.http_get_eventually(&format!("{NODE_IP}:18081"), "/", T).unwrap();
    assert_eq!(body.trim(), "hello from c");
    assert_eq!(pool_entries(&a).len(), 2);

    // killed: the next start drops every entry (one may carry a pod's hostname) and builds
    // new ones; the pods keep their sandboxes and IPs.
    let before = wait_pool_full(&a, 2);
    a.kill9();
    a.restart_with_env(Vec::new());
    let after = wait_pool_full(&a, 2);
    assert!(
        after.iter().all(|(id, _)| !before.iter().any(|(b, _)| b == id)),
        "{before:?} {after:?}"
    );
    for (name, p) in [("a", &pa), ("b", &pb), ("c", &pc)] {
        assert_eq!(pod_ip(&running_with_ip(&a, name)), pod_ip(p), "{name} kept its IP");
    }
    let mut want: Vec<String> = [&pa, &pb, &pc].iter().map(|p| pod_ip(p)).collect();
    want.extend(after.iter().flat_map(|(_, ips)| ips.clone()));
    want.sort();
    assert_eq!(allocations(&ipam), want, "the old entries' IPs went with them");
    assert_eq!(net.bridge_ports("ferrolet0").len(), 5, "three pods, two entries");

    // Killed in the middle of a hand-over, at each step: the entry reaches no other pod, the
    // pod runs with its own hostname, and nothing leaks.
    for (point, name) in [("pool-after-hostname", "d"), ("pool-after-claim", "e")] {
        a.restart_with_env(vec![("FERROLET_POOL_FAILPOINT".into(), point.into())]);
        wait_pool_full(&a, 2);
        a.write(&format!("{name}.yaml"), &web(name, 8080, "", ""));
        a.wait_log(&format!("failpoint=\"{point}\""), T);
        a.restart_with_env(Vec::new());
        let p = running_with_ip(&a, name);
        assert_eq!(
            exec(&a, name, &["hostname"]).trim(),
            format!("{name}-node-netpool"),
            "{point}"
        );
        let body = net
            .http_get_eventually(&format!("{}:8080", pod_ip(&p)), "/", T)
            .unwrap();
        assert_eq!(body.trim(), format!("hello from {name}"), "{point}");
    }
    let (want, _) = pods_and_entries_ips(&a, &ipam, &["a", "b", "c", "d", "e"]);
    assert_eq!(allocations(&ipam), want, "one IP per pod and per entry");
    assert_eq!(net.bridge_ports("ferrolet0").len(), 7, "five pods, two entries");

    // A power cut: every pin is gone; the pods get sandboxes again (new or pooled), each its
    // own, and the old entries' veths and IPs go.
    a.simulate_power_cut();
    a.boot();
    for name in ["a", "b", "c", "d", "e"] {
        a.wait_for(name, "running again after the power cut", T, |p| {
            running(p, "web") && restarts(p, "web") >= 1 && !pod_ip(p).is_empty()
        });
        assert_eq!(exec(&a, name, &["hostname"]).trim(), format!("{name}-node-netpool"));
    }
    let (want, entries) = pods_and_entries_ips(&a, &ipam, &["a", "b", "c", "d", "e"]);
    assert_eq!(
        allocations(&ipam),
        want,
        "after the power cut: one IP per pod and per entry"
    );
    assert_eq!(
        net.bridge_ports("ferrolet0").len(),
        7,
        "after the power cut: five pods, two entries"
    );

    // Turned off, the pool an earlier run left goes at the next start; turned on, it is back.
    let cfg = a.dir.join("kubelet.yaml");
    let yaml = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, yaml.replace("sandboxPool: 2", "sandboxPool: 0")).unwrap();
    a.restart();
    let pods_only: Vec<String> = want
        .iter()
        .filter(|ip| !entries.iter().any(|(_, e)| e.contains(ip)))
        .cloned()
        .collect();
    let deadline = std::time::Instant::now() + T;
    while (allocations(&ipam) != pods_only || !pool_entries(&a).is_empty()) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(allocations(&ipam), pods_only, "the entries' IPs went");
    assert!(pool_entries(&a).is_empty());
    assert_eq!(net.bridge_ports("ferrolet0").len(), 5, "the entries' veths went");
    std::fs::write(&cfg, yaml).unwrap();
    a.restart();
    wait_pool_full(&a, 2);

    // The pods go; the pool stays. Then reset removes the pool with everything else.
    for n in ["a", "b", "c", "d", "e"] {
        a.remove(&format!("{n}.yaml"));
    }
    for n in ["a", "b", "c", "d", "e"] {
        a.wait_gone(n, T);
    }
    let deadline = std::time::Instant::now() + T;
    while allocations(&ipam).len() != 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(allocations(&ipam).len(), 2, "{:?}", allocations(&ipam));
    a.stop();
    let out = a.reset().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let links = net.ip(&["-o", "link"]);
    assert!(!links.contains("veth"), "veths left: {links}");
    assert!(!a.root.join("sandbox-pool").exists(), "the pool's directory is gone");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&a.root.join("sandbox-pool").display().to_string()),
        "a pooled sandbox is still mounted"
    );
}
