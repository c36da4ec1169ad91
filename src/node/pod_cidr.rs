//! The node's pod CIDR (kubelet's updatePodCIDR): the controller-manager allocates each Node a
//! range in spec.podCIDR soon after it registers; the built-in bridge takes its pod subnet from
//! it, so the agent waits for it (bounded) before its pod network starts.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use tracing::{info, warn};

use crate::kubeclient::Kube;

/// The pod CIDR a Node has been given (spec.podCIDRs' first, else spec.podCIDR).
pub fn of(node: &Node) -> Option<String> {
    let spec = node.spec.as_ref()?;
    spec.pod_cidrs
        .as_ref()
        .and_then(|c| c.first().cloned())
        .or_else(|| spec.pod_cidr.clone())
        .filter(|c| !c.is_empty())
}

/// Wait up to `timeout` for the controller-manager to set the Node's podCIDR and return it;
/// `None` when it has not by then (no CIDR allocation in this cluster, or the API server is
/// unreachable): the caller falls back to its configured subnet. Polls every second; logs when
/// it starts waiting, when the API server cannot be asked, and the outcome.
pub async fn wait(kube: &Kube, node_name: &str, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    let mut said_waiting = false;
    let mut last_error = String::new();
    loop {
        let nodes: Api<Node> = Api::all(kube.client());
        match nodes.get_opt(node_name).await {
            Ok(Some(n)) => {
                if let Some(cidr) = of(&n) {
                    info!(node = %node_name, pod_cidr = %cidr, "the node has its pod CIDR");
                    return Some(cidr);
                }
                if !said_waiting {
                    info!(node = %node_name, timeout = ?timeout, "waiting for the controller-manager to assign the node's pod CIDR");
                    said_waiting = true;
                }
            }
            Ok(None) => {
                let e = "the Node does not exist".to_string();
                if e != last_error {
                    warn!(node = %node_name, "waiting for the pod CIDR: {e}");
                    last_error = e;
                }
            }
            Err(e) => {
                let e = format!("{e:#}");
                if e != last_error {
                    warn!(node = %node_name, error = %e, "waiting for the pod CIDR: cannot get the Node");
                    last_error = e;
                }
            }
        }
        if Instant::now() >= deadline {
            warn!(node = %node_name, timeout = ?timeout, "the node has no pod CIDR yet; using the configured pod subnet");
            return None;
        }
        tokio::time::sleep(Duration::from_secs(1).min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    #[test]
    fn pod_cidrs_first() {
        let mut n = Node::default();
        assert_eq!(of(&n), None);
        n.spec = Some(NodeSpec {
            pod_cidr: Some("10.244.1.0/24".into()),
            ..Default::default()
        });
        assert_eq!(of(&n).as_deref(), Some("10.244.1.0/24"));
        n.spec.as_mut().unwrap().pod_cidrs = Some(vec!["10.244.2.0/24".into(), "fd00::/64".into()]);
        assert_eq!(of(&n).as_deref(), Some("10.244.2.0/24"));
        n.spec.as_mut().unwrap().pod_cidrs = Some(vec![]);
        n.spec.as_mut().unwrap().pod_cidr = Some(String::new());
        assert_eq!(of(&n), None);
    }
}
