//! `ferrolet pods`: the kubectl-style table (NAMESPACE NAME READY STATUS RESTARTS AGE), with
//! STATUS worked out as kubectl's printer does, or the PodList as JSON/YAML; manifests that
//! could not be run are listed with their errors below the table.

use anyhow::Result;
use chrono::Utc;
use k8s_openapi::api::core::v1::Pod;

use super::PodsArgs;
use crate::pod::reasons;
use crate::pod::units::human_duration;

pub async fn run(args: &PodsArgs) -> Result<i32> {
    let socket = args.root.root_dir.join("ferrolet.sock");
    let v = super::client::get_json(&socket, "/ferrolet/pods").await?;
    let mut rows: Vec<(Pod, bool)> = Vec::new();
    for item in v["items"].as_array().cloned().unwrap_or_default() {
        let pod: Pod = crate::pod::manifest::from_value(item["pod"].clone())
            .map_err(|e| anyhow::anyhow!("a pod from the agent: {e}"))?;
        if args
            .namespace
            .as_deref()
            .is_some_and(|ns| crate::pod::namespace(&pod) != ns)
        {
            continue;
        }
        rows.push((pod, item["terminating"].as_bool().unwrap_or(false)));
    }
    rows.sort_by(|a, b| {
        (crate::pod::namespace(&a.0), crate::pod::name(&a.0))
            .cmp(&(crate::pod::namespace(&b.0), crate::pod::name(&b.0)))
    });
    match args.output.as_deref() {
        Some("json") | Some("yaml") => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": rows.iter().map(|r| &r.0).collect::<Vec<_>>()});
            if args.output.as_deref() == Some("json") {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print!("{}", serde_saphyr::to_string(&list)?);
            }
            return Ok(0);
        }
        None | Some("wide") => {}
        Some(o) => anyhow::bail!("unknown output format {o:?} (wide, json, yaml)"),
    }
    let wide = args.output.as_deref() == Some("wide");
    let mut table = vec![if wide {
        vec!["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]
            .into_iter()
            .map(String::from)
            .collect()
    } else {
        vec!["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
    }];
    for (p, terminating) in &rows {
        let (ready, status, restarts) = summarize(p, *terminating);
        let age = p
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| human_duration(Utc::now().timestamp() - t.0.as_second()))
            .unwrap_or_else(|| "<unknown>".into());
        let mut row = vec![
            crate::pod::namespace(p).to_string(),
            crate::pod::name(p).to_string(),
            ready,
            status,
            restarts,
            age,
        ];
        if wide {
            row.push(
                p.status
                    .as_ref()
                    .and_then(|s| s.pod_ip.clone())
                    .unwrap_or_else(|| "<none>".into()),
            );
            row.push(crate::pod::spec(p).node_name.clone().unwrap_or_default());
        }
        table.push(row);
    }
    if rows.is_empty() && args.namespace.is_some() {
        println!(
            "No resources found in {} namespace.",
            args.namespace.as_deref().unwrap_or("")
        );
    } else if rows.is_empty() {
        println!("No resources found");
    } else {
        print_table(&table);
    }
    if let Some(errs) = v["manifestErrors"].as_object().filter(|e| !e.is_empty()) {
        println!("\nMANIFESTS NOT RUNNING:");
        for (loc, e) in errs {
            let loc = loc.split_once(':').map(|(_, l)| l).unwrap_or(loc);
            println!("  {loc}: {}", e.as_str().unwrap_or("").replace('\n', "\n    "));
        }
    }
    Ok(0)
}

fn print_table(rows: &[Vec<String>]) {
    let cols = rows[0].len();
    let widths: Vec<usize> = (0..cols)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i + 1 == cols {
                    c.clone()
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        println!("{}", line.join("   ").trim_end());
    }
}

/// READY, STATUS and RESTARTS as kubectl's pod printer computes them.
pub fn summarize(p: &Pod, terminating: bool) -> (String, String, String) {
    let st = p.status.clone().unwrap_or_default();
    let spec = crate::pod::spec(p);
    let mut reason = st
        .reason
        .clone()
        .or(st.phase.clone())
        .unwrap_or_else(|| "Pending".into());
    let mut restarts = 0;
    let mut ready = 0;
    let mut total = spec.containers.len();
    let mut last_restart: Option<i64> = None;
    let mut note_restart = |c: &k8s_openapi::api::core::v1::ContainerStatus| {
        if let Some(t) = c
            .last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
        {
            let s = t.0.as_second();
            last_restart = Some(last_restart.map_or(s, |x: i64| x.max(s)));
        }
    };
    let inits = st.init_container_statuses.clone().unwrap_or_default();
    let init_specs = spec.init_containers.clone().unwrap_or_default();
    let mut sidecar_restarts = 0;
    for (c, s) in init_specs.iter().zip(&inits) {
        if crate::pod::is_sidecar(c) {
            total += 1;
            sidecar_restarts += s.restart_count;
            if s.ready {
                ready += 1;
            }
        }
    }
    let mut initializing = false;
    for (i, (c, s)) in init_specs.iter().zip(&inits).enumerate() {
        restarts += s.restart_count;
        note_restart(s);
        let state = s.state.clone().unwrap_or_default();
        if state.terminated.as_ref().is_some_and(|t| t.exit_code == 0) {
            continue;
        }
        if crate::pod::is_sidecar(c) && s.started == Some(true) {
            continue;
        }
        if let Some(t) = &state.terminated {
            reason = match t.reason.as_deref().filter(|r| !r.is_empty()) {
                Some(r) => format!("Init:{r}"),
                None if t.signal.unwrap_or(0) != 0 => {
                    format!("Init:Signal:{}", t.signal.unwrap_or(0))
                }
                None => format!("Init:ExitCode:{}", t.exit_code),
            };
        } else if let Some(r) = state
            .waiting
            .as_ref()
            .and_then(|w| w.reason.clone())
            .filter(|r| !r.is_empty() && r != reasons::POD_INITIALIZING)
        {
            reason = format!("Init:{r}");
        } else {
            reason = format!("Init:{i}/{}", init_specs.len());
        }
        initializing = true;
        break;
    }
    let initialized = st
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Initialized" && c.status == "True");
    if !initializing || initialized {
        restarts = sidecar_restarts;
        let mut has_running = false;
        for s in st.container_statuses.iter().flatten().rev() {
            restarts += s.restart_count;
            note_restart(s);
            let state = s.state.clone().unwrap_or_default();
            if let Some(r) = state
                .waiting
                .as_ref()
                .and_then(|w| w.reason.clone())
                .filter(|r| !r.is_empty())
            {
                reason = r;
            } else if let Some(t) = &state.terminated {
                reason = match t.reason.as_deref().filter(|r| !r.is_empty()) {
                    Some(r) => r.to_string(),
                    None if t.signal.unwrap_or(0) != 0 => {
                        format!("Signal:{}", t.signal.unwrap_or(0))
                    }
                    None => format!("ExitCode:{}", t.exit_code),
                };
            } else if s.ready && state.running.is_some() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == reasons::COMPLETED && has_running {
            let ready_cond = st
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            reason = if ready_cond {
                "Running".into()
            } else {
                "NotReady".into()
            };
        }
    }
    if terminating {
        reason = "Terminating".into();
    }
    let restarts = match last_restart.filter(|_| restarts > 0) {
        Some(t) => format!("{restarts} ({} ago)", human_duration(Utc::now().timestamp() - t)),
        None => restarts.to_string(),
    };
    (format!("{ready}/{total}"), reason, restarts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_looping_pod_summary() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "image": "x"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "a", "image": "x", "imageID": "", "ready": false, "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2020-01-01T00:00:00Z"}}}]}
        }))
        .unwrap();
        let (ready, status, restarts) = summarize(&p, false);
        assert_eq!(ready, "0/1");
        assert_eq!(status, "CrashLoopBackOff");
        assert!(restarts.starts_with("3 ("), "{restarts}");
    }

    #[test]
    fn init_progress() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"}, "spec": {"initContainers": [{"name": "i", "image": "x"}, {"name": "j", "image": "x"}], "containers": [{"name": "a", "image": "x"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"name": "i", "image": "x", "imageID": "", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                {"name": "j", "image": "x", "imageID": "", "ready": false, "restartCount": 0, "state": {"running": {}}}],
                "containerStatuses": [{"name": "a", "image": "x", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}]}
        }))
        .unwrap();
        assert_eq!(summarize(&p, false).1, "Init:1/2");
    }
}
