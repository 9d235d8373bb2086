//! `ipam-da-pool readmit`: lifts the fence `reclaim` put on a node, once
//! an operator has drained it.

use std::io::Write;
use std::path::PathBuf;

use super::{cluster_of, finish, read_network};
use crate::args::{Opt, Options, Verb};
use crate::da_pool::clock::utc;
use crate::da_pool::cluster::reclaim::{readmit, Readmitted};
use crate::da_pool::cluster::states;
use crate::da_pool::error::PoolError;
use crate::da_pool::store::{fence, Stores};

/// `readmit`.
pub(super) const VERB: Verb = Verb {
    name: "readmit",
    synopsis: "--config PATH [--network NAME] --node NAME [--dry-run]",
    options: &[
        Opt::value("--config"),
        Opt::value("--network"),
        Opt::value("--node"),
        Opt::flag("--dry-run"),
    ],
    operands: false,
    help: "\
On etcd: lifts the fence `reclaim` put on node NAME when it gave
back what the node held, so that its ADDs and STATUS succeed
again, and forgets when it was first seen gone. Run it once the
node is drained (a container it still runs may use an address
given to another since) and its keeper runs again: a node not
registered is refused, or the next reclaim would take it again.
Exit status 1 when the node is not fenced or not registered.
",
    run: |given| Ok(finish(run(&options(given)?))),
};

/// `readmit`'s options.
#[derive(Debug, PartialEq)]
struct Readmit {
    config: PathBuf,
    network: Option<String>,
    node: String,
    dry_run: bool,
}

fn options(given: &Options) -> Result<Readmit, String> {
    Ok(Readmit {
        config: given.path("--config").ok_or("readmit needs --config")?,
        network: given.value("--network").map(String::from),
        node: given
            .value("--node")
            .ok_or("readmit needs --node: the node to readmit")?
            .to_owned(),
        dry_run: given.flag("--dry-run"),
    })
}

/// Lifts node's fence: whether there was one.
fn run(options: &Readmit) -> Result<bool, PoolError> {
    let (_, settings) = read_network(&options.config, options.network.as_deref())?;
    let client = cluster_of(&Stores::new(&settings), &options.config, "readmit")?;
    let node = &options.node;
    let mut err = std::io::stderr().lock();
    let Some(fence) = fence::read(&client, node)? else {
        let _ = writeln!(
            err,
            "ipam-da-pool: node {node} is not fenced: nothing to lift"
        );
        return Ok(false);
    };
    let not_registered = || {
        let _ = writeln!(
            std::io::stderr(),
            "ipam-da-pool: node {node} is not registered: start its keeper first (readmitted without one, the node would be reclaimed again at the next reclaim); the fence stays"
        );
        false
    };
    let verb = if options.dry_run {
        if !states(&client)?.get(node).is_some_and(|s| s.alive) {
            return Ok(not_registered());
        }
        "would lift"
    } else {
        match readmit(&client, &fence)? {
            Readmitted::Lifted => "lifted",
            Readmitted::NotRegistered => return Ok(not_registered()),
        }
    };
    let _ = writeln!(
        std::io::stdout(),
        "{verb} the fence on node {node} (reclaimed at {})",
        utc(fence.at)
    );
    Ok(true)
}
