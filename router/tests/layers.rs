//! The router's folders are layers (docs/architecture.md): each imports only folders below it,
//! so a newcomer can read one floor without the ones above, and a change to an upper floor
//! cannot break a lower one. This test reads every `crate::...` path in the router's source
//! (test code left out) and fails on any import from a folder to one at its own level or above,
//! other than the few named side by side below. No server is needed: it reads files.
//!
//! With `SHARDGATE_LAYERS_DOT=FILE` it also writes the folders' import graph in Graphviz's DOT
//! language (each edge labelled with the number of files that import across it):
//! `SHARDGATE_LAYERS_DOT=/tmp/layers.dot cargo test -p shardgate --test layers && dot -Tsvg
//! /tmp/layers.dot > docs/layers.svg` draws docs/layers.svg.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each folder (or top-level file) of `router/src` and its floor, the lowest first.
const LAYERS: &[(&str, u8)] = &[
    // The pure leaves: the wire protocol, the SQL planner and resolver, merges, errors.
    ("protocol", 0),
    ("errors", 1),
    ("merge", 1),
    ("auth", 2),
    ("planner", 2),
    ("config", 3),
    ("resolver", 3),
    ("stats", 3),
    ("tls", 4),
    // Connections to the primaries.
    ("backend", 5),
    // What every layer above needs to reach a shard.
    ("routing", 6),
    // Statements on several shards.
    ("multishard", 7),
    // One client's session, and the admin console.
    ("session", 8),
    ("admin", 8),
    // The front door and the process's life.
    ("server", 9),
    ("cli", 10),
    ("main", 10),
    ("lib", 10),
];

/// Imports between folders of one floor that are allowed: the admin console reads and writes
/// its client with the session's socket.
const SIDEWAYS: &[(&str, &str)] = &[("admin", "session")];

fn level(folder: &str) -> Option<u8> {
    LAYERS.iter().find(|(f, _)| *f == folder).map(|(_, l)| *l)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read router/src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without its comments, string literals and `#[cfg(test)]` module.
fn code(src: &str) -> String {
    let src = match src.find("#[cfg(test)]\nmod ") {
        Some(at) => &src[..at],
        None => src,
    };
    let mut out = String::with_capacity(src.len());
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    match c {
                        '\\' if !escaped => escaped = true,
                        '"' if !escaped => break,
                        _ => escaped = false,
                    }
                }
                out.push_str("\"\"");
            }
            c => out.push(c),
        }
    }
    out
}

/// The top-level folders a file's code names: `crate::x::...` and `use crate::{x, y::z}`.
fn imported(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if c.is_whitespace() => {}
                    _ if start => {
                        names.insert(ident(&group[i..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(ident(rest));
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

#[test]
fn no_folder_imports_one_at_its_floor_or_above() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    let mut unknown = BTreeSet::new();
    let mut graph: BTreeMap<(String, String), usize> = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let folder = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs").to_string())
            .expect("a name");
        let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "tests.rs" {
            continue;
        }
        let Some(from) = level(&folder) else {
            unknown.insert(folder);
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read a source file");
        for to in imported(&code(&text)) {
            if to == folder {
                continue;
            }
            let Some(to_level) = level(&to) else {
                unknown.insert(to);
                continue;
            };
            *graph.entry((folder.clone(), to.clone())).or_default() += 1;
            let sideways = SIDEWAYS.contains(&(folder.as_str(), to.as_str()));
            if to_level >= from && !sideways {
                wrong.push(format!(
                    "{} (floor {from}) imports {to} (floor {to_level})",
                    rel.display()
                ));
            }
        }
    }
    if let Some(path) = std::env::var_os("SHARDGATE_LAYERS_DOT") {
        std::fs::write(&path, dot(&graph)).expect("write the DOT file");
    }
    assert!(
        unknown.is_empty(),
        "folders of router/src missing from LAYERS in this test: {unknown:?}"
    );
    assert!(
        wrong.is_empty(),
        "imports from a floor to one at its level or above:\n{}",
        wrong.join("\n")
    );
}

/// The folders' import graph in DOT, one rank per floor, the highest on top.
fn dot(graph: &BTreeMap<(String, String), usize>) -> String {
    let mut out = String::from("digraph layers {\n  rankdir=TB; node [shape=box];\n");
    let mut floors: BTreeMap<u8, Vec<&str>> = BTreeMap::new();
    for (folder, floor) in LAYERS {
        floors.entry(*floor).or_default().push(folder);
    }
    for folders in floors.values().rev() {
        let names: Vec<String> = folders.iter().map(|f| format!("\"{f}\"")).collect();
        out.push_str(&format!("  {{ rank=same; {} }}\n", names.join("; ")));
    }
    for ((from, to), files) in graph {
        out.push_str(&format!("  \"{from}\" -> \"{to}\" [label=\"{files}\"];\n"));
    }
    out.push_str("}\n");
    out
}

#[test]
fn the_reader_sees_grouped_and_inline_paths_and_skips_comments() {
    let code = code(
        "use crate::{a::B, c};\nfn f() { crate::d::e(); }\n// crate::f\nlet s = \"crate::g\";\n#[cfg(test)]\nmod tests { use crate::h; }",
    );
    let got: Vec<String> = imported(&code).into_iter().collect();
    assert_eq!(got, ["a", "c", "d"]);
}
