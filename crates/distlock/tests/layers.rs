//! The shape of the code, kept true by a test: in every crate the modules depend on each other
//! one way (no module reaches back into a module that depends on it), and no source file grows
//! past 1,000 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments and its unit tests (a test module may use anything).
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("a source file");
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a file of `src/` belongs to (`None` for the crate root).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (name != "lib" && name != "main").then_some(name)
}

/// The modules `text` names as `crate::<module>`, among `known`.
fn uses(text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        if at > 0 && text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // `distlock_crate::`, say
        }
        let rest = &text[at + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if known.contains(&name) {
            found.insert(name);
        } else if rest.starts_with('{') {
            // `use crate::{a, b::c}`: every first segment inside the braces.
            let inner = &rest[1..rest.find('}').unwrap_or(rest.len())];
            for part in inner.split(',') {
                let first = part.trim().split("::").next().unwrap_or("").trim();
                if known.contains(first) {
                    found.insert(first.to_owned());
                }
            }
        }
    }
    found
}

/// The cycles of a directed graph (its strongly connected parts of two or more nodes).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(n) = stack.pop() {
            for m in graph.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    stack.push(m.clone());
                }
            }
        }
        seen
    };
    let mut out: Vec<Vec<String>> = Vec::new();
    let reachable: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|k| (k, reach(k))).collect();
    for a in graph.keys() {
        if out.iter().any(|c| c.contains(a)) {
            continue;
        }
        let part: Vec<String> = graph
            .keys()
            .filter(|b| *b == a || (reachable[a].contains(*b) && reachable[*b].contains(a)))
            .cloned()
            .collect();
        if part.len() > 1 || reachable[a].contains(a) {
            out.push(part);
        }
    }
    out
}

#[test]
fn no_crate_has_a_module_import_cycle() {
    let mut found = Vec::new();
    let mut crates = 0;
    for entry in std::fs::read_dir(crates_dir()).expect("crates/") {
        let src = entry.expect("an entry").path().join("src");
        if !src.is_dir() {
            continue;
        }
        crates += 1;
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let known: BTreeSet<String> = files.iter().filter_map(|f| module_of(&src, f)).collect();
        let mut graph: BTreeMap<String, BTreeSet<String>> =
            known.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
        for f in &files {
            let Some(m) = module_of(&src, f) else {
                continue;
            };
            let mut deps = uses(&code(f), &known);
            deps.remove(&m);
            graph.get_mut(&m).expect("known").extend(deps);
        }
        for c in cycles(&graph) {
            found.push(format!("{}: {}", src.display(), c.join(" <-> ")));
        }
    }
    assert!(crates >= 13, "only {crates} crates found");
    assert!(
        found.is_empty(),
        "module import cycles:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_source_file_is_over_1000_lines() {
    let mut files = Vec::new();
    rust_files(&crates_dir(), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter(|f| !f.components().any(|c| c.as_os_str() == "target"))
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).ok()?.lines().count();
            (n > 1000).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these: {long:?}");
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let g = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry((*a).to_owned())
                .or_default()
                .insert((*b).to_owned());
            g.entry((*b).to_owned()).or_default();
        }
        g
    };
    assert!(cycles(&g(&[("a", "b"), ("b", "c")])).is_empty());
    assert_eq!(
        cycles(&g(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])),
        vec![vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]]
    );
    let known: BTreeSet<String> = ["lease", "guard", "engine"].map(String::from).into();
    assert_eq!(
        uses(
            "use crate::{engine::LeaseRef, lease};\nlet x = crate::guard::f();",
            &known
        ),
        known
    );
}
