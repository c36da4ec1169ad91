//! What the machine says about itself (kubelet reads it through cAdvisor): capacity, the
//! identity the Node's nodeInfo shows, and the pid limit the stats report (the eviction
//! manager's signals come from the stats summary, src/eviction/signals.rs). Every function here reads /proc, /sys or statvfs: call them off the async
//! threads.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};

use super::allocatable::{hugepage_resource, Resources};

/// The machine's online logical cpus, as cAdvisor counts them: not the agent's own share
/// (`available_parallelism` follows the caller's affinity and cgroup quota, and the agent
/// runs in a cgroup of its own).
pub fn logical_cpus() -> u64 {
    // SAFETY: sysconf reads a value; no memory is passed.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u64::try_from(n).ok().filter(|n| *n > 0).unwrap_or(1)
}

/// The machine's capacity: logical cpus, MemTotal, the root dir's filesystem size, huge pages
/// of every size the kernel offers, and `max_pods`.
pub fn capacity(root_dir: &Path, max_pods: u32) -> Resources {
    let cpu_milli = logical_cpus() as i64 * 1000;
    let memory = meminfo().map(|m| m.mem_total as i64).unwrap_or(0);
    let ephemeral_storage = filesystem(root_dir).map(|f| f.capacity).unwrap_or(0);
    Resources {
        cpu_milli,
        memory,
        ephemeral_storage,
        pods: max_pods as i64,
        hugepages: hugepages(Path::new("/sys/kernel/mm/hugepages")),
    }
}

/// `/proc/meminfo`, in bytes.
pub fn meminfo() -> Result<procfs::Meminfo> {
    use procfs::Current;
    procfs::Meminfo::current().context("reading /proc/meminfo")
}

/// Free pages the kernel holds on its per-cpu lists, in bytes; 0 when /proc/zoneinfo cannot be
/// read. MemFree leaves them out. Since Linux 6.7 a cpu's list grows while a task frees memory in
/// bulk (a memory-backed emptyDir torn down, a large process gone) and drains back over tens of
/// seconds, so right after such a release MemFree is short of what is free by as much as a GiB.
pub fn per_cpu_free_bytes() -> u64 {
    let Ok(zoneinfo) = std::fs::read_to_string("/proc/zoneinfo") else {
        return 0;
    };
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p.max(1) as u64);
    per_cpu_free_pages(&zoneinfo).saturating_mul(page)
}

/// The pages on every zone's per-cpu lists: the `count:` of each `pagesets` entry.
fn per_cpu_free_pages(zoneinfo: &str) -> u64 {
    let mut in_pagesets = false;
    let mut pages = 0u64;
    for line in zoneinfo.lines() {
        let l = line.trim();
        if line.starts_with("Node ") {
            in_pagesets = false;
        } else if l == "pagesets" {
            in_pagesets = true;
        } else if let Some(n) = l.strip_prefix("count:").filter(|_| in_pagesets) {
            pages = pages.saturating_add(n.trim().parse().unwrap_or(0));
        }
    }
    pages
}

/// The huge page pools under `dir` (`.../hugepages`): (page size in kB, pages configured),
/// smallest page size first, every supported size (0 pages included).
pub fn hugepage_pools(dir: &Path) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(kb) = name
            .strip_prefix("hugepages-")
            .and_then(|s| s.strip_suffix("kB"))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        let pages = std::fs::read_to_string(e.path().join("nr_hugepages"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        out.push((kb, pages));
    }
    out.sort_unstable();
    out
}

/// Huge pages configured per page size (kubelet reports every supported size, 0 included).
pub fn hugepages(dir: &Path) -> BTreeMap<String, i64> {
    hugepage_pools(dir)
        .into_iter()
        .map(|(kb, pages)| (hugepage_resource(kb), (pages as i64).saturating_mul(kb as i64 * 1024)))
        .collect()
}

/// A filesystem's size and what is available to unprivileged users (the nodefs signal).
#[derive(Debug, Clone, Copy)]
pub struct Filesystem {
    pub capacity: i64,
    pub available: i64,
}

/// The filesystem holding `path` (its nearest existing ancestor, for a root dir not yet made).
pub fn filesystem(path: &Path) -> Result<Filesystem> {
    let existing = path.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    let s = nix::sys::statvfs::statvfs(existing).with_context(|| format!("statfs {}", existing.display()))?;
    let frag = s.fragment_size() as i64;
    Ok(Filesystem {
        capacity: (s.blocks() as i64).saturating_mul(frag),
        available: (s.blocks_available() as i64).saturating_mul(frag),
    })
}

/// kubelet's rlimit stats: the pid limit (the smaller of kernel.pid_max and kernel.threads-max)
/// and the number of tasks (threads included) that exist, from /proc/loadavg.
pub fn pids() -> Result<(i64, i64)> {
    let read = |p: &str| -> Result<i64> {
        std::fs::read_to_string(p)
            .with_context(|| format!("reading {p}"))?
            .trim()
            .parse()
            .with_context(|| format!("parsing {p}"))
    };
    let max = read("/proc/sys/kernel/pid_max")?;
    let max = read("/proc/sys/kernel/threads-max").map_or(max, |t| t.min(max));
    let loadavg = std::fs::read_to_string("/proc/loadavg").context("reading /proc/loadavg")?;
    let tasks = loadavg
        .split_whitespace()
        .nth(3)
        .and_then(|f| f.split_once('/'))
        .and_then(|(_, total)| total.parse().ok())
        .with_context(|| format!("parsing /proc/loadavg {loadavg:?}"))?;
    Ok((max, tasks))
}

/// What nodeInfo shows about the machine (the rest of nodeInfo is the agent's own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub kernel_version: String,
    pub os_image: String,
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
}

/// Read the machine's identity; what cannot be read stays empty (as cAdvisor leaves it).
pub fn identity() -> Identity {
    let trimmed = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    Identity {
        kernel_version: trimmed("/proc/sys/kernel/osrelease"),
        os_image: std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|s| pretty_name(&s))
            .unwrap_or_else(|| "Linux".into()),
        machine_id: trimmed("/etc/machine-id"),
        system_uuid: trimmed("/sys/class/dmi/id/product_uuid"),
        boot_id: trimmed("/proc/sys/kernel/random/boot_id"),
    }
}

/// PRETTY_NAME of an os-release file, unquoted.
fn pretty_name(os_release: &str) -> Option<String> {
    let v = os_release.lines().find_map(|l| l.strip_prefix("PRETTY_NAME="))?.trim();
    let v = v
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
        .unwrap_or(v);
    Some(v.to_string()).filter(|v| !v.is_empty())
}

/// Go's name for the architecture this binary runs on (GOARCH), as the Node's labels and
/// nodeInfo show it.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "arm" => "arm",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "powerpc64" => "ppc64",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        "loongarch64" => "loong64",
        "mips64" if cfg!(target_endian = "little") => "mips64le",
        "mips64" => "mips64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_free_pages_sum_every_zone_and_cpu() {
        let zoneinfo = "Node 0, zone      DMA
  per-node stats
      nr_inactive_anon 2869
  pages free     3840
        min      12
  pagesets
    cpu: 0
              count:    0
              high:     0
              batch:    1
  vm stats threshold: 4
    cpu: 1
              count:    2
              high:     0
              batch:    1
  vm stats threshold: 4
  node_unreclaimable:  0
  start_pfn:           1
Node 0, zone   Normal
  pages free     5000000
  pagesets
    cpu: 0
              count:    184039
              high:     184193
              batch:    63
  vm stats threshold: 72
    cpu: 1
              count:    8913
              high:     9636
              batch:    63
  vm stats threshold: 72
  node_unreclaimable:  0
";
        assert_eq!(per_cpu_free_pages(zoneinfo), 2 + 184039 + 8913);
        assert_eq!(per_cpu_free_pages(""), 0);
    }

    #[test]
    fn os_release_pretty_name() {
        assert_eq!(
            pretty_name("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n").as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(pretty_name("PRETTY_NAME=Alpine\n").as_deref(), Some("Alpine"));
        assert_eq!(pretty_name("NAME=x\n"), None);
    }

    #[test]
    fn hugepage_sizes_from_sysfs() {
        let d = tempfile::tempdir().unwrap();
        for (dir, n) in [("hugepages-2048kB", "3\n"), ("hugepages-1048576kB", "0\n")] {
            std::fs::create_dir(d.path().join(dir)).unwrap();
            std::fs::write(d.path().join(dir).join("nr_hugepages"), n).unwrap();
        }
        let h = hugepages(d.path());
        assert_eq!(h["hugepages-2Mi"], 3 * 2048 * 1024);
        assert_eq!(h["hugepages-1Gi"], 0);
    }
}
