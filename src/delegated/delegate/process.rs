//! The process runner: each delegate call is one process in a process
//! group of its own, with the plugin's environment (and any variables the
//! runner was given) and pipes of the plugin's own, watched to its end by
//! [`supervise`](super::supervise), and what it printed judged.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io::{self, PipeReader, PipeWriter};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::time::Instant;

use tracing::{debug, warn};

use super::judge::{judge, Printed};
use super::lookup::Delegate;
use super::runner::{Call, Limits, Runner};
use super::supervise::{supervise, Finished, Ours};
use crate::cni::Command;
use crate::delegated::error::Failure;
use crate::signals;
use crate::sys;

/// Set in every delegate's environment, to the plugin's pid. An
/// ipam-delegated that finds it set was started by itself: its stack names
/// it (under another name, or as a copy), and would start itself forever.
pub const PARENT_VARIABLE: &str = "IPAM_DELEGATED_PARENT";

/// Runs delegates as processes of their own.
#[derive(Debug)]
pub struct Processes {
    /// Every delegate's environment but CNI_COMMAND, made once for all the
    /// calls: the plugin's own, the runner's variables on top (agent mode's
    /// CNI_* ones), and the parent's pid; or why it cannot be given.
    env: Result<Vec<CString>, String>,
}

impl Default for Processes {
    fn default() -> Self {
        Processes::with_env(Vec::<(OsString, OsString)>::new())
    }
}

impl Processes {
    /// A runner whose delegates get `vars` on top of the plugin's
    /// environment.
    pub fn with_env(
        vars: impl IntoIterator<Item = (impl Into<OsString>, impl Into<OsString>)>,
    ) -> Self {
        let inherited = std::env::vars_os();
        let given = vars.into_iter().map(|(k, v)| (k.into(), v.into()));
        let parent = (
            PARENT_VARIABLE.into(),
            std::process::id().to_string().into(),
        );
        let all: Vec<(OsString, OsString)> = inherited
            .chain(given)
            .chain([parent])
            .filter(|(key, _)| key != COMMAND_VARIABLE)
            .collect();
        // Each key once, the last value winning, as with std's Command:
        // programs disagree on which of two copies they read.
        let env = all
            .iter()
            .enumerate()
            .filter(|(i, (key, _))| !all[i + 1..].iter().any(|(k, _)| k == key))
            .map(|(_, (k, v))| c_string(k, Some(v)))
            .collect::<io::Result<_>>()
            .map_err(|e| e.to_string());
        Processes { env }
    }
}

/// The variable that tells a delegate the command, set per call.
const COMMAND_VARIABLE: &str = "CNI_COMMAND";

/// What a process is asked: a CNI command, in CNI_COMMAND; or a verb of
/// the family's own on its command line, outside any runtime.
#[derive(Debug, Clone, Copy)]
enum Asked<'v> {
    Cni(Command),
    Verb(&'v str),
}

impl std::fmt::Display for Asked<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Asked::Cni(command) => write!(f, "{command}"),
            Asked::Verb(verb) => write!(f, "{verb}"),
        }
    }
}

impl Runner for Processes {
    fn run(&self, delegate: &Delegate, call: Call) -> Result<Option<Vec<u8>>, Failure> {
        self.ask(delegate, Asked::Cni(call.command), call)
    }

    fn stop_requested(&self, count: usize) -> Option<i32> {
        signals::received(count)
    }
}

impl Processes {
    /// Runs `DELEGATE verb` with `stdin`, outside any runtime (no
    /// CNI_COMMAND), bounded by `limits`, as the doctor asks the family's
    /// delegates to `validate`: what it printed, judged as a CHECK's (so
    /// its own CNI error object on failure is kept).
    pub fn run_verb(
        &self,
        delegate: &Delegate,
        verb: &str,
        stdin: &[u8],
        limits: Limits,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let call = Call {
            command: Command::Check,
            stdin,
            limits,
            buffer: Vec::new(),
        };
        self.ask(delegate, Asked::Verb(verb), call)
    }

    /// Runs `call` on `delegate`, asked `asked`: what it printed, judged.
    fn ask(
        &self,
        delegate: &Delegate,
        asked: Asked,
        call: Call,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let started = Instant::now();
        let command = call.command;
        let finished = match signals::received(call.limits.stopped_by) {
            // Asked to stop before it started: no process at all.
            Some(signal) => Err(Failure::NotRun(signal)),
            None => self.spawn(delegate, asked, call),
        };
        // Formatted only when someone will read it: every pod start pays for this.
        if tracing::enabled!(tracing::Level::DEBUG) {
            let (status, bytes_out) = match &finished {
                Ok(f) => (f.status.to_string(), f.stdout.len()),
                Err(failure) => (failure.to_string(), 0),
            };
            debug!(
                delegate = %delegate.name,
                path = %delegate.path.display(),
                command = %asked,
                %status,
                duration = ?started.elapsed(),
                bytes_out,
                "delegate called"
            );
        }
        let finished = finished?;
        if finished.abandoned {
            warn!(
                "{} ({asked}): a process it left behind holds its stdout; not waiting for it",
                delegate.name
            );
        }
        match judge(command, finished.status, finished.stdout)? {
            Printed::Object(result) => Ok(Some(result)),
            Printed::Nothing => Ok(None),
            // A log line printed there by a delegate that works under
            // bridge must not fail a teardown.
            Printed::Ignored { reason, stdout } => {
                warn!(
                    "{} ({asked}): ignoring its stdout, which is not one JSON object ({reason}): {stdout:?}",
                    delegate.name
                );
                Ok(None)
            }
        }
    }

    /// Starts the delegate in a process group of its own (so that stopping
    /// it reaches whatever it started) and supervises it.
    fn spawn(&self, delegate: &Delegate, asked: Asked, call: Call) -> Result<Finished, Failure> {
        let (theirs, ours) = self.pipes(delegate, asked).map_err(Failure::NotStarted)?;
        let env: Vec<&CStr> = theirs
            .env
            .iter()
            .chain(&theirs.command)
            .map(CString::as_c_str)
            .collect();
        let args: Vec<&CStr> = theirs.args.iter().map(CString::as_c_str).collect();
        let pid = sys::spawn(
            &theirs.program,
            &env,
            &sys::Start {
                args: &args,
                stdio: [
                    theirs.stdin.as_fd(),
                    theirs.stdout.as_fd(),
                    theirs.stderr.as_fd(),
                ],
                unblock: &signals::WATCHED,
                // A GC's list of live attachments is stale once the
                // runtime has given up on it. Other commands finish what
                // they were asked, and a delegate cut short mid-write can
                // leave a record that nothing frees.
                stop_with_starter: matches!(asked, Asked::Cni(Command::Gc)),
            },
        )
        .map_err(Failure::NotStarted)?;
        // Their ends closed here, so that ours see the end of what they write.
        drop(theirs);
        supervise(pid, ours, call.stdin, call.limits, call.buffer)
    }

    /// The delegate's side of a call (its program, arguments, environment
    /// and ends of the pipes) and the plugin's ends of the pipes.
    fn pipes(&self, delegate: &Delegate, asked: Asked) -> io::Result<(Theirs<'_>, Ours)> {
        let env = self
            .env
            .as_ref()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.clone()))?;
        let program = c_string(delegate.path.as_os_str(), None)?;
        let (command, args) = match asked {
            Asked::Cni(command) => (
                Some(c_string(
                    OsStr::new(COMMAND_VARIABLE),
                    Some(OsStr::new(command.as_str())),
                )?),
                Vec::new(),
            ),
            Asked::Verb(verb) => (None, vec![c_string(OsStr::new(verb), None)?]),
        };
        let (stdin, feed) = io::pipe()?;
        let (read, stdout) = io::pipe()?;
        // A pipe of the plugin's own, not the runtime's stderr: a child the
        // delegate leaves behind would hold that open, and a Go runtime
        // waits for every holder to close it.
        let (copy, stderr) = io::pipe()?;
        Ok((
            Theirs {
                program,
                args,
                env,
                command,
                stdin,
                stdout,
                stderr,
            },
            Ours {
                stdin: feed,
                stdout: read,
                stderr: copy,
            },
        ))
    }
}

/// `key`, or `key=value`, as a C string; a NUL in either is refused, as
/// std refuses it.
fn c_string(key: &OsStr, value: Option<&OsStr>) -> io::Result<CString> {
    let mut bytes = key.as_bytes().to_vec();
    if let Some(value) = value {
        bytes.push(b'=');
        bytes.extend_from_slice(value.as_bytes());
    }
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a NUL byte in {:?}", key),
        )
    })
}

/// What a delegate process is started with.
struct Theirs<'a> {
    program: CString,
    /// Its arguments after the program's name: a verb's, or none.
    args: Vec<CString>,
    /// All but CNI_COMMAND, which is `command` (none for a verb).
    env: &'a [CString],
    command: Option<CString>,
    stdin: PipeReader,
    stdout: PipeWriter,
    stderr: PipeWriter,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_variable_is_given_once_the_last_value_winning() {
        // PATH is in every test's environment; CNI_COMMAND is the call's.
        let runner = Processes::with_env([
            ("PATH", "/first"),
            ("PATH", "/given"),
            ("CNI_COMMAND", "ADD"),
        ]);
        let delegate = Delegate {
            name: "d".into(),
            path: "/bin/true".into(),
        };
        let (theirs, _) = runner.pipes(&delegate, Asked::Cni(Command::Del)).unwrap();
        let vars: Vec<&str> = theirs
            .env
            .iter()
            .chain(&theirs.command)
            .map(|v| v.to_str().unwrap())
            .collect();
        let with = |key: &str| -> Vec<&str> {
            let prefix = format!("{key}=");
            vars.iter()
                .filter(|v| v.starts_with(&prefix))
                .copied()
                .collect()
        };
        assert_eq!(with("PATH"), ["PATH=/given"]);
        assert_eq!(with("CNI_COMMAND"), ["CNI_COMMAND=DEL"]);
        assert_eq!(with(PARENT_VARIABLE).len(), 1);
    }

    #[test]
    fn a_verb_is_an_argument_and_sets_no_cni_command() {
        let runner = Processes::with_env([("CNI_COMMAND", "ADD")]);
        let delegate = Delegate {
            name: "d".into(),
            path: "/bin/true".into(),
        };
        let (theirs, _) = runner.pipes(&delegate, Asked::Verb("validate")).unwrap();
        assert_eq!(theirs.args, [c"validate".to_owned()]);
        assert!(theirs.command.is_none());
        assert!(!theirs
            .env
            .iter()
            .any(|v| v.to_bytes().starts_with(b"CNI_COMMAND=")));
    }
}
