//! Pod sysctls as kubelet 1.26 judges them (pkg/kubelet/sysctl): the safe set every pod may
//! set, the namespaced groups a sysctl must belong to, `allowedUnsafeSysctls` patterns, and the
//! checks of the sysctl admit handler, with kubelet's messages. docs/agent.md#sysctls

use k8s_openapi::api::core::v1::Pod;

/// The sysctls kubelet 1.26 allows in every pod (`SafeSysctlAllowlist`).
pub const SAFE: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
];

/// kubelet's admit handler's reason.
pub const REASON: &str = "SysctlForbidden";

/// The kernel namespace a sysctl belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Namespace {
    Ipc,
    Net,
}

impl Namespace {
    fn name(self) -> &'static str {
        match self {
            Namespace::Ipc => "ipc",
            Namespace::Net => "net",
        }
    }
}

/// kubelet's `NamespacedBy`: `kernel.sem` exactly, names starting `kernel.shm`, `kernel.msg`
/// or `fs.mqueue.` are IPC; names starting `net.` are the network namespace's; any other is
/// not namespaced (setting it would change the node).
pub fn namespaced_by(name: &str) -> Option<Namespace> {
    if name == "kernel.sem" {
        return Some(Namespace::Ipc);
    }
    for (prefix, ns) in [
        ("kernel.shm", Namespace::Ipc),
        ("kernel.msg", Namespace::Ipc),
        ("fs.mqueue.", Namespace::Ipc),
        ("net.", Namespace::Net),
    ] {
        if name.starts_with(prefix) {
            return Some(ns);
        }
    }
    None
}

/// sysctl.d(5)'s slash form to dots: when the first separator is `/`, every `/` becomes `.`
/// and every `.` a `/` (`net/ipv4/conf/eth0.100/forwarding` ->
/// `net.ipv4.conf.eth0/100.forwarding`). kubelet compares and sends the dotted form.
pub fn to_dots(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '/' => '.',
                '.' => '/',
                c => c,
            })
            .collect(),
        _ => name.to_string(),
    }
}

const MAX_LEN: usize = 253;

/// One segment of a sysctl name: `[a-z0-9]([-_a-z0-9]*[a-z0-9])?`.
fn segment(x: &str) -> bool {
    let b = x.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
        && b.iter().all(|c| alnum(c) || *c == b'-' || *c == b'_')
}

/// The pattern grammar of `allowedUnsafeSysctls` (kubelet's IsValidSysctlPattern): dot or
/// slash separated segments of `[a-z0-9]([-_a-z0-9]*[a-z0-9])?`, the last of which may end in
/// `*`.
fn valid_pattern(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_LEN {
        return false;
    }
    let segments: Vec<&str> = s.split(['.', '/']).collect();
    let (last, rest) = segments.split_last().expect("split yields one");
    // the last segment: ([a-z0-9][-_a-z0-9]*)?[a-z0-9*]
    let last_ok = match last.strip_suffix('*') {
        Some(body) => {
            let b = body.as_bytes();
            b.is_empty()
                || (segment(&body[..1])
                    && b.iter()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'_'))
        }
        None => segment(last),
    };
    rest.iter().all(|x| segment(x)) && last_ok
}

const PATTERN_REGEX: &str = r"([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]";

/// The sysctls a node allows: the safe set and `allowedUnsafeSysctls`, names exactly or
/// prefixes (a pattern ending in `*`), each with the namespace it belongs to.
#[derive(Debug, Clone, Default)]
pub struct Allowlist {
    exact: Vec<(String, Namespace)>,
    prefixes: Vec<(String, Namespace)>,
}

impl Allowlist {
    /// kubelet's NewAllowlist over the safe set and `unsafe_patterns`: an invalid pattern or
    /// one outside the namespaced groups is an error with kubelet's message.
    pub fn new(unsafe_patterns: &[String]) -> Result<Allowlist, String> {
        let mut w = Allowlist::default();
        for s in SAFE
            .iter()
            .map(|s| s.to_string())
            .chain(unsafe_patterns.iter().cloned())
        {
            if !valid_pattern(&s) {
                return Err(format!(
                    "sysctl {s:?} must have at most {MAX_LEN} characters and match regex {PATTERN_REGEX}"
                ));
            }
            let s = to_dots(&s);
            if let Some(prefix) = s.strip_suffix('*') {
                let ns =
                    namespaced_by(prefix).ok_or_else(|| format!("the sysctls {s:?} are not known to be namespaced"))?;
                w.prefixes.push((prefix.to_string(), ns));
            } else {
                let ns = namespaced_by(&s).ok_or_else(|| format!("the sysctl {s:?} are not known to be namespaced"))?;
                w.exact.push((s, ns));
            }
        }
        Ok(w)
    }

    /// kubelet's validateSysctl: allowed by name or prefix, and not in a namespace the pod
    /// shares with the node.
    pub fn check(&self, name: &str, host_net: bool, host_ipc: bool) -> Result<(), String> {
        let name = to_dots(name);
        let ns = self
            .exact
            .iter()
            .find(|(n, _)| *n == name)
            .or_else(|| self.prefixes.iter().find(|(p, _)| name.starts_with(p.as_str())))
            .map(|(_, ns)| *ns)
            .ok_or_else(|| format!("{name:?} not allowlisted"))?;
        if (ns == Namespace::Ipc && host_ipc) || (ns == Namespace::Net && host_net) {
            return Err(format!("{name:?} not allowed with host {} enabled", ns.name()));
        }
        Ok(())
    }

    /// The sysctl admit handler: the first of the pod's sysctls that is not allowed, as
    /// kubelet's message ("forbidden sysctl: ...").
    pub fn admit(&self, p: &Pod) -> Result<(), String> {
        let spec = super::spec(p);
        let host_net = spec.host_network.unwrap_or(false);
        let host_ipc = spec.host_ipc.unwrap_or(false);
        for s in spec.security_context.iter().flat_map(|sc| sc.sysctls.iter().flatten()) {
            self.check(&s.name, host_net, host_ipc)
                .map_err(|e| format!("forbidden sysctl: {e}"))?;
        }
        Ok(())
    }
}

/// The API server's validation of `spec.securityContext.sysctls`: names required, at most 253
/// characters of dot or slash separated segments, no name twice (values are not checked).
pub fn validate(p: &Pod, errs: &mut Vec<String>) {
    let sysctls = super::spec(p)
        .security_context
        .iter()
        .flat_map(|sc| sc.sysctls.iter().flatten());
    let mut seen = std::collections::HashSet::new();
    for (i, s) in sysctls.enumerate() {
        let field = format!("spec.securityContext.sysctls[{i}].name");
        let name = s.name.as_str();
        if name.is_empty() {
            errs.push(format!("{field}: Required value"));
        } else if name.len() > MAX_LEN || !name.split(['.', '/']).all(segment) {
            errs.push(format!(
                "{field}: Invalid value: {name:?}: must have at most {MAX_LEN} characters and match regex \
                 ^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$"
            ));
        } else if !seen.insert(name) {
            errs.push(format!("{field}: Duplicate value: {name:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(extra: serde_json::Value) -> Pod {
        let mut v = serde_json::json!({"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x"}]}});
        for (k, x) in extra.as_object().unwrap() {
            v["spec"][k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    fn sysctls(names: &[&str]) -> serde_json::Value {
        serde_json::json!({"securityContext":{"sysctls": names.iter().map(|n| serde_json::json!({"name": n, "value": "1"})).collect::<Vec<_>>()}})
    }

    #[test]
    fn the_safe_set_is_allowed_and_nothing_else() {
        let w = Allowlist::new(&[]).unwrap();
        for s in SAFE {
            assert_eq!(w.check(s, false, false), Ok(()), "{s}");
        }
        assert_eq!(
            w.check("net.core.somaxconn", false, false),
            Err("\"net.core.somaxconn\" not allowlisted".into())
        );
        assert_eq!(
            w.admit(&pod(sysctls(&["kernel.shm_rmid_forced", "kernel.msgmax"]))),
            Err("forbidden sysctl: \"kernel.msgmax\" not allowlisted".into())
        );
    }

    #[test]
    fn unsafe_patterns_extend_it_by_name_and_prefix() {
        let w = Allowlist::new(&["net.core.somaxconn".into(), "kernel.msg*".into(), "kernel/sem".into()]).unwrap();
        assert_eq!(w.check("net.core.somaxconn", false, false), Ok(()));
        assert_eq!(w.check("kernel.msgmax", false, false), Ok(()));
        assert_eq!(w.check("kernel/msgmnb", false, false), Ok(()), "slash form");
        assert_eq!(w.check("kernel.sem", false, false), Ok(()));
        assert!(w.check("net.core.rmem_max", false, false).is_err());
    }

    #[test]
    fn host_namespaces_refuse_their_sysctls() {
        let w = Allowlist::new(&["kernel.msg*".into()]).unwrap();
        assert_eq!(
            w.check("net.ipv4.tcp_syncookies", true, false),
            Err("\"net.ipv4.tcp_syncookies\" not allowed with host net enabled".into())
        );
        assert_eq!(
            w.check("kernel.msgmax", false, true),
            Err("\"kernel.msgmax\" not allowed with host ipc enabled".into())
        );
        assert_eq!(w.check("kernel.shm_rmid_forced", true, false), Ok(()));
        let host_net = pod(
            serde_json::json!({"hostNetwork": true, "securityContext":{"sysctls":[{"name":"net.ipv4.ping_group_range","value":"0 1"}]}}),
        );
        assert_eq!(
            w.admit(&host_net),
            Err("forbidden sysctl: \"net.ipv4.ping_group_range\" not allowed with host net enabled".into())
        );
    }

    #[test]
    fn bad_unsafe_patterns_stop_the_node_with_kubelets_message() {
        let e = Allowlist::new(&["kernel.*".into()]).unwrap_err();
        assert_eq!(e, "the sysctls \"kernel.*\" are not known to be namespaced");
        let e = Allowlist::new(&["vm.swappiness".into()]).unwrap_err();
        assert_eq!(e, "the sysctl \"vm.swappiness\" are not known to be namespaced");
        for bad in ["net.*.foo", "net.-", " kernel.msg*", "kernel.msg* ", "*a"] {
            let e = Allowlist::new(&[bad.into()]).unwrap_err();
            assert!(e.contains("must have at most 253 characters"), "{bad}: {e}");
        }
        assert!(Allowlist::new(&["kernel.msg*".into(), "kernel.sem".into(), "kernel/msg*".into()]).is_ok());
    }

    #[test]
    fn slash_names_convert_as_sysctl_d() {
        assert_eq!(
            to_dots("net/ipv4/conf/eth0.100/forwarding"),
            "net.ipv4.conf.eth0/100.forwarding"
        );
        assert_eq!(to_dots("net.ipv4.ip_forward"), "net.ipv4.ip_forward");
    }

    #[test]
    fn api_validation_names_the_entry() {
        let mut errs = Vec::new();
        validate(
            &pod(sysctls(&[
                "net.ipv4.tcp_syncookies",
                "",
                "Net.Bad",
                "net.ipv4.tcp_syncookies",
            ])),
            &mut errs,
        );
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert_eq!(errs[0], "spec.securityContext.sysctls[1].name: Required value");
        assert!(errs[1].starts_with("spec.securityContext.sysctls[2].name: Invalid value: \"Net.Bad\""));
        assert_eq!(
            errs[2],
            "spec.securityContext.sysctls[3].name: Duplicate value: \"net.ipv4.tcp_syncookies\""
        );
    }
}
