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

/// How long to wait, after killing a delegate, for its process to end and
/// its stdout to close. Past it, whatever still holds the pipe (a process
/// that left the group) is abandoned rather than waited for.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// How much of a failed delegate's stdout an error quotes.
const EXCERPT_LEN: usize = 512;

/// What bounds one call.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Kill the delegate (and everything in its group) after this long.
    pub timeout: Option<Duration>,
    /// How many termination requests stop the call: 1 for what the runtime
    /// asked for; 2 for a rollback DEL, which a first request must not cut
    /// short (that would leak what the ADD allocated) but a second may.
    pub stopped_by: usize,
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
    let finished = match signals::received(limits.stopped_by) {
        // Asked to stop before it started: no process at all.
        Some(signal) => Err(Failure::NotRun(signal)),
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
    /// Its stdout, read to EOF or one byte past the cap.
    Stdout(io::Result<Vec<u8>>),
    /// The delegate has ended; it is a zombie until reaped.
    Exited,
    /// A termination request came.
    Signal,
}

/// Why the plugin killed a delegate.
#[derive(Clone, Copy)]
enum Stop {
    Timeout(Duration),
    Signal(i32),
    OverCap,
}

/// Feeds stdin, reads stdout and watches for the exit in threads of their
/// own, so that no pipe can deadlock us, while this one waits for all of it
/// within the limits; on expiry, a termination request or too much output,
/// it kills the delegate's process group.
///
/// The delegate is reaped only after the last kill: until then its zombie
/// keeps its pid, and so its process group id, from being reused, so the
/// kill cannot reach a stranger.
fn supervise(mut child: Child, input: &[u8], limits: Limits) -> Result<Finished, Failure> {
    let group = Group(child.id());
    let failed = |child: &mut Child, error: io::Error| {
        group.kill();
        let _ = child.wait();
        Err(Failure::Io(error))
    };
    // Both are Some: the caller asked for piped stdin and stdout.
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return failed(&mut child, io::Error::other("delegate pipes missing"));
    };
    let (tx, events) = mpsc::channel();
    let signal = tx.clone();
    let _listening = signals::listen(move || {
        let _ = signal.send(Event::Signal);
    });
    let reader = tx.clone();
    let pid = child.id();
    let input = input.to_vec();
    let threads = background("delegate-stdin", move || {
        // A delegate may exit without reading its input; that is its
        // business, and its exit status says how it went.
        let _ = stdin.write_all(&input);
    })
    .and_then(|()| {
        background("delegate-stdout", move || {
            let _ = reader.send(Event::Stdout(read_capped(stdout)));
        })
    })
    .and_then(|()| {
        background("delegate-exit", move || {
            if wait_for_exit(pid).is_ok() {
                let _ = tx.send(Event::Exited);
            }
        })
    });
    if let Err(e) = threads {
        return failed(&mut child, e);
    }

    let deadline = limits.timeout.and_then(|t| Instant::now().checked_add(t));
    let mut stopped = None;
    let stop = |why: Stop, stopped: &mut Option<(Stop, Instant)>| {
        if stopped.is_none() {
            group.kill();
            *stopped = Some((why, Instant::now() + KILL_GRACE));
        }
    };
    if let Some(signal) = signals::received(limits.stopped_by) {
        stop(Stop::Signal(signal), &mut stopped);
    }
    let (mut stdout, mut exited) = (None, false);
    while stdout.is_none() || !exited {
        let until = stopped.map(|(_, grace)| grace).or(deadline);
        let event = match until {
            Some(until) => events.recv_timeout(until.saturating_duration_since(Instant::now())),
            None => events.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match event {
            Ok(Event::Stdout(read)) => {
                if matches!(&read, Ok(out) if out.len() > STDOUT_CAP) {
                    stop(Stop::OverCap, &mut stopped);
                }
                stdout = Some(read);
            }
            Ok(Event::Exited) => exited = true,
            Ok(Event::Signal) => {
                if let Some(signal) = signals::received(limits.stopped_by) {
                    stop(Stop::Signal(signal), &mut stopped);
                }
            }
            Err(RecvTimeoutError::Timeout) if stopped.is_none() => {
                if let Some(limit) = limits.timeout {
                    stop(Stop::Timeout(limit), &mut stopped);
                }
            }
            // The grace after a kill is over, or every sender is gone.
            Err(_) => break,
        }
    }
    // No kill can come now: reap it, unless it outlived the grace.
    let status = if exited {
        Some(child.wait())
    } else {
        child.try_wait().transpose()
    };
    match stopped.map(|(why, _)| why) {
        Some(Stop::Timeout(limit)) => return Err(Failure::TimedOut(limit)),
        Some(Stop::Signal(signal)) => return Err(Failure::Interrupted(signal)),
        Some(Stop::OverCap) | None => {}
    }
    // Not stopped for a timeout or a signal, the loop ended with both.
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

/// Runs `work` in a thread of its own; the error if none can be made.
fn background(name: &str, work: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(work)
        .map(drop)
}

/// Waits until process `pid` has ended, without reaping it.
fn wait_for_exit(pid: u32) -> io::Result<()> {
    let pid = libc::id_t::from(pid);
    loop {
        // SAFETY: siginfo_t is plain data that waitid fills in; zeroed is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is valid for writing; WNOWAIT leaves the child to be reaped.
        let result =
            unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if result == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
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

/// Reads to EOF or one byte past [`STDOUT_CAP`], whichever comes first.
fn read_capped(stdout: impl Read) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    stdout.take(STDOUT_CAP as u64 + 1).read_to_end(&mut buf)?;
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
    fn a_result_with_numbers_beyond_f64_is_passed_on_as_printed() {
        // Found by fuzzing (fuzz/artifacts/delegate_output/crash-d5ca8700…):
        // valid JSON, which the next delegate gets exactly as printed.
        let printed = b"{\"cniipsk\":[\t\t\t\t111111111,11111111111111111111111111,11111111111394594128,111110111111111111111111111111111111111550E9511111111,11111111119111000000311111\t\t]\t\t}";
        let out = judge(exited(0), printed.to_vec()).unwrap();
        assert_eq!(out.as_deref(), Some(&printed[..]));
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
