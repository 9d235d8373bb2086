//! The systemd units of deploy/systemd run command lines the binaries
//! take: each Exec line, run with its `--config` pointed at a file that
//! is not there, gets as far as reading it (exit status 1, naming it),
//! never a usage error (2).

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::common::{temp_dir, ALLOCATOR, PLUGIN, PORT_ALLOCATOR};

/// The unit's Exec lines, each as its words.
fn exec_lines(unit: &str) -> Vec<Vec<String>> {
    unit.lines()
        .filter_map(|line| {
            line.strip_prefix("ExecStart=")
                .or(line.strip_prefix("ExecStop="))
        })
        .map(|line| line.split_whitespace().map(String::from).collect())
        .collect()
}

#[test]
fn every_units_command_line_is_one_the_binaries_take() {
    let dir = temp_dir("units");
    let missing = dir.path().join("no-such-config");
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/systemd");
    let mut run = 0;
    for entry in fs::read_dir(&units).unwrap() {
        let path = entry.unwrap().path();
        let unit = fs::read_to_string(&path).unwrap();
        let lines = exec_lines(&unit);
        assert!(!lines.is_empty(), "{} runs nothing", path.display());
        for words in lines {
            let program = match words[0].as_str() {
                "/opt/cni/bin/ipam-delegated" => PLUGIN,
                "/opt/cni/bin/ipam-da-pool" => ALLOCATOR,
                "/opt/cni/bin/ipam-da-neutron" => PORT_ALLOCATOR,
                other => panic!("{}: runs {other}, which is not ours", path.display()),
            };
            let mut args = words[1..].to_vec();
            let config = args.iter().position(|a| a == "--config").unwrap() + 1;
            args[config] = missing.display().to_string();
            let out = Command::new("timeout")
                .arg("20")
                .arg(program)
                .args(&args)
                .env("CNI_PATH", dir.path())
                .env("IPAM_DELEGATED_LOG_FILE", dir.path().join("log"))
                .output()
                .unwrap();
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(out.status.code(), Some(1), "{words:?}: {said}");
            assert!(said.contains("no-such-config"), "{words:?}: {said}");
            run += 1;
        }
    }
    assert!(run >= 5, "only {run} command lines");
}
