//! ipam-da-neutron's operator verbs on a real Neutron: `show`, and
//! `release --node` for a node that will not come back; and lists read
//! to their last page, or refused where a page cannot be followed.

use std::path::Path;

use serde_json::{json, Value};

use crate::common::{run_program, Env, PORT_ALLOCATOR};
use crate::{past_the_grace, says, shared, Net};

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

/// `net`'s configuration written where the operator's verbs read it.
fn config_file(net: &Net, name: &str) -> String {
    let file = net.data.path().join(name);
    std::fs::write(&file, net.config()).unwrap();
    file.display().to_string()
}

/// `extra` with the members `more` adds.
fn with(mut extra: Value, more: Value) -> Value {
    for (key, value) in more.as_object().unwrap() {
        extra[key] = value.clone();
    }
    extra
}

#[test]
#[ignore = "needs python3-neutron"]
fn clusters_that_share_node_and_network_names_never_touch_each_others_ports() {
    let neutron = shared();
    // Three CNI networks named alike on node-a: one that names no
    // cluster (as before `cluster` was set), and two clusters.
    let nets: Vec<Net> = [
        json!({}),
        json!({"cluster": "east"}),
        json!({"cluster": "west"}),
    ]
    .into_iter()
    .map(|cluster| {
        let mut net = Net::on(neutron, "alike");
        net.extra = cluster;
        net
    })
    .collect();
    for (i, net) in nets.iter().enumerate() {
        let add = net.run("ADD", &format!("c-{i}"), net.config().as_bytes());
        assert!(add.status.success(), "{add:?}");
    }
    // Each one's `show`, `release --node` and GC sees its own port alone:
    // the others' are there still, or gone by their own GC.
    let grace = past_the_grace();
    for (i, net) in nets.iter().enumerate() {
        let file = config_file(net, "alike.conf");
        let show = cli(&["show", "--config", &file, "--json"]);
        let shown = show.json()["nodes"]["node-a"].clone();
        assert_eq!(shown.as_array().unwrap().len(), 1, "{i}: {show:?}");
        assert_eq!(shown[0]["containerID"], format!("c-{i}"), "{show:?}");
        let dry = cli(&[
            "release",
            "--config",
            &file,
            "--node",
            "node-a",
            "--dry-run",
            "--json",
        ]);
        let listed = dry.json()["wouldDelete"].clone();
        assert_eq!(listed.as_array().unwrap().len(), 1, "{i}: {dry:?}");
        assert_eq!(listed[0]["containerID"], format!("c-{i}"), "{dry:?}");
        let mut gc: Value = serde_json::from_str(&net.config()).unwrap();
        gc["ipam"]["neutron"] = with(gc["ipam"]["neutron"].take(), grace.clone());
        gc["cni.dev/valid-attachments"] = json!([]);
        net.run("GC", "c-gc", gc.to_string().as_bytes())
            .assert_silent_success();
        let left: Vec<usize> = nets.iter().map(|n| n.ports(neutron).len()).collect();
        let expected: Vec<usize> = (0..nets.len()).map(|j| usize::from(j > i)).collect();
        assert_eq!(left, expected, "after network {i}'s GC");
    }
    // One container ID in two clusters (east's, west's): a DEL that cannot
    // read its node's name takes the ID's word, within its own cluster.
    for net in &nets[1..] {
        let add = net.run("ADD", "c-same", net.config().as_bytes());
        assert!(add.status.success(), "{add:?}");
    }
    let pin = nets[1].data.path().join("node-name");
    std::fs::write(&pin, "not,a tag's name\n").unwrap();
    let mut nameless: Value = serde_json::from_str(&nets[1].config()).unwrap();
    let settings = nameless["ipam"]["neutron"].as_object_mut().unwrap();
    settings.remove("host");
    settings.insert("nodeNameFile".into(), json!(pin));
    nets[1]
        .run("DEL", "c-same", nameless.to_string().as_bytes())
        .assert_silent_success();
    let left: Vec<usize> = nets.iter().map(|n| n.ports(neutron).len()).collect();
    assert_eq!(left, [0, 0, 1], "west's port of c-same is to stay");
}

#[test]
#[ignore = "needs python3-neutron"]
fn marks_fit_the_controller_and_read_back_whatever_the_node_is_called() {
    let neutron = shared();
    // A node name with spaces and a `%`; and one as long as Kubernetes
    // allows (253: its tag is a digest), beside a CNI network name of 200,
    // whose marks pass the 255 characters of a description (which is a
    // digest of them then).
    let long = "n".repeat(253);
    let mut spaced = Net::on(neutron, "marked");
    spaced.extra = json!({"host": "rack 7 % a", "cluster": "east"});
    let mut long_net = Net::on(neutron, &"w".repeat(200));
    long_net.extra = json!({"host": long, "cluster": "east"});
    for (net, id) in [(&spaced, "c-spaced"), (&long_net, "c-long")] {
        let add = net.run("ADD", id, net.config().as_bytes());
        assert!(add.status.success(), "{add:?}");
        // Their tags lost (a controller that drops them, a plugin killed
        // before it set them again): the descriptions still find them.
        for port in net.ports(neutron) {
            let path = format!("/v2.0/ports/{}/tags", port["id"].as_str().unwrap());
            let (status, said) = neutron.request("PUT", &path, Some(json!({"tags": []})));
            assert_eq!(status, 200, "{said}");
            assert!(port["description"].as_str().unwrap().len() <= 255, "{port}");
        }
    }
    let file = config_file(&spaced, "spaced.conf");
    let show = cli(&["show", "--config", &file, "--json"]);
    assert_eq!(
        show.json()["nodes"]["rack 7 % a"][0]["containerID"],
        "c-spaced",
        "{show:?}"
    );
    for (net, host, id) in [
        (&spaced, "rack 7 % a", "c-spaced"),
        (&long_net, &*long, "c-long"),
    ] {
        let file = config_file(net, "marked.conf");
        let dry = cli(&[
            "release",
            "--config",
            &file,
            "--node",
            host,
            "--dry-run",
            "--json",
        ]);
        let listed = dry.json()["wouldDelete"].clone();
        assert_eq!(listed.as_array().unwrap().len(), 1, "{dry:?}");
        assert_eq!(listed[0]["containerID"], id, "{dry:?}");
    }
    // GC of the long-named node finds its port by the digest alone.
    let marks = long_net.extra.clone();
    long_net.extra = with(past_the_grace(), marks);
    let mut gc: Value = serde_json::from_str(&long_net.config()).unwrap();
    gc["cni.dev/valid-attachments"] = json!([]);
    long_net
        .run("GC", "c-gc", gc.to_string().as_bytes())
        .assert_silent_success();
    assert!(long_net.ports(neutron).is_empty());
    assert_eq!(spaced.ports(neutron).len(), 1);
    // A pool name that makes the port's name too long is refused before
    // any request.
    let pool = "p".repeat(60);
    long_net.extra = json!({"pools": {&pool: {"network": long_net.network}}, "default": pool});
    let mut config: Value = serde_json::from_str(&long_net.config()).unwrap();
    config["ipam"]["neutron"]
        .as_object_mut()
        .unwrap()
        .remove("network");
    says(
        &long_net.run("ADD", "c-named", config.to_string().as_bytes()),
        7,
        "shorten the CNI network's or the pool's name",
    );
    assert!(long_net.ports(neutron).is_empty());
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
    net.extra = past_the_grace();
    let gc = |net: &Net| {
        let mut gc: Value = serde_json::from_str(&net.config()).unwrap();
        gc["cni.dev/valid-attachments"] = json!([]);
        gc.to_string()
    };
    // Through a proxy that links each next page under another root, GC
    // fails naming the link, rather than take the first page for all.
    let proxy = crate::proxy::Proxy::to(neutron.port);
    proxy.foreign_links();
    let direct = std::mem::replace(&mut net.url, proxy.url());
    let failed = net.run("GC", "c-gc", gc(&net).as_bytes());
    says(&failed, 7, "at http://127.0.0.1:");
    says(&failed, 7, "/elsewhere/v2.0/ports?");
    let show = cli(&["show", "--config", config, "--json"]);
    assert_eq!(
        show.json()["nodes"]["node-a"].as_array().unwrap().len(),
        5,
        "{show:?}"
    );
    // GC sees every page: all five go.
    net.url = direct;
    net.run("GC", "c-gc", gc(&net).as_bytes())
        .assert_silent_success();
    assert!(net.ports(&neutron).is_empty(), "{:?}", net.ports(&neutron));
}
