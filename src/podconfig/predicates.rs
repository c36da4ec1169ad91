//! kubelet's admission predicates against the Node (lifecycle/predicate.go's generalFilter): the
//! pod's nodeName, its nodeSelector and required node affinity against the Node's labels, its
//! host ports against those of the pods already admitted, and, for static pods, the Node's
//! NoExecute taints against its tolerations. Each failure is kubelet's
//! "Predicate <name> failed".

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration};

use crate::pod;

/// The name of the first predicate `p` fails on `node`, if any.
pub fn failed(p: &Pod, active: &[Arc<Pod>], node: &Node) -> Option<&'static str> {
    let spec = pod::spec(p);
    let node_name = node.metadata.name.as_deref().unwrap_or("");
    if !affinity_matches(p, node) {
        return Some("NodeAffinity");
    }
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != node_name)
    {
        return Some("NodeName");
    }
    if host_ports_conflict(p, active) {
        return Some("NodePorts");
    }
    if pod::is_static(p) && untolerated_no_execute(node, spec.tolerations.as_deref().unwrap_or(&[])) {
        return Some("TaintToleration");
    }
    None
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// nodeSelector (every label) and requiredDuringSchedulingIgnoredDuringExecution (any term).
fn affinity_matches(p: &Pod, node: &Node) -> bool {
    let spec = pod::spec(p);
    if let Some(sel) = &spec.node_selector {
        if sel.iter().any(|(k, v)| label(node, k) != Some(v.as_str())) {
            return false;
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    match required {
        // No terms matches nothing (the API server rejects an empty list anyway).
        Some(r) => r.node_selector_terms.iter().any(|t| term_matches(t, node)),
        None => true,
    }
}

/// Whether `node` matches any term of `sel` (kubelet's CheckNodeAffinity of a
/// PersistentVolume's `nodeAffinity.required`).
pub fn node_selector_matches(sel: &k8s_openapi::api::core::v1::NodeSelector, node: &Node) -> bool {
    sel.node_selector_terms.iter().any(|t| term_matches(t, node))
}

/// A term with no requirements matches nothing (the scheduler's rule).
fn term_matches(t: &NodeSelectorTerm, node: &Node) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or(&[]);
    let fields = t.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let name = node.metadata.name.as_deref();
    exprs.iter().all(|r| requirement_matches(r, label(node, &r.key)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, name))
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or(&[]);
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (value.and_then(number), values.first().and_then(|b| number(b))) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// (host IP, protocol, port) of every container port with a hostPort.
fn host_ports(p: &Pod) -> Vec<(String, String, i32)> {
    pod::all_containers(p)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|port| {
            let hp = port.host_port.filter(|h| *h > 0)?;
            let ip = port
                .host_ip
                .clone()
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| "0.0.0.0".into());
            Some((ip, port.protocol.clone().unwrap_or_else(|| "TCP".into()), hp))
        })
        .collect()
}

/// The scheduler's NodePorts check: the same port and protocol, on the same host IP or where
/// either side is 0.0.0.0.
fn host_ports_conflict(p: &Pod, active: &[Arc<Pod>]) -> bool {
    let wanted = host_ports(p);
    if wanted.is_empty() {
        return false;
    }
    let used: Vec<_> = active.iter().flat_map(|a| host_ports(a)).collect();
    wanted.iter().any(|(ip, proto, port)| {
        used.iter().any(|(uip, uproto, uport)| {
            port == uport && proto == uproto && (ip == uip || ip == "0.0.0.0" || uip == "0.0.0.0")
        })
    })
}

fn untolerated_no_execute(node: &Node, tolerations: &[Toleration]) -> bool {
    let taints: &[Taint] = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or(&[]);
    taints
        .iter()
        .filter(|t| t.effect == "NoExecute")
        .any(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// The API's ToleratesTaint.
fn tolerates(tol: &Toleration, t: &Taint) -> bool {
    if let Some(e) = tol.effect.as_deref().filter(|e| !e.is_empty()) {
        if e != t.effect {
            return false;
        }
    }
    if let Some(k) = tol.key.as_deref().filter(|k| !k.is_empty()) {
        if k != t.key {
            return false;
        }
    }
    match tol.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => tol.value.as_deref().unwrap_or("") == t.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": {"kubernetes.io/os": "linux", "zone": "a", "cores": "4"}},
            "spec": {"taints": [{"key": "dedicated", "value": "edge", "effect": "NoExecute"}]}
        }))
        .unwrap()
    }

    fn pod(spec: serde_json::Value) -> Pod {
        let mut s = serde_json::json!({"containers": [{"name": "c", "image": "x"}]});
        s.as_object_mut().unwrap().extend(spec.as_object().unwrap().clone());
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "spec": s})).unwrap()
    }

    fn static_pod(spec: serde_json::Value) -> Pod {
        let mut p = pod(spec);
        p.metadata.annotations = Some([(pod::CONFIG_SOURCE.to_string(), "file".to_string())].into());
        p
    }

    #[test]
    fn node_selector_and_affinity() {
        let n = node();
        assert_eq!(
            failed(&pod(serde_json::json!({"nodeSelector": {"zone": "a"}})), &[], &n),
            None
        );
        assert_eq!(
            failed(&pod(serde_json::json!({"nodeSelector": {"zone": "b"}})), &[], &n),
            Some("NodeAffinity")
        );
        let aff = |op: &str, key: &str, values: &[&str]| {
            pod(
                serde_json::json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": op, "values": values}]}]}}}}),
            )
        };
        assert_eq!(failed(&aff("In", "zone", &["a", "b"]), &[], &n), None);
        assert_eq!(failed(&aff("NotIn", "zone", &["a"]), &[], &n), Some("NodeAffinity"));
        assert_eq!(failed(&aff("Exists", "zone", &[]), &[], &n), None);
        assert_eq!(failed(&aff("DoesNotExist", "zone", &[]), &[], &n), Some("NodeAffinity"));
        assert_eq!(failed(&aff("Gt", "cores", &["2"]), &[], &n), None);
        assert_eq!(failed(&aff("Lt", "cores", &["2"]), &[], &n), Some("NodeAffinity"));
        let by_name = pod(
            serde_json::json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]},
                                  {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}),
        );
        assert_eq!(failed(&by_name, &[], &n), None, "terms are ORed");
    }

    #[test]
    fn node_name_must_be_this_node() {
        let n = node();
        assert_eq!(failed(&pod(serde_json::json!({"nodeName": "n1"})), &[], &n), None);
        assert_eq!(
            failed(&pod(serde_json::json!({"nodeName": "n2"})), &[], &n),
            Some("NodeName")
        );
    }

    #[test]
    fn host_ports_may_not_clash() {
        let n = node();
        let hp = |ip: &str, port: i32| {
            Arc::new(pod(serde_json::json!({"containers": [{"name": "c", "image": "x",
                "ports": [{"containerPort": 80, "hostPort": port, "hostIP": ip}]}]})))
        };
        assert_eq!(failed(&hp("", 8080), &[hp("", 8081)], &n), None);
        assert_eq!(failed(&hp("", 8080), &[hp("10.0.0.1", 8080)], &n), Some("NodePorts"));
        assert_eq!(failed(&hp("10.0.0.2", 8080), &[hp("10.0.0.1", 8080)], &n), None);
    }

    #[test]
    fn static_pods_must_tolerate_no_execute_taints() {
        let n = node();
        assert_eq!(
            failed(&static_pod(serde_json::json!({})), &[], &n),
            Some("TaintToleration")
        );
        // API pods were placed by the scheduler, which weighed the taints.
        assert_eq!(failed(&pod(serde_json::json!({})), &[], &n), None);
        let tol = static_pod(
            serde_json::json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "edge"}]}),
        );
        assert_eq!(failed(&tol, &[], &n), None);
        let exists = static_pod(serde_json::json!({"tolerations": [{"operator": "Exists"}]}));
        assert_eq!(failed(&exists, &[], &n), None);
        let wrong = static_pod(serde_json::json!({"tolerations": [{"key": "dedicated", "value": "other"}]}));
        assert_eq!(failed(&wrong, &[], &n), Some("TaintToleration"));
    }
}
