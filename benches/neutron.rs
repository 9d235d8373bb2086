//! ipam-da-neutron against a real Neutron on loopback (Debian's
//! python3-neutron, started by the tests' harness), side by side in one
//! run, call by call so that machine noise falls on both alike:
//!
//! 1. ADD and DEL through ipam-delegated running [ipam-da-neutron], each
//!    a process as a runtime starts it, the subnet cached;
//! 2. the same REST calls made by a bare client (this bench, one
//!    connection per request as the plugin opens them): for ADD, list the
//!    container's ports and create one; for DEL, list and delete;
//!
//! the plugin's call and the bare client's alternating call by call; the
//! medians of every call, and the stack's overhead over the controller's
//! own time. Then, through a proxy that counts them, the requests an ADD
//! and a DEL make, with the subnet cached and not. Then what
//! `binding:host_id` and the project's default security group cost a
//! POST, each beside one without. Then the warm pool: an ADD handed a
//! port by the node's pool, beside an ADD that makes its port and a bare
//! POST, call by call; their DELs; the requests of a hand-out; and how
//! fast the keeper fills a pool, by bulk requests and one port at a time.
//!
//! Run with `cargo bench --bench neutron`; needs python3-neutron
//! (./.ci/test installs it).

// The tests' harness: the Neutron server, and the counting proxy.
#[allow(dead_code)]
#[path = "../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "../tests/neutron/proxy.rs"]
mod proxy;

use std::path::Path;
use std::time::{Duration, Instant};

use common::neutron::{http, Neutron, Options};
use common::{run_plugin, temp_dir, Env, PLUGIN, PORT_ALLOCATOR};
use serde_json::{json, Value};

/// ADDs (and DELs) per variant and round.
const CALLS: usize = 20;
/// Rounds; the medians are of every call of every round.
const ROUNDS: usize = 5;
/// The port owner the plugin uses: the bare client lists by it too.
const OWNER: &str = "cni:ipam-da-neutron";

fn main() {
    let neutron = Neutron::start(Options::default());
    let network = neutron.network("bench");
    let subnet = json!({
        "cidr": "10.88.0.0/16",
        "gateway_ip": "10.88.0.1",
        "allocation_pools": [{"start": "10.88.0.10", "end": "10.88.250.250"}],
    });
    neutron.subnet(&network, subnet);
    let work = temp_dir("bench-neutron");
    let bin = work.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for program in [PLUGIN, PORT_ALLOCATOR] {
        let name = Path::new(program).file_name().unwrap();
        std::fs::copy(program, bin.join(name)).unwrap();
    }
    let config = |url: &str| {
        json!({
            "cniVersion": "1.1.0",
            "name": "bench",
            "type": "bridge",
            "ipam": {
                "type": "ipam-delegated",
                "delegates": ["ipam-da-neutron"],
                "stateDir": work.path().join("state"),
                "neutron": {
                    "url": url,
                    "network": network,
                    "host": "bench-node",
                    "dataDir": work.path().join("data"),
                },
            },
        })
        .to_string()
    };
    let env = |command: &str, id: &str| {
        Env(vec![
            ("CNI_COMMAND".into(), command.into()),
            ("CNI_CONTAINERID".into(), id.into()),
            ("CNI_NETNS".into(), "/var/run/netns/bench".into()),
            ("CNI_IFNAME".into(), "eth0".into()),
            ("CNI_PATH".into(), bin.display().to_string()),
        ])
    };
    let direct = config(&neutron.url());
    // Warm: the subnet read and cached, the server's first calls paid.
    for i in 0..3 {
        let id = format!("warm-{i}");
        assert!(run_plugin(&env("ADD", &id), direct.as_bytes())
            .status
            .success());
        run_plugin(&env("DEL", &id), direct.as_bytes()).assert_silent_success();
    }

    // Call by call, the plugin's and the bare client's alternate (which
    // goes first alternates too), so that the controller's drift over a
    // run falls on both alike.
    let mut times: [Vec<Duration>; 4] = Default::default();
    let timed = |f: &mut dyn FnMut()| {
        let started = Instant::now();
        f();
        started.elapsed()
    };
    for round in 0..ROUNDS {
        let ids: Vec<String> = (0..CALLS).map(|i| format!("p{round}-{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            let mut ours = || {
                let add = run_plugin(&env("ADD", id), direct.as_bytes());
                assert!(add.status.success(), "{add:?}");
            };
            let mut bare = || bare_add(&neutron, &network, &format!("b{id}"));
            if i % 2 == 0 {
                times[0].push(timed(&mut ours));
                times[1].push(timed(&mut bare));
            } else {
                times[1].push(timed(&mut bare));
                times[0].push(timed(&mut ours));
            }
        }
        for (i, id) in ids.iter().enumerate() {
            let mut ours = || {
                run_plugin(&env("DEL", id), direct.as_bytes()).assert_silent_success();
            };
            let mut bare = || bare_del(&neutron, &format!("b{id}"));
            if i % 2 == 0 {
                times[2].push(timed(&mut ours));
                times[3].push(timed(&mut bare));
            } else {
                times[3].push(timed(&mut bare));
                times[2].push(timed(&mut ours));
            }
        }
    }
    let [add, bare_adds, del, bare_dels] = times.map(|mut t| {
        t.sort();
        t[t.len() / 2]
    });
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let overhead = |ours: Duration, bare: Duration| (ms(ours) / ms(bare) - 1.0) * 100.0;
    println!(
        "ipam-da-neutron on Neutron 21 (loopback, SQLite), {ROUNDS} rounds of {CALLS} calls each, medians:"
    );
    println!(
        "  ADD through ipam-delegated {:.1} ms; the same REST calls by a bare client {:.1} ms: overhead {:+.1}%",
        ms(add),
        ms(bare_adds),
        overhead(add, bare_adds)
    );
    println!(
        "  DEL through ipam-delegated {:.1} ms; the same REST calls by a bare client {:.1} ms: overhead {:+.1}%",
        ms(del),
        ms(bare_dels),
        overhead(del, bare_dels)
    );

    // The requests each command makes, counted by a proxy.
    let proxy = proxy::Proxy::to(neutron.port);
    let counted = config(&proxy.url());
    let count = |command: &str, id: &str| {
        let before = proxy.requests();
        let out = run_plugin(&env(command, id), counted.as_bytes());
        assert!(out.status.success(), "{out:?}");
        proxy.requests() - before
    };
    // The subnet read again: the cache of the first calls is older than
    // its minute by now.
    count("ADD", "counted-0");
    count("DEL", "counted-0");
    let cached_add = count("ADD", "counted-1");
    let del = count("DEL", "counted-1");
    std::fs::remove_dir_all(work.path().join("data")).unwrap();
    let cold_add = count("ADD", "counted-2");
    count("DEL", "counted-2");
    println!(
        "  round trips: ADD {cached_add} with the subnet cached, {cold_add} without; DEL {del}"
    );

    // What two attributes cost the controller per POST, each against a
    // POST without it (the project's default security group, no host
    // binding), the three alternating call by call.
    let variants = [
        json!({}),
        json!({"binding:host_id": "bench-node"}),
        json!({"security_groups": []}),
    ];
    let mut posts: [Vec<Duration>; 3] = Default::default();
    for i in 0..ROUNDS * CALLS {
        for k in 0..variants.len() {
            let v = (i + k) % variants.len();
            let started = Instant::now();
            let id = bare_post(&neutron, &network, &format!("attr{i}-{v}"), &variants[v]);
            posts[v].push(started.elapsed());
            delete_port(&neutron, &id);
        }
    }
    let [plain, bound, ungrouped] = posts.map(|mut t| {
        t.sort();
        t[t.len() / 2]
    });
    println!(
        "  one POST: {:.1} ms (default security group, no binding); with binding:host_id {:.1} ms ({:+.1}%); with no security group {:.1} ms ({:+.1}%)",
        ms(plain),
        ms(bound),
        overhead(bound, plain),
        ms(ungrouped),
        overhead(ungrouped, plain)
    );
    warm_pool(&neutron, &network, work.path(), &env);
}

/// The warm pool against ADDs that make their ports, on `network`: see
/// the file's head.
fn warm_pool(neutron: &Neutron, network: &str, work: &Path, env: &dyn Fn(&str, &str) -> Env) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let median = |mut t: Vec<Duration>| {
        t.sort();
        t[t.len() / 2]
    };
    let config = |name: &str, url: &str, warm: Value| {
        let mut config = json!({
            "cniVersion": "1.1.0",
            "name": name,
            "type": "bridge",
            "ipam": {
                "type": "ipam-delegated",
                "delegates": ["ipam-da-neutron"],
                "stateDir": work.join("state"),
                "neutron": {
                    "url": url, "network": network, "host": "bench-node",
                    "dataDir": work.join("data"), "warm": warm,
                },
            },
        });
        if warm.is_null() {
            config["ipam"]["neutron"]
                .as_object_mut()
                .unwrap()
                .remove("warm");
        }
        config.to_string()
    };
    let free = |name: &str| -> usize {
        std::fs::read(work.join(format!("data/warm/{name}.ledger")))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|l| l["free"].as_object().map(|f| f.len()))
            .unwrap_or(0)
    };
    let keeper = |name: &str, config: &str| {
        let file = work.join(format!("{name}.conflist"));
        std::fs::write(&file, config).unwrap();
        let file = file.display().to_string();
        common::spawn_program(
            PORT_ALLOCATOR,
            Path::new("/"),
            &["keeper", "--config", &file],
            &Env(vec![]),
            std::process::Stdio::null(),
        )
    };
    let wait_for = |name: &str, count: usize| {
        let until = Instant::now() + Duration::from_secs(300);
        while free(name) < count {
            assert!(Instant::now() < until, "the keeper did not fill {name}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    // How fast a keeper fills an empty pool of 40: by bulk requests of
    // 10, and one port at a time.
    for batch in [10, 1] {
        let name = format!("bench-fill-{batch}");
        let warm = json!({"min": 40, "max": 40, "batch": batch});
        let started = Instant::now();
        let mut filling = keeper(&name, &config(&name, &neutron.url(), warm));
        wait_for(&name, 40);
        let rate = 40.0 / started.elapsed().as_secs_f64();
        let _ = filling.kill();
        let _ = filling.wait();
        println!("  the keeper fills a pool of 40 (from its start): {rate:.1} ports/s by requests of {batch}");
    }

    // A pool of 25 to 45: a round's 20 hand-outs never empty it, and
    // take it below 25, so that the keeper refills it between rounds.
    let warm = json!({"min": 25, "max": 45, "batch": 10});
    let pooled = config("bench-warm", &neutron.url(), warm.clone());
    let made = config("bench", &neutron.url(), Value::Null);
    let mut kept = keeper("bench-warm", &pooled);
    let mut times: [Vec<Duration>; 5] = Default::default();
    for round in 0..ROUNDS {
        wait_for("bench-warm", 25);
        let ids: Vec<String> = (0..CALLS).map(|i| format!("w{round}-{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            let mut calls: [Box<dyn FnMut()>; 3] = [
                Box::new(|| {
                    let add = run_plugin(&env("ADD", id), pooled.as_bytes());
                    assert!(add.status.success(), "{add:?}");
                }),
                Box::new(|| {
                    let add = run_plugin(&env("ADD", &format!("m{id}")), made.as_bytes());
                    assert!(add.status.success(), "{add:?}");
                }),
                Box::new(|| {
                    bare_post(
                        neutron,
                        network,
                        &format!("b{id}"),
                        &json!({"security_groups": []}),
                    );
                }),
            ];
            for k in 0..3 {
                let v = (i + k) % 3;
                let started = Instant::now();
                calls[v]();
                times[v].push(started.elapsed());
            }
        }
        for (i, id) in ids.iter().enumerate() {
            let pair = [(id.clone(), &pooled), (format!("m{id}"), &made)];
            for k in 0..2 {
                let v = (i + k) % 2;
                let (id, config) = &pair[v];
                let started = Instant::now();
                let del = run_plugin(&env("DEL", id), config.as_bytes());
                times[3 + v].push(started.elapsed());
                if !del.status.success() {
                    let log = neutron.log();
                    let tail: Vec<&str> = log.lines().rev().take(80).collect();
                    panic!(
                        "{del:?}\n{}",
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    );
                }
            }
            bare_del(neutron, &format!("b{id}"));
        }
    }
    let [warm_add, made_add, post, warm_del, made_del] = times.map(median);
    println!(
        "  ADD from the warm pool {:.2} ms; ADD that makes its port {:.1} ms; one bare POST {:.1} ms: pooled/POST {:.3}",
        ms(warm_add),
        ms(made_add),
        ms(post),
        ms(warm_add) / ms(post)
    );
    println!(
        "  DEL of a pooled port {:.1} ms; of a port its ADD made {:.1} ms",
        ms(warm_del),
        ms(made_del)
    );

    // The requests of a hand-out, counted by a proxy (the keeper talks to
    // the controller itself).
    wait_for("bench-warm", 25);
    let proxy = proxy::Proxy::to(neutron.port);
    let counted = config("bench-warm", &proxy.url(), warm);
    let add = run_plugin(&env("ADD", "counted-w"), counted.as_bytes());
    assert!(add.status.success(), "{add:?}");
    println!(
        "  round trips of an ADD from the warm pool: {}",
        proxy.requests()
    );
    run_plugin(&env("DEL", "counted-w"), counted.as_bytes()).assert_silent_success();
    let _ = kept.kill();
    let _ = kept.wait();
}

/// The container's ports of the plugin's owner, as ADD and DEL list them.
fn bare_list(neutron: &Neutron, id: &str) -> Value {
    let path = format!("/v2.0/ports?device_id={id}&device_owner=cni%3Aipam-da-neutron");
    let (status, body) = http(neutron.port, "GET", &path, None, None).unwrap();
    assert_eq!(status, 200);
    serde_json::from_slice(&body).unwrap()
}

/// The REST calls of an ADD: the container's ports listed, one created,
/// with what the plugin's carries by default (no binding, no group).
fn bare_add(neutron: &Neutron, network: &str, id: &str) {
    bare_list(neutron, id);
    bare_post(neutron, network, id, &json!({"security_groups": []}));
}

/// Creates a port for container `id` as the plugin does, with the members
/// of `more`: its ID.
fn bare_post(neutron: &Neutron, network: &str, id: &str, more: &Value) -> String {
    let mut port = json!({
        "network_id": network, "device_id": id, "device_owner": OWNER,
        "name": "bench/default/eth0", "tags": ["cni-node=bench-node", "cni-network=bench"],
        "description": "ipam-da-neutron cni-node=bench-node cni-network=bench",
    });
    for (key, value) in more.as_object().unwrap() {
        port[key] = value.clone();
    }
    let body = Some(json!({ "port": port }));
    // The test server's SQLite may answer 500 ("database is locked")
    // while a keeper writes beside it: tried again, as a runtime would.
    for tried in 1.. {
        let (status, answer) =
            http(neutron.port, "POST", "/v2.0/ports", body.clone(), None).unwrap();
        if status == 201 {
            let created: Value = serde_json::from_slice(&answer).unwrap();
            return created["port"]["id"].as_str().unwrap().to_owned();
        }
        assert!(
            status == 500 && tried < 5,
            "POST: {status} {}",
            String::from_utf8_lossy(&answer)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    unreachable!("the loop returns or fails")
}

/// The REST calls of a DEL: the container's ports listed, each deleted.
fn bare_del(neutron: &Neutron, id: &str) {
    let listed = bare_list(neutron, id);
    for port in listed["ports"].as_array().unwrap() {
        delete_port(neutron, port["id"].as_str().unwrap());
    }
}

/// DELETEs port `id`. The test server's SQLite may answer 500 ("database
/// is locked") while a keeper writes beside it: tried again, a few
/// times, as a runtime would retry the DEL.
fn delete_port(neutron: &Neutron, id: &str) {
    let path = format!("/v2.0/ports/{id}");
    for tried in 1.. {
        let (status, body) = http(neutron.port, "DELETE", &path, None, None).unwrap();
        if status == 204 {
            return;
        }
        assert!(
            status == 500 && tried < 5,
            "DELETE {path}: {status} {}",
            String::from_utf8_lossy(&body)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
