//! A real Kubernetes control plane for cluster-mode tests (../shared/k8s/control-plane: etcd,
//! kube-apiserver, controller-manager, scheduler v1.26.0), started once per test binary inside a
//! network namespace of the test's own, with the nodes (agents) in the same namespace: each node
//! has its own address on the namespace's uplink, so the API server reaches its kubelet port and
//! nothing touches the machine's network. Dropping the cluster stops everything and removes it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::net::TestNet;
use super::Agent;

/// The control-plane script, when this checkout has ../shared.
pub fn control_plane_script() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/k8s/control-plane");
    p.exists().then(|| p.canonicalize().unwrap_or(p))
}

pub struct Cluster {
    pub net: TestNet,
    /// The control plane's state directory.
    pub dir: PathBuf,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    pub bootstrap_kubeconfig: PathBuf,
    pub apiserver: String,
    /// The cluster CA (PEM): the API server's client certificate for kubelets chains to it.
    pub ca: PathBuf,
    script: PathBuf,
    nodes: AtomicU32,
    /// The controller-manager's pid and command line, to start it again when it dies.
    controller_manager: std::sync::Mutex<(i32, Vec<String>)>,
    /// Held while the control plane signs a node certificate (see `node_kubeconfig`).
    signing: std::sync::Mutex<()>,
}

impl Cluster {
    /// Start a control plane, or None (after a loud notice) when ../shared is missing.
    pub fn start() -> Option<Cluster> {
        let Some(script) = control_plane_script() else {
            eprintln!(
                "\n!!! SKIPPING the cluster tests: ../shared/k8s/control-plane is missing in this checkout !!!\n"
            );
            return None;
        };
        let net = TestNet::create("k8s");
        let dir = net.dir.join("control-plane");
        let out = net
            .command("bash")
            .arg(&script)
            .arg("start")
            .arg(&dir)
            .output()
            .expect("running control-plane start");
        if !out.status.success() {
            let _ = net.command("bash").arg(&script).arg("stop").arg(&dir).output();
            panic!(
                "control-plane start failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let env = String::from_utf8_lossy(&out.stdout).into_owned();
        let get = |k: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .map(|v| v.trim_matches(|c| c == '"' || c == '\'').to_string())
                .unwrap_or_else(|| panic!("control-plane start printed no {k}:\n{env}"))
        };
        let c = Cluster {
            kubeconfig: PathBuf::from(get("KUBECONFIG")),
            bootstrap_kubeconfig: PathBuf::from(get("K8S_BOOTSTRAP_KUBECONFIG")),
            apiserver: get("K8S_APISERVER"),
            ca: PathBuf::from(get("K8S_CA")),
            dir,
            net,
            script,
            nodes: AtomicU32::new(0),
            controller_manager: std::sync::Mutex::new((0, Vec::new())),
            signing: std::sync::Mutex::new(()),
        };
        let cm = c
            .component("kube-controller-manager")
            .expect("no kube-controller-manager among the control plane's processes");
        *c.controller_manager.lock().unwrap() = cm;
        Some(c)
    }

    /// `kubectl ARGS` as the cluster admin, inside the namespace.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.net
            .command("kubectl")
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .output()
            .expect("running kubectl")
    }

    /// `kubectl ARGS`, which must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl ARGS` with stdin.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> String {
        use std::io::Write;
        let mut child = self
            .net
            .command("kubectl")
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("running kubectl");
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of a YAML text.
    pub fn apply(&self, yaml: &str) {
        self.kubectl_stdin(&["apply", "-f", "-"], yaml);
    }

    /// An object as JSON (`kubectl get KIND NAME -o json`), or None when it does not exist.
    pub fn get_json(&self, args: &[&str]) -> Option<Value> {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        let out = self.kubectl(&a);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("NotFound"), "kubectl {}: {err}", a.join(" "));
            return None;
        }
        Some(serde_json::from_slice(&out.stdout).expect("kubectl json"))
    }

    /// A kubeconfig with a client certificate for system:node:NODE.
    ///
    /// Calls are serialized: the script signs with `openssl x509 -CAcreateserial`, which reads
    /// and rewrites the CA's serial file, and two signings at once fail with nothing on stderr.
    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        let _one_at_a_time = self.signing.lock().unwrap_or_else(|e| e.into_inner());
        let out = Command::new("bash")
            .arg(&self.script)
            .arg("node-kubeconfig")
            .arg(&self.dir)
            .arg(node)
            .output()
            .expect("control-plane node-kubeconfig");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    }

    /// The next node's address in the namespace (the first node gets .11).
    fn node_ip(&self) -> (u32, String) {
        let n = self.nodes.fetch_add(1, Ordering::SeqCst) + 1;
        let ip = format!("198.51.100.{}", 10 + n);
        self.net.ip(&["addr", "add", &format!("{ip}/24"), "dev", "node0"]);
        (n, ip)
    }

    /// Start a node named `node-NAME` with the node credential the control plane issues.
    pub fn node(&self, name: &str) -> Agent {
        let kc = self.node_kubeconfig(&format!("node-{name}"));
        self.node_with(name, &["--kubeconfig", kc.to_str().unwrap()], "")
    }

    /// Start a node named `node-NAME` with more flags and config (YAML lines): each node has
    /// its own address and pod bridge.
    pub fn node_with(&self, name: &str, flags: &[&str], config: &str) -> Agent {
        self.node_with_env(name, flags, config, Vec::new())
    }

    /// [`Cluster::node_with`] with more environment for the agent.
    pub fn node_with_env(&self, name: &str, flags: &[&str], config: &str, env: Vec<(String, String)>) -> Agent {
        // A node needs the controller-manager for its pod CIDR.
        self.ensure_controller_manager();
        let (n, ip) = self.node_ip();
        let mut args = vec!["--node-ip", ip.as_str()];
        args.extend_from_slice(flags);
        // The nodes share the machine's disk with everything else: the disk pressure they
        // report (and the scheduler heeds) is about their own thresholds, not the machine's.
        // The kubelet API listens on the node's own address, as a kubelet on a machine of its
        // own, and trusts the cluster CA: the API server's proxy (logs, exec, port-forward,
        // stats) presents the apiserver-kubelet-client certificate.
        let mut serving = format!("address: {ip}\nhealthzBindAddress: {ip}\n");
        if !super::has_field(config, "authentication") {
            serving.push_str(&format!(
                "authentication:\n  x509:\n    clientCAFile: {}\n",
                self.ca.display()
            ));
        }
        let config = format!(
            "evictionHard:\n  memory.available: 100Mi\n  nodefs.available: \"1%\"\nferrolet:\n  bridgeName: flk{n}\n{serving}{config}"
        );
        Agent::start_in_netns_with(name, &self.net.path, "bridge", &args, &config, env)
    }

    /// Wait until `f` holds, or panic saying `what`.
    pub fn wait(&self, what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        while !f() {
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The live control-plane process whose program ends with `binary`: (pid, command line).
    /// A process that died (a zombie nobody reaps) has no command line and is not found.
    fn component(&self, binary: &str) -> Option<(i32, Vec<String>)> {
        let pids = std::fs::read_to_string(self.dir.join("pids")).expect("control-plane pids");
        pids.lines().filter_map(|l| l.trim().parse::<i32>().ok()).find_map(|p| {
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            args.first().is_some_and(|a| a.ends_with(binary)).then_some((p, args))
        })
    }

    /// Start a control-plane process again with `args` in the cluster's namespace, its output
    /// appended to `logs/<name>.log`; `old_pid` is replaced by the new one in the pids file.
    fn respawn(&self, name: &str, args: &[String], old_pid: i32) -> i32 {
        use std::os::unix::process::CommandExt;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("logs/{name}.log")))
            .unwrap();
        let mut cmd = Command::new(&args[0]);
        cmd.args(&args[1..])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0);
        super::enter_netns(&mut cmd, &self.net.path);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("restarting {name}: {e}"));
        let new_pid = child.id() as i32;
        let pids = std::fs::read_to_string(self.dir.join("pids")).unwrap();
        let pids: Vec<String> = pids
            .lines()
            .map(|l| {
                if l.trim() == old_pid.to_string() {
                    new_pid.to_string()
                } else {
                    l.to_string()
                }
            })
            .collect();
        std::fs::write(self.dir.join("pids"), pids.join("\n") + "\n").unwrap();
        std::mem::forget(child);
        new_pid
    }

    /// Stop the API server (etcd and the controllers keep running); returns what restarts it.
    pub fn stop_apiserver(&self) -> StoppedApiserver {
        let (p, args) = self
            .component("kube-apiserver")
            .expect("no kube-apiserver among the control plane's processes");
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Path::new(&format!("/proc/{p}")).exists() && Instant::now() < deadline {
            // Reaped by nobody (its parent exited), so look at the state.
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            if stat.split_whitespace().nth(2) == Some("Z") {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        StoppedApiserver { old_pid: p, args }
    }

    /// kube-controller-manager v1.26.0 may die of a nil pointer in its node lifecycle
    /// controller after an API server outage (seen in CI and here): start it again, loudly,
    /// as its systemd unit or static pod would be. Returns whether it had to.
    fn ensure_controller_manager(&self) -> bool {
        let mut cm = self.controller_manager.lock().unwrap();
        if self.component("kube-controller-manager").is_some() {
            return false;
        }
        let log = std::fs::read_to_string(self.dir.join("logs/kube-controller-manager.log")).unwrap_or_default();
        let why = log
            .lines()
            .find(|l| l.starts_with("panic:"))
            .unwrap_or("no panic line in its log");
        eprintln!("\n!!! kube-controller-manager died ({why}); starting it again !!!\n");
        let pid = self.respawn("kube-controller-manager", &cm.1, cm.0);
        cm.0 = pid;
        true
    }

    /// Start the API server stopped by [`Cluster::stop_apiserver`] again, with the same
    /// arguments, and wait until it answers.
    pub fn restart_apiserver(&self, stopped: StoppedApiserver) {
        self.respawn("kube-apiserver", &stopped.args, stopped.old_pid);
        self.wait("the API server to answer again", Duration::from_secs(60), || {
            self.kubectl(&["get", "--raw", "/readyz"]).status.success()
        });
        self.wait_for_controllers();
    }

    /// After an outage the controller-manager's informers come back on their own back-off (its
    /// watches may first be refused while the restarted API server loads its RBAC rules): wait
    /// until it allocates a pod CIDR to a canary Node, so the next test meets the whole control
    /// plane and not a half-recovered one. On time-out, say so with its log's tail.
    fn wait_for_controllers(&self) {
        let canary = format!("canary-{}", std::process::id());
        let node =
            format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {canary}\n  labels:\n    ferrolet-test: canary\n");
        self.kubectl_stdin(&["apply", "-f", "-"], &node);
        let mut deadline = Instant::now() + Duration::from_secs(120);
        let mut restarts = 0;
        let allocated = loop {
            if restarts < 3 && self.ensure_controller_manager() {
                restarts += 1;
                deadline = Instant::now() + Duration::from_secs(120);
            }
            let cidr = self
                .get_json(&["node", &canary])
                .and_then(|n| n["spec"]["podCIDR"].as_str().map(str::to_string));
            if cidr.is_some() || Instant::now() > deadline {
                break cidr.is_some();
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        let _ = self.kubectl(&["delete", "node", &canary, "--wait=false"]);
        if !allocated {
            let log = std::fs::read_to_string(self.dir.join("logs/kube-controller-manager.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "the controller-manager allocated no pod CIDR within 120 s of the API server's return; its log ends:\n{}",
                tail.join("\n")
            );
        }
    }
}

pub struct StoppedApiserver {
    old_pid: i32,
    args: Vec<String>,
}

impl Cluster {
    /// Stop the control plane (the namespace goes with the cluster's network).
    pub fn shutdown(&self) {
        let _ = self
            .net
            .command("bash")
            .arg(&self.script)
            .arg("stop")
            .arg(&self.dir)
            .output();
        self.net.release();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}
