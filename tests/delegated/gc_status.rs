//! CNI 1.1's GC and STATUS through the built binary, and the version each
//! command needs. Debian's libcni (1.1.2) predates GC, so these drive the
//! plugin through its environment as a 1.1 runtime would.

use crate::common;
use crate::common::{config, run_plugin, with_state_dir, Answer, Stack};
use serde_json::json;

/// A 1.1.0 GC input as libcni builds it: the runtime's attachments included.
fn gc_input(delegates: &[&str]) -> String {
    json!({
        "cniVersion": "1.1.0",
        "name": "testnet",
        "type": "bridge",
        "ipam": {"type": "ipam-delegated", "delegates": delegates},
        "cni.dev/valid-attachments": [
            {"containerID": "ctr-a", "ifname": "eth0"},
            {"containerID": "ctr-b", "ifname": "net1"}
        ]
    })
    .to_string()
}

/// GC and STATUS concern no one attachment: runtimes set only these.
fn env_for(stack: &Stack, command: &str) -> common::Env {
    stack
        .env(command)
        .unset("CNI_CONTAINERID")
        .unset("CNI_NETNS")
        .unset("CNI_IFNAME")
}

#[test]
fn gc_reaches_every_delegate_in_order_with_the_input_byte_for_byte() {
    let names = ["a", "b", "c"];
    let stack = Stack::of(&names);
    // A delegate printing something on GC does not change what the next reads.
    stack.answer("a", "GC", Answer::prints(r#"{"cniVersion":"1.1.0"}"#));
    let input = with_state_dir(&stack, &gc_input(&names));
    run_plugin(&env_for(&stack, "GC"), input.as_bytes()).assert_silent_success();
    assert_eq!(stack.call_list(), ["a GC", "b GC", "c GC"]);
    for call in stack.calls() {
        assert_eq!(stack.stdin_of(&call), input.as_bytes(), "{call:?}");
    }
}

#[test]
fn gc_is_best_effort_and_reports_every_failure() {
    let names = ["a", "b", "c", "d"];
    let stack = Stack::of(&names);
    stack.answer(
        "b",
        "GC",
        Answer::fails(1, r#"{"code":11,"msg":"store locked"}"#),
    );
    stack.answer("c", "GC", Answer::fails(2, "crashed"));
    let out = run_plugin(
        &env_for(&stack, "GC"),
        with_state_dir(&stack, &gc_input(&names)).as_bytes(),
    );
    let error = out.assert_error(11);
    assert_eq!(stack.call_list(), ["a GC", "b GC", "c GC", "d GC"]);
    assert_eq!(error["msg"], "store locked (and 1 more failure)");
    assert_eq!(error["cniVersion"], "1.1.0");
    let details = error["details"].as_str().unwrap();
    assert!(
        details.contains("- b (GC): failed with code 11: store locked"),
        "{details}"
    );
    assert!(
        details.contains("- c (GC): exited with status 2"),
        "{details}"
    );
}

#[test]
fn gc_runs_the_delegates_that_exist_when_one_is_missing() {
    let stack = Stack::of(&["a", "c"]);
    let out = run_plugin(
        &env_for(&stack, "GC"),
        with_state_dir(&stack, &gc_input(&["a", "b", "c"])).as_bytes(),
    );
    let error = out.assert_error(100);
    assert!(error["msg"].as_str().unwrap().contains("\"b\""));
    assert_eq!(stack.call_list(), ["a GC", "c GC"]);
}

#[test]
fn status_with_every_delegate_ready_prints_nothing() {
    let names = ["a", "b", "c"];
    let stack = Stack::of(&names);
    let input = config("1.1.0", &names);
    run_plugin(&env_for(&stack, "STATUS"), input.as_bytes()).assert_silent_success();
    assert_eq!(stack.call_list(), ["a STATUS", "b STATUS", "c STATUS"]);
    for call in stack.calls() {
        assert_eq!(stack.stdin_of(&call), input.as_bytes());
    }
}

#[test]
fn status_answers_with_the_first_delegate_not_ready() {
    let names = ["a", "b", "c"];
    for code in [50, 51] {
        let stack = Stack::of(&names);
        let not_ready = json!({"cniVersion": "1.1.0", "code": code, "msg": "pool service unreachable", "details": "10.0.0.1:443"});
        stack.answer("b", "STATUS", Answer::fails(1, not_ready.to_string()));
        let out = run_plugin(
            &env_for(&stack, "STATUS"),
            config("1.1.0", &names).as_bytes(),
        );
        let error = out.assert_error(code);
        assert_eq!(error["msg"], "pool service unreachable");
        assert_eq!(error["details"], "10.0.0.1:443");
        assert_eq!(stack.call_list(), ["a STATUS", "b STATUS"]);
    }
}

#[test]
fn status_with_a_missing_delegate_runs_nothing() {
    let stack = Stack::of(&["a", "c"]);
    let out = run_plugin(
        &env_for(&stack, "STATUS"),
        config("1.1.0", &["a", "b", "c"]).as_bytes(),
    );
    out.assert_error(100);
    assert!(stack.calls().is_empty());
}

#[test]
fn gc_and_status_need_1_1_0_and_run_nothing_before() {
    for command in ["GC", "STATUS"] {
        for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0"] {
            let stack = Stack::of(&["a"]);
            let out = run_plugin(
                &env_for(&stack, command),
                config(version, &["a"]).as_bytes(),
            );
            let error = out.assert_error(1);
            let msg = error["msg"].as_str().unwrap();
            assert_eq!(
                msg,
                format!(
                    "{command} needs cniVersion 1.1.0 or later, the configuration has {version}"
                )
            );
            assert_eq!(error["cniVersion"], version);
            assert!(stack.calls().is_empty(), "{command} {version}");
        }
    }
}

#[test]
fn gc_and_status_still_need_cni_path() {
    for command in ["GC", "STATUS"] {
        let stack = Stack::of(&["a"]);
        let env = env_for(&stack, command).unset("CNI_PATH");
        let error = run_plugin(&env, config("1.1.0", &["a"]).as_bytes()).assert_error(4);
        assert_eq!(error["msg"], "CNI_PATH is not set");
        assert!(stack.calls().is_empty());
    }
}

#[test]
fn check_needs_0_4_0_and_every_command_runs_at_1_1_0() {
    for version in ["0.3.0", "0.3.1"] {
        let stack = Stack::of(&["a"]);
        stack
            .run("CHECK", config(version, &["a"]).as_bytes())
            .assert_error(1);
        assert!(stack.calls().is_empty());
    }
    let stack = Stack::of(&["a"]);
    stack.answer(
        "a",
        "ADD",
        Answer::prints(r#"{"cniVersion":"1.1.0","ips":[]}"#),
    );
    let input = with_state_dir(&stack, &config("1.1.0", &["a"]));
    assert!(stack.run("ADD", input.as_bytes()).status.success());
    for command in ["CHECK", "DEL", "GC", "STATUS"] {
        stack.run(command, input.as_bytes()).assert_silent_success();
    }
    assert_eq!(
        stack.call_list(),
        ["a ADD", "a CHECK", "a DEL", "a GC", "a STATUS"]
    );
}
