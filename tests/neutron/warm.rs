//! The warm pool on a real Neutron: a node's keeper (`ipam-da-neutron
//! keeper`) fills it, an ADD hands a port out with no controller call,
//! the keeper records its owner; a crash at each step of a hand-out and a
//! refill, many ADDs at once, a quota used up, and a node that is gone.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::neutron::{Neutron, Options};
use crate::common::{
    run_program, spawn_program, temp_dir, with_prev, Env, TempDir, PORT_ALLOCATOR,
};
use crate::proxy::Proxy;
use crate::{addresses, port_addresses, says, shared, Net};

/// A keeper of one network, started on a configuration file of its own,
/// its log kept; killed when dropped.
struct Keeper {
    child: Option<Child>,
    log: PathBuf,
    config: PathBuf,
    _dir: TempDir,
}

impl Keeper {
    /// A keeper of `net` (on `url`, the controller itself unless given).
    fn start(net: &Net, url: Option<&str>) -> Keeper {
        let dir = temp_dir("keeper");
        let mut config: Value = serde_json::from_str(&net.config()).unwrap();
        if let Some(url) = url {
            config["ipam"]["neutron"]["url"] = json!(url);
        }
        // Pools of their own replace the one network.
        let settings = config["ipam"]["neutron"].as_object_mut().unwrap();
        if settings.contains_key("pools") {
            settings.remove("network");
        }
        let path = dir.path().join("net.conflist");
        fs::write(&path, config.to_string()).unwrap();
        let log = dir.path().join("keeper.log");
        let mut keeper = Keeper {
            child: None,
            log,
            config: path,
            _dir: dir,
        };
        keeper.restart();
        keeper
    }

    /// Starts it (again), on the same configuration.
    fn restart(&mut self) {
        self.kill();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let config = self.config.display().to_string();
        self.child = Some(spawn_program(
            PORT_ALLOCATOR,
            Path::new("/"),
            &["keeper", "--config", &config],
            &Env(vec![]),
            Stdio::from(log),
        ));
    }

    /// SIGTERM, and its end awaited.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid])
                .status();
            let _ = child.wait();
        }
    }

    /// SIGKILL: no chance to tidy anything.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `ipam-da-neutron show --json` on its configuration.
    fn show(&self) -> Value {
        let config = self.config.display().to_string();
        let args = ["show", "--config", &config, "--json"];
        run_program(PORT_ALLOCATOR, Path::new("/"), &args, &Env(vec![]), b"").json()
    }

    /// `ipam-da-neutron release --node NODE` on its configuration.
    fn release(&self, node: &str) -> crate::common::Outcome {
        let config = self.config.display().to_string();
        let args = ["release", "--config", &config, "--node", node];
        run_program(PORT_ALLOCATOR, Path::new("/"), &args, &Env(vec![]), b"")
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `net`'s ledger as the keeper and the plugin keep it.
fn ledger(net: &Net) -> Value {
    let path = net.data.path().join(format!("warm/{}.ledger", net.name));
    fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null)
}

/// The free ports `net`'s ledger lists.
fn ledger_free(net: &Net) -> usize {
    ledger(net)["free"].as_object().map_or(0, |f| f.len())
}

/// Waits up to `seconds` for `done`, then fails saying `what`.
fn wait_until(what: &str, seconds: u64, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(seconds);
    while !done() {
        assert!(Instant::now() < until, "not within {seconds} s: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The controller's ports of `net` that look free (the pool's), and
/// those held (an owner recorded), and whether any is neither.
fn split(neutron: &Neutron, net: &Net) -> (Vec<Value>, Vec<Value>) {
    let mut free = Vec::new();
    let mut held = Vec::new();
    for port in net.ports(neutron) {
        let tags: Vec<&str> = port["tags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        if port["fixed_ips"].as_array().unwrap().is_empty() {
            continue; // a keeper's heartbeat
        }
        // A port whose owner is recorded and whose tags are not yet is
        // held; one with neither an owner nor the free mark is lost.
        match (port["device_id"] == "", tags.contains(&"cni-free")) {
            (true, true) => free.push(port),
            (false, _) => held.push(port),
            (true, false) => panic!("a port with neither an owner nor the free mark: {port}"),
        }
    }
    (free, held)
}

/// The port of the controller's that has `address`.
fn port_with(neutron: &Neutron, net: &Net, address: &str) -> Value {
    net.ports(neutron)
        .into_iter()
        .find(|p| port_addresses(p).contains(&address.to_owned()))
        .unwrap_or_else(|| panic!("no port has {address}"))
}

/// A net with a warm pool of `warm`.
fn warm_net(neutron: &Neutron, name: &str, warm: Value) -> Net {
    let mut net = Net::on(neutron, name);
    net.extra = json!({ "warm": warm });
    net
}

/// Waits until the keeper has filled the pool to `count` free ports, the
/// controller agrees, and the keeper's beat lets ADDs hand out.
fn filled(neutron: &Neutron, net: &Net, count: usize) {
    let beat = net.data.path().join(format!("warm/{}.keeper", net.name));
    wait_until(
        &format!("{count} free ports in {}'s pool", net.name),
        60,
        || {
            ledger(net)["reconciled"] == true
                && beat.exists()
                && ledger_free(net) == count
                && split(neutron, net).0.len() == count
        },
    );
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_hand_out_makes_no_controller_call_and_the_keeper_records_its_owner() {
    let neutron = shared();
    let mut net = warm_net(neutron, "warm-out", json!({"min": 2, "max": 3, "batch": 2}));
    let mut keeper = Keeper::start(&net, None);
    filled(neutron, &net, 3);
    assert_eq!(keeper.show()["warmFree"], json!({"node-a": 3}));
    // The plugin through a proxy that counts its requests; the keeper
    // talks to the controller itself.
    let proxy = Proxy::to(neutron.port);
    net.extra["url"] = json!(proxy.url());
    let config = net.config();
    let pooled: BTreeSet<String> = split(neutron, &net)
        .0
        .iter()
        .flat_map(port_addresses)
        .collect();

    let add = net.run("ADD", "c-w1", config.as_bytes());
    assert!(add.status.success(), "{add:?}");
    assert_eq!(
        proxy.requests(),
        0,
        "the hand-out called the controller: {}",
        keeper.log()
    );
    let result = add.json();
    let address = addresses(&result)[0].clone();
    assert!(
        pooled.contains(&address),
        "{address} is not a pooled port's"
    );
    assert_eq!(result["ips"][0]["address"], format!("{address}/24"));
    assert_eq!(result["ips"][0]["gateway"], "10.77.0.1");
    assert_eq!(result["routes"][0]["dst"], "10.78.0.0/16");
    assert_eq!(result["dns"]["nameservers"][0], "10.77.0.53");
    let check = with_prev(&config, &String::from_utf8_lossy(&add.stdout));
    net.run("CHECK", "c-w1", &check).assert_silent_success();

    // The keeper records the owner; from then on the port is as any.
    wait_until("the owner recorded, its tags too", 20, || {
        let port = port_with(neutron, &net, &address);
        port["device_id"] == "c-w1" && !crate::tags_of(&port).contains(&"cni-free")
    });
    let port = port_with(neutron, &net, &address);
    assert_eq!(port["name"], "warm-out/default/eth0");
    assert_eq!(
        crate::tags_of(&port),
        ["cni-network=warm-out", "cni-node=node-a"]
    );
    wait_until("the claim forgotten", 10, || {
        ledger(&net)["claimed"]
            .as_object()
            .is_some_and(|c| c.is_empty())
    });
    net.run("CHECK", "c-w1", &check).assert_silent_success();
    // A repeated ADD answers the same port.
    let again = net.run("ADD", "c-w1", config.as_bytes());
    assert_eq!(addresses(&again.json()), std::slice::from_ref(&address));
    // A GC that lists it keeps it.
    let mut gc: Value = serde_json::from_str(&config).unwrap();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "c-w1", "ifname": "eth0"}]);
    net.run("GC", "c-w1", gc.to_string().as_bytes())
        .assert_silent_success();
    assert_eq!(port_with(neutron, &net, &address)["device_id"], "c-w1");
    // DEL deletes it, and never gives it back to the pool.
    net.run("DEL", "c-w1", &check).assert_silent_success();
    assert!(!net
        .ports(neutron)
        .iter()
        .any(|p| port_addresses(p).contains(&address)));
    // Two free are the low watermark: no refill. One is below it: the
    // keeper refills to the high one.
    assert_eq!(ledger_free(&net), 2);
    // A pod's hand-out too: no look for the pod's orphans either.
    let before = proxy.requests();
    let env = net.env("ADD", "c-w2").set(
        "CNI_ARGS",
        "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u-w2",
    );
    let second = crate::common::run_plugin(&env, config.as_bytes());
    assert!(second.status.success(), "{second:?}");
    assert_eq!(
        proxy.requests(),
        before,
        "the pod's hand-out called the controller"
    );
    filled(neutron, &net, 3);

    // Its keeper stopped, an ADD makes its port as without a pool, and
    // what the keeper had not recorded yet it recorded as it stopped.
    let third = net.run("ADD", "c-w3", config.as_bytes());
    let third = addresses(&third.json())[0].clone();
    keeper.stop();
    assert!(keeper.log().contains("stops"), "{}", keeper.log());
    assert_eq!(port_with(neutron, &net, &third)["device_id"], "c-w3");
    let add = net.run("ADD", "c-w4", config.as_bytes());
    assert!(add.status.success(), "{add:?}");
    let made = port_with(neutron, &net, &addresses(&add.json())[0]);
    assert_eq!(made["device_id"], "c-w4", "{made}");
    assert_eq!(ledger_free(&net), 2);
}

/// Runs ipam-da-neutron's ADD alone for `container` under strace, killed
/// at the `when`th call of `syscall` (a hand-out renames the record of
/// its answer into place, then the ledger, then syncs the directory:
/// `renameat` 1 and 2, and `fsync` 3 once the records' directory
/// exists), and says what it printed.
fn add_killed_at(net: &Net, container: &str, syscall: &str, when: u32) -> String {
    let mut config: Value = serde_json::from_str(&net.config()).unwrap();
    config["ipam"] =
        json!({"type": "ipam-da-neutron", "neutron": config["ipam"]["neutron"].clone()});
    let trace = format!("trace={syscall}");
    let inject = format!("inject={syscall}:signal=KILL:when={when}");
    let env = Env(vec![
        ("CNI_COMMAND".into(), "ADD".into()),
        ("CNI_CONTAINERID".into(), container.into()),
        ("CNI_NETNS".into(), "/var/run/netns/x".into()),
        ("CNI_IFNAME".into(), "eth0".into()),
        ("CNI_PATH".into(), "/nonexistent".into()),
    ]);
    let args = ["-qq", "-e", &trace, "-e", &inject, PORT_ALLOCATOR];
    let stdin = config.to_string();
    let out = run_program(
        "/usr/bin/strace",
        Path::new("/"),
        &args,
        &env,
        stdin.as_bytes(),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "needs python3-neutron and strace"]
fn a_crash_at_any_step_of_a_hand_out_or_a_refill_answers_no_address_twice() {
    let neutron = shared();
    let net = warm_net(
        neutron,
        "warm-crash",
        json!({"min": 3, "max": 4, "batch": 2}),
    );
    let mut keeper = Keeper::start(&net, None);
    filled(neutron, &net, 4);
    let mut answered: Vec<String> = Vec::new();
    let answer = |outcome: &crate::common::Outcome, answered: &mut Vec<String>| {
        assert!(outcome.status.success(), "{outcome:?}");
        for a in addresses(&outcome.json()) {
            assert!(!answered.contains(&a), "{a} answered twice");
            answered.push(a);
        }
    };

    // Killed before its claim is written: nothing handed out, whether
    // the record of its answer was written or not; the retried ADD makes
    // its port.
    assert_eq!(add_killed_at(&net, "c-k1", "renameat", 1), "");
    assert_eq!(add_killed_at(&net, "c-k1", "renameat", 2), "");
    let l = ledger(&net);
    assert!(l["claimed"].as_object().unwrap().is_empty(), "{l}");
    assert_eq!(ledger_free(&net), 4);
    assert!(!net.ports(neutron).iter().any(|p| p["device_id"] == "c-k1"));
    let retried = net.run("ADD", "c-k1", net.config().as_bytes());
    answer(&retried, &mut answered);
    let made = port_with(neutron, &net, &addresses(&retried.json())[0]);
    assert_eq!(made["device_id"], "c-k1", "{made}");
    assert_eq!(ledger_free(&net), 4);
    // Killed after its claim is written, before it answers: the retried
    // ADD answers the claimed port, and no other ADD gets it.
    assert_eq!(add_killed_at(&net, "c-k2", "fsync", 3), "");
    let claimed = ledger(&net)["claimed"].clone();
    let (id, claim) = claimed.as_object().unwrap().iter().next().unwrap();
    assert_eq!(claim["container"], "c-k2");
    let claimed_address = claim["port"]["fixed_ips"][0][1]
        .as_str()
        .unwrap()
        .to_owned();
    // The keeper killed too, before it records that owner.
    keeper.kill();
    let other = net.run("ADD", "c-k3", net.config().as_bytes());
    answer(&other, &mut answered);
    let retried = net.run("ADD", "c-k2", net.config().as_bytes());
    answer(&retried, &mut answered);
    assert_eq!(
        addresses(&retried.json()),
        std::slice::from_ref(&claimed_address)
    );
    // A hand-out whose owner the keeper has not recorded yet, and then
    // the keeper killed: its next run records it.
    let unrecorded = net.run("ADD", "c-k4", net.config().as_bytes());
    answer(&unrecorded, &mut answered);
    let unrecorded = addresses(&unrecorded.json())[0].clone();
    assert_eq!(port_with(neutron, &net, &unrecorded)["device_id"], "");
    keeper.restart();
    wait_until("the owners recorded, and the claims forgotten", 30, || {
        port_with(neutron, &net, &claimed_address)["device_id"] == "c-k2"
            && port_with(neutron, &net, &unrecorded)["device_id"] == "c-k4"
            && !ledger(&net)["claimed"]
                .as_object()
                .unwrap()
                .contains_key(id.as_str())
    });
    filled(neutron, &net, 4);

    // Killed in the middle of a refill: the controller made the ports,
    // the keeper never heard. Its next run takes them in (or deletes
    // those above max), and nothing is left unmarked.
    keeper.kill();
    let proxy = Proxy::to(neutron.port);
    proxy.hold_posts();
    let mut refilling = Keeper::start(&net, Some(&proxy.url()));
    for c in ["c-k5", "c-k6"] {
        answer(&net.run("ADD", c, net.config().as_bytes()), &mut answered);
    }
    proxy.wait_for_held();
    refilling.kill();
    proxy.drop_held();
    keeper.restart();
    filled(neutron, &net, 4);
    let (free, held) = split(neutron, &net);
    assert_eq!(free.len(), 4);
    let held: BTreeSet<String> = held.iter().flat_map(port_addresses).collect();
    for a in &answered {
        assert!(held.contains(a), "{a} answered, but its port is not held");
    }
    assert!(
        refilling.log().contains("keeps the warm pools"),
        "{}",
        refilling.log()
    );
    drop(refilling);

    // Killed after its claim is written; its owner recorded before the
    // runtime retries: the retried ADD finds the same port.
    assert_eq!(add_killed_at(&net, "c-k7", "fsync", 3), "");
    wait_until("the claim recorded", 30, || {
        ledger(&net)["claimed"].as_object().unwrap().is_empty()
    });
    let claimed_by_k7: Vec<Value> = net
        .ports(neutron)
        .into_iter()
        .filter(|p| p["device_id"] == "c-k7")
        .collect();
    assert_eq!(claimed_by_k7.len(), 1, "{claimed_by_k7:?}");
    let retried = net.run("ADD", "c-k7", net.config().as_bytes());
    answer(&retried, &mut answered);
    assert_eq!(
        addresses(&retried.json()),
        port_addresses(&claimed_by_k7[0])
    );
    assert_eq!(
        net.ports(neutron)
            .iter()
            .filter(|p| p["device_id"] == "c-k7")
            .count(),
        1
    );
    // A container gone without a DEL (c-k4): once its owner is
    // recorded, GC deletes its port as any other, past the grace.
    let kept = ["c-k1", "c-k2", "c-k3", "c-k5", "c-k6", "c-k7"];
    wait_until("every owner recorded", 30, || {
        ledger(&net)["claimed"].as_object().unwrap().is_empty()
    });
    let mut gc: Value = serde_json::from_str(&net.config()).unwrap();
    for (key, value) in crate::past_the_grace().as_object().unwrap() {
        gc["ipam"]["neutron"][key] = value.clone();
    }
    let valid: Vec<Value> = kept
        .iter()
        .map(|c| json!({"containerID": c, "ifname": "eth0"}))
        .collect();
    gc["cni.dev/valid-attachments"] = json!(valid);
    net.run("GC", "c-k2", gc.to_string().as_bytes())
        .assert_silent_success();
    assert!(!net
        .ports(neutron)
        .iter()
        .any(|p| port_addresses(p).contains(&unrecorded)));
    // Each DEL deletes its port: nothing is held after.
    for c in kept {
        net.run("DEL", c, net.config().as_bytes())
            .assert_silent_success();
    }
    let (_, held) = split(neutron, &net);
    assert!(held.is_empty(), "{held:?}\n{}", keeper.log());
}

#[test]
#[ignore = "needs python3-neutron"]
fn thirty_two_adds_at_once_on_a_pool_of_eight_get_distinct_addresses_and_leave_nothing() {
    let neutron = shared();
    let mut net = warm_net(
        neutron,
        "warm-many",
        json!({"min": 8, "max": 8, "batch": 4}),
    );
    let keeper = Keeper::start(&net, None);
    filled(neutron, &net, 8);
    let pooled: BTreeSet<String> = split(neutron, &net)
        .0
        .iter()
        .flat_map(port_addresses)
        .collect();
    // The ADDs through a proxy that counts their requests; the keeper
    // talks to the controller itself.
    let proxy = Proxy::to(neutron.port);
    net.extra["url"] = json!(proxy.url());
    let config = net.config();
    let children: Vec<_> = (0..32)
        .map(|i| {
            let env = net.env("ADD", &format!("c-m{i}"));
            crate::common::start_plugin(&env, config.as_bytes(), Stdio::piped())
        })
        .collect();
    let mut all = BTreeSet::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{} {}",
            String::from_utf8_lossy(&out.stdout),
            keeper.log()
        );
        let result: Value = serde_json::from_slice(&out.stdout).unwrap();
        for a in addresses(&result) {
            assert!(all.insert(a.clone()), "{a} answered twice");
        }
    }
    assert_eq!(all.len(), 32);
    // The pool's eight handed out; the rest (the refill by batches of
    // four racing them) made directly, through the proxy.
    assert!(
        pooled.len() == 8 && pooled.is_subset(&all),
        "{pooled:?} {all:?}"
    );
    assert!(proxy.requests() > 0, "no ADD made its port");
    wait_until("every owner recorded", 30, || {
        split(neutron, &net).1.len() == 32
    });
    for i in 0..32 {
        // The test's controller (SQLite) may answer 500 while the keeper
        // refills beside the DELs: "try again later", which a runtime does.
        for tried in 1.. {
            let out = net.run("DEL", &format!("c-m{i}"), config.as_bytes());
            if out.status.success() || tried == 5 {
                out.assert_silent_success();
                break;
            }
            out.assert_error(11);
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
    filled(neutron, &net, 8);
    assert!(split(neutron, &net).1.is_empty());
    assert!(ledger(&net)["claimed"].as_object().unwrap().is_empty());
    drop(keeper);
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_used_up_quota_pauses_the_refill_and_an_empty_pool_answers_110() {
    // A server of its own: the quota is the whole project's.
    let neutron = Neutron::start(Options::default());
    let net = warm_net(&neutron, "warm-quota", json!({"min": 2, "max": 2}));
    let quota = |ports: i64| {
        let body = json!({"quota": {"port": ports}});
        let (status, said) = neutron.request("PUT", "/v2.0/quotas/fake_project_id", Some(body));
        assert_eq!(status, 200, "{said}");
    };
    // Room for the heartbeat alone.
    quota(1);
    let proxy = Proxy::to(neutron.port);
    let keeper = Keeper::start(&net, Some(&proxy.url()));
    wait_until("the refill refused", 30, || {
        keeper.log().contains("refill paused")
    });
    let posts_at = proxy.requests();
    std::thread::sleep(Duration::from_secs(6));
    // Pauses of 1, 2 and 4 s, each round's other calls aside: a handful
    // of requests, never a tight loop.
    let made = proxy.requests() - posts_at;
    assert!(made <= 12, "{made} requests in 6 s of a refused refill");
    assert_eq!(ledger_free(&net), 0);
    let add = net.run("ADD", "c-q1", net.config().as_bytes());
    says(&add, 110, "quota");
    says(
        &net.run("STATUS", "c-q1", net.config().as_bytes()),
        50,
        "quota",
    );
    quota(-1);
    filled(&neutron, &net, 2);
    let add = net.run("ADD", "c-q2", net.config().as_bytes());
    assert!(add.status.success(), "{add:?}");
    drop(keeper);
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_gone_nodes_free_ports_are_deleted_by_another_nodes_keeper_and_its_ports_in_use_left() {
    let neutron = shared();
    // node-a keeps a grace of 10 s, node-b of 3 s: node-b waits node-a's,
    // as node-a's heartbeat says it.
    let mut a = warm_net(neutron, "warm-gone", json!({"min": 2, "max": 2}));
    a.extra["gcGraceSeconds"] = json!(10);
    a.extra["timeout"] = json!(3);
    let beside = |host: &str, extra: Value| {
        let mut other = Net::on(neutron, "unused");
        other.name = a.name.clone();
        other.network = a.network.clone();
        other.extra = a.extra.clone();
        other.extra["host"] = json!(host);
        for (key, value) in extra.as_object().unwrap() {
            other.extra[key] = value.clone();
        }
        other
    };
    let b = beside("node-b", json!({"gcGraceSeconds": 3}));
    // node-c: another cluster's, on the same network: never node-b's to
    // judge, gone or not.
    let c = beside("node-c", json!({"cluster": "west"}));
    let mut keeper_a = Keeper::start(&a, None);
    filled(neutron, &a, 2);
    let add = a.run("ADD", "c-g1", a.config().as_bytes());
    let in_use = addresses(&add.json())[0].clone();
    wait_until("the owner recorded", 20, || {
        port_with(neutron, &a, &in_use)["device_id"] == "c-g1"
    });
    filled(neutron, &a, 2);
    let mut keeper_c = Keeper::start(&c, None);
    wait_until("node-c's pool filled", 60, || ledger_free(&c) == 2);
    // node-b's keeper through a controller that ignores list filters: it
    // must tell what it deletes itself.
    let proxy = Proxy::to(neutron.port);
    proxy.ignore_filters();
    let keeper_b = Keeper::start(&b, Some(&proxy.url()));
    wait_until("node-b's pool filled", 60, || ledger_free(&b) == 2);
    // Another network's heartbeat, as stale: never node-b's to judge.
    let elsewhere = neutron.network("warm-gone-elsewhere");
    let other_beat = neutron.port(json!({
        "network_id": elsewhere, "device_owner": "cni:ipam-da-neutron",
        "tags": ["cni-keeper", "cni-node=node-z", "cni-network=warm-gone-elsewhere"],
        "description": "ipam-da-neutron keeper beat 1 grace 1",
    }));
    // node-a and node-c go: node-a's keeper killed between the two
    // writes that record a hand-out's owner (device_id, then the tags),
    // which leave one of its free-tagged ports in use.
    keeper_a.kill();
    keeper_c.kill();
    let (mut free_a, _) = split(neutron, &a);
    free_a.retain(|p| crate::tags_of(p).contains(&"cni-node=node-a"));
    let half = free_a[0]["id"].as_str().unwrap().to_owned();
    let (status, said) = neutron.request(
        "PUT",
        &format!("/v2.0/ports/{half}"),
        Some(json!({"port": {"device_id": "c-g2"}})),
    );
    assert_eq!(status, 200, "{said}");
    let beat_of = |node: &str| {
        let tag = format!("cni-node={node}");
        neutron.ports_of(&a.network).into_iter().find(|p| {
            let tags = crate::tags_of(p);
            tags.contains(&"cni-keeper") && tags.contains(&tag.as_str())
        })
    };
    let last_beat = beat_of("node-a").unwrap()["updated_at"]
        .as_str()
        .unwrap()
        .to_owned();
    let free_of = |node: &str| {
        let tag = json!(format!("cni-node={node}"));
        neutron
            .ports_of(&a.network)
            .iter()
            .filter(|p| {
                p["tags"].as_array().unwrap().contains(&tag)
                    && p["device_id"] == ""
                    && !p["fixed_ips"].as_array().unwrap().is_empty()
            })
            .count()
    };
    wait_until("node-a's free ports deleted", 90, || free_of("node-a") == 0);
    // Two of node-a's graces after its last beat, a second spared for
    // the controller's whole-second clock: stale on a look, and still so
    // a grace later.
    let since = seconds_since(&last_beat);
    assert!(since >= 19, "deleted {since} s after node-a's last beat");
    assert_eq!(port_with(neutron, &a, &in_use)["device_id"], "c-g1");
    let (status, _) = neutron.request("GET", &format!("/v2.0/ports/{half}"), None);
    assert_eq!(
        status, 200,
        "a port in use, its tags not set yet, was deleted"
    );
    assert!(
        keeper_b.log().contains(&format!(
            "node \"node-a\" stopped beating (last at {last_beat}): its 1 free pooled ports are deleted"
        )),
        "{}",
        keeper_b.log()
    );
    // node-c, of another cluster, as gone as node-a (killed with it, its
    // beat at most a third of a grace apart): left as it is, a look and
    // a beat's phase later.
    std::thread::sleep(Duration::from_secs(6));
    assert!(beat_of("node-c").is_some(), "{}", keeper_b.log());
    assert_eq!(free_of("node-c"), 2);
    let (status, _) = neutron.request(
        "GET",
        &format!("/v2.0/ports/{}", other_beat["id"].as_str().unwrap()),
        None,
    );
    assert_eq!(status, 200, "another network's heartbeat was deleted");
    // node-b's own pool is whole.
    assert_eq!(ledger_free(&b), 2);
    assert_eq!(keeper_b.show()["warmFree"], json!({"node-b": 2}));
    let released = keeper_a.release("node-a");
    assert!(
        String::from_utf8_lossy(&released.stdout).contains("c-g1/eth0"),
        "{released:?}"
    );
    drop(keeper_b);
    drop(keeper_a);
    drop(keeper_c);
}

/// Seconds from `time` (RFC 3339, as the controller dates a port) to now.
fn seconds_since(time: &str) -> i64 {
    let out = std::process::Command::new("date")
        .args(["-u", "-d", time, "+%s"])
        .output()
        .unwrap();
    let then: i64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    now - then
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_lost_ledger_stops_the_hand_outs_until_a_new_one_begins_and_its_ports_are_left_to_release() {
    let neutron = shared();
    let net = warm_net(neutron, "warm-lost", json!({"min": 2, "max": 2}));
    let mut keeper = Keeper::start(&net, None);
    filled(neutron, &net, 2);
    // A hand-out whose owner is never recorded: the keeper is killed.
    keeper.kill();
    let handed = net.run("ADD", "c-l1", net.config().as_bytes());
    let handed = addresses(&handed.json())[0].clone();
    assert_eq!(port_with(neutron, &net, &handed)["device_id"], "");
    let path = net.data.path().join("warm/warm-lost.ledger");
    fs::write(&path, b"{\"epoch\": ").unwrap();
    // No ledger to claim in: the ADD makes its port.
    let made = net.run("ADD", "c-l2", net.config().as_bytes());
    let made = addresses(&made.json())[0].clone();
    assert_eq!(port_with(neutron, &net, &made)["device_id"], "c-l2");
    // A pooled port of another ledger (an earlier boot's, say): whether
    // it is in use nothing tells, so it is left alone too.
    let earlier = neutron.port(json!({
        "network_id": net.network,
        "device_owner": "cni:ipam-da-neutron",
        "device_id": "",
        "name": "warm-lost/default",
        "description": "ipam-da-neutron cni-node=node-a cni-network=warm-lost",
        "tags": ["cni-node=node-a", "cni-network=warm-lost", "cni-free", "cni-warm=another-boot.0123"],
    }));
    // The keeper begins a new ledger, keeps the old one aside, and
    // leaves the old ports alone: one of them is in use, and nothing
    // says which.
    keeper.restart();
    wait_until("a new pool", 60, || {
        ledger(&net)["reconciled"] == true
            && ledger_free(&net) == 2
            && split(neutron, &net).0.len() == 5
    });
    let log = keeper.log();
    assert!(
        log.contains("cannot be read") && log.contains("left alone"),
        "{log}"
    );
    let id = earlier["id"].as_str().unwrap();
    assert!(net.ports(neutron).iter().any(|p| p["id"] == id), "{log}");
    assert_eq!(
        fs::read(path.with_extension("ledger.unreadable")).unwrap(),
        b"{\"epoch\": "
    );
    assert_eq!(port_with(neutron, &net, &handed)["device_id"], "");
    let after = net.run("ADD", "c-l3", net.config().as_bytes());
    let after = addresses(&after.json())[0].clone();
    assert!(after != handed && after != made);
    // The operator drains the node: release takes them all, once the
    // keeper has stopped (a refill it had in flight has landed by then:
    // the pool is whole again).
    wait_until("the pool refilled", 30, || ledger_free(&net) == 2);
    keeper.stop();
    let released = keeper.release("node-a");
    let said = String::from_utf8_lossy(&released.stdout);
    assert!(
        said.contains("unheld port") && said.contains(&handed),
        "{said}"
    );
    assert!(net.ports(neutron).is_empty(), "{:?}", net.ports(neutron));
}

#[test]
#[ignore = "needs python3-neutron"]
fn two_clusters_pools_on_one_controller_with_the_same_names_never_touch_each_other() {
    let neutron = shared();
    let plain = warm_net(neutron, "warm-two", json!({"min": 2, "max": 2}));
    let mut east = Net::on(neutron, "warm-two-unused");
    east.name = plain.name.clone();
    east.network = plain.network.clone();
    east.extra = plain.extra.clone();
    east.extra["cluster"] = json!("east");
    let mut plain_keeper = Keeper::start(&plain, None);
    let east_keeper = Keeper::start(&east, None);
    wait_until("both pools full", 60, || {
        ledger_free(&plain) == 2 && ledger_free(&east) == 2 && split(neutron, &plain).0.len() == 4
    });
    let ours = plain.run("ADD", "c-t1", plain.config().as_bytes());
    let theirs = east.run("ADD", "c-t1", east.config().as_bytes());
    let (ours, theirs) = (
        addresses(&ours.json())[0].clone(),
        addresses(&theirs.json())[0].clone(),
    );
    assert_ne!(ours, theirs);
    wait_until("both owners recorded", 20, || {
        port_with(neutron, &plain, &ours)["device_id"] == "c-t1"
            && port_with(neutron, &plain, &theirs)["device_id"] == "c-t1"
    });
    // Stopped once its refill has landed: release takes what there is.
    wait_until("the plain pool refilled", 30, || ledger_free(&plain) == 2);
    plain_keeper.stop();
    let released = plain_keeper.release("node-a");
    assert!(released.status.success(), "{released:?}");
    // What is left is east's: its pool, its attachment, its heartbeat.
    let left = neutron.ports_of(&plain.network);
    assert_eq!(left.len(), 4, "{left:?}");
    for port in &left {
        assert!(
            port["tags"]
                .as_array()
                .unwrap()
                .contains(&json!("cni-cluster=east")),
            "{port}"
        );
    }
    assert_eq!(port_with(neutron, &plain, &theirs)["device_id"], "c-t1");
    assert_eq!(ledger_free(&east), 2);
    drop(east_keeper);
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_node_whose_heartbeat_was_deleted_begins_its_pool_anew_before_it_hands_out() {
    let neutron = shared();
    let mut net = warm_net(neutron, "warm-anew", json!({"min": 2, "max": 2}));
    net.extra["gcGraceSeconds"] = json!(3);
    net.extra["timeout"] = json!(3);
    let keeper = Keeper::start(&net, None);
    filled(neutron, &net, 2);
    let old_epoch = ledger(&net)["epoch"].clone();
    let old: Vec<String> = split(neutron, &net)
        .0
        .iter()
        .map(|p| p["id"].as_str().unwrap().to_owned())
        .collect();
    // Another node's keeper took this one for gone: its heartbeat is
    // deleted, and its free ports may be at any moment.
    let beat = net
        .ports(neutron)
        .into_iter()
        .find(|p| crate::tags_of(p).contains(&"cni-keeper"))
        .unwrap();
    let (status, _) = neutron.request(
        "DELETE",
        &format!("/v2.0/ports/{}", beat["id"].as_str().unwrap()),
        None,
    );
    assert_eq!(status, 204);
    wait_until("a new epoch", 20, || ledger(&net)["epoch"] != old_epoch);
    filled(neutron, &net, 2);
    let ids: Vec<String> = net
        .ports(neutron)
        .iter()
        .map(|p| p["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        old.iter().all(|id| !ids.contains(id)),
        "{old:?} among {ids:?}"
    );
    assert!(keeper.log().contains("begun anew"), "{}", keeper.log());
    let add = net.run("ADD", "c-n1", net.config().as_bytes());
    let address = addresses(&add.json())[0].clone();
    assert!(!old
        .iter()
        .any(|id| port_with(neutron, &net, &address)["id"] == id.as_str()));
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_port_handed_out_and_deleted_while_the_keeper_lists_is_never_taken_in_again() {
    let neutron = shared();
    let net = warm_net(neutron, "warm-race", json!({"min": 2, "max": 2}));
    let mut first = Keeper::start(&net, None);
    filled(neutron, &net, 2);
    first.kill();
    // The next keeper's listing of the free ports is read now and heard
    // of later; meanwhile a port is handed out, and its DEL deletes it.
    let proxy = Proxy::to(neutron.port);
    proxy.hold_gets_with("cni-free");
    let second = Keeper::start(&net, Some(&proxy.url()));
    proxy.wait_for_held();
    let add = net.run("ADD", "c-r1", net.config().as_bytes());
    let address = addresses(&add.json())[0].clone();
    let id = port_with(neutron, &net, &address)["id"]
        .as_str()
        .unwrap()
        .to_owned();
    net.run("DEL", "c-r1", net.config().as_bytes())
        .assert_silent_success();
    assert!(!net.ports(neutron).iter().any(|p| p["id"] == id.as_str()));
    proxy.let_held_go();
    // The listing said it was free: it is not taken in, and the pool is
    // refilled with new ports.
    filled(neutron, &net, 2);
    let free = ledger(&net)["free"].clone();
    assert!(free.get(&id).is_none(), "{free}\n{}", second.log());
    let next = net.run("ADD", "c-r2", net.config().as_bytes());
    assert_ne!(addresses(&next.json())[0], address);
    assert!(port_with(neutron, &net, &addresses(&next.json())[0])["id"] != id.as_str());
}

#[test]
#[ignore = "needs python3-neutron"]
fn each_pool_hands_out_only_its_own_network_s_ports() {
    let neutron = shared();
    // Two pools on two networks, 10.77.0.0/24 and 10.79.0.0/24.
    let mut net = Net::on(neutron, "warm-two-pools");
    let other = neutron.network("warm-two-pools-b");
    neutron.subnet(
        &other,
        json!({"cidr": "10.79.0.0/24", "gateway_ip": "10.79.0.1"}),
    );
    net.extra = json!({
        "pools": {
            "a": {"network": net.network, "warm": {"min": 3, "max": 3}},
            "b": {"network": other, "warm": {"min": 3, "max": 3}},
        },
        "default": "a",
    });
    let mut config: Value = serde_json::from_str(&net.config()).unwrap();
    config["ipam"]["neutron"]
        .as_object_mut()
        .unwrap()
        .remove("network");
    let config = config.to_string();
    let _keeper = Keeper::start(&net, None);
    wait_until("both pools full", 60, || ledger_free(&net) == 6);
    // The same CNI network (one ledger), its ADDs asking pool a and pool
    // b in turn: each gets a port of its own pool's network.
    let mut by_b: Value = serde_json::from_str(&config).unwrap();
    by_b["ipam"]["neutron"]["default"] = json!("b");
    let by_b = by_b.to_string();
    for i in 0..4 {
        let (asked, config, prefix) = match i % 2 {
            0 => ("a", &config, "10.77.0."),
            _ => ("b", &by_b, "10.79.0."),
        };
        let add = net.run("ADD", &format!("c-p{i}"), config.as_bytes());
        assert!(add.status.success(), "{add:?}");
        let address = addresses(&add.json())[0].clone();
        assert!(address.starts_with(prefix), "pool {asked} got {address}");
    }
}
