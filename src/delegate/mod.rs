//! Running the stack: each delegate in order, each one's printed result
//! handed to the next as `prevResult`, and an ADD that fails undone.

mod exec;
mod lookup;

use std::time::Duration;

use tracing::warn;

pub use exec::{judge, Limits, STDOUT_CAP};
pub use lookup::{resolve, resolve_each, Delegate};

use crate::config::Config;
use crate::environment::Command;
use crate::error::{Error, Failure};
use crate::result;
use crate::signals;

/// The limits of every call the runtime asked for: stopped by a termination
/// request, and bounded by `ipam.timeout` when the configuration sets one.
fn asked(config: &Config) -> Limits {
    Limits {
        timeout: config.timeout,
        stopped_by: 1,
    }
}

/// The limits of a rollback DEL: bounded alike, but stopped only by a
/// second termination request; after the first, stopping would leave
/// allocated what it is undoing.
fn undoing(config: &Config) -> Limits {
    Limits {
        stopped_by: 2,
        ..asked(config)
    }
}

impl Delegate {
    /// Runs `command` with `stdin`, reading what it prints into `buffer`
    /// (cleared first; handed back as the result, so a chain reuses one
    /// allocation); a failure comes back naming this delegate.
    fn call(
        &self,
        command: Command,
        stdin: &[u8],
        limits: Limits,
        buffer: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, Error> {
        exec::run(self, command, stdin, limits, buffer)
            .map_err(|failure| self.failed(command, failure))
    }

    fn failed(&self, command: Command, failure: Failure) -> Error {
        Error::Delegate {
            delegate: self.name.clone(),
            command,
            failure,
        }
    }
}

/// ADD: delegate 1 gets the input as it came, each next one the previous
/// one's result as `prevResult`; the last result is the answer, as printed
/// or, if printed in another spec version, converted to the configuration's.
/// If delegate k fails, delegates 1..=k get a DEL (see [`rollback`]) and
/// delegate k's error is the answer; if it was never started (the plugin
/// was asked to stop first), 1..k.
pub fn add(config: &Config, delegates: &[Delegate]) -> Result<Vec<u8>, Error> {
    let mut thread = Thread::new(config);
    for (k, delegate) in delegates.iter().enumerate() {
        let buffer = thread.take_buffer();
        let error = match delegate.call(Command::Add, thread.input(), asked(config), buffer) {
            Ok(Some(result)) if k + 1 == delegates.len() => {
                // Finished in the grace of a termination request: the ADD
                // is undone all the same, as it would have been earlier.
                let converted = match signals::received(asked(config).stopped_by) {
                    Some(signal) => Err(Failure::FinishedAfterStop(signal)),
                    None => result::in_version(result, config.cni_version),
                };
                match converted {
                    Ok(reply) => return Ok(reply),
                    Err(failure) => delegate.failed(Command::Add, failure),
                }
            }
            Ok(Some(result)) => {
                thread.pass_on(result);
                continue;
            }
            Ok(None) => delegate.failed(Command::Add, Failure::NoResult),
            Err(error) => error,
        };
        // One that never started has nothing to undo.
        let ran = if error.never_ran() { k } else { k + 1 };
        warn!(
            "ADD failed, rolling back {ran} delegate(s): {}",
            error.summary()
        );
        return Err(error.with_rollback(rollback(&delegates[..ran], thread)));
    }
    // Only reachable with no delegates, which Config::parse refuses.
    Err(Error::InvalidConfig("\"ipam.delegates\" is empty".into()))
}

/// Undoes an ADD that succeeded but whose result the runtime will never
/// see: DEL on every delegate, in order, the first getting the result as
/// `prevResult`, as a runtime's DEL would. Returns the DELs that failed.
pub fn undo(config: &Config, delegates: &[Delegate], result: &[u8]) -> Vec<Error> {
    let mut thread = Thread::new(config);
    thread.input = Some(config.with_prev_result(result));
    rollback(delegates, thread)
}

/// Undoes a failed ADD: DEL on each delegate that was run, failed one
/// included, in the same order. The first DEL gets `thread`'s input, what
/// the failed delegate got; then results thread as in [`del`]. Failures
/// are logged and returned, and never stop the remaining DELs.
fn rollback(delegates: &[Delegate], mut thread: Thread) -> Vec<Error> {
    let limits = undoing(thread.config);
    delegates
        .iter()
        .filter_map(|delegate| {
            let error = thread.step(delegate, Command::Del, limits).err()?;
            warn!("rollback: {}", error.summary());
            Some(error)
        })
        .collect()
}

/// DEL, best effort: every delegate that was found runs, in order, whatever
/// the others did. The first failure's code is the answer; all are listed.
pub fn del(config: &Config, delegates: Vec<Result<Delegate, Error>>) -> Result<(), Error> {
    let mut thread = Thread::new(config);
    let failures = delegates
        .into_iter()
        .filter_map(|found| {
            found
                .and_then(|delegate| thread.step(&delegate, Command::Del, asked(config)))
                .err()
        })
        .collect();
    Error::from_failures(failures)
}

/// CHECK: in order, threading results as DEL does; the first failure is the answer.
pub fn check(config: &Config, delegates: &[Delegate]) -> Result<(), Error> {
    let mut thread = Thread::new(config);
    for delegate in delegates {
        thread.step(delegate, Command::Check, asked(config))?;
    }
    Ok(())
}

/// GC (CNI 1.1), best effort: every delegate that was found gets the input
/// as it came, `cni.dev/valid-attachments` and all, whatever the others did.
/// Nothing is threaded: each delegate cleans up its own store against the
/// runtime's list. The first failure's code is the answer; all are listed.
pub fn gc(config: &Config, delegates: Vec<Result<Delegate, Error>>) -> Result<(), Error> {
    let failures = delegates
        .into_iter()
        .filter_map(|found| {
            found
                .and_then(|delegate| {
                    delegate.call(Command::Gc, config.raw, asked(config), Vec::new())
                })
                .err()
        })
        .collect();
    Error::from_failures(failures)
}

/// STATUS (CNI 1.1): each delegate in order gets the input as it came; the
/// first one not ready (50, 51 or any failure) is the answer, code kept.
pub fn status(config: &Config, delegates: &[Delegate]) -> Result<(), Error> {
    for delegate in delegates {
        delegate.call(Command::Status, config.raw, asked(config), Vec::new())?;
    }
    Ok(())
}

/// VERSION: the spec versions `delegate` says it supports, asked with
/// `cni_version`; bounded by `timeout`, as a doctor must not hang.
pub fn supported_versions(
    delegate: &Delegate,
    cni_version: &str,
    timeout: Duration,
) -> Result<Vec<String>, Error> {
    let question = serde_json::json!({"cniVersion": cni_version}).to_string();
    let limits = Limits {
        timeout: Some(timeout),
        stopped_by: 1,
    };
    let answer = delegate.call(Command::Version, question.as_bytes(), limits, Vec::new())?;
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

/// A chain's threading: the input the next delegate reads, and the buffer
/// the next output is read into. A result becomes the next input's
/// `prevResult`, and its allocation the next output's buffer, so two
/// buffers serve a chain of any length: memory stays at about the
/// configuration plus twice [`STDOUT_CAP`], the input being fed and the
/// output being read.
struct Thread<'a> {
    config: &'a Config<'a>,
    /// The next input; `None` for the configuration as it came.
    input: Option<Vec<u8>>,
    /// Where the next output is read.
    spare: Vec<u8>,
}

impl<'a> Thread<'a> {
    fn new(config: &'a Config<'a>) -> Thread<'a> {
        Thread {
            config,
            input: None,
            spare: Vec::new(),
        }
    }

    fn input(&self) -> &[u8] {
        self.input.as_deref().unwrap_or(self.config.raw)
    }

    fn take_buffer(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.spare)
    }

    /// Makes `result` the next input's `prevResult`.
    fn pass_on(&mut self, result: Vec<u8>) {
        let input = self.input.get_or_insert_with(Vec::new);
        self.config.write_with_prev_result(&result, input);
        self.spare = result;
    }

    /// One call of a threaded DEL or CHECK: a delegate that printed a
    /// result makes it the next one's `prevResult`; one that printed
    /// nothing leaves the next one's input as it was.
    fn step(&mut self, delegate: &Delegate, command: Command, limits: Limits) -> Result<(), Error> {
        let buffer = self.take_buffer();
        if let Some(printed) = delegate.call(command, self.input(), limits, buffer)? {
            self.pass_on(printed);
        }
        Ok(())
    }
}
