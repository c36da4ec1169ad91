//! Lifecycle hooks (kubelet's HandlerRunner): exec in the container, an HTTP GET to the pod
//! (host defaults to the pod IP), or a sleep. postStart runs right after the container starts
//! and a failure kills the container; preStop runs before the stop signal and its time comes
//! out of the grace period.

use std::time::Duration;

use ferrolet_runtime::{ExecSpec, Runtime};
use k8s_openapi::api::core::v1::{Container, LifecycleHandler};

use crate::netns::PodTarget;
use crate::probe::run::{http_get_once, resolve_port, MAX_OUTPUT};

/// Run `h` for container `id`; an error is the message kubelet would put in the event.
pub async fn run(
    rt: &Runtime,
    h: &LifecycleHandler,
    id: &str,
    c: &Container,
    target: &PodTarget,
    timeout: Duration,
) -> Result<(), String> {
    if let Some(e) = &h.exec {
        let cmd = e.command.clone().unwrap_or_default();
        let spec = ExecSpec {
            args: cmd.clone(),
            ..Default::default()
        };
        let o = rt
            .exec_capture(id, &spec, Some(timeout), MAX_OUTPUT)
            .await
            .map_err(|e| e.to_string())?;
        if o.timed_out {
            return Err(format!("command '{}' timed out after {timeout:?}", cmd.join(" ")));
        }
        if o.exit_code != 0 {
            let mut out = o.stdout;
            out.extend_from_slice(&o.stderr);
            return Err(format!(
                "command '{}' exited with {}: {}",
                cmd.join(" "),
                o.exit_code,
                String::from_utf8_lossy(&out)
            ));
        }
        return Ok(());
    }
    if let Some(g) = &h.http_get {
        let port = resolve_port(&g.port, c)?;
        let (addr, ns) = target.resolve(g.host.as_deref(), port).map_err(|e| e.to_string())?;
        let host = g
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| addr.ip().to_string());
        let path = g.path.clone().unwrap_or_else(|| "/".into());
        let https = g.scheme.as_deref() == Some("HTTPS");
        let r = http_get_once(
            https,
            addr,
            ns,
            &format!("{host}:{port}"),
            &path,
            g.http_headers.as_deref().unwrap_or(&[]),
            timeout,
        )
        .await?;
        if r.status >= 400 {
            return Err(format!(
                "HTTP lifecycle hook ({path}) for Container {:?} returned status {}: {}",
                c.name,
                r.status,
                String::from_utf8_lossy(&r.body)
            ));
        }
        return Ok(());
    }
    if let Some(s) = &h.sleep {
        let d = Duration::from_secs(s.seconds.max(0) as u64);
        tokio::time::sleep(d.min(timeout)).await;
        return Ok(());
    }
    if h.tcp_socket.is_some() {
        return Err("tcpSocket lifecycle handlers are not supported (deprecated in Kubernetes)".into());
    }
    Err("lifecycle handler has no action".into())
}
