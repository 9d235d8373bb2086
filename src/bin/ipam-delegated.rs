//! ipam-delegated: as a CNI plugin (CNI_COMMAND set), reads the environment
//! and stdin, runs the stack and writes the one reply; otherwise, the
//! command line of agent mode and the doctor.

use std::process::ExitCode;

use ipam_delegated::delegated::{self, Delegated};
use ipam_delegated::{logging, skel};

fn main() -> ExitCode {
    logging::init("ipam-delegated");
    // Concurrent invocations share the log file; the pid tells them apart.
    let _invocation = tracing::debug_span!("ipam-delegated", pid = std::process::id()).entered();
    tracing::debug!(version = env!("CARGO_PKG_VERSION"), "started");
    skel::serve(&Delegated::from_process(), || {
        delegated::command_line(std::env::args_os().skip(1))
    })
}
