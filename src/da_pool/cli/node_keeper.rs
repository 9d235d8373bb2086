//! `ipam-da-pool node-keeper`: keeps this node registered in the etcd
//! cluster its configuration names, until asked to stop.

use std::path::PathBuf;

use super::{cluster_of, finish, read_network};
use crate::args::{Opt, Options, Verb};
use crate::da_pool::cluster::keeper;
use crate::da_pool::error::PoolError;
use crate::da_pool::settings::invalid;
use crate::da_pool::store::Stores;
use crate::node_name;

/// `node-keeper`.
pub(super) const VERB: Verb = Verb {
    name: "node-keeper",
    synopsis: "--config PATH [--network NAME] [--node-name NAME [--node-name-file FILE]]",
    options: &[
        Opt::value("--config"),
        Opt::value("--network"),
        Opt::value("--node-name"),
        Opt::value("--node-name-file"),
    ],
    operands: false,
    help: "\
Keeps this node (ipam.pool.node, or the name pinned at first
use) registered in the etcd cluster the configuration names: a
key under a lease of ipam.pool.nodeTTL seconds (60 by default),
renewed every third of it by a keep-alive that writes nothing.
Several keepers of one node share that key: each registers the
node only if it is not registered, and checks at every renewal
(a read, writing nothing) that it still is. While `reclaim` has
the node fenced, says so as an error at every renewal. Runs
until SIGTERM or SIGINT, then withdraws the registration if it
is on its own lease, and exits 0. Logs to stderr. With --node-name, first
pins NAME as `ipam-delegated install --node-name` does (in
/var/lib/cni/ipam-da-pool/node-name, or FILE), so that a keeper
started before the installer takes the node's name from the same
source: a different name pinned already is refused.
",
    run: |given| Ok(finish(run(&options(given)?))),
};

/// `node-keeper`'s options.
#[derive(Debug, PartialEq)]
struct Keeper {
    config: PathBuf,
    network: Option<String>,
    /// The name to pin first, and where.
    node_name: Option<(String, PathBuf)>,
}

fn options(given: &Options) -> Result<Keeper, String> {
    let node_name = node_name::given(given)?;
    Ok(Keeper {
        config: given.path("--config").ok_or("node-keeper needs --config")?,
        network: given.value("--network").map(String::from),
        node_name,
    })
}

/// Keeps the node registered until asked to stop.
fn run(options: &Keeper) -> Result<bool, PoolError> {
    if let Some((name, file)) = &options.node_name {
        node_name::pin(file, name)?;
    }
    let (_, settings) = read_network(&options.config, options.network.as_deref())?;
    if let Some((name, _)) = options
        .node_name
        .as_ref()
        .filter(|(n, _)| *n != settings.node)
    {
        return Err(invalid(format!(
            "{} names node {:?} (ipam.pool.node, or another nodeNameFile), not {name:?}",
            options.config.display(),
            settings.node
        )));
    }
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
