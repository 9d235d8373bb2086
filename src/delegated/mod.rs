//! ipam-delegated, the meta-plugin: its `delegate` module runs the
//! configuration's stack of IPAM delegates in order, hands each one's
//! result to the next as `prevResult`, answers with the last one's result,
//! and undoes the stack when an ADD fails. Run by hand, its verbs keep
//! addresses for node agents (agent mode), check a configuration (the
//! doctor) and install the family.

pub(crate) mod agent;
mod cli;
pub mod config;
pub(crate) mod delegate;
mod doctor;
mod error;
mod install;

use std::io::Write;

use tracing::warn;

/// Its own verbs, and its command line as they make it.
pub use cli::{DOCTOR, ENSURE, INSTALL, PROGRAM, RELEASE};
/// For the fuzz targets: what a delegate's exit status and output amount to.
pub use delegate::{judge, Printed};
pub use error::{DelegatedError, Failure};

use crate::cni::{Environment, NetConf};
use crate::skel::{self, Plugin};
use config::Config;
use delegate::{Chain, Delegate, Processes, PARENT_VARIABLE};

/// ipam-delegated as a CNI plugin: each command runs the configuration's
/// stack of delegates.
pub struct Delegated {
    /// The pid of the ipam-delegated that started this one, if one did.
    parent: Option<String>,
}

impl Delegated {
    /// The plugin as this process was started: by a runtime, or by
    /// itself, which its stack must not be.
    pub fn from_process() -> Self {
        // Set, and not empty, only by an ipam-delegated that started this one.
        let parent = std::env::var_os(PARENT_VARIABLE)
            .filter(|p| !p.is_empty())
            .map(|p| p.to_string_lossy().into_owned());
        Delegated { parent }
    }

    /// What every command needs: the plugin's own keys checked, and the
    /// delegates looked up in CNI_PATH (each found, or why not). A plugin
    /// started by itself refuses at once.
    fn stack<'a>(
        &self,
        env: &Environment,
        net: NetConf<'a>,
    ) -> Result<(Stack<'a>, Vec<Found>), DelegatedError> {
        if let Some(parent) = &self.parent {
            return Err(DelegatedError::Recursion {
                parent: parent.clone(),
            });
        }
        let config = Config::from_net(net)?;
        let found = delegate::resolve_each(&config.delegates, &env.path);
        let runner = Processes::default();
        Ok((Stack { config, runner }, found))
    }
}

/// A delegate looked up in CNI_PATH, or why it was not found.
type Found = Result<Delegate, DelegatedError>;

impl Plugin for Delegated {
    type Error = DelegatedError;

    /// A result that cannot be written is undone: the runtime would never
    /// learn of the address.
    fn add(
        &self,
        env: &Environment,
        net: NetConf,
        stdout: &mut dyn Write,
    ) -> Result<(), DelegatedError> {
        let (stack, found) = self.stack(env, net)?;
        let delegates = delegate::all(found)?;
        let chain = stack.chain();
        let result = chain.add(&delegates)?;
        skel::write_reply(stdout, &result).map_err(|e| {
            warn!("the result could not be written ({e}): undoing the ADD");
            DelegatedError::from(e).with_rollback(chain.undo(&delegates, &result))
        })
    }

    fn del(&self, env: &Environment, net: NetConf) -> Result<(), DelegatedError> {
        let (stack, found) = self.stack(env, net)?;
        stack.chain().del(found)
    }

    fn check(&self, env: &Environment, net: NetConf) -> Result<(), DelegatedError> {
        let (stack, found) = self.stack(env, net)?;
        stack.chain().check(&delegate::all(found)?)
    }

    /// Agent mode's attachments are kept from GC, under their lock.
    fn gc(&self, env: &Environment, net: NetConf) -> Result<(), DelegatedError> {
        let (stack, found) = self.stack(env, net)?;
        let protected = agent::protect_from_gc(&stack.config)?;
        stack.chain().gc(protected.input(&stack.config.net), found)
    }

    fn status(&self, env: &Environment, net: NetConf) -> Result<(), DelegatedError> {
        let (stack, found) = self.stack(env, net)?;
        stack.chain().status(&delegate::all(found)?)
    }
}

/// A configuration's stack of delegates, run as processes.
struct Stack<'a> {
    config: Config<'a>,
    runner: Processes,
}

impl Stack<'_> {
    fn chain(&self) -> Chain<'_, Processes> {
        Chain::new(&self.config.net, &self.runner, self.config.timeout)
    }
}
