//! ipam-delegated: as a CNI plugin (CNI_COMMAND set), reads the CNI_*
//! environment and the stdin configuration, runs each `ipam.delegates`
//! entry in order from CNI_PATH (the `delegated::delegate` module),
//! threading `prevResult` through the chain and rolling back with DEL on
//! failure, and writes the one reply; otherwise, its command line (agent
//! mode, the doctor, the Docker driver, install).

use std::process::ExitCode;

use ipam_delegated::args::Program;
use ipam_delegated::delegated::{self, Delegated};
use ipam_delegated::{docker, logging, skel};

/// Its command line: the plugin's own verbs, and `docker-plugin`, which
/// the Docker driver defines and whose binary it runs.
const COMMAND_LINE: Program = Program {
    verbs: &[
        delegated::ENSURE,
        delegated::RELEASE,
        delegated::DOCTOR,
        docker::DOCKER_PLUGIN,
        delegated::INSTALL,
    ],
    ..delegated::PROGRAM
};

/// A plugin call's memory, with no mapping and unmapping per allocation.
#[global_allocator]
static ALLOCATOR: ipam_delegated::Arena = ipam_delegated::Arena::new();

fn main() -> ExitCode {
    logging::init("ipam-delegated");
    ipam_delegated::forbid_core_dumps();
    // Concurrent invocations share the log file; the pid tells them apart.
    let _invocation = tracing::debug_span!("ipam-delegated", pid = std::process::id()).entered();
    tracing::debug!(version = env!("CARGO_PKG_VERSION"), "started");
    skel::serve(&Delegated::from_process(), || {
        COMMAND_LINE.main(std::env::args_os().skip(1))
    })
}
