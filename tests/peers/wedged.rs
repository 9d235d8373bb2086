//! Wedged peers: a TLS port that accepts and never speaks, a TLS server
//! that trickles its answer, a termination request during a wedged
//! handshake, and one member of a real etcd cluster SIGSTOPped.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::etcd::{Certificates, Cluster};
use crate::common::{temp_dir, with_state_dir, Stack, ALLOCATOR, PLUGIN, PORT_ALLOCATOR};
use crate::servers::{closed_port, json_answer, trickling_tls, Scripted, Silent};
use crate::{
    config, env, failed_in_time, failed_within, finish, neutron_ipam, pool_ipam, run, secret_file,
    start, tls_of,
};

/// What each command answers when its peer cannot: STATUS says the
/// plugin is not available (50, as CNI has it for STATUS), the others
/// "try again later" (11).
const COMMANDS: [(&str, u64); 5] = [
    ("ADD", 11),
    ("DEL", 11),
    ("CHECK", 11),
    ("GC", 11),
    ("STATUS", 50),
];

#[test]
#[ignore = "needs openssl"]
fn every_command_of_ipam_da_pool_ends_in_time_at_an_etcd_that_accepts_and_never_speaks() {
    let certificates = Certificates::make();
    let data = temp_dir("peers-silent");
    let silent = Silent::start();
    let ipam = pool_ipam(
        &[format!("https://127.0.0.1:{}", silent.port())],
        &certificates,
        data.path(),
    );
    for (command, code) in COMMANDS {
        let out = run(
            ALLOCATOR,
            &env(command, "c1"),
            &config(ipam.clone(), command),
        );
        let said = failed_in_time(&out, code, command);
        assert!(said.contains("out of time"), "{command}: {said}");
    }
    // Under ipam-delegated, as a runtime runs it: the delegate's error
    // passed on as it is, the delegate named on stderr; the ADD's rollback
    // (a DEL, which waits on etcd too) takes a timeout more.
    let stack = Stack::new().with_pool_plugins();
    let mut delegated = ipam.clone();
    delegated["type"] = json!("ipam-delegated");
    delegated["delegates"] = json!(["ipam-da-pool"]);
    let input = String::from_utf8(config(delegated, "ADD")).unwrap();
    let input = with_state_dir(&stack, &input);
    let out = run(PLUGIN, &stack.env("ADD"), input.as_bytes());
    let said = failed_within(&out, 11, "ADD through ipam-delegated", 2 * crate::TIMEOUT);
    assert!(said.contains("out of time"), "{said}");
    assert!(
        out.outcome.stderr.contains("ipam-da-pool"),
        "{}",
        out.outcome.stderr
    );
}

#[test]
#[ignore = "needs openssl"]
fn a_member_out_of_time_does_not_hide_another_members_refusal() {
    // The refusal tells the operator which member is down; "out of time"
    // from the wedged one, tried later or last, would hide it.
    let certificates = Certificates::make();
    let silent = Silent::start();
    let closed = closed_port();
    let data = temp_dir("peers-closed");
    let ipam = pool_ipam(
        &[
            format!("https://127.0.0.1:{closed}"),
            format!("https://127.0.0.1:{}", silent.port()),
        ],
        &certificates,
        data.path(),
    );
    let out = run(ALLOCATOR, &env("ADD", "c1"), &config(ipam, "ADD"));
    let said = failed_in_time(&out, 11, "ADD");
    assert!(said.to_lowercase().contains("refused"), "{said}");
}

#[test]
#[ignore = "needs openssl"]
fn every_command_of_ipam_da_neutron_ends_in_time_at_a_controller_or_keystone_that_never_speaks() {
    let certificates = Certificates::make();
    let data = temp_dir("peers-neutron");
    let (controller, keystone) = (Silent::start(), Silent::start());
    let url = format!("https://127.0.0.1:{}/v2.0", controller.port());
    let secret = secret_file(&data, "secret", "s3cret\n");
    let keystone_auth = json!({
        "tls": tls_of(&certificates),
        "auth": {
            "url": format!("https://127.0.0.1:{}/v3", keystone.port()),
            "applicationCredentialId": "cred-1",
            "secretFile": secret,
        },
    });
    for (silent, more) in [
        ("the controller", json!({"tls": tls_of(&certificates)})),
        ("Keystone", keystone_auth),
    ] {
        let ipam = neutron_ipam(&url, data.path(), more);
        for (command, code) in COMMANDS {
            let out = run(
                PORT_ALLOCATOR,
                &env(command, "c1"),
                &config(ipam.clone(), command),
            );
            let said = failed_in_time(&out, code, command);
            assert!(
                said.contains("no answer within the timeout"),
                "{silent}, {command}: {said}"
            );
            if silent == "Keystone" {
                assert!(said.contains("Keystone at https://"), "{command}: {said}");
            }
        }
    }
}

#[test]
#[ignore = "needs openssl"]
fn a_tls_answer_trickled_a_byte_a_second_or_slower_ends_in_time() {
    let certificates = Certificates::make();
    let data = temp_dir("peers-trickle");
    for every in [Duration::from_secs(1), Duration::from_millis(1500)] {
        let port = trickling_tls(&certificates, every);
        let mut pool = pool_ipam(
            &[format!("https://127.0.0.1:{port}")],
            &certificates,
            data.path(),
        );
        // Each try at a member gets a quarter of the timeout: 2 s here,
        // longer than a byte takes.
        pool["pool"]["etcd"]["timeout"] = json!(8);
        let out = run(ALLOCATOR, &env("ADD", "c1"), &config(pool, "ADD"));
        failed_within(&out, 11, &format!("ipam-da-pool, a byte each {every:?}"), 8);
        let url = format!("https://127.0.0.1:{port}/v2.0");
        let neutron = neutron_ipam(&url, data.path(), json!({"tls": tls_of(&certificates)}));
        let out = run(PORT_ALLOCATOR, &env("DEL", "c1"), &config(neutron, "DEL"));
        failed_in_time(&out, 11, &format!("ipam-da-neutron, a byte each {every:?}"));
    }
}

#[test]
#[ignore = "needs openssl"]
fn sigterm_during_a_wedged_handshake_ends_the_plugin_within_a_second() {
    let certificates = Certificates::make();
    let data = temp_dir("peers-sigterm");
    let silent = Silent::start();
    let mut pool = pool_ipam(
        &[format!("https://127.0.0.1:{}", silent.port())],
        &certificates,
        data.path(),
    );
    // Far longer than the test waits: only the request can end it.
    pool["pool"]["etcd"]["timeout"] = json!(60);
    let url = format!("https://127.0.0.1:{}/v2.0", silent.port());
    let mut neutron = neutron_ipam(&url, data.path(), json!({"tls": tls_of(&certificates)}));
    neutron["neutron"]["timeout"] = json!(60);
    for (program, ipam) in [(ALLOCATOR, pool), (PORT_ALLOCATOR, neutron)] {
        for command in ["ADD", "DEL"] {
            let started = Instant::now();
            let before = silent.received();
            let child = start(program, &env(command, "c1"), &config(ipam.clone(), command));
            // Its hello sent: it waits in the handshake.
            while silent.received() == before {
                assert!(started.elapsed() < Duration::from_secs(10), "no hello");
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(200));
            let out = terminated_within_a_second(child, started);
            let error = out.outcome.assert_error(105);
            assert!(
                error["msg"].as_str().unwrap().contains("signal 15"),
                "{error}"
            );
        }
    }
}

#[test]
#[ignore = "needs openssl"]
fn sigterm_between_tries_that_fail_at_once_ends_the_plugin_within_a_second() {
    let certificates = Certificates::make();
    // Nothing listens: every try is refused at once, and the etcd client
    // pauses between rounds until its timeout.
    let closed = closed_port();
    let data = temp_dir("peers-sigterm-refused");
    let mut pool = pool_ipam(
        &[format!("https://127.0.0.1:{closed}")],
        &certificates,
        data.path(),
    );
    pool["pool"]["etcd"]["timeout"] = json!(60);
    let started = Instant::now();
    let child = start(ALLOCATOR, &env("ADD", "c1"), &config(pool, "ADD"));
    std::thread::sleep(Duration::from_millis(700));
    let out = terminated_within_a_second(child, started);
    out.outcome.assert_error(105);
}

#[test]
fn sigterm_while_a_kept_connection_waits_is_not_taken_for_the_connections_end() {
    let data = temp_dir("peers-sigterm-kept");
    // The attachment's port is listed at once; its DELETE, sent on the
    // same connection, is never answered.
    let controller = Scripted::start(|request, out| {
        if request.method == "DELETE" {
            std::thread::sleep(Duration::from_secs(120));
            return;
        }
        let body = json!({"ports": [{
            "id": "p-1", "device_id": "c1", "device_owner": "cni:ipam-da-neutron",
            "network_id": "net-1", "name": "peers/default/eth0",
        }]});
        json_answer(out, "200 OK", &body.to_string());
    });
    let url = format!("http://127.0.0.1:{}/v2.0", controller.port());
    let mut ipam = neutron_ipam(&url, data.path(), json!({}));
    ipam["neutron"]["timeout"] = json!(60);
    let started = Instant::now();
    let child = start(PORT_ALLOCATOR, &env("DEL", "c1"), &config(ipam, "DEL"));
    until_sent(&controller, "DELETE", started);
    let out = terminated_within_a_second(child, started);
    out.outcome.assert_error(105);
    // Not sent again on a new connection, as an idle one's end would be.
    let deletes = controller
        .requests()
        .iter()
        .filter(|r| r.method == "DELETE")
        .count();
    assert_eq!(deletes, 1);
}

/// A controller that makes the port an ADD asks for, without addresses,
/// and never answers a read of it again; that deletes it when asked if
/// `deletes`, else never answers that either.
fn controller_that_stalls_after_the_post(deletes: bool) -> Scripted {
    Scripted::start(move |request, out| match request.method.as_str() {
        "POST" => {
            let port = json!({"port": {
                "id": "p-1", "device_id": "c1", "device_owner": "cni:ipam-da-neutron",
                "network_id": "net-1", "name": "peers/default/eth0", "fixed_ips": [],
                "tags": ["cni-node=node-a", "cni-network=peers"],
            }});
            json_answer(out, "201 Created", &port.to_string());
        }
        "DELETE" if deletes => {
            let _ = write!(out, "HTTP/1.1 204 No Content\r\n\r\n");
        }
        "GET" if request.path.contains("/ports?") => json_answer(out, "200 OK", r#"{"ports": []}"#),
        _ => std::thread::sleep(Duration::from_secs(120)),
    })
}

/// Waits until `controller` has been sent a `method` request.
fn until_sent(controller: &Scripted, method: &str, started: Instant) {
    while !controller.requests().iter().any(|r| r.method == method) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no {method} sent"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_add_stopped_by_sigterm_gives_back_its_port_unless_a_second_one_comes() {
    let data = temp_dir("peers-sigterm-undo");
    for second in [false, true] {
        let controller = controller_that_stalls_after_the_post(!second);
        let url = format!("http://127.0.0.1:{}/v2.0", controller.port());
        let mut ipam = neutron_ipam(&url, data.path(), json!({}));
        ipam["neutron"]["timeout"] = json!(60);
        let started = Instant::now();
        let child = start(PORT_ALLOCATOR, &env("ADD", "c1"), &config(ipam, "ADD"));
        // The port made, its addresses awaited.
        while controller
            .requests()
            .iter()
            .filter(|r| r.method == "GET")
            .count()
            < 2
        {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{:?}",
                controller.requests()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = child.id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        if !second {
            // The first request stops the ADD, not its giving back.
            let out = finish(child, started);
            out.outcome.assert_error(105);
            assert!(controller
                .requests()
                .iter()
                .any(|r| r.method == "DELETE" && r.path.ends_with("/ports/p-1")));
            continue;
        }
        // A second one, during the giving back, stops that too.
        until_sent(&controller, "DELETE", started);
        let out = terminated_within_a_second(child, started);
        out.outcome.assert_error(105);
    }
}

/// Sends `child`, started at `started`, SIGTERM, and asserts that it
/// ends within a second.
fn terminated_within_a_second(child: std::process::Child, started: Instant) -> crate::Run {
    let signalled = Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = finish(child, started);
    assert!(
        signalled.elapsed() < Duration::from_secs(1),
        "ended {:?} after SIGTERM: {:?}",
        signalled.elapsed(),
        out.outcome
    );
    out
}

/// A process killed when the test ends, however it ends: a keeper left
/// behind by a failed assertion would renew for ever.
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether node `node` is registered, as a member that is not `frozen`
/// reads it (serializable: a member without a leader still answers);
/// `None` if none answers.
fn registered(cluster: &Cluster, frozen: usize, node: &str) -> Option<bool> {
    let keys = cluster.try_keys_apart_from(frozen, &format!("/peers/nodes/{node}/"))?;
    Some(keys.iter().any(|k| k.ends_with("/alive")))
}

#[test]
#[ignore = "needs etcd-server and openssl"]
fn one_wedged_member_of_three_is_passed_over_and_the_keeper_keeps_its_lease() {
    let certificates = Certificates::make();
    let cluster = Cluster::start(3, Some(&certificates));
    let dir = temp_dir("peers-wedged");
    let mut ipam = pool_ipam(&cluster.endpoints(), &certificates, dir.path());
    ipam["pool"]["nodeTTL"] = json!(3);
    // A second for a try at the wedged member, the rest for the others,
    // however loaded the machine is.
    ipam["pool"]["etcd"]["timeout"] = json!(4);
    let conf = dir.path().join("peers.conf");
    std::fs::write(&conf, config(ipam.clone(), "ADD")).unwrap();
    let log = dir.path().join("keeper.log");
    let mut keeper = Stopped(crate::common::spawn_program(
        ALLOCATOR,
        std::path::Path::new("/"),
        &["node-keeper", "--config", conf.to_str().unwrap()],
        &crate::plain_env(),
        std::process::Stdio::from(std::fs::File::create(&log).unwrap()),
    ));
    let deadline = Instant::now() + Duration::from_secs(20);
    while registered(&cluster, usize::MAX, "node-a") != Some(true) {
        assert!(
            Instant::now() < deadline,
            "never registered: {:?}",
            std::fs::read_to_string(&log)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let leader = cluster.leader();
    // A follower first, then the leader: each wedged for three TTLs.
    for (wedged, what) in [((leader + 1) % 3, "a follower"), (leader, "the leader")] {
        cluster.freeze(wedged);
        let frozen_at = Instant::now();
        let mut added = 0;
        // The leader's followers elect another first (about a second, more
        // on a loaded machine): an ADD begun before that is known may fail,
        // however late it ends. One begun after must not.
        let mut elected = wedged != leader;
        while frozen_at.elapsed() < Duration::from_secs(9) || !elected {
            assert!(
                frozen_at.elapsed() < Duration::from_secs(30),
                "{what} wedged: no other leader in 30 s"
            );
            let id = format!("{}-{added}", what.replace(' ', "-"));
            let electing = !elected;
            let out = run(ALLOCATOR, &env("ADD", &id), &config(ipam.clone(), "ADD"));
            if out.outcome.status.success() {
                added += 1;
                // The timeout is per request: one begun during the election
                // may spend it on its claim, and again on finding out whether
                // that claim landed, before the new leader answers the retry.
                let bound = if electing { 3 * 4 + 1 } else { 4 + 1 };
                assert!(
                    out.took < Duration::from_secs(bound),
                    "{what} (electing: {electing}): {:?}",
                    out.took
                );
                run(ALLOCATOR, &env("DEL", &id), &config(ipam.clone(), "DEL"))
                    .outcome
                    .assert_silent_success();
            } else {
                assert!(electing, "{what} wedged: {:?}", out.outcome);
            }
            elected = elected || cluster.led_apart_from(wedged);
            if let Some(alive) = registered(&cluster, wedged, "node-a") {
                assert!(
                    alive,
                    "{what} wedged: node-a unregistered: {}",
                    std::fs::read_to_string(&log).unwrap()
                );
            }
        }
        assert!(added >= 3, "{what} wedged: {added} ADDs");
        cluster.thaw(wedged);
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &keeper.0.id().to_string()])
        .status();
    let _ = keeper.0.wait();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!logged.contains("lease ended"), "{logged}");
}
