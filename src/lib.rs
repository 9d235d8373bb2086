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
        version = env!("CARGO_PKG_VERSION"),
        command = %env.command,
        container_id = env.container_id.as_deref().unwrap_or(""),
        "ipam-delegated invoked"
    );
    if env.command == Command::Version {
        return Ok(Some(version::reply(&config::reply_version(stdin))));
    }
    let config = Config::parse(stdin)?;
    version::check_command(env.command, &config.cni_version)?;
    match env.command {
        Command::Add => {
            let delegates = delegate::resolve(&config.delegates, &env.path)?;
            delegate::add(&config, &delegates).map(Some)
        }
        Command::Check => {
            let delegates = delegate::resolve(&config.delegates, &env.path)?;
            delegate::check(&config, &delegates).map(|()| None)
        }
        Command::Del => {
            let delegates = delegate::resolve_each(&config.delegates, &env.path);
            delegate::del(&config, delegates).map(|()| None)
        }
        Command::Version => Ok(Some(version::reply(&config.cni_version))),
    }
}
