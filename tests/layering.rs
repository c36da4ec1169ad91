//! The floors of the agent (docs/agent.md#floors): each module of `src/` (a top-level folder
//! or file) stands on a floor of [`FLOORS`] and imports only its own folder and modules on
//! lower floors, so that the modules form no circle and a lower one never reaches up. This
//! test reads `src/**/*.rs` (no kernel, no build of the agent), finds every `crate::<module>`
//! path outside `#[cfg(test)]` items (comments and strings aside; `use crate::{a, b::c}`
//! groups and `super::super::` paths that climb to the crate root included; `ferrolet::` in
//! main.rs), and fails on an import that runs up or sideways, and on a module the table does
//! not place. The table in docs/agent.md must say the same.
//!
//! A lower module that needs something of a higher one is told it by its caller (a function
//! or a value handed down), or the thing it needs moves down to where both can reach it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Each floor with its modules, from the ground up. A module may import only modules on
/// strictly lower floors, or its own folder.
const FLOORS: &[(u32, &[&str])] = &[
    // Vocabulary and tools that import nothing of the agent.
    (1, &["apis", "backoff", "metrics", "pod", "tasks"]),
    (2, &["checkpoint", "config", "pluginmanager"]),
    (3, &["kubeclient"]),
    (4, &["events", "mirror", "probe"]),
    (5, &["lifecycle", "node", "prober"]),
    (6, &["cm"]),
    (7, &["podconfig"]),
    (8, &["objects"]),
    (9, &["images", "volumemanager"]),
    (10, &["podsetup"]),
    (11, &["kuberuntime"]),
    (12, &["stats", "status"]),
    (13, &["eviction"]),
    (14, &["nodeshutdown", "server", "worker"]),
    (15, &["agent"]),
    (16, &["cli"]),
    (17, &["main"]),
];

/// The library's root: it declares the modules and imports none.
const CRATE_ROOT: &str = "lib";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn floors() -> BTreeMap<&'static str, u32> {
    let mut m = BTreeMap::new();
    for (floor, mods) in FLOORS {
        for name in *mods {
            assert!(m.insert(*name, *floor).is_none(), "{name} is on two floors of FLOORS");
        }
    }
    m
}

/// The `.rs` files under `dir`, sorted.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The modules of `src/`: its folders and its files (without `.rs`).
fn modules(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_string();
            if p.is_dir() {
                Some(name)
            } else {
                name.strip_suffix(".rs").map(str::to_string)
            }
        })
        .collect()
}

/// `text` with comments, string and char literals blanked (newlines kept, so byte offsets
/// and line numbers stay those of the file).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let start = i;
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                blank(&mut out, start, i);
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i..].starts_with(b"/*") {
                        depth += 1;
                        i += 2;
                    } else if b[i..].starts_with(b"*/") {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                blank(&mut out, start, i);
            }
            // Raw strings: r"...", r#"..."#, br"...".
            b'r' | b'b' if (i == 0 || !is_ident(b[i - 1])) && raw_string_hashes(&b[i..]).is_some() => {
                let (open, hashes) = raw_string_hashes(&b[i..]).unwrap();
                i += open;
                let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
                while i < b.len() && !b[i..].starts_with(&close) {
                    i += 1;
                }
                i = (i + close.len()).min(b.len());
                blank(&mut out, start, i);
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(b.len());
                blank(&mut out, start, i);
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{..}', a multi-byte char), else a lifetime.
                if b.get(i + 1) == Some(&b'\\') {
                    i += 2;
                    while i < b.len() && b[i] != b'\'' {
                        i += 1;
                    }
                    i += 1;
                    blank(&mut out, start, i);
                } else if let Some(c) = text[i + 1..].chars().next() {
                    if text[i + 1 + c.len_utf8()..].starts_with('\'') {
                        i += 2 + c.len_utf8();
                        blank(&mut out, start, i);
                    } else {
                        i += 1;
                    }
                } else {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    String::from_utf8(out).unwrap()
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// At a raw string's start (`r"`, `r#"`, `br"`...): the length of its opening and its `#`s.
fn raw_string_hashes(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    if b.first() == Some(&b'b') {
        i += 1;
    }
    if b.get(i) != Some(&b'r') {
        return None;
    }
    i += 1;
    let hashes = b[i..].iter().take_while(|c| **c == b'#').count();
    i += hashes;
    (b.get(i) == Some(&b'"')).then_some((i + 1, hashes))
}

/// `code` with every `#[cfg(test)]` item blanked: the attribute through the item's closing
/// `}` or `;`.
fn without_test_items(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = b.to_vec();
    let mut from = 0;
    while let Some(at) = find_cfg_test(&code[from..]).map(|p| p + from) {
        let mut i = at;
        let (mut parens, mut end) = (0i32, b.len());
        while i < b.len() {
            match b[i] {
                b'(' | b'[' => parens += 1,
                b')' | b']' => parens -= 1,
                b';' if parens == 0 => {
                    end = i + 1;
                    break;
                }
                b'{' if parens == 0 => {
                    end = matching_brace(b, i) + 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        for c in &mut out[at..end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        from = end;
    }
    String::from_utf8(out).unwrap()
}

/// Where `#[cfg(test)]` (any spacing) starts in `code`.
fn find_cfg_test(code: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(p) = code[from..].find("#").map(|p| p + from) {
        let squeezed: String = code[p..].chars().filter(|c| !c.is_whitespace()).take(12).collect();
        if squeezed == "#[cfg(test)]" {
            return Some(p);
        }
        from = p + 1;
    }
    None
}

fn matching_brace(b: &[u8], open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in b.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    b.len() - 1
}

/// One import of another module: where, the path as written, the module it names.
struct Import {
    line: usize,
    path: String,
    module: String,
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .unwrap_or(s.len());
    &s[..end]
}

fn skip_ws(s: &str) -> &str {
    s.trim_start()
}

/// The modules named by the paths that start at `root` (`crate`, or `ferrolet` in main.rs)
/// and by `super::` chains that climb to the crate root. `depth`: how many modules deep the
/// file is (`src/pod/mod.rs` 1, `src/pod/manager.rs` 2).
fn imports(code: &str, root: &str, depth: usize) -> Vec<Import> {
    let b = code.as_bytes();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    // The inline modules open at each point, for super:: chains.
    let mut inline_mods: Vec<usize> = Vec::new();
    let mut braces = 0usize;
    let mut i = 0;
    while i < b.len() {
        let word_start = i == 0 || !is_ident(b[i - 1]);
        if b[i] == b'{' {
            braces += 1;
        } else if b[i] == b'}' {
            braces = braces.saturating_sub(1);
            if inline_mods.last() == Some(&braces) {
                inline_mods.pop();
            }
        } else if word_start && b[i..].starts_with(b"mod") && !is_ident(*b.get(i + 3).unwrap_or(&b' ')) {
            let rest = skip_ws(&code[i + 3..]);
            let name = ident_at(rest);
            if !name.is_empty() && skip_ws(&rest[name.len()..]).starts_with('{') {
                inline_mods.push(braces);
            }
        } else if word_start
            && b[i..].starts_with(root.as_bytes())
            && !is_ident(*b.get(i + root.len()).unwrap_or(&b' '))
        {
            if let Some(rest) = skip_ws(&code[i + root.len()..]).strip_prefix("::") {
                for m in first_segments(skip_ws(rest)) {
                    found.push(Import {
                        line: line_of(i),
                        path: format!("{root}::{m}"),
                        module: m,
                    });
                }
            }
        } else if word_start && b[i..].starts_with(b"super") && (i < 2 || &b[i - 2..i] != b"::") {
            // A chain super::super::...: it reaches the crate root after as many supers as
            // the module at this point is deep.
            let mut rest = &code[i..];
            let mut supers = 0;
            while let Some(r) = rest.strip_prefix("super").and_then(|r| skip_ws(r).strip_prefix("::")) {
                supers += 1;
                rest = skip_ws(r);
            }
            if supers > 0 && supers == depth + inline_mods.len() {
                for m in first_segments(rest) {
                    found.push(Import {
                        line: line_of(i),
                        path: format!("{}{m}", "super::".repeat(supers)),
                        module: m,
                    });
                }
            }
        }
        i += 1;
    }
    found
}

/// The first segments of what follows `crate::`: one name, or each entry of a `{...}` group.
fn first_segments(rest: &str) -> Vec<String> {
    if let Some(group) = rest.strip_prefix('{') {
        let close = matching_brace(rest.as_bytes(), 0);
        let inner = &group[..close - 1];
        let mut out = Vec::new();
        let mut depth = 0;
        let mut entry_start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(ident_at(skip_ws(&inner[entry_start..i])).to_string());
                    entry_start = i + 1;
                }
                _ => {}
            }
        }
        out.push(ident_at(skip_ws(&inner[entry_start..])).to_string());
        out.retain(|m| !m.is_empty() && m != "self");
        out
    } else {
        vec![ident_at(rest).to_string()]
    }
}

/// Every import of another module of `src/` that the floors do not allow, and every module
/// the table does not place.
fn violations(src: &Path) -> Vec<String> {
    let floors = floors();
    let mods = modules(src);
    let mut bad = Vec::new();
    for m in &mods {
        if m != CRATE_ROOT && !floors.contains_key(m.as_str()) {
            bad.push(format!(
                "src/{m}: a module on no floor; place it in FLOORS (tests/layering.rs) and docs/agent.md#floors"
            ));
        }
    }
    for name in floors.keys() {
        if !mods.contains(*name) {
            bad.push(format!("FLOORS names {name}, which src/ does not have"));
        }
    }
    let mut files = Vec::new();
    rust_files(src, &mut files);
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        let comps: Vec<&str> = rel.iter().map(|c| c.to_str().unwrap()).collect();
        let me = comps[0].strip_suffix(".rs").unwrap_or(comps[0]);
        if me == CRATE_ROOT {
            continue;
        }
        let Some(&my_floor) = floors.get(me) else {
            continue;
        };
        // The module path's depth: src/x.rs and src/x/mod.rs 1, src/x/y.rs 2, src/x/y/mod.rs 2.
        let depth = comps.len() - usize::from(comps.len() > 1 && *comps.last().unwrap() == "mod.rs");
        let root = if me == "main" { "ferrolet" } else { "crate" };
        let text = std::fs::read_to_string(&file).unwrap();
        let code = without_test_items(&code_only(&text));
        for imp in imports(&code, root, depth) {
            if imp.module == me || !mods.contains(&imp.module) {
                continue;
            }
            let Some(&their_floor) = floors.get(imp.module.as_str()) else {
                continue;
            };
            if their_floor >= my_floor {
                bad.push(format!(
                    "src/{}:{}: {} runs {}: {me} is on floor {my_floor}, {} on floor {their_floor}",
                    rel.display(),
                    imp.line,
                    imp.path,
                    if their_floor == my_floor { "sideways" } else { "up" },
                    imp.module,
                ));
            }
        }
    }
    bad
}

#[test]
fn imports_run_down_the_floors() {
    let bad = violations(&repo().join("src"));
    let mut msg = String::new();
    for b in &bad {
        writeln!(msg, "  {b}").unwrap();
    }
    assert!(
        bad.is_empty(),
        "imports that the floors do not allow (tests/layering.rs FLOORS, docs/agent.md#floors):\n{msg}\
         A lower module that needs something of a higher one is told it by its caller, or the thing moves down."
    );
}

/// docs/agent.md's table of floors: `| <floor> | `a`, `b` | ... |` rows under `### Floors`.
#[test]
fn docs_describe_the_floors() {
    let doc = std::fs::read_to_string(repo().join("docs/agent.md")).unwrap();
    let section = doc
        .split("\n### Floors\n")
        .nth(1)
        .expect("docs/agent.md has a ### Floors section");
    let section = section.split("\n#").next().unwrap();
    let mut documented: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let Some(floor) = cells.get(1).and_then(|c| c.parse::<u32>().ok()) else {
            continue;
        };
        let names = cells[2]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|s| s.trim_end_matches('/').trim_end_matches(".rs").to_string());
        documented.entry(floor).or_default().extend(names);
    }
    let table: BTreeMap<u32, BTreeSet<String>> = FLOORS
        .iter()
        .map(|(f, mods)| (*f, mods.iter().map(|m| m.to_string()).collect()))
        .collect();
    assert_eq!(
        documented, table,
        "docs/agent.md#floors and FLOORS in tests/layering.rs differ"
    );
}

/// The checker itself, on small pieces of code.
#[test]
fn finds_imports_as_written() {
    let names = |code: &str, depth| -> Vec<String> {
        imports(&without_test_items(&code_only(code)), "crate", depth)
            .into_iter()
            .map(|i| i.module)
            .collect()
    };
    assert_eq!(names("use crate::pod::{self, Phase};", 1), ["pod"]);
    assert_eq!(
        names(
            "use crate::{\n    events::Kind,\n    node::{a, b},\n    self,\n    tasks,\n};",
            1
        ),
        ["events", "node", "tasks"]
    );
    assert_eq!(names("let x = crate :: status::Phase::of(s);", 2), ["status"]);
    assert_eq!(names("fn f() -> crate::events::Kind { todo!() }", 1), ["events"]);
    // Comments, strings and char literals are not imports.
    assert!(names(
        "// crate::status\n/// [`crate::status`]\n/* crate::x */ let s = \"crate::y\";",
        1
    )
    .is_empty());
    assert!(names(
        "let s = r#\"crate::status\"#; let c = '\"'; let l: &'static str = \"\";",
        1
    )
    .is_empty());
    assert_eq!(names("fn f<'a>(x: &'a str) -> crate::status::Phase {}", 1), ["status"]);
    // Nor are the ones of test items.
    assert!(names("#[cfg(test)]\nmod tests {\n    use crate::status;\n}\n", 1).is_empty());
    assert!(names(
        "#[cfg(test)]\nuse crate::status;\n#[cfg( test )]\nfn f(a: [u8; 2]) { crate::x::y(); }",
        1
    )
    .is_empty());
    assert_eq!(names("#[cfg(not(test))]\nuse crate::status;", 1), ["status"]);
    // Not a path of the crate: `$crate` is; `my_crate::x` is not.
    assert_eq!(names("$crate::tasks::spawn()", 1), ["tasks"]);
    assert!(names("my_crate::status::x(); ferrolet::status::y();", 1).is_empty());
    // super:: chains that climb to the crate root, from a file two deep and an inline module.
    assert_eq!(names("use super::super::status::Phase;", 2), ["status"]);
    assert!(names("use super::labels;", 2).is_empty());
    assert_eq!(
        names("mod inner {\n    use super::super::super::status;\n}", 2),
        ["status"]
    );
    assert!(names("mod inner {\n    use super::super::labels;\n}\nuse super::x;", 2).is_empty());
}
