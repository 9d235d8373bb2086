//! The pool plugins, ipam-ds-static and ipam-da-pool, through their built
//! binaries: on the local store (each command, many processes at once,
//! allocators killed at random instants), on etcd clusters the tests start
//! (nodes sharing pools, members failing, TLS), and as operators run them
//! (sticky addresses, node keepers and reclaim, show, check and release),
//! and beside the previous release on one cluster.

// The harness every test binary and the pools bench share: each uses
// the part it needs.
#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;

mod cluster;
mod cooldown;
mod etcd;
mod local;
mod metrics;
mod operating;
mod round_trips;
mod upgrade;
