//! ipam-da-pool, the allocation delegate: one address from each pool an
//! ADD asks for (`prevResult.pools`, as a selector prints them, else
//! `ipam.pool.default`), kept in a store (local files, or etcd shared by
//! every node) with who holds it; given back on DEL, verified on CHECK,
//! and freed on GC when the runtime no longer knows its attachment, on
//! this node only. With `ipam.pool.sticky`, the addresses follow a
//! workload rather than a container: a workload's hold keeps them from
//! one of its containers to the next, for `stickyFor` after the last. A
//! store never decides what a command means; a command never knows which
//! store it talks to, and opens one only through `store::Stores`. On etcd,
//! the nodes of a cluster keep themselves registered, and a dead one's
//! addresses are reclaimed (`cluster`).

mod add;
mod cli;
mod clock;
mod cluster;
mod counts;
mod definitions;
mod error;
mod metrics;
mod predicted;
mod result;
mod search;
mod settings;
mod status;
mod sticky;
mod store;
mod teardown;
#[cfg(test)]
mod testing;

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use crate::cni::{Environment, NetConf};
use crate::pools;
use crate::skel::{self, Plugin};
use add::add;
use settings::Settings;
use status::status;
use store::{Access, Owner, Stores};
use teardown::{check, del, gc, nothing_held};

pub use error::PoolError;

/// Runs the command line `args` (without the program name), for when the
/// binary is not run as a CNI plugin.
pub fn command_line(args: impl IntoIterator<Item = std::ffi::OsString>) -> std::process::ExitCode {
    cli::PROGRAM.main(args)
}

/// ipam-da-pool as a CNI plugin.
pub struct Allocator;

impl Plugin for Allocator {
    type Error = PoolError;

    fn add(
        &self,
        env: &Environment,
        net: NetConf,
        stdout: &mut dyn Write,
    ) -> Result<(), PoolError> {
        let started = Instant::now();
        let settings = Settings::from_net(&net);
        let dir = counts_dir(&settings, &net);
        let outcome = settings.and_then(|settings| {
            let settings = &settings;
            let asked = pools::requested_by_runtime(env, &net)?;
            let store = Stores::new(settings).create(&net.name, durable(env))?;
            let owner = Owner {
                workload: settings::workload(env, settings),
                ..owner(env, settings)
            };
            let result = add(&*store, &net, settings, &owner, &asked)?;
            Ok(skel::write_reply(stdout, &result)?)
        });
        counts::record(dir.as_deref(), &net.name, "ADD", started, &outcome);
        outcome
    }

    /// Reads only where the records are: a mistake in a pool must never
    /// stop a teardown.
    fn del(&self, env: &Environment, net: NetConf) -> Result<(), PoolError> {
        let started = Instant::now();
        let settings = Settings::store_only(&net);
        let dir = counts_dir(&settings, &net);
        let outcome = settings.and_then(|settings| {
            let settings = &settings;
            let access = match durable(env) {
                true => Access::Durable,
                false => Access::Locked,
            };
            match Stores::new(settings).existing(&net.name, access)? {
                Some(store) => del(&*store, &owner(env, settings)),
                None => Ok(()),
            }
        });
        counts::record(dir.as_deref(), &net.name, "DEL", started, &outcome);
        outcome
    }

    fn check(&self, env: &Environment, net: NetConf) -> Result<(), PoolError> {
        let started = Instant::now();
        let settings = Settings::store_only(&net);
        let dir = counts_dir(&settings, &net);
        let outcome = settings.and_then(|settings| {
            let settings = &settings;
            let owner = owner(env, settings);
            match Stores::new(settings).existing(&net.name, Access::Locked)? {
                Some(store) => check(&*store, &net, &owner),
                None => Err(nothing_held(&owner)),
            }
        });
        counts::record(dir.as_deref(), &net.name, "CHECK", started, &outcome);
        outcome
    }

    fn gc(&self, _env: &Environment, net: NetConf) -> Result<(), PoolError> {
        let started = Instant::now();
        let settings = Settings::store_only(&net);
        let dir = counts_dir(&settings, &net);
        let outcome = settings.and_then(|settings| {
            let settings = &settings;
            let valid = pools::valid_attachments(&net)?;
            match Stores::new(settings).existing(&net.name, Access::Locked)? {
                Some(store) => gc(&*store, &valid, settings),
                None => Ok(()),
            }
        });
        counts::record(dir.as_deref(), &net.name, "GC", started, &outcome);
        outcome
    }

    fn status(&self, _env: &Environment, net: NetConf) -> Result<(), PoolError> {
        let started = Instant::now();
        let settings = Settings::from_net(&net);
        let dir = counts_dir(&settings, &net);
        let outcome = settings.and_then(|settings| {
            let settings = &settings;
            let not_available = |e: PoolError| PoolError::NotAvailable(e.to_string());
            let opened = Stores::new(settings).existing(&net.name, Access::Locked);
            match opened.map_err(not_available)? {
                Some(store) => status(&*store, settings),
                // A local store with no records: every pool is free.
                None => Ok(()),
            }
        });
        counts::record(dir.as_deref(), &net.name, "STATUS", started, &outcome);
        outcome
    }
}

/// Where a command's count goes: where `settings` say, or, where they
/// could not be read, where `net` says alone (a configuration's error
/// counts too).
fn counts_dir(settings: &Result<Settings, PoolError>, net: &NetConf) -> Option<PathBuf> {
    match settings {
        Ok(settings) => settings.counts.clone(),
        Err(_) => settings::counts_of(net),
    }
}

/// Whether the runtime keeps this attachment's address across reboots
/// (CNI_ARGS `DURABLE=true`, as the Docker driver asks): then its claim,
/// and its DEL, reach the disk before they count.
fn durable(env: &Environment) -> bool {
    env.arg_pairs()
        .iter()
        .any(|(key, value)| *key == "DURABLE" && value.eq_ignore_ascii_case("true"))
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
