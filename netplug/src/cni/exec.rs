//! Running a CNI plugin: find its binary, pass the CNI_* environment and the config on stdin,
//! enforce the time limit (killing the plugin's whole process group), and decode its answer:
//! a result on success, the spec's error object (`code`, `msg`, `details`) on failure.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tracing::debug;

use crate::error::{Context, Error, PluginFailure, Result};

/// The CNI environment of one invocation.
#[derive(Debug, Clone)]
pub(crate) struct Invocation<'a> {
    pub command: &'a str,
    pub container_id: &'a str,
    /// Empty when the namespace is gone (allowed for DEL) or for VERSION.
    pub netns: &'a str,
    pub ifname: &'a str,
    pub args: &'a str,
    /// `CNI_PATH`: the bin dirs joined with ':'.
    pub path: &'a str,
}

/// The first executable `name` in `dirs`.
pub(crate) fn find_plugin(name: &str, dirs: &[PathBuf]) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    for d in dirs {
        let c = d.join(name);
        if let Ok(md) = std::fs::metadata(&c) {
            if md.is_file() && md.permissions().mode() & 0o111 != 0 {
                return Ok(c);
            }
        }
    }
    Err(Error::PluginNotFound {
        plugin: name.to_string(),
        dirs: dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Decode a failed plugin's output into [`Error::Plugin`]: the JSON error object on stdout if
/// there is one, else whatever stdout/stderr said.
pub(crate) fn decode_failure(plugin: &str, command: &str, exit: String, stdout: &[u8], stderr: &[u8]) -> Error {
    let stderr_s = tail(stderr);
    let parsed: Option<Value> = serde_json::from_slice(stdout).ok();
    match parsed.as_ref().and_then(Value::as_object) {
        Some(o) if o.contains_key("msg") || o.contains_key("code") => Error::Plugin(Box::new(PluginFailure {
            plugin: plugin.to_string(),
            command: command.to_string(),
            code: o.get("code").and_then(Value::as_u64).unwrap_or(0) as u32,
            msg: o.get("msg").and_then(Value::as_str).unwrap_or("").to_string(),
            details: o.get("details").and_then(Value::as_str).unwrap_or("").to_string(),
            exit,
            stderr: stderr_s,
        })),
        _ => {
            let out = tail(stdout);
            Error::Plugin(Box::new(PluginFailure {
                plugin: plugin.to_string(),
                command: command.to_string(),
                code: 0,
                msg: if out.is_empty() {
                    "no error object on stdout".into()
                } else {
                    format!("unparseable output: {out}")
                },
                details: String::new(),
                exit,
                stderr: stderr_s,
            }))
        }
    }
}

/// The last 2000 bytes of some output, trimmed, as text.
fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let s = s.trim();
    if s.len() > 2000 {
        let mut start = s.len() - 2000;
        while !s.is_char_boundary(start) {
            start += 1;
        }
        format!("...{}", &s[start..])
    } else {
        s.to_string()
    }
}

/// Run one plugin. Returns its stdout (the result; may be empty for DEL/CHECK).
pub(crate) async fn exec_plugin(
    bin: &Path,
    plugin: &str,
    inv: &Invocation<'_>,
    stdin: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>> {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.env("CNI_COMMAND", inv.command)
        .env("CNI_CONTAINERID", inv.container_id)
        .env("CNI_NETNS", inv.netns)
        .env("CNI_IFNAME", inv.ifname)
        .env("CNI_ARGS", inv.args)
        .env("CNI_PATH", inv.path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let started = std::time::Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("running CNI plugin {plugin} ({})", bin.display()))?;
    let pgid = child.id().map(|p| p as i32);
    let mut pipe = child.stdin.take().expect("piped stdin");
    let run = async move {
        // A plugin may exit without reading stdin: a broken pipe here is not the error to report.
        let _ = pipe.write_all(stdin).await;
        drop(pipe);
        child.wait_with_output().await
    };
    let out = match tokio::time::timeout(timeout, run).await {
        Ok(r) => r.with_context(|| format!("waiting for CNI plugin {plugin}"))?,
        Err(_) => {
            if let Some(pg) = pgid {
                // the child itself is killed by kill_on_drop; this takes its children too
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pg), nix::sys::signal::Signal::SIGKILL);
            }
            return Err(Error::PluginTimeout {
                plugin: plugin.to_string(),
                command: inv.command.to_string(),
                timeout,
            });
        }
    };
    debug!(plugin, command = inv.command, container = inv.container_id, elapsed_ms = started.elapsed().as_millis() as u64, status = %out.status, "CNI plugin ran");
    if out.status.success() {
        if !out.stderr.is_empty() {
            debug!(plugin, stderr = %tail(&out.stderr), "CNI plugin stderr");
        }
        return Ok(out.stdout);
    }
    let exit = match (out.status.code(), out.status.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => out.status.to_string(),
    };
    Err(decode_failure(plugin, inv.command, exit, &out.stdout, &out.stderr))
}

/// Decode a plugin's success output as a JSON object.
pub(crate) fn parse_result(plugin: &str, command: &str, out: &[u8]) -> Result<Value> {
    let v: Value = serde_json::from_slice(out).map_err(|e| Error::PluginOutput {
        plugin: plugin.to_string(),
        command: command.to_string(),
        reason: format!("result is not JSON ({e}): {}", tail(out)),
    })?;
    if !v.is_object() {
        return Err(Error::PluginOutput {
            plugin: plugin.to_string(),
            command: command.to_string(),
            reason: format!("result is not a JSON object: {}", tail(out)),
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_spec_error_object() {
        let out =
            br#"{"cniVersion":"1.0.0","code":7,"msg":"invalid network config","details":"unknown field \"bridgee\""}"#;
        let e = decode_failure("bridge", "ADD", "exit status 1".into(), out, b"");
        assert_eq!(
            e.to_string(),
            "CNI plugin bridge ADD failed: invalid network config: unknown field \"bridgee\" (code 7, exit status 1)"
        );
        match e {
            Error::Plugin(f) => assert_eq!(f.code, 7),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn falls_back_to_raw_output() {
        let e = decode_failure("x", "DEL", "killed by signal 9".into(), b"", b"panic: boom\n").to_string();
        assert_eq!(
            e,
            "CNI plugin x DEL failed: no error object on stdout (code 0, killed by signal 9); stderr: panic: boom"
        );
        let e = decode_failure("x", "ADD", "exit status 2".into(), b"garbage", b"").to_string();
        assert!(e.contains("unparseable output: garbage"), "{e}");
    }

    #[test]
    fn result_must_be_a_json_object() {
        assert!(parse_result("p", "ADD", br#"{"ips":[]}"#).is_ok());
        let e = parse_result("p", "ADD", b"[1]").unwrap_err().to_string();
        assert!(e.starts_with("CNI plugin p ADD: result is not a JSON object"), "{e}");
        let e = parse_result("p", "ADD", b"").unwrap_err().to_string();
        assert!(e.contains("not JSON"), "{e}");
    }

    #[test]
    fn plugin_lookup_names_the_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let e = find_plugin("nope", &[dir.path().to_path_buf(), "/nonexistent".into()])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "CNI plugin \"nope\" not found in {}, /nonexistent",
                dir.path().display()
            )
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn runs_kills_on_timeout_and_decodes() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("fake");
        std::fs::write(
            &script,
            "#!/bin/sh\ncat >/dev/null\ncase \"$CNI_COMMAND\" in\n\
             ADD) echo \"{\\\"args\\\":\\\"$CNI_ARGS\\\",\\\"netns\\\":\\\"$CNI_NETNS\\\"}\" ;;\n\
             DEL) echo '{\"code\":11,\"msg\":\"try again\"}'; exit 1 ;;\n\
             CHECK) sleep 30 ;;\nesac\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let inv = Invocation {
            command: "ADD",
            container_id: "c1",
            netns: "/run/netns/x",
            ifname: "eth0",
            args: "K8S_POD_NAME=a",
            path: "/usr/lib/cni",
        };
        let out = exec_plugin(&script, "fake", &inv, b"{}", Duration::from_secs(10))
            .await
            .unwrap();
        let v = parse_result("fake", "ADD", &out).unwrap();
        assert_eq!(v["args"], "K8S_POD_NAME=a");
        assert_eq!(v["netns"], "/run/netns/x");

        let del = Invocation {
            command: "DEL",
            ..inv.clone()
        };
        let e = exec_plugin(&script, "fake", &del, b"{}", Duration::from_secs(10))
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "CNI plugin fake DEL failed: try again (code 11, exit status 1)"
        );

        let check = Invocation {
            command: "CHECK",
            ..inv
        };
        let t = std::time::Instant::now();
        let e = exec_plugin(&script, "fake", &check, b"{}", Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::PluginTimeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(
            e.to_string(),
            "CNI plugin fake CHECK timed out after 300ms and was killed"
        );
    }
}
