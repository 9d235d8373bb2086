//! Calling one delegate: one process in a process group of its own, with the
//! plugin's environment, the configuration on its stdin, its stderr passed
//! through and its stdout captured up to a cap, bounded in time and stopped
//! on a termination request, all in one poll(2) loop; then judged as a
//! result or a failure.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStdin, ChildStdout, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::debug;

use super::Delegate;
use crate::environment::{Command, PARENT_VARIABLE};
use crate::error::Failure;
use crate::json;
use crate::signals;
use crate::sys::{poll, pollfd};

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
/// printed nothing, or, for any command but ADD, something else.
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
    // Formatted only when someone will read it: every pod start pays for this.
    if tracing::enabled!(tracing::Level::DEBUG) {
        let (status, bytes_out) = match &finished {
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
    }
    let finished = finished?;
    match judge(finished.status, finished.stdout) {
        // Only an ADD must print a result. For the other commands libcni
        // ignores stdout on success, so a log line printed there (a
        // delegate that works under bridge) must not fail a teardown.
        Err(Failure::NotObject { reason, stdout }) if command != Command::Add => {
            tracing::warn!(
                "{} ({command}): ignoring its stdout, which is not one JSON object ({reason}): {stdout:?}",
                delegate.name
            );
            Ok(None)
        }
        judged => judged,
    }
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
}

/// Why the plugin killed a delegate.
#[derive(Clone, Copy)]
enum Stop {
    Timeout(Duration),
    Signal(i32),
    OverCap,
}

/// Feeds the delegate's stdin, reads its stdout and waits for its exit and
/// for termination requests, all in one poll(2) loop (no thread, no pipe
/// that can deadlock), within the limits; on expiry, a termination request
/// or too much output, it kills the delegate's process group.
///
/// The delegate is reaped only after the last kill: until then its zombie
/// keeps its pid, and so its process group id, from being reused, so the
/// kill cannot reach a stranger.
fn supervise(mut child: Child, input: &[u8], limits: Limits) -> Result<Finished, Failure> {
    let group = Group(child.id());
    // Both are Some: the caller asked for piped stdin and stdout.
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        group.kill();
        let _ = child.wait();
        return Err(Failure::Io(io::Error::other("delegate pipes missing")));
    };
    let mut pipes = match Pipes::new(input, stdin, stdout) {
        Ok(pipes) => pipes,
        Err(e) => {
            group.kill();
            let _ = child.wait();
            return Err(Failure::Io(e));
        }
    };
    let exit = ExitWatch::new(child.id());
    let mut exited = false;
    let deadline = limits.timeout.and_then(|t| Instant::now().checked_add(t));
    let mut stopped: Option<(Stop, Instant)> = None;
    let stop = |why: Stop, stopped: &mut Option<(Stop, Instant)>| {
        if stopped.is_none() {
            group.kill();
            *stopped = Some((why, Instant::now() + KILL_GRACE));
        }
    };
    if let Some(signal) = signals::received(limits.stopped_by) {
        stop(Stop::Signal(signal), &mut stopped);
    }

    while pipes.stdout.is_some() || !exited {
        let until = stopped.map(|(_, grace)| grace).or(deadline);
        let now = Instant::now();
        if until.is_some_and(|until| now >= until) {
            match stopped {
                // The grace after a kill is over: abandon what still holds the pipe.
                Some(_) => break,
                None => {
                    if let Some(limit) = limits.timeout {
                        stop(Stop::Timeout(limit), &mut stopped);
                    }
                    continue;
                }
            }
        }
        let mut wait = until.map(|until| until - now);
        // Without a pidfd, the exit is asked for; it only matters once stdout is closed.
        if !exited && pipes.stdout.is_none() && exit.needs_polling() {
            wait = Some(wait.map_or(EXIT_POLL, |w| w.min(EXIT_POLL)));
        }
        let mut fds = [
            pollfd(pipes.stdout.as_ref().map(AsRawFd::as_raw_fd), libc::POLLIN),
            pollfd(pipes.stdin.as_ref().map(AsRawFd::as_raw_fd), libc::POLLOUT),
            pollfd(exit.fd().filter(|_| !exited), libc::POLLIN),
            pollfd(signals::fd().map(|fd| fd.as_raw_fd()), libc::POLLIN),
        ];
        if let Err(e) = poll(&mut fds, wait) {
            // Not left running unsupervised, where a rollback could overtake it.
            group.kill();
            let _ = child.wait();
            return Err(Failure::Io(e));
        }
        if fds[1].revents != 0 {
            pipes.feed();
        }
        if fds[0].revents != 0 {
            pipes.drain();
            if pipes.output.len() > STDOUT_CAP {
                pipes.stdout = None;
                stop(Stop::OverCap, &mut stopped);
            }
        }
        exited = exited || fds[2].revents != 0 || exit.has_exited();
        if fds[3].revents != 0 {
            if let Some(signal) = signals::received(limits.stopped_by) {
                stop(Stop::Signal(signal), &mut stopped);
            }
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
        Some(Stop::OverCap) => return Err(Failure::TooMuchOutput(STDOUT_CAP)),
        None => {}
    }
    if let Some(e) = pipes.read_error {
        return Err(Failure::Io(e));
    }
    // Not stopped for a timeout or a signal, the loop ended with its exit.
    let status = status.ok_or_else(|| Failure::Io(io::Error::other("delegate vanished")))?;
    Ok(Finished {
        status: status.map_err(Failure::Io)?,
        stdout: pipes.output,
    })
}

/// The plugin's ends of a delegate's stdin and stdout, non-blocking: what
/// is left to write, and what was read.
struct Pipes<'a> {
    input: &'a [u8],
    stdin: Option<ChildStdin>,
    stdout: Option<ChildStdout>,
    output: Vec<u8>,
    read_error: Option<io::Error>,
}

impl<'a> Pipes<'a> {
    fn new(input: &'a [u8], stdin: ChildStdin, stdout: ChildStdout) -> io::Result<Self> {
        nonblocking(stdin.as_raw_fd())?;
        nonblocking(stdout.as_raw_fd())?;
        Ok(Pipes {
            input,
            // Nothing to write: close it now, the delegate sees EOF at once.
            stdin: (!input.is_empty()).then_some(stdin),
            stdout: Some(stdout),
            output: Vec::new(),
            read_error: None,
        })
    }

    /// Writes what the pipe takes; closes stdin when all is written. A
    /// delegate may exit without reading its input; that is its business,
    /// and its exit status says how it went, so a broken pipe just closes.
    fn feed(&mut self) {
        let Some(stdin) = self.stdin.as_mut() else {
            return;
        };
        loop {
            match stdin.write(self.input) {
                Ok(n) if n < self.input.len() => self.input = &self.input[n..],
                Ok(_) => break self.stdin = None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => break self.stdin = None,
            }
        }
    }

    /// Reads what is there, up to one byte past [`STDOUT_CAP`]; closes
    /// stdout at EOF.
    fn drain(&mut self) {
        let Some(stdout) = self.stdout.as_mut() else {
            return;
        };
        let mut chunk = [0; 16 * 1024];
        loop {
            match stdout.read(&mut chunk) {
                Ok(0) => break self.stdout = None,
                Ok(n) => {
                    let room = STDOUT_CAP + 1 - self.output.len().min(STDOUT_CAP + 1);
                    self.output.extend_from_slice(&chunk[..n.min(room)]);
                    if self.output.len() > STDOUT_CAP {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.read_error = Some(e);
                    break self.stdout = None;
                }
            }
        }
    }
}

/// How often to look for the delegate's exit where pidfd_open(2) is missing
/// (Linux before 5.3).
const EXIT_POLL: Duration = Duration::from_millis(5);

/// Learns when the delegate has ended without reaping it: through a pidfd
/// that poll(2) watches, or, on kernels without pidfds, by asking.
enum ExitWatch {
    Pidfd(OwnedFd),
    Asking(u32),
}

impl ExitWatch {
    fn new(pid: u32) -> ExitWatch {
        let (raw_pid, flags): (libc::pid_t, libc::c_uint) = (pid as libc::pid_t, 0);
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw_pid, flags) };
        match i32::try_from(fd) {
            // SAFETY: a non-negative result is a new descriptor that nothing else owns.
            Ok(fd) if fd >= 0 => ExitWatch::Pidfd(unsafe { OwnedFd::from_raw_fd(fd) }),
            _ => ExitWatch::Asking(pid),
        }
    }

    fn fd(&self) -> Option<RawFd> {
        match self {
            ExitWatch::Pidfd(fd) => Some(fd.as_raw_fd()),
            ExitWatch::Asking(_) => None,
        }
    }

    fn needs_polling(&self) -> bool {
        matches!(self, ExitWatch::Asking(_))
    }

    /// For a watch without a pidfd: whether the process has ended, left unreaped.
    fn has_exited(&self) -> bool {
        let ExitWatch::Asking(pid) = self else {
            return false;
        };
        // SAFETY: siginfo_t is plain data that waitid fills in; zeroed is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        // SAFETY: `info` is valid for writing; WNOWAIT leaves the child to be reaped.
        let result = unsafe { libc::waitid(libc::P_PID, libc::id_t::from(*pid), &mut info, flags) };
        if result != 0 {
            // No such child any more (reaped already): it has ended.
            return io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD);
        }
        // With WNOHANG, a child still running leaves si_pid at 0.
        // SAFETY: waitid succeeded, so `info` holds a child's state or zeros.
        let pid = unsafe { info.si_pid() };
        pid != 0
    }
}

/// Puts a descriptor in non-blocking mode.
fn nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, with valid commands.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
        return match json::check_object(&printed) {
            Ok(()) => Ok(Some(printed)),
            Err(reason) => Err(Failure::NotObject {
                reason,
                stdout: excerpt(&printed),
            }),
        };
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
    fn both_exit_watches_see_the_exit_and_leave_the_process_to_reap() {
        for asking in [false, true] {
            let mut child = std::process::Command::new("sh")
                .args(["-c", "sleep 0.2; exit 3"])
                .spawn()
                .unwrap();
            let watch = match ExitWatch::new(child.id()) {
                ExitWatch::Pidfd(_) if asking => ExitWatch::Asking(child.id()),
                watch => watch,
            };
            assert!(!watch.has_exited());
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let mut fds = [pollfd(watch.fd(), libc::POLLIN)];
                poll(&mut fds, Some(EXIT_POLL)).unwrap();
                if fds[0].revents != 0 || watch.has_exited() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "exit never seen (asking: {asking})"
                );
            }
            // Not reaped by the watch: the status is still there to collect.
            assert_eq!(child.wait().unwrap().code(), Some(3), "asking: {asking}");
        }
    }

    #[test]
    fn excerpts_are_bounded() {
        let long = vec![b'x'; 2000];
        let text = excerpt(&long);
        assert_eq!(text.chars().filter(|c| *c == 'x').count(), EXCERPT_LEN);
        assert!(text.ends_with('…'));
    }
}
