//! Starting a delegate: a clone(2) that shares the parent's memory until
//! the child execs (as vfork), in a process group of its own, with only the
//! signals that have handlers reset and the ones asked for unblocked, and,
//! if asked, sent SIGTERM when the thread that started it ends first.

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

use super::wait;

/// What [`spawn`] gives the new process besides its program and environment.
pub struct Start<'a> {
    /// Its arguments after the program's name (none for a CNI call).
    pub args: &'a [&'a CStr],
    /// Its stdin, stdout and stderr; descriptors above 2.
    pub stdio: [BorrowedFd<'a>; 3],
    /// Signals blocked in this thread that the program must start with unblocked.
    pub unblock: &'a [libc::c_int],
    /// Whether the program gets SIGTERM when the calling thread ends
    /// before it (prctl's parent-death signal), for work that must not go
    /// on unsupervised: see [`spawn`].
    pub stop_with_starter: bool,
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
///
/// With `start.stop_with_starter`, the program is sent SIGTERM when the
/// calling thread ends before it. A runtime that kills the plugin outright
/// kills only the plugin; a GC's delegate would run on, unsupervised, with
/// a list of live attachments that the runtime's next ADDs make stale, and
/// free their addresses. Only the program gets it, not what it started.
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
    let argv: Vec<*const libc::c_char> = std::iter::once(program)
        .chain(start.args.iter().copied())
        .map(CStr::as_ptr)
        .chain([std::ptr::null()])
        .collect();
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
        // SAFETY: getpid has no preconditions.
        parent: unsafe { libc::getpid() },
        program: program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        stdio,
        stop_with_starter: start.stop_with_starter,
        mask,
        reset: handled_signals(),
        error: AtomicI32::new(0),
    };
    // Its stack, for the moments before exec: it only makes system calls.
    // A region of ours, as musl's posix_spawn has it: we are suspended,
    // and this frame outlives the child's use, whereas an allocation of
    // this size is a mapping made and unmapped for every delegate under
    // musl's malloc.
    let mut stack = MaybeUninit::<[u128; CHILD_STACK / 16]>::uninit();
    // SAFETY: one past the end of the region, 16-byte aligned, as the
    // stack grows down.
    let top = unsafe { stack.as_mut_ptr().add(1) };
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
    /// The process starting it: if its parent is another by the time the
    /// parent-death signal is set, the starter is already gone.
    parent: libc::pid_t,
    stop_with_starter: bool,
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
    // SAFETY: prctl, getppid, setpgid and dup2 have no memory effects; the
    // descriptors are open, and above 2, so no dup2 overwrites another's source.
    unsafe {
        if child.stop_with_starter {
            // Set before the check, so that a starter that dies between
            // the two is seen by one or the other. The signal is an
            // unsigned long, and every argument is passed.
            let term = libc::SIGTERM as libc::c_ulong;
            if libc::prctl(libc::PR_SET_PDEATHSIG, term, 0_u64, 0_u64, 0_u64) != 0 {
                child_failed(child);
            }
            if libc::getppid() != child.parent {
                libc::_exit(128 + libc::SIGTERM);
            }
        }
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
