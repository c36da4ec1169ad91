//! Volumes with real pods (issue 15): ConfigMaps and Secrets from the static pod path for
//! volumes and env, the atomic writer's `..data` swap seen by a running container, downwardAPI
//! labels following the pod, memory emptyDirs sized as kubelet sizes them, fsGroup ownership,
//! recursive read-only mounts, and what is refused: a subPath symlink leading out of its
//! volume, hostPath type checks, a static pod's claim (only an API server resolves one). Each
//! test runs its own `ferrolet run` (see common/mod.rs).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

const T: Duration = Duration::from_secs(45);
/// Volumes follow their sources at each pod sync: a short syncFrequency keeps the tests short.
const FAST_SYNC: &str = "syncFrequency: 2s\n";

/// The last line of the logs starting with `prefix`, without it.
fn last_value(logs: &str, prefix: &str) -> Option<String> {
    logs.lines()
        .rev()
        .find_map(|l| l.strip_prefix(prefix))
        .map(str::to_string)
}

fn config_map(value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: app-config}}\ndata:\n  greeting: {value}\n  color: blue\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: app-secret}}\nstringData:\n  password: {value}-pw\n"
    )
}

#[test]
fn config_map_and_secret_from_the_manifest_dir_update_live() {
    let a = Agent::start_with_config("volcm", &[], FAST_SYNC);
    a.write("objects.yaml", &config_map("hello"));
    a.write(
        "app.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: app}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {IMAGE}
    env:
    - name: GREETING
      valueFrom: {{configMapKeyRef: {{name: app-config, key: greeting}}}}
    - name: PASSWORD
      valueFrom: {{secretKeyRef: {{name: app-secret, key: password}}}}
    envFrom:
    - prefix: CM_
      configMapRef: {{name: app-config}}
    command: [sh, -c, 'echo "env=$GREETING $PASSWORD $CM_color"; grep " /etc/secret " /proc/mounts | cut -d" " -f3 | sed "s/^/secretfs=/"; while true; do echo "file=$(cat /etc/app/greeting) $(cat /etc/secret/password)"; echo "data=$(readlink /etc/app/..data)"; sleep 0.2; done']
    volumeMounts:
    - {{name: cfg, mountPath: /etc/app}}
    - {{name: sec, mountPath: /etc/secret}}
  volumes:
  - {{name: cfg, configMap: {{name: app-config}}}}
  - {{name: sec, secret: {{secretName: app-secret}}}}
"#
        ),
    );
    a.wait_phase("app", "Running", T);
    let logs = a.wait_logs_for("app", "", "the first file line", |l| l.contains("file="));
    assert!(logs.contains("env=hello hello-pw blue"), "{logs}");
    assert!(logs.contains("secretfs=tmpfs"), "secrets are on tmpfs only: {logs}");
    assert_eq!(last_value(&logs, "file=").as_deref(), Some("hello hello-pw"));
    let first = last_value(&logs, "data=").unwrap();
    let timestamped = |d: &str| {
        let d = d.strip_prefix("..").unwrap_or("");
        d.len() > 20 && d.chars().all(|c| c.is_ascii_digit() || c == '_' || c == '.')
    };
    assert!(timestamped(&first), "..data -> {first:?} is not a timestamped dir");

    // The file changes: the running container sees the new content through a new `..data`.
    a.write("objects.yaml", &config_map("bonjour"));
    let logs = a.wait_logs_for("app", "", "the new content", |l| {
        last_value(l, "file=").as_deref() == Some("bonjour bonjour-pw")
    });
    let second = last_value(&logs, "data=").unwrap();
    assert!(timestamped(&second) && second != first, "..data: {first} then {second}");
    // The user-visible names go through `..data` on the node too.
    let pod = a.pod("app").unwrap();
    let dir = a
        .root
        .join("pods")
        .join(pod.metadata.uid.as_deref().unwrap())
        .join("volumes/kubernetes.io~configmap/cfg");
    assert_eq!(
        std::fs::read_link(dir.join("greeting")).unwrap(),
        Path::new("..data/greeting")
    );
    // env is read at container start only, as kubelet's.
    assert_eq!(logs.matches("env=").count(), 1);
    assert!(logs.contains("env=hello hello-pw blue"), "{logs}");
    // The same pod is still running: no restart for a volume update.
    assert_eq!(restarts(&a.pod("app").unwrap(), "c"), 0);
}

#[test]
fn downward_api_labels_follow_the_pod() {
    let a = Agent::start_with_config("voldown", &[], FAST_SYNC);
    let manifest = |tier: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: info
  uid: 7d3c1c0e-0000-4000-8000-00000000d0a1
  labels: {{tier: {tier}}}
  annotations: {{note: "{tier} note"}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {IMAGE}
    command: [sh, -c, 'while true; do echo "labels=$(cat /info/labels | tr "\n" ,)"; echo "ann=$(grep note /info/annotations)"; echo "data=$(readlink /info/..data)"; sleep 0.2; done']
    volumeMounts: [{{name: info, mountPath: /info}}]
  volumes:
  - name: info
    downwardAPI:
      items:
      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
      - {{path: annotations, fieldRef: {{fieldPath: metadata.annotations}}}}
"#
        )
    };
    a.write("info.yaml", &manifest("one"));
    a.wait_phase("info", "Running", T);
    let logs = a.wait_logs_for("info", "", "the labels", |l| l.contains("labels=tier=\"one\""));
    assert!(
        last_value(&logs, "data=").is_some_and(|d| d.starts_with("..2")),
        "{logs}"
    );
    a.write("info.yaml", &manifest("two"));
    let logs = a.wait_logs_for("info", "", "the new labels", |l| {
        last_value(l, "labels=").as_deref() == Some("tier=\"two\"")
    });
    assert_eq!(last_value(&logs, "ann=").as_deref(), Some("note=\"two note\""));
    assert_eq!(restarts(&a.pod("info").unwrap(), "c"), 0);
}

#[test]
fn memory_empty_dirs_are_sized_as_kubelet_sizes_them() {
    let mut a = Agent::start_with_config("volmem", &[], FAST_SYNC);
    a.write(
        "mem.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: mem}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {IMAGE}
    resources: {{limits: {{memory: 96Mi}}}}
    command: [sh, -c, 'df -k /limited /podlimit | tail -n +2 | while read fs size rest; do echo "df=$fs $size"; done; date > /limited/kept; sleep 3600']
    volumeMounts:
    - {{name: limited, mountPath: /limited}}
    - {{name: podlimit, mountPath: /podlimit}}
  volumes:
  - {{name: limited, emptyDir: {{medium: Memory, sizeLimit: 64Mi}}}}
  - {{name: podlimit, emptyDir: {{medium: Memory}}}}
"#
        ),
    );
    a.wait_phase("mem", "Running", T);
    let logs = a.wait_logs_for("mem", "", "df", |l| l.matches("df=").count() == 2);
    // sizeLimit; without one, the pod's memory limit (96Mi).
    assert!(logs.contains("df=tmpfs 65536\n"), "{logs}");
    assert!(logs.contains("df=tmpfs 98304\n"), "{logs}");
    // The agent restarts: the volume is found set up, its content stays, nothing is redone.
    let uid = a.pod("mem").unwrap().metadata.uid.unwrap();
    let kept = a
        .root
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/limited/kept");
    let before = std::fs::read_to_string(&kept).unwrap();
    a.restart();
    a.wait_log("volumes reconstructed from disk", T);
    // A few syncs of the pod by the new agent.
    std::thread::sleep(Duration::from_secs(5));
    let p = a.wait_phase("mem", "Running", T);
    assert_eq!(p.metadata.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(restarts(&p, "c"), 0);
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), before);
}

#[test]
fn fs_group_owns_writable_and_file_volumes() {
    let a = Agent::start_with_config("volfsg", &[], FAST_SYNC);
    a.write("objects.yaml", &config_map("hi"));
    a.write(
        "fsg.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: fsg}}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {{runAsUser: 1000, runAsGroup: 3000, fsGroup: 2345, fsGroupChangePolicy: OnRootMismatch}}
  containers:
  - name: c
    image: {IMAGE}
    command: [sh, -c, 'touch /data/made; mkdir /data/sub; echo "data=$(ls -lnd /data)"; echo "made=$(ls -ln /data/made)"; echo "sub=$(ls -lnd /data/sub)"; echo "cfg=$(ls -lnL /cfg/greeting)"; echo "id=$(id -G)"; sleep 3600']
    volumeMounts:
    - {{name: data, mountPath: /data}}
    - {{name: cfg, mountPath: /cfg}}
  volumes:
  - {{name: data, emptyDir: {{}}}}
  - {{name: cfg, configMap: {{name: app-config}}}}
"#
        ),
    );
    a.wait_phase("fsg", "Running", T);
    let logs = a.wait_logs_for("fsg", "", "ls", |l| l.contains("id="));
    let field = |prefix: &str, i: usize| {
        last_value(&logs, prefix)
            .and_then(|l| l.split_whitespace().nth(i).map(str::to_string))
            .unwrap_or_default()
    };
    // The emptyDir: group 2345, setgid, group-writable; what the container makes inherits it.
    assert_eq!(field("data=", 0), "drwxrwsrwx", "{logs}");
    assert_eq!(field("data=", 3), "2345", "{logs}");
    assert_eq!(
        (field("made=", 2), field("made=", 3)),
        ("1000".into(), "2345".into()),
        "{logs}"
    );
    assert_eq!(field("sub=", 3), "2345", "{logs}");
    // The configMap's files: group 2345 with group read.
    assert_eq!(field("cfg=", 3), "2345", "{logs}");
    assert_eq!(&field("cfg=", 0)[..7], "-rw-r--", "{logs}");
    assert!(field("id=", 0).len() > 1, "{logs}");
}

/// A tmpfs the test mounts (and unmounts, also on failure).
struct TmpfsGuard(PathBuf);

impl Drop for TmpfsGuard {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn read_only_mounts_are_recursive() {
    let a = Agent::start_with_config("volrro", &[], FAST_SYNC);
    let tree = a.dir.join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &tree.join("sub"),
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
    let _guard = TmpfsGuard(tree.join("sub"));
    a.write(
        "rro.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: rro}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {IMAGE}
    command: [sh, -c, 'for d in /ro /plain; do touch $d/top 2>/dev/null && echo "$d top=rw" || echo "$d top=ro"; touch $d/sub/x 2>/dev/null && echo "$d sub=rw" || echo "$d sub=ro"; done; sleep 3600']
    volumeMounts:
    - {{name: tree, mountPath: /ro, readOnly: true}}
    - {{name: tree, mountPath: /plain, readOnly: true, recursiveReadOnly: Disabled}}
  volumes:
  - {{name: tree, hostPath: {{path: {tree}, type: Directory}}}}
"#,
            tree = tree.display()
        ),
    );
    a.wait_phase("rro", "Running", T);
    let logs = a.wait_logs_for("rro", "", "the writes", |l| l.contains("/plain sub="));
    assert!(logs.contains("/ro top=ro") && logs.contains("/ro sub=ro"), "{logs}");
    // kubelet's plain read-only bind leaves the submount writable.
    assert!(
        logs.contains("/plain top=ro") && logs.contains("/plain sub=rw"),
        "{logs}"
    );
}

#[test]
fn refusals_name_their_reason() {
    let a = Agent::start_with_config("volrefuse", &[], FAST_SYNC);
    let host_file = a.dir.join("a-file");
    std::fs::write(&host_file, "x").unwrap();
    a.write(
        "refused.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: pvc}}
spec:
  containers: [{{name: c, image: {IMAGE}, command: [sleep, "3600"], volumeMounts: [{{name: data, mountPath: /data}}]}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: data}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: hostpath}}
spec:
  containers: [{{name: c, image: {IMAGE}, command: [sleep, "3600"], volumeMounts: [{{name: h, mountPath: /h}}]}}]
  volumes: [{{name: h, hostPath: {{path: {file}, type: Directory}}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: escape}}
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - {{name: plant, image: {IMAGE}, command: [sh, -c, "ln -s / /shared/escape && ln -s ../../etc /shared/up"], volumeMounts: [{{name: shared, mountPath: /shared}}]}}
  containers:
  - {{name: c, image: {IMAGE}, command: [sleep, "3600"], volumeMounts: [{{name: shared, mountPath: /host, subPath: escape}}]}}
  - {{name: d, image: {IMAGE}, command: [sleep, "3600"], volumeMounts: [{{name: shared, mountPath: /host, subPath: up}}]}}
  - {{name: ok, image: {IMAGE}, command: [sleep, "3600"], volumeMounts: [{{name: shared, mountPath: /mine, subPath: mine}}]}}
  volumes: [{{name: shared, emptyDir: {{}}}}]
"#,
            file = host_file.display()
        ),
    );
    // A static pod's claim cannot be resolved (no API server): it says so, naming the claim.
    let p = a.wait_for("pvc", "FailedMount", T, |p| {
        waiting_message(p, "c").is_some_and(|m| m.contains("cannot use claims"))
    });
    assert_eq!(waiting_reason(&p, "c").as_deref(), Some("ContainerCreating"));
    assert!(
        waiting_message(&p, "c").unwrap().starts_with(
            "MountVolume.SetUp failed for volume \"data\" : claim \"data\": a claim is resolved through the API server"
        ),
        "{:?}",
        waiting_message(&p, "c")
    );
    let p = a.wait_for("hostpath", "the type check", T, |p| {
        waiting_message(p, "c").is_some_and(|m| m.contains("type check"))
    });
    assert_eq!(
        waiting_message(&p, "c").unwrap(),
        format!(
            "MountVolume.SetUp failed for volume \"h\" : hostPath type check failed: {} is not a directory",
            host_file.display()
        )
    );
    a.wait_log("FailedMount", T);
    let log = a.agent_log();
    assert!(log.contains("a static pod cannot use claims"), "{}", tail(&log, 30));
    // The planted symlinks lead out of the volume: the containers are refused, the one whose
    // subPath stays inside runs.
    let p = a.wait_for("escape", "the subPath refusals", T, |p| {
        running(p, "ok")
            && waiting_reason(p, "c").as_deref() == Some("CreateContainerConfigError")
            && waiting_reason(p, "d").as_deref() == Some("CreateContainerConfigError")
    });
    for c in ["c", "d"] {
        let m = waiting_message(&p, c).unwrap();
        assert!(m.contains("resolves outside the volume"), "{c}: {m}");
    }
}

/// envFrom takes every key that is an env var name in apimachinery's relaxed sense (letters,
/// digits, `_`, `-`, `.`, not starting with a digit), with and without a prefix, as the upstream
/// conformance specs' Secret and ConfigMap `data-1` keys; only the invalid ones are skipped,
/// said in a warning event. (The container runs `env` itself: busybox 1.35's ash drops variables
/// whose names are not shell names from the environment it passes on, so `sh -c env` shows
/// none of them, whatever the node put in the container's environment.)
#[test]
fn env_from_takes_keys_with_dashes_and_dots() {
    let a = Agent::start("volenvfrom", &[]);
    a.write(
        "objects.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata:\n  data-1: dmFsdWUtMQ==\n  data.2: dmFsdWUtMg==\n  3bad: eA==\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  data-1: cm-1\n",
    );
    a.write(
        "p.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [env]\n    envFrom:\n    - secretRef: {{name: s}}\n    - prefix: p-\n      secretRef: {{name: s}}\n    - prefix: cm_\n      configMapRef: {{name: c}}\n"
        ),
    );
    a.wait_phase("p", "Succeeded", T);
    let logs = a.logs("p", "");
    for want in [
        "data-1=value-1",
        "data.2=value-2",
        "p-data-1=value-1",
        "p-data.2=value-2",
        "cm_data-1=cm-1",
    ] {
        assert!(logs.lines().any(|l| l == want), "{want} missing:\n{logs}");
    }
    // The name with its prefix is what must be valid: `p-3bad` is, `3bad` is not.
    assert!(logs.lines().any(|l| l == "p-3bad=x"), "{logs}");
    assert!(!logs.lines().any(|l| l.starts_with("3bad=")), "{logs}");
    a.wait_log("Keys [3bad] from the EnvFrom secret default/s were skipped", T);
}

/// Tmpfs mounts a test made, unmounted (and `then_remove` removed) when it ends, pass or fail:
/// declared before the agent, dropped after it.
#[derive(Default)]
struct TestMounts {
    at: Vec<PathBuf>,
    then_remove: Option<PathBuf>,
}

impl TestMounts {
    fn tmpfs(&mut self, at: &Path) {
        std::fs::create_dir_all(at).unwrap();
        mount_tmpfs_of(at, "64m");
        self.at.push(at.to_path_buf());
    }
}

impl Drop for TestMounts {
    fn drop(&mut self) {
        for at in self.at.iter().rev() {
            let _ = nix::mount::umount2(at, nix::mount::MntFlags::MNT_DETACH);
        }
        if let Some(d) = &self.then_remove {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn is_tmpfs(p: &Path) -> bool {
    nix::sys::statfs::statfs(p).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// Every file under `dir` (not following links).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(e.path()),
                Ok(t) if t.is_file() => out.push(e.path()),
                _ => {}
            }
        }
    }
    out
}

/// Edge boards keep /var/lib and /var/log on partitions or tmpfs of their own, and mount disks
/// while the agent runs. The root dir is a tmpfs mounted before the agent starts; the pod log
/// dir, the pods' dir under the root and a hostPath source are tmpfs mounted after it started
/// (here `/` has private propagation: the agent's copy of the mount namespace it made at start
/// never hears of them). Every path the runtime writes must be the host's: the container's
/// log on the log dir's tmpfs, readable by `logs`; its hostPath and emptyDir writes on theirs.
#[test]
fn logs_and_volumes_on_mounts_of_their_own() {
    let mut mounts = TestMounts::default();
    let a = Agent::start_on_tmpfs_root("volmounts", &[], "");
    mounts.then_remove = Some(a.dir.clone());
    let source = a.host_dir();
    mounts.tmpfs(&a.logs);
    mounts.tmpfs(&a.root.join("pods"));
    mounts.tmpfs(&source);
    a.write(
        "m.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: m}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {IMAGE}
    command: [sh, -c, "echo hello-from-a-mount; echo host-data > /host/file; echo scratch-data > /scratch/f; sleep 3600"]
    volumeMounts:
    - {{name: host, mountPath: /host}}
    - {{name: scratch, mountPath: /scratch}}
  volumes:
  - name: host
    hostPath: {{path: {}, type: Directory}}
  - name: scratch
    emptyDir: {{}}
"#,
            source.display()
        ),
    );
    a.wait_phase("m", "Running", T);
    a.wait_logs_for("m", "", "the container's output", |l| {
        l.lines().any(|l| l == "hello-from-a-mount")
    });
    assert!(is_tmpfs(&a.logs) && is_tmpfs(&source) && is_tmpfs(&a.root.join("pods")));
    let logs = files_under(&a.logs);
    assert!(
        logs.iter()
            .any(|f| f.ends_with("c/0.log")
                && std::fs::read_to_string(f).is_ok_and(|t| t.contains("hello-from-a-mount"))),
        "the container's log is not on the log dir's tmpfs: {logs:?}"
    );
    let deadline = Instant::now() + T;
    let scratch = loop {
        let found = files_under(&a.root.join("pods"))
            .into_iter()
            .find(|f| f.ends_with("scratch/f"));
        if let (Some(f), true) = (&found, source.join("file").exists()) {
            break f.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the container's writes never reached the host"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(std::fs::read_to_string(source.join("file")).unwrap(), "host-data\n");
    assert_eq!(std::fs::read_to_string(&scratch).unwrap(), "scratch-data\n");
    // And the pod goes as it came: its mounts and directories under the pods' tmpfs.
    a.remove("m.yaml");
    a.wait_gone("m", T);
    let left = files_under(&a.root.join("pods"));
    assert!(left.is_empty(), "left under the pods' dir: {left:?}");
}
