//! Embeds the demo image (images/out/busybox.oci.tar, built by images/build-busybox.sh from
//! Debian's busybox-static) so a fresh node runs busybox pods with nothing imported. Without
//! it (no busybox-static on the build machine) the binary simply carries no demo image.

use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("demo-image.tar");
    let src = std::env::var_os("FERROLET_DEMO_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("images/out/busybox.oci.tar"));
    println!("cargo:rerun-if-env-changed=FERROLET_DEMO_IMAGE");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-changed=images/build-busybox.sh");
    if !src.exists() {
        let _ = std::process::Command::new(root.join("images/build-busybox.sh"))
            .arg(src.parent().unwrap())
            .status();
    }
    match std::fs::copy(&src, &out) {
        Ok(_) => {}
        Err(_) => {
            println!("cargo:warning=no demo image at {} (install busybox-static and run images/build-busybox.sh); building without one", src.display());
            std::fs::write(&out, b"").unwrap();
        }
    }
}
