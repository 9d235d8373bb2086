//! `ipam-da-neutron keeper`: keeps this node's warm pools of one CNI
//! network, until asked to stop.

use std::path::PathBuf;

use super::{finish, read_network};
use crate::args::{Opt, Verb};
use crate::da_neutron::error::NeutronError;
use crate::da_neutron::settings::invalid;
use crate::da_neutron::warm::keeper::Keeper;
use crate::node_name;

/// `keeper`.
pub(super) const VERB: Verb = Verb {
    name: "keeper",
    synopsis: "--config PATH [--network NAME] [--node-name NAME [--node-name-file FILE]]",
    options: &[
        Opt::value("--config"),
        Opt::value("--network"),
        Opt::value("--node-name"),
        Opt::value("--node-name-file"),
    ],
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
With --node-name, first pins NAME as `ipam-delegated install
--node-name` does (in /var/lib/cni/ipam-da-pool/node-name, or
FILE), so that a keeper started before the installer marks the
node's ports with the name the plugin will read: a different
name pinned already, or a configuration that names another
node, is refused.
",
    run: |given| {
        let config = given.path("--config").ok_or("keeper needs --config")?;
        let node_name = node_name::given(given)?;
        Ok(finish(run(config, given.value("--network"), node_name)))
    },
};

fn run(
    config: PathBuf,
    network: Option<&str>,
    node_name: Option<(String, PathBuf)>,
) -> Result<bool, NeutronError> {
    if let Some((name, file)) = &node_name {
        node_name::pin(file, name)?;
    }
    let (name, settings) = read_network(&config, network)?;
    if let Some((pinned, _)) =
        node_name.filter(|(pinned, _)| settings.node().ok() != Some(pinned.as_str()))
    {
        return Err(invalid(format!(
            "{} marks ports as node {:?} (ipam.neutron.host, or another nodeNameFile), not {pinned:?}",
            config.display(),
            settings.node().unwrap_or_default()
        )));
    }
    let mut log = std::io::stderr();
    Keeper::new(&settings, &name, &mut log)?.keep();
    Ok(true)
}
