//! ipam-delegated: a CNI IPAM plugin that runs a stack of IPAM delegates in
//! order, hands each one's result to the next as `prevResult`, answers with
//! the last one's result, and undoes the stack when an ADD fails.
//!
//! Data flows one way: environment and stdin, then [`config`], then the
//! chain in [`delegate`], then the reply that `main` writes.

pub mod config;
pub mod delegate;
pub mod environment;
pub mod error;
pub mod logging;
pub mod version;

use tracing::debug;

use config::Config;
use environment::{Command, Environment};
use error::Error;

/// Runs one CNI invocation. `Ok(Some(bytes))` is a result to print,
/// `Ok(None)` a success that prints nothing.
pub fn run(env: &Environment, stdin: &[u8]) -> Result<Option<Vec<u8>>, Error> {
    debug!(
        command = %env.command,
        container_id = env.container_id.as_deref().unwrap_or(""),
        "invocation"
    );
    match env.command {
        Command::Version => Ok(Some(version::reply(&config::reply_version(stdin)))),
        Command::Add => {
            let config = checked(env.command, stdin)?;
            let delegates = delegate::resolve(&config.delegates, &env.path)?;
            delegate::add(&config, &delegates).map(Some)
        }
        Command::Check => {
            let config = checked(env.command, stdin)?;
            let delegates = delegate::resolve(&config.delegates, &env.path)?;
            delegate::check(&config, &delegates).map(|()| None)
        }
        Command::Del => {
            let config = checked(env.command, stdin)?;
            let delegates = delegate::resolve_each(&config.delegates, &env.path);
            delegate::del(&config, delegates).map(|()| None)
        }
        Command::Gc => {
            let config = checked(env.command, stdin)?;
            let delegates = delegate::resolve_each(&config.delegates, &env.path);
            delegate::gc(&config, delegates).map(|()| None)
        }
        Command::Status => {
            let config = checked(env.command, stdin)?;
            let delegates = delegate::resolve(&config.delegates, &env.path)?;
            delegate::status(&config, &delegates).map(|()| None)
        }
    }
}

/// The configuration, parsed and checked for the command.
fn checked(command: Command, stdin: &[u8]) -> Result<Config<'_>, Error> {
    let config = Config::parse(stdin)?;
    version::check_command(command, config.cni_version)?;
    Ok(config)
}
