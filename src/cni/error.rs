//! What goes wrong at the protocol's level, in any plugin (its environment,
//! its input, its reply); the error codes, the specification's and the
//! family's own; what every part's error gives the reply ([`Reportable`]);
//! and the error object a failing plugin prints.

use std::io;

use serde_json::json;

use super::command::Command;
use super::version::SUPPORTED;

/// CNI error codes: the specification's where one fits, the family's own
/// from 100 up. docs/reference.md's table lists each one.
pub mod code {
    /// The configuration's cniVersion, or a command at that version, is not supported.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// A CNI_* environment variable is missing or malformed.
    pub const INVALID_ENVIRONMENT: u32 = 4;
    /// Reading, writing or waiting failed at the I/O level.
    pub const IO_FAILURE: u32 = 5;
    /// Something that should be a JSON object is not.
    pub const DECODING_FAILURE: u32 = 6;
    /// The network configuration is invalid.
    pub const INVALID_CONFIG: u32 = 7;
    /// Try again later.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin cannot serve an ADD now.
    pub const NOT_AVAILABLE: u32 = 50;

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
    /// SIGTERM or SIGINT stopped the plugin before its work was done.
    pub const INTERRUPTED: u32 = 105;
    /// A pool has no free address.
    pub const POOL_EXHAUSTED: u32 = 110;
    /// The address asked for cannot be given (outside the pool, its
    /// gateway, held by another attachment …).
    pub const ADDRESS_UNAVAILABLE: u32 = 111;
    /// CHECK: an address of the previous result is not held by the
    /// attachment.
    pub const NOT_HELD: u32 = 112;
}

/// What the reply needs of an error, whichever part's it is: each part's
/// own error enum knows its code, and says more in `details` where it
/// has more to say. Its message is its `Display`. Only the layer that
/// writes the reply puts errors of several parts together.
pub trait Reportable: std::error::Error {
    /// The CNI error code it is reported with.
    fn code(&self) -> u32;

    /// The error object's `details`: nothing, unless the error carries
    /// more than its message (a delegate's own details, the failures that
    /// came with it).
    fn details(&self) -> String {
        String::new()
    }

    /// One line for logs and for lists of failures that always names who
    /// failed: its message, unless that leaves the culprit out.
    fn summary(&self) -> String {
        self.to_string()
    }
}

/// A protocol-level failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration's cniVersion (as written, if present) is missing,
    /// not a string, or not one the crate speaks.
    #[error("cniVersion {} is not supported; supported: {}", .0.as_deref().unwrap_or("(missing)"), SUPPORTED.join(", "))]
    UnsupportedVersion(Option<String>),

    /// The command exists only from a later spec version than the configuration's.
    #[error("{command} needs cniVersion {minimum} or later, the configuration has {version}")]
    CommandNeedsVersion {
        /// The command asked for.
        command: Command,
        /// The first spec version that has it.
        minimum: &'static str,
        /// The configuration's version.
        version: &'static str,
    },

    /// CNI_COMMAND names no CNI command.
    #[error("CNI_COMMAND {0:?} is not a CNI command this plugin knows (ADD, DEL, CHECK, GC, STATUS, VERSION)")]
    UnknownCommand(String),

    /// A variable the command needs is not set, or is empty.
    #[error("{0} is not set")]
    MissingVariable(&'static str),

    /// A variable is set but its value breaks the specification's rules.
    #[error("{name} is invalid: {reason}")]
    InvalidVariable {
        /// The variable (or option) named.
        name: &'static str,
        /// What is wrong with its value.
        reason: String,
    },

    /// Several variables are missing or invalid: each one named, as skel
    /// lists them all, so that a runtime's mistakes are fixed in one go.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Variables(Vec<Error>),

    /// Stdin could not be read.
    #[error("cannot read the network configuration from stdin: {0}")]
    ReadStdin(#[source] io::Error),

    /// The reply could not be written on stdout (a pipe whose reader has
    /// gone, or a full disk).
    #[error("the reply could not be written on stdout: {0}")]
    WriteReply(#[source] io::Error),

    /// Stdin is not a JSON object.
    #[error("the network configuration is not a JSON object: {0}")]
    NotAnObject(#[source] serde_json::Error),

    /// The configuration breaks a rule.
    #[error("invalid network configuration: {0}")]
    InvalidConfig(String),
}

impl Reportable for Error {
    fn code(&self) -> u32 {
        match self {
            Error::UnsupportedVersion(_) | Error::CommandNeedsVersion { .. } => {
                code::INCOMPATIBLE_VERSION
            }
            Error::UnknownCommand(_)
            | Error::MissingVariable(_)
            | Error::InvalidVariable { .. }
            | Error::Variables(_) => code::INVALID_ENVIRONMENT,
            Error::ReadStdin(_) | Error::WriteReply(_) => code::IO_FAILURE,
            Error::NotAnObject(_) => code::DECODING_FAILURE,
            Error::InvalidConfig(_) => code::INVALID_CONFIG,
        }
    }
}

impl Error {
    /// The variable problems found in an environment as one error (the
    /// problem itself when there is one), or none.
    pub(super) fn from_variables(mut problems: Vec<Error>) -> Option<Error> {
        match problems.len() {
            0 => None,
            1 => problems.pop(),
            _ => Some(Error::Variables(problems)),
        }
    }
}

/// The CNI error object a failing plugin prints on stdout, on one line.
pub fn error_object(cni_version: &str, code: u32, msg: &str, details: &str) -> Vec<u8> {
    let object = json!({
        "cniVersion": cni_version,
        "code": code,
        "msg": msg,
        "details": details,
    });
    let mut bytes = object.to_string().into_bytes();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_is_one_cni_error_object_on_one_line() {
        let reply = error_object("0.4.0", 4, "CNI_PATH is not set", "");
        assert_eq!(reply.last(), Some(&b'\n'));
        assert_eq!(reply.iter().filter(|b| **b == b'\n').count(), 1);
        let v: serde_json::Value = serde_json::from_slice(&reply).unwrap();
        assert_eq!(
            v,
            json!({"cniVersion": "0.4.0", "code": 4, "msg": "CNI_PATH is not set", "details": ""})
        );
    }

    #[test]
    fn several_variable_problems_are_named_in_one_message() {
        assert!(Error::from_variables(Vec::new()).is_none());
        let one = Error::from_variables(vec![Error::MissingVariable("CNI_PATH")]).unwrap();
        assert_eq!(one.to_string(), "CNI_PATH is not set");
        let two = Error::from_variables(vec![
            Error::MissingVariable("CNI_NETNS"),
            Error::MissingVariable("CNI_PATH"),
        ])
        .unwrap();
        assert_eq!(two.to_string(), "CNI_NETNS is not set; CNI_PATH is not set");
        assert_eq!(two.code(), code::INVALID_ENVIRONMENT);
    }
}
