//! Calling one delegate: one process in a process group of its own, with the
//! plugin's environment, the configuration on its stdin, its stderr passed
//! through and its stdout captured up to a cap, bounded in time and stopped
//! on a termination request, then judged as a result or a failure.

use std::io::{self, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::value::RawValue;
use serde_json::Value;
use tracing::debug;

use super::Delegate;
use crate::environment::{Command, PARENT_VARIABLE};
use crate::error::Failure;
use crate::signals;

/// The most a delegate may print on stdout. Results are a few KiB; more
/// than this is a broken delegate, stopped before it costs us memory.
pub const STDOUT_CAP: usize = 4 << 20;

/// How long to wait for a killed delegate's process and pipes to close.
/// Past it, whatever still holds them (a process that left the group) is
/// abandoned rather than waited for.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// How much of a failed delegate's stdout an error quotes.
const EXCERPT_LEN: usize = 512;

/// What bounds one call.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Kill the delegate (and everything it started) after this long.
    pub timeout: Option<Duration>,
    /// Stop it on SIGTERM or SIGINT. Rollback DELs are not interruptible:
    /// stopping them would leak what the ADD allocated.
    pub interruptible: bool,
}

/// Runs `command` on `delegate` with `stdin`. On success, returns what it
/// printed (a JSON object, surrounding whitespace trimmed), or `None` if it
/// printed nothing.
pub fn run(
    delegate: &Delegate,
    command: Command,
    stdin: &[u8],
    limits: Limits,
) -> Result<Option<Vec<u8>>, Failure> {
    let started = Instant::now();
    let finished = match signals::received().filter(|_| limits.interruptible) {
        // Asked to stop before it started: no process at all.
        Some(signal) => Err(Failure::Interrupted(signal)),
        None => spawn(delegate, command, stdin, limits),
    };
    let (status, bytes_out) = match &finished {
        Ok(f) if f.over_cap => (
            format!("stopped after more than {STDOUT_CAP} bytes"),
            f.stdout.len(),
        ),
        Ok(f) => (f.status.to_string(), f.stdout.len()),
        Err(failure) => (failure.to_string(), 0),
    };
    debug!(
        delegate = %delegate.name,
        path = %delegate.path.display(),
        %command,
        %status,
        duration = ?started.elapsed(),
        bytes_out,
        "delegate called"
    );
    let finished = finished?;
    if finished.over_cap {
        return Err(Failure::TooMuchOutput(STDOUT_CAP));
    }
    judge(finished.status, finished.stdout)
}

/// Starts the delegate in a process group of its own and supervises it.
fn spawn(
    delegate: &Delegate,
    command: Command,
    stdin: &[u8],
    limits: Limits,
) -> Result<Finished, Failure> {
    std::process::Command::new(&delegate.path)
        .env("CNI_COMMAND", command.as_str())
        .env(PARENT_VARIABLE, std::process::id().to_string())
        // Its own group, so that killing it reaches whatever it started.
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(Failure::NotStarted)
        .and_then(|child| supervise(child, stdin, limits))
}

/// A delegate process that has ended.
struct Finished {
    status: ExitStatus,
    stdout: Vec<u8>,
    /// It printed more than [`STDOUT_CAP`] and was killed; `stdout` holds the first bytes.
    over_cap: bool,
}

/// What the helper threads of one call report.
enum Event {
    Stdout(io::Result<Vec<u8>>),
    Exited(io::Result<ExitStatus>),
    Signal(i32),
}

/// Why the plugin killed a delegate.
#[derive(Clone, Copy)]
enum Stop {
    Timeout(Duration),
    Signal(i32),
}

/// Feeds stdin, reads stdout and waits for the exit in threads of their
/// own, so that no pipe can deadlock us, while this one waits for all of it
/// within the limits; on expiry or a termination request it kills the
/// delegate's process group.
fn supervise(mut child: Child, input: &[u8], limits: Limits) -> Result<Finished, Failure> {
    let group = Group(child.id());
    // Both are Some: the caller asked for piped stdin and stdout.
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        group.kill();
        return Err(Failure::Io(io::Error::other("delegate pipes missing")));
    };
    let (tx, events) = mpsc::channel();

    let _listening = limits.interruptible.then(|| {
        let tx = tx.clone();
        signals::listen(move |signal| {
            let _ = tx.send(Event::Signal(signal));
        })
    });
    let mut stopped = None;
    if let Some(signal) = signals::received().filter(|_| limits.interruptible) {
        group.kill();
        stopped = Some(Stop::Signal(signal));
    }

    // A delegate may exit without reading its input; that is its business,
    // and its exit status says how it went.
    let input = input.to_vec();
    std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let reader = tx.clone();
    std::thread::spawn(move || {
        let _ = reader.send(Event::Stdout(read_capped(stdout, group)));
    });
    let waiter = tx;
    std::thread::spawn(move || {
        let _ = waiter.send(Event::Exited(child.wait()));
    });

    let deadline = limits.timeout.map(|t| Instant::now() + t);
    let (mut stdout, mut status) = (None, None);
    while stdout.is_none() || status.is_none() {
        let wait = match (stopped, deadline) {
            (Some(_), _) => Some(KILL_GRACE),
            (None, Some(deadline)) => Some(deadline.saturating_duration_since(Instant::now())),
            (None, None) => None,
        };
        let event = match wait {
            Some(wait) => events.recv_timeout(wait),
            None => events.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match event {
            Ok(Event::Stdout(read)) => stdout = Some(read),
            Ok(Event::Exited(exit)) => status = Some(exit),
            Ok(Event::Signal(signal)) if stopped.is_none() => {
                group.kill();
                stopped = Some(Stop::Signal(signal));
            }
            Ok(Event::Signal(_)) => {}
            Err(RecvTimeoutError::Timeout) if stopped.is_none() => {
                group.kill();
                stopped = limits.timeout.map(Stop::Timeout);
            }
            // The grace after a kill is over, or every sender is gone.
            Err(_) => break,
        }
    }
    match stopped {
        Some(Stop::Timeout(limit)) => return Err(Failure::TimedOut(limit)),
        Some(Stop::Signal(signal)) => return Err(Failure::Interrupted(signal)),
        None => {}
    }
    // Without a stop, the loop ends only with both present.
    let (Some(stdout), Some(status)) = (stdout, status) else {
        return Err(Failure::Io(io::Error::other("delegate vanished")));
    };
    let stdout = stdout.map_err(Failure::Io)?;
    Ok(Finished {
        status: status.map_err(Failure::Io)?,
        over_cap: stdout.len() > STDOUT_CAP,
        stdout,
    })
}

/// A delegate's process group, named by its leader's pid.
#[derive(Clone, Copy)]
struct Group(u32);

impl Group {
    /// Kills every process in the group. A group already gone is no error.
    fn kill(self) {
        if let Ok(pgid) = libc::pid_t::try_from(self.0) {
            // SAFETY: kill has no memory effects; a negative pid names the group.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
    }
}

/// Reads to EOF or one byte past [`STDOUT_CAP`], killing the group then.
fn read_capped(stdout: impl Read, group: Group) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    stdout.take(STDOUT_CAP as u64 + 1).read_to_end(&mut buf)?;
    if buf.len() > STDOUT_CAP {
        group.kill();
    }
    Ok(buf)
}

/// Decides what a finished delegate's exit status and stdout amount to:
/// on success, the JSON object it printed (trimmed) or `None` for nothing;
/// on failure, its CNI error object or what else went wrong.
pub fn judge(status: ExitStatus, stdout: Vec<u8>) -> Result<Option<Vec<u8>>, Failure> {
    let printed = trim(stdout);
    if status.success() {
        if printed.is_empty() {
            return Ok(None);
        }
        // Checked without building the value: it is passed on as printed.
        let reason = match serde_json::from_slice::<&RawValue>(&printed) {
            Ok(_) if printed.starts_with(b"{") => return Ok(Some(printed)),
            Ok(_) => "JSON, but not an object".to_owned(),
            Err(error) => error.to_string(),
        };
        return Err(Failure::NotObject {
            reason,
            stdout: excerpt(&printed),
        });
    }
    if let Some(signal) = status.signal() {
        return Err(Failure::Killed(signal));
    }
    Err(reported(&printed).unwrap_or_else(|| Failure::Exited {
        status: status.code().unwrap_or(-1),
        stdout: excerpt(&printed),
    }))
}

/// A CNI error object: a JSON object with a non-zero integer `code`; `msg`
/// and `details` are kept when they are strings.
fn reported(printed: &[u8]) -> Option<Failure> {
    let Value::Object(error) = serde_json::from_slice(printed).ok()? else {
        return None;
    };
    let code = error.get("code")?.as_u64().filter(|c| *c != 0)?;
    let text = |key| {
        error
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    Some(Failure::Reported {
        code: u32::try_from(code).ok()?,
        msg: text("msg"),
        details: text("details"),
    })
}

fn trim(mut bytes: Vec<u8>) -> Vec<u8> {
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    bytes.truncate(end);
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(0);
    bytes.drain(..start);
    bytes
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(EXCERPT_LEN)]);
    if bytes.len() > EXCERPT_LEN {
        format!("{text}…")
    } else {
        text.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{code, Error};

    fn exited(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    fn killed(signal: i32) -> ExitStatus {
        ExitStatus::from_raw(signal)
    }

    fn code_of(failure: Failure) -> u32 {
        Error::Delegate {
            delegate: "d".into(),
            command: Command::Add,
            failure,
        }
        .code()
    }

    #[test]
    fn success_with_an_object_keeps_it_as_printed_but_trimmed() {
        let out = judge(exited(0), b"\n {\"ips\": [], \"pools\":[1]}\n\n".to_vec()).unwrap();
        assert_eq!(out.unwrap(), b"{\"ips\": [], \"pools\":[1]}");
    }

    #[test]
    fn success_with_nothing_or_whitespace_is_none() {
        assert_eq!(judge(exited(0), Vec::new()).unwrap(), None);
        assert_eq!(judge(exited(0), b" \n\t".to_vec()).unwrap(), None);
    }

    #[test]
    fn success_with_non_json_or_non_object_is_code_6() {
        for bad in [
            &b"hello"[..],
            b"{",
            b"[1]",
            b"\"s\"",
            b"{} {}",
            b"{\"a\":1}x",
        ] {
            let failure = judge(exited(0), bad.to_vec()).unwrap_err();
            assert!(matches!(failure, Failure::NotObject { .. }), "{bad:?}");
            assert_eq!(code_of(failure), code::DECODING_FAILURE, "{bad:?}");
        }
    }

    #[test]
    fn a_cni_error_object_is_kept() {
        let failure = judge(
            exited(1),
            br#"{"cniVersion":"1.0.0","code":11,"msg":"busy","details":"retry"}"#.to_vec(),
        )
        .unwrap_err();
        match failure {
            Failure::Reported { code, msg, details } => {
                assert_eq!(
                    (code, msg.as_str(), details.as_str()),
                    (11, "busy", "retry")
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_non_zero_exit_without_an_error_object_names_the_status() {
        for printed in [
            &b""[..],
            b"oops",
            br#"{"msg":"no code"}"#,
            br#"{"code":0}"#,
            br#"{"code":"7"}"#,
        ] {
            let failure = judge(exited(3), printed.to_vec()).unwrap_err();
            assert!(
                matches!(failure, Failure::Exited { status: 3, .. }),
                "{printed:?}"
            );
            assert_eq!(code_of(failure), code::DELEGATE_EXITED);
        }
    }

    #[test]
    fn a_signal_is_named() {
        let failure = judge(killed(9), Vec::new()).unwrap_err();
        assert_eq!(failure.to_string(), "was killed by signal 9");
        assert_eq!(code_of(failure), code::DELEGATE_KILLED);
    }

    #[test]
    fn excerpts_are_bounded() {
        let long = vec![b'x'; 2000];
        let text = excerpt(&long);
        assert_eq!(text.chars().filter(|c| *c == 'x').count(), EXCERPT_LEN);
        assert!(text.ends_with('…'));
    }
}
