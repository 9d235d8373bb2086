//! Termination requests: SIGTERM and SIGINT are blocked and read from a
//! signalfd instead of killing the plugin mid-stack, so that the loop that
//! supervises a delegate can wait for them alongside the delegate's pipes,
//! stop the delegate, and let an ADD roll back before the plugin answers.
//! Requests are counted: a first one stops what the runtime asked for, a
//! second one also cuts the rollback short.

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::error::Error;
use crate::sys::{poll, pollfd};

/// How many termination requests have been read.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The last one's signal number.
static LAST: AtomicI32 = AtomicI32::new(0);

/// The signalfd, once [`watch`] has made it.
static SIGNALS: OnceLock<Result<OwnedFd, i32>> = OnceLock::new();

/// Takes SIGTERM and SIGINT away from their default (ending the process)
/// for the rest of the process; later calls do nothing. The plugin is
/// single-threaded, so blocking them here blocks them everywhere;
/// delegates do not inherit the block, since std::process clears the
/// signal mask of the processes it starts.
pub fn watch() -> io::Result<()> {
    match SIGNALS.get_or_init(open) {
        Ok(_) => Ok(()),
        Err(errno) => Err(io::Error::from_raw_os_error(*errno)),
    }
}

fn open() -> Result<OwnedFd, i32> {
    // A runtime that ignores SIGCHLD passes that on through exec, and the
    // kernel would then reap delegates by itself: their exit status lost,
    // and their pid (their group's id) free for reuse before the last kill.
    // SAFETY: setting a standard disposition for a valid signal.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    let set = termination_signals();
    // SAFETY: -1 asks for a new descriptor; `set` is valid for the call.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    // Blocked only once the signalfd exists: without it nothing would ever
    // read them, and the plugin would ignore every request to stop.
    // SAFETY: `set` is an initialised sigset_t; a null old-set pointer is allowed.
    if unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } != 0 {
        let error = errno();
        // SAFETY: closing the descriptor signalfd just returned, owned by nothing else.
        unsafe { libc::close(fd) };
        return Err(error);
    }
    // SAFETY: signalfd returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The descriptor that becomes readable when a request comes, for poll(2);
/// `None` if [`watch`] was not called or failed.
pub fn fd() -> Option<BorrowedFd<'static>> {
    SIGNALS.get()?.as_ref().ok().map(|fd| fd.as_fd())
}

/// Sleeps for `pause`, or less if a termination request comes.
pub fn wait(pause: std::time::Duration) {
    let mut fds = [pollfd(raw_fd(), libc::POLLIN)];
    // A failed wait is a short sleep: the caller looks again either way.
    let _ = poll(&mut fds, Some(pause));
}

/// Reads `input` to its end, unless a termination request comes first: a
/// runtime that never closes the plugin's stdin must still be able to
/// stop it, and the requests are blocked, so they cannot end the read.
pub fn read_to_end(input: &mut (impl Read + AsRawFd)) -> Result<Vec<u8>, Error> {
    let mut bytes = Vec::new();
    let Some(requests) = raw_fd() else {
        // Not watched: a request ends the process as it always would.
        input.read_to_end(&mut bytes).map_err(Error::ReadStdin)?;
        return Ok(bytes);
    };
    let mut chunk = [0; 64 * 1024];
    loop {
        let mut fds = [
            pollfd(Some(input.as_raw_fd()), libc::POLLIN),
            pollfd(Some(requests), libc::POLLIN),
        ];
        poll(&mut fds, None).map_err(Error::ReadStdin)?;
        if fds[1].revents != 0 {
            if let Some(signal) = received(1) {
                return Err(Error::Interrupted {
                    signal,
                    during: "reading the network configuration from stdin",
                });
            }
        }
        // Ready (data, end of file or an error to report): a read cannot block.
        if fds[0].revents != 0 {
            match input.read(&mut chunk) {
                Ok(0) => return Ok(bytes),
                Ok(n) => bytes.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::ReadStdin(e)),
            }
        }
    }
}

fn raw_fd() -> Option<RawFd> {
    fd().map(|fd| fd.as_raw_fd())
}

/// The signal of the latest request, if at least `count` have come.
pub fn received(count: usize) -> Option<i32> {
    drain();
    (COUNT.load(Ordering::SeqCst) >= count).then(|| LAST.load(Ordering::SeqCst))
}

/// Counts the requests waiting in the signalfd.
fn drain() {
    let Some(raw) = raw_fd() else { return };
    loop {
        // SAFETY: signalfd_siginfo is plain data; zeroed is a valid value.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: `info` is valid for `size` bytes of writing.
        let read =
            unsafe { libc::read(raw, (&mut info as *mut libc::signalfd_siginfo).cast(), size) };
        if usize::try_from(read) != Ok(size) {
            // Empty (EAGAIN) or interrupted: nothing more to count now.
            return;
        }
        LAST.store(
            i32::try_from(info.ssi_signo).unwrap_or(libc::SIGTERM),
            Ordering::SeqCst,
        );
        COUNT.fetch_add(1, Ordering::SeqCst);
    }
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

fn termination_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set before sigaddset writes to it;
    // both only fail for invalid signal numbers, and these are valid.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    }
}
