//! ipam-ds-static: the selection delegate. It picks the pools an
//! attachment's addresses come from, by rules over CNI_ARGS and
//! runtimeConfig, and hands them to the allocator as `pools`.

use std::process::ExitCode;

use ipam_delegated::{init_logging, skel, Selector};

fn main() -> ExitCode {
    init_logging("ipam-ds-static");
    skel::serve(&Selector, || {
        skel::about(
            "ipam-ds-static",
            "a CNI IPAM plugin that selects the pools an attachment's addresses come from",
        )
    })
}
