//! The one reply type: every way an invocation can fail, composed of the
//! protocol's failures ([`cni::Error`]) and each part's own, and the table
//! of the CNI error code each one is reported with.

use std::io;

use crate::cni;
use crate::da_pool::PoolError;
use crate::delegated::{Failure, StackError};
use crate::docker::DockerError;
use crate::etcd::EtcdError;

/// CNI error codes: the specification's where one fits, ours from 100 up.
/// The README's error-code table lists each one.
pub mod code {
    pub use crate::cni::code::*;

    /// A delegate is not in any CNI_PATH directory as an executable file.
    pub const DELEGATE_NOT_FOUND: u32 = 100;
    /// A delegate was found but could not be started.
    pub const DELEGATE_NOT_STARTED: u32 = 101;
    /// A delegate exited non-zero without printing a CNI error object.
    pub const DELEGATE_EXITED: u32 = 102;
    /// A delegate was killed by a signal.
    pub const DELEGATE_KILLED: u32 = 103;
    /// A delegate printed more than the output cap and was stopped.
    pub const DELEGATE_OUTPUT_TOO_LARGE: u32 = 104;
    /// SIGTERM or SIGINT stopped the plugin before its stack was done.
    pub const INTERRUPTED: u32 = 105;
    /// A pool has no free address.
    pub const POOL_EXHAUSTED: u32 = 110;
    /// The address asked for cannot be given (outside the pool, its
    /// gateway, held by another attachment …).
    pub const ADDRESS_UNAVAILABLE: u32 = 111;
    /// CHECK: an address of the previous result is not held by the
    /// attachment.
    pub const NOT_HELD: u32 = 112;
    /// STATUS: the plugin cannot serve an ADD now (the specification's 50).
    pub const NOT_AVAILABLE: u32 = 50;
}

/// Everything that can make an invocation fail: the protocol's failures,
/// each part's own, and what the parts share.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The protocol: the environment, the input, a version.
    #[error(transparent)]
    Cni(#[from] cni::Error),

    /// ipam-delegated's stack: a delegate not found, or failed.
    #[error(transparent)]
    Stack(#[from] StackError),

    /// ipam-da-pool: an address not given, not held, not now.
    #[error(transparent)]
    Pool(#[from] PoolError),

    /// The etcd cluster a store is kept in.
    #[error(transparent)]
    Etcd(#[from] EtcdError),

    /// The Docker driver: a request it cannot serve.
    #[error(transparent)]
    Docker(#[from] DockerError),

    /// A termination request came while the plugin was waiting, not
    /// running a delegate.
    #[error("stopped: the plugin received signal {signal} while {during}")]
    Interrupted {
        signal: i32,
        /// What it was waiting for.
        during: &'static str,
    },

    /// A lock was held past the time the configuration allows.
    #[error("the lock on {} is still held after {waited:?}: try again later", path.display())]
    LockTimeout {
        /// The directory locked.
        path: std::path::PathBuf,
        /// How long the plugin waited.
        waited: std::time::Duration,
    },

    /// Records kept in files (agent mode's state, a pool's local store)
    /// could not be read or written, or are not what they should be.
    #[error("{}: {error}", path.display())]
    Files {
        /// The file or directory.
        path: std::path::PathBuf,
        #[source]
        error: io::Error,
    },

    /// A network configuration file given on a command line cannot be used.
    #[error("{}: {reason}", path.display())]
    ConfigFile {
        /// The file given with --config.
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// An ADD failed and undoing it failed too; `error` is what is reported.
    #[error("{error}")]
    RollbackFailed {
        /// The failure that made the ADD roll back.
        error: Box<Error>,
        /// The rollback DELs that failed.
        rollback: Vec<Error>,
    },

    /// Several delegates failed in a best-effort command; the first is reported.
    #[error("{first} (and {} more {})", rest.len(), if rest.len() == 1 { "failure" } else { "failures" })]
    Several {
        /// The first failure: its code is the answer.
        first: Box<Error>,
        /// The failures after it, at least one.
        rest: Vec<Error>,
    },
}

impl Error {
    /// The CNI error code this error is reported with.
    pub fn code(&self) -> u32 {
        match self {
            Error::Cni(e) => e.code(),
            Error::Stack(e) => match e {
                StackError::SelfReference { .. } | StackError::Recursion { .. } => {
                    code::INVALID_CONFIG
                }
                StackError::NotFound { .. } => code::DELEGATE_NOT_FOUND,
                StackError::Failed { failure, .. } => match failure {
                    Failure::Reported { code, .. } => *code,
                    Failure::NotStarted(_) => code::DELEGATE_NOT_STARTED,
                    Failure::Exited { .. } => code::DELEGATE_EXITED,
                    Failure::Killed(_) => code::DELEGATE_KILLED,
                    Failure::TooMuchOutput(_) => code::DELEGATE_OUTPUT_TOO_LARGE,
                    Failure::NotObject { .. } | Failure::NoResult => code::DECODING_FAILURE,
                    Failure::Reply(e) => e.code(),
                    Failure::TimedOut(_) => code::TRY_AGAIN_LATER,
                    Failure::Interrupted(_)
                    | Failure::FinishedAfterStop(_)
                    | Failure::NotRun(_) => code::INTERRUPTED,
                    Failure::Io(_) => code::IO_FAILURE,
                },
            },
            Error::Pool(e) => match e {
                PoolError::Exhausted { .. } => code::POOL_EXHAUSTED,
                PoolError::AddressUnavailable { .. } => code::ADDRESS_UNAVAILABLE,
                PoolError::NotHeld { .. } => code::NOT_HELD,
                PoolError::NotAvailable(_) | PoolError::Fenced(_) => code::NOT_AVAILABLE,
                PoolError::Busy(_) | PoolError::Moved { .. } => code::TRY_AGAIN_LATER,
            },
            Error::Etcd(e) => match e {
                EtcdError::Unavailable { .. } | EtcdError::NoSpace { .. } => code::TRY_AGAIN_LATER,
                EtcdError::Refused { .. } | EtcdError::Tls { .. } | EtcdError::Auth { .. } => {
                    code::IO_FAILURE
                }
            },
            Error::Docker(e) => match e {
                DockerError::Request(_) => code::INVALID_CONFIG,
                DockerError::AddressUnavailable { .. } => code::ADDRESS_UNAVAILABLE,
            },
            Error::Files { .. } => code::IO_FAILURE,
            Error::Interrupted { .. } => code::INTERRUPTED,
            Error::LockTimeout { .. } => code::TRY_AGAIN_LATER,
            Error::ConfigFile { .. } => code::INVALID_CONFIG,
            Error::RollbackFailed { error, .. } => error.code(),
            Error::Several { first, .. } => first.code(),
        }
    }

    /// Whether the stack could not give its verdict now (a timeout, a
    /// termination request, "try again later", a delegate that could not
    /// be run) rather than answering with a failure.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Error::Interrupted { .. } | Error::LockTimeout { .. } => true,
            Error::Stack(StackError::Failed { failure, .. }) => matches!(
                failure,
                Failure::TimedOut(_)
                    | Failure::Interrupted(_)
                    | Failure::FinishedAfterStop(_)
                    | Failure::NotRun(_)
                    | Failure::NotStarted(_)
                    | Failure::Io(_)
                    | Failure::Reported {
                        code: code::TRY_AGAIN_LATER,
                        ..
                    }
            ),
            Error::RollbackFailed { error, .. } => error.is_transient(),
            Error::Several { first, .. } => first.is_transient(),
            _ => false,
        }
    }

    /// Whether this is a delegate that was never started, so had nothing
    /// to undo.
    pub(crate) fn never_ran(&self) -> bool {
        matches!(
            self,
            Error::Stack(StackError::Failed {
                failure: Failure::NotRun(_),
                ..
            })
        )
    }

    /// The CNI error object's `details`: a delegate's own details, the
    /// start of what a misbehaving delegate printed, and every other failure
    /// that came with this one.
    pub fn details(&self) -> String {
        match self {
            Error::Stack(StackError::Failed { failure, .. }) => match failure {
                Failure::Reported { details, .. } => details.clone(),
                Failure::Exited { stdout, .. } | Failure::NotObject { stdout, .. }
                    if !stdout.is_empty() =>
                {
                    format!("stdout began: {stdout}")
                }
                _ => String::new(),
            },
            Error::RollbackFailed { error, rollback } => {
                list(error.details(), "rollback DEL also failed", rollback.iter())
            }
            Error::Several { first, rest } => list(
                String::new(),
                "failures",
                std::iter::once(&**first).chain(rest),
            ),
            _ => String::new(),
        }
    }

    /// One line that always says which delegate failed and how, for logs
    /// and for the lists in `details`.
    pub fn summary(&self) -> String {
        match self {
            Error::Stack(StackError::Failed {
                delegate,
                command,
                failure,
            }) => format!("{delegate} ({command}): {failure}"),
            Error::RollbackFailed { error, .. } => error.summary(),
            Error::Several { first, .. } => first.summary(),
            _ => self.to_string(),
        }
    }

    /// The CNI error object for this error, as printed on stdout.
    pub fn to_reply(&self, cni_version: &str) -> Vec<u8> {
        cni::error_object(cni_version, self.code(), &self.to_string(), &self.details())
    }

    /// Folds the failures of a best-effort command into one error, or none.
    pub(crate) fn from_failures(failures: Vec<Error>) -> Result<(), Error> {
        let mut failures = failures.into_iter();
        let Some(first) = failures.next() else {
            return Ok(());
        };
        let rest: Vec<Error> = failures.collect();
        if rest.is_empty() {
            Err(first)
        } else {
            Err(Error::Several {
                first: Box::new(first),
                rest,
            })
        }
    }

    /// Adds the failures of an ADD's rollback to the error that caused it.
    pub(crate) fn with_rollback(self, rollback: Vec<Error>) -> Error {
        if rollback.is_empty() {
            self
        } else {
            Error::RollbackFailed {
                error: Box::new(self),
                rollback,
            }
        }
    }
}

/// `own` details, then a heading and each listed error's summary (with its
/// details in brackets), one per line.
fn list<'a>(own: String, heading: &str, listed: impl Iterator<Item = &'a Error>) -> String {
    let mut out = own;
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(heading);
    out.push(':');
    for error in listed {
        out.push_str("\n- ");
        out.push_str(&error.summary());
        let details = error.details();
        if !details.is_empty() {
            out.push_str(&format!(" ({details})"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::Command;

    fn delegate(name: &str, failure: Failure) -> Error {
        StackError::Failed {
            delegate: name.into(),
            command: Command::Add,
            failure,
        }
        .into()
    }

    fn reported(code: u32) -> Failure {
        Failure::Reported {
            code,
            msg: "no addresses left".into(),
            details: "pool p1 is full".into(),
        }
    }

    #[test]
    fn a_reported_error_keeps_its_code_message_and_details() {
        let e = delegate("ipam-da-world", reported(11));
        assert_eq!(e.code(), 11);
        assert_eq!(e.to_string(), "no addresses left");
        assert_eq!(e.details(), "pool p1 is full");
        assert_eq!(
            e.summary(),
            "ipam-da-world (ADD): failed with code 11: no addresses left"
        );
    }

    #[test]
    fn a_reported_error_without_a_message_names_the_delegate() {
        let e = delegate(
            "a",
            Failure::Reported {
                code: 11,
                msg: String::new(),
                details: String::new(),
            },
        );
        assert_eq!(e.to_string(), "a (ADD): failed with code 11: ");
    }

    #[test]
    fn other_failures_name_the_delegate() {
        let e = delegate("a", Failure::Killed(9));
        assert_eq!(e.to_string(), "a (ADD): was killed by signal 9");
        assert_eq!(e.code(), code::DELEGATE_KILLED);
    }

    #[test]
    fn rollback_failures_are_listed_but_never_replace_the_code() {
        let e = delegate("b", reported(11)).with_rollback(vec![
            delegate("a", Failure::Killed(9)),
            delegate(
                "b",
                Failure::Exited {
                    status: 3,
                    stdout: String::new(),
                },
            ),
        ]);
        assert_eq!(e.code(), 11);
        assert_eq!(e.to_string(), "no addresses left");
        assert_eq!(
            e.details(),
            "pool p1 is full\nrollback DEL also failed:\n- a (ADD): was killed by signal 9\n- b (ADD): exited with status 3 and no CNI error object"
        );
    }

    #[test]
    fn no_rollback_failures_leave_the_error_as_it_was() {
        let e = delegate("b", Failure::NoResult).with_rollback(Vec::new());
        assert!(matches!(e, Error::Stack(StackError::Failed { .. })));
    }

    #[test]
    fn several_failures_report_the_first_code_and_list_them_all() {
        let e = Error::from_failures(vec![
            delegate("a", Failure::Killed(15)),
            delegate("b", reported(11)),
        ])
        .unwrap_err();
        assert_eq!(e.code(), code::DELEGATE_KILLED);
        assert_eq!(
            e.to_string(),
            "a (ADD): was killed by signal 15 (and 1 more failure)"
        );
        assert_eq!(
            e.details(),
            "failures:\n- a (ADD): was killed by signal 15\n- b (ADD): failed with code 11: no addresses left (pool p1 is full)"
        );
        let three = Error::from_failures(vec![
            delegate("a", Failure::NoResult),
            delegate("b", Failure::NoResult),
            delegate("c", Failure::NoResult),
        ])
        .unwrap_err();
        assert!(three.to_string().ends_with("(and 2 more failures)"));
    }

    #[test]
    fn one_failure_is_reported_as_itself_and_none_is_success() {
        assert!(Error::from_failures(Vec::new()).is_ok());
        let e = Error::from_failures(vec![delegate("a", Failure::NoResult)]).unwrap_err();
        assert!(matches!(e, Error::Stack(StackError::Failed { .. })));
        assert_eq!(e.code(), code::DECODING_FAILURE);
    }
}
