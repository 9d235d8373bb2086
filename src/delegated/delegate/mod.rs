//! Running the delegates: finding them in CNI_PATH, the rules of running
//! them in order (threading results, undoing a failed ADD), and the seam
//! between those rules and what runs a delegate: the [`Runner`],
//! processes in production and a fake in the rules' tests.

#[cfg(test)]
mod fake;
mod judge;
mod lookup;
mod process;
mod rules;
mod runner;
mod supervise;

use std::time::Duration;

pub use judge::{judge, Printed};
pub use lookup::{all, is_copy_of_this_plugin, list_dirs, resolve_each, same_file, Delegate};
pub use process::{Processes, PARENT_VARIABLE};
pub use rules::Chain;
pub use runner::{Call, Limits, Runner};

use crate::cni::Command;
use crate::delegated::error::{DelegatedError, Failure};

/// VERSION: the spec versions `delegate` says it supports, asked with
/// `cni_version` and bounded by `timeout`, as a doctor must not hang.
pub fn supported_versions(
    delegate: &Delegate,
    cni_version: &str,
    timeout: Duration,
) -> Result<Vec<String>, DelegatedError> {
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
    fn failed(&self, command: Command, failure: Failure) -> DelegatedError {
        DelegatedError::Failed {
            delegate: self.name.clone(),
            command,
            failure,
        }
    }
}
