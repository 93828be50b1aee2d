//! The library's layout, checked from its sources: no import circle
//! between `src` modules, and no arrow from a lower wing to a higher one
//! (docs/architecture.md, "Layout", gives the order and why).
//!
//! Every `crate::...` and `super::...` path in the code of a library file
//! (comments, string literals and `#[cfg(test)] mod tests` left out) is an
//! arrow from that file's module to the module the path names: the
//! longest prefix of the path that is a module file, after the crate
//! root's own re-exports (`crate::NodeId`) are followed to where they
//! point. An arrow between a module and one of its own submodules is not
//! counted (a folder's file is its door: `peer.rs` and `peer/links.rs`
//! talk both ways). The binary crate (`main.rs`, `cli/`, `bin/`) is
//! outside the library and not checked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The wings, lowest first, each named by the module paths it holds. A
/// module belongs to the wing of the longest prefix that names it; a wing
/// may use its own modules and the wings below it, never one above.
const WINGS: &[(&str, &[&str])] = &[
    ("engine", &["crate::engine"]),
    ("config", &["crate::config"]),
    ("seam", &["crate::seam"]),
    (
        "adapters base",
        &[
            "crate::adapters",
            "crate::adapters::wire",
            "crate::adapters::framing",
            "crate::adapters::body",
            "crate::adapters::tunnel",
            "crate::adapters::access",
            "crate::adapters::metrics",
        ],
    ),
    ("cluster", &["crate::adapters::cluster"]),
    ("transport", &["crate::adapters::transport"]),
    ("http", &["crate::adapters::http"]),
    (
        "adapters state",
        &["crate::adapters::node_state", "crate::adapters::errors"],
    ),
    ("ops", &["crate::adapters::ops"]),
    ("serve", &["crate::adapters::serve"]),
    ("front", &["crate::adapters::front"]),
    (
        "root",
        &[
            "crate",
            "crate::env",
            "crate::node",
            "crate::explain",
            "crate::fuzz",
            "crate::sim",
        ],
    ),
];

/// The files of the binary crate, relative to `src/`.
fn in_binary(rel: &Path) -> bool {
    let first = rel
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    matches!(first.as_deref(), Some("main.rs" | "cli.rs" | "cli" | "bin"))
}

/// `crate::a::b` for `a/b.rs` (`crate` for `lib.rs`).
fn module_of(rel: &Path) -> String {
    let mut parts = vec!["crate".to_owned()];
    for c in rel.with_extension("").components() {
        parts.push(c.as_os_str().to_string_lossy().into_owned());
    }
    if parts == ["crate", "lib"] {
        parts.pop();
    }
    parts.join("::")
}

/// The code of a file without comments, string and char literals, and
/// without its `#[cfg(test)]` test module at the end.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let b = text.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b'r' if b.get(i + 1) == Some(&b'"')
                || (b.get(i + 1) == Some(&b'#')
                    && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))) =>
            {
                // A raw string: r"..." or r#"..."#.
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                j += 1;
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                while j < b.len() && !b[j..].starts_with(&close) {
                    j += 1;
                }
                i = j + close.len();
                out.push_str("\"\"");
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
                let rest = &text[i + 1..];
                let lit = if rest.starts_with('\\') {
                    rest.find('\'').map(|e| e + 2)
                } else {
                    let mut cs = rest.char_indices();
                    match (cs.next(), cs.next()) {
                        (Some(_), Some((e, '\''))) => Some(e + 2),
                        _ => None,
                    }
                };
                match lit {
                    Some(n) => {
                        i += n;
                        out.push_str("' '");
                    }
                    None => {
                        out.push('\'');
                        i += 1;
                    }
                }
            }
            c => {
                // Copy one whole UTF-8 character.
                let len = match c {
                    0x00..=0x7f => 1,
                    0xc0..=0xdf => 2,
                    0xe0..=0xef => 3,
                    _ => 4,
                };
                out.push_str(&text[i..(i + len).min(text.len())]);
                i += len;
            }
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths a piece of code names: `crate::a::b`, `super::x`, and each
/// member of a `use` group (`crate::a::{b, c::d}`), as written.
fn paths_in(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < b.len() {
        let starts = |w: &str| b[i..].iter().take(w.len()).copied().eq(w.chars());
        let boundary = i == 0 || !(is_ident(b[i - 1]) || b[i - 1] == ':');
        if boundary && (starts("crate::") || starts("super::")) {
            let (path, next) = read_path(&b, i);
            expand(&b, path, next, &mut out);
            i = next.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Reads `a::b::c` from `i`; returns it and the index after it (at a
/// `{` when a group follows `::`).
fn read_path(b: &[char], mut i: usize) -> (String, usize) {
    let mut path = String::new();
    loop {
        let s = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        path.extend(&b[s..i]);
        let mut j = i;
        while j < b.len() && b[j].is_whitespace() {
            j += 1;
        }
        if b.get(j) == Some(&':') && b.get(j + 1) == Some(&':') {
            j += 2;
            while j < b.len() && b[j].is_whitespace() {
                j += 1;
            }
            if b.get(j).is_some_and(|c| is_ident(*c)) {
                path.push_str("::");
                i = j;
                continue;
            }
            return (path, j);
        }
        return (path, i);
    }
}

/// Pushes `path`, or, when a `{...}` group starts at `next`, `path::m` for
/// each member `m` (nested groups too).
fn expand(b: &[char], path: String, next: usize, out: &mut Vec<String>) {
    if b.get(next) != Some(&'{') {
        out.push(path);
        return;
    }
    let mut depth = 0;
    let mut end = next;
    for (k, c) in b.iter().enumerate().skip(next) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    end = k;
                    break;
                }
            }
            _ => {}
        }
    }
    let inner: Vec<char> = b[next + 1..end].to_vec();
    // Split at top-level commas.
    let mut depth = 0;
    let mut start = 0;
    let mut items = Vec::new();
    for (k, c) in inner.iter().enumerate() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(inner[start..k].to_vec());
                start = k + 1;
            }
            _ => {}
        }
    }
    items.push(inner[start..].to_vec());
    for item in items {
        let s: String = item.iter().collect();
        let s = s.trim();
        let s = s.split(" as ").next().unwrap_or("").trim();
        if s.is_empty() || s == "*" {
            if s == "*" {
                out.push(path.clone());
            }
            continue;
        }
        if s == "self" {
            out.push(path.clone());
            continue;
        }
        let ic: Vec<char> = s.chars().collect();
        let (sub, n) = read_path(&ic, 0);
        expand(&ic, format!("{path}::{sub}"), n, out);
    }
}

/// `super::x` (and `self::x`) written in module `from`, as a path from
/// `crate`.
fn absolute(from: &str, path: &str) -> String {
    let mut base: Vec<&str> = from.split("::").collect();
    let mut rest: Vec<&str> = path.split("::").collect();
    while rest.first() == Some(&"super") {
        base.pop();
        rest.remove(0);
    }
    if rest.first() == Some(&"crate") {
        return rest.join("::");
    }
    base.extend(rest);
    base.join("::")
}

/// The crate root's re-exports, `crate::Name` -> the path it names.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stmt in code_of(lib).split(';') {
        let stmt = stmt.trim();
        let Some(at) = stmt.find("pub use ") else {
            continue;
        };
        let rest = stmt[at + "pub use ".len()..].trim();
        let rest = if rest.starts_with("crate::") {
            rest.to_owned()
        } else {
            format!("crate::{rest}")
        };
        let chars: Vec<char> = rest.chars().collect();
        let (path, next) = read_path(&chars, 0);
        let mut items = Vec::new();
        expand(&chars, path, next, &mut items);
        // `a::b as c` keeps only `a::b` in the expansion; read the alias.
        for (item, alias) in items.into_iter().zip(aliases(&rest)) {
            let name = alias.unwrap_or_else(|| item.rsplit("::").next().unwrap_or("").to_owned());
            out.insert(format!("crate::{name}"), item);
        }
    }
    out
}

/// The alias (`as name`) of each member of a `pub use`, in order.
fn aliases(stmt: &str) -> Vec<Option<String>> {
    let inner = match (stmt.find('{'), stmt.rfind('}')) {
        (Some(a), Some(z)) => &stmt[a + 1..z],
        _ => stmt,
    };
    inner
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.split(" as ").nth(1).map(|a| a.trim().to_owned()))
        .collect()
}

/// One library file: its module path and code.
struct File {
    module: String,
    code: String,
}

/// The arrows between modules: `from -> {to}`, ancestors and descendants
/// left out.
fn arrows(
    files: &[File],
    reexports: &BTreeMap<String, String>,
) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<&str> = files.iter().map(|f| f.module.as_str()).collect();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        for p in paths_in(&f.code) {
            let mut abs = absolute(&f.module, &p);
            // Follow a root re-export once (`crate::NodeId`).
            let head: String = abs.split("::").take(2).collect::<Vec<_>>().join("::");
            if let Some(to) = reexports.get(&head) {
                abs = format!("{to}{}", &abs[head.len()..]);
            }
            let segs: Vec<&str> = abs.split("::").collect();
            let target = (1..=segs.len())
                .rev()
                .map(|n| segs[..n].join("::"))
                .find(|m| modules.contains(m.as_str()));
            let Some(target) = target else { continue };
            let related = |a: &str, b: &str| a == b || b.starts_with(&format!("{a}::"));
            if related(&f.module, &target) || related(&target, &f.module) {
                continue;
            }
            out.entry(f.module.clone()).or_default().insert(target);
        }
    }
    out
}

/// The rank of `module`'s wing (its index in [`WINGS`]).
fn wing_of(module: &str) -> Option<(usize, &'static str)> {
    let mut best: Option<(usize, usize, &'static str)> = None;
    for (rank, (name, prefixes)) in WINGS.iter().enumerate() {
        for p in *prefixes {
            if (module == *p || module.starts_with(&format!("{p}::")))
                && best.is_none_or(|(len, _, _)| p.len() > len)
            {
                best = Some((p.len(), rank, name));
            }
        }
    }
    best.map(|(_, rank, name)| (rank, name))
}

/// Every import circle (a strongly connected set of two modules or more,
/// Tarjan's algorithm), each sorted.
fn circles(arrows: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        arrows: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        if let Some(next) = t.arrows.get(v) {
            for w in next {
                let w = w.as_str();
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let lw = t.low[w];
                    let lv = t.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if t.on.contains(w) {
                    let iw = t.index[w];
                    let lv = t.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut set = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                set.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                set.sort();
                t.out.push(set);
            }
        }
    }
    let mut t = T {
        arrows,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    let nodes: BTreeSet<&str> = arrows
        .iter()
        .flat_map(|(k, v)| std::iter::once(k.as_str()).chain(v.iter().map(String::as_str)))
        .collect();
    for n in nodes {
        if !t.index.contains_key(n) {
            visit(&mut t, n);
        }
    }
    t.out
}

/// What is wrong with a tree: its circles and its arrows up the wings.
fn problems(files: &[File], lib: &str) -> Vec<String> {
    let arrows = arrows(files, &root_reexports(lib));
    let mut out: Vec<String> = circles(&arrows)
        .into_iter()
        .map(|c| format!("import circle: {}", c.join(" <-> ")))
        .collect();
    for f in files {
        if wing_of(&f.module).is_none() {
            out.push(format!("{} belongs to no wing (add it to WINGS)", f.module));
        }
    }
    for (from, tos) in &arrows {
        let Some((rf, wf)) = wing_of(from) else {
            continue;
        };
        for to in tos {
            let Some((rt, wt)) = wing_of(to) else {
                continue;
            };
            if rt > rf {
                out.push(format!("{from} ({wf}) uses {to} ({wt}), a higher wing"));
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("reading src") {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn library() -> (Vec<File>, String) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    paths.sort();
    let mut files = Vec::new();
    for p in paths {
        let rel = p.strip_prefix(&src).expect("under src");
        // Test modules in files of their own (`foo/tests.rs`) are tests.
        if in_binary(rel) || rel.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&p).expect("reading a source file");
        files.push(File {
            module: module_of(rel),
            code: code_of(&text),
        });
    }
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("reading lib.rs");
    (files, lib)
}

#[test]
fn no_import_circle_and_no_arrow_up_the_wings() {
    let (files, lib) = library();
    assert!(
        files.len() > 100,
        "found only {} library files",
        files.len()
    );
    let problems = problems(&files, &lib);
    assert!(
        problems.is_empty(),
        "layout problems:\n{}",
        problems.join("\n")
    );
}

fn file(module: &str, code: &str) -> File {
    File {
        module: module.to_owned(),
        code: code_of(code),
    }
}

/// The check itself: a circle, an arrow up the wings and a path through a
/// root re-export are found; a module and its submodule may use each other;
/// comments, strings and the test module are not read.
#[test]
fn the_check_finds_a_circle_and_an_arrow_up() {
    let lib = "pub use adapters::serve::app::AppListener;\n";
    let tree = [
        file(
            "crate::adapters::errors",
            "use crate::adapters::serve::app::AppError;",
        ),
        file(
            "crate::adapters::serve::app",
            "use super::forwarded;\nuse crate::adapters::front::client_input;",
        ),
        file("crate::adapters::serve::forwarded", ""),
        file(
            "crate::adapters::front::client_input",
            "use crate::adapters::{errors::RequestError, body};\n// crate::engine::x\nconst S: &str = \"crate::sim::y\";",
        ),
        file("crate::adapters::body", ""),
        file(
            "crate::engine::route",
            "fn f() -> crate::AppListener { todo!() }\n#[cfg(test)]\nmod tests {\n use crate::node::Node;\n}",
        ),
        file("crate::adapters::transport::peer", "use links::X;"),
        file(
            "crate::adapters::transport::peer::links",
            "use super::super::peer::Y;",
        ),
        file("crate::node", ""),
    ];
    let p = problems(&tree, lib);
    assert!(
        p.contains(&"import circle: crate::adapters::errors <-> crate::adapters::front::client_input <-> crate::adapters::serve::app".to_owned()),
        "{p:#?}"
    );
    assert!(p.contains(&"crate::adapters::errors (adapters state) uses crate::adapters::serve::app (serve), a higher wing".to_owned()), "{p:#?}");
    assert!(p.contains(&"crate::adapters::serve::app (serve) uses crate::adapters::front::client_input (front), a higher wing".to_owned()), "{p:#?}");
    assert!(p.contains(&"crate::engine::route (engine) uses crate::adapters::serve::app (serve), a higher wing".to_owned()), "{p:#?}");
    assert_eq!(p.len(), 4, "{p:#?}");
}

/// `text` with every comment, string and char literal blanked to spaces,
/// its newlines kept (so line numbers hold): the braces left are code's.
fn blanked(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            while i < c.len() && !(c[i] == '*' && c.get(i + 1) == Some(&'/')) {
                blank(&mut out, c[i]);
                i += 1;
            }
            out.push_str("  ");
            i += 2;
        } else if c[i] == 'r'
            && (c.get(i + 1) == Some(&'"') || c.get(i + 1) == Some(&'#'))
            && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_'))
        {
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push('r');
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            j += 1;
            while j < c.len() && !(c[j] == '"' && (1..=hashes).all(|h| c.get(j + h) == Some(&'#')))
            {
                j += 1;
            }
            let end = (j + 1 + hashes).min(c.len());
            for &ch in &c[i..end] {
                blank(&mut out, ch);
            }
            i = end;
        } else if c[i] == '"' {
            blank(&mut out, c[i]);
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let end = if c.get(i + 1) == Some(&'\\') {
                (i + 2..c.len()).find(|&j| c[j] == '\'').map(|j| j + 1)
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(end) => {
                    for &ch in &c[i..end] {
                        blank(&mut out, ch);
                    }
                    i = end;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The functions of `text` longer than `max` lines (from the `fn` line to
/// its closing brace) with no reason at their top: a `// Long:` comment in
/// the first three lines of the body. (line, name, lines) each.
fn long_functions(text: &str, max: usize) -> Vec<(usize, String, usize)> {
    let code = blanked(text);
    let lines: Vec<&str> = code.lines().collect();
    let original: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let words: Vec<&str> = line
            .split(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        let Some(at) = words.iter().position(|w| *w == "fn") else {
            continue;
        };
        // `fn` as an item: first on its line after visibility and qualifiers.
        let before_ok = words[..at].iter().all(|w| {
            matches!(
                *w,
                "pub"
                    | "crate"
                    | "super"
                    | "in"
                    | "self"
                    | "async"
                    | "const"
                    | "unsafe"
                    | "extern"
                    | "C"
            )
        });
        let Some(name) = words.get(at + 1).filter(|_| before_ok) else {
            continue;
        };
        // The body's opening brace, unless a `;` ends a declaration first.
        let mut depth = 0usize;
        let mut open = None;
        'find: for (m, l) in lines.iter().enumerate().skip(n) {
            for ch in l.chars() {
                match ch {
                    '(' | '[' | '<' => depth += 1,
                    ')' | ']' | '>' => depth = depth.saturating_sub(1),
                    ';' if depth == 0 => break 'find,
                    '{' => {
                        open = Some(m);
                        break 'find;
                    }
                    _ => {}
                }
            }
        }
        let Some(open) = open else { continue };
        let mut braces = 0i64;
        let mut close = None;
        'body: for (m, l) in lines.iter().enumerate().skip(open) {
            for ch in l.chars() {
                match ch {
                    '{' => braces += 1,
                    '}' => {
                        braces -= 1;
                        if braces == 0 {
                            close = Some(m);
                            break 'body;
                        }
                    }
                    _ => {}
                }
            }
        }
        let Some(close) = close else { continue };
        let len = close - n + 1;
        let reason = original[open..(open + 4).min(original.len())]
            .iter()
            .any(|l| l.contains("// Long:"));
        if len > max && !reason {
            out.push((n + 1, name.to_string(), len));
        }
    }
    out
}

/// Every `.rs` file under `src/`, as (path relative to the crate, text).
fn sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = Vec::new();
    rust_files(&root.join("src"), &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("reading a source file");
            let rel = p.strip_prefix(root).expect("under the crate");
            (rel.display().to_string(), text)
        })
        .collect()
}

/// Rooms a reader can hold: no `src` file over 800 lines unless its first
/// lines say why (`Past 800 lines:`), no function over 120 lines unless a
/// `// Long:` comment at the top of its body says why.
#[test]
fn no_file_over_800_lines_and_no_function_over_120_without_a_reason() {
    let mut problems = Vec::new();
    for (path, text) in sources() {
        let n = text.lines().count();
        let head: Vec<&str> = text.lines().take(20).collect();
        if n > 800 && !head.iter().any(|l| l.contains("Past 800 lines:")) {
            problems.push(format!("{path}: {n} lines"));
        }
        for (line, name, len) in long_functions(&text, 120) {
            problems.push(format!("{path}:{line}: fn {name} is {len} lines"));
        }
    }
    assert!(
        problems.is_empty(),
        "too long, with no reason at the top:\n{}",
        problems.join("\n")
    );
}

/// The length check itself: a long function is found and measured, a
/// `// Long:` reason excuses it, braces in strings, chars and comments
/// do not count, and a declaration without a body is no function.
#[test]
fn the_length_check_measures_bodies_and_honours_a_reason() {
    let body = "    let s = \"}\"; let c = '{'; // }\n".repeat(5);
    let f = format!("pub(crate) async fn long(\n    a: u8,\n) -> u8 {{\n{body}    0\n}}\n");
    assert_eq!(long_functions(&f, 8), vec![(1, "long".to_string(), 10)]);
    assert!(long_functions(&f, 10).is_empty());
    let excused = f.replace("-> u8 {\n", "-> u8 {\n    // Long: a table.\n");
    assert!(long_functions(&excused, 8).is_empty());
    let decl = "trait T {\n    fn f(&self);\n}\n";
    assert!(long_functions(decl, 0).iter().all(|(_, n, _)| n != "f"));
    let raw = format!("fn r() {{\n    let x = r#\"{{{{\"#;\n{body}}}\n");
    assert_eq!(long_functions(&raw, 3).len(), 1);
}
