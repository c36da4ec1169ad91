//! Builds the monitor program (crate ferrolet-monitor, runtime/monitor) that this crate carries
//! and its zygote's forks execute once a container is built (docs/runtime.md#the-monitor-image):
//! static and not position-independent, for `<arch>-unknown-linux-musl` whatever this crate's
//! own target is, in the workspace's `monitor` profile. A static musl program writes few pages
//! of its own as it starts (no dynamic loader, no relocations), and those are what every
//! container's monitor holds.
//!
//! It runs a cargo of its own, in a target directory of its own beside this build's
//! (`<target>/[<triple>/]<profile>/monitor-image`), with none of the outer build's compiler
//! wrappers or flags (`scripts/test` builds the workspace through clippy-driver) but the
//! target's own (`CARGO_TARGET_<TRIPLE>_RUSTFLAGS`, the linker: the arm64 lane's). The target
//! must be installed (`rustup target add`; scripts/setup.sh adds the host's).

use std::path::{Path, PathBuf};
use std::process::Command;

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("cargo sets {name} for build scripts"))
}

fn main() {
    let manifest_dir = PathBuf::from(var("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(var("OUT_DIR"));
    // FERROLET_MONITOR_PROGRAM=none: a binary without the program (its monitors stay forks of
    // the agent), for a build that must stay under a size (scripts/release).
    println!("cargo:rerun-if-env-changed=FERROLET_MONITOR_PROGRAM");
    if std::env::var("FERROLET_MONITOR_PROGRAM").as_deref() == Ok("none") {
        copy_if_changed_bytes(&[], &out_dir.join("ferrolet-monitor"));
        return;
    }
    let arch = var("CARGO_CFG_TARGET_ARCH");
    let target = format!("{arch}-unknown-linux-musl");
    // The workspace's Cargo.toml holds the `monitor` profile and the dependencies' versions.
    for p in [
        "monitor/src",
        "monitor/Cargo.toml",
        "../fsutil/src",
        "../fsutil/Cargo.toml",
        "../Cargo.toml",
        "../Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={p}");
    }
    let triple_var = target.to_uppercase().replace('-', "_");
    let target_var = format!("CARGO_TARGET_{triple_var}_RUSTFLAGS");
    for v in [
        target_var.clone(),
        format!("CARGO_TARGET_{triple_var}_LINKER"),
        format!("CC_{}", target.replace('-', "_")),
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }

    // OUT_DIR is <profile dir>/build/ferrolet-runtime-<hash>/out.
    let profile_dir = out_dir.ancestors().nth(3).unwrap_or(&out_dir).to_path_buf();
    let target_dir = profile_dir.join("monitor-image");
    let rustflags = format!(
        "{} -C relocation-model=static -C target-feature=+crt-static",
        std::env::var(&target_var).unwrap_or_default()
    );
    let mut cargo = Command::new(var("CARGO"));
    cargo
        .args([
            "build",
            "--quiet",
            "--locked",
            "--package",
            "ferrolet-monitor",
            "--bin",
            "ferrolet-monitor",
        ])
        .args(["--profile", "monitor", "--target", &target])
        .arg("--manifest-path")
        .arg(manifest_dir.join("monitor/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env(&target_var, rustflags.trim());
    for v in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CLIPPY_ARGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_TARGET_DIR",
    ] {
        cargo.env_remove(v);
    }
    // The `monitor` profile inherits `release`: settings given to the outer build for its
    // release profile (scripts/fuzz's, a debugging build's) are not the program's.
    for (v, _) in std::env::vars_os() {
        if v.to_str().is_some_and(|v| v.starts_with("CARGO_PROFILE_RELEASE_")) {
            cargo.env_remove(v);
        }
    }
    let status = cargo
        .status()
        .unwrap_or_else(|e| panic!("running cargo to build the monitor program: {e}"));
    if !status.success() {
        panic!(
            "building the monitor program (ferrolet-monitor) for {target} failed ({status}); its \
             standard library must be installed: `rustup target add {target}` (scripts/setup.sh \
             adds the host's)"
        );
    }
    let built = target_dir.join(&target).join("monitor").join("ferrolet-monitor");
    copy_if_changed(&built, &out_dir.join("ferrolet-monitor"));
}

/// Copy `from` to `to` unless `to` has the same bytes already (so a rebuild that changed
/// nothing leaves the file, and what includes it, as it was).
fn copy_if_changed(from: &Path, to: &Path) {
    let new = std::fs::read(from).unwrap_or_else(|e| panic!("reading {}: {e}", from.display()));
    copy_if_changed_bytes(&new, to);
}

/// Write `new` to `to` unless it holds those bytes already.
fn copy_if_changed_bytes(new: &[u8], to: &Path) {
    if std::fs::read(to).ok().as_deref() != Some(new) {
        std::fs::write(to, new).unwrap_or_else(|e| panic!("writing {}: {e}", to.display()));
    }
}
