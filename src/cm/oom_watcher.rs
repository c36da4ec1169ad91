//! kubelet's OOM watcher (`pkg/kubelet/oom/oom_watcher_linux.go` over cAdvisor's oomparser):
//! reads the kernel log from `/dev/kmsg` (from its end: only kills from now on), and turns an
//! OOM kill that no cgroup limit caused (a node-level OOM: the kernel's report names no
//! `oom_memcg`) into a Warning `SystemOOM` event on the Node. Kills under a cgroup's limit are
//! the containers' own: each container reports them as OOMKilled from its cgroup's counters.

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};

use tracing::{info, warn};

use crate::events::{Kind, Recorder};

/// One OOM kill as the kernel reported it (cAdvisor's OomInstance).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OomKill {
    pub pid: i32,
    pub process_name: String,
    /// The cgroup whose limit was hit (`oom_memcg`); "/" for a node-level OOM.
    pub victim_container: String,
    /// The cgroup of the killed task (`task_memcg`); "/" when not reported.
    pub container: String,
    pub constraint: String,
}

impl OomKill {
    /// kubelet records an event only for kills not caused by a cgroup limit.
    pub fn is_system_oom(&self) -> bool {
        self.victim_container == "/"
    }

    /// kubelet's SystemOOM message.
    pub fn event_message(&self) -> String {
        let mut m = "System OOM encountered".to_string();
        if !self.process_name.is_empty() && self.pid != 0 {
            m.push_str(&format!(", victim process: {}, pid: {}", self.process_name, self.pid));
        }
        m
    }
}

/// The message of a `/dev/kmsg` record (`prio,seq,usec,flags;message`); continuation lines
/// (starting with a space: `SUBSYSTEM=...`) are not records.
fn record_message(line: &str) -> Option<&str> {
    if line.starts_with(' ') {
        return None;
    }
    let (head, msg) = line.split_once(';')?;
    head.split(',').next()?.parse::<u32>().ok()?;
    Some(msg.trim_end_matches(['\n', '\r']))
}

/// Reads kernel log messages and assembles OOM kills the way cAdvisor's oomparser does: a
/// kill starts at "invoked oom-killer:" and ends at the `oom-kill:` summary line or at
/// "Killed process N (name)".
#[derive(Default)]
pub struct Parser {
    current: Option<OomKill>,
}

impl Parser {
    /// Feed one message; returns a kill when one is complete.
    pub fn feed(&mut self, msg: &str) -> Option<OomKill> {
        if msg.contains("invoked oom-killer:") {
            self.current = Some(OomKill {
                victim_container: "/".into(),
                container: "/".into(),
                ..Default::default()
            });
            return None;
        }
        let cur = self.current.as_mut()?;
        if let Some(rest) = msg.trim_start().strip_prefix("oom-kill:") {
            // constraint=..,nodemask=..,cpuset=..,mems_allowed=..[,oom_memcg=..],task_memcg=..,task=..,pid=..,uid=..
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
                    .map(str::to_string)
            };
            cur.constraint = field("constraint").unwrap_or_default();
            if let Some(m) = field("oom_memcg") {
                cur.victim_container = m;
            }
            if let Some(t) = field("task_memcg") {
                cur.container = t;
            }
            cur.process_name = field("task").unwrap_or_default();
            cur.pid = field("pid").and_then(|p| p.parse().ok()).unwrap_or(0);
            return self.current.take();
        }
        // Kernels before 5.0: "Task in /a killed as a result of limit of /b".
        if let Some(rest) = msg.split_once("Task in ").map(|(_, r)| r) {
            if let Some((task, limit)) = rest.split_once(" killed as a result of limit of ") {
                cur.container = task.trim().to_string();
                cur.victim_container = limit.trim().to_string();
            }
            return None;
        }
        if let Some(rest) = msg.split_once("Killed process ").map(|(_, r)| r) {
            let (pid, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let name = tail
                .strip_prefix('(')
                .and_then(|t| t.split_once(')'))
                .map(|(n, _)| n.to_string())
                .unwrap_or_default();
            if let Ok(pid) = pid.parse() {
                cur.pid = pid;
                cur.process_name = name;
                return self.current.take();
            }
        }
        None
    }
}

/// Read records from `r` until it ends, calling `on_kill` for every OOM kill. `/dev/kmsg`
/// returns one record per read and EPIPE when records were overwritten before being read:
/// that is skipped.
pub fn scan(r: impl Read, mut on_kill: impl FnMut(OomKill)) {
    let mut reader = BufReader::new(r);
    let mut parser = Parser::default();
    let mut line = String::new();
    let mut errors = 0;
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                errors = 0;
                if let Some(kill) = record_message(&line).and_then(|m| parser.feed(m)) {
                    on_kill(kill);
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => continue,
            Err(e) => {
                errors += 1;
                if errors > 10 {
                    warn!(error = %e, "reading the kernel log: OOM kills of the node are no longer reported");
                    return;
                }
            }
        }
    }
}

/// Start the watcher on its own thread (reads block). Without a readable `/dev/kmsg` (a
/// container without it) the node's OOM kills are not reported, as kubelet logs and goes on.
pub fn start(events: Recorder) {
    let file = match std::fs::File::open("/dev/kmsg") {
        Ok(mut f) => {
            // Only what the kernel logs from now on.
            let _ = f.seek(SeekFrom::End(0));
            f
        }
        Err(e) => {
            warn!(error = %e, "cannot read /dev/kmsg: node OOM kills will not be reported");
            return;
        }
    };
    let spawned = std::thread::Builder::new().name("oom-watcher".into()).spawn(move || {
        info!("watching /dev/kmsg for node OOM kills");
        scan(file, |kill| {
            if kill.is_system_oom() {
                events.node(Kind::Warning, "SystemOOM", &kill.event_message());
            } else {
                tracing::debug!(cgroup = %kill.victim_container, pid = kill.pid, task = %kill.process_name, "OOM kill under a cgroup limit");
            }
        });
    });
    if let Err(e) = spawned {
        warn!(error = %e, "starting the OOM watcher");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Records as a 6.1 kernel writes them to /dev/kmsg.
    const MEMCG: &str = "4,1001,5000000,-;sh invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=1000\n SUBSYSTEM=x\n6,1002,5000001,-;memory: usage 16384kB, limit 16384kB, failcnt 40\n6,1003,5000002,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/kubepods/podabc,task_memcg=/kubepods/podabc/ctr,task=tr,pid=4242,uid=0\n3,1004,5000003,-;Memory cgroup out of memory: Killed process 4242 (tr) total-vm:1000kB, anon-rss:900kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:40kB oom_score_adj:1000\n";
    const GLOBAL: &str = "4,2001,6000000,-;stress invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0\n6,2002,6000001,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice,task=stress,pid=777,uid=1000\n3,2003,6000002,-;Out of memory: Killed process 777 (stress) total-vm:8000000kB, anon-rss:7000000kB\n";
    const LEGACY: &str = "4,3001,1,-;foo invoked oom-killer: gfp_mask=0x24000c0, order=0, oom_score_adj=0\n3,3002,2,-;Task in /mem2 killed as a result of limit of /mem2\n3,3003,3,-;Killed process 99 (foo) total-vm:1kB\n";

    fn kills(text: &str) -> Vec<OomKill> {
        let mut out = Vec::new();
        scan(text.as_bytes(), |k| out.push(k));
        out
    }

    #[test]
    fn a_cgroup_limit_kill_is_not_a_system_oom() {
        let k = kills(MEMCG);
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].victim_container, "/kubepods/podabc");
        assert_eq!(k[0].container, "/kubepods/podabc/ctr");
        assert_eq!((k[0].pid, k[0].process_name.as_str()), (4242, "tr"));
        assert_eq!(k[0].constraint, "CONSTRAINT_MEMCG");
        assert!(!k[0].is_system_oom());
    }

    #[test]
    fn a_global_oom_is_a_system_oom_with_kubelets_message() {
        let k = kills(&format!("{MEMCG}{GLOBAL}"));
        assert_eq!(k.len(), 2);
        assert!(k[1].is_system_oom());
        assert_eq!(
            k[1].event_message(),
            "System OOM encountered, victim process: stress, pid: 777"
        );
        assert_eq!(k[1].container, "/user.slice");
    }

    #[test]
    fn legacy_kernels_and_noise() {
        let k = kills(&format!("6,1,1,-;unrelated\n{LEGACY}garbage\n"));
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].victim_container, "/mem2");
        assert_eq!((k[0].pid, k[0].process_name.as_str()), (99, "foo"));
        assert!(!k[0].is_system_oom());
        // A report without a summary nor a victim line produces nothing.
        assert!(kills("4,1,1,-;x invoked oom-killer: gfp\n").is_empty());
        assert_eq!(
            OomKill {
                victim_container: "/".into(),
                ..Default::default()
            }
            .event_message(),
            "System OOM encountered"
        );
    }
}
