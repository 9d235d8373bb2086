//! ipam-da-pool: the allocation delegate. It gives one address from each
//! pool asked for and keeps who holds it, in local files or in etcd; run
//! by hand, its command line is an operator's (show, check, release, a
//! node's keeper, reclaim, import, migrate).

use std::process::ExitCode;

use ipam_delegated::da_pool::{self, Allocator};
use ipam_delegated::{logging, skel};

/// A plugin call's memory, with no mapping and unmapping per allocation.
#[global_allocator]
static ALLOCATOR: ipam_delegated::Arena = ipam_delegated::Arena::new();

fn main() -> ExitCode {
    logging::init("ipam-da-pool");
    ipam_delegated::forbid_core_dumps();
    // Concurrent invocations share the log file; the pid tells them apart.
    let _invocation = tracing::debug_span!("ipam-da-pool", pid = std::process::id()).entered();
    skel::serve(&Allocator, || {
        da_pool::command_line(std::env::args_os().skip(1))
    })
}
