//! Admission (kubelet's lifecycle admit handlers): a new pod is refused when ferrolet cannot run
//! something it asks for, when the node already runs maxPods pods, when its cpu or memory
//! requests do not fit in what the active pods leave of allocatable (OutOfpods, OutOfcpu,
//! OutOfmemory), or when a predicate against the Node fails ([`super::predicates`]: node name,
//! selector and affinity, host ports, NoExecute taints for static pods). A refused pod is Failed
//! with kubelet's reason and message.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};

use crate::node::allocatable::Extended;
use crate::node::NodeInfo;
use crate::pod::{qos, reasons, validation};

pub use crate::lifecycle::admit::Rejection;

/// kubelet's sysctl admit handler, which runs right after the eviction one: a sysctl outside
/// the safe set and allowedUnsafeSysctls, or in a namespace the pod shares with the node, is
/// `SysctlForbidden`.
pub fn sysctls(p: &Pod, allowed: &crate::pod::sysctl::Allowlist) -> Result<(), Rejection> {
    allowed.admit(p).map_err(|message| Rejection {
        reason: crate::pod::sysctl::REASON.into(),
        message,
    })
}

/// kubelet's OS checks in its predicate admit handler: `spec.os.name` must be the node's OS, and
/// so must a `kubernetes.io/os` node selector.
fn os(p: &Pod) -> Result<(), Rejection> {
    let spec = crate::pod::spec(p);
    if spec.os.as_ref().is_some_and(|o| o.name != std::env::consts::OS) {
        return Err(Rejection {
            reason: reasons::POD_OS_NOT_SUPPORTED.into(),
            message: "Failed to admit pod as the OS field doesn't match node OS".into(),
        });
    }
    let selected = spec.node_selector.as_ref().and_then(|s| s.get(OS_LABEL));
    if selected.is_some_and(|os| os != std::env::consts::OS) {
        return Err(Rejection {
            reason: reasons::POD_OS_SELECTOR_MISMATCH.into(),
            message: format!("Failed to admit pod as the `{OS_LABEL}` label doesn't match node label"),
        });
    }
    Ok(())
}

/// The node label naming its OS.
const OS_LABEL: &str = "kubernetes.io/os";

/// What admission knows of the device plugins' resources.
#[derive(Debug, Default)]
pub struct Devices {
    /// Each resource's devices (capacity) and healthy devices (allocatable).
    pub extended: Extended,
    /// The resources the pod being admitted already holds devices of: it is not counted
    /// against them again (kubelet's pre-allocated devices), so a restarted agent keeps its
    /// pods before their plugins have registered again.
    pub held: BTreeSet<String>,
}

/// Can the node (`node`, its Node object `node_object`) take `p` beside the `active` pods
/// (admitted, not terminating, not finished)?
pub fn admit(
    p: &Pod,
    active: &[Arc<Pod>],
    node: &NodeInfo,
    node_object: &Node,
    devices: &Devices,
) -> Result<(), Rejection> {
    let extended = &devices.extended;
    if let Some(why) = validation::unsupported(p) {
        return Err(Rejection {
            reason: reasons::UNSUPPORTED_POD_SPEC.into(),
            message: why,
        });
    }
    if active.len() as i64 >= node.allocatable.pods {
        return Err(Rejection {
            reason: reasons::OUT_OF_PODS.into(),
            message: format!(
                "Node didn't have enough resource: pods, requested: 1, used: {}, capacity: {}",
                active.len(),
                node.allocatable.pods
            ),
        });
    }
    for (res, cap) in [("cpu", node.allocatable.cpu_milli), ("memory", node.allocatable.memory)] {
        let want = qos::pod_requests(p, res);
        if want == 0 {
            continue;
        }
        let used = active
            .iter()
            .fold(0i64, |sum, a| sum.saturating_add(qos::pod_requests(a, res)));
        if used.saturating_add(want) > cap {
            return Err(Rejection {
                reason: reasons::out_of(res),
                message: format!(
                    "Node didn't have enough resource: {res}, requested: {want}, used: {used}, capacity: {cap}"
                ),
            });
        }
    }
    for res in extended_requests(p).into_iter().filter(|r| !devices.held.contains(r)) {
        let want = qos::pod_requests(p, &res);
        // A device plugin's count, else what the Node advertises (an administrator's patch).
        let cap = extended.allocatable.get(&res).copied().unwrap_or_else(|| {
            node_object
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get(&res))
                .and_then(|q| crate::pod::units::bytes(&q.0).ok())
                .unwrap_or(0)
        });
        let used = active
            .iter()
            .fold(0i64, |sum, a| sum.saturating_add(qos::pod_requests(a, &res)));
        if used.saturating_add(want) > cap {
            return Err(Rejection {
                reason: reasons::out_of(&res),
                message: format!(
                    "Node didn't have enough resource: {res}, requested: {want}, used: {used}, capacity: {cap}"
                ),
            });
        }
    }
    if let Some(predicate) = super::predicates::failed(p, active, node_object) {
        return Err(Rejection {
            reason: predicate.into(),
            message: format!("Predicate {predicate} failed"),
        });
    }
    os(p)?;
    // kubelet's AppArmor admit handler comes after the predicates.
    super::lsm::admit(p, super::lsm::Host::detect())?;
    Ok(())
}

/// The extended resources (device plugins' and administrators') any container of `p` asks for.
fn extended_requests(p: &Pod) -> BTreeSet<String> {
    crate::pod::all_containers(p)
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| r.requests.iter().chain(r.limits.iter()).flat_map(|m| m.keys()))
        .filter(|k| validation::is_extended_resource_name(k))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(max_pods: u32) -> NodeInfo {
        let r = crate::node::Resources {
            cpu_milli: 1000,
            memory: 1 << 30,
            pods: max_pods as i64,
            ..Default::default()
        };
        NodeInfo {
            name: "n".into(),
            ips: Vec::new(),
            capacity: r.clone(),
            allocatable: r,
        }
    }

    fn pod(cpu: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({"metadata":{"name":"p"},"spec":{"containers":[
                {"name":"c","image":"x","resources":{"requests":{"cpu":cpu}}}]}}))
            .unwrap(),
        )
    }

    #[test]
    fn pods_and_cpu_must_fit() {
        assert!(admit(&pod("500m"), &[], &node(2), &Node::default(), &Devices::default()).is_ok());
        let full = admit(
            &pod("500m"),
            &[pod("100m"), pod("100m")],
            &node(2),
            &Node::default(),
            &Devices::default(),
        )
        .unwrap_err();
        assert_eq!(full.reason, "OutOfpods");
        let cpu = admit(
            &pod("600m"),
            &[pod("500m")],
            &node(5),
            &Node::default(),
            &Devices::default(),
        )
        .unwrap_err();
        assert_eq!(cpu.reason, "OutOfcpu");
        assert!(
            cpu.message.contains("requested: 600, used: 500, capacity: 1000"),
            "{}",
            cpu.message
        );
    }

    #[test]
    fn a_pod_holding_devices_is_not_counted_against_them_again() {
        let dev = |name: &str| -> Arc<Pod> {
            Arc::new(
                serde_json::from_value(serde_json::json!({"metadata":{"name":name},"spec":{"containers":[
                    {"name":"c","image":"x","resources":{"requests":{"example.com/dev":"1"},"limits":{"example.com/dev":"1"}}}]}}))
                .unwrap(),
            )
        };
        // The plugin has not registered (again): no devices.
        let mut devices = Devices::default();
        let refused = admit(&dev("new"), &[], &node(5), &Node::default(), &devices).unwrap_err();
        assert_eq!(refused.reason, "OutOfexample.com/dev");
        assert!(
            refused.message.contains("requested: 1, used: 0, capacity: 0"),
            "{}",
            refused.message
        );
        // A pod the checkpoint says holds one is admitted again; another one is not.
        devices.held.insert("example.com/dev".into());
        assert!(admit(&dev("holder"), &[dev("other")], &node(5), &Node::default(), &devices).is_ok());
        devices.held.clear();
        devices.extended.allocatable.insert("example.com/dev".into(), 1);
        let full = admit(&dev("new"), &[dev("holder")], &node(5), &Node::default(), &devices).unwrap_err();
        assert!(
            full.message.contains("requested: 1, used: 1, capacity: 1"),
            "{}",
            full.message
        );
    }
}

#[cfg(test)]
mod os_tests {
    use super::*;

    fn pod(extra: &str) -> Pod {
        serde_saphyr::from_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers:\n  - name: c\n    image: x\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn another_os_is_refused_as_kubelet_says() {
        let r = os(&pod("  os: {name: windows}\n")).unwrap_err();
        assert_eq!(r.reason, "PodOSNotSupported");
        assert_eq!(r.message, "Failed to admit pod as the OS field doesn't match node OS");
        let r = os(&pod("  nodeSelector: {kubernetes.io/os: windows}\n")).unwrap_err();
        assert_eq!(r.reason, "PodOSSelectorNodeLabelDoesNotMatch");
        assert!(os(&pod("  os: {name: linux}\n  nodeSelector: {kubernetes.io/os: linux}\n")).is_ok());
    }
}
