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
fn the_projects_own_changelog_has_a_section_for_the_packages_version() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/release-notes");
    let out = Command::new(script)
        .arg(env!("CARGO_PKG_VERSION"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `.ci/release` run in a clone of this commit at `dir`, with a target
/// directory of its own: what it wrote, by name.
fn release_in(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let source = dir.join("source");
    let cloned = Command::new("git")
        .args(["clone", "--quiet", env!("CARGO_MANIFEST_DIR")])
        .arg(&source)
        .status()
        .unwrap();
    assert!(cloned.success());
    let out = dir.join("out");
    let built = Command::new(source.join(".ci/release"))
        .arg(&out)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .status()
        .unwrap();
    assert!(built.success());
    std::fs::read_dir(&out)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect()
}

#[test]
#[ignore = "needs two static builds of the package and podman (minutes)"]
fn two_builds_of_one_commit_give_the_same_archive_of_what_a_release_ships() {
    // The archive does not depend on the flavour the tests run in: the
    // standard run builds it.
    if cfg!(feature = "verbose") {
        return;
    }
    let (one, two) = (common::temp_dir("release-1"), common::temp_dir("release-2"));
    let (first, second) = (release_in(one.path()), release_in(two.path()));
    let version = env!("CARGO_PKG_VERSION");
    let archive = format!("ipam-delegated-{version}-linux-amd64.tgz");
    let package = format!("ipam-delegated_{version}_amd64.deb");
    let image = format!("ipam-delegated-{version}-image.oci.tar");
    for made in [&archive, &package, &image] {
        assert!(first.contains_key(made), "{made} not in {:?}", first.keys());
    }
    assert!(first == second, "two builds differ");
    let sums = String::from_utf8(first["SHA256SUMS"].clone()).unwrap();
    for made in [&archive, &package, &image] {
        assert!(sums.contains(&format!("  {made}\n")), "{sums}");
    }
    // What is in it: sorted, owned by root, the binaries executable.
    let listing = Command::new("tar")
        .args(["-tvzf"])
        .arg(one.path().join("out").join(&archive))
        .output()
        .unwrap();
    let listing = String::from_utf8(listing.stdout).unwrap();
    let names: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    let top = format!("ipam-delegated-{version}-linux-amd64/");
    let expected: Vec<String> = [
        "",
        "CHANGELOG.md",
        "LICENSE-APACHE",
        "LICENSE-MIT",
        "README.md",
        "ipam-da-neutron",
        "ipam-da-pool",
        "ipam-delegated",
        "ipam-delegated-docker",
        "ipam-ds-static",
    ]
    .iter()
    .map(|n| format!("{top}{n}"))
    .collect();
    assert_eq!(names, expected);
    assert!(listing.lines().all(|l| l.contains(" 0/0 ")), "{listing}");
    // The binaries run, statically linked.
    let unpacked = one.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    let untar = Command::new("tar")
        .arg("-xzf")
        .arg(one.path().join("out").join(&archive))
        .arg("-C")
        .arg(&unpacked)
        .status()
        .unwrap();
    assert!(untar.success());
    for binary in [
        "ipam-delegated",
        "ipam-ds-static",
        "ipam-da-pool",
        "ipam-da-neutron",
        "ipam-delegated-docker",
    ] {
        let path = unpacked.join(&top).join(binary);
        let version_out = Command::new(&path).arg("--version").output().unwrap();
        assert!(version_out.status.success(), "{binary}");
        let ldd = Command::new("ldd").arg(&path).output().unwrap();
        let said = String::from_utf8_lossy(&ldd.stdout).into_owned()
            + &String::from_utf8_lossy(&ldd.stderr);
        assert!(
            said.contains("not a dynamic executable"),
            "{binary}: {said}"
        );
    }
}
