//! How ipam-da-pool refuses: a pool with no free address, an address
//! that cannot be given or is not held, a store that is not ready or
//! moved, other nodes in the way, this node fenced. The reply type gives each its code.

/// A refusal of the allocator.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A pool has no free address.
    #[error("pool {pool:?} has no free address")]
    Exhausted { pool: String },

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
}
