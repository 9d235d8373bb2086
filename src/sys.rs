//! Every call into the operating system that std does not offer, and so
//! every `unsafe` block of the crate, behind safe functions: poll(2), the
//! signalfd that termination requests are read from, starting, watching,
//! signalling and reaping a delegate's process, reading into a buffer's
//! spare room, and the calls relative to a directory descriptor and the
//! file locks that agent mode's state is kept with.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;
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

/// What [`spawn`] gives the new process besides its program and environment.
pub struct Start<'a> {
    /// Its stdin, stdout and stderr; descriptors above 2.
    pub stdio: [BorrowedFd<'a>; 3],
    /// Signals blocked in this thread that the program must start with unblocked.
    pub unblock: &'a [libc::c_int],
}

/// Starts `program` with `env` (`KEY=value` strings) in a process group of
/// its own, and returns its pid, for [`wait`] or [`try_wait`].
///
/// What std's Command does through posix_spawn(3), with two differences
/// that every delegate call pays or suffers for. glibc's child asks for the
/// disposition of all 64 signals, one call each, while the parent waits;
/// here the parent learns once which signals have handlers, and the child
/// resets only those (and SIGPIPE, which std ignores). And std passes on
/// the caller's signal mask, SIGTERM and SIGINT blocked included, so a
/// delegate that does not unblock them never saw the plugin's SIGTERM;
/// here the program starts with `start.unblock` unblocked.
pub fn spawn(program: &CStr, env: &[&CStr], start: &Start) -> io::Result<u32> {
    let stdio = start.stdio.map(|fd| fd.as_raw_fd());
    if stdio.iter().any(|fd| *fd <= 2) {
        // One could be overwritten by another's dup2 in the child. std
        // opens 0, 1 and 2 before main, so new descriptors are above them.
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a standard descriptor of the plugin is closed",
        ));
    }
    let argv = [program.as_ptr(), std::ptr::null()];
    let envp: Vec<*const libc::c_char> = env
        .iter()
        .map(|var| var.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    // Every signal blocked in this thread, glibc's internal ones included
    // (which pthread_sigmask would leave out), until the child has reset
    // the handlers it shares with us: none may run in it before that.
    let before = set_mask(!0)?;
    let mask = start
        .unblock
        .iter()
        .fold(before, |mask, signal| mask & !signal_bit(*signal));
    let child = Child {
        program: program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        stdio,
        mask,
        reset: handled_signals(),
        error: AtomicI32::new(0),
    };
    // Its stack, for the moments before exec: it only makes system calls.
    let mut stack: Vec<u128> = Vec::with_capacity(CHILD_STACK / 16);
    // SAFETY: the end of the allocation, 16-byte aligned, as the stack grows down.
    let top = unsafe { stack.as_mut_ptr().add(stack.capacity()) };
    // CLONE_VM | CLONE_VFORK: the child borrows our memory (nothing to copy)
    // and we are suspended until it has called execve or exited, so what it
    // reads from `child` stays valid and `child.error` is final after.
    // SAFETY: `start_child` is an extern "C" fn taking the pointer to `child`,
    // which outlives the child's use of it (see above); `top` is the top of
    // a writable region of CHILD_STACK bytes.
    let pid = unsafe {
        libc::clone(
            start_child,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::addr_of!(child).cast_mut().cast(),
        )
    };
    let cloned = io::Error::last_os_error();
    let _ = set_mask(before);
    drop(stack);
    if pid < 0 {
        return Err(cloned);
    }
    let pid = u32::try_from(pid).map_err(|_| io::Error::other("clone returned a bad pid"))?;
    match child.error.load(Ordering::SeqCst) {
        0 => Ok(pid),
        errno => {
            let _ = wait(pid);
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

/// The stack the child of [`spawn`] runs on until it calls execve.
const CHILD_STACK: usize = 16 * 1024;

/// What the child of [`spawn`] reads from the parent's memory.
struct Child {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    stdio: [RawFd; 3],
    /// The signal mask the program starts with.
    mask: KernelSigset,
    reset: &'static [libc::c_int],
    /// The errno of the step that failed, for the parent to report.
    error: AtomicI32,
}

/// The child of [`spawn`]: only system calls, on memory the parent set up
/// (no allocation, no lock, nothing that could panic).
extern "C" fn start_child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Child` that the suspended parent keeps alive.
    let child = unsafe { &*arg.cast::<Child>() };
    // The kernel's struct sigaction, all zero: SIG_DFL, no flags, an empty
    // mask. Through the raw call, as glibc refuses its own internal signals.
    let default = KernelSigaction::default();
    for signal in child.reset {
        // SAFETY: `default` is a valid kernel struct sigaction; a null old
        // action is allowed.
        let reset = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                libc::c_long::from(*signal),
                &default,
                std::ptr::null_mut::<KernelSigaction>(),
                SIGSET_SIZE,
            )
        };
        if reset != 0 {
            child_failed(child);
        }
    }
    // SAFETY: setpgid and dup2 have no memory effects; the descriptors are
    // open, and above 2, so no dup2 overwrites another's source.
    unsafe {
        if libc::setpgid(0, 0) != 0 {
            child_failed(child);
        }
        for (target, fd) in (0..).zip(child.stdio) {
            if libc::dup2(fd, target) < 0 {
                child_failed(child);
            }
        }
    }
    if set_mask(child.mask).is_err() {
        child_failed(child);
    }
    // SAFETY: the program, argv and envp are NUL-terminated, and the arrays
    // end with a null pointer; the parent keeps them alive.
    unsafe { libc::execve(child.program, child.argv, child.envp) };
    child_failed(child)
}

/// Leaves errno for the parent of [`start_child`], and exits.
fn child_failed(child: &Child) -> ! {
    let errno = io::Error::last_os_error().raw_os_error();
    let errno = errno.filter(|e| *e != 0).unwrap_or(libc::EINVAL);
    child.error.store(errno, Ordering::SeqCst);
    // SAFETY: _exit ends this process at once, running nothing of the parent's.
    unsafe { libc::_exit(127) }
}

/// The signals this process has handlers for, which a child must reset
/// before it unblocks anything, and SIGPIPE, which std ignores and programs
/// expect at its default. Looked at once: the handlers are set up before
/// main (std's for SIGSEGV and SIGBUS, glibc's internal ones) and the crate
/// installs none; termination requests come through a signalfd.
fn handled_signals() -> &'static [libc::c_int] {
    static HANDLED: OnceLock<Vec<libc::c_int>> = OnceLock::new();
    HANDLED.get_or_init(|| {
        let mut handled = vec![libc::SIGPIPE];
        for signal in 1..=64 {
            let mut current = KernelSigaction::default();
            // SAFETY: a null new action only reads the disposition into
            // `current`, a valid kernel struct sigaction.
            let read = unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    libc::c_long::from(signal),
                    std::ptr::null::<KernelSigaction>(),
                    &mut current,
                    SIGSET_SIZE,
                )
            };
            if read == 0 && current.handler != libc::SIG_DFL && current.handler != libc::SIG_IGN {
                handled.push(signal);
            }
        }
        handled
    })
}

// The kernel's own signal structures, for the raw calls above; their
// layout is the one of the 64-bit architectures below.
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "powerpc64",
    target_arch = "s390x"
)))]
compile_error!("sys::spawn knows the kernel's struct sigaction of 64-bit x86, ARM, RISC-V, POWER and s390x only");

/// The kernel's signal set: one bit per signal, 1 to 64.
type KernelSigset = u64;

/// Its size, as rt_sigaction(2) and rt_sigprocmask(2) take it.
const SIGSET_SIZE: libc::size_t = std::mem::size_of::<KernelSigset>();

/// The kernel's struct sigaction (not glibc's): all zero is SIG_DFL.
#[repr(C)]
#[derive(Default)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: usize,
    mask: KernelSigset,
}

fn signal_bit(signal: libc::c_int) -> KernelSigset {
    1 << (signal - 1)
}

/// Sets this thread's signal mask to `mask` with the raw call (which,
/// unlike glibc's, also blocks glibc's internal signals); returns the old one.
fn set_mask(mask: KernelSigset) -> io::Result<KernelSigset> {
    let mut old: KernelSigset = 0;
    // SAFETY: both sets are valid for SIGSET_SIZE bytes.
    let result = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::c_long::from(libc::SIG_SETMASK),
            &mask,
            &mut old,
            SIGSET_SIZE,
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(old)
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
