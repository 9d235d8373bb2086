//! `ipam-da-pool migrate`: moves a network's records on etcd from the
//! previous layout (every attachment under one prefix) to this one (each
//! node's attachments under a prefix of its own), then says so with the
//! layout's version. Until it has run, both layouts are read.

use std::io::Write;
use std::path::PathBuf;

use super::{finish, local_only, read_network};
use crate::args::{Opt, Options, Verb};
use crate::da_pool::error::PoolError;
use crate::da_pool::store::{Stores, LAYOUT};

/// `migrate`.
pub(super) const VERB: Verb = Verb {
    name: "migrate",
    synopsis: "--config PATH [--network NAME] [--dry-run]",
    options: &[
        Opt::value("--config"),
        Opt::value("--network"),
        Opt::flag("--dry-run"),
    ],
    operands: false,
    help: "\
On etcd: moves the network's attachments that builds before 0.1.0
kept under one prefix to their nodes' own prefixes, each in one
transaction (any node may run it, any number of times, with ADDs
and DELs going on), then records the layout's version. Run it
once no node runs such a build any more. Prints what it moved
(with --dry-run, what it would move). Exit status 1 when a
record changed meanwhile: run it again.
",
    run: |given| Ok(finish(run(&options(given)?))),
};

/// `migrate`'s options.
#[derive(Debug, PartialEq)]
struct Migrate {
    config: PathBuf,
    network: Option<String>,
    dry_run: bool,
}

fn options(given: &Options) -> Result<Migrate, String> {
    Ok(Migrate {
        config: given.path("--config").ok_or("migrate needs --config")?,
        network: given.value("--network").map(String::from),
        dry_run: given.flag("--dry-run"),
    })
}

/// Moves what is left of the previous layout: whether all of it moved.
fn run(options: &Migrate) -> Result<bool, PoolError> {
    let (name, settings) = read_network(&options.config, options.network.as_deref())?;
    let store = Stores::new(&settings)
        .etcd(&name)?
        .ok_or_else(|| local_only(&options.config, "migrate"))?;
    let mut out = std::io::stdout().lock();
    let verb = if options.dry_run {
        "would move"
    } else {
        "moved"
    };
    let mut changed = 0;
    let legacy = store.legacy_allocations()?;
    for allocation in &legacy {
        let owner = &allocation.owner;
        if !options.dry_run && !store.move_legacy(allocation)? {
            changed += 1;
            continue;
        }
        let _ = writeln!(
            out,
            "{verb} {}/{} under node {}",
            owner.id, owner.ifname, owner.node
        );
    }
    if changed > 0 {
        let _ = writeln!(
            std::io::stderr(),
            "ipam-da-pool: {changed} record(s) changed meanwhile: run migrate again"
        );
        return Ok(false);
    }
    if !options.dry_run {
        store.mark_layout()?;
    }
    let _ = writeln!(
        out,
        "network {name}: {} attachment(s) {verb}; layout version {LAYOUT}",
        legacy.len()
    );
    Ok(true)
}
