//! Reclaim and readmit: what a dead (or decommissioned) node held given
//! back, each change made only while its registration is still absent and
//! fencing the node in the same transaction; and the fence lifted once an
//! operator has drained the node.

use serde_json::json;

use crate::da_pool::clock;
use crate::da_pool::error::PoolError;
use crate::da_pool::store::fence::{self, node_key, Fence};
use crate::da_pool::store::{Allocation, EtcdStore, Guard, Released, Store, WorkloadHold};
use crate::etcd::{Compare, EtcdClient, Op};

/// What `reclaim` gave back (or, dry, would give back) of one node.
#[derive(Debug, Default)]
pub struct Reclaimed {
    /// The attachments released.
    pub allocations: Vec<Allocation>,
    /// The workloads' holds ended (those of released attachments included).
    pub holds: Vec<WorkloadHold>,
    /// What changed meanwhile and was left alone (the node came back, or
    /// its runtime released it first).
    pub skipped: usize,
}

/// Gives back, unless `dry_run`, what node `node` holds in `store`'s
/// network (`allocations` and `holds` as read): its attachments, the
/// holds of their workloads, and the holds it released last. Writes
/// through a view of the store guarded for this node alone: each change
/// made only while the node's registration is still absent, and fencing
/// the node in the same transaction.
pub fn reclaim(
    store: &EtcdStore,
    node: &str,
    allocations: &[Allocation],
    holds: &[WorkloadHold],
    dry_run: bool,
) -> Result<Reclaimed, PoolError> {
    let prefix = &store.client().settings().prefix;
    let fence = json!({"node": node, "at": clock::now()});
    let store = store.guarded(Guard {
        compares: vec![Compare::Absent(node_key(prefix, node, "alive"))],
        also: vec![Op::Put(
            fence::key(prefix, node),
            fence.to_string().into_bytes(),
        )],
    });
    let mut done = Reclaimed::default();
    for allocation in allocations.iter().filter(|h| h.owner.node == node) {
        if dry_run {
            done.allocations.push(allocation.clone());
            continue;
        }
        // Its workload's hold, if bound to it, ends with it: the fenced
        // node's container may still use the addresses, which the
        // workload's next container, elsewhere, must not take over.
        match store.release_ending_hold(allocation)? {
            Released::Done(ended) => {
                done.allocations.push(allocation.clone());
                done.holds.extend(ended);
            }
            Released::Changed => done.skipped += 1,
        }
    }
    // A hold no live container has bound: its node's, released there last
    // (in a dry run, those of the attachments to release among them).
    let released = |id: &str, ifname: &str| {
        done.allocations
            .iter()
            .any(|h| h.owner.id == id && h.owner.ifname == ifname)
    };
    let mut ending: Vec<WorkloadHold> = Vec::new();
    for hold in holds {
        let bound_elsewhere = match &hold.container {
            Some(id) if !released(id, &hold.ifname) => {
                store.allocation(&hold.node, id, &hold.ifname)?.is_some()
            }
            _ => false,
        };
        let bound_to_released = hold
            .container
            .as_ref()
            .is_some_and(|id| released(id, &hold.ifname));
        // Ended already with its attachment, unless this is a dry run.
        if bound_to_released && !dry_run {
            continue;
        }
        let of_node = hold.node == node || bound_to_released;
        if of_node && !bound_elsewhere {
            ending.push(hold.clone());
        }
    }
    for hold in ending {
        if dry_run {
            done.holds.push(hold);
            continue;
        }
        // As it is now: releasing its attachment changed it.
        match store.workload_hold(&hold.workload, &hold.ifname)? {
            // Still this node's: a live node may have taken it over since.
            Some(now)
                if now.node == node
                    && (now.container.is_none() || now.container == hold.container) =>
            {
                if store.end_hold(&now)? {
                    done.holds.push(now);
                } else {
                    done.skipped += 1;
                }
            }
            _ => done.skipped += 1,
        }
    }
    Ok(done)
}

/// Whether [`readmit`] lifted the fence.
#[derive(Debug, PartialEq, Eq)]
pub enum Readmitted {
    /// Lifted, and the node's first sight as gone forgotten.
    Lifted,
    /// Not: the node is not registered, so the next reclaim would take
    /// it again at once. Its keeper must run first.
    NotRegistered,
}

/// Lifts `fence`, as it was read, so that its node's ADDs and STATUS
/// succeed again, only while the node is registered (its keeper runs),
/// and forgets when it was first seen gone, in the same transaction: a
/// node readmitted while its keeper is down would be reclaimed again at
/// the next run. `Busy` if the fence changed meanwhile (reclaimed again).
pub fn readmit(client: &EtcdClient, fence: &Fence) -> Result<Readmitted, PoolError> {
    let prefix = &client.settings().prefix;
    let key = fence::key(prefix, &fence.node);
    let alive = node_key(prefix, &fence.node, "alive");
    let lifted = client.txn(
        &[
            Compare::Unchanged(key.clone(), fence.revision),
            Compare::Present(alive.clone()),
        ],
        &[
            Op::Delete(key),
            Op::Delete(node_key(prefix, &fence.node, "gone")),
        ],
    )?;
    if lifted {
        return Ok(Readmitted::Lifted);
    }
    if client.get(&alive)?.is_none() {
        return Ok(Readmitted::NotRegistered);
    }
    Err(PoolError::Busy(format!(
        "node {}'s fence changed while it was lifted (reclaimed again?)",
        fence.node
    )))
}
