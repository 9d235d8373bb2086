//! Termination requests: SIGTERM and SIGINT are blocked and read from a
//! signalfd instead of killing the plugin mid-stack, so that the loop that
//! supervises a delegate can wait for them alongside the delegate's pipes,
//! stop the delegate, and let an ADD roll back before the plugin answers.
//! Requests are counted: a first one stops what the runtime asked for, a
//! second one also cuts the rollback short.

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::cni::{code, Reportable};
use crate::sys::{self, poll, pollfd};

/// The termination requests: blocked in the plugin and read from the
/// signalfd, unblocked again in the delegates it starts.
pub const WATCHED: [libc::c_int; 2] = [libc::SIGTERM, libc::SIGINT];

/// A termination request that stopped the plugin while it was waiting,
/// not running a delegate.
#[derive(Debug, Clone, thiserror::Error)]
#[error("stopped: the plugin received signal {signal} while {during}")]
pub struct Interrupted {
    pub signal: i32,
    /// What it was waiting for.
    pub during: &'static str,
}

impl Reportable for Interrupted {
    fn code(&self) -> u32 {
        code::INTERRUPTED
    }
}

/// Why stdin was not read to its end.
#[derive(Debug)]
pub enum Unread {
    /// A termination request came first.
    Interrupted(Interrupted),
    /// Reading failed.
    Failed(io::Error),
}

/// How many termination requests have been read.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The last one's signal number.
static LAST: AtomicI32 = AtomicI32::new(0);

/// How many of them the plugin has taken in hand: a wait on a peer ends
/// at any request past these.
static IN_HAND: AtomicUsize = AtomicUsize::new(0);

/// The signalfd, once [`watch`] has made it; the error's OS code if it
/// could not be made.
static SIGNALS: OnceLock<Result<OwnedFd, i32>> = OnceLock::new();

/// Takes SIGTERM and SIGINT away from their default (ending the process)
/// for the rest of the process; later calls do nothing. The plugin is
/// single-threaded, so blocking them here blocks them everywhere.
pub fn watch() -> io::Result<()> {
    let made = SIGNALS.get_or_init(|| {
        // The delegates' exit statuses, and their pids until the last
        // kill, must stay the plugin's to collect.
        sys::default_sigchld();
        sys::block_into_signalfd(&WATCHED).map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))
    });
    match made {
        Ok(_) => Ok(()),
        Err(errno) => Err(io::Error::from_raw_os_error(*errno)),
    }
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

/// Sleeps for `pause`, or less if a termination request comes, even one
/// another thread read first (an etcd call of a thread beside it drains
/// requests too, and then this poll would not wake): in slices of at
/// most a second, between which the count of requests is compared.
pub fn sleep(pause: std::time::Duration) {
    let until = std::time::Instant::now() + pause;
    let seen = counted();
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || received(seen + 1).is_some() {
            return;
        }
        wait(left.min(std::time::Duration::from_secs(1)));
    }
}

/// Reads `input` to its end, unless a termination request comes first: a
/// runtime that never closes the plugin's stdin must still be able to
/// stop it, and the requests are blocked, so they cannot end the read.
pub fn read_to_end(input: &mut (impl Read + AsFd)) -> Result<Vec<u8>, Unread> {
    let mut bytes = Vec::new();
    let Some(requests) = raw_fd() else {
        // Not watched: a request ends the process as it always would.
        input.read_to_end(&mut bytes).map_err(Unread::Failed)?;
        return Ok(bytes);
    };
    loop {
        let mut fds = [
            pollfd(Some(input.as_fd().as_raw_fd()), libc::POLLIN),
            pollfd(Some(requests), libc::POLLIN),
        ];
        poll(&mut fds, None).map_err(Unread::Failed)?;
        if fds[1].revents != 0 {
            if let Some(signal) = received(1) {
                return Err(Unread::Interrupted(Interrupted {
                    signal,
                    during: "reading the network configuration from stdin",
                }));
            }
        }
        // Ready (data, end of file or an error to report): a read cannot block.
        if fds[0].revents != 0 {
            match sys::read_into(input.as_fd(), &mut bytes, 64 * 1024) {
                Ok(0) => return Ok(bytes),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Unread::Failed(e)),
            }
        }
    }
}

fn raw_fd() -> Option<RawFd> {
    fd().map(|fd| fd.as_raw_fd())
}

/// How many requests have been read so far, by any thread, without
/// reading more: a thread whose poll did not wake because another thread
/// read the request compares it with what it saw last.
pub fn counted() -> usize {
    COUNT.load(Ordering::SeqCst)
}

/// The signal of the latest request, if at least `count` have come.
pub fn received(count: usize) -> Option<i32> {
    drain();
    (COUNT.load(Ordering::SeqCst) >= count).then(|| LAST.load(Ordering::SeqCst))
}

/// The signal of a termination request the plugin has not taken in hand,
/// if one has come: every wait on a peer (etcd, the controller, Keystone)
/// ends at it, however many there are, until the plugin takes it in hand.
pub fn pending() -> Option<i32> {
    drain();
    (COUNT.load(Ordering::SeqCst) > IN_HAND.load(Ordering::SeqCst))
        .then(|| LAST.load(Ordering::SeqCst))
}

/// Takes the first request not in hand yet, if one has come, in hand:
/// the work that answers it (a keeper withdrawing its registration, an
/// ADD giving back what it made) waits on its peers again, until another
/// request comes (a second one already come stops it at once).
pub fn take_in_hand() {
    drain();
    let come = COUNT.load(Ordering::SeqCst);
    let _ = IN_HAND.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |taken| {
        Some((taken + 1).min(come))
    });
}

/// Counts the requests waiting in the signalfd.
fn drain() {
    let Some(Ok(signalfd)) = SIGNALS.get() else {
        return;
    };
    while let Some(signal) = sys::read_signal(signalfd) {
        LAST.store(signal, Ordering::SeqCst);
        COUNT.fetch_add(1, Ordering::SeqCst);
    }
}
