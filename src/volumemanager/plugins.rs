//! Which volume plugin serves a pod's volume or a claim's PersistentVolume (kubelet's
//! VolumePluginMgr.FindPluginBySpec), and
//! where its directory lives: `<pod dir>/volumes/<plugin dir>/<volume name>`, kubelet's layout
//! (the plugin directory is the plugin's escaped name, `kubernetes.io~configmap`). Every type of
//! volume ferrolet does not serve is refused by name with the reason, never ignored.

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};

/// The volume plugins ferrolet has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Plugin {
    EmptyDir,
    HostPath,
    ConfigMap,
    Secret,
    DownwardApi,
    Projected,
    /// A CSI driver's volume (inline `csi`; a PersistentVolume's `csi` source).
    Csi,
    /// A `local` PersistentVolume: a directory of the node, used in place.
    LocalVolume,
}

impl Plugin {
    pub const ALL: [Plugin; 8] = [
        Plugin::EmptyDir,
        Plugin::HostPath,
        Plugin::ConfigMap,
        Plugin::Secret,
        Plugin::DownwardApi,
        Plugin::Projected,
        Plugin::Csi,
        Plugin::LocalVolume,
    ];

    /// kubelet's plugin name.
    pub fn name(self) -> &'static str {
        match self {
            Plugin::EmptyDir => "kubernetes.io/empty-dir",
            Plugin::HostPath => "kubernetes.io/host-path",
            Plugin::ConfigMap => "kubernetes.io/configmap",
            Plugin::Secret => "kubernetes.io/secret",
            Plugin::DownwardApi => "kubernetes.io/downward-api",
            Plugin::Projected => "kubernetes.io/projected",
            Plugin::Csi => super::csi::PLUGIN_NAME,
            Plugin::LocalVolume => "kubernetes.io/local-volume",
        }
    }

    /// The plugin's directory under `<pod dir>/volumes` (the name with `/` escaped as `~`).
    pub fn dir_name(self) -> String {
        self.name().replace('/', "~")
    }

    pub fn from_dir_name(d: &str) -> Option<Plugin> {
        Plugin::ALL.into_iter().find(|p| p.dir_name() == d)
    }

    /// Whether the volume's content is the agent's own making (files written by the atomic
    /// writer), read-only in every container.
    pub fn is_files(self) -> bool {
        matches!(
            self,
            Plugin::ConfigMap | Plugin::Secret | Plugin::DownwardApi | Plugin::Projected
        )
    }

    /// The volume is a directory of the node, used in place (hostPath, local): never
    /// removed, never re-owned for a user namespace.
    pub fn is_nodes(self) -> bool {
        matches!(self, Plugin::HostPath | Plugin::LocalVolume)
    }

    /// Secrets and projected volumes (tokens, secrets) are on tmpfs: never on disk.
    pub fn in_memory_only(self) -> bool {
        matches!(self, Plugin::Secret | Plugin::Projected)
    }
}

/// The plugin of `v`, or why none serves it. A volume with no source at all is an emptyDir
/// (the API server's defaulting). A `persistentVolumeClaim` or `ephemeral` volume's plugin is
/// its PersistentVolume's ([`plugin_for_pv`]), once its claim is resolved.
pub fn plugin_for(v: &Volume) -> Result<Plugin, String> {
    let found = [
        (v.empty_dir.is_some(), Plugin::EmptyDir),
        (v.host_path.is_some(), Plugin::HostPath),
        (v.config_map.is_some(), Plugin::ConfigMap),
        (v.secret.is_some(), Plugin::Secret),
        (v.downward_api.is_some(), Plugin::DownwardApi),
        (v.projected.is_some(), Plugin::Projected),
        (v.csi.is_some(), Plugin::Csi),
    ];
    if let Some((_, p)) = found.iter().find(|(set, _)| *set) {
        return Ok(*p);
    }
    let json = serde_json::to_value(v).unwrap_or_default();
    let Some(kind) = json.as_object().and_then(|m| m.keys().find(|k| *k != "name").cloned()) else {
        return Ok(Plugin::EmptyDir);
    };
    Err(unsupported(&kind))
}

/// The plugin of a PersistentVolume's source (a claim's volume): hostPath and local PVs, or
/// why none serves it.
pub fn plugin_for_pv(pv: &PersistentVolume) -> Result<Plugin, String> {
    let name = pv.metadata.name.as_deref().unwrap_or("");
    let Some(spec) = &pv.spec else {
        return Err(format!("PersistentVolume {name:?} has no spec"));
    };
    if spec.host_path.is_some() {
        return Ok(Plugin::HostPath);
    }
    if spec.local.is_some() {
        return Ok(Plugin::LocalVolume);
    }
    if spec.csi.is_some() {
        return Ok(Plugin::Csi);
    }
    // The source is the one field of the spec that is not about the volume's binding.
    const NOT_SOURCES: [&str; 8] = [
        "accessModes",
        "capacity",
        "claimRef",
        "mountOptions",
        "nodeAffinity",
        "persistentVolumeReclaimPolicy",
        "storageClassName",
        "volumeMode",
    ];
    let json = serde_json::to_value(spec).unwrap_or_default();
    let kind = json
        .as_object()
        .and_then(|m| m.keys().find(|k| !NOT_SOURCES.contains(&k.as_str())).cloned())
        .unwrap_or_else(|| "(none)".to_string());
    Err(format!(
        "PersistentVolume {name:?}: {}",
        unsupported(&kind).replacen("volume type", "source", 1)
    ))
}

/// The reason a volume type is refused.
pub fn unsupported(kind: &str) -> String {
    let why = match kind {
        "image" => "image volumes (OCI artifacts as volumes) are not implemented",
        "gitRepo" => "gitRepo volumes are deprecated and disabled in kubelet; clone in an init container into an emptyDir instead",
        "nfs" | "iscsi" | "rbd" | "cephfs" | "glusterfs" | "fc" | "flocker" | "quobyte" | "storageos"
        | "scaleIO" | "portworxVolume" | "flexVolume" => "network and in-tree storage plugins are not built into ferrolet",
        "awsElasticBlockStore" | "gcePersistentDisk" | "azureDisk" | "azureFile" | "cinder" | "vsphereVolume"
        | "photonPersistentDisk" => "cloud provider disks are not built into ferrolet (kubelet serves them through CSI)",
        _ => "ferrolet has no plugin for it",
    };
    format!("volume type {kind:?} is not supported: {why}; ferrolet serves emptyDir, hostPath, configMap, secret, downwardAPI, projected and csi volumes, and claims of hostPath, local and CSI PersistentVolumes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(j: serde_json::Value) -> Volume {
        serde_json::from_value(j).unwrap()
    }

    #[test]
    fn plugins_and_refusals() {
        assert_eq!(
            plugin_for(&vol(serde_json::json!({"name": "a", "configMap": {"name": "x"}}))),
            Ok(Plugin::ConfigMap)
        );
        assert_eq!(plugin_for(&vol(serde_json::json!({"name": "a"}))), Ok(Plugin::EmptyDir));
        let e = plugin_for(&vol(serde_json::json!({"name": "a", "gitRepo": {"repository": "r"}}))).unwrap_err();
        assert!(
            e.starts_with("volume type \"gitRepo\" is not supported: gitRepo volumes are deprecated"),
            "{e}"
        );
        let e = plugin_for(&vol(
            serde_json::json!({"name": "a", "nfs": {"server": "s", "path": "/"}}),
        ))
        .unwrap_err();
        assert!(e.contains("\"nfs\""), "{e}");
        assert_eq!(Plugin::ConfigMap.dir_name(), "kubernetes.io~configmap");
        let pv = |spec: serde_json::Value| -> PersistentVolume {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "pv-1"}, "spec": spec})).unwrap()
        };
        let common = serde_json::json!({"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
            "storageClassName": "local", "claimRef": {"name": "c"}, "volumeMode": "Filesystem"});
        let with = |k: &str, v: serde_json::Value| {
            let mut s = common.clone();
            s[k] = v;
            pv(s)
        };
        assert_eq!(
            plugin_for_pv(&with("local", serde_json::json!({"path": "/d"}))),
            Ok(Plugin::LocalVolume)
        );
        assert_eq!(
            plugin_for_pv(&with("hostPath", serde_json::json!({"path": "/d"}))),
            Ok(Plugin::HostPath)
        );
        let e = plugin_for_pv(&with("nfs", serde_json::json!({"server": "s", "path": "/"}))).unwrap_err();
        assert!(
            e.starts_with("PersistentVolume \"pv-1\": source \"nfs\" is not supported: network"),
            "{e}"
        );
        assert_eq!(Plugin::from_dir_name("kubernetes.io~empty-dir"), Some(Plugin::EmptyDir));
    }
}
