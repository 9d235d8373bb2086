//! The meta-plugin's stack of delegates: finding them in CNI_PATH, the
//! rules of running them in order (threading results, undoing a failed
//! ADD), and the seam between those rules and what runs a delegate: the
//! [`Runner`], processes in production and a fake in the chain's tests.

#[cfg(test)]
mod fake;
mod judge;
mod lookup;
mod process;
mod rules;
mod supervise;

use std::time::Duration;

pub use judge::{judge, Printed};
pub use lookup::{all, is_copy_of_this_plugin, list_dirs, resolve_each, same_file, Delegate};
pub use process::Processes;
pub use rules::Chain;

use crate::cni::Command;
use crate::delegated::{Failure, StackError};
use crate::error::Error;

/// Set in every delegate's environment, to the plugin's pid. An
/// ipam-delegated that finds it set was started by itself: its stack names
/// it (under another name, or as a copy), and would start itself forever.
pub const PARENT_VARIABLE: &str = "IPAM_DELEGATED_PARENT";

/// What bounds one call.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Stop the delegate (and everything in its group) after this long.
    pub timeout: Option<Duration>,
    /// How many termination requests wind the call down: 1 for what the
    /// runtime asked for (the delegate gets a grace to finish, a second
    /// request kills it at once); 2 for a rollback DEL, which a first
    /// request must not cut short (that would leak what the ADD allocated)
    /// but a second kills.
    pub stopped_by: usize,
}

impl Limits {
    /// The count of requests that kills the delegate at once.
    fn killed_by(self) -> usize {
        self.stopped_by.max(2)
    }
}

/// One call of a delegate.
#[derive(Debug)]
pub struct Call<'a> {
    pub command: Command,
    pub stdin: &'a [u8],
    pub limits: Limits,
    /// Cleared, filled with what the delegate prints, and handed back as
    /// the result, so that a chain reuses one allocation.
    pub buffer: Vec<u8>,
}

/// What runs one delegate call.
pub trait Runner {
    /// Runs `call` on `delegate`. Returns the JSON object it printed
    /// (trimmed, in the call's buffer), or `None` if it printed nothing;
    /// for any command but ADD, output that is not one object also gives
    /// `None`. A call asked to stop before it started fails with
    /// [`Failure::NotRun`].
    fn run(&self, delegate: &Delegate, call: Call) -> Result<Option<Vec<u8>>, Failure>;

    /// The signal of the latest termination request, if at least `count`
    /// have come.
    fn stop_requested(&self, count: usize) -> Option<i32>;
}

/// VERSION: the spec versions `delegate` says it supports, asked with
/// `cni_version` and bounded by `timeout`, as a doctor must not hang.
pub fn supported_versions(
    delegate: &Delegate,
    cni_version: &str,
    timeout: Duration,
) -> Result<Vec<String>, Error> {
    let question = serde_json::json!({"cniVersion": cni_version}).to_string();
    let call = Call {
        command: Command::Version,
        stdin: question.as_bytes(),
        limits: Limits {
            timeout: Some(timeout),
            stopped_by: 1,
        },
        buffer: Vec::new(),
    };
    let answer = Processes::default()
        .run(delegate, call)
        .map_err(|failure| delegate.failed(Command::Version, failure))?;
    let versions = answer
        .and_then(|a| serde_json::from_slice::<serde_json::Value>(&a).ok())
        .and_then(|a| {
            let list = a.get("supportedVersions")?.as_array()?;
            list.iter()
                .map(|v| v.as_str().map(String::from))
                .collect::<Option<Vec<_>>>()
        });
    versions.ok_or_else(|| delegate.failed(Command::Version, Failure::NoResult))
}

impl Delegate {
    /// `failure` of this delegate running `command`, as an error naming it.
    fn failed(&self, command: Command, failure: Failure) -> Error {
        Error::from(StackError::Failed {
            delegate: self.name.clone(),
            command,
            failure,
        })
    }
}
