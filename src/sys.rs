//! The operating-system calls std does not offer, as safe functions: one
//! poll(2) wrapper for every loop that waits on descriptors, and the
//! calls relative to a directory descriptor and the file locks that agent
//! mode's state is kept with.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
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

/// Opens `name` in directory `dir` with `flags` (and `mode` for a file it
/// creates), close-on-exec. With `O_NOFOLLOW`, a last component that is a
/// symbolic link fails with ELOOP; `dir` itself is the descriptor, so no
/// link above `name` is followed either.
pub fn openat(dir: &File, name: &str, flags: libc::c_int, mode: libc::mode_t) -> io::Result<File> {
    let name = c_name(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call; `dir` is open.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            libc::c_uint::from(mode),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a non-negative result is a new descriptor that nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Makes directory `name` in `dir`.
pub fn mkdirat(dir: &File, name: &str, mode: libc::mode_t) -> io::Result<()> {
    let name = c_name(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call; `dir` is open.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })
}

/// Renames `from` to `to`, both in `dir`, replacing `to` (a link at `to`
/// is replaced, not followed).
pub fn renameat(dir: &File, from: &str, to: &str) -> io::Result<()> {
    let (from, to) = (c_name(from)?, c_name(to)?);
    let fd = dir.as_raw_fd();
    // SAFETY: both names are NUL-terminated and outlive the call.
    check(unsafe { libc::renameat(fd, from.as_ptr(), fd, to.as_ptr()) })
}

/// Removes file `name` from `dir` (a link is removed, not followed).
pub fn unlinkat(dir: &File, name: &str) -> io::Result<()> {
    let name = c_name(name)?;
    // SAFETY: `name` is NUL-terminated and outlives the call; `dir` is open.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) })
}

/// How to take a lock with [`try_flock`].
#[derive(Debug, Clone, Copy)]
pub enum Lock {
    /// Alone.
    Exclusive,
    /// With other shared holders.
    Shared,
}

/// Takes `lock` on `file` if no one holds it against us: `Ok(false)` if
/// someone does.
pub fn try_flock(file: &File, lock: Lock) -> io::Result<bool> {
    let operation = match lock {
        Lock::Exclusive => libc::LOCK_EX,
        Lock::Shared => libc::LOCK_SH,
    };
    // SAFETY: flock on an open descriptor has no memory effects.
    match check(unsafe { libc::flock(file.as_raw_fd(), operation | libc::LOCK_NB) }) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(e),
    }
}

fn c_name(name: &str) -> io::Result<CString> {
    CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a file name"))
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
