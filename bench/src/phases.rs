//! Where a pod's start goes: the agent's own timestamps along one start (its
//! `ferrolet::start_phase` DEBUG events, see docs/start-path.md), read back from its log and
//! turned into a per-phase table (p50 of each phase's share), and the latency with N pods
//! already running.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::Result;

use crate::agent::{ms_between, pod_manifest, wait_mark, Agent};
use crate::procstat::percentile;

/// The phases in the order a start passes them; each is timed from the one before that the
/// pod has (the network phase only with a pod network).
pub const PHASES: [(&str, &str); 13] = [
    (
        "inotify",
        "manifest renamed in -> inotify event seen by the file source",
    ),
    ("parsed", "manifest read, decoded, defaulted, validated"),
    ("admitted", "snapshot merged (pod config), ADD dispatched, admitted"),
    ("worker", "pod worker task running its first sync"),
    ("cgroup", "pod dir, pod.json, QoS tiers, pod cgroup"),
    ("sandbox", "sandbox: namespaces pinned, /dev/shm, record"),
    ("network", "pod network attached (CNI / bridge)"),
    ("volumes", "volumes set up"),
    ("managed_files", "hosts, resolv.conf, hostname written"),
    ("status", "first status computed and saved"),
    ("image", "image ensured present"),
    ("created", "container built: rootfs, spec, libcontainer create"),
    ("started", "container started (libcontainer start, log links)"),
];

/// The `ferrolet::start_phase` events in an agent's log: pod -> phase -> when (first seen).
pub fn read_log(log: &Path) -> HashMap<String, HashMap<String, SystemTime>> {
    let mut out: HashMap<String, HashMap<String, SystemTime>> = HashMap::new();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    for line in text.lines().filter(|l| l.contains("ferrolet::start_phase")) {
        let mut pod = None;
        let mut phase = None;
        let mut at = None;
        for tok in line.split_whitespace() {
            let Some((k, v)) = tok.split_once('=') else { continue };
            let v = v.trim_matches('"');
            match k {
                "pod" => pod = Some(v.to_string()),
                "phase" => phase = Some(v.to_string()),
                "at_us" => at = v.parse::<u64>().ok(),
                _ => {}
            }
        }
        if let (Some(pod), Some(phase), Some(at)) = (pod, phase, at) {
            out.entry(pod)
                .or_default()
                .entry(phase)
                .or_insert(SystemTime::UNIX_EPOCH + Duration::from_micros(at));
        }
    }
    out
}

/// Phase name -> its share (ms) in each start that has it.
pub type Shares = Vec<(String, Vec<f64>)>;

/// One measured start: the pod's name, when its manifest landed, when its first command ran.
pub struct Start {
    pub name: String,
    pub t0: SystemTime,
    pub first: SystemTime,
}

/// The per-phase shares (ms) of each start: phase name -> one value per start that has it;
/// "first instruction" is the container's first command (its mark's mtime) after "started".
pub fn shares(log: &Path, starts: &[Start]) -> Shares {
    let events = read_log(log);
    let mut cols: Vec<(String, Vec<f64>)> = PHASES
        .iter()
        .map(|(p, _)| (p.to_string(), Vec::new()))
        .chain([
            ("first instruction".to_string(), Vec::new()),
            ("total".to_string(), Vec::new()),
        ])
        .collect();
    for s in starts {
        // Static pods are named <name>-<node>.
        let Some(ev) = events
            .iter()
            .find(|(pod, _)| pod.strip_prefix(&s.name).is_some_and(|r| r.starts_with('-')))
            .map(|(_, e)| e)
        else {
            continue;
        };
        let mut prev = s.t0;
        for (i, (p, _)) in PHASES.iter().enumerate() {
            if let Some(t) = ev.get(*p) {
                cols[i].1.push(ms_between(prev, *t));
                prev = *t;
            }
        }
        let n = PHASES.len();
        cols[n].1.push(ms_between(prev, s.first));
        cols[n + 1].1.push(ms_between(s.t0, s.first));
    }
    cols.retain(|(_, v)| !v.is_empty());
    cols
}

pub fn p50(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    percentile(&v, 50.0)
}

/// The per-phase table as Markdown: one column per set of starts (`(title, shares)`).
pub fn render(sets: &[(String, Shares)]) -> String {
    let mut out = String::from("| phase (p50, ms) |");
    for (title, _) in sets {
        out.push_str(&format!(" {title} |"));
    }
    out.push_str(" what it covers |\n|---|");
    for _ in sets {
        out.push_str("---|");
    }
    out.push_str("---|\n");
    let names: Vec<(String, String)> = PHASES
        .iter()
        .map(|(p, d)| (p.to_string(), d.to_string()))
        .chain([
            (
                "first instruction".to_string(),
                "container's first command runs (its file's mtime)".to_string(),
            ),
            ("total".to_string(), "manifest landed -> first command".to_string()),
        ])
        .collect();
    for (name, what) in names {
        if !sets.iter().any(|(_, s)| s.iter().any(|(n, _)| *n == name)) {
            continue;
        }
        out.push_str(&format!("| {name} |"));
        for (_, s) in sets {
            match s.iter().find(|(n, _)| *n == name) {
                Some((_, v)) => out.push_str(&format!(" {:.2} |", p50(v))),
                None => out.push_str(" - |"),
            }
        }
        out.push_str(&format!(" {what} |\n"));
    }
    out
}

/// Start `measured` pods one after another on `a` with `running` pods already running (started
/// first, as a burst, and waited for); returns the measured starts. The filler pods stay.
pub fn starts_with_running(
    a: &Agent,
    image: &str,
    tag: &str,
    running: usize,
    measured: usize,
    gap: Duration,
    pool: usize,
) -> Result<Vec<Start>> {
    let have = std::fs::read_dir(&a.manifests)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("fill"))
        .count();
    for i in have..running {
        let name = format!("fill{i}");
        a.add(&name, &pod_manifest(&name, &a.marks, image))?;
    }
    for i in 0..running {
        wait_mark(&a.marks, &format!("fill{i}"), Duration::from_secs(300))?;
    }
    // Let the burst's after-effects (status writes, probes, and the kernel's teardown of
    // the previous round's pods) settle.
    std::thread::sleep(Duration::from_secs(2));
    let waited = crate::procstat::settle(Duration::from_secs(60));
    eprintln!("   (waited {:.1} s for a quiet machine)", waited.as_secs_f64());
    if pool > 0 {
        a.wait_pool_full(pool, Duration::from_secs(60))?;
    }
    let mut out = Vec::new();
    for i in 0..measured {
        let name = format!("{tag}{i}");
        let t0 = a.add(&name, &pod_manifest(&name, &a.marks, image))?;
        let first = wait_mark(&a.marks, &name, Duration::from_secs(60))?;
        out.push(Start { name, t0, first });
        // A start is measured alone, as a person would write one manifest.
        std::thread::sleep(gap);
    }
    for s in &out {
        a.remove(&s.name)?;
    }
    Ok(out)
}
