//! The Node object (kubelet's node status and lease, `src/node/`), driven directly against the
//! shared control plane with the node's own credential: a node registers with its labels,
//! taints, capacity, allocatable, nodeInfo and addresses, turns Ready once its runtime and
//! network say so, gets a pod CIDR from the controller-manager, renews its Lease, takes an
//! existing Node over, and rides out an API server outage. Its parts run on a thread that
//! joined the cluster's namespace.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrolet::config::{Config, Threshold};
use ferrolet::kubeclient::Kube;
use ferrolet::node::{cluster as node_cluster, NodeInfo};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::Api;
use libtest_mimic::Trial;

use crate::{cluster, test};

pub fn tests() -> Vec<Trial> {
    vec![test(
        "node_registers_turns_ready_gets_its_pod_cidr_renews_its_lease_and_survives_an_outage",
        node_registers_turns_ready_gets_its_pod_cidr_renews_its_lease_and_survives_an_outage,
    )]
}

fn node_registers_turns_ready_gets_its_pod_cidr_renews_its_lease_and_survives_an_outage() {
    let c = cluster();
    let name = "node-status".to_string();
    let node_kubeconfig = c.node_kubeconfig(&name);
    let admin = c.kubeconfig.clone();
    let root = tempfile::tempdir().unwrap();
    let root_dir = root.path().to_path_buf();
    c.net.in_ns(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(scenario(name, node_kubeconfig, admin, root_dir))
    });
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

async fn scenario(name: String, node_kubeconfig: PathBuf, admin: PathBuf, root_dir: PathBuf) {
    let mut cfg = Config {
        node_name: name.clone(),
        root_dir,
        node_ip: Some(crate::common::net::NODE_IP.parse().unwrap()),
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
    let readiness: node_cluster::Readiness = {
        let ready = network_ready.clone();
        Arc::new(move || {
            if ready.load(Ordering::SeqCst) {
                Vec::new()
            } else {
                vec!["container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:the test holds it".into()]
            }
        })
    };
    let images: node_cluster::ImageList = Arc::new(|| Ok(Vec::new()));
    // What the device manager counts (its plugins are tested in tests/resources.rs).
    let extended = Arc::new(std::sync::Mutex::new(ferrolet::node::allocatable::Extended::default()));
    let events = ferrolet::events::Recorder::standalone(&name);
    let handle = node_cluster::start(
        kube.clone(),
        cfg.clone(),
        info.clone(),
        images,
        readiness,
        events,
        Arc::new(ferrolet::node::conditions::Pressure::default),
        node_cluster::Reported {
            extended: {
                let extended = extended.clone();
                Arc::new(move || extended.lock().unwrap().clone())
            },
            volumes_in_use: Arc::new(Vec::new),
        },
        ferrolet::checkpoint::Checkpoint::open(&cfg.root_dir).unwrap(),
    )
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
            ("InternalIP".to_string(), crate::common::net::NODE_IP.to_string()),
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

    // A device plugin's resource: its devices as capacity, the healthy ones as allocatable, in
    // the status as soon as the device manager counts them; gone once no plugin serves it.
    let dev = "example.com/dev";
    *extended.lock().unwrap() = ferrolet::node::allocatable::Extended {
        capacity: [(dev.to_string(), 3)].into(),
        allocatable: [(dev.to_string(), 2)].into(),
    };
    (handle.sync_now())();
    eventually("the device plugin's resource", Duration::from_secs(20), || async {
        let n = nodes.get(&name).await.map_err(|e| e.to_string())?;
        let s = n.status.unwrap_or_default();
        let of = |m: Option<
            std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        >| { m.and_then(|m| m.get(dev).map(|q| q.0.clone())) };
        match (of(s.capacity), of(s.allocatable)) {
            (Some(c), Some(a)) if c == "3" && a == "2" => Ok(()),
            other => Err(format!("capacity and allocatable of {dev}: {other:?}")),
        }
    })
    .await;
    *extended.lock().unwrap() = Default::default();
    (handle.sync_now())();
    eventually("the resource gone", Duration::from_secs(20), || async {
        let n = nodes.get(&name).await.map_err(|e| e.to_string())?;
        let s = n.status.unwrap_or_default();
        let has = |m: &Option<
            std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        >| { m.as_ref().is_some_and(|m| m.contains_key(dev)) };
        match has(&s.capacity) || has(&s.allocatable) {
            false => Ok(()),
            true => Err(format!("{dev} still in {:?}", s.capacity)),
        }
    })
    .await;

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

    // An unchanged status is not posted again (only heartbeats would differ): some 4-second
    // window, with the status computed every second, leaves the Node untouched.
    eventually("a quiet Node", Duration::from_secs(30), || async {
        let before = nodes
            .get(&name)
            .await
            .map_err(|e| e.to_string())?
            .metadata
            .resource_version;
        tokio::time::sleep(Duration::from_secs(4)).await;
        let after = nodes
            .get(&name)
            .await
            .map_err(|e| e.to_string())?
            .metadata
            .resource_version;
        if before == after {
            Ok(())
        } else {
            Err(format!("resourceVersion {before:?} -> {after:?}"))
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
    // (The API server is stopped and restarted off this thread: the loops run on it meanwhile.)
    let stopped = tokio::task::spawn_blocking(|| cluster().stop_apiserver())
        .await
        .unwrap();
    network_ready.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(8)).await;
    tokio::task::spawn_blocking(move || cluster().restart_apiserver(stopped))
        .await
        .unwrap();
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
