//! `/logs/`: the node's log directory (`/var/log`) as kubelet serves it (Go's http.FileServer on
//! it): a directory is an HTML listing (`<a href="name">name</a>`, directories with a trailing
//! slash; one without its slash is redirected to it), a file is its content. A path with a `..`
//! element is refused (400, as Go's file server does) and so is anything that resolves outside
//! the directory through a symlink (404).

use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::io::AsyncReadExt;

/// The directory served.
pub const LOG_DIR: &str = "/var/log";

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

/// Percent-encode a name for an href (Go's url.URL{Path: name}.String()).
fn href(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    // a name with a colon would read as a scheme
    if name.contains(':') && !name.starts_with("./") {
        out.insert_str(0, "./");
    }
    out
}

/// Why a path is not served.
#[derive(Debug, PartialEq)]
pub enum Refused {
    /// A `..` element (400, as Go's file server).
    BadPath,
    NotFound,
    /// A directory asked for without its trailing slash: go to `0`.
    Redirect(String),
    Unreadable(String),
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::BadPath => (StatusCode::BAD_REQUEST, "invalid URL path").into_response(),
            Refused::NotFound => (StatusCode::NOT_FOUND, "404 page not found\n").into_response(),
            Refused::Redirect(to) => (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, to)]).into_response(),
            Refused::Unreadable(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
        }
    }
}

/// Where `rel` (the URL path below `/logs/`) lands under `root`.
pub fn resolve(root: &Path, rel: &str) -> Result<PathBuf, Refused> {
    if rel.split('/').any(|p| p == "..") {
        return Err(Refused::BadPath);
    }
    let root = std::fs::canonicalize(root).map_err(|_| Refused::NotFound)?;
    let joined = root.join(rel.trim_start_matches('/'));
    let real = std::fs::canonicalize(&joined).map_err(|_| Refused::NotFound)?;
    if !real.starts_with(&root) {
        return Err(Refused::NotFound);
    }
    Ok(real)
}

/// Serve `rel` under `root`; `url_path` is the request's path (for the directory redirect).
pub async fn serve(root: &Path, rel: &str, url_path: &str) -> Response {
    let (root, rel, url_path) = (root.to_path_buf(), rel.to_string(), url_path.to_string());
    let found = ferrolet_fsutil::spawn_blocking(move || -> Result<(PathBuf, Option<String>), Refused> {
        let path = resolve(&root, &rel)?;
        let meta = std::fs::metadata(&path).map_err(|_| Refused::NotFound)?;
        if !meta.is_dir() {
            return Ok((path, None));
        }
        if !url_path.ends_with('/') {
            let last = url_path.rsplit('/').next().unwrap_or("");
            return Err(Refused::Redirect(format!("{last}/")));
        }
        let mut names: Vec<String> = std::fs::read_dir(&path)
            .map_err(|e| Refused::Unreadable(format!("Error reading directory: {e}")))?
            .flatten()
            .map(|e| {
                let mut n = e.file_name().to_string_lossy().into_owned();
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    n.push('/');
                }
                n
            })
            .collect();
        names.sort();
        let mut html =
            String::from("<!doctype html>\n<meta name=\"viewport\" content=\"width=device-width\">\n<pre>\n");
        for n in names {
            html.push_str(&format!("<a href=\"{}\">{}</a>\n", href(&n), html_escape(&n)));
        }
        html.push_str("</pre>\n");
        Ok((path, Some(html)))
    })
    .await;
    let (path, listing) = match found {
        Ok(Ok(x)) => x,
        Ok(Err(refused)) => return refused.into_response(),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    if let Some(html) = listing {
        return ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response();
    }
    let mut file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return (StatusCode::FORBIDDEN, "403 Forbidden\n").into_response()
        }
        Err(_) => return (StatusCode::NOT_FOUND, "404 page not found\n").into_response(),
    };
    let mut head = vec![0u8; 512];
    let n = file.read(&mut head).await.unwrap_or(0);
    head.truncate(n);
    let text = std::str::from_utf8(&head).is_ok() || head.len() == 512 && !head.contains(&0);
    let kind = if text {
        "text/plain; charset=utf-8"
    } else {
        "application/octet-stream"
    };
    let first = bytes::Bytes::from(head);
    let rest = futures::stream::unfold(file, |mut f| async move {
        let mut buf = vec![0u8; 64 * 1024];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(bytes::Bytes::from(buf)), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    });
    let body = futures::StreamExt::chain(futures::stream::once(async move { Ok(first) }), rest);
    ([(header::CONTENT_TYPE, kind)], Body::from_stream(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_listings_and_escapes() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("pods")).unwrap();
        std::fs::write(root.path().join("syslog"), "line one\n").unwrap();
        std::fs::write(root.path().join("a<b"), "x").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("link")).unwrap();

        let body = |r: Response| async move {
            let b = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
            String::from_utf8_lossy(&b).into_owned()
        };
        let r = serve(root.path(), "", "/logs/").await;
        assert_eq!(r.status(), StatusCode::OK);
        let html = body(r).await;
        assert!(html.contains("<a href=\"pods/\">pods/</a>"), "{html}");
        assert!(html.contains("<a href=\"syslog\">syslog</a>"), "{html}");
        assert!(html.contains("<a href=\"a%3Cb\">a&lt;b</a>"), "{html}");
        let r = serve(root.path(), "syslog", "/logs/syslog").await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(body(r).await, "line one\n");
        let r = serve(root.path(), "pods", "/logs/pods").await;
        assert_eq!(r.status(), StatusCode::MOVED_PERMANENTLY);
        assert_eq!(r.headers()[header::LOCATION], "pods/");
        assert_eq!(
            serve(root.path(), "../etc/passwd", "/logs/../etc/passwd")
                .await
                .status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            serve(root.path(), "pods/../../x", "/logs/pods/../../x").await.status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            serve(root.path(), "link", "/logs/link").await.status(),
            StatusCode::NOT_FOUND,
            "a symlink out is refused"
        );
        assert_eq!(
            serve(root.path(), "missing", "/logs/missing").await.status(),
            StatusCode::NOT_FOUND
        );
    }
}
