//! The CNI protocol, as every plugin of the crate speaks it: the commands
//! and the spec versions that have them, the environment a runtime sets
//! and its rules, the error object and its codes, a network
//! configuration's common keys (kept as written, `prevResult` spliced in),
//! and results converted between versions. It depends on nothing else in
//! the crate.

mod command;
mod config;
mod env;
mod error;
mod json;
mod result;
mod version;

pub use command::Command;
pub use config::{version_for_reply, NetConf};
#[cfg(test)]
pub use env::add_with_args;
pub use env::{
    check_container_id, check_ifname, is_identifier, path_outside_runtime, search_path,
    Environment, IDENTIFIER_RULE,
};
pub use error::{code, error_object, Error, Reportable};
pub use json::{check_object, is_object, string, Members};
pub use result::{in_version, ips_after, ConversionError};
pub use version::{check_command, supported, version_result, NEWEST, SUPPORTED};
