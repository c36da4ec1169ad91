//! The container boundary, tried from inside real containers: device nodes a container makes
//! or is given and what opening them does (the devices controller on cgroup v1, the eBPF
//! device program on v2), and what a privileged container reaches. Every test makes the
//! attempt an attacker would and checks it is refused (docs/devices.md).
//!
//! `harness = false`, as the other runtime test binaries: the zygote is forked first.

mod common;

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};
use common::{block, config, env, run, trial};
use ferrolet_runtime::config::Device;
use ferrolet_runtime::devices::{self, bpf, program, Policy};
use ferrolet_runtime::fork_zygote;

fn main() {
    let zygote = fork_zygote().expect("fork zygote (must be single-threaded here)");
    let args = common::setup("boundary", zygote);
    let tests = vec![
        trial(
            "the_device_program_is_enforced_by_the_kernel",
            the_device_program_is_enforced_by_the_kernel,
        ),
        trial(
            "a_container_cannot_open_the_disk_it_mknods",
            a_container_cannot_open_the_disk_it_mknods,
        ),
        trial(
            "a_device_the_config_names_is_usable_with_its_access_only",
            a_device_the_config_names_is_usable_with_its_access_only,
        ),
        trial(
            "a_privileged_container_reads_the_disk",
            a_privileged_container_reads_the_disk,
        ),
    ];
    common::finish(&args, tests);
}

/// A disk to try: the one under the test's root directory, or, where that is not on a disk
/// (the cgroup v2 guest's root is a tmpfs), the first disk the kernel lists. Where root on the
/// host cannot read it either (this development machine's sandbox refuses even root its
/// disk, which would make a refusal in the container prove nothing), a loop device over a
/// file of the test's own, detached when dropped.
struct Disk {
    node: PathBuf,
    major: u32,
    minor: u32,
    /// Its first 4 KiB as the host reads them, in hex.
    head: String,
    loop_file: Option<PathBuf>,
}

impl Drop for Disk {
    fn drop(&mut self) {
        if let Some(file) = &self.loop_file {
            let _ = Command::new("losetup").arg("-d").arg(&self.node).status();
            let _ = std::fs::remove_file(file);
        }
    }
}

fn disk() -> Result<Disk> {
    let (node, loop_file) = match machine_disk()? {
        Some(node) if disk_head(&node).is_ok() => (node, None),
        found => {
            static SAID: std::sync::Once = std::sync::Once::new();
            if let Some(node) = found {
                SAID.call_once(|| eprintln!("{}: not readable by root here; a loop device instead", node.display()));
            }
            let file = env().root.join(format!("disk-{}.img", ferrolet_fsutil::random_hex(4)));
            let mut data = vec![0u8; 1 << 20];
            data[..24].copy_from_slice(b"ferrolet boundary disk\n\0");
            std::fs::write(&file, &data)?;
            let out = Command::new("losetup").args(["-f", "--show"]).arg(&file).output()?;
            ensure!(
                out.status.success(),
                "losetup: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            (PathBuf::from(String::from_utf8(out.stdout)?.trim()), Some(file))
        }
    };
    let n = devices::nodes::host_node(&node).map_err(anyhow::Error::msg)?;
    let mut d = Disk {
        node,
        major: n.major,
        minor: n.minor,
        head: String::new(),
        loop_file,
    };
    d.head = disk_head(&d.node)?;
    Ok(d)
}

fn machine_disk() -> Result<Option<PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(&env().root)?.dev();
    let (major, minor) = devices::nodes::major_minor(dev);
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let name = if major != 0 && sys.exists() {
        std::fs::canonicalize(&sys)?
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
    } else {
        let mut disks: Vec<String> = std::fs::read_dir("/sys/block")?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| {
                !["loop", "ram", "zram", "nbd", "sr", "dm-"]
                    .iter()
                    .any(|p| n.starts_with(p))
            })
            .collect();
        disks.sort();
        disks.into_iter().next()
    };
    Ok(name.map(|n| PathBuf::from("/dev").join(n)))
}

/// The first bytes of a disk, read on the host, in hex.
fn disk_head(node: &Path) -> Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; 4096];
    std::fs::File::open(node)
        .and_then(|mut f| f.read_exact(&mut buf))
        .with_context(|| format!("reading {}", node.display()))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// The cgroup v2 hierarchy this machine has: the only one on a v2 node, the controller-less
/// unified one on a hybrid node (BPF device programs work on either).
fn unified_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut found = None;
    for line in info.lines() {
        let (pre, post) = line.split_once(" - ")?;
        if post.starts_with("cgroup2 ") {
            let mp = PathBuf::from(pre.split(' ').nth(4)?);
            if mp == Path::new("/sys/fs/cgroup") || found.is_none() {
                found = Some(mp);
            }
        }
    }
    found
}

/// A policy compiled, loaded and attached to a real cgroup: a process in it opens /dev/null
/// and /dev/zero but not the disk, and may mknod it but not open the node it made.
fn the_device_program_is_enforced_by_the_kernel() -> Result<()> {
    let Some(mount) = unified_mount() else {
        eprintln!("no cgroup2 hierarchy on this machine: the program is tried in the v2 lane");
        return Ok(());
    };
    let d = disk()?;
    let (disk, major, minor) = (&d.node, d.major, d.minor);
    let dir = mount
        .join(env().cgroup.path().trim_start_matches('/'))
        .join(format!("devprog-{}", ferrolet_fsutil::random_hex(4)));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let res = (|| {
        let policy = Policy::from_rules(&devices::default_rules()).map_err(anyhow::Error::msg)?;
        let prog = bpf::load(&program::compile(&policy)).map_err(anyhow::Error::msg)?;
        bpf::attach(&prog, &dir).map_err(anyhow::Error::msg)?;
        // mknod into a directory of the root dir (a filesystem without nodev)
        let scratch = env().root.join(format!("devnodes-{}", ferrolet_fsutil::random_hex(4)));
        std::fs::create_dir_all(&scratch)?;
        let script = format!(
            "cat /dev/null && head -c 4 /dev/zero | wc -c && echo null-ok; \
             head -c 1 {disk} >/dev/null 2>&1 && echo disk-read; \
             mknod {s}/disk b {major} {minor} && echo mknod-ok; \
             head -c 1 {s}/disk 2>&1 >/dev/null; \
             mknod {s}/mem c 1 1 && head -c 1 {s}/mem 2>&1 >/dev/null; true",
            disk = disk.display(),
            s = scratch.display()
        );
        let procs = CString::new(dir.join("cgroup.procs").into_os_string().into_encoded_bytes())?;
        let mut cmd = Command::new("/bin/busybox");
        cmd.args(["sh", "-c", &script]);
        // SAFETY: only async-signal-safe calls between fork and exec: open, write, close.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, b"0".as_ptr() as *const libc::c_void, 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(())
            });
        }
        let out = cmd.output().context("running busybox in the cgroup")?;
        let _ = std::fs::remove_dir_all(&scratch);
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        ensure!(text.contains("4\nnull-ok"), "the allowed devices failed: {text}");
        ensure!(!text.contains("disk-read"), "the host's disk was readable: {text}");
        ensure!(
            text.contains("mknod-ok"),
            "mknod is allowed by the default rules: {text}"
        );
        ensure!(
            text.matches("Operation not permitted").count() == 2,
            "the disk node and /dev/mem should both be refused with EPERM: {text}"
        );
        Ok(())
    })();
    let _ = std::fs::remove_dir(&dir);
    res
}

/// The escape of issue 30: an unprivileged container (with CAP_MKNOD, as containerd's default
/// set has it) makes a node with the host disk's numbers; opening it fails with EPERM, on v1
/// by the devices controller, on v2 by the program; the default devices still work.
fn a_container_cannot_open_the_disk_it_mknods() -> Result<()> {
    let d = disk()?;
    let script = format!(
        "mknod /dev/hostdisk b {} {} && echo mknod-ok; \
         if head -c 512 /dev/hostdisk >/dev/null; then echo READ-THE-DISK; fi; \
         if (echo x > /dev/hostdisk); then echo WROTE-THE-DISK; fi; \
         echo hi > /dev/null && head -c 8 /dev/urandom | wc -c && echo defaults-ok",
        d.major, d.minor
    );
    let cfg = config("mknod-disk", &["sh", "-c", &script]);
    let (exit, out, err) = block(run(&cfg))?;
    let text = format!("{}\n{}", out.join("\n"), err.join("\n"));
    ensure!(exit.exit_code == 0, "exit {}: {text}", exit.exit_code);
    ensure!(text.contains("mknod-ok"), "mknod failed: {text}");
    ensure!(
        !text.contains("READ-THE-DISK") && !text.contains("WROTE-THE-DISK"),
        "{text}"
    );
    ensure!(
        text.matches("Operation not permitted").count() == 2,
        "reading and writing the node should fail with EPERM: {text}"
    );
    ensure!(text.contains("8\ndefaults-ok"), "the default devices: {text}");
    Ok(())
}

/// A device given with `r` only: readable at its container path, not writable, and the
/// disk's other numbers stay refused.
fn a_device_the_config_names_is_usable_with_its_access_only() -> Result<()> {
    let d = disk()?;
    let (major, minor) = (d.major, d.minor);
    let mut cfg = config(
        "given-device",
        &[
            "sh",
            "-c",
            &format!(
                "head -c 4096 /dev/xdisk | od -An -v -tx1 | tr -d ' \\n'; echo; \
                 if (echo x >> /dev/xdisk); then echo WROTE; fi; \
                 mknod /dev/other b {major} {} && head -c 1 /dev/other 2>&1 >/dev/null; true",
                minor + 1
            ),
        ],
    );
    cfg.devices.push(Device {
        host_path: d.node.clone(),
        container_path: "/dev/xdisk".into(),
        permissions: "r".into(),
    });
    let (exit, out, err) = block(run(&cfg))?;
    let text = format!("{}\n{}", out.join("\n"), err.join("\n"));
    ensure!(exit.exit_code == 0, "exit {}: {text}", exit.exit_code);
    ensure!(
        out.first() == Some(&d.head),
        "the given device read differently: {text}"
    );
    ensure!(!text.contains("WROTE"), "{text}");
    ensure!(
        text.matches("Operation not permitted").count() == 2,
        "writing the given device and opening another one should fail with EPERM: {text}"
    );
    // a bad device is refused naming the field
    let mut bad = config("bad-device", &["true"]);
    bad.devices.push(Device {
        host_path: "/etc/hostname".into(),
        container_path: "/dev/x".into(),
        permissions: "r".into(),
    });
    let e = block(env().rt.create(&bad)).err().context("a file is not a device")?;
    ensure!(e.to_string().contains("devices[0].hostPath"), "{e}");
    bad.devices[0].host_path = "/dev/null".into();
    bad.devices[0].permissions = "rx".into();
    let e = block(env().rt.create(&bad)).err().context("x is no access")?;
    ensure!(e.to_string().contains("devices[0].permissions"), "{e}");
    Ok(())
}

/// A privileged container has the host's device nodes and may use them: it reads the disk's
/// first block as the host does.
fn a_privileged_container_reads_the_disk() -> Result<()> {
    let d = disk()?;
    let mut cfg = config(
        "privileged-disk",
        &[
            "sh",
            "-c",
            &format!(
                "head -c 4096 {} | od -An -v -tx1 | tr -d ' \\n'; echo",
                d.node.display()
            ),
        ],
    );
    cfg.privileged = true;
    let (exit, out, err) = block(run(&cfg))?;
    ensure!(exit.exit_code == 0, "exit {}: {out:?} {err:?}", exit.exit_code);
    ensure!(out.first() == Some(&d.head), "read {out:?} {err:?}");
    Ok(())
}

