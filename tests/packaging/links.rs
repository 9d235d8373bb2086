//! The documentation holds together: every relative link of every
//! Markdown file of the repository names a file that is there, every
//! anchor a heading of it (as GitHub makes anchors from headings), and the
//! README's index reaches every page of docs/.

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
