//! The layering in `lib.rs`, checked on the source: each layer names only the layers below it,
//! and no two modules (at `layer::module` depth) name each other, directly or round a loop.
//!
//! Read from the `crate::` paths of every non-test source file (comments, `#[cfg(test)]`
//! modules and `*tests.rs` files left out: tests may reach anywhere). A `use` with braces
//! counts each name inside them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// What each layer may name besides itself.
const ALLOWED: &[(&str, &[&str])] = &[
    (
        "cli",
        &["runtime", "state", "domain", "platform", "proto", "testkit"],
    ),
    (
        "bench",
        &["testkit", "runtime", "state", "domain", "platform", "proto"],
    ),
    (
        "testkit",
        &["runtime", "state", "domain", "platform", "proto"],
    ),
    ("fuzz", &["domain", "platform"]),
    ("runtime", &["state", "domain", "platform", "proto"]),
    ("state", &["domain"]),
    ("platform", &["domain", "proto"]),
    ("domain", &[]),
    ("proto", &[]),
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && !path
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .ends_with("tests.rs")
        {
            out.push(path);
        }
    }
}

/// The module a file defines, relative to `src/` (`domain/cdi/mod.rs` → `[domain, cdi]`).
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The source without comments and without what follows the first `#[cfg(test)]` module.
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]")
            && lines.peek().is_some_and(|next| {
                let n = next.trim_start();
                n.starts_with("mod ")
                    || n.starts_with("pub mod ")
                    || n.starts_with("pub(crate) mod ")
            })
        {
            break;
        }
        push_code(&mut out, line);
    }
    out
}

/// Append `line` without its `//` comment.
fn push_code(out: &mut String, line: &str) {
    let code = line.find("//").map_or(line, |i| &line[..i]);
    out.push_str(code);
    out.push('\n');
}

/// The source without comments and without any `#[cfg(test)]` item (a one-line `mod x;`, or
/// a braced item counted to its closing brace), wherever it stands in the file.
fn production_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            let mut depth = 0i64;
            let mut opened = false;
            for item in lines.by_ref() {
                for c in item.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                if (opened && depth <= 0) || (!opened && item.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        push_code(&mut out, line);
    }
    out
}

/// Every `crate::a::b` a source names, cut to two segments.
fn references(code: &str) -> BTreeSet<Module> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let layer = ident(rest);
        if layer.is_empty() {
            continue;
        }
        let after = &rest[layer.len()..];
        let Some(tail) = after.strip_prefix("::") else {
            found.insert(vec![layer]);
            continue;
        };
        if let Some(group) = tail.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let name = ident(item.trim());
                if !name.is_empty() {
                    found.insert(vec![layer.clone(), name]);
                }
            }
        } else {
            let name = ident(tail);
            found.insert(if name.is_empty() {
                vec![layer]
            } else {
                vec![layer, name]
            });
        }
    }
    found
}

/// Module graph at `layer::module` depth; an edge to an item of a layer's root module
/// (`crate::state::Store`) is an edge to the layer.
fn graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeSet<Module> = files
        .iter()
        .map(|f| module_of(&src, f).into_iter().take(2).collect())
        .collect();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for file in &files {
        let from: Module = module_of(&src, file).into_iter().take(2).collect();
        if from.is_empty() {
            continue;
        }
        for mut to in references(&code(&std::fs::read_to_string(file).unwrap())) {
            if !modules.contains(&to) {
                to.truncate(1);
            }
            let nested = to.starts_with(&from) || from.starts_with(&to);
            if !nested {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

#[test]
fn each_layer_names_only_the_layers_below_it() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut wrong = Vec::new();
    for (from, tos) in graph() {
        let Some(may) = allowed.get(from[0].as_str()) else {
            wrong.push(format!("{} is not a layer lib.rs names", from.join("::")));
            continue;
        };
        for to in tos {
            if to[0] != from[0] && !may.contains(&to[0].as_str()) {
                wrong.push(format!("{} names {}", from.join("::"), to.join("::")));
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the layering: {wrong:#?}");
}

/// The two front-ends are peers: neither names the other (what they share, the socket
/// lifecycle, is `runtime::socket`), so a third front-end needs neither.
#[test]
fn the_front_ends_name_nothing_of_each_other() {
    let edges = graph();
    let (plugin, dra) = (
        vec!["runtime".to_string(), "plugin".to_string()],
        vec!["runtime".to_string(), "dra".to_string()],
    );
    for (from, to) in [(&plugin, &dra), (&dra, &plugin)] {
        assert!(
            !edges.get(from).is_some_and(|t| t.contains(to)),
            "{} names {}",
            from.join("::"),
            to.join("::")
        );
    }
    // The check sees real edges: the DRA front-end does name the socket module.
    assert!(edges[&dra].contains(&vec!["runtime".to_string(), "socket".to_string()]));
}

/// Lines of `code` with a `Result<_, String>`: `Result<`, then `, String>` closing it (not a
/// `String` that is a type argument of the value, as in `Result<BTreeMap<String, String>, E>`).
fn string_results(code: &str) -> Vec<String> {
    code.lines()
        .filter(|l| {
            l.find("Result<").is_some_and(|at| {
                let rest = &l[at..];
                rest.match_indices("String>").any(|(i, _)| {
                    let before = rest[..i].trim_end();
                    let after = &rest[i + "String>".len()..];
                    before.ends_with(',') && !after.starts_with(',')
                })
            })
        })
        .map(|l| l.trim().to_string())
        .collect()
}

/// The DRA front-end's refusals are typed (`ClaimError` and the module enums under it):
/// neither `domain::dra` nor `runtime::dra` returns a `Result<_, String>` (the kubelet's own
/// registration verdict, which the driver relays, is a `RegistrationRefused`).
#[test]
fn the_dra_front_end_speaks_no_string_errors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src.join("domain/dra"), &mut files);
    sources(&src.join("runtime/dra"), &mut files);
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for line in string_results(&code(&text)) {
            found.push(format!("{}: {line}", file.display()));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    // The reader sees what it looks for, and not a String inside the value type.
    assert_eq!(
        string_results(
            "fn f() -> Result<Vec<u8>, String> {\nfn g() -> Result<BTreeMap<String, String>, E> {"
        ),
        ["fn f() -> Result<Vec<u8>, String> {"]
    );
}

/// The supervisor only wires: each front-end's specifics (its servers, socket watch,
/// readiness, Events, slice publisher) are started behind `runtime::front_end`, and the
/// supervisor has nothing that exists only for tests.
#[test]
fn the_supervisor_only_wires() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/runtime/supervisor.rs");
    let text = std::fs::read_to_string(&src).unwrap();
    assert!(
        !text.contains("#[cfg(test)]"),
        "runtime/supervisor.rs has test-only items: tests read the daemon through Running::probe"
    );
    let code = production_code(&text);
    for specific in [
        "plugin::spawn",
        "plugin::start",
        "KubeletWatch",
        "remove_stale_sockets",
        "dra::spawn",
        "dra::front",
        "dra::publish",
        "mark_registered",
        "EventKind",
        "mpsc::channel",
    ] {
        assert!(
            !code.contains(specific),
            "runtime/supervisor.rs names `{specific}`: it belongs to its front-end"
        );
    }
}

/// Where a `Result<_, String>` may still stand in production code, and how many: clap's
/// value parsers (clap takes any `Display` error, the flag name is clap's to add) and the
/// emulators' wire protocols
/// in `testkit` (their errors are the HTTP or gRPC answer text). Everything else has its
/// module's `thiserror` enum (`hack/count-string-results.sh` lists the same lines).
const STRING_RESULTS_LEFT: &[(&str, usize)] = &[
    ("cli/advise.rs", 1),
    ("cli/args.rs", 3),
    ("cli/backend.rs", 1),
    ("testkit/apiserver/schedule.rs", 3),
    ("testkit/apiserver/serve.rs", 1),
    ("testkit/apiserver/store.rs", 3),
    ("testkit/kubelet/dra.rs", 1),
];

/// The count cannot grow back: a file not listed above has no `Result<_, String>`, a listed
/// one exactly its number (fixing one shrinks the list).
#[test]
fn string_results_do_not_grow_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let lines = string_results(&production_code(&text));
        if !lines.is_empty() {
            let rel = file.strip_prefix(&src).unwrap().display().to_string();
            found.insert(rel, lines);
        }
    }
    let allowed: BTreeMap<String, usize> = STRING_RESULTS_LEFT
        .iter()
        .map(|(f, n)| (f.to_string(), *n))
        .collect();
    let mut wrong = Vec::new();
    for (file, lines) in &found {
        let left = allowed.get(file).copied().unwrap_or(0);
        if lines.len() != left {
            wrong.push(format!(
                "{file}: {} Result<_, String> (allowed {left}):\n  {}",
                lines.len(),
                lines.join("\n  ")
            ));
        }
    }
    for (file, n) in &allowed {
        if !found.contains_key(file) {
            wrong.push(format!(
                "{file}: none left (allowed {n}): drop it from STRING_RESULTS_LEFT"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The reader skips test items wherever they stand, and only them.
    assert_eq!(
        string_results(&production_code(
            "#[cfg(test)]\nmod a;\nfn f() -> Result<(), String> {}\n#[cfg(test)]\nfn g() -> Result<(), String> {\n    {}\n}\nfn h() -> Result<u8, String> {}\n"
        )),
        [
            "fn f() -> Result<(), String> {}",
            "fn h() -> Result<u8, String> {}"
        ]
    );
}

#[test]
fn no_two_modules_depend_on_each_other() {
    let edges = graph();
    // Tarjan's strongly connected components; any with two or more modules is a cycle.
    struct Search<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<Module, usize>,
        low: BTreeMap<Module, usize>,
        stack: Vec<Module>,
        cycles: Vec<Vec<String>>,
    }
    impl Search<'_> {
        fn visit(&mut self, v: &Module) {
            let n = self.index.len();
            self.index.insert(v.clone(), n);
            self.low.insert(v.clone(), n);
            self.stack.push(v.clone());
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    let done = &w == v;
                    component.push(w.join("::"));
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.cycles.push(component);
                }
            }
        }
    }
    let mut search = Search {
        edges: &edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        cycles: Vec::new(),
    };
    for v in edges.keys() {
        if !search.index.contains_key(v) {
            search.visit(v);
        }
    }
    assert!(
        search.cycles.is_empty(),
        "module cycles: {:#?}",
        search.cycles
    );
}

#[test]
fn the_reader_finds_braced_and_nested_paths() {
    let found = references(&code(
        "use crate::domain::{config::Config, plan};\n// crate::runtime::x\nfn f() { crate::state::Store::new(); }\n#[cfg(test)]\nmod tests { use crate::testkit::fixtures; }\n",
    ));
    let want: BTreeSet<Module> = [
        vec!["domain".to_string(), "config".to_string()],
        vec!["domain".to_string(), "plan".to_string()],
        vec!["state".to_string(), "Store".to_string()],
    ]
    .into_iter()
    .collect();
    assert_eq!(found, want);
}
