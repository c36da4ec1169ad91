//! A container's environment exactly as Kubernetes builds it (kubelet's
//! makeEnvironmentVariables): envFrom ConfigMaps and Secrets first (each key with its prefix;
//! keys that are no valid variable names skipped), then the entries in order, each value may use
//! `$(VAR)` for variables defined before it and the Service variables (`$$` escapes, unknown
//! references stay as written); values from the downward API (fieldRef), from resources
//! (resourceFieldRef, defaulting to node allocatable when no limit is set) and from ConfigMap and
//! Secret keys; last the Service variables the container did not set. Objects come already
//! fetched ([`EnvObjects`]); command and args are expanded with the final environment.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

use crate::objects::{EnvObjects, Lookup};
use crate::pod::expansion::expand;
use crate::pod::fieldpath::{field_ref, resource_field, PodFacts};

/// Build the environment of `c` (in order), or kubelet's error (CreateContainerConfigError).
pub fn build(
    pod: &Pod,
    c: &Container,
    facts: &PodFacts,
    objects: &EnvObjects,
) -> Result<Vec<(String, String)>, String> {
    let service_env = objects.service_env.clone()?;
    let ns = crate::pod::namespace(pod);
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, k: String, v: String| match env.iter_mut().find(|(n, _)| *n == k) {
        Some(slot) => slot.1 = v,
        None => env.push((k, v)),
    };
    for e in c.env_from.iter().flatten() {
        let prefix = e.prefix.as_deref().unwrap_or("");
        if let Some(r) = &e.config_map_ref {
            let Some(cm) = found(&objects.config_maps, "configmap", "configMap", ns, &r.name, r.optional)? else {
                continue;
            };
            for (k, v) in cm.data.iter().flatten() {
                let k = format!("{prefix}{k}");
                if is_env_var_name(&k) {
                    set(&mut env, k, v.clone());
                }
            }
        }
        if let Some(r) = &e.secret_ref {
            let Some(s) = found(&objects.secrets, "secret", "secret", ns, &r.name, r.optional)? else {
                continue;
            };
            for (k, v) in s.data.iter().flatten() {
                let k = format!("{prefix}{k}");
                if is_env_var_name(&k) {
                    set(&mut env, k, String::from_utf8_lossy(&v.0).into_owned());
                }
            }
        }
    }
    for (i, e) in c.env.iter().flatten().enumerate() {
        let Some(value) = value_of(pod, c, e, facts, &env, &service_env, objects)? else {
            continue;
        };
        let value = value.map_err(|m| format!("env[{i}] ({}): {m}", e.name))?;
        set(&mut env, e.name.clone(), value);
    }
    for (k, v) in service_env {
        if !env.iter().any(|(n, _)| *n == k) {
            env.push((k, v));
        }
    }
    Ok(env)
}

/// kubelet's InvalidEnvironmentVariableNames warnings: for each envFrom source, the keys
/// skipped because they are no valid variable names.
pub fn invalid_env_from_keys(pod: &Pod, c: &Container, objects: &EnvObjects) -> Vec<String> {
    let ns = crate::pod::namespace(pod);
    let mut out = Vec::new();
    for e in c.env_from.iter().flatten() {
        let prefix = e.prefix.as_deref().unwrap_or("");
        let bad = |keys: Vec<&String>| -> Vec<String> {
            let mut b: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{prefix}{k}"))
                .filter(|k| !is_env_var_name(k))
                .collect();
            b.sort();
            b
        };
        if let Some(r) = &e.config_map_ref {
            if let Some(Ok(Some(cm))) = objects.config_maps.get(&r.name) {
                let b = bad(cm.data.iter().flat_map(|d| d.keys()).collect());
                if !b.is_empty() {
                    out.push(format!("Keys [{}] from the EnvFrom configMap {ns}/{} were skipped since they are considered invalid environment variable names.", b.join(", "), r.name));
                }
            }
        }
        if let Some(r) = &e.secret_ref {
            if let Some(Ok(Some(s))) = objects.secrets.get(&r.name) {
                let b = bad(s.data.iter().flat_map(|d| d.keys()).collect());
                if !b.is_empty() {
                    out.push(format!("Keys [{}] from the EnvFrom secret {ns}/{} were skipped since they are considered invalid environment variable names.", b.join(", "), r.name));
                }
            }
        }
    }
    out
}

/// apimachinery's IsEnvVarName: `[-._a-zA-Z][-._a-zA-Z0-9]*`.
pub fn is_env_var_name(s: &str) -> bool {
    let ok = |c: char, first: bool| {
        c == '-' || c == '.' || c == '_' || c.is_ascii_alphabetic() || (!first && c.is_ascii_digit())
    };
    let mut chars = s.chars();
    chars.next().is_some_and(|c| ok(c, true)) && chars.all(|c| ok(c, false))
}

/// The object a reference names: `None` when it is missing and optional (skipped), kubelet's
/// error when it is missing and required or could not be read.
fn found<'a, K>(
    objects: &'a std::collections::BTreeMap<String, Lookup<K>>,
    kind: &str,
    kind_camel: &str,
    ns: &str,
    name: &str,
    optional: Option<bool>,
) -> Result<Option<&'a K>, String> {
    match objects.get(name) {
        None => Err(format!("couldn't get {kind_camel} {ns}/{name}, no kubeClient defined")),
        Some(Ok(Some(o))) => Ok(Some(o)),
        Some(Ok(None)) if optional == Some(true) => Ok(None),
        Some(Ok(None)) => Err(format!("{kind} {name:?} not found")),
        Some(Err(e)) => Err(e.clone()),
    }
}

/// An entry's value: `Ok(None)` to skip it (an optional reference to what is missing),
/// `Ok(Some(Err))` for a problem of the entry itself (named with it), `Err` for kubelet's
/// errors about the objects, which it reports as they are.
#[allow(clippy::type_complexity)]
fn value_of(
    pod: &Pod,
    c: &Container,
    e: &EnvVar,
    facts: &PodFacts,
    before: &[(String, String)],
    service_env: &[(String, String)],
    objects: &EnvObjects,
) -> Result<Option<Result<String, String>>, String> {
    if let Some(v) = &e.value {
        let lookup = |name: &str| {
            before
                .iter()
                .chain(service_env)
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        return Ok(Some(Ok(expand(v, &lookup))));
    }
    let Some(vf) = &e.value_from else {
        return Ok(Some(Ok(String::new())));
    };
    if let Some(f) = &vf.field_ref {
        return Ok(Some(field_ref(pod, &f.field_path, facts)));
    }
    if let Some(r) = &vf.resource_field_ref {
        let target = match r.container_name.as_deref().filter(|s| !s.is_empty()) {
            Some(n) => match crate::pod::container(pod, n) {
                Some(t) => t,
                None => return Ok(Some(Err(format!("resourceFieldRef: no container named {n:?}")))),
            },
            None => c,
        };
        let divisor = r.divisor.as_ref().map(|d| d.0.clone()).unwrap_or_else(|| "1".into());
        return Ok(Some(resource_field(target, &r.resource, &divisor, facts)));
    }
    let ns = crate::pod::namespace(pod);
    if let Some(r) = &vf.config_map_key_ref {
        let optional = r.optional == Some(true);
        let Some(cm) = found(&objects.config_maps, "configmap", "configMap", ns, &r.name, r.optional)? else {
            return Ok(None);
        };
        return match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
            Some(v) => Ok(Some(Ok(v.clone()))),
            None if optional => Ok(None),
            None => Err(format!("couldn't find key {} in ConfigMap {ns}/{}", r.key, r.name)),
        };
    }
    if let Some(r) = &vf.secret_key_ref {
        let optional = r.optional == Some(true);
        let Some(s) = found(&objects.secrets, "secret", "secret", ns, &r.name, r.optional)? else {
            return Ok(None);
        };
        return match s.data.as_ref().and_then(|d| d.get(&r.key)) {
            Some(v) => Ok(Some(Ok(String::from_utf8_lossy(&v.0).into_owned()))),
            None if optional => Ok(None),
            None => Err(format!("couldn't find key {} in Secret {ns}/{}", r.key, r.name)),
        };
    }
    Ok(Some(Ok(String::new())))
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
        let env = build(
            &p,
            &p.spec.as_ref().unwrap().containers[0],
            &facts,
            &EnvObjects::default(),
        )
        .unwrap();
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
        let e = build(
            &p,
            &p.spec.as_ref().unwrap().containers[0],
            &PodFacts::default(),
            &EnvObjects::default(),
        )
        .unwrap_err();
        assert!(e.contains("env[0] (X)") && e.contains("spec.nope"), "{e}");
    }

    fn objects() -> EnvObjects {
        let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cfg"}, "data": {"MODE": "fast", "1BAD": "x", "LEVEL": "3"}
        }))
        .unwrap();
        let sec: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "sec"}, "data": {"PASSWORD": "aHVudGVyMg==", "bad key": "eA=="}
        }))
        .unwrap();
        let mut o = EnvObjects::default();
        o.config_maps.insert("cfg".into(), Ok(Some(std::sync::Arc::new(cm))));
        o.config_maps.insert("missing".into(), Ok(None));
        o.secrets.insert("sec".into(), Ok(Some(std::sync::Arc::new(sec))));
        o.secrets
            .insert("forbidden".into(), Err("secrets \"forbidden\" is forbidden: no".into()));
        o.service_env = Ok(vec![
            ("KUBERNETES_SERVICE_HOST".into(), "10.96.0.1".into()),
            ("MODE".into(), "from-service".into()),
        ]);
        o
    }

    fn container(env_from: serde_json::Value, env: serde_json::Value) -> (Pod, Container) {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "envFrom": env_from, "env": env}]}
        }))
        .unwrap();
        let c = p.spec.as_ref().unwrap().containers[0].clone();
        (p, c)
    }

    #[test]
    fn env_from_objects_and_services() {
        let (p, c) = container(
            serde_json::json!([{"configMapRef": {"name": "cfg"}}, {"secretRef": {"name": "sec"}, "prefix": "S_"},
                               {"configMapRef": {"name": "missing", "optional": true}}]),
            serde_json::json!([
                {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "LEVEL"}}},
                {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "PASSWORD"}}},
                {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nope", "optional": true}}},
                {"name": "URL", "value": "$(KUBERNETES_SERVICE_HOST)/$(MODE)"}
            ]),
        );
        let o = objects();
        let env = build(&p, &c, &PodFacts::default(), &o).unwrap();
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["LEVEL", "MODE", "S_PASSWORD", "PW", "URL", "KUBERNETES_SERVICE_HOST"],
            "envFrom first (invalid keys skipped), entries, then the services not set"
        );
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()).unwrap();
        assert_eq!(get("MODE"), "fast", "the container's own value wins over the service's");
        assert_eq!(get("S_PASSWORD"), "hunter2");
        assert_eq!(get("PW"), "hunter2");
        assert_eq!(get("URL"), "10.96.0.1/fast");
        let warnings = invalid_env_from_keys(&p, &c, &o);
        assert_eq!(
            warnings,
            [
                "Keys [1BAD] from the EnvFrom configMap ns/cfg were skipped since they are considered invalid environment variable names.",
                "Keys [S_bad key] from the EnvFrom secret ns/sec were skipped since they are considered invalid environment variable names."
            ]
        );
    }

    #[test]
    fn missing_objects_give_kubelets_errors() {
        let o = objects();
        let err = |env_from: serde_json::Value, env: serde_json::Value| {
            let (p, c) = container(env_from, env);
            build(&p, &c, &PodFacts::default(), &o).unwrap_err()
        };
        assert_eq!(
            err(
                serde_json::json!([{"configMapRef": {"name": "missing"}}]),
                serde_json::json!([])
            ),
            "configmap \"missing\" not found"
        );
        assert_eq!(
            err(
                serde_json::json!([]),
                serde_json::json!([{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nope"}}}])
            ),
            "couldn't find key nope in ConfigMap ns/cfg"
        );
        assert_eq!(
            err(
                serde_json::json!([]),
                serde_json::json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "nope"}}}])
            ),
            "couldn't find key nope in Secret ns/sec"
        );
        assert_eq!(
            err(
                serde_json::json!([{"secretRef": {"name": "forbidden", "optional": true}}]),
                serde_json::json!([])
            ),
            "secrets \"forbidden\" is forbidden: no",
            "optional covers only a missing object"
        );
        let mut no_services = objects();
        no_services.service_env = Err("failed to list services when setting up env vars".into());
        let (p, c) = container(serde_json::json!([]), serde_json::json!([]));
        assert!(build(&p, &c, &PodFacts::default(), &no_services).is_err());
        // Standalone (nothing fetched): a reference cannot be resolved.
        let (p, c) = container(
            serde_json::json!([{"secretRef": {"name": "sec"}}]),
            serde_json::json!([]),
        );
        let e = build(&p, &c, &PodFacts::default(), &EnvObjects::default()).unwrap_err();
        assert!(e.contains("no kubeClient"), "{e}");
    }

    #[test]
    fn env_var_names() {
        for ok in ["A", "a.b", "-x", "_1", "MY_VAR9"] {
            assert!(is_env_var_name(ok), "{ok}");
        }
        for bad in ["", "1A", "a b", "a=b", "é"] {
            assert!(!is_env_var_name(bad), "{bad}");
        }
    }
}
