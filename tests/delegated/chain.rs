//! The stack run through the built binary with scripted delegates: the
//! example flow of the original ipam-delegated README, every way a delegate
//! can fail, rollback, and the threading of results through ADD, DEL and
//! CHECK.

use crate::common;
use crate::common::{config, with_prev, Answer, Stack};
use serde_json::json;

/// The `ipam` value of step 2 of the original ipam-delegated README's
/// example flow, as written there.
macro_rules! readme_ipam {
    () => {
        r#"{
    "type": "ipam-delegated",
    "delegates": [
      "ipam-ds-hello",
      "ipam-da-world"
    ],
    "hello": "local-pool",
    "world": 23
  }"#
    };
}

/// Step 2 of the original ipam-delegated README's example flow: what
/// bridge hands the plugin.
const README_INPUT: &str = concat!(
    "{\n  \"cniVersion\": \"1.0.0\",\n  \"name\": \"example\",\n  \"type\": \"bridge\",\n  \"ipam\": ",
    readme_ipam!(),
    "\n}\n"
);

/// What ipam-ds-hello prints: step 5's prevResult (the README's step 4 shows
/// the same pool without its gateway; the plugin passes on whatever the
/// delegate printed, so the test uses the one step 5 expects).
const README_HELLO: &str = r#"{"cniVersion":"1.0.0","ips":[],"routes":[],"dns":{},"pools":[{"name":"local-pool","subnet":"192.168.0.0/24","gateway":"192.168.0.1"}]}"#;

/// Step 5: what ipam-da-world must read. Every member is copied as
/// written (the ipam object keeps its layout), prevResult is appended as
/// ipam-ds-hello printed it.
const README_WORLD_STDIN: &str = concat!(
    r#"{"cniVersion":"1.0.0","name":"example","type":"bridge","ipam":"#,
    readme_ipam!(),
    r#","prevResult":{"cniVersion":"1.0.0","ips":[],"routes":[],"dns":{},"pools":[{"name":"local-pool","subnet":"192.168.0.0/24","gateway":"192.168.0.1"}]}}"#
);

/// Step 6, as a delegate might print it: pretty, with a trailing newline.
const README_WORLD_RESULT: &str = r#"{
  "cniVersion": "1.0.0",
  "ips": [
    { "address": "192.168.0.23/24", "gateway": "192.168.0.1" }
  ],
  "routes": [
    { "dst": "0.0.0.0/0", "gw": "192.168.0.1" }
  ],
  "dns": {}
}
"#;

fn readme_stack() -> Stack {
    let stack = Stack::of(&["ipam-ds-hello", "ipam-da-world"]);
    stack.answer("ipam-ds-hello", "ADD", Answer::prints(README_HELLO));
    stack.answer("ipam-da-world", "ADD", Answer::prints(README_WORLD_RESULT));
    stack
}

#[test]
fn the_original_readmes_example_flow_byte_for_byte() {
    let stack = readme_stack();
    let out = stack.run("ADD", README_INPUT.as_bytes());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stack.call_list(),
        ["ipam-ds-hello ADD", "ipam-da-world ADD"]
    );
    let calls = stack.calls();
    // Step 3: the exact same input.
    assert_eq!(stack.stdin_of(&calls[0]), README_INPUT.as_bytes());
    // Step 5: the input with prevResult set, nothing else changed.
    let world_stdin = String::from_utf8(stack.stdin_of(&calls[1])).unwrap();
    assert_eq!(world_stdin, README_WORLD_STDIN);
    let step_5: serde_json::Value = serde_json::from_str(&world_stdin).unwrap();
    assert_eq!(step_5["prevResult"]["pools"][0]["gateway"], "192.168.0.1");
    assert_eq!(step_5["ipam"]["world"], 23);
    // Step 7: the last result, exactly as printed (less surrounding whitespace).
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        README_WORLD_RESULT.trim()
    );
}

#[test]
fn readme_step_4_failure_rolls_back_hello_with_the_same_config() {
    let stack = readme_stack();
    stack.answer(
        "ipam-ds-hello",
        "ADD",
        Answer::fails(1, r#"{"code":11,"msg":"pool service busy"}"#),
    );
    let out = stack.run("ADD", README_INPUT.as_bytes());
    out.assert_error(11);
    assert_eq!(
        stack.call_list(),
        ["ipam-ds-hello ADD", "ipam-ds-hello DEL"]
    );
    assert_eq!(stack.stdin_of(&stack.calls()[1]), README_INPUT.as_bytes());
}

#[test]
fn readme_step_6_failure_rolls_back_both_threading_the_del_result() {
    let stack = readme_stack();
    stack.answer(
        "ipam-da-world",
        "ADD",
        Answer::fails(1, r#"{"code":7,"msg":"world must be a string"}"#),
    );
    let hello_del = r#"{"cniVersion":"1.0.0","released":"local-pool"}"#;
    stack.answer("ipam-ds-hello", "DEL", Answer::prints(hello_del));
    let out = stack.run("ADD", README_INPUT.as_bytes());
    let error = out.assert_error(7);
    assert_eq!(error["cniVersion"], "1.0.0");
    assert_eq!(
        stack.call_list(),
        [
            "ipam-ds-hello ADD",
            "ipam-da-world ADD",
            "ipam-ds-hello DEL",
            "ipam-da-world DEL"
        ]
    );
    let calls = stack.calls();
    // 1/ hello gets the prevResult it gave world …
    assert_eq!(
        String::from_utf8(stack.stdin_of(&calls[2])).unwrap(),
        README_WORLD_STDIN
    );
    // 2/ … and world gets the prevResult that DEL returned.
    let expected = README_WORLD_STDIN.replace(README_HELLO, hello_del);
    assert_eq!(
        String::from_utf8(stack.stdin_of(&calls[3])).unwrap(),
        expected
    );
}

/// Each way a delegate can fail on ADD, with the code the plugin must answer.
fn failure_modes() -> Vec<(&'static str, Answer, u64)> {
    vec![
        (
            "error object",
            Answer::fails(
                1,
                r#"{"cniVersion":"1.0.0","code":11,"msg":"try later","details":"lease store down"}"#,
            ),
            11,
        ),
        ("exit without error object", Answer::fails(3, "boom"), 102),
        ("silent non-zero exit", Answer::fails(2, ""), 102),
        ("killed by a signal", Answer::killed("KILL"), 103),
        ("non-JSON stdout", Answer::prints("this is not json"), 6),
        ("non-object stdout", Answer::prints("[1, 2]"), 6),
        ("empty stdout", Answer::default(), 6),
    ]
}

/// Results the delegates of the rollback matrix print on ADD.
fn result_of(name: &str) -> String {
    json!({"cniVersion": "1.0.0", "ips": [], "by": name}).to_string()
}

#[test]
fn rollback_for_each_failure_at_first_middle_and_last() {
    let names = ["a", "b", "c"];
    let input = config("1.0.0", &names);
    for (mode, answer, code) in failure_modes() {
        for k in 0..names.len() {
            let stack = Stack::of(&names);
            for name in &names[..k] {
                stack.answer(name, "ADD", Answer::prints(result_of(name)));
            }
            stack.answer(names[k], "ADD", answer.clone());
            let out = stack.run("ADD", input.as_bytes());
            let error = out.assert_error(code);
            // An error object's msg is kept as printed; any other failure
            // names the delegate. Either way stderr says which one it was.
            let msg = error["msg"].as_str().unwrap();
            let named = format!("{} (ADD): ", names[k]);
            if code == 11 {
                assert_eq!(msg, "try later", "{mode} at {k}");
            } else {
                assert!(msg.starts_with(&named), "{mode} at {k}: {msg}");
            }
            assert!(out.stderr.contains(&named), "{mode} at {k}: {}", out.stderr);

            let mut expected: Vec<String> =
                names[..=k].iter().map(|n| format!("{n} ADD")).collect();
            expected.extend(names[..=k].iter().map(|n| format!("{n} DEL")));
            assert_eq!(stack.call_list(), expected, "{mode} at {k}");

            // The first rollback DEL reads what the failed delegate read.
            let calls = stack.calls();
            let failed_stdin = stack.stdin_of(&calls[k]);
            assert_eq!(stack.stdin_of(&calls[k + 1]), failed_stdin, "{mode} at {k}");
            let expected_stdin = match k {
                0 => input.as_bytes().to_vec(),
                _ => with_prev(&input, &result_of(names[k - 1])),
            };
            assert_eq!(failed_stdin, expected_stdin, "{mode} at {k}");
        }
    }
}

#[test]
fn a_reported_error_keeps_code_message_and_details() {
    let stack = Stack::of(&["a"]);
    stack.answer(
        "a",
        "ADD",
        Answer::fails(
            1,
            r#"{"cniVersion":"1.0.0","code":11,"msg":"try later","details":"lease store down"}"#,
        ),
    );
    let out = stack.run("ADD", config("1.0.0", &["a"]).as_bytes());
    let error = out.assert_error(11);
    assert_eq!(error["msg"], "try later");
    assert_eq!(error["details"], "lease store down");
    // The runtime's log learns which delegate said so.
    assert!(
        out.stderr
            .contains("a (ADD): failed with code 11: try later"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_delegate_that_cannot_start_is_named_and_rolled_back_at_first_middle_and_last() {
    let names = ["a", "b", "c"];
    let input = config("1.0.0", &names);
    for k in 0..names.len() {
        let stack = Stack::new();
        for (i, name) in names.iter().enumerate() {
            if i == k {
                stack.file(name, "#!/nonexistent/interpreter\n", 0o755);
            } else {
                stack.fake(name);
                stack.answer(name, "ADD", Answer::prints(result_of(name)));
            }
        }
        let error = stack.run("ADD", input.as_bytes()).assert_error(101);
        let msg = error["msg"].as_str().unwrap();
        assert!(
            msg.starts_with(&format!("{} (ADD): could not be started", names[k])),
            "{msg}"
        );
        // Its own rollback DEL cannot start either: listed, code unchanged.
        let details = error["details"].as_str().unwrap();
        let listed = format!(
            "rollback DEL also failed:\n- {} (DEL): could not be started",
            names[k]
        );
        assert!(details.contains(&listed), "{details}");

        // The scripted delegates before it were added, then deleted in order,
        // the first DEL reading what the one that failed to start was given.
        let mut expected: Vec<String> = names[..k].iter().map(|n| format!("{n} ADD")).collect();
        expected.extend(names[..k].iter().map(|n| format!("{n} DEL")));
        assert_eq!(stack.call_list(), expected, "at {k}");
        if k > 0 {
            let first_del = &stack.calls()[k];
            assert_eq!(
                stack.stdin_of(first_del),
                with_prev(&input, &result_of(names[k - 1]))
            );
        }
    }
}

#[test]
fn rollback_threads_del_results_and_survives_rollback_failures() {
    let names = ["a", "b", "c", "d"];
    let input = config("0.4.0", &names);
    let stack = Stack::of(&names);
    for name in ["a", "b", "c"] {
        stack.answer(name, "ADD", Answer::prints(result_of(name)));
    }
    stack.answer(
        "d",
        "ADD",
        Answer::fails(1, r#"{"code":11,"msg":"no lease"}"#),
    );
    let a_del = r#"{"cniVersion":"0.4.0","freed":"a"}"#;
    stack.answer("a", "DEL", Answer::prints(a_del));
    stack.answer(
        "b",
        "DEL",
        Answer::fails(1, r#"{"code":3,"msg":"b lost its store"}"#),
    );
    stack.answer("c", "DEL", Answer::killed("TERM"));
    let error = stack.run("ADD", input.as_bytes()).assert_error(11);
    assert_eq!(
        stack.call_list(),
        ["a ADD", "b ADD", "c ADD", "d ADD", "a DEL", "b DEL", "c DEL", "d DEL"]
    );
    let calls = stack.calls();
    assert_eq!(
        stack.stdin_of(&calls[4]),
        with_prev(&input, &result_of("c"))
    );
    assert_eq!(stack.stdin_of(&calls[5]), with_prev(&input, a_del));
    // b failed and c was killed: neither printed a result, so d reads a's.
    assert_eq!(stack.stdin_of(&calls[6]), with_prev(&input, a_del));
    assert_eq!(stack.stdin_of(&calls[7]), with_prev(&input, a_del));
    let details = error["details"].as_str().unwrap();
    assert!(
        details.contains("- b (DEL): failed with code 3: b lost its store"),
        "{details}"
    );
    assert!(
        details.contains("- c (DEL): was killed by signal 15"),
        "{details}"
    );
    assert_eq!(error["msg"], "no lease");
}

#[test]
fn the_environment_is_passed_on_with_only_the_command_changed_in_rollback() {
    let stack = Stack::of(&["a", "b"]);
    stack.answer("a", "ADD", Answer::prints(result_of("a")));
    stack.answer("b", "ADD", Answer::fails(1, ""));
    let env = stack.env("ADD").set("SOME_OPERATOR_SETTING", "kept as is");
    common::run_plugin(&env, config("1.0.0", &["a", "b"]).as_bytes()).assert_error(102);
    for call in stack.calls() {
        let seen = stack.env_of(&call);
        for (key, value) in &env.0 {
            let want = if key == "CNI_COMMAND" {
                &call.command
            } else {
                value
            };
            assert_eq!(seen.get(key), Some(want), "{key} for {call:?}");
        }
    }
}

#[test]
fn delegate_stderr_reaches_the_plugin_stderr() {
    let stack = Stack::of(&["a"]);
    stack.answer(
        "a",
        "ADD",
        Answer {
            stdout: Some(result_of("a").into_bytes()),
            stderr: Some("a says hello on stderr\n".into()),
            ..Answer::default()
        },
    );
    let out = stack.run("ADD", config("1.0.0", &["a"]).as_bytes());
    assert!(out.status.success());
    assert!(
        out.stderr.contains("a says hello on stderr"),
        "{}",
        out.stderr
    );
    assert_eq!(out.json()["by"], "a");
}

#[test]
fn a_delegate_flooding_stdout_is_stopped_and_rolled_back() {
    let stack = Stack::of(&["a", "b"]);
    stack.answer("a", "ADD", Answer::prints(result_of("a")));
    stack.answer("b", "ADD", Answer::prints(vec![b' '; 5 << 20]));
    let error = stack
        .run("ADD", config("1.0.0", &["a", "b"]).as_bytes())
        .assert_error(104);
    let msg = error["msg"].as_str().unwrap();
    // The README's 4 MiB.
    let cap = 4 << 20;
    assert!(
        msg.starts_with(&format!("b (ADD): printed more than {cap} bytes")),
        "{msg}"
    );
    assert_eq!(stack.call_list(), ["a ADD", "b ADD", "a DEL", "b DEL"]);
}

#[test]
fn a_delegate_may_ignore_a_large_stdin_or_print_before_reading_it() {
    // Both would deadlock a plugin that wrote all of stdin before reading
    // stdout: the config is far larger than a pipe's buffer.
    let stack = Stack::new();
    stack.file("ignores-stdin", "#!/bin/sh\necho '{\"ips\":[]}'\n", 0o755);
    let talks_first = "#!/bin/sh\nhead -c 300000 /dev/zero | tr '\\0' ' '\necho '{\"by\":\"talks-first\"}'\ncat >/dev/null\n";
    stack.file("talks-first", talks_first, 0o755);
    let input = json!({
        "cniVersion": "1.0.0",
        "name": "n",
        "ipam": {"delegates": ["ignores-stdin", "talks-first"], "blob": "x".repeat(1 << 20)},
    })
    .to_string();
    let out = stack.run("ADD", input.as_bytes());
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.json(), json!({"by": "talks-first"}));
}

#[test]
fn a_chain_of_twenty_threads_every_result() {
    let names: Vec<String> = (1..=20).map(|i| format!("ipam-d{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let input = config("1.1.0", &names);
    let stack = Stack::of(&names);
    for name in &names {
        stack.answer(name, "ADD", Answer::prints(result_of(name)));
    }
    let out = stack.run("ADD", input.as_bytes());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.json()["by"], "ipam-d20");
    let calls = stack.calls();
    assert_eq!(calls.len(), 20);
    assert_eq!(stack.stdin_of(&calls[0]), input.as_bytes());
    for k in 1..20 {
        assert_eq!(calls[k].name, names[k]);
        assert_eq!(
            stack.stdin_of(&calls[k]),
            with_prev(&input, &result_of(names[k - 1])),
            "delegate {k}"
        );
    }

    let out = stack.run("DEL", input.as_bytes());
    out.assert_silent_success();
    assert_eq!(stack.calls().len(), 40);
}

#[test]
fn del_with_silent_delegates_gives_each_the_input_as_it_came() {
    let names = ["a", "b", "c"];
    let stack = Stack::of(&names);
    let input = with_prev(&config("1.0.0", &names), &result_of("c"));
    for _ in 0..2 {
        stack.run("DEL", &input).assert_silent_success();
    }
    assert_eq!(
        stack.call_list(),
        ["a DEL", "b DEL", "c DEL", "a DEL", "b DEL", "c DEL"]
    );
    for call in stack.calls() {
        assert_eq!(stack.stdin_of(&call), input);
    }
}

#[test]
fn del_threads_printed_results() {
    let names = ["a", "b", "c"];
    let input = config("1.0.0", &names);
    let stack = Stack::of(&names);
    let a_del = r#"{"after":"a"}"#;
    stack.answer("a", "DEL", Answer::prints(a_del));
    stack.run("DEL", input.as_bytes()).assert_silent_success();
    let calls = stack.calls();
    assert_eq!(stack.stdin_of(&calls[0]), input.as_bytes());
    assert_eq!(stack.stdin_of(&calls[1]), with_prev(&input, a_del));
    assert_eq!(stack.stdin_of(&calls[2]), with_prev(&input, a_del));
}

#[test]
fn del_is_best_effort_and_reports_the_first_failure() {
    let names = ["a", "b", "c"];
    let stack = Stack::of(&names);
    stack.answer(
        "a",
        "DEL",
        Answer::fails(1, r#"{"code":11,"msg":"store busy"}"#),
    );
    stack.answer("c", "DEL", Answer::killed("KILL"));
    let error = stack
        .run("DEL", config("1.0.0", &names).as_bytes())
        .assert_error(11);
    assert_eq!(stack.call_list(), ["a DEL", "b DEL", "c DEL"]);
    assert_eq!(error["msg"], "store busy (and 1 more failure)");
    let details = error["details"].as_str().unwrap();
    assert!(
        details.contains("- a (DEL): failed with code 11: store busy"),
        "{details}"
    );
    assert!(
        details.contains("- c (DEL): was killed by signal 9"),
        "{details}"
    );
}

#[test]
fn del_runs_the_delegates_that_exist_when_one_is_missing() {
    let stack = Stack::of(&["a", "c"]);
    let error = stack
        .run("DEL", config("1.0.0", &["a", "b", "c"]).as_bytes())
        .assert_error(100);
    assert_eq!(stack.call_list(), ["a DEL", "c DEL"]);
    assert!(error["msg"].as_str().unwrap().contains("\"b\""));
}

#[test]
fn del_accepts_an_empty_or_missing_netns() {
    let stack = Stack::of(&["a"]);
    let input = config("1.0.0", &["a"]);
    common::run_plugin(&stack.env("DEL").set("CNI_NETNS", ""), input.as_bytes())
        .assert_silent_success();
    common::run_plugin(&stack.env("DEL").unset("CNI_NETNS"), input.as_bytes())
        .assert_silent_success();
    assert_eq!(stack.call_list(), ["a DEL", "a DEL"]);
}

#[test]
fn check_runs_all_silently_or_stops_at_the_first_failure() {
    let names = ["a", "b", "c"];
    let input = with_prev(&config("0.4.0", &names), &result_of("c"));
    let stack = Stack::of(&names);
    stack.run("CHECK", &input).assert_silent_success();
    assert_eq!(stack.call_list(), ["a CHECK", "b CHECK", "c CHECK"]);
    for call in stack.calls() {
        assert_eq!(stack.stdin_of(&call), input);
    }

    let stack = Stack::of(&names);
    stack.answer(
        "b",
        "CHECK",
        Answer::fails(1, r#"{"code":3,"msg":"no such container"}"#),
    );
    let error = stack.run("CHECK", &input).assert_error(3);
    assert_eq!(error["msg"], "no such container");
    assert_eq!(stack.call_list(), ["a CHECK", "b CHECK"]);
}

#[test]
fn check_threads_printed_results() {
    let names = ["a", "b"];
    let input = config("1.0.0", &names);
    let stack = Stack::of(&names);
    stack.answer("a", "CHECK", Answer::prints(r#"{"checked":"a"}"#));
    stack.run("CHECK", input.as_bytes()).assert_silent_success();
    assert_eq!(
        stack.stdin_of(&stack.calls()[1]),
        with_prev(&input, r#"{"checked":"a"}"#)
    );
}

#[test]
fn add_and_check_run_nothing_when_a_delegate_is_missing() {
    for command in ["ADD", "CHECK"] {
        let stack = Stack::of(&["a", "c"]);
        let error = stack
            .run(command, config("1.0.0", &["a", "b", "c"]).as_bytes())
            .assert_error(100);
        let msg = error["msg"].as_str().unwrap();
        assert!(
            msg.contains("\"b\"") && msg.contains(&stack.bin().display().to_string()),
            "{msg}"
        );
        assert!(stack.calls().is_empty(), "{command}");
    }
}

#[test]
fn relative_path_entries_resolve_in_the_working_directory_without_tilde_expansion() {
    let stack = Stack::new();
    let dir = stack.dir.path();
    std::fs::create_dir_all(dir.join("home/bin")).unwrap();
    std::fs::create_dir_all(dir.join("~/bin")).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/fake-delegate");
    std::os::unix::fs::symlink(script, dir.join("~/bin/a")).unwrap();
    std::os::unix::fs::symlink("/bin/false", dir.join("home/bin/a")).unwrap();
    stack.answer("a", "ADD", Answer::prints(result_of("a")));
    let env = stack
        .env("ADD")
        .set("CNI_PATH", "~/bin")
        .set("HOME", &dir.join("home").display().to_string());
    let out = common::run_plugin_in(dir, &env, config("1.0.0", &["a"]).as_bytes());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stack.call_list(), ["a ADD"]);
}

#[test]
fn a_non_executable_file_of_the_name_is_not_a_delegate() {
    let stack = Stack::new();
    stack.file("a", "#!/bin/sh\nexit 0\n", 0o644);
    stack
        .run("ADD", config("1.0.0", &["a"]).as_bytes())
        .assert_error(100);
}

#[test]
fn every_supported_version_runs_add() {
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let stack = Stack::of(&["a"]);
        stack.answer("a", "ADD", Answer::prints(result_of("a")));
        let out = stack.run("ADD", config(version, &["a"]).as_bytes());
        assert!(out.status.success(), "{version}: {out:?}");
    }
}

#[test]
fn stdout_that_is_not_an_object_is_ignored_on_success_except_on_add() {
    // libcni ignores stdout on success for every command but ADD: a
    // delegate that logs there works under bridge and must work here.
    for (command, version) in [
        ("DEL", "1.1.0"),
        ("CHECK", "1.1.0"),
        ("GC", "1.1.0"),
        ("STATUS", "1.1.0"),
    ] {
        let names = ["chatty", "b"];
        let stack = Stack::of(&names);
        let input = common::with_state_dir(&stack, &config(version, &names));
        stack.answer("chatty", command, Answer::prints("released 10.1.2.3\n"));
        let out = stack.run(command, input.as_bytes());
        out.assert_silent_success();
        assert_eq!(
            stack.call_list(),
            [format!("chatty {command}"), format!("b {command}")]
        );
        // "Printed nothing": the next delegate's input is unchanged.
        let calls = stack.calls();
        assert_eq!(
            stack.stdin_of(&calls[1]),
            stack.stdin_of(&calls[0]),
            "{command}"
        );
        assert!(
            out.stderr.contains("chatty") && out.stderr.contains("released 10.1.2.3"),
            "{command}: the stdout ignored is logged as a warning: {}",
            out.stderr
        );
    }

    // ADD keeps the strict rule: it must print its result.
    let stack = Stack::of(&["chatty"]);
    stack.answer("chatty", "ADD", Answer::prints("allocated 10.1.2.3\n"));
    stack
        .run("ADD", config("1.1.0", &["chatty"]).as_bytes())
        .assert_error(6);
    assert_eq!(stack.call_list(), ["chatty ADD", "chatty DEL"]);
}

#[test]
fn the_reply_is_converted_to_the_configurations_version() {
    let stack = Stack::of(&["a", "b"]);
    stack.answer("a", "ADD", Answer::prints(result_of("a")));
    let printed = r#"{"cniVersion":"1.1.0","ips":[{"address":"10.1.0.5/16","gateway":"10.1.0.1"}],"pools":[{"name":"p","n":2.50}]}"#;
    stack.answer("b", "ADD", Answer::prints(printed));
    let out = stack.run("ADD", config("0.4.0", &["a", "b"]).as_bytes());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        r#"{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.0.5/16","gateway":"10.1.0.1"}],"pools":[{"name":"p","n":2.50}]}"#
    );
    // Only the reply: b got a's result as a printed it.
    let calls = stack.calls();
    assert_eq!(
        stack.stdin_of(&calls[1]),
        with_prev(&config("0.4.0", &["a", "b"]), &result_of("a"))
    );
}

#[test]
fn a_reply_in_a_version_that_cannot_be_converted_is_rolled_back() {
    let stack = Stack::of(&["a", "b"]);
    stack.answer("a", "ADD", Answer::prints(result_of("a")));
    stack.answer(
        "b",
        "ADD",
        Answer::prints(r#"{"cniVersion":"0.2.0","ip4":{"ip":"10.1.0.5/16"}}"#),
    );
    let error = stack
        .run("ADD", config("1.0.0", &["a", "b"]).as_bytes())
        .assert_error(1);
    assert_eq!(
        error["msg"],
        "b (ADD): answered in cniVersion 0.2.0, which cannot be converted to the configuration's 1.0.0"
    );
    assert_eq!(stack.call_list(), ["a ADD", "b ADD", "a DEL", "b DEL"]);
}

#[test]
fn a_rollback_refused_for_the_adds_reason_is_not_repeated() {
    // The allocator refuses its settings on ADD and on the rollback's DEL
    // alike: the error says it once.
    let stack = Stack::new().with_pool_plugins();
    let input = common::pool_config(
        "n",
        "1.0.0",
        json!({"default": [{"name": "blue"}]}),
        json!({"dataDir": "relative", "node": "a", "pools": {"blue": [{"subnet": "10.9.0.0/24"}]}}),
    );
    let error = stack.run("ADD", input.as_bytes()).assert_error(7);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .contains("\"ipam.pool.dataDir\""),
        "{error}"
    );
    assert_eq!(error["details"], "", "{error}");
}
