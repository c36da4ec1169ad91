//! The grpc handler (kubelet's pkg/probe/grpc): one grpc.health.v1 Check over HTTP/2 without
//! TLS, the request and response encoded by hand (a single string field and a single enum).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::GRPCAction;

use super::netns::{connect, PodTarget};
use super::{Outcome, USER_AGENT};

/// grpc.health.v1.Health/Check on the pod's port: SERVING succeeds, anything else fails with
/// kubelet's message.
pub async fn probe(action: &GRPCAction, target: &PodTarget, timeout: Duration) -> Outcome {
    let Ok(port) = u16::try_from(action.port) else {
        return Outcome::Failure(format!("invalid port number: {}", action.port));
    };
    let (addr, ns) = match target.resolve(None, port) {
        Ok(x) => x,
        Err(e) => return Outcome::Failure(e.to_string()),
    };
    let service = action.service.clone().unwrap_or_default();
    let secs = timeout.as_secs().max(1);
    let fut = async {
        let stream = connect(addr, ns, timeout)
            .await
            .map_err(|e| format!("error: failed to connect service at {:?}: {e}", addr.to_string()))?;
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| format!("error: failed to connect service at {:?}: {e}", addr.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        // HealthCheckRequest { string service = 1; } in a gRPC frame.
        let mut msg = Vec::new();
        if !service.is_empty() {
            msg.push(0x0a);
            push_varint(&mut msg, service.len() as u64);
            msg.extend_from_slice(service.as_bytes());
        }
        let mut frame = vec![0u8];
        frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        frame.extend_from_slice(&msg);
        let req = hyper::Request::post(format!("http://{addr}/grpc.health.v1.Health/Check"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("user-agent", USER_AGENT)
            .body(Full::new(Bytes::from(frame)))
            .map_err(|e| e.to_string())?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("error: health rpc probe failed: {e}"))?;
        let (parts, body) = resp.into_parts();
        let collected = body
            .collect()
            .await
            .map_err(|e| format!("error: health rpc probe failed: {e}"))?;
        let trailers = collected.trailers().cloned();
        let data = collected.to_bytes();
        let grpc_status = trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| parts.headers.get("grpc-status"))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(if parts.status.is_success() { 0 } else { 2 });
        if grpc_status != 0 {
            let m = trailers
                .as_ref()
                .and_then(|t| t.get("grpc-message"))
                .or_else(|| parts.headers.get("grpc-message"))
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            if grpc_status == 12 {
                return Err(format!(
                    "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {m}"
                ));
            }
            return Err(format!(
                "error: health rpc probe failed: rpc error: code = {} desc = {m}",
                grpc_code_name(grpc_status)
            ));
        }
        let status = data.get(5..).map(parse_status).unwrap_or(0);
        Ok(status)
    };
    match tokio::time::timeout(timeout, fut).await {
        Err(_) => Outcome::Failure(format!("timeout: health rpc did not complete within {secs}s")),
        Ok(Err(e)) => Outcome::Failure(e),
        Ok(Ok(1)) => Outcome::Success(String::new()),
        Ok(Ok(s)) => Outcome::Failure(format!(
            "service unhealthy (responded with {:?})",
            serving_status_name(s)
        )),
    }
}

fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// `status` (field 1, varint) of a HealthCheckResponse.
fn parse_status(b: &[u8]) -> u64 {
    let mut i = 0;
    while i < b.len() {
        let key = b[i];
        i += 1;
        let (v, n) = read_varint(&b[i..]);
        if key == 0x08 {
            return v;
        }
        i += n;
        if key & 7 == 2 {
            i += v as usize;
        }
    }
    0
}

fn read_varint(b: &[u8]) -> (u64, usize) {
    let mut v = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        v |= ((byte & 0x7f) as u64) << (7 * i);
        if byte & 0x80 == 0 {
            return (v, i + 1);
        }
    }
    (v, b.len())
}

fn serving_status_name(s: u64) -> &'static str {
    match s {
        0 => "UNKNOWN",
        1 => "SERVING",
        2 => "NOT_SERVING",
        3 => "SERVICE_UNKNOWN",
        _ => "UNKNOWN",
    }
}

fn grpc_code_name(c: u32) -> &'static str {
    [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ]
    .get(c as usize)
    .copied()
    .unwrap_or("Unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_response_parsing() {
        assert_eq!(parse_status(&[0x08, 0x01]), 1);
        assert_eq!(parse_status(&[0x08, 0x02]), 2);
        assert_eq!(parse_status(&[]), 0);
        let mut v = Vec::new();
        push_varint(&mut v, 300);
        assert_eq!(read_varint(&v), (300, 2));
    }
}
