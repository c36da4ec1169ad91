//! `ferrolet top pods` / `ferrolet top node`: cpu and memory as `kubectl top` prints them
//! (CPU in millicores, memory in Mi; the working set and the cpu rate metrics-server would
//! take), from the agent's stats cache through `/stats/summary?only_cpu_and_memory=true`.

use anyhow::{bail, Result};

use super::{TopArgs, TopCommand};
use crate::stats::summary::{ContainerStats, Summary};

pub async fn run(args: &TopArgs) -> Result<i32> {
    let sub = match &args.command {
        TopCommand::Pods(p) => Some(p),
        TopCommand::Node => None,
    };
    let socket = args.root.root_dir.join("ferrolet.sock");
    let v = super::client::get_json(&socket, "/stats/summary?only_cpu_and_memory=true").await?;
    let summary: Summary = serde_json::from_value(v)?;
    let (lines, ok) = match sub {
        Some(p) => pods_table(&summary, p)?,
        None => node_table(&summary, cpu_capacity_milli())?,
    };
    for l in lines {
        println!("{l}");
    }
    Ok(if ok { 0 } else { 1 })
}

fn cpu_capacity_milli() -> u64 {
    crate::node::machine::logical_cpus() * 1000
}

/// kubectl's formats: cpu in millicores ("250m"), memory in mebibytes ("64Mi").
pub fn millicores(nano_cores: u64) -> String {
    format!("{}m", nano_cores.div_ceil(1_000_000))
}

pub fn mebibytes(bytes: u64) -> String {
    format!("{}Mi", bytes / (1024 * 1024))
}

fn usage(c: &ContainerStats) -> Option<(u64, u64)> {
    Some((c.cpu.as_ref()?.usage_nano_cores?, c.memory.as_ref()?.working_set_bytes?))
}

fn table(rows: Vec<Vec<String>>) -> Vec<String> {
    let cols = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..cols)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            r.iter()
                .enumerate()
                .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
                .collect::<Vec<_>>()
                .join("   ")
                .trim_end()
                .to_string()
        })
        .collect()
}

/// The node's line: the cpu rate and the working set, and their share of the capacity.
pub fn node_table(s: &Summary, cpu_capacity_milli: u64) -> Result<(Vec<String>, bool)> {
    let n = &s.node;
    let (Some(cpu), Some(mem)) = (
        n.cpu.as_ref().and_then(|c| c.usage_nano_cores),
        n.memory.as_ref().and_then(|m| m.working_set_bytes),
    ) else {
        bail!("metrics not available yet");
    };
    let capacity = n.memory.as_ref().and_then(|m| m.available_bytes).map_or(0, |a| a + mem);
    let pct = |used: u64, cap: u64| {
        (used * 100)
            .checked_div(cap)
            .map_or_else(|| "<unknown>".to_string(), |p| format!("{p}%"))
    };
    let rows = vec![
        ["NAME", "CPU(cores)", "CPU%", "MEMORY(bytes)", "MEMORY%"]
            .map(String::from)
            .to_vec(),
        vec![
            n.node_name.clone(),
            millicores(cpu),
            pct(cpu.div_ceil(1_000_000), cpu_capacity_milli),
            mebibytes(mem),
            pct(mem, capacity),
        ],
    ];
    Ok((table(rows), true))
}

/// One line per pod (the sum of its containers, as metrics-server reports a pod), or per
/// container with `--containers`.
pub fn pods_table(s: &Summary, a: &super::TopPodsArgs) -> Result<(Vec<String>, bool)> {
    struct Row {
        ns: String,
        pod: String,
        container: String,
        cpu: u64,
        mem: u64,
    }
    let mut rows = Vec::new();
    for p in &s.pods {
        if a.namespace.as_deref().is_some_and(|n| n != p.pod_ref.namespace) {
            continue;
        }
        if a.name.as_deref().is_some_and(|n| n != p.pod_ref.name) {
            continue;
        }
        let us: Vec<(&str, Option<(u64, u64)>)> = p.containers.iter().map(|c| (c.name.as_str(), usage(c))).collect();
        // metrics-server leaves out a pod while any container's numbers are missing.
        if us.is_empty() || us.iter().any(|(_, u)| u.is_none()) {
            continue;
        }
        if a.containers {
            for (name, u) in us {
                let (cpu, mem) = u.unwrap_or_default();
                rows.push(Row {
                    ns: p.pod_ref.namespace.clone(),
                    pod: p.pod_ref.name.clone(),
                    container: name.to_string(),
                    cpu,
                    mem,
                });
            }
        } else {
            let (cpu, mem) = us
                .iter()
                .filter_map(|(_, u)| *u)
                .fold((0, 0), |(c, m), (c2, m2)| (c + c2, m + m2));
            rows.push(Row {
                ns: p.pod_ref.namespace.clone(),
                pod: p.pod_ref.name.clone(),
                container: String::new(),
                cpu,
                mem,
            });
        }
    }
    if rows.is_empty() {
        return match (&a.name, &a.namespace) {
            (Some(n), _) => bail!("metrics not available yet for pod {n}"),
            (None, Some(ns)) => Ok((vec![format!("No resources found in {ns} namespace.")], true)),
            (None, None) => Ok((vec!["No resources found".into()], true)),
        };
    }
    match a.sort_by.as_deref() {
        Some("cpu") => rows.sort_by_key(|r| std::cmp::Reverse(r.cpu)),
        Some("memory") => rows.sort_by_key(|r| std::cmp::Reverse(r.mem)),
        Some(o) => bail!("--sort-by: {o:?} is neither cpu nor memory"),
        None => rows.sort_by(|x, y| (&x.ns, &x.pod, &x.container).cmp(&(&y.ns, &y.pod, &y.container))),
    }
    let all_ns = a.namespace.is_none();
    let mut head: Vec<String> = Vec::new();
    if all_ns {
        head.push("NAMESPACE".into());
    }
    if a.containers {
        head.extend(["POD", "NAME"].map(String::from));
    } else {
        head.push("NAME".into());
    }
    head.extend(["CPU(cores)", "MEMORY(bytes)"].map(String::from));
    let mut out = vec![head];
    for r in rows {
        let mut line = Vec::new();
        if all_ns {
            line.push(r.ns);
        }
        line.push(r.pod);
        if a.containers {
            line.push(r.container);
        }
        line.extend([millicores(r.cpu), mebibytes(r.mem)]);
        out.push(line);
    }
    Ok((table(out), true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::TopPodsArgs;
    use crate::stats::summary::*;

    fn c(name: &str, nano: u64, mem: u64) -> ContainerStats {
        ContainerStats {
            name: name.into(),
            cpu: Some(CpuStats {
                usage_nano_cores: Some(nano),
                ..Default::default()
            }),
            memory: Some(MemoryStats {
                working_set_bytes: Some(mem),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn args(containers: bool, ns: Option<&str>) -> TopPodsArgs {
        TopPodsArgs {
            name: None,
            namespace: ns.map(String::from),
            containers,
            sort_by: None,
        }
    }

    fn summary() -> Summary {
        Summary {
            node: NodeStats {
                node_name: "n1".into(),
                cpu: Some(CpuStats {
                    usage_nano_cores: Some(250_000_000),
                    ..Default::default()
                }),
                memory: Some(MemoryStats {
                    working_set_bytes: Some(1 << 30),
                    available_bytes: Some(3 << 30),
                    ..Default::default()
                }),
                ..Default::default()
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "web".into(),
                    namespace: "default".into(),
                    uid: "u".into(),
                },
                containers: vec![c("a", 1_500_000, 5 << 20), c("b", 1_000_000, 3 << 20)],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn formats_as_kubectl_top() {
        assert_eq!(millicores(1), "1m");
        assert_eq!(millicores(1_000_000_000), "1000m");
        assert_eq!(mebibytes(5 << 20), "5Mi");
    }

    #[test]
    fn pods_sum_their_containers() {
        let (l, _) = pods_table(&summary(), &args(false, Some("default"))).unwrap();
        assert_eq!(
            l[0].split_whitespace().collect::<Vec<_>>(),
            ["NAME", "CPU(cores)", "MEMORY(bytes)"]
        );
        assert_eq!(l[1].split_whitespace().collect::<Vec<_>>(), ["web", "3m", "8Mi"]);
        let (l, _) = pods_table(&summary(), &args(true, None)).unwrap();
        assert_eq!(l[0].split_whitespace().next(), Some("NAMESPACE"));
        assert_eq!(
            l[2].split_whitespace().collect::<Vec<_>>(),
            ["default", "web", "b", "1m", "3Mi"]
        );
    }

    #[test]
    fn node_line_with_shares() {
        let (l, _) = node_table(&summary(), 2000).unwrap();
        assert_eq!(
            l[1].split_whitespace().collect::<Vec<_>>(),
            ["n1", "250m", "12%", "1024Mi", "25%"]
        );
        let mut s = summary();
        s.node.cpu = None;
        assert!(node_table(&s, 2000).is_err());
    }
}
