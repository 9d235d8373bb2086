//! When a reclaimer first sees a node's registration gone: the sight is
//! recorded (`PREFIX/nodes/NODE/gone`, by the reclaimer's clock), and a
//! node counts as dead once it has been gone for long enough from then,
//! whatever time the node itself wrote. `reclaim` and `check` both
//! record it, as `operating-pools.md` says; the keeper clears it when the
//! node registers again.

use std::collections::BTreeMap;

use serde_json::json;

use super::NodeState;
use crate::da_pool::store::fence::node_key;
use crate::etcd::{Compare, EtcdClient, EtcdError, Op};

/// Writes, for each node of `states` whose registration is gone and that
/// no reclaimer saw gone before, that it was first seen gone at `now`
/// (each only while its registration is still absent and no other
/// reclaimer wrote first), and notes it in `states`. A node back
/// meanwhile, or seen by another reclaimer, is left for the next time.
pub fn record_first_sights(
    client: &EtcdClient,
    states: &mut BTreeMap<String, NodeState>,
    now: u64,
) -> Result<(), EtcdError> {
    let prefix = &client.settings().prefix;
    for (node, state) in states.iter_mut() {
        if state.alive || state.gone.is_some() {
            continue;
        }
        let key = node_key(prefix, node, "gone");
        let sight = json!({"node": node, "since": now});
        let first = client.txn(
            &[
                Compare::Absent(node_key(prefix, node, "alive")),
                Compare::Absent(key.clone()),
            ],
            &[Op::Put(key, sight.to_string().into_bytes())],
        )?;
        if first {
            state.gone = Some(now);
        }
    }
    Ok(())
}

/// The nodes of `states` whose registration has been gone for at least
/// `dead_for` seconds at `now`, each with when it was first seen gone:
/// what `reclaim` gives back from, and `check` names. Reads nothing.
pub fn gone_for(
    states: &BTreeMap<String, NodeState>,
    dead_for: u64,
    now: u64,
) -> Vec<(String, u64)> {
    states
        .iter()
        .filter(|(_, state)| !state.alive)
        .filter_map(|(node, state)| Some((node.clone(), state.gone?)))
        .filter(|(_, since)| now.saturating_sub(*since) >= dead_for)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_dead_once_gone_for_long_enough_since_first_seen_so() {
        let state = |alive: bool, gone: Option<u64>| NodeState {
            alive,
            gone,
            fence: None,
        };
        let states = BTreeMap::from([
            ("alive".to_owned(), state(true, Some(0))),
            ("never-seen-gone".to_owned(), state(false, None)),
            ("long-gone".to_owned(), state(false, Some(100))),
            ("just-gone".to_owned(), state(false, Some(990))),
        ]);
        assert_eq!(
            gone_for(&states, 60, 1_000),
            [("long-gone".to_owned(), 100)]
        );
        assert_eq!(gone_for(&states, 10, 1_000).len(), 2);
        // A live node is never dead, whenever it was once seen gone.
        assert!(gone_for(&states, 0, 1_000)
            .iter()
            .all(|(n, _)| n != "alive"));
    }
}
