//! Validation of a static pod before it is admitted, with Kubernetes' field paths in the
//! messages (`spec.containers[0].image: Required value`), and the features ferrolet refuses
//! rather than silently ignores.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Pod, Volume};

use crate::pod::units::{bytes, milli};

/// Every problem found; empty means valid.
pub fn validate(pod: &Pod) -> Vec<String> {
    let mut errs = Vec::new();
    let name = pod.metadata.name.as_deref().unwrap_or("");
    if name.is_empty() {
        errs.push("metadata.name: Required value".into());
    } else if !is_dns_subdomain(name) {
        errs.push(format!(
            "metadata.name: Invalid value: {name:?}: must be a lowercase RFC 1123 subdomain"
        ));
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    if !is_dns_label(ns) {
        errs.push(format!(
            "metadata.namespace: Invalid value: {ns:?}: must be a lowercase RFC 1123 label"
        ));
    }
    validate_annotations(pod.metadata.annotations.as_ref(), &mut errs);
    let Some(spec) = &pod.spec else {
        errs.push("spec: Required value".into());
        return errs;
    };
    if spec.containers.is_empty() {
        errs.push("spec.containers: Required value".into());
    }
    // kubelet validates a static pod as the API server validates a new pod: ephemeral
    // containers come only later, through the ephemeralcontainers subresource.
    if spec.ephemeral_containers.as_ref().is_some_and(|e| !e.is_empty()) {
        errs.push("spec.ephemeralContainers: Forbidden: cannot be set on create".into());
    }
    match spec.restart_policy.as_deref() {
        Some("Always") | Some("OnFailure") | Some("Never") | None => {}
        Some(o) => errs.push(format!(
            "spec.restartPolicy: Unsupported value: {o:?}: supported values: \"Always\", \"OnFailure\", \"Never\""
        )),
    }
    match spec.dns_policy.as_deref() {
        Some("ClusterFirst") | Some("ClusterFirstWithHostNet") | Some("Default") | None => {}
        Some("None") => {
            if spec
                .dns_config
                .as_ref()
                .is_none_or(|d| d.nameservers.as_ref().is_none_or(|n| n.is_empty()))
            {
                errs.push(
                    "spec.dnsConfig: Required value: must provide at least one DNS nameserver when dnsPolicy is None"
                        .into(),
                );
            }
        }
        Some(o) => errs.push(format!("spec.dnsPolicy: Unsupported value: {o:?}")),
    }
    if spec.termination_grace_period_seconds.is_some_and(|g| g < 0) {
        errs.push("spec.terminationGracePeriodSeconds: Invalid value: must be >= 0".into());
    }
    if let Some(d) = spec.active_deadline_seconds {
        if !(1..=i32::MAX as i64).contains(&d) {
            errs.push(format!(
                "spec.activeDeadlineSeconds: Invalid value: {d}: must be between 1 and {}, inclusive",
                i32::MAX
            ));
        }
    }
    for (i, a) in spec.host_aliases.iter().flatten().enumerate() {
        let p = format!("spec.hostAliases[{i}]");
        if a.ip.parse::<std::net::IpAddr>().is_err() {
            errs.push(format!("{p}.ip: Invalid value: {:?}: must be a valid IP address", a.ip));
        }
        for (j, h) in a.hostnames.iter().flatten().enumerate() {
            if !is_dns_subdomain(h) {
                errs.push(format!(
                    "{p}.hostnames[{j}]: Invalid value: {h:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"
                ));
            }
        }
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        for (j, s) in v
            .projected
            .iter()
            .flat_map(|pr| pr.sources.iter().flatten())
            .enumerate()
        {
            if let Some(secs) = s.service_account_token.as_ref().and_then(|t| t.expiration_seconds) {
                let f = format!("spec.volumes[{i}].projected.sources[{j}].serviceAccountToken.expirationSeconds");
                if secs < 600 {
                    errs.push(format!(
                        "{f}: Invalid value: {secs}: may not specify a duration less than 10 minutes"
                    ));
                } else if secs > 1 << 32 {
                    errs.push(format!(
                        "{f}: Invalid value: {secs}: may not specify a duration larger than 2^32 seconds"
                    ));
                }
            }
        }
    }
    if let Some(h) = &spec.hostname {
        if !is_dns_label(h) {
            errs.push(format!("spec.hostname: Invalid value: {h:?}: must be a DNS label"));
        }
    }
    super::sysctl::validate(pod, &mut errs);
    if spec.share_process_namespace == Some(true) && spec.host_pid == Some(true) {
        errs.push(
            "spec.securityContext.shareProcessNamespace: Invalid value: true: ShareProcessNamespace and HostPID cannot both be enabled"
                .into(),
        );
    }
    // hostUsers: false (a user namespace of the pod's own) excludes the node's namespaces.
    // Every volume type is allowed, as Kubernetes allows them since 1.28 (1.26's alpha took
    // only emptyDir, configMap, secret, downwardAPI and projected): docs/userns.md.
    if spec.host_users == Some(false) {
        for (field, on) in [
            ("hostNetwork", spec.host_network),
            ("HostPID", spec.host_pid),
            ("HostIPC", spec.host_ipc),
        ] {
            if on == Some(true) {
                errs.push(format!("spec.{field}: Forbidden: when `pod.Spec.HostUsers` is false"));
            }
        }
    }
    let mut vol_names = HashSet::new();
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let p = format!("spec.volumes[{i}]");
        if !is_dns_label(&v.name) {
            errs.push(format!("{p}.name: Invalid value: {:?}", v.name));
        }
        if !vol_names.insert(v.name.clone()) {
            errs.push(format!("{p}.name: Duplicate value: {:?}", v.name));
        }
        let n = volume_sources(v);
        if n == 0 {
            errs.push(format!("{p}: Required value: must specify a volume type"));
        } else if n > 1 {
            errs.push(format!("{p}: Forbidden: may not specify more than 1 volume type"));
        }
        if let Some(h) = &v.host_path {
            if !h.path.starts_with('/') {
                errs.push(format!(
                    "{p}.hostPath.path: Invalid value: {:?}: must be an absolute path",
                    h.path
                ));
            }
        }
    }
    let mut names = HashSet::new();
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| ("initContainers", c))
        .enumerate()
        .chain(spec.containers.iter().map(|c| ("containers", c)).enumerate());
    for (i, (kind, c)) in all {
        let p = format!("spec.{kind}[{i}]");
        if !names.insert(c.name.clone()) {
            errs.push(format!("{p}.name: Duplicate value: {:?}", c.name));
        }
        container(
            &p,
            kind == "initContainers",
            c,
            &vol_names,
            spec.host_network.unwrap_or(false),
            &mut errs,
        );
    }
    errs
}

fn container(
    p: &str,
    init: bool,
    c: &Container,
    volumes: &HashSet<String>,
    host_network: bool,
    errs: &mut Vec<String>,
) {
    if !is_dns_label(&c.name) {
        errs.push(format!(
            "{p}.name: Invalid value: {:?}: must be a lowercase RFC 1123 label",
            c.name
        ));
    }
    if c.image.as_deref().unwrap_or("").trim().is_empty() {
        errs.push(format!("{p}.image: Required value"));
    }
    match c.image_pull_policy.as_deref() {
        Some("Always") | Some("IfNotPresent") | Some("Never") | None => {}
        Some(o) => errs.push(format!("{p}.imagePullPolicy: Unsupported value: {o:?}")),
    }
    match (init, c.restart_policy.as_deref()) {
        (_, None) | (true, Some("Always")) => {}
        (true, Some(o)) => errs.push(format!(
            "{p}.restartPolicy: Unsupported value: {o:?}: supported values: \"Always\""
        )),
        (false, Some(_)) => errs.push(format!(
            "{p}.restartPolicy: Forbidden: may not be set for non-init containers"
        )),
    }
    match c.termination_message_policy.as_deref() {
        Some("File") | Some("FallbackToLogsOnError") | None => {}
        Some(o) => errs.push(format!("{p}.terminationMessagePolicy: Unsupported value: {o:?}")),
    }
    if let Some(wd) = &c.working_dir {
        if !wd.is_empty() && !wd.starts_with('/') {
            errs.push(format!(
                "{p}.workingDir: Invalid value: {wd:?}: must be an absolute path"
            ));
        }
    }
    for (j, port) in c.ports.iter().flatten().enumerate() {
        let pp = format!("{p}.ports[{j}]");
        if !(1..=65535).contains(&port.container_port) {
            errs.push(format!(
                "{pp}.containerPort: Invalid value: {}: must be between 1 and 65535",
                port.container_port
            ));
        }
        if let Some(h) = port.host_port {
            if !(0..=65535).contains(&h) {
                errs.push(format!(
                    "{pp}.hostPort: Invalid value: {h}: must be between 1 and 65535"
                ));
            }
            if host_network && h != 0 && h != port.container_port {
                errs.push(format!(
                    "{pp}.hostPort: Invalid value: {h}: must match containerPort when hostNetwork is true"
                ));
            }
        }
        match port.protocol.as_deref() {
            Some("TCP") | Some("UDP") | Some("SCTP") | None => {}
            Some(o) => errs.push(format!("{pp}.protocol: Unsupported value: {o:?}")),
        }
    }
    for (name, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if let Some(pr) = probe {
            validate_probe(&format!("{p}.{name}"), name, pr, errs);
        }
    }
    if let Some(l) = &c.lifecycle {
        for (name, h) in [("postStart", &l.post_start), ("preStop", &l.pre_stop)] {
            if let Some(s) = h.as_ref().and_then(|h| h.sleep.as_ref()) {
                if s.seconds < 0 {
                    errs.push(format!(
                        "{p}.lifecycle.{name}.sleep.seconds: Invalid value: {}: must be greater than or equal to 0",
                        s.seconds
                    ));
                }
            }
        }
    }
    for (j, e) in c.env.iter().flatten().enumerate() {
        if e.name.is_empty() || e.name.contains('=') {
            errs.push(format!("{p}.env[{j}].name: Invalid value: {:?}", e.name));
        }
        if e.value.is_some() && e.value_from.is_some() {
            errs.push(format!(
                "{p}.env[{j}].valueFrom: Invalid value: may not be specified when `value` is not empty"
            ));
        }
    }
    let mut mount_paths = HashSet::new();
    for (j, m) in c.volume_mounts.iter().flatten().enumerate() {
        let mp = format!("{p}.volumeMounts[{j}]");
        if !volumes.contains(&m.name) {
            errs.push(format!("{mp}.name: Not found: {:?}", m.name));
        }
        if m.mount_path.is_empty() {
            errs.push(format!("{mp}.mountPath: Required value"));
        } else if !mount_paths.insert(m.mount_path.clone()) {
            errs.push(format!(
                "{mp}.mountPath: Invalid value: {:?}: must be unique",
                m.mount_path
            ));
        }
        if let Some(sp) = &m.sub_path {
            if sp.starts_with('/') || sp.split('/').any(|x| x == "..") {
                errs.push(format!(
                    "{mp}.subPath: Invalid value: {sp:?}: must be a relative path without '..'"
                ));
            }
        }
    }
    if let Some(r) = &c.resources {
        for (k, q) in r.requests.iter().flatten().chain(r.limits.iter().flatten()) {
            let ok = match k.as_str() {
                "cpu" => milli(&q.0).is_ok(),
                _ => bytes(&q.0).is_ok(),
            };
            if !ok {
                errs.push(format!(
                    "{p}.resources: Invalid value: {:?}: {k} quantity {:?} is not valid",
                    q.0, q.0
                ));
            }
        }
        if let (Some(req), Some(lim)) = (&r.requests, &r.limits) {
            for (k, rq) in req {
                if let Some(lq) = lim.get(k) {
                    let (a, b) = if k == "cpu" {
                        (milli(&rq.0).unwrap_or(0), milli(&lq.0).unwrap_or(0))
                    } else {
                        (bytes(&rq.0).unwrap_or(0), bytes(&lq.0).unwrap_or(0))
                    };
                    if a > b {
                        errs.push(format!("{p}.resources.requests[{k}]: Invalid value: {:?}: must be less than or equal to {k} limit of {}", rq.0, lq.0));
                    }
                }
            }
        }
    }
    if let Some(sc) = &c.security_context {
        if let Some(pm) = &sc.proc_mount {
            if pm != "Default" && pm != "Unmasked" {
                errs.push(format!("{p}.securityContext.procMount: Unsupported value: {pm:?}"));
            }
        }
    }
}

/// The API server's validateProbe: counts and periods non-negative, a probe's own grace
/// period positive, liveness and startup probes succeeding once, ports in range.
fn validate_probe(p: &str, kind: &str, pr: &k8s_openapi::api::core::v1::Probe, errs: &mut Vec<String>) {
    for (field, v) in [
        ("initialDelaySeconds", pr.initial_delay_seconds),
        ("timeoutSeconds", pr.timeout_seconds),
        ("periodSeconds", pr.period_seconds),
        ("successThreshold", pr.success_threshold),
        ("failureThreshold", pr.failure_threshold),
    ] {
        if let Some(v) = v.filter(|v| *v < 0) {
            errs.push(format!(
                "{p}.{field}: Invalid value: {v}: must be greater than or equal to 0"
            ));
        }
    }
    if let Some(g) = pr.termination_grace_period_seconds.filter(|g| *g <= 0) {
        errs.push(format!(
            "{p}.terminationGracePeriodSeconds: Invalid value: {g}: must be greater than 0"
        ));
    }
    if kind != "readinessProbe" {
        if let Some(s) = pr.success_threshold.filter(|s| *s != 1) {
            errs.push(format!("{p}.successThreshold: Invalid value: {s}: must be 1"));
        }
    }
    let port =
        |field: &str, port: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString, errs: &mut Vec<String>| {
            use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
            match port {
                IntOrString::Int(n) if !(1..=65535).contains(n) => errs.push(format!(
                    "{p}.{field}: Invalid value: {n}: must be between 1 and 65535, inclusive"
                )),
                IntOrString::String(s) if !is_port_name(s) => errs.push(format!(
                    "{p}.{field}: Invalid value: {s:?}: must be a port number or an IANA service name"
                )),
                _ => {}
            }
        };
    if let Some(h) = &pr.http_get {
        port("httpGet.port", &h.port, errs);
    }
    if let Some(t) = &pr.tcp_socket {
        port("tcpSocket.port", &t.port, errs);
    }
    if let Some(g) = &pr.grpc {
        if !(1..=65535).contains(&g.port) {
            errs.push(format!(
                "{p}.grpc.port: Invalid value: {}: must be between 1 and 65535, inclusive",
                g.port
            ));
        }
    }
}

/// An IANA service name: 1-15 lowercase letters, digits and '-', at least one letter, no '-'
/// at either end or twice in a row.
fn is_port_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.bytes().any(|b| b.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

fn volume_sources(v: &Volume) -> usize {
    [
        v.empty_dir.is_some(),
        v.host_path.is_some(),
        v.config_map.is_some(),
        v.secret.is_some(),
        v.downward_api.is_some(),
        v.projected.is_some(),
        v.persistent_volume_claim.is_some(),
        v.nfs.is_some(),
        v.iscsi.is_some(),
        v.csi.is_some(),
        v.ephemeral.is_some(),
        v.image.is_some(),
        v.fc.is_some(),
        v.git_repo.is_some(),
        v.cephfs.is_some(),
        v.rbd.is_some(),
        v.glusterfs.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count()
}

/// Features ferrolet does not run, each with the reason a user sees in the pod's status.
/// Returns the first one found. Volumes are not judged here: as kubelet, a volume no plugin
/// serves is the volume manager's FailedMount (the pod waits in ContainerCreating with the
/// reason, see src/volumemanager/plugins.rs); static pods read ConfigMaps and Secrets from
/// the static pod path (src/objects/local.rs).
pub fn unsupported(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(rc) = spec.runtime_class_name.as_deref().filter(|s| !s.is_empty()) {
        return Some(format!(
            "spec.runtimeClassName: {rc:?}: ferrolet has one runtime and no runtime classes"
        ));
    }
    None
}

/// Kubernetes' limit on all of an object's annotations together (keys and values).
pub const TOTAL_ANNOTATION_SIZE: usize = 256 * 1024;

/// apimachinery's ValidateAnnotations: qualified-name keys, and at most 256 KiB in all.
fn validate_annotations(ann: Option<&std::collections::BTreeMap<String, String>>, errs: &mut Vec<String>) {
    let Some(ann) = ann else { return };
    let mut total = 0;
    for (k, v) in ann {
        total += k.len() + v.len();
        if let Err(why) = qualified_name(k) {
            errs.push(format!("metadata.annotations: Invalid value: {k:?}: {why}"));
        }
    }
    if total > TOTAL_ANNOTATION_SIZE {
        errs.push(format!(
            "metadata.annotations: Too long: must have at most {TOTAL_ANNOTATION_SIZE} bytes"
        ));
    }
}

/// A qualified name (`[prefix/]name`, as label and annotation keys are): an optional DNS
/// subdomain prefix, then 1-63 alphanumerics, '-', '_' or '.', starting and ending with an
/// alphanumeric.
pub fn qualified_name(s: &str) -> Result<(), String> {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if p.is_empty() || !is_dns_subdomain(p) {
            return Err("prefix part must be a lowercase RFC 1123 subdomain".into());
        }
    }
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err("name part must consist of alphanumeric characters, '-', '_' or '.', must start and end with an alphanumeric character, and be at most 63 characters".into())
    }
}

/// An RFC 1123 subdomain: dot-separated DNS labels, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && !s.is_empty() && s.split('.').all(is_dns_label)
}

/// An RFC 1123 label: lowercase alphanumerics and '-', at most 63, not starting or ending with '-'.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// kubelet's IsExtendedResourceName: a resource with a domain other than kubernetes.io, that is
/// no quota name (`requests.`), and a valid qualified name.
pub fn is_extended_resource_name(name: &str) -> bool {
    let Some((domain, rest)) = name.split_once('/') else {
        return false;
    };
    if domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") || name.starts_with("requests.") {
        return false;
    }
    is_dns_subdomain(domain) && is_qualified_name_part(rest)
}

/// The name part of a qualified name: at most 63 alphanumerics, `-`, `_` or `.`, starting and
/// ending alphanumeric.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_resource_names() {
        for ok in ["example.com/dev", "nvidia.com/gpu", "a.b/c_d.e-f"] {
            assert!(is_extended_resource_name(ok), "{ok}");
        }
        for bad in [
            "cpu",
            "kubernetes.io/x",
            "node.kubernetes.io/x",
            "requests.a/b",
            "example.com/",
            "Ex@mple/x",
            "a/-b",
        ] {
            assert!(!is_extended_resource_name(bad), "{bad}");
        }
    }

    fn pod(v: serde_json::Value) -> Pod {
        let mut p: Pod = serde_json::from_value(v).unwrap();
        super::super::defaults::apply(&mut p);
        p
    }

    #[test]
    fn valid_pod_has_no_errors() {
        let p = pod(
            serde_json::json!({"metadata":{"name":"a-node"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}),
        );
        assert!(validate(&p).is_empty(), "{:?}", validate(&p));
    }

    #[test]
    fn errors_carry_field_paths() {
        let p = pod(
            serde_json::json!({"metadata":{"name":"a"},"spec":{"restartPolicy":"Sometimes","containers":[
            {"name":"c","image":""},{"name":"c","image":"x","volumeMounts":[{"name":"nope","mountPath":"/x"}]}]}}),
        );
        let e = validate(&p).join("\n");
        assert!(e.contains("spec.restartPolicy: Unsupported value"), "{e}");
        assert!(e.contains("spec.containers[0].image: Required value"), "{e}");
        assert!(e.contains("spec.containers[1].name: Duplicate value"), "{e}");
        assert!(e.contains("spec.containers[1].volumeMounts[0].name: Not found"), "{e}");
    }

    #[test]
    fn numbers_out_of_kubernetes_ranges_are_refused() {
        let p = pod(serde_json::json!({"metadata":{"name":"a"},"spec":{
            "activeDeadlineSeconds": 9223372036854775807i64,
            "hostAliases": [{"ip": "1.2.3.4\n5.6.7.8 evil", "hostnames": ["ok.example", "bad\nline"]}],
            "containers":[{"name":"c","image":"x",
                "livenessProbe": {"exec": {"command": ["true"]}, "periodSeconds": -1, "successThreshold": 2,
                    "terminationGracePeriodSeconds": 0},
                "readinessProbe": {"httpGet": {"port": 70000}, "successThreshold": 3},
                "startupProbe": {"tcpSocket": {"port": "Not_A_Name"}},
                "lifecycle": {"preStop": {"sleep": {"seconds": -5}}}}],
            "volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "expirationSeconds": 60}}]}}]
        }}));
        let e = validate(&p).join("\n");
        for want in [
            "spec.activeDeadlineSeconds: Invalid value: 9223372036854775807: must be between 1 and 2147483647, inclusive",
            "spec.hostAliases[0].ip: Invalid value",
            "spec.hostAliases[0].hostnames[1]: Invalid value",
            "spec.containers[0].livenessProbe.periodSeconds: Invalid value: -1",
            "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
            "spec.containers[0].livenessProbe.terminationGracePeriodSeconds: Invalid value: 0: must be greater than 0",
            "spec.containers[0].readinessProbe.httpGet.port: Invalid value: 70000",
            "spec.containers[0].startupProbe.tcpSocket.port: Invalid value: \"Not_A_Name\"",
            "spec.containers[0].lifecycle.preStop.sleep.seconds: Invalid value: -5",
            "serviceAccountToken.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes",
        ] {
            assert!(e.contains(want), "want {want}: {e}");
        }
        assert!(!e.contains("hostnames[0]"), "{e}");
        assert!(
            !e.contains("readinessProbe.successThreshold"),
            "readiness may need several: {e}"
        );
    }

    #[test]
    fn a_static_pod_may_not_name_ephemeral_containers() {
        let p = pod(
            serde_json::json!({"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"x"}],
            "ephemeralContainers":[{"name":"dbg","image":"x"}]}}),
        );
        assert_eq!(
            validate(&p),
            ["spec.ephemeralContainers: Forbidden: cannot be set on create"]
        );
        // From the API server (where the subresource added them) they are admitted.
        assert_eq!(unsupported(&p), None);
    }

    #[test]
    fn stdin_and_tty_are_supported() {
        let p = pod(serde_json::json!({"metadata":{"name":"a"},"spec":{"containers":[
            {"name":"c","image":"x","stdin":true,"stdinOnce":true,"tty":true}]}}));
        assert_eq!(unsupported(&p), None);
        assert!(validate(&p).is_empty(), "{:?}", validate(&p));
    }

    #[test]
    fn objects_and_volume_types_are_not_refused_at_admission() {
        // ConfigMaps and Secrets come from the API server or, for static pods, from the static
        // pod path; a volume type no plugin serves is the volume manager's FailedMount.
        for source in ["api", "file"] {
            let p = pod(
                serde_json::json!({"metadata":{"name":"a","annotations":{"kubernetes.io/config.source":source}},
                "spec":{"containers":[{"name":"c","image":"x",
                    "envFrom":[{"secretRef":{"name":"s"}}],
                    "env":[{"name":"X","valueFrom":{"configMapKeyRef":{"name":"x","key":"k"}}}]}],
                "volumes":[{"name":"cfg","configMap":{"name":"x"}},{"name":"s","secret":{"secretName":"s"}},
                    {"name":"data","persistentVolumeClaim":{"claimName":"c"}},
                    {"name":"api","projected":{"sources":[{"serviceAccountToken":{"path":"token"}}]}}]}}),
            );
            assert_eq!(unsupported(&p), None, "{source}");
        }
    }

    #[test]
    fn annotations_are_bounded_and_keyed_as_kubernetes_requires() {
        let with = |ann: serde_json::Value| -> Vec<String> {
            validate(
                &serde_json::from_value(serde_json::json!({"metadata":{"name":"a","annotations":ann},
                    "spec":{"containers":[{"name":"c","image":"x"}]}}))
                .unwrap(),
            )
        };
        assert!(with(serde_json::json!({"example.com/a": "x", "b_c.d": "y"})).is_empty());
        let big = "x".repeat(TOTAL_ANNOTATION_SIZE);
        let e = with(serde_json::json!({"a": big})).join("; ");
        assert!(
            e.contains("metadata.annotations: Too long: must have at most 262144 bytes"),
            "{e}"
        );
        let e = with(serde_json::json!({"-bad": "x"})).join("; ");
        assert!(e.contains("metadata.annotations: Invalid value: \"-bad\""), "{e}");
    }
}
