//! Pods the node stops for good while they are still wanted: `activeDeadlineSeconds`
//! (kubelet's active deadline handler), with real pods.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;

const T: Duration = Duration::from_secs(40);

fn condition<'a>(p: &'a Pod, t: &str) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == t)
}

#[test]
fn a_pod_is_killed_at_its_active_deadline_and_stays_failed() {
    let mut a = Agent::start("deadline", &[]);
    a.write(
        "dl.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: dl}}\nspec:\n  activeDeadlineSeconds: 3\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sh, -c, 'echo started; exec sleep 600']\n    volumeMounts: [{{name: scratch, mountPath: /scratch}}]\n  volumes: [{{name: scratch, emptyDir: {{medium: Memory}}}}]\n"
        ),
    );
    // A pod that finishes before its deadline is left alone.
    a.write(
        "quick.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: quick}}\nspec:\n  activeDeadlineSeconds: 3\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: ['true']\n"
        ),
    );
    let up = a.wait_for("dl", "running", T, |p| running(p, "c"));
    let started = up.status.as_ref().unwrap().start_time.clone().unwrap().0;
    let p = a.wait_phase("dl", "Failed", T);
    let st = p.status.as_ref().unwrap();
    assert_eq!(st.reason.as_deref(), Some("DeadlineExceeded"), "{st:?}");
    assert_eq!(
        st.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
    let after = k8s_openapi::jiff::Timestamp::now().duration_since(started);
    assert!(after.as_secs() >= 3, "killed after {after:?}");
    for t in ["Ready", "ContainersReady"] {
        let c = condition(&p, t).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some("PodFailed")),
            "{c:?}"
        );
    }
    // Its container was stopped, not restarted, and its log is still there.
    let p = a.wait_for("dl", "container terminated", T, |p| {
        try_container_status(p, "c").is_some_and(|s| s.state.as_ref().is_some_and(|s| s.terminated.is_some()))
    });
    let t = container_status(&p, "c").state.clone().unwrap().terminated.unwrap();
    assert_eq!(t.exit_code, 137, "stopped by SIGKILL after the grace period: {t:?}");
    assert_eq!(restarts(&p, "c"), 0);
    a.wait_logs("dl", "container=c", "started");
    assert!(a
        .agent_log()
        .contains("Pod was active on the node longer than the specified deadline"));
    // Its volumes were released; the pod stays on the node, Failed.
    let uid = p.metadata.uid.clone().unwrap();
    let vols = a.root.join("pods").join(&uid).join("volumes");
    let until = std::time::Instant::now() + T;
    while vols.exists() {
        assert!(std::time::Instant::now() < until, "the pod's volumes were not released");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let p = a.pod("dl").unwrap();
    assert_eq!(phase_of(Some(&p)), Some("Failed"));
    assert_eq!(restarts(&p, "c"), 0);
    let quick = a.wait_phase("quick", "Succeeded", T);
    assert_eq!(quick.status.as_ref().unwrap().reason, None);

    // An agent restart keeps it Failed: nothing runs again.
    a.restart();
    std::thread::sleep(Duration::from_secs(3));
    let p = a.wait_phase("dl", "Failed", T);
    assert_eq!(p.status.as_ref().unwrap().reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(restarts(&p, "c"), 0);
    assert!(!running(&p, "c"));
    assert_eq!(phase_of(a.pod("quick").as_ref()), Some("Succeeded"));

    // Removing the manifest removes the pod.
    a.remove("dl.yaml");
    a.wait_gone("dl", T);
    assert!(!a.root.join("pods").join(&uid).exists());
}
