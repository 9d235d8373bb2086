//! ipam-da-neutron, the allocation delegate whose addresses come from a
//! network controller's port API (OpenStack Networking, and the
//! controllers that copy it): one port per attachment and pool asked for
//! (`prevResult.pools`, as a selector prints them, else
//! `ipam.neutron.default`), found again rather than made twice, deleted
//! on DEL, verified on CHECK, and deleted on GC when the runtime no
//! longer knows its attachment, on this node only. Nothing is kept on the
//! node that the addresses depend on: the controller is the record, and
//! every port says whose it is.

mod add;
mod age;
mod api;
mod cli;
mod error;
mod keystone;
mod orphans;
mod ports;
mod settings;
mod state;
mod status;
mod teardown;
mod warm;
mod wire;

use std::io::Write;

use crate::cni::{Environment, NetConf};
use crate::skel::{self, Plugin};
use settings::Settings;

pub use error::NeutronError;

/// Runs the command line `args` (without the program name), for when the
/// binary is not run as a CNI plugin.
pub fn command_line(args: impl IntoIterator<Item = std::ffi::OsString>) -> std::process::ExitCode {
    cli::PROGRAM.main(args)
}

/// ipam-da-neutron as a CNI plugin.
pub struct PortAllocator;

impl Plugin for PortAllocator {
    type Error = NeutronError;

    fn add(
        &self,
        env: &Environment,
        net: NetConf,
        stdout: &mut dyn Write,
    ) -> Result<(), NeutronError> {
        let settings = Settings::from_net(&net)?;
        let result = add::add(env, &net, &settings)?;
        Ok(skel::write_reply(stdout, &result)?)
    }

    /// Reads no pool and no node name: a mistake in them must never
    /// stop a teardown.
    fn del(&self, env: &Environment, net: NetConf) -> Result<(), NeutronError> {
        teardown::del(env, &net, &Settings::for_teardown(&net)?)
    }

    fn check(&self, env: &Environment, net: NetConf) -> Result<(), NeutronError> {
        teardown::check(env, &net, &Settings::from_net(&net)?)
    }

    /// Reads no pool: a mistake in one must never stop a teardown.
    fn gc(&self, _env: &Environment, net: NetConf) -> Result<(), NeutronError> {
        let settings = Settings::for_teardown(&net)?;
        let valid = crate::pools::valid_attachments(&net)?;
        teardown::gc(&net, &settings, &valid)
    }

    fn status(&self, _env: &Environment, net: NetConf) -> Result<(), NeutronError> {
        status::status(&Settings::from_net(&net)?)
    }
}
