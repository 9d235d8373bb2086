//! What every plugin binary of the crate does around its commands, as
//! libcni's skel does for Go plugins: reads the CNI environment, then stdin
//! (a termination request answered even while the runtime keeps it open),
//! runs the command, and writes the one reply and the exit status. Without
//! CNI_COMMAND the binary is not a CNI plugin call, and its command line
//! takes over.

use std::borrow::Cow;
use std::io::Write;
use std::process::ExitCode;

use crate::cni::{self, Environment};
use crate::error::Error;
use crate::signals;

/// Serves one invocation: `run` gets the environment and stdin and writes
/// a result, if it has one, on the stdout it is given; without CNI_COMMAND,
/// `command_line` runs instead.
pub fn serve(
    run: impl FnOnce(&Environment, &[u8], &mut dyn Write) -> Result<(), Error>,
    command_line: impl FnOnce() -> ExitCode,
) -> ExitCode {
    let env = match Environment::from_vars(|name| std::env::var_os(name)) {
        Ok(Some(env)) => Ok(env),
        Ok(None) => return command_line(),
        Err(e) => Err(Error::from(e)),
    };
    // From here a termination request is answered, not fatal: it stops the
    // command cleanly, or the wait for stdin. On failure the signals keep
    // their default and end the plugin where it stands.
    if let Err(e) = signals::watch() {
        tracing::warn!("SIGTERM and SIGINT will end the plugin at once: {e}");
    }
    // Stdin is read even when the environment is wrong: the error reply
    // carries the configuration's cniVersion.
    let (stdin, read) = match signals::read_to_end(&mut std::io::stdin().lock()) {
        Ok(stdin) => (stdin, Ok(())),
        Err(e) => (Vec::new(), Err(e)),
    };
    let outcome = env.and_then(|env| {
        read?;
        run(&env, &stdin, &mut std::io::stdout().lock())
    });
    respond(outcome.map(|()| None), || cni::reply_version(&stdin))
}

/// Writes a reply whole and flushed: a buffered write that fails only at
/// exit would go unnoticed.
pub fn write_reply(stdout: &mut dyn Write, reply: &[u8]) -> Result<(), Error> {
    stdout
        .write_all(reply)
        .and_then(|()| stdout.flush())
        .map_err(|e| cni::Error::WriteReply(e).into())
}

/// Writes the one reply for `outcome` on stdout (a result, nothing, or a
/// CNI error object carrying the version `cni_version` gives, asked for
/// only then: it parses the input again), logs a failure, and gives the
/// exit status.
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
    let written = write_reply(&mut std::io::stdout().lock(), &reply);
    if let Err(e) = &outcome {
        tracing::error!(code = e.code(), details = ?e.details(), "{}", e.summary());
    }
    match written {
        Ok(()) => status,
        Err(_) => ExitCode::FAILURE,
    }
}
