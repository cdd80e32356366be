//! The shape of the code, checked: the layers of DESIGN.md ("Layers") import only downwards,
//! the dialect of an upstream is decided in one module, and no function grows past 80 lines
//! unless a comment right above it says why (`// Long on purpose: ...`).
//!
//! These read the source as text, which is what a reviewer reads; a module that moves must
//! move its rule here too.

use std::path::{Path, PathBuf};

fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// Source text with comments, string and char literals blanked (braces inside them do not
/// count), line structure kept.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
            continue;
        }
        // Raw strings: r"..", r#".."#, br"..".
        if (c == b'r' || (c == b'b' && b.get(i + 1) == Some(&b'r')))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            let mut j = i + if c == b'b' { 2 } else { 1 };
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) == Some(&b'"') {
                j += 1;
                let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
                while j < b.len() && !b[j..].starts_with(&close) {
                    if b[j] == b'\n' {
                        out.push('\n');
                    }
                    j += 1;
                }
                i = j + close.len();
                out.push_str("\"\"");
                continue;
            }
        }
        if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                if i < b.len() && b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
            continue;
        }
        // Char literals ('{', '\'', '\u{7b}'), not lifetimes ('a).
        if c == b'\'' {
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..].iter().position(|&x| x == b'\'').map(|p| i + 2 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                // A multi-byte char: find a quote within 5 bytes.
                b[i + 1..b.len().min(i + 6)]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map(|p| i + 1 + p)
                    .filter(|&e| std::str::from_utf8(&b[i + 1..e]).is_ok_and(|s| s.chars().count() == 1))
            };
            if let Some(e) = end {
                out.push_str("' '");
                i = e + 1;
                continue;
            }
        }
        out.push(c as char);
        i += 1;
    }
    out
}

/// (first line, line count, name) of every `fn` with a body.
fn functions(text: &str) -> Vec<(usize, usize, String)> {
    let code = code_only(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(at) = fn_keyword(line) else { continue };
        let name: String = line[at + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // Find the body's opening brace (or a `;`: a declaration without a body).
        let mut depth = 0i64;
        let mut opened = false;
        let mut end = None;
        'scan: for (m, l) in lines.iter().enumerate().skip(n) {
            let start = if m == n { at } else { 0 };
            for ch in l[start..].chars() {
                match ch {
                    ';' if !opened && depth == 0 => break 'scan,
                    '{' => {
                        opened = true;
                        depth += 1;
                    }
                    '}' => {
                        depth -= 1;
                        if opened && depth == 0 {
                            end = Some(m);
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(e) = end {
            out.push((n + 1, e - n + 1, name));
        }
    }
    out
}

/// Where `fn ` starts on a line as the keyword of an item (not inside an identifier).
fn fn_keyword(line: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(p) = line[from..].find("fn ") {
        let at = from + p;
        let before = line[..at].chars().next_back();
        if before.is_none_or(|c| c == ' ' || c == '\t' || c == '(') {
            let rest = &line[at + 3..];
            if rest.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_') {
                return Some(at);
            }
        }
        from = at + 3;
    }
    None
}

#[test]
fn no_function_is_longer_than_80_lines_without_a_reason() {
    let mut long = Vec::new();
    for path in sources(&src()) {
        let text = read(&path);
        let raw: Vec<&str> = text.lines().collect();
        for (line, len, name) in functions(&text) {
            if len <= 80 {
                continue;
            }
            // The reason sits in the comments just above the fn (or its attributes).
            let above = raw[line.saturating_sub(8)..line - 1].iter().any(|l| l.contains("Long on purpose:"));
            if !above {
                long.push(format!("{}:{line} fn {name} is {len} lines", path.display()));
            }
        }
    }
    assert!(long.is_empty(), "functions over 80 lines with no `// Long on purpose:` comment:\n{}", long.join("\n"));
}

#[test]
fn the_length_check_sees_functions_and_skips_braces_in_literals() {
    let text =
        "fn a() {\n    let s = \"}}}\";\n    let c = '}';\n    // }\n}\nfn b();\npub async fn c<'a>(x: &'a str) {\n}\n";
    let got = functions(text);
    assert_eq!(got, vec![(1, 5, "a".to_string()), (7, 2, "c".to_string())], "a body is counted to its own brace");
}

/// Files (relative to src/) whose text contains `needle`.
fn files_with(needle: &str, under: &[&str]) -> Vec<String> {
    let root = src();
    let mut out = Vec::new();
    for path in sources(&root) {
        let rel = path.strip_prefix(&root).map(|p| p.display().to_string()).unwrap_or_default();
        if !under.is_empty() && !under.iter().any(|u| rel == *u || rel.starts_with(&format!("{u}/"))) {
            continue;
        }
        if read(&path).contains(needle) {
            out.push(rel);
        }
    }
    out
}

#[test]
fn lower_layers_never_import_the_proxy() {
    let hits =
        files_with("crate::proxy", &["cloud", "health.rs", "reload.rs", "telemetry", "telemetry.rs", "state.rs"]);
    assert!(hits.is_empty(), "these import the proxy, which sits above them: {hits:?}");
}

#[test]
fn the_node_registry_does_not_know_telemetry() {
    let hits = files_with("crate::telemetry", &["node.rs"]);
    assert!(hits.is_empty(), "node publishes its own state changes; telemetry listens: {hits:?}");
}

#[test]
fn routing_does_not_borrow_from_the_simulator() {
    let hits = files_with("crate::sim", &["route.rs", "admit.rs", "node.rs", "upstream", "cloud", "proxy"]);
    assert!(hits.is_empty(), "product code under test must not depend on the simulator: {hits:?}");
}

#[test]
fn the_dialect_is_decided_only_in_upstream() {
    let hits: Vec<String> =
        files_with("NodeKind::Openai", &[]).into_iter().filter(|f| !f.starts_with("upstream/")).collect();
    assert!(hits.is_empty(), "only src/upstream/ may branch on a node's dialect: {hits:?}");
}

/// The module paths `docs/ARCHITECTURE.md` names, like `src/node.rs` or `src/upstream/`.
fn documented_modules() -> Vec<String> {
    let doc = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md"));
    let layers = doc.split("## One request").next().unwrap_or_default().to_string();
    let mut out: Vec<String> = layers
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.len() > 4 && s.starts_with("src/") && (s.ends_with(".rs") || s.ends_with('/')))
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

#[test]
fn architecture_names_every_module_and_only_real_ones() {
    let documented = documented_modules();
    let root = src();
    let mut actual = Vec::new();
    for e in std::fs::read_dir(&root).expect("src/").flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if e.path().is_dir() {
            actual.push(format!("src/{name}/"));
        } else if name.ends_with(".rs") {
            actual.push(format!("src/{name}"));
        }
    }
    actual.sort();
    let missing: Vec<&String> = actual.iter().filter(|m| !documented.contains(m)).collect();
    let stale: Vec<&String> = documented.iter().filter(|m| !actual.contains(m)).collect();
    assert!(missing.is_empty(), "docs/ARCHITECTURE.md does not place these in a layer: {missing:?}");
    assert!(stale.is_empty(), "docs/ARCHITECTURE.md names modules that do not exist: {stale:?}");
}
