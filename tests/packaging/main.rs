//! What ships: the static plugin's size and what its processes map, the
//! alert rules' cases, the
//! release archive, the image and its installer, every binary's command
//! line and manual page, the release notes, and documentation whose every
//! relative link and anchor resolves.

// The harness every test binary and the pools bench share: each uses
// the part it needs.
#[allow(dead_code)]
#[path = "../common/mod.rs"]
mod common;

// The static build the README's Install makes, which the bench uses too.
#[path = "../../benches/support/static_build.rs"]
mod static_build;

mod alerts;
mod deb;
mod help;
mod image;
mod install;
mod kubernetes;
mod links;
mod memory;
mod release;
mod size;
mod units;
