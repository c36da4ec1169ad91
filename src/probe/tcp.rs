//! The tcpSocket handler (kubelet's pkg/probe/tcp).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, TCPSocketAction};

use super::netns::{connect, PodTarget};
use super::{resolve_port, Outcome};

/// A TCP connection to the port succeeds; failing to connect in time fails.
pub async fn probe(action: &TCPSocketAction, c: &Container, target: &PodTarget, timeout: Duration) -> Outcome {
    let port = match resolve_port(&action.port, c) {
        Ok(p) => p,
        Err(e) => return Outcome::Failure(e),
    };
    let (addr, ns) = match target.resolve(action.host.as_deref(), port) {
        Ok(x) => x,
        Err(e) => return Outcome::Failure(e.to_string()),
    };
    match connect(addr, ns, timeout).await {
        Ok(_) => Outcome::Success(String::new()),
        Err(e) => Outcome::Failure(format!("dial tcp {addr}: {e}")),
    }
}
