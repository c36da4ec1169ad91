//! SELinux labels of pods and containers where SELinux is enabled, as kubelet and containerd
//! give them (docs/selinux.md). The sandbox gets labels from the pod's seLinuxOptions over the
//! policy's container contexts, with a level of its own (`s0:cX,cY`) unless the pod names one;
//! they are kept in its record. A container without options of its own takes its sandbox's
//! labels; one with options takes them over its sandbox's (containerd's DupSecOpt then
//! InitLabels). The files the agent makes for a pod are relabeled with the mount label of the
//! container they go into; a hostPath never is. Where SELinux is not enabled nothing is
//! labeled and seLinuxOptions are ignored (podconfig::lsm says so once).

use std::collections::HashSet;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Context, Result};
use ferrolet_runtime::selinux::{self as label, Context as Label, Labels, Options, Policy};
use k8s_openapi::api::core::v1::{Container, Pod, SELinuxOptions};
use serde::{Deserialize, Serialize};

use crate::pod;

/// A sandbox's labels, as its record keeps them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxLabels {
    pub process: String,
    pub mount: String,
}

impl SandboxLabels {
    fn of(l: &Labels) -> SandboxLabels {
        SandboxLabels {
            process: l.process.to_string(),
            mount: l.mount.to_string(),
        }
    }

    /// The level every label of the pod carries (`s0:c1,c2`).
    pub fn level(&self) -> Option<String> {
        Label::parse(&self.process).ok().map(|c| c.level)
    }
}

/// Whether this node labels: SELinux is enabled for the agent's process (read once, with
/// AppArmor's, by podconfig::lsm).
pub fn enabled() -> bool {
    crate::podconfig::lsm::Host::detect().selinux
}

fn policy() -> &'static Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    POLICY.get_or_init(|| Policy::load(Path::new("/etc/selinux")))
}

/// The options, each field checked ([`label::check_field`]); an error names the field under
/// `at` (e.g. `securityContext.seLinuxOptions`).
fn options(o: Option<&SELinuxOptions>, at: &str) -> Result<Options, String> {
    let Some(o) = o else {
        return Ok(Options::default());
    };
    let field = |name: &str, f: &Option<String>| -> Result<Option<String>, String> {
        match f.as_deref().filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => label::check_field(name, v)
                .map(|()| Some(v.to_string()))
                .map_err(|e| format!("{at}.{name}: {e}")),
        }
    };
    Ok(Options {
        user: field("user", &o.user)?,
        role: field("role", &o.role)?,
        type_: field("type", &o.type_)?,
        level: field("level", &o.level)?,
    })
}

fn pod_options(p: &Pod) -> Result<Options, String> {
    options(
        pod::spec(p)
            .security_context
            .as_ref()
            .and_then(|s| s.se_linux_options.as_ref()),
        "spec.securityContext.seLinuxOptions",
    )
}

fn container_options(c: &Container) -> Result<Options, String> {
    options(
        c.security_context.as_ref().and_then(|s| s.se_linux_options.as_ref()),
        &format!("container {:?}: securityContext.seLinuxOptions", c.name),
    )
}

/// The labels of a new sandbox of `p` (`in_use`: the levels the other pods' sandboxes hold,
/// asked only when a fresh level is needed). None where SELinux is not enabled, and where the
/// policy has no container contexts and the pod asks for none (as go-selinux: then nothing
/// is labeled).
/// An option that is not a valid label field is an error naming it.
pub fn sandbox_labels(p: &Pod, in_use: impl FnOnce() -> HashSet<String>) -> Result<Option<SandboxLabels>, String> {
    if !enabled() {
        return Ok(None);
    }
    Ok(labels_for(policy(), p, in_use)?.map(|l| SandboxLabels::of(&l)))
}

fn labels_for(policy: &Policy, p: &Pod, in_use: impl FnOnce() -> HashSet<String>) -> Result<Option<Labels>, String> {
    let opts = pod_options(p)?;
    // (a container's invalid options ask too; its own build names them)
    let any_asked =
        !opts.is_empty() || pod::all_containers(p).any(|c| container_options(c).map_or(true, |o| !o.is_empty()));
    if !policy.from_policy && !any_asked {
        return Ok(None);
    }
    Ok(Some(policy.labels(&opts, || label::unique_level(&in_use()))))
}

/// A container's labels: its sandbox's, with its own seLinuxOptions over them (`in_use`: as
/// for [`sandbox_labels`]).
pub fn container_labels(
    sandbox: Option<&SandboxLabels>,
    c: &Container,
    in_use: impl FnOnce() -> HashSet<String>,
) -> Result<Option<Labels>, String> {
    if !enabled() {
        return Ok(None);
    }
    container_labels_with(policy(), sandbox, c, in_use)
}

fn container_labels_with(
    policy: &Policy,
    sandbox: Option<&SandboxLabels>,
    c: &Container,
    in_use: impl FnOnce() -> HashSet<String>,
) -> Result<Option<Labels>, String> {
    let own = container_options(c)?;
    let base = sandbox.and_then(|s| Label::parse(&s.process).ok());
    Ok(match (base, own.is_empty()) {
        (None, true) => None,
        (None, false) => Some(policy.labels(&own, || label::unique_level(&in_use()))),
        (Some(base), _) => {
            let mut opts = Options::of(&base);
            let over = |f: Option<String>, to: &mut Option<String>| {
                if f.is_some() {
                    *to = f;
                }
            };
            over(own.user, &mut opts.user);
            over(own.role, &mut opts.role);
            over(own.type_, &mut opts.type_);
            over(own.level, &mut opts.level);
            Some(policy.labels(&opts, || base.level.clone()))
        }
    })
}

/// Label what the agent made for the container (its volumes' directories, the files it
/// binds) with its mount label. Paths that do not exist are skipped.
pub fn relabel_all<'a>(paths: impl IntoIterator<Item = &'a Path>, mount_label: &str) -> Result<()> {
    for p in paths {
        if p.symlink_metadata().is_err() {
            continue;
        }
        label::relabel(p, mount_label).with_context(|| format!("relabeling {} for SELinux", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn defaults() -> Policy {
        Policy::load(Path::new("/nonexistent"))
    }

    fn from_policy() -> Policy {
        Policy {
            from_policy: true,
            ..defaults()
        }
    }

    #[test]
    fn a_pod_gets_a_level_no_other_pod_holds_unless_it_names_one() {
        let plain = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}));
        let l = labels_for(&from_policy(), &plain, || HashSet::from(["s0:c1,c2".to_string()]))
            .unwrap()
            .unwrap();
        assert_eq!(l.process.type_, "container_t");
        assert_ne!(l.process.level, "s0:c1,c2");
        assert_eq!(l.process.level, l.mount.level);
        // a policy without container contexts labels only pods that ask
        assert!(labels_for(&defaults(), &plain, HashSet::new).unwrap().is_none());
        let named = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {
            "securityContext": {"seLinuxOptions": {"level": "s0:c123,c456"}},
            "containers": [{"name": "c"}]}}));
        let l = labels_for(&defaults(), &named, || unreachable!()).unwrap().unwrap();
        assert_eq!(l.process.to_string(), "system_u:system_r:container_t:s0:c123,c456");
        assert_eq!(l.mount.to_string(), "system_u:object_r:container_file_t:s0:c123,c456");
    }

    #[test]
    fn options_that_are_no_label_field_are_errors_naming_the_field() {
        let bad = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {
            "securityContext": {"seLinuxOptions": {"level": "s0\",upperdir=/etc"}},
            "containers": [{"name": "c"}]}}));
        let e = labels_for(&defaults(), &bad, HashSet::new).unwrap_err();
        assert!(
            e.starts_with("spec.securityContext.seLinuxOptions.level: level "),
            "{e}"
        );
        let c: Container = serde_json::from_value(serde_json::json!({"name": "web",
            "securityContext": {"seLinuxOptions": {"type": "spc_t,ro"}}}))
        .unwrap();
        let e = container_labels_with(&defaults(), None, &c, HashSet::new).unwrap_err();
        assert!(
            e.starts_with("container \"web\": securityContext.seLinuxOptions.type: "),
            "{e}"
        );
    }

    #[test]
    fn containers_take_their_sandboxs_labels_with_their_own_options_over_them() {
        let sb = SandboxLabels {
            process: "system_u:system_r:container_t:s0:c7,c8".into(),
            mount: "system_u:object_r:container_file_t:s0:c7,c8".into(),
        };
        let c = |sc: serde_json::Value| -> Container {
            serde_json::from_value(serde_json::json!({"name": "c", "securityContext": sc})).unwrap()
        };
        let plain = container_labels_with(&defaults(), Some(&sb), &c(serde_json::json!({})), || unreachable!())
            .unwrap()
            .unwrap();
        assert_eq!(plain.process.to_string(), sb.process);
        assert_eq!(plain.mount.to_string(), sb.mount);
        let typed = container_labels_with(
            &defaults(),
            Some(&sb),
            &c(serde_json::json!({"seLinuxOptions": {"type": "spc_t"}})),
            || unreachable!(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(typed.process.to_string(), "system_u:system_r:spc_t:s0:c7,c8");
        assert_eq!(typed.mount.to_string(), sb.mount);
        let leveled = container_labels_with(
            &defaults(),
            Some(&sb),
            &c(serde_json::json!({"seLinuxOptions": {"level": "s0:c1,c2", "user": "u2"}})),
            || unreachable!(),
        )
        .unwrap()
        .unwrap();
        assert_eq!(leveled.process.to_string(), "u2:system_r:container_t:s0:c1,c2");
        assert_eq!(leveled.mount.to_string(), "u2:object_r:container_file_t:s0:c1,c2");
        // no sandbox labels (a policy without container contexts): only a container that asks
        assert!(
            container_labels_with(&defaults(), None, &c(serde_json::json!({})), HashSet::new)
                .unwrap()
                .is_none()
        );
        let own = container_labels_with(
            &defaults(),
            None,
            &c(serde_json::json!({"seLinuxOptions": {"type": "spc_t"}})),
            HashSet::new,
        )
        .unwrap()
        .unwrap();
        assert_eq!(own.process.type_, "spc_t");
        assert!(own.process.level.starts_with("s0:c"));
    }
}
