//! Termination requests: SIGTERM and SIGINT are taken by a watcher thread
//! instead of killing the plugin mid-stack, so that the running delegate is
//! stopped and an ADD rolled back before the plugin answers. Requests are
//! counted: a first one stops what the runtime asked for, a second one also
//! cuts the rollback short.

use std::io;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Told of each termination request while a delegate runs.
type Listener = Box<dyn Fn() + Send>;

/// How many termination requests have come.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The last one's signal number.
static LAST: AtomicI32 = AtomicI32::new(0);

/// Who to tell, while a delegate runs.
static LISTENER: Mutex<Option<Listener>> = Mutex::new(None);

/// Takes SIGTERM and SIGINT away from their default (ending the process)
/// for the rest of the process; later calls do nothing. Call it before
/// starting any other thread, so that every thread inherits the block;
/// delegates do not, since std::process clears the signal mask of the
/// processes it starts.
pub fn watch() -> io::Result<()> {
    static WATCHING: OnceLock<Result<(), i32>> = OnceLock::new();
    (*WATCHING.get_or_init(start_watching)).map_err(io::Error::from_raw_os_error)
}

fn start_watching() -> Result<(), i32> {
    let set = termination_signals();
    // SAFETY: `set` is an initialised sigset_t; a null old-set pointer is allowed.
    let blocked = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if blocked != 0 {
        return Err(blocked);
    }
    let watcher = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut signal = 0;
            // SAFETY: both pointers are valid for the call.
            if unsafe { libc::sigwait(&set, &mut signal) } == 0 {
                LAST.store(signal, Ordering::SeqCst);
                COUNT.fetch_add(1, Ordering::SeqCst);
                if let Ok(listener) = LISTENER.lock() {
                    if let Some(tell) = listener.as_ref() {
                        tell();
                    }
                }
            }
        });
    watcher
        .map(drop)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))
}

/// The signal of the latest request, if at least `count` have come.
pub fn received(count: usize) -> Option<i32> {
    (COUNT.load(Ordering::SeqCst) >= count).then(|| LAST.load(Ordering::SeqCst))
}

/// Tells `listener` of each termination request until the guard is
/// dropped. Check [`received`] after this: a request that came just before
/// is not repeated, and one that comes after reaches the listener.
pub fn listen(listener: impl Fn() + Send + 'static) -> Listening {
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
