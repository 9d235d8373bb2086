//! The operating-system calls std does not offer, as safe functions: one
//! poll(2) wrapper for every loop that waits on descriptors.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// A poll(2) slot watching `fd` for `events`, or, for `None`, a slot poll
/// ignores (so that slots keep their places whatever is open).
pub fn pollfd(fd: Option<RawFd>, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: fd.unwrap_or(-1),
        events,
        revents: 0,
    }
}

/// Waits until one of `fds` is ready, for at most `wait` (for ever if
/// `None`). An interruption by a signal counts as a wake-up, not an error.
pub fn poll(fds: &mut [libc::pollfd], wait: Option<Duration>) -> io::Result<()> {
    // Rounded up, so that a deadline is not polled for again and again.
    let millis = wait.map_or(-1, |w| {
        i32::try_from(w.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
    });
    let count = libc::nfds_t::try_from(fds.len()).unwrap_or(0);
    // SAFETY: `fds` is a valid, writable array of `count` pollfds.
    if unsafe { libc::poll(fds.as_mut_ptr(), count, millis) } < 0 {
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    Ok(())
}
