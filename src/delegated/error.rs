//! How ipam-delegated fails: a delegate not in CNI_PATH, a delegate run
//! and failed (and how), a stack that names the plugin itself, an ADD
//! whose rollback failed too, several failures of a best-effort command;
//! and what the plugin meets on its way: a configuration or an agent's
//! request the protocol refuses, a configuration file that gives no
//! network, agent mode's files and locks. Each knows
//! its CNI code.

use std::io;

use crate::cni::{self, code, Command, Reportable};
use crate::dir::DirError;
use crate::netd::ConfigFileError;

/// Why a stack must not name the plugin itself: every delegate gets the
/// same configuration, so it would start itself for ever.
const STACK_HOLDS_ITSELF: &str = "a stack cannot hold the plugin that runs it";

/// A failure of ipam-delegated.
#[derive(Debug, thiserror::Error)]
pub enum DelegatedError {
    /// The configuration, or an agent's request, breaks the protocol's rules.
    #[error(transparent)]
    Protocol(#[from] cni::Error),

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

    /// An ADD failed and undoing it failed too; `error` is what is reported.
    #[error("{error}")]
    RollbackFailed {
        /// The failure that made the ADD roll back.
        error: Box<DelegatedError>,
        /// The rollback DELs that failed.
        rollback: Vec<DelegatedError>,
    },

    /// Several delegates failed in a best-effort command; the first is reported.
    #[error("{first} (and {} more {})", rest.len(), if rest.len() == 1 { "failure" } else { "failures" })]
    Several {
        /// The first failure: its code is the answer.
        first: Box<DelegatedError>,
        /// The failures after it, at least one.
        rest: Vec<DelegatedError>,
    },

    /// The configuration file (or directory) given to `ensure`, `release`
    /// or the doctor gives no network to work with.
    #[error(transparent)]
    ConfigFile(#[from] ConfigFileError),

    /// Agent mode's kept attachments could not be read or written, or
    /// their lock was not taken.
    #[error(transparent)]
    State(#[from] DirError),
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

impl Failure {
    /// The CNI error code a delegate's failure is reported with: its own,
    /// if it printed one.
    fn code(&self) -> u32 {
        match self {
            Failure::Reported { code, .. } => *code,
            Failure::NotStarted(_) => code::DELEGATE_NOT_STARTED,
            Failure::Exited { .. } => code::DELEGATE_EXITED,
            Failure::Killed(_) => code::DELEGATE_KILLED,
            Failure::TooMuchOutput(_) => code::DELEGATE_OUTPUT_TOO_LARGE,
            Failure::NotObject { .. } | Failure::NoResult => code::DECODING_FAILURE,
            Failure::Reply(e) => e.code(),
            Failure::TimedOut(_) => code::TRY_AGAIN_LATER,
            Failure::Interrupted(_) | Failure::FinishedAfterStop(_) | Failure::NotRun(_) => {
                code::INTERRUPTED
            }
            Failure::Io(_) => code::IO_FAILURE,
        }
    }

    /// Whether the delegate could not give its verdict now: a timeout, a
    /// termination request, "try again later", or it could not be run.
    fn is_transient(&self) -> bool {
        matches!(
            self,
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
        )
    }
}

impl Reportable for DelegatedError {
    fn code(&self) -> u32 {
        match self {
            DelegatedError::Protocol(e) => e.code(),
            DelegatedError::SelfReference { .. } | DelegatedError::Recursion { .. } => {
                code::INVALID_CONFIG
            }
            DelegatedError::NotFound { .. } => code::DELEGATE_NOT_FOUND,
            DelegatedError::Failed { failure, .. } => failure.code(),
            DelegatedError::RollbackFailed { error, .. } => error.code(),
            DelegatedError::Several { first, .. } => first.code(),
            DelegatedError::ConfigFile(e) => e.code(),
            DelegatedError::State(e) => e.code(),
        }
    }

    /// A delegate's own details, the start of what a misbehaving delegate
    /// printed, and every other failure that came with this one.
    fn details(&self) -> String {
        match self {
            DelegatedError::Failed { failure, .. } => match failure {
                Failure::Reported { details, .. } => details.clone(),
                Failure::Exited { stdout, .. } | Failure::NotObject { stdout, .. }
                    if !stdout.is_empty() =>
                {
                    format!("stdout began: {stdout}")
                }
                _ => String::new(),
            },
            DelegatedError::RollbackFailed { error, rollback } => {
                list(error.details(), "rollback DEL also failed", rollback.iter())
            }
            DelegatedError::Several { first, rest } => list(
                String::new(),
                "failures",
                std::iter::once(&**first).chain(rest),
            ),
            _ => String::new(),
        }
    }

    /// Always says which delegate failed and how.
    fn summary(&self) -> String {
        match self {
            DelegatedError::Failed {
                delegate,
                command,
                failure,
            } => format!("{delegate} ({command}): {failure}"),
            DelegatedError::RollbackFailed { error, .. } => error.summary(),
            DelegatedError::Several { first, .. } => first.summary(),
            _ => self.to_string(),
        }
    }
}

impl DelegatedError {
    /// Whether the stack could not give its verdict now (a timeout, a
    /// termination request, "try again later", a delegate that could not
    /// be run, a lock still held) rather than answering with a failure.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            DelegatedError::State(e) => e.is_transient(),
            DelegatedError::Failed { failure, .. } => failure.is_transient(),
            DelegatedError::RollbackFailed { error, .. } => error.is_transient(),
            DelegatedError::Several { first, .. } => first.is_transient(),
            _ => false,
        }
    }

    /// Whether this is a delegate that was never started, so had nothing
    /// to undo.
    pub(crate) fn never_ran(&self) -> bool {
        matches!(
            self,
            DelegatedError::Failed {
                failure: Failure::NotRun(_),
                ..
            }
        )
    }

    /// Whether this is `other`'s delegate failing again, with its code and
    /// message.
    fn repeats(&self, other: &DelegatedError) -> bool {
        match (self, other) {
            (
                DelegatedError::Failed { delegate, .. },
                DelegatedError::Failed {
                    delegate: first, ..
                },
            ) => {
                delegate == first
                    && self.code() == other.code()
                    && self.to_string() == other.to_string()
            }
            _ => false,
        }
    }

    /// Folds the failures of a best-effort command into one error, or none.
    pub(crate) fn from_failures(failures: Vec<DelegatedError>) -> Result<(), DelegatedError> {
        let mut failures = failures.into_iter();
        let Some(first) = failures.next() else {
            return Ok(());
        };
        let rest: Vec<DelegatedError> = failures.collect();
        if rest.is_empty() {
            Err(first)
        } else {
            Err(DelegatedError::Several {
                first: Box::new(first),
                rest,
            })
        }
    }

    /// Adds the failures of an ADD's rollback to the error that caused it,
    /// but the failing delegate's own DEL refused for the ADD's reason
    /// (code and message): settings or credentials refused twice say
    /// nothing new, and the log has each. Another delegate's failed DEL is
    /// always listed: it may have left an address held.
    pub(crate) fn with_rollback(self, rollback: Vec<DelegatedError>) -> DelegatedError {
        let rollback: Vec<DelegatedError> = rollback
            .into_iter()
            .filter(|undo| !undo.repeats(&self))
            .collect();
        if rollback.is_empty() {
            self
        } else {
            DelegatedError::RollbackFailed {
                error: Box::new(self),
                rollback,
            }
        }
    }
}

/// `own` details, then a heading and each listed error's summary (with its
/// details in brackets), one per line.
fn list<'a>(
    own: String,
    heading: &str,
    listed: impl Iterator<Item = &'a DelegatedError>,
) -> String {
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

    fn delegate(name: &str, failure: Failure) -> DelegatedError {
        DelegatedError::Failed {
            delegate: name.into(),
            command: Command::Add,
            failure,
        }
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
    fn rollback_failures_for_the_adds_reason_are_not_repeated() {
        let refused = |code| Failure::Reported {
            code,
            msg: "unknown key \"exlcude\"".into(),
            details: String::new(),
        };
        let e = delegate("b", refused(7)).with_rollback(vec![
            delegate("a", refused(7)),
            delegate("b", refused(7)),
            delegate("b", refused(5)),
        ]);
        assert_eq!(e.code(), 7);
        // Another delegate's, even for the same reason, and b's for another.
        assert_eq!(
            e.details(),
            "rollback DEL also failed:\n- a (ADD): failed with code 7: unknown key \"exlcude\"\n- b (ADD): failed with code 5: unknown key \"exlcude\""
        );
        let e = delegate("b", refused(7)).with_rollback(vec![delegate("b", refused(7))]);
        assert!(matches!(e, DelegatedError::Failed { .. }), "{e:?}");
        assert_eq!(e.details(), "");
    }

    #[test]
    fn no_rollback_failures_leave_the_error_as_it_was() {
        let e = delegate("b", Failure::NoResult).with_rollback(Vec::new());
        assert!(matches!(e, DelegatedError::Failed { .. }));
    }

    #[test]
    fn several_failures_report_the_first_code_and_list_them_all() {
        let e = DelegatedError::from_failures(vec![
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
        let three = DelegatedError::from_failures(vec![
            delegate("a", Failure::NoResult),
            delegate("b", Failure::NoResult),
            delegate("c", Failure::NoResult),
        ])
        .unwrap_err();
        assert!(three.to_string().ends_with("(and 2 more failures)"));
    }

    #[test]
    fn one_failure_is_reported_as_itself_and_none_is_success() {
        assert!(DelegatedError::from_failures(Vec::new()).is_ok());
        let e = DelegatedError::from_failures(vec![delegate("a", Failure::NoResult)]).unwrap_err();
        assert!(matches!(e, DelegatedError::Failed { .. }));
        assert_eq!(e.code(), code::DECODING_FAILURE);
    }

    #[test]
    fn what_cannot_give_a_verdict_now_is_transient() {
        assert!(delegate("a", Failure::TimedOut(std::time::Duration::ZERO)).is_transient());
        assert!(delegate("a", reported(code::TRY_AGAIN_LATER)).is_transient());
        assert!(!delegate("a", reported(7)).is_transient());
        let held = DelegatedError::from(DirError::LockTimeout {
            path: "/run/x".into(),
            waited: std::time::Duration::ZERO,
        });
        assert!(held.is_transient());
        assert_eq!(held.code(), code::TRY_AGAIN_LATER);
    }
}
