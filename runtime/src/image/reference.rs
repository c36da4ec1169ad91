//! Image references as Kubernetes and docker write them, normalized the way containerd does:
//! `busybox` -> `docker.io/library/busybox:latest`, `ghcr.io/x/y@sha256:...` kept as is.

use crate::digest::Digest;
use crate::error::{Error, Result};

pub(crate) const DEFAULT_REGISTRY: &str = "docker.io";
pub(crate) const DEFAULT_TAG: &str = "latest";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Fully qualified repository, e.g. `docker.io/library/busybox`.
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

impl Reference {
    /// Parse and normalize. A reference with neither tag nor digest gets `:latest`.
    pub fn parse(input: &str) -> Result<Reference> {
        let bad = |reason: &str| Error::InvalidReference {
            reference: input.to_string(),
            reason: reason.to_string(),
        };
        if input.is_empty() {
            return Err(bad("empty"));
        }
        let (rest, digest) = match input.split_once('@') {
            Some((r, d)) => (r, Some(Digest::parse(d).map_err(|e| bad(&e))?)),
            None => (input, None),
        };
        // A tag is after the last ':' that comes after the last '/' (a ':' before it is a port).
        let last_slash = rest.rfind('/').map(|i| i + 1).unwrap_or(0);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(rest[last_slash + i + 1..].to_string())),
            None => (rest, None),
        };
        if let Some(t) = &tag {
            let ok = !t.is_empty()
                && t.len() <= 128
                && t.chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-');
            if !ok {
                return Err(bad("invalid tag"));
            }
        }
        let mut parts: Vec<&str> = name.split('/').collect();
        let domain = if parts.len() > 1 && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost")
        {
            parts.remove(0).to_string()
        } else {
            DEFAULT_REGISTRY.to_string()
        };
        if domain.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(bad("registry must be lowercase"));
        }
        if parts.is_empty() || parts.iter().any(|p| !valid_path_component(p)) {
            return Err(bad(
                "repository path components must be lowercase letters, digits and . _ - separators",
            ));
        }
        if domain == DEFAULT_REGISTRY && parts.len() == 1 {
            parts.insert(0, "library");
        }
        let tag = if tag.is_none() && digest.is_none() {
            Some(DEFAULT_TAG.to_string())
        } else {
            tag
        };
        Ok(Reference {
            repository: format!("{domain}/{}", parts.join("/")),
            tag,
            digest,
        })
    }

    /// The normalized string form, `repo:tag`, `repo@digest` or `repo:tag@digest`.
    pub fn normalized(&self) -> String {
        let mut s = self.repository.clone();
        if let Some(t) = &self.tag {
            s.push(':');
            s.push_str(t);
        }
        if let Some(d) = &self.digest {
            s.push('@');
            s.push_str(&d.to_string());
        }
        s
    }
}

fn valid_path_component(p: &str) -> bool {
    if p.is_empty() {
        return false;
    }
    let b = p.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    b.iter().all(|&c| alnum(c) || c == b'.' || c == b'_' || c == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> String {
        Reference::parse(s).unwrap().normalized()
    }

    #[test]
    fn normalizes_like_containerd() {
        assert_eq!(n("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(n("busybox:1.35"), "docker.io/library/busybox:1.35");
        assert_eq!(n("user/app"), "docker.io/user/app:latest");
        assert_eq!(n("ghcr.io/a/b:v1"), "ghcr.io/a/b:v1");
        assert_eq!(n("localhost:5000/x"), "localhost:5000/x:latest");
        assert_eq!(n("localhost/x:1"), "localhost/x:1");
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(n(&format!("busybox@{d}")), format!("docker.io/library/busybox@{d}"));
    }

    #[test]
    fn rejects_bad_references() {
        for bad in ["", "Busybox", "busybox:", "a//b", "busybox:-x", "x@sha256:12"] {
            assert!(Reference::parse(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn familiar_form() {}
}
