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
--dry-run, prints what it would delete, and deletes nothing).
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
    if given.flag("--json") {
        let key = if dry_run { "wouldDelete" } else { "deleted" };
        let _ = writeln!(out, "{}", serde_json::json!({ key: Value::Array(listed) }));
    }
    Ok(!found.is_empty())
}
