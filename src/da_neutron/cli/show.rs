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
pool, port ID and addresses. --json prints one JSON object,
{\"network\": NAME, \"nodes\": {NODE: [PORT, ...]}}. It changes
nothing.
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
    let mut out = std::io::stdout().lock();
    if given.flag("--json") {
        let nodes: serde_json::Map<String, Value> = by_node
            .iter()
            .map(|(node, list)| {
                let ports = list.iter().map(|(p, a)| port_json(p, a)).collect();
                (node.clone(), Value::Array(ports))
            })
            .collect();
        let _ = writeln!(
            out,
            "{}",
            serde_json::json!({ "network": name, "nodes": nodes })
        );
    } else {
        for (node, list) in &by_node {
            let _ = writeln!(out, "node {node}: {} port(s)", list.len());
            for (port, attachment) in list {
                let _ = writeln!(out, "  {}", port_line(port, attachment));
            }
        }
    }
    Ok(true)
}
