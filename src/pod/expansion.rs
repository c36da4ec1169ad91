//! Kubernetes' `$(VAR)` expansion (third_party/forked/golang/expansion): used for env values,
//! command and args, subPathExpr, and exec probe commands.

/// Kubernetes' `expansion.Expand`: `$(NAME)` is replaced when `lookup` knows NAME and kept as
/// written when it does not, `$$` is a literal `$`, any other `$` stays.
pub fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let b = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < b.len() {
        if b[cursor] == b'$' && cursor + 1 < b.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            let advance = match rest.as_bytes()[0] {
                b'$' => {
                    out.push('$');
                    1
                }
                b'(' => match rest[1..].find(')') {
                    Some(i) => {
                        let name = &rest[1..i + 1];
                        match lookup(name) {
                            Some(v) => out.push_str(&v),
                            None => {
                                out.push_str("$(");
                                out.push_str(name);
                                out.push(')');
                            }
                        }
                        i + 2
                    }
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                _ => {
                    let ch = rest.chars().next().expect("non-empty");
                    out.push('$');
                    out.push(ch);
                    ch.len_utf8()
                }
            };
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    out.push_str(&input[checkpoint.min(input.len())..]);
    out
}

/// Expand `$(VAR)` in each item with `env` (command and args with the container's environment).
pub fn expand_all(items: &[String], env: &[(String, String)]) -> Vec<String> {
    let lookup = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    items.iter().map(|s| expand(s, &lookup)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(s: &str) -> String {
        let env = [
            ("VAR".to_string(), "val".to_string()),
            ("EMPTY".to_string(), String::new()),
        ];
        let lookup = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        expand(s, &lookup)
    }

    #[test]
    fn expansion_cases_from_kubernetes() {
        assert_eq!(ex("$(VAR)"), "val");
        assert_eq!(ex("___$(VAR)___"), "___val___");
        assert_eq!(ex("$(VAR)$(VAR)"), "valval");
        assert_eq!(ex("$$(VAR)"), "$(VAR)");
        assert_eq!(ex("$$$(VAR)"), "$val");
        assert_eq!(ex("$(UNDEFINED)"), "$(UNDEFINED)");
        assert_eq!(ex("$(EMPTY)x"), "x");
        assert_eq!(ex("$(VAR"), "$(VAR");
        assert_eq!(ex("$VAR"), "$VAR");
        assert_eq!(ex("$"), "$");
        assert_eq!(ex("x$"), "x$");
        assert_eq!(ex("$$"), "$");
        assert_eq!(ex("$()"), "$()");
        assert_eq!(ex("ünï$(VAR)ç"), "ünïvalç");
    }
}
