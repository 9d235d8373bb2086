//! The Docker driver, ipam-delegated-docker, under a real dockerd.

// The harness every test binary and the pools bench share: each uses
// the part it needs.
#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;

mod dockerd;
mod driver;
