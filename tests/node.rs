//! The Node object against a real control plane (issue 12): a node registers with its labels,
//! taints, capacity, allocatable, nodeInfo and addresses, turns Ready once its runtime and
//! network say so, gets a pod CIDR from the controller-manager, and renews its Lease. The
//! control plane runs in a network namespace of the test's own; the node's parts run on a
//! thread that joined it. Needs root (the namespace).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::net::TestNet;
use ferrolet::config::{Config, Threshold};
use ferrolet::kubeclient::Kube;
use ferrolet::node::{cluster, NodeInfo};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::Api;

const CONTROL_PLANE: &str = "/work/shared/k8s/control-plane";

/// A control plane started in `net`, stopped (and its directory removed) on drop.
struct ControlPlane {
    dir: PathBuf,
    net_path: PathBuf,
}

impl ControlPlane {
    fn start(net: &TestNet) -> ControlPlane {
        let dir = std::env::temp_dir().join(format!("ferrolet-cp-node-{}", std::process::id()));
        let cp = ControlPlane {
            dir: dir.clone(),
            net_path: net.path.clone(),
        };
        let out = net.command(CONTROL_PLANE).arg("start").arg(&dir).output().unwrap();
        assert!(
            out.status.success(),
            "control-plane start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cp
    }

    /// A kubeconfig for `cn` in group `org`, with an X.509 v3 client certificate signed by the
    /// cluster CA (rustls refuses the v1 certificates `control-plane node-kubeconfig` and the
    /// admin kubeconfig carry: UnsupportedCertVersion).
    fn kubeconfig(&self, file: &str, cn: &str, org: &str) -> PathBuf {
        let pki = self.dir.join("pki");
        let out_dir = self.dir.join("v3");
        std::fs::create_dir_all(&out_dir).unwrap();
        let (key, csr, crt, ext) = (
            out_dir.join(format!("{file}.key")),
            out_dir.join(format!("{file}.csr")),
            out_dir.join(format!("{file}.crt")),
            out_dir.join(format!("{file}.ext")),
        );
        std::fs::write(
            &ext,
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
        )
        .unwrap();
        let run = |args: &[&std::ffi::OsStr]| {
            let out = Command::new("openssl").args(args).output().unwrap();
            assert!(
                out.status.success(),
                "openssl: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let subj = format!("/O={org}/CN={cn}");
        run(&[
            "req".as_ref(),
            "-new".as_ref(),
            "-newkey".as_ref(),
            "rsa:2048".as_ref(),
            "-nodes".as_ref(),
            "-keyout".as_ref(),
            key.as_os_str(),
            "-subj".as_ref(),
            subj.as_ref(),
            "-out".as_ref(),
            csr.as_os_str(),
        ]);
        run(&[
            "x509".as_ref(),
            "-req".as_ref(),
            "-in".as_ref(),
            csr.as_os_str(),
            "-CA".as_ref(),
            pki.join("ca.crt").as_os_str(),
            "-CAkey".as_ref(),
            pki.join("ca.key").as_os_str(),
            "-CAcreateserial".as_ref(),
            "-days".as_ref(),
            "1".as_ref(),
            "-extfile".as_ref(),
            ext.as_os_str(),
            "-out".as_ref(),
            crt.as_os_str(),
        ]);
        let env = std::fs::read_to_string(self.dir.join("env")).unwrap();
        let server = env
            .lines()
            .find_map(|l| l.strip_prefix("K8S_APISERVER="))
            .expect("K8S_APISERVER")
            .trim_matches('"');
        let path = out_dir.join(format!("{file}.kubeconfig"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster: {{server: \"{server}\", certificate-authority: \"{}\"}}\nusers:\n- name: u\n  user: {{client-certificate: \"{}\", client-key: \"{}\"}}\ncontexts:\n- name: c\n  context: {{cluster: local, user: u}}\ncurrent-context: c\n",
                pki.join("ca.crt").display(),
                crt.display(),
                key.display()
            ),
        )
        .unwrap();
        path
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new("nsenter")
            .arg(format!("--net={}", self.net_path.display()))
            .arg("--")
            .arg(CONTROL_PLANE)
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if Instant::now() > deadline => panic!("{what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

fn condition(n: &Node, kind: &str) -> Option<(String, String, String)> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

#[test]
fn a_node_registers_turns_ready_gets_its_pod_cidr_and_renews_its_lease() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let net = TestNet::create("node");
    let cp = ControlPlane::start(&net);
    let name = "edge-node-1".to_string();
    let node_kubeconfig = cp.kubeconfig("node", &format!("system:node:{name}"), "system:nodes");
    let admin = cp.kubeconfig("admin", "kubernetes-admin", "system:masters");
    let root = tempfile::tempdir().unwrap();
    let root_dir = root.path().to_path_buf();
    let cp_dir = cp.dir.clone();
    net.in_ns(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(scenario(name, node_kubeconfig, admin, root_dir, cp_dir))
    });
    drop(cp);
}

async fn scenario(name: String, node_kubeconfig: PathBuf, admin: PathBuf, root_dir: PathBuf, cp_dir: PathBuf) {
    let mut cfg = Config {
        node_name: name.clone(),
        root_dir,
        node_ip: Some(common::net::NODE_IP.parse().unwrap()),
        max_pods: 42,
        ..Default::default()
    };
    cfg.system_reserved.memory = 256 << 20;
    cfg.kube_reserved.cpu_milli = 100;
    // Thresholds this shared machine is sure to be above (its disk may be nearly full).
    cfg.eviction_hard.nodefs_available = Some(Threshold::Quantity(1 << 20));
    cfg.eviction_hard.memory_available = Some(Threshold::Quantity(100 << 20));
    cfg.cluster.kubeconfig = Some(node_kubeconfig.clone());
    cfg.cluster.node_labels = [("example.com/rack".to_string(), "r7".to_string())].into();
    cfg.cluster.register_with_taints = vec![Taint {
        key: "example.com/edge".into(),
        value: Some("yes".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }];
    cfg.cluster.node_status_update_frequency = Duration::from_secs(1);
    cfg.cluster.node_lease_duration_seconds = 8;
    let cfg = Arc::new(cfg);
    let info = NodeInfo::detect(&cfg);

    let kube = Kube::from_kubeconfig(&node_kubeconfig).await.unwrap();
    let admin = Kube::from_kubeconfig(&admin).await.unwrap();
    let network_ready = Arc::new(AtomicBool::new(false));
    let readiness: cluster::Readiness = {
        let ready = network_ready.clone();
        Arc::new(move || {
            if ready.load(Ordering::SeqCst) {
                Vec::new()
            } else {
                vec!["container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:the test holds it".into()]
            }
        })
    };
    let images: cluster::ImageList = Arc::new(|| Ok(Vec::new()));
    let events = ferrolet::events::Recorder::standalone(&name);
    let handle = cluster::start(kube.clone(), cfg.clone(), info.clone(), images, readiness, events)
        .await
        .unwrap();
    let registered = tokio::time::timeout(Duration::from_secs(30), handle.registered())
        .await
        .expect("registered within 30s");
    let uid = registered.metadata.uid.clone().unwrap();

    let nodes: Api<Node> = Api::all(admin.client());
    // Not ready while the network is not, with the error as the message.
    let n = eventually("the NotReady status", Duration::from_secs(20), || async {
        let n = nodes.get(&name).await.map_err(|e| e.to_string())?;
        match condition(&n, "Ready") {
            Some((s, r, m)) if s == "False" => {
                assert_eq!(r, "KubeletNotReady");
                assert!(m.contains("NetworkPluginNotReady"), "{m}");
                Ok(n)
            }
            other => Err(format!("Ready is {other:?}")),
        }
    })
    .await;
    let l = n.metadata.labels.as_ref().unwrap();
    assert_eq!(l["kubernetes.io/hostname"], name);
    assert_eq!(l["kubernetes.io/os"], "linux");
    assert_eq!(l["beta.kubernetes.io/os"], "linux");
    assert_eq!(l["kubernetes.io/arch"], ferrolet::node::machine::go_arch());
    assert_eq!(l["example.com/rack"], "r7");
    let taints = n.spec.as_ref().unwrap().taints.clone().unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t.key == "example.com/edge" && t.effect == "NoSchedule"),
        "{taints:?}"
    );
    for kind in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        let (s, r, _) = condition(&n, kind).unwrap();
        assert_eq!(s, "False", "{kind}");
        assert!(r.starts_with("KubeletHas"), "{kind}: {r}");
    }

    // Ready once the network is.
    network_ready.store(true, Ordering::SeqCst);
    let n = eventually("the Ready status", Duration::from_secs(20), || async {
        let n = nodes.get(&name).await.map_err(|e| e.to_string())?;
        match condition(&n, "Ready") {
            Some((s, r, m)) if s == "True" => {
                assert_eq!(
                    (r.as_str(), m.as_str()),
                    ("KubeletReady", "kubelet is posting ready status")
                );
                Ok(n)
            }
            other => Err(format!("Ready is {other:?}")),
        }
    })
    .await;
    let s = n.status.as_ref().unwrap();
    let cap = s.capacity.as_ref().unwrap();
    let alloc = s.allocatable.as_ref().unwrap();
    let q = |m: &std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
             k: &str| { ferrolet::pod::units::parse_quantity(&m[k].0).unwrap() };
    let milli = |m: &std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        ferrolet::pod::units::milli(&m["cpu"].0).unwrap()
    };
    assert_eq!(milli(cap), info.capacity.cpu_milli);
    assert_eq!(q(cap, "memory"), info.capacity.memory as f64);
    assert_eq!(q(cap, "pods"), 42.0);
    assert_eq!(milli(alloc), info.capacity.cpu_milli - 100);
    let hugepages: i64 = info.capacity.hugepages.values().sum();
    assert_eq!(
        q(alloc, "memory"),
        (info.capacity.memory - (256 << 20) - (100 << 20) - hugepages) as f64
    );
    assert_eq!(
        q(alloc, "ephemeral-storage"),
        q(cap, "ephemeral-storage") - (1 << 20) as f64
    );
    let ni = s.node_info.as_ref().unwrap();
    assert_eq!(ni.kubelet_version, "v1.26.0");
    assert!(ni.container_runtime_version.starts_with("ferrolet://"), "{ni:?}");
    assert_eq!(ni.operating_system, "linux");
    assert!(!ni.kernel_version.is_empty() && !ni.boot_id.is_empty(), "{ni:?}");
    let addrs: Vec<_> = s
        .addresses
        .iter()
        .flatten()
        .map(|a| (a.type_.clone(), a.address.clone()))
        .collect();
    assert_eq!(
        addrs,
        [
            ("InternalIP".to_string(), common::net::NODE_IP.to_string()),
            ("Hostname".to_string(), name.clone())
        ]
    );
    assert_eq!(
        s.daemon_endpoints
            .as_ref()
            .unwrap()
            .kubelet_endpoint
            .as_ref()
            .unwrap()
            .port,
        10250
    );

    // The controller-manager's pod CIDR.
    let cidr = handle.pod_cidr(Duration::from_secs(60)).await.expect("a pod CIDR");
    assert!(cidr.starts_with("10.244.") && cidr.ends_with("/24"), "{cidr}");

    // The Lease: held by the node, owned by the Node, renewed.
    let leases: Api<Lease> = Api::namespaced(admin.client(), "kube-node-lease");
    let renew_of = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone()).map(|t| t.0);
    let first = eventually("the Lease", Duration::from_secs(20), || async {
        let l = leases.get(&name).await.map_err(|e| e.to_string())?;
        let owners = l.metadata.owner_references.clone().unwrap_or_default();
        if owners.iter().any(|o| o.kind == "Node" && o.uid == uid) {
            Ok(l)
        } else {
            Err(format!("owners {owners:?}"))
        }
    })
    .await;
    let spec = first.spec.as_ref().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(name.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(8));
    let t0 = renew_of(&first).unwrap();
    eventually("a renewed Lease", Duration::from_secs(10), || async {
        let l = leases.get(&name).await.map_err(|e| e.to_string())?;
        match renew_of(&l) {
            Some(t) if t > t0 => Ok(()),
            other => Err(format!("renewTime {other:?}, first {t0}")),
        }
    })
    .await;

    // Registering again finds the Node (409) and sets its default labels right, keeping the
    // labels others added.
    let patch = serde_json::json!({"metadata": {"labels": {
        "kubernetes.io/hostname": "wrong", "kubernetes.io/os": null, "team": "a"}}});
    nodes
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await
        .unwrap();
    let initial = ferrolet::node::register::initial_node(&cfg);
    let again = ferrolet::node::register::register(&kube, &initial).await;
    assert_eq!(again.metadata.uid.as_deref(), Some(uid.as_str()));
    let l = nodes.get(&name).await.unwrap().metadata.labels.unwrap();
    assert_eq!(l["kubernetes.io/hostname"], name);
    assert_eq!(l["kubernetes.io/os"], "linux");
    assert_eq!(l["team"], "a");

    // An API server outage: the loops keep going and catch up when it is back.
    let outage = ApiServerOutage::begin(&cp_dir);
    network_ready.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let _restarted = outage.end();
    let back = k8s_openapi::jiff::Timestamp::now();
    eventually("the API server back", Duration::from_secs(60), || async {
        nodes.get(&name).await.map(|_| ()).map_err(|e| e.to_string())
    })
    .await;
    eventually("NotReady posted after the outage", Duration::from_secs(30), || async {
        let n = nodes.get(&name).await.map_err(|e| e.to_string())?;
        match condition(&n, "Ready") {
            Some((s, _, _)) if s == "False" => Ok(()),
            other => Err(format!("Ready is {other:?}")),
        }
    })
    .await;
    eventually(
        "the Lease renewed after the outage",
        Duration::from_secs(30),
        || async {
            let l = leases.get(&name).await.map_err(|e| e.to_string())?;
            match renew_of(&l) {
                Some(t) if t > back => Ok(()),
                other => Err(format!("renewTime {other:?}, back at {back}")),
            }
        },
    )
    .await;
}

/// The control plane's kube-apiserver killed, then started again with the same command line
/// (the second pid the control-plane script records); the restarted one is killed on drop.
struct ApiServerOutage {
    argv: Vec<String>,
    log: PathBuf,
}

struct Restarted(std::process::Child);

impl Drop for Restarted {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl ApiServerOutage {
    fn begin(cp_dir: &std::path::Path) -> ApiServerOutage {
        let pids = std::fs::read_to_string(cp_dir.join("pids")).unwrap();
        let pid: i32 = pids
            .lines()
            .nth(1)
            .expect("the apiserver's pid")
            .trim()
            .parse()
            .unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        assert!(argv[0].ends_with("kube-apiserver"), "{argv:?}");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(&format!("/proc/{pid}/cmdline")).exists()
            && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        ApiServerOutage {
            argv,
            log: cp_dir.join("logs/kube-apiserver-restarted.log"),
        }
    }

    /// Start it again (from this thread, which is in the control plane's namespace).
    fn end(self) -> Restarted {
        let log = std::fs::File::create(&self.log).unwrap();
        let child = Command::new(&self.argv[0])
            .args(&self.argv[1..])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Restarted(child)
    }
}
