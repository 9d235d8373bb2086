//! The alert rules shipped in deploy/prometheus: each one's cases in
//! ipam-da-pool.test.yml both trip it and hold it back, so that a rule
//! whose threshold never or always fires fails `promtool test rules`.

use std::path::Path;
use std::process::Command;

/// The rules' file with the threshold of rule `index` (its `expr`'s last
/// word) made `threshold`.
fn with_threshold(rules: &str, index: usize, threshold: &str) -> String {
    let mut seen = 0;
    rules
        .lines()
        .map(|line| {
            if !line.trim_start().starts_with("expr: ") {
                return line.to_owned();
            }
            seen += 1;
            if seen - 1 != index {
                return line.to_owned();
            }
            let (rest, _) = line.rsplit_once(' ').unwrap();
            format!("{rest} {threshold}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `promtool test rules` passes on `rules` and the shipped cases.
fn cases_pass(rules: &str) -> bool {
    let dir = crate::common::temp_dir("alerts");
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus");
    std::fs::write(dir.path().join("ipam-da-pool.rules.yml"), rules).unwrap();
    std::fs::copy(
        shipped.join("ipam-da-pool.test.yml"),
        dir.path().join("ipam-da-pool.test.yml"),
    )
    .unwrap();
    let out = Command::new("promtool")
        .args(["test", "rules", "ipam-da-pool.test.yml"])
        .current_dir(dir.path())
        .output()
        .expect("promtool runs (./.ci/test installs prometheus)");
    out.status.success()
}

#[test]
#[ignore = "needs promtool"]
fn every_rules_cases_trip_it_and_hold_it_back() {
    let file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/ipam-da-pool.rules.yml");
    let rules = std::fs::read_to_string(file).unwrap();
    assert!(cases_pass(&rules), "the shipped rules fail their cases");
    let count = rules
        .lines()
        .filter(|l| l.trim_start().starts_with("expr: "))
        .count();
    assert!(count >= 11, "{count} rules");
    for index in 0..count {
        // Never firing, then always firing: either must fail a case.
        for threshold in ["1e15", "-1e15"] {
            assert!(
                !cases_pass(&with_threshold(&rules, index, threshold)),
                "rule {index} with threshold {threshold} still passes its cases"
            );
        }
    }
}
