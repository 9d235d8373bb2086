//! `ipam-da-pool reclaim`: on etcd, gives back what dead nodes held (or
//! the one an operator names), never touching a node whose registration
//! is there.

use std::io::Write;
use std::path::PathBuf;

use super::{
    dead_for, finish, local_only, print_released, read_network, Released, DEFAULT_DEAD_FOR,
};
use crate::args::{Opt, Options, Verb};
use crate::da_pool::clock;
use crate::da_pool::cluster::{self, first_sight, reclaim::reclaim};
use crate::da_pool::error::PoolError;
use crate::da_pool::store::{Store, Stores};

/// `reclaim`.
pub(super) const VERB: Verb = Verb {
    name: "reclaim",
    synopsis:
        "--config PATH [--network NAME] [--dead-for DURATION | --node NAME] [--dry-run] [--json]",
    options: &[
        Opt::value("--config"),
        Opt::value("--network"),
        Opt::value("--dead-for"),
        Opt::value("--node"),
        Opt::flag("--dry-run"),
        Opt::flag("--json"),
    ],
    operands: false,
    help: "\
On etcd: gives back what every node holds in the network whose
keeper's registration has been gone for DURATION (15m by
default), counted by this machine's clock from when a reclaim
or check first saw it gone (a node never registered is left
alone), or what node NAME holds (one decommissioned):
attachments and sticky holds. A node whose registration is
there is never touched, not even named. A node given back from
is fenced in the same transactions: its ADDs and STATUS are
refused until `readmit` lifts the fence. Prints what it
released (with --dry-run, what it would release).
",
    run: |given| Ok(finish(run(&options(given)?))),
};

/// `reclaim`'s options.
#[derive(Debug, PartialEq)]
struct Reclaim {
    config: PathBuf,
    network: Option<String>,
    dead_for: u64,
    node: Option<String>,
    dry_run: bool,
    json: bool,
}

fn options(given: &Options) -> Result<Reclaim, String> {
    let config = given.path("--config").ok_or("reclaim needs --config")?;
    let node = given.value("--node").map(String::from);
    let dead_for = match given.value("--dead-for") {
        Some(_) if node.is_some() => {
            return Err("reclaim takes --dead-for or --node, not both".into())
        }
        Some(text) => dead_for(text)?,
        None => DEFAULT_DEAD_FOR,
    };
    Ok(Reclaim {
        config,
        network: given.value("--network").map(String::from),
        dead_for,
        node,
        dry_run: given.flag("--dry-run"),
        json: given.flag("--json"),
    })
}

/// `seconds` as given: in hours, minutes or seconds, whichever is whole.
fn span(seconds: u64) -> String {
    match seconds {
        s if s > 0 && s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s > 0 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Gives back what dead nodes (or the one named) hold, printing it:
/// whether a node named had anything.
fn run(options: &Reclaim) -> Result<bool, PoolError> {
    let (name, settings) = read_network(&options.config, options.network.as_deref())?;
    let stores = Stores::new(&settings);
    let store = stores
        .etcd(&name)?
        .ok_or_else(|| local_only(&options.config, "reclaim"))?;
    let mut states = cluster::states(store.client())?;
    let targets: Vec<String> = match &options.node {
        Some(node) => {
            if states.get(node).is_some_and(|s| s.alive) {
                // An answer, not a failure to wait out.
                let _ = writeln!(
                    std::io::stderr(),
                    "ipam-da-pool: node {node} is alive: its keeper's registration is there, renewed under its lease; nothing released (stop its keeper, or let its lease end, first)"
                );
                return Ok(false);
            }
            vec![node.clone()]
        }
        None => {
            let now = clock::now();
            first_sight::record_first_sights(store.client(), &mut states, now)?;
            first_sight::gone_for(&states, options.dead_for, now)
                .into_iter()
                .map(|(node, _)| node)
                .collect()
        }
    };
    let (allocations, holds) = (store.allocations()?, store.workload_holds()?);
    let mut outcomes = Vec::new();
    for node in &targets {
        outcomes.push(reclaim(
            &store,
            node,
            &allocations,
            &holds,
            options.dry_run,
        )?);
    }
    let released: Vec<Released> = outcomes
        .iter()
        .flat_map(|done| {
            let allocations = done.allocations.iter().map(Released::Attachment);
            allocations.chain(done.holds.iter().map(Released::WorkloadHold))
        })
        .collect();
    let skipped: usize = outcomes.iter().map(|done| done.skipped).sum();
    let fenced: Vec<&String> = targets
        .iter()
        .zip(&outcomes)
        .filter(|(_, done)| !done.allocations.is_empty() || !done.holds.is_empty())
        .map(|(node, _)| node)
        .collect();
    let mut extra = serde_json::json!({"nodes": targets});
    if !options.dry_run {
        extra["fenced"] = serde_json::json!(fenced);
    }
    print_released(&released, options.dry_run, options.json, extra);
    if options.node.is_none() && targets.is_empty() && !options.json {
        println!(
            "no node of network {name} has been gone for {}: nothing to reclaim",
            span(options.dead_for)
        );
    }
    let mut err = std::io::stderr().lock();
    for node in fenced.iter().filter(|_| !options.dry_run) {
        let _ = writeln!(
            err,
            "ipam-da-pool: node {node} is fenced: its ADDs and STATUS are refused until it is drained and `ipam-da-pool readmit --config {} --node {node}` lifts the fence",
            options.config.display()
        );
    }
    if skipped > 0 {
        let _ = writeln!(
            err,
            "ipam-da-pool: {skipped} record(s) changed meanwhile (a node back, or a DEL) and were left alone"
        );
    }
    // Nodes with records that no keeper ever registered: never judged dead.
    let unknown: std::collections::BTreeSet<&str> = allocations
        .iter()
        .map(|h| h.owner.node.as_str())
        .chain(holds.iter().map(|h| h.node.as_str()))
        .filter(|node| !states.contains_key(*node))
        .collect();
    if options.node.is_none() && !unknown.is_empty() {
        let list: Vec<&str> = unknown.into_iter().collect();
        let _ = writeln!(
            err,
            "ipam-da-pool: node(s) {} hold records but never ran a node-keeper: left alone (reclaim --node NAME releases one)",
            list.join(", ")
        );
    }
    match &options.node {
        Some(node) if released.is_empty() => {
            let _ = writeln!(
                err,
                "ipam-da-pool: node {node} holds nothing in network {name}; nothing released"
            );
            Ok(false)
        }
        _ => Ok(true),
    }
}
