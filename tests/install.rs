//! `ferrolet install` and `ferrolet uninstall`, staged under a directory (`--destdir`), as a
//! package build or an image build runs them: what install adds is in its place, and
//! uninstall removes exactly that, keeping what a person changed or put there; and for real,
//! on a machine with systemd as PID 1 (tests/common/systemd.rs), as a person installs it on a
//! fresh board: the unit starts the agent, which runs a static pod, keeps it across its own
//! restart, and uninstall stops the pod and the service and leaves the machine as it was.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::systemd::SystemdMachine;

fn ferrolet(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ferrolet"))
        .args(args)
        .output()
        .expect("running ferrolet")
}

fn ok(args: &[&str]) -> String {
    let out = ferrolet(args);
    assert!(
        out.status.success(),
        "ferrolet {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every file under `dir`, relative to it, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn install_places_everything_and_uninstall_removes_only_that() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path();
    let d = dest.to_str().unwrap();
    // What the machine had before: a tool beside where the binary goes.
    std::fs::create_dir_all(dest.join("usr/local/bin")).unwrap();
    std::fs::write(dest.join("usr/local/bin/other-tool"), "mine").unwrap();

    let said = ok(&["install", "--destdir", d]);
    assert!(said.contains("ferrolet is installed"), "{said}");
    let unit = std::fs::read_to_string(dest.join("etc/systemd/system/ferrolet.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/ferrolet run --config /etc/ferrolet/config.yaml"),
        "{unit}"
    );
    assert!(
        unit.contains("Delegate=yes") && unit.contains("KillMode=process"),
        "{unit}"
    );
    let config = std::fs::read_to_string(dest.join("etc/ferrolet/config.yaml")).unwrap();
    assert!(config.contains("staticPodPath: manifests"), "{config}");
    assert!(dest.join("etc/ferrolet/manifests").is_dir());
    let bin = std::fs::read(dest.join("usr/local/bin/ferrolet")).unwrap();
    assert_eq!(bin, std::fs::read(env!("CARGO_BIN_EXE_ferrolet")).unwrap());
    let bash = std::fs::read_to_string(dest.join("usr/share/bash-completion/completions/ferrolet")).unwrap();
    assert!(
        bash.contains("--pod-manifest-path") && bash.contains("complete -F"),
        "bash completion"
    );
    assert!(dest.join("usr/share/zsh/vendor-completions/_ferrolet").is_file());
    assert!(dest.join("usr/share/fish/vendor_completions.d/ferrolet.fish").is_file());
    let man = std::fs::read_to_string(dest.join("usr/local/share/man/man8/ferrolet-run.8")).unwrap();
    assert!(
        man.starts_with(".ie") || man.contains(".TH ferrolet-run 8"),
        "{}",
        &man[..200]
    );
    assert!(man.contains("pod\\-manifest\\-path"), "the run page lists the flags");
    for sub in ["pods", "logs", "exec", "install", "uninstall"] {
        assert!(dest
            .join(format!("usr/local/share/man/man8/ferrolet-{sub}.8"))
            .is_file());
    }

    // A second install refuses, naming the record.
    let again = ferrolet(&["install", "--destdir", d]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("install-record.json"));

    // A person edits the config and adds a pod.
    std::fs::write(dest.join("etc/ferrolet/config.yaml"), config + "# mine\n").unwrap();
    std::fs::write(dest.join("etc/ferrolet/manifests/web.yaml"), "kind: Pod\n").unwrap();

    let said = ok(&["uninstall", "--destdir", d]);
    assert!(
        said.contains("kept      ") && said.contains("config.yaml (changed since it was installed)"),
        "{said}"
    );
    assert_eq!(
        files(dest),
        [
            "etc/ferrolet/config.yaml",
            "etc/ferrolet/manifests/web.yaml",
            "usr/local/bin/other-tool"
        ]
    );
    // Directories install made and left empty are gone; the machine's stay.
    assert!(!dest.join("usr/share").exists());
    assert!(!dest.join("etc/systemd").exists());
    assert!(dest.join("usr/local/bin").is_dir());

    // Without a record, uninstall says it has nothing of its own to remove.
    let none = ferrolet(&["uninstall", "--destdir", d]);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("not installed by `ferrolet install`"));
}

/// The release tarball's layout: the binary, and `images/*.tar` beside it (the demo image, which
/// a release binary does not carry inside). Install puts each archive in the agent's import
/// directory; `--image-archive` names others instead; uninstall takes them away again.
#[test]
fn install_puts_the_shipped_image_archives_in_the_import_directory() {
    let t = tempfile::tempdir().unwrap();
    let unpacked = t.path().join("ferrolet-0.1.0-x86_64-unknown-linux-musl");
    std::fs::create_dir_all(unpacked.join("images")).unwrap();
    let exe = unpacked.join("ferrolet");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_ferrolet"), &exe).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_ferrolet"), &exe).unwrap();
    }
    std::fs::write(unpacked.join("images/busybox.oci.tar"), "an archive").unwrap();
    let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(unpacked.join("images/busybox.oci.tar"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    std::fs::write(unpacked.join("images/README"), "not an archive").unwrap();
    let import = "var/lib/ferrolet/images/import";

    let dest = t.path().join("root");
    std::fs::create_dir(&dest).unwrap();
    let d = dest.to_str().unwrap();
    let out = Command::new(&exe).args(["install", "--destdir", d]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let placed: Vec<String> = files(&dest).into_iter().filter(|f| f.starts_with("var/")).collect();
    assert_eq!(placed, [format!("{import}/busybox.oci.tar")]);
    let archive = dest.join(import).join("busybox.oci.tar");
    assert_eq!(std::fs::read_to_string(&archive).unwrap(), "an archive");
    // With the archive's time (the tarball's are old), so the agent imports it at its start.
    let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    assert_eq!(mtime(&archive), mtime(&unpacked.join("images/busybox.oci.tar")));
    ok(&["uninstall", "--destdir", d]);
    assert!(!dest.join("var").exists(), "{:?}", files(&dest));

    // Named ones instead of the shipped ones; a missing one fails the install, which leaves
    // nothing behind.
    let other = t.path().join("mine.docker.tar");
    std::fs::write(&other, "another").unwrap();
    let out = Command::new(&exe)
        .args(["install", "--destdir", d, "--image-archive", other.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let placed: Vec<String> = files(&dest).into_iter().filter(|f| f.starts_with("var/")).collect();
    assert_eq!(placed, [format!("{import}/mine.docker.tar")]);
    ok(&["uninstall", "--destdir", d]);
    let out = Command::new(&exe)
        .args(["install", "--destdir", d, "--image-archive", "/nonexistent/x.tar"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/x.tar"));
    assert!(files(&dest).is_empty(), "{:?}", files(&dest));
}

/// `args` run inside the machine: (success, stdout + stderr).
fn inside(m: &SystemdMachine, args: &[&str]) -> (bool, String) {
    let out = m.run(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The agent's journal in the machine and the machine's console, for failure messages.
fn journal(m: &SystemdMachine) -> String {
    let (_, j) = inside(m, &["journalctl", "-u", "ferrolet", "--no-pager", "-n", "40"]);
    let (_, w) = inside(
        m,
        &[
            "sh",
            "-c",
            "journalctl -u ferrolet --no-pager | grep -E ' (WARN|ERROR) ' | tail -20",
        ],
    );
    format!(
        "--- journalctl -u ferrolet ---\n{j}\n--- its warnings ---\n{w}\n{}",
        m.log()
    )
}

/// Wait (60 s at most) until `f` holds of what `args` print inside the machine.
fn wait_inside(m: &SystemdMachine, what: &str, args: &[&str], f: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, text) = inside(m, args);
        if f(&text) {
            return text;
        }
        if Instant::now() > deadline {
            panic!("{what}: `{}` says\n{text}\n{}", args.join(" "), journal(m));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The pid (as the machine numbers it) of the `hello` pod's container, found by its command.
fn hello_pid(m: &SystemdMachine) -> Option<u32> {
    let (ok, said) = inside(m, &["pgrep", "-x", "-f", "sleep 3601"]);
    let pids: Vec<u32> = said.split_whitespace().filter_map(|p| p.parse().ok()).collect();
    (ok && pids.len() == 1).then(|| pids[0])
}

#[test]
fn install_under_systemd_runs_static_pods_and_uninstall_undoes_it() {
    let name = format!("ferrolet-it-install-{}", std::process::id());
    let dir = std::env::temp_dir().join(&name);
    let _ = std::fs::remove_dir_all(&dir);
    let m = SystemdMachine::boot(&dir, &name);
    let bin = env!("CARGO_BIN_EXE_ferrolet");

    // The machine's root is an overlay, on which the agent's image store cannot build its own
    // overlays (an upper directory on overlayfs): the agent's root dir gets a tmpfs, as a
    // board's /var/lib is a disk. It goes with the machine's mount namespace.
    for args in [
        &["mkdir", "-p", "/var/lib/ferrolet"][..],
        &[
            "mount",
            "-t",
            "tmpfs",
            "-o",
            "size=2g",
            "ferrolet-root",
            "/var/lib/ferrolet",
        ],
    ] {
        let (ok, said) = inside(&m, args);
        assert!(ok, "{args:?}: {said}");
    }
    // First as a board where the agent cannot start: systemd-nspawn keeps the cgroup v1
    // controllers read-only, so the agent cannot make its kubepods cgroups. Install says the
    // service did not start, and uninstall still takes everything back.
    let (ok, said) = inside(&m, &[bin, "install"]);
    assert!(!ok, "install with an agent that cannot start: {said}");
    assert!(said.contains("its service did not start"), "{said}");
    let (ok, said) = inside(&m, &["/usr/local/bin/ferrolet", "uninstall"]);
    assert!(ok, "uninstall after a failed start: {said}\n{}", journal(&m));
    assert!(!Path::new(&format!("/proc/{}/root/usr/local/bin/ferrolet", m.leader())).exists());

    // Then as a board whose systemd hands the agent its cgroups.
    m.delegate_cgroup_controllers();
    let (ok, said) = inside(&m, &[bin, "install"]);
    assert!(ok, "ferrolet install under systemd: {said}\n{}", journal(&m));
    assert!(said.contains("ferrolet is installed"), "{said}");
    // Type=notify: active once the agent said READY=1.
    wait_inside(
        &m,
        "the unit is active",
        &["systemctl", "is-active", "ferrolet.service"],
        |t| t.trim() == "active",
    );
    let (_, enabled) = inside(&m, &["systemctl", "is-enabled", "ferrolet.service"]);
    assert_eq!(enabled.trim(), "enabled");

    // A static pod, as a person drops it in.
    let manifests = format!("/proc/{}/root/etc/ferrolet/manifests", m.leader());
    std::fs::write(
        format!("{manifests}/hello.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: hello}}\nspec:\n  containers:\n  - name: main\n    image: {}\n    command: [sleep, '3601']\n",
            common::IMAGE
        ),
    )
    .unwrap();
    wait_inside(&m, "the static pod runs", &["/usr/local/bin/ferrolet", "pods"], |t| {
        t.lines().any(|l| l.contains("hello-") && l.contains("Running"))
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let pid = loop {
        if let Some(p) = hello_pid(&m) {
            break p;
        }
        assert!(Instant::now() < deadline, "the pod's pid never showed");
        std::thread::sleep(Duration::from_millis(200));
    };
    let alive = |pid: u32| inside(&m, &["kill", "-0", &pid.to_string()]).0;
    assert!(alive(pid), "the container's process {pid}");

    // KillMode=process: restarting the agent leaves the pod running; the new agent adopts it.
    let (ok, said) = inside(&m, &["systemctl", "restart", "ferrolet.service"]);
    assert!(ok, "systemctl restart: {said}");
    wait_inside(
        &m,
        "the agent is back",
        &["systemctl", "is-active", "ferrolet.service"],
        |t| t.trim() == "active",
    );
    wait_inside(&m, "the adopted pod runs", &["/usr/local/bin/ferrolet", "pods"], |t| {
        t.lines()
            .any(|l| l.contains("hello-") && l.contains("Running") && l.contains(" 0 "))
    });
    assert!(alive(pid), "the pod's container survived the agent's restart");
    assert_eq!(hello_pid(&m), Some(pid), "the same container, not a new one");

    // Uninstall: the service stops and is disabled, the pod is stopped and removed, what
    // install put there is gone, and what the person put there (the manifest) stays.
    let (ok, said) = inside(&m, &["/usr/local/bin/ferrolet", "uninstall"]);
    assert!(ok, "ferrolet uninstall: {said}\n{}", journal(&m));
    let (_, active) = inside(&m, &["systemctl", "is-active", "ferrolet.service"]);
    assert_ne!(active.trim(), "active", "{active}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive(pid) {
        assert!(Instant::now() < deadline, "the pod's process {pid} outlived uninstall");
        std::thread::sleep(Duration::from_millis(100));
    }
    let root = |p: &str| format!("/proc/{}/root{p}", m.leader());
    for gone in [
        "/usr/local/bin/ferrolet",
        "/etc/systemd/system/ferrolet.service",
        "/etc/ferrolet/config.yaml",
        "/etc/ferrolet/install-record.json",
        "/usr/share/bash-completion/completions/ferrolet",
    ] {
        assert!(
            !Path::new(&root(gone)).exists(),
            "{gone} is still there after uninstall"
        );
    }
    assert!(Path::new(&root("/etc/ferrolet/manifests/hello.yaml")).exists());
    let (_, unit) = inside(&m, &["systemctl", "list-unit-files", "ferrolet.service", "--no-legend"]);
    assert!(unit.trim().is_empty(), "systemd still knows the unit: {unit}");
}
