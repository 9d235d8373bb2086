//! ipam-delegated and the plugins released with it: a CNI IPAM
//! meta-plugin that runs a stack of IPAM delegates, a selector and an
//! allocator to stack under it, and a Docker driver that serves the same
//! stacks. Each binary (`src/main.rs`, ipam-delegated's, and those of
//! `src/bin`) is a short `main` over one module here.
//!
//! Data flows one way in every binary: the environment and stdin are read
//! once into [`cni`] types (by [`skel`]), the command runs against them,
//! and one reply, or one error object, is written at the end. Each part
//! fails with its own error enum, which knows its CNI code and wraps the
//! errors of the parts below it that it calls, never one above it;
//! [`skel`] writes the reply from any of them.

// The protocol: what every plugin speaks, and how a binary serves it.
pub mod cni;
pub mod skel;

// The plugins, each in the module named as it is, and the Docker driver.
pub mod da_neutron;
pub mod da_pool;
pub mod delegated;
pub mod docker;
pub mod ds_static;

// Shared by the plugins.
mod addr;
pub mod args;
mod dir;
mod etcd;
mod http;
pub mod logging;
mod netd;
mod node_name;
mod pools;
mod secret;
mod signals;
mod sys;

pub use sys::Arena;

/// Makes the process undumpable, first thing in every binary: a root
/// process that holds passwords and tokens leaves no core file when it
/// aborts, and no other process of its user may read its memory.
pub fn forbid_core_dumps() {
    if let Err(e) = sys::forbid_core_dumps() {
        tracing::warn!("core dumps could not be forbidden (PR_SET_DUMPABLE): {e}");
    }
}
