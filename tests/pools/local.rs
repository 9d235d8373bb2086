//! ipam-ds-static and ipam-da-pool, with the local store: the original
//! README's example flow through ipam-delegated, each plugin's commands,
//! many processes at once in a small pool, and allocators killed at random
//! instants. The stress figures are printed on stderr.

use crate::common;
use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{
    pool_config, run_plugin, run_program, spawn_program, temp_dir, Env, Stack, ALLOCATOR, SELECTOR,
};
use serde_json::{json, Value};

/// The names (dot-files aside) in `dir`, which may not exist.
fn names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|name| !name.starts_with('.'))
                .collect()
        })
        .unwrap_or_default()
}

/// The local store's records for `network` under `data`: the attachments,
/// and the addresses as `POOL/ADDRESS`, the pool as each record names it.
fn records(data: &Path, network: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let network = data.join(network);
    let attachments = names(&network.join("attachments"));
    let addresses = names(&network.join("addresses"))
        .into_iter()
        .map(|address| {
            let record = json_of(&network.join("addresses").join(&address));
            format!("{}/{address}", record["pool"].as_str().unwrap())
        })
        .collect();
    (attachments, addresses)
}

/// A record of the local store: a symbolic link whose target is the record.
fn json_of(path: &Path) -> Value {
    let target = fs::read_link(path)
        .unwrap_or_else(|e| panic!("{} is not a record, a link ({e})", path.display()));
    let text = target.into_os_string().into_encoded_bytes();
    serde_json::from_slice(&text)
        .unwrap_or_else(|e| panic!("{} is not a whole record ({e}): {text:?}", path.display()))
}

#[test]
fn the_original_readmes_example_flow_with_a_real_selector_and_allocator() {
    let stack = Stack::new().with_pool_plugins();
    let data = temp_dir("pool-data");
    let input = pool_config(
        "example",
        "1.0.0",
        json!({"default": [{"name": "local-pool", "subnet": "192.168.0.0/24", "gateway": "192.168.0.1"}]}),
        json!({
            "dataDir": data.path(),
            "node": "node-a",
            "routes": [{"dst": "0.0.0.0/0", "gw": "192.168.0.1"}],
        }),
    );
    let env = stack
        .env("ADD")
        .set("CNI_ARGS", "IgnoreUnknown=1;IP=192.168.0.23");
    let out = run_plugin(&env, input.as_bytes());
    assert!(out.status.success(), "{out:?}");
    let result = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(
        result,
        concat!(
            r#"{"cniVersion":"1.0.0","ips":[{"address":"192.168.0.23/24","gateway":"192.168.0.1"}],"#,
            r#""pools":[{"name":"local-pool","subnet":"192.168.0.0/24","gateway":"192.168.0.1","requested-ip":"192.168.0.23"}],"#,
            r#""routes":[{"dst":"0.0.0.0/0","gw":"192.168.0.1"}]}"#
        )
    );
    let other = run_plugin(
        &stack.env("ADD").set("CNI_CONTAINERID", "ctr-other"),
        input.as_bytes(),
    );
    // Allocation goes on from the last address given.
    assert_eq!(other.json()["ips"][0]["address"], "192.168.0.24/24");
    let (attachments, addresses) = records(data.path(), "example");
    assert_eq!(
        attachments,
        BTreeSet::from(["ctr-0123:eth0".into(), "ctr-other:eth0".into()])
    );
    assert_eq!(
        addresses,
        BTreeSet::from([
            "local-pool/192.168.0.23".into(),
            "local-pool/192.168.0.24".into()
        ])
    );
    let record = json_of(&data.path().join("example/addresses/192.168.0.23"));
    assert_eq!(
        (&record["containerID"], &record["ifname"], &record["node"]),
        (&json!("ctr-0123"), &json!("eth0"), &json!("node-a"))
    );

    // The same ADD again: the same address, nothing more held.
    let again = run_plugin(&env, input.as_bytes());
    assert_eq!(again.stdout, out.stdout);
    assert_eq!(records(data.path(), "example").1.len(), 2);

    let with_prev = common::with_prev(&input, &result);
    run_plugin(&stack.env("CHECK"), &with_prev).assert_silent_success();
    let wrong = common::with_prev(&input, &result.replace("192.168.0.23", "192.168.0.24"));
    let check = run_plugin(&stack.env("CHECK"), &wrong);
    let e = check.assert_error(112);
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .starts_with("ctr-0123/eth0 holds 192.168.0.23 (pool \"local-pool\"), which the previous result does not list"),
        "{e}"
    );
    assert!(
        check.stderr.contains("ipam-da-pool (CHECK)"),
        "{}",
        check.stderr
    );

    for id in ["ctr-0123", "ctr-other"] {
        let del = stack.env("DEL").set("CNI_CONTAINERID", id);
        run_plugin(&del, &with_prev).assert_silent_success();
        run_plugin(&del, &with_prev).assert_silent_success();
    }
    assert_eq!(records(data.path(), "example"), Default::default());
}

#[test]
fn a_dual_stack_selection_gives_an_address_of_each_version_in_a_legacy_result() {
    let stack = Stack::new().with_pool_plugins();
    let data = temp_dir("pool-data");
    let input = pool_config(
        "dual",
        "0.4.0",
        json!({
            "default": [{"name": "blue"}],
            "rules": [{"args": {"K8S_POD_NAMESPACE": "edge"}, "pools": [{"name": "edge4"}, {"name": "edge6"}]}],
        }),
        json!({
            "dataDir": data.path(),
            "node": "node-a",
            "pools": {
                "blue": [{"subnet": "10.1.0.0/24"}],
                "edge4": [{"subnet": "10.2.0.0/24", "rangeStart": "10.2.0.100"}],
                "edge6": [{"subnet": "fd00:2::/64"}],
            },
        }),
    );
    let edge = stack
        .env("ADD")
        .set("CNI_ARGS", "K8S_POD_NAMESPACE=edge;K8S_POD_NAME=web");
    let result = run_plugin(&edge, input.as_bytes()).json();
    assert_eq!(
        result["ips"],
        json!([
            {"version": "4", "address": "10.2.0.100/24", "gateway": "10.2.0.1"},
            {"version": "6", "address": "fd00:2::2/64", "gateway": "fd00:2::1"},
        ])
    );
    assert_eq!(result["cniVersion"], "0.4.0");
    assert_eq!(
        result["pools"],
        json!([{"name": "edge4"}, {"name": "edge6"}])
    );
    let other = stack.env("ADD").set("CNI_CONTAINERID", "ctr-blue");
    assert_eq!(
        run_plugin(&other, input.as_bytes()).json()["ips"][0]["address"],
        "10.1.0.2/24"
    );
}

#[test]
fn an_allocation_that_fails_is_undone_and_keeps_the_allocators_code() {
    let stack = Stack::new().with_pool_plugins();
    let data = temp_dir("pool-data");
    // A /30 gives one address: its gateway takes the other.
    let input = pool_config(
        "tiny",
        "1.0.0",
        json!({"default": [{"name": "tiny", "subnet": "10.3.0.0/30"}]}),
        json!({"dataDir": data.path(), "node": "node-a"}),
    );
    run_plugin(&stack.env("ADD"), input.as_bytes()).json();
    let second = stack.env("ADD").set("CNI_CONTAINERID", "ctr-second");
    let out = run_plugin(&second, input.as_bytes());
    let e = out.assert_error(110);
    assert_eq!(e["msg"], "pool \"tiny\" has no free address");
    assert!(out.stderr.contains("ipam-da-pool (ADD)"), "{}", out.stderr);
    let (attachments, addresses) = records(data.path(), "tiny");
    assert_eq!(attachments, BTreeSet::from(["ctr-0123:eth0".into()]));
    assert_eq!(addresses, BTreeSet::from(["tiny/10.3.0.2".into()]));

    let asked = stack
        .env("ADD")
        .set("CNI_ARGS", "IP=10.3.0.1")
        .set("CNI_CONTAINERID", "c3");
    let e = run_plugin(&asked, input.as_bytes()).assert_error(111);
    assert!(e.to_string().contains("the gateway"), "{e}");
}

/// Runs `program` by itself: `command` for container `id`.
pub(crate) fn run_alone(program: &str, command: &str, id: &str, input: &str) -> common::Outcome {
    run_program(
        program,
        Path::new("/"),
        &[],
        &alone(command, id),
        input.as_bytes(),
    )
}

/// The environment for running one of the pool plugins by itself.
pub(crate) fn alone(command: &str, id: &str) -> Env {
    Env(vec![
        ("CNI_COMMAND".into(), command.into()),
        ("CNI_CONTAINERID".into(), id.into()),
        ("CNI_NETNS".into(), "/var/run/netns/test".into()),
        ("CNI_IFNAME".into(), "eth0".into()),
        ("CNI_PATH".into(), "/nonexistent".into()),
        // The verbose flavour's log, not on the machine's /var/log.
        ("IPAM_DELEGATED_LOG_FILE".into(), "/dev/null".into()),
    ])
}

#[test]
fn the_selector_keeps_nothing_and_so_prints_nothing_but_on_add() {
    let input = json!({
        "cniVersion": "1.1.0",
        "name": "n",
        "ipam": {"type": "ipam-delegated", "static": {"default": [{"name": "blue"}]}},
        "prevResult": {"cniVersion": "1.1.0", "ips": [{"address": "10.1.0.2/24"}]},
    })
    .to_string();
    for command in ["DEL", "CHECK", "GC", "STATUS"] {
        let out = run_alone(SELECTOR, command, "c", &input);
        out.assert_silent_success();
    }
    let out = run_alone(SELECTOR, "ADD", "c", &input);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        r#"{"cniVersion":"1.1.0","ips":[{"address":"10.1.0.2/24"}],"pools":[{"name":"blue"}]}"#
    );
    let version = run_alone(SELECTOR, "VERSION", "c", "{}");
    assert_eq!(version.json()["supportedVersions"][0], "0.3.0");
    let no_settings = r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"x"}}"#;
    let out = run_alone(SELECTOR, "ADD", "c", no_settings);
    let e = out.assert_error(7);
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("\"ipam.static\" is missing"),
        "{e}"
    );
}

#[test]
fn the_allocator_alone_allocates_from_its_default_and_says_what_is_missing() {
    let data = temp_dir("pool-data");
    let input = |pool: Value| {
        json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "ipam-da-pool", "pool": pool}})
            .to_string()
    };
    let good = input(json!({
        "dataDir": data.path(), "node": "a", "default": "blue",
        "pools": {"blue": [{"subnet": "10.4.0.0/24", "gateway": "10.4.0.254"}]},
    }));
    let run = |command: &str, input: &str| run_alone(ALLOCATOR, command, "c", input);
    assert_eq!(
        run("ADD", &good).json()["ips"],
        json!([{"address": "10.4.0.1/24", "gateway": "10.4.0.254"}])
    );
    run("DEL", &good).assert_silent_success();
    let e = run("ADD", &input(json!({"dataDir": data.path(), "node": "a"}))).assert_error(7);
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("no pool to allocate from"),
        "{e}"
    );
    let e = run(
        "ADD",
        &input(json!({"dataDir": data.path(), "node": "a", "default": "red"})),
    )
    .assert_error(7);
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("pool \"red\" is not defined"),
        "{e}"
    );
}

#[test]
fn excluded_and_reserved_addresses_are_never_given_and_bad_pools_claim_nothing() {
    let data = temp_dir("pool-exclude");
    let input = |pools: Value, requested: Option<&str>| {
        let mut config = json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "ipam-da-pool",
            "pool": {"dataDir": data.path(), "node": "a", "default": "blue", "pools": pools}}});
        if let Some(address) = requested {
            config["prevResult"] = json!({"pools": [{"name": "blue", "requested-ip": address}]});
        }
        config.to_string()
    };
    // .1 the gateway, .7 broadcast, .2 and .3 excluded, .4 reserved: .5 and .6 are left.
    let pools = json!({"blue": {"ranges": [{"subnet": "10.7.0.0/29", "exclude": ["10.7.0.2/31"]}], "reserved": ["10.7.0.4"]}});
    let given: Vec<Value> = ["c1", "c2"]
        .iter()
        .map(|id| {
            run_alone(ALLOCATOR, "ADD", id, &input(pools.clone(), None)).json()["ips"][0]["address"]
                .clone()
        })
        .collect();
    assert_eq!(given, [json!("10.7.0.5/29"), json!("10.7.0.6/29")]);
    run_alone(ALLOCATOR, "ADD", "c3", &input(pools.clone(), None)).assert_error(110);
    for (asked, why) in [
        ("10.7.0.3", "it is excluded (10.7.0.2/31) from 10.7.0.0/29"),
        ("10.7.0.4", "it is reserved in the pool"),
    ] {
        let e =
            run_alone(ALLOCATOR, "ADD", "c3", &input(pools.clone(), Some(asked))).assert_error(111);
        assert!(e["msg"].as_str().unwrap().contains(why), "{asked}: {e}");
    }
    // A pool broken anywhere is refused whole, naming the pool, range and field.
    for (broken, said) in [
        (
            json!({"blue": [{"subnet": "10.7.0.0/29", "exclude": ["10.8.0.0/31"]}]}),
            "pool \"blue\": range 0: \"exclude\" 10.8.0.0/31 is outside the subnet 10.7.0.0/29",
        ),
        (
            json!({"blue": {"ranges": [{"subnet": "10.7.0.0/29"}], "reserved": ["10.9.0.1"]}}),
            "pool \"blue\": \"reserved\" 10.9.0.1 is in none of the pool's ranges",
        ),
    ] {
        let e = run_alone(ALLOCATOR, "ADD", "c4", &input(broken, None)).assert_error(7);
        assert!(e["msg"].as_str().unwrap().contains(said), "{e}");
    }
    assert_eq!(
        records(data.path(), "n"),
        (
            ["c1:eth0", "c2:eth0"].map(String::from).into(),
            ["blue/10.7.0.5", "blue/10.7.0.6"].map(String::from).into()
        ),
        "nothing claimed by the refusals"
    );
}

#[test]
fn show_reports_a_networks_pools_as_text_json_and_prometheus_without_the_lock() {
    let data = temp_dir("pool-show");
    let configs = data.path().join("net.d");
    fs::create_dir(&configs).unwrap();
    let network = |name: &str, ipam: Value| json!({"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "bridge", "ipam": ipam}]});
    let pool = |default: &str| {
        json!({"type": "ipam-da-pool", "pool": {"dataDir": data.path(), "node": "node-a", "default": default, "pools": {
            "blue": {"ranges": [{"subnet": "10.6.0.0/28", "exclude": ["10.6.0.8/30"]}], "reserved": ["10.6.0.2"]},
            "green": [{"subnet": "fd00:6::/48"}],
        }}})
    };
    for (file, config) in [
        ("10-pods.conflist", network("pods", pool("blue"))),
        (
            "20-other.conflist",
            network("other", json!({"type": "host-local"})),
        ),
        ("30-more.conflist", network("more", pool("green"))),
    ] {
        fs::write(configs.join(file), config.to_string()).unwrap();
    }
    // What the runtime hands the allocator: the plugin's configuration.
    let plugin = |name: &str, default: &str| {
        json!({"cniVersion": "1.0.0", "name": name, "ipam": pool(default)}).to_string()
    };
    for id in ["c1", "c2"] {
        run_alone(ALLOCATOR, "ADD", id, &plugin("pods", "blue")).json();
    }
    run_alone(ALLOCATOR, "ADD", "c3", &plugin("more", "green")).json();

    let show = |args: &[&str]| {
        let mut all = vec!["show", "--config"];
        let dir = configs.to_str().unwrap();
        all.push(dir);
        all.extend_from_slice(args);
        run_program(ALLOCATOR, Path::new("/"), &all, &Env(Vec::new()), b"")
    };
    let out = show(&[]);
    assert!(!out.status.success());
    assert!(
        out.stderr.contains(
            "several networks that run ipam-da-pool (pods, more): pick one with --network"
        ),
        "{}",
        out.stderr
    );
    let out = show(&["--network", "nope"]);
    assert!(
        out.stderr
            .contains("has no network \"nope\" that runs ipam-da-pool"),
        "{}",
        out.stderr
    );

    // The network's lock held (util-linux's flock), as by an ADD in
    // progress: show does not wait for it.
    let network_dir = data.path().join("pods");
    let mut holder = std::process::Command::new("flock")
        .arg(&network_dir)
        .args(["sleep", "60"])
        .spawn()
        .expect("flock (util-linux) runs");
    let is_held = || {
        let tried = std::process::Command::new("flock")
            .args(["--nonblock", "--conflict-exit-code", "9"])
            .arg(&network_dir)
            .arg("true")
            .status()
            .unwrap();
        tried.code() == Some(9)
    };
    while !is_held() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let started = Instant::now();
    let report = show(&["--network", "pods", "--json", "--addresses"]).json();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited for the lock"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    // .1 to .14, less the gateway, the excluded block of 4 and the reserved .2.
    assert_eq!(report["network"], "pods");
    let blue = &report["pools"][0];
    assert_eq!(
        (
            &blue["name"],
            &blue["size"],
            &blue["used"],
            &blue["free"],
            &blue["reserved"]
        ),
        (&json!("blue"), &json!(8), &json!(2), &json!(6), &json!(1))
    );
    assert_eq!(blue["nodes"], json!({"node-a": 2}));
    let held: Vec<(&Value, &Value)> = blue["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (&a["address"], &a["containerID"]))
        .collect();
    assert_eq!(
        held,
        [
            (&json!("10.6.0.3"), &json!("c1")),
            (&json!("10.6.0.4"), &json!("c2"))
        ]
    );
    assert_eq!(
        report["pools"][1]["size"].as_f64(),
        Some(2f64.powi(80) - 2.0),
        "a /48, counted"
    );

    let text = show(&["--network=pods"]);
    assert!(String::from_utf8_lossy(&text.stdout)
        .contains("pool blue: size 8, used 2, free 6, reserved 1"));
    let gauges =
        String::from_utf8(show(&["--network", "more", "--format", "prometheus"]).stdout).unwrap();
    for line in gauges.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap();
        assert!(
            series.starts_with("ipam_da_pool_") && series.contains("{network=\"more\",pool=\""),
            "{line}"
        );
        value.parse::<f64>().unwrap();
    }
    // Both pools of its configuration, one of them unused there.
    assert!(
        gauges.contains("ipam_da_pool_used{network=\"more\",pool=\"green\"} 1\n"),
        "{gauges}"
    );
    assert!(
        gauges.contains("ipam_da_pool_free{network=\"more\",pool=\"blue\"} 8\n"),
        "{gauges}"
    );
    // A single file works too, and reading changed nothing.
    let single = run_program(
        ALLOCATOR,
        Path::new("/"),
        &[
            "show",
            "--config",
            configs.join("10-pods.conflist").to_str().unwrap(),
            "--json",
        ],
        &Env(Vec::new()),
        b"",
    );
    assert_eq!(single.json()["pools"][0]["used"], 2);
    assert_eq!(records(data.path(), "pods").0.len(), 2);
}

#[test]
fn release_gives_back_what_an_address_a_container_or_a_node_holds_and_nothing_else() {
    let data = temp_dir("pool-release");
    let file = data.path().join("pods.conflist");
    let on = |node: &str| {
        json!({"cniVersion": "1.0.0", "name": "pods", "ipam": {"type": "ipam-da-pool", "pool": {
            "dataDir": data.path(), "node": node, "default": "blue",
            "pools": {"blue": [{"subnet": "10.5.0.0/24"}]},
        }}})
        .to_string()
    };
    fs::write(&file, on("node-a")).unwrap();
    for (id, node) in [
        ("a1", "node-a"),
        ("a2", "node-a"),
        ("b1", "node-b"),
        ("b2", "node-b"),
    ] {
        run_alone(ALLOCATOR, "ADD", id, &on(node)).json();
    }
    let release = |args: &[&str]| {
        let mut all = vec!["release", "--config", file.to_str().unwrap()];
        all.extend_from_slice(args);
        run_program(ALLOCATOR, Path::new("/"), &all, &Env(Vec::new()), b"")
    };
    let held = || records(data.path(), "pods").1;
    let before = held();
    // Unknown address, container or node: exit 1, nothing changed.
    for unknown in [
        &["10.5.0.200"][..],
        &["--container", "zz"],
        &["--node", "node-z"],
    ] {
        let out = release(unknown);
        assert!(!out.status.success(), "{unknown:?}");
        assert!(out.stderr.contains("nothing released"), "{}", out.stderr);
    }
    let out = release(&["--node", "node-b", "--dry-run", "--json"]);
    assert_eq!(out.json()["wouldRelease"].as_array().unwrap().len(), 2);
    assert_eq!(held(), before, "a dry run changes nothing");

    let out = release(&["10.5.0.2"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "released 10.5.0.2 held by a1/eth0 on node node-a\n"
    );
    let out = release(&["--container", "a2", "--ifname", "eth0"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("released 10.5.0.3 held by a2/eth0"));
    let out = release(&["--node", "node-b", "--json"]);
    let report = out.json();
    let mut released: Vec<&str> = report["released"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["containerID"].as_str().unwrap())
        .collect();
    released.sort();
    assert_eq!(released, ["b1", "b2"]);
    assert_eq!(
        records(data.path(), "pods"),
        Default::default(),
        "records and attachments gone"
    );
    // A released attachment's DEL is a no-op, as for any DEL.
    run_alone(ALLOCATOR, "DEL", "a1", &on("node-a")).assert_silent_success();
}

#[test]
fn release_of_an_address_frees_a_record_check_says_nothing_will_free() {
    let data = temp_dir("pool-release-unlisted");
    let file = data.path().join("pods.conflist");
    let config =
        json!({"cniVersion": "1.0.0", "name": "pods", "ipam": {"type": "ipam-da-pool", "pool": {
            "dataDir": data.path(), "node": "node-a", "default": "blue",
            "pools": {"blue": [{"subnet": "10.5.0.0/24"}]},
        }}})
        .to_string();
    fs::write(&file, &config).unwrap();
    for id in ["c1", "c2"] {
        run_alone(ALLOCATOR, "ADD", id, &config).json();
    }
    // c1's attachment record lost, its address record left; and a record
    // that names no one.
    let network = data.path().join("pods");
    fs::remove_file(network.join("attachments/c1:eth0")).unwrap();
    fs::write(network.join("addresses/10.5.0.9"), "garbage").unwrap();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.splice(1..1, ["--config", file.to_str().unwrap()]);
        run_program(ALLOCATOR, Path::new("/"), &all, &Env(Vec::new()), b"")
    };
    let out = run(&["check"]);
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!out.status.success(), "{report}");
    assert!(
        report.contains("10.5.0.2 is held by c1/eth0 (node node-a), whose attachment record does not list it: no DEL will free it"),
        "{report}"
    );
    let held = || names(&network.join("addresses"));
    let before = held();

    let out = run(&["release", "10.5.0.2", "--dry-run"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "would release the record of 10.5.0.2, held by c1/eth0 on node node-a, which does not list it\n"
    );
    assert_eq!(held(), before, "a dry run changes nothing");
    let out = run(&["release", "10.5.0.2", "--json"]);
    assert_eq!(
        out.json()["released"],
        json!([{"containerID": "c1", "ifname": "eth0", "node": "node-a",
                "addresses": ["10.5.0.2"], "unlisted": true}])
    );
    let out = run(&["release", "10.5.0.9", "--dry-run", "--json"]);
    assert_eq!(
        out.json(),
        json!({"wouldRelease": [{"addresses": ["10.5.0.9"], "unlisted": true}]})
    );
    let out = run(&["release", "10.5.0.9"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "released the record of 10.5.0.9, which names no one\n"
    );
    // What is left is c2's, whole, and check finds nothing.
    let (attachments, addresses) = records(data.path(), "pods");
    assert_eq!(attachments, BTreeSet::from(["c2:eth0".to_owned()]));
    assert_eq!(addresses, BTreeSet::from(["blue/10.5.0.3".to_owned()]));
    let out = run(&["check"]);
    assert!(out.status.success(), "{out:?}");
    // An address whose attachment lists it is released with it, as before.
    let out = run(&["release", "10.5.0.3"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "released 10.5.0.3 held by c2/eth0 on node node-a\n"
    );
    let out = run(&["release", "10.5.0.3"]);
    assert!(!out.status.success());
    assert!(
        out.stderr.contains(
            "no attachment, hold or address record of network pods matches address 10.5.0.3"
        ),
        "{}",
        out.stderr
    );
}

#[test]
fn check_names_each_inconsistency_and_fails_only_then() {
    let data = temp_dir("pool-check");
    let file = data.path().join("pods.conflist");
    let config = |range_end: &str| {
        json!({"cniVersion": "1.0.0", "name": "pods", "ipam": {"type": "ipam-da-pool", "pool": {
            "dataDir": data.path(), "node": "node-a", "default": "blue",
            "pools": {"blue": [{"subnet": "10.5.0.0/24", "rangeEnd": range_end}]},
        }}})
        .to_string()
    };
    fs::write(&file, config("10.5.0.200")).unwrap();
    for id in ["c1", "c2", "c3"] {
        run_alone(ALLOCATOR, "ADD", id, &config("10.5.0.200")).json();
    }
    let check = |args: &[&str]| {
        let mut all = vec!["check", "--config", file.to_str().unwrap()];
        all.extend_from_slice(args);
        run_program(ALLOCATOR, Path::new("/"), &all, &Env(Vec::new()), b"")
    };
    let out = check(&[]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("3 attachment(s), 0 hold(s), 3 address record(s), 0 finding(s)"));

    // The range shrunk in the configuration below c3's address (.4); c2's
    // address record gone, as if its claim were cut short; a record that
    // is not ours; and a runtime that knows only c1 and c2.
    fs::write(&file, config("10.5.0.3")).unwrap();
    let addresses = data.path().join("pods/addresses");
    fs::remove_file(addresses.join("10.5.0.3")).unwrap();
    fs::write(addresses.join("10.5.0.9"), "garbage").unwrap();
    let valid = data.path().join("valid.json");
    fs::write(
        &valid,
        r#"[{"containerID": "c1", "ifname": "eth0"}, {"containerID": "c2", "ifname": "eth0"}]"#,
    )
    .unwrap();
    let out = check(&["--valid-attachments", valid.to_str().unwrap(), "--json"]);
    assert!(!out.status.success());
    let findings: Vec<String> = out.json()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_owned())
        .collect();
    // In the order the records are read: attachments by name, then addresses.
    assert_eq!(
        findings,
        [
            "c2/eth0 (node node-a) lists 10.5.0.3, which has no record: it could be given to another",
            "10.5.0.4 held by c3/eth0 (node node-a) is outside every range of pool \"blue\"",
            "the record of 10.5.0.9 is torn or not ipam-da-pool's: no DEL or GC can free it",
            "c3/eth0 (node node-a) is not among the valid attachments",
        ]
    );
    // A bad list is an error before anything is read.
    fs::write(&valid, r#"[{"containerID": "c1"}]"#).unwrap();
    let out = check(&["--valid-attachments", valid.to_str().unwrap()]);
    assert!(
        out.stderr
            .contains("has an entry that is not {\"containerID\", \"ifname\"}"),
        "{}",
        out.stderr
    );
}

/// A small pseudo-random sequence (xorshift), seeded from the clock and
/// printed, so that a failure can be replayed with STRESS_SEED.
struct Random(u64);

impl Random {
    fn new() -> Random {
        let seed = std::env::var("STRESS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .subsec_nanos() as u64
                    | 1
            });
        eprintln!("STRESS_SEED={seed}");
        Random(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn thirty_two_processes_at_once_never_hold_one_address_twice_and_leave_nothing() {
    let cycles: usize = std::env::var("STRESS_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50);
    let workers = 32;
    let stack = Stack::new().with_pool_plugins();
    let data = temp_dir("pool-stress");
    let holding = temp_dir("pool-stress-held");
    // 32 at once in a /27 (29 addresses): addresses go round and round,
    // and some ADDs find the pool exhausted.
    let input = pool_config(
        "stressnet",
        "1.1.0",
        json!({"default": [{"name": "small"}]}),
        json!({
            "dataDir": data.path(),
            "node": "node-a",
            "pools": {"small": [{"subnet": "10.250.0.0/27"}]},
        }),
    );
    let (given, exhausted) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let started = Instant::now();
    std::thread::scope(|scope| {
        for w in 0..workers {
            let (stack, input, holding) = (&stack, &input, holding.path());
            let (given, exhausted) = (&given, &exhausted);
            scope.spawn(move || {
                for i in 0..cycles {
                    let id = format!("w{w}-{i}");
                    let add = stack.env("ADD").set("CNI_CONTAINERID", &id);
                    let out = run_plugin(&add, input.as_bytes());
                    if !out.status.success() {
                        out.assert_error(110);
                        exhausted.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    given.fetch_add(1, Ordering::Relaxed);
                    let address = out.json()["ips"][0]["address"].as_str().unwrap().to_owned();
                    let with_prev = common::with_prev(input, &String::from_utf8_lossy(&out.stdout));
                    common::while_held(holding, &address, &id, || {
                        let check = stack.env("CHECK").set("CNI_CONTAINERID", &id);
                        run_plugin(&check, &with_prev).assert_silent_success();
                    });
                    let del = stack.env("DEL").set("CNI_CONTAINERID", &id);
                    run_plugin(&del, &with_prev).assert_silent_success();
                }
            });
        }
    });
    let (given, exhausted) = (given.into_inner(), exhausted.into_inner());
    eprintln!(
        "{workers} processes at once: {given} ADDs given and DELs, {exhausted} found the pool exhausted, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        given >= workers * cycles / 2,
        "most ADDs get an address: {given}"
    );
    assert_eq!(records(data.path(), "stressnet"), Default::default());
    // The hint, where the next look starts, is all that is left.
    // Records are links: anything but a directory counts.
    let leftovers: Vec<_> = walk(data.path())
        .into_iter()
        .filter(|p| fs::symlink_metadata(p).is_ok_and(|m| !m.is_dir()))
        .collect();
    assert_eq!(
        leftovers,
        [data.path().join("stressnet/hints/small")],
        "no record or temporary file is left"
    );
}

/// Every path under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(walk(&path));
        }
        found.push(path);
    }
    found
}

#[test]
fn allocators_killed_at_random_instants_leave_no_unowned_reservation() {
    let kills: usize = std::env::var("STRESS_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let data = temp_dir("pool-kill");
    let input = json!({
        "cniVersion": "1.0.0",
        "name": "killnet",
        "ipam": {"type": "ipam-da-pool", "pool": {
            "dataDir": data.path(), "node": "node-a", "default": ["blue", "blue6"],
            "pools": {"blue": [{"subnet": "10.251.0.0/24"}], "blue6": [{"subnet": "fd00:251::/64"}]},
        }},
    })
    .to_string();
    let mut random = Random::new();
    let mut finished = 0;
    for i in 0..kills {
        // ADDs, and now and then the DEL of an earlier one.
        let (command, id) = match random.below(4) {
            0 if i > 0 => ("DEL", format!("k{}", random.below(i as u64))),
            _ => ("ADD", format!("k{i}")),
        };
        let mut child = spawn_program(
            ALLOCATOR,
            Path::new("/"),
            &[],
            &alone(command, &id),
            Stdio::null(),
        );
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        std::thread::sleep(Duration::from_micros(random.below(4000)));
        let _ = child.kill();
        if child.wait().unwrap().success() {
            finished += 1;
        }
    }
    let (attachments, addresses) = records(data.path(), "killnet");
    eprintln!(
        "{kills} allocators killed at random: {finished} had finished; {} attachments and {} addresses recorded",
        attachments.len(),
        addresses.len()
    );
    let network = data.path().join("killnet");
    for address in &addresses {
        let (_, file) = address.split_once('/').unwrap();
        let record = json_of(&network.join("addresses").join(file));
        let attachment = format!(
            "{}:{}",
            record["containerID"].as_str().unwrap(),
            record["ifname"].as_str().unwrap()
        );
        assert!(
            attachments.contains(&attachment),
            "{address} is held by {attachment}, which has no record"
        );
        let lists = json_of(&network.join("attachments").join(&attachment))["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .any(|held| {
                format!(
                    "{}/{}",
                    held["pool"].as_str().unwrap(),
                    held["address"].as_str().unwrap()
                ) == *address
            });
        assert!(lists, "{attachment}'s record does not list {address}");
    }
    // An ADD repeated for an attachment whose claim was cut short gives
    // back what it got and claims again: every address it answers with
    // is its own.
    let mut given = BTreeSet::new();
    for attachment in &attachments {
        let id = attachment.split(':').next().unwrap();
        let add = run_alone(ALLOCATOR, "ADD", id, &input);
        for ip in add.json()["ips"].as_array().unwrap() {
            let address = ip["address"].as_str().unwrap().to_owned();
            assert!(given.insert(address.clone()), "{address} answered twice");
            let file = address.split('/').next().unwrap();
            let record = json_of(&network.join("addresses").join(file));
            assert_eq!(record["containerID"], id, "{address}");
        }
    }
    // Every attachment found by DEL: nothing is left.
    for attachment in &attachments {
        let id = attachment.split(':').next().unwrap();
        let del = run_alone(ALLOCATOR, "DEL", id, &input);
        del.assert_silent_success();
    }
    assert_eq!(records(data.path(), "killnet"), Default::default());
}

#[test]
fn teardown_makes_nothing_and_survives_a_broken_pool() {
    let data = temp_dir("pool-teardown");
    let missing = data.path().join("never-made");
    let input = |pools: Value| {
        json!({
            "cniVersion": "1.1.0",
            "name": "gone",
            "ipam": {"type": "ipam-da-pool", "pool": {"dataDir": missing, "node": "a", "default": "blue", "pools": pools}},
            "cni.dev/valid-attachments": [],
            "prevResult": {"cniVersion": "1.1.0", "ips": [{"address": "10.4.0.2/24"}]},
        })
        .to_string()
    };
    let good = input(json!({"blue": [{"subnet": "10.4.0.0/24"}]}));
    // A pool an operator broke after the ADD: DEL and GC still work.
    let broken = input(json!({"blue": [{"subnet": "10.4.0.1/24"}]}));
    let run = |command: &str, input: &str| run_alone(ALLOCATOR, command, "c", input);
    for input in [&good, &broken] {
        run("DEL", input).assert_silent_success();
        run("GC", input).assert_silent_success();
    }
    run("STATUS", &good).assert_silent_success();
    let e = run("CHECK", &good).assert_error(112);
    assert!(
        e["msg"].as_str().unwrap().contains("holds no address"),
        "{e}"
    );
    assert!(!missing.exists(), "no data directory made");
    run("ADD", &broken).assert_error(7);
    // A dataDir that cannot be opened is an error naming it, never taken
    // for one with nothing in it: the records there would be left behind.
    let file = data.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let on_file = good.replace(missing.to_str().unwrap(), file.to_str().unwrap());
    for command in ["DEL", "GC"] {
        let out = run(command, &on_file);
        assert!(!out.status.success(), "{command}: {out:?}");
        let e = out.json();
        assert!(
            e["msg"].as_str().unwrap().contains(file.to_str().unwrap()),
            "{command}: {e}"
        );
    }
}

#[test]
fn import_holds_the_local_stores_lock_for_one_short_step_only() {
    // An etcd that takes the connection and never answers: the import's
    // claims wait there for its timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let data = temp_dir("import-lock");
    let settings = |store: Value| {
        let mut pool = json!({"node": "node-a", "default": "p", "pools": {"p": [{"subnet": "10.253.0.0/28"}]}});
        for (key, value) in store.as_object().unwrap() {
            pool[key] = value.clone();
        }
        json!({"cniVersion": "1.0.0", "name": "moving", "ipam": {"type": "ipam-da-pool", "pool": pool}})
            .to_string()
    };
    let local = settings(json!({"dataDir": data.path()}));
    let port = silent.local_addr().unwrap().port();
    let on_etcd =
        settings(json!({"etcd": {"endpoints": [format!("127.0.0.1:{port}")], "timeout": 4}}));
    let cni = |command: &str, id: &str| {
        let env = Env(vec![
            ("CNI_COMMAND".into(), command.into()),
            ("CNI_CONTAINERID".into(), id.into()),
            ("CNI_NETNS".into(), "/var/run/netns/import".into()),
            ("CNI_IFNAME".into(), "eth0".into()),
            ("CNI_PATH".into(), "/nonexistent".into()),
        ]);
        run_program(ALLOCATOR, Path::new("/"), &[], &env, local.as_bytes())
    };
    for id in ["a", "b"] {
        assert!(cni("ADD", id).status.success());
    }
    let file = data.path().join("moving.conf");
    fs::write(&file, &on_etcd).unwrap();
    let mut import = spawn_program(
        ALLOCATOR,
        Path::new("/"),
        &[
            "import",
            "--config",
            file.to_str().unwrap(),
            "--from",
            data.path().to_str().unwrap(),
        ],
        &Env(Vec::new()),
        Stdio::piped(),
    );
    let marker = data.path().join("moving/moved");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "import never marked the store");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The import waits on etcd; a DEL on the node does not wait for it.
    let started = Instant::now();
    cni("DEL", "a").assert_silent_success();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(
        import.try_wait().unwrap().is_none(),
        "the import is still waiting on etcd"
    );
    let out = import.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("code 11"),
        "{out:?}"
    );
    drop(silent);
}

#[test]
fn a_hostile_umask_never_opens_the_allocators_directories() {
    let dir = temp_dir("umask");
    let data = dir.path().join("a/b/data");
    let named = dir.path().join("n/x/node-name");
    let config =
        json!({"cniVersion": "1.0.0", "name": "pods", "ipam": {"type": "ipam-da-pool", "pool": {
            "dataDir": data, "nodeNameFile": named, "default": "blue",
            "pools": {"blue": [{"subnet": "10.5.0.0/24"}]},
        }}})
        .to_string();
    for (umask, id) in [("000", "c1"), ("077", "c2")] {
        let out =
            common::run_under_umask(umask, ALLOCATOR, &[], &alone("ADD", id), config.as_bytes());
        out.json();
        // Its own directories private, those above them readable, none
        // writable by others, whatever the umask.
        for (path, mode) in [
            (dir.path().join("a"), 0o755),
            (dir.path().join("a/b"), 0o755),
            (data.clone(), 0o700),
            (data.join("pods"), 0o700),
            (data.join("pods/addresses"), 0o700),
            (dir.path().join("n"), 0o755),
            (dir.path().join("n/x"), 0o700),
        ] {
            assert_eq!(
                common::mode_of(&path),
                mode,
                "umask {umask}: {}",
                path.display()
            );
        }
        fs::remove_dir_all(dir.path().join("a")).unwrap();
        fs::remove_dir_all(dir.path().join("n")).unwrap();
    }
}

#[test]
#[ignore = "needs strace"]
fn a_durable_del_reaches_the_disk_before_it_answers() {
    let data = temp_dir("durable-del");
    let config =
        json!({"cniVersion": "1.0.0", "name": "pods", "ipam": {"type": "ipam-da-pool", "pool": {
            "dataDir": data.path(), "node": "node-a", "default": "blue",
            "pools": {"blue": [{"subnet": "10.5.0.0/24"}]},
        }}})
        .to_string();
    let log = data.path().join("strace");
    // The system calls of a DEL: each removal, then whether the directory
    // was synced after the last one.
    let del = |args: &str| {
        let env = alone("DEL", "c1").set("CNI_ARGS", args);
        let out = run_program(
            "/usr/bin/strace",
            Path::new("/"),
            &[
                "-qq",
                "-o",
                log.to_str().unwrap(),
                "-e",
                "trace=unlinkat,fsync",
                ALLOCATOR,
            ],
            &env,
            config.as_bytes(),
        );
        out.assert_silent_success();
        let calls = fs::read_to_string(&log).unwrap();
        let last_removal = calls.rfind("unlinkat(").expect("records removed");
        calls[last_removal..].contains("fsync(")
    };
    for (args, synced) in [("IgnoreUnknown=1;DURABLE=true", true), ("", false)] {
        let env = alone("ADD", "c1").set("CNI_ARGS", "IgnoreUnknown=1;DURABLE=true");
        run_program(ALLOCATOR, Path::new("/"), &[], &env, config.as_bytes()).json();
        assert_eq!(del(args), synced, "CNI_ARGS {args:?}");
        assert_eq!(records(data.path(), "pods"), Default::default());
    }
}
