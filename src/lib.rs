//! ipam-delegated: a CNI IPAM plugin that runs a stack of IPAM delegates in
//! order, hands each one's result to the next as `prevResult`, answers with
//! the last one's result, and undoes the stack when an ADD fails.
//!
//! Data flows one way: environment and stdin, then [`config`], then the
//! chain in [`delegate`], then the reply that `main` writes.

pub mod agent;
pub mod cli;
pub mod config;
pub mod delegate;
pub mod doctor;
pub mod environment;
pub mod error;
mod json;
pub mod logging;
mod result;
pub mod signals;
pub mod state;
mod sys;
pub mod version;

use std::borrow::Cow;
use std::io::Write;
use std::process::ExitCode;

use tracing::{debug, warn};

use config::Config;
use environment::{Command, Environment};
use error::Error;

/// Runs one CNI invocation, writing its result, if it has one, on `stdout`.
/// An ADD whose result cannot be written is undone: the runtime would never
/// learn of the address.
pub fn run(env: &Environment, stdin: &[u8], stdout: &mut impl Write) -> Result<(), Error> {
    debug!(
        command = %env.command,
        container_id = env.container_id.as_deref().unwrap_or(""),
        "invocation"
    );
    match env.command {
        Command::Version => write_reply(stdout, &version::reply(&config::reply_version(stdin)))
            .map_err(Error::WriteReply),
        Command::Add => {
            let config = prepare(env, stdin)?;
            let delegates = delegate::resolve(&config.delegates, &env.path)?;
            let result = delegate::add(&config, &delegates)?;
            write_reply(stdout, &result).map_err(|e| {
                warn!("the result could not be written ({e}): undoing the ADD");
                let undone = delegate::undo(&config, &delegates, &result);
                Error::WriteReply(e).with_rollback(undone)
            })
        }
        Command::Check => {
            let config = prepare(env, stdin)?;
            let delegates = delegate::resolve(&config.delegates, &env.path)?;
            delegate::check(&config, &delegates)
        }
        Command::Del => {
            let config = prepare(env, stdin)?;
            let delegates = delegate::resolve_each(&config.delegates, &env.path);
            delegate::del(&config, delegates)
        }
        Command::Gc => {
            let config = prepare(env, stdin)?;
            let delegates = delegate::resolve_each(&config.delegates, &env.path);
            // The network's lock, held until the delegates are done.
            let (_lock, with_kept) = agent::gc_input(&config)?;
            match with_kept {
                Some(input) => delegate::gc(&Config::parse(&input)?, delegates),
                None => delegate::gc(&config, delegates),
            }
        }
        Command::Status => {
            let config = prepare(env, stdin)?;
            let delegates = delegate::resolve(&config.delegates, &env.path)?;
            delegate::status(&config, &delegates)
        }
    }
}

/// Writes a reply whole, flushed: a buffered write that fails only at exit
/// would go unnoticed.
fn write_reply(stdout: &mut impl Write, reply: &[u8]) -> std::io::Result<()> {
    stdout.write_all(reply)?;
    stdout.flush()
}

/// What every command that runs the stack does first: refuse to run under
/// itself, then read the configuration and check it for the command.
fn prepare<'a>(env: &Environment, stdin: &'a [u8]) -> Result<Config<'a>, Error> {
    if let Some(parent) = &env.parent {
        return Err(Error::Recursion {
            parent: parent.clone(),
        });
    }
    let config = Config::parse(stdin)?;
    version::check_command(env.command, config.cni_version)?;
    Ok(config)
}

/// Writes the one reply for `outcome` on stdout (a result, nothing, or a
/// CNI error object carrying the version `cni_version` gives, asked for
/// only then: it parses the input again) and gives the exit status.
pub fn respond(
    outcome: Result<Option<Vec<u8>>, Error>,
    cni_version: impl FnOnce() -> String,
) -> ExitCode {
    let (reply, status) = match &outcome {
        Ok(result) => (
            Cow::from(result.as_deref().unwrap_or_default()),
            ExitCode::SUCCESS,
        ),
        Err(e) => (Cow::from(e.to_reply(&cni_version())), ExitCode::FAILURE),
    };
    // The reply first: it is what the runtime acts on, whatever the logs do.
    let written = std::io::stdout().lock().write_all(&reply);
    if let Err(e) = &outcome {
        tracing::error!(code = e.code(), details = ?e.details(), "{}", e.summary());
    }
    match written {
        Ok(()) => status,
        Err(_) => ExitCode::FAILURE,
    }
}
