//! ipam-da-neutron's operator verbs on a real Neutron: `show`, and
//! `release --node` for a node that will not come back.

use std::path::Path;

use serde_json::{json, Value};

use crate::common::{run_program, Env, PORT_ALLOCATOR};
use crate::{says, shared, Net};

/// Runs the allocator's command line.
fn cli(args: &[&str]) -> crate::common::Outcome {
    run_program(PORT_ALLOCATOR, Path::new("/"), args, &Env(vec![]), b"")
}

#[test]
#[ignore = "needs python3-neutron"]
fn release_deletes_only_the_named_nodes_ports_and_show_lists_them_by_node() {
    let neutron = shared();
    let mut net = Net::on(neutron, "decommissioned");
    for (node, id) in [("node-a", "c-a1"), ("node-a", "c-a2"), ("node-b", "c-b1")] {
        net.extra = json!({ "host": node });
        let add = net.run("ADD", id, net.config().as_bytes());
        assert!(add.status.success(), "{add:?}");
    }
    let foreign = neutron.port(json!({
        "network_id": net.network, "device_id": "c-a1", "device_owner": "compute:nova",
        "tags": ["cni-node=node-a", "cni-network=decommissioned"],
    }));
    let file = net.data.path().join("net.conf");
    std::fs::write(&file, net.config()).unwrap();
    let config = file.to_str().unwrap();

    let show = cli(&["show", "--config", config, "--json"]);
    assert!(show.status.success(), "{show:?}");
    let listed = show.json();
    assert_eq!(
        listed["nodes"]["node-a"].as_array().unwrap().len(),
        2,
        "{listed}"
    );
    assert_eq!(listed["nodes"]["node-b"][0]["containerID"], "c-b1");
    let text = cli(&["show", "--config", config]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("node node-a: 2 port(s)"),
        "{text:?}"
    );

    let dry = cli(&[
        "release",
        "--config",
        config,
        "--node",
        "node-a",
        "--dry-run",
        "--json",
    ]);
    assert!(dry.status.success(), "{dry:?}");
    assert_eq!(dry.json()["wouldDelete"].as_array().unwrap().len(), 2);
    assert_eq!(net.ports(neutron).len(), 4);

    let released = cli(&["release", "--config", config, "--node", "node-a"]);
    assert!(released.status.success(), "{released:?}");
    let said = String::from_utf8_lossy(&released.stdout).to_string();
    assert_eq!(
        said.lines()
            .filter(|l| l.starts_with("deleted c-a"))
            .count(),
        2,
        "{said}"
    );
    let mut left: Vec<Value> = net
        .ports(neutron)
        .iter()
        .map(|p| json!([p["device_id"], p["device_owner"]]))
        .collect();
    left.sort_by_key(|v| v.to_string());
    assert_eq!(
        left,
        [
            json!(["c-a1", "compute:nova"]),
            json!(["c-b1", "cni:ipam-da-neutron"])
        ]
    );
    assert_eq!(
        net.ports(neutron)
            .iter()
            .filter(|p| p["id"] == foreign["id"])
            .count(),
        1
    );

    // Nothing left of that node's: exit 1, said plainly.
    let again = cli(&["release", "--config", config, "--node", "node-a"]);
    assert!(
        !again.status.success() && again.stdout.is_empty(),
        "{again:?}"
    );
    // A usage mistake.
    let usage = cli(&["release", "--config", config]);
    assert!(usage.stderr.contains("release needs --node"), "{usage:?}");
}

#[test]
#[ignore = "needs python3-neutron"]
fn validate_checks_the_settings_without_calling_the_controller() {
    let neutron = shared();
    let mut net = Net::on(neutron, "validated");
    // Nothing listens there: a call would fail.
    net.url = format!(
        "http://127.0.0.1:{}/v2.0",
        crate::common::neutron::free_port()
    );
    let valid = run_program(
        PORT_ALLOCATOR,
        Path::new("/"),
        &["validate"],
        &Env(vec![]),
        net.config().as_bytes(),
    );
    assert!(
        valid.status.success() && valid.stdout.is_empty(),
        "{valid:?}"
    );
    net.extra = json!({"subnet": "s"});
    let invalid = run_program(
        PORT_ALLOCATOR,
        Path::new("/"),
        &["validate"],
        &Env(vec![]),
        net.config().as_bytes(),
    );
    says(&invalid, 7, "unknown key \"ipam.neutron.subnet\"");
}

#[test]
#[ignore = "needs python3-neutron"]
fn a_controller_that_pages_its_lists_is_read_to_the_last_page() {
    let neutron = crate::common::neutron::Neutron::start(crate::common::neutron::Options {
        page_size: Some(2),
        ..Default::default()
    });
    let mut net = Net::on(&neutron, "paged");
    for i in 0..5 {
        let add = net.run("ADD", &format!("c-p{i}"), net.config().as_bytes());
        assert!(add.status.success(), "{add:?}");
    }
    let file = net.data.path().join("net.conf");
    std::fs::write(&file, net.config()).unwrap();
    let config = file.to_str().unwrap();
    let show = cli(&["show", "--config", config, "--json"]);
    assert_eq!(
        show.json()["nodes"]["node-a"].as_array().unwrap().len(),
        5,
        "{show:?}"
    );
    // GC sees every page: all five go.
    net.extra = json!({"gcGraceSeconds": 0});
    let mut gc: Value = serde_json::from_str(&net.config()).unwrap();
    gc["cni.dev/valid-attachments"] = json!([]);
    net.run("GC", "c-gc", gc.to_string().as_bytes())
        .assert_silent_success();
    assert!(net.ports(&neutron).is_empty(), "{:?}", net.ports(&neutron));
}
