//! How ipam-delegated's stack fails: a delegate not in CNI_PATH, a
//! delegate run and failed (and how), or a stack that names the plugin
//! itself. The reply type gives each its code.

use std::io;

use crate::cni::{self, Command};

/// Why a stack must not name the plugin itself: every delegate gets the
/// same configuration, so it would start itself for ever.
const STACK_HOLDS_ITSELF: &str = "a stack cannot hold the plugin that runs it";

/// A failure of the stack.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// A delegate is this plugin itself, which would run itself forever.
    #[error("delegate {name:?} is ipam-delegated itself ({how}): {STACK_HOLDS_ITSELF}")]
    SelfReference {
        name: String,
        /// How it was found out.
        how: String,
    },

    /// This plugin was started as a delegate by itself.
    #[error("ipam-delegated was started as a delegate of ipam-delegated (pid {parent}): {STACK_HOLDS_ITSELF}")]
    Recursion {
        /// The pid of the ipam-delegated that started this one.
        parent: String,
    },

    /// A delegate is in none of the CNI_PATH directories.
    #[error("delegate {name:?} is not an executable file in any CNI_PATH directory (searched {searched})")]
    NotFound {
        name: String,
        /// The directories searched, as a list for the message.
        searched: String,
    },

    /// A delegate was run and failed. A CNI error object it printed is
    /// reported as it printed it; any other failure names the delegate.
    #[error("{}", match failure {
        Failure::Reported { msg, .. } if !msg.is_empty() => msg.clone(),
        _ => format!("{delegate} ({command}): {failure}"),
    })]
    Failed {
        /// The name as configured in `ipam.delegates`.
        delegate: String,
        command: Command,
        failure: Failure,
    },
}

/// How one delegate call failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The delegate exited non-zero and printed a CNI error object, kept as printed.
    #[error("failed with code {code}: {msg}")]
    Reported {
        code: u32,
        msg: String,
        details: String,
    },
    /// The process could not be started.
    #[error("could not be started: {0}")]
    NotStarted(#[source] io::Error),
    /// The delegate exited non-zero without a CNI error object on stdout.
    #[error("exited with status {status} and no CNI error object")]
    Exited {
        status: i32,
        /// The start of whatever it printed.
        stdout: String,
    },
    /// The delegate was killed by a signal.
    #[error("was killed by signal {0}")]
    Killed(i32),
    /// The delegate printed more than the cap (in bytes) and was stopped.
    #[error("printed more than {0} bytes on stdout and was stopped")]
    TooMuchOutput(usize),
    /// The delegate succeeded but printed something that is not a JSON object.
    #[error("printed something that is not a JSON object: {reason}")]
    NotObject {
        /// What is wrong with it.
        reason: String,
        /// The start of what it printed.
        stdout: String,
    },
    /// The last delegate's result cannot be the reply: not in a version
    /// the plugin can convert from, or not convertible.
    #[error("{0}")]
    Reply(#[source] cni::ConversionError),
    /// An ADD succeeded but printed no result.
    #[error("succeeded but printed no result")]
    NoResult,
    /// It ran past `ipam.timeout` and was killed with everything it started.
    #[error("did not finish within {0:?} and was killed")]
    TimedOut(std::time::Duration),
    /// A termination request stopped it.
    #[error("was stopped: the plugin received signal {0}")]
    Interrupted(i32),
    /// It finished in the grace a termination request gives, but the ADD
    /// it was the last step of is undone all the same: the runtime that
    /// asked the plugin to stop will not take the address.
    #[error("finished after the plugin received signal {0}; its ADD is undone")]
    FinishedAfterStop(i32),
    /// A termination request came before it was started, so it was not.
    #[error("was not run: the plugin had received signal {0}")]
    NotRun(i32),
    /// Reading its stdout, or waiting for it, failed.
    #[error("I/O error while supervising it: {0}")]
    Io(#[source] io::Error),
}
