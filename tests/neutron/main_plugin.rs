//! ipam-da-neutron under a real main plugin: Debian's bridge puts the
//! port's address and the subnet's routes on a container's interface, in
//! a network namespace of the test's own, and DEL gives the port back.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::common::{run_program, PLUGIN};
use crate::{addresses, port_addresses, shared, Net};

/// Debian's bridge (containernetworking-plugins).
const BRIDGE: &str = "/usr/lib/cni/bridge";

/// A network namespace standing in for a container's, and the bridge the
/// plugin makes on the host: both removed when dropped, however the test
/// ends.
struct Sandbox {
    netns: String,
    bridge: String,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}

/// `ip ARGS`, which must succeed: its output.
fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(out.status.success(), "ip {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "needs root, python3-neutron and containernetworking-plugins"]
fn debians_bridge_puts_the_ports_address_and_routes_on_the_containers_interface() {
    assert!(
        Path::new(BRIDGE).exists(),
        "needs Debian's containernetworking-plugins"
    );
    let neutron = shared();
    let net = Net::on(neutron, "bridged");
    // The bridge finds ipam-delegated in CNI_PATH, as a runtime's would.
    net.stack.link("ipam-delegated", Path::new(PLUGIN));
    let sandbox = Sandbox {
        netns: format!("ipdn-{}", std::process::id()),
        bridge: format!("ipdn{}", std::process::id() % 100_000),
    };
    ip(&["netns", "add", &sandbox.netns]);
    let mut config: Value =
        serde_json::from_str(&net.config_of("1.0.0", &["ipam-da-neutron"])).unwrap();
    config["bridge"] = json!(sandbox.bridge);
    let config = config.to_string();
    let env = |command: &str| {
        net.env(command, "c-bridged")
            .set("CNI_NETNS", &format!("/run/netns/{}", sandbox.netns))
    };
    let run = |command: &str, stdin: &[u8]| {
        run_program(BRIDGE, Path::new("/"), &[], &env(command), stdin)
    };

    let add = run("ADD", config.as_bytes());
    assert!(add.status.success(), "{add:?}");
    let result = add.json();
    let ports = net.ports(neutron);
    assert_eq!(ports.len(), 1);
    let address = addresses(&result)[0].clone();
    assert_eq!(vec![address.clone()], port_addresses(&ports[0]));
    let shown = ip(&[
        "-n",
        &sandbox.netns,
        "-o",
        "-4",
        "addr",
        "show",
        "dev",
        "eth0",
    ]);
    assert!(shown.contains(&format!("inet {address}/24")), "{shown}");
    let routes = ip(&["-n", &sandbox.netns, "route"]);
    assert!(routes.contains("10.78.0.0/16 via 10.77.0.254"), "{routes}");

    let prev = crate::common::with_prev(&config, &String::from_utf8(add.stdout.clone()).unwrap());
    run("CHECK", &prev).assert_silent_success();
    run("DEL", &prev).assert_silent_success();
    assert!(net.ports(neutron).is_empty());
    let links = ip(&["-n", &sandbox.netns, "-o", "link"]);
    assert!(!links.contains("eth0"), "{links}");
}
