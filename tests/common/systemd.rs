//! A machine with systemd as PID 1, for the graceful node shutdown tests: Debian's systemd
//! booted by systemd-nspawn in a container of its own (its own pid, mount and network
//! namespaces; not registered with any machined) whose root is this machine's root under an
//! overlay with a tmpfs on top, so nothing it writes reaches the disk. It boots a target of
//! the test's that wants only D-Bus and systemd-logind. The agent under test runs outside and
//! talks to the machine's system bus through /proc/<its PID 1>/root; the machine's
//! /etc/systemd/logind.conf.d is reachable the same way. logind knows its callers by their
//! pids, so the agent runs in the machine's pid namespace
//! ([`super::Agent::start_in_pid_namespace_of`]). A shutdown asked inside
//! (`systemctl poweroff`) is real: logind holds it for delay inhibitors, then systemd powers
//! the machine off and systemd-nspawn exits. Dropped: stopped (by pid), unmounted, removed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ferrolet_runtime::cgroups::{Cgroups, NestedRoot};

use super::stop_child;

pub const NSPAWN: &str = "/usr/bin/systemd-nspawn";

const TARGET: &str = "[Unit]
Description=ferrolet's graceful node shutdown test
Wants=dbus.service systemd-logind.service
After=dbus.service systemd-logind.service
";

pub struct SystemdMachine {
    dir: PathBuf,
    name: String,
    /// The machine's cgroup, nested below this test's own as every test's agent is
    /// (`NestedRoot`: never at a hierarchy root): systemd-nspawn makes its payload and
    /// supervisor cgroups under the one it is started in.
    cgroup: NestedRoot,
    nspawn: Option<Child>,
    /// Its PID 1, as this machine numbers it.
    leader: u32,
}

/// The machine's PID 1 among systemd-nspawn's children: the one that is pid 1 in a pid
/// namespace of its own. systemd-nspawn's first child is an intermediate that clones PID 1
/// and exits, so "the first child" can name a process that is about to vanish.
fn machine_pid_1(nspawn_pid: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{nspawn_pid}/task/{nspawn_pid}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|pid: &u32| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .map(|ids| {
                    let ids: Vec<&str> = ids.split_whitespace().collect();
                    ids.len() >= 2 && ids.last() == Some(&"1")
                })
                .unwrap_or(false)
        })
}

impl SystemdMachine {
    /// Boot the machine under `dir`; returns once its logind answers on its bus.
    pub fn boot(dir: &Path, name: &str) -> SystemdMachine {
        assert!(
            Path::new(NSPAWN).exists(),
            "{NSPAWN} is missing: scripts/setup.sh installs systemd-container"
        );
        let (upper, root) = (dir.join("upper"), dir.join("root"));
        for d in [&upper, &root] {
            std::fs::create_dir_all(d).unwrap();
        }
        // A limit, not an allocation: room for a debug build of the agent installed inside.
        super::mount_tmpfs_of(&upper, "1g");
        std::fs::create_dir_all(upper.join("u")).unwrap();
        std::fs::create_dir_all(upper.join("w")).unwrap();
        nix::mount::mount(
            Some("overlay"),
            &root,
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(format!("lowerdir=/,upperdir={0}/u,workdir={0}/w", upper.display()).as_str()),
        )
        .expect("the machine's overlay root");
        let units = root.join("etc/systemd/system");
        std::fs::create_dir_all(&units).unwrap();
        std::fs::write(units.join("ferrolet-test.target"), TARGET).unwrap();
        let cgroups = Cgroups::detect().expect("cgroups");
        let mut me = SystemdMachine {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            cgroup: NestedRoot::create(&cgroups, name).expect("the machine's nested cgroup"),
            nspawn: None,
            leader: 0,
        };
        let log = |n: &str| std::fs::File::create(dir.join(n)).unwrap();
        let mut cmd = Command::new(NSPAWN);
        let dirs = cgroups.all_dirs(me.cgroup.path());
        super::move_into_cgroups_before_exec(&mut cmd, &dirs);
        let child = cmd
            .args(["--quiet", "--register=no", "--keep-unit", "--private-network"])
            .arg(format!("--machine={name}"))
            .arg(format!("--directory={}", root.display()))
            .args(["--boot", "--", "--unit=ferrolet-test.target"])
            .stdin(Stdio::null())
            .stdout(log("console.log"))
            .stderr(log("nspawn.err"))
            .spawn()
            .expect("systemd-nspawn");
        let nspawn_pid = child.id();
        me.nspawn = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if me.leader == 0 {
                me.leader = machine_pid_1(nspawn_pid).unwrap_or(0);
            }
            if me.leader != 0 && me.try_busctl(&["get-property", "InhibitDelayMaxUSec"]).is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the machine's logind did not come up\n{}",
                me.log()
            );
            if let Some(Ok(Some(st))) = me.nspawn.as_mut().map(|c| c.try_wait()) {
                panic!("systemd-nspawn exited ({st})\n{}", me.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        me
    }

    /// Its PID 1, as this machine numbers it.
    pub fn leader(&self) -> u32 {
        self.leader
    }

    /// `DBUS_SYSTEM_BUS_ADDRESS` of the machine's system bus, as seen from outside.
    pub fn bus_address(&self) -> String {
        format!("unix:path=/proc/{}/root/run/dbus/system_bus_socket", self.leader)
    }

    /// The same bus from inside the machine's pid namespace (with its /proc), where the
    /// machine's PID 1 is 1.
    pub fn bus_address_in_its_pid_namespace(&self) -> String {
        "unix:path=/proc/1/root/run/dbus/system_bus_socket".into()
    }

    /// The machine's /etc/systemd/logind.conf.d, as seen from outside.
    pub fn logind_conf_dir(&self) -> PathBuf {
        self.dir.join("root/etc/systemd/logind.conf.d")
    }

    /// busctl's answer about logind's manager: `get-property NAME` or `call METHOD [SIG ARGS]`.
    pub fn try_busctl(&self, args: &[&str]) -> Result<String, String> {
        let (verb, rest) = args.split_first().unwrap();
        let out = Command::new("busctl")
            .arg(format!("--address={}", self.bus_address()))
            .arg(verb)
            .args([
                "org.freedesktop.login1",
                "/org/freedesktop/login1",
                "org.freedesktop.login1.Manager",
            ])
            .args(rest)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    pub fn busctl(&self, args: &[&str]) -> String {
        self.try_busctl(args)
            .unwrap_or_else(|e| panic!("busctl {args:?}: {e}\n{}", self.log()))
    }

    /// logind's InhibitDelayMaxSec now.
    pub fn inhibit_delay_max(&self) -> Duration {
        let v = self.busctl(&["get-property", "InhibitDelayMaxUSec"]);
        Duration::from_micros(v.trim_start_matches("t ").parse().unwrap())
    }

    /// The inhibitor locks, as logind's ListInhibitors answers.
    pub fn inhibitors(&self) -> String {
        self.busctl(&["call", "ListInhibitors"])
    }

    /// The machine's cgroup v1 controller hierarchies made writable. systemd-nspawn mounts
    /// them read-only in a cgroup namespace whose root is the machine's own cgroup (below this
    /// test's), so the writable view still reaches only the machine's subtree: an agent
    /// installed inside can make its pods' cgroups there, as on a board whose systemd hands
    /// it every hierarchy (Delegate=yes). A remount of the bind only: the hierarchies' other
    /// mounts are untouched.
    pub fn delegate_cgroup_controllers(&self) {
        let info = std::fs::read_to_string(format!("/proc/{}/mountinfo", self.leader)).unwrap();
        for line in info.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mut l = left.split_whitespace();
            let (target, opts) = (l.nth(4).unwrap_or(""), l.next().unwrap_or(""));
            if right.split_whitespace().next() != Some("cgroup") || !opts.split(',').any(|o| o == "ro") {
                continue;
            }
            let out = self.run(&["mount", "-o", "remount,bind,rw", target]);
            assert!(
                out.status.success(),
                "making the machine's {target} writable: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Run `args` inside the machine (all its namespaces), as its root would.
    pub fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("nsenter")
            .arg(format!("--target={}", self.leader))
            .args(["--mount", "--uts", "--ipc", "--net", "--pid", "--"])
            .args(args)
            .output()
            .expect("nsenter")
    }

    /// systemd-nspawn's exit once the machine has powered off, within `timeout`; `meanwhile`
    /// runs between looks.
    pub fn wait_powered_off(&mut self, timeout: Duration, meanwhile: impl Fn()) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            meanwhile();
            if let Some(Ok(Some(st))) = self.nspawn.as_mut().map(|c| c.try_wait()) {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }

    /// The machine's console and systemd-nspawn's errors, for failure messages.
    pub fn log(&self) -> String {
        let read = |n: &str| std::fs::read_to_string(self.dir.join(n)).unwrap_or_default();
        format!(
            "--- machine console ---\n{}--- systemd-nspawn ---\n{}",
            super::tail(&read("console.log"), 40),
            read("nspawn.err")
        )
    }
}

impl Drop for SystemdMachine {
    fn drop(&mut self) {
        // SIGTERM asks systemd-nspawn to power the machine off cleanly.
        if let Some(c) = self.nspawn.as_mut() {
            stop_child(c, Duration::from_secs(20));
        }
        // What outlived the machine (its containers' processes die with its pid namespace,
        // but not all at once) is killed before the tree is removed.
        if let Ok(cgroups) = Cgroups::detect() {
            let left = cgroups.kill_all(self.cgroup.path(), Duration::from_secs(10));
            if !left.is_empty() {
                eprintln!("the machine's processes {left:?} survived SIGKILL");
            }
        }
        if let Err(e) = self.cgroup.cleanup() {
            eprintln!("the machine's cgroup: {e}");
        }
        let _ = nix::mount::umount2(&self.dir.join("root"), nix::mount::MntFlags::MNT_DETACH);
        let _ = nix::mount::umount2(&self.dir.join("upper"), nix::mount::MntFlags::MNT_DETACH);
        // What systemd-nspawn leaves of a machine on a /run that is no tmpfs: its directory,
        // and its state directories once empty (another machine's keep them).
        let nspawn = Path::new("/run/systemd/nspawn");
        let _ = std::fs::remove_dir(nspawn.join("propagate").join(&self.name));
        for d in ["propagate", "locks", ""] {
            let _ = std::fs::remove_dir(nspawn.join(d));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
