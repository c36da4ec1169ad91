//! The HTTP/1.1 upgrade to SPDY/3.1 as apimachinery's httpstream does it: the client offers
//! subprotocols in `X-Stream-Protocol-Version` (one header line each), the server answers with
//! the first it speaks in the client's order (none acceptable: 403 listing the server's in
//! `X-Accepted-Stream-Protocol-Versions`), then `101 Switching Protocols` with
//! `Connection: Upgrade` and `Upgrade: SPDY/3.1`.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper::upgrade::OnUpgrade;

pub const PROTOCOL_HEADER: &str = "x-stream-protocol-version";
pub const ACCEPTED_HEADER: &str = "x-accepted-stream-protocol-versions";
pub const SPDY_31: &str = "SPDY/3.1";

/// `Upgrade: websocket` with `Connection` naming upgrade (wsstream's IsWebSocketRequest).
pub fn is_websocket(h: &HeaderMap) -> bool {
    let upgrade = h
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    upgrade && connection_upgrade(h)
}

fn connection_upgrade(h: &HeaderMap) -> bool {
    h.get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// A negotiated SPDY upgrade: send `response`, then the connection is `on_upgrade`'s.
pub struct SpdyUpgrade {
    pub protocol: String,
    pub response: Response,
    pub on_upgrade: OnUpgrade,
}

fn plain(code: StatusCode, msg: String) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], msg).into_response()
}

/// Negotiate the subprotocol and prepare the 101 answer; the error is the response to send.
pub fn spdy(req: &mut Request<Body>, supported: &[&'static str]) -> Result<SpdyUpgrade, Box<Response>> {
    let h = req.headers();
    let client: Vec<String> = h
        .get_all(PROTOCOL_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if client.is_empty() {
        return Err(Box::new(plain(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: X-Stream-Protocol-Version is required".into(),
        )));
    }
    let Some(protocol) = client.iter().find(|c| supported.contains(&c.as_str())).cloned() else {
        let mut r = plain(
            StatusCode::FORBIDDEN,
            format!(
                "unable to upgrade: unable to negotiate protocol: client supports {client:?}, server accepts {supported:?}"
            ),
        );
        for s in supported {
            r.headers_mut().append(ACCEPTED_HEADER, HeaderValue::from_static(s));
        }
        return Err(Box::new(r));
    };
    let upgrade_ok = h
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(SPDY_31));
    if !upgrade_ok || !connection_upgrade(h) {
        return Err(Box::new(plain(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: missing upgrade headers in request".into(),
        )));
    }
    let Some(on_upgrade) = req.extensions_mut().remove::<OnUpgrade>() else {
        return Err(Box::new(plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "unable to upgrade: this connection cannot be upgraded".into(),
        )));
    };
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let rh = response.headers_mut();
    rh.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    rh.insert(header::UPGRADE, HeaderValue::from_static(SPDY_31));
    if let Ok(v) = HeaderValue::from_str(&protocol) {
        rh.insert(PROTOCOL_HEADER, v);
    }
    Ok(SpdyUpgrade {
        protocol,
        response,
        on_upgrade,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(headers: &[(&str, &str)]) -> Request<Body> {
        let mut b = Request::builder().uri("/exec/ns/p/c");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn negotiation_follows_the_client_order_and_refuses_with_403() {
        let supported = ["v4.channel.k8s.io", "v3.channel.k8s.io"];
        let mut r = req(&[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1"),
            (PROTOCOL_HEADER, "v5.channel.k8s.io"),
            (PROTOCOL_HEADER, "v3.channel.k8s.io"),
            (PROTOCOL_HEADER, "v4.channel.k8s.io"),
        ]);
        // No hyper connection behind a built request: negotiation passes, the upgrade cannot.
        let e = spdy(&mut r, &supported).err().unwrap();
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);

        let mut r = req(&[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1"),
            (PROTOCOL_HEADER, "v1.channel.k8s.io"),
        ]);
        let e = spdy(&mut r, &supported).err().unwrap();
        assert_eq!(e.status(), StatusCode::FORBIDDEN);
        assert_eq!(e.headers().get_all(ACCEPTED_HEADER).iter().count(), 2);

        let mut r = req(&[("connection", "Upgrade"), ("upgrade", "SPDY/3.1")]);
        assert_eq!(
            spdy(&mut r, &supported).err().unwrap().status(),
            StatusCode::BAD_REQUEST
        );
        let mut r = req(&[(PROTOCOL_HEADER, "v4.channel.k8s.io")]);
        assert_eq!(
            spdy(&mut r, &supported).err().unwrap().status(),
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn websocket_requests_are_recognized() {
        let r = req(&[("connection", "keep-alive, Upgrade"), ("upgrade", "websocket")]);
        assert!(is_websocket(r.headers()));
        let r = req(&[("connection", "Upgrade"), ("upgrade", "SPDY/3.1")]);
        assert!(!is_websocket(r.headers()));
    }
}
