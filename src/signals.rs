//! Termination requests: SIGTERM and SIGINT are taken by a watcher thread
//! instead of killing the plugin mid-stack, so that the running delegate is
//! stopped and an ADD rolled back before the plugin answers.

use std::io;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

/// Told of a termination request while a delegate runs.
type Listener = Box<dyn Fn(i32) + Send>;

/// The first termination signal received, 0 while none has been.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// Who to tell, while a delegate that may be interrupted runs.
static LISTENER: Mutex<Option<Listener>> = Mutex::new(None);

/// Takes SIGTERM and SIGINT away from their default (ending the process)
/// for the rest of the process. Call it before starting any other thread,
/// so that every thread inherits the block; delegates do not, since
/// std::process clears the signal mask of the processes it starts.
pub fn watch() -> io::Result<()> {
    let set = termination_signals();
    // SAFETY: `set` is an initialised sigset_t; a null old-set pointer is allowed.
    let blocked = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if blocked != 0 {
        return Err(io::Error::from_raw_os_error(blocked));
    }
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut signal = 0;
            // SAFETY: both pointers are valid for the call.
            if unsafe { libc::sigwait(&set, &mut signal) } == 0 {
                let _ = RECEIVED.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
                if let Ok(listener) = LISTENER.lock() {
                    if let Some(tell) = listener.as_ref() {
                        tell(signal);
                    }
                }
            }
        })?;
    Ok(())
}

/// The termination signal the plugin has received, if any.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// Tells `listener` of termination requests until the guard is dropped.
/// Check [`received`] after this: a request that came just before is not
/// repeated, and one that comes after reaches the listener.
pub fn listen(listener: impl Fn(i32) + Send + 'static) -> Listening {
    if let Ok(mut slot) = LISTENER.lock() {
        *slot = Some(Box::new(listener));
    }
    Listening
}

/// Stops the listener of [`listen`] when dropped.
pub struct Listening;

impl Drop for Listening {
    fn drop(&mut self) {
        if let Ok(mut slot) = LISTENER.lock() {
            *slot = None;
        }
    }
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
