//! The binary: reads the CNI environment and stdin, runs the command, and
//! writes the one reply, a result or a CNI error object, on stdout.

use std::io::{Read, Write};
use std::process::ExitCode;

use ipam_delegated::environment::Environment;
use ipam_delegated::error::Error;
use ipam_delegated::{config, logging, version};

fn main() -> ExitCode {
    logging::init();
    // Concurrent invocations share the log file; the pid tells them apart.
    let _invocation = tracing::debug_span!("ipam-delegated", pid = std::process::id()).entered();
    let env = match Environment::from_vars(|name| std::env::var_os(name)) {
        Ok(Some(env)) => Ok(env),
        Ok(None) => {
            eprint!("{}", version::about());
            return ExitCode::FAILURE;
        }
        Err(e) => Err(e),
    };
    // Stdin is read whatever happened above: an error reply carries its cniVersion.
    let mut stdin = Vec::new();
    let outcome = match std::io::stdin().read_to_end(&mut stdin) {
        Ok(_) => env.and_then(|env| ipam_delegated::run(&env, &stdin)),
        Err(e) => Err(Error::ReadStdin(e)),
    };
    let (reply, status) = match outcome {
        Ok(result) => (result.unwrap_or_default(), ExitCode::SUCCESS),
        Err(e) => {
            tracing::error!(code = e.code(), details = %e.details(), "{e}");
            (
                e.to_reply(&config::reply_version(&stdin)),
                ExitCode::FAILURE,
            )
        }
    };
    match std::io::stdout().lock().write_all(&reply) {
        Ok(()) => status,
        Err(_) => ExitCode::FAILURE,
    }
}
