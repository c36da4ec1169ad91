//! The AppArmor profile containers get by default where the kernel enforces AppArmor
//! (`RuntimeDefault`), as containerd ships and loads its `cri-containerd.apparmor.d`: all
//! network, capability and file access the container's other confinement allows, no mounts,
//! no writes to the kernel's knobs under /proc and /sys (its own processes' /proc entries and
//! `kernel.shm*` excepted, and the cgroup filesystem), nothing at all of /proc/sysrq-trigger,
//! /proc/kcore, the firmware, powercap and security filesystems, and signals and ptrace only
//! within the profile (and signals from the unconfined agent). docs/apparmor.md

use std::path::Path;
use std::sync::Mutex;

/// The profile's name.
pub const DEFAULT_PROFILE: &str = "ferrolet-default";

/// The profile's text, for `apparmor_parser`.
pub(crate) fn default_profile() -> String {
    let name = DEFAULT_PROFILE;
    format!(
        r#"@{{PROC}}=/proc/

profile {name} flags=(attach_disconnected,mediate_deleted) {{
  network,
  capability,
  file,
  umount,

  # signals: from the agent and its helpers (unconfined), and among the container's processes
  signal (receive) peer=unconfined,
  signal (send,receive) peer={name},

  # /proc: nothing written but the processes' own entries and kernel.shm*
  deny @{{PROC}}/* w,
  deny @{{PROC}}/{{[^1-9],[^1-9][^0-9],[^1-9s][^0-9y][^0-9s],[^1-9][^0-9][^0-9][^0-9]*}}/** w,
  deny @{{PROC}}/sys/[^k]** w,
  deny @{{PROC}}/sys/kernel/{{?,??,[^s][^h][^m]**}} w,
  deny @{{PROC}}/sysrq-trigger rwklx,
  deny @{{PROC}}/kcore rwklx,

  deny mount,

  # /sys: nothing written outside the cgroup filesystem
  deny /sys/[^f]*/** wklx,
  deny /sys/f[^s]*/** wklx,
  deny /sys/fs/[^c]*/** wklx,
  deny /sys/fs/c[^g]*/** wklx,
  deny /sys/fs/cg[^r]*/** wklx,
  deny /sys/firmware/** rwklx,
  deny /sys/devices/virtual/powercap/** rwklx,
  deny /sys/kernel/security/** rwklx,

  ptrace (trace,read,tracedby,readby) peer={name},
}}
"#
    )
}

/// Whether the kernel has `name` loaded.
pub fn loaded(name: &str) -> bool {
    std::fs::read_to_string("/sys/kernel/security/apparmor/profiles")
        .is_ok_and(|all| all.lines().any(|l| l.rsplit_once(" (").is_some_and(|(n, _)| n == name)))
}

static LOADED: Mutex<bool> = Mutex::new(false);

/// Load [`default_profile`] into the kernel unless it is there already (once per process; a
/// failure is tried again at the next call): the text is written under `dir` and given to
/// `apparmor_parser -Kr`, as containerd loads its own. Needs AppArmor's parser, which every
/// distribution that enables AppArmor installs with it.
pub fn ensure_default_loaded(dir: &Path) -> Result<(), String> {
    let mut done = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if *done || loaded(DEFAULT_PROFILE) {
        *done = true;
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let file = dir.join(DEFAULT_PROFILE);
    ferrolet_fsutil::write_atomic(&file, default_profile().as_bytes())
        .map_err(|e| format!("writing {}: {}", file.display(), ferrolet_fsutil::chain(&e)))?;
    let out = std::process::Command::new("apparmor_parser")
        .arg("-Kr")
        .arg(&file)
        .output()
        .map_err(|e| {
            format!(
                "loading the AppArmor profile {DEFAULT_PROFILE}: running apparmor_parser: {e} \
                 (install AppArmor's parser: Debian's and Ubuntu's package apparmor)"
            )
        })?;
    if !out.status.success() {
        return Err(format!(
            "loading the AppArmor profile {DEFAULT_PROFILE}: apparmor_parser: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    *done = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_denies_mounts_and_the_kernels_knobs() {
        let p = default_profile();
        assert!(p.contains("profile ferrolet-default flags=(attach_disconnected,mediate_deleted) {"));
        for rule in [
            "deny mount,",
            "deny @{PROC}/sysrq-trigger rwklx,",
            "deny /sys/kernel/security/** rwklx,",
            "signal (receive) peer=unconfined,",
            "ptrace (trace,read,tracedby,readby) peer=ferrolet-default,",
        ] {
            assert!(p.contains(rule), "{rule}");
        }
        // balanced braces, one profile
        assert_eq!(p.matches('{').count(), p.matches('}').count());
        assert_eq!(p.matches("profile ").count(), 1);
    }
}
