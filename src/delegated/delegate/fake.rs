//! An in-memory runner for the rules' tests: each delegate answers each
//! command as it is told, every call is recorded with its input, and
//! termination requests come after the calls a test names.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;

use super::lookup::Delegate;
use super::runner::{Call, Limits, Runner};
use crate::cni::Command;
use crate::delegated::error::Failure;

/// How a fake delegate answers.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Succeeds, printing this.
    Prints(String),
    /// Succeeds, printing nothing.
    Silent,
    /// Fails with this CNI error code and message.
    Fails(u32, &'static str),
    /// Is stopped by a termination request while it runs.
    Stopped,
}

/// One call a fake delegate got.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub name: String,
    pub command: Command,
    pub stdin: String,
    pub limits: Limits,
}

/// A Runner that starts nothing: each delegate answers as the test says,
/// and every call is recorded.
#[derive(Default)]
pub struct FakeRunner {
    answers: HashMap<(String, Command), Answer>,
    /// A termination request comes after each of these many calls.
    requests_after: Vec<usize>,
    calls: RefCell<Vec<Recorded>>,
}

impl FakeRunner {
    /// Delegate `name` answers `command` with `answer` (else: silently).
    pub fn answer(mut self, name: &str, command: Command, answer: Answer) -> Self {
        self.answers.insert((name.into(), command), answer);
        self
    }

    /// A termination request comes once `calls` calls have run.
    pub fn request_after(mut self, calls: usize) -> Self {
        self.requests_after.push(calls);
        self
    }

    /// The calls so far, as "name COMMAND".
    pub fn call_list(&self) -> Vec<String> {
        let calls = self.calls.borrow();
        calls
            .iter()
            .map(|c| format!("{} {}", c.name, c.command))
            .collect()
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<Recorded> {
        self.calls.borrow().clone()
    }

    fn requests(&self) -> usize {
        let ran = self.calls.borrow().len();
        self.requests_after
            .iter()
            .filter(|after| **after <= ran)
            .count()
    }
}

/// Delegates of these names.
pub fn delegates(names: &[&str]) -> Vec<Delegate> {
    names
        .iter()
        .map(|name| Delegate {
            name: (*name).into(),
            path: PathBuf::from(name),
        })
        .collect()
}

impl Runner for FakeRunner {
    fn run(&self, delegate: &Delegate, call: Call) -> Result<Option<Vec<u8>>, Failure> {
        let Call {
            command,
            stdin,
            limits,
            mut buffer,
        } = call;
        if let Some(signal) = self.stop_requested(limits.stopped_by) {
            return Err(Failure::NotRun(signal));
        }
        self.calls.borrow_mut().push(Recorded {
            name: delegate.name.clone(),
            command,
            stdin: String::from_utf8_lossy(stdin).into_owned(),
            limits,
        });
        let answer = self.answers.get(&(delegate.name.clone(), command));
        match answer.cloned().unwrap_or(Answer::Silent) {
            Answer::Prints(printed) => {
                buffer.clear();
                buffer.extend_from_slice(printed.as_bytes());
                Ok(Some(buffer))
            }
            Answer::Silent => Ok(None),
            Answer::Fails(code, msg) => Err(Failure::Reported {
                code,
                msg: msg.into(),
                details: String::new(),
            }),
            Answer::Stopped => Err(Failure::Interrupted(libc::SIGTERM)),
        }
    }

    fn stop_requested(&self, count: usize) -> Option<i32> {
        (self.requests() >= count).then_some(libc::SIGTERM)
    }
}
