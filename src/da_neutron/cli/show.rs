//! `ipam-da-neutron show`: the network's ports of this plugin, by node and
//! attachment, as the controller lists them now.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;

use serde_json::Value;

use super::{finish, network_ports, port_json, port_line, read_network};
use crate::args::{Opt, Options, Verb};
use crate::da_neutron::api::Controller;
use crate::da_neutron::error::NeutronError;
use crate::da_neutron::ports::OWNER;
use crate::da_neutron::warm;

/// `show`.
pub(super) const VERB: Verb = Verb {
    name: "show",
    synopsis: "--config PATH [--network NAME] [--json]",
    options: &[
        Opt::value("--config"),
        Opt::value("--network"),
        Opt::flag("--json"),
    ],
    operands: false,
    help: "\
Lists the network's ports that this plugin made, at the
controller, by node: each with its container ID, interface,
pool, port ID and addresses; and how many free ports each node's
warm pools keep. --json prints one JSON object, {\"network\":
NAME, \"nodes\": {NODE: [PORT, ...]}, \"warmFree\": {NODE: N}}.
It changes nothing.
",
    run: |given| {
        let config = given.path("--config").ok_or("show needs --config")?;
        Ok(finish(run(config, given)))
    },
};

fn run(config: PathBuf, given: &Options) -> Result<bool, NeutronError> {
    let (name, settings) = read_network(&config, given.value("--network"))?;
    let controller = Controller::open(&settings)?;
    let mut by_node: BTreeMap<String, Vec<_>> = BTreeMap::new();
    let cluster = settings.cluster.as_deref();
    for (port, attachment) in network_ports(&controller, &name, None, cluster)? {
        let node = super::ports::node_of(&port).unwrap_or_default();
        by_node.entry(node).or_default().push((port, attachment));
    }
    // The warm pools' free ports, by node: counted, not listed.
    let mut unheld: BTreeMap<String, usize> = BTreeMap::new();
    let free = controller.ports(&[("device_owner", OWNER), ("tags", warm::FREE)])?;
    for port in free.iter().filter(|p| warm::looks_free(p)) {
        let ours = port.tags.contains(&format!("cni-network={name}"));
        if ours && !super::ports::foreign(port, cluster) {
            let node = super::ports::node_of(port).unwrap_or_default();
            *unheld.entry(node.clone()).or_default() += 1;
            by_node.entry(node).or_default();
        }
    }
    let mut out = std::io::stdout().lock();
    if given.flag("--json") {
        let nodes: serde_json::Map<String, Value> = by_node
            .iter()
            .map(|(node, list)| {
                let ports = list.iter().map(|(p, a)| port_json(p, a)).collect();
                (node.clone(), Value::Array(ports))
            })
            .collect();
        let json = serde_json::json!({ "network": name, "nodes": nodes, "warmFree": unheld });
        let _ = writeln!(out, "{json}");
    } else {
        for (node, list) in &by_node {
            let free = unheld.get(node).copied().unwrap_or_default();
            let _ = writeln!(
                out,
                "node {node}: {} port(s), {free} free in its warm pools",
                list.len()
            );
            for (port, attachment) in list {
                let _ = writeln!(out, "  {}", port_line(port, attachment));
            }
        }
    }
    Ok(true)
}
