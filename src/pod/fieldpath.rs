//! Values the downward API exposes (kubelet's fieldpath and resource helpers): pod fields by
//! path (`metadata.labels['app']`, `status.podIP`...) and container resources divided by a
//! divisor, with node allocatable standing in for an unset limit. Used for env entries and
//! downwardAPI volume files alike.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::pod::units::{bytes, milli, parse_quantity};

/// What the downward API needs to know beyond the pod object.
#[derive(Debug, Clone, Default)]
pub struct PodFacts {
    pub pod_ips: Vec<String>,
    pub host_ips: Vec<String>,
    pub node_cpu_milli: i64,
    pub node_memory: i64,
    pub node_ephemeral_storage: i64,
}

/// A downward API field's value.
pub fn field_ref(pod: &Pod, path: &str, facts: &PodFacts) -> Result<String, String> {
    let m = &pod.metadata;
    let map_key =
        |prefix: &str, map: &Option<std::collections::BTreeMap<String, String>>| -> Option<Result<String, String>> {
            let rest = path.strip_prefix(prefix)?;
            let key = rest
                .strip_prefix("['")
                .and_then(|r| r.strip_suffix("']"))
                .or_else(|| rest.strip_prefix("[\"").and_then(|r| r.strip_suffix("\"]")))?;
            Some(Ok(map.as_ref().and_then(|x| x.get(key)).cloned().unwrap_or_default()))
        };
    if let Some(r) = map_key("metadata.labels", &m.labels) {
        return r;
    }
    if let Some(r) = map_key("metadata.annotations", &m.annotations) {
        return r;
    }
    let spec = crate::pod::spec(pod);
    Ok(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.node_name.clone().unwrap_or_default(),
        "spec.serviceAccountName" => spec.service_account_name.clone().unwrap_or_default(),
        "status.hostIP" => facts.host_ips.first().cloned().unwrap_or_default(),
        "status.hostIPs" => facts.host_ips.join(","),
        "status.podIP" => facts.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => facts.pod_ips.join(","),
        other => return Err(format!("fieldRef: unsupported fieldPath {other:?}")),
    })
}

/// A resource value (limits.cpu, requests.memory...) divided by `divisor`, rounded up.
pub fn resource_field(c: &Container, resource: &str, divisor: &str, facts: &PodFacts) -> Result<String, String> {
    let (kind, res) = resource
        .split_once('.')
        .ok_or_else(|| format!("resourceFieldRef: unsupported resource {resource:?}"))?;
    let res_map = c.resources.as_ref();
    let get = |m: Option<
        &std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| { m.and_then(|m| m.get(res)).map(|q| q.0.clone()) };
    let limits = res_map.and_then(|r| r.limits.as_ref());
    let requests = res_map.and_then(|r| r.requests.as_ref());
    let q = match kind {
        "limits" => get(limits),
        // A request without a limit... or a limit defaulted into it; unset requests are 0.
        "requests" => get(requests),
        _ => return Err(format!("resourceFieldRef: unsupported resource {resource:?}")),
    };
    match res {
        "cpu" => {
            let m = match (kind, q) {
                (_, Some(q)) => milli(&q)?,
                ("limits", None) => facts.node_cpu_milli,
                _ => 0,
            };
            // A zero divisor (the API server's default for an unset one) is 1: whole cores.
            let d = match milli(divisor)? {
                0 => 1000,
                d => d,
            };
            if d < 0 {
                return Err(format!("resourceFieldRef: invalid divisor {divisor:?}"));
            }
            Ok(((m as f64) / (d as f64)).ceil().to_string())
        }
        "memory" | "ephemeral-storage" => {
            let v = match (kind, q) {
                (_, Some(q)) => bytes(&q)?,
                ("limits", None) if res == "memory" => facts.node_memory,
                ("limits", None) => facts.node_ephemeral_storage,
                _ => 0,
            };
            // A zero divisor (the API server's default for an unset one) is 1: bytes.
            let d = Some(parse_quantity(divisor)?).filter(|d| *d != 0.0).unwrap_or(1.0);
            if d < 0.0 {
                return Err(format!("resourceFieldRef: invalid divisor {divisor:?}"));
            }
            Ok(((v as f64) / d).ceil().to_string())
        }
        other if other.starts_with("hugepages-") => {
            let v = q.map(|q| bytes(&q)).transpose()?.unwrap_or(0);
            let d = parse_quantity(divisor)?.max(1.0);
            Ok(((v as f64) / d).ceil().to_string())
        }
        other => Err(format!("resourceFieldRef: unsupported resource {other:?}")),
    }
}
