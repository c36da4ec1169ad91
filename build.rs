//! Embeds the demo image (an OCI archive of Debian's busybox-static, built by
//! images/build-busybox.sh) so a fresh node runs busybox pods with nothing imported. The image
//! is built into OUT_DIR, never into the source tree; FERROLET_DEMO_IMAGE names a ready archive
//! instead, or `none` for a binary without one (the release's: its tarball carries the image).
//! Without busybox-static on the build machine the binary carries no demo image.
//! BUSYBOX names the busybox binary to build it from (the image takes that binary's
//! architecture; BUSYBOX_RUNNER runs a foreign one, e.g. qemu-aarch64-static): a build for
//! another architecture than the build machine's without BUSYBOX carries no demo image rather
//! than one the node cannot run (scripts/release sets both for aarch64).
//!
//! Also compiles kubelet's node plugin APIs (src/apis/proto) into Rust with protox (a protobuf
//! compiler in Rust: no protoc needed, for every target alike) and tonic.

use std::path::PathBuf;

/// The gRPC APIs of src/apis, each a `package` the generated code is named after.
const PROTOS: &[&str] = &[
    "src/apis/proto/csi_v1.proto",
    "src/apis/proto/deviceplugin_v1beta1.proto",
    "src/apis/proto/pluginregistration_v1.proto",
    "src/apis/proto/podresources_v1.proto",
];

fn compile_protos() {
    for p in PROTOS {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(PROTOS, ["src/apis/proto"]).expect("compiling src/apis/proto");
    tonic_prost_build::configure()
        .compile_fds(fds)
        .expect("generating the gRPC code of src/apis/proto");
}

/// The agent's relative relocations (some 37,000 on x86_64: vtables, tables of string slices)
/// packed as DT_RELR instead of 24 bytes each in `.rela.dyn`: 0.9 MB less binary (issue 16's
/// 25 MB, docs/static-build.md). GNU ld 2.38 and glibc 2.36 (Debian 12) have them. The musl
/// builds are linked by scripts/release, with lld packing them the same way.
fn pack_relocations() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

fn main() {
    compile_protos();
    pack_relocations();
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let embedded = out_dir.join("demo-image.tar");
    println!("cargo:rerun-if-env-changed=FERROLET_DEMO_IMAGE");
    println!("cargo:rerun-if-env-changed=BUSYBOX");
    println!("cargo:rerun-if-env-changed=BUSYBOX_RUNNER");
    let target_arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let foreign = target_arch != std::env::consts::ARCH && std::env::var_os("BUSYBOX").is_none();
    println!("cargo:rerun-if-changed=images/build-busybox.sh");
    let busybox = std::env::var_os("BUSYBOX").unwrap_or_else(|| "/bin/busybox".into());
    println!("cargo:rerun-if-changed={}", PathBuf::from(&busybox).display());

    let src = match std::env::var_os("FERROLET_DEMO_IMAGE") {
        // Chosen (scripts/release: the demo image ships beside the binary, not inside it).
        Some(p) if p == "none" => {
            std::fs::write(&embedded, b"").expect("writing into OUT_DIR");
            return;
        }
        Some(p) => PathBuf::from(p),
        None if foreign => {
            println!("cargo:warning=building for {target_arch} without BUSYBOX (a {target_arch} busybox-static): no demo image");
            out_dir.join("no-demo-image")
        }
        None => {
            let dir = out_dir.join("demo-image");
            let built = std::process::Command::new(root.join("images/build-busybox.sh"))
                .arg(&dir)
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !built {
                println!("cargo:warning=could not build the demo image (install busybox-static); building without one");
            }
            dir.join("busybox.oci.tar")
        }
    };
    if std::fs::copy(&src, &embedded).is_err() {
        println!("cargo:warning=no demo image at {}; building without one", src.display());
        std::fs::write(&embedded, b"").expect("writing into OUT_DIR");
    }
}
