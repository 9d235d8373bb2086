//! Watching one delegate process to its end: its stdin fed, its stdout
//! captured up to a cap, its stderr copied to the plugin's line by line,
//! its exit awaited, bounded in time and wound down on a termination
//! request, all in one poll(2) loop: no thread, no pipe that can deadlock.

use std::io::{self, PipeReader, PipeWriter, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use super::runner::Limits;
use crate::delegated::error::Failure;
use crate::signals;
use crate::sys::{self, poll, pollfd};

/// The most a delegate may print on stdout. Results are a few KiB; more
/// than this is a broken delegate, stopped before it costs us memory.
const STDOUT_CAP: usize = 4 << 20;

/// How long a delegate may go on after a first termination request: most
/// finish in milliseconds, and one killed mid-write can leave a torn
/// reservation that no DEL frees (host-local's file made but still empty).
const STOP_GRACE: Duration = Duration::from_secs(2);

/// How long a delegate has between SIGTERM and SIGKILL, to finish a write
/// if it handles SIGTERM.
const TERM_GRACE: Duration = Duration::from_millis(500);

/// How long to wait for stdout to close once the process it belongs to has
/// ended (it exited, or was killed). Past it, whatever still holds the pipe
/// (a child left behind, a process that left the group) is abandoned
/// rather than waited for.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// The longest stderr line kept whole; a longer one is copied in parts.
const STDERR_LINE_CAP: usize = 64 * 1024;

/// The most one read(2) of a delegate's pipe takes.
const READ_SIZE: usize = 16 * 1024;

/// What a delegate's stderr is first read into.
const STDERR_START: usize = 512;

/// How many reads of a delegate's stderr one wake-up copies: a pipe's worth.
const STDERR_READS: usize = 4;

/// The plugin's ends of a delegate's pipes.
pub(super) struct Ours {
    pub stdin: PipeWriter,
    pub stdout: PipeReader,
    pub stderr: PipeReader,
}

/// A delegate process that has ended.
pub(super) struct Finished {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    /// Something it left behind still held its stdout, and was not waited for.
    pub abandoned: bool,
}

/// Why the plugin stopped a delegate.
#[derive(Clone, Copy)]
enum Stop {
    Timeout(Duration),
    Signal(i32),
    OverCap,
}

/// How far stopping the delegate has gone.
#[derive(Clone, Copy)]
enum Stopping {
    /// Nobody asked.
    No,
    /// A first termination request: the delegate may finish until then.
    Grace { signal: i32, until: Instant },
    /// SIGTERM sent to its group; SIGKILL at `until`.
    Terminated { why: Stop, until: Instant },
    /// SIGKILL sent; its stdout may take until `until` to close.
    Killed { why: Stop, until: Instant },
}

/// The places of the descriptors in the poll(2) array.
const STDOUT: usize = 0;
const STDIN: usize = 1;
const STDERR: usize = 2;
const EXIT: usize = 3;
const REQUESTS: usize = 4;

/// Feeds the delegate's stdin, reads its stdout, copies its stderr, and
/// waits for its exit and for termination requests, all in one poll(2)
/// loop (no thread, no pipe that can deadlock), within the limits.
///
/// A timeout sends SIGTERM to its process group, then SIGKILL after
/// [`TERM_GRACE`]; output over the cap, or a request that kills, sends
/// SIGKILL at once; a first request gives it [`STOP_GRACE`] to finish.
/// The delegate is reaped only after the last kill: until then its zombie
/// keeps its pid, and so its process group id, from being reused, so a
/// kill cannot reach a stranger.
pub(super) fn supervise(
    pid: u32,
    ours: Ours,
    input: &[u8],
    limits: Limits,
    output: Vec<u8>,
) -> Result<Finished, Failure> {
    let group = Group(pid);
    let mut pipes = match Pipes::new(ours, input, output) {
        Ok(pipes) => pipes,
        Err(e) => {
            group.signal(libc::SIGKILL);
            let _ = sys::wait(pid);
            return Err(Failure::Io(e));
        }
    };
    let exit = ExitWatch::new(pid);
    let mut exited: Option<Instant> = None;
    let mut abandoned = false;
    let deadline = limits.timeout.and_then(|t| Instant::now().checked_add(t));
    let mut stopping = on_requests(Stopping::No, limits, deadline, group);
    let mut seen = signals::counted();

    loop {
        let now = Instant::now();
        if pipes.stdout.is_none() && exited.is_some() {
            break;
        }
        match stopping {
            Stopping::No if deadline.is_some_and(|d| now >= d) => {
                let limit = limits.timeout.unwrap_or_default();
                stopping = terminate(Stop::Timeout(limit), group);
                continue;
            }
            Stopping::Grace { signal, until } if now >= until => {
                stopping = terminate(Stop::Signal(signal), group);
                continue;
            }
            Stopping::Terminated { why, until } if now >= until => {
                stopping = kill(why, group);
                continue;
            }
            // The grace after a kill is over: abandon what still holds stdout.
            Stopping::Killed { until, .. } if now >= until => break,
            _ => {}
        }
        // Ended, but something it left behind holds stdout: all it printed
        // is in the pipe already.
        if exited.is_some_and(|at| now >= at + CLOSE_GRACE) {
            abandoned = true;
            break;
        }
        let timer = match stopping {
            Stopping::No => deadline,
            Stopping::Grace { until, .. }
            | Stopping::Terminated { until, .. }
            | Stopping::Killed { until, .. } => Some(until),
        };
        let timer = [timer, exited.map(|at| at + CLOSE_GRACE)]
            .into_iter()
            .flatten()
            .min();
        let mut wait = timer.map(|t| t.saturating_duration_since(now));
        // Without a pidfd, the exit is asked for: it ends the loop once
        // stdout is closed, and starts the wait for a stdout held open.
        if exited.is_none() && exit.needs_polling() {
            wait = Some(wait.map_or(EXIT_POLL, |w| w.min(EXIT_POLL)));
        }
        // In a process of many threads (the Docker driver), another one
        // may read a termination request from the signalfd first: the
        // count, looked at now and then, is what tells.
        if signals::fd().is_some() {
            wait = Some(wait.map_or(RECOUNT, |w| w.min(RECOUNT)));
        }
        let mut fds = [pollfd(None, 0); 5];
        fds[STDOUT] = pollfd(pipes.stdout.as_ref().map(AsRawFd::as_raw_fd), libc::POLLIN);
        fds[STDIN] = pollfd(pipes.stdin.as_ref().map(AsRawFd::as_raw_fd), libc::POLLOUT);
        fds[STDERR] = pollfd(pipes.stderr.as_ref().map(AsRawFd::as_raw_fd), libc::POLLIN);
        fds[EXIT] = pollfd(exit.fd().filter(|_| exited.is_none()), libc::POLLIN);
        fds[REQUESTS] = pollfd(signals::fd().map(|fd| fd.as_raw_fd()), libc::POLLIN);
        if let Err(e) = poll(&mut fds, wait) {
            // Not left running unsupervised, where a rollback could overtake it.
            group.signal(libc::SIGKILL);
            let _ = sys::wait(pid);
            return Err(Failure::Io(e));
        }
        if fds[STDIN].revents != 0 {
            pipes.feed();
        }
        if fds[STDERR].revents != 0 {
            pipes.copy_stderr(&mut io::stderr());
        }
        if fds[STDOUT].revents != 0 {
            pipes.drain();
            if pipes.output.len() > STDOUT_CAP {
                pipes.stdout = None;
                if !matches!(stopping, Stopping::Killed { .. }) {
                    stopping = kill(Stop::OverCap, group);
                }
            }
        }
        if exited.is_none() && (fds[EXIT].revents != 0 || exit.has_exited()) {
            exited = Some(Instant::now());
        }
        if fds[REQUESTS].revents != 0 || signals::counted() != seen {
            stopping = on_requests(stopping, limits, deadline, group);
            seen = signals::counted();
        }
    }

    let stopped = match stopping {
        Stopping::Terminated { why, .. } | Stopping::Killed { why, .. } => {
            // Whatever it left running goes too, before the reaping frees
            // the group's id.
            group.signal(libc::SIGKILL);
            Some(why)
        }
        Stopping::No | Stopping::Grace { .. } => None,
    };
    // What it wrote on stderr before it ended is in the pipe: copied, then
    // the pipe closed, whoever else still holds it.
    pipes.copy_stderr(&mut io::stderr());
    pipes.finish_stderr(&mut io::stderr());
    let status = if exited.is_some() {
        Some(sys::wait(pid))
    } else {
        sys::try_wait(pid).transpose()
    };
    match stopped {
        Some(Stop::Timeout(limit)) => return Err(Failure::TimedOut(limit)),
        Some(Stop::Signal(signal)) => return Err(Failure::Interrupted(signal)),
        Some(Stop::OverCap) => return Err(Failure::TooMuchOutput(STDOUT_CAP)),
        None => {}
    }
    if let Some(e) = pipes.read_error {
        return Err(Failure::Io(e));
    }
    // Not stopped, the loop ended with its exit.
    let status = status.ok_or_else(|| Failure::Io(io::Error::other("delegate vanished")))?;
    Ok(Finished {
        status: status.map_err(Failure::Io)?,
        stdout: pipes.output,
        abandoned,
    })
}

/// Acts on the termination requests received so far: one that kills
/// kills at once; a first one for a call it stops starts the grace, which
/// ends at the call's deadline if that comes first.
fn on_requests(
    stopping: Stopping,
    limits: Limits,
    deadline: Option<Instant>,
    group: Group,
) -> Stopping {
    if let Some(signal) = signals::received(limits.killed_by()) {
        return match stopping {
            Stopping::Killed { .. } => stopping,
            _ => kill(Stop::Signal(signal), group),
        };
    }
    match (stopping, signals::received(limits.stopped_by)) {
        (Stopping::No, Some(signal)) => {
            // The call's own deadline still stands within the grace.
            let grace_end = Instant::now() + STOP_GRACE;
            Stopping::Grace {
                signal,
                until: deadline.map_or(grace_end, |d| d.min(grace_end)),
            }
        }
        _ => stopping,
    }
}

/// Sends SIGTERM to the group; SIGKILL follows after [`TERM_GRACE`].
fn terminate(why: Stop, group: Group) -> Stopping {
    group.signal(libc::SIGTERM);
    Stopping::Terminated {
        why,
        until: Instant::now() + TERM_GRACE,
    }
}

/// Sends SIGKILL to the group.
fn kill(why: Stop, group: Group) -> Stopping {
    group.signal(libc::SIGKILL);
    Stopping::Killed {
        why,
        until: Instant::now() + CLOSE_GRACE,
    }
}

/// The plugin's ends of a delegate's pipes, non-blocking: what is left to
/// write, what was read from stdout, and the part of a stderr line not
/// yet copied.
struct Pipes<'a> {
    input: &'a [u8],
    stdin: Option<PipeWriter>,
    stdout: Option<PipeReader>,
    stderr: Option<PipeReader>,
    output: Vec<u8>,
    line: Vec<u8>,
    read_error: Option<io::Error>,
}

impl<'a> Pipes<'a> {
    fn new(ours: Ours, input: &'a [u8], mut output: Vec<u8>) -> io::Result<Self> {
        sys::set_nonblocking(&ours.stdin)?;
        sys::set_nonblocking(&ours.stdout)?;
        sys::set_nonblocking(&ours.stderr)?;
        output.clear();
        let mut pipes = Pipes {
            input,
            stdin: Some(ours.stdin),
            stdout: Some(ours.stdout),
            stderr: Some(ours.stderr),
            output,
            // Room for a few lines before it grows: its first read (most
            // often of the end of the file) then takes no READ_SIZE
            // allocation, which musl's malloc maps and unmaps.
            line: Vec::with_capacity(STDERR_START),
            read_error: None,
        };
        // A pipe takes 64 KiB at once: most inputs are written before the
        // first wait, and nothing at all closes stdin at once (EOF).
        pipes.feed();
        Ok(pipes)
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
        loop {
            // Room for one more byte than the cap, to know it was passed.
            let room = STDOUT_CAP + 1 - self.output.len();
            if self.output.len() == self.output.capacity() {
                // Doubling as Vec does, but never past the cap: a 4 MiB
                // result costs 4 MiB, not 8.
                let grown = (self.output.capacity() * 2).clamp(READ_SIZE, STDOUT_CAP + 1);
                self.output.reserve_exact(grown - self.output.len());
            }
            let spare = self.output.capacity() - self.output.len();
            match sys::read_into(stdout.as_fd(), &mut self.output, spare.min(room)) {
                Ok(0) => break self.stdout = None,
                Ok(_) if self.output.len() > STDOUT_CAP => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.read_error = Some(e);
                    break self.stdout = None;
                }
            }
        }
    }

    /// Copies what is there of the delegate's stderr to `sink` (the
    /// plugin's stderr), whole lines at a time, so that they do not
    /// interleave with the plugin's own; closes it at EOF. Reads a bounded
    /// amount: a delegate (or what it left behind) writing without pause
    /// must not keep the loop from its deadline and its signals.
    fn copy_stderr(&mut self, sink: &mut impl Write) {
        let Some(stderr) = self.stderr.as_mut() else {
            return;
        };
        for _ in 0..STDERR_READS {
            match sys::read_into(stderr.as_fd(), &mut self.line, READ_SIZE) {
                Ok(0) => return self.finish_stderr(sink),
                Ok(_) => {
                    // A delegate that writes to stderr is read READ_SIZE at
                    // a time from here, whatever its lines' length.
                    if self.line.capacity() < READ_SIZE {
                        self.line.reserve(READ_SIZE - self.line.len());
                    }
                    let whole = match self.line.iter().rposition(|b| *b == b'\n') {
                        Some(end) => end + 1,
                        None if self.line.len() > STDERR_LINE_CAP => self.line.len(),
                        None => continue,
                    };
                    // A closed stderr loses the lines and nothing else.
                    let _ = sink.write_all(&self.line[..whole]);
                    self.line.drain(..whole);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Empty for now; an error is the end of it.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return self.finish_stderr(sink),
            }
        }
    }

    /// Copies a last line left without its newline, and closes stderr.
    fn finish_stderr(&mut self, sink: &mut impl Write) {
        if !self.line.is_empty() {
            self.line.push(b'\n');
            let _ = sink.write_all(&self.line);
            self.line.clear();
        }
        self.stderr = None;
    }
}

/// How often to look for the delegate's exit where pidfd_open(2) is missing
/// (Linux before 5.3).
const EXIT_POLL: Duration = Duration::from_millis(5);

/// How often a delegate's supervision looks at the count of termination
/// requests, which another thread may have read.
const RECOUNT: Duration = Duration::from_millis(200);

/// Learns when the delegate has ended without reaping it: through a pidfd
/// that poll(2) watches, or, on kernels without pidfds, by asking.
enum ExitWatch {
    Pidfd(OwnedFd),
    Asking(u32),
}

impl ExitWatch {
    fn new(pid: u32) -> ExitWatch {
        sys::pidfd_open(pid).map_or(ExitWatch::Asking(pid), ExitWatch::Pidfd)
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
        match self {
            ExitWatch::Asking(pid) => sys::has_exited(*pid),
            ExitWatch::Pidfd(_) => false,
        }
    }
}

/// A delegate's process group, named by its leader's pid.
#[derive(Clone, Copy)]
struct Group(u32);

impl Group {
    /// Sends `signal` to every process in the group.
    fn signal(self, signal: libc::c_int) {
        sys::signal_group(self.0, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    /// Pipes whose delegate's stderr holds lines of `length` bytes, as
    /// many as a socket takes (more than a pipe: more than one copy
    /// takes), read into `line`; with the writing end and what it wrote.
    fn flooded(
        length: usize,
        line: Vec<u8>,
    ) -> (Pipes<'static>, std::os::unix::net::UnixStream, usize) {
        let (mut writer, reader) = std::os::unix::net::UnixStream::pair().unwrap();
        writer.set_nonblocking(true).unwrap();
        let text = [&vec![b'x'; length - 1][..], b"\n"].concat();
        let mut written = 0;
        while let Ok(n) = writer.write(&text) {
            written += n;
        }
        reader.set_nonblocking(true).unwrap();
        let pipes = Pipes {
            input: b"",
            stdin: None,
            stdout: None,
            stderr: Some(PipeReader::from(OwnedFd::from(reader))),
            output: Vec::new(),
            line,
            read_error: None,
        };
        (pipes, writer, written)
    }

    #[test]
    fn a_stderr_with_short_lines_is_read_a_pipes_worth_at_a_time() {
        let (mut pipes, _writer, written) = flooded(100, Vec::with_capacity(STDERR_START));
        let mut sink = Vec::new();
        pipes.copy_stderr(&mut sink);
        // Not STDERR_START bytes a read, as the first one was.
        assert!(sink.len() > STDERR_READS * STDERR_START, "{}", sink.len());
        assert!(written >= sink.len() && sink.len() % 100 == 0);
    }

    #[test]
    fn one_wake_up_copies_a_bounded_part_of_stderr_in_whole_lines() {
        let (mut pipes, writer, written) = flooded(1000, Vec::new());
        let mut sink = Vec::new();
        pipes.copy_stderr(&mut sink);
        let bound = STDERR_READS * READ_SIZE;
        assert!(written > bound, "only {written} bytes buffered");
        assert!(!sink.is_empty() && sink.len() <= bound, "{}", sink.len());
        assert!(sink.ends_with(b"\n") && sink.len() % 1000 == 0);
        // The rest comes with the next wake-ups, nothing lost or split.
        drop(writer);
        while pipes.stderr.is_some() {
            pipes.copy_stderr(&mut sink);
        }
        assert_eq!(sink.len(), written);
    }
}
