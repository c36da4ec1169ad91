//! Every committed seed (`fuzz/seeds/<target>/`) through every fuzz target, built plain by the
//! test build: the targets' own checks (no panic, nothing written outside the scratch
//! directory, digests that match) hold on the inputs that were once interesting. This is the
//! fuzz targets' part of `scripts/test`; `scripts/fuzz` builds them with coverage
//! instrumentation and fuzzes them.
//!
//! A libFuzzer binary given files runs each once and exits 0, or reports the input that
//! failed. Each target gets a fresh scratch directory as its `TMPDIR`, as under scripts/fuzz.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Each target beside the binary the test build made of it.
const TARGETS: &[(&str, &str)] = &[
    ("crilog_records", env!("CARGO_BIN_EXE_crilog_records")),
    ("crilog_writer", env!("CARGO_BIN_EXE_crilog_writer")),
    ("image_archive", env!("CARGO_BIN_EXE_image_archive")),
    ("image_layer", env!("CARGO_BIN_EXE_image_layer")),
    ("kubelet_config", env!("CARGO_BIN_EXE_kubelet_config")),
    ("pod_manifest", env!("CARGO_BIN_EXE_pod_manifest")),
    ("registry_manifest", env!("CARGO_BIN_EXE_registry_manifest")),
    ("spdy_frames", env!("CARGO_BIN_EXE_spdy_frames")),
    ("spdy_session", env!("CARGO_BIN_EXE_spdy_session")),
    ("websocket_frames", env!("CARGO_BIN_EXE_websocket_frames")),
];

fn seeds(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_target_has_seeds_and_every_seed_passes() {
    let on_disk: Vec<String> = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz_targets"))
        .unwrap()
        .map(|e| e.unwrap().path().file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    for t in &on_disk {
        assert!(
            TARGETS.iter().any(|(name, _)| name == t),
            "fuzz target {t} is not replayed here: add it to TARGETS"
        );
    }
    for (target, bin) in TARGETS {
        let inputs = seeds(target);
        assert!(
            !inputs.is_empty(),
            "{target} has no seeds (fuzz/seeds/make.py writes them)"
        );
        let scratch = tempfile::tempdir().unwrap();
        let out = Command::new(bin)
            .args(["-timeout=10", "-rss_limit_mb=4096"])
            .args(&inputs)
            .env("TMPDIR", scratch.path())
            .output()
            .unwrap_or_else(|e| panic!("{bin}: {e}"));
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{target} failed ({}) on one of {} seeds:\n{said}",
            out.status,
            inputs.len()
        );
        // libFuzzer says "Executed <file>" for each input it ran.
        assert_eq!(
            said.matches("Executed ").count(),
            inputs.len(),
            "{target} did not run every seed:\n{said}"
        );
    }
}
