//! ipam-delegated-docker: the Docker driver `ipam-delegated docker-plugin`
//! starts, a binary of its own so that the CNI plugin carries none of it.
//! It serves libnetwork's remote IPAM API from the CNI stack until SIGTERM.

use std::process::ExitCode;

use ipam_delegated::{docker, logging};

fn main() -> ExitCode {
    logging::init("ipam-delegated-docker");
    ipam_delegated::forbid_core_dumps();
    docker::command_line(std::env::args_os().skip(1))
}
