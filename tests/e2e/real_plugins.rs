//! Debian's real IPAM plugins (host-local, static) as delegates: what users
//! run. Ignored unless asked for with --include-ignored (./.ci/test does),
//! since they need containernetworking-plugins installed.

use crate::common;
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use crate::common::{real_plugins, run_plugin, temp_dir, Answer, Stack};
use serde_json::{json, Value};

/// A host-local-backed config: host-local reads `ranges` and `dataDir`
/// from the same ipam object the plugin reads `delegates` from.
fn host_local_config(delegates: &[&str], data_dir: &Path) -> String {
    json!({
        "cniVersion": "1.0.0",
        "name": "realnet",
        "type": "bridge",
        "ipam": {
            "type": "ipam-delegated",
            "delegates": delegates,
            "ranges": [[{"subnet": "10.250.7.0/24"}]],
            "dataDir": data_dir,
        },
    })
    .to_string()
}

/// The addresses host-local holds reserved in its store.
fn reservations(data_dir: &Path) -> BTreeSet<String> {
    let Ok(entries) = fs::read_dir(data_dir.join("realnet")) else {
        return BTreeSet::new();
    };
    entries
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.parse::<std::net::IpAddr>().is_ok())
        .collect()
}

/// A stack holding these real plugins.
fn real_stack(names: &[&str]) -> Stack {
    let plugins = real_plugins();
    let stack = Stack::new();
    for name in names {
        stack.link(name, &plugins.join(name));
    }
    stack
}

fn address(result: &Value) -> String {
    result["ips"][0]["address"]
        .as_str()
        .expect("an address")
        .to_owned()
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn host_local_add_check_del_del() {
    let stack = real_stack(&["host-local"]);
    let data = temp_dir("hl-data");
    let input = host_local_config(&["host-local"], data.path());

    let out = stack.run("ADD", input.as_bytes());
    assert!(out.status.success(), "{out:?}");
    let result = out.json();
    assert_eq!(address(&result), "10.250.7.2/24");
    assert_eq!(result["cniVersion"], "1.0.0");
    assert_eq!(
        reservations(data.path()),
        BTreeSet::from(["10.250.7.2".to_string()])
    );

    let with_result = common::with_prev(&input, &result.to_string());
    stack.run("CHECK", &with_result).assert_silent_success();
    stack.run("DEL", &with_result).assert_silent_success();
    assert!(reservations(data.path()).is_empty());
    stack.run("DEL", &with_result).assert_silent_success();

    // CHECK after DEL: host-local finds nothing and says so; its error
    // object is kept and the log names it.
    let out = stack.run("CHECK", &with_result);
    let code = out.json()["code"].as_u64().unwrap();
    let error = out.assert_error(code);
    assert!(
        error["msg"].as_str().unwrap().contains("ctr-0123"),
        "{error}"
    );
    assert!(
        out.stderr.contains("host-local (CHECK): failed with code"),
        "{}",
        out.stderr
    );
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn a_failure_after_host_local_leaves_no_reservation() {
    let stack = real_stack(&["host-local"]);
    stack.fake("ipam-da-fails");
    stack.answer(
        "ipam-da-fails",
        "ADD",
        Answer::fails(1, r#"{"code":11,"msg":"upstream down"}"#),
    );
    let data = temp_dir("hl-data");
    let input = host_local_config(&["host-local", "ipam-da-fails"], data.path());

    let error = stack.run("ADD", input.as_bytes()).assert_error(11);
    assert_eq!(error["msg"], "upstream down");
    assert!(
        reservations(data.path()).is_empty(),
        "{:?}",
        reservations(data.path())
    );
    // The failed delegate got host-local's result, and so did the rollback DEL.
    let calls = stack.calls();
    assert_eq!(
        stack.call_list(),
        ["ipam-da-fails ADD", "ipam-da-fails DEL"]
    );
    let prev: Value = serde_json::from_slice(&stack.stdin_of(&calls[0])).unwrap();
    assert_eq!(address(&prev["prevResult"]), "10.250.7.2/24");
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn host_local_keeps_nothing_when_the_result_cannot_reach_the_runtime() {
    let stack = real_stack(&["host-local"]);
    let data = temp_dir("hl-data");
    let input = host_local_config(&["host-local"], data.path());
    let full = fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let (status, stderr) = common::run_plugin_to(&stack.env("ADD"), input.as_bytes(), full.into());
    assert!(!status.success(), "{stderr}");
    assert!(reservations(data.path()).is_empty(), "{stderr}");
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn a_fixture_selector_in_front_of_host_local() {
    let stack = real_stack(&["host-local"]);
    stack.fake("ipam-ds-pool");
    stack.answer(
        "ipam-ds-pool",
        "ADD",
        Answer::prints(
            r#"{"cniVersion":"1.0.0","ips":[],"pools":[{"name":"p","subnet":"10.250.7.0/24"}]}"#,
        ),
    );
    let data = temp_dir("hl-data");
    let input = host_local_config(&["ipam-ds-pool", "host-local"], data.path());
    let out = stack.run("ADD", input.as_bytes());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(address(&out.json()), "10.250.7.2/24");
    stack.run("DEL", input.as_bytes()).assert_silent_success();
    assert!(reservations(data.path()).is_empty());
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn thirty_two_parallel_adds_get_distinct_addresses_and_dels_free_them() {
    let stack = real_stack(&["host-local"]);
    let data = temp_dir("hl-data");
    let input = host_local_config(&["host-local"], data.path());
    let run_all = |command: &str| -> Vec<common::Outcome> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..32)
                .map(|i| {
                    let env = stack
                        .env(command)
                        .set("CNI_CONTAINERID", &format!("parallel-{i}"));
                    let input = &input;
                    scope.spawn(move || run_plugin(&env, input.as_bytes()))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };

    let added: BTreeSet<String> = run_all("ADD")
        .iter()
        .map(|out| {
            assert!(out.status.success(), "{out:?}");
            address(&out.json())
        })
        .collect();
    assert_eq!(added.len(), 32, "{added:?}");
    assert_eq!(reservations(data.path()).len(), 32);

    for out in run_all("DEL") {
        out.assert_silent_success();
    }
    assert!(reservations(data.path()).is_empty());
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn static_returns_its_configured_address() {
    let stack = real_stack(&["static"]);
    let input = json!({
        "cniVersion": "1.0.0",
        "name": "staticnet",
        "ipam": {
            "type": "ipam-delegated",
            "delegates": ["static"],
            "addresses": [{"address": "10.250.9.5/24", "gateway": "10.250.9.1"}],
        },
    })
    .to_string();
    let out = stack.run("ADD", input.as_bytes());
    assert!(out.status.success(), "{out:?}");
    let result = out.json();
    assert_eq!(address(&result), "10.250.9.5/24");
    assert_eq!(result["ips"][0]["gateway"], "10.250.9.1");
    stack.run("DEL", input.as_bytes()).assert_silent_success();
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn a_real_plugins_own_error_keeps_its_code() {
    let stack = real_stack(&["host-local"]);
    // Debian's host-local speaks up to 1.0.0: at 1.1.0 it answers code 1 itself.
    let data = temp_dir("hl-data");
    let input = host_local_config(&["host-local"], data.path()).replace("\"1.0.0\"", "\"1.1.0\"");
    let out = stack.run("ADD", input.as_bytes());
    out.assert_error(1);
    assert!(
        out.stderr.contains("host-local (ADD): failed with code 1"),
        "{}",
        out.stderr
    );
}

/// The README's example selector, fixtures/ipam-ds-namespace.
fn example_selector() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/ipam-ds-namespace")
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn the_guides_example_selector_runs_in_front_of_host_local() {
    let stack = real_stack(&["host-local"]);
    stack.link("ipam-ds-namespace", &example_selector());
    stack.fake("ipam-da-recorder");
    stack.answer(
        "ipam-da-recorder",
        "ADD",
        Answer::prints(r#"{"cniVersion":"1.0.0","ips":[]}"#),
    );
    let data = temp_dir("hl-data");

    // The allocator after it sees the selection as prevResult.
    let input = host_local_config(&["ipam-ds-namespace", "ipam-da-recorder"], data.path());
    let env = stack
        .env("ADD")
        .set("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=blue");
    assert!(common::run_plugin(&env, input.as_bytes()).status.success());
    let seen: Value = serde_json::from_slice(&stack.stdin_of(&stack.calls()[0])).unwrap();
    assert_eq!(seen["prevResult"]["pools"], json!([{"name": "blue"}]));

    // In front of host-local: host-local's address is the answer, and DEL
    // and CHECK pass through the selector silently.
    let input = host_local_config(&["ipam-ds-namespace", "host-local"], data.path());
    let out = common::run_plugin(&env, input.as_bytes());
    assert!(out.status.success(), "{out:?}");
    let result = out.json();
    assert_eq!(address(&result), "10.250.7.2/24");
    let with_result = common::with_prev(&input, &result.to_string());
    stack.run("CHECK", &with_result).assert_silent_success();
    stack.run("DEL", &with_result).assert_silent_success();
    assert!(reservations(data.path()).is_empty());

    // A bad namespace (here one that would break the JSON if echoed): the
    // selector's own error object, nothing allocated.
    let bad = stack
        .env("ADD")
        .set("CNI_ARGS", r#"K8S_POD_NAMESPACE=x","code":0,"msg":"ok"#);
    let error = common::run_plugin(&bad, input.as_bytes()).assert_error(7);
    assert_eq!(error["msg"], "the pod's namespace is not a Kubernetes name");
    assert!(reservations(data.path()).is_empty());
}
