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
    let ending = holds_to_end(node, holds, &done.allocations, dry_run, |hold, id| {
        Ok(store.allocation(&hold.node, id, &hold.ifname)?.is_some())
    })?;
    for hold in ending {
        if dry_run {
            done.holds.push(hold);
            continue;
        }
        // As it is now: releasing its attachment changed it.
        match store.workload_hold(&hold.workload, &hold.ifname)? {
            Some(now) if still_to_end(&now, node, &hold) => {
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

/// The holds of `holds` that reclaiming `node` ends, besides those
/// ended with their attachments: the node's own, released there or bound
/// to a container whose attachment is gone, and never one bound to a
/// container that lives (`bound_alive`: whether the attachment of
/// container ID that the hold is bound to is there). `released` are the
/// attachments given back (in a dry run, to give back); a dry run lists
/// their holds too, since nothing ended them.
fn holds_to_end(
    node: &str,
    holds: &[WorkloadHold],
    released: &[Allocation],
    dry_run: bool,
    mut bound_alive: impl FnMut(&WorkloadHold, &str) -> Result<bool, PoolError>,
) -> Result<Vec<WorkloadHold>, PoolError> {
    let is_released = |id: &str, ifname: &str| {
        released
            .iter()
            .any(|h| h.owner.id == id && h.owner.ifname == ifname)
    };
    let mut ending = Vec::new();
    for hold in holds {
        let bound_to_released = hold
            .container
            .as_ref()
            .is_some_and(|id| is_released(id, &hold.ifname));
        let bound_elsewhere = match &hold.container {
            Some(id) if !bound_to_released => bound_alive(hold, id)?,
            _ => false,
        };
        // Ended already with its attachment, unless this is a dry run.
        if bound_to_released && !dry_run {
            continue;
        }
        let of_node = hold.node == node || bound_to_released;
        if of_node && !bound_elsewhere {
            ending.push(hold.clone());
        }
    }
    Ok(ending)
}

/// Whether `now`, a hold as read again just before reclaim ends it, is
/// still the one it chose (`chosen`): still `node`'s, and bound to no
/// container or to the same one. A live node may have taken it over
/// since, and its container must keep the addresses.
fn still_to_end(now: &WorkloadHold, node: &str, chosen: &WorkloadHold) -> bool {
    now.node == node && (now.container.is_none() || now.container == chosen.container)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::da_pool::store::Owner;

    /// Workload `workload`'s hold on node `node`, bound to `container`.
    fn hold(workload: &str, node: &str, container: Option<&str>) -> WorkloadHold {
        WorkloadHold {
            workload: workload.into(),
            ifname: "eth0".into(),
            node: node.into(),
            held: Vec::new(),
            container: container.map(String::from),
            until: None,
            sticky_for: 60,
            since: 0,
            revision: 1,
        }
    }

    fn attachment(id: &str, ifname: &str, node: &str) -> Allocation {
        Allocation {
            owner: Owner {
                id: id.into(),
                ifname: ifname.into(),
                node: node.into(),
                workload: None,
            },
            held: Vec::new(),
            revision: 1,
            since: 0,
            legacy: false,
            record: None,
        }
    }

    fn workloads(holds: &[WorkloadHold]) -> Vec<&str> {
        holds.iter().map(|h| h.workload.as_str()).collect()
    }

    #[test]
    fn reclaim_ends_the_dead_nodes_holds_that_no_living_container_is_bound_to() {
        let holds = [
            hold("released-here", "dead", None),
            hold("bound-to-gone", "dead", Some("c-gone")),
            hold("bound-to-living", "dead", Some("c-living")),
            hold("bound-to-released", "dead", Some("c-released")),
            hold("other-ifname", "dead", Some("c-other")),
            hold("elsewhere", "live", None),
            hold("elsewhere-bound", "live", Some("c-live")),
        ];
        // c-other/eth0 lives: the attachment released is its net1.
        let released = [
            attachment("c-released", "eth0", "dead"),
            attachment("c-other", "net1", "dead"),
        ];
        let mut asked = Vec::new();
        let mut bound_alive = |hold: &WorkloadHold, id: &str| {
            asked.push(id.to_owned());
            Ok(matches!(id, "c-living" | "c-other" | "c-live") && hold.ifname == "eth0")
        };
        let ending = holds_to_end("dead", &holds, &released, false, &mut bound_alive).unwrap();
        assert_eq!(workloads(&ending), ["released-here", "bound-to-gone"]);
        // A dry run lists the holds its attachments would end with them.
        let ending = holds_to_end("dead", &holds, &released, true, &mut bound_alive).unwrap();
        assert_eq!(
            workloads(&ending),
            ["released-here", "bound-to-gone", "bound-to-released"]
        );
        // The containers of the attachments released are not looked for.
        assert!(!asked.iter().any(|id| id == "c-released"), "{asked:?}");
    }

    #[test]
    fn a_hold_is_ended_only_if_it_is_still_the_dead_nodes_and_bound_as_it_was() {
        let chosen = hold("web", "dead", Some("c1"));
        assert!(still_to_end(&chosen, "dead", &chosen));
        // Released since, by the dead node's last DEL.
        assert!(still_to_end(&hold("web", "dead", None), "dead", &chosen));
        // Taken over by a container on a live node, or on the dead node
        // by another container.
        assert!(!still_to_end(
            &hold("web", "live", Some("c2")),
            "dead",
            &chosen
        ));
        assert!(!still_to_end(&hold("web", "live", None), "dead", &chosen));
        assert!(!still_to_end(
            &hold("web", "dead", Some("c2")),
            "dead",
            &chosen
        ));
    }
}
