//! ipam-da-neutron: the allocation delegate whose addresses are ports of
//! a network controller (OpenStack Networking's port API); run by hand,
//! its command line is an operator's (show, release).

use std::process::ExitCode;

use ipam_delegated::da_neutron::{self, PortAllocator};
use ipam_delegated::{logging, skel};

/// A plugin call's memory, with no mapping and unmapping per allocation.
#[global_allocator]
static ALLOCATOR: ipam_delegated::Arena = ipam_delegated::Arena::new();

fn main() -> ExitCode {
    logging::init("ipam-da-neutron");
    ipam_delegated::forbid_core_dumps();
    // Concurrent invocations share the log file; the pid tells them apart.
    let _invocation = tracing::debug_span!("ipam-da-neutron", pid = std::process::id()).entered();
    skel::serve(&PortAllocator, || {
        da_neutron::command_line(std::env::args_os().skip(1))
    })
}
