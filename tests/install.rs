//! `ferrolet install` and `ferrolet uninstall`, staged under a directory (`--destdir`), as a
//! package build or an image build runs them: what install adds is in its place, and
//! uninstall removes exactly that, keeping what a person changed or put there.

use std::path::Path;
use std::process::Command;

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
