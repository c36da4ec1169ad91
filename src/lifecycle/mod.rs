//! Lifecycle hooks (kubelet's pkg/kubelet/lifecycle HandlerRunner): exec in the container, an
//! HTTP GET to the pod (host defaults to the pod IP; any HTTP response counts as success, only
//! failing to get one fails; TLS is not verified), or a sleep. They go through the same
//! transports as the probes ([`crate::probe`]). The container runtime side runs them: postStart
//! right after the container starts (a failure kills the container), preStop before the stop
//! signal, out of the grace period. Error messages are kubelet's.

pub mod admit;

use std::time::Duration;

use ferrolet_runtime::{ExecSpec, Runtime};
use k8s_openapi::api::core::v1::{Container, HTTPHeader, LifecycleHandler};

use crate::probe::netns::PodTarget;
use crate::probe::{http, resolve_port, MAX_OUTPUT};

pub const USER_AGENT: &str = "kube-lifecycle/1.37";

/// A hook that failed, with kubelet's message for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookError(pub String);

impl std::fmt::Display for HookError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HookError {}

/// Run `h` for container `id` of pod `pod` (`name_namespace(uid)`); `timeout` bounds exec and
/// HTTP hooks and the sleep.
pub async fn run(
    rt: &Runtime,
    h: &LifecycleHandler,
    id: &str,
    c: &Container,
    pod: &str,
    target: &PodTarget,
    timeout: Duration,
) -> Result<(), HookError> {
    if let Some(e) = &h.exec {
        let cmd = e.command.clone().unwrap_or_default();
        let spec = ExecSpec {
            args: cmd.clone(),
            ..Default::default()
        };
        let fail = |err: String, out: &[u8]| {
            HookError(format!(
                "Exec lifecycle hook ({cmd:?}) for Container {:?} in Pod {pod:?} failed - error: {err}, message: {:?}",
                c.name,
                String::from_utf8_lossy(out)
            ))
        };
        let o = rt
            .exec_capture(id, &spec, Some(timeout), MAX_OUTPUT)
            .await
            .map_err(|e| fail(ferrolet_fsutil::chain(&e).to_string(), b""))?;
        let mut out = o.stdout.clone();
        out.extend_from_slice(&o.stderr);
        if o.timed_out {
            return Err(fail(
                format!("command '{}' timed out after {timeout:?}", cmd.join(" ")),
                &out,
            ));
        }
        if o.exit_code != 0 {
            return Err(fail(
                format!(
                    "command '{}' exited with {}: {}",
                    cmd.join(" "),
                    o.exit_code,
                    String::from_utf8_lossy(&o.stderr)
                ),
                &out,
            ));
        }
        return Ok(());
    }
    if let Some(g) = &h.http_get {
        let path = g.path.clone().unwrap_or_else(|| "/".into());
        let fail = |err: String| {
            HookError(format!(
                "HTTP lifecycle hook ({path}) for Container {:?} in Pod {pod:?} failed - error: {err}",
                c.name
            ))
        };
        let port = resolve_port(&g.port, c).map_err(fail)?;
        let (addr, ns) = target
            .resolve(g.host.as_deref(), port)
            .map_err(|e| fail(e.to_string()))?;
        let host = g
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| addr.ip().to_string());
        let https = g.scheme.as_deref() == Some("HTTPS");
        let mut headers: Vec<HTTPHeader> = g.http_headers.clone().unwrap_or_default();
        if !headers.iter().any(|h| h.name.eq_ignore_ascii_case("user-agent")) {
            headers.push(HTTPHeader {
                name: "User-Agent".into(),
                value: USER_AGENT.into(),
            });
        }
        http::get(https, addr, ns, &format!("{host}:{port}"), &path, &headers, timeout)
            .await
            .map_err(fail)?;
        return Ok(());
    }
    if let Some(s) = &h.sleep {
        let d = Duration::from_secs(s.seconds.max(0) as u64);
        if d > timeout {
            tokio::time::sleep(timeout).await;
            return Err(HookError(format!(
                "Sleep lifecycle hook ({}) for Container {:?} in Pod {pod:?} failed - error: container terminated before sleep hook finished",
                s.seconds, c.name
            )));
        }
        tokio::time::sleep(d).await;
        return Ok(());
    }
    if h.tcp_socket.is_some() {
        return Err(HookError(
            "Cannot run handler: invalid handler: tcpSocket lifecycle handlers are not supported".into(),
        ));
    }
    Err(HookError("Cannot run handler: invalid handler: no action".into()))
}
