//! ipam-da-neutron's CNI commands, through ipam-delegated, on a real
//! Neutron.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::neutron::{Neutron, Options};
use crate::common::{with_prev, Answer, PORT_ALLOCATOR};
use crate::proxy::Proxy;
use crate::{addresses, past_the_grace, port_addresses, says, shared, Net};

/// A GC configuration: `config` with the attachments the runtime keeps.
fn gc_input(config: &str, valid: Value) -> Vec<u8> {
    let mut gc: Value = serde_json::from_str(config).unwrap();
    gc["cni.dev/valid-attachments"] = valid;
    gc.to_string().into_bytes()
}

#[test]
#[ignore = "needs python3-neutron"]
fn add_check_del_and_del_again_through_a_selector() {
    let neutron = shared();
    let net = Net::on(neutron, "flow");
    // The selector picks pool "tenant-a", whose network is this one.
    let mut config: Value =
        serde_json::from_str(&net.config_of("1.1.0", &["ipam-ds-static", "ipam-da-neutron"]))
            .unwrap();
    let settings = &mut config["ipam"]["neutron"];
    let network = settings["network"].take();
    settings.as_object_mut().unwrap().remove("network");
    settings["pools"] = json!({"tenant-a": {"network": network}});
    settings["default"] = json!("tenant-a");
    config["ipam"]["static"] = json!({"default": [{"name": "tenant-a"}]});
    let config = config.to_string();

    net.run("STATUS", "c-flow", config.as_bytes())
        .assert_silent_success();
    let add = net.run("ADD", "c-flow", config.as_bytes());
    assert!(add.status.success(), "{add:?}");
    let result = add.json();
    let ports = net.ports(neutron);
    assert_eq!(ports.len(), 1, "{ports:?}");
    let port = &ports[0];
    assert_eq!(addresses(&result), port_addresses(port));
    let address = &addresses(&result)[0];
    assert_eq!(
        result["ips"][0],
        json!({"address": format!("{address}/24"), "gateway": "10.77.0.1"})
    );
    assert_eq!(
        result["routes"],
        json!([{"dst": "10.78.0.0/16", "gw": "10.77.0.254"}])
    );
    assert_eq!(result["dns"], json!({"nameservers": ["10.77.0.53"]}));
    // The selector's pools are kept as they came.
    assert_eq!(result["pools"], json!([{"name": "tenant-a"}]));
    assert_eq!(port["device_id"], "c-flow");
    assert_eq!(port["device_owner"], "cni:ipam-da-neutron");
    assert_eq!(port["name"], "flow/tenant-a/eth0");
    // By default neither bound to the node nor in any security group:
    // nothing plugs the port, and both cost the controller work.
    assert_eq!(port["binding:host_id"], "", "{port}");
    assert_eq!(port["security_groups"], json!([]), "{port}");
    assert_eq!(
        crate::tags_of(port),
        ["cni-network=flow", "cni-node=node-a"]
    );

    // The same ADD again answers the same port.
    let again = net.run("ADD", "c-flow", config.as_bytes());
    assert!(again.status.success(), "{again:?}");
    assert_eq!(addresses(&again.json()), addresses(&result));
    assert_eq!(net.ports(neutron).len(), 1);

    let with_result = with_prev(&config, &String::from_utf8(add.stdout.clone()).unwrap());
    net.run("CHECK", "c-flow", &with_result)
        .assert_silent_success();
    net.run("DEL", "c-flow", &with_result)
        .assert_silent_success();
    assert!(net.ports(neutron).is_empty());
    // DEL again, and CHECK of what is gone.
    net.run("DEL", "c-flow", &with_result)
        .assert_silent_success();
    let check = net.run("CHECK", "c-flow", &with_result);
    says(&check, 112, "has no port");
}

#[test]
#[ignore = "needs python3-neutron"]
fn every_spec_version_gets_its_result_shape_and_check_sees_a_changed_port() {
    let neutron = shared();
    let net = Net::on(neutron, "versions");
    for (i, version) in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
        .iter()
        .enumerate()
    {
        let config = net.config_of(version, &["ipam-da-neutron"]);
        let id = format!("c-v{i}");
        let add = net.run("ADD", &id, config.as_bytes());
        assert!(add.status.success(), "{version}: {add:?}");
        let result = add.json();
        assert_eq!(result["cniVersion"], *version);
        let legacy = version.starts_with("0.");
        assert_eq!(
            result["ips"][0].get("version").is_some(),
            legacy,
            "{version}: {result}"
        );
        if *version != "0.3.0" && *version != "0.3.1" {
            let prev = with_prev(&config, &String::from_utf8(add.stdout.clone()).unwrap());
            net.run("CHECK", &id, &prev).assert_silent_success();
        }
    }
    // A port whose address the previous result does not list fails CHECK.
    let config = net.config_of("1.0.0", &["ipam-da-neutron"]);
    let wrong = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.77.0.250/24"}]}).to_string();
    let check = net.run("CHECK", "c-v3", &with_prev(&config, &wrong));
    says(&check, 112, "which the previous result does not list");
}

#[test]
#[ignore = "needs python3-neutron"]
fn an_add_retried_after_a_kill_between_post_and_reply_answers_its_one_port() {
    let neutron = shared();
    let proxy = Proxy::to(neutron.port);
    let mut net = Net::on(neutron, "retried");
    let direct = net.url.clone();
    net.url = proxy.url();
    let config = net.config();
    proxy.hold_posts();
    let mut killed = common_start(&net, "ADD", "c-retry", config.as_bytes());
    // The port is made; the allocator is killed before it hears so.
    proxy.wait_for_held();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &killed.id().to_string()])
        .status();
    let _ = killed.wait();
    proxy.drop_held();
    assert_eq!(net.ports(neutron).len(), 1);

    net.url = direct;
    let retried = net.run("ADD", "c-retry", net.config().as_bytes());
    assert!(retried.status.success(), "{retried:?}");
    let ports = net.ports(neutron);
    assert_eq!(ports.len(), 1, "a second port: {ports:?}");
    assert_eq!(addresses(&retried.json()), port_addresses(&ports[0]));

    // A POST that lands after the retry looked leaves an extra port: the
    // next DEL removes it with the answered one.
    neutron.port(json!({
        "network_id": net.network, "device_id": "c-retry",
        "device_owner": "cni:ipam-da-neutron", "name": "retried/default/eth0",
        "tags": ["cni-node=node-a", "cni-network=retried"],
    }));
    assert_eq!(net.ports(neutron).len(), 2);
    net.run("DEL", "c-retry", net.config().as_bytes())
        .assert_silent_success();
    assert!(net.ports(neutron).is_empty());
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_late_posts_port_goes_to_the_pods_retried_sandbox_or_its_del() {
    let neutron = shared();
    let mut net = Net::on(neutron, "late");
    // Long enough for the shared controller, busy with the other tests,
    // to answer the calls meant to succeed (2 s was not, once, in CI).
    net.extra = json!({"timeout": 4});
    // Through a controller that ignores list filters, so that the plugin
    // must itself pass over what looks like an orphan of the pod and is
    // not: another pod's port, another interface's, another cluster's.
    let loose = Proxy::to(neutron.port);
    loose.ignore_filters();
    let direct = loose.url();
    net.url = direct.clone();
    let tags = |more: &[&'static str]| {
        let mut tags = vec!["cni-node=node-a", "cni-network=late"];
        tags.extend(more);
        tags
    };
    for (device, name, more) in [
        ("c-other-pod", "late/default/eth0", tags(&["cni-pod=uid-9"])),
        ("c-other-if", "late/default/eth1", tags(&["cni-pod=uid-1"])),
        ("c-other-if", "late/default/eth1", tags(&["cni-pod=uid-3"])),
        (
            "c-west",
            "late/default/eth0",
            tags(&["cni-pod=uid-1", "cni-cluster=west"]),
        ),
        (
            "c-west",
            "late/default/eth0",
            tags(&["cni-pod=uid-3", "cni-cluster=west"]),
        ),
        // The retried sandbox's own port of another interface.
        ("c-second", "late/default/eth1", tags(&["cni-pod=uid-1"])),
    ] {
        neutron.port(json!({"network_id": net.network, "device_id": device,
            "device_owner": "cni:ipam-da-neutron", "name": name, "tags": more}));
    }
    let others = [
        "c-other-if",
        "c-other-if",
        "c-other-pod",
        "c-second",
        "c-west",
        "c-west",
    ];
    let pod = |uid: &str| {
        format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME=pg-0;K8S_POD_UID={uid}")
    };
    let run = |net: &Net, command: &str, id: &str, uid: &str| {
        let env = net.env(command, id).set("CNI_ARGS", &pod(uid));
        crate::common::run_plugin(&env, net.config().as_bytes())
    };
    // An ADD whose POST the controller makes, but whose answer comes only
    // after the ADD gave up (code 11); its runtime's DEL came before (so
    // the allocator alone, not ipam-delegated, whose undo is that DEL).
    let late = |net: &mut Net, id: &str, uid: &str| {
        let proxy = Proxy::to(neutron.port);
        net.url = proxy.url();
        proxy.hold_posts();
        let env = net.env("ADD", id).set("CNI_ARGS", &pod(uid));
        let alone = crate::common::run_program(
            PORT_ALLOCATOR,
            std::path::Path::new("/"),
            &[],
            &env,
            net.config().as_bytes(),
        );
        says(&alone, 11, "out of reach");
        proxy.drop_held();
        net.url = direct.clone();
    };
    // The holders of the network's ports, but the others above, which
    // must stay as they are throughout.
    let holders = |net: &Net| -> Vec<String> {
        let mut ids: Vec<String> = net
            .ports(neutron)
            .iter()
            .map(|p| p["device_id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        for other in others {
            let at = ids.iter().position(|id| id == other);
            ids.remove(at.unwrap_or_else(|| panic!("{other}'s port went: {ids:?}")));
        }
        ids
    };
    // An ADD and its undo take at most twice the timeout: until then the
    // late port may be its ADD's still, and the retry makes its own.
    let ended = || std::thread::sleep(Duration::from_secs(11));
    late(&mut net, "c-first", "uid-1");
    assert_eq!(holders(&net), ["c-first"]);
    let retry = run(&net, "ADD", "c-second", "uid-1");
    assert!(retry.status.success(), "{retry:?}");
    assert_eq!(holders(&net), ["c-first", "c-second"]);
    // The pod's DEL takes the late port with its own.
    ended();
    run(&net, "DEL", "c-second", "uid-1").assert_silent_success();
    assert!(holders(&net).is_empty());

    // Later than that, the retried sandbox takes the late port over; one
    // that an ADD answered with (another sandbox of the pod, alive) it
    // leaves alone.
    let alive = run(&net, "ADD", "c-alive", "uid-3");
    assert!(alive.status.success(), "{alive:?}");
    late(&mut net, "c-third", "uid-3");
    let made = net
        .ports(neutron)
        .into_iter()
        .find(|p| p["device_id"] == "c-third")
        .unwrap();
    ended();
    let retry = run(&net, "ADD", "c-fourth", "uid-3");
    assert!(retry.status.success(), "{retry:?}");
    assert_eq!(addresses(&retry.json()), port_addresses(&made));
    assert_eq!(holders(&net), ["c-alive", "c-fourth"]);
    run(&net, "DEL", "c-fourth", "uid-3").assert_silent_success();
    assert_eq!(holders(&net), ["c-alive"]);
    run(&net, "DEL", "c-alive", "uid-3").assert_silent_success();
    assert!(holders(&net).is_empty());

    // A late port with another address than the retry asks for is not
    // taken over: the retry gets a port of its own, the DEL takes both.
    let asked = |address: &str| format!("{};IP={address}", pod("uid-5"));
    // Two addresses no port has yet: the controller gave the others at
    // random from the same range.
    let taken: Vec<String> = net.ports(neutron).iter().flat_map(port_addresses).collect();
    let mut free = (150..=200)
        .map(|i| format!("10.77.0.{i}"))
        .filter(|a| !taken.contains(a));
    let (first, second) = (free.next().unwrap(), free.next().unwrap());
    let proxy = Proxy::to(neutron.port);
    net.url = proxy.url();
    proxy.hold_posts();
    let env = net.env("ADD", "c-fifth").set("CNI_ARGS", &asked(&first));
    let config = net.config();
    let alone = crate::common::run_program(
        PORT_ALLOCATOR,
        std::path::Path::new("/"),
        &[],
        &env,
        config.as_bytes(),
    );
    says(&alone, 11, "out of reach");
    proxy.drop_held();
    net.url = direct.clone();
    ended();
    let env = net.env("ADD", "c-sixth").set("CNI_ARGS", &asked(&second));
    let retry = crate::common::run_plugin(&env, net.config().as_bytes());
    assert!(retry.status.success(), "{retry:?}");
    assert_eq!(addresses(&retry.json()), [second]);
    assert_eq!(holders(&net), ["c-fifth", "c-sixth"]);
    run(&net, "DEL", "c-sixth", "uid-5").assert_silent_success();
    assert!(holders(&net).is_empty());
}

/// Starts the allocator itself (no ipam-delegated between: a kill then
/// kills the one process) for container `id`.
fn common_start(net: &Net, command: &str, id: &str, stdin: &[u8]) -> std::process::Child {
    crate::common::spawn_program(
        PORT_ALLOCATOR,
        std::path::Path::new("/"),
        &[],
        &net.env(command, id),
        std::process::Stdio::null(),
    )
    .tap_stdin(stdin)
}

trait TapStdin {
    fn tap_stdin(self, stdin: &[u8]) -> Self;
}

impl TapStdin for std::process::Child {
    /// Writes `stdin` to the child and closes it.
    fn tap_stdin(mut self, stdin: &[u8]) -> Self {
        use std::io::Write;
        self.stdin.take().unwrap().write_all(stdin).unwrap();
        self
    }
}

#[test]
#[ignore = "needs python3-neutron"]
fn an_exhausted_subnet_answers_code_110_and_leaves_nothing() {
    let neutron = shared();
    let net = Net::with_pool(neutron, "small", "10.77.0.10", "10.77.0.11");
    let config = net.config();
    for id in ["c-s1", "c-s2"] {
        let add = net.run("ADD", id, config.as_bytes());
        assert!(add.status.success(), "{add:?}");
    }
    let full = net.run("ADD", "c-s3", config.as_bytes());
    let error = full.assert_error(110);
    let msg = error["msg"].as_str().unwrap();
    assert!(
        msg.contains(&net.network) && msg.contains("IpAddressGenerationFailure"),
        "{error}"
    );
    assert_eq!(net.ports(neutron).len(), 2);
    // STATUS says so.
    let status = net.run("STATUS", "c-s3", config.as_bytes());
    says(&status, 50, "no free address");
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_used_up_port_quota_answers_code_110_and_status_says_so_until_a_port_is_made() {
    // A server of its own: the quota is the whole project's.
    let neutron = Neutron::start(Options::default());
    let net = Net::on(&neutron, "quota");
    let config = net.config();
    let quota = |ports: i64| {
        let body = json!({"quota": {"port": ports}});
        let (status, said) = neutron.request("PUT", "/v2.0/quotas/fake_project_id", Some(body));
        assert_eq!(status, 200, "{said}");
    };
    let add = net.run("ADD", "c-q1", config.as_bytes());
    assert!(add.status.success(), "{add:?}");
    let (_, all) = neutron.request("GET", "/v2.0/ports", None);
    quota(all["ports"].as_array().unwrap().len() as i64);
    let over = net.run("ADD", "c-q2", config.as_bytes());
    let error = over.assert_error(110);
    let msg = error["msg"].as_str().unwrap();
    assert!(
        msg.contains("for the project's quota") && msg.contains("OverQuota"),
        "{error}"
    );
    assert_eq!(net.ports(&neutron).len(), 1);
    says(
        &net.run("STATUS", "c-q2", config.as_bytes()),
        50,
        "refused a port for the project's quota",
    );
    // The quota raised, STATUS still says so until a port is made (or a
    // minute has passed): nothing it reads tells it otherwise.
    quota(-1);
    says(&net.run("STATUS", "c-q2", config.as_bytes()), 50, "quota");
    let add = net.run("ADD", "c-q3", config.as_bytes());
    assert!(add.status.success(), "{add:?}");
    net.run("STATUS", "c-q3", config.as_bytes())
        .assert_silent_success();
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_chain_whose_last_delegate_fails_deletes_the_port() {
    let neutron = shared();
    let net = Net::on(neutron, "undone");
    net.stack.fake("failing");
    net.stack.answer(
        "failing",
        "ADD",
        Answer::fails(
            1,
            r#"{"cniVersion":"1.0.0","code":7,"msg":"refused on purpose"}"#,
        ),
    );
    let config = net.config_of("1.0.0", &["ipam-da-neutron", "failing"]);
    let add = net.run("ADD", "c-undo", config.as_bytes());
    says(&add, 7, "refused on purpose");
    assert!(net.ports(neutron).is_empty(), "{:?}", net.ports(neutron));
}

#[test]
#[ignore = "needs python3-neutron"]
fn gc_deletes_only_this_nodes_stale_ports_of_this_network_once_old_enough() {
    let neutron = shared();
    let mut net = Net::on(neutron, "collected");
    let config = net.config();
    for id in ["c-keep", "c-gone"] {
        let add = net.run("ADD", id, config.as_bytes());
        assert!(add.status.success(), "{add:?}");
    }
    let owner = "cni:ipam-da-neutron";
    let network = net.network.clone();
    // Another host's port of the same CNI network, and another owner's.
    let other_host = neutron.port(json!({
        "network_id": network, "device_id": "c-elsewhere", "device_owner": owner,
        "name": "collected/default/eth0", "tags": ["cni-node=node-b", "cni-network=collected"],
    }));
    let foreign = neutron.port(json!({
        "network_id": network, "device_id": "c-gone", "device_owner": "compute:nova",
        "name": "collected/default/eth0", "tags": ["cni-node=node-a", "cni-network=collected"],
    }));
    // A late POST's extra port of a kept attachment, which its ADD did
    // not answer with.
    let extra = neutron.port(json!({
        "network_id": network, "device_id": "c-keep", "device_owner": owner,
        "name": "collected/default/eth0", "tags": ["cni-node=node-a", "cni-network=collected"],
    }));
    // A stale port of this node whose tags were lost: its description
    // still says whose it is.
    neutron.port(json!({
        "network_id": network, "device_id": "c-untagged", "device_owner": owner,
        "name": "collected/default/eth0",
        "description": "ipam-da-neutron cni-node=node-a cni-network=collected",
    }));
    let valid = json!([{"containerID": "c-keep", "ifname": "eth0"}]);
    // Young ports are kept, by the controller's clock.
    net.extra = json!({"gcGraceSeconds": 3600});
    net.run("GC", "c-gc", &gc_input(&net.config(), valid.clone()))
        .assert_silent_success();
    assert_eq!(net.ports(neutron).len(), 6);

    net.extra = past_the_grace();
    net.run("GC", "c-gc", &gc_input(&net.config(), valid))
        .assert_silent_success();
    let mut left: Vec<String> = net
        .ports(neutron)
        .iter()
        .map(|p| {
            format!(
                "{} {}",
                p["device_id"].as_str().unwrap(),
                p["id"].as_str().unwrap()
            )
        })
        .collect();
    left.sort();
    let kept = net
        .ports(neutron)
        .iter()
        .find(|p| p["device_id"] == "c-keep" && p["id"] != extra["id"])
        .cloned();
    assert!(kept.is_some(), "the answered port of c-keep went: {left:?}");
    let mut expected = vec![
        format!("c-elsewhere {}", other_host["id"].as_str().unwrap()),
        format!("c-gone {}", foreign["id"].as_str().unwrap()),
        format!("c-keep {}", kept.unwrap()["id"].as_str().unwrap()),
    ];
    expected.sort();
    assert_eq!(left, expected);
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_requested_address_is_given_and_the_gateway_or_a_taken_one_refused() {
    let neutron = shared();
    let net = Net::on(neutron, "requested");
    let config = net.config();
    let env = net
        .env("ADD", "c-r1")
        .set("CNI_ARGS", "IgnoreUnknown=1;IP=10.77.0.77");
    let add = crate::common::run_plugin(&env, config.as_bytes());
    assert!(add.status.success(), "{add:?}");
    assert_eq!(addresses(&add.json()), ["10.77.0.77"]);

    let env = net
        .env("ADD", "c-r2")
        .set("CNI_ARGS", "IgnoreUnknown=1;IP=10.77.0.77");
    let taken = crate::common::run_plugin(&env, config.as_bytes());
    says(&taken, 111, "IpAddressAlreadyAllocated");

    for (id, address, why) in [
        ("c-r3", "10.77.0.1", "gateway"),
        ("c-r4", "10.77.0.250", "allocation pools"),
    ] {
        let env = net
            .env("ADD", id)
            .set("CNI_ARGS", &format!("IgnoreUnknown=1;IP={address}"));
        let refused = crate::common::run_plugin(&env, config.as_bytes());
        says(&refused, 111, why);
    }
    // Only the first attachment has a port.
    let ports = net.ports(neutron);
    assert_eq!(ports.len(), 1, "{ports:?}");
    assert_eq!(ports[0]["device_id"], "c-r1");

    // runtimeConfig.ips asks as IP= does.
    let mut asked: Value = serde_json::from_str(&config).unwrap();
    asked["runtimeConfig"] = json!({"ips": ["10.77.0.88/24"]});
    let add = net.run("ADD", "c-r6", asked.to_string().as_bytes());
    assert!(add.status.success(), "{add:?}");
    assert_eq!(addresses(&add.json()), ["10.77.0.88"]);

    // Through a selector, which sets the runtime's address on its pool:
    // asked once.
    let config = net.config_of("1.0.0", &["ipam-ds-static", "ipam-da-neutron"]);
    let mut config: Value = serde_json::from_str(&config).unwrap();
    config["ipam"]["static"] = json!({"default": [{"name": "default"}]});
    let env = net
        .env("ADD", "c-r5")
        .set("CNI_ARGS", "IgnoreUnknown=1;IP=10.77.0.78");
    let selected = crate::common::run_plugin(&env, config.to_string().as_bytes());
    assert!(selected.status.success(), "{selected:?}");
    let result = selected.json();
    assert_eq!(addresses(&result), ["10.77.0.78"]);
    assert_eq!(
        result["pools"],
        json!([{"name": "default", "requested-ip": "10.77.0.78"}])
    );
}

#[test]
#[ignore = "needs python3-neutron"]
fn thirty_two_adds_at_once_get_distinct_addresses_and_their_dels_leave_no_port() {
    let neutron = shared();
    let net = Net::on(neutron, "parallel");
    let config = net.config();
    let started = Instant::now();
    let results: Vec<Vec<String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..32)
            .map(|i| {
                let (net, config) = (&net, &config);
                scope.spawn(move || {
                    let add = net.run("ADD", &format!("c-p{i}"), config.as_bytes());
                    assert!(add.status.success(), "{add:?}");
                    addresses(&add.json())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    eprintln!("32 ADDs at once: {:?}", started.elapsed());
    let mut all: Vec<String> = results.into_iter().flatten().collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 32);
    assert_eq!(net.ports(neutron).len(), 32);
    std::thread::scope(|scope| {
        for i in 0..32 {
            let (net, config) = (&net, &config);
            scope.spawn(move || {
                net.run("DEL", &format!("c-p{i}"), config.as_bytes())
                    .assert_silent_success();
            });
        }
    });
    assert!(net.ports(neutron).is_empty());
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_token_file_is_sent_and_a_wrong_or_loose_one_refused() {
    let neutron = Neutron::start(Options {
        token: Some("s3cret-token".into()),
        ..Options::default()
    });
    let mut net = Net::on(&neutron, "tokened");
    let token = net.data.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    net.extra = json!({"tokenFile": token});
    let add = net.run("ADD", "c-t1", net.config().as_bytes());
    assert!(add.status.success(), "{add:?}");

    // Rotated to a wrong one: read again at the next call.
    std::fs::write(&token, "wrong\n").unwrap();
    let refused = net.run("ADD", "c-t2", net.config().as_bytes());
    says(&refused, 5, "requires authentication");
    // Without one at all.
    net.extra = json!({});
    net.run("ADD", "c-t3", net.config().as_bytes())
        .assert_error(5);
    // One its group may read is refused before any call.
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o640)).unwrap();
    net.extra = json!({"tokenFile": token});
    let loose = net.run("ADD", "c-t4", net.config().as_bytes());
    says(
        &loose,
        7,
        "its group or other users may read or write it (mode 640)",
    );
    assert_eq!(net.ports(&neutron).len(), 1);
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_port_is_bound_and_grouped_only_when_the_settings_ask() {
    let neutron = shared();
    let mut net = Net::on(neutron, "grouped");
    net.extra = json!({"bindHost": true, "securityGroups": null});
    let add = net.run("ADD", "c-g1", net.config().as_bytes());
    assert!(add.status.success(), "{add:?}");
    let port = net.ports(neutron).pop().unwrap();
    assert_eq!(port["binding:host_id"], "node-a", "{port}");
    // The project's default group, as the controller chose it.
    let (status, groups) = neutron.request("GET", "/v2.0/security-groups?name=default", None);
    assert_eq!(status, 200, "{groups}");
    let default = groups["security_groups"][0]["id"].clone();
    assert_eq!(port["security_groups"], json!([default]), "{port}");
    net.run("DEL", "c-g1", net.config().as_bytes())
        .assert_silent_success();
    // Groups named: the port is in those.
    net.extra = json!({"securityGroups": [default]});
    let add = net.run("ADD", "c-g2", net.config().as_bytes());
    assert!(add.status.success(), "{add:?}");
    let port = net.ports(neutron).pop().unwrap();
    assert_eq!(port["security_groups"], json!([default]), "{port}");
    assert_eq!(port["binding:host_id"], "", "{port}");
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_controller_that_forbids_host_binding_and_drops_posted_tags_costs_only_the_binding() {
    let neutron = Neutron::start(Options {
        forbid_host_binding: true,
        drop_posted_tags: true,
        // Nor may the token read how many addresses are left.
        forbid: vec!["get_network_ip_availability"],
        ..Options::default()
    });
    let mut net = Net::on(&neutron, "unbound");
    net.extra = json!({"bindHost": true});
    let config = net.config();
    // STATUS learns only that the network is there: enough.
    net.run("STATUS", "c-b0", config.as_bytes())
        .assert_silent_success();
    let mut elsewhere: Value = serde_json::from_str(&config).unwrap();
    elsewhere["ipam"]["neutron"]["network"] = json!("0c0c0c0c-0000-4000-8000-000000000000");
    says(
        &net.run("STATUS", "c-b0", elsewhere.to_string().as_bytes()),
        50,
        "has no network 0c0c0c0c-0000-4000-8000-000000000000",
    );
    for id in ["c-b1", "c-b2"] {
        let add = net.run("ADD", id, config.as_bytes());
        assert!(add.status.success(), "{add:?}");
        let prev = with_prev(&config, &String::from_utf8(add.stdout.clone()).unwrap());
        net.run("CHECK", id, &prev).assert_silent_success();
    }
    // Killed between its POST and the tags' PUT: the retried ADD tags the
    // port it finds.
    let proxy = Proxy::to(neutron.port);
    let direct = std::mem::replace(&mut net.url, proxy.url());
    proxy.hold_posts();
    let mut killed = common_start(&net, "ADD", "c-b3", net.config().as_bytes());
    proxy.wait_for_held();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &killed.id().to_string()])
        .status();
    let _ = killed.wait();
    proxy.drop_held();
    let untagged: Vec<Value> = net
        .ports(&neutron)
        .into_iter()
        .filter(|p| p["device_id"] == "c-b3")
        .collect();
    assert_eq!(untagged.len(), 1);
    assert_eq!(untagged[0]["tags"], json!([]));
    net.url = direct;
    let retried = net.run("ADD", "c-b3", config.as_bytes());
    assert!(retried.status.success(), "{retried:?}");
    let ports = net.ports(&neutron);
    assert_eq!(ports.len(), 3);
    assert!(
        ports.iter().all(|p| p.get("binding:host_id").is_none()),
        "{ports:?}"
    );
    // The tags the POST lost were set after it: GC sees the ports.
    for port in &ports {
        let tags = crate::tags_of(port);
        assert_eq!(tags, ["cni-network=unbound", "cni-node=node-a"], "{port}");
    }
    net.run("DEL", "c-b1", config.as_bytes())
        .assert_silent_success();
    let mut gc: Value = serde_json::from_str(&config).unwrap();
    for (key, value) in past_the_grace().as_object().unwrap() {
        gc["ipam"]["neutron"][key] = value.clone();
    }
    net.run("GC", "c-gc", &gc_input(&gc.to_string(), json!([])))
        .assert_silent_success();
    assert!(net.ports(&neutron).is_empty());
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_controller_killed_mid_add_is_code_11_and_the_retry_finds_what_it_made() {
    let mut neutron = Neutron::start(Options::default());
    let proxy = Proxy::to(neutron.port);
    let mut net = Net::on(&neutron, "killed");
    net.url = proxy.url();
    let config = net.config();
    proxy.hold_posts();
    let add = std::thread::scope(|scope| {
        let running = scope.spawn(|| net.run("ADD", "c-k1", config.as_bytes()));
        proxy.wait_for_held();
        neutron.kill();
        proxy.drop_held();
        running.join().unwrap()
    });
    says(&add, 11, "out of reach");
    // Down: DEL must be tried again, and STATUS says so.
    net.run("DEL", "c-k1", config.as_bytes()).assert_error(11);
    net.run("STATUS", "c-k1", config.as_bytes())
        .assert_error(50);

    neutron.restart();
    let proxy = Proxy::to(neutron.port);
    net.url = proxy.url();
    let config = net.config();
    let retried = net.run("ADD", "c-k1", config.as_bytes());
    assert!(retried.status.success(), "{retried:?}");
    let ports = net.ports(&neutron);
    assert_eq!(ports.len(), 1, "{ports:?}");
    net.run("DEL", "c-k1", config.as_bytes())
        .assert_silent_success();
    assert!(net.ports(&neutron).is_empty());
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_controller_that_never_answers_is_bounded_by_the_timeout() {
    let neutron = shared();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut net = Net::on(neutron, "silent");
    net.url = format!(
        "http://127.0.0.1:{}/v2.0",
        silent.local_addr().unwrap().port()
    );
    net.extra = json!({"timeout": 2});
    let started = Instant::now();
    let add = net.run("ADD", "c-silent", net.config().as_bytes());
    let took = started.elapsed();
    says(&add, 11, "within the timeout");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(6),
        "{took:?}"
    );
    drop(silent);
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_common_add_costs_two_round_trips_and_a_del_two() {
    let neutron = shared();
    let proxy = Proxy::to(neutron.port);
    let mut net = Net::on(neutron, "counted");
    net.url = proxy.url();
    let config = net.config();
    // The first ADD reads the subnet, and caches it.
    let first = net.run("ADD", "c-n1", config.as_bytes());
    assert!(first.status.success(), "{first:?}");
    assert_eq!(proxy.requests(), 3, "list, create, subnet");
    let second = net.run("ADD", "c-n2", config.as_bytes());
    assert!(second.status.success(), "{second:?}");
    assert_eq!(proxy.requests() - 3, 2, "list, create");
    net.run("DEL", "c-n2", config.as_bytes())
        .assert_silent_success();
    assert_eq!(proxy.requests() - 5, 2, "list, delete");
    // A minute later the subnet is read again.
    let cache = net.data.path().join("subnets").join(&net.subnet);
    let mut kept: Value = serde_json::from_slice(&std::fs::read(&cache).unwrap()).unwrap();
    kept["read"] = json!(kept["read"].as_u64().unwrap() - 61);
    std::fs::write(&cache, kept.to_string()).unwrap();
    let third = net.run("ADD", "c-n3", config.as_bytes());
    assert!(third.status.success(), "{third:?}");
    assert_eq!(proxy.requests() - 7, 3, "list, create, subnet again");
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_controller_that_ignores_filters_and_fills_addresses_later_is_served_all_the_same() {
    let neutron = shared();
    let proxy = Proxy::to(neutron.port);
    proxy.ignore_filters();
    proxy.blank_addresses();
    let mut net = Net::on(neutron, "loose");
    let other = Net::on(neutron, "loose-other");
    net.url = proxy.url();
    let config = net.config();
    // Ports the plugin must never take for its own, listed to it whole:
    // another node's, another owner's, another CNI network's.
    let owner = "cni:ipam-da-neutron";
    for (device, owner, name, tags) in [
        (
            "c-l1",
            owner,
            "loose/default/eth0",
            ["cni-node=node-b", "cni-network=loose"],
        ),
        (
            "c-l1",
            "compute:nova",
            "loose/default/eth0",
            ["cni-node=node-a", "cni-network=loose"],
        ),
        (
            "c-l1",
            owner,
            "loose-other/default/eth0",
            ["cni-node=node-a", "cni-network=loose-other"],
        ),
    ] {
        neutron.port(json!({"network_id": other.network, "device_id": device,
            "device_owner": owner, "name": name, "tags": tags}));
    }
    // The POST's answer has no address: the plugin reads the port again.
    let add = net.run("ADD", "c-l1", config.as_bytes());
    assert!(add.status.success(), "{add:?}");
    let ours = net.ports(neutron);
    assert_eq!(ours.len(), 1);
    assert_eq!(addresses(&add.json()), port_addresses(&ours[0]));
    let again = net.run("ADD", "c-l1", config.as_bytes());
    assert_eq!(addresses(&again.json()), addresses(&add.json()));
    let prev = with_prev(&config, &String::from_utf8(add.stdout.clone()).unwrap());
    net.run("CHECK", "c-l1", &prev).assert_silent_success();
    let mut gc: Value = serde_json::from_str(&config).unwrap();
    for (key, value) in past_the_grace().as_object().unwrap() {
        gc["ipam"]["neutron"][key] = value.clone();
    }
    net.run("GC", "c-gc", &gc_input(&gc.to_string(), json!([])))
        .assert_silent_success();
    assert!(net.ports(neutron).is_empty());
    assert_eq!(other.ports(neutron).len(), 3, "another's port was touched");
    net.run("DEL", "c-l1", config.as_bytes())
        .assert_silent_success();
    assert_eq!(other.ports(neutron).len(), 3, "another's port was touched");
}

#[test]
#[ignore = "needs python3-neutron"]
fn two_pools_each_get_a_port_and_the_runtimes_address_goes_to_the_pool_that_holds_it() {
    let neutron = shared();
    let net = Net::on(neutron, "two-pools");
    let second = neutron.network("two-pools-b");
    let second_subnet = neutron.subnet(
        &second,
        json!({"cidr": "10.79.0.0/24", "gateway_ip": "10.79.0.1",
               "allocation_pools": [{"start": "10.79.0.10", "end": "10.79.0.200"}]}),
    );
    let mut config: Value = serde_json::from_str(&net.config()).unwrap();
    let settings = &mut config["ipam"]["neutron"];
    settings.as_object_mut().unwrap().remove("network");
    settings["pools"] = json!({
        "a": {"network": net.network},
        "b": {"network": second, "subnets": [second_subnet]},
    });
    settings["default"] = json!("a");
    config["ipam"]["delegates"] = json!(["ipam-ds-static", "ipam-da-neutron"]);
    config["ipam"]["static"] = json!({"default": [{"name": "a"}, {"name": "b"}]});
    let config = config.to_string();
    let env = net
        .env("ADD", "c-2p")
        .set("CNI_ARGS", "IgnoreUnknown=1;IP=10.79.0.42");
    let add = crate::common::run_plugin(&env, config.as_bytes());
    assert!(add.status.success(), "{add:?}");
    let result = add.json();
    let got = addresses(&result);
    assert_eq!(got.len(), 2, "{result}");
    assert!(
        got[0].starts_with("10.77.0.") && got[1] == "10.79.0.42",
        "{got:?}"
    );
    let prev = with_prev(&config, &String::from_utf8(add.stdout.clone()).unwrap());
    net.run("CHECK", "c-2p", &prev).assert_silent_success();
    // One pool's port gone behind the plugin's back: CHECK says which.
    let b_port = neutron.ports_of(&second)[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _) = neutron.request("DELETE", &format!("/v2.0/ports/{b_port}"), None);
    assert_eq!(status, 204);
    let check = net.run("CHECK", "c-2p", &prev);
    says(&check, 112, "no port of pool \"b\"");
    net.run("DEL", "c-2p", &prev).assert_silent_success();
    // An address no pool's subnet holds.
    let env = net
        .env("ADD", "c-2q")
        .set("CNI_ARGS", "IgnoreUnknown=1;IP=10.99.0.5");
    let nowhere = crate::common::run_plugin(&env, config.as_bytes());
    says(&nowhere, 111, "no subnet of theirs holds it");
    assert!(net.ports(neutron).is_empty() && neutron.ports_of(&second).is_empty());
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_teardown_needs_no_pool_and_a_network_without_subnet_is_named() {
    let neutron = shared();
    let net = Net::on(neutron, "teardown");
    let add = net.run("ADD", "c-t1", net.config().as_bytes());
    assert!(add.status.success(), "{add:?}");
    // The pools broken since: DEL and GC still run.
    let mut broken: Value = serde_json::from_str(&net.config()).unwrap();
    broken["ipam"]["neutron"]["default"] = json!("gone");
    let broken = broken.to_string();
    net.run("ADD", "c-t2", broken.as_bytes()).assert_error(7);
    net.run("DEL", "c-t1", broken.as_bytes())
        .assert_silent_success();
    net.run("GC", "c-gc", &gc_input(&broken, json!([])))
        .assert_silent_success();
    assert!(net.ports(neutron).is_empty());

    // A network with no subnet: code 7 at once, not a timeout; STATUS 50.
    let mut bare = Net::on(neutron, "teardown-bare");
    bare.network = neutron.network("no-subnet");
    let config = bare.config();
    let started = std::time::Instant::now();
    let add = bare.run("ADD", "c-t3", config.as_bytes());
    says(&add, 7, "has no subnet in network");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(bare.ports(neutron).is_empty());
    let status = bare.run("STATUS", "c-t3", config.as_bytes());
    says(&status, 50, "no subnet");
}

#[test]
#[ignore = "needs python3-neutron"]
fn an_address_a_subnet_no_longer_gives_fails_a_repeated_add_and_its_port_stays() {
    let neutron = shared();
    let net = Net::on(neutron, "shrunk");
    let add = net.run("ADD", "c-s1", net.config().as_bytes());
    assert!(add.status.success(), "{add:?}");
    let held = addresses(&add.json())[0].clone();
    // The allocation pools changed so that the address is outside them.
    let last: u8 = held.rsplit('.').next().unwrap().parse().unwrap();
    let pool = if last > 100 {
        json!([{"start": "10.77.0.10", "end": "10.77.0.20"}])
    } else {
        json!([{"start": "10.77.0.150", "end": "10.77.0.200"}])
    };
    let path = format!("/v2.0/subnets/{}", net.subnet);
    let (status, body) = neutron.request(
        "PUT",
        &path,
        Some(json!({"subnet": {"allocation_pools": pool}})),
    );
    assert_eq!(status, 200, "{body}");
    std::fs::remove_dir_all(net.data.path().join("subnets")).unwrap();
    // The allocator alone: ipam-delegated undoes a failed ADD with DEL,
    // as a runtime does after it.
    let again = crate::common::run_program(
        PORT_ALLOCATOR,
        std::path::Path::new("/"),
        &[],
        &net.env("ADD", "c-s1"),
        net.config().as_bytes(),
    );
    says(&again, 111, "allocation pools");
    // The container may still use it: DEL gives it back, not ADD.
    assert_eq!(net.ports(neutron).len(), 1);
    net.run("DEL", "c-s1", net.config().as_bytes())
        .assert_silent_success();
}

#[test]
#[ignore = "needs python3-neutron"]
fn tls_that_cannot_be_agreed_is_code_5() {
    let neutron = shared();
    let certificates = crate::common::etcd::Certificates::make();
    let mut net = Net::on(neutron, "tls");
    // The controller speaks plain HTTP on the port given as https.
    net.url = format!("https://127.0.0.1:{}/v2.0", neutron.port);
    net.extra = json!({"tls": {"ca": certificates.file("ca.pem")}});
    let add = net.run("ADD", "c-tls", net.config().as_bytes());
    says(&add, 5, "TLS with the controller at https://127.0.0.1");
    assert!(net.ports(neutron).is_empty());
}

#[test]
#[ignore = "needs python3-neutron"]
fn https_with_the_ca_that_signed_the_controller_and_refused_with_another() {
    let certificates = crate::common::etcd::Certificates::make();
    let neutron = Neutron::start(Options {
        tls: Some(crate::common::neutron::Tls {
            cert: certificates.file("member.pem"),
            key: certificates.file("member.key"),
            ca: certificates.file("ca.pem"),
        }),
        ..Options::default()
    });
    let mut net = Net::on(&neutron, "https");
    assert!(net.url.starts_with("https://"), "{}", net.url);
    net.extra = json!({"tls": {"ca": certificates.file("ca.pem")}});
    let config = net.config();
    let add = net.run("ADD", "c-h1", config.as_bytes());
    assert!(add.status.success(), "{add:?}");
    let prev = with_prev(&config, &String::from_utf8(add.stdout.clone()).unwrap());
    net.run("CHECK", "c-h1", &prev).assert_silent_success();
    net.run("DEL", "c-h1", config.as_bytes())
        .assert_silent_success();
    assert!(net.ports(&neutron).is_empty());
    // A CA that did not sign the controller's certificate: code 5.
    net.extra = json!({"tls": {"ca": certificates.file("other.pem")}});
    says(
        &net.run("ADD", "c-h2", net.config().as_bytes()),
        5,
        "TLS with the controller at https://127.0.0.1",
    );
    assert!(net.ports(&neutron).is_empty());
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_dual_stack_network_gives_one_address_of_each_version_in_each_versions_shape() {
    let neutron = shared();
    let net = Net::on(neutron, "dual");
    neutron.subnet(
        &net.network,
        json!({"ip_version": 6, "cidr": "fd00:77::/64", "gateway_ip": "fd00:77::1",
               "allocation_pools": [{"start": "fd00:77::10", "end": "fd00:77::ff"}]}),
    );
    for (id, version) in [("c-d1", "0.4.0"), ("c-d2", "1.0.0")] {
        let config = net.config_of(version, &["ipam-da-neutron"]);
        let add = net.run("ADD", id, config.as_bytes());
        assert!(add.status.success(), "{add:?}");
        let result = add.json();
        let ips = result["ips"].as_array().unwrap();
        assert_eq!(ips.len(), 2, "{result}");
        let v6 = ips
            .iter()
            .find(|ip| ip["address"].as_str().unwrap().starts_with("fd00:77::"))
            .unwrap();
        assert!(v6["address"].as_str().unwrap().ends_with("/64"), "{result}");
        assert_eq!(v6["gateway"], "fd00:77::1");
        match version {
            // Before 1.0.0 each entry says its version, first.
            "0.4.0" => {
                assert_eq!(v6.as_object().unwrap().keys().next().unwrap(), "version");
                assert_eq!(v6["version"], "6");
            }
            _ => assert!(v6.get("version").is_none(), "{result}"),
        }
        let prev = with_prev(&config, &String::from_utf8(add.stdout.clone()).unwrap());
        net.run("CHECK", id, &prev).assert_silent_success();
    }
    assert_eq!(net.ports(neutron).len(), 2);
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_network_the_controller_does_not_have_is_code_7_naming_it() {
    let neutron = shared();
    let mut net = Net::on(neutron, "unknown");
    net.network = "0d0d0d0d-0000-4000-8000-000000000000".into();
    says(
        &net.run("ADD", "c-u1", net.config().as_bytes()),
        7,
        "0d0d0d0d-0000-4000-8000-000000000000",
    );
}

#[test]
#[ignore = "needs python3-neutron and faketime"]
fn gc_judges_a_ports_age_by_the_controllers_clock_not_the_nodes() {
    let neutron = shared();
    let mut net = Net::on(neutron, "skewed");
    let add = net.run("ADD", "c-sk", net.config().as_bytes());
    assert!(add.status.success(), "{add:?}");
    // GC with the node's clock `offset` off, grace `grace`.
    let gc = |net: &mut Net, offset: &str, extra: Value| {
        net.extra = extra;
        let env = net
            .env("GC", "c-gc")
            .set(
                "LD_PRELOAD",
                &crate::common::libfaketime().display().to_string(),
            )
            .set("FAKETIME", offset)
            .set("DONT_FAKE_MONOTONIC", "1");
        crate::common::run_plugin(&env, &gc_input(&net.config(), json!([])))
    };
    // The node's clock two hours ahead: by it the port is old, by the
    // controller's it is a moment old, and it stays.
    gc(&mut net, "+2h", json!({"gcGraceSeconds": 3600})).assert_silent_success();
    assert_eq!(net.ports(neutron).len(), 1);
    // Past the grace by the controller's clock, it goes, whatever the
    // node's clock says.
    gc(&mut net, "-2h", past_the_grace()).assert_silent_success();
    assert!(net.ports(neutron).is_empty());
}
