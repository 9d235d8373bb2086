//! Calls relative to a directory's descriptor (open, make, rename, link,
//! read a link, remove), none following a symbolic link, and the file
//! locks records are kept under.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::{c_name, check};

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

/// Makes `to` a second name of file `from`, both in `dir`: fails with
/// EEXIST, and changes nothing, if `to` is there already (a link included).
pub fn linkat(dir: &File, from: &str, to: &str) -> io::Result<()> {
    let (from, to) = (c_name(from)?, c_name(to)?);
    let fd = dir.as_raw_fd();
    // SAFETY: both names are NUL-terminated and outlive the call; flags 0
    // follows no link.
    check(unsafe { libc::linkat(fd, from.as_ptr(), fd, to.as_ptr(), 0) })
}

/// Makes `name` in `dir` a symbolic link whose target is `target`: fails
/// with EEXIST, and changes nothing, if `name` is there already.
pub fn symlinkat(target: &[u8], dir: &File, name: &str) -> io::Result<()> {
    let target = CString::new(target)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a link's target"))?;
    let name = c_name(name)?;
    // SAFETY: both strings are NUL-terminated and outlive the call.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })
}

/// The target of symbolic link `name` in `dir`, not followed: EINVAL if
/// `name` is not a link.
pub fn readlinkat(dir: &File, name: &str) -> io::Result<Vec<u8>> {
    let name = c_name(name)?;
    // A target is shorter than PATH_MAX; one that fills the buffer was cut.
    let mut buffer = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `name` is NUL-terminated; `buffer` is valid for writing its length.
    let read = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buffer.as_mut_ptr().cast(),
            buffer.len(),
        )
    };
    let read = usize::try_from(read).map_err(|_| io::Error::last_os_error())?;
    if read == buffer.len() {
        return Err(io::Error::other("a link's target longer than PATH_MAX"));
    }
    buffer.truncate(read);
    Ok(buffer)
}

/// Whether anything is named `name` in `dir` (a link counts, unfollowed).
pub fn exists_at(dir: &File, name: &str) -> io::Result<bool> {
    let name = c_name(name)?;
    // SAFETY: stat is plain data that fstatat fills in; zeroed is a valid value.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated and outlives the call; `stat` is
    // valid for writing.
    let result = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut stat,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match check(result) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
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
