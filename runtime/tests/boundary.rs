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
use ferrolet_runtime::{fork_zygote, ExecIo, ExecSpec};
use std::time::Duration;

fn main() {
    // The hold of the sealed-binary test: this binary, started inside a container as the
    // interpreter of a `#!/proc/self/exe` script, waits there for the test to try it.
    if std::env::var_os("FERROLET_TEST_HOLD").is_some() {
        hold();
    }
    // As the agent: the zygote runs from a sealed copy of the binary.
    ferrolet_runtime::exe_seal::reexec_sealed().expect("re-executing from a sealed copy");
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
        trial(
            "the_runtime_binary_cannot_be_written_from_a_container",
            the_runtime_binary_cannot_be_written_from_a_container,
        ),
        trial(
            "root_in_a_user_namespace_is_root_only_inside",
            root_in_a_user_namespace_is_root_only_inside,
        ),
        trial(
            "an_images_passwd_cannot_crash_the_runtime_or_reach_the_node",
            an_images_passwd_cannot_crash_the_runtime_or_reach_the_node,
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

/// In a container, as the interpreter of `#!/proc/self/exe`: say so, then wait for stdin to
/// close.
fn hold() -> ! {
    use std::io::{Read, Write};
    let _ = writeln!(std::io::stdout(), "held");
    let _ = std::io::stdout().flush();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    std::process::exit(0);
}

/// Size, modification and change times.
type FileStamp = (u64, i64, i64, i64, i64);

/// The host file this test binary was started from (before it re-executed from its sealed
/// copy), and what any write to it would change: its size, modification and change times
/// (hashing the whole file took seconds, and minutes in the emulated guest).
fn own_binary() -> Result<(PathBuf, FileStamp)> {
    use std::os::unix::fs::MetadataExt;
    let path = std::fs::canonicalize(std::env::args_os().next().context("argv[0]")?)?;
    let m = std::fs::metadata(&path)?;
    Ok((path, (m.size(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec())))
}

/// The read-only binds that let this (dynamically linked) binary run in the busybox image:
/// the machine's library directories at the same paths, as an image with a C library would
/// have them.
fn library_binds() -> Vec<ferrolet_runtime::config::Mount> {
    ["/lib64", "/lib", "/usr/lib"]
        .iter()
        .filter_map(|d| {
            let real = std::fs::canonicalize(d).ok()?;
            real.is_dir().then(|| common::read_only_bind(d, &real))
        })
        .collect()
}

/// CVE-2019-5736 as it was done to runc: the container holds a script starting
/// `#!/proc/self/exe`; exec'ing it makes the kernel run the runtime's own binary (what the
/// exec'd process was) inside the container, where an attacker process finds it by
/// `/proc/<pid>/exe`, opens it, and writes through the link while it runs and, through an fd
/// kept open, after it has exited. Every write must fail and the host's file stay as it was.
fn the_runtime_binary_cannot_be_written_from_a_container() -> Result<()> {
    let (host_binary, before) = own_binary()?;
    let rt = &env().rt;
    let mut cfg = config(
        "exe-attack",
        &[
            "sh",
            "-c",
            "printf '#!/proc/self/exe\\n' > /evil && chmod +x /evil && exec sleep 600",
        ],
    );
    cfg.mounts = library_binds();
    block(async {
        let id = rt.create(&cfg).await?.id().to_string();
        let res = async {
            rt.start(&id).await?;
            // the script is there once the container runs
            let mut ready = false;
            for _ in 0..100 {
                let o = rt
                    .exec_capture(&id, &exec(&["test", "-x", "/evil"]), Some(Duration::from_secs(10)), 1024)
                    .await?;
                if o.exit_code == 0 {
                    ready = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            ensure!(ready, "the container did not write /evil");
            // 1. the runtime's binary, running in the container, held there
            let (stdin_r, stdin_w) = nix::unistd::pipe()?;
            let (out_r, out_w) = nix::unistd::pipe()?;
            let devnull = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
            let mut evil = exec(&["/evil"]);
            evil.env.push(("FERROLET_TEST_HOLD".into(), "1".into()));
            let held = rt
                .exec(
                    &id,
                    &evil,
                    ExecIo {
                        stdin: stdin_r,
                        stdout: out_w,
                        stderr: devnull.into(),
                    },
                )
                .await?;
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(std::fs::File::from(out_r)), &mut line)?;
            ensure!(line.trim() == "held", "the interpreter did not start: {line:?}");
            // 2. the attacker: find it, write through its exe link, keep an fd for later
            let attack = r#"
                for p in /proc/[0-9]*; do
                  exe=$(readlink $p/exe) || continue
                  case "$exe" in /bin/busybox) continue;; esac
                  echo "target ${p#/proc/} $exe $(head -c 4 $p/exe | od -An -c | tr -d ' ')"
                  if (echo x >> $p/exe) 2>/tmp/now.err; then echo WROTE-WHILE-RUNNING; fi
                  cat /tmp/now.err
                  (exec 3< $p/exe
                   while [ ! -e /tmp/released ]; do sleep 0.05; done
                   if (echo x >> /proc/self/fd/3) 2>/tmp/late.err; then echo WROTE-AFTER-EXIT; else cat /tmp/late.err; fi > /tmp/late.out
                  ) </dev/null >/dev/null 2>&1 &
                done
            "#;
            let o = rt
                .exec_capture(&id, &exec(&["sh", "-c", attack]), Some(Duration::from_secs(20)), 1 << 16)
                .await?;
            let first = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
            // 3. the interpreter exits; the kept fd is tried
            drop(stdin_w);
            let code = tokio::time::timeout(Duration::from_secs(20), held.wait()).await??;
            ensure!(code == 0, "the held interpreter exited {code}");
            rt.exec_capture(&id, &exec(&["touch", "/tmp/released"]), Some(Duration::from_secs(10)), 1024)
                .await?;
            let mut late = String::new();
            for _ in 0..200 {
                let o = rt
                    .exec_capture(&id, &exec(&["cat", "/tmp/late.out"]), Some(Duration::from_secs(10)), 1 << 12)
                    .await?;
                if o.exit_code == 0 && !o.stdout.is_empty() {
                    late = String::from_utf8_lossy(&o.stdout).into_owned();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok::<_, anyhow::Error>((first, late))
        }
        .await;
        rt.delete(&id).await?;
        let (first, late) = res?;
        eprintln!("attack while running:\n{first}after exit: {late}");
        ensure!(
            first.contains("target ") && first.contains("177ELF"),
            "the attacker never reached the binary (the attack would prove nothing): {first}"
        );
        ensure!(!first.contains("WROTE") && !late.contains("WROTE"), "{first}\n{late}");
        let refused = |t: &str| t.contains("Read-only file system") || t.contains("Operation not permitted");
        ensure!(
            refused(&first) && refused(&late),
            "not refused as a sealed copy refuses: {first}\n{late}"
        );
        let (_, after) = own_binary()?;
        ensure!(before == after, "{} changed", host_binary.display());
        Ok(())
    })
}

fn exec(args: &[&str]) -> ExecSpec {
    ExecSpec {
        args: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// A user namespace pinned with the pod's other namespaces, mapping 0-65535 to `host`: a
/// container joining it is root inside (`id` 0, its image's files its own, through idmapped
/// layers) and an unprivileged id on the host: it cannot write a root-owned host file a bind
/// mount shows it, while an idmapped bind of a root-owned directory is its own. An idmapped
/// bind of a filesystem that takes none is refused naming the feature.
fn root_in_a_user_namespace_is_root_only_inside() -> Result<()> {
    use ferrolet_runtime::config::{NamespaceMode, UserNamespace};
    use ferrolet_runtime::namespaces::{IdRange, Pins};
    use std::os::unix::fs::MetadataExt;
    let e = env();
    let range = IdRange {
        host: 2_000_000_000 + (std::process::id() % 1000) * 65536,
        size: 65536,
    };
    let sandbox = e.root.join(format!("userns-{}", ferrolet_fsutil::random_hex(4)));
    let pins = Pins {
        hostname: Some("userns".into()),
        net: true,
        ipc: true,
        uts: true,
        user: Some(range),
        ..Default::default()
    };
    block(e.rt.pin_namespaces(&sandbox, &pins))?;
    let host_dir = e.root.join(format!("hostpath-{}", ferrolet_fsutil::random_hex(4)));
    let vol_dir = e.root.join(format!("volume-{}", ferrolet_fsutil::random_hex(4)));
    let res = (|| {
        std::fs::create_dir_all(&host_dir)?;
        std::fs::write(host_dir.join("file"), "host root's\n")?;
        std::fs::create_dir_all(&vol_dir)?;
        let script = "echo id=$(id -u):$(id -g); cat /proc/self/uid_map | tr -s ' ' | sed 's/^ //'; \
            echo image=$(stat -c %u:%g /bin/busybox); touch /made && echo rootfs-write-ok; \
            if (echo x >> /host/file); then echo WROTE-HOST-FILE; fi; \
            if touch /host/new; then echo MADE-HOST-FILE; fi; \
            touch /vol/made && echo volume=$(stat -c %u:%g /vol/made); \
            echo host=$(stat -c %u:%g /host/file)";
        let mut cfg = config("userns", &["sh", "-c", script]);
        cfg.user_namespace = Some(UserNamespace {
            path: sandbox.join("user"),
            range,
        });
        cfg.namespaces.network = NamespaceMode::Path(sandbox.join("net"));
        cfg.namespaces.ipc = NamespaceMode::Path(sandbox.join("ipc"));
        cfg.namespaces.uts = NamespaceMode::Path(sandbox.join("uts"));
        let mut host = common::read_only_bind("/host", &host_dir);
        host.readonly = false;
        let mut vol = common::read_only_bind("/vol", &vol_dir);
        vol.readonly = false;
        vol.idmap = true;
        cfg.mounts = vec![host, vol];
        let info = block(e.rt.create(&cfg))?;
        let id = info.id().to_string();
        let upper = e.rt.upper_dir(&id);
        let run = block(async {
            let init = e.rt.inspect(&id)?.monitor.map(|m| m.init_pid).unwrap_or(0);
            let status = std::fs::read_to_string(format!("/proc/{init}/status"))?;
            let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or("").to_string();
            e.rt.start(&id).await?;
            let exit = e.rt.wait(&id).await?;
            let (out, err) = common::output(&cfg.log.path)?;
            Ok::<_, anyhow::Error>((exit, out, err, uid_line))
        });
        let made = std::fs::metadata(upper.join("made")).map(|m| (m.uid(), m.gid()));
        block(e.rt.delete(&id))?;
        let (exit, out, err, uid_line) = run?;
        let text = format!("{}\n{}", out.join("\n"), err.join("\n"));
        ensure!(exit.exit_code == 0, "exit {}: {text}", exit.exit_code);
        ensure!(text.contains("id=0:0\n"), "root inside: {text}");
        ensure!(text.contains(&format!("0 {} 65536", range.host)), "the map: {text}");
        ensure!(
            uid_line.split_whitespace().skip(1).all(|u| u == range.host.to_string()),
            "on the host its init runs as {}: {uid_line}",
            range.host
        );
        ensure!(
            text.contains("image=0:0\n"),
            "the image's files are root's inside: {text}"
        );
        ensure!(text.contains("rootfs-write-ok"), "{text}");
        ensure!(
            made.as_ref().ok() == Some(&(range.host, range.host)),
            "a file root made in the container is the pod's first host id's on the host: {made:?}"
        );
        ensure!(
            !text.contains("WROTE-HOST-FILE") && !text.contains("MADE-HOST-FILE"),
            "{text}"
        );
        ensure!(
            text.matches("Permission denied").count() == 2,
            "the root-owned host file and directory refuse it: {text}"
        );
        ensure!(
            text.contains("host=65534:65534"),
            "host root's files are nobody's inside: {text}"
        );
        ensure!(
            text.contains("volume=0:0"),
            "the idmapped volume is root's inside: {text}"
        );
        let on_host = std::fs::metadata(vol_dir.join("made"))?;
        ensure!((on_host.uid(), on_host.gid()) == (0, 0), "and host root's on the host");
        // an exec'd process joins the user namespace too, as root or as another user inside
        let mut sleeper = config("userns-exec", &["sleep", "600"]);
        sleeper.user_namespace = cfg.user_namespace.clone();
        sleeper.namespaces = cfg.namespaces.clone();
        let sid = block(e.rt.create(&sleeper))?.id().to_string();
        let execs = block(async {
            e.rt.start(&sid).await?;
            let probe = "echo id=$(id -u):$(id -g) map=$(cat /proc/self/uid_map | tr -s ' ' | sed 's/^ //'); grep CapEff /proc/self/status";
            let mut as_root = exec(&["sh", "-c", probe]);
            let root =
                e.rt.exec_capture(&sid, &as_root, Some(Duration::from_secs(10)), 4096)
                    .await?;
            as_root.user = Some((1000, 1000));
            let user =
                e.rt.exec_capture(&sid, &as_root, Some(Duration::from_secs(10)), 4096)
                    .await?;
            Ok::<_, anyhow::Error>((root, user))
        });
        block(e.rt.delete(&sid))?;
        let (root, user) = execs?;
        let (root, user) = (
            String::from_utf8_lossy(&root.stdout),
            String::from_utf8_lossy(&user.stdout),
        );
        let map = format!("map=0 {} 65536", range.host);
        ensure!(root.contains(&format!("id=0:0 {map}")), "exec'd as root: {root}");
        ensure!(
            !root.contains("CapEff:\t0000000000000000"),
            "root inside keeps the container's capabilities: {root}"
        );
        ensure!(user.contains(&format!("id=1000:1000 {map}")), "exec'd as 1000: {user}");
        ensure!(
            user.contains("CapEff:\t0000000000000000"),
            "another user has none: {user}"
        );
        // an idmapped bind of a filesystem without idmapped mounts: refused, naming why
        let mut bad = config("userns-bad", &["true"]);
        bad.user_namespace = cfg.user_namespace.clone();
        bad.namespaces = cfg.namespaces.clone();
        let mut sys = common::read_only_bind("/k", Path::new("/sys/kernel"));
        sys.idmap = true;
        bad.mounts = vec![sys];
        let err = block(e.rt.create(&bad)).err().context("an idmapped sysfs")?;
        ensure!(err.to_string().contains("idmapped mounts need Linux 5.12"), "{err}");
        Ok(())
    })();
    let _ = ferrolet_runtime::Runtime::unpin_namespaces(&sandbox);
    let _ = std::fs::remove_dir_all(&sandbox);
    let _ = std::fs::remove_dir_all(&host_dir);
    let _ = std::fs::remove_dir_all(&vol_dir);
    res
}

/// Images that attack the user lookup, which reads every container's image /etc/passwd
/// whatever its user: a symlink cycle (was a stack overflow at every start), a passwd larger
/// than anything read (was read whole), and an /etc that links to the node's /etc (was
/// followed, so the node's users became the container's). Each is refused or ignored with a
/// clear error; the runtime goes on.
fn an_images_passwd_cannot_crash_the_runtime_or_reach_the_node() -> Result<()> {
    use common::LayerEntry::{Dir, File, Symlink};
    let e = env();
    let busybox = std::fs::read("/bin/busybox").context("busybox-static")?;
    let base = || {
        vec![
            Dir("bin".into()),
            File("bin/busybox".into(), busybox.clone()),
            Symlink("bin/sh".into(), "busybox".into()),
            Symlink("bin/id".into(), "busybox".into()),
        ]
    };
    // each image's User is a name, which only its /etc/passwd can resolve
    let images: Vec<(&str, &str, Vec<common::LayerEntry>)> = vec![
        ("localhost/passwd-cycle:1", "daemon", {
            let mut v = base();
            v.extend([
                Dir("etc".into()),
                Symlink("etc/passwd".into(), "p2".into()),
                Symlink("etc/p2".into(), "passwd".into()),
            ]);
            v
        }),
        ("localhost/passwd-huge:1", "root", {
            let mut v = base();
            let mut big = b"root:x:0:0:root:/root:/bin/sh\n".repeat(200_000);
            big.truncate(5 << 20);
            v.extend([Dir("etc".into()), File("etc/passwd".into(), big)]);
            v
        }),
        ("localhost/etc-to-node:1", "daemon", {
            let mut v = base();
            v.push(Symlink("etc".into(), "/etc".into()));
            v
        }),
    ];
    for (name, user, entries) in &images {
        let dir = e.root.join(format!("img-{}", ferrolet_fsutil::random_hex(4)));
        common::write_oci_image(&dir, name, entries, user)?;
        e.rt.images()
            .import(&dir)
            .with_context(|| format!("importing {name}"))?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    let container = |image: &str, uid: Option<u32>| {
        let mut c = config("hostile", &["sh", "-c", "id -u"]);
        c.image = image.to_string();
        c.user.uid = uid;
        c
    };
    for (image, why) in [
        ("localhost/passwd-cycle:1", "too many levels of symbolic links"),
        ("localhost/passwd-huge:1", "more than the"),
        // the node has a daemon user (the old lookup followed the link on the node and found
        // it); resolved in the image, /etc -> /etc is itself, a loop
        ("localhost/etc-to-node:1", "too many levels of symbolic links"),
    ] {
        // the image's named user: refused, saying why
        let err = block(e.rt.create(&container(image, None)))
            .err()
            .with_context(|| format!("{image}: its user resolved"))?;
        ensure!(err.to_string().contains(why), "{image}: {err}");
        // a numeric user needs no lookup: the container runs
        let (exit, out, err) = block(run(&container(image, Some(1000))))?;
        ensure!(
            exit.exit_code == 0 && out == ["1000"],
            "{image}: {exit:?} {out:?} {err:?}"
        );
    }
    // and the runtime is there for everyone else
    let (exit, ..) = block(run(&config("after-hostile", &["true"])))?;
    ensure!(exit.exit_code == 0);
    Ok(())
}
