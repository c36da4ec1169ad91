//! Events and mirror pods against a real API server: the shared v1.26 control plane
//! (`../shared/k8s/control-plane`) started in a network namespace of the test's own, a Node
//! object made with the admin credential, and the agent's event recorder and mirror-pod client
//! working with the node's own credential (Node authorizer + NodeRestriction). Skipped, loudly,
//! when the control plane script is missing or the test is not root.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ferrolet::events::{Kind, Recorder};
use ferrolet::kubeclient::Kube;
use ferrolet::mirror::{self, MirrorPods};
use ferrolet::pod::{self, manifest};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

const NODE: &str = "evt-node";

fn control_plane_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/k8s/control-plane")
}

/// The test's network namespace and the control plane in it; both go when dropped.
struct Cluster {
    dir: PathBuf,
    netns: PathBuf,
    admin: PathBuf,
    node_kubeconfig: PathBuf,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = std::env::temp_dir().join(format!("ferrolet-evtmirror-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let netns = dir.join("netns");
        std::fs::File::create(&netns).unwrap();
        let p = netns.clone();
        std::thread::spawn(move || {
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
            mount(
                Some("/proc/thread-self/ns/net"),
                &p,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .expect("pinning the namespace");
        })
        .join()
        .unwrap();
        let mut c = Cluster {
            dir: dir.clone(),
            netns,
            admin: PathBuf::new(),
            node_kubeconfig: PathBuf::new(),
        };
        // kube-apiserver needs a default route to pick the address it advertises.
        for args in [
            &["link", "set", "lo", "up"][..],
            &["link", "add", "node0", "type", "veth", "peer", "name", "node0-peer"],
            &["link", "set", "node0", "up"],
            &["link", "set", "node0-peer", "up"],
            &["addr", "add", "198.51.100.10/24", "dev", "node0"],
            &["route", "add", "default", "via", "198.51.100.1"],
        ] {
            c.run("/usr/sbin/ip", args);
        }
        let script = control_plane_script();
        let cp = dir.join("cp");
        c.run(script.to_str().unwrap(), &["start", cp.to_str().unwrap()]);
        let env = std::fs::read_to_string(cp.join("env")).expect("control plane env");
        let var = |k: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("{k} in the control plane's env"))
                .trim_matches(|c| c == '\'' || c == '"')
                .to_string()
        };
        c.admin = PathBuf::from(var("KUBECONFIG"));
        // The Node object, as registration would make it.
        let node = format!(r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{NODE}"}}}}"#);
        std::fs::write(dir.join("node.json"), node).unwrap();
        let kc = format!("--kubeconfig={}", c.admin.display());
        c.run(
            "kubectl",
            &[&kc, "create", "-f", dir.join("node.json").to_str().unwrap()],
        );
        // `control-plane node-kubeconfig` signs X.509 v1 certificates, which rustls refuses;
        // the same identities with v3 client certificates from the cluster CA.
        let (server, ca) = (var("K8S_APISERVER"), var("K8S_CA"));
        c.admin = client_kubeconfig(&dir, &server, &ca, "admin", "/O=system:masters/CN=kubernetes-admin");
        c.node_kubeconfig = client_kubeconfig(
            &dir,
            &server,
            &ca,
            "node",
            &format!("/O=system:nodes/CN=system:node:{NODE}"),
        );
        c
    }

    /// A command in the namespace; panics on failure, returns stdout.
    fn run(&self, prog: &str, args: &[&str]) -> String {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.netns.display()))
            .arg("--")
            .arg(prog)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{prog}: {e}"));
        assert!(
            out.status.success(),
            "{prog} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Run `f` on a single-threaded runtime in a thread inside the namespace (its sockets are
    /// made there).
    fn block_on<F, Fut, T>(&self, f: F) -> T
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
        T: Send + 'static,
    {
        let ns = std::fs::File::open(&self.netns).unwrap();
        std::thread::spawn(move || {
            setns(&ns, CloneFlags::CLONE_NEWNET).expect("setns");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(f())
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let cp = self.dir.join("cp");
        if cp.exists() {
            let _ = Command::new(control_plane_script()).arg("stop").arg(&cp).status();
        }
        let _ = umount2(&self.netns, MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A kubeconfig for `subject` with a v3 client certificate signed by the cluster CA.
fn client_kubeconfig(dir: &Path, server: &str, ca: &str, name: &str, subject: &str) -> PathBuf {
    let ca_key = Path::new(ca).with_extension("key");
    let f = |ext: &str| dir.join(format!("{name}.{ext}"));
    std::fs::write(
        f("ext"),
        "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n",
    )
    .unwrap();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let p = |ext: &str| f(ext).to_str().unwrap().to_string();
    openssl(&[
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &p("key"),
        "-subj",
        subject,
        "-out",
        &p("csr"),
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        &p("csr"),
        "-CA",
        ca,
        "-CAkey",
        ca_key.to_str().unwrap(),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        &p("ext"),
        "-out",
        &p("crt"),
    ]);
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: '{server}', certificate-authority: '{ca}'}}\n\
         users:\n- name: u\n  user: {{client-certificate: '{}', client-key: '{}'}}\n\
         contexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
        p("crt"),
        p("key")
    );
    std::fs::write(f("kubeconfig"), kubeconfig).unwrap();
    f("kubeconfig")
}

fn skip_reason() -> Option<String> {
    if !control_plane_script().exists() {
        return Some(format!("{} is missing", control_plane_script().display()));
    }
    if !nix::unistd::geteuid().is_root() {
        return Some("not root (network namespaces and the control plane need it)".into());
    }
    None
}

/// A static pod as the file source hands it on.
fn static_pod(yaml: &str) -> Pod {
    let mut p = manifest::decode(yaml).unwrap().remove(0);
    manifest::apply_static_identity(
        &mut p,
        &manifest::Source::File("/etc/kubernetes/manifests/x.yaml".into()),
        NODE,
    );
    pod::defaults::apply(&mut p);
    p
}

const WEB: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\nspec:\n  containers:\n  - name: c\n    image: busybox\n    command: [sleep, '3600']\n";

async fn until<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn events_about(admin: &Kube, ns: &str, name: &str) -> Vec<Event> {
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    Api::<Event>::namespaced(admin.client(), ns)
        .list(&lp)
        .await
        .unwrap()
        .items
}

async fn events(admin: Kube, node: Kube) {
    let rec = Recorder::cluster(node, NODE, 50, 100);
    let p = static_pod(WEB);
    // The same event three times: one object, count 3.
    for _ in 0..3 {
        rec.pod(&p, Some("c"), Kind::Normal, "Started", "Started container c");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let name = pod::name(&p).to_string();
    let started = until("Started counted to 3", || {
        let (admin, name) = (admin.clone(), name.clone());
        async move {
            let evs = events_about(&admin, "default", &name).await;
            evs.into_iter()
                .find(|e| e.reason.as_deref() == Some("Started") && e.count == Some(3))
        }
    })
    .await;
    assert_eq!(started.involved_object.kind.as_deref(), Some("Pod"));
    assert_eq!(started.involved_object.uid.as_deref(), Some(pod::uid(&p)));
    assert_eq!(
        started.involved_object.field_path.as_deref(),
        Some("spec.containers{c}")
    );
    assert_eq!(started.source.as_ref().unwrap().host.as_deref(), Some(NODE));
    assert_eq!(started.reporting_component.as_deref(), Some("kubelet"));
    assert_eq!(started.reporting_instance.as_deref(), Some(NODE));
    assert!(started
        .metadata
        .name
        .as_deref()
        .unwrap()
        .starts_with(&format!("{name}.")));

    // Ten distinct messages of one reason: the tenth is combined.
    for i in 0..10 {
        rec.pod(
            &p,
            Some("c"),
            Kind::Warning,
            "Unhealthy",
            &format!("Liveness probe failed: attempt {i}"),
        );
    }
    until("a combined Unhealthy event", || {
        let (admin, name) = (admin.clone(), name.clone());
        async move {
            let evs = events_about(&admin, "default", &name).await;
            let unhealthy: Vec<_> = evs
                .iter()
                .filter(|e| e.reason.as_deref() == Some("Unhealthy"))
                .collect();
            let combined = unhealthy.iter().any(|e| {
                e.message
                    .as_deref()
                    .is_some_and(|m| m.starts_with("(combined from similar events): "))
            });
            (combined && unhealthy.len() == 10 && unhealthy.iter().all(|e| e.type_.as_deref() == Some("Warning")))
                .then_some(())
        }
    })
    .await;

    // A node event: kind Node, its name as UID, in the default namespace.
    rec.node(
        Kind::Normal,
        "NodeReady",
        &format!("Node {NODE} status is now: NodeReady"),
    );
    let ev = until("the NodeReady event", || {
        let admin = admin.clone();
        async move { events_about(&admin, "default", NODE).await.into_iter().next() }
    })
    .await;
    assert_eq!(ev.involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(ev.involved_object.uid.as_deref(), Some(NODE));
    assert_eq!(rec.dropped(), 0);
}

async fn mirrors(admin: Kube, node: Kube) {
    let m = MirrorPods::new(node, NODE);
    let pods: Api<Pod> = Api::namespaced(admin.client(), "default");
    let p = static_pod(WEB);
    let name = pod::name(&p).to_string();

    // Created, owned by the Node, with the hash; a second ensure changes nothing.
    let uid1 = m.ensure(&p).await.unwrap().expect("a mirror pod");
    let api = pods.get(&name).await.unwrap();
    assert_eq!(pod::uid(&api), uid1);
    assert!(mirror::is_mirror_of(&api, &p));
    let owner = &api.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("Node", NODE, Some(true))
    );
    assert_eq!(m.ensure(&p).await.unwrap().as_deref(), Some(uid1.as_str()));
    let listed = m.list().await.unwrap();
    assert_eq!(
        listed.iter().map(|x| pod::uid(x).to_string()).collect::<Vec<_>>(),
        vec![uid1.clone()]
    );

    // Deleted by a user: back at the next ensure.
    pods.delete(
        &name,
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let uid2 = until("the mirror pod back", || {
        let m = m.clone();
        let p = p.clone();
        async move { m.ensure(&p).await.ok().flatten() }
    })
    .await;
    assert_ne!(uid2, uid1);

    // The static pod changed (a new hash): the outdated mirror is replaced.
    let p2 = static_pod(&WEB.replace("'3600'", "'3601'"));
    assert_ne!(pod::uid(&p2), pod::uid(&p));
    let uid3 = until("the replaced mirror pod", || {
        let m = m.clone();
        let p2 = p2.clone();
        async move { m.ensure(&p2).await.ok().flatten() }
    })
    .await;
    assert_ne!(uid3, uid2);
    assert!(mirror::is_mirror_of(&pods.get(&name).await.unwrap(), &p2));

    // NodeRestriction refuses a mirror that references a secret: no mirror, no error.
    let secret = static_pod(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: sec\nspec:\n  containers:\n  - name: c\n    image: busybox\n  volumes:\n  - name: s\n    secret:\n      secretName: top\n",
    );
    assert_eq!(m.ensure(&secret).await.unwrap(), None);
    assert!(pods.get_opt(pod::name(&secret)).await.unwrap().is_none());

    // Orphans: a mirror whose static pod is kept stays, the others go.
    let keep: HashSet<String> = [mirror::full_name(&p2)].into();
    assert_eq!(m.delete_orphans(&keep).await.unwrap(), 0);
    assert_eq!(m.delete_orphans(&HashSet::new()).await.unwrap(), 1);
    until("the orphan gone", || {
        let m = m.clone();
        async move { m.list().await.unwrap().is_empty().then_some(()) }
    })
    .await;
}

#[test]
fn events_and_mirror_pods_against_a_real_api_server() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIPPED events_and_mirror_pods_against_a_real_api_server: {why}");
        return;
    }
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let c = Cluster::start();
    let (admin_kc, node_kc) = (c.admin.clone(), c.node_kubeconfig.clone());
    c.block_on(move || async move {
        let admin = Kube::from_kubeconfig(&admin_kc).await.unwrap();
        let node = Kube::from_kubeconfig(&node_kc).await.unwrap();
        events(admin.clone(), node.clone()).await;
        mirrors(admin, node).await;
    });
}
