//! Kubernetes' v1 defaulting for the fields kubelet relies on, so a pod read from a short
//! manifest looks in `/pods` as it would from the API server: restartPolicy Always, dnsPolicy
//! ClusterFirst, grace period 30s, termination message path and policy, image pull policy from
//! the tag, probe timings, port protocols, requests defaulted from limits.

use k8s_openapi::api::core::v1::{Container, Pod, Probe};

pub fn apply(pod: &mut Pod) {
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.scheduler_name.get_or_insert_with(|| "default-scheduler".into());
    spec.security_context.get_or_insert_with(Default::default);
    spec.enable_service_links.get_or_insert(true);
    spec.priority.get_or_insert(0);
    if spec.host_network == Some(true) {
        // Host networking publishes containerPort on the node: hostPort defaults to it.
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            for p in c.ports.iter_mut().flatten() {
                if p.host_port.unwrap_or(0) == 0 {
                    p.host_port = Some(p.container_port);
                }
            }
        }
    }
    for c in spec.containers.iter_mut() {
        container(c);
    }
    for c in spec.init_containers.iter_mut().flatten() {
        container(c);
    }
    for v in spec.volumes.iter_mut().flatten() {
        if let Some(e) = v.config_map.as_mut() {
            e.default_mode.get_or_insert(0o644);
        }
        if let Some(s) = v.secret.as_mut() {
            s.default_mode.get_or_insert(0o644);
        }
        if let Some(d) = v.downward_api.as_mut() {
            d.default_mode.get_or_insert(0o644);
            for item in d.items.iter_mut().flatten() {
                if let Some(f) = item.field_ref.as_mut() {
                    f.api_version.get_or_insert_with(|| "v1".into());
                }
            }
        }
        if let Some(h) = v.host_path.as_mut() {
            h.type_.get_or_insert_with(String::new);
        }
    }
}

fn container(c: &mut Container) {
    c.termination_message_path
        .get_or_insert_with(|| "/dev/termination-log".into());
    c.termination_message_policy.get_or_insert_with(|| "File".into());
    if c.image_pull_policy.is_none() {
        c.image_pull_policy = Some(default_pull_policy(c.image.as_deref().unwrap_or("")).into());
    }
    for p in c.ports.iter_mut().flatten() {
        p.protocol.get_or_insert_with(|| "TCP".into());
    }
    for e in c.env.iter_mut().flatten() {
        if let Some(f) = e.value_from.as_mut().and_then(|v| v.field_ref.as_mut()) {
            f.api_version.get_or_insert_with(|| "v1".into());
        }
    }
    if let Some(r) = c.resources.as_mut() {
        if let Some(limits) = &r.limits {
            let req = r.requests.get_or_insert_with(Default::default);
            for (k, v) in limits {
                req.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    for p in [&mut c.liveness_probe, &mut c.readiness_probe, &mut c.startup_probe]
        .into_iter()
        .flatten()
    {
        probe(p);
    }
    if let Some(l) = c.lifecycle.as_mut() {
        for h in [&mut l.post_start, &mut l.pre_stop].into_iter().flatten() {
            if let Some(g) = h.http_get.as_mut() {
                g.scheme.get_or_insert_with(|| "HTTP".into());
                g.path.get_or_insert_with(|| "/".into());
            }
        }
    }
}

fn probe(p: &mut Probe) {
    p.timeout_seconds.get_or_insert(1);
    p.period_seconds.get_or_insert(10);
    p.success_threshold.get_or_insert(1);
    p.failure_threshold.get_or_insert(3);
    if let Some(g) = p.http_get.as_mut() {
        g.scheme.get_or_insert_with(|| "HTTP".into());
        g.path.get_or_insert_with(|| "/".into());
    }
    if let Some(g) = p.grpc.as_mut() {
        g.service.get_or_insert_with(String::new);
    }
}

/// `Always` for `:latest` or untagged images, else `IfNotPresent` (digests count as tags).
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        None => "Always",
        Some((_, "latest")) => "Always",
        Some(_) => "IfNotPresent",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_from_tag() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("busybox:1.35"), "IfNotPresent");
        assert_eq!(default_pull_policy("localhost:5000/busybox"), "Always");
    }

    #[test]
    fn defaults_fill_the_usual_fields() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "busybox:1.35",
                "resources": {"limits": {"cpu": "1"}},
                "livenessProbe": {"httpGet": {"port": 80}}}]}
        }))
        .unwrap();
        apply(&mut pod);
        let s = pod.spec.as_ref().unwrap();
        assert_eq!(s.restart_policy.as_deref(), Some("Always"));
        assert_eq!(s.termination_grace_period_seconds, Some(30));
        let c = &s.containers[0];
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(c.termination_message_path.as_deref(), Some("/dev/termination-log"));
        assert!(c
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()
            .contains_key("cpu"));
        let p = c.liveness_probe.as_ref().unwrap();
        assert_eq!((p.period_seconds, p.failure_threshold), (Some(10), Some(3)));
        assert_eq!(p.http_get.as_ref().unwrap().path.as_deref(), Some("/"));
    }
}
