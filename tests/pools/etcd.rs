//! ipam-da-pool on etcd: Debian's etcd-server, run by each test as a
//! cluster of its own on loopback (fresh ports and data, stopped at the
//! end). Nodes share pools without ever holding one address twice, through
//! a member's crash; a cluster that cannot answer is "try again later"
//! with nothing written; GC stays on its node, and one whose plugin was
//! killed frees nothing after; a DEL frees no address another holds; TLS
//! with client
//! certificates; pools defined in etcd. The stress figures are printed on
//! stderr.
//!
//! Ignored unless asked for with --include-ignored (./.ci/test installs
//! etcd-server, openssl and faketime, and does).

use crate::common;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::etcd::{Certificates, Cluster};
use crate::common::{run_plugin, run_program, temp_dir, Env, Stack, ALLOCATOR};
use crate::local::{alone, run_alone};
use crate::operating;
use serde_json::{json, Value};

/// The key prefix every test uses; each cluster is its own.
const PREFIX: &str = "/ipamd-test";

/// A configuration of network `name` whose stack is the selector, then
/// the allocator on `cluster`, as node `node`; pool "shared" is
/// 10.252.0.0/26 unless `pool` changes the allocator's settings.
fn config(name: &str, version: &str, cluster: &Cluster, node: &str, pool: Value) -> String {
    let mut settings = json!({
        "etcd": {"endpoints": cluster.endpoints(), "prefix": PREFIX, "timeout": 5},
        "dataDir": cluster.notes(),
        "node": node,
        "pools": {"shared": [{"subnet": "10.252.0.0/26"}]},
    });
    for (key, value) in pool.as_object().unwrap() {
        settings[key] = value.clone();
    }
    common::pool_config(
        name,
        version,
        json!({"default": [{"name": "shared"}]}),
        settings,
    )
}

/// Network `name`'s attachment and address keys, short: `attachments/ID:IF`
/// (under whichever node) and `addresses/POOL/ADDRESS`, in order.
fn records(cluster: &Cluster, name: &str) -> Vec<String> {
    let network = format!("{PREFIX}/networks/{name}/");
    let mut found: Vec<String> = cluster
        .keys(&network)
        .into_iter()
        .map(|key| {
            let rest = &key[network.len()..];
            match rest.strip_prefix("nodes/").and_then(|r| r.split_once('/')) {
                Some((_, attachment)) => attachment.to_owned(),
                None => rest.to_owned(),
            }
        })
        .filter(|key| !key.starts_with("hints/") && key != "layout")
        .collect();
    found.sort();
    found
}

#[test]
#[ignore = "needs etcd-server"]
fn nodes_share_a_pool_through_a_leaders_crash_without_duplicates_or_leaks() {
    let cycles: usize = std::env::var("STRESS_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(16);
    let (nodes, per_node) = (4, 8);
    let mut cluster = Cluster::start(3, None);
    let stack = Stack::new().with_pool_plugins();
    let holding = temp_dir("etcd-held");
    // 32 processes at once on a loaded machine may wait out an election
    // longer than the usual 5 s: this is a test of duplicates and leaks
    // through the crash, not of the election's speed.
    let patient = json!({"etcd": {"endpoints": cluster.endpoints(), "prefix": PREFIX, "timeout": 20},
               "dataDir": cluster.notes()});
    let inputs: Vec<String> = (0..nodes)
        .map(|n| {
            config(
                "shared",
                "1.1.0",
                &cluster,
                &format!("node-{n}"),
                patient.clone(),
            )
        })
        .collect();
    let total = nodes * per_node * cycles;
    let (given, failed, slowest) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let started = Instant::now();
    let mut killed = None;
    std::thread::scope(|scope| {
        for w in 0..nodes * per_node {
            let (stack, input, holding) = (&stack, &inputs[w % nodes], holding.path());
            let (given, failed, slowest) = (&given, &failed, &slowest);
            scope.spawn(move || {
                for i in 0..cycles {
                    let id = format!("w{w}-{i}");
                    let asked = Instant::now();
                    let out = run_plugin(
                        &stack.env("ADD").set("CNI_CONTAINERID", &id),
                        input.as_bytes(),
                    );
                    let took = asked.elapsed().as_millis() as usize;
                    slowest.fetch_max(took, Ordering::Relaxed);
                    if !out.status.success() {
                        failed.fetch_add(1, Ordering::Relaxed);
                        panic!(
                            "ADD {id} failed: {}\n{}",
                            String::from_utf8_lossy(&out.stdout),
                            out.stderr
                        );
                    }
                    given.fetch_add(1, Ordering::Relaxed);
                    let address = out.json()["ips"][0]["address"].as_str().unwrap().to_owned();
                    let with_prev = common::with_prev(input, &String::from_utf8_lossy(&out.stdout));
                    common::while_held(holding, &address, &id, || {
                        let check = stack.env("CHECK").set("CNI_CONTAINERID", &id);
                        run_plugin(&check, &with_prev).assert_silent_success();
                    });
                    let del = run_plugin(&stack.env("DEL").set("CNI_CONTAINERID", &id), &with_prev);
                    del.assert_silent_success();
                }
            });
        }
        // A third of the way in, the leader crashes.
        while given.load(Ordering::Relaxed) < total / 3 && failed.load(Ordering::Relaxed) == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        let leader = cluster.leader();
        cluster.kill(leader);
        killed = Some((leader, started.elapsed()));
    });
    let took = started.elapsed();
    let (leader, at) = killed.unwrap();
    eprintln!(
        "{nodes} nodes x {per_node} processes: {total} ADD, CHECK and DEL cycles in {:.1} s ({:.0} ms a cycle, 32 at once); leader m{leader} killed at {:.1} s; slowest ADD {} ms",
        took.as_secs_f64(),
        took.as_secs_f64() * 1000.0 / cycles as f64,
        at.as_secs_f64(),
        slowest.into_inner()
    );
    assert_eq!(given.into_inner(), total);
    assert_eq!(
        records(&cluster, "shared"),
        Vec::<String>::new(),
        "nothing is left"
    );
}

#[test]
#[ignore = "needs etcd-server"]
fn a_cluster_without_quorum_or_down_is_try_again_later_and_nothing_is_written() {
    let mut cluster = Cluster::start(3, None);
    let stack = Stack::new().with_pool_plugins();
    let input = config("quorum", "1.0.0", &cluster, "node-a", json!({}));
    let input = input.replace("\"timeout\":5", "\"timeout\":1.5");
    let add = |id: &str| {
        run_plugin(
            &stack.env("ADD").set("CNI_CONTAINERID", id),
            input.as_bytes(),
        )
    };
    add("c1").json();
    let held = records(&cluster, "quorum");
    assert_eq!(held, ["addresses/010.252.000.002", "attachments/c1:eth0"]);
    let status_input = input.replace("\"cniVersion\":\"1.0.0\"", "\"cniVersion\":\"1.1.0\"");
    let status = || run_plugin(&stack.env("STATUS"), status_input.as_bytes());
    status().assert_silent_success();

    // The leader and one follower gone: the last member has no quorum.
    let leader = cluster.leader();
    cluster.kill(leader);
    let follower = (leader + 1) % 3;
    cluster.kill(follower);
    let started = Instant::now();
    let out = add("c2");
    let e = out.assert_error(11);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by the timeout"
    );
    assert!(out.stderr.contains("ipam-da-pool (ADD)"), "{}", out.stderr);
    assert!(e["msg"].as_str().unwrap().contains("etcd"), "{e}");

    // Every member down.
    let last = (leader + 2) % 3;
    cluster.kill(last);
    add("c3").assert_error(11);
    let e = status().assert_error(50);
    assert!(e["msg"].as_str().unwrap().contains("etcd"), "{e}");
    // DEL cannot give back either: the runtime is told to try again.
    run_plugin(
        &stack.env("DEL").set("CNI_CONTAINERID", "c1"),
        input.as_bytes(),
    )
    .assert_error(11);

    cluster.restart(&[leader, follower, last]);
    assert_eq!(records(&cluster, "quorum"), held, "nothing half-written");
    assert_eq!(add("c2").json()["ips"][0]["address"], "10.252.0.3/26");
}

#[test]
#[ignore = "needs etcd-server"]
fn an_add_while_the_cluster_restarts_waits_for_it_within_the_timeout() {
    let mut cluster = Cluster::start(1, None);
    let stack = Stack::new().with_pool_plugins();
    let input = config("restarting", "1.0.0", &cluster, "node-a", json!({}));
    cluster.kill(0);
    let env = stack.env("ADD").set("CNI_CONTAINERID", "c1");
    let add = std::thread::spawn(move || run_plugin(&env, input.as_bytes()));
    // Refused at once, round after round, until the member is back: a
    // restart shorter than the timeout (5 s) is not the runtime's trouble.
    std::thread::sleep(Duration::from_millis(500));
    cluster.restart(&[0]);
    let result = add.join().unwrap().json();
    assert_eq!(result["ips"][0]["address"], "10.252.0.2/26");
    assert_eq!(
        records(&cluster, "restarting"),
        ["addresses/010.252.000.002", "attachments/c1:eth0"]
    );
}

/// Whether process `pid` has ended (gone, or a zombie nobody reaped).
fn ended(pid: &str) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's name, which is in parentheses.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => true,
    }
}

#[test]
#[ignore = "needs etcd-server and faketime"]
fn a_gc_whose_plugin_was_killed_does_not_free_the_runtimes_next_add() {
    // The runtime gives up on a GC and kills ipam-delegated alone
    // (SIGKILL). Its ipam-da-pool, waiting on a wedged member, must not
    // wake later and judge the runtime's next ADD by the old list. The
    // GC's clock is an hour ahead, so that an orphan would find that ADD
    // old enough whatever second it was made in (in life: the same one).
    let cluster = Cluster::start(3, None);
    let stack = Stack::new().with_pool_plugins();
    let endpoints = cluster.endpoints();
    let on = |members: &[String]| {
        let mut config: Value = serde_json::from_str(&config(
            "killedgc",
            "1.1.0",
            &cluster,
            "node-a",
            json!({"gcGraceSeconds": 0}),
        ))
        .unwrap();
        config["ipam"]["pool"]["etcd"]["endpoints"] = json!(members);
        config
    };
    cluster.freeze(0);
    let mut gc = on(&endpoints[..1]);
    gc["cni.dev/valid-attachments"] = json!([]);
    let gc = common::with_state_dir(&stack, &gc.to_string());
    let ahead = stack
        .env("GC")
        .set("LD_PRELOAD", &common::libfaketime().display().to_string())
        .set("FAKETIME", "+1h");
    let mut plugin = common::start_plugin(&ahead, gc.as_bytes(), std::process::Stdio::null());
    // The allocator started, and its first request sent to the wedged member.
    let children = format!("/proc/{0}/task/{0}/children", plugin.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    let allocator = loop {
        let listed = fs::read_to_string(&children).unwrap_or_default();
        if let Some(pid) = listed.split_whitespace().next() {
            let name = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if name.trim() == "ipam-da-pool" {
                break pid.to_owned();
            }
        }
        assert!(
            Instant::now() < deadline,
            "the GC never reached ipam-da-pool"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    std::thread::sleep(Duration::from_millis(500));
    plugin.kill().unwrap();
    plugin.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while !ended(&allocator) {
        assert!(Instant::now() < deadline, "the GC's ipam-da-pool ran on");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The runtime goes on, through the other members.
    let add = on(&endpoints[1..]).to_string();
    let result = run_plugin(
        &stack.env("ADD").set("CNI_CONTAINERID", "c2"),
        add.as_bytes(),
    )
    .json();
    assert_eq!(result["ips"][0]["address"], "10.252.0.2/26");
    cluster.thaw(0);
    // Long enough for an orphan to have read the store and freed it.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        records(&cluster, "killedgc"),
        ["addresses/010.252.000.002", "attachments/c2:eth0"]
    );
}

#[test]
#[ignore = "needs etcd-server"]
fn show_check_and_release_on_etcd_every_nodes_records() {
    let mut cluster = Cluster::start(1, None);
    cluster.put(
        &format!("{PREFIX}/pools/central"),
        r#"[{"subnet": "10.251.0.0/24"}]"#,
    );
    let stack = Stack::new().with_pool_plugins();
    for (id, node) in [("a1", "node-a"), ("a2", "node-a"), ("b1", "node-b")] {
        run_plugin(
            &stack.env("ADD").set("CNI_CONTAINERID", id),
            config("shownet", "1.0.0", &cluster, node, json!({})).as_bytes(),
        )
        .json();
    }
    // One address of a pool that only etcd defines, as another network's
    // selector could pick it.
    let mut central: Value =
        serde_json::from_str(&config("shownet", "1.0.0", &cluster, "node-b", json!({}))).unwrap();
    central["ipam"]["static"] = json!({"default": [{"name": "central"}]});
    run_plugin(
        &stack.env("ADD").set("CNI_CONTAINERID", "b2"),
        central.to_string().as_bytes(),
    )
    .json();
    let dir = temp_dir("etcd-show");
    let file = dir.path().join("shownet.conflist");
    std::fs::write(
        &file,
        config("shownet", "1.0.0", &cluster, "node-c", json!({})),
    )
    .unwrap();
    let out = run_program(
        ALLOCATOR,
        Path::new("/"),
        &["show", "--config", file.to_str().unwrap(), "--json"],
        &Env(Vec::new()),
        b"",
    );
    let report = out.json();
    assert_eq!(
        report["pools"],
        json!([
            {"name": "shared", "size": 61, "used": 3, "free": 58, "reserved": 0, "sticky": 0, "cooling": 0, "nodes": {"node-a": 2, "node-b": 1}},
            {"name": "central", "size": 253, "used": 1, "free": 252, "reserved": 0, "sticky": 0, "cooling": 0, "nodes": {"node-b": 1}},
        ])
    );
    // Every node's records agree with each other: check finds nothing.
    let out = run_program(
        ALLOCATOR,
        Path::new("/"),
        &["check", "--config", file.to_str().unwrap(), "--json"],
        &Env(Vec::new()),
        b"",
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.json()["findings"], json!([]));
    // A record put there by hand, of no attachment: named.
    cluster.put(
        &format!("{PREFIX}/networks/shownet/addresses/010.252.000.060"),
        "{}",
    );
    let out = run_program(
        ALLOCATOR,
        Path::new("/"),
        &["check", "--config", file.to_str().unwrap(), "--json"],
        &Env(Vec::new()),
        b"",
    );
    assert!(!out.status.success());
    assert_eq!(
        out.json()["findings"],
        json!([
            "the record of 10.252.0.60 is torn or not ipam-da-pool's: no DEL or GC can free it"
        ])
    );
    // A node decommissioned: what it held is released, nothing else.
    let out = run_program(
        ALLOCATOR,
        Path::new("/"),
        &[
            "release",
            "--config",
            file.to_str().unwrap(),
            "--node",
            "node-b",
            "--json",
        ],
        &Env(Vec::new()),
        b"",
    );
    let mut released: Vec<String> = out.json()["released"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["containerID"].as_str().unwrap().to_owned())
        .collect();
    released.sort();
    assert_eq!(released, ["b1", "b2"]);
    let left: Vec<String> = records(&cluster, "shownet")
        .into_iter()
        .filter(|k| k.starts_with("attachments/"))
        .collect();
    assert_eq!(left, ["attachments/a1:eth0", "attachments/a2:eth0"]);
    assert_eq!(
        records(&cluster, "shownet").len(),
        5,
        "their addresses, and the stray record"
    );
    // What check says nothing will free, release frees by address: the
    // stray record, and a record whose attachment is gone.
    let release = |address: &str| {
        let file = file.to_str().unwrap();
        run_program(
            ALLOCATOR,
            Path::new("/"),
            &["release", "--config", file, address],
            &Env(Vec::new()),
            b"",
        )
    };
    let out = release("10.252.0.60");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "released the record of 10.252.0.60, which names no one\n"
    );
    let network = format!("{PREFIX}/networks/shownet/");
    let (a1, record) = cluster
        .values(&network)
        .into_iter()
        .find(|(k, _)| k.ends_with("/a1:eth0"))
        .unwrap();
    let address = serde_json::from_str::<Value>(&record).unwrap()["addresses"][0]["address"]
        .as_str()
        .unwrap()
        .to_owned();
    cluster.etcdctl(&["del", &a1]);
    let out = release(&address);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("released the record of {address}, held by a1/eth0 on node node-a, which does not list it\n")
    );
    let left = records(&cluster, "shownet");
    assert_eq!(left.len(), 2, "a2's attachment and address: {left:?}");
    assert!(left.contains(&"attachments/a2:eth0".to_owned()), "{left:?}");
    // An unreachable cluster is an error, and says so.
    cluster.kill(0);
    let out = run_program(
        ALLOCATOR,
        Path::new("/"),
        &["show", "--config", file.to_str().unwrap()],
        &Env(Vec::new()),
        b"",
    );
    assert!(!out.status.success());
    assert!(out.stderr.contains("(code 11)"), "{}", out.stderr);
}

#[test]
#[ignore = "needs etcd-server"]
fn gc_on_one_node_releases_only_that_nodes_stale_reservations() {
    let cluster = Cluster::start(1, None);
    let stack = Stack::new().with_pool_plugins();
    let on = |node: &str| {
        config(
            "gcnet",
            "1.1.0",
            &cluster,
            node,
            json!({"gcGraceSeconds": 0}),
        )
    };
    for (id, node) in [
        ("a-kept", "node-a"),
        ("a-stale", "node-a"),
        ("b-stale", "node-b"),
    ] {
        run_plugin(
            &stack.env("ADD").set("CNI_CONTAINERID", id),
            on(node).as_bytes(),
        )
        .json();
    }
    let mut gc: Value = serde_json::from_str(&on("node-a")).unwrap();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "a-kept", "ifname": "eth0"}]);
    run_plugin(&stack.env("GC"), gc.to_string().as_bytes()).assert_silent_success();
    let attachments: Vec<String> = records(&cluster, "gcnet")
        .into_iter()
        .filter(|k| k.starts_with("attachments/"))
        .collect();
    assert_eq!(
        attachments,
        ["attachments/a-kept:eth0", "attachments/b-stale:eth0"]
    );
    assert_eq!(records(&cluster, "gcnet").len(), 4, "and their addresses");
}

#[test]
#[ignore = "needs etcd-server"]
fn a_del_never_frees_anothers_address_and_release_frees_an_unlisted_one() {
    // c1's attachment lists 10.70.0.2, whose record is gone (removed by
    // hand, or lost to a restore from an older backup) and then made
    // again by c2. c1's DEL takes back what names c1, nothing of c2's.
    let cluster = Cluster::start(1, None);
    let config = operating::pods(&operating::on_etcd(&cluster), "node-a", json!({}));
    assert_eq!(operating::add(&config, "c1", ""), "10.70.0.2");
    let addresses = format!("{}/networks/pods/addresses/", operating::PREFIX);
    cluster.etcdctl(&["del", &format!("{addresses}010.070.000.002")]);
    let asked = "IgnoreUnknown=1;IP=10.70.0.2";
    assert_eq!(operating::add(&config, "c2", asked), "10.70.0.2");
    // And a record of c1's that its attachment does not list (as a restore
    // could leave too): an operator frees it by address, c1 still there.
    let stray = json!({"containerID": "c1", "ifname": "eth0", "node": "node-a",
        "pool": "pods", "since": 1});
    cluster.put(&format!("{addresses}010.070.000.005"), &stray.to_string());
    let dir = temp_dir("etcd-del-other");
    let file = operating::config_file(dir.path(), "pods.conf", &config);
    let file = file.to_str().unwrap();
    let out = operating::operator(&["release", "--config", file, "10.70.0.5"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "released the record of 10.70.0.5, held by c1/eth0 on node node-a, which does not list it\n",
        "{out:?}"
    );
    operating::del(&config, "c1");
    let left = cluster.values(&addresses);
    assert_eq!(left.len(), 1, "{left:?}");
    let record: Value = serde_json::from_str(&left[0].1).unwrap();
    assert_eq!(record["containerID"], "c2", "{left:?}");
    let out = operating::operator(&["check", "--config", file]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
#[ignore = "needs etcd-server"]
fn pools_defined_in_etcd_with_their_reserved_addresses_are_used_and_reservations_say_who_holds_them(
) {
    let cluster = Cluster::start(1, None);
    cluster.put(
        &format!("{PREFIX}/pools/central"),
        // .1 reserved, .2 and .3 excluded: the first address given is .4.
        r#"{"ranges": [{"subnet": "10.253.0.0/24", "gateway": "10.253.0.254", "exclude": ["10.253.0.2/31"]}], "reserved": ["10.253.0.1"]}"#,
    );
    let stack = Stack::new().with_pool_plugins();
    let mut input: Value =
        serde_json::from_str(&config("central", "1.0.0", &cluster, "node-c", json!({}))).unwrap();
    input["ipam"]["static"] = json!({"default": [{"name": "central"}]});
    let input = input.to_string();
    let out = run_plugin(&stack.env("ADD"), input.as_bytes()).json();
    assert_eq!(
        out["ips"],
        json!([{"address": "10.253.0.4/24", "gateway": "10.253.0.254"}])
    );
    let values = cluster.values(&format!("{PREFIX}/networks/central/addresses/"));
    let record: Value = serde_json::from_str(&values[0].1).unwrap();
    assert_eq!(
        (&record["containerID"], &record["ifname"], &record["node"]),
        (&json!("ctr-0123"), &json!("eth0"), &json!("node-c"))
    );
    let prev = common::with_prev(&input, &out.to_string());
    run_plugin(&stack.env("CHECK"), &prev).assert_silent_success();
    run_plugin(&stack.env("DEL"), &prev).assert_silent_success();
    assert_eq!(records(&cluster, "central"), Vec::<String>::new());
}

#[test]
#[ignore = "needs etcd-server"]
fn a_look_whose_span_ends_on_a_reserved_address_reads_the_next_span_itself() {
    // In the first look (.1 to .16): .1 and .2 held, .3 reserved, .4 to
    // .7 excluded, .8 held. The first span ends on what the pool does not
    // give; the search must not run on past it into the next span, which
    // it has not read: .8 is held, and the first free address is .9.
    let cluster = Cluster::start(1, None);
    cluster.put(
        &format!("{PREFIX}/pools/central"),
        r#"{"ranges": [{"subnet": "10.253.0.0/24", "exclude": ["10.253.0.4/30"]}], "reserved": ["10.253.0.3"]}"#,
    );
    let addresses = format!("{PREFIX}/networks/central/addresses/");
    for held in ["001", "002", "008"] {
        let record = json!({"containerID": format!("other-{held}"), "ifname": "eth0",
            "node": "node-z", "pool": "central", "since": 1});
        cluster.put(
            &format!("{addresses}010.253.000.{held}"),
            &record.to_string(),
        );
    }
    let stack = Stack::new().with_pool_plugins();
    let mut input: Value =
        serde_json::from_str(&config("central", "1.0.0", &cluster, "node-c", json!({}))).unwrap();
    input["ipam"]["static"] = json!({"default": [{"name": "central"}]});
    let out = run_plugin(&stack.env("ADD"), input.to_string().as_bytes()).json();
    assert_eq!(out["ips"][0]["address"], "10.253.0.9/24", "{out}");
}

#[test]
#[ignore = "needs etcd-server"]
fn tls_with_client_certificates() {
    let certificates = Certificates::make();
    let cluster = Cluster::start(1, Some(&certificates));
    let stack = Stack::new().with_pool_plugins();
    let file = |name: &str| certificates.file(name).display().to_string();
    let with_tls = |tls: Value| {
        config("tlsnet", "1.0.0", &cluster, "node-a", json!({}))
            .replace("\"prefix\"", &format!("\"tls\":{tls},\"prefix\""))
    };
    let good = with_tls(
        json!({"ca": file("ca.pem"), "cert": file("client.pem"), "key": file("client.key")}),
    );
    let out = run_plugin(&stack.env("ADD"), good.as_bytes());
    assert_eq!(out.json()["ips"][0]["address"], "10.252.0.2/26", "{out:?}");

    let no_client = with_tls(json!({"ca": file("ca.pem")}));
    let out = run_plugin(
        &stack.env("ADD").set("CNI_CONTAINERID", "c2"),
        no_client.as_bytes(),
    );
    // Certificates to fix, not a cluster to wait for: not 11.
    let e = out.assert_error(5);
    let msg = e["msg"].as_str().unwrap();
    assert!(msg.contains("TLS with the etcd cluster failed"), "{e}");
    assert!(msg.contains("BadCertificate"), "{e}");

    let wrong_ca = with_tls(
        json!({"ca": file("other.pem"), "cert": file("client.pem"), "key": file("client.key")}),
    );
    let out = run_plugin(
        &stack.env("ADD").set("CNI_CONTAINERID", "c3"),
        wrong_ca.as_bytes(),
    );
    let e = out.assert_error(5);
    assert!(e["msg"].as_str().unwrap().contains("UnknownIssuer"), "{e}");

    let missing = with_tls(json!({"ca": "/nonexistent/ca.pem"}));
    let e = run_plugin(
        &stack.env("ADD").set("CNI_CONTAINERID", "c4"),
        missing.as_bytes(),
    )
    .assert_error(7);
    assert!(
        e["msg"].as_str().unwrap().contains("/nonexistent/ca.pem"),
        "{e}"
    );

    run_plugin(&stack.env("DEL"), good.as_bytes()).assert_silent_success();
}

#[test]
#[ignore = "needs etcd-server"]
fn a_scheme_the_cluster_does_not_speak_is_a_setting_to_fix() {
    let certificates = Certificates::make();
    let secure = Cluster::start(1, Some(&certificates));
    let plain = Cluster::start(1, None);
    let stack = Stack::new().with_pool_plugins();
    let file = |name: &str| certificates.file(name).display().to_string();
    let tls = json!({"ca": file("ca.pem"), "cert": file("client.pem"), "key": file("client.key")});
    // https:// to a member that speaks plain HTTP, and http:// to one
    // that speaks TLS: each is code 5 at once, naming the endpoint and
    // the likely cause, not code 11 after a wait.
    let cases = [
        (
            config("schemenet", "1.0.0", &plain, "node-a", json!({}))
                .replace("http://", "https://")
                .replace("\"prefix\"", &format!("\"tls\":{tls},\"prefix\"")),
            plain.endpoints()[0].replace("http://", ""),
            "speaks plain HTTP, not TLS: give it as http://",
        ),
        (
            config("schemenet", "1.0.0", &secure, "node-a", json!({}))
                .replace("https://", "http://"),
            secure.endpoints()[0].replace("https://", ""),
            "speaks TLS, not plain HTTP: give it as https://",
        ),
    ];
    for (input, endpoint, cause) in cases {
        let out = run_plugin(&stack.env("ADD"), input.as_bytes());
        let e = out.assert_error(5);
        let msg = e["msg"].as_str().unwrap();
        assert!(msg.contains(&endpoint), "{e}");
        assert!(msg.contains(cause), "{e}");
    }
}

/// The stdin a main plugin gives its IPAM plugin for the first plugin of
/// conflist `list`, as libcni derives it.
fn plugin_config(list: &Value) -> String {
    let mut plugin = list["plugins"][0].clone();
    plugin["cniVersion"] = list["cniVersion"].clone();
    plugin["name"] = list["name"].clone();
    plugin.to_string()
}

#[test]
#[ignore = "needs etcd-server"]
fn the_readmes_nomad_example_with_central_pools_and_tls() {
    let certificates = Certificates::make();
    let cluster = Cluster::start(1, Some(&certificates));
    let stack = Stack::new().with_pool_plugins();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/conflists/nomad-pools.conflist");
    let mut list: Value = serde_json::from_str(&fs::read_to_string(fixture).unwrap()).unwrap();
    // The node's notes and pinned name in the cluster's directory, not
    // the machine's that every test would share.
    let pool = &mut list["plugins"][0]["ipam"]["pool"];
    pool["dataDir"] = json!(cluster.notes());
    pool["nodeNameFile"] = json!(cluster.notes().join("node-name"));
    let etcd = &mut list["plugins"][0]["ipam"]["pool"]["etcd"];
    etcd["endpoints"] = json!(cluster.endpoints());
    etcd["tls"] = json!({
        "ca": certificates.file("ca.pem"),
        "cert": certificates.file("client.pem"),
        "key": certificates.file("client.key"),
    });
    // As the README has the operator put them, once for every node.
    cluster.put(
        "/ipam-da-pool/pools/services",
        r#"[{"subnet": "10.20.0.0/16", "rangeStart": "10.20.1.1", "rangeEnd": "10.20.199.254", "gateway": "10.20.0.1"}]"#,
    );
    cluster.put(
        "/ipam-da-pool/pools/billing",
        r#"[{"subnet": "10.20.0.0/16", "rangeStart": "10.20.200.1", "gateway": "10.20.0.1"}]"#,
    );
    let input = plugin_config(&list);
    let job = |namespace: &str, alloc: &str| {
        stack
            .env("ADD")
            .set("CNI_CONTAINERID", alloc)
            .set(
                "CNI_ARGS",
                &format!("IgnoreUnknown=1;NOMAD_REGION=global;NOMAD_NAMESPACE={namespace};NOMAD_JOB_ID=web;NOMAD_GROUP_NAME=web;NOMAD_ALLOC_ID={alloc}"),
            )
    };
    let billing = run_plugin(&job("billing", "alloc-1"), input.as_bytes()).json();
    assert_eq!(
        billing["ips"],
        json!([{"address": "10.20.200.1/16", "gateway": "10.20.0.1"}])
    );
    assert_eq!(billing["routes"], json!([{"dst": "0.0.0.0/0"}]));
    let default = run_plugin(&job("default", "alloc-2"), input.as_bytes()).json();
    assert_eq!(default["ips"][0]["address"], "10.20.1.1/16");
}

#[test]
#[ignore = "needs etcd-server"]
fn a_node_moves_its_reservations_from_the_local_store_to_etcd() {
    let cluster = Cluster::start(1, None);
    let data = temp_dir("import-data");
    let stack = Stack::new().with_pool_plugins();
    let pools = json!({"shared": [{"subnet": "10.252.0.0/26"}]});
    let on_etcd = config(
        "moving",
        "1.0.0",
        &cluster,
        "node-a",
        json!({"pools": pools}),
    );
    let mut local: Value = serde_json::from_str(&on_etcd).unwrap();
    local["ipam"]["pool"]
        .as_object_mut()
        .unwrap()
        .remove("etcd");
    local["ipam"]["pool"]["dataDir"] = json!(data.path());
    let local = local.to_string();
    let add = |id: &str, input: &str, args: &str| {
        let env = stack
            .env("ADD")
            .set("CNI_CONTAINERID", id)
            .set("CNI_ARGS", args);
        run_plugin(&env, input.as_bytes())
    };
    for id in ["a", "b", "c"] {
        add(id, &local, "").json();
    }
    // Another node already holds b's address (10.252.0.3) in etcd.
    let elsewhere = config(
        "moving",
        "1.0.0",
        &cluster,
        "node-b",
        json!({"pools": pools}),
    );
    add("x", &elsewhere, "IP=10.252.0.3").json();

    let file = data.path().join("moving.conflist");
    fs::write(&file, &on_etcd).unwrap();
    let import = || {
        let args = [
            "import",
            "--config",
            file.to_str().unwrap(),
            "--from",
            data.path().to_str().unwrap(),
        ];
        run_program(ALLOCATOR, Path::new("/"), &args, &Env(vec![]), b"")
    };
    let first = import();
    assert_eq!(first.status.code(), Some(1), "{first:?}");
    let text = String::from_utf8_lossy(&first.stdout).into_owned();
    assert_eq!(
        text,
        "imported a/eth0 (node node-a) shared/10.252.0.2\n\
         conflict b/eth0 (node node-a) shared/10.252.0.3: 10.252.0.3 is held there by x/eth0 on node node-b\n\
         imported c/eth0 (node node-a) shared/10.252.0.4\n\
         3 attachment(s) of network moving under "
            .to_owned()
            + &format!("{}; 1 conflict(s)\n", data.path().display())
    );
    // The local store gives no new address now: it would be missing from
    // etcd. The runtime is told to try again (on the new configuration).
    let refused = add("d", &local, "");
    let e = refused.assert_error(11);
    assert!(
        e["msg"].as_str().unwrap().contains("moved into etcd"),
        "{e}"
    );
    // On etcd now, a's ADD (a runtime's retry, say) finds what it held.
    assert_eq!(
        add("a", &on_etcd, "").json()["ips"][0]["address"],
        "10.252.0.2/26"
    );

    // The operator settles the conflict; the import, run again, finishes.
    let del = stack.env("DEL").set("CNI_CONTAINERID", "x");
    run_plugin(&del, elsewhere.as_bytes()).assert_silent_success();
    let second = import();
    assert!(second.status.success(), "{second:?}");
    let text = String::from_utf8_lossy(&second.stdout);
    assert!(
        text.contains("already there a/eth0") && text.contains("imported b/eth0"),
        "{text}"
    );
    let attachments: Vec<String> = records(&cluster, "moving")
        .into_iter()
        .filter(|k| k.starts_with("attachments/"))
        .collect();
    assert_eq!(
        attachments,
        [
            "attachments/a:eth0",
            "attachments/b:eth0",
            "attachments/c:eth0"
        ]
    );

    // Import copies into etcd only: said first, whatever `--from` holds.
    let local_file = data.path().join("local.conflist");
    fs::write(&local_file, &local).unwrap();
    let args = [
        "import",
        "--config",
        local_file.to_str().unwrap(),
        "--from",
        "/nonexistent",
    ];
    let refused = run_program(ALLOCATOR, Path::new("/"), &args, &Env(vec![]), b"");
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        refused.stderr.contains("must name an etcd cluster"),
        "{}",
        refused.stderr
    );
}

/// Runs the allocator alone as `ADD` for container `id` with `input`,
/// under strace, which writes what it traces to `log`: `inject` is a
/// fault on `sendto`, the system call that writes to etcd (see strace(1),
/// `-e inject`), if one is given.
fn add_under_strace(id: &str, input: &str, log: &Path, inject: Option<&str>) -> common::Outcome {
    let injected = inject.map(|fault| format!("inject=sendto:{fault}"));
    let mut args = vec!["-qq", "-o", log.to_str().unwrap(), "-e", "trace=sendto"];
    if let Some(injected) = &injected {
        args.extend(["-e", injected]);
    }
    args.push(ALLOCATOR);
    run_program(
        "/usr/bin/strace",
        Path::new("/"),
        &args,
        &alone("ADD", id),
        input.as_bytes(),
    )
}

#[test]
#[ignore = "needs etcd-server and strace"]
fn an_add_stalled_at_any_write_to_etcd_answers_its_claim_or_leaves_nothing() {
    let cluster = Cluster::start(1, None);
    let input = serde_json::to_string(&json!({
        "cniVersion": "1.0.0", "name": "stallnet",
        "ipam": {"type": "ipam-da-pool", "pool": {
            "etcd": {"endpoints": cluster.endpoints(), "prefix": PREFIX, "timeout": 1},
            "dataDir": cluster.notes(), "node": "node-a", "default": "p",
            "pools": {"p": [{"subnet": "10.253.0.0/24"}]},
        }},
    }))
    .unwrap();
    // How many writes to etcd an ADD makes, as strace counts them.
    let dir = temp_dir("stall");
    let counted = dir.path().join("sendto");
    add_under_strace("counted", &input, &counted, None).json();
    let writes = fs::read_to_string(&counted).unwrap().lines().count();
    assert!(writes >= 2, "{writes} writes");
    run_alone(ALLOCATOR, "DEL", "counted", &input).assert_silent_success();
    // Each write in turn stalls past the etcd timeout, as a frozen node's
    // allocator does: the ADD answers with what it claimed, or fails and
    // leaves nothing of its own.
    let quiet = Path::new("/dev/null");
    for n in 1..=writes {
        let id = format!("stalled-{n}");
        let fault = format!("delay_exit=1500000:when={n}");
        let out = add_under_strace(&id, &input, quiet, Some(&fault));
        let mine: Vec<String> = records(&cluster, "stallnet")
            .into_iter()
            .filter(|key| key.contains(&id))
            .collect();
        if out.status.success() {
            assert_eq!(
                mine,
                [format!("attachments/{id}:eth0")],
                "write {n}: {out:?}"
            );
        } else {
            let error = out.assert_error(11);
            assert_eq!(
                mine,
                Vec::<String>::new(),
                "write {n} left its claim: {error}"
            );
        }
        let left = records(&cluster, "stallnet");
        let addresses = left.iter().filter(|k| k.starts_with("addresses/")).count();
        let attachments = left
            .iter()
            .filter(|k| k.starts_with("attachments/"))
            .count();
        assert_eq!(addresses, attachments, "write {n}: {left:?}");
    }
}

#[test]
#[ignore = "needs etcd-server"]
fn an_ended_hold_gives_back_only_the_records_that_still_name_its_workload() {
    let cluster = Cluster::start(1, None);
    let config = operating::pods(
        &operating::on_etcd(&cluster),
        "node-a",
        operating::sticky("1s"),
    );
    let kept = operating::add(&config, "w1", &operating::pod("db/pg-0", None));
    operating::del(&config, "w1");
    // The workload's hold keeps the address, whose record is made
    // another's meanwhile (as a restore from an older backup leaves it).
    let octets: Vec<String> = kept.split('.').map(|o| format!("{o:0>3}")).collect();
    let key = format!(
        "{}/networks/pods/addresses/{}",
        operating::PREFIX,
        octets.join(".")
    );
    let another = json!({"containerID": "c9", "ifname": "eth0", "node": "node-b",
        "pool": "pods", "since": 1})
    .to_string();
    cluster.put(&key, &another);
    // Its time up, GC ends the hold: it gives back what names the
    // workload, and nothing of another's.
    std::thread::sleep(Duration::from_millis(2_100));
    let mut gc: Value = serde_json::from_str(&config).unwrap();
    gc["cni.dev/valid-attachments"] = json!([]);
    operating::cni("GC", &gc.to_string(), "", "").assert_silent_success();
    assert_eq!(operating::holders(&cluster), Vec::<String>::new());
    assert_eq!(cluster.values(&key), [(key.clone(), another)]);
}
