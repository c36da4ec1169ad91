//! kubelet's user namespace manager (pkg/kubelet/userns_manager.go, 1.26): every pod with
//! `hostUsers: false` gets a range of 65536 host ids that no other pod has, kept in
//! `<pod dir>/userns` (kubelet's file and format) so it survives agent restarts and reboots,
//! read back from every pod directory at start, and freed when the pod is gone.
//! docs/userns.md

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{anyhow, bail, Context, Result};
use ferrolet_runtime::namespaces::IdRange;
use serde::{Deserialize, Serialize};

/// The ids of one pod.
pub const LENGTH: u32 = 1 << 16;
/// Blocks of [`LENGTH`] ids in the 32-bit id space; 0 (the host's own ids) and 1 (kubelet keeps
/// it for later use) are never given out.
const BLOCKS: u32 = 1 << 16;
const FIRST_BLOCK: u32 = 2;
/// kubelet's limit on pods with a user namespace per node.
pub const MAX_PODS: usize = 1024;
const FILE: &str = "userns";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Mapping {
    host_id: u32,
    container_id: u32,
    length: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MappingsFile {
    uid_mappings: Vec<Mapping>,
    gid_mappings: Vec<Mapping>,
}

/// Which block each pod holds.
#[derive(Debug, Default)]
pub struct UserNamespaces {
    used: Mutex<BTreeMap<u32, String>>,
}

fn parse(data: &[u8]) -> Result<IdRange> {
    let f: MappingsFile = serde_json::from_slice(data).map_err(|e| anyhow!("can't parse file: {e}"))?;
    if f.uid_mappings.len() != 1 || f.gid_mappings.len() != 1 {
        bail!("invalid user namespace configuration: no more than one mapping allowed.");
    }
    if f.uid_mappings != f.gid_mappings {
        bail!("invalid user namespace configuration: GID and UID mapping should be identical");
    }
    let m = f.uid_mappings[0];
    if m.container_id != 0 {
        bail!("invalid user namespace configuration: UID 0 must be mapped");
    }
    if m.length != LENGTH {
        bail!("wrong user namespace length {}", m.length);
    }
    if m.host_id % LENGTH != 0 || m.host_id / LENGTH < FIRST_BLOCK {
        bail!("wrong user namespace offset specified {}", m.host_id);
    }
    Ok(IdRange {
        host: m.host_id,
        size: m.length,
    })
}

impl UserNamespaces {
    /// Read every pod directory's allocation under `pods_dir`. As kubelet, an allocation that
    /// cannot be read, or two pods holding one range, stops the agent: giving a range out
    /// again could put two pods' processes under one host id.
    pub fn load(pods_dir: &Path) -> Result<UserNamespaces> {
        let me = UserNamespaces::default();
        let entries = match std::fs::read_dir(pods_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(me),
            Err(e) => return Err(anyhow!("user namespace manager can't read pods from disk: {e}")),
        };
        for e in entries.flatten() {
            let uid = e.file_name().to_string_lossy().into_owned();
            let file = e.path().join(FILE);
            let data = match std::fs::read(&file) {
                Ok(d) => d,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => return Err(anyhow!("reading {}: {err}", file.display())),
            };
            let range = parse(&data).with_context(|| {
                format!(
                    "{} (the pod's user namespace ids; remove the pod's directory once nothing of it runs)",
                    file.display()
                )
            })?;
            me.record(&uid, range)?;
        }
        Ok(me)
    }

    fn record(&self, pod_uid: &str, range: IdRange) -> Result<()> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let block = range.host / LENGTH;
        match used.get(&block) {
            Some(owner) if owner != pod_uid => bail!("range picked for pod {pod_uid:?} already taken by pod {owner:?}"),
            _ => {}
        }
        if let Some((&other, _)) = used.iter().find(|(b, o)| o.as_str() == pod_uid && **b != block) {
            bail!("different user namespace range already used by pod {pod_uid:?} (block {other})");
        }
        if used.len() >= MAX_PODS && !used.contains_key(&block) {
            bail!(
                "limit on count of pods with user namespaces exceeded (limit is {MAX_PODS}, current pods with userns: {})",
                used.len()
            );
        }
        used.insert(block, pod_uid.to_string());
        Ok(())
    }

    /// The pod's range: the one in its directory, or a new one written there atomically.
    pub fn get_or_create(&self, pod_uid: &str, pod_dir: &Path) -> Result<IdRange> {
        let file = pod_dir.join(FILE);
        match std::fs::read(&file) {
            Ok(data) => {
                let range = parse(&data).with_context(|| file.display().to_string())?;
                self.record(pod_uid, range)?;
                return Ok(range);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(anyhow!("reading {}: {e}", file.display())),
        }
        let range = {
            let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
            if used.len() >= MAX_PODS {
                bail!(
                    "limit on count of pods with user namespaces exceeded (limit is {MAX_PODS}, current pods with userns: {})",
                    used.len()
                );
            }
            // kubelet's allocator: from a random block onwards, the first free one.
            let span = BLOCKS - FIRST_BLOCK;
            let start = u32::from_str_radix(&ferrolet_fsutil::random_hex(4), 16).unwrap_or(0) % span;
            let block = (0..span)
                .map(|i| FIRST_BLOCK + (start + i) % span)
                .find(|b| !used.contains_key(b))
                .ok_or_else(|| anyhow!("could not find an empty slot to allocate a user namespace"))?;
            used.insert(block, pod_uid.to_string());
            IdRange {
                host: block * LENGTH,
                size: LENGTH,
            }
        };
        let m = Mapping {
            host_id: range.host,
            container_id: 0,
            length: range.size,
        };
        let f = MappingsFile {
            uid_mappings: vec![m],
            gid_mappings: vec![m],
        };
        // compact, as kubelet writes it
        let data = serde_json::to_vec(&f).expect("plain data encodes");
        if let Err(e) = ferrolet_fsutil::write_atomic(&file, &data) {
            self.forget(pod_uid);
            return Err(anyhow!(e).context("recording the pod's user namespace ids"));
        }
        Ok(range)
    }

    fn forget(&self, pod_uid: &str) {
        self.used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, o| o != pod_uid);
    }

    /// The pod is gone: its range may be given out again.
    pub fn release(&self, pod_uid: &str, pod_dir: &Path) {
        let _ = std::fs::remove_file(pod_dir.join(FILE));
        self.forget(pod_uid);
    }

    /// How many pods hold a range.
    pub fn count(&self) -> usize {
        self.used.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Where the pod's user namespace is pinned (beside its other namespaces).
pub fn pin_path(sandbox_dir: &Path) -> PathBuf {
    sandbox_dir.join("user")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_unique_kept_on_disk_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let pods = dir.path();
        let m = UserNamespaces::default();
        let mut seen = std::collections::HashSet::new();
        for i in 0..50 {
            let pod_dir = pods.join(format!("uid{i}"));
            std::fs::create_dir_all(&pod_dir).unwrap();
            let r = m.get_or_create(&format!("uid{i}"), &pod_dir).unwrap();
            assert_eq!(r.size, 65536);
            assert_eq!(r.host % 65536, 0);
            assert!(r.host >= 131072, "blocks 0 and 1 are never given out: {}", r.host);
            assert!(seen.insert(r.host), "{} given twice", r.host);
            // asking again gives the same
            assert_eq!(m.get_or_create(&format!("uid{i}"), &pod_dir).unwrap(), r);
        }
        // kubelet's file
        let text = std::fs::read_to_string(pods.join("uid0/userns")).unwrap();
        assert!(
            text.contains("\"uidMappings\"") && text.contains("\"hostId\"") && text.contains("\"containerId\":0"),
            "{text}"
        );
        // a restart reads them all back
        let again = UserNamespaces::load(pods).unwrap();
        assert_eq!(again.count(), 50);
        let r0 = m.get_or_create("uid0", &pods.join("uid0")).unwrap();
        assert_eq!(again.get_or_create("uid0", &pods.join("uid0")).unwrap(), r0);
        // released, the range is free and the file gone
        again.release("uid0", &pods.join("uid0"));
        assert_eq!(again.count(), 49);
        assert!(!pods.join("uid0/userns").exists());
    }

    #[test]
    fn bad_or_clashing_files_stop_the_load() {
        let dir = tempfile::tempdir().unwrap();
        let pods = dir.path();
        let write = |uid: &str, text: &str| {
            std::fs::create_dir_all(pods.join(uid)).unwrap();
            std::fs::write(pods.join(uid).join("userns"), text).unwrap();
        };
        let m = |h: u32| {
            format!("{{\"uidMappings\":[{{\"hostId\":{h},\"containerId\":0,\"length\":65536}}],\"gidMappings\":[{{\"hostId\":{h},\"containerId\":0,\"length\":65536}}]}}")
        };
        write("a", &m(131072));
        write("b", &m(131072));
        let e = format!("{:#}", UserNamespaces::load(pods).unwrap_err());
        assert!(e.contains("already taken"), "{e}");
        write("b", &m(65536));
        let e = format!("{:#}", UserNamespaces::load(pods).unwrap_err());
        assert!(e.contains("wrong user namespace offset"), "{e}");
        write("b", "{not json");
        let e = format!("{:#}", UserNamespaces::load(pods).unwrap_err());
        assert!(e.contains("can't parse file") && e.contains("/b/userns"), "{e}");
        write("b", &m(196608));
        assert_eq!(UserNamespaces::load(pods).unwrap().count(), 2);
    }
}
