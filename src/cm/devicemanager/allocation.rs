//! Devices given to containers (kubelet's podDevices and its Allocate path): which device IDs
//! of which resource each container of each pod holds, with the plugin's answer to Allocate
//! (device nodes, mounts, env, annotations), kept in `kubelet_internal_checkpoint` in the
//! device plugin directory so that an agent restart gives a running pod's devices to nobody
//! else. The file has kubelet's shape (`PodDeviceEntries` with the answer as base64 protobuf),
//! without its checksum.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use prost::Message as _;
use serde::{Deserialize, Serialize};

use crate::apis::deviceplugin::v1beta1::ContainerAllocateResponse;

/// The checkpoint's file name in the device plugin directory (kubelet's).
pub const CHECKPOINT: &str = "kubelet_internal_checkpoint";

/// The devices of one resource one container holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub pod_uid: String,
    pub container: String,
    /// A regular init container: its devices are the next containers' to take.
    pub init: bool,
    pub resource: String,
    pub ids: Vec<String>,
    pub response: ContainerAllocateResponse,
    /// Chosen, the plugin's Allocate not answered yet: the devices are held (no other
    /// container gets them meanwhile) but not written to the checkpoint.
    pub pending: bool,
}

/// What a container gets from its devices' plugins, all resources together.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allocated {
    /// (host path, container path, cgroup permissions).
    pub devices: Vec<(String, String, String)>,
    /// (host path, container path, read-only).
    pub mounts: Vec<(String, String, bool)>,
    pub envs: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl Allocated {
    pub fn add(&mut self, r: &ContainerAllocateResponse) {
        for d in &r.devices {
            self.devices
                .push((d.host_path.clone(), d.container_path.clone(), d.permissions.clone()));
        }
        for m in &r.mounts {
            self.mounts
                .push((m.host_path.clone(), m.container_path.clone(), m.read_only));
        }
        self.envs.extend(r.envs.clone());
        self.annotations.extend(r.annotations.clone());
    }
}

/// Why a plugin's answer for one container cannot be used, naming the field.
pub fn check_response(r: &ContainerAllocateResponse) -> Result<(), String> {
    for (i, d) in r.devices.iter().enumerate() {
        if !d.host_path.starts_with('/') {
            return Err(format!(
                "devices[{i}].host_path: {:?} is not an absolute path",
                d.host_path
            ));
        }
        if !d.container_path.starts_with('/') {
            return Err(format!(
                "devices[{i}].container_path: {:?} is not an absolute path",
                d.container_path
            ));
        }
        if d.permissions.is_empty() || !d.permissions.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return Err(format!(
                "devices[{i}].permissions: {:?} is not some of r, w, m",
                d.permissions
            ));
        }
    }
    for (i, m) in r.mounts.iter().enumerate() {
        if !m.host_path.starts_with('/') || !m.container_path.starts_with('/') {
            return Err(format!(
                "mounts[{i}]: {:?} -> {:?} must be absolute paths",
                m.host_path, m.container_path
            ));
        }
    }
    for k in r.envs.keys() {
        if k.is_empty() || k.contains('=') {
            return Err(format!("envs: {k:?} is not a variable name"));
        }
    }
    Ok(())
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct File {
    data: Data,
    #[serde(default)]
    checksum: u64,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct Data {
    #[serde(default)]
    pod_device_entries: Vec<FileEntry>,
    #[serde(default)]
    registered_devices: BTreeMap<String, Vec<String>>,
}

#[derive(Serialize, Deserialize)]
struct FileEntry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    #[serde(rename = "ContainerName")]
    container: String,
    #[serde(rename = "ResourceName")]
    resource: String,
    /// Device IDs by NUMA node; `-1` for none, as kubelet writes them.
    #[serde(rename = "DeviceIDs")]
    ids: BTreeMap<String, Vec<String>>,
    #[serde(rename = "AllocResp")]
    response: String,
    #[serde(rename = "InitContainer", default)]
    init: bool,
}

/// The entries in `dir`'s checkpoint (none when there is no file). The error names the file.
pub fn load(dir: &Path) -> Result<Vec<Entry>, String> {
    let path = dir.join(CHECKPOINT);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let file: File = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, e) in file.data.pod_device_entries.into_iter().enumerate() {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&e.response)
            .map_err(|x| format!("{}: PodDeviceEntries[{i}].AllocResp: {x}", path.display()))?;
        let response = ContainerAllocateResponse::decode(raw.as_slice())
            .map_err(|x| format!("{}: PodDeviceEntries[{i}].AllocResp: {x}", path.display()))?;
        out.push(Entry {
            pod_uid: e.pod_uid,
            container: e.container,
            init: e.init,
            resource: e.resource,
            ids: e.ids.into_values().flatten().collect(),
            response,
            pending: false,
        });
    }
    Ok(out)
}

/// Write `entries` (and the devices each resource has) to `dir`'s checkpoint, atomically.
pub fn store(dir: &Path, entries: &[Entry], registered: BTreeMap<String, Vec<String>>) -> Result<(), String> {
    let path = dir.join(CHECKPOINT);
    let file = File {
        data: Data {
            pod_device_entries: entries
                .iter()
                .filter(|e| !e.pending)
                .map(|e| FileEntry {
                    pod_uid: e.pod_uid.clone(),
                    container: e.container.clone(),
                    resource: e.resource.clone(),
                    ids: [("-1".to_string(), e.ids.clone())].into(),
                    response: base64::engine::general_purpose::STANDARD.encode(e.response.encode_to_vec()),
                    init: e.init,
                })
                .collect(),
            registered_devices: registered,
        },
        checksum: 0,
    };
    let bytes = serde_json::to_vec(&file).map_err(|e| format!("encoding {}: {e}", path.display()))?;
    ferrolet_fsutil::write_atomic(&path, &bytes).map_err(|e| ferrolet_fsutil::chain(&e).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::deviceplugin::v1beta1::DeviceSpec;

    fn response() -> ContainerAllocateResponse {
        ContainerAllocateResponse {
            envs: [("A".to_string(), "1".to_string())].into(),
            mounts: Vec::new(),
            devices: vec![DeviceSpec {
                container_path: "/dev/x".into(),
                host_path: "/dev/null".into(),
                permissions: "rw".into(),
            }],
            annotations: Default::default(),
        }
    }

    #[test]
    fn the_checkpoint_round_trips_and_a_bad_one_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_empty());
        let e = Entry {
            pod_uid: "u".into(),
            container: "c".into(),
            init: true,
            resource: "example.com/dev".into(),
            ids: vec!["d1".into(), "d2".into()],
            response: response(),
            pending: false,
        };
        // a choice still waiting for its plugin's answer is not written down
        let pending = Entry {
            container: "d".into(),
            pending: true,
            ..e.clone()
        };
        store(dir.path(), &[e.clone(), pending], Default::default()).unwrap();
        assert_eq!(load(dir.path()).unwrap(), [e]);
        std::fs::write(dir.path().join(CHECKPOINT), b"{").unwrap();
        let err = load(dir.path()).unwrap_err();
        assert!(err.contains(CHECKPOINT), "{err}");
    }

    #[test]
    fn answers_that_cannot_be_used_name_the_field() {
        assert!(check_response(&response()).is_ok());
        let mut r = response();
        r.devices[0].host_path = "null".into();
        assert!(check_response(&r).unwrap_err().starts_with("devices[0].host_path"));
        let mut r = response();
        r.devices[0].permissions = "rwx".into();
        assert!(check_response(&r).unwrap_err().starts_with("devices[0].permissions"));
        let mut r = response();
        r.envs.insert("A=B".into(), "x".into());
        assert!(check_response(&r).unwrap_err().starts_with("envs"));
    }
}
