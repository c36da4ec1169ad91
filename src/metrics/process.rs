//! The standard `process_*` metrics every Prometheus client exposes (and kubelet's /metrics
//! has): CPU seconds, resident and virtual memory, open and maximum fds, start time, read
//! from /proc/self when scraped.

use std::sync::Mutex;

use prometheus::{Counter, Gauge, IntGauge, Registry};

pub(super) struct ProcessMetrics {
    cpu_seconds: Counter,
    /// The CPU seconds already counted (the counter only goes up by deltas).
    cpu_seen: Mutex<f64>,
    resident: IntGauge,
    virtual_: IntGauge,
    open_fds: IntGauge,
    max_fds: IntGauge,
    start_time: Gauge,
}

impl ProcessMetrics {
    pub(super) fn new() -> ProcessMetrics {
        let int = |name: &str, help: &str| super::valid(IntGauge::new(name, help));
        ProcessMetrics {
            cpu_seconds: super::valid(Counter::new(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
            )),
            cpu_seen: Mutex::new(0.0),
            resident: int("process_resident_memory_bytes", "Resident memory size in bytes."),
            virtual_: int("process_virtual_memory_bytes", "Virtual memory size in bytes."),
            open_fds: int("process_open_fds", "Number of open file descriptors."),
            max_fds: int("process_max_fds", "Maximum number of open file descriptors."),
            start_time: super::valid(Gauge::new(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
            )),
        }
    }

    pub(super) fn register(&self, r: &Registry) {
        super::valid(r.register(Box::new(self.cpu_seconds.clone())));
        for g in [&self.resident, &self.virtual_, &self.open_fds, &self.max_fds] {
            super::valid(r.register(Box::new(g.clone())));
        }
        super::valid(r.register(Box::new(self.start_time.clone())));
    }

    /// Read /proc/self; what cannot be read keeps its last value.
    pub(super) fn refresh(&self) {
        let Some(s) = read_stat() else {
            return;
        };
        let mut seen = self.cpu_seen.lock().unwrap_or_else(|e| e.into_inner());
        if s.cpu_seconds > *seen {
            self.cpu_seconds.inc_by(s.cpu_seconds - *seen);
            *seen = s.cpu_seconds;
        }
        self.resident.set(s.rss_bytes as i64);
        self.virtual_.set(s.vsize_bytes as i64);
        self.start_time.set(s.start_time);
        if let Ok(d) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(d.count() as i64);
        }
        if let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
            self.max_fds.set(soft.min(i64::MAX as u64) as i64);
        }
    }
}

struct Stat {
    cpu_seconds: f64,
    rss_bytes: u64,
    vsize_bytes: u64,
    start_time: f64,
}

fn read_stat() -> Option<Stat> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??.max(1) as f64;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok()??.max(1) as u64;
    let boot = boot_time()?;
    parse_stat(&text, ticks, page, boot)
}

/// Fields after the command (which may hold spaces and parentheses) of /proc/<pid>/stat.
fn parse_stat(text: &str, ticks: f64, page: u64, boot_time: f64) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state): utime 14, stime 15, starttime 22, vsize 23, rss 24.
    let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    Some(Stat {
        cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
        start_time: boot_time + field(22)? as f64 / ticks,
        vsize_bytes: field(23)?,
        rss_bytes: field(24)? * page,
    })
}

fn boot_time() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<f64>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_command_with_spaces_and_parens() {
        let line = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 9 0 \
                    1000 123456789 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let s = parse_stat(line, 100.0, 4096, 1_700_000_000.0).unwrap();
        assert_eq!(s.cpu_seconds, 4.0);
        assert_eq!(s.start_time, 1_700_000_010.0);
        assert_eq!(s.vsize_bytes, 123456789);
        assert_eq!(s.rss_bytes, 300 * 4096);
    }
}
