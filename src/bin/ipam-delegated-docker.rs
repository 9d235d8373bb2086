//! ipam-delegated-docker: the Docker driver `ipam-delegated docker-plugin`
//! starts, a binary of its own so that the CNI plugin carries none of it.
//! It serves libnetwork's remote IPAM API from the CNI stack until SIGTERM.

use std::process::ExitCode;

use ipam_delegated::{docker_command_line, init_logging};

fn main() -> ExitCode {
    init_logging("ipam-delegated-docker");
    docker_command_line(std::env::args_os().skip(1))
}
