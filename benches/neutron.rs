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
//! POST, each beside one without.
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
            let (status, _) = http(
                neutron.port,
                "DELETE",
                &format!("/v2.0/ports/{id}"),
                None,
                None,
            )
            .unwrap();
            assert_eq!(status, 204);
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
}

/// The container's ports of the plugin's owner, as ADD and DEL list them.
fn bare_list(neutron: &Neutron, id: &str) -> Value {
    let path = format!("/v2.0/ports?device_id={id}&device_owner=cni%3Aipam-da-neutron");
    let (status, body) = http(neutron.port, "GET", &path, None, None).unwrap();
    assert_eq!(status, 200);
    serde_json::from_slice(&body).unwrap()
}

/// The REST calls of an ADD: the container's ports listed, one created,
/// with what the plugin's carries.
fn bare_add(neutron: &Neutron, network: &str, id: &str) {
    bare_list(neutron, id);
    bare_post(
        neutron,
        network,
        id,
        &json!({"binding:host_id": "bench-node"}),
    );
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
    let (status, body) = http(neutron.port, "POST", "/v2.0/ports", body, None).unwrap();
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let created: Value = serde_json::from_slice(&body).unwrap();
    created["port"]["id"].as_str().unwrap().to_owned()
}

/// The REST calls of a DEL: the container's ports listed, each deleted.
fn bare_del(neutron: &Neutron, id: &str) {
    let listed = bare_list(neutron, id);
    for port in listed["ports"].as_array().unwrap() {
        let path = format!("/v2.0/ports/{}", port["id"].as_str().unwrap());
        let (status, _) = http(neutron.port, "DELETE", &path, None, None).unwrap();
        assert_eq!(status, 204);
    }
}
