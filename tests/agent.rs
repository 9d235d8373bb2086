//! Agent mode through the built binary: `ensure` and `release` with
//! Debian's host-local as the allocator (idempotent, self-healing, never
//! two reservations for one ID), GC keeping agents' attachments, and the
//! errors a command line can make.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use common::{real_plugins, run_cli, run_plugin, Answer, Env, Stack, TempDir};
use serde_json::{json, Value};

/// A stack and the files an agent uses: its conflist, host-local's store
/// and agent mode's state directory.
struct Agent {
    stack: Stack,
    conflist: PathBuf,
    data: PathBuf,
    state: PathBuf,
    _dir: TempDir,
}

impl Agent {
    /// A conflist whose bridge plugin's IPAM is ipam-delegated over `delegates`.
    fn new(stack: Stack, delegates: &[&str]) -> Agent {
        let dir = TempDir::new("agent");
        let (data, state) = (dir.path().join("data"), dir.path().join("state"));
        let conflist = dir.path().join("agents.conflist");
        let list = json!({
            "cniVersion": "1.0.0",
            "name": "agents",
            "plugins": [
                {"type": "bridge", "bridge": "agents0", "ipam": {
                    "type": "ipam-delegated",
                    "delegates": delegates,
                    "ranges": [[{"subnet": "10.250.77.0/24"}]],
                    "dataDir": data,
                    "stateDir": state,
                }},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        fs::write(&conflist, serde_json::to_string_pretty(&list).unwrap()).unwrap();
        Agent {
            stack,
            conflist,
            data,
            state,
            _dir: dir,
        }
    }

    /// The environment an agent runs with: no CNI_* but CNI_PATH.
    fn env(&self) -> Env {
        let env = self.stack.env("ADD");
        Env(env
            .0
            .into_iter()
            .filter(|(k, _)| !k.starts_with("CNI_") || k == "CNI_PATH")
            .collect())
    }

    fn run(&self, command: &str, id: &str) -> common::Outcome {
        let config = self.conflist.display().to_string();
        run_cli(&[command, "--config", &config, "--id", id], &self.env())
    }

    fn ensure(&self, id: &str) -> String {
        let out = self.run("ensure", id);
        assert!(out.status.success(), "{out:?}");
        out.json()["ips"][0]["address"].as_str().unwrap().to_owned()
    }

    fn reservations(&self) -> BTreeSet<String> {
        let Ok(entries) = fs::read_dir(self.data.join("agents")) else {
            return BTreeSet::new();
        };
        entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }

    fn state_of(&self, id: &str) -> PathBuf {
        self.state.join("agents").join(format!("{id}:eth0"))
    }
}

fn host_local_agent() -> Option<Agent> {
    let plugins = real_plugins()?;
    let stack = Stack::new();
    stack.link("host-local", &plugins.join("host-local"));
    Some(Agent::new(stack, &["host-local"]))
}

fn host(address: &str) -> String {
    address.split('/').next().unwrap().to_owned()
}

#[test]
fn ensure_twice_gives_the_same_address_and_one_reservation() {
    let Some(agent) = host_local_agent() else {
        return;
    };
    let first = agent.ensure("agent-health");
    let second = agent.ensure("agent-health");
    assert_eq!(first, second);
    assert_eq!(agent.reservations(), BTreeSet::from([host(&first)]));
    let kept: Value =
        serde_json::from_slice(&fs::read(agent.state_of("agent-health")).unwrap()).unwrap();
    assert_eq!(kept["ips"][0]["address"], first.as_str());
}

#[test]
fn a_reservation_lost_behind_our_back_is_made_again_once() {
    let Some(agent) = host_local_agent() else {
        return;
    };
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
fn state_lost_after_an_add_leaves_one_reservation_not_two() {
    let Some(agent) = host_local_agent() else {
        return;
    };
    agent.ensure("agent-health");
    // A crash between ADD and keeping the result looks like this.
    fs::remove_file(agent.state_of("agent-health")).unwrap();
    let again = agent.ensure("agent-health");
    assert_eq!(agent.reservations(), BTreeSet::from([host(&again)]));
}

#[test]
fn release_twice_leaves_no_reservation_and_no_state() {
    let Some(agent) = host_local_agent() else {
        return;
    };
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
fn concurrent_ensures_for_one_id_leave_one_reservation() {
    let Some(agent) = host_local_agent() else {
        return;
    };
    let addresses: BTreeSet<String> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| agent.ensure("agent-health")))
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(addresses.len(), 1, "{addresses:?}");
    assert_eq!(agent.reservations().len(), 1);
}

/// An agent over one scripted delegate `a` that allocates on ADD.
fn fixture_agent() -> Agent {
    let stack = Stack::of(&["a"]);
    stack.answer(
        "a",
        "ADD",
        Answer::prints(r#"{"cniVersion":"1.1.0","ips":[{"address":"10.250.78.9/24"}]}"#),
    );
    let agent = Agent::new(stack, &["a"]);
    let list = fs::read_to_string(&agent.conflist)
        .unwrap()
        .replace("\"1.0.0\"", "\"1.1.0\"");
    fs::write(&agent.conflist, list).unwrap();
    agent
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
    let env = agent
        .stack
        .env("GC")
        .unset("CNI_CONTAINERID")
        .unset("CNI_NETNS")
        .unset("CNI_IFNAME");
    run_plugin(&env, input.to_string().as_bytes()).assert_silent_success();
    let gc = agent
        .stack
        .calls()
        .into_iter()
        .find(|c| c.command == "GC")
        .unwrap();
    let seen: Value = serde_json::from_slice(&agent.stack.stdin_of(&gc)).unwrap();
    assert_eq!(
        seen["cni.dev/valid-attachments"],
        json!([{"containerID": "pod-1", "ifname": "eth0"}, {"containerID": "agent-health", "ifname": "eth0"}])
    );
    // Released, it is no longer kept from GC.
    agent.run("release", "agent-health").assert_silent_success();
    run_plugin(&env, input.to_string().as_bytes()).assert_silent_success();
    let gc = agent
        .stack
        .calls()
        .into_iter()
        .rfind(|c| c.command == "GC")
        .unwrap();
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
    let dir = agent.state.parent().unwrap().display().to_string();
    let error = run_cli(&["release", "--config", &dir, "--id", "a"], &agent.env()).assert_error(7);
    assert!(
        error["msg"].as_str().unwrap().contains("cannot be read"),
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
        &["release", "--config", "f", "--id", "a", "--netns", "x"],
    ] {
        let out = run_cli(args, &agent.env());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty());
        assert!(out.stderr.contains("usage:"), "{}", out.stderr);
    }
    assert!(agent.stack.calls().is_empty());
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
