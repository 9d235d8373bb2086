//! ipam-delegated: a CNI IPAM plugin that runs a stack of IPAM delegates in
//! order, hands each one's result to the next as `prevResult`, answers with
//! the last one's result, and undoes the stack when an ADD fails.
//!
//! Data flows one way: the environment and stdin (read by [`skel`] into
//! [`cni`] types), then the configuration ([`config`]), then the chain of
//! delegates ([`delegate`]), then the one reply [`skel`] writes.

pub mod cni;
pub mod config;
pub mod error;
pub mod skel;

mod agent;
mod cli;
mod delegate;
mod doctor;
mod logging;
mod signals;
mod state;
mod sys;

use std::io::Write;

use tracing::{debug, warn};

pub use cli::main as command_line;
/// For the fuzz targets: what a delegate's exit status and output amount to.
pub use delegate::{judge, Printed};
pub use delegate::{PARENT_VARIABLE, STDOUT_CAP};
pub use logging::init as init_logging;

use cni::Command;
use config::Config;
use delegate::{Chain, Processes};
use error::Error;

/// Runs one CNI invocation with configuration `stdin`, writing its result,
/// if it has one, on `stdout`. `parent` is [`PARENT_VARIABLE`]'s value: a
/// plugin started by itself refuses at once. An ADD whose result cannot be
/// written is undone: the runtime would never learn of the address.
pub fn run(
    env: &cni::Environment,
    parent: Option<&str>,
    stdin: &[u8],
    stdout: &mut dyn Write,
) -> Result<(), Error> {
    debug!(
        command = %env.command,
        container_id = env.container_id.as_deref().unwrap_or(""),
        "invocation"
    );
    if env.command == Command::Version {
        // Needs no configuration, runs nothing, and never fails on its input.
        let reply = cni::version_reply(&cni::reply_version(stdin));
        return skel::write_reply(stdout, &reply);
    }
    if let Some(parent) = parent {
        return Err(Error::Recursion {
            parent: parent.to_owned(),
        });
    }
    let config = Config::parse(stdin)?;
    cni::check_command(env.command, config.net.cni_version)?;
    let found = delegate::resolve_each(&config.delegates, &env.path);
    let runner = Processes::default();
    let chain = Chain::new(&config.net, &runner, config.timeout);
    match env.command {
        Command::Add => {
            let delegates = all(found)?;
            let result = chain.add(&delegates)?;
            skel::write_reply(stdout, &result)
                .inspect_err(|e| {
                    warn!("the result could not be written ({e}): undoing the ADD");
                })
                .map_err(|e| e.with_rollback(chain.undo(&delegates, &result)))
        }
        Command::Check => chain.check(&all(found)?),
        Command::Del => chain.del(found),
        Command::Gc => {
            // Agent mode's attachments are kept from GC, under their lock.
            let protected = agent::protect_from_gc(&config)?;
            chain.gc(protected.input(&config.net), found)
        }
        Command::Status => chain.status(&all(found)?),
        // Answered above.
        Command::Version => Ok(()),
    }
}

/// Every delegate, for a command that runs none when one is missing.
fn all(found: Vec<Result<delegate::Delegate, Error>>) -> Result<Vec<delegate::Delegate>, Error> {
    found.into_iter().collect()
}
