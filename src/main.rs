//! The binary: reads the CNI environment and stdin, runs the command, and
//! writes the one reply, a result or a CNI error object, on stdout.

use std::borrow::Cow;
use std::io::{Read, Write};
use std::process::ExitCode;

use ipam_delegated::environment::{Command, Environment};
use ipam_delegated::error::Error;
use ipam_delegated::{config, logging, signals, version};

fn main() -> ExitCode {
    logging::init();
    // Concurrent invocations share the log file; the pid tells them apart.
    let _invocation = tracing::debug_span!("ipam-delegated", pid = std::process::id()).entered();
    tracing::debug!(version = env!("CARGO_PKG_VERSION"), "started");

    let env = match Environment::from_vars(|name| std::env::var_os(name)) {
        Ok(Some(env)) => Ok(env),
        Ok(None) => {
            // Not a CNI call; a closed stderr leaves nothing better to do.
            let _ = std::io::stderr().write_all(version::about().as_bytes());
            return ExitCode::FAILURE;
        }
        Err(e) => Err(e),
    };
    // From here a termination request is honoured, not fatal: it stops the
    // stack cleanly. First, before any other thread exists; on failure the
    // signals keep their default and end the plugin where it stands.
    if env
        .as_ref()
        .is_ok_and(|env| env.command != Command::Version)
    {
        if let Err(e) = signals::watch() {
            tracing::warn!("SIGTERM and SIGINT will end the plugin at once: {e}");
        }
    }
    // Stdin is read even when the environment is wrong: the error reply
    // carries the configuration's cniVersion.
    let mut stdin = Vec::new();
    let read = std::io::stdin().read_to_end(&mut stdin);
    let outcome = env.and_then(|env| {
        read.map_err(Error::ReadStdin)?;
        ipam_delegated::run(&env, &stdin)
    });

    let (reply, status) = match &outcome {
        Ok(result) => (
            Cow::from(result.as_deref().unwrap_or_default()),
            ExitCode::SUCCESS,
        ),
        Err(e) => (
            Cow::from(e.to_reply(&config::reply_version(&stdin))),
            ExitCode::FAILURE,
        ),
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
