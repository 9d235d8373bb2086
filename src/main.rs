//! The binary: as a CNI plugin (CNI_COMMAND set), reads the environment and
//! stdin, runs the command and writes the one reply on stdout; otherwise,
//! the command line of agent mode.

use std::process::ExitCode;

use ipam_delegated::environment::Environment;
use ipam_delegated::{cli, config, logging, respond, signals};

fn main() -> ExitCode {
    logging::init();
    // Concurrent invocations share the log file; the pid tells them apart.
    let _invocation = tracing::debug_span!("ipam-delegated", pid = std::process::id()).entered();
    tracing::debug!(version = env!("CARGO_PKG_VERSION"), "started");

    let env = match Environment::from_vars(|name| std::env::var_os(name)) {
        Ok(Some(env)) => Ok(env),
        Ok(None) => return cli::main(std::env::args_os().skip(1)),
        Err(e) => Err(e),
    };
    // From here a termination request is answered, not fatal: it stops the
    // stack cleanly, or the wait for stdin. On failure the signals keep
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
        ipam_delegated::run(&env, &stdin, &mut std::io::stdout().lock())
    });
    respond(outcome.map(|()| None), || config::reply_version(&stdin))
}
