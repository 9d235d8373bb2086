//! The plugins as users run them: with Debian's real IPAM plugins as
//! delegates, under the runtimes (libcni, podman, containerd), and under
//! parallel load and termination requests.

// The harness every test binary and the pools bench share: each uses
// the part it needs.
#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;

mod real_plugins;
mod runtimes;
mod stress;
