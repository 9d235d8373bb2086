//! The binary's command line, when it is not run as a CNI plugin: the
//! about text, --help and --version, usage errors, and agent mode's
//! options; and a CNI invocation, which never reads its arguments.

use crate::common;
use std::fs;
use std::path::Path;

use crate::agent_harness::fixture_agent;
use crate::common::{config, run_cli, run_plugin, temp_dir, Answer, Env, Stack};
use serde_json::json;

#[test]
fn no_command_prints_the_about_text_and_fails() {
    let stack = Stack::of(&["a"]);
    let out = run_plugin(
        &stack.env("ADD").unset("CNI_COMMAND"),
        config("1.0.0", &["a"]).as_bytes(),
    );
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert!(out.stderr.starts_with("ipam-delegated "), "{}", out.stderr);
    assert!(out.stderr.contains("0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"));
    assert!(stack.calls().is_empty());
}

#[test]
fn help_version_and_unknown_arguments() {
    let dir = temp_dir("cli");
    let log = dir.path().join("plugin.log").display().to_string();
    let env = Env(vec![
        ("PATH".into(), "/usr/bin:/bin".into()),
        // The verbose flavour logs here, not to the machine's /var/log.
        ("IPAM_DELEGATED_LOG_FILE".into(), log),
    ]);
    let out = run_cli(&["--help"], &env);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for command in ["ensure", "release", "doctor", "ipam.delegates"] {
        assert!(help.contains(command), "{help}");
    }
    let out = run_cli(&["--version"], &env);
    assert!(out.status.success());
    let version = String::from_utf8(out.stdout).unwrap();
    let flavour = if cfg!(feature = "verbose") {
        "verbose"
    } else {
        "standard"
    };
    assert_eq!(
        version,
        format!("ipam-delegated {} ({flavour} flavour)\nCNI spec versions: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0\n", env!("CARGO_PKG_VERSION"))
    );
    for (args, read) in [
        (&["--frobnicate"][..], "ipam-delegated --help"),
        (&["doctor"], "ipam-delegated doctor --help"),
        (&["--version", "extra"], "ipam-delegated --help"),
    ] {
        let out = run_cli(args, &env);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            out.stderr.ends_with(&format!("(see '{read}')\n")),
            "{}",
            out.stderr
        );
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    }
}

#[test]
fn a_cni_invocation_never_reads_arguments() {
    let stack = Stack::of(&["a"]);
    stack.answer(
        "a",
        "ADD",
        Answer::prints(r#"{"cniVersion":"1.0.0","ips":[]}"#),
    );
    let env = stack.env("ADD");
    let mut child = common::spawn_plugin(
        Path::new("/"),
        &["--frobnicate", "doctor"],
        &env,
        std::process::Stdio::null(),
    );
    let input = common::config("1.0.0", &["a"]);
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(stack.call_list(), ["a ADD"]);
}

#[test]
fn command_line_errors_are_clear() {
    let agent = fixture_agent();
    let config = agent.conflist.display().to_string();
    let error = run_cli(
        &["ensure", "--config", &config, "--id", "-bad"],
        &agent.env(),
    )
    .assert_error(4);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .starts_with("--id is invalid"),
        "{error}"
    );
    let error = run_cli(
        &["ensure", "--config", "/nonexistent.conflist", "--id", "a"],
        &agent.env(),
    )
    .assert_error(7);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .starts_with("/nonexistent.conflist: cannot be read"),
        "{error}"
    );
    // A directory is read as net.d: one with no network of ours says so.
    let empty = temp_dir("empty");
    let dir = empty.path().display().to_string();
    let error = run_cli(&["release", "--config", &dir, "--id", "a"], &agent.env()).assert_error(7);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .ends_with("has no network whose ipam.type is ipam-delegated"),
        "{error}"
    );

    for plugins in [
        json!([{"type": "bridge", "ipam": {"type": "host-local"}}]),
        json!([
            {"type": "bridge", "ipam": {"type": "ipam-delegated", "delegates": ["a"]}},
            {"type": "macvlan", "ipam": {"type": "ipam-delegated", "delegates": ["a"]}}
        ]),
    ] {
        let file = agent.state.parent().unwrap().join("other.conflist");
        fs::write(
            &file,
            json!({"cniVersion": "1.0.0", "name": "n", "plugins": plugins}).to_string(),
        )
        .unwrap();
        let error = run_cli(
            &["ensure", "--config", file.to_str().unwrap(), "--id", "a"],
            &agent.env(),
        )
        .assert_error(7);
        assert!(
            error["msg"]
                .as_str()
                .unwrap()
                .contains("exactly one plugin whose ipam.type is ipam-delegated"),
            "{error}"
        );
    }
    for args in [
        &["frobnicate"][..],
        &["ensure", "--id", "a"],
        &["release", "--config", "f", "--id", "a", "--netns"],
    ] {
        let out = run_cli(args, &agent.env());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty());
        assert!(out.stderr.contains("--help')"), "{}", out.stderr);
    }
    assert!(agent.stack.calls().is_empty());
}

#[test]
fn empty_interface_or_namespace_values_are_refused() {
    let agent = fixture_agent();
    let config = agent.conflist.display().to_string();
    let error = run_cli(
        &["ensure", "--config", &config, "--id", "a", "--ifname="],
        &agent.env(),
    )
    .assert_error(4);
    assert_eq!(error["msg"], "--ifname is invalid: \"\" is empty");
    let out = run_cli(
        &["ensure", "--config", &config, "--id", "a", "--netns="],
        &agent.env(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(agent.stack.calls().is_empty());
}

#[test]
fn docker_plugin_is_the_driver_binary_beside_the_plugin() {
    let dir = temp_dir("cli");
    let log = dir.path().join("plugin.log").display().to_string();
    let env = Env(vec![("IPAM_DELEGATED_LOG_FILE".into(), log)]);
    // Beside it, as installed: the driver answers, here with its usage.
    let out = run_cli(&["docker-plugin", "--bogus"], &env);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("unknown option \"--bogus\"")
            && out
                .stderr
                .contains("(see 'ipam-delegated docker-plugin --help')"),
        "{}",
        out.stderr
    );
    // A plugin installed without it says what is missing.
    let alone = dir.path().join("ipam-delegated");
    fs::copy(common::PLUGIN, &alone).unwrap();
    let out = common::run_program(
        alone.to_str().unwrap(),
        dir.path(),
        &["docker-plugin", "--config", "x"],
        &env,
        b"",
    );
    assert_eq!(out.status.code(), Some(1));
    let expected = format!(
        "docker-plugin runs {}, which cannot be started",
        dir.path().join("ipam-delegated-docker").display()
    );
    assert!(out.stderr.contains(&expected), "{}", out.stderr);
    assert!(
        out.stderr.contains("install ipam-delegated-docker"),
        "{}",
        out.stderr
    );
}
