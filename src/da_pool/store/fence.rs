//! Where a node's keys are on etcd (`PREFIX/nodes/NODE/WHICH`), and the
//! fence among them (etcd only: a local store has one node, never
//! reclaimed). The fence is the store's to honour: every claim of a node
//! needs it absent, and the node's ADDs and STATUS answer with why until
//! `readmit` lifts it; `reclaim` writes it in the same transactions as it
//! gives back what the node held. The other keys (the keeper's
//! registration, when the node was first seen gone) are the cluster's
//! (`da_pool::cluster`), which finds them here: the cluster's code uses
//! the store's, never the other way round.

use serde_json::Value;

use crate::da_pool::clock;
use crate::da_pool::error::PoolError;
use crate::etcd::{EtcdClient, EtcdError, Kv};

/// Key `which` of node `node`: `PREFIX/nodes/NODE/WHICH`.
pub fn node_key(prefix: &str, node: &str, which: &str) -> Vec<u8> {
    format!("{prefix}/nodes/{node}/{which}").into_bytes()
}

/// Node `node`'s fence: `PREFIX/nodes/NODE/fenced`.
pub fn key(prefix: &str, node: &str) -> Vec<u8> {
    node_key(prefix, node, "fenced")
}

/// A node's fence: `reclaim` gave back what it held at `at` (seconds
/// since the epoch); read at `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub node: String,
    pub at: u64,
    pub revision: i64,
}

impl Fence {
    /// The fence of `node`, as its key `kv` says.
    pub fn from_kv(node: &str, kv: &Kv) -> Fence {
        let value: Option<Value> = serde_json::from_slice(&kv.value).ok();
        Fence {
            node: node.to_owned(),
            at: value.and_then(|v| v.get("at")?.as_u64()).unwrap_or(0),
            revision: kv.mod_revision,
        }
    }

    /// What the node's STATUS and ADDs answer, and the way out.
    pub fn refusal(&self) -> PoolError {
        PoolError::Fenced(format!(
            "node {} is fenced: `ipam-da-pool reclaim` gave back its addresses at {} while its registration was gone, and its containers may still use them; drain the node, then lift the fence with `ipam-da-pool readmit --config PATH --node {}`",
            self.node,
            clock::utc(self.at),
            self.node
        ))
    }
}

/// The fence on node `node`, if there is one.
pub fn read(client: &EtcdClient, node: &str) -> Result<Option<Fence>, EtcdError> {
    let key = key(&client.settings().prefix, node);
    Ok(client.get(&key)?.map(|kv| Fence::from_kv(node, &kv)))
}
