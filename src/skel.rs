//! What every plugin binary of the crate does around its commands, as
//! libcni's skel does for Go plugins: reads the CNI environment, then stdin
//! (a termination request is honoured even if the runtime never closes
//! it), answers VERSION, checks the configuration's common keys and that
//! its version has the command, runs the command, and writes the one reply
//! and the exit status. Without CNI_COMMAND the binary is not a CNI plugin
//! call, and its command line takes over. It is the one place where the
//! protocol's failures and a plugin's own meet, in the reply: a plugin's
//! error is its own enum, which knows its CNI code ([`Reportable`]).
//!
//! A plugin on it is as short as its commands:
//!
//! ```no_run
//! use std::io::Write;
//! use std::process::ExitCode;
//!
//! use ipam_delegated::cni::{Environment, Error, NetConf};
//! use ipam_delegated::skel::{self, Plugin};
//!
//! /// Hands every container the same address, and keeps nothing.
//! struct Fixed;
//!
//! impl Plugin for Fixed {
//!     // Nothing of its own can fail: the protocol's errors are its errors.
//!     type Error = Error;
//!     fn add(&self, _: &Environment, net: NetConf, out: &mut dyn Write) -> Result<(), Error> {
//!         let version = net.cni_version;
//!         let result = format!(r#"{{"cniVersion":"{version}","ips":[{{"address":"10.1.0.2/24"}}]}}"#);
//!         skel::write_reply(out, result.as_bytes())
//!     }
//!     fn del(&self, _: &Environment, _: NetConf) -> Result<(), Error> { Ok(()) }
//!     fn check(&self, _: &Environment, _: NetConf) -> Result<(), Error> { Ok(()) }
//!     fn gc(&self, _: &Environment, _: NetConf) -> Result<(), Error> { Ok(()) }
//!     fn status(&self, _: &Environment, _: NetConf) -> Result<(), Error> { Ok(()) }
//! }
//!
//! fn main() -> ExitCode {
//!     skel::serve(&Fixed, || ExitCode::FAILURE)
//! }
//! ```

use std::borrow::Cow;
use std::io::Write;
use std::process::ExitCode;

use tracing::debug;

use crate::args::{Options, Verb};
use crate::cni::{self, Command, Environment, NetConf, Reportable};
use crate::signals::{self, Interrupted, Unread};

/// A CNI plugin's commands, as [`serve`] calls them (libcni's CNIFuncs).
/// Each gets the environment and the configuration, its common keys
/// checked and its version known to have the command.
pub trait Plugin {
    /// How its commands fail: its own error enum, which knows the CNI
    /// code of each failure.
    type Error: Reportable;

    /// ADD: allocate, and write the result on `stdout`.
    fn add(
        &self,
        env: &Environment,
        net: NetConf,
        stdout: &mut dyn Write,
    ) -> Result<(), Self::Error>;
    /// DEL: release whatever the attachment holds, and succeed when it
    /// holds nothing (DEL is repeated, and may come for what never was).
    fn del(&self, env: &Environment, net: NetConf) -> Result<(), Self::Error>;
    /// CHECK (0.4.0 and later): fail unless the attachment is as ADD left it.
    fn check(&self, env: &Environment, net: NetConf) -> Result<(), Self::Error>;
    /// GC (1.1.0): release what the runtime's `cni.dev/valid-attachments`
    /// does not list.
    fn gc(&self, env: &Environment, net: NetConf) -> Result<(), Self::Error>;
    /// STATUS (1.1.0): fail (50, 51) when an ADD could not succeed now.
    fn status(&self, env: &Environment, net: NetConf) -> Result<(), Self::Error>;
}

/// Every way an invocation can fail, as its reply reports it: the
/// protocol's failures (the environment, stdin, the configuration's
/// common keys, the reply), a termination request while stdin was read,
/// or the plugin's own.
#[derive(Debug, thiserror::Error)]
enum Failed<E: Reportable> {
    #[error(transparent)]
    Protocol(#[from] cni::Error),
    #[error(transparent)]
    Interrupted(#[from] Interrupted),
    #[error(transparent)]
    Plugin(E),
}

impl<E: Reportable> Reportable for Failed<E> {
    fn code(&self) -> u32 {
        match self {
            Failed::Protocol(e) => e.code(),
            Failed::Interrupted(e) => e.code(),
            Failed::Plugin(e) => e.code(),
        }
    }

    fn details(&self) -> String {
        match self {
            Failed::Plugin(e) => e.details(),
            _ => String::new(),
        }
    }

    fn summary(&self) -> String {
        match self {
            Failed::Plugin(e) => e.summary(),
            other => other.to_string(),
        }
    }
}

/// Serves one invocation of `plugin`; without CNI_COMMAND, `command_line`
/// runs instead.
pub fn serve<P: Plugin>(plugin: &P, command_line: impl FnOnce() -> ExitCode) -> ExitCode {
    let env = match Environment::from_vars(|name| std::env::var_os(name)) {
        Ok(Some(env)) => Ok(env),
        Ok(None) => return command_line(),
        Err(e) => Err(Failed::Protocol(e)),
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
        Err(Unread::Interrupted(e)) => (Vec::new(), Err(Failed::Interrupted(e))),
        Err(Unread::Failed(e)) => (Vec::new(), Err(cni::Error::ReadStdin(e).into())),
    };
    let outcome = env.and_then(|env| {
        read?;
        dispatch(plugin, &env, &stdin, &mut std::io::stdout().lock())
    });
    respond(outcome.map(|()| None), || cni::version_for_reply(&stdin))
}

/// Runs the command the environment names, with `stdin` as configuration.
fn dispatch<P: Plugin>(
    plugin: &P,
    env: &Environment,
    stdin: &[u8],
    stdout: &mut dyn Write,
) -> Result<(), Failed<P::Error>> {
    debug!(
        command = %env.command,
        container_id = env.container_id.as_deref().unwrap_or(""),
        "invocation"
    );
    // Every command but VERSION checks the configuration first: JSON (6),
    // then its version (1), then its name (7), then that the version has
    // the command (1).
    let checked = || -> Result<NetConf, cni::Error> {
        let net = NetConf::parse(stdin)?;
        cni::check_command(env.command, net.cni_version)?;
        Ok(net)
    };
    let ran = match env.command {
        // Needs no configuration, and never fails on its input.
        Command::Version => {
            let version = cni::version_result(&cni::version_for_reply(stdin));
            return Ok(write_reply(stdout, &version)?);
        }
        Command::Add => plugin.add(env, checked()?, stdout),
        Command::Del => plugin.del(env, checked()?),
        Command::Check => plugin.check(env, checked()?),
        Command::Gc => plugin.gc(env, checked()?),
        Command::Status => plugin.status(env, checked()?),
    };
    ran.map_err(Failed::Plugin)
}

/// A plugin's `validate` verb, as the doctor of ipam-delegated runs it on
/// every delegate of the family: `help` says what it checks (after how it
/// reads), and `run` calls [`validate`].
pub const fn validate_verb(
    help: &'static str,
    run: fn(&Options) -> Result<ExitCode, String>,
) -> Verb {
    Verb {
        name: "validate",
        synopsis: "< CONFIGURATION",
        options: &[],
        operands: false,
        help,
        run,
    }
}

/// What a plugin's `validate` verb does: reads a configuration on stdin, as a
/// runtime gives it, and runs `check` on it, which must allocate, write
/// and pin nothing. Exit 0, printing nothing, when it holds; otherwise
/// the CNI error object an ADD would print, and exit 1, so that a doctor
/// reads it as it reads any delegate's failure.
pub fn validate<E: Reportable + From<cni::Error>>(
    check: impl FnOnce(&NetConf) -> Result<(), E>,
) -> ExitCode {
    let mut stdin = Vec::new();
    let read = std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut stdin);
    let outcome = match read {
        Ok(_) => NetConf::parse(&stdin)
            .map_err(E::from)
            .and_then(|net| check(&net)),
        Err(e) => Err(E::from(cni::Error::ReadStdin(e))),
    };
    respond(outcome.map(|()| None), || cni::version_for_reply(&stdin))
}

/// What a plugin binary says when run with neither CNI_COMMAND nor
/// arguments, as libcni's skel does: its name, version and purpose, and
/// the spec versions it speaks, on stderr; then it fails.
pub fn about(program: &str, purpose: &str) -> ExitCode {
    let text = format!(
        "{program} {}: {purpose}\nCNI protocol versions supported: {}\n",
        env!("CARGO_PKG_VERSION"),
        cni::SUPPORTED.join(", ")
    );
    let _ = std::io::stderr().write_all(text.as_bytes());
    ExitCode::FAILURE
}

/// Writes a reply whole and flushed: a buffered write that fails only at
/// exit would go unnoticed.
pub fn write_reply(stdout: &mut dyn Write, reply: &[u8]) -> Result<(), cni::Error> {
    stdout
        .write_all(reply)
        .and_then(|()| stdout.flush())
        .map_err(cni::Error::WriteReply)
}

/// Writes the reply for `outcome` and returns the exit status. On failure
/// the reply is a CNI error object, whose cniVersion `cni_version` gives
/// (called only then, since it parses the input again), and the failure is
/// logged.
pub(crate) fn respond<E: Reportable>(
    outcome: Result<Option<Vec<u8>>, E>,
    cni_version: impl FnOnce() -> String,
) -> ExitCode {
    let (reply, status) = match &outcome {
        Ok(result) => (
            Cow::from(result.as_deref().unwrap_or_default()),
            ExitCode::SUCCESS,
        ),
        Err(e) => {
            let object = cni::error_object(&cni_version(), e.code(), &e.to_string(), &e.details());
            (Cow::from(object), ExitCode::FAILURE)
        }
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
