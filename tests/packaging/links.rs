//! The documentation holds together: every relative link of every
//! Markdown file of the repository names a file that is there, every
//! anchor a heading of it (as GitHub makes anchors from headings), and the
//! README's index reaches every page of docs/; every path of the
//! repository named for a reader (in a comment, Cargo.toml, the README,
//! CONTRIBUTING.md or docs/) is there; and CONTRIBUTING.md's code map
//! names every file of src/ and nothing that is not there.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Component, Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The repository's Markdown files, but what builds leave.
fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            markdown_files(&path, found);
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

/// The lines outside fenced code blocks.
fn outside_fences(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The text outside fenced code blocks and code spans, where links are.
fn prose(text: &str) -> String {
    let mut out = String::new();
    for line in outside_fences(text) {
        // Code spans: every other backtick-delimited part.
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                out.push_str(part);
            }
        }
        out.push('\n');
    }
    out
}

/// Every link target: `[text](target)` and `[name]: target`.
fn links(text: &str) -> Vec<String> {
    let text = prose(text);
    let mut targets = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        // A title after the target ("file.md "title"") is not part of it.
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(['<', '>']).to_owned());
        rest = &after[end..];
    }
    for line in text.lines() {
        let line = line.trim_start();
        if let Some(close) = line.find("]: ") {
            if line.starts_with('[') && !line[..close].contains('(') {
                targets.push(line[close + 3..].trim().to_owned());
            }
        }
    }
    targets
}

/// The anchors GitHub gives a file's headings: lowercased, all but
/// letters, digits, spaces, hyphens and underscores dropped, spaces made
/// hyphens, a repeated one numbered; and explicit `<a id|name="…">`s.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = BTreeSet::new();
    for line in outside_fences(text) {
        for key in ["<a id=\"", "<a name=\""] {
            if let Some(at) = line.find(key) {
                let name = &line[at + key.len()..];
                anchors.insert(name[..name.find('"').unwrap_or(0)].to_owned());
            }
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let title = heading.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let count = seen.entry(slug.clone()).or_insert(0);
        let anchor = match *count {
            0 => slug.clone(),
            n => format!("{slug}-{n}"),
        };
        *count += 1;
        anchors.insert(anchor);
    }
    anchors
}

/// `path` without `.` and `..` parts.
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// What is wrong with `target`, linked from `file`, if anything.
fn broken(file: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("an empty link".into());
    }
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let linked = if path.is_empty() {
        file.to_owned()
    } else {
        normal(&file.parent().unwrap().join(path))
    };
    if !linked.starts_with(root()) {
        return Some("outside the repository".into());
    }
    if !linked.exists() {
        return Some(format!("{} does not exist", linked.display()));
    }
    let anchor = anchor?;
    let text = fs::read_to_string(&linked).ok()?;
    (!anchors(&text).contains(anchor)).then(|| {
        format!(
            "{} has no heading with the anchor #{anchor}",
            linked.display()
        )
    })
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut files = Vec::new();
    markdown_files(root(), &mut files);
    files.sort();
    assert!(files.len() > 3, "{files:?}");
    let mut problems = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap();
        for target in links(&text) {
            if let Some(problem) = broken(file, &target) {
                let shown = file.strip_prefix(root()).unwrap().display();
                problems.push(format!("{shown}: ({target}): {problem}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_readme_links_every_page_of_the_docs() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let linked: BTreeSet<String> = links(&readme)
        .into_iter()
        .map(|target| target.split('#').next().unwrap_or("").to_owned())
        .collect();
    let mut missing = Vec::new();
    for entry in fs::read_dir(root().join("docs")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && !linked.contains(&format!("docs/{name}")) {
            missing.push(name);
        }
    }
    assert!(missing.is_empty(), "the README does not link {missing:?}");
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    let text = "# Try it\n## Use with containerd, CRI-O, podman and cnitool\n### `ipam-da-pool`: one address\n## Try it\n```\n# not a heading\n```\n<a id=\"codes\"></a>\n";
    let made = anchors(text);
    for anchor in [
        "try-it",
        "try-it-1",
        "use-with-containerd-cri-o-podman-and-cnitool",
        "ipam-da-pool-one-address",
        "codes",
    ] {
        assert!(made.contains(anchor), "{anchor}: {made:?}");
    }
    assert_eq!(made.len(), 5, "{made:?}");
    let readme = root().join("README.md");
    assert_eq!(broken(&readme, "#try-it"), None);
    assert_eq!(broken(&readme, "docs/safety.md"), None);
    assert_eq!(broken(&readme, "https://example.com/#x"), None);
    for bad in [
        "#no-such-heading",
        "docs/no-such-page.md",
        "docs/safety.md#nope",
        "../../etc/passwd",
        "",
    ] {
        assert!(broken(&readme, bad).is_some(), "{bad}");
    }
    assert_eq!(
        links("[a](docs/x.md#y) `[b](not/a.md)`\n```\n[c](no.md)\n```\n[d]: e.md\n"),
        ["docs/x.md#y", "e.md"]
    );
}

/// Where the repository's paths are named for readers, and the top
/// folders a path named there starts with.
const NAMED_IN: [&str; 4] = ["Cargo.toml", "README.md", "CONTRIBUTING.md", "docs"];
const TOP: [&str; 9] = [
    "src/",
    "tests/",
    "benches/",
    "fixtures/",
    "deploy/",
    "docs/",
    "fuzz/",
    ".ci/",
    ".github/",
];

/// What running makes, which a reader may be told of but the repository
/// does not hold.
const MADE_BY_RUNNING: [&str; 2] = ["fuzz/artifacts", "target/"];

/// The Rust sources whose comments name paths, but what builds leave.
fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, found);
        } else if name.ends_with(".rs") {
            found.push(path);
        }
    }
}

/// The text of `file` that speaks to a reader: the comments of a Rust
/// source, the whole of anything else.
fn reader_text(file: &Path) -> String {
    let text = fs::read_to_string(file).unwrap();
    if file.extension().is_some_and(|e| e == "rs") {
        text.lines()
            .filter(|line| line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        text
    }
}

/// The repository paths `text` names: a top folder and what follows it,
/// up to a character no path of ours has; a trailing stop is punctuation.
fn named_paths(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in text.char_indices() {
        let Some(top) = TOP.iter().find(|top| text[at..].starts_with(**top)) else {
            continue;
        };
        // Part of a longer path (/usr/share/gocode/src/…) or a word.
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || "/._-".contains(c)) {
            continue;
        }
        let rest = &text[at + top.len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || "_./{},*-".contains(c)))
            .unwrap_or(rest.len());
        let path = format!("{top}{}", &rest[..end]);
        found.push(path.trim_end_matches(['.', ',', ':', ';']).to_owned());
    }
    found
}

/// `path` with its one `{a,b}` group, if any, spelt out.
fn expanded(path: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (path.find('{'), path.find('}')) else {
        return vec![path.to_owned()];
    };
    path[open + 1..close]
        .split(',')
        .map(|each| format!("{}{each}{}", &path[..open], &path[close + 1..]))
        .collect()
}

/// Whether `path` (a file, a folder, or a `*` pattern in its last part)
/// is in the repository.
fn exists(path: &str) -> bool {
    let Some((dir, pattern)) = path.rsplit_once('/').filter(|_| path.contains('*')) else {
        return root().join(path).exists();
    };
    let (before, after) = pattern.split_once('*').unwrap_or((pattern, ""));
    fs::read_dir(root().join(dir)).is_ok_and(|entries| {
        entries.filter_map(Result::ok).any(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.starts_with(before) && name.ends_with(after)
        })
    })
}

#[test]
fn every_path_named_for_a_reader_is_there() {
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in ["src", "tests", "benches", "fuzz"] {
        rust_files(&root().join(dir), &mut files);
    }
    for named in NAMED_IN {
        let path = root().join(named);
        if path.is_dir() {
            markdown_files(&path, &mut files);
        } else {
            files.push(path);
        }
    }
    files.sort();
    let mut missing = Vec::new();
    let mut seen = 0;
    for file in &files {
        for named in named_paths(&reader_text(file)) {
            seen += 1;
            if MADE_BY_RUNNING.iter().any(|made| named.starts_with(made)) {
                continue;
            }
            for path in expanded(&named) {
                if !exists(&path) {
                    let shown = file.strip_prefix(root()).unwrap().display();
                    missing.push(format!("{shown}: {path}"));
                }
            }
        }
    }
    assert!(seen > 20, "only {seen} paths named: the scan reads nothing");
    assert!(
        missing.is_empty(),
        "paths named that are not there:\n{}",
        missing.join("\n")
    );
}

#[test]
fn named_paths_are_read_as_a_reader_reads_them() {
    let text = "see src/sys/, (src/pool/{local,etcd}.rs). /usr/share/gocode/src/github.com \
                fixtures/conflists/*.conflist and `.ci/test`; mysrc/x";
    assert_eq!(
        named_paths(text),
        [
            "src/sys/",
            "src/pool/{local,etcd}.rs",
            "fixtures/conflists/*.conflist",
            ".ci/test"
        ]
    );
    assert_eq!(
        expanded("src/pool/{local,etcd}.rs"),
        ["src/pool/local.rs", "src/pool/etcd.rs"]
    );
    assert!(exists("fixtures/conflists/*.conflist") && exists("src/sys/"));
    assert!(!exists("src/pool/local.rs") && !exists("fixtures/conflists/*.nope"));
}

/// The code map's block: the first fenced block after its heading.
fn code_map() -> String {
    let text = fs::read_to_string(root().join("CONTRIBUTING.md")).unwrap();
    let after = &text[text.find("## The code map").expect("a code map")..];
    let block = &after[after.find("```").expect("a fenced block") + 3..];
    let block = &block[block.find('\n').unwrap() + 1..];
    block[..block.find("```").expect("its end")].to_owned()
}

/// The paths the map names, each from the folders above it: a line whose
/// first part (before two spaces) is a list of names, each a folder
/// (`name/`) or a file with one of our extensions, is an entry; any
/// other line is prose. A line indented under a folder is inside it.
fn mapped(map: &str) -> Vec<String> {
    const EXTENSIONS: [&str; 5] = ["rs", "toml", "lock", "md", "yml"];
    let is_name = |word: &str| {
        !word.is_empty()
            && word
                .chars()
                .all(|c| c.is_alphanumeric() || "._-/".contains(c))
            && (word.ends_with('/')
                || word
                    .rsplit_once('.')
                    .is_some_and(|(stem, ext)| !stem.is_empty() && EXTENSIONS.contains(&ext)))
    };
    let mut above: Vec<(usize, String)> = Vec::new();
    let mut paths = Vec::new();
    for line in map.lines() {
        let indent = line.len() - line.trim_start().len();
        let names = line.trim_start().split("  ").next().unwrap_or("").trim();
        let names: Vec<&str> = names.split(", ").collect();
        if !names.iter().all(|name| is_name(name)) {
            continue;
        }
        above.retain(|(depth, _)| *depth < indent);
        let parent: String = above.iter().map(|(_, dir)| dir.as_str()).collect();
        for name in names {
            paths.push(format!("{parent}{name}"));
            if name.ends_with('/') {
                above.push((indent, name.to_owned()));
            }
        }
    }
    paths
}

#[test]
fn the_code_map_names_every_file_of_src_and_nothing_else() {
    let paths = mapped(&code_map());
    let missing: Vec<&String> = paths.iter().filter(|p| !root().join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "the code map names {missing:?}, not there"
    );
    let mut sources = Vec::new();
    rust_files(&root().join("src"), &mut sources);
    let unnamed: Vec<String> = sources
        .iter()
        .map(|file| file.strip_prefix(root()).unwrap().display().to_string())
        .filter(|file| !paths.contains(file))
        .collect();
    assert!(unnamed.is_empty(), "the code map leaves out {unnamed:?}");
    assert!(
        mapped("src/\n  a.rs, b/  prose\n    c.rs\n  prose, too\n  d.rs\nx.md")
            == [
                "src/",
                "src/a.rs",
                "src/b/",
                "src/b/c.rs",
                "src/d.rs",
                "x.md"
            ]
    );
}
