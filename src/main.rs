//! ipam-delegated: as a CNI plugin (CNI_COMMAND set), reads the CNI_*
//! environment and the stdin configuration, runs each `ipam.delegates`
//! entry in order from CNI_PATH (the `delegated::delegate` module),
//! threading `prevResult` through the chain and rolling back with DEL on
//! failure, and writes the one reply; otherwise, its command line (agent
//! mode, the doctor, install, the Docker driver).

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
