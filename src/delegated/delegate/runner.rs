//! The seam between the rules of a stack and what runs one delegate call:
//! the [`Runner`] (processes in production, a fake in the rules' tests),
//! the call it gets, and what bounds it.

use std::time::Duration;

use super::lookup::Delegate;
use crate::cni::Command;
use crate::delegated::error::Failure;

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
    pub(super) fn killed_by(self) -> usize {
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
