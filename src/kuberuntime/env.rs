//! A container's environment exactly as Kubernetes builds it: entries in order, each value may
//! use `$(VAR)` for variables defined before it (`$$` escapes, unknown references stay as
//! written); values from the downward API (fieldRef) and from resources (resourceFieldRef,
//! defaulting to node allocatable when no limit is set); command and args expanded with the
//! final environment.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

use crate::pod::expansion::expand;
use crate::pod::fieldpath::{field_ref, resource_field, PodFacts};

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
            Some(n) => {
                crate::pod::container(pod, n).ok_or_else(|| format!("resourceFieldRef: no container named {n:?}"))?
            }
            None => c,
        };
        let divisor = r.divisor.as_ref().map(|d| d.0.clone()).unwrap_or_else(|| "1".into());
        return resource_field(target, &r.resource, &divisor, facts);
    }
    Err("valueFrom: configMapKeyRef and secretKeyRef need an API server".into())
}

#[cfg(test)]
mod tests {
    use super::*;

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
