//! `ipam-da-neutron keeper`: keeps this node's warm pools of one CNI
//! network, until asked to stop.

use std::path::PathBuf;

use super::{finish, read_network};
use crate::args::{Opt, Verb};
use crate::da_neutron::error::NeutronError;
use crate::da_neutron::warm::keeper::Keeper;

/// `keeper`.
pub(super) const VERB: Verb = Verb {
    name: "keeper",
    synopsis: "--config PATH [--network NAME]",
    options: &[Opt::value("--config"), Opt::value("--network")],
    operands: false,
    help: "\
Keeps this node's warm pools of the network (the pools with
\"warm\" in ipam.neutron), round after round: refills each
below its \"min\" up to its \"max\" by bulk requests of
\"batch\" ports, records on each port an ADD handed out its
owner, sets the ledger under dataDir against the controller,
beats (for the node's ADDs, and for the other nodes' keepers),
and deletes the free pooled ports of a node whose keeper
stopped beating for two graces. ADDs hand out only while it
beats. One keeper per network and node: a second one waits.
Runs until SIGTERM or SIGINT, then exits 0. Logs to stderr.
",
    run: |given| {
        let config = given.path("--config").ok_or("keeper needs --config")?;
        Ok(finish(run(config, given.value("--network"))))
    },
};

fn run(config: PathBuf, network: Option<&str>) -> Result<bool, NeutronError> {
    let (name, settings) = read_network(&config, network)?;
    let mut log = std::io::stderr();
    Keeper::new(&settings, &name, &mut log)?.keep();
    Ok(true)
}
