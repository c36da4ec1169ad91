//! Registry authentication: `WWW-Authenticate` challenges (RFC 7235) and the distribution
//! token flow's response.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// One challenge: `Bearer realm="...",service="...",scope="..."` or `Basic realm="..."`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Challenge {
    /// Lowercased: `bearer`, `basic`.
    pub scheme: String,
    /// Parameter names lowercased.
    pub params: BTreeMap<String, String>,
}

impl Challenge {
    pub(crate) fn param(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }
}

/// Parse a `WWW-Authenticate` header value into its challenges. Parameters may be tokens
/// or quoted strings (with `\` escapes, commas inside quotes kept).
pub(crate) fn parse_www_authenticate(value: &str) -> Vec<Challenge> {
    let mut out: Vec<Challenge> = Vec::new();
    let b = value.as_bytes();
    let mut i = 0;
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && (b[*i] == b' ' || b[*i] == b'\t' || b[*i] == b',') {
            *i += 1;
        }
    };
    let token = |i: &mut usize| -> String {
        let start = *i;
        while *i < b.len() && !matches!(b[*i], b' ' | b'\t' | b',' | b'=' | b'"') {
            *i += 1;
        }
        value[start..*i].to_string()
    };
    loop {
        skip_ws(&mut i);
        if i >= b.len() {
            break;
        }
        let word = token(&mut i);
        if word.is_empty() {
            // Stray character: skip it.
            i += 1;
            continue;
        }
        // `name=value` continues the current challenge; a bare word starts a new one.
        let mut j = i;
        while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
            j += 1;
        }
        if j < b.len() && b[j] == b'=' && !out.is_empty() {
            i = j + 1;
            while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
                i += 1;
            }
            let val = if i < b.len() && b[i] == b'"' {
                i += 1;
                let mut v = String::new();
                let mut chars = value[i..].char_indices();
                let mut end = value.len();
                while let Some((k, c)) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some((_, n)) = chars.next() {
                                v.push(n);
                            }
                        }
                        '"' => {
                            end = i + k + 1;
                            break;
                        }
                        c => v.push(c),
                    }
                }
                i = end;
                v
            } else {
                token(&mut i)
            };
            if let Some(c) = out.last_mut() {
                c.params.insert(word.to_ascii_lowercase(), val);
            }
        } else {
            out.push(Challenge {
                scheme: word.to_ascii_lowercase(),
                params: BTreeMap::new(),
            });
        }
    }
    out
}

/// The token server's answer (distribution's token spec; `access_token` is OAuth2's name).
#[derive(Debug, Deserialize)]
pub(crate) struct TokenResponse {
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub access_token: Option<String>,
    #[serde(default)]
    pub expires_in: Option<u64>,
}

impl TokenResponse {
    pub(crate) fn bearer(&self) -> Option<&str> {
        self.token
            .as_deref()
            .filter(|t| !t.is_empty())
            .or(self.access_token.as_deref().filter(|t| !t.is_empty()))
    }

    /// How long to reuse the token: `expires_in` (60 s when missing or shorter, as the
    /// spec says), less a margin for the requests it will be sent with.
    pub(crate) fn lifetime(&self) -> Duration {
        let secs = self.expires_in.unwrap_or(60).max(60);
        Duration::from_secs(secs - 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_and_basic_challenges() {
        let c = parse_www_authenticate(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull""#,
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].scheme, "bearer");
        assert_eq!(c[0].param("realm"), Some("https://auth.docker.io/token"));
        assert_eq!(c[0].param("service"), Some("registry.docker.io"));
        assert_eq!(c[0].param("scope"), Some("repository:library/busybox:pull"));

        let c = parse_www_authenticate(r#"Basic realm="Registry Realm""#);
        assert_eq!(c[0].scheme, "basic");
        assert_eq!(c[0].param("realm"), Some("Registry Realm"));

        // Commas and escaped quotes inside quotes, tokens unquoted, two challenges.
        let c = parse_www_authenticate(
            r#"Bearer realm="https://r/t",scope="repository:a/b:pull,push", error=invalid_token, Basic realm="x \"y\"""#,
        );
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].param("scope"), Some("repository:a/b:pull,push"));
        assert_eq!(c[0].param("error"), Some("invalid_token"));
        assert_eq!(c[1].scheme, "basic");
        assert_eq!(c[1].param("realm"), Some("x \"y\""));

        assert!(parse_www_authenticate("").is_empty());
        assert_eq!(parse_www_authenticate("Negotiate")[0].scheme, "negotiate");
    }

    #[test]
    fn token_response_fields() {
        let t: TokenResponse = serde_json::from_str(r#"{"access_token":"a","expires_in":300}"#).unwrap();
        assert_eq!(t.bearer(), Some("a"));
        assert_eq!(t.lifetime(), Duration::from_secs(290));
        let t: TokenResponse = serde_json::from_str(r#"{"token":"t","access_token":"a"}"#).unwrap();
        assert_eq!(t.bearer(), Some("t"));
        assert_eq!(t.lifetime(), Duration::from_secs(50));
        let t: TokenResponse = serde_json::from_str(r#"{"token":""}"#).unwrap();
        assert_eq!(t.bearer(), None);
    }
}
