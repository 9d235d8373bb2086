//! Agent mode through the built binary: `ensure` and `release` with
//! Debian's host-local as the allocator (idempotent, self-healing, never
//! two reservations for one ID), GC keeping agents' attachments, state
//! that links cannot redirect, and plugins built on libcni 1.2.

use crate::agent_harness::{fixture_agent, Agent};
use crate::common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use crate::common::{real_plugins, run_cli, run_plugin, Answer, Env, Stack};
use serde_json::{json, Value};

fn host_local_agent() -> Agent {
    let plugins = real_plugins();
    let stack = Stack::new();
    stack.link("host-local", &plugins.join("host-local"));
    Agent::new(stack, &["host-local"])
}

fn host(address: &str) -> String {
    address.split('/').next().unwrap().to_owned()
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn ensure_twice_gives_the_same_address_and_one_reservation() {
    let agent = host_local_agent();
    let first = agent.ensure("agent-health");
    let second = agent.ensure("agent-health");
    assert_eq!(first, second);
    assert_eq!(agent.reservations(), BTreeSet::from([host(&first)]));
    let kept: Value =
        serde_json::from_slice(&fs::read(agent.state_of("agent-health")).unwrap()).unwrap();
    assert_eq!(kept["ips"][0]["address"], first.as_str());
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn a_reservation_lost_behind_our_back_is_made_again_once() {
    let agent = host_local_agent();
    let first = agent.ensure("agent-health");
    fs::remove_file(agent.data.join("agents").join(host(&first))).unwrap();
    assert!(agent.reservations().is_empty());
    let again = agent.ensure("agent-health");
    assert_eq!(agent.reservations(), BTreeSet::from([host(&again)]));
    let kept: Value =
        serde_json::from_slice(&fs::read(agent.state_of("agent-health")).unwrap()).unwrap();
    assert_eq!(kept["ips"][0]["address"], again.as_str());
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn state_lost_after_an_add_leaves_one_reservation_not_two() {
    let agent = host_local_agent();
    agent.ensure("agent-health");
    // A crash between ADD and keeping the result looks like this.
    fs::remove_file(agent.state_of("agent-health")).unwrap();
    let again = agent.ensure("agent-health");
    assert_eq!(agent.reservations(), BTreeSet::from([host(&again)]));
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn release_twice_leaves_no_reservation_and_no_state() {
    let agent = host_local_agent();
    agent.ensure("agent-health");
    agent.ensure("agent-dns");
    for _ in 0..2 {
        agent.run("release", "agent-health").assert_silent_success();
    }
    assert!(!agent.state_of("agent-health").exists());
    assert_eq!(agent.reservations().len(), 1, "agent-dns keeps its own");
    agent.run("release", "agent-dns").assert_silent_success();
    assert!(agent.reservations().is_empty());
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn concurrent_ensures_for_one_id_leave_one_reservation() {
    let agent = host_local_agent();
    let addresses: BTreeSet<String> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| agent.ensure("agent-health")))
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(addresses.len(), 1, "{addresses:?}");
    assert_eq!(agent.reservations().len(), 1);
}

/// The GC input a CNI 1.1 runtime sends for the agent's network, with
/// `valid` as `cni.dev/valid-attachments` and `ipam` keys added.
fn gc_of(agent: &Agent, valid: Value, ipam: Value) -> (Env, String) {
    let mut input = json!({
        "cniVersion": "1.1.0",
        "name": "agents",
        "ipam": {"type": "ipam-delegated", "delegates": ["a"], "stateDir": agent.state},
        "cni.dev/valid-attachments": valid,
    });
    for (key, value) in ipam.as_object().unwrap() {
        input["ipam"][key] = value.clone();
    }
    (gc_env(agent), input.to_string())
}

/// The last GC call the scripted delegate recorded.
fn last_gc(agent: &Agent) -> common::Call {
    let calls = agent.stack.calls();
    calls
        .into_iter()
        .rfind(|c| c.command == "GC")
        .expect("a GC call")
}

/// A CNI 1.1 runtime's GC environment: only CNI_PATH of the CNI_* ones.
fn gc_env(agent: &Agent) -> Env {
    agent
        .stack
        .env("GC")
        .unset("CNI_CONTAINERID")
        .unset("CNI_NETNS")
        .unset("CNI_IFNAME")
}

#[test]
fn gc_gets_the_runtimes_list_plus_the_agents_attachments() {
    let agent = fixture_agent();
    agent.ensure("agent-health");
    let input = json!({
        "cniVersion": "1.1.0",
        "name": "agents",
        "type": "bridge",
        "ipam": {"type": "ipam-delegated", "delegates": ["a"], "stateDir": agent.state},
        "cni.dev/valid-attachments": [{"containerID": "pod-1", "ifname": "eth0"}],
    });
    let env = gc_env(&agent);
    run_plugin(&env, input.to_string().as_bytes()).assert_silent_success();
    let gc = last_gc(&agent);
    let seen: Value = serde_json::from_slice(&agent.stack.stdin_of(&gc)).unwrap();
    assert_eq!(
        seen["cni.dev/valid-attachments"],
        json!([{"containerID": "pod-1", "ifname": "eth0"}, {"containerID": "agent-health", "ifname": "eth0"}])
    );
    // Released, it is no longer kept from GC.
    agent.run("release", "agent-health").assert_silent_success();
    run_plugin(&env, input.to_string().as_bytes()).assert_silent_success();
    let gc = last_gc(&agent);
    assert_eq!(agent.stack.stdin_of(&gc), input.to_string().as_bytes());
}

#[test]
fn a_failed_add_keeps_no_state() {
    let agent = fixture_agent();
    agent.ensure("agent-health");
    assert!(agent.state_of("agent-health").exists());
    // The kept result no longer checks out, and ADD fails now.
    agent
        .stack
        .answer("a", "CHECK", Answer::fails(1, r#"{"code":3,"msg":"gone"}"#));
    fs::remove_file(agent.stack.rec().join("a.ADD.stdout")).unwrap();
    agent.stack.answer(
        "a",
        "ADD",
        Answer::fails(1, r#"{"code":11,"msg":"pool empty"}"#),
    );
    let out = agent.run("ensure", "agent-health");
    let error = out.assert_error(11);
    assert_eq!(error["msg"], "pool empty");
    assert!(!agent.state_of("agent-health").exists());
    assert_eq!(
        agent.stack.call_list(),
        ["a DEL", "a ADD", "a CHECK", "a DEL", "a ADD", "a DEL"]
    );
}

#[test]
fn the_agents_environment_is_a_runtimes() {
    let agent = fixture_agent();
    agent.ensure("agent-health");
    let add = agent
        .stack
        .calls()
        .into_iter()
        .find(|c| c.command == "ADD")
        .unwrap();
    let env = agent.stack.env_of(&add);
    for (key, value) in [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "agent-health"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_NETNS", "/proc/self/ns/net"),
    ] {
        assert_eq!(env.get(key).map(String::as_str), Some(value), "{key}");
    }
    let stdin: Value = serde_json::from_slice(&agent.stack.stdin_of(&add)).unwrap();
    // The stdin bridge would give: its object, with the list's version and name.
    assert_eq!(
        (
            stdin["cniVersion"].as_str(),
            stdin["name"].as_str(),
            stdin["type"].as_str()
        ),
        (Some("1.1.0"), Some("agents"), Some("bridge"))
    );
}

#[test]
fn a_single_plugin_configuration_works_too() {
    let agent = fixture_agent();
    let list: Value = serde_json::from_str(&fs::read_to_string(&agent.conflist).unwrap()).unwrap();
    let mut plugin = list["plugins"][0].clone();
    plugin["cniVersion"] = json!("1.1.0");
    plugin["name"] = json!("agents");
    let file: &Path = &agent.state.parent().unwrap().join("agents.conf");
    fs::write(file, plugin.to_string()).unwrap();
    let out = run_cli(
        &[
            "ensure",
            "--config",
            file.to_str().unwrap(),
            "--id",
            "agent-x",
        ],
        &agent.env(),
    );
    assert!(out.status.success(), "{out:?}");
    assert!(agent.state_of("agent-x").exists());
}

/// Sets `ipam.timeout` in the agent's conflist.
fn with_timeout(agent: &Agent, seconds: f64) {
    let mut list: Value =
        serde_json::from_str(&fs::read_to_string(&agent.conflist).unwrap()).unwrap();
    list["plugins"][0]["ipam"]["timeout"] = json!(seconds);
    fs::write(&agent.conflist, list.to_string()).unwrap();
}

#[test]
fn a_check_without_a_verdict_keeps_the_state_and_allocates_nothing() {
    let agent = fixture_agent();
    agent.ensure("agent-health");
    with_timeout(&agent, 0.5);
    agent
        .stack
        .answer("a", "CHECK", Answer::default().after("sleep 30\n"));
    let error = agent.run("ensure", "agent-health").assert_error(11);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .contains("did not finish within"),
        "{error}"
    );
    assert!(agent.state_of("agent-health").exists());
    // No DEL, no ADD after the CHECK that could not answer.
    assert_eq!(agent.stack.call_list(), ["a DEL", "a ADD", "a CHECK"]);
}

#[test]
fn a_failed_add_after_a_failed_del_keeps_the_state_for_gc() {
    let agent = fixture_agent();
    agent.ensure("agent-health");
    agent
        .stack
        .answer("a", "CHECK", Answer::fails(1, r#"{"code":3,"msg":"gone"}"#));
    agent.stack.answer(
        "a",
        "DEL",
        Answer::fails(1, r#"{"code":5,"msg":"store unreachable"}"#),
    );
    fs::remove_file(agent.stack.rec().join("a.ADD.stdout")).unwrap();
    agent.stack.answer(
        "a",
        "ADD",
        Answer::fails(1, r#"{"code":7,"msg":"no pool"}"#),
    );
    agent.run("ensure", "agent-health").assert_error(7);
    // The DEL could not free what the kept result names: still kept.
    assert!(agent.state_of("agent-health").exists());
}

#[test]
fn gc_holds_the_lock_even_before_the_first_ensure() {
    let agent = fixture_agent();
    let rec = agent.stack.rec().display().to_string();
    agent.stack.answer(
        "a",
        "GC",
        Answer::default().after(&format!("sleep 1\ndate +%s%N > {rec}/gc-end\n")),
    );
    agent.stack.answer(
        "a",
        "ADD",
        Answer::prints(r#"{"cniVersion":"1.1.0","ips":[{"address":"10.250.78.9/24"}]}"#)
            .after(&format!("date +%s%N > {rec}/add-start\n")),
    );
    let input = json!({
        "cniVersion": "1.1.0",
        "name": "agents",
        "ipam": {"type": "ipam-delegated", "delegates": ["a"], "stateDir": agent.state},
        "cni.dev/valid-attachments": [],
    });
    let env = gc_env(&agent);
    std::thread::scope(|scope| {
        let gc = scope.spawn(|| run_plugin(&env, input.to_string().as_bytes()));
        // Once GC is running, the first ensure for the network starts.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while agent.stack.calls().is_empty() {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        agent.ensure("agent-health");
        gc.join().unwrap().assert_silent_success();
    });
    let read = |name: &str| {
        fs::read_to_string(agent.stack.rec().join(name))
            .unwrap()
            .trim()
            .parse::<u128>()
            .unwrap()
    };
    assert!(
        read("add-start") > read("gc-end"),
        "the ADD ran while GC did"
    );
}

#[test]
fn waiting_for_the_lock_stops_on_sigterm() {
    let agent = fixture_agent();
    agent.stack.answer(
        "a",
        "ADD",
        Answer::prints(r#"{"cniVersion":"1.1.0","ips":[{"address":"10.250.78.9/24"}]}"#)
            .after("sleep 5\n"),
    );
    let config = agent.conflist.display().to_string();
    let spawn = |id: &str| {
        std::process::Command::new(common::PLUGIN)
            .args(["ensure", "--config", &config, "--id", id])
            .env_clear()
            .envs(agent.env().0)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let holder = spawn("agent-one");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !agent.stack.call_list().contains(&"a ADD".to_string()) {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let waiter = spawn("agent-two");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let started = std::time::Instant::now();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &waiter.id().to_string()])
        .status();
    assert!(sent.unwrap().success());
    let out = waiter.wait_with_output().unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "waited for the holder"
    );
    let error: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(error["code"], 105, "{error}");
    assert!(holder.wait_with_output().unwrap().status.success());
}

#[test]
fn a_damaged_state_file_is_replaced_not_fatal() {
    let agent = fixture_agent();
    agent.ensure("agent-health");
    fs::write(agent.state_of("agent-health"), "{\"ips\":[").unwrap();
    let address = agent.ensure("agent-health");
    assert_eq!(address, "10.250.78.9/24");
    let kept: Value =
        serde_json::from_slice(&fs::read(agent.state_of("agent-health")).unwrap()).unwrap();
    assert_eq!(kept["ips"][0]["address"], "10.250.78.9/24");
}

#[test]
fn gc_creates_nothing_for_a_network_without_agent_attachments() {
    let agent = fixture_agent();
    let (env, input) = gc_of(&agent, json!([]), json!({}));
    run_plugin(&env, input.as_bytes()).assert_silent_success();
    assert!(!agent.state.exists(), "GC made {}", agent.state.display());
    // With a state directory, but none for this network, alike.
    fs::create_dir_all(&agent.state).unwrap();
    run_plugin(&env, input.as_bytes()).assert_silent_success();
    assert_eq!(fs::read_dir(&agent.state).unwrap().count(), 0);
    assert_eq!(agent.stack.call_list(), ["a GC", "a GC"]);
}

#[test]
fn gc_waits_for_agent_modes_lock_no_longer_than_the_timeout() {
    let agent = fixture_agent();
    agent.ensure("agent-health");
    // An ensure that holds the network's lock for 5 s.
    agent
        .stack
        .answer("a", "CHECK", Answer::default().after("sleep 5\n"));
    let config = agent.conflist.display().to_string();
    let holder = std::process::Command::new(common::PLUGIN)
        .args(["ensure", "--config", &config, "--id", "agent-health"])
        .env_clear()
        .envs(agent.env().0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !agent.stack.call_list().contains(&"a CHECK".to_string()) {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (env, input) = gc_of(&agent, json!([]), json!({"timeout": 0.5}));
    let started = std::time::Instant::now();
    let error = run_plugin(&env, input.as_bytes()).assert_error(11);
    assert!(started.elapsed() < std::time::Duration::from_secs(3));
    assert!(error["msg"].as_str().unwrap().contains("lock"), "{error}");
    assert!(!agent.stack.call_list().contains(&"a GC".to_string()));
    let _ = holder.wait_with_output();
}

#[test]
fn valid_attachments_that_are_not_an_array_are_refused_with_or_without_state() {
    let agent = fixture_agent();
    let (env, input) = gc_of(&agent, json!({"containerID": "pod-1"}), json!({}));
    for with_state in [false, true] {
        if with_state {
            agent.ensure("agent-health");
        }
        let error = run_plugin(&env, input.as_bytes()).assert_error(7);
        assert_eq!(
            error["msg"],
            "invalid network configuration: \"cni.dev/valid-attachments\" must be an array"
        );
    }
    assert!(!agent.stack.call_list().contains(&"a GC".to_string()));
}

#[test]
fn a_link_planted_in_the_state_directory_redirects_nothing() {
    let agent = fixture_agent();
    agent.ensure("agent-health");
    let target = agent.state.join("precious");
    fs::write(&target, "precious").unwrap();
    let network = agent.state.join("agents");
    // At the temporary file's path: ensure writes its own file instead.
    std::os::unix::fs::symlink(&target, network.join(".agent-dns:eth0.tmp")).unwrap();
    agent.ensure("agent-dns");
    assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
    assert!(!network.join("agent-dns:eth0").is_symlink());
    // A state file that is a link: refused, nothing run, the target kept.
    fs::remove_file(agent.state_of("agent-health")).unwrap();
    std::os::unix::fs::symlink(&target, agent.state_of("agent-health")).unwrap();
    let calls = agent.stack.calls().len();
    let error = agent.run("ensure", "agent-health").assert_error(5);
    assert!(
        error["msg"].as_str().unwrap().contains("symbolic link"),
        "{error}"
    );
    assert_eq!(agent.stack.calls().len(), calls);
    assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
}

/// An agent over host-local as a plugin built on libcni 1.2 or later
/// behaves: it fails ADD and DEL whose CNI_NETNS is its own namespace,
/// unless CNI_NETNS_OVERRIDE says it is meant.
fn libcni_1_2_agent() -> Agent {
    let plugins = real_plugins();
    let stack = Stack::new();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/libcni-1.2-plugin");
    stack.link("host-local", &fixture);
    stack.link("host-local.real", &plugins.join("host-local"));
    Agent::new(stack, &["host-local"])
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn the_libcni_1_2_fixture_refuses_the_plugins_own_namespace() {
    let agent = libcni_1_2_agent();
    // A runtime's ADD into the plugin's own namespace, no override: code 8,
    // as from host-local v1.6.0.
    let input = fs::read_to_string(&agent.conflist).unwrap();
    let list: Value = serde_json::from_str(&input).unwrap();
    let mut plugin = list["plugins"][0].clone();
    plugin["cniVersion"] = list["cniVersion"].clone();
    plugin["name"] = list["name"].clone();
    let env = agent.stack.env("ADD").set("CNI_NETNS", "/proc/self/ns/net");
    let error = run_plugin(&env, plugin.to_string().as_bytes()).assert_error(8);
    assert_eq!(
        error["msg"],
        "plugin's netns and netns from CNI_NETNS should not be the same"
    );
    for allowed in ["1", "true", "TRUE"] {
        let env = env.clone().set("CNI_NETNS_OVERRIDE", allowed);
        let out = run_plugin(&env, plugin.to_string().as_bytes());
        assert!(out.status.success(), "{allowed}: {out:?}");
        run_plugin(
            &env.set("CNI_COMMAND", "DEL"),
            plugin.to_string().as_bytes(),
        )
        .assert_silent_success();
    }
    assert!(agent.reservations().is_empty());
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn ensure_and_release_work_with_plugins_built_on_libcni_1_2() {
    let agent = libcni_1_2_agent();
    // The agent's own namespace, by default and named.
    for netns in [&[][..], &["--netns", "/proc/self/ns/net"]] {
        let first = agent.run_with("ensure", "agent-health", netns);
        assert!(first.status.success(), "{first:?}");
        let again = agent.run_with("ensure", "agent-health", netns);
        assert_eq!(again.json(), first.json());
        assert_eq!(agent.reservations().len(), 1);
        agent
            .run_with("release", "agent-health", netns)
            .assert_silent_success();
        assert!(!agent.state_of("agent-health").exists());
        assert!(agent.reservations().is_empty());
    }
    // Another namespace at ensure: release, with it or without, frees it.
    for release in [&["--netns", "/run/netns/ipamd-absent"][..], &[]] {
        let ensured = agent.run_with(
            "ensure",
            "agent-health",
            &["--netns", "/run/netns/ipamd-absent"],
        );
        assert!(ensured.status.success(), "{ensured:?}");
        agent
            .run_with("release", "agent-health", release)
            .assert_silent_success();
        assert!(!agent.state_of("agent-health").exists());
        assert!(agent.reservations().is_empty());
    }
}

#[test]
fn the_override_is_set_only_for_the_agents_own_namespace() {
    let agent = fixture_agent();
    agent.ensure("agent-own");
    let ensured = agent.run_with(
        "ensure",
        "agent-other",
        &["--netns", "/run/netns/ipamd-absent"],
    );
    assert!(ensured.status.success(), "{ensured:?}");
    let override_of = |id: &str| {
        let call = agent
            .stack
            .calls()
            .into_iter()
            .find(|c| c.command == "ADD" && agent.stack.env_of(c)["CNI_CONTAINERID"] == id)
            .unwrap();
        agent.stack.env_of(&call).get("CNI_NETNS_OVERRIDE").cloned()
    };
    assert_eq!(override_of("agent-own").as_deref(), Some("1"));
    assert_eq!(override_of("agent-other"), None);
}

#[test]
#[ignore = "needs root, to run the plugin as another user"]
fn gc_by_a_user_who_cannot_read_the_state_directory_goes_on() {
    // A rootless runtime's GC: no agent of that user can keep anything in
    // a state directory it cannot read, so there is nothing to protect.
    use std::os::unix::fs::PermissionsExt;
    assert!(
        common::is_root(),
        "needs root, to run the plugin as another user"
    );
    let agent = fixture_agent();
    agent.ensure("agent-health");
    fs::set_permissions(&agent.state, fs::Permissions::from_mode(0o700)).unwrap();
    // The scripted delegate records its calls there, as that user too.
    fs::set_permissions(agent.stack.rec(), fs::Permissions::from_mode(0o777)).unwrap();
    for entry in fs::read_dir(agent.stack.rec()).unwrap() {
        fs::set_permissions(entry.unwrap().path(), fs::Permissions::from_mode(0o666)).unwrap();
    }
    let (env, input) = gc_of(&agent, json!([]), json!({}));
    let mut child = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            common::PLUGIN,
        ])
        .env_clear()
        .envs(env.0)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let gc = last_gc(&agent);
    assert_eq!(agent.stack.stdin_of(&gc), input.as_bytes());
}

#[test]
fn ensure_and_release_take_a_directory_and_pick_a_network_of_it() {
    let agent = fixture_agent();
    let dir = agent.conflist.parent().unwrap().display().to_string();
    let run = |verb: &str, more: &[&str]| {
        let mut args = vec![verb, "--config", &dir, "--id", "agent-health"];
        args.extend(more);
        run_cli(&args, &agent.env())
    };
    let out = run("ensure", &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.json()["ips"][0]["address"], "10.250.78.9/24");

    // A second network run by ipam-delegated: which one must be said.
    let list = fs::read_to_string(&agent.conflist).unwrap();
    let other = list.replace("\"agents\"", "\"others\"");
    assert_ne!(list, other);
    fs::write(agent.conflist.with_file_name("others.conflist"), other).unwrap();
    let error = run("ensure", &[]).assert_error(7);
    assert!(
        error["msg"].as_str().unwrap().contains(
            "has several networks whose ipam.type is ipam-delegated (agents, others): pick one with --network"
        ),
        "{error}"
    );
    let out = run("ensure", &["--network", "agents"]);
    assert_eq!(out.json()["ips"][0]["address"], "10.250.78.9/24");
    let out = run("release", &["--network", "agents"]);
    assert!(out.status.success(), "{out:?}");
    assert!(!agent.state_of("agent-health").exists());
    run("release", &["--network", "nobody"]).assert_error(7);
}

#[test]
fn ensure_gives_the_kept_result_in_the_configurations_version_today() {
    let agent = fixture_agent();
    let first = agent.run("ensure", "agent-health").json();
    assert_eq!(first["cniVersion"], "1.1.0");
    // The configuration moves to 0.4.0: the kept result, checked, is given
    // in it.
    let list = fs::read_to_string(&agent.conflist)
        .unwrap()
        .replace("\"1.1.0\"", "\"0.4.0\"");
    fs::write(&agent.conflist, list).unwrap();
    let again = agent.run("ensure", "agent-health").json();
    assert_eq!(
        again,
        json!({"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.250.78.9/24"}]})
    );
    let calls = agent.stack.calls();
    let check = calls.last().unwrap();
    assert_eq!(check.command, "CHECK", "{calls:?}");
    let checked: Value = serde_json::from_slice(&agent.stack.stdin_of(check)).unwrap();
    assert_eq!(checked["prevResult"], again, "CHECK got it in 0.4.0 too");
    // Kept in 1.1.0 still; when CHECK fails, the DEL before the new ADD
    // gets it in 0.4.0 as well.
    agent
        .stack
        .answer("a", "CHECK", Answer::fails(1, r#"{"code":3,"msg":"gone"}"#));
    agent.run("ensure", "agent-health").json();
    let calls = agent.stack.calls();
    let del = calls.iter().rev().find(|c| c.command == "DEL").unwrap();
    let deleted: Value = serde_json::from_slice(&agent.stack.stdin_of(del)).unwrap();
    assert_eq!(deleted["prevResult"], again, "{calls:?}");
}

#[test]
fn ensure_with_a_delegate_missing_makes_no_state() {
    let agent = fixture_agent();
    fs::remove_file(agent.stack.bin().join("a")).unwrap();
    agent.run("ensure", "agent-health").assert_error(100);
    assert!(!agent.state.exists(), "{} was made", agent.state.display());
}

#[test]
fn a_hostile_umask_leaves_agent_state_private() {
    let agent = fixture_agent();
    let config = agent.conflist.display().to_string();
    let out = common::run_under_umask(
        "000",
        common::PLUGIN,
        &["ensure", "--config", &config, "--id", "agent-health"],
        &agent.env(),
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(common::mode_of(&agent.state), 0o700);
    assert_eq!(common::mode_of(&agent.state.join("agents")), 0o700);
}
