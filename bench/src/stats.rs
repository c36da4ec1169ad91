//! The cost of the stats endpoints with many pods: one `/stats/summary` and one
//! `/metrics/resource` scrape (p50/p99 over many, from request to the last byte over the CLI
//! socket), and the agent's own CPU with no scrapes against one scrape of each every 10 s
//! (the sampler runs at its default housekeeping interval in both).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::agent::{pod_manifest, wait_mark, Agent};
use crate::procstat::{cpu_ticks, ticks_per_second};

pub struct StatsResult {
    pub summary_p50_ms: f64,
    pub summary_p99_ms: f64,
    pub resource_p50_ms: f64,
    pub resource_p99_ms: f64,
    pub summary_bytes: usize,
    pub cpu_idle_s_per_min: f64,
    pub cpu_scraped_s_per_min: f64,
}

fn timed(a: &Agent, path: &str, n: usize) -> Result<(Vec<f64>, usize)> {
    let mut v = Vec::with_capacity(n);
    let mut size = 0;
    for _ in 0..n {
        let t = Instant::now();
        size = a.get(path)?.len();
        v.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((v, size))
}

/// The agent process's CPU seconds per minute over `secs`, running `during` every 10 s.
fn agent_cpu(a: &Agent, secs: u64, mut during: impl FnMut() -> Result<()>) -> Result<f64> {
    let t0 = cpu_ticks(a.pid());
    let start = Instant::now();
    let mut next = Duration::ZERO;
    while start.elapsed() < Duration::from_secs(secs) {
        if start.elapsed() >= next {
            during()?;
            next += Duration::from_secs(10);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let used = (cpu_ticks(a.pid()) - t0) as f64 / ticks_per_second() as f64;
    Ok(used * 60.0 / start.elapsed().as_secs_f64())
}

pub fn run(
    bin: &Path,
    dir: &Path,
    cgroup_root: &str,
    image: &str,
    pods: usize,
    scrapes: usize,
    cpu_seconds: u64,
) -> Result<StatsResult> {
    let a = Agent::start(bin, dir, cgroup_root, "bridge", &dir.join("agent.log"))?;
    for i in 0..pods {
        let name = format!("stats{i}");
        a.add(&name, &pod_manifest(&name, &a.marks, image))?;
    }
    for i in 0..pods {
        wait_mark(&a.marks, &format!("stats{i}"), Duration::from_secs(300))?;
    }
    // Two housekeeping rounds, so every pod has its rates and its walks.
    std::thread::sleep(Duration::from_secs(25));
    let (mut s, summary_bytes) = timed(&a, "/stats/summary", scrapes)?;
    let (mut r, _) = timed(&a, "/metrics/resource", scrapes)?;
    let (s50, _, s99) = crate::stats(std::mem::take(&mut s));
    let (r50, _, r99) = crate::stats(std::mem::take(&mut r));
    let idle = agent_cpu(&a, cpu_seconds, || Ok(()))?;
    let scraped = agent_cpu(&a, cpu_seconds, || {
        a.get("/stats/summary")?;
        a.get("/metrics/resource")?;
        Ok(())
    })?;
    a.finish();
    Ok(StatsResult {
        summary_p50_ms: s50,
        summary_p99_ms: s99,
        resource_p50_ms: r50,
        resource_p99_ms: r99,
        summary_bytes,
        cpu_idle_s_per_min: idle,
        cpu_scraped_s_per_min: scraped,
    })
}
