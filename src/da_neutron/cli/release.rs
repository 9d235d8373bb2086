//! `ipam-da-neutron release --node`: deletes the ports of the network a
//! node that will not come back holds, which no DEL or GC of its own
//! will ever delete.

use std::io::Write as _;
use std::path::PathBuf;

use serde_json::Value;

use super::{finish, network_ports, port_json, port_line, read_network};
use crate::args::{Opt, Options, Verb};
use crate::da_neutron::api::Controller;
use crate::da_neutron::error::NeutronError;
use crate::da_neutron::ports::Marks;
use crate::da_neutron::warm;

/// `release`.
pub(super) const VERB: Verb = Verb {
    name: "release",
    synopsis: "--config PATH [--network NAME] --node NAME [--dry-run] [--json]",
    options: &[
        Opt::value("--config"),
        Opt::value("--network"),
        Opt::value("--node"),
        Opt::flag("--dry-run"),
        Opt::flag("--json"),
    ],
    operands: false,
    help: "\
Deletes the network's ports that this plugin made for node
NAME, one that will not come back, and prints them (with
--dry-run, prints what it would delete, and deletes nothing):
its attachments' ports, then the ports no attachment holds (its
warm pools' free ports, and its keeper's heartbeat, \"unheld\").
Nothing of that node's is exit status 1. A port already gone
counts as deleted. Another node's ports, another cluster's
(\"ipam.neutron.cluster\"), and ports another owner made, are
never touched.
",
    run: |given| {
        let config = given.path("--config").ok_or("release needs --config")?;
        let node = given.value("--node").ok_or("release needs --node NAME")?;
        Ok(finish(run(config, node, given)))
    },
};

fn run(config: PathBuf, node: &str, given: &Options) -> Result<bool, NeutronError> {
    let (name, settings) = read_network(&config, given.value("--network"))?;
    let controller = Controller::open(&settings)?;
    let dry_run = given.flag("--dry-run");
    let found = network_ports(&controller, &name, Some(node), settings.cluster.as_deref())?;
    let mut out = std::io::stdout().lock();
    let mut listed = Vec::new();
    for (port, attachment) in &found {
        if !dry_run {
            // Each with time of its own: a node may have had many.
            controller.renewed().delete_port(&port.id)?;
        }
        if given.flag("--json") {
            listed.push(port_json(port, attachment));
        } else {
            let verb = if dry_run { "would delete" } else { "deleted" };
            let _ = writeln!(out, "{verb} {}", port_line(port, attachment));
        }
    }
    // Its warm pools' free ports and its keeper's heartbeat.
    let marks = Marks {
        node,
        network: &name,
        cluster: settings.cluster.as_deref(),
    };
    let pooled = warm::pooled_of_node(&controller, &marks)?;
    let mut pooled_listed = Vec::new();
    for port in &pooled {
        if !dry_run {
            controller.renewed().delete_port(&port.id)?;
        }
        let addresses: Vec<String> = port.fixed_ips.iter().map(|(_, a)| a.to_string()).collect();
        if given.flag("--json") {
            pooled_listed.push(serde_json::json!({ "port": port.id, "addresses": addresses }));
        } else {
            let verb = if dry_run { "would delete" } else { "deleted" };
            let _ = writeln!(
                out,
                "{verb} unheld port {} {}",
                port.id,
                addresses.join(", ")
            );
        }
    }
    if given.flag("--json") {
        let key = if dry_run { "wouldDelete" } else { "deleted" };
        let json = serde_json::json!({ key: Value::Array(listed), "unheld": pooled_listed });
        let _ = writeln!(out, "{json}");
    }
    Ok(!found.is_empty() || !pooled.is_empty())
}
