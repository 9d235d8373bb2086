//! The operator's doctor and the command line's own options, through the
//! built binary.

use crate::common;
use std::fs;
use std::path::Path;

use crate::common::{run_cli, Answer, Env, Stack, PLUGIN};
use serde_json::json;

/// A stack of scripted delegates that answer VERSION like real plugins,
/// and a configuration file over them.
fn stack_with_config(delegates: &[&str], extra_ipam: serde_json::Value) -> (Stack, String) {
    let stack = Stack::new();
    for name in delegates {
        stack.fake(name);
        stack.answer(
            name,
            "VERSION",
            Answer::prints(r#"{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}"#),
        );
    }
    let mut ipam = json!({"type": "ipam-delegated", "delegates": delegates});
    if let Some(extra) = extra_ipam.as_object() {
        for (k, v) in extra {
            ipam[k] = v.clone();
        }
    }
    let list = json!({"cniVersion": "1.0.0", "name": "pods", "plugins": [{"type": "bridge", "ipam": ipam}]});
    let file = stack.dir.path().join("pods.conflist");
    fs::write(&file, list.to_string()).unwrap();
    (stack, file.display().to_string())
}

fn env(stack: &Stack) -> Env {
    Env(stack
        .env("ADD")
        .0
        .into_iter()
        .filter(|(k, _)| !k.starts_with("CNI_") || k == "CNI_PATH")
        .collect())
}

fn doctor(stack: &Stack, file: &str) -> (bool, String) {
    let out = run_cli(&["doctor", "--config", file], &env(stack));
    (out.status.success(), String::from_utf8(out.stdout).unwrap())
}

#[test]
fn a_good_stack_is_all_good_and_nothing_is_allocated() {
    let (stack, file) =
        stack_with_config(&["ipam-ds-pool", "ipam-da-alloc"], json!({"timeout": 5}));
    let (ok, report) = doctor(&stack, &file);
    assert!(ok, "{report}");
    assert!(report.ends_with("all good\n"), "{report}");
    for name in ["ipam-ds-pool", "ipam-da-alloc"] {
        let row = report.lines().find(|l| l.starts_with(name)).unwrap();
        assert!(
            row.contains(&stack.bin().join(name).display().to_string()),
            "{row}"
        );
        assert!(row.contains("0.4.0,1.0.0") && row.ends_with("ok"), "{row}");
    }
    assert!(
        report.contains("ipam.timeout: 5s per delegate call"),
        "{report}"
    );
    // Only VERSION: nothing was allocated.
    assert_eq!(
        stack.call_list(),
        ["ipam-ds-pool VERSION", "ipam-da-alloc VERSION"]
    );
}

#[test]
fn every_problem_is_named_with_what_to_do() {
    let (stack, file) = stack_with_config(&["old", "missing", "locked"], json!({}));
    stack.answer(
        "old",
        "VERSION",
        Answer::prints(r#"{"cniVersion":"0.4.0","supportedVersions":["0.3.1","0.4.0"]}"#),
    );
    // "locked" is there but not executable; "missing" is not there at all.
    fs::remove_file(stack.bin().join("locked")).unwrap();
    stack.file("locked", "#!/bin/sh\n", 0o644);
    fs::remove_file(stack.bin().join("missing")).unwrap();
    let (ok, report) = doctor(&stack, &file);
    assert!(!ok, "{report}");
    assert!(report.contains("3 problem(s):"), "{report}");
    assert!(
        report.contains("old does not support cniVersion 1.0.0 (it supports 0.3.1,0.4.0)"),
        "{report}"
    );
    assert!(
        report.contains(&format!(
            "missing is in none of {}: install it there",
            stack.bin().display()
        )),
        "{report}"
    );
    assert!(
        report.contains(&format!(
            "{}/locked is not executable: chmod +x it",
            stack.bin().display()
        )),
        "{report}"
    );
}

#[test]
fn a_self_reference_is_found_by_link_and_by_copy() {
    let (stack, file) = stack_with_config(&["a"], json!({}));
    stack.link("loop", Path::new(PLUGIN));
    fs::copy(PLUGIN, stack.bin().join("copy")).unwrap();
    let list = fs::read_to_string(&file)
        .unwrap()
        .replace(r#"["a"]"#, r#"["a","loop","copy"]"#);
    fs::write(&file, list).unwrap();
    let (ok, report) = doctor(&stack, &file);
    assert!(!ok, "{report}");
    // One message for both, as the plugin itself words it.
    assert!(
        report.contains("delegate \"loop\" is ipam-delegated itself")
            && report.contains("is the same file"),
        "{report}"
    );
    assert!(
        report.contains("delegate \"copy\" is ipam-delegated itself")
            && report.contains("copy is a copy of it"),
        "{report}"
    );
    assert!(report.contains("remove it from ipam.delegates"), "{report}");
}

#[test]
fn a_bad_timeout_or_config_is_named() {
    let (stack, file) = stack_with_config(&["a"], json!({"timeout": -1}));
    let (ok, report) = doctor(&stack, &file);
    assert!(!ok);
    assert!(
        report.contains("\"ipam.timeout\" must be a number of seconds"),
        "{report}"
    );
    let (ok, report) = doctor(&stack, "/nonexistent.conflist");
    assert!(!ok);
    assert!(
        report.contains("/nonexistent.conflist: cannot be read"),
        "{report}"
    );
    assert!(stack.calls().is_empty());
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn the_docs_nomad_and_multus_examples_pass_the_doctor() {
    let plugins = common::real_plugins();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let stack = Stack::new().with_pool_plugins();
    stack.link("host-local", &plugins.join("host-local"));
    let shown_in = fs::read_to_string(root.join("docs/runtimes.md")).unwrap();
    for (fixture, indent) in [("nomad.conflist", ""), ("multus.json", "    ")] {
        let path = root.join("fixtures/conflists").join(fixture);
        let (ok, report) = doctor(&stack, path.to_str().unwrap());
        assert!(ok, "{fixture}: {report}");
        let text = fs::read_to_string(&path).unwrap();
        let shown: Vec<String> = text
            .trim_end()
            .lines()
            .map(|l| format!("{indent}{l}"))
            .collect();
        assert!(
            shown_in.contains(&shown.join("\n")),
            "docs/runtimes.md lacks {fixture} as it is"
        );
    }
}

/// A conflist over the real ipam-ds-static and ipam-da-pool of `stack`,
/// whose `ipam.static` and `ipam.pool` are `selector` and `pools` (with
/// the pools' files in the stack's directory), named `name` and written to
/// `file` there.
fn family_config(
    stack: &Stack,
    name: &str,
    file: &str,
    selector: serde_json::Value,
    pools: serde_json::Value,
) -> String {
    let mut pool = json!({
        "dataDir": stack.dir.path().join("data"),
        "nodeNameFile": stack.dir.path().join("node/name"),
        "pools": pools,
    });
    pool["default"] = "general".into();
    let list = json!({"cniVersion": "1.0.0", "name": name, "plugins": [{
        "type": "bridge",
        "ipam": {
            "type": "ipam-delegated",
            "delegates": ["ipam-ds-static", "ipam-da-pool"],
            "static": selector,
            "pool": pool,
        },
    }]});
    let path = stack.dir.path().join(file);
    fs::write(&path, list.to_string()).unwrap();
    path.display().to_string()
}

/// The selector of the Kubernetes example: payments' pods from `pci`.
fn payments_rule(condition: &str) -> serde_json::Value {
    json!({"default": [{"name": "general"}],
           "rules": [{condition: {"K8S_POD_NAMESPACE": "payments"}, "pools": [{"name": "pci"}]}]})
}

/// A configuration the family accepts.
fn good_config(stack: &Stack, name: &str, file: &str) -> String {
    family_config(stack, name, file, payments_rule("args"), two_pools())
}

fn two_pools() -> serde_json::Value {
    json!({"general": [{"subnet": "10.22.0.0/24"}], "pci": [{"subnet": "10.22.128.0/24"}]})
}

#[test]
fn the_family_checks_its_own_settings_making_nothing() {
    let stack = Stack::new().with_pool_plugins();
    let file = good_config(&stack, "pods", "pods.conflist");
    let (ok, report) = doctor(&stack, &file);
    assert!(ok, "{report}");
    assert!(report.ends_with("all good\n"), "{report}");
    // The allocator's check pins no node name and opens no store.
    for made in ["node", "data"] {
        assert!(!stack.dir.path().join(made).exists(), "{made}: {report}");
    }
}

#[test]
fn a_misspelt_key_is_named_with_its_delegate_and_the_fix() {
    let typo_in_range = json!({
        "general": [{"subnet": "10.22.0.0/24", "exlcude": ["10.22.0.9"]}],
        "pci": [{"subnet": "10.22.128.0/24"}],
    });
    let cases = [
        (
            payments_rule("arg"),
            two_pools(),
            "ipam-ds-static",
            "\"arg\"",
            "ipam.static",
        ),
        (
            payments_rule("args"),
            typo_in_range,
            "ipam-da-pool",
            "\"exlcude\"",
            "ipam.pool",
        ),
    ];
    for (selector, pools, delegate, key, settings) in cases {
        let stack = Stack::new().with_pool_plugins();
        let file = family_config(&stack, "pods", "pods.conflist", selector, pools);
        let (ok, report) = doctor(&stack, &file);
        assert!(!ok, "{report}");
        let row = report.lines().find(|l| l.starts_with(delegate)).unwrap();
        assert!(row.ends_with("PROBLEM"), "{report}");
        let problems: Vec<&str> = report.lines().filter(|l| l.starts_with("- ")).collect();
        let [problem] = problems[..] else {
            panic!("one problem: {report}")
        };
        let refused = format!("{delegate} refuses its settings (code 7)");
        let fix = format!("correct {settings} and run the doctor again");
        for part in [refused.as_str(), key, fix.as_str()] {
            assert!(problem.contains(part), "{part}: {report}");
        }
        // Checking pinned no node name.
        assert!(!stack.dir.path().join("node").exists(), "{report}");
    }
}

#[test]
fn a_family_member_without_validate_is_named_as_older() {
    let stack = Stack::new().with_pool_plugins();
    fs::remove_file(stack.bin().join("ipam-da-pool")).unwrap();
    // A build from before `validate`: VERSION answered, the verb a usage error.
    stack.file(
        "ipam-da-pool",
        "#!/bin/sh\n\
         if [ \"$CNI_COMMAND\" = VERSION ]; then\n\
         echo '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"1.0.0\"]}'; exit 0; fi\n\
         echo 'ipam-da-pool: unknown command' >&2; exit 2\n",
        0o755,
    );
    let file = good_config(&stack, "pods", "pods.conflist");
    let (ok, report) = doctor(&stack, &file);
    assert!(!ok, "{report}");
    assert!(
        report.contains("- ipam-da-pool has no validate command: it is older than ipam-delegated"),
        "{report}"
    );
}

#[test]
fn a_directory_is_read_as_net_d_and_network_picks_one() {
    let stack = Stack::new().with_pool_plugins();
    good_config(&stack, "pods", "10-pods.conflist");
    let dir = stack.dir.path().display().to_string();
    let (ok, report) = doctor(&stack, &dir);
    assert!(ok, "{report}");
    assert!(report.contains("network \"pods\""), "{report}");

    family_config(
        &stack,
        "edge",
        "20-edge.conflist",
        payments_rule("arg"),
        two_pools(),
    );
    let (ok, report) = doctor(&stack, &dir);
    assert!(!ok, "{report}");
    assert!(
        report.contains("has several networks whose ipam.type is ipam-delegated (pods, edge): pick one with --network"),
        "{report}"
    );
    for (network, healthy) in [("pods", true), ("edge", false)] {
        let out = run_cli(
            &["doctor", "--config", &dir, "--network", network],
            &env(&stack),
        );
        let report = String::from_utf8(out.stdout).unwrap();
        assert_eq!(out.status.success(), healthy, "{report}");
        assert!(report.contains(&format!("network {network:?}")), "{report}");
    }
    let out = run_cli(
        &["doctor", "--config", &dir, "--network", "nope"],
        &env(&stack),
    );
    let report = String::from_utf8(out.stdout).unwrap();
    assert!(!out.status.success());
    assert!(
        report.contains("has no network \"nope\" whose ipam.type is ipam-delegated"),
        "{report}"
    );
}

#[test]
fn the_port_allocator_checks_its_own_settings_calling_no_controller() {
    // Nothing listens on this URL: a call would fail the check.
    let neutron = |extra: serde_json::Value| {
        let mut settings = json!({
            "url": "http://127.0.0.1:9/v2.0",
            "network": "6f6e1a7c-2b5e-4c1e-9a51-0d3c0a0b7c11",
            "host": "node-a",
        });
        for (key, value) in extra.as_object().unwrap() {
            settings[key] = value.clone();
        }
        settings
    };
    let stack = Stack::new().with_neutron_plugins();
    let write = |settings: serde_json::Value| {
        let list = json!({"cniVersion": "1.0.0", "name": "pods", "plugins": [{
            "type": "bridge",
            "ipam": {"type": "ipam-delegated", "delegates": ["ipam-da-neutron"], "neutron": settings},
        }]});
        let path = stack.dir.path().join("pods.conflist");
        fs::write(&path, list.to_string()).unwrap();
        path.display().to_string()
    };
    let (ok, report) = doctor(&stack, &write(neutron(json!({}))));
    assert!(ok, "{report}");
    let (ok, report) = doctor(&stack, &write(neutron(json!({"subnet": ["s"]}))));
    assert!(!ok, "{report}");
    let problems: Vec<&str> = report.lines().filter(|l| l.starts_with("- ")).collect();
    let [problem] = problems[..] else {
        panic!("one problem: {report}")
    };
    for part in [
        "ipam-da-neutron refuses its settings (code 7)",
        "\"ipam.neutron.subnet\"",
        "correct ipam.neutron and run the doctor again",
    ] {
        assert!(problem.contains(part), "{part}: {report}");
    }
}
