//! ipam-ds-static: the selection delegate. It picks the pools an
//! attachment's addresses come from, by rules over CNI_ARGS and
//! runtimeConfig, and hands them to the allocator as `pools`.

use std::process::ExitCode;

use ipam_delegated::ds_static::{self, Selector};
use ipam_delegated::{logging, skel};

/// A plugin call's memory, with no mapping and unmapping per allocation.
#[global_allocator]
static ALLOCATOR: ipam_delegated::Arena = ipam_delegated::Arena::new();

fn main() -> ExitCode {
    logging::init("ipam-ds-static");
    ipam_delegated::forbid_core_dumps();
    // Concurrent invocations share the log file; the pid tells them apart.
    let _invocation = tracing::debug_span!("ipam-ds-static", pid = std::process::id()).entered();
    skel::serve(&Selector, || {
        ds_static::PROGRAM.main(std::env::args_os().skip(1))
    })
}
