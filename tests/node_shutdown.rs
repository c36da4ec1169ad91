//! Graceful node shutdown against real systemd and logind (tests/common/systemd.rs: Debian's
//! systemd as PID 1 of a machine booted by systemd-nspawn; the agent outside talks to its
//! system bus, from its pid namespace): the agent raises logind's InhibitDelayMaxSec to shutdownGracePeriod through
//! its drop-in and holds a delay inhibitor lock; `systemctl poweroff` in the machine makes
//! logind send PrepareForShutdown, and the agent refuses new pods, reports the node not
//! Ready, stops the ordinary pods, then the critical ones, each Failed with kubelet's reason,
//! message and DisruptionTarget condition, and releases its lock; then the machine powers
//! off. A shutdown systemd refuses to carry out is cancelled by logind (PrepareForShutdown
//! false): the node takes pods again and holds its lock again.

mod common;

use std::time::{Duration, Instant};

use common::systemd::SystemdMachine;
use common::*;
use k8s_openapi::api::core::v1::Pod;

const T: Duration = Duration::from_secs(60);

/// The node's condition `kind` (status, message), as the agent reports it standalone.
fn node_condition(a: &Agent, kind: &str) -> (String, String) {
    let (code, body) = a.get("/ferrolet/node").expect("/ferrolet/node");
    assert_eq!(code, 200);
    let n: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let c = n["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
        .unwrap_or_default();
    (
        c["status"].as_str().unwrap_or_default().to_string(),
        c["message"].as_str().unwrap_or_default().to_string(),
    )
}

fn wait(what: &str, a: &Agent, machine: &SystemdMachine, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n--- agent log ---\n{}\n{}",
            tail(&a.agent_log(), 60),
            machine.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A sample of the agent's /metrics without labels.
fn metric(a: &Agent, name: &str) -> Option<f64> {
    let (code, body) = a.get("/metrics").expect("/metrics");
    assert_eq!(code, 200);
    String::from_utf8(body).unwrap().lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().unwrap())
    })
}

const START_METRIC: &str = "kubelet_graceful_shutdown_start_time_seconds";
const END_METRIC: &str = "kubelet_graceful_shutdown_end_time_seconds";
const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// The agent's graceful_node_shutdown_state (kubelet's file), when it is there: the start and
/// end as whole seconds since the epoch (0 for Go's zero time), as the metrics carry them.
fn shutdown_state(a: &Agent) -> Option<(f64, f64)> {
    let text = std::fs::read_to_string(a.root.join("graceful_node_shutdown_state")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let secs = |k: &str| {
        let t = v[k].as_str().unwrap_or_else(|| panic!("{k} in {text}"));
        if t == GO_ZERO_TIME {
            0.0
        } else {
            chrono::DateTime::parse_from_rfc3339(t).unwrap().timestamp() as f64
        }
    };
    Some((secs("startTime"), secs("endTime")))
}

fn stopped_for_shutdown(p: &Pod) -> bool {
    let st = p.status.as_ref().unwrap();
    let ended = try_container_status(p, "main")
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.terminated.is_some());
    ended
        && st.phase.as_deref() == Some("Failed")
        && st.reason.as_deref() == Some("Terminated")
        && st.message.as_deref() == Some("Pod was terminated in response to imminent node shutdown.")
        && st.conditions.iter().flatten().any(|c| {
            c.type_ == "DisruptionTarget" && c.status == "True" && c.reason.as_deref() == Some("TerminationByKubelet")
        })
}

/// The pod as its directory's `status.json` last recorded it: the agent writes a status there
/// before anyone sees it, and a shutdown goes on only once its pods' final statuses are
/// written. Read after the machine has powered off, it is the last pods' end without a race
/// against the agent, which the shutdown ends about a tenth of a second after its pods stop.
fn persisted(a: &Agent, seen: &Pod) -> Pod {
    let uid = seen.metadata.uid.as_deref().expect("the pod's uid");
    let path = a.root.join("pods").join(uid).join("status.json");
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let rec: serde_json::Value = serde_json::from_slice(&text).unwrap();
    let status = serde_json::from_value(rec["status"].clone()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Pod {
        status: Some(status),
        ..seen.clone()
    }
}

fn finished_at(p: &Pod) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    container_status(p, "main")
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.finished_at.clone())
        .expect("the container's end")
}

#[test]
fn systemd_poweroff_waits_while_ordinary_pods_then_critical_ones_stop() {
    let dir = std::env::temp_dir().join(format!("ferrolet-it-machine-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut machine = SystemdMachine::boot(&dir, &format!("ferrolet-it-machine-{}", std::process::id()));
    assert_eq!(machine.inhibit_delay_max(), Duration::from_secs(5), "logind's default");
    // In the machine's pid namespace, as a node agent is in its host's: logind knows the
    // holders of its locks by their pids.
    let mut a = Agent::start_in_pid_namespace_of(
        "shutdown",
        machine.leader(),
        &format!(
            "shutdownGracePeriod: 20s\nshutdownGracePeriodCriticalPods: 8s\nferrolet:\n  logindConfDir: {}\n",
            machine.logind_conf_dir().display()
        ),
        vec![(
            "DBUS_SYSTEM_BUS_ADDRESS".into(),
            machine.bus_address_in_its_pid_namespace(),
        )],
    );
    // The ordinary pod takes 6 s to stop (of the 12 its group has); the critical one stops
    // at once, and only after it.
    a.write(
        "ordinary.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: ordinary}}\nspec:\n  terminationGracePeriodSeconds: 30\n  containers:\n  - name: main\n    image: {IMAGE}\n    command: [sh, -c, 'trap \"sleep 6; exit 0\" TERM; while true; do sleep 0.2; done']\n"
        ),
    );
    a.write(
        "critical.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: critical}}\nspec:\n  priority: 2000001000\n  terminationGracePeriodSeconds: 30\n  containers:\n  - name: main\n    image: {IMAGE}\n    command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 0.2; done']\n"
        ),
    );
    let ordinary = a.wait_phase("ordinary", "Running", T);
    let critical = a.wait_phase("critical", "Running", T);

    // The lock, and the delay raised to the whole period through the drop-in.
    wait("the agent's inhibitor lock", &a, &machine, || {
        let l = machine.inhibitors();
        l.contains("\"shutdown\" \"ferrolet\"") && l.contains("\"delay\"")
    });
    assert_eq!(machine.inhibit_delay_max(), Duration::from_secs(20));
    let drop_in = std::fs::read_to_string(machine.logind_conf_dir().join("99-ferrolet.conf")).unwrap();
    assert!(drop_in.contains("[Login]\nInhibitDelayMaxSec=20\n"), "{drop_in}");
    assert_eq!(node_condition(&a, "Ready").0, "True");
    assert!(shutdown_state(&a).is_none(), "no shutdown yet, no state file");
    assert_eq!(metric(&a, START_METRIC), Some(0.0));
    assert_eq!(metric(&a, END_METRIC), Some(0.0));

    let before = chrono::Utc::now().timestamp() as f64;
    let out = machine.run(&["systemctl", "poweroff"]);
    assert!(out.status.success(), "systemctl poweroff: {out:?}");
    wait("the node not Ready while it shuts down", &a, &machine, || {
        node_condition(&a, "Ready") == ("False".into(), "node is shutting down".into())
    });
    // A pod that comes meanwhile is refused.
    a.write("late.yaml", &pod_yaml("late", "Always", "sleep 3600"));
    let late = a.wait_for("late", "refused", T, |p| phase_of(Some(p)) == Some("Failed"));
    let st = late.status.as_ref().unwrap();
    assert_eq!(st.reason.as_deref(), Some("NodeShutdown"));
    assert_eq!(
        st.message.as_deref(),
        Some("Pod was rejected: Pod was rejected as the node is shutting down.")
    );
    // The shutdown's start is on disk and in the metrics, its end not yet.
    wait("the shutdown's start in the state file", &a, &machine, || {
        shutdown_state(&a).is_some()
    });
    let (start, end) = shutdown_state(&a).unwrap();
    assert!(start >= before && start <= before + 10.0 && end == 0.0, "{start} {end}");
    assert_eq!(metric(&a, START_METRIC), Some(start));
    assert_eq!(metric(&a, END_METRIC), Some(0.0));
    // The machine waits for the pods meanwhile.
    assert!(
        machine.wait_powered_off(Duration::from_secs(2), || {}).is_none(),
        "the machine did not wait"
    );

    // The lock let go once both groups stopped, the shutdown goes on: the machine powers off
    // (its agent with it).
    let st = machine.wait_powered_off(T, || a.continue_launcher());
    assert!(
        st.is_some_and(|s| s.success()),
        "the machine did not power off: {st:?}\n{}",
        machine.log()
    );
    // Each pod's end was recorded before the shutdown went on.
    let (ordinary, critical) = (persisted(&a, &ordinary), persisted(&a, &critical));
    for p in [&ordinary, &critical] {
        assert!(
            stopped_for_shutdown(p),
            "{}\n--- agent log ---\n{}",
            serde_json::to_string_pretty(&p.status).unwrap(),
            tail(&a.agent_log(), 40)
        );
    }
    let (o, c) = (finished_at(&ordinary), finished_at(&critical));
    assert!(
        o.0 <= c.0,
        "the critical pod stopped ({c:?}) before the ordinary one ({o:?})"
    );
    assert_eq!(
        container_status(&ordinary, "main")
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code),
        Some(0),
        "the ordinary pod had its grace period (its TERM trap ran to the end)"
    );
    let log = a.agent_log();
    let order: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("node shutdown manager: stopping pod"))
        .collect();
    assert!(
        order.len() == 2 && order[0].contains("ordinary") && order[1].contains("critical"),
        "{order:#?}"
    );
    assert!(
        order[0].contains("grace=12s") && order[1].contains("grace=8s"),
        "each pod gets its group's period: {order:#?}"
    );
    assert!(log.contains("Shutdown manager detected shutdown event"));
    // The end was written before the lock went, once both groups had stopped.
    let (start2, end) = shutdown_state(&a).expect("the state file");
    let critical_end = c.0.as_second() as f64;
    assert!(
        start2 == start && end >= critical_end && end <= start + 20.0,
        "{start} {end} {critical_end}"
    );
    drop(machine);

    // The node comes back (its agent outside the machine, no logind to talk to): the metrics
    // are the last shutdown's, read from the file.
    for m in ["ordinary.yaml", "critical.yaml", "late.yaml"] {
        a.remove(m);
    }
    let no_bus = format!(
        "unix:path={}",
        std::env::temp_dir().join("ferrolet-it-no-such-bus").display()
    );
    a.boot_after_its_machine(vec![("DBUS_SYSTEM_BUS_ADDRESS".into(), no_bus.clone())]);
    assert_eq!(metric(&a, START_METRIC), Some(start));
    assert_eq!(metric(&a, END_METRIC), Some(end));

    // A state file that cannot be read is said so, naming it; the agent runs on, the metrics 0.
    let file = a.root.join("graceful_node_shutdown_state");
    std::fs::write(&file, "{\"startTime\": \"yesterday\"}").unwrap();
    a.restart_with_env(vec![("DBUS_SYSTEM_BUS_ADDRESS".into(), no_bus)]);
    a.wait_log("the graceful shutdown state cannot be read", T);
    let said = a
        .agent_log()
        .lines()
        .rev()
        .find(|l| l.contains("the graceful shutdown state cannot be read"))
        .unwrap()
        .to_string();
    assert!(
        said.contains(&file.display().to_string()) && said.contains("yesterday"),
        "{said}"
    );
    assert_eq!(metric(&a, START_METRIC), Some(0.0));
    assert_eq!(metric(&a, END_METRIC), Some(0.0));
    drop(a);
}

/// A shutdown systemd refuses to carry out: logind sends PrepareForShutdown(true), holds the
/// shutdown for the agent's delay lock, and when the lock is let go its StartUnit of
/// poweroff.target fails, so logind sends PrepareForShutdown(false) ("Tell people that they now
/// may take a lock again", logind-dbus.c execute_shutdown_or_sleep). Here the failure is real:
/// a drop-in gives poweroff.target RefuseManualStart=yes, which logind's up-front check (the
/// unit is loaded) lets through and systemd's StartUnit refuses. The agent is Ready again,
/// admits pods, and holds its lock again: a second poweroff, the drop-in gone, waits for its
/// new pod.
#[test]
fn a_shutdown_systemd_refuses_is_cancelled_and_the_node_takes_pods_again() {
    let dir = std::env::temp_dir().join(format!("ferrolet-it-machine-cancel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut machine = SystemdMachine::boot(&dir, &format!("ferrolet-it-cancel-{}", std::process::id()));
    let a = Agent::start_in_pid_namespace_of(
        "shutdown-cancel",
        machine.leader(),
        &format!(
            "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 2s\nferrolet:\n  logindConfDir: {}\n",
            machine.logind_conf_dir().display()
        ),
        vec![(
            "DBUS_SYSTEM_BUS_ADDRESS".into(),
            machine.bus_address_in_its_pid_namespace(),
        )],
    );
    // A pod that takes `stop` seconds to stop on SIGTERM.
    let pod = |name: &str, stop: u32| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 30\n  containers:\n  - name: main\n    image: {IMAGE}\n    command: [sh, -c, 'trap \"sleep {stop}; exit 0\" TERM; while true; do sleep 0.2; done']\n"
        )
    };
    a.write("first.yaml", &pod("first", 2));
    a.wait_phase("first", "Running", T);
    let locked = || {
        let l = machine.try_busctl(&["call", "ListInhibitors"]).unwrap_or_default();
        l.contains("\"shutdown\" \"ferrolet\"") && l.contains("\"delay\"")
    };
    wait("the agent's inhibitor lock", &a, &machine, locked);

    // systemd will refuse logind's StartUnit of poweroff.target.
    let refuse = machine.run(&[
        "sh",
        "-c",
        "mkdir -p /run/systemd/system/poweroff.target.d && printf '[Unit]\\nRefuseManualStart=yes\\n' > /run/systemd/system/poweroff.target.d/refuse.conf && systemctl daemon-reload",
    ]);
    assert!(refuse.status.success(), "{refuse:?}");
    let out = machine.run(&["systemctl", "poweroff"]);
    assert!(out.status.success(), "systemctl poweroff: {out:?}");
    wait("the node not Ready while it shuts down", &a, &machine, || {
        node_condition(&a, "Ready").0 == "False"
    });
    a.wait_for("first", "stopped for the shutdown", T, stopped_for_shutdown);

    // The lock let go, systemd refuses, logind cancels: the node is Ready again and holds its
    // lock again; the machine stays up.
    wait("the node Ready again after the cancellation", &a, &machine, || {
        node_condition(&a, "Ready").0 == "True"
    });
    assert!(
        a.agent_log()
            .contains("Shutdown manager detected shutdown cancellation"),
        "{}",
        tail(&a.agent_log(), 40)
    );
    wait("the agent's inhibitor lock again", &a, &machine, locked);
    // The cancellation came from systemd's refusal, as logind says.
    let journal = machine.run(&["journalctl", "--no-pager", "-u", "systemd-logind"]);
    let journal = String::from_utf8_lossy(&journal.stdout);
    assert!(
        journal.contains("Error during inhibitor-delayed operation") && journal.contains("refuse manual start"),
        "{journal}"
    );
    assert!(
        machine.wait_powered_off(Duration::from_secs(1), || {}).is_none(),
        "the machine powered off after all\n{}",
        machine.log()
    );
    // A new pod is admitted and runs; the one stopped for the shutdown stays Failed, as in
    // kubelet.
    // Stopping takes 6 s (within the 8 s its priority gets): the second shutdown goes on, and
    // the agent with the machine, once the pod has stopped, and the checks below need the
    // agent up until then. With 2 s, a `systemctl poweroff` slow to return under load left
    // too little of that time for them (CI, 2026-11-28).
    a.write("second.yaml", &pod("second", 6));
    let second = a.wait_phase("second", "Running", T);
    assert!(stopped_for_shutdown(&a.pod("first").unwrap()));

    // The lock taken again holds the next shutdown for the new pod.
    let allow = machine.run(&[
        "sh",
        "-c",
        "rm /run/systemd/system/poweroff.target.d/refuse.conf && systemctl daemon-reload",
    ]);
    assert!(allow.status.success(), "{allow:?}");
    let out = machine.run(&["systemctl", "poweroff"]);
    assert!(out.status.success(), "systemctl poweroff: {out:?}");
    assert!(
        machine.wait_powered_off(Duration::from_secs(1), || {}).is_none(),
        "the second shutdown did not wait for the agent"
    );
    let st = machine.wait_powered_off(T, || a.continue_launcher());
    assert!(
        st.is_some_and(|s| s.success()),
        "the machine did not power off: {st:?}\n{}",
        machine.log()
    );
    // The pod's end was recorded before the shutdown went on (the agent is gone with the
    // machine: its record outlives it).
    let second = persisted(&a, &second);
    assert!(
        stopped_for_shutdown(&second),
        "{}\n--- agent log ---\n{}",
        serde_json::to_string_pretty(&second.status).unwrap(),
        tail(&a.agent_log(), 40)
    );
    drop(a);
    drop(machine);
}
