//! Every call into the operating system that std does not offer, and so
//! every `unsafe` block of the crate, behind safe functions: poll(2), the
//! signalfd that termination requests are read from, watching, signalling
//! and reaping a delegate's process, reading into a buffer's spare room;
//! starting a delegate (`spawn`), and the calls relative to a directory
//! descriptor and the file locks records are kept under (`at`); core dumps
//! forbidden; a TCP connection started without waiting (`net`); the
//! binaries' memory allocator (`arena`).
#![allow(unsafe_code)]

mod arena;
mod at;
mod net;
mod spawn;

pub use arena::Arena;
pub use at::{
    exists_at, linkat, mkdirat, openat, readlinkat, renameat, symlinkat, try_flock, unlinkat, Lock,
};
pub use net::connect_started;
pub use spawn::{spawn, Start};

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

/// This boot's ID: nothing of another boot lives, and no clock of
/// another boot counts.
pub fn boot_id() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

/// The time since this boot, suspended time included (`CLOCK_BOOTTIME`):
/// one clock for every process of the boot, which no one sets. `None`
/// if the kernel does not say.
pub fn since_boot() -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to write.
    let said = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    if said != 0 {
        return None;
    }
    Some(Duration::new(
        u64::try_from(now.tv_sec).ok()?,
        u32::try_from(now.tv_nsec).ok()?,
    ))
}

/// 16 random hex digits (getrandom(2)), for names no other process
/// makes: a container ID of the Docker driver's, an installer's
/// temporary file.
pub fn random_hex() -> io::Result<String> {
    let mut bytes = [0u8; 8];
    // SAFETY: the buffer is valid for its length; getrandom writes at
    // most that many bytes.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got != bytes.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Makes this process undumpable (`PR_SET_DUMPABLE` 0): no core file, and
/// no ptrace or /proc reading of its memory by other processes of its
/// user, since it holds passwords and tokens.
pub fn forbid_core_dumps() -> io::Result<()> {
    // SAFETY: prctl with PR_SET_DUMPABLE takes plain integers.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The effective user ID of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

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

/// Sets SIGCHLD back to its default disposition. A runtime that ignores it
/// passes that on through exec, and the kernel would then reap children by
/// itself: their exit status lost, their pid free for reuse.
pub fn default_sigchld() {
    // SAFETY: setting a standard disposition for a valid signal.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
}

/// A new non-blocking signalfd for `signals`, which are then blocked for
/// the calling thread and the threads it starts later: from then on they
/// are read from the descriptor instead of acting. Processes inherit the
/// block: [`spawn`] is told which signals to unblock for them.
pub fn block_into_signalfd(signals: &[libc::c_int]) -> io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it below.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is valid for writing; both calls only fail for invalid
    // signal numbers, and the callers pass valid ones.
    unsafe {
        libc::sigemptyset(&mut set);
        for signal in signals {
            libc::sigaddset(&mut set, *signal);
        }
    }
    // SAFETY: -1 asks for a new descriptor; `set` is valid for the call.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: signalfd returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Blocked only once the signalfd exists: without it nothing would ever
    // read them, and the process would ignore every request to stop. (On
    // failure the descriptor closes as it drops.)
    // SAFETY: `set` is an initialised sigset_t; a null old-set pointer is allowed.
    check(unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) })?;
    Ok(fd)
}

/// The next signal waiting in `signalfd`, if one is.
pub fn read_signal(signalfd: &OwnedFd) -> Option<libc::c_int> {
    // SAFETY: signalfd_siginfo is plain data; zeroed is a valid value.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::signalfd_siginfo>();
    let buffer = (&mut info as *mut libc::signalfd_siginfo).cast();
    // SAFETY: `buffer` is valid for `size` bytes of writing.
    let read = unsafe { libc::read(signalfd.as_raw_fd(), buffer, size) };
    // Empty (EAGAIN), interrupted or short: nothing to count now.
    (usize::try_from(read) == Ok(size)).then(|| libc::c_int::try_from(info.ssi_signo).ok())?
}

/// A pidfd for child `pid`, which poll(2) reports readable once the child
/// has ended; `None` on kernels without pidfd_open(2) (before Linux 5.3).
pub fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    let flags: libc::c_uint = 0;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) };
    let fd = RawFd::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: a non-negative result is a new descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether child `pid` has ended, leaving it unreaped (its status still
/// to be collected, its pid still taken).
pub fn has_exited(pid: u32) -> bool {
    // SAFETY: siginfo_t is plain data that waitid fills in; zeroed is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: `info` is valid for writing; WNOWAIT leaves the child to be reaped.
    let result = unsafe { libc::waitid(libc::P_PID, libc::id_t::from(pid), &mut info, flags) };
    if result != 0 {
        // No such child any more (reaped already): it has ended.
        return io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD);
    }
    // With WNOHANG, a child still running leaves si_pid at 0.
    // SAFETY: waitid succeeded, so `info` holds a child's state or zeros.
    unsafe { info.si_pid() != 0 }
}

/// Waits for child `pid` to end, and reaps it.
pub fn wait(pid: u32) -> io::Result<ExitStatus> {
    loop {
        match wait_pid(pid, 0) {
            Ok(Some(status)) => return Ok(status),
            Err(e) if e.kind() != io::ErrorKind::Interrupted => return Err(e),
            // Interrupted (or, which waitpid without WNOHANG never does, nothing).
            _ => {}
        }
    }
}

/// Reaps child `pid` if it has ended.
pub fn try_wait(pid: u32) -> io::Result<Option<ExitStatus>> {
    wait_pid(pid, libc::WNOHANG)
}

fn wait_pid(pid: u32, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ECHILD))?;
    let mut status: libc::c_int = 0;
    // SAFETY: `status` is valid for writing.
    match unsafe { libc::waitpid(pid, &mut status, flags) } {
        0 => Ok(None),
        n if n < 0 => Err(io::Error::last_os_error()),
        _ => Ok(Some(ExitStatus::from_raw(status))),
    }
}

/// Reads at most `max` bytes from `fd` onto the end of `buffer`, straight
/// into its spare capacity: no chunk to zero and copy. The buffer grows (by
/// `max` at least) only when it is full: the read that finds the end after
/// a short one must not move what was read to a larger allocation (growing
/// a 64 KiB buffer copied all of it and faulted in 17 fresh pages, 40 µs
/// of every start).
pub fn read_into(fd: BorrowedFd, buffer: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    // Room for nothing would read as the end of the file.
    debug_assert!(max > 0);
    if buffer.len() == buffer.capacity() {
        buffer.reserve(max);
    }
    let spare = buffer.spare_capacity_mut();
    let room = spare.len().min(max);
    // SAFETY: `spare` is valid for writing `room` bytes.
    let read = unsafe { libc::read(fd.as_raw_fd(), spare.as_mut_ptr().cast(), room) };
    let read = usize::try_from(read).map_err(|_| io::Error::last_os_error())?;
    // SAFETY: read(2) initialised the first `read` bytes of the spare capacity.
    unsafe { buffer.set_len(buffer.len() + read) };
    Ok(read)
}

/// Sends `signal` to every process in process group `group`. A group
/// already gone is no error.
pub fn signal_group(group: u32, signal: libc::c_int) {
    if let Ok(group) = libc::pid_t::try_from(group) {
        // SAFETY: kill has no memory effects; a negative pid names the group.
        unsafe { libc::kill(-group, signal) };
    }
}

/// Lowers the calling thread's scheduling priority (the process's, in a
/// single-threaded one) to nice 10, never raising it: for a reader that
/// should give way to the work it reads about. Failing is no error; it
/// only runs at the priority it had.
pub fn give_way() {
    // SAFETY: getpriority and setpriority have no memory effects.
    unsafe {
        // -1 is also a valid priority: errno would tell, but either way
        // a process already at nice 10 or more is left as it is.
        let current = libc::getpriority(libc::PRIO_PROCESS, 0);
        if current < 10 {
            libc::setpriority(libc::PRIO_PROCESS, 0, 10);
        }
    }
}

/// Puts descriptor `fd` in non-blocking mode (its own open file
/// description only: the other end of a pipe keeps its mode).
pub fn set_nonblocking(fd: &impl AsFd) -> io::Result<()> {
    let fd = fd.as_fd().as_raw_fd();
    // SAFETY: fcntl on an open descriptor, with valid commands.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) })
}

/// Whether this process may write in `path` (access(2) with W_OK).
pub fn can_write(path: &Path) -> bool {
    may(path, libc::W_OK)
}

/// Whether this process may execute `path` (access(2) with X_OK): for root,
/// a file with any execute bit.
pub fn can_execute(path: &Path) -> bool {
    may(path, libc::X_OK)
}

fn may(path: &Path, mode: libc::c_int) -> bool {
    let Ok(path) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: access only reads the NUL-terminated path.
    unsafe { libc::access(path.as_ptr(), mode) == 0 }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn giving_way_lowers_the_priority_to_nice_10_and_never_raises_it() {
        // In a thread of its own: Linux gives each thread its own nice.
        let niceness = || {
            give_way();
            // SAFETY: getpriority has no memory effects.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
        };
        assert_eq!(std::thread::spawn(niceness).join().unwrap(), 10);
        let lower = std::thread::spawn(move || {
            // SAFETY: as above.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 15) };
            niceness()
        });
        assert_eq!(lower.join().unwrap(), 15);
    }

    #[test]
    fn a_read_grows_the_buffer_only_when_it_is_full() {
        let (reader, mut writer) = io::pipe().unwrap();
        io::Write::write_all(&mut writer, b"a short configuration").unwrap();
        drop(writer);
        let mut buffer = Vec::new();
        assert_eq!(
            read_into(reader.as_fd(), &mut buffer, 64 * 1024).unwrap(),
            21
        );
        let capacity = buffer.capacity();
        let at = buffer.as_ptr();
        // The read that finds the end: nothing moved, nothing grown.
        assert_eq!(
            read_into(reader.as_fd(), &mut buffer, 64 * 1024).unwrap(),
            0
        );
        assert_eq!((buffer.capacity(), buffer.as_ptr()), (capacity, at));
        assert_eq!(buffer, b"a short configuration");
        // A full buffer grows by what is asked for.
        let (reader, mut writer) = io::pipe().unwrap();
        io::Write::write_all(&mut writer, b"more").unwrap();
        let mut full = Vec::with_capacity(2);
        full.extend_from_slice(b"ab");
        assert_eq!(read_into(reader.as_fd(), &mut full, 16).unwrap(), 4);
        assert!(full.capacity() >= 18);
        assert_eq!(full, b"abmore");
    }
}
