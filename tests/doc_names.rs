//! The test names the docs give exist: every name in the "tested in"
//! column of docs/cases.md is a `fn` in the file it is listed under (a
//! scenario is a file in `simulations/`, a fuzz target a `fn` in
//! src/fuzz.rs), and every `cargo test --test <file> <filter>` or
//! `simulations/peerlb-sim test <filter>` command in CONTRIBUTING.md
//! selects at least one test. A renamed test fails here instead of leaving
//! a doc pointing at nothing (`cargo test --test cluster c6_` printing "ok"
//! after running 0 tests).

// Reads files only: no clock, no network.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The files a docs' file name stands for: `tests/x.rs` and `src/...` as
/// they are, any other (`ring/tests.rs`, `byrequests.rs`) every file under
/// src/ whose path ends with it.
fn files_named(name: &str, src: &[PathBuf]) -> Vec<PathBuf> {
    if name.starts_with("tests/") || name.starts_with("src/") {
        return vec![root().join(name)];
    }
    src.iter()
        .filter(|p| p.to_string_lossy().ends_with(&format!("/{name}")))
        .cloned()
        .collect()
}

/// The `fn` names defined in `text` (tests, proptest cases, helpers).
fn fn_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("fn ") {
        let before = rest[..i].chars().last();
        rest = &rest[i + 3..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.push(name);
        }
    }
    out
}

fn is_ident(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// What a name in a "tested in" cell refers to.
enum Kind {
    /// A `fn` in one of these files.
    Fn(Vec<PathBuf>),
    /// `simulations/<name>.toml`.
    Scenario,
    /// A `fn` in src/fuzz.rs.
    Fuzz,
}

/// The names of one "tested in" cell that do not exist, with why.
fn missing_in_cell(cell: &str, src: &[PathBuf]) -> Vec<String> {
    let mut missing = Vec::new();
    let mut kind = None;
    let mut rest = cell;
    loop {
        let tick = rest.find('`');
        // Words between names switch to scenarios or fuzz targets.
        let words = &rest[..tick.unwrap_or(rest.len())];
        if words.contains("scenario") {
            kind = Some(Kind::Scenario);
        } else if words.contains("fuzz target") {
            kind = Some(Kind::Fuzz);
        }
        let Some(start) = tick else { break };
        let Some(len) = rest[start + 1..].find('`') else {
            missing.push(format!("unbalanced backtick in {cell:?}"));
            break;
        };
        let token = &rest[start + 1..start + 1 + len];
        rest = &rest[start + len + 2..];
        if token.ends_with(".rs") {
            let files = files_named(token, src);
            if files.is_empty() || files.iter().any(|f| !f.is_file()) {
                missing.push(format!("no file {token}"));
            }
            kind = Some(Kind::Fn(files));
            continue;
        }
        match &kind {
            Some(Kind::Scenario) => {
                if !root().join(format!("simulations/{token}.toml")).is_file() {
                    missing.push(format!("no scenario simulations/{token}.toml"));
                }
            }
            Some(Kind::Fuzz) => {
                if !fn_names(&read(&root().join("src/fuzz.rs")))
                    .iter()
                    .any(|n| n == token)
                {
                    missing.push(format!("no fuzz target {token} in src/fuzz.rs"));
                }
            }
            Some(Kind::Fn(files)) if is_ident(token) => {
                let found = files
                    .iter()
                    .filter(|f| f.is_file())
                    .any(|f| fn_names(&read(f)).iter().any(|n| n == token));
                if !found {
                    missing.push(format!("no fn {token} in {files:?}"));
                }
            }
            _ => missing.push(format!("{token:?} names no test (no file before it)")),
        }
    }
    missing
}

#[test]
fn every_tested_in_name_of_docs_cases_exists() {
    let mut src = Vec::new();
    rust_files(&root().join("src"), &mut src);
    let doc = read(&root().join("docs/cases.md"));
    let mut missing = Vec::new();
    let mut checked = 0;
    // Some(true) inside a table whose last column is "tested in".
    let mut table: Option<bool> = None;
    for line in doc.lines() {
        if !line.starts_with('|') {
            table = None;
            continue;
        }
        // "tested in" is the last column: taking the last cell keeps a `\|`
        // in an earlier one from shifting it.
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let Some(cell) = cells.last() else { continue };
        match table {
            None => {
                table = Some(*cell == "tested in");
                continue;
            }
            Some(false) => continue,
            Some(true) => {}
        }
        if cell.starts_with("---") {
            continue;
        }
        checked += 1;
        for m in missing_in_cell(cell, &src) {
            missing.push(format!("{}: {m}", cells[0]));
        }
    }
    assert!(checked >= 30, "only {checked} case rows found");
    assert!(missing.is_empty(), "docs/cases.md:\n{}", missing.join("\n"));
}

/// The `fn` names that a filter `f` selects among `files`: libtest runs
/// every test whose path contains the filter.
fn selected(files: &[&str], filter: &str) -> usize {
    files
        .iter()
        .flat_map(|f| fn_names(&read(&root().join(f))))
        .filter(|n| n.contains(filter.trim_end_matches("::")))
        .count()
}

#[test]
fn every_test_command_of_contributing_selects_a_test() {
    let doc = read(&root().join("CONTRIBUTING.md"));
    let mut commands = 0;
    let mut empty = Vec::new();
    for line in doc.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            let (files, filter) = match (*w, words.get(i + 1), words.get(i + 2)) {
                ("--test", Some(file), Some(filter)) if !filter.starts_with('#') => {
                    (vec![format!("tests/{file}.rs")], *filter)
                }
                ("simulations/peerlb-sim", Some(&"test"), Some(filter))
                    if !filter.starts_with('#') =>
                {
                    (
                        vec![
                            "tests/simulation.rs".to_owned(),
                            "tests/sim_harness.rs".to_owned(),
                        ],
                        *filter,
                    )
                }
                _ => continue,
            };
            commands += 1;
            let files: Vec<&str> = files.iter().map(String::as_str).collect();
            if selected(&files, filter) == 0 {
                empty.push(line.trim().to_owned());
            }
        }
    }
    assert!(commands >= 2, "only {commands} test commands found");
    assert!(empty.is_empty(), "select no test:\n{}", empty.join("\n"));
}

/// The module of a `src` file as the tree names it: its file stem, or
/// `None` for what the tree does not list one by one (the crate roots,
/// a wing's own file named by its folder, tests, the fuzz targets).
fn module_stem(rel: &Path) -> Option<String> {
    let stem = rel.file_stem()?.to_str()?.to_owned();
    let test = stem == "tests" || stem.ends_with("_tests") || rel.iter().any(|c| c == "tests");
    let root = matches!(stem.as_str(), "lib" | "main" | "fuzz" | "peerlb-sim");
    (!test && !root).then_some(stem)
}

/// docs/architecture.md's tree ("Engine and adapters") names every module:
/// each `src` file's stem is a word of the tree, so a file added (or
/// moved under a new name) without a line there fails here.
#[test]
fn the_architecture_tree_names_every_module() {
    let doc = read(&root().join("docs/architecture.md"));
    let start = doc
        .find("## Engine and adapters")
        .expect("architecture.md has its tree");
    let tree = &doc[start..];
    let tree = &tree[..tree[3..].find("\n## ").map_or(tree.len(), |i| i + 3)];
    let words: std::collections::BTreeSet<&str> = tree
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
        .collect();
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let mut missing: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(root().join("src")).unwrap();
            let stem = module_stem(rel)?;
            (!words.contains(stem.as_str())).then(|| format!("src/{}", rel.display()))
        })
        .collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "not named in docs/architecture.md's tree:\n{}",
        missing.join("\n")
    );
}
