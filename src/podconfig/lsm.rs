//! AppArmor and SELinux, as kubelet treats them (pkg/security/apparmor and its AppArmor admit
//! handler): a pod that asks for an AppArmor profile other than Unconfined, on a node whose
//! kernel does not enforce AppArmor, is refused with reason `AppArmor` and the message
//! "Cannot enforce AppArmor: AppArmor is not enabled on the host"; on a node that does, the
//! profile is applied to the container's process (src/kuberuntime/container.rs). SELinux: as
//! kubelet and containerd, seLinuxOptions are ignored (said once) where SELinux is not enabled;
//! where it is, pods and containers are labeled (src/podsetup/selinux.rs, docs/selinux.md).
//! docs/agent.md#apparmor-and-selinux

use std::path::Path;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::{Container, Pod, SELinuxOptions};

use crate::lifecycle::admit::Rejection;
pub use crate::lifecycle::admit::REASON_APPARMOR;
use crate::pod;
/// The deprecated per-container annotation (`<prefix><container name>`).
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// A container's AppArmor profile, from its securityContext, else the deprecated annotation,
/// else the pod's securityContext (kubelet's apparmor.GetProfile).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Profile {
    RuntimeDefault,
    Unconfined,
    /// A profile loaded on the node, by name (None or blank: invalid).
    Localhost(Option<String>),
    /// A type or annotation value kubelet does not know.
    Unknown(String),
}

fn from_field(p: &k8s_openapi::api::core::v1::AppArmorProfile) -> Profile {
    match p.type_.as_str() {
        "RuntimeDefault" => Profile::RuntimeDefault,
        "Unconfined" => Profile::Unconfined,
        "Localhost" => Profile::Localhost(p.localhost_profile.clone()),
        other => Profile::Unknown(other.to_string()),
    }
}

fn from_annotation(v: &str) -> Profile {
    match v {
        "runtime/default" => Profile::RuntimeDefault,
        "unconfined" => Profile::Unconfined,
        _ => match v.strip_prefix("localhost/") {
            Some(name) => Profile::Localhost(Some(name.to_string())),
            None => Profile::Unknown(v.to_string()),
        },
    }
}

pub fn profile(p: &Pod, c: &Container) -> Option<Profile> {
    if let Some(x) = c.security_context.as_ref().and_then(|s| s.app_armor_profile.as_ref()) {
        return Some(from_field(x));
    }
    let key = format!("{APPARMOR_ANNOTATION_PREFIX}{}", c.name);
    if let Some(v) = p.metadata.annotations.as_ref().and_then(|a| a.get(&key)) {
        return Some(from_annotation(v));
    }
    pod::spec(p)
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.as_ref())
        .map(from_field)
}

/// kubelet's isRequired: some profile other than Unconfined is asked for.
fn apparmor_required(p: &Pod) -> bool {
    pod::all_containers(p).any(|c| profile(p, c).is_some_and(|x| x != Profile::Unconfined))
        || p.metadata
            .annotations
            .iter()
            .flatten()
            .any(|(k, v)| k.starts_with(APPARMOR_ANNOTATION_PREFIX) && from_annotation(v) != Profile::Unconfined)
}

/// What the node's kernel enforces, read once (kubelet checks the host at start only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    pub apparmor: bool,
    pub selinux: bool,
}

impl Host {
    pub fn detect() -> Host {
        static HOST: OnceLock<Host> = OnceLock::new();
        *HOST.get_or_init(|| Host {
            apparmor: apparmor_enabled(Path::new("/")),
            selinux: selinux_enabled(Path::new("/")),
        })
    }
}

/// runc's apparmor.IsEnabled: securityfs has apparmor and the module says it is enabled.
pub fn apparmor_enabled(root: &Path) -> bool {
    root.join("sys/kernel/security/apparmor").exists()
        && std::fs::read(root.join("sys/module/apparmor/parameters/enabled")).is_ok_and(|b| b.first() == Some(&b'Y'))
}

/// go-selinux's GetEnabled, in short: selinuxfs is mounted and the process has a context.
pub fn selinux_enabled(root: &Path) -> bool {
    ferrolet_runtime::selinux::enabled_at(root)
}

/// Whether the profile of an AppArmor-enabled node's kernel has `name` loaded.
pub fn apparmor_profile_loaded(name: &str) -> bool {
    std::fs::read_to_string("/sys/kernel/security/apparmor/profiles")
        .is_ok_and(|all| all.lines().any(|l| l.rsplit_once(" (").is_some_and(|(n, _)| n == name)))
}

fn selinux_set(o: Option<&SELinuxOptions>) -> bool {
    o.is_some_and(|o| {
        [&o.user, &o.role, &o.type_, &o.level]
            .iter()
            .any(|f| f.as_deref().is_some_and(|s| !s.is_empty()))
    })
}

/// The refusal of a pod whose AppArmor settings `host` cannot enforce. SELinux options never
/// refuse a pod: they are applied where SELinux is enabled and ignored where not.
pub fn admit(p: &Pod, host: Host) -> Result<(), Rejection> {
    let apparmor = |why: String| Rejection {
        reason: REASON_APPARMOR.into(),
        message: format!("Cannot enforce AppArmor: {why}"),
    };
    if apparmor_required(p) {
        if !host.apparmor {
            return Err(apparmor("AppArmor is not enabled on the host".into()));
        }
        for c in pod::all_containers(p) {
            match profile(p, c) {
                Some(Profile::Localhost(name)) if name.as_deref().is_none_or(|n| n.trim().is_empty()) => {
                    return Err(apparmor(format!(
                        "invalid empty AppArmor profile name: {:?}",
                        name.unwrap_or_default()
                    )));
                }
                Some(Profile::Unknown(t)) => {
                    return Err(apparmor(format!("unknown AppArmor profile type {t:?}")));
                }
                _ => {}
            }
        }
    }
    if !host.selinux && selinux_asked(p) {
        // As kubelet and containerd: labels apply only where SELinux is enabled.
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::info!(
                pod = %pod::full_name(p),
                "seLinuxOptions ignored: SELinux is not enabled on the host (said once)"
            );
        }
    }
    Ok(())
}

/// Some container of `p` (or the pod) has seLinuxOptions.
fn selinux_asked(p: &Pod) -> bool {
    let spec = pod::spec(p);
    selinux_set(spec.security_context.as_ref().and_then(|s| s.se_linux_options.as_ref()))
        || pod::all_containers(p)
            .any(|c| selinux_set(c.security_context.as_ref().and_then(|s| s.se_linux_options.as_ref())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    const NONE: Host = Host {
        apparmor: false,
        selinux: false,
    };
    const AA: Host = Host {
        apparmor: true,
        selinux: false,
    };

    #[test]
    fn apparmor_is_refused_where_the_kernel_has_none_but_unconfined_runs() {
        let field = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "image": "i", "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}}]}}));
        let e = admit(&field, NONE).unwrap_err();
        assert_eq!(e.reason, "AppArmor");
        assert_eq!(
            e.message,
            "Cannot enforce AppArmor: AppArmor is not enabled on the host"
        );
        assert!(admit(&field, AA).is_ok());

        let ann = pod(serde_json::json!({"metadata": {"name": "p", "annotations": {
            "container.apparmor.security.beta.kubernetes.io/c": "localhost/k8s-deny-write"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}));
        assert_eq!(admit(&ann, NONE).unwrap_err().reason, "AppArmor");
        let c = &ann.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            profile(&ann, c),
            Some(Profile::Localhost(Some("k8s-deny-write".into())))
        );

        let unconfined = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {
            "securityContext": {"appArmorProfile": {"type": "Unconfined"}},
            "containers": [{"name": "c", "image": "i"}]}}));
        assert!(admit(&unconfined, NONE).is_ok());
    }

    #[test]
    fn the_container_field_wins_over_the_annotation_and_the_pod() {
        let p = pod(serde_json::json!({"metadata": {"name": "p", "annotations": {
            "container.apparmor.security.beta.kubernetes.io/c": "runtime/default"}},
            "spec": {"securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {"name": "c", "image": "i", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}},
                {"name": "d", "image": "i"}]}}));
        let cs = &p.spec.as_ref().unwrap().containers;
        assert_eq!(profile(&p, &cs[0]), Some(Profile::Unconfined));
        assert_eq!(profile(&p, &cs[1]), Some(Profile::RuntimeDefault));
        let empty = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "image": "i", "securityContext": {"appArmorProfile": {"type": "Localhost", "localhostProfile": " "}}}]}}));
        assert_eq!(
            admit(&empty, AA).unwrap_err().message,
            "Cannot enforce AppArmor: invalid empty AppArmor profile name: \" \""
        );
    }

    #[test]
    fn selinux_options_never_refuse_a_pod() {
        let p = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "image": "i"},
            {"name": "b", "image": "i", "securityContext": {"seLinuxOptions": {"level": "s0:c123,c456"}}}]}}));
        assert!(selinux_asked(&p));
        assert!(admit(&p, NONE).is_ok());
        let selinux = Host {
            apparmor: false,
            selinux: true,
        };
        assert!(admit(&p, selinux).is_ok());
        // Empty options ask for nothing.
        let none = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {
            "securityContext": {"seLinuxOptions": {}}, "containers": [{"name": "a", "image": "i"}]}}));
        assert!(!selinux_asked(&none));
        assert!(admit(&none, NONE).is_ok());
    }

    #[test]
    fn host_detection_reads_securityfs_and_the_module_parameter() {
        let d = tempfile::tempdir().unwrap();
        assert!(!apparmor_enabled(d.path()));
        std::fs::create_dir_all(d.path().join("sys/kernel/security/apparmor")).unwrap();
        std::fs::create_dir_all(d.path().join("sys/module/apparmor/parameters")).unwrap();
        std::fs::write(d.path().join("sys/module/apparmor/parameters/enabled"), "N\n").unwrap();
        assert!(!apparmor_enabled(d.path()));
        std::fs::write(d.path().join("sys/module/apparmor/parameters/enabled"), "Y\n").unwrap();
        assert!(apparmor_enabled(d.path()));
        assert!(!selinux_enabled(d.path()));
    }
}
