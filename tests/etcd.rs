//! ipam-da-pool on etcd: Debian's etcd-server, run by each test as a
//! cluster of its own on loopback (fresh ports and data, stopped at the
//! end). Nodes share pools without ever holding one address twice, through
//! a member's crash; a cluster that cannot answer is "try again later"
//! with nothing written; GC stays on its node; TLS with client
//! certificates; pools defined in etcd. The stress figures are printed on
//! stderr.
//!
//! Ignored unless asked for with --include-ignored (./.ci/test installs
//! etcd-server and openssl and does).

mod common;

use std::fs;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::etcd::{Certificates, Cluster};
use common::{run_plugin, temp_dir, Stack};
use serde_json::{json, Value};

/// The key prefix every test uses; each cluster is its own.
const PREFIX: &str = "/ipamd-test";

/// A configuration of network `name` whose stack is the selector, then
/// the allocator on `cluster`, as node `node`; pool "shared" is
/// 10.252.0.0/26 unless `pool` changes the allocator's settings.
fn config(name: &str, version: &str, cluster: &Cluster, node: &str, pool: Value) -> String {
    let mut settings = json!({
        "etcd": {"endpoints": cluster.endpoints(), "prefix": PREFIX, "timeout": 5},
        "node": node,
        "pools": {"shared": [{"subnet": "10.252.0.0/26"}]},
    });
    for (key, value) in pool.as_object().unwrap() {
        settings[key] = value.clone();
    }
    json!({
        "cniVersion": version,
        "name": name,
        "type": "bridge",
        "ipam": {
            "type": "ipam-delegated",
            "delegates": ["ipam-ds-static", "ipam-da-pool"],
            "static": {"default": [{"name": "shared"}]},
            "pool": settings,
        },
    })
    .to_string()
}

/// Network `name`'s attachment and address keys, short: `attachments/ID:IF`
/// and `addresses/POOL/ADDRESS`.
fn records(cluster: &Cluster, name: &str) -> Vec<String> {
    let network = format!("{PREFIX}/networks/{name}/");
    cluster
        .keys(&network)
        .into_iter()
        .map(|key| key[network.len()..].to_owned())
        .filter(|key| !key.starts_with("hints/"))
        .collect()
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
    let inputs: Vec<String> = (0..nodes)
        .map(|n| config("shared", "1.1.0", &cluster, &format!("node-{n}"), json!({})))
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
                    let marker = holding.join(address.replace('/', "_"));
                    let made = fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&marker);
                    assert!(
                        made.is_ok(),
                        "{address} given to {id} while another holds it"
                    );
                    fs::remove_file(&marker).unwrap();
                    let del = run_plugin(
                        &stack.env("DEL").set("CNI_CONTAINERID", &id),
                        input.as_bytes(),
                    );
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
        "{nodes} nodes x {per_node} processes: {total} ADDs and DELs in {:.1} s ({:.0} ms per ADD or DEL, 32 at once); leader m{leader} killed at {:.1} s; slowest ADD {} ms",
        took.as_secs_f64(),
        took.as_secs_f64() * 1000.0 / (2 * total) as f64 * (nodes * per_node) as f64,
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
    assert_eq!(
        held,
        ["addresses/shared/010.252.000.002", "attachments/c1:eth0"]
    );

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
fn pools_defined_in_etcd_are_used_and_reservations_say_who_holds_them() {
    let cluster = Cluster::start(1, None);
    cluster.put(
        &format!("{PREFIX}/pools/central"),
        r#"[{"subnet": "10.253.0.0/24", "gateway": "10.253.0.254"}]"#,
    );
    let stack = Stack::new().with_pool_plugins();
    let mut input: Value =
        serde_json::from_str(&config("central", "1.0.0", &cluster, "node-c", json!({}))).unwrap();
    input["ipam"]["static"] = json!({"default": [{"name": "central"}]});
    let input = input.to_string();
    let out = run_plugin(&stack.env("ADD"), input.as_bytes()).json();
    assert_eq!(
        out["ips"],
        json!([{"address": "10.253.0.1/24", "gateway": "10.253.0.254"}])
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
