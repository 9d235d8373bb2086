//! How ipam-da-pool fails: a pool with no free address, an address that
//! cannot be given or is not held, a store that is not ready or moved,
//! other nodes in the way, this node fenced; and what it meets on its
//! way: a configuration the protocol refuses, the etcd cluster, its
//! files, the node's name, a file given on its command line. Each knows
//! its CNI code.

use crate::cni::{self, code, Reportable};
use crate::dir::DirError;
use crate::etcd::EtcdError;
use crate::netd::ConfigFileError;
use crate::node_name::NodeNameError;

/// A failure of the allocator.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A pool has no free address, but maybe some that cool down.
    #[error("pool {pool:?} has no free address{cooling}")]
    Exhausted { pool: String, cooling: Cooldowns },

    /// The address asked for cannot be given; nothing was claimed.
    #[error("{address} cannot be given from pool {pool:?}: {why}")]
    AddressUnavailable {
        address: String,
        pool: String,
        why: String,
    },

    /// CHECK: an address of the previous result is not the attachment's.
    #[error("{address} is not held by {id}/{ifname}: {why}")]
    NotHeld {
        address: String,
        id: String,
        ifname: String,
        why: String,
    },

    /// CHECK: the attachment holds an address the previous result lacks.
    #[error(
        "{id}/{ifname} holds {address} (pool {pool:?}), which the previous result does not list"
    )]
    NotListed {
        address: String,
        pool: String,
        id: String,
        ifname: String,
    },

    /// CHECK: the attachment holds nothing in this network.
    #[error("{id}/{ifname} holds no address in this network")]
    NothingHeld { id: String, ifname: String },

    /// Other nodes kept changing what the command needed: try again later.
    #[error("{0}: try again later")]
    Busy(String),

    /// `reclaim` gave back what this node held while it was out of reach:
    /// its ADDs and STATUS are refused until an operator readmits it.
    #[error("{0}")]
    Fenced(String),

    /// STATUS: an ADD could not succeed now.
    #[error("not available: {0}")]
    NotAvailable(String),

    /// The network's local records were moved into etcd by `ipam-da-pool
    /// import`: this node must be configured for the cluster now. Until
    /// it is, try again later.
    #[error("this network's reservations were moved into etcd ({marker} says so): the node's configuration must name the etcd cluster now; try again later (remove that file to allocate from local files again)")]
    Moved {
        /// The marker file `import` left.
        marker: std::path::PathBuf,
    },

    /// The configuration breaks a rule (the protocol's, or `ipam.pool`'s).
    #[error(transparent)]
    Config(#[from] cni::Error),

    /// The etcd cluster the records are kept in.
    #[error(transparent)]
    Etcd(#[from] EtcdError),

    /// The local store's files, or its lock.
    #[error(transparent)]
    Files(#[from] DirError),

    /// The node's name, pinned in a file.
    #[error(transparent)]
    NodeName(#[from] NodeNameError),

    /// A file given on an operator's command line.
    #[error(transparent)]
    ConfigFile(#[from] ConfigFileError),
}

impl PoolError {
    /// Whether a claim that failed so may have been recorded all the same
    /// (see [`EtcdError::may_have_landed`]).
    pub(crate) fn may_have_landed(&self) -> bool {
        matches!(self, PoolError::Etcd(e) if e.may_have_landed())
    }
}

impl Reportable for PoolError {
    fn code(&self) -> u32 {
        match self {
            PoolError::Exhausted { .. } => code::POOL_EXHAUSTED,
            PoolError::AddressUnavailable { .. } => code::ADDRESS_UNAVAILABLE,
            PoolError::NotHeld { .. }
            | PoolError::NotListed { .. }
            | PoolError::NothingHeld { .. } => code::NOT_HELD,
            PoolError::NotAvailable(_) | PoolError::Fenced(_) => code::NOT_AVAILABLE,
            PoolError::Busy(_) | PoolError::Moved { .. } => code::TRY_AGAIN_LATER,
            PoolError::Config(e) => e.code(),
            PoolError::Etcd(e) => e.code(),
            PoolError::Files(e) => e.code(),
            PoolError::NodeName(e) => e.code(),
            PoolError::ConfigFile(e) => e.code(),
        }
    }
}

/// The addresses of an exhausted pool that cool down after their release
/// (`ipam.pool.reuseAfter`): what its code 110 says of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cooldowns {
    /// How many.
    pub count: usize,
    /// When the first of them may be given again, seconds since the epoch.
    pub first_until: Option<u64>,
}

impl std::fmt::Display for Cooldowns {
    /// Nothing, for none; else how many, and when the first is free again.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(until) = self.first_until else {
            return Ok(());
        };
        write!(
            f,
            " now: {} of its addresses cool down after their release (\"ipam.pool.reuseAfter\"), the first until {}; `ipam-da-pool release --now ADDRESS` ends an address's cooldown",
            self.count,
            crate::da_pool::clock::utc(until)
        )
    }
}
