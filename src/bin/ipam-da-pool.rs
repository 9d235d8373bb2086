//! ipam-da-pool: the allocation delegate. It gives one address from each
//! pool asked for and keeps who holds it, in local files or in etcd.

use std::process::ExitCode;

use ipam_delegated::{init_logging, skel, Allocator};

fn main() -> ExitCode {
    init_logging("ipam-da-pool");
    skel::serve(&Allocator, || {
        skel::about(
            "ipam-da-pool",
            "a CNI IPAM plugin that allocates addresses from pools, on local files or etcd",
        )
    })
}
