//! What a release ships beside the binaries: its notes are the version's
//! own CHANGELOG section (.ci/release-notes, run by the release workflow).

use crate::common;
use std::process::Command;

fn notes(version: &str, changelog: &str) -> std::process::Output {
    let dir = common::temp_dir("release");
    let file = dir.path().join("CHANGELOG.md");
    std::fs::write(&file, changelog).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/release-notes");
    Command::new(script)
        .arg(version)
        .arg(&file)
        .output()
        .unwrap()
}

const CHANGELOG: &str = "# Changelog

## [Unreleased]

### Added
- what comes next

## [0.2.0] - 2026-12-01

### Fixed
- the second release's fix

## [0.1.0] - 2026-11-01

- the first release
";

#[test]
fn the_notes_are_the_versions_own_section() {
    let out = notes("0.2.0", CHANGELOG);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "\n### Fixed\n- the second release's fix\n"
    );
    let out = notes("0.1.0", CHANGELOG);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "\n- the first release\n"
    );
}

#[test]
fn a_version_without_a_section_is_refused() {
    let out = notes("0.3.0", CHANGELOG);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no section for 0.3.0"));
    let out = notes("0.4.0", "# Changelog\n\n## [0.4.0]\n\n## [0.3.0]\n- x\n");
    assert!(!out.status.success(), "an empty section is no notes");
}

#[test]
fn the_projects_own_changelog_has_an_unreleased_section() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/release-notes");
    let out = Command::new(script).arg("Unreleased").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
