//! A network namespace per test, standing in for the node: the agent runs in it, so its bridge,
//! veths, nftables and CNI state never touch the machine's own network. The namespace is pinned
//! by a bind mount of a thread's namespace; the test reaches into it from threads that setns()
//! (a socket stays in the namespace it was created in) and with `nsenter` for commands.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

/// The node's address inside the test namespace (TEST-NET-2), on interface node0.
pub const NODE_IP: &str = "198.51.100.10";

pub struct TestNet {
    pub dir: PathBuf,
    pub path: PathBuf,
}

impl TestNet {
    /// A fresh namespace with lo up and "node0" (a veth; the dummy driver may be missing)
    /// holding [`NODE_IP`]/24 and a default route, like a node's uplink.
    pub fn create(name: &str) -> TestNet {
        let dir = std::env::temp_dir().join(format!("ferrolet-net-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("netns");
        std::fs::File::create(&path).unwrap();
        let p = path.clone();
        std::thread::spawn(move || {
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET) in a thread");
            mount(
                Some("/proc/thread-self/ns/net"),
                &p,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .expect("pinning the test namespace");
        })
        .join()
        .expect("netns thread");
        let n = TestNet { dir, path };
        n.ip(&["link", "set", "lo", "up"]);
        n.ip(&["link", "add", "node0", "type", "veth", "peer", "name", "node0-peer"]);
        n.ip(&["link", "set", "node0", "up"]);
        n.ip(&["link", "set", "node0-peer", "up"]);
        n.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "node0"]);
        n.ip(&["route", "add", "default", "via", "198.51.100.1"]);
        n
    }

    /// A command run inside the namespace.
    pub fn command(&self, prog: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path.display())).arg("--").arg(prog);
        c
    }

    /// `ip ARGS` inside the namespace; panics on failure. Full path: busybox may shadow it.
    pub fn ip(&self, args: &[&str]) -> String {
        let out = self.command("/usr/sbin/ip").args(args).output().expect("nsenter ip");
        assert!(
            out.status.success(),
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `nft ARGS` inside the namespace (stdout, or the error).
    pub fn nft(&self, args: &[&str]) -> Result<String, String> {
        let out = self.command("nft").args(args).output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Run `f` on a thread that joined the namespace.
    pub fn in_ns<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let ns = self.path.clone();
        std::thread::spawn(move || {
            let fd = std::fs::File::open(&ns).expect("open netns");
            setns(&fd, CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("namespace thread")
    }

    /// An HTTP/1.0 GET from the node side; the response body.
    pub fn http_get(&self, addr: &str, path: &str) -> Result<String, String> {
        let addr: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
        let path = path.to_string();
        self.in_ns(move || {
            let mut s =
                TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map_err(|e| format!("{addr}: {e}"))?;
            s.set_read_timeout(Some(Duration::from_secs(5))).ok();
            write!(s, "GET {path} HTTP/1.0\r\n\r\n").map_err(|e| e.to_string())?;
            let mut buf = String::new();
            s.read_to_string(&mut buf).map_err(|e| e.to_string())?;
            match buf.split_once("\r\n\r\n") {
                Some((head, body)) if head.contains(" 200 ") => Ok(body.to_string()),
                _ => Err(format!("{addr}: unexpected response {buf:?}")),
            }
        })
    }

    /// Retry [`TestNet::http_get`] until it answers or `timeout` passes.
    pub fn http_get_eventually(&self, addr: &str, path: &str, timeout: Duration) -> Result<String, String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match self.http_get(addr, path) {
                Ok(b) => return Ok(b),
                Err(e) if std::time::Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// Names of the interfaces enslaved to `bridge`.
    pub fn bridge_ports(&self, bridge: &str) -> Vec<String> {
        self.ip(&["-o", "link", "show", "master", bridge])
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .collect()
    }
}

impl TestNet {
    /// Unpin the namespace and remove its directory (also done on drop).
    pub fn release(&self) {
        // Everything inside (bridge, veths, tables) goes with the namespace's last reference.
        let _ = umount2(&self.path, MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        self.release();
    }
}

/// Files in an IPAM directory that are allocations (named by an IP).
pub fn allocations(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect();
    v.sort();
    v
}
