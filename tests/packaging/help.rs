//! Every binary's command line follows the conventions: `--help` (after
//! any command too) prints its usage and exits 0, `--version` answers,
//! a usage error is one line naming the problem and the `--help` to read
//! with exit status 2, and the manual page says what `--help` says.

use std::path::Path;

use crate::common::{run_program, Env, ALLOCATOR, PLUGIN, PORT_ALLOCATOR, SELECTOR};

const DOCKER: &str = env!("CARGO_BIN_EXE_ipam-delegated-docker");

/// Runs `binary` with `args`, no CNI_COMMAND.
fn run(binary: &str, args: &[&str]) -> crate::common::Outcome {
    run_program(binary, Path::new("/"), args, &Env(Vec::new()), b"")
}

/// The commands `binary --help` lists.
fn commands(binary: &str) -> Vec<String> {
    let help = String::from_utf8(run(binary, &["--help"]).stdout).unwrap();
    let Some((_, list)) = help.split_once("\nCommands:\n") else {
        return Vec::new();
    };
    list.lines()
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|word| !word.starts_with("--"))
        .map(String::from)
        .collect()
}

#[test]
fn every_binary_and_command_answers_help_version_and_usage_errors_alike() {
    for binary in [PLUGIN, SELECTOR, ALLOCATOR, PORT_ALLOCATOR, DOCKER] {
        let name = Path::new(binary).file_name().unwrap().to_str().unwrap();
        for flag in ["--help", "--version", "--generate-man"] {
            let out = run(binary, &[flag]);
            assert!(out.status.success(), "{name} {flag}: {out:?}");
            assert!(!out.stdout.is_empty(), "{name} {flag}");
        }
        let version = String::from_utf8(run(binary, &["--version"]).stdout).unwrap();
        assert!(
            version.starts_with(&format!("{name} {}", env!("CARGO_PKG_VERSION"))),
            "{version}"
        );
        let man = String::from_utf8(run(binary, &["--generate-man"]).stdout).unwrap();
        assert!(
            man.starts_with(&format!(".TH {} 1 ", name.to_uppercase())),
            "{man}"
        );
        // A usage error: one line, exit status 2, naming what to read.
        let out = run(binary, &["--bogus-option"]);
        assert_eq!(out.status.code(), Some(2), "{name}: {out:?}");
        assert_eq!(out.stderr.lines().count(), 1, "{name}: {}", out.stderr);
        assert!(
            out.stderr.contains(&format!("(see '{name} --help')")),
            "{}",
            out.stderr
        );
        for command in commands(binary) {
            let out = run(binary, &[&command, "--help"]);
            assert!(out.status.success(), "{name} {command} --help: {out:?}");
            let usage = String::from_utf8(out.stdout).unwrap();
            assert!(
                usage.starts_with(&format!("usage: {name} {command} ")),
                "{usage}"
            );
            // The manual page has the same synopsis, roff-escaped.
            let synopsis = usage.lines().next().unwrap()
                [format!("usage: {name} {command} ").len()..]
                .replace('-', "\\-");
            assert!(
                man.contains(&synopsis),
                "{name} {command}: {synopsis}\n{man}"
            );
            let out = run(binary, &[&command, "--bogus-option"]);
            assert_eq!(out.status.code(), Some(2), "{name} {command}: {out:?}");
            assert_eq!(
                out.stderr.trim_end(),
                format!("{name} {command}: unknown option \"--bogus-option\" (see '{name} {command} --help')")
            );
        }
    }
    // The commands are found: ipam-delegated's and the allocators'.
    assert!(commands(PLUGIN).contains(&"docker-plugin".to_owned()));
    assert!(commands(ALLOCATOR).contains(&"readmit".to_owned()));
    assert!(commands(PORT_ALLOCATOR).contains(&"release".to_owned()));
    // The Docker driver's one command: its options after its name.
    let out = run(DOCKER, &["--config", "/nonexistent", "--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .starts_with("usage: ipam-delegated-docker --config PATH"));
}
