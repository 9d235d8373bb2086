//! A workload's hold: what keeps a workload's addresses for it from one
//! of its containers to the next, for `stickyFor` after the last; taken
//! over by the workload's next ADD, and once its time is up, ended when
//! someone needs its addresses.

use super::clock;
use super::error::PoolError;
use super::store::{Owner, Store, WorkloadHold, ATTEMPTS};

/// The hold `owner`'s workload has for its interface, which this ADD may
/// take over: none if it has none, or if the hold's time was up (given
/// back now). One that another container of the workload still uses (its
/// attachment's record is there: not yet DELeted) is try again later.
pub(super) fn hold_to_take_over(
    store: &dyn Store,
    owner: &Owner,
) -> Result<Option<WorkloadHold>, PoolError> {
    let Some(workload) = &owner.workload else {
        return Ok(None);
    };
    for _ in 0..ATTEMPTS {
        let Some(hold) = store.workload_hold(workload, &owner.ifname)? else {
            return Ok(None);
        };
        let other = hold.container.as_ref().filter(|id| **id != owner.id);
        if let Some(id) = other {
            if store.allocation(&hold.node, id, &owner.ifname)?.is_some() {
                let addresses: Vec<String> =
                    hold.held.iter().map(|h| h.address.to_string()).collect();
                return Err(PoolError::Busy(format!(
                    "workload {workload}'s addresses ({}) are held by its container {id} ({}) on node {}, not deleted yet",
                    addresses.join(", "),
                    owner.ifname,
                    hold.node
                )));
            }
        }
        if hold.ends(false).is_some_and(|end| end > clock::now()) {
            return Ok(Some(hold));
        }
        if store.end_hold(&hold)? {
            return Ok(None);
        }
    }
    Err(PoolError::Busy(format!(
        "workload {workload}'s hold changed under every one of {ATTEMPTS} attempts to read it"
    )))
}

/// The holds whose time is up (their container gone, their `stickyFor`
/// over): no longer holds, but their addresses are not given back yet.
pub(super) fn ended_holds(store: &dyn Store) -> Result<Vec<WorkloadHold>, PoolError> {
    let now = clock::now();
    let mut ended = Vec::new();
    for hold in store.workload_holds()? {
        let bound_alive = match &hold.container {
            Some(id) => store.allocation(&hold.node, id, &hold.ifname)?.is_some(),
            None => false,
        };
        if hold.ends(bound_alive).is_some_and(|end| end <= now) {
            ended.push(hold);
        }
    }
    Ok(ended)
}

/// Ends every hold whose time is up: how many it ended.
pub(super) fn sweep_ended_holds(store: &dyn Store) -> Result<usize, PoolError> {
    let mut ended = 0;
    for hold in ended_holds(store)? {
        if store.end_hold(&hold)? {
            ended += 1;
        }
    }
    Ok(ended)
}
