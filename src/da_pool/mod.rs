//! ipam-da-pool, the allocation delegate: one address from each pool an
//! ADD asks for (`prevResult.pools`, as a selector prints them, else
//! `ipam.pool.default`), kept in a store (local files, or etcd shared by
//! every node) with who holds it; given back on DEL, verified on CHECK,
//! and freed on GC when the runtime no longer knows its attachment, on
//! this node only. With `ipam.pool.sticky`, the addresses follow a
//! workload rather than a container: a workload's hold keeps them from
//! one of its containers to the next, for `stickyFor` after the last. A
//! store never decides what a command means; a command never knows which
//! store it talks to.

mod add;
mod cli;
mod error;
mod holds;
mod identity;
mod nodes;
mod result;
mod search;
mod settings;
mod status;
mod store;
mod teardown;
#[cfg(test)]
mod testing;

use std::io::Write;

use crate::cni::{Environment, NetConf};
use crate::error::Error;
use crate::pools;
use crate::skel::{self, Plugin};
use add::add;
use settings::{Settings, StoreSettings};
use status::status;
use store::{etcd, local, Owner, Store};
use teardown::{check, del, gc, nothing_held, valid_attachments};

pub use error::PoolError;
pub use identity::{pin as pin_node_name, DEFAULT_NODE_NAME_FILE};

/// Runs the command line `args` (without the program name), for when the
/// binary is not run as a CNI plugin.
pub fn command_line(args: impl IntoIterator<Item = std::ffi::OsString>) -> std::process::ExitCode {
    cli::PROGRAM.main(args)
}

/// How many times a command starts again after losing a race for a key to
/// another node, before it says "try again later".
const ATTEMPTS: usize = 8;

/// ipam-da-pool as a CNI plugin.
pub struct Allocator;

impl Plugin for Allocator {
    fn add(&self, env: &Environment, net: NetConf, stdout: &mut dyn Write) -> Result<(), Error> {
        let settings = Settings::from_net(&net)?;
        let asked = pools::requested_by_runtime(env, &net)?;
        // An address the runtime keeps across reboots (the Docker driver's).
        let durable = env
            .arg_pairs()
            .iter()
            .any(|(key, value)| *key == "DURABLE" && value.eq_ignore_ascii_case("true"));
        let store = open(&settings, &net.name, durable)?;
        let owner = Owner {
            workload: settings::workload(env, &settings),
            ..owner(env, &settings)
        };
        let result = add(&*store, &net, &settings, &owner, &asked)?;
        skel::write_reply(stdout, &result)
    }

    /// Reads only where the records are: a mistake in a pool must never
    /// stop a teardown.
    fn del(&self, env: &Environment, net: NetConf) -> Result<(), Error> {
        let settings = Settings::store_only(&net)?;
        match open_existing(&settings, &net.name)? {
            Some(store) => del(&*store, &owner(env, &settings)),
            None => Ok(()),
        }
    }

    fn check(&self, env: &Environment, net: NetConf) -> Result<(), Error> {
        let settings = Settings::store_only(&net)?;
        let owner = owner(env, &settings);
        match open_existing(&settings, &net.name)? {
            Some(store) => check(&*store, &net, &owner),
            None => Err(nothing_held(&owner)),
        }
    }

    fn gc(&self, _env: &Environment, net: NetConf) -> Result<(), Error> {
        let settings = Settings::store_only(&net)?;
        let valid = valid_attachments(&net)?;
        match open_existing(&settings, &net.name)? {
            Some(store) => gc(&*store, &valid, &settings),
            None => Ok(()),
        }
    }

    fn status(&self, _env: &Environment, net: NetConf) -> Result<(), Error> {
        let settings = Settings::from_net(&net)?;
        let not_available = |e: Error| Error::from(PoolError::NotAvailable(e.to_string()));
        match open_existing(&settings, &net.name).map_err(not_available)? {
            Some(store) => status(&*store, &settings),
            // A local store with no records: every pool is free.
            None => Ok(()),
        }
    }
}

/// The store the settings name, for network `name`, made if need be; its
/// claims synced to the disk before they count if `durable` (etcd's
/// always are).
fn open(settings: &Settings, name: &str, durable: bool) -> Result<Box<dyn Store>, Error> {
    Ok(match &settings.store {
        StoreSettings::Local { data_dir } => {
            Box::new(local::Local::open(data_dir, name)?.synced(durable))
        }
        StoreSettings::Etcd(cluster) => Box::new(etcd::Etcd::new(
            crate::etcd::Client::new(cluster.clone())?,
            name,
        )),
    })
}

/// The store as [`open`] has it, but `None`, and nothing made, for a local
/// store that has no records of the network.
fn open_existing(settings: &Settings, name: &str) -> Result<Option<Box<dyn Store>>, Error> {
    match &settings.store {
        StoreSettings::Local { data_dir } => Ok(local::Local::open_existing(data_dir, name)?
            .map(|store| Box::new(store) as Box<dyn Store>)),
        StoreSettings::Etcd(_) => open(settings, name, false).map(Some),
    }
}

/// The attachment a command is for. ADD, DEL and CHECK always have both
/// variables (the environment's rules), so the defaults are never used.
/// Its workload, if any, is the ADD's to say, and the records' after.
fn owner(env: &Environment, settings: &Settings) -> Owner {
    Owner {
        id: env.container_id.clone().unwrap_or_default(),
        ifname: env.ifname.clone().unwrap_or_default(),
        node: settings.node.clone(),
        workload: None,
    }
}
