//! The nodes of a cluster on the etcd store (etcd only: a local store has
//! one node). Each node's keeper keeps it registered (a key bound to a
//! lease it renews), so that `reclaim` can give back what a node holds
//! once its registration has been gone for longer than any network
//! partition the operator tolerates, counted by the reclaimer's clock
//! from when a reclaimer first saw it gone (never by a time the node
//! wrote: its clock may be wrong). A node reclaimed is fenced in the same
//! transactions: its containers may still use the addresses given back,
//! so its ADDs and STATUS are refused until an operator who has drained
//! it runs `readmit`.
//!
//! ```text
//! PREFIX/nodes/NODE/alive    the keeper's registration, under its lease
//! PREFIX/nodes/NODE/seen     when its keeper last registered it or withdrew it
//! PREFIX/nodes/NODE/gone     when a reclaimer first saw the registration gone
//! PREFIX/nodes/NODE/fenced   when reclaim gave back what the node held
//! ```
//!
//! A keeper writes only when it registers and when it stops: its renewals
//! are lease keep-alives, so an idle node adds no revision to etcd's
//! history. Every release `reclaim` makes holds only while the node's
//! registration is still absent (one more condition of its transaction):
//! a node whose keeper comes back in the middle keeps what it has not
//! lost yet. What writes says so in its name; the rest only reads.

pub mod first_sight;
pub mod keeper;
pub mod reclaim;

use std::collections::BTreeMap;

use serde_json::Value;

use super::clock;
use super::store::fence::Fence;
use crate::etcd::{EtcdClient, EtcdError};

/// What the cluster knows of a node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeState {
    /// Whether its keeper's registration is there (its lease alive).
    pub alive: bool,
    /// When a reclaimer first saw its registration gone, seconds since
    /// the epoch by that reclaimer's clock.
    pub gone: Option<u64>,
    /// The fence `reclaim` put on it, if one is there.
    pub fence: Option<Fence>,
}

/// Every node a keeper ever registered, by name, as the cluster has them
/// now.
pub fn states(client: &EtcdClient) -> Result<BTreeMap<String, NodeState>, EtcdError> {
    let prefix = format!("{}/nodes/", client.settings().prefix);
    let mut states: BTreeMap<String, NodeState> = BTreeMap::new();
    for kv in client.with_prefix(prefix.as_bytes())? {
        let Some(rest) = kv.key.strip_prefix(prefix.as_bytes()) else {
            continue;
        };
        let Some((node, which)) = std::str::from_utf8(rest)
            .ok()
            .and_then(|r| r.split_once('/'))
        else {
            continue;
        };
        let state = states.entry(node.to_owned()).or_default();
        match which {
            "alive" => state.alive = true,
            "gone" => {
                let value: Option<Value> = serde_json::from_slice(&kv.value).ok();
                // Unreadable: as if first seen gone now.
                state.gone = Some(
                    value
                        .and_then(|v| v.get("since")?.as_u64())
                        .unwrap_or_else(clock::now),
                );
            }
            "fenced" => state.fence = Some(Fence::from_kv(node, &kv)),
            _ => {}
        }
    }
    Ok(states)
}
