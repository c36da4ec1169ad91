//! Image garbage collection (kubelet's realImageGCManager): every [`GC_PERIOD`] the image
//! filesystem (the filesystem of the image store's directory) is measured; at or above
//! imageGCHighThresholdPercent of it used, images are removed, least recently used first,
//! until usage would be down to imageGCLowThresholdPercent. Never removed: images a container
//! uses (running or exited and not yet removed), images first seen less than
//! imageMinimumGCAge ago. With imageMaximumGCAge set, images unused for longer go whatever
//! the disk says. Layers other images share stay (the store removes only unreferenced ones).
//! The built-in demo image is never removed: an air-gapped node could not pull it back.
//! Not enough to free is kubelet's FreeDiskSpaceFailed event; repeated failures ImageGCFailed.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::image::{ImageRecord, ImageStore};
use tracing::{error, info, warn};

use crate::events::{Kind, Recorder};

/// kubelet's ImageGCPeriod.
pub const GC_PERIOD: Duration = Duration::from_secs(300);

pub const EVENT_FREE_DISK_SPACE_FAILED: &str = "FreeDiskSpaceFailed";
pub const EVENT_IMAGE_GC_FAILED: &str = "ImageGCFailed";

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GcPolicy {
    pub high_threshold_percent: i32,
    pub low_threshold_percent: i32,
    pub min_age: Duration,
    /// 0: no maximum.
    pub max_age: Duration,
}

/// What the manager knows of an image beyond the store's record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seen {
    /// When this agent first saw the image (kubelet's firstDetected; an agent restart starts
    /// the minimum age over, as kubelet's in-memory records do).
    pub first_detected: DateTime<Utc>,
    /// Last created a container or seen in use (`None`: never).
    pub last_used: Option<DateTime<Utc>>,
}

/// An image GC may remove.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub id: Digest,
    pub size: u64,
    pub seen: Seen,
}

/// The images that may go now, least recently used first (then first detected): not in use,
/// not used at `now` or later, at least `min_age` since first detected.
pub fn candidates(
    images: &[ImageRecord],
    in_use: &HashSet<Digest>,
    seen: &HashMap<Digest, Seen>,
    now: DateTime<Utc>,
    min_age: Duration,
) -> Vec<Candidate> {
    let min_age = chrono::Duration::from_std(min_age).unwrap_or(chrono::Duration::MAX);
    let mut v: Vec<Candidate> = images
        .iter()
        .filter(|i| !in_use.contains(&i.id))
        .filter_map(|i| {
            let s = *seen.get(&i.id)?;
            if s.last_used.is_some_and(|u| u >= now) || now - s.first_detected < min_age {
                return None;
            }
            Some(Candidate {
                id: i.id.clone(),
                size: i.size,
                seen: s,
            })
        })
        .collect();
    v.sort_by(|a, b| {
        a.seen
            .last_used
            .cmp(&b.seen.last_used)
            .then(a.seen.first_detected.cmp(&b.seen.first_detected))
    });
    v
}

/// Bytes to free for usage to go down to `low` percent, when usage is at or over `high`.
pub fn bytes_to_free(capacity: u64, available: u64, high: i32, low: i32) -> Option<u64> {
    if capacity == 0 {
        return None;
    }
    let usage = 100 - (available.saturating_mul(100) / capacity) as i64;
    if usage < high as i64 {
        return None;
    }
    let target = capacity as u128 * (100 - low.clamp(0, 100)) as u128 / 100;
    Some((target.saturating_sub(available as u128)) as u64)
}

/// Containers and the image each uses.
type Users = Vec<(String, Digest)>;

/// What one collection did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Report {
    pub removed: Vec<Digest>,
    pub freed: u64,
}

pub struct ImageGc {
    store: Arc<ImageStore>,
    /// The runtime's root (its container records say which images are in use).
    root_dir: PathBuf,
    policy: GcPolicy,
    seen: Mutex<HashMap<Digest, Seen>>,
    events: Recorder,
    prev_failed: AtomicBool,
    /// Images never removed: the one built into the binary.
    protected: HashSet<Digest>,
}

fn parse_time(s: &Option<String>) -> Option<DateTime<Utc>> {
    s.as_deref()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
}

/// Capacity and available bytes of the filesystem holding `dir`.
pub fn fs_usage(dir: &Path) -> Result<(u64, u64), String> {
    let st = nix::sys::statvfs::statvfs(dir).map_err(|e| format!("statfs {}: {e}", dir.display()))?;
    let frag = st.fragment_size() as u64;
    Ok((st.blocks() as u64 * frag, st.blocks_available() as u64 * frag))
}

impl ImageGc {
    /// The image store's directory (on imagefs).
    pub fn images_dir(&self) -> &Path {
        self.store.dir()
    }

    pub fn new(store: Arc<ImageStore>, root_dir: PathBuf, policy: GcPolicy, events: Recorder) -> ImageGc {
        ImageGc {
            store,
            root_dir,
            policy,
            seen: Mutex::new(HashMap::new()),
            events,
            prev_failed: AtomicBool::new(false),
            protected: crate::images::local::demo_image_id().into_iter().collect(),
        }
    }

    /// The images containers use; `None` when a container's image is not known (its record
    /// was rebuilt): then no image may go.
    fn in_use(&self) -> Option<(Users, HashSet<Digest>)> {
        let users: Users = ferrolet_runtime::container::list_records(&self.root_dir)
            .into_iter()
            .map(|r| (r.id, r.image_ref))
            .collect();
        let unknown = Digest::of(b"");
        if users.iter().any(|(_, d)| *d == unknown) {
            return None;
        }
        // The built-in image counts as in use: never a candidate, whatever the disk or its age.
        let set = users
            .iter()
            .map(|(_, d)| d.clone())
            .chain(self.protected.iter().cloned())
            .collect();
        Some((users, set))
    }

    /// kubelet's detectImages: note new images, and the last use of every image.
    fn detect(&self, now: DateTime<Utc>, images: &[ImageRecord], in_use: &HashSet<Digest>) -> HashMap<Digest, Seen> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let ids: HashSet<&Digest> = images.iter().map(|i| &i.id).collect();
        seen.retain(|d, _| ids.contains(d));
        for i in images {
            let s = seen.entry(i.id.clone()).or_insert(Seen {
                first_detected: now,
                last_used: None,
            });
            let recorded = parse_time(&i.last_used);
            s.last_used = s.last_used.max(recorded);
            if in_use.contains(&i.id) {
                s.last_used = Some(now);
            }
        }
        seen.clone()
    }

    /// One round, as kubelet's GarbageCollect; `Err` is what the round could not do.
    pub fn collect(&self, now: DateTime<Utc>) -> Result<Report, String> {
        let images = self.store.list().map_err(|e| format!("listing images: {e}"))?;
        let Some((users, in_use)) = self.in_use() else {
            return Err("a container's image is not known (its record was rebuilt); no image is collected".into());
        };
        let seen = self.detect(now, &images, &in_use);
        let mut report = Report::default();
        if !self.policy.max_age.is_zero() {
            let max = chrono::Duration::from_std(self.policy.max_age).unwrap_or(chrono::Duration::MAX);
            for c in candidates(&images, &in_use, &seen, now, self.policy.min_age) {
                let last = c.seen.last_used.unwrap_or(c.seen.first_detected);
                if now - last > max {
                    info!(image = %c.id, "removing an image unused for longer than imageMaximumGCAge");
                    self.remove(&c, &users, &mut report);
                }
            }
        }
        let (capacity, available) = fs_usage(self.store.dir())?;
        if capacity == 0 {
            return Err(format!("invalid capacity {capacity} on image filesystem"));
        }
        let Some(amount) = bytes_to_free(
            capacity,
            available,
            self.policy.high_threshold_percent,
            self.policy.low_threshold_percent,
        ) else {
            return Ok(report);
        };
        info!(
            usage_percent = 100 - available * 100 / capacity,
            high_threshold = self.policy.high_threshold_percent,
            amount_to_free = amount,
            low_threshold = self.policy.low_threshold_percent,
            "Disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold"
        );
        let mut freed = 0u64;
        for c in candidates(&images, &in_use, &seen, now, self.policy.min_age) {
            if freed >= amount {
                break;
            }
            if report.removed.contains(&c.id) {
                continue;
            }
            if self.remove(&c, &users, &mut report) {
                freed += c.size;
            }
        }
        if freed < amount {
            let msg = format!(
                "Failed to garbage collect required amount of images. Attempted to free {amount} bytes, but only found {freed} bytes eligible to free."
            );
            self.events.node(Kind::Warning, EVENT_FREE_DISK_SPACE_FAILED, &msg);
            return Err(msg);
        }
        Ok(report)
    }

    /// kubelet's DeleteUnusedImages (the eviction manager's reclaim for disk): every image no
    /// container uses and older than imageMinimumGCAge, whatever the thresholds.
    pub fn delete_unused(&self) -> Result<Report, String> {
        let now = Utc::now();
        let images = self.store.list().map_err(|e| format!("listing images: {e}"))?;
        let Some((users, in_use)) = self.in_use() else {
            return Err("a container's image is not known (its record was rebuilt); no image is collected".into());
        };
        let seen = self.detect(now, &images, &in_use);
        let mut report = Report::default();
        for c in candidates(&images, &in_use, &seen, now, self.policy.min_age) {
            self.remove(&c, &users, &mut report);
        }
        Ok(report)
    }

    fn remove(&self, c: &Candidate, users: &[(String, Digest)], report: &mut Report) -> bool {
        match self.store.remove(&c.id.to_string(), users) {
            Ok(_) => {
                info!(image = %c.id, size = c.size, "image garbage collected");
                self.seen.lock().unwrap_or_else(|e| e.into_inner()).remove(&c.id);
                report.removed.push(c.id.clone());
                report.freed += c.size;
                true
            }
            Err(e) => {
                warn!(image = %c.id, error = %ferrolet_fsutil::chain(&e), "removing an image");
                false
            }
        }
    }

    /// A periodic round: failures are logged, and recorded as ImageGCFailed when they repeat
    /// (kubelet's StartGarbageCollection).
    pub fn run_round(&self) {
        match self.collect(Utc::now()) {
            Ok(r) => {
                self.prev_failed.store(false, Ordering::Relaxed);
                if !r.removed.is_empty() {
                    info!(
                        images = r.removed.len(),
                        bytes = r.freed,
                        "image garbage collection freed space"
                    );
                }
            }
            Err(e) => {
                if self.prev_failed.swap(true, Ordering::Relaxed) {
                    error!(error = %e, "Image garbage collection failed multiple times in a row");
                    self.events.node(Kind::Warning, EVENT_IMAGE_GC_FAILED, &e);
                } else {
                    error!(error = %e, "Image garbage collection failed once. Stats initialization may not have completed yet");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(c: char, size: u64) -> ImageRecord {
        let d = Digest::parse(&format!("sha256:{}", c.to_string().repeat(64))).unwrap();
        ImageRecord {
            id: d.clone(),
            manifest: d,
            refs: vec![format!("reg.local/{c}:1")],
            layers: Vec::new(),
            size,
            imported_at: String::new(),
            last_used: None,
        }
    }

    #[test]
    fn candidates_least_recently_used_first_keeping_in_use_and_young() {
        let t0 = Utc::now() - chrono::Duration::hours(1);
        let at = |m: i64| t0 + chrono::Duration::minutes(m);
        let imgs = vec![rec('a', 1), rec('b', 2), rec('c', 3), rec('d', 4), rec('e', 5)];
        let mut seen = HashMap::new();
        let s = |first, used| Seen {
            first_detected: first,
            last_used: used,
        };
        seen.insert(imgs[0].id.clone(), s(at(0), Some(at(30))));
        seen.insert(imgs[1].id.clone(), s(at(0), Some(at(10))));
        seen.insert(imgs[2].id.clone(), s(at(5), None)); // never used: first
        seen.insert(imgs[3].id.clone(), s(at(59), None)); // too young
        seen.insert(imgs[4].id.clone(), s(at(0), None)); // in use
        let in_use: HashSet<Digest> = [imgs[4].id.clone()].into();
        let c = candidates(&imgs, &in_use, &seen, at(60), Duration::from_secs(120));
        let order: Vec<u64> = c.iter().map(|c| c.size).collect();
        assert_eq!(order, [3, 2, 1]);
        let c = candidates(&imgs, &in_use, &seen, at(60), Duration::ZERO);
        assert_eq!(
            c.iter().map(|c| c.size).collect::<Vec<_>>(),
            [3, 4, 2, 1],
            "never used, by detection time"
        );
    }

    #[test]
    fn thresholds() {
        assert_eq!(bytes_to_free(100, 20, 85, 80), None, "80% used, under 85");
        assert_eq!(bytes_to_free(100, 15, 85, 80), Some(5), "85% used: free down to 80%");
        assert_eq!(bytes_to_free(1000, 50, 85, 80), Some(150));
        assert_eq!(bytes_to_free(0, 0, 85, 80), None);
        assert_eq!(bytes_to_free(100, 99, 1, 0), Some(1));
    }

    /// The built-in demo image and another image (no layers) in a real store under a temp
    /// root (no containers there).
    fn store_with_demo() -> (tempfile::TempDir, Arc<ImageStore>) {
        let root = tempfile::tempdir().unwrap();
        let store = Arc::new(ImageStore::open(root.path().join("images")).unwrap());
        crate::images::local::load_demo(&store);
        assert_eq!(
            store.list().unwrap().len(),
            1,
            "the demo image is built into the binary"
        );
        let layout = root.path().join("other");
        std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
        let put = |data: &[u8]| {
            let d = Digest::of(data);
            std::fs::write(layout.join("blobs/sha256").join(d.hex()), data).unwrap();
            (d, data.len())
        };
        let (cd, cl) = put(br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#);
        let manifest =
            serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd.to_string(), "size": cl},
            "layers": []})
            .to_string();
        let (md, ml) = put(manifest.as_bytes());
        std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": md.to_string(), "size": ml, "annotations": {"io.containerd.image.name": "reg.local/other:1"}}]});
        std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
        store.import(&layout).unwrap();
        assert_eq!(store.list().unwrap().len(), 2);
        (root, store)
    }

    fn demo_only(store: &ImageStore) -> bool {
        let ids: Vec<Digest> = store.list().unwrap().into_iter().map(|i| i.id).collect();
        ids == [crate::images::local::demo_image_id().unwrap()]
    }

    #[test]
    fn over_the_threshold_frees_what_is_old_enough_but_never_the_builtin_image() {
        let (root, store) = store_with_demo();
        let policy = GcPolicy {
            // Any usage is over 0%: everything eligible goes, and it can never be enough.
            high_threshold_percent: 0,
            low_threshold_percent: 0,
            min_age: Duration::from_secs(3600),
            max_age: Duration::ZERO,
        };
        let events = Recorder::standalone("n");
        let gc = ImageGc::new(store.clone(), root.path().to_path_buf(), policy, events.clone());
        let now = Utc::now();
        let e = gc.collect(now).unwrap_err();
        assert!(e.contains("but only found 0 bytes eligible to free"), "{e}");
        assert_eq!(store.list().unwrap().len(), 2, "younger than imageMinimumGCAge: kept");
        let e = gc.collect(now + chrono::Duration::hours(2)).unwrap_err();
        assert!(
            e.starts_with("Failed to garbage collect required amount of images"),
            "{e}"
        );
        assert!(
            demo_only(&store),
            "old enough and unused: removed, but the built-in image stays"
        );
        let layers = std::fs::read_dir(store.dir().join("layers")).unwrap().count();
        assert_eq!(layers, 1, "the built-in image's layer stays");
        // The eviction manager's reclaim (every unused image) leaves it too.
        assert!(gc.delete_unused().unwrap().removed.is_empty());
        assert!(demo_only(&store));
        assert!(store.resolve(crate::images::local::DEMO_REF).is_ok());
    }

    #[test]
    fn maximum_age_removes_unused_images_whatever_the_disk() {
        let (root, store) = store_with_demo();
        let policy = GcPolicy {
            high_threshold_percent: 100,
            low_threshold_percent: 99,
            min_age: Duration::ZERO,
            max_age: Duration::from_secs(600),
        };
        let gc = ImageGc::new(
            store.clone(),
            root.path().to_path_buf(),
            policy,
            Recorder::standalone("n"),
        );
        let now = Utc::now();
        assert_eq!(gc.collect(now).unwrap().removed.len(), 0, "just detected");
        let r = gc.collect(now + chrono::Duration::minutes(11)).unwrap();
        assert_eq!(r.removed.len(), 1);
        assert!(
            demo_only(&store),
            "the built-in image is not subject to imageMaximumGCAge"
        );
    }
}
