//! A container's environment exactly as Kubernetes builds it: entries in order, each value may
//! use `$(VAR)` for variables defined before it (`$$` escapes, unknown references stay as
//! written); values from the downward API (fieldRef) and from resources (resourceFieldRef,
//! defaulting to node allocatable when no limit is set); command and args expanded with the
//! final environment.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

use crate::units::{bytes, milli, parse_quantity};

/// What the downward API needs to know beyond the pod object.
#[derive(Debug, Clone, Default)]
pub struct PodFacts {
    pub pod_ips: Vec<String>,
    pub host_ips: Vec<String>,
    pub node_cpu_milli: i64,
    pub node_memory: i64,
    pub node_ephemeral_storage: i64,
}

/// Kubernetes' `expansion.Expand`: `$(NAME)` is replaced when `lookup` knows NAME and kept as
/// written when it does not, `$$` is a literal `$`, any other `$` stays.
pub fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let b = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < b.len() {
        if b[cursor] == b'$' && cursor + 1 < b.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            let advance = match rest.as_bytes()[0] {
                b'$' => {
                    out.push('$');
                    1
                }
                b'(' => match rest[1..].find(')') {
                    Some(i) => {
                        let name = &rest[1..i + 1];
                        match lookup(name) {
                            Some(v) => out.push_str(&v),
                            None => {
                                out.push_str("$(");
                                out.push_str(name);
                                out.push(')');
                            }
                        }
                        i + 2
                    }
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                _ => {
                    let ch = rest.chars().next().expect("non-empty");
                    out.push('$');
                    out.push(ch);
                    ch.len_utf8()
                }
            };
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    out.push_str(&input[checkpoint.min(input.len())..]);
    out
}

/// Build the environment of `c` (in order), or an error naming the bad entry.
pub fn build(pod: &Pod, c: &Container, facts: &PodFacts) -> Result<Vec<(String, String)>, String> {
    let mut env: Vec<(String, String)> = Vec::new();
    for (i, e) in c.env.iter().flatten().enumerate() {
        let value = value_of(pod, c, e, facts, &env).map_err(|m| format!("env[{i}] ({}): {m}", e.name))?;
        match env.iter_mut().find(|(k, _)| k == &e.name) {
            Some(slot) => slot.1 = value,
            None => env.push((e.name.clone(), value)),
        }
    }
    Ok(env)
}

fn value_of(
    pod: &Pod,
    c: &Container,
    e: &EnvVar,
    facts: &PodFacts,
    before: &[(String, String)],
) -> Result<String, String> {
    if let Some(v) = &e.value {
        let lookup = |name: &str| before.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        return Ok(expand(v, &lookup));
    }
    let Some(vf) = &e.value_from else {
        return Ok(String::new());
    };
    if let Some(f) = &vf.field_ref {
        return field_ref(pod, &f.field_path, facts);
    }
    if let Some(r) = &vf.resource_field_ref {
        let target = match r.container_name.as_deref().filter(|s| !s.is_empty()) {
            Some(n) => crate::pod::containers(pod)
                .iter()
                .chain(crate::pod::init_containers(pod))
                .find(|x| x.name == n)
                .ok_or_else(|| format!("resourceFieldRef: no container named {n:?}"))?,
            None => c,
        };
        let divisor = r.divisor.as_ref().map(|d| d.0.clone()).unwrap_or_else(|| "1".into());
        return resource_field(target, &r.resource, &divisor, facts);
    }
    Err("valueFrom: configMapKeyRef and secretKeyRef need an API server".into())
}

/// A downward API field as an env value.
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
            let d = milli(divisor)?;
            if d <= 0 {
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
            let d = parse_quantity(divisor)?;
            if d <= 0.0 {
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

/// Expand `$(VAR)` in command and args with the container's environment.
pub fn expand_all(items: &[String], env: &[(String, String)]) -> Vec<String> {
    let lookup = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    items.iter().map(|s| expand(s, &lookup)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(s: &str) -> String {
        let env = [
            ("VAR".to_string(), "val".to_string()),
            ("EMPTY".to_string(), String::new()),
        ];
        let lookup = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        expand(s, &lookup)
    }

    #[test]
    fn expansion_cases_from_kubernetes() {
        assert_eq!(ex("$(VAR)"), "val");
        assert_eq!(ex("___$(VAR)___"), "___val___");
        assert_eq!(ex("$(VAR)$(VAR)"), "valval");
        assert_eq!(ex("$$(VAR)"), "$(VAR)");
        assert_eq!(ex("$$$(VAR)"), "$val");
        assert_eq!(ex("$(UNDEFINED)"), "$(UNDEFINED)");
        assert_eq!(ex("$(EMPTY)x"), "x");
        assert_eq!(ex("$(VAR"), "$(VAR");
        assert_eq!(ex("$VAR"), "$VAR");
        assert_eq!(ex("$"), "$");
        assert_eq!(ex("x$"), "x$");
        assert_eq!(ex("$$"), "$");
        assert_eq!(ex("$()"), "$()");
        assert_eq!(ex("ünï$(VAR)ç"), "ünïvalç");
    }

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "web"}, "annotations": {"a.b/c": "d"}},
            "spec": {"nodeName": "n1", "serviceAccountName": "sa", "containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "250m", "memory": "32Mi"}},
                "env": [
                    {"name": "A", "value": "a"},
                    {"name": "B", "value": "$(A)-b"},
                    {"name": "C", "value": "$(D)"},
                    {"name": "D", "value": "d"},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "LBL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                    {"name": "ANN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['a.b/c']"}}},
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                    {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
                    {"name": "CPULIM", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}
                ]}]}
        }))
        .unwrap()
    }

    #[test]
    fn env_in_order_with_downward_api() {
        let p = pod();
        let facts = PodFacts {
            pod_ips: vec!["10.88.0.5".into()],
            node_cpu_milli: 2000,
            node_memory: 1 << 30,
            ..Default::default()
        };
        let env = build(&p, &p.spec.as_ref().unwrap().containers[0], &facts).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()).unwrap();
        assert_eq!(get("B"), "a-b");
        assert_eq!(get("C"), "$(D)", "references only see earlier entries");
        assert_eq!(get("POD"), "p");
        assert_eq!(get("LBL"), "web");
        assert_eq!(get("ANN"), "d");
        assert_eq!(get("IP"), "10.88.0.5");
        assert_eq!(get("MEM"), "64");
        assert_eq!(get("CPU"), "250");
        assert_eq!(get("CPULIM"), "2", "no cpu limit: node allocatable");
    }

    #[test]
    fn bad_field_path_is_named() {
        let mut p = pod();
        p.spec.as_mut().unwrap().containers[0].env = Some(vec![EnvVar {
            name: "X".into(),
            value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
                field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                    field_path: "spec.nope".into(),
                    api_version: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        let e = build(&p, &p.spec.as_ref().unwrap().containers[0], &PodFacts::default()).unwrap_err();
        assert!(e.contains("env[0] (X)") && e.contains("spec.nope"), "{e}");
    }
}
