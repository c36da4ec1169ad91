//! How the node reaches into a pod (kubelet's pkg/probe), shared by the prober and the
//! lifecycle hooks: a command in the container ([`exec`]), an HTTP GET ([`http`]), a TCP
//! connection ([`tcp`]), a gRPC health check ([`grpc`]), each from the node to the pod's IP or,
//! for a pod without one, from inside its network namespace ([`netns`]). Results and messages
//! are kubelet's.

pub mod exec;
pub mod grpc;
pub mod http;
pub mod netns;
pub mod tcp;

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub const MAX_OUTPUT: usize = 10 * 1024;
pub const USER_AGENT: &str = "kube-probe/1.37";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Success; the text is a warning worth an event (e.g. a redirect not followed).
    Success(String),
    Failure(String),
}

impl Outcome {
    pub fn ok(&self) -> bool {
        matches!(self, Outcome::Success(_))
    }
}

/// A port given by number or by the name of one of the container's ports.
pub fn resolve_port(port: &IntOrString, c: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("invalid port number: {n}")),
        IntOrString::String(s) => {
            if let Ok(n) = s.parse::<u16>() {
                return Ok(n);
            }
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(s.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("couldn't find port: {s} in {}", c.name))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_and_numbered_ports() {
        let c: Container =
            serde_json::from_value(serde_json::json!({"name":"c","ports":[{"name":"http","containerPort":8080}]}))
                .unwrap();
        assert_eq!(resolve_port(&IntOrString::Int(80), &c), Ok(80));
        assert_eq!(resolve_port(&IntOrString::String("http".into()), &c), Ok(8080));
        assert!(resolve_port(&IntOrString::String("nope".into()), &c).is_err());
        assert!(resolve_port(&IntOrString::Int(0), &c).is_err());
    }
}
