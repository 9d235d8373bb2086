//! What happened during a run, as the checker reads it: every operation a
//! node's runtime made (its start, its end, its answer) and every fault,
//! each with its time in milliseconds since the run began, written as JSON
//! lines so that a failing run's history can be kept and read again.

use std::io::Write;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::{json, Value};

/// One operation of a node's runtime: a CNI command for one attachment
/// (GC and STATUS for none), from its start to its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    pub node: String,
    pub command: String,
    /// The container ID; empty for GC.
    pub container: String,
    /// The workload its addresses follow, if any.
    pub workload: Option<String>,
    pub start: u64,
    pub end: u64,
    /// The exit status; `None` when it was killed.
    pub status: Option<i32>,
    /// The addresses a successful ADD gave.
    pub addresses: Vec<String>,
    /// What it printed, when it failed: its error.
    pub said: String,
}

impl Operation {
    /// Whether it answered with success.
    pub fn succeeded(&self) -> bool {
        self.status == Some(0)
    }
}

/// A fault, or an operator's act that changes who may hold what: a node
/// fenced by reclaim, and readmitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub at: u64,
    /// What: "kill", "partition", "fenced", "readmitted", ...
    pub kind: String,
    /// Its target (a node, a member), if any.
    pub target: String,
    /// More about it, as said.
    pub detail: String,
}

/// Everything that happened, in the order it was recorded.
#[derive(Debug, Default, Clone)]
pub struct History {
    pub operations: Vec<Operation>,
    pub events: Vec<Event>,
}

/// A history being recorded by several threads at once, kept in memory
/// and, line by line, in a file.
pub struct Recorder {
    began: Instant,
    history: Mutex<History>,
    file: Mutex<Option<std::fs::File>>,
}

impl Recorder {
    /// A recorder whose times count from now, writing to `file` if given.
    pub fn new(file: Option<std::fs::File>) -> Recorder {
        Recorder {
            began: Instant::now(),
            history: Mutex::new(History::default()),
            file: Mutex::new(file),
        }
    }

    /// When the run began.
    pub fn began(&self) -> Instant {
        self.began
    }

    /// Milliseconds since the run began.
    pub fn now(&self) -> u64 {
        self.began.elapsed().as_millis() as u64
    }

    /// Records `operation`.
    pub fn operation(&self, operation: Operation) {
        self.write(&json!({
            "op": operation.command, "node": operation.node, "container": operation.container,
            "workload": operation.workload, "start": operation.start, "end": operation.end,
            "status": operation.status, "addresses": operation.addresses, "said": operation.said,
        }));
        lock(&self.history).operations.push(operation);
    }

    /// Records an event of `kind` on `target`, now.
    pub fn event(&self, kind: &str, target: &str, detail: &str) {
        self.event_at(self.now(), kind, target, detail);
    }

    /// Records an event of `kind` on `target` that took effect `at`.
    pub fn event_at(&self, at: u64, kind: &str, target: &str, detail: &str) {
        let event = Event {
            at,
            kind: kind.into(),
            target: target.into(),
            detail: detail.into(),
        };
        self.write(&json!({
            "event": event.kind, "target": event.target, "at": event.at, "detail": event.detail,
        }));
        lock(&self.history).events.push(event);
    }

    /// A copy of what is recorded so far.
    pub fn history(&self) -> History {
        lock(&self.history).clone()
    }

    fn write(&self, line: &Value) {
        if let Some(file) = lock(&self.file).as_mut() {
            // A history that cannot be written is still checked in memory.
            let _ = writeln!(file, "{line}");
        }
    }
}

/// `mutex`'s content, even if a thread panicked holding it: the history
/// is still worth checking and keeping.
pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
