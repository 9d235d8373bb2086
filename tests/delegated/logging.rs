//! Logging through the built binary: stderr for warnings and errors in both
//! flavours; the debug log file only in the `verbose` flavour (run the
//! suite with `--features verbose` for those tests).

use crate::common;
use crate::common::{config, temp_dir, Answer, Stack};

/// A stack whose second delegate fails with a message spanning lines.
fn failing_stack() -> Stack {
    let stack = Stack::of(&["ipam-ds-one", "ipam-da-two"]);
    stack.answer(
        "ipam-ds-one",
        "ADD",
        Answer::prints(r#"{"cniVersion":"1.0.0","ips":[]}"#),
    );
    stack.answer(
        "ipam-da-two",
        "ADD",
        Answer::fails(1, r#"{"code":11,"msg":"line one\nline two"}"#),
    );
    stack.answer(
        "ipam-ds-one",
        "DEL",
        Answer::fails(1, r#"{"code":5,"msg":"cannot release"}"#),
    );
    stack
}

#[test]
fn warnings_and_errors_reach_stderr_one_line_each_without_colour() {
    let stack = failing_stack();
    let out = stack.run(
        "ADD",
        config("1.0.0", &["ipam-ds-one", "ipam-da-two"]).as_bytes(),
    );
    out.assert_error(11);
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert!(
        !out.stderr.contains('\u{1b}'),
        "colour codes on stderr: {:?}",
        out.stderr
    );
    let find = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
    assert_eq!(find("WARN") + find("ERROR"), lines.len(), "{lines:#?}");
    // The rollback failure is a warning, the answer an error, each one line
    // even though the delegate's message has a newline in it.
    assert_eq!(
        find("rollback: ipam-ds-one (DEL): failed with code 5: cannot release"),
        1,
        "{lines:#?}"
    );
    assert_eq!(find("ERROR"), 1, "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("ERROR") && l.contains(r"line one\nline two")),
        "{lines:#?}"
    );
}

#[test]
fn a_closed_stderr_does_not_stop_the_error_reply() {
    let stack = failing_stack();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let input = config("1.0.0", &["ipam-ds-one", "ipam-da-two"]);
    let child = common::start_plugin(&stack.env("ADD"), input.as_bytes(), writer.into());
    let out = child.wait_with_output().unwrap();
    // Exit status 1, as for any error, not a panic's 101 or an abort.
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let error: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(error["code"], 11);
}

#[test]
fn a_success_logs_nothing_on_stderr() {
    let stack = Stack::of(&["a"]);
    stack.answer(
        "a",
        "ADD",
        Answer::prints(r#"{"cniVersion":"1.0.0","ips":[]}"#),
    );
    let out = stack.run("ADD", config("1.0.0", &["a"]).as_bytes());
    assert!(out.status.success());
    assert_eq!(out.stderr, "");
}

#[cfg(not(feature = "verbose"))]
#[test]
fn the_standard_flavour_writes_no_log_file() {
    let stack = failing_stack();
    let dir = temp_dir("log");
    let log = dir.path().join("sub/ipam-delegated.log");
    let env = stack
        .env("ADD")
        .set("IPAM_DELEGATED_LOG_FILE", &log.display().to_string());
    common::run_plugin(
        &env,
        config("1.0.0", &["ipam-ds-one", "ipam-da-two"]).as_bytes(),
    )
    .assert_error(11);
    assert!(!log.exists());
}

#[cfg(feature = "verbose")]
#[test]
fn the_verbose_flavour_appends_a_complete_debug_log() {
    let stack = failing_stack();
    let dir = temp_dir("log");
    let log = dir.path().join("created/by/plugin/ipam-delegated.log");
    let input = config("1.0.0", &["ipam-ds-one", "ipam-da-two"]);
    for id in ["first-run", "second-run"] {
        let env = stack
            .env("ADD")
            .set("IPAM_DELEGATED_LOG_FILE", &log.display().to_string())
            .set("CNI_CONTAINERID", id);
        common::run_plugin(&env, input.as_bytes()).assert_error(11);
    }
    let text = std::fs::read_to_string(&log).unwrap();
    // Appended: both runs are there, in order.
    let first = text.find("first-run").expect("first run logged");
    let second = text.find("second-run").expect("second run logged");
    assert!(first < second, "{text}");

    let run = &text[second..];
    assert!(
        text.contains(concat!("version=\"", env!("CARGO_PKG_VERSION"), "\"")),
        "{text}"
    );
    assert!(run.contains("command=ADD"), "{run}");
    let bin = stack.bin().display().to_string();
    for (name, command, status) in [
        ("ipam-ds-one", "ADD", "exit status: 0"),
        ("ipam-da-two", "ADD", "exit status: 1"),
        ("ipam-ds-one", "DEL", "exit status: 1"),
        ("ipam-da-two", "DEL", "exit status: 0"),
    ] {
        let line = run
            .lines()
            .find(|l| {
                l.contains(&format!("delegate={name}")) && l.contains(&format!("command={command}"))
            })
            .unwrap_or_else(|| panic!("no {name} {command} call in {run}"));
        assert!(line.contains("DEBUG"), "{line}");
        assert!(line.contains(&format!("path={bin}/{name}")), "{line}");
        assert!(line.contains(&format!("status={status}")), "{line}");
        assert!(line.contains("duration="), "{line}");
        assert!(line.contains("bytes_out="), "{line}");
    }
    // The final error is in the file as well as on stderr.
    assert!(run.contains("ERROR"), "{run}");
}

#[cfg(feature = "verbose")]
#[test]
fn the_verbose_log_records_stopped_delegates_and_refused_invocations() {
    let stack = Stack::of(&["ipam-da-flood"]);
    stack.answer("ipam-da-flood", "ADD", Answer::prints(vec![b' '; 5 << 20]));
    let dir = temp_dir("log");
    let log = dir.path().join("ipam-delegated.log");
    let env = stack
        .env("ADD")
        .set("IPAM_DELEGATED_LOG_FILE", &log.display().to_string());
    let input = config("1.0.0", &["ipam-da-flood"]);
    common::run_plugin(&env, input.as_bytes()).assert_error(104);
    common::run_plugin(&env.clone().unset("CNI_PATH"), input.as_bytes()).assert_error(4);

    let text = std::fs::read_to_string(&log).unwrap();
    // The README's 4 MiB.
    let cap = 4 << 20;
    let flood = text
        .lines()
        .find(|l| l.contains("delegate=ipam-da-flood") && l.contains("command=ADD"))
        .unwrap_or_else(|| panic!("no flooding call in {text}"));
    assert!(
        flood.contains(&format!(
            "status=printed more than {cap} bytes on stdout and was stopped"
        )),
        "{flood}"
    );
    // Both runs logged their start with the version, the refused one too.
    let version = concat!("version=\"", env!("CARGO_PKG_VERSION"), "\"");
    assert_eq!(
        text.lines().filter(|l| l.contains(version)).count(),
        2,
        "{text}"
    );
    assert!(text.contains("CNI_PATH is not set"), "{text}");
}

#[cfg(feature = "verbose")]
#[test]
fn a_hostile_umask_leaves_the_log_for_root_to_write() {
    let stack = failing_stack();
    let dir = temp_dir("log-umask");
    let log = dir.path().join("var/log/cni/ipam-delegated.log");
    let env = stack
        .env("ADD")
        .set("IPAM_DELEGATED_LOG_FILE", &log.display().to_string());
    let input = config("1.0.0", &["ipam-ds-one", "ipam-da-two"]);
    common::run_under_umask("000", common::PLUGIN, &[], &env, input.as_bytes()).assert_error(11);
    for made in ["var", "var/log", "var/log/cni"] {
        assert_eq!(common::mode_of(&dir.path().join(made)), 0o755, "{made}");
    }
    assert_eq!(common::mode_of(&log), 0o644);
}
