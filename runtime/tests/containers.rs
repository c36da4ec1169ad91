//! Real containers through the runtime crate, as root: images, logs, exit codes, env/args,
//! user and workingDir, read-only rootfs, masked paths, exec, cgroup limits, stats, re-adoption
//! after the owning process is SIGKILLed, and rejection of bad archives.
//!
//! `harness = false`: the zygote must be forked while the process has one thread, before the
//! test runner starts its pool. Everything is created under a temp root and a cgroup nested in
//! this process's own; both are removed at the end, pass or fail.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use ferrolet_runtime::cgroups::NestedRoot;
use ferrolet_runtime::config::{LogConfig, SeccompProfile};
use ferrolet_runtime::digest::Digest;
use ferrolet_runtime::{
    fork_zygote, AttachOptions, AttachOutput, ContainerConfig, ContainerState, ExecIo, ExecSpec, Runtime,
};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

mod common;

use common::{block, config, env, mount_tmpfs, output, read_only_bind, run, run_built, trial, IMAGE};

/// A second zygote, forked while the process was single-threaded, for the test that needs a
/// runtime of its own (a root on a filesystem it can fill).
static SPARE_ZYGOTE: std::sync::Mutex<Option<ferrolet_runtime::ZygoteHandle>> = std::sync::Mutex::new(None);

fn main() {
    if let Ok(spec) = std::env::var("FERROLET_TEST_CHILD") {
        child_main(&spec);
    }
    let zygote = fork_zygote().expect("fork zygote (must be single-threaded here)");
    let spare = fork_zygote().expect("fork the spare zygote");
    *SPARE_ZYGOTE.lock().unwrap() = Some(spare);
    let args = common::setup("rt-test", zygote);

    let tests = vec![
        trial("images_import_oci_and_docker_save", images_import_oci_and_docker_save),
        trial("images_corrupt_blob_is_rejected", images_corrupt_blob_is_rejected),
        trial(
            "images_layer_escaping_root_is_rejected",
            images_layer_escaping_root_is_rejected,
        ),
        trial("stdout_and_stderr_in_cri_log", stdout_and_stderr_in_cri_log),
        trial("exit_codes_0_3_and_sigkill", exit_codes_0_3_and_sigkill),
        trial("env_and_args_merging", env_and_args_merging),
        trial("working_dir_and_user", working_dir_and_user),
        trial("readonly_rootfs_refuses_writes", readonly_rootfs_refuses_writes),
        trial("masked_paths_are_unreadable", masked_paths_are_unreadable),
        trial(
            "seccomp_notify_profile_is_refused_at_creation",
            seccomp_notify_profile_is_refused_at_creation,
        ),
        trial("exec_in_running_container", exec_in_running_container),
        trial(
            "exec_that_never_starts_fails_within_its_bound",
            exec_that_never_starts_fails_within_its_bound,
        ),
        trial("memory_limit_in_cgroup_and_cleanup", memory_limit_in_cgroup_and_cleanup),
        trial(
            "warming_cgroup_migrations_moves_nothing",
            warming_cgroup_migrations_moves_nothing,
        ),
        trial("stats_of_busy_container", stats_of_busy_container),
        trial(
            "memory_limit_is_enforced_oom_killed",
            memory_limit_is_enforced_oom_killed,
        ),
        trial("cpu_and_pids_limits_are_enforced", cpu_and_pids_limits_are_enforced),
        trial(
            "monitor_and_zygote_show_their_names_in_ps",
            monitor_and_zygote_show_their_names_in_ps,
        ),
        trial(
            "an_idle_containers_monitor_does_not_wake_up",
            an_idle_containers_monitor_does_not_wake_up,
        ),
        trial(
            "a_monitor_runs_the_monitor_program_not_a_copy_of_the_agent",
            a_monitor_runs_the_monitor_program_not_a_copy_of_the_agent,
        ),
        trial(
            "containers_survive_owner_sigkill_and_are_readopted",
            containers_survive_owner_sigkill_and_are_readopted,
        ),
        trial(
            "unreadable_records_of_a_running_container",
            unreadable_records_of_a_running_container,
        ),
        trial(
            "unreadable_records_of_an_exited_container",
            unreadable_records_of_an_exited_container,
        ),
        trial(
            "a_created_container_whose_monitor_record_is_unreadable_reads_created",
            a_created_container_whose_monitor_record_is_unreadable_reads_created,
        ),
        trial(
            "records_of_another_boot_after_a_power_loss",
            records_of_another_boot_after_a_power_loss,
        ),
        trial(
            "container_whose_monitor_died_is_not_exited_while_it_runs",
            container_whose_monitor_died_is_not_exited_while_it_runs,
        ),
        trial(
            "a_reused_state_gives_way_to_a_replaced_record",
            a_reused_state_gives_way_to_a_replaced_record,
        ),
        trial(
            "container_without_records_is_found_by_cgroup_and_mount",
            container_without_records_is_found_by_cgroup_and_mount,
        ),
        trial(
            "exec_runs_confined_like_the_container",
            exec_runs_confined_like_the_container,
        ),
        trial(
            "exec_tty_runs_on_a_container_terminal",
            exec_tty_runs_on_a_container_terminal,
        ),
        trial("attach_to_a_tty_container", attach_to_a_tty_container),
        trial(
            "attach_stdin_once_closes_stdin_on_detach",
            attach_stdin_once_closes_stdin_on_detach,
        ),
        trial(
            "attach_stdin_and_tagged_output_to_several_attachers",
            attach_stdin_and_tagged_output_to_several_attachers,
        ),
        trial("attach_refusals", attach_refusals),
        trial(
            "containers_are_built_without_the_other_containers_mounts",
            containers_are_built_without_the_other_containers_mounts,
        ),
        trial(
            "the_root_becomes_a_private_mount_only_with_nothing_below",
            the_root_becomes_a_private_mount_only_with_nothing_below,
        ),
        trial(
            "attach_stdin_once_on_a_terminal_hangs_up_on_detach",
            attach_stdin_once_on_a_terminal_hangs_up_on_detach,
        ),
        trial(
            "slow_attacher_does_not_stall_the_log",
            slow_attacher_does_not_stall_the_log,
        ),
        trial(
            "creations_failing_at_every_step_leave_nothing_behind",
            creations_failing_at_every_step_leave_nothing_behind,
        ),
    ];
    common::finish(&args, tests);
}

fn images_import_oci_and_docker_save() -> Result<()> {
    let e = env();
    let store = e.rt.images();
    let oci = store.find("busybox:1.35")?;
    ensure!(
        oci.refs.contains(&"docker.io/library/busybox:latest".to_string()),
        "refs: {:?}",
        oci.refs
    );
    let imported = store.import(&e.images.join("busybox.docker.tar"))?;
    ensure!(imported.len() == 1);
    let docker = store.find("localhost/busybox-docker:1.35")?;
    ensure!(
        docker.id == oci.id,
        "same config, same image id: {} vs {}",
        docker.id,
        oci.id
    );
    ensure!(store.resolve("busybox")?.layer_dirs.iter().all(|d| d.is_dir()));
    // The docker-save name runs a container too.
    let mut cfg = config("docker-save", &["echo", "from-docker-archive"]);
    cfg.image = "localhost/busybox-docker:1.35".into();
    let (exit, out, _) = block(run(&cfg))?;
    ensure!(
        exit.exit_code == 0 && out == ["from-docker-archive"],
        "{exit:?} {out:?}"
    );
    // Untag the second name: the image stays for the first.
    store.remove("localhost/busybox-docker:1.35", &[])?;
    ensure!(store.find("busybox:1.35").is_ok());
    ensure!(store.find("localhost/busybox-docker:1.35").is_err());
    Ok(())
}

/// Unpack the OCI tar into a directory we can tamper with.
fn oci_dir(tag: &str) -> Result<PathBuf> {
    let dir = env().root.join(format!("tamper-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    tar::Archive::new(std::fs::File::open(env().images.join("busybox.oci.tar"))?).unpack(&dir)?;
    Ok(dir)
}

fn images_corrupt_blob_is_rejected() -> Result<()> {
    let dir = oci_dir("corrupt")?;
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("index.json"))?)?;
    let manifest = index["manifests"][0]["digest"].as_str().unwrap().to_string();
    let path = dir.join("blobs/sha256").join(manifest.trim_start_matches("sha256:"));
    let mut data = std::fs::read(&path)?;
    data[10] ^= 0x20;
    std::fs::write(&path, data)?;
    let err = env()
        .rt
        .images()
        .import(&dir)
        .expect_err("a corrupt blob must be rejected")
        .to_string();
    ensure!(
        err.contains(&manifest) && err.contains("hashes to"),
        "error should name the blob: {err}"
    );
    Ok(())
}

fn images_layer_escaping_root_is_rejected() -> Result<()> {
    let dir = env().root.join("evil-image");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("blobs/sha256"))?;
    // A layer with an entry named ../evil, written raw as a hostile archive would.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    let name = b"../evil";
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_size(4);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    b.append(&h, &b"evil"[..])?;
    let layer = b.into_inner()?;
    let put = |data: &[u8]| -> Result<Digest> {
        let d = Digest::of(data);
        std::fs::write(dir.join("blobs/sha256").join(d.hex()), data)?;
        Ok(d)
    };
    let layer_d = put(&layer)?;
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{"Cmd":["sh"]}},"rootfs":{{"type":"layers","diff_ids":["{layer_d}"]}}}}"#
    );
    let config_d = put(config.as_bytes())?;
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_d}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{layer_d}","size":{}}}]}}"#,
        config.len(),
        layer.len()
    );
    let manifest_d = put(manifest.as_bytes())?;
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)?;
    std::fs::write(
        dir.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{manifest_d}","size":{},"annotations":{{"io.containerd.image.name":"localhost/evil:1"}}}}]}}"#,
            manifest.len()
        ),
    )?;
    let err = env()
        .rt
        .images()
        .import(&dir)
        .expect_err("a layer escaping its root must be rejected")
        .to_string();
    ensure!(
        err.contains("../evil") && err.contains("escapes"),
        "error should name the entry: {err}"
    );
    let layers = env().rt.images().dir().join("layers");
    ensure!(!layers.join("evil").exists(), "nothing written outside the layer");
    // The failed import took its blobs back.
    for d in [layer_d, config_d, manifest_d] {
        ensure!(
            !env().rt.images().blob_path(&d).exists(),
            "blob {d} of the failed import is still stored"
        );
    }
    // Unpacked layers and mounted root filesystems are the owner's only.
    use std::os::unix::fs::PermissionsExt;
    for d in [
        env().rt.images().dir().join("layers"),
        env().rt.images().dir().join("blobs"),
        env().root.join("containers"),
    ] {
        let mode = std::fs::metadata(&d)?.permissions().mode() & 0o777;
        ensure!(mode == 0o700, "{} has mode {mode:o}", d.display());
    }
    ensure!(
        env().rt.images().find("localhost/evil:1").is_err(),
        "the image must not be recorded"
    );
    Ok(())
}

fn stdout_and_stderr_in_cri_log() -> Result<()> {
    let cfg = config("logs", &["sh", "-c", "echo hello; echo oops >&2; printf tail"]);
    let (exit, out, err) = block(run(&cfg))?;
    ensure!(exit.exit_code == 0, "{exit:?}");
    ensure!(out == ["hello", "tail"], "stdout {out:?}");
    ensure!(err == ["oops"], "stderr {err:?}");
    let raw = std::fs::read_to_string(&cfg.log.path)?;
    let first = raw.lines().find(|l| l.contains("hello")).unwrap_or_default();
    let parts: Vec<&str> = first.splitn(4, ' ').collect();
    ensure!(
        parts.len() == 4 && parts[1] == "stdout" && parts[2] == "F" && parts[3] == "hello",
        "line {first:?}"
    );
    ensure!(
        chrono::DateTime::parse_from_rfc3339(parts[0]).is_ok(),
        "RFC3339 timestamp in {first:?}"
    );
    // The unterminated last line is partial, as containerd tags it.
    let last = raw.lines().find(|l| l.ends_with(" tail")).unwrap_or_default();
    ensure!(last.contains(" stdout P tail"), "line {last:?}");
    Ok(())
}

fn exit_codes_0_3_and_sigkill() -> Result<()> {
    let (e0, ..) = block(run(&config("exit0", &["sh", "-c", "exit 0"])))?;
    ensure!(e0.exit_code == 0 && e0.signal.is_none(), "{e0:?}");
    let (e3, ..) = block(run(&config("exit3", &["sh", "-c", "exit 3"])))?;
    ensure!(e3.exit_code == 3, "{e3:?}");
    block(async {
        let rt = &env().rt;
        let info = rt.create(&config("killed", &["sleep", "60"])).await?;
        let id = info.id().to_string();
        let r = async {
            rt.start(&id).await?;
            ensure!(matches!(rt.inspect(&id)?.state, ContainerState::Running));
            let e = killed(rt, &id).await?;
            ensure!(e.exit_code == 137 && e.signal == Some(9) && !e.oom_killed, "{e:?}");
            Ok(())
        }
        .await;
        rt.delete(&id).await?;
        r
    })
}

fn env_and_args_merging() -> Result<()> {
    // args only: the image has no Entrypoint, so args are the command.
    let mut c = config("args", &[]);
    c.args = vec!["echo".into(), "a".into(), "b".into()];
    let (_, out, _) = block(run(&c))?;
    ensure!(out == ["a b"], "{out:?}");
    // command + args, env from the image (PATH) and the container (A), one overriding HOME.
    let mut c = config("env", &["sh", "-c"]);
    c.args = vec!["echo \"$A|$PATH|$HOME|$0\"".into(), "zero".into()];
    c.env = vec![("A".into(), "1".into()), ("HOME".into(), "/h".into())];
    let (_, out, _) = block(run(&c))?;
    ensure!(
        out == ["1|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin|/h|zero"],
        "{out:?}"
    );
    // A container value replaces the image's.
    let mut c = config("env-path", &["sh", "-c", "echo $PATH"]);
    c.env = vec![("PATH".into(), "/bin".into())];
    let (_, out, _) = block(run(&c))?;
    ensure!(out == ["/bin"], "{out:?}");
    Ok(())
}

fn working_dir_and_user() -> Result<()> {
    let mut c = config("user", &["sh", "-c", "id; pwd; echo $HOME"]);
    c.user.uid = Some(33);
    c.user.supplemental_groups = vec![100];
    c.working_dir = Some("/var/www".into());
    let (_, out, _) = block(run(&c))?;
    ensure!(out.len() == 3, "{out:?}");
    ensure!(
        out[0].starts_with("uid=33(www-data) gid=33(www-data)") && out[0].contains("100(users)"),
        "{out:?}"
    );
    ensure!(out[1] == "/var/www" && out[2] == "/var/www", "{out:?}");
    // A working dir the image lacks is created.
    let mut c = config("workdir", &["pwd"]);
    c.working_dir = Some("/srv/new/dir".into());
    let (exit, out, _) = block(run(&c))?;
    ensure!(exit.exit_code == 0 && out == ["/srv/new/dir"], "{exit:?} {out:?}");
    Ok(())
}

fn readonly_rootfs_refuses_writes() -> Result<()> {
    let mut c = config("ro", &["sh", "-c", "touch /x && echo wrote; touch /tmp/y || true"]);
    c.readonly_rootfs = true;
    let (exit, out, err) = block(run(&c))?;
    ensure!(out.is_empty(), "must not write: {out:?}");
    ensure!(err.iter().any(|l| l.contains("Read-only file system")), "{err:?}");
    ensure!(exit.exit_code == 0, "{exit:?}");
    Ok(())
}

/// A Localhost profile with a notify action needs a listener ferrolet does not run: creation
/// fails naming `seccomp`, and leaves no container behind.
fn seccomp_notify_profile_is_refused_at_creation() -> Result<()> {
    let profile = env().root.join("notify-profile.json");
    std::fs::write(
        &profile,
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir"],"action":"SCMP_ACT_NOTIFY"}]}"#,
    )?;
    let mut c = config("notify", &["true"]);
    c.seccomp = SeccompProfile::Localhost(profile);
    match block(env().rt.create(&c)) {
        Err(ferrolet_runtime::Error::InvalidConfig { field, reason }) => {
            ensure!(field == "seccomp" && reason.contains("notify"), "{field}: {reason}")
        }
        other => bail!("expected a refusal naming seccomp, got {other:?}"),
    }
    // (other tests create containers meanwhile: look for this one by its name)
    let left: Vec<String> = env()
        .rt
        .list()?
        .into_iter()
        .filter(|i| i.record.name == "notify")
        .map(|i| i.id().to_string())
        .collect();
    ensure!(left.is_empty(), "a refused creation left containers {left:?}");
    Ok(())
}

fn masked_paths_are_unreadable() -> Result<()> {
    // Masked files read as empty inside, though the node has content there (kernels differ in
    // which of the masked files exist: use those this one has).
    let masked: Vec<&str> = ["/proc/keys", "/proc/timer_list", "/proc/kcore", "/proc/sched_debug"]
        .into_iter()
        .filter(|p| std::fs::read(p).map(|d| !d.is_empty()).unwrap_or(false))
        .collect();
    ensure!(
        !masked.is_empty(),
        "no masked /proc file with content on this node to test with"
    );
    let script: String = masked.iter().map(|p| format!("wc -c < {p}; ")).collect::<String>()
        + "echo x > /proc/sys/kernel/domainname || echo ro";
    let c = config("masked", &["sh", "-c", &script]);
    let (_, out, _) = block(run(&c))?;
    let mut want: Vec<String> = masked.iter().map(|_| "0".to_string()).collect();
    want.push("ro".into());
    ensure!(out == want, "masked {masked:?}: {out:?}");
    Ok(())
}

/// Priming writes this (multi-threaded) process into the cgroup it is in: the write must be
/// accepted on this node's layout, and every thread must stay where it was in every hierarchy,
/// with containers created right after it as usual.
fn warming_cgroup_migrations_moves_nothing() -> Result<()> {
    use ferrolet_runtime::migration_warmer::{MigrationWarmer, THREAD_NAME};
    let tasks = || -> Result<std::collections::BTreeMap<String, (String, String)>> {
        let mut v = std::collections::BTreeMap::new();
        for t in std::fs::read_dir("/proc/self/task")? {
            let t = t?.path();
            // (a thread of the test runner may end meanwhile)
            if let (Ok(comm), Ok(c)) = (
                std::fs::read_to_string(t.join("comm")),
                std::fs::read_to_string(t.join("cgroup")),
            ) {
                v.insert(t.display().to_string(), (comm.trim().to_string(), c));
            }
        }
        Ok(v)
    };
    let warm_threads = || -> Result<usize> { Ok(tasks()?.values().filter(|(comm, _)| comm == THREAD_NAME).count()) };
    let wait_for = |want: usize| -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while warm_threads()? != want {
            ensure!(
                Instant::now() < deadline,
                "{} warm threads, not {want}",
                warm_threads()?
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    };
    // A second thread of our own, alive across the warming: the agent that warms has many
    // (and the test runner may run this test on its only one).
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        let _ = wait.recv();
    });
    let r = (|| -> Result<()> {
        let before = tasks()?;
        ensure!(
            before.len() > 1,
            "the test process should have several threads: {before:?}"
        );
        let warmer = MigrationWarmer::new(env().rt.cgroups().clone());
        let hold = warmer.hold();
        let second = warmer.hold();
        wait_for(1)?;
        // Still writing a while later: a warmer that cannot write gives up at once.
        std::thread::sleep(Duration::from_millis(100));
        ensure!(warm_threads()? == 1, "the warm thread stopped while held (or two run)");
        let (exit, out, _) = block(run(&config("warmed", &["echo", "created while warm"])))?;
        ensure!(
            exit.exit_code == 0 && out == ["created while warm"],
            "exit {exit:?}, out {out:?}"
        );
        let after = tasks()?;
        let mut compared = 0;
        for (task, (_, cgroups)) in &after {
            if let Some((_, was)) = before.get(task) {
                ensure!(was == cgroups, "warming moved {task}: from\n{was}to\n{cgroups}");
                compared += 1;
            }
        }
        ensure!(compared > 1, "no thread lived through the warming");
        drop(hold);
        std::thread::sleep(Duration::from_millis(20));
        ensure!(warm_threads()? == 1, "the warm thread stopped while one hold is left");
        drop(second);
        wait_for(0)?;
        // A new hold starts a new spell.
        let again = warmer.hold();
        wait_for(1)?;
        drop(again);
        wait_for(0)
    })();
    drop(done);
    let _ = other.join();
    r
}

/// Processes on the machine whose command line, arguments joined by spaces, is `cmdline`.
fn processes(cmdline: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let args: Vec<String> = c
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if args.join(" ") == cmdline {
                out.push(pid);
            }
        }
    }
    out
}

/// Wait for every process running `cmdline` to be gone.
fn wait_no_process(cmdline: &str, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let left = processes(cmdline);
        if left.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{cmdline:?} still runs after {within:?}: pids {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn exec_in_running_container() -> Result<()> {
    block(async {
        let rt = &env().rt;
        let mut c = config("exec", &["sleep", "60"]);
        c.working_dir = Some("/tmp".into());
        let info = rt.create(&c).await?;
        let id = info.id().to_string();
        let r = async {
            rt.start(&id).await?;
            let spec = ExecSpec {
                args: vec![
                    "sh".into(),
                    "-c".into(),
                    "echo out:$FOO:$(pwd); echo err >&2; exit 4".into(),
                ],
                env: vec![("FOO".into(), "bar".into())],
                ..Default::default()
            };
            let o = rt
                .exec_capture(&id, &spec, Some(Duration::from_secs(10)), 1 << 20)
                .await?;
            ensure!(o.exit_code == 4 && !o.timed_out, "{o:?}");
            ensure!(o.stdout == b"out:bar:/tmp\n" && o.stderr == b"err\n", "{o:?}");
            let slow = ExecSpec {
                args: vec!["sleep".into(), "30".into()],
                ..Default::default()
            };
            let t = Instant::now();
            let o = rt
                .exec_capture(&id, &slow, Some(Duration::from_millis(300)), 1024)
                .await?;
            ensure!(o.timed_out && t.elapsed() < Duration::from_secs(5), "{o:?}");
            // A session that ends before its process (the client went away, the handler was
            // cancelled) takes the process with it: `yes` no longer spins on its own.
            let yes = ExecSpec {
                args: vec!["yes".into(), "ferrolet-dropped-exec".into()],
                ..Default::default()
            };
            let cancelled =
                tokio::time::timeout(Duration::from_millis(500), rt.exec_capture(&id, &yes, None, 1024)).await;
            ensure!(cancelled.is_err(), "yes ended by itself: {cancelled:?}");
            wait_no_process("yes ferrolet-dropped-exec", Duration::from_secs(2))?;
            let null = || std::fs::File::open("/dev/null").map(std::os::fd::OwnedFd::from);
            let io = ExecIo {
                stdin: null()?,
                stdout: std::fs::OpenOptions::new().write(true).open("/dev/null")?.into(),
                stderr: std::fs::OpenOptions::new().write(true).open("/dev/null")?.into(),
            };
            let p = rt.exec(&id, &yes, io).await?;
            ensure!(
                !processes("yes ferrolet-dropped-exec").is_empty(),
                "the exec'd process runs"
            );
            drop(p);
            wait_no_process("yes ferrolet-dropped-exec", Duration::from_secs(2))?;
            // sleep as PID 1 ignores TERM: stop escalates to KILL after the grace period.
            let e = rt.stop(&id, libc::SIGTERM, Duration::from_millis(500)).await?;
            ensure!(e.exit_code == 137, "{e:?}");
            Ok(())
        }
        .await;
        rt.delete(&id).await?;
        r
    })
}

/// An exec whose process can never start: the container's cgroup is frozen, so the process
/// libcontainer starts in it never reports back, and the zygote's worker would wait for it
/// forever. The exec fails once its start timeout has passed, with an error naming the
/// container; the worker ends itself shortly after, its files with it; and once the cgroup
/// thaws, what libcontainer had started finds nobody to report to and ends: the command never
/// runs, and the container takes an exec again.
fn exec_that_never_starts_fails_within_its_bound() -> Result<()> {
    block(async {
        let rt = &env().rt;
        let info = rt.create(&config("exec-frozen", &["sleep", "60"])).await?;
        let id = info.id().to_string();
        let cg = info.record.cgroup_path.clone();
        let (freeze, frozen, thawed) = if rt.cgroups().is_v2() {
            (rt.cgroups().dir_for("", &cg).map(|d| d.join("cgroup.freeze")), "1", "0")
        } else {
            (
                rt.cgroups().dir_for("freezer", &cg).map(|d| d.join("freezer.state")),
                "FROZEN",
                "THAWED",
            )
        };
        let freeze = freeze.ok_or_else(|| anyhow!("no freezer for {cg}"))?;
        let procs = freeze.with_file_name("cgroup.procs");
        let lc_dir = rt.root().join("libcontainer").join(&id);
        let exec_files = || -> Vec<String> {
            std::fs::read_dir(&lc_dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("ferrolet-exec-"))
                .collect()
        };
        let r = async {
            rt.start(&id).await?;
            std::fs::write(&freeze, frozen)?;
            let spec = ExecSpec {
                args: vec!["touch".into(), "/tmp/ran".into()],
                start_timeout: Some(Duration::from_secs(2)),
                ..Default::default()
            };
            let t = Instant::now();
            let exec = rt.exec_capture(&id, &spec, Some(Duration::from_secs(10)), 1024);
            tokio::pin!(exec);
            // The worker's process.json names it, while it waits.
            let mut workers = Vec::new();
            let outcome = loop {
                tokio::select! {
                    o = &mut exec => break o,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {
                        for f in exec_files() {
                            let pid = f.trim_start_matches("ferrolet-exec-").trim_end_matches(".json");
                            if let Ok(pid) = pid.parse::<i32>() {
                                if !workers.contains(&pid) {
                                    workers.push(pid);
                                }
                            }
                        }
                        ensure!(t.elapsed() < Duration::from_secs(30), "the exec still waits after 30 s");
                    }
                }
            };
            let took = t.elapsed();
            let e = match outcome {
                Ok(o) => bail!("an exec ran in a frozen container: {o:?}"),
                Err(e) => e,
            };
            let text = ferrolet_fsutil::chain(&e).to_string();
            ensure!(
                took >= Duration::from_secs(2) && took < Duration::from_secs(5),
                "the exec failed after {took:?}: {text}"
            );
            ensure!(text.contains(&id) && text.contains("did not start within 2s"), "{text}");
            ensure!(!workers.is_empty(), "no worker was seen waiting");
            // The worker ends itself a little later and removes its files.
            let deadline = Instant::now() + Duration::from_secs(6);
            while workers.iter().any(|p| Path::new(&format!("/proc/{p}")).exists()) || !exec_files().is_empty() {
                ensure!(
                    Instant::now() < deadline,
                    "the worker {workers:?} or its files {:?} are still there",
                    exec_files()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            std::fs::write(&freeze, thawed)?;
            // Thawed, what libcontainer had started ends: only the container's own process is
            // left in its cgroup.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let left = std::fs::read_to_string(&procs)?;
                if left.lines().count() == 1 {
                    break;
                }
                ensure!(Instant::now() < deadline, "left in the container's cgroup: {left}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // The command never ran; the container takes an exec again.
            let check = ExecSpec {
                args: vec!["test".into(), "-e".into(), "/tmp/ran".into()],
                ..Default::default()
            };
            let o = rt
                .exec_capture(&id, &check, Some(Duration::from_secs(10)), 1024)
                .await?;
            ensure!(o.exit_code == 1, "the frozen exec ran after all: {o:?}");
            // Nothing of either exec is left in libcontainer's directory of the container (its
            // tenant builder leaves a notify socket per exec; the worker removes those unbound).
            let left: Vec<String> = std::fs::read_dir(&lc_dir)?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("tenant-") || n.starts_with("ferrolet-exec-"))
                .collect();
            ensure!(left.is_empty(), "left in {}: {left:?}", lc_dir.display());
            rt.kill(&id, libc::SIGKILL)?;
            tokio::time::timeout(Duration::from_secs(10), rt.wait(&id)).await??;
            Ok(())
        }
        .await;
        // Never leave the cgroup frozen: its processes could not be killed.
        let _ = std::fs::write(&freeze, thawed);
        if r.is_err() {
            let _ = rt.kill(&id, libc::SIGKILL);
            let _ = tokio::time::timeout(Duration::from_secs(10), rt.wait(&id)).await;
        }
        rt.delete(&id).await?;
        r
    })
}

fn memory_limit_in_cgroup_and_cleanup() -> Result<()> {
    block(async {
        let rt = &env().rt;
        let mut c = config("memlimit", &["sleep", "60"]);
        c.resources.memory_limit = Some(64 << 20);
        c.resources.pids_limit = Some(50);
        let info = rt.create(&c).await?;
        let id = info.id().to_string();
        let cg = info.record.cgroup_path.clone();
        let dir = rt
            .cgroups()
            .dir_for("memory", &cg)
            .ok_or_else(|| anyhow!("no memory controller"))?;
        let r = (|| {
            let (file, want) = if rt.cgroups().is_v2() {
                ("memory.max", "67108864")
            } else {
                ("memory.limit_in_bytes", "67108864")
            };
            let got = std::fs::read_to_string(dir.join(file))?;
            ensure!(got.trim() == want, "{file} = {got}");
            // The limit bounds swap too (kubelet 1.26 without NodeSwap), where swap is accounted.
            let (swap_file, swap_want) = if rt.cgroups().is_v2() {
                ("memory.swap.max", "0")
            } else {
                ("memory.memsw.limit_in_bytes", "67108864")
            };
            match std::fs::read_to_string(dir.join(swap_file)) {
                Ok(got) => ensure!(got.trim() == swap_want, "{swap_file} = {got}"),
                Err(_) => eprintln!("no swap accounting on this kernel: {swap_file} not checked"),
            }
            let pids = rt.cgroups().dir_for("pids", &cg).unwrap();
            ensure!(std::fs::read_to_string(pids.join("pids.max"))?.trim() == "50");
            Ok(())
        })();
        let rootfs = rt.root().join("containers").join(&id).join("rootfs");
        rt.delete(&id).await?;
        r?;
        ensure!(!dir.exists(), "cgroup {} removed", dir.display());
        let mounts = std::fs::read_to_string("/proc/self/mounts")?;
        ensure!(!mounts.contains(&rootfs.display().to_string()), "rootfs unmounted");
        ensure!(!rt.root().join("containers").join(&id).exists(), "state removed");
        Ok(())
    })
}

fn stats_of_busy_container() -> Result<()> {
    block(async {
        let rt = &env().rt;
        let info = rt.create(&config("busy", &["sh", "-c", "while :; do :; done"])).await?;
        let id = info.id().to_string();
        let r = async {
            rt.start(&id).await?;
            tokio::time::sleep(Duration::from_millis(700)).await;
            let s = rt.stats(&id)?;
            ensure!(s.cpu_usage_nanos.unwrap_or(0) > 100_000_000, "cpu {s:?}");
            ensure!(s.memory_usage_bytes.unwrap_or(0) > 0, "memory {s:?}");
            ensure!(s.memory_working_set_bytes.is_some(), "working set {s:?}");
            ensure!(s.pids.unwrap_or(0) >= 1, "pids {s:?}");
            Ok(())
        }
        .await;
        rt.delete(&id).await?;
        r
    })
}

fn memory_limit_is_enforced_oom_killed() -> Result<()> {
    // The shell (the container's init) reads 64 MiB into a variable against a 16 MiB limit.
    let mut c = config(
        "oom",
        &[
            "sh",
            "-c",
            "x=$(head -c 67108864 /dev/zero | tr '\\0' a); echo survived",
        ],
    );
    c.resources.memory_limit = Some(16 << 20);
    let (exit, out, _) = block(run(&c))?;
    ensure!(exit.oom_killed, "the OOM kill is recorded: {exit:?} {out:?}");
    ensure!(
        exit.exit_code == 137 && exit.signal == Some(9),
        "killed by the OOM killer: {exit:?}"
    );
    ensure!(out.is_empty(), "{out:?}");
    Ok(())
}

fn cpu_and_pids_limits_are_enforced() -> Result<()> {
    block(async {
        let rt = &env().rt;
        let mut c = config("limits", &["sh", "-c", "while :; do :; done"]);
        c.resources.cpu_quota = Some(20_000);
        c.resources.cpu_period = Some(100_000);
        c.resources.pids_limit = Some(8);
        let info = rt.create(&c).await?;
        let id = info.id().to_string();
        let cg = info.record.cgroup_path.clone();
        let r = async {
            rt.start(&id).await?;
            let cpu = rt
                .cgroups()
                .dir_for("cpu", &cg)
                .ok_or_else(|| anyhow!("no cpu controller"))?;
            if rt.cgroups().is_v2() {
                ensure!(std::fs::read_to_string(cpu.join("cpu.max"))?.trim() == "20000 100000");
            } else {
                ensure!(std::fs::read_to_string(cpu.join("cpu.cfs_quota_us"))?.trim() == "20000");
            }
            // A busy loop under a 20% quota uses about 0.2 cpu-seconds per second.
            let s0 = rt.stats(&id)?.cpu_usage_nanos.unwrap_or(0);
            tokio::time::sleep(Duration::from_secs(2)).await;
            let used = rt.stats(&id)?.cpu_usage_nanos.unwrap_or(0) - s0;
            ensure!(used < 1_000_000_000, "quota enforced: {used}ns of cpu in 2s");
            ensure!(used > 100_000_000, "it did run: {used}ns");
            // pids.max: a fork bomb in miniature stops at the limit.
            let spec = ExecSpec {
                args: vec![
                    "sh".into(),
                    "-c".into(),
                    "for i in $(seq 20); do sleep 5 & done 2>&1 | head -1; wait".into(),
                ],
                ..Default::default()
            };
            let o = rt.exec_capture(&id, &spec, Some(Duration::from_secs(20)), 4096).await?;
            let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
            ensure!(
                text.contains("can't fork") || text.contains("Resource temporarily unavailable") || o.exit_code != 0,
                "pids.max stops forks: {o:?}"
            );
            Ok(())
        }
        .await;
        rt.delete(&id).await?;
        r
    })
}

/// /proc/PID/cmdline and comm of a process.
fn cmdline_and_comm(pid: i32) -> Result<(Vec<u8>, String)> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).with_context(|| format!("cmdline of {pid}"))?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).with_context(|| format!("comm of {pid}"))?;
    Ok((cmdline, comm.trim_end().to_string()))
}

/// The context switches process `pid` made of its own will (each one a sleep).
fn voluntary_switches(pid: i32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("status of {pid}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow!("no voluntary_ctxt_switches for {pid}"))
}

/// A container in a pid namespace of its own that prints nothing: its orphans all go to its
/// init, so its monitor sleeps in poll until something happens (it once woke every 5 s to reap
/// orphans that never come).
fn an_idle_containers_monitor_does_not_wake_up() -> Result<()> {
    let rt = &env().rt;
    block(async {
        let c = config("quiet-monitor", &["sleep", "60"]);
        ensure!(
            matches!(c.namespaces.pid, ferrolet_runtime::config::NamespaceMode::Private),
            "the test's container should have a pid namespace of its own"
        );
        let info = rt.create(&c).await?;
        let id = info.id().to_string();
        let r = async {
            let m = info.monitor.clone().ok_or_else(|| anyhow!("no monitor record"))?;
            rt.start(&id).await?;
            // Past the start's own work (the monitor answers, settles into its loop).
            tokio::time::sleep(Duration::from_secs(1)).await;
            let before = voluntary_switches(m.monitor_pid)?;
            tokio::time::sleep(Duration::from_secs(6)).await;
            let after = voluntary_switches(m.monitor_pid)?;
            ensure!(after == before, "the idle monitor woke {} times in 6 s", after - before);
            ensure!(rt.inspect(&id)?.is_running());
            rt.kill(&id, libc::SIGKILL)?;
            Ok(())
        }
        .await;
        rt.delete(&id).await?;
        r
    })
}

/// Once its container is built, a monitor executes the small monitor program carried in the
/// binary (a sealed memfd): nothing of the agent's binary or heap is mapped in it any more, it
/// still logs the container's output and records its exit, and the program cannot be written
/// through /proc/<pid>/exe.
fn a_monitor_runs_the_monitor_program_not_a_copy_of_the_agent() -> Result<()> {
    let rt = &env().rt;
    block(async {
        let c = config(
            "monitor-program",
            &["sh", "-c", "echo out; echo err >&2; sleep 1; exit 3"],
        );
        let info = rt.create(&c).await?;
        let id = info.id().to_string();
        let r = async {
            let m = info.monitor.clone().ok_or_else(|| anyhow!("no monitor record"))?;
            // Created is answered by the program: it runs already, named.
            let exe = std::fs::read_link(format!("/proc/{}/exe", m.monitor_pid))?;
            ensure!(
                exe.to_string_lossy().starts_with("/memfd:ferrolet-monitor"),
                "the monitor runs {exe:?}"
            );
            let (_, comm) = cmdline_and_comm(m.monitor_pid)?;
            ensure!(comm == "ferrolet-mon", "monitor comm {comm:?}");
            let own = std::fs::read_link("/proc/self/exe")?;
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", m.monitor_pid))?;
            ensure!(
                !maps.lines().any(|l| l.ends_with(&*own.to_string_lossy())),
                "the monitor still maps the test binary {own:?}"
            );
            let write = std::fs::OpenOptions::new()
                .write(true)
                .open(format!("/proc/{}/exe", m.monitor_pid));
            ensure!(
                write.is_err(),
                "the monitor program is writable through /proc/<pid>/exe"
            );
            rt.start(&id).await?;
            let e = tokio::time::timeout(Duration::from_secs(10), rt.wait(&id)).await??;
            ensure!(e.exit_code == 3, "{e:?}");
            let log = std::fs::read_to_string(&c.log.path)?;
            ensure!(
                log.contains(" stdout F out\n") && log.contains(" stderr F err\n"),
                "log: {log:?}"
            );
            Ok(())
        }
        .await;
        rt.delete(&id).await?;
        r
    })
}

fn monitor_and_zygote_show_their_names_in_ps() -> Result<()> {
    let rt = &env().rt;
    let (cmdline, comm) = cmdline_and_comm(rt.zygote_pid())?;
    ensure!(
        cmdline == b"ferrolet-zygote\0" && comm == "ferrolet-zygote",
        "zygote shows {:?} ({comm})",
        String::from_utf8_lossy(&cmdline)
    );
    let long = "y".repeat(100_000);
    let cases = [
        (
            "web",
            "default/web-node1/nginx",
            "ferrolet-monitor default/web-node1/nginx",
        ),
        ("plain", "", "ferrolet-monitor plain"),
        ("long", long.as_str(), ""),
    ];
    block(async {
        for (name, display, want) in cases {
            let mut c = config(name, &["sleep", "60"]);
            c.display_name = display.to_string();
            let info = rt.create(&c).await?;
            let id = info.id().to_string();
            let r = async {
                let m = info.monitor.clone().ok_or_else(|| anyhow!("no monitor record"))?;
                rt.start(&id).await?;
                let (cmdline, comm) = cmdline_and_comm(m.monitor_pid)?;
                ensure!(comm == "ferrolet-mon", "monitor comm {comm:?}");
                let shown = String::from_utf8_lossy(&cmdline).into_owned();
                if want.is_empty() {
                    // Longer than the inherited argv + environment area (or a page): cut, and
                    // nothing of the agent's command line or environment shows.
                    let title = shown.trim_end_matches('\0');
                    ensure!(
                        title.len() > 100 && title.len() < long.len(),
                        "long title: {} bytes",
                        title.len()
                    );
                    ensure!(
                        title
                            .strip_prefix("ferrolet-monitor ")
                            .is_some_and(|t| t.bytes().all(|b| b == b'y')),
                        "long title: {title:?}"
                    );
                } else {
                    ensure!(cmdline == format!("{want}\0").as_bytes(), "monitor shows {shown:?}");
                    // What ps reads is the cmdline above; cross-check with procps' ps where it is
                    // the ps (the v2 guest has busybox's, which takes no -p).
                    let procps = Command::new("ps")
                        .arg("--version")
                        .output()
                        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("procps"));
                    if let (true, Ok(o)) = (
                        procps,
                        Command::new("ps")
                            .args(["-o", "args=", "-p", &m.monitor_pid.to_string()])
                            .output(),
                    ) {
                        let ps = String::from_utf8_lossy(&o.stdout);
                        ensure!(ps.trim() == want, "ps shows {ps:?}");
                    }
                }
                // The monitor still does its job after renaming itself.
                ensure!(rt.inspect(&id)?.is_running());
                let e = killed(rt, &id).await?;
                ensure!(e.exit_code == 137, "{e:?}");
                Ok(())
            }
            .await;
            rt.delete(&id).await?;
            r?;
        }
        Ok(())
    })
}

/// In a child process: own a runtime, start two containers, print their ids, then hang until
/// killed. `spec` is "root|cgroup parent|log dir".
fn child_main(spec: &str) -> ! {
    let zygote = fork_zygote().expect("zygote");
    let parts: Vec<&str> = spec.split('|').collect();
    let rt = Runtime::new(parts[0], zygote).expect("runtime");
    block(rt.isolate_mounts()).expect("isolating the zygote's mounts");
    let mk = |name: &str, script: &str| ContainerConfig {
        name: name.into(),
        image: IMAGE.into(),
        command: vec!["sh".into(), "-c".into(), script.into()],
        cgroup_parent: parts[1].into(),
        log: LogConfig {
            path: Path::new(parts[2]).join(format!("{name}.log")),
            ..Default::default()
        },
        ..Default::default()
    };
    block(async {
        // short exits while nobody watches; long is still running when a new owner adopts it.
        let short = rt
            .create(&mk("short", "echo short-start; sleep 1; exit 5"))
            .await
            .expect("create");
        let long = rt
            .create(&mk(
                "long",
                "i=0; while [ $i -lt 40 ]; do echo tick $i; i=$((i+1)); sleep 0.1; done; exit 7",
            ))
            .await
            .expect("create");
        rt.start(short.id()).await.expect("start");
        rt.start(long.id()).await.expect("start");
        let mut o = std::io::stdout();
        writeln!(o, "{} {}", short.id(), long.id()).unwrap();
        o.flush().unwrap();
    });
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

fn containers_survive_owner_sigkill_and_are_readopted() -> Result<()> {
    let e = env();
    let logs = e.root.join("adopt-logs");
    std::fs::create_dir_all(&logs)?;
    let mut child = Command::new(std::env::current_exe()?)
        .env(
            "FERROLET_TEST_CHILD",
            format!("{}|{}|{}", e.root.display(), e.cgroup.path(), logs.display()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line)?;
    // Kill the owner the hard way, then reap it.
    child.kill()?;
    child.wait()?;
    let ids: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    if ids.len() != 2 {
        bail!("child did not report two container ids: {line:?}");
    }
    let (short, long) = (&ids[0], &ids[1]);
    let r = block(async {
        let rt = &e.rt;
        ensure!(
            rt.list()?.iter().any(|c| c.id() == long),
            "the new owner lists the container"
        );
        ensure!(
            matches!(rt.inspect(long)?.state, ContainerState::Running),
            "still running after the owner died"
        );
        let ticks_at_kill = output(&logs.join("long.log"))?.0.len();
        // The monitor's attach socket is found by the new owner too.
        let (mut rd, _wr) = rt
            .attach(
                long,
                AttachOptions {
                    stdout: true,
                    ..Default::default()
                },
            )
            .await?
            .into_split();
        attach_until(&mut rd, "tick", Duration::from_secs(5)).await?;
        drop(rd);
        // wait() on an adopted container, which exits later with its own code.
        let exit = tokio::time::timeout(Duration::from_secs(20), rt.wait(long)).await??;
        ensure!(exit.exit_code == 7, "{exit:?}");
        let ticks = output(&logs.join("long.log"))?.0;
        ensure!(
            ticks.len() == 40 && ticks_at_kill < 40,
            "logs kept flowing: {ticks_at_kill} at kill, {} at end",
            ticks.len()
        );
        // short exited while no process owned the runtime: its code was recorded anyway.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let ContainerState::Exited(x) = rt.inspect(short)?.state {
                ensure!(x.exit_code == 5, "{x:?}");
                break;
            }
            ensure!(Instant::now() < deadline, "short never exited");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ensure!(output(&logs.join("short.log"))?.0 == ["short-start"]);
        Ok(())
    });
    block(async {
        for id in &ids {
            let _ = e.rt.delete(id).await;
        }
    });
    r
}

/// The variant name of a state ("Running", "Exited", "ExitUnknown", "Unknown", ...).
fn state_name(s: &ContainerState) -> String {
    format!("{s:?}")
        .split(['(', ' ', '{'])
        .next()
        .unwrap_or_default()
        .to_string()
}

/// What a container puts on the node, noted while it runs, to check that `delete` removed it.
struct Traces {
    /// (pid, start time) of its processes.
    procs: Vec<(i32, u64)>,
    cgroup_dirs: Vec<PathBuf>,
    rootfs: PathBuf,
    state_dir: PathBuf,
    lc_dir: PathBuf,
}

fn traces(id: &str, cgroup: &str) -> Traces {
    let rt = &env().rt;
    let procs = rt
        .cgroups()
        .procs_below(cgroup)
        .into_iter()
        .filter_map(|p| Some((p, ferrolet_runtime::pidfd::process_start_time(p)?)))
        .collect();
    let state_dir = rt.root().join("containers").join(id);
    Traces {
        procs,
        cgroup_dirs: rt.cgroups().dirs(cgroup),
        rootfs: state_dir.join("rootfs"),
        state_dir,
        lc_dir: rt.root().join("libcontainer").join(id),
    }
}

/// Alive and not a zombie (an orphan's new parent may take a moment to reap it).
fn runs(pid: i32, start: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3));
    state != Some("Z") && ferrolet_runtime::pidfd::process_start_time(pid) == Some(start)
}

fn ensure_removed(t: &Traces) -> Result<()> {
    for (pid, start) in &t.procs {
        ensure!(!runs(*pid, *start), "process {pid} of the container still runs");
    }
    for d in &t.cgroup_dirs {
        ensure!(!d.exists(), "cgroup {} left", d.display());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    ensure!(
        !mounts.contains(&t.rootfs.display().to_string()),
        "rootfs {} still mounted",
        t.rootfs.display()
    );
    ensure!(!t.state_dir.exists(), "state dir {} left", t.state_dir.display());
    ensure!(!t.lc_dir.exists(), "libcontainer dir {} left", t.lc_dir.display());
    Ok(())
}

/// (file, new content) pairs for [`garble`].
type Garbling<'a> = &'a [(&'a str, &'a str)];

/// Write `content` over each named file of the container (a path starting with "lc:" is in
/// libcontainer's directory of the container).
fn garble(id: &str, files: &[(&str, &str)]) -> Result<()> {
    let rt = &env().rt;
    for (name, content) in files {
        let path = match name.strip_prefix("lc:") {
            Some(f) => rt.root().join("libcontainer").join(id).join(f),
            None => rt.root().join("containers").join(id).join(name),
        };
        // Put in place by a rename, as every record is written: the runtime reuses a state it
        // read while the directory is unchanged (container_cache), and an edit in place
        // leaves the directory as it was.
        let tmp = path.with_extension("garbled");
        std::fs::write(&tmp, content).with_context(|| format!("garbling {}", path.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("garbling {}", path.display()))?;
    }
    Ok(())
}

fn labelled(name: &str, command: &[&str]) -> ContainerConfig {
    let mut c = config(name, command);
    c.labels.insert("test.case".into(), name.into());
    c.annotations.insert("test.note".into(), "kept".into());
    c
}

/// Garbage or empty records of a running container (torn writes, a bad disk): it is still
/// listed, with its labels when any copy of its record is readable, never reported gone or
/// exited while it runs, and `delete` removes its processes, cgroup, mount and state.
fn unreadable_records_of_a_running_container() -> Result<()> {
    let cases: &[(&str, Garbling, bool)] = &[
        ("garbage-container-json", &[("container.json", "garbage{")], true),
        ("empty-monitor-json", &[("monitor.json", "")], true),
        ("garbage-exit-json", &[("exit.json", "\0\0not json")], true),
        ("empty-started-json", &[("started.json", "")], true),
        (
            "all-records",
            &[
                ("container.json", "x"),
                ("config.json", "{"),
                ("monitor.json", ""),
                ("started.json", "}"),
                ("exit.json", "?"),
            ],
            true,
        ),
        (
            "all-records-and-libcontainer",
            &[
                ("container.json", "x"),
                ("config.json", "{"),
                ("monitor.json", ""),
                ("started.json", "}"),
                ("lc:state.json", "garbage"),
                ("lc:youki_config.json", ""),
            ],
            false,
        ),
    ];
    block(async {
        let rt = &env().rt;
        for (name, files, labels_recoverable) in cases {
            let cfg = labelled(name, &["sleep", "60"]);
            let info = rt.create(&cfg).await?;
            let id = info.id().to_string();
            let t = traces(&id, &info.record.cgroup_path);
            let r = async {
                rt.start(&id).await?;
                ensure!(!t.procs.is_empty(), "the container has processes");
                garble(&id, files)?;
                let listed = rt
                    .list()?
                    .into_iter()
                    .find(|c| c.id() == id)
                    .ok_or_else(|| anyhow!("not listed"))?;
                let got = rt.inspect(&id)?;
                for i in [&listed, &got] {
                    ensure!(state_name(&i.state) == "Running", "state {:?}", i.state);
                    if *labels_recoverable {
                        ensure!(i.record.labels == cfg.labels, "labels {:?}", i.record.labels);
                        ensure!(
                            i.record.annotations.get("test.note").map(String::as_str) == Some("kept"),
                            "annotations {:?}",
                            i.record.annotations
                        );
                        ensure!(i.record.cgroup_path == info.record.cgroup_path);
                    }
                }
                if *name == "empty-monitor-json" {
                    // The monitor found through the kernel still signals and reports.
                    let m = got.monitor.clone().ok_or_else(|| anyhow!("no monitor"))?;
                    // The same processes; how the container was built is only in the file.
                    let recorded = info
                        .monitor
                        .clone()
                        .map(|r| ferrolet_runtime::container::MonitorRecord {
                            build_mounts: None,
                            ..r
                        });
                    ensure!(Some(&m) == recorded.as_ref(), "{m:?} vs {:?}", info.monitor);
                    ensure!(
                        rt.exec_capture(
                            &id,
                            &ExecSpec {
                                args: vec!["true".into()],
                                ..Default::default()
                            },
                            Some(Duration::from_secs(10)),
                            64
                        )
                        .await?
                        .exit_code
                            == 0
                    );
                    let e = killed(rt, &id).await?;
                    ensure!(e.exit_code == 137, "{e:?}");
                }
                Ok(())
            }
            .await
            .with_context(|| format!("case {name}"));
            let d = rt.delete(&id).await.with_context(|| format!("case {name}: delete"));
            r?;
            d?;
            ensure_removed(&t).with_context(|| format!("case {name}"))?;
        }
        Ok(())
    })
}

/// A created container, never started, whose monitor.json is empty: the monitor is found
/// through the kernel, and the container reads as Created, not started, though its monitor
/// runs the monitor program and its init another executable (its name, libcontainer's, says
/// it has not exec'd). It starts and runs as any.
fn a_created_container_whose_monitor_record_is_unreadable_reads_created() -> Result<()> {
    block(async {
        let rt = &env().rt;
        let cfg = labelled("created-empty-monitor-json", &["sleep", "60"]);
        let info = rt.create(&cfg).await?;
        let id = info.id().to_string();
        let t = traces(&id, &info.record.cgroup_path);
        let r = async {
            garble(&id, &[("monitor.json", "")])?;
            let got = rt.inspect(&id)?;
            ensure!(state_name(&got.state) == "Created", "state {:?}", got.state);
            let m = got.monitor.clone().ok_or_else(|| anyhow!("no monitor found"))?;
            ensure!(
                Some(m.monitor_pid) == info.monitor.as_ref().map(|r| r.monitor_pid),
                "{m:?} vs {:?}",
                info.monitor
            );
            rt.start(&id).await?;
            ensure!(
                state_name(&rt.inspect(&id)?.state) == "Running",
                "not running once started"
            );
            let e = killed(rt, &id).await?;
            ensure!(e.exit_code == 137, "{e:?}");
            Ok(())
        }
        .await;
        let d = rt.delete(&id).await;
        r?;
        d?;
        ensure_removed(&t)
    })
}

/// SIGKILL a container and wait (10 s at most) for its exit record.
async fn killed(rt: &ferrolet_runtime::Runtime, id: &str) -> Result<ferrolet_runtime::ExitRecord> {
    rt.kill(id, libc::SIGKILL)?;
    Ok(tokio::time::timeout(Duration::from_secs(10), rt.wait(id)).await??)
}

/// Wait until the monitor of an exited container is gone too (it exits right after writing
/// exit.json).
async fn monitor_gone(info: &ferrolet_runtime::ContainerInfo) -> Result<()> {
    let m = info.monitor.clone().ok_or_else(|| anyhow!("no monitor record"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ferrolet_runtime::pidfd::process_matches(m.monitor_pid, m.monitor_start) {
        ensure!(Instant::now() < deadline, "monitor {} did not exit", m.monitor_pid);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Garbage or empty records of a container that exited with 3: never running or absent; its
/// recorded exit while exit.json is readable, "exit status unknown" when it is not.
fn unreadable_records_of_an_exited_container() -> Result<()> {
    let cases: &[(&str, Garbling, Option<i32>)] = &[
        ("exited-garbage-exit-json", &[("exit.json", "garbage")], None),
        ("exited-empty-monitor-json", &[("monitor.json", "")], Some(3)),
        ("exited-garbage-container-json", &[("container.json", "[1,")], Some(3)),
        ("exited-empty-started-json", &[("started.json", "")], Some(3)),
        (
            "exited-exit-and-monitor",
            &[("exit.json", ""), ("monitor.json", "{}")],
            None,
        ),
    ];
    block(async {
        let rt = &env().rt;
        for (name, files, code) in cases {
            with_exited(name, async |id, cfg| {
                garble(id, files)?;
                let listed = rt
                    .list()?
                    .into_iter()
                    .find(|c| c.id() == id)
                    .ok_or_else(|| anyhow!("not listed"))?;
                let got = rt.inspect(id)?;
                for i in [&listed, &got] {
                    ensure!(i.record.labels == cfg.labels, "labels {:?}", i.record.labels);
                    match code {
                        Some(c) => ensure!(
                            matches!(&i.state, ContainerState::Exited(x) if x.exit_code == *c),
                            "state {:?}",
                            i.state
                        ),
                        None => {
                            ensure!(state_name(&i.state) == "ExitUnknown", "state {:?}", i.state);
                            let dbg = format!("{:?}", i.state);
                            ensure!(
                                dbg.contains("exit.json") && dbg.contains("exit status unknown"),
                                "{dbg}"
                            );
                        }
                    }
                }
                // wait() on it answers at once.
                let w = tokio::time::timeout(Duration::from_secs(2), rt.wait(id)).await??;
                ensure!(code.is_none_or(|c| w.exit_code == c), "{w:?}");
                Ok(())
            })
            .await?;
        }
        Ok(())
    })
}

/// Run `sh -c "exit 3"` labelled `name` until it has exited and its monitor is gone, hand its
/// id and config to `check`, then delete it and make sure nothing is left, pass or fail.
async fn with_exited(name: &str, check: impl AsyncFnOnce(&str, &ContainerConfig) -> Result<()>) -> Result<()> {
    let rt = &env().rt;
    let cfg = labelled(name, &["sh", "-c", "exit 3"]);
    let info = rt.create(&cfg).await?;
    let id = info.id().to_string();
    let t = traces(&id, &info.record.cgroup_path);
    let r = async {
        rt.start(&id).await?;
        let e = tokio::time::timeout(Duration::from_secs(10), rt.wait(&id)).await??;
        ensure!(e.exit_code == 3, "{e:?}");
        monitor_gone(&info).await?;
        check(&id, &cfg).await
    }
    .await
    .with_context(|| format!("case {name}"));
    let d = rt.delete(&id).await.with_context(|| format!("case {name}: delete"));
    r?;
    d?;
    ensure_removed(&t).with_context(|| format!("case {name}"))
}

/// What a power loss may leave of a container's records (monitor.json and started.json are not
/// fsynced; exit.json and container.json are), read in the next boot: with its exit recorded the
/// container is exited with that code; without, it is gone with an unknown exit status ("the
/// node rebooted"), never a creation to retry (`Incomplete`) nor alive.
fn records_of_another_boot_after_a_power_loss() -> Result<()> {
    let cases: &[(&str, &[&str], Option<i32>)] = &[
        (
            "reboot-lost-monitor-and-started",
            &["monitor.json", "started.json"],
            Some(3),
        ),
        (
            "reboot-lost-all-but-the-record",
            &["monitor.json", "started.json", "exit.json"],
            None,
        ),
        ("reboot-lost-exit", &["exit.json"], None),
    ];
    block(async {
        let rt = &env().rt;
        for (name, lost, code) in cases {
            with_exited(name, async |id, cfg| {
                // Another boot: the record names a boot id that is not this one.
                let dir = rt.root().join("containers").join(id);
                let path = dir.join("container.json");
                let mut rec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
                rec["bootId"] = "a-boot-before-the-power-loss".into();
                std::fs::write(&path, serde_json::to_vec(&rec)?)?;
                for f in *lost {
                    std::fs::remove_file(dir.join(f))?;
                }
                let got = rt.inspect(id)?;
                ensure!(got.record.labels == cfg.labels, "labels {:?}", got.record.labels);
                match code {
                    Some(c) => ensure!(
                        matches!(&got.state, ContainerState::Exited(x) if x.exit_code == *c),
                        "state {:?}",
                        got.state
                    ),
                    None => {
                        ensure!(state_name(&got.state) == "ExitUnknown", "state {:?}", got.state);
                        let dbg = format!("{:?}", got.state);
                        ensure!(dbg.contains("the node rebooted"), "{dbg}");
                    }
                }
                Ok(())
            })
            .await?;
        }
        Ok(())
    })
}

/// Longer than the runtime waits for a state directory to be still before it reuses the state
/// read from it (container_cache::SETTLED).
const STATE_SETTLES: Duration = Duration::from_millis(1300);

/// A state the runtime reused (its directory unchanged for a while) gives way to a record
/// replaced as the runtime writes records, by a rename: the next inspect and list read it.
fn a_reused_state_gives_way_to_a_replaced_record() -> Result<()> {
    block(async {
        with_exited("replaced-record", async |id, _| {
            let rt = &env().rt;
            tokio::time::sleep(STATE_SETTLES).await;
            for _ in 0..2 {
                let got = rt.inspect(id)?;
                ensure!(
                    matches!(&got.state, ContainerState::Exited(e) if e.exit_code == 3),
                    "{got:?}"
                );
            }
            // Reused, it is answered without reading (what an async caller asks first).
            let cached = rt.inspect_cached(id);
            ensure!(
                cached
                    .as_ref()
                    .is_some_and(|c| matches!(&c.state, ContainerState::Exited(e) if e.exit_code == 3)),
                "{cached:?}"
            );
            ensure!(rt.inspect_cached("../etc").is_none() && rt.inspect_cached("no-such").is_none());
            let path = rt.root().join("containers").join(id).join("exit.json");
            let mut rec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
            rec["exitCode"] = 7.into();
            let tmp = path.with_extension("new");
            std::fs::write(&tmp, serde_json::to_vec(&rec)?)?;
            std::fs::rename(&tmp, &path)?;
            ensure!(rt.inspect_cached(id).is_none(), "a changed directory must be read");
            let got = rt.inspect(id)?;
            ensure!(
                matches!(&got.state, ContainerState::Exited(e) if e.exit_code == 7),
                "{got:?}"
            );
            let listed = rt.list()?.into_iter().find(|c| c.id() == id);
            ensure!(
                listed
                    .as_ref()
                    .is_some_and(|c| matches!(&c.state, ContainerState::Exited(e) if e.exit_code == 7)),
                "{listed:?}"
            );
            Ok(())
        })
        .await
    })
}

/// A container whose monitor was killed keeps running without anyone to record its exit: it
/// is not "exited" while its processes live (the agent would start a second copy), and kill,
/// wait and delete still work through its cgroup.
fn container_whose_monitor_died_is_not_exited_while_it_runs() -> Result<()> {
    block(async {
        let rt = &env().rt;
        let info = rt.create(&labelled("monitor-killed", &["sleep", "60"])).await?;
        let id = info.id().to_string();
        let t = traces(&id, &info.record.cgroup_path);
        let r = async {
            rt.start(&id).await?;
            // Listed while its directory is settled: the state is reused from here on, and
            // only the monitor's pidfd tells of the monitor's death (it writes nothing).
            tokio::time::sleep(STATE_SETTLES).await;
            for _ in 0..2 {
                ensure!(state_name(&rt.inspect(&id)?.state) == "Running");
            }
            ensure!(rt
                .inspect_cached(&id)
                .is_some_and(|c| state_name(&c.state) == "Running"));
            let m = info.monitor.clone().ok_or_else(|| anyhow!("no monitor record"))?;
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(m.monitor_pid), nix::sys::signal::SIGKILL)?;
            monitor_gone(&info).await?;
            ensure!(
                ferrolet_runtime::pidfd::process_matches(m.init_pid, m.init_start),
                "the container outlives its monitor"
            );
            ensure!(rt.inspect_cached(&id).is_none(), "a dead monitor must be read");
            let got = rt.inspect(&id)?;
            ensure!(state_name(&got.state) == "Unknown", "state {:?}", got.state);
            ensure!(rt
                .list()?
                .iter()
                .any(|c| c.id() == id && state_name(&c.state) == "Unknown"));
            let e = killed(rt, &id).await?;
            ensure!(
                e.exit_code == 255 && e.reason.as_deref().is_some_and(|r| r.contains("monitor died")),
                "{e:?}"
            );
            ensure!(state_name(&rt.inspect(&id)?.state) == "ExitUnknown");
            Ok(())
        }
        .await;
        let d = rt.delete(&id).await;
        r?;
        d?;
        ensure_removed(&t)
    })
}

/// A running container whose records are all gone (container.json, config.json, monitor.json,
/// started.json and libcontainer's state): it is listed from its directory, the kernel says it
/// runs (its monitor holds the directory, its cgroup is named after it), and delete finds its
/// cgroup and mount and removes them. What `ferrolet reset` does without records rests on this
/// and on `mounts_under` / `procs_below`, checked here too.
fn container_without_records_is_found_by_cgroup_and_mount() -> Result<()> {
    block(async {
        let rt = &env().rt;
        let info = rt.create(&labelled("no-records", &["sleep", "60"])).await?;
        let id = info.id().to_string();
        let t = traces(&id, &info.record.cgroup_path);
        let r = async {
            rt.start(&id).await?;
            let dir = rt.root().join("containers").join(&id);
            for f in ["container.json", "config.json", "monitor.json", "started.json"] {
                std::fs::remove_file(dir.join(f))?;
            }
            std::fs::remove_dir_all(rt.root().join("libcontainer").join(&id))?;
            // Asked of this directory alone: remove_orphans would also take other tests'
            // creations in flight in this shared root (it runs only when none is, in the agent).
            ensure!(!rt.is_orphan(&id), "a directory with a live container is no orphan");
            let got = rt
                .list()?
                .into_iter()
                .find(|c| c.id() == id)
                .ok_or_else(|| anyhow!("not listed"))?;
            ensure!(state_name(&got.state) == "Running", "state {:?}", got.state);
            ensure!(
                rt.inspect(&id)?.monitor.map(|m| m.init_pid) == info.monitor.as_ref().map(|m| m.init_pid),
                "init found"
            );
            // What reset looks at: the rootfs among the mounts under the root, the processes
            // in the container's parent cgroup.
            ensure!(ferrolet_runtime::rootfs::mounts_under(rt.root()).contains(&t.rootfs));
            let parent = env().cgroup.path();
            ensure!(t
                .procs
                .iter()
                .all(|(p, _)| rt.cgroups().procs_below(parent).contains(p)));
            Ok(())
        }
        .await;
        let d = rt.delete(&id).await;
        r?;
        d?;
        ensure_removed(&t)
    })
}

// ---- terminals and attach (docs/runtime.md#terminals-and-attach) ----

/// Read from a pty master until `want` appears in what was read (or `limit` passes).
fn read_pty_until(master: &OwnedFd, want: &str, limit: Duration) -> Result<String> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(want) {
        let left = deadline.saturating_duration_since(Instant::now());
        ensure!(
            !left.is_zero(),
            "no {want:?} on the terminal within {limit:?}; got {:?}",
            String::from_utf8_lossy(&got)
        );
        let mut p = [PollFd::new(master.as_fd(), PollFlags::POLLIN)];
        let ms = PollTimeout::try_from(left.as_millis().min(1000) as i32).unwrap_or(PollTimeout::ZERO);
        if poll(&mut p, ms)? == 0 {
            continue;
        }
        match nix::unistd::read(master.as_raw_fd(), &mut buf) {
            Ok(0) | Err(nix::errno::Errno::EIO) => bail!(
                "terminal closed before {want:?}; got {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => {}
            Err(e) => bail!("reading the terminal: {e}"),
        }
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

fn pty_number(master: &OwnedFd) -> Result<u32> {
    let mut n: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes one unsigned int.
    let r = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTN as _, &mut n) };
    ensure!(r == 0, "TIOCGPTN: {}", std::io::Error::last_os_error());
    Ok(n)
}

/// Create and start `cfg`; run `f` with its id; delete it whatever happens.
async fn with_running<F, Fut>(cfg: &ContainerConfig, f: F) -> Result<()>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let rt = &env().rt;
    let info = rt.create(cfg).await?;
    let id = info.id().to_string();
    let r = async {
        rt.start(&id).await?;
        f(id.clone()).await
    }
    .await;
    rt.delete(&id).await?;
    r
}

/// The lines of /proc/<pid>/status that say how a process is confined.
const CONFINEMENT: &[&str] = &[
    "Uid:",
    "CapInh:",
    "CapPrm:",
    "CapEff:",
    "CapBnd:",
    "CapAmb:",
    "NoNewPrivs:",
    "Seccomp:",
    "Seccomp_filters:",
];

/// An exec'd process is confined exactly as the container's first process: the same
/// capabilities, noNewPrivileges and seccomp filter, with and without noNewPrivileges (which
/// decides whether the filter is loaded before or after the capabilities are dropped), as
/// root and as another user, and with Unconfined seccomp too.
fn exec_runs_confined_like_the_container() -> Result<()> {
    block(async {
        let cases: [(&str, bool, Option<u32>, SeccompProfile); 4] = [
            ("confined-root", false, None, SeccompProfile::RuntimeDefault),
            ("confined-nnp", true, None, SeccompProfile::RuntimeDefault),
            ("confined-user", false, Some(1000), SeccompProfile::RuntimeDefault),
            ("unconfined", false, None, SeccompProfile::Unconfined),
        ];
        for (name, nnp, uid, seccomp) in cases {
            let mut c = config(name, &["sleep", "60"]);
            c.no_new_privileges = nnp;
            c.user.uid = uid;
            c.seccomp = seccomp.clone();
            with_running(&c, |id| async move {
                let rt = &env().rt;
                let status = |pid: &str| ExecSpec {
                    args: vec!["cat".into(), format!("/proc/{pid}/status")],
                    ..Default::default()
                };
                let lines = |out: &[u8]| -> Vec<String> {
                    String::from_utf8_lossy(out)
                        .lines()
                        .filter(|l| CONFINEMENT.iter().any(|k| l.starts_with(k)))
                        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                        .collect()
                };
                let first = rt
                    .exec_capture(&id, &status("1"), Some(Duration::from_secs(10)), 1 << 16)
                    .await?;
                let own = rt
                    .exec_capture(&id, &status("self"), Some(Duration::from_secs(10)), 1 << 16)
                    .await?;
                ensure!(first.exit_code == 0 && own.exit_code == 0, "{first:?} {own:?}");
                let (first, own) = (lines(&first.stdout), lines(&own.stdout));
                ensure!(first.len() == CONFINEMENT.len(), "{name}: /proc/1/status: {first:?}");
                ensure!(
                    first == own,
                    "{name}: the exec'd process is confined differently:\n container: {first:?}\n exec'd:    {own:?}"
                );
                // The container's capabilities, not the full set the agent (and libcontainer's
                // init until the executor drops them) holds.
                let host_bounding = std::fs::read_to_string("/proc/self/status")?
                    .lines()
                    .find(|l| l.starts_with("CapBnd:"))
                    .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                    .unwrap_or_default();
                ensure!(
                    first.iter().any(|l| l.starts_with("CapBnd:")) && !first.contains(&host_bounding),
                    "{name}: the container kept the full bounding set: {first:?}"
                );
                let filtered = matches!(seccomp, SeccompProfile::RuntimeDefault);
                ensure!(
                    own.contains(&format!("Seccomp: {}", if filtered { 2 } else { 0 })),
                    "{name}: {own:?}"
                );
                ensure!(
                    own.contains(&format!("NoNewPrivs: {}", u8::from(nnp))),
                    "{name}: {own:?}"
                );
                Ok(())
            })
            .await?;
        }
        Ok(())
    })
}

fn exec_tty_runs_on_a_container_terminal() -> Result<()> {
    block(async {
        with_running(&config("exec-tty", &["sleep", "60"]), |id| async move {
            let rt = &env().rt;
            let spec = ExecSpec {
                args: vec![
                    "sh".into(),
                    "-c".into(),
                    // tty_nr (field 7 of stat) is the controlling terminal, 0 for none.
                    "tty; echo term=$TERM ctty=$(cut -d' ' -f7 /proc/$$/stat) sid=$(cut -d' ' -f6 /proc/$$/stat) pid=$$ seccomp=$(awk '/^Seccomp:/{print $2}' /proc/$$/status) .; read go; stty size; exit 5".into(),
                ],
                ..Default::default()
            };
            let (proc_, master) = rt.exec_tty(&id, &spec).await?;
            let first = read_pty_until(&master, " .", Duration::from_secs(10))?;
            let n = pty_number(&master)?;
            ensure!(
                first.contains(&format!("/dev/pts/{n}\r\n")),
                "`tty` should name the container's /dev/pts/{n}: {first:?}"
            );
            ensure!(first.contains("term=xterm"), "{first:?}");
            let field = |k: &str| {
                first
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .map(str::to_string)
                    .unwrap_or_default()
            };
            ensure!(field("ctty=") != "0" && !field("ctty=").is_empty(), "no controlling tty: {first:?}");
            ensure!(field("sid=") == field("pid="), "the shell is not a session leader: {first:?}");
            ensure!(field("seccomp=") == "2", "the terminal's shell runs unfiltered: {first:?}");
            ferrolet_runtime::resize_tty(master.as_fd(), 123, 45)?;
            nix::unistd::write(&master, b"go\n")?;
            read_pty_until(&master, "45 123", Duration::from_secs(10))?;
            let code = tokio::time::timeout(Duration::from_secs(10), proc_.wait())
                .await
                .map_err(|_| anyhow!("exec did not exit"))??;
            ensure!(code == 5, "exit code {code}");
            // The worker left nothing behind in libcontainer's directory.
            let lc = env().root.join("libcontainer").join(&id);
            let left: Vec<String> = std::fs::read_dir(&lc)?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("ferrolet-exec-") || n.starts_with("tenant-tty-"))
                .collect();
            ensure!(left.is_empty(), "left in {}: {left:?}", lc.display());
            Ok(())
        })
        .await
    })
}

/// Collect attach output until `want` is in the concatenated stream (stdout, stderr).
async fn attach_until(a: &mut ferrolet_runtime::AttachReader, want: &str, limit: Duration) -> Result<(String, String)> {
    let mut out = (String::new(), String::new());
    let r = tokio::time::timeout(limit, async {
        while !(out.0.contains(want) || out.1.contains(want)) {
            match a.next().await {
                Some(AttachOutput::Stdout(b)) => out.0.push_str(&String::from_utf8_lossy(&b)),
                Some(AttachOutput::Stderr(b)) => out.1.push_str(&String::from_utf8_lossy(&b)),
                None => return false,
            }
        }
        true
    })
    .await;
    match r {
        Ok(true) => Ok(out),
        Ok(false) => bail!("attach ended before {want:?}; got {out:?}"),
        Err(_) => bail!("no {want:?} from attach within {limit:?}; got {out:?}"),
    }
}

fn attach_to_a_tty_container() -> Result<()> {
    block(async {
        let mut c = config("attach-tty", &["sh"]);
        (c.stdin, c.tty) = (true, true);
        let log = c.log.path.clone();
        with_running(&c, |id| async move {
            let rt = &env().rt;
            let all = AttachOptions {
                stdin: true,
                stdout: true,
                stderr: true,
            };
            let a = rt.attach(&id, all).await?;
            ensure!(a.tty(), "the session should report a terminal");
            let (mut rd, mut wr) = a.into_split();
            wr.resize(100, 50).await?;
            wr.write_stdin(b"echo hi-$((40+2))\n").await?;
            let (o, e) = attach_until(&mut rd, "hi-42", Duration::from_secs(10)).await?;
            ensure!(e.is_empty(), "a terminal has no separate stderr: {e:?}");
            ensure!(
                o.contains("echo hi-$((40+2))"),
                "the terminal should echo the input: {o:?}"
            );
            wr.write_stdin(b"stty size\n").await?;
            attach_until(&mut rd, "50 100", Duration::from_secs(10)).await?;
            wr.write_stdin(b"exit 3\n").await?;
            let end = tokio::time::timeout(Duration::from_secs(10), async { while rd.next().await.is_some() {} }).await;
            ensure!(end.is_ok(), "the session did not end when the container exited");
            let exit = tokio::time::timeout(Duration::from_secs(10), rt.wait(&id)).await??;
            ensure!(exit.exit_code == 3, "{exit:?}");
            let (out, err) = output(&log)?;
            ensure!(
                out.iter().any(|l| l.contains("hi-42")) && err.is_empty(),
                "log: {out:?} {err:?}"
            );
            ensure!(
                rt.attach(&id, AttachOptions::default()).await.is_err(),
                "attaching to an exited container must fail"
            );
            Ok(())
        })
        .await
    })
}

fn attach_stdin_once_on_a_terminal_hangs_up_on_detach() -> Result<()> {
    block(async {
        let mut c = config("attach-once-tty", &["sh"]);
        (c.stdin, c.stdin_once, c.tty) = (true, true, true);
        with_running(&c, |id| async move {
            let rt = &env().rt;
            let opts = AttachOptions {
                stdin: true,
                stdout: true,
                stderr: false,
            };
            let (mut rd, mut wr) = rt.attach(&id, opts).await?.into_split();
            wr.write_stdin(b"echo x-$((2*3))\n").await?;
            attach_until(&mut rd, "x-6", Duration::from_secs(10)).await?;
            // As containerd's shim: closing a terminal's stdin hangs the terminal up; the
            // interactive shell (SIGHUP, then end of input) exits.
            wr.close_stdin().await?;
            tokio::time::timeout(Duration::from_secs(10), rt.wait(&id))
                .await
                .map_err(|_| anyhow!("the shell did not end after its terminal's stdin was closed"))??;
            // (the shell's last prompt may still be queued)
            let end = tokio::time::timeout(Duration::from_secs(5), async { while rd.next().await.is_some() {} }).await;
            ensure!(end.is_ok(), "the session should end with the container");
            Ok(())
        })
        .await
    })
}

fn attach_stdin_once_closes_stdin_on_detach() -> Result<()> {
    block(async {
        let mut c = config("attach-once", &["sh", "-c", "cat; echo cat-ended"]);
        (c.stdin, c.stdin_once) = (true, true);
        let log = c.log.path.clone();
        with_running(&c, |id| async move {
            let rt = &env().rt;
            let opts = AttachOptions {
                stdin: true,
                stdout: true,
                stderr: true,
            };
            let mut a = rt.attach(&id, opts).await?;
            ensure!(!a.tty() && a.stdin_open());
            a.write_stdin(b"line-one\n").await?;
            let (mut rd, wr) = a.into_split();
            attach_until(&mut rd, "line-one", Duration::from_secs(10)).await?;
            // Detaching (dropping the session) closes a stdinOnce container's stdin.
            drop((rd, wr));
            let exit = tokio::time::timeout(Duration::from_secs(10), rt.wait(&id))
                .await
                .map_err(|_| anyhow!("cat did not see end of stdin after the attacher detached"))??;
            ensure!(exit.exit_code == 0, "{exit:?}");
            let (out, _) = output(&log)?;
            ensure!(out == ["line-one", "cat-ended"], "log: {out:?}");
            Ok(())
        })
        .await
    })
}

fn attach_stdin_and_tagged_output_to_several_attachers() -> Result<()> {
    block(async {
        let script = "echo started; while read l; do echo \"out:$l\"; echo \"err:$l\" >&2; \
                      if [ \"$l\" = bye ]; then sleep 1; echo after-detach; exit 0; fi; done";
        let mut c = config("attach-pipes", &["sh", "-c", script]);
        c.stdin = true;
        let log = c.log.path.clone();
        with_running(&c, |id| async move {
            let rt = &env().rt;
            let all = AttachOptions {
                stdin: true,
                stdout: true,
                stderr: true,
            };
            let out_only = AttachOptions {
                stdout: true,
                ..Default::default()
            };
            // Nobody attached yet: the output is logged all the same.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !output(&log)?.0.contains(&"started".to_string()) {
                ensure!(Instant::now() < deadline, "\"started\" not logged without attachers");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let (mut a_rd, mut a_wr) = rt.attach(&id, all).await?.into_split();
            let (mut b_rd, _b_wr) = rt.attach(&id, out_only).await?.into_split();
            a_wr.write_stdin(b"x\n").await?;
            let (ao, ae) = attach_until(&mut a_rd, "err:x", Duration::from_secs(10)).await?;
            let (ao, ae) = if ao.contains("out:x") {
                (ao, ae)
            } else {
                let more = attach_until(&mut a_rd, "out:x", Duration::from_secs(10)).await?;
                (ao + &more.0, ae + &more.1)
            };
            ensure!(ao == "out:x\n" && ae == "err:x\n", "first attacher: {ao:?} {ae:?}");
            let (bo, be) = attach_until(&mut b_rd, "out:x", Duration::from_secs(10)).await?;
            ensure!(
                bo == "out:x\n" && be.is_empty(),
                "second attacher (stdout only): {bo:?} {be:?}"
            );
            // Without stdinOnce an attacher closing its stdin (and dropping its writer) leaves
            // the container's open, and it still gets output.
            a_wr.close_stdin().await?;
            drop(a_wr);
            tokio::time::sleep(Duration::from_millis(300)).await;
            ensure!(
                rt.inspect(&id)?.is_running(),
                "closing one attacher's stdin ended the container"
            );
            let (mut c_rd, mut c_wr) = rt.attach(&id, all).await?.into_split();
            c_wr.write_stdin(b"y\nbye\n").await?;
            attach_until(&mut c_rd, "out:bye", Duration::from_secs(10)).await?;
            attach_until(&mut a_rd, "out:bye", Duration::from_secs(10)).await?;
            drop((a_rd, c_rd, c_wr, b_rd));
            let exit = tokio::time::timeout(Duration::from_secs(10), rt.wait(&id)).await??;
            ensure!(exit.exit_code == 0, "{exit:?}");
            let (out, err) = output(&log)?;
            ensure!(
                out == ["started", "out:x", "out:y", "out:bye", "after-detach"],
                "stdout log: {out:?}"
            );
            ensure!(err == ["err:x", "err:y", "err:bye"], "stderr log: {err:?}");
            Ok(())
        })
        .await
    })
}

fn attach_refusals() -> Result<()> {
    block(async {
        with_running(&config("attach-no-stdin", &["sleep", "60"]), |id| async move {
            let rt = &env().rt;
            let e = match rt
                .attach(
                    &id,
                    AttachOptions {
                        stdin: true,
                        stdout: true,
                        stderr: true,
                    },
                )
                .await
            {
                Ok(_) => bail!("attaching stdin to a container without stdin succeeded"),
                Err(e) => e,
            };
            let msg = ferrolet_fsutil::chain(&e).to_string();
            ensure!(msg.contains("stdin"), "the error should name stdin: {msg}");
            // Output-only attach works on any running container.
            let mut a = rt
                .attach(
                    &id,
                    AttachOptions {
                        stdout: true,
                        stderr: true,
                        ..Default::default()
                    },
                )
                .await?;
            ensure!(a.write_stdin(b"x").await.is_err(), "write without stdin must fail");
            rt.kill(&id, libc::SIGKILL)?;
            let end = tokio::time::timeout(Duration::from_secs(10), async { while a.next().await.is_some() {} }).await;
            ensure!(end.is_ok(), "the session did not end when the container was killed");
            tokio::time::timeout(Duration::from_secs(10), rt.wait(&id)).await??;
            ensure!(
                rt.attach(&id, AttachOptions::default()).await.is_err(),
                "attaching to a stopped container must fail"
            );
            Ok(())
        })
        .await
    })
}

fn slow_attacher_does_not_stall_the_log() -> Result<()> {
    block(async {
        let mut c = config("attach-slow", &["sh", "-c", "read go; seq 1 200000"]);
        c.stdin = true;
        let log = c.log.path.clone();
        with_running(&c, |id| async move {
            let rt = &env().rt;
            let opts = AttachOptions {
                stdin: true,
                stdout: true,
                stderr: true,
            };
            // This attacher never reads its output.
            let mut a = rt.attach(&id, opts).await?;
            a.write_stdin(b"go\n").await?;
            // A stall is for ever; 200,000 lines through the monitor take 30 s and more in
            // the emulated guests beside CI's other stages.
            let exit = tokio::time::timeout(Duration::from_secs(120), rt.wait(&id))
                .await
                .map_err(|_| anyhow!("an attacher that does not read held up the container"))??;
            ensure!(exit.exit_code == 0, "{exit:?}");
            let (out, _) = output(&log)?;
            ensure!(
                out.len() == 200_000 && out.last().map(String::as_str) == Some("200000"),
                "log has {} lines",
                out.len()
            );
            drop(a);
            Ok(())
        })
        .await
    })
}

/// A small tmpfs mounted at `at` (the caller unmounts it).
fn mount_points(pid: i32) -> Result<Vec<String>> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    Ok(info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(str::to_string)
        .collect())
}

/// An isolated zygote's containers are built in mount namespaces of their own (mount_ns): the
/// zygote's table has none of the pods' mounts (rootfs, namespace pins, a tmpfs volume) nor a
/// tmpfs the host had outside the root before it isolated; containers are built from a few
/// dozen mounts and their monitors are back in the host's namespace; the container joins the
/// pinned network namespace and sees the volume's files, written before or after it started.
/// A container with a Bidirectional (rshared) mount, or a bind mount of `/`, is built in the
/// host's namespace. A mount the host makes outside the root later, even under a mount that
/// does not propagate, is in the containers built after it, and so is a hostPath inside the
/// tmpfs the zygote's copy detached.
fn containers_are_built_without_the_other_containers_mounts() -> Result<()> {
    use ferrolet_runtime::config::{Mount, MountKind, NamespaceMode, Propagation};
    let e = env();
    let pod = e
        .root
        .join("pods")
        .join(format!("iso-{}", ferrolet_fsutil::random_hex(4)));
    let sandbox = pod.join("sandbox");
    let vol = pod.join("volumes").join("mem");
    let shared = pod.join("volumes").join("shared");
    std::fs::create_dir_all(&vol)?;
    std::fs::create_dir_all(&shared)?;
    let pins = ferrolet_runtime::namespaces::Pins {
        hostname: Some("iso".into()),
        net: true,
        ipc: true,
        uts: true,
        ..Default::default()
    };
    block(e.rt.pin_namespaces(&sandbox, &pins))?;
    mount_tmpfs(&vol)?;
    let mut ids = Vec::new();
    let r = (|| -> Result<()> {
        std::fs::write(vol.join("before"), "written before\n")?;
        let in_pod = |name: &str, script: &str, propagation: Propagation| {
            let mut c = config(name, &["sh", "-c", script]);
            c.namespaces.network = NamespaceMode::Path(sandbox.join("net"));
            c.namespaces.ipc = NamespaceMode::Path(sandbox.join("ipc"));
            c.namespaces.uts = NamespaceMode::Path(sandbox.join("uts"));
            c.mounts.push(Mount {
                destination: "/vol".into(),
                source: vol.clone(),
                kind: MountKind::Bind,
                readonly: false,
                propagation: Propagation::Private,
                options: Vec::new(),
                idmap: false,
            });
            if propagation == Propagation::Bidirectional {
                c.privileged = true;
                c.mounts.push(Mount {
                    destination: "/shared".into(),
                    source: shared.clone(),
                    kind: MountKind::Bind,
                    readonly: false,
                    propagation,
                    options: Vec::new(),
                    idmap: false,
                });
            }
            c
        };
        let a = in_pod(
            "iso-a",
            "cat /vol/before; while [ ! -e /vol/after ]; do sleep 0.05; done; cat /vol/after; \
             readlink /proc/self/ns/net; hostname; exec sleep 1000",
            Propagation::Private,
        );
        let b = in_pod("iso-b", "exec sleep 1000", Propagation::Private);
        let c = in_pod("iso-c", "exec sleep 1000", Propagation::Bidirectional);
        block(async {
            for cfg in [&a, &b, &c] {
                let info = e.rt.create(cfg).await?;
                ids.push(info.id().to_string());
                e.rt.start(info.id()).await?;
            }
            Ok::<_, anyhow::Error>(())
        })?;
        let build_mounts = |id: &str| -> Result<Option<u32>> {
            let m = e.rt.inspect(id)?.monitor.ok_or_else(|| anyhow!("{id}: no monitor"))?;
            Ok(m.build_mounts)
        };
        let rootfs = |id: &str| {
            std::fs::canonicalize(e.root.join("containers").join(id).join("rootfs"))
                .unwrap_or_default()
                .display()
                .to_string()
        };
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_default().display().to_string();
        let host = mount_points(std::process::id() as i32)?;
        let zygote = mount_points(e.rt.zygote_pid())?;
        // The zygote's copy: none of the pods' mounts, nor a mount the host had outside the
        // root when it was taken.
        for unwanted in [
            rootfs(&ids[0]),
            rootfs(&ids[1]),
            canon(&sandbox.join("net")),
            canon(&vol),
            canon(&e.premount),
        ] {
            ensure!(host.contains(&unwanted), "the host lacks {unwanted}");
            ensure!(
                !zygote.contains(&unwanted),
                "the zygote's copy holds {unwanted}: {zygote:?}"
            );
        }
        ensure!(zygote.contains(&canon(&e.root)), "{zygote:?}");
        // a and b were built in namespaces of their own, from a few dozen mounts; c, with a
        // Bidirectional (rshared) mount, in the host's.
        for id in &ids[..2] {
            let n = build_mounts(id)?.ok_or_else(|| anyhow!("{id} was built in the host's namespace"))? as usize;
            ensure!(
                n < host.len() && n < 60,
                "{id}: built from {n} mounts, the host has {}",
                host.len()
            );
        }
        ensure!(
            build_mounts(&ids[2])?.is_none(),
            "c is built in the host's namespace; c: {:?} {:?}",
            e.rt.inspect(&ids[2])?.state,
            output(&c.log.path)
        );
        // Every monitor is back in the host's namespace once its container is built.
        let ns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap_or_default();
        for id in &ids {
            let m = e.rt.inspect(id)?.monitor.ok_or_else(|| anyhow!("{id}: no monitor"))?;
            ensure!(ns(m.monitor_pid) == ns(std::process::id() as i32), "{id}'s monitor");
        }

        std::fs::write(vol.join("after"), "written after\n")?;
        let net = std::fs::metadata(sandbox.join("net"))?;
        let want_net = format!("net:[{}]", std::os::unix::fs::MetadataExt::ino(&net));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (out, _) = output(&a.log.path)?;
            if out.len() >= 4 {
                ensure!(
                    out == ["written before", "written after", want_net.as_str(), "iso"],
                    "container a printed {out:?}"
                );
                break;
            }
            ensure!(Instant::now() < deadline, "container a printed only {out:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    })();
    block(async {
        for id in &ids {
            let _ = e.rt.delete(id).await;
        }
    });
    let _ = nix::mount::umount(&vol);
    let _ = Runtime::unpin_namespaces(&sandbox);
    let _ = std::fs::remove_dir_all(&pod);
    r?;

    // A disk the host mounts outside the root after the zygote took its copy (a tmpfs under
    // the temp dir, on a mount that may well not propagate).
    let outside = std::env::temp_dir().join(format!("ferrolet-rt-outside-{}", std::process::id()));
    std::fs::create_dir_all(&outside)?;
    mount_tmpfs(&outside)?;
    let r = (|| -> Result<()> {
        std::fs::write(outside.join("file"), "on the new disk\n")?;
        // At once: the monitor copies the host's mount as it is now.
        let mut cfg = config("iso-d", &["cat", "/outside/file"]);
        cfg.mounts.push(read_only_bind("/outside", &outside));
        let (exit, out, err) = block(run_built(&cfg, Some(true)))?;
        ensure!(
            exit.exit_code == 0 && out == ["on the new disk"],
            "{exit:?} {out:?} {err:?}"
        );

        // A directory inside a disk the zygote's copy detached (mounted before it was taken):
        // the disk's mount comes along, alone, for the directory to be there.
        let sub = e.premount.join("sub");
        std::fs::create_dir_all(&sub)?;
        std::fs::write(sub.join("file"), "on the early disk\n")?;
        let mut cfg = config("iso-e", &["cat", "/early/file"]);
        cfg.mounts.push(read_only_bind("/early", &sub));
        let (exit, out, err) = block(run_built(&cfg, Some(true)))?;
        ensure!(
            exit.exit_code == 0 && out == ["on the early disk"],
            "{exit:?} {out:?} {err:?}"
        );

        // A bind mount of the host's `/` cannot be copied: built in the host's namespace.
        let mut cfg = config("iso-f", &["test", "-d", "/host/etc"]);
        cfg.mounts.push(read_only_bind("/host", Path::new("/")));
        let (exit, out, err) = block(run_built(&cfg, Some(false)))?;
        ensure!(exit.exit_code == 0, "{exit:?} {out:?} {err:?}");
        Ok(())
    })();
    let _ = nix::mount::umount(&outside);
    let _ = std::fs::remove_dir(&outside);
    r
}

/// `make_root_private` bind-mounts a root dir on itself (private), once, and refuses while
/// something is mounted below a root that is not a mount point (the bind would hide it);
/// `release_root` undoes only its own bind mount. A root that is a mount already is kept.
fn the_root_becomes_a_private_mount_only_with_nothing_below() -> Result<()> {
    use ferrolet_runtime::mount_ns::{make_root_private, release_root};
    let dir = std::env::temp_dir().join(format!("ferrolet-rt-rootmount-{}", std::process::id()));
    let root = dir.join("root");
    let below = root.join("pods").join("left");
    std::fs::create_dir_all(&below)?;
    let root_s = std::fs::canonicalize(&root)?.display().to_string();
    let lines_at = |path: &str| -> Result<Vec<String>> {
        let info = std::fs::read_to_string("/proc/self/mountinfo")?;
        Ok(info
            .lines()
            .filter(|l| l.split(' ').nth(4) == Some(path))
            .map(str::to_string)
            .collect())
    };
    let r = (|| -> Result<()> {
        mount_tmpfs(&below)?;
        let refused = make_root_private(&root)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        ensure!(refused.contains("mounts are below"), "{refused:?}");
        ensure!(lines_at(&root_s)?.is_empty(), "nothing was mounted at the root");
        nix::mount::umount(&below)?;

        make_root_private(&root)?;
        make_root_private(&root)?;
        let at = lines_at(&root_s)?;
        ensure!(at.len() == 1, "one bind mount, private: {at:?}");
        ensure!(!at[0].contains("shared:"), "{at:?}");
        ensure!(root.join(".self-bind").exists());
        ensure!(release_root(&root)?, "its own bind mount is undone");
        ensure!(lines_at(&root_s)?.is_empty() && !root.join(".self-bind").exists());
        ensure!(!release_root(&root)?, "nothing left to undo");

        // A root that is a mount already (a disk of its own) is made private, never unmounted.
        mount_tmpfs(&root)?;
        make_root_private(&root)?;
        ensure!(!release_root(&root)?, "not ours to unmount");
        ensure!(lines_at(&root_s)?.len() == 1);
        Ok(())
    })();
    let _ = nix::mount::umount2(&below, nix::mount::MntFlags::MNT_DETACH);
    while !lines_at(&root_s).unwrap_or_default().is_empty() {
        if nix::mount::umount2(&root, nix::mount::MntFlags::MNT_DETACH).is_err() {
            break;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// Inodes in use on the filesystem of `p`.
fn inodes_used(p: &Path) -> Result<u64> {
    let st = nix::sys::statvfs::statvfs(p)?;
    Ok(st.files() - st.files_free())
}

/// A runtime whose root is a tmpfs with room for `k` more inodes, for k = 0, 1, 2...: each
/// creation fails at a later step (the log, the container's records, the rootfs, libcontainer's
/// state, the monitor's record after the build) until one succeeds. Every failed one must leave
/// nothing: no directory, mount, cgroup or libcontainer state, and every inode back.
fn creations_failing_at_every_step_leave_nothing_behind() -> Result<()> {
    let zygote = SPARE_ZYGOTE
        .lock()
        .unwrap()
        .take()
        .context("the spare zygote was taken")?;
    let root = std::env::temp_dir().join(format!("ferrolet-rt-inodes-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    nix::mount::mount(
        Some("tmpfs"),
        &root,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=64m"),
    )?;
    let result = (|| -> Result<(usize, Vec<String>)> {
        let rt = Runtime::new(&root, zygote)?;
        rt.images().import(&env().images.join("busybox.oci.tar"))?;
        let parent = NestedRoot::create(rt.cgroups(), &format!("ferrolet-rt-inodes-{}", std::process::id()))?;
        let checked = (|| -> Result<(usize, Vec<String>)> {
            std::fs::create_dir_all(root.join("logs"))?;
            let baseline = inodes_used(&root)?;
            let mut errors = Vec::new();
            for k in 0..400u64 {
                nix::mount::mount(
                    None::<&str>,
                    &root,
                    None::<&str>,
                    nix::mount::MsFlags::MS_REMOUNT,
                    Some(format!("size=64m,nr_inodes={}", baseline + k).as_str()),
                )?;
                let cfg = ContainerConfig {
                    name: "inodes".into(),
                    image: IMAGE.into(),
                    command: vec!["true".into()],
                    cgroup_parent: parent.path().to_string(),
                    log: LogConfig {
                        path: root.join("logs").join(format!("inodes-{k}.log")),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let created = block(rt.create(&cfg));
                if let Ok(info) = &created {
                    block(rt.delete(info.id()))?;
                }
                // What is left (a log file of a creation that got that far is the caller's).
                let _ = std::fs::remove_file(&cfg.log.path);
                let left: Vec<String> = ["containers", "libcontainer"]
                    .iter()
                    .flat_map(|d| std::fs::read_dir(root.join(d)).into_iter().flatten().flatten())
                    .map(|e| e.path().display().to_string())
                    .collect();
                ensure!(left.is_empty(), "k={k}: {created:?} left {left:?}");
                let cgroups: Vec<PathBuf> = rt
                    .cgroups()
                    .dirs(parent.path())
                    .iter()
                    .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .collect();
                ensure!(cgroups.is_empty(), "k={k}: {created:?} left cgroups {cgroups:?}");
                let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
                let under = root.join("containers").display().to_string();
                ensure!(
                    !mounts.contains(&under),
                    "k={k}: {created:?} left a mount under {under}"
                );
                // An inode of a file already removed stays counted until the last descriptor
                // of it is closed, which the zygote's worker may do a moment after answering:
                // a leak is what is still counted after 2 s.
                let deadline = Instant::now() + Duration::from_secs(2);
                let mut used = inodes_used(&root)?;
                while used != baseline && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                    used = inodes_used(&root)?;
                }
                ensure!(used == baseline, "k={k}: {created:?} left {} inodes", used - baseline);
                match created {
                    Ok(_) => return Ok((k as usize, errors)),
                    Err(e) => errors.push(ferrolet_fsutil::chain(&e).to_string()),
                }
            }
            bail!("no creation succeeded with up to 400 inodes: {errors:#?}")
        })();
        let _ = parent.cleanup();
        checked
    })();
    // Detached: the spare zygote may not have gone yet.
    let _ = nix::mount::umount2(&root, nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(&root);
    let (failures, errors) = result?;
    ensure!(failures >= 5, "only {failures} creations failed: {errors:#?}");
    ensure!(
        errors.iter().any(|e| e.contains("recording monitor state")),
        "no creation failed after the build: {errors:#?}"
    );
    Ok(())
}
