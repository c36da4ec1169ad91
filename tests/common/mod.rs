//! A real agent per test: `ferrolet run` as a child process with its own root dir, manifest
//! dir and a cgroup nested under this process's own; pods are read back over the agent's unix
//! socket. Dropping the handle stops the agent, runs `ferrolet reset` and removes everything,
//! pass or fail.

#![allow(dead_code)]

pub mod cluster;
pub mod net;
pub mod registry;
pub mod systemd;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferrolet_runtime::cgroups::{Cgroups, NestedRoot};
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_ferrolet");

pub struct Agent {
    pub name: String,
    pub dir: PathBuf,
    pub root: PathBuf,
    pub manifests: PathBuf,
    pub logs: PathBuf,
    pub cgroup: NestedRoot,
    pub args: Vec<String>,
    /// More KubeletConfiguration fields (YAML lines) for this agent.
    pub extra_config: String,
    child: Option<Child>,
    /// Run in the pid namespace of this process (the PID 1 of a [`systemd::SystemdMachine`],
    /// as this machine numbers it), with a /proc of that namespace.
    pidns_leader: Option<u32>,
    /// The agent's pid when `child` is the nsenter that started it there.
    agent_pid: Option<u32>,
    pub node: String,
    /// Start the agent inside its own cgroup (the test's nested root) and let it pick its
    /// default cgroup root there, instead of passing --cgroup-root.
    own_cgroup: bool,
    /// The network namespace the agent (and its `reset`) runs in, and its `--network`.
    netns: Option<PathBuf>,
    network: String,
    /// More environment for the agent process.
    pub env: Vec<(String, String)>,
    /// The agent's stderr is a pipe whose reading end is closed at once (every log write fails).
    stderr_closed: bool,
    /// The root dir is a tmpfs the test mounted before the agent started (unmounted on drop).
    root_on_tmpfs: bool,
}

/// Whether the KubeletConfiguration lines `config` set top-level field `name`.
pub fn has_field(config: &str, name: &str) -> bool {
    config
        .lines()
        .any(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(':')))
}

/// A TCP port free on this machine right now, handed out once per test process.
///
/// The port comes from below the kernel's ephemeral range: a port the kernel picked for
/// `bind(:0)` goes back into the pool the moment the probe closes, and any outgoing
/// connection (the agent's own, another test's client) may take it before the agent binds
/// it. Below the range only an explicit bind can take it, and the counter never hands the
/// same one out twice in a process.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    // Leave the well-known ports and the kubelet's own (10250-10255) alone.
    let (first, span) = (20000u32, low.saturating_sub(20000));
    if span < 1000 {
        return std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
    }
    // Processes that run at once (test binaries, a bench) start at different places.
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let port = (first + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok()
            && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free port in {first}..{}", first + span)
}

/// Make `cmd` enter the network namespace pinned at `ns` before exec.
pub fn enter_netns(cmd: &mut Command, ns: &Path) {
    use std::os::fd::{AsRawFd, IntoRawFd};
    use std::os::unix::process::CommandExt;
    let fd = std::fs::File::open(ns).expect("open netns").into_raw_fd();
    // SAFETY: setns on an fd opened above; nothing else between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the agent tests run real pods and need root"
    );
}

impl Agent {
    /// Start an agent; `extra` are more `ferrolet run` flags.
    pub fn start(name: &str, extra: &[&str]) -> Agent {
        Agent::start_with_config(name, extra, "")
    }

    /// An agent started inside a cgroup of its own, with no --cgroup-root: it uses its own
    /// cgroup (on v2 moving itself into a leaf first).
    pub fn start_in_own_cgroup(name: &str) -> Agent {
        Agent::build(name, &[], "", true)
    }

    pub fn start_with_config(name: &str, extra: &[&str], config: &str) -> Agent {
        Agent::build(name, extra, config, false)
    }

    /// An agent inside the test network namespace `ns` with pod network `network`
    /// (bridge, cni or none).
    pub fn start_in_netns(name: &str, ns: &Path, network: &str, extra: &[&str], config: &str) -> Agent {
        Agent::prepare(name, extra, config, false, Some(ns.to_path_buf()), network, Vec::new()).started()
    }

    /// Like [`Agent::start_in_netns`], with flags and more environment for the agent.
    pub fn start_in_netns_with(
        name: &str,
        ns: &Path,
        network: &str,
        extra: &[&str],
        config: &str,
        env: Vec<(String, String)>,
    ) -> Agent {
        Agent::prepare(name, extra, config, false, Some(ns.to_path_buf()), network, env).started()
    }

    /// Like [`Agent::start_in_netns`], with more environment for the agent.
    pub fn start_in_netns_env(name: &str, ns: &Path, network: &str, config: &str, env: Vec<(String, String)>) -> Agent {
        Agent::prepare(name, &[], config, false, Some(ns.to_path_buf()), network, env).started()
    }

    fn build(name: &str, extra: &[&str], config: &str, own_cgroup: bool) -> Agent {
        Agent::prepare(name, extra, config, own_cgroup, None, "none", Vec::new()).started()
    }

    /// An agent whose root dir is a tmpfs of its own, mounted before it starts (a node whose
    /// /var/lib is a partition of its own).
    pub fn start_on_tmpfs_root(name: &str, extra: &[&str], config: &str) -> Agent {
        let mut a = Agent::prepare(name, extra, config, false, None, "none", Vec::new());
        std::fs::create_dir_all(&a.root).unwrap();
        mount_tmpfs_of(&a.root, "256m");
        a.root_on_tmpfs = true;
        a.started()
    }

    /// An agent with a configuration and more environment.
    pub fn start_with_config_env(name: &str, config: &str, env: Vec<(String, String)>) -> Agent {
        Agent::prepare(name, &[], config, false, None, "none", env).started()
    }

    /// An agent in the pid namespace of `leader` (a machine's PID 1: systemd-logind there
    /// knows its callers by their pids), with a mount namespace of its own where /proc is that
    /// namespace's, and everything else the machine's host's. It dies with the machine.
    pub fn start_in_pid_namespace_of(name: &str, leader: u32, config: &str, env: Vec<(String, String)>) -> Agent {
        let mut a = Agent::prepare(name, &[], config, false, None, "none", env);
        a.pidns_leader = Some(leader);
        a.started()
    }

    /// An agent set up with more environment but not started: write its manifests, then
    /// [`Agent::boot`] it.
    pub fn unstarted_with_env(name: &str, env: Vec<(String, String)>) -> Agent {
        Agent::prepare(name, &[], "", false, None, "none", env)
    }

    /// Start the agent [`Agent::prepare`] set up; returns once it answers /healthz.
    fn started(mut self) -> Agent {
        self.spawn();
        self
    }

    fn prepare(
        name: &str,
        extra: &[&str],
        config: &str,
        own_cgroup: bool,
        netns: Option<PathBuf>,
        network: &str,
        env: Vec<(String, String)>,
    ) -> Agent {
        require_root();
        let dir = std::env::temp_dir().join(format!("ferrolet-it-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("manifests")).unwrap();
        let cgroups = Cgroups::detect().expect("cgroups");
        let cgroup = NestedRoot::create(&cgroups, &format!("ferrolet-it-{name}-{}", std::process::id()))
            .expect("nested cgroup root");
        Agent {
            name: name.to_string(),
            root: dir.join("root"),
            manifests: dir.join("manifests"),
            logs: dir.join("logs"),
            dir,
            cgroup,
            args: extra.iter().map(|s| s.to_string()).collect(),
            extra_config: config.to_string(),
            child: None,
            pidns_leader: None,
            agent_pid: None,
            own_cgroup,
            node: format!("node-{name}"),
            netns,
            network: network.to_string(),
            env,
            stderr_closed: false,
            root_on_tmpfs: false,
        }
    }

    /// The listeners' settings the test did not set: loopback, no read-only port, and free
    /// ports for the kubelet API and healthz (tests run many agents at once on one machine, or in one
    /// namespace where each node has an address of its own and keeps kubelet's ports).
    fn default_ports(&self) -> String {
        let mut out = String::new();
        if !has_field(&self.extra_config, "readOnlyPort") {
            out.push_str("readOnlyPort: 0\n");
        }
        if !has_field(&self.extra_config, "evictionHard") {
            // The test machine's own disk must not put every test agent under DiskPressure
            // (kubelet's nodefs/imagefs defaults are percentages of the host's filesystem):
            // tests that exercise eviction set their own thresholds.
            out.push_str("evictionHard:\n  memory.available: 100Mi\n");
        }
        let own_address = has_field(&self.extra_config, "address");
        if !own_address {
            // kubelet's default is every address; a test agent on the machine's own network
            // listens on loopback only
            out.push_str("address: 127.0.0.1\n");
        }
        if !has_field(&self.extra_config, "port") && !own_address {
            out.push_str(&format!("port: {}\n", free_port()));
        }
        if !has_field(&self.extra_config, "healthzPort") && !own_address {
            out.push_str(&format!("healthzPort: {}\n", free_port()));
        }
        out
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .unwrap();
        let config = self.dir.join("kubelet.yaml");
        if !config.exists() {
            std::fs::write(
                &config,
                format!(
                    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: {}\n{}{}",
                    self.logs.display(),
                    self.default_ports(),
                    self.extra_config
                ),
            )
            .unwrap();
        }
        let mut cmd = match self.pidns_leader {
            Some(leader) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--target={leader}"))
                    .args(["--pid", "--", "unshare", "--mount", "--mount-proc", BIN]);
                c
            }
            None => Command::new(BIN),
        };
        cmd.arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--pod-manifest-path")
            .arg(&self.manifests)
            .arg("--root-dir")
            .arg(&self.root);
        if self.own_cgroup {
            // The child moves itself into the nested root in every hierarchy before exec.
            let dirs = Cgroups::detect().unwrap().all_dirs(self.cgroup.path());
            move_into_cgroups_before_exec(&mut cmd, &dirs);
        } else {
            cmd.arg("--cgroup-root").arg(self.cgroup.path());
        }
        cmd.arg("--hostname-override")
            .arg(&self.node)
            .arg("--file-check-frequency")
            .arg("2s")
            .arg("--sync-frequency")
            .arg("10s")
            .arg("--network")
            .arg(&self.network)
            .arg("--initial-container-restart-period")
            .arg("1s")
            // The containers' log links in the test's directory, not the machine's
            // /var/log/containers.
            .arg("--container-log-link-dir")
            .arg(self.dir.join("log-links"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap());
        if self.stderr_closed {
            cmd.stderr(Stdio::piped());
        } else {
            cmd.stderr(log);
        }
        cmd.env("RUST_LOG", "ferrolet=debug,ferrolet_runtime=info,ferrolet_netplug=info");
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(ns) = &self.netns {
            enter_netns(&mut cmd, ns);
        }
        let mut child = cmd.spawn().expect("spawn ferrolet");
        // Dropping the reading end: the agent's writes to stderr fail with EPIPE from now on.
        drop(child.stderr.take());
        self.agent_pid = None;
        if self.pidns_leader.is_some() {
            // nsenter's one child, which became the agent.
            let n = child.id();
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.agent_pid.is_none() {
                assert!(Instant::now() < deadline, "nsenter started no agent");
                self.agent_pid = std::fs::read_to_string(format!("/proc/{n}/task/{n}/children"))
                    .ok()
                    .and_then(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()));
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        // Generous: the cgroup v2 lane's guest runs under software emulation, beside the host's
        // tests, and its agents took over 20 s to come up there.
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if self.get("/healthz").is_ok() {
                return;
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("agent exited early ({st}):\n{}", self.agent_log());
                }
            }
            assert!(
                Instant::now() < deadline,
                "agent did not come up:\n{}",
                self.agent_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A directory of the test's, for hostPath volumes (created).
    pub fn host_dir(&self) -> PathBuf {
        let d = self.dir.join("host");
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    pub fn pid(&self) -> u32 {
        self.agent_pid
            .or_else(|| self.child.as_ref().map(|c| c.id()))
            .unwrap_or(0)
    }

    /// Continue the nsenter that started the agent in a machine's pid namespace: it stops
    /// itself when it sees the agent stopped (systemd's final kill stops every process of the
    /// machine, then continues them), and the machine's SIGCONT never reaches it outside; a
    /// stopped nsenter would never reap the agent, and the machine would wait for it.
    pub fn continue_launcher(&self) {
        if let (Some(c), Some(_)) = (&self.child, self.agent_pid) {
            // (not reaped yet: the pid is still nsenter's)
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::SIGCONT);
        }
    }

    /// Signal the agent itself (not the nsenter that started it in a machine's namespace).
    fn signal_agent(&self, sig: nix::sys::signal::Signal) {
        if let Some(p) = self.agent_pid {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p as i32), sig);
        }
    }

    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }

    pub fn socket(&self) -> PathBuf {
        self.root.join("ferrolet.sock")
    }

    /// A GET over the agent's unix socket (HTTP/1.0, whole body).
    pub fn get(&self, path: &str) -> Result<(u16, Vec<u8>), String> {
        let mut s = UnixStream::connect(self.socket()).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(20))).ok();
        write!(s, "GET {path} HTTP/1.0\r\nHost: ferrolet\r\n\r\n").map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).map_err(|e| e.to_string())?;
        let split = buf.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no header end")?;
        let head = String::from_utf8_lossy(&buf[..split]).to_string();
        let code: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or("bad status line")?;
        Ok((code, buf[split + 4..].to_vec()))
    }

    pub fn pods(&self) -> Vec<Pod> {
        let (_, body) = self.get("/pods").expect("GET /pods");
        let v: Value = serde_json::from_slice(&body).expect("PodList json");
        assert_eq!(v["kind"], "PodList");
        serde_json::from_value(v["items"].clone()).unwrap()
    }

    pub fn ferrolet_pods(&self) -> Value {
        let (_, body) = self.get("/ferrolet/pods").expect("GET /ferrolet/pods");
        serde_json::from_slice(&body).unwrap()
    }

    /// The static pod for manifest pod name `name`.
    pub fn pod(&self, name: &str) -> Option<Pod> {
        let full = format!("{name}-{}", self.node);
        self.pods()
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(&full))
    }

    pub fn write(&self, file: &str, yaml: &str) {
        // Written aside and renamed in, as a careful operator (or config tool) would.
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(&tmp, self.manifests.join(file)).unwrap();
    }

    pub fn remove(&self, file: &str) {
        std::fs::remove_file(self.manifests.join(file)).unwrap();
    }

    /// Wait until `f` holds for the pod `name` (Some) or its absence (None).
    pub fn wait_pod(&self, name: &str, what: &str, timeout: Duration, f: impl Fn(Option<&Pod>) -> bool) -> Option<Pod> {
        let deadline = Instant::now() + timeout;
        loop {
            let p = self.pod(name);
            if f(p.as_ref()) {
                return p;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out after {timeout:?} waiting for pod {name}: {what}\nlast seen: {}\n--- agent log (tail) ---\n{}",
                    serde_json::to_string_pretty(&p.as_ref().map(|p| &p.status)).unwrap(),
                    tail(&self.agent_log(), 40)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Wait until the pod exists and `f` holds for it.
    pub fn wait_for(&self, name: &str, what: &str, timeout: Duration, f: impl Fn(&Pod) -> bool) -> Pod {
        self.wait_pod(name, what, timeout, |p| p.is_some_and(&f)).unwrap()
    }

    pub fn wait_gone(&self, name: &str, timeout: Duration) {
        self.wait_pod(name, "gone", timeout, |p| p.is_none());
    }

    pub fn wait_phase(&self, name: &str, phase: &str, timeout: Duration) -> Pod {
        self.wait_pod(name, &format!("phase {phase}"), timeout, |p| phase_of(p) == Some(phase))
            .unwrap()
    }

    pub fn logs(&self, pod: &str, query: &str) -> String {
        let (code, body) = self
            .get(&format!("/ferrolet/logs/default/{pod}-{}?{query}", self.node))
            .expect("logs");
        let s = String::from_utf8_lossy(&body).to_string();
        assert_eq!(code, 200, "logs: {s}");
        s
    }

    /// The pod's logs once they contain `needle`: a container that runs has not always
    /// written its first line yet.
    pub fn wait_logs(&self, pod: &str, query: &str, needle: &str) -> String {
        self.wait_logs_for(pod, query, needle, |l| l.contains(needle))
    }

    /// The pod's logs once `f` holds of them (60 s at most); `what` names the wait.
    pub fn wait_logs_for(&self, pod: &str, query: &str, what: &str, f: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let l = self.logs(pod, query);
            if f(&l) {
                return l;
            }
            assert!(
                Instant::now() < deadline,
                "{pod}: {what} never came; logs:\n{}\nagent:\n{}",
                tail(&l, 20),
                tail(&self.agent_log(), 30)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Run the `ferrolet` CLI against this agent.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        // --root-dir right after the subcommand: anything after `--` belongs to the command.
        Command::new(BIN)
            .arg(args[0])
            .arg("--root-dir")
            .arg(&self.root)
            .args(&args[1..])
            .output()
            .expect("run ferrolet")
    }

    pub fn kill9(&mut self) {
        self.signal_agent(nix::sys::signal::Signal::SIGKILL);
        if let Some(mut c) = self.child.take() {
            c.kill().ok();
            c.wait().ok();
        }
    }

    /// kill -9, then start again with this environment.
    pub fn restart_with_env(&mut self, env: Vec<(String, String)>) {
        self.kill9();
        self.env = env;
        self.spawn();
    }

    /// Wait until the agent's log contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.agent_log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "agent log never said {needle:?}:\n{}",
                tail(&self.agent_log(), 40)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// A power cut and a boot, as far as this node can tell: the agent killed, every process
    /// of its containers killed (monitors first, by the pids and start times they recorded;
    /// then everything in the node's cgroups), the node's cgroups removed, every mount under
    /// the agent's directories unmounted (overlays, volumes, namespace pins, /dev/shm), and the
    /// runtime's and sandboxes' records marked as written in another boot. What is on disk
    /// stays. The agent is not started again.
    pub fn simulate_power_cut(&mut self) {
        self.kill9();
        for record in dirs_in(&self.root.join("containers")) {
            let Ok(m) = std::fs::read(record.join("monitor.json")) else {
                continue;
            };
            let Ok(m) = serde_json::from_slice::<Value>(&m) else {
                continue;
            };
            if let (Some(pid), Some(start)) = (m["monitorPid"].as_i64(), m["monitorStart"].as_u64()) {
                if ferrolet_runtime::pidfd::process_start_time(pid as i32) == Some(start) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        let cgroups = Cgroups::detect().unwrap();
        let tree: Vec<PathBuf> = cgroups.all_dirs(self.cgroup.path());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut alive = 0;
            for top in &tree {
                for dir in cgroup_tree(top) {
                    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                        alive += 1;
                        let _ =
                            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                    }
                }
            }
            if alive == 0 {
                break;
            }
            assert!(Instant::now() < deadline, "the node's processes did not die");
            std::thread::sleep(Duration::from_millis(50));
        }
        for top in &tree {
            // Deepest first; the nested root itself stays (the agent is started in it again).
            let mut dirs = cgroup_tree(top);
            dirs.retain(|d| d != top);
            dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for d in dirs {
                let _ = std::fs::remove_dir(&d);
            }
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mut mounts: Vec<PathBuf> = mountinfo
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(|m| PathBuf::from(m.replace("\\040", " ")))
            .filter(|m| m.starts_with(&self.dir) && !(self.root_on_tmpfs && *m == self.root))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
        for m in mounts {
            let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
        }
        let records = dirs_in(&self.root.join("containers"))
            .into_iter()
            .map(|d| d.join("container.json"))
            .chain(
                dirs_in(&self.root.join("pods"))
                    .into_iter()
                    .map(|d| d.join("sandbox.json")),
            );
        for file in records {
            let Ok(data) = std::fs::read(&file) else { continue };
            let mut v: Value = serde_json::from_slice(&data).unwrap();
            if v.get("bootId").is_some() {
                v["bootId"] = "00000000-0000-0000-0000-simulated-old".into();
                std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
            }
        }
    }

    /// Start the agent again after [`Agent::simulate_power_cut`].
    pub fn boot(&mut self) {
        self.spawn();
    }

    /// Start the agent again once the machine whose pid namespace it ran in is gone (it died
    /// with it): in this machine's pid namespace, with `env`.
    pub fn boot_after_its_machine(&mut self, env: Vec<(String, String)>) {
        if let Some(mut c) = self.child.take() {
            // The nsenter that started it (ended with the machine, or about to).
            stop_child(&mut c, Duration::from_secs(10));
        }
        self.pidns_leader = None;
        self.env = env;
        self.spawn();
    }

    /// Restart the agent (kill -9) with a stderr nobody reads: every log line fails to write.
    pub fn restart_with_closed_stderr(&mut self) {
        self.kill9();
        self.stderr_closed = true;
        self.spawn();
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if self.agent_pid.is_some() {
                // nsenter waits for the agent and forwards no signal.
                self.signal_agent(nix::sys::signal::Signal::SIGTERM);
                let deadline = Instant::now() + Duration::from_secs(10);
                while !matches!(c.try_wait(), Ok(Some(_))) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                self.signal_agent(nix::sys::signal::Signal::SIGKILL);
            }
            stop_child(&mut c, Duration::from_secs(10));
        }
    }
}

impl Agent {
    /// `ferrolet reset` on this agent's root dir (in its network namespace).
    pub fn reset(&self) -> std::io::Result<std::process::Output> {
        let mut reset = Command::new(BIN);
        reset.arg("reset").arg("--root-dir").arg(&self.root);
        if let Some(ns) = &self.netns {
            enter_netns(&mut reset, ns);
        }
        reset.output()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
        let out = self.reset();
        if let Ok(o) = &out {
            if !o.status.success() {
                eprintln!("reset failed: {}", String::from_utf8_lossy(&o.stderr));
            }
        }
        if let Err(e) = self.cgroup.cleanup() {
            eprintln!("cgroup cleanup: {e}");
        }
        if self.root_on_tmpfs {
            let _ = nix::mount::umount2(&self.root, nix::mount::MntFlags::MNT_DETACH);
        }
        if std::thread::panicking() {
            eprintln!("--- agent log of {} ---\n{}", self.name, tail(&self.agent_log(), 60));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The directories in `dir` (none when it is missing).
fn dirs_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect())
        .unwrap_or_default()
}

/// `top` and every cgroup below it.
fn cgroup_tree(top: &Path) -> Vec<PathBuf> {
    let mut out = vec![top.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let below = dirs_in(&out[i]);
        out.extend(below);
        i += 1;
    }
    out
}

/// Say that a test is skipped where the run's output shows it: straight to stderr, past the
/// test harness's capture (which hides eprintln! of passing tests).
pub fn skip_loudly(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n!!! {test} SKIPPED: {why} !!!\n");
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

pub fn phase_of(p: Option<&Pod>) -> Option<&str> {
    p?.status.as_ref()?.phase.as_deref()
}

pub fn try_container_status<'a>(p: &'a Pod, name: &str) -> Option<&'a k8s_openapi::api::core::v1::ContainerStatus> {
    let st = p.status.as_ref()?;
    st.container_statuses
        .iter()
        .flatten()
        .chain(st.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
}

pub fn container_status<'a>(p: &'a Pod, name: &str) -> &'a k8s_openapi::api::core::v1::ContainerStatus {
    try_container_status(p, name).unwrap_or_else(|| panic!("no status for container {name}"))
}

/// When container `name` of `p` started running, if it runs.
pub fn running_since(p: &Pod, name: &str) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
    container_status(p, name)
        .state
        .as_ref()
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.clone())
}

/// Container `name` of `p` ended OOMKilled with exit code 137, as kubelet reports a container
/// its memory limit killed.
pub fn assert_oom_killed(p: &Pod, name: &str) {
    let t = container_status(p, name)
        .state
        .as_ref()
        .and_then(|s| s.terminated.clone())
        .unwrap_or_else(|| panic!("container {name} has not terminated: {:?}", p.status));
    assert_eq!(
        (t.reason.as_deref(), t.exit_code),
        (Some("OOMKilled"), 137),
        "container {name}"
    );
}

/// The runtime's id of container `name` of `p` (its status's containerID without the
/// `ferrolet://` scheme).
pub fn container_id(p: &Pod, name: &str) -> String {
    let id = container_status(p, name)
        .container_id
        .clone()
        .unwrap_or_else(|| panic!("container {name} has no containerID: {:?}", p.status));
    id.trim_start_matches("ferrolet://").to_string()
}

pub fn waiting_reason(p: &Pod, name: &str) -> Option<String> {
    try_container_status(p, name)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

pub fn waiting_message(p: &Pod, name: &str) -> Option<String> {
    try_container_status(p, name)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .message
        .clone()
}

pub fn restarts(p: &Pod, name: &str) -> i32 {
    try_container_status(p, name).map(|c| c.restart_count).unwrap_or(0)
}

pub fn running(p: &Pod, name: &str) -> bool {
    try_container_status(p, name)
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

pub fn scratch(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::create_dir_all(&p).unwrap();
    p
}

pub const IMAGE: &str = "busybox:1.35";

/// A pod manifest with one container running `script` under `sh -c`.
pub fn pod_yaml(name: &str, restart: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {restart}\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {IMAGE}\n    command: [\"sh\", \"-c\", {script:?}]\n"
    )
}

/// Stop a child this test started: SIGTERM, then SIGKILL when it is still there after `grace`;
/// reaped either way.
pub fn stop_child(c: &mut Child, grace: Duration) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    c.kill().ok();
    c.wait().ok();
}

/// Have `cmd`'s child move itself into the cgroup directories `dirs` (one a hierarchy)
/// between fork and exec, so that it and everything it starts live there from the start.
pub fn move_into_cgroups_before_exec(cmd: &mut Command, dirs: &[PathBuf]) {
    let procs: Vec<std::ffi::CString> = dirs
        .iter()
        .map(|d| std::ffi::CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes()).unwrap())
        .collect();
    use std::os::unix::process::CommandExt;
    // SAFETY: only open/write/close between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for p in &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let r = libc::write(fd, b"0".as_ptr() as *const libc::c_void, 1);
                libc::close(fd);
                if r < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// A libtest-mimic trial of a test function that panics on failure: the panic's message is
/// the failure's.
pub fn trial(name: &'static str, f: fn()) -> libtest_mimic::Trial {
    libtest_mimic::Trial::test(name, move || {
        std::panic::catch_unwind(f).map_err(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            libtest_mimic::Failed::from(msg)
        })
    })
}

/// Run `curl` (a command made by the caller, e.g. in a namespace) on `url` with more `args`;
/// (status, body). Status 0: no HTTP answer.
pub fn curl_with(mut curl: Command, args: &[&str], url: &str) -> (u16, String) {
    let out = curl
        .args(["-sS", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// A small tmpfs mounted at `at` (the caller unmounts it).
pub fn mount_tmpfs(at: &Path) {
    mount_tmpfs_of(at, "1m");
}

/// A tmpfs of `size` (tmpfs's `size=` option) mounted at `at` (the caller unmounts it).
pub fn mount_tmpfs_of(at: &Path, size: &str) {
    nix::mount::mount(
        Some("tmpfs"),
        at,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some(format!("size={size}").as_str()),
    )
    .unwrap_or_else(|e| panic!("mounting a tmpfs at {}: {e}", at.display()));
}
