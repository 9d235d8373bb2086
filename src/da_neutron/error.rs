//! How ipam-da-neutron fails: what the controller refused or could not
//! do, told in its own words and under the code `ipam-da-pool` gives the
//! same situation; a controller out of reach; an attachment that is not
//! as ADD left it; and what it meets on its way (a configuration the
//! protocol refuses, the node's name, a file given on its command line,
//! the warm pool's ledger).

use crate::cni::{self, code, Reportable};
use crate::dir::DirError;
use crate::netd::ConfigFileError;
use crate::node_name::NodeNameError;
use crate::signals::Interrupted;

/// A failure of the allocator.
#[derive(Debug, thiserror::Error)]
pub enum NeutronError {
    /// A network, subnet or port (or application credential) the
    /// settings name does not exist.
    #[error("{peer} has no {what}: {message}")]
    Missing {
        what: String,
        /// Who said so: "the controller at URL", "Keystone at URL".
        peer: String,
        message: String,
    },

    /// The network (or subnet) has no free address.
    #[error("{what} has no free address: {message}")]
    Exhausted { what: String, message: String },

    /// The controller refused a port for its project's quota: an
    /// exhaustion, as a network without a free address is.
    #[error("{peer} refused {call} for the project's quota: {message}")]
    OverQuota {
        peer: String,
        call: String,
        message: String,
    },

    /// The address asked for cannot be given.
    #[error("{address} cannot be given from {what}: {why}")]
    AddressUnavailable {
        address: String,
        what: String,
        why: String,
    },

    /// The controller (or Keystone) refused the token, or its policy the
    /// call (401, 403).
    #[error("{peer} refused {call}: {message}")]
    Refused {
        peer: String,
        call: String,
        message: String,
    },

    /// The controller refused a request as malformed (400, 409 …): a
    /// setting it does not take.
    #[error("{peer} rejected {call}: {message}")]
    Rejected {
        peer: String,
        call: String,
        message: String,
    },

    /// The controller could not be reached, or failed (5xx), or took
    /// longer than the timeout: the runtime should try again.
    #[error("{peer} is out of reach ({call}): {reason}: try again later")]
    Unreachable {
        peer: String,
        call: String,
        reason: String,
    },

    /// A list's next page is linked outside the API's root as configured:
    /// the rest of the list cannot be read.
    #[error(
        "{peer} links the next page of {call} at {link}, outside \"ipam.neutron.url\": \
         set \"url\" to the root its links use (Neutron's network_link_prefix, or a \
         proxy's path); a list read in part would hide ports"
    )]
    Unfollowable {
        peer: String,
        call: String,
        link: String,
    },

    /// TLS could not be agreed with the controller or Keystone: a CA that
    /// did not sign its certificate, a name it does not have, a plain-HTTP
    /// port given as https://.
    #[error("TLS with {peer} failed: {reason}: check \"ipam.neutron.tls\" and the URL's scheme")]
    Tls { peer: String, reason: String },

    /// A termination request came while the controller or Keystone was
    /// awaited.
    #[error(transparent)]
    Interrupted(#[from] Interrupted),

    /// CHECK: the attachment is not as ADD left it.
    #[error("{0}")]
    NotHeld(String),

    /// STATUS: an ADD could not succeed now.
    #[error("not available: {0}")]
    NotAvailable(String),

    /// The configuration breaks a rule (the protocol's, or `ipam.neutron`'s).
    #[error(transparent)]
    Config(#[from] cni::Error),

    /// The node's name, pinned in a file.
    #[error(transparent)]
    NodeName(#[from] NodeNameError),

    /// A file given on an operator's command line.
    #[error(transparent)]
    ConfigFile(#[from] ConfigFileError),

    /// The warm pool's ledger under `dataDir` could not be read, written
    /// or locked.
    #[error("the warm pool's ledger: {0}")]
    Ledger(#[from] DirError),
}

impl Reportable for NeutronError {
    fn code(&self) -> u32 {
        match self {
            NeutronError::Missing { .. }
            | NeutronError::Rejected { .. }
            | NeutronError::Unfollowable { .. } => code::INVALID_CONFIG,
            NeutronError::Exhausted { .. } | NeutronError::OverQuota { .. } => code::POOL_EXHAUSTED,
            NeutronError::AddressUnavailable { .. } => code::ADDRESS_UNAVAILABLE,
            NeutronError::Refused { .. } | NeutronError::Tls { .. } => code::IO_FAILURE,
            NeutronError::Unreachable { .. } => code::TRY_AGAIN_LATER,
            NeutronError::Interrupted(e) => e.code(),
            NeutronError::NotHeld(_) => code::NOT_HELD,
            NeutronError::NotAvailable(_) => code::NOT_AVAILABLE,
            NeutronError::Config(e) => e.code(),
            NeutronError::NodeName(e) => e.code(),
            NeutronError::ConfigFile(e) => e.code(),
            NeutronError::Ledger(e) => e.code(),
        }
    }
}
