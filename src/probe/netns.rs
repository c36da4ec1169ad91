//! Reaching a pod over TCP. Like kubelet, probes and hooks connect from the node to the pod's
//! IP; a pod without an IP (no pod network configured) is reached on its own loopback, by
//! creating the socket inside the pod's network namespace: a short-lived thread enters the
//! namespace, connects, and hands the connected socket back (a socket stays in the namespace
//! it was created in). No thread of the async runtime ever changes namespace.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

use tokio::net::TcpStream;

/// Where a pod's ports are.
#[derive(Debug, Clone, Default)]
pub struct PodTarget {
    /// The pod's IP (the node's for hostNetwork pods).
    pub ip: Option<IpAddr>,
    /// The pod's network namespace, when it has its own.
    pub netns: Option<PathBuf>,
}

impl PodTarget {
    /// The address to use for `host` (empty: the pod) and `port`, and the namespace to connect
    /// from (None: the node's).
    pub fn resolve(&self, host: Option<&str>, port: u16) -> io::Result<(SocketAddr, Option<PathBuf>)> {
        match host.filter(|h| !h.is_empty()) {
            Some(h) => {
                let ip: IpAddr = match h.parse() {
                    Ok(ip) => ip,
                    Err(_) => std::net::ToSocketAddrs::to_socket_addrs(&(h, port))?
                        .next()
                        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("cannot resolve host {h:?}")))?
                        .ip(),
                };
                Ok((SocketAddr::new(ip, port), None))
            }
            None => match (self.ip, &self.netns) {
                (Some(ip), _) => Ok((SocketAddr::new(ip, port), None)),
                (None, Some(ns)) => Ok((SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port), Some(ns.clone()))),
                (None, None) => Ok((SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port), None)),
            },
        }
    }
}

/// Connect to `addr` from `netns` (None: the node's namespace), within `timeout`.
pub async fn connect(addr: SocketAddr, netns: Option<PathBuf>, timeout: Duration) -> io::Result<TcpStream> {
    let Some(ns) = netns else {
        return match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("dial tcp {addr}: i/o timeout"),
            )),
        };
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("netns-connect".into())
        .spawn(move || {
            let r = (|| -> io::Result<std::net::TcpStream> {
                let f = std::fs::File::open(&ns)?;
                nix::sched::setns(f.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
                let s = std::net::TcpStream::connect_timeout(&addr, timeout)?;
                s.set_nonblocking(true)?;
                Ok(s)
            })();
            let _ = tx.send(r);
        })?;
    let std = rx.await.map_err(|_| io::Error::other("connect thread died"))??;
    TcpStream::from_std(std)
}
