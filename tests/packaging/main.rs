//! What ships: the static plugin's size, the release notes, and
//! documentation whose every relative link and anchor resolves.

// The harness every test binary and the pools bench share: each uses
// the part it needs.
#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;

mod help;
mod install;
mod links;
mod release;
mod size;
mod units;
