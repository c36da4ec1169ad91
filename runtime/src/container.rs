//! A container on disk. Everything the runtime knows about a container lives in its state
//! directory `<root>/containers/<id>/`, so a new agent process can pick up where a killed one
//! left off:
//!
//! ```text
//! container.json  what was asked for (written once, before the monitor is forked)
//! config.json     the OCI spec (the bundle)
//! monitor.json    monitor and init pids with start times (written by the monitor)
//! started.json    when start succeeded
//! exit.json       exit code, signal, OOM kill (written by the monitor when the container exits)
//! rootfs/ upper/ work/   the overlay
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::cgroups::Cgroups;
use crate::digest::Digest;
use crate::error::{Error, Result};
use crate::pidfd::{process_matches, process_start_time};
use ferrolet_fsutil::{chain, read_json_opt};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecord {
    pub id: String,
    pub name: String,
    /// The reference the caller asked for.
    pub image: String,
    /// The image's config digest.
    pub image_ref: Digest,
    /// The `imageID` Kubernetes shows (`repo@manifest-digest`).
    pub image_id: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub created_at: String,
    pub log_path: PathBuf,
    pub cgroup_path: String,
    /// The image's StopSignal, if any (e.g. `SIGQUIT`).
    pub stop_signal: Option<String>,
    pub boot_id: String,
    /// The identity the container's process runs with (CRI's ContainerStatus.user). Absent in
    /// records written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<ProcessUser>,
}

/// uid, primary gid and supplementary groups of a container's process.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ProcessUser {
    pub uid: u32,
    pub gid: u32,
    pub supplemental_groups: Vec<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MonitorRecord {
    pub monitor_pid: i32,
    pub monitor_start: u64,
    pub init_pid: i32,
    pub init_start: u64,
    /// When the container was built in a mount namespace of the monitor's own
    /// (crate::mount_ns): how many mounts that namespace had. None: built in the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_mounts: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StartedRecord {
    pub started_at: String,
}

/// What a monitor records when its container's init exits (`exit.json`).
pub use ferrolet_monitor::ExitRecord;

/// Annotation of the OCI spec holding a copy of `container.json` (JSON in a string). The spec is
/// `config.json` in the state directory, and libcontainer copies its annotations into its own
/// `state.json`: two more copies to rebuild the record from when `container.json` cannot be read.
pub(crate) const RECORD_ANNOTATION: &str = "ferrolet.io/container-record";

impl ContainerState {
    /// The state an `exit.json` says: Exited, or ExitUnknown when the monitor recorded that it
    /// could not learn how init ended.
    fn from_exit(e: ExitRecord) -> ContainerState {
        if e.reason.is_some() {
            ContainerState::ExitUnknown(e)
        } else {
            ContainerState::Exited(e)
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum ContainerState {
    /// Created, not started; the init process waits.
    Created,
    Running,
    /// The container's init exited and its monitor recorded how (`exit.json`).
    Exited(ExitRecord),
    /// The container is certainly gone (its monitor is dead and its cgroup holds no process,
    /// or the node rebooted since) but how it ended is not known: no exit was recorded (the
    /// monitor was killed) or `exit.json` cannot be read. The record is a stand-in: code 255, no
    /// signal, `reason` says why, `finished_at` is the best time known. A terminated container
    /// with an unknown outcome; never running.
    ExitUnknown(ExitRecord),
    /// The container may still run but the runtime cannot say how it is: its records cannot be
    /// read and the kernel shows processes in its cgroup, or its monitor died while processes
    /// remain (nobody will record an exit). Treat it as running: start no replacement, count
    /// no restart. `kill` signals its cgroup, `wait` polls until it is gone, `delete` kills
    /// by cgroup and removes it. `reason` says what was unreadable and what the kernel showed.
    Unknown {
        reason: String,
    },
    /// Creation did not finish (the agent died between writing the record and the monitor
    /// reporting back): delete it.
    Incomplete,
}

impl ContainerState {
    /// Created, Running or Unknown: the container may still hold processes.
    pub fn may_be_alive(&self) -> bool {
        matches!(
            self,
            ContainerState::Created | ContainerState::Running | ContainerState::Unknown { .. }
        )
    }
}

#[derive(Debug, Clone)]
pub struct ContainerInfo {
    /// `container.json`, or when it cannot be read, its copy in the spec's annotations, or a
    /// record rebuilt from what is left (see `record_errors`: labels may then be empty).
    pub record: ContainerRecord,
    pub state: ContainerState,
    /// `monitor.json`, or when it cannot be read, the monitor as found through the kernel.
    pub monitor: Option<MonitorRecord>,
    pub started_at: Option<String>,
    /// Every state file that could not be read, with the error and what stood in for it.
    /// Empty when all records were read.
    pub record_errors: Vec<String>,
}

impl ContainerInfo {
    pub fn id(&self) -> &str {
        &self.record.id
    }
    pub fn is_running(&self) -> bool {
        matches!(self.state, ContainerState::Running)
    }
}

pub(crate) fn state_dir(root: &Path, id: &str) -> PathBuf {
    root.join("containers").join(id)
}

/// A state file: read, absent, or there but unreadable (torn write, garbage, I/O error).
enum Rec<T> {
    Ok(T),
    Missing,
    Bad(String),
}

impl<T> Rec<T> {
    fn ok(self) -> Option<T> {
        match self {
            Rec::Ok(v) => Some(v),
            _ => None,
        }
    }
}

fn read_rec<T: DeserializeOwned>(path: &Path) -> Rec<T> {
    match read_json_opt::<T>(path) {
        Ok(Some(v)) => Rec::Ok(v),
        Ok(None) => Rec::Missing,
        Err(e) => Rec::Bad(chain(&e).to_string()),
    }
}

/// Any JSON file as a value; `None` when missing or unreadable.
fn read_value(path: &Path) -> Option<serde_json::Value> {
    read_json_opt::<serde_json::Value>(path).ok().flatten()
}

fn mtime_rfc3339(path: &Path) -> Option<String> {
    let t = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    Some(chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Nanos, true))
}

/// libcontainer's directory of the container whose state directory is `dir`
/// (`<root>/containers/<id>` -> `<root>/libcontainer/<id>`).
fn lc_dir(dir: &Path, id: &str) -> Option<PathBuf> {
    Some(dir.parent()?.parent()?.join("libcontainer").join(id))
}

/// What libcontainer keeps of a container: its `state.json` and `youki_config.json`.
#[derive(Default)]
struct LcState {
    state: Option<serde_json::Value>,
    cgroup_path: Option<String>,
}

impl LcState {
    fn read(dir: &Path, id: &str) -> LcState {
        let Some(d) = lc_dir(dir, id) else {
            return LcState::default();
        };
        LcState {
            state: read_value(&d.join("state.json")),
            cgroup_path: read_value(&d.join("youki_config.json"))
                .and_then(|v| v.get("cgroup_path")?.as_str().map(str::to_string)),
        }
    }

    fn init_pid(&self) -> Option<i32> {
        self.state
            .as_ref()?
            .get("pid")?
            .as_i64()
            .map(|p| p as i32)
            .filter(|p| *p > 0)
    }
}

fn annotations_of(v: Option<&serde_json::Value>) -> Option<&serde_json::Map<String, serde_json::Value>> {
    v?.get("annotations")?.as_object()
}

/// The container record: `container.json`, else its copy in config.json's or libcontainer's
/// annotations, else what can be pieced together (id, annotations, cgroup path, creation
/// time; no labels). Problems are added to `errors`.
fn recover_record(dir: &Path, id: &str, errors: &mut Vec<String>) -> ContainerRecord {
    let path = dir.join("container.json");
    match read_rec::<ContainerRecord>(&path) {
        Rec::Ok(r) => return r,
        Rec::Missing => errors.push(format!("{} is missing", path.display())),
        Rec::Bad(e) => errors.push(e),
    }
    let lc = LcState::read(dir, id);
    let spec = read_value(&dir.join("config.json"));
    for (src, ann) in [
        ("config.json", annotations_of(spec.as_ref())),
        ("libcontainer's state.json", annotations_of(lc.state.as_ref())),
    ] {
        let copy = ann
            .and_then(|a| a.get(RECORD_ANNOTATION)?.as_str())
            .and_then(|s| serde_json::from_str::<ContainerRecord>(s).ok());
        if let Some(mut r) = copy {
            r.id = id.to_string();
            errors.push(format!("container record rebuilt from its copy in {src}"));
            return r;
        }
    }
    errors.push("no readable copy of the container record: name, image and labels are unknown".into());
    let annotations = annotations_of(spec.as_ref())
        .or_else(|| annotations_of(lc.state.as_ref()))
        .map(|a| {
            a.iter()
                .filter(|(k, _)| k.as_str() != RECORD_ANNOTATION)
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let cgroup_path = spec
        .as_ref()
        .and_then(|s| s.get("linux")?.get("cgroupsPath")?.as_str().map(str::to_string))
        .or_else(|| lc.cgroup_path.clone())
        .unwrap_or_default();
    let created_at = lc
        .state
        .as_ref()
        .and_then(|s| s.get("created")?.as_str().map(str::to_string))
        .or_else(|| mtime_rfc3339(dir))
        .unwrap_or_default();
    ContainerRecord {
        id: id.to_string(),
        name: String::new(),
        image: String::new(),
        // Matches no image: which image it used is unknown.
        image_ref: Digest::of(b""),
        image_id: String::new(),
        labels: BTreeMap::new(),
        annotations,
        created_at,
        log_path: PathBuf::new(),
        cgroup_path,
        stop_signal: None,
        boot_id: String::new(),
        user: None,
    }
}

fn stand_in_exit(reason: String, finished_at: String) -> ExitRecord {
    ExitRecord {
        exit_code: 255,
        signal: None,
        oom_killed: false,
        finished_at,
        reason: Some(reason),
    }
}

/// Read a container's files and work out its state. Records that cannot be read never make a
/// live container look gone or finished: the kernel (the processes in its cgroup, the monitor
/// holding its state directory) decides then, and what it cannot decide is
/// [`ContainerState::Unknown`]. Fails only when the state directory does not exist.
pub(crate) fn load(dir: &Path, cgroups: &Cgroups) -> Result<ContainerInfo> {
    let id = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !dir.is_dir() {
        return Err(Error::ContainerNotFound(id));
    }
    let mut errors = Vec::new();
    let record = recover_record(dir, &id, &mut errors);
    let monitor_path = dir.join("monitor.json");
    let started_path = dir.join("started.json");
    let exit_path = dir.join("exit.json");
    // started.json is written only after start() succeeded: if it exists the container was
    // started, even when the file cannot be read (its mtime is then the start time).
    let started = read_rec::<StartedRecord>(&started_path);
    let mut started_at = match &started {
        Rec::Ok(s) => Some(s.started_at.clone()),
        Rec::Missing => None,
        Rec::Bad(e) => {
            errors.push(format!("{e} (it exists, so the container was started)"));
            Some(mtime_rfc3339(&started_path).unwrap_or_else(|| record.created_at.clone()))
        }
    };
    let exit = read_rec::<ExitRecord>(&exit_path);
    let monitor_rec = read_rec::<MonitorRecord>(&monitor_path);
    let mut monitor = None;

    // The common case: the records say it all.
    let exit_err = match exit {
        Rec::Ok(e) => {
            return Ok(finish(
                record,
                ContainerState::from_exit(e),
                monitor_rec.ok(),
                started_at,
                errors,
            ));
        }
        Rec::Missing => None,
        Rec::Bad(e) => {
            errors.push(e.clone());
            Some(e)
        }
    };
    let live = |started: bool| {
        if started {
            ContainerState::Running
        } else {
            ContainerState::Created
        }
    };
    // Written in another boot: by the record's boot id, else by monitor.json's mtime.
    let other_boot = if record.boot_id.is_empty() {
        !crate::probe::written_this_boot(&monitor_path)
    } else {
        record.boot_id != ferrolet_fsutil::boot_id()
    };
    // The processes of the container per the kernel: those in its cgroup, or when no record
    // names the cgroup, in a cgroup named after the container.
    let cgroup = if record.cgroup_path.is_empty() {
        crate::probe::cgroup_named(&id).unwrap_or_default()
    } else {
        record.cgroup_path.clone()
    };
    let remaining = || -> Vec<i32> {
        if cgroup.trim_matches('/').is_empty() {
            Vec::new()
        } else {
            cgroup_procs(cgroups, &cgroup)
        }
    };
    let where_ = || {
        if cgroup.is_empty() {
            format!("a cgroup named {id}")
        } else {
            format!("cgroup {cgroup}")
        }
    };
    let finished_at = || {
        mtime_rfc3339(&exit_path)
            .or_else(|| started_at.clone())
            .unwrap_or_else(|| record.created_at.clone())
    };
    let gone = |why: &str| {
        let reason = match &exit_err {
            Some(e) => format!("exit.json is unreadable ({e}); {why}; exit status unknown"),
            None => format!("{why}; exit status unknown"),
        };
        ContainerState::ExitUnknown(stand_in_exit(reason, finished_at()))
    };
    // The monitor writes exit.json before it exits: a dead monitor's exit is on disk by the
    // time we look again.
    let exit_now = || match read_rec::<ExitRecord>(&exit_path) {
        Rec::Ok(e) => Some(e),
        _ => None,
    };

    let state = match monitor_rec {
        Rec::Ok(m) => {
            let state = if other_boot {
                gone("the node rebooted")
            } else if process_matches(m.monitor_pid, m.monitor_start) {
                live(started_at.is_some())
            } else if let Some(e) = exit_now() {
                ContainerState::from_exit(e)
            } else {
                let left = remaining();
                if !left.is_empty() {
                    ContainerState::Unknown {
                        reason: format!(
                            "its monitor (pid {}) died while processes remain in {} (pids {left:?}); nobody records its exit",
                            m.monitor_pid,
                            where_()
                        ),
                    }
                } else if exit_err.is_some() {
                    gone("the container and its monitor are gone")
                } else {
                    gone("the container's monitor died")
                }
            };
            monitor = Some(m);
            state
        }
        // Written in another boot without a monitor record: monitor.json is not fsynced, so a
        // power loss may have taken it from a container that ran. Gone, as with a record.
        Rec::Missing if other_boot && exit_err.is_none() => gone("the node rebooted"),
        // Neither an exit nor a monitor recorded, the record fine: a creation that did not
        // finish (or is under way), as long as the kernel shows nothing alive.
        Rec::Missing if exit_err.is_none() && errors.is_empty() && remaining().is_empty() => ContainerState::Incomplete,
        monitor_rec => {
            let what = match monitor_rec {
                Rec::Bad(e) => e,
                _ => format!("{} is missing", monitor_path.display()),
            };
            errors.push(what.clone());
            let left = remaining();
            // The monitor: the one holding the state directory open, else the parent of a
            // process of the cgroup (the init libcontainer recorded first; a pid outside the
            // cgroup may have been reused by anyone).
            let mut candidates = left.clone();
            if let Some(i) = LcState::read(dir, &id).init_pid() {
                if let Some(at) = candidates.iter().position(|p| *p == i) {
                    candidates.swap(0, at);
                }
            }
            let found = crate::probe::monitor_holding(dir)
                .map(|mpid| {
                    let kids = crate::probe::children(mpid);
                    (mpid, candidates.iter().copied().find(|p| kids.contains(p)))
                })
                .or_else(|| crate::probe::monitor_of(&candidates).map(|(m, i)| (m, Some(i))));
            match found {
                Some((mpid, init)) if !other_boot => {
                    let init_pid = init.unwrap_or(0);
                    monitor = Some(MonitorRecord {
                        monitor_pid: mpid,
                        monitor_start: process_start_time(mpid).unwrap_or(0),
                        init_pid,
                        init_start: init.and_then(process_start_time).unwrap_or(0),
                        build_mounts: None,
                    });
                    errors.push(format!(
                        "monitor found through the kernel: pid {mpid}, container init {}",
                        init.map_or("gone".to_string(), |p| format!("pid {p}"))
                    ));
                    // Without started.json: a created container's init has not exec'd yet.
                    if started_at.is_none() && init.and_then(|i| crate::probe::has_execed(i, mpid)) == Some(true) {
                        errors.push("started.json is missing but the container's init has exec'd: started".into());
                        started_at = mtime_rfc3339(&monitor_path);
                        live(true)
                    } else {
                        live(started_at.is_some())
                    }
                }
                _ => {
                    if let Some(e) = exit_now() {
                        ContainerState::from_exit(e)
                    } else if !left.is_empty() && !other_boot {
                        ContainerState::Unknown {
                            reason: format!(
                                "its monitor record is unreadable ({what}), no monitor holds it, and processes remain in {} (pids {left:?})",
                                where_()
                            ),
                        }
                    } else if other_boot {
                        gone("the node rebooted")
                    } else if exit_err.is_none() && started_at.is_none() && matches!(started, Rec::Missing) {
                        // Never started, nothing alive: a creation that did not finish.
                        ContainerState::Incomplete
                    } else {
                        gone(&format!(
                            "its monitor record is unreadable ({what}) and neither a monitor nor a process of the container is left"
                        ))
                    }
                }
            }
        }
    };
    Ok(finish(record, state, monitor, started_at, errors))
}

fn finish(
    record: ContainerRecord,
    state: ContainerState,
    monitor: Option<MonitorRecord>,
    started_at: Option<String>,
    errors: Vec<String>,
) -> ContainerInfo {
    if !errors.is_empty() {
        // (the caller reports record_errors; inspect runs too often to warn here each time)
        tracing::debug!(container = %record.id, problems = %errors.join("; "), state = ?state, "unreadable container state");
    }
    ContainerInfo {
        record,
        state,
        monitor,
        started_at,
        record_errors: errors,
    }
}

/// Processes in `cgroup` and below (none for a hierarchy root, which no container has).
fn cgroup_procs(cgroups: &Cgroups, cgroup: &str) -> Vec<i32> {
    if cgroup.trim_matches('/').is_empty() {
        return Vec::new();
    }
    cgroups.procs_below(cgroup)
}

/// The records of every container under `root`, without needing a running runtime (for tools
/// that only read, like `ferrolet images rm` checking which images are in use). A record that
/// cannot be read is rebuilt as far as its copies allow, so no container is left out.
pub fn list_records(root: &Path) -> Vec<ContainerRecord> {
    let base = root.join("containers");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !e.path().is_dir() {
            continue;
        }
        out.push(recover_record(&e.path(), &name, &mut Vec::new()));
    }
    out
}
