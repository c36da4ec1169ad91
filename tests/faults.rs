//! Fault injection (issue 11): the agent is killed (SIGKILL) at random points while pods are
//! created and deleted, many times over; afterwards the node must have exactly one container per
//! desired container, and nothing at all once every pod is deleted. The seed is printed, and
//! FERROLET_FAULT_SEED replays a run.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(60);

/// xorshift64*: enough randomness for delays and choices, reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Running monitors by the display name they show in ps (`<namespace>/<pod>/<container>`),
/// for the pods of node `node`.
fn monitors(node: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd);
        if let Some(name) = cmd.trim_end_matches('\0').strip_prefix("ferrolet-monitor ") {
            if name.contains(&format!("-{node}/")) {
                *out.entry(name.to_string()).or_default() += 1;
            }
        }
    }
    out
}

/// A pod of two containers.
fn two(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: a, image: {IMAGE}, command: [sleep, \"3600\"]}}\n  - {{name: b, image: {IMAGE}, command: [sleep, \"3600\"]}}\n"
    )
}

#[test]
fn killed_at_random_points_the_node_converges() {
    let seed = std::env::var("FERROLET_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("fault injection seed: {seed} (FERROLET_FAULT_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let mut a = Agent::start("faults", &[]);
    let names = ["f1", "f2", "f3", "f4"];
    let mut desired: Vec<&str> = Vec::new();
    for round in 0..12 {
        // Change the desired set (add or remove one or two pods), then kill the agent at a
        // random point of the work that follows.
        for _ in 0..=rng.below(2) {
            let n = names[rng.below(names.len() as u64) as usize];
            if desired.contains(&n) {
                a.remove(&format!("{n}.yaml"));
                desired.retain(|d| *d != n);
            } else {
                a.write(&format!("{n}.yaml"), &two(n));
                desired.push(n);
            }
        }
        std::thread::sleep(Duration::from_millis(rng.below(1500)));
        eprintln!("round {round}: kill -9 with {desired:?} desired");
        a.restart();
    }
    // Settled: exactly one running container per desired container, nothing else.
    let want: BTreeMap<String, usize> = desired
        .iter()
        .flat_map(|n| ["a", "b"].map(|c| (format!("default/{n}-{}/{c}", a.node), 1)))
        .collect();
    let deadline = Instant::now() + T;
    loop {
        let got = monitors(&a.node);
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "seed {seed}: containers {got:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for n in &desired {
        a.wait_phase(n, "Running", T);
    }
    // Everything deleted: nothing of the pods is left on the node.
    for n in &desired {
        a.remove(&format!("{n}.yaml"));
    }
    for n in &desired {
        a.wait_gone(n, T);
    }
    let deadline = Instant::now() + T;
    while !monitors(&a.node).is_empty() {
        assert!(
            Instant::now() < deadline,
            "seed {seed}: left running: {:?}",
            monitors(&a.node)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let count = |sub: &str| std::fs::read_dir(a.root.join(sub)).map(|d| d.count()).unwrap_or(0);
    let deadline = Instant::now() + T;
    while count("containers") + count("pods") > 0 {
        assert!(
            Instant::now() < deadline,
            "seed {seed}: left on disk: {} containers, {} pods",
            count("containers"),
            count("pods")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Below the root dir: the root itself is a mount of the running agent's
    // (ferrolet_runtime::mount_ns), which its reset undoes.
    let below = format!("{}/", a.root.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let left: Vec<&str> = mounts
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&below)))
        .collect();
    assert!(
        left.is_empty(),
        "seed {seed}: mounts left under the root dir: {left:#?}"
    );
    let cg = ferrolet_runtime::cgroups::Cgroups::detect().unwrap();
    let pods_left: Vec<String> = ["", "/burstable", "/besteffort"]
        .iter()
        .filter_map(|level| cg.dir_for("memory", &format!("{}/kubepods{level}", a.cgroup.path())))
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("pod"))
        .collect();
    assert!(pods_left.is_empty(), "seed {seed}: pod cgroups left: {pods_left:?}");
}
