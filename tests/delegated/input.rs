//! Every bad input, through the built binary: its code, the
//! thing named in the message, the reply's cniVersion, and no delegate run.

use crate::common::{config, run_plugin, Answer, Env, Stack};

/// A stack with one scripted delegate `a` that would record any call.
fn stack() -> Stack {
    let stack = Stack::of(&["a"]);
    stack.answer(
        "a",
        "ADD",
        Answer::prints(r#"{"cniVersion":"1.0.0","ips":[]}"#),
    );
    stack
}

/// Runs `env` with `stdin`, expects `code` with `needle` in the message,
/// and checks that nothing was run.
fn refused(stack: &Stack, env: &Env, stdin: &str, code: u64, needle: &str) -> serde_json::Value {
    let error = run_plugin(env, stdin.as_bytes()).assert_error(code);
    let msg = error["msg"].as_str().unwrap();
    assert!(msg.contains(needle), "{needle:?} not in {msg:?}");
    assert!(stack.calls().is_empty(), "a delegate ran for {msg}");
    error
}

#[test]
fn an_unknown_command_is_code_4() {
    let stack = stack();
    refused(
        &stack,
        &stack.env("FROB"),
        &config("1.0.0", &["a"]),
        4,
        "\"FROB\"",
    );
}

#[test]
fn each_missing_variable_is_code_4_and_named() {
    let stack = stack();
    let cases = [
        (
            "ADD",
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"][..],
        ),
        (
            "CHECK",
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
        ),
        ("DEL", &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"]),
    ];
    for (command, vars) in cases {
        for var in vars {
            let input = config("1.0.0", &["a"]);
            refused(&stack, &stack.env(command).unset(var), &input, 4, var);
            refused(&stack, &stack.env(command).set(var, ""), &input, 4, var);
        }
    }
}

#[test]
fn malformed_variables_are_code_4_and_named() {
    let stack = stack();
    let input = config("1.0.0", &["a"]);
    for (var, value) in [
        ("CNI_CONTAINERID", "-starts-with-dash"),
        ("CNI_CONTAINERID", "has space"),
        ("CNI_CONTAINERID", "../../etc"),
        ("CNI_IFNAME", "sixteen-bytes-xx"),
        ("CNI_IFNAME", "."),
        ("CNI_IFNAME", ".."),
        ("CNI_IFNAME", "eth/0"),
        ("CNI_IFNAME", "eth:0"),
        ("CNI_IFNAME", "eth 0"),
        ("CNI_PATH", ":::"),
    ] {
        for command in ["ADD", "DEL", "CHECK"] {
            refused(&stack, &stack.env(command).set(var, value), &input, 4, var);
        }
    }
}

#[test]
fn bad_stdin_is_code_6_with_the_newest_version_in_the_reply() {
    let stack = stack();
    for stdin in [
        "",
        "not json",
        "[\"a\"]",
        "42",
        "{\"cniVersion\": \"1.0.0\",",
        "{\"a\":\"\u{fffd}\"} trailing",
    ] {
        let error = refused(&stack, &stack.env("ADD"), stdin, 6, "network configuration");
        assert_eq!(error["cniVersion"], "1.1.0", "{stdin:?}");
    }
    let out = run_plugin(
        &stack.env("ADD"),
        b"{\"cniVersion\":\"1.0.0\",\"name\":\"\xff\"}",
    );
    out.assert_error(6);
}

#[test]
fn unsupported_or_missing_versions_are_code_1() {
    let stack = stack();
    for version in ["0.1.0", "0.2.0", "1.2.0", "1.0", ""] {
        let error = refused(
            &stack,
            &stack.env("ADD"),
            &config(version, &["a"]),
            1,
            "is not supported",
        );
        assert_eq!(
            error["cniVersion"], version,
            "the reply keeps the input's version"
        );
    }
    let input = r#"{"name":"n","ipam":{"delegates":["a"]}}"#;
    refused(&stack, &stack.env("ADD"), input, 1, "cniVersion (missing)");
}

#[test]
fn check_before_0_4_0_is_code_1() {
    let stack = stack();
    for version in ["0.3.0", "0.3.1"] {
        let error = refused(
            &stack,
            &stack.env("CHECK"),
            &config(version, &["a"]),
            1,
            "CHECK needs cniVersion 0.4.0",
        );
        assert_eq!(error["cniVersion"], version);
    }
}

#[test]
fn a_missing_name_is_code_7() {
    let stack = stack();
    let input = r#"{"cniVersion":"1.0.0","ipam":{"delegates":["a"]}}"#;
    refused(&stack, &stack.env("ADD"), input, 7, "\"name\"");
}

#[test]
fn a_name_breaking_the_specs_rule_is_code_7_at_every_version() {
    let stack = stack();
    for version in ["0.3.0", "0.4.0", "1.1.0"] {
        for name in ["-pods", "pods net", "../pods", "pods/v4"] {
            let input = config(version, &["a"]).replace("\"testnet\"", &format!("{name:?}"));
            refused(
                &stack,
                &stack.env("ADD"),
                &input,
                7,
                "must start with a letter or digit",
            );
        }
    }
}

#[test]
fn every_bad_variable_is_named_in_one_error() {
    let stack = stack();
    let env = stack
        .env("ADD")
        .unset("CNI_NETNS")
        .set("CNI_CONTAINERID", "ctr/1")
        .set("CNI_IFNAME", "")
        .set("CNI_PATH", ":");
    let error = refused(&stack, &env, &config("1.0.0", &["a"]), 4, "CNI_CONTAINERID");
    let msg = error["msg"].as_str().unwrap();
    for named in ["CNI_NETNS", "CNI_IFNAME", "CNI_PATH"] {
        assert!(msg.contains(named), "{named} not in {msg:?}");
    }
}

#[test]
fn bad_delegate_lists_are_code_7() {
    let stack = stack();
    let ipams = [
        (r#"{"type":"ipam-delegated"}"#, "is missing"),
        (r#"{"delegates":"a"}"#, "must be an array"),
        (r#"{"delegates":{"a":1}}"#, "must be an array"),
        (r#"{"delegates":[]}"#, "is empty"),
        (r#"{"delegates":["a",2]}"#, "[1] must be a plugin name"),
        (r#"{"delegates":[["a"]]}"#, "[0] must be a plugin name"),
        (r#"{"delegates":[""]}"#, "not a plain file name"),
    ];
    for (ipam, needle) in ipams {
        let input = format!(r#"{{"cniVersion":"1.0.0","name":"n","ipam":{ipam}}}"#);
        for command in ["ADD", "DEL", "CHECK"] {
            refused(&stack, &stack.env(command), &input, 7, needle);
        }
    }
    let input = r#"{"cniVersion":"1.0.0","name":"n"}"#;
    refused(&stack, &stack.env("ADD"), input, 7, "\"ipam\" is missing");
}

#[test]
fn names_that_could_leave_cni_path_are_code_7() {
    let stack = stack();
    // "../bin/a" would reach the real delegate if it were looked up as a path.
    let bin = stack.bin().display().to_string();
    for name in ["../bin/a", &format!("{bin}/a"), "a\\b", ".", "..", "a\u{0}"] {
        let input = config("1.0.0", &[name]);
        refused(
            &stack,
            &stack.env("ADD"),
            &input,
            7,
            "not a plain file name",
        );
        refused(
            &stack,
            &stack.env("DEL"),
            &input,
            7,
            "not a plain file name",
        );
    }
}

#[test]
fn unknown_keys_are_passed_on() {
    let stack = Stack::of(&["a", "b"]);
    stack.answer(
        "a",
        "ADD",
        Answer::prints(r#"{"cniVersion":"1.0.0","ips":[]}"#),
    );
    stack.answer(
        "b",
        "ADD",
        Answer::prints(r#"{"cniVersion":"1.0.0","ips":[]}"#),
    );
    let input = r#"{"cniVersion":"1.0.0","name":"n","x-vendor":{"deep":[1,2.50,null]},"ipam":{"delegates":["a","b"],"subnet":"10.250.0.0/16","n":1e3},"runtimeConfig":{"ips":["10.250.0.9"]},"args":{"cni":{"k":"v"}}}"#;
    assert!(stack.run("ADD", input.as_bytes()).status.success());
    let second = String::from_utf8(stack.stdin_of(&stack.calls()[1])).unwrap();
    // Every value is copied as written: 2.50 stays 2.50, 1e3 stays 1e3.
    assert_eq!(
        second,
        r#"{"cniVersion":"1.0.0","name":"n","x-vendor":{"deep":[1,2.50,null]},"ipam":{"delegates":["a","b"],"subnet":"10.250.0.0/16","n":1e3},"runtimeConfig":{"ips":["10.250.0.9"]},"args":{"cni":{"k":"v"}},"prevResult":{"cniVersion":"1.0.0","ips":[]}}"#
    );
}

#[test]
fn version_needs_no_path_and_runs_nothing() {
    let stack = stack();
    let log = stack.dir.path().join("plugin.log").display().to_string();
    let env = Env(vec![
        ("CNI_COMMAND".into(), "VERSION".into()),
        ("IPAM_DELEGATED_LOG_FILE".into(), log),
    ]);
    let out = run_plugin(&env, br#"{"cniVersion":"0.4.0"}"#);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        out.json(),
        serde_json::json!({"cniVersion": "0.4.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
    );
    let out = run_plugin(&env, b"");
    assert_eq!(out.json()["cniVersion"], "1.1.0");
    assert!(stack.calls().is_empty());
}

#[test]
fn cni_path_empty_is_not_set_and_a_missing_directory_is_searched_as_any() {
    let stack = stack();
    let input = config("1.0.0", &["a"]);
    let error = refused(
        &stack,
        &stack.env("ADD").set("CNI_PATH", ""),
        &input,
        4,
        "CNI_PATH",
    );
    assert_eq!(error["msg"], "CNI_PATH is not set");
    let error = refused(
        &stack,
        &stack.env("ADD").set("CNI_PATH", "/nonexistent"),
        &input,
        100,
        "searched /nonexistent",
    );
    assert!(
        error["msg"].as_str().unwrap().starts_with("delegate \"a\""),
        "{error}"
    );
}
