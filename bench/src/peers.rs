//! The peers a user would otherwise pick, run on this machine in the same benchmark run:
//! `crun run` and `runc run` on an equivalent bundle (the runtime floor), and `podman kube
//! play` on the same manifests (the closest peer for static pods). The peers leave nothing on
//! the node: their cgroups nest under the benchmark's own cgroup (podman in a private cgroup
//! namespace rooted there, with every cgroupfs remounted so its absolute /libpod_parent lands
//! below it), and podman's state (/run, /var/lib, its CNI config) lives in the benchmark dir.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ferrolet_runtime::cgroups::{CgroupMode, Cgroups, NestedRoot};

/// Unpack the demo image's layer into `rootfs` for the OCI runtimes.
pub fn unpack_rootfs(oci_tar: &Path, rootfs: &Path) -> Result<()> {
    let mut ar = tar::Archive::new(std::fs::File::open(oci_tar)?);
    std::fs::create_dir_all(rootfs)?;
    for e in ar.entries()? {
        let mut e = e?;
        let path = e.path()?.into_owned();
        if !path.starts_with("blobs/sha256") {
            continue;
        }
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data)?;
        if data.starts_with(&[0x1f, 0x8b]) {
            let mut layer = tar::Archive::new(flate2::read::GzDecoder::new(&data[..]));
            layer.set_preserve_permissions(true);
            layer.unpack(rootfs)?;
            return Ok(());
        }
    }
    bail!("no gzip layer in {}", oci_tar.display())
}

/// An OCI runtime (crun or runc) with a bundle running `/bin/true`.
pub struct OciRuntime {
    pub name: &'static str,
    bundle: PathBuf,
    cgroup_parent: String,
    /// A hybrid node's cgroup2 mount, hidden from crun in a private mount namespace: crun
    /// refuses hybrid layouts but runs on the v1 controllers alone.
    hide: Option<CString>,
}

impl OciRuntime {
    /// `spec` is the OCI spec ferrolet generated for the same container, so every runtime runs
    /// the same mounts, namespaces, capabilities, masked paths and seccomp profile.
    pub fn new(
        name: &'static str,
        dir: &Path,
        rootfs: &Path,
        cgroups: &Cgroups,
        cgroup_parent: &str,
        spec: &serde_json::Value,
    ) -> Result<OciRuntime> {
        let bundle = dir.join(format!("bundle-{name}"));
        std::fs::create_dir_all(&bundle)?;
        let mut spec = spec.clone();
        spec["root"]["path"] = serde_json::json!(rootfs.display().to_string());
        spec["root"]["readonly"] = serde_json::json!(true);
        spec["process"]["args"] = serde_json::json!(["/bin/true"]);
        // oci-spec leaves out a cwd of "/"; runc and crun require the field.
        if spec["process"]["cwd"].is_null() {
            spec["process"]["cwd"] = serde_json::json!("/");
        }
        // Without the deny-all device rule the runtimes need no devices cgroup here.
        if let Some(r) = spec["linux"]["resources"].as_object_mut() {
            r.remove("devices");
        }
        std::fs::write(bundle.join("config.json"), serde_json::to_vec_pretty(&spec)?)?;
        let hide = match cgroups.mode() {
            CgroupMode::V1 { named, .. } if name == "crun" => named
                .get("")
                .map(|m| CString::new(m.clone().into_os_string().into_encoded_bytes()).expect("path")),
            _ => None,
        };
        Ok(OciRuntime {
            name,
            bundle,
            cgroup_parent: cgroup_parent.to_string(),
            hide,
        })
    }

    /// One create+start+wait+delete, in milliseconds.
    pub fn run_once(&self, i: usize) -> Result<f64> {
        let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(self.bundle.join("config.json"))?)?;
        spec["linux"]["cgroupsPath"] = serde_json::json!(format!("{}/{}-{i}", self.cgroup_parent, self.name));
        std::fs::write(self.bundle.join("config.json"), serde_json::to_vec(&spec)?)?;
        let mut cmd = Command::new(self.name);
        cmd.args(["run", "--bundle"])
            .arg(&self.bundle)
            .arg(format!("bench-{}-{i}", self.name))
            .stdin(Stdio::null());
        if let Some(hide) = self.hide.clone() {
            // SAFETY: unshare/mount/umount2 system calls only, between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::unshare(libc::CLONE_NEWNS) != 0
                        || libc::mount(
                            std::ptr::null(),
                            c"/".as_ptr(),
                            std::ptr::null(),
                            libc::MS_REC | libc::MS_PRIVATE,
                            std::ptr::null(),
                        ) != 0
                        || libc::umount2(hide.as_ptr(), libc::MNT_DETACH) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let t = Instant::now();
        let out = cmd.output()?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        if !out.status.success() {
            bail!("{} run: {}", self.name, String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(ms)
    }
}

/// Runs in podman's private mount and cgroup namespaces (the process already sits in the
/// nested cgroup in every hierarchy): remount each cgroupfs so its root is the namespace's,
/// put /run, /var/lib and the CNI config dir in the benchmark dir ($1), then exec podman.
const PODMAN_NS: &str = r#"
d=$1; shift
grep -E ' - cgroup2? ' /proc/self/mountinfo | while read -r line; do
  mp=$(echo "$line" | cut -d' ' -f5)
  set -- ${line#* - }
  umount -l "$mp"
  if [ "$1" = cgroup2 ]; then
    mount -t cgroup2 cgroup2 "$mp"
  else
    mount -t cgroup -o "$(echo "$3" | tr , '
' | grep -vxE 'rw|ro' | paste -sd,)" cgroup "$mp"
  fi
done
mount --bind "$d/run" /run
mount --bind "$d/varlib" /var/lib
if [ -d /etc/cni/net.d ]; then mount --bind "$d/cni" /etc/cni/net.d; fi
exec podman "$@"
"#;

/// podman with its own storage under the benchmark dir and its cgroups nested.
pub struct Podman {
    dir: PathBuf,
    cgroup: NestedRoot,
    procs: Vec<CString>,
}

impl Podman {
    pub fn new(dir: &Path, cgroups: &Cgroups, docker_archive: &Path) -> Result<Podman> {
        let dir = dir.join("podman");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("containers.conf"),
            // podman's default ulimits need CAP_SYS_RESOURCE, which this machine withholds.
            "[containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=4096:4096\"]\n[engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"none\"\nruntime = \"runc\"\n",
        )?;
        let cgroup = NestedRoot::create(cgroups, &format!("ferrolet-bench-podman-{}", std::process::id()))
            .map_err(anyhow::Error::from)?;
        for d in ["run", "varlib", "cni"] {
            std::fs::create_dir_all(dir.join(d))?;
        }
        let procs = cgroups
            .all_dirs(cgroup.path())
            .into_iter()
            .map(|d| CString::new(d.join("cgroup.procs").into_os_string().into_encoded_bytes()).expect("path"))
            .collect();
        let p = Podman { dir, cgroup, procs };
        p.run(&["load", "-i", &docker_archive.display().to_string()])?;
        p.run(&["tag", "localhost/busybox-docker:1.35", "docker.io/library/busybox:1.35"])?;
        Ok(p)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("unshare");
        c.args(["-m", "-C", "sh", "-ec", PODMAN_NS, "podman"])
            .arg(&self.dir)
            .arg("--root")
            .arg(self.dir.join("root"))
            .arg("--runroot")
            .arg(self.dir.join("run"))
            .args(["--storage-driver", "overlay"])
            .args(args)
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .stdin(Stdio::null());
        let procs = self.procs.clone();
        // SAFETY: only open/write/close between fork and exec.
        unsafe {
            c.pre_exec(move || {
                for p in &procs {
                    let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd >= 0 {
                        libc::write(fd, b"0".as_ptr() as *const libc::c_void, 1);
                        libc::close(fd);
                    }
                }
                Ok(())
            });
        }
        c
    }

    pub fn run(&self, args: &[&str]) -> Result<Output> {
        let out = self
            .command(args)
            .output()
            .with_context(|| format!("podman {}", args.join(" ")))?;
        if !out.status.success() {
            bail!(
                "podman {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out)
    }

    /// conmon and catatonit: what podman keeps per pod.
    pub fn processes(&self) -> Vec<i32> {
        let mut v = crate::procstat::pids_named("conmon");
        v.extend(crate::procstat::pids_named("catatonit"));
        v
    }

    pub fn finish(self) {
        let _ = self.run(&["pod", "rm", "-af", "-t", "0"]);
        let _ = self.run(&["system", "reset", "-f"]);
        // conmon and catatonit can outlive podman's own exit by a moment.
        let mut last = Ok(());
        for _ in 0..50 {
            last = self.cgroup.cleanup();
            if last.is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        if let Err(e) = last {
            eprintln!("   podman's cgroups: {}", ferrolet_fsutil::chain(&e));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
