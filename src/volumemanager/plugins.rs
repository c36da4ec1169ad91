//! Which volume plugin serves a pod's volume (kubelet's VolumePluginMgr.FindPluginBySpec), and
//! where its directory lives: `<pod dir>/volumes/<plugin dir>/<volume name>`, kubelet's layout
//! (the plugin directory is the plugin's escaped name, `kubernetes.io~configmap`). Every type of
//! volume ferrolet does not serve is refused by name with the reason, never ignored.

use k8s_openapi::api::core::v1::Volume;

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
}

impl Plugin {
    pub const ALL: [Plugin; 7] = [
        Plugin::EmptyDir,
        Plugin::HostPath,
        Plugin::ConfigMap,
        Plugin::Secret,
        Plugin::DownwardApi,
        Plugin::Projected,
        Plugin::Csi,
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

    /// Secrets and projected volumes (tokens, secrets) are on tmpfs: never on disk.
    pub fn in_memory_only(self) -> bool {
        matches!(self, Plugin::Secret | Plugin::Projected)
    }
}

/// The plugin of `v`, or why none serves it. A volume with no source at all is an emptyDir
/// (the API server's defaulting).
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

/// The reason a volume type is refused.
pub fn unsupported(kind: &str) -> String {
    let why = match kind {
        "persistentVolumeClaim" | "ephemeral" => {
            "it needs a PersistentVolume bound through an API server and an attacher/mounter (CSI), which ferrolet does not have"
        }
        "image" => "image volumes (OCI artifacts as volumes) are not implemented",
        "gitRepo" => "gitRepo volumes are deprecated and disabled in kubelet; clone in an init container into an emptyDir instead",
        "nfs" | "iscsi" | "rbd" | "cephfs" | "glusterfs" | "fc" | "flocker" | "quobyte" | "storageos"
        | "scaleIO" | "portworxVolume" | "flexVolume" => "network and in-tree storage plugins are not built into ferrolet",
        "awsElasticBlockStore" | "gcePersistentDisk" | "azureDisk" | "azureFile" | "cinder" | "vsphereVolume"
        | "photonPersistentDisk" => "cloud provider disks are not built into ferrolet (kubelet serves them through CSI)",
        _ => "ferrolet has no plugin for it",
    };
    format!("volume type {kind:?} is not supported: {why}; ferrolet serves emptyDir, hostPath, configMap, secret, downwardAPI, projected and csi volumes")
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
        let e = plugin_for(&vol(
            serde_json::json!({"name": "a", "persistentVolumeClaim": {"claimName": "c"}}),
        ))
        .unwrap_err();
        assert!(
            e.starts_with("volume type \"persistentVolumeClaim\" is not supported: it needs a PersistentVolume"),
            "{e}"
        );
        let e = plugin_for(&vol(
            serde_json::json!({"name": "a", "nfs": {"server": "s", "path": "/"}}),
        ))
        .unwrap_err();
        assert!(e.contains("\"nfs\""), "{e}");
        assert_eq!(Plugin::ConfigMap.dir_name(), "kubernetes.io~configmap");
        assert_eq!(Plugin::from_dir_name("kubernetes.io~empty-dir"), Some(Plugin::EmptyDir));
    }
}
