//! `ipam-da-pool node-keeper`: keeps this node registered in the etcd
//! cluster its configuration names, until asked to stop.

use std::path::PathBuf;

use super::{cluster_of, finish, read_network};
use crate::args::{Opt, Options, Verb};
use crate::da_pool::cluster::keeper;
use crate::da_pool::error::PoolError;
use crate::da_pool::store::Stores;

/// `node-keeper`.
pub(super) const VERB: Verb = Verb {
    name: "node-keeper",
    synopsis: "--config PATH [--network NAME]",
    options: &[Opt::value("--config"), Opt::value("--network")],
    operands: false,
    help: "\
Keeps this node (ipam.pool.node, or the name pinned at first
use) registered in the etcd cluster the configuration names: a
key under a lease of ipam.pool.nodeTTL seconds (60 by default),
renewed every third of it by a keep-alive that writes nothing.
While `reclaim` has the node fenced, says so as an error at
every renewal. Runs until SIGTERM or SIGINT, then withdraws the
registration and exits 0. Logs to stderr.
",
    run: |given| Ok(finish(run(&options(given)?))),
};

/// `node-keeper`'s options.
#[derive(Debug, PartialEq)]
struct Keeper {
    config: PathBuf,
    network: Option<String>,
}

fn options(given: &Options) -> Result<Keeper, String> {
    Ok(Keeper {
        config: given.path("--config").ok_or("node-keeper needs --config")?,
        network: given.value("--network").map(String::from),
    })
}

/// Keeps the node registered until asked to stop.
fn run(options: &Keeper) -> Result<bool, PoolError> {
    let (_, settings) = read_network(&options.config, options.network.as_deref())?;
    let client = cluster_of(
        &Stores::new(&settings.store),
        &options.config,
        "node-keeper",
    )?;
    keeper::keep(
        &client,
        &settings.node,
        settings.node_ttl,
        &mut std::io::stderr(),
    )?;
    Ok(true)
}
