//! Decoding JSON into typed values through one deserializer per type.
//!
//! Every type the agent decodes is compiled once per kind of input its decoder reads: a Pod
//! decoded from text, from a `serde_json::Value` and through a path-tracking wrapper is three
//! copies of k8s-openapi's whole visitor tree (docs/static-build.md). kube-client decodes API
//! responses from text (`serde_json::from_str`), so the agent decodes from text too: records
//! ([`decode_text`]) and values ([`decode_value`], which writes the value out first).
//!
//! A value (a manifest, a configuration file) comes from a person, so its errors must name the
//! field. [`decode_value`] finds it from where the decoder stopped in the text it wrote: the
//! keys and list indices open at that byte are the path.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// JSON text decoded as `serde_json::from_str` decodes it, which is how kube-client decodes
/// API responses: every type the agent reads both from the API and from its records (a Pod,
/// a Node) is then compiled once, not once per kind of input.
pub fn decode_text<T: DeserializeOwned>(data: &[u8]) -> serde_json::Result<T> {
    let text = std::str::from_utf8(data).map_err(<serde_json::Error as serde::de::Error>::custom)?;
    serde_json::from_str(text)
}

/// Why a value is not a `T`: the field (`spec.containers[0].image`, empty at the top) and the
/// decoder's reason, without the position in text the caller never saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError {
    pub path: String,
    pub reason: String,
}

impl std::fmt::Display for ValueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.path, self.reason)
        }
    }
}

impl std::error::Error for ValueError {}

/// Decode `v` as a `T` through the same decoder as [`decode_text`]; the error names the field.
pub fn decode_value<T: DeserializeOwned>(v: &Value) -> Result<T, ValueError> {
    // Compact text: one line, so the error's column is the byte offset into it.
    let text = v.to_string();
    serde_json::from_str(&text).map_err(|e| {
        let end = if e.line() == 1 {
            e.column().min(text.len())
        } else {
            text.len()
        };
        let message = e.to_string();
        let reason = match message.rfind(" at line ") {
            Some(i) => message[..i].to_string(),
            None => message,
        };
        ValueError {
            path: path_at(&text, end),
            reason,
        }
    })
}

/// One open container of the JSON text being walked.
enum Open {
    /// An object: the key whose value is being read (none right after `{` or a comma).
    Object(Option<String>),
    /// A list: the index of the item being read, none until it starts.
    List { index: usize, started: bool },
}

/// The path of whatever is being read at byte `end` of the well-formed JSON `text`: the keys
/// (dot-separated) and indices (`[i]`) of the containers open there. A value that has ended is
/// still the one being read until the comma after it, and a container just closed is the
/// value of its parent's key, which is where a decoder reports a wrong value or a missing
/// field.
pub fn path_at(text: &str, end: usize) -> String {
    let bytes = &text.as_bytes()[..end.min(text.len())];
    let mut open: Vec<Open> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        // An item of a list starts with anything but the list's own punctuation.
        if let Some(Open::List { started, .. }) = open.last_mut() {
            if !matches!(b, b' ' | b'\n' | b'\t' | b'\r' | b',' | b']') {
                *started = true;
            }
        }
        match b {
            b'{' => open.push(Open::Object(None)),
            b'[' => open.push(Open::List {
                index: 0,
                started: false,
            }),
            b'}' | b']' => {
                open.pop();
            }
            b',' => match open.last_mut() {
                Some(Open::Object(key)) => *key = None,
                Some(Open::List { index, started }) => {
                    *index += 1;
                    *started = false;
                }
                None => {}
            },
            b'"' => {
                let start = i;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                if i >= bytes.len() {
                    break; // the text ends inside this string
                }
                if let Some(Open::Object(key @ None)) = open.last_mut() {
                    let raw = &text[start..=i];
                    *key = Some(serde_json::from_str(raw).unwrap_or_else(|_| raw.to_string()));
                }
            }
            _ => {}
        }
        i += 1;
    }
    let mut path = String::new();
    for o in &open {
        match o {
            Open::Object(Some(key)) => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
            }
            Open::List { index, started: true } => path.push_str(&format!("[{index}]")),
            _ => {}
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Pod {
        spec: Spec,
    }
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Spec {
        containers: Vec<Container>,
        #[serde(default)]
        labels: std::collections::BTreeMap<String, u32>,
    }
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Container {
        name: String,
        #[serde(default)]
        env: Vec<Env>,
    }
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Env {
        name: String,
        value: Option<String>,
    }

    fn err(v: Value) -> ValueError {
        decode_value::<Pod>(&v).unwrap_err()
    }

    #[test]
    fn a_wrong_value_is_named_by_its_path() {
        let e = err(json!({"spec": {"containers": [{"name": "a"}, {"name": "b", "env": [
            {"name": "x", "value": "1"}, {"name": "y", "value": 5}]}]}}));
        assert_eq!(e.path, "spec.containers[1].env[1].value");
        assert_eq!(e.reason, "invalid type: integer `5`, expected a string");
        assert_eq!(
            e.to_string(),
            "spec.containers[1].env[1].value: invalid type: integer `5`, expected a string"
        );
    }

    #[test]
    fn a_missing_field_names_its_object() {
        let e = err(json!({"spec": {"containers": [{"name": "a"}, {"env": []}]}}));
        assert_eq!(e.path, "spec.containers[1]");
        assert_eq!(e.reason, "missing field `name`");
        let e = err(json!({}));
        assert_eq!((e.path.as_str(), e.reason.as_str()), ("", "missing field `spec`"));
        assert_eq!(e.to_string(), "missing field `spec`");
    }

    #[test]
    fn a_container_where_another_kind_belongs_is_named() {
        let e = err(json!({"spec": {"containers": {"name": "a"}}}));
        assert_eq!(e.path, "spec.containers");
        assert!(e.reason.starts_with("invalid type: map, expected a sequence"), "{e}");
        let e = err(json!({"spec": {"containers": [{"name": "a"}, 5]}}));
        assert_eq!(e.path, "spec.containers[1]");
        let e = err(json!({"spec": "x"}));
        assert_eq!(e.path, "spec");
    }

    #[test]
    fn keys_with_quotes_brackets_and_escapes_are_read_whole() {
        let e = err(json!({"spec": {"containers": [], "labels": {"a\"{[,": 1, "b\\": "two"}}}));
        assert_eq!(e.path, "spec.labels.b\\");
        let e = err(json!({"spec": {"containers": [{"name": "[{,\"", "env": [{"name": 1}]}]}}));
        assert_eq!(e.path, "spec.containers[0].env[0].name");
    }

    #[test]
    fn a_good_value_decodes() {
        let p: Pod = decode_value(&json!({"spec": {"containers": [{"name": "a", "env": [{"name": "x"}]}]}})).unwrap();
        assert_eq!(p.spec.containers[0].env[0].name, "x");
    }

    #[test]
    fn paths_of_positions_in_text() {
        let t = r#"{"a":[1,{"b":[true,"x"]}],"c":{}}"#;
        let at = |s: &str| path_at(t, t.find(s).unwrap() + s.len());
        assert_eq!(at("{"), "");
        assert_eq!(at(r#"{"a":["#), "a");
        assert_eq!(at(r#"{"a":[1"#), "a[0]");
        assert_eq!(at(r#"{"a":[1,"#), "a");
        assert_eq!(at(r#""b":[true"#), "a[1].b[0]");
        assert_eq!(at(r#"true,"x""#), "a[1].b[1]");
        assert_eq!(at(r#""x"]}"#), "a[1]");
        assert_eq!(at(r#""c":{}"#), "c");
        assert_eq!(path_at(t, t.len()), "");
        // The text ends inside a string: the string is not a key yet.
        assert_eq!(path_at(t, t.find("\"c").unwrap() + 2), "");
    }
}
