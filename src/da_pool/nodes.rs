//! Nodes of a cluster on the etcd store: each node's keeper keeps it
//! registered (a key bound to a lease it renews, and when it was last
//! seen), so that `reclaim` can give back what a node holds once its
//! registration is gone, and it was last seen longer ago than any network
//! partition the operator tolerates.
//!
//! ```text
//! PREFIX/nodes/NODE/alive    the keeper's registration, under its lease
//! PREFIX/nodes/NODE/seen     when the keeper last renewed it
//! ```
//!
//! Every release `reclaim` makes holds only while the node's registration
//! is still absent (one more condition of its transaction): a node whose
//! keeper comes back in the middle keeps what it has not lost yet.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use serde_json::{json, Value};

use super::etcd::Etcd;
use super::store::{self, Hold, Holding, Store};
use crate::error::Error;
use crate::etcd::{Client, Compare, Op};
use crate::signals;

/// How long a keeper waits before it tries again after etcd failed it.
const RETRY: Duration = Duration::from_secs(1);

/// What the cluster knows of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeState {
    /// Whether its keeper's registration is there (its lease alive).
    pub alive: bool,
    /// When its keeper last renewed it, seconds since the epoch, by the
    /// keeper's clock.
    pub seen: Option<u64>,
}

fn node_key(prefix: &str, node: &str, which: &str) -> Vec<u8> {
    format!("{prefix}/nodes/{node}/{which}").into_bytes()
}

/// Every node a keeper ever registered, by name.
pub fn states(client: &Client) -> Result<BTreeMap<String, NodeState>, Error> {
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
        let state = states.entry(node.to_owned()).or_insert(NodeState {
            alive: false,
            seen: None,
        });
        match which {
            "alive" => state.alive = true,
            "seen" => {
                let value: Option<Value> = serde_json::from_slice(&kv.value).ok();
                state.seen = value.and_then(|v| v.get("seen")?.as_u64());
            }
            _ => {}
        }
    }
    Ok(states)
}

/// The nodes to reclaim now: those whose registration is gone and that
/// were last seen at least `dead_for` seconds ago.
pub fn dead(states: &BTreeMap<String, NodeState>, dead_for: u64) -> Vec<(String, u64)> {
    let now = store::now();
    states
        .iter()
        .filter(|(_, s)| !s.alive)
        .filter_map(|(node, s)| Some((node.clone(), s.seen?)))
        .filter(|(_, seen)| now.saturating_sub(*seen) >= dead_for)
        .collect()
}

/// Keeps node `node` registered in the cluster `client` reaches, its
/// registration outliving the last renewal by `ttl` seconds, until a
/// termination request: then the registration is withdrawn (the node
/// counts as gone at once, but reclaim still waits for its `--dead-for`).
/// Says what it does on `log`. Idle between renewals, in one poll(2).
pub fn keep(client: &Client, node: &str, ttl: u64, log: &mut dyn Write) -> Result<(), Error> {
    if let Err(e) = signals::watch() {
        // SIGTERM then ends it where it stands; its lease runs out.
        let _ = writeln!(
            log,
            "ipam-da-pool node-keeper: SIGTERM and SIGINT will end it at once: {e}"
        );
    }
    let prefix = client.settings().prefix.clone();
    let renew_every = Duration::from_secs(ttl / 3).max(Duration::from_secs(1));
    let mut lease: Option<i64> = None;
    while signals::received(1).is_none() {
        let pause = match lease {
            None => match register(client, &prefix, node, ttl) {
                Ok(id) => {
                    let _ = writeln!(
                        log,
                        "ipam-da-pool node-keeper: node {node} registered (lease {id:x}, TTL {ttl} s)"
                    );
                    lease = Some(id);
                    renew_every
                }
                Err(e) => {
                    let _ = writeln!(
                        log,
                        "ipam-da-pool node-keeper: cannot register node {node}: {e}"
                    );
                    RETRY
                }
            },
            Some(id) => match client.keep_lease(id).and_then(|kept| {
                if kept.is_some() {
                    seen(client, &prefix, node)?;
                }
                Ok(kept)
            }) {
                Ok(Some(_)) => renew_every,
                Ok(None) => {
                    let _ = writeln!(
                        log,
                        "ipam-da-pool node-keeper: node {node}'s lease ended (etcd out of reach for longer than its TTL?): registering again"
                    );
                    lease = None;
                    continue;
                }
                Err(e) => {
                    let _ = writeln!(
                        log,
                        "ipam-da-pool node-keeper: cannot renew node {node}'s lease: {e}"
                    );
                    RETRY
                }
            },
        };
        signals::wait(pause);
    }
    if let Some(id) = lease {
        seen(client, &prefix, node)?;
        client.revoke_lease(id)?;
    }
    let _ = writeln!(
        log,
        "ipam-da-pool node-keeper: stopped; node {node}'s registration withdrawn"
    );
    Ok(())
}

/// Registers `node` under a new lease of `ttl` seconds: the lease's ID.
fn register(client: &Client, prefix: &str, node: &str, ttl: u64) -> Result<i64, Error> {
    let id = client.grant_lease(ttl)?;
    let registration = json!({"node": node, "pid": std::process::id(), "since": store::now()});
    let ops = [
        Op::PutLeased(
            node_key(prefix, node, "alive"),
            registration.to_string().into_bytes(),
            id,
        ),
        seen_op(prefix, node),
    ];
    client.txn(&[], &ops)?;
    Ok(id)
}

fn seen_op(prefix: &str, node: &str) -> Op {
    let record = json!({"node": node, "seen": store::now()});
    Op::Put(
        node_key(prefix, node, "seen"),
        record.to_string().into_bytes(),
    )
}

fn seen(client: &Client, prefix: &str, node: &str) -> Result<(), Error> {
    client.txn(&[], &[seen_op(prefix, node)]).map(drop)
}

/// What `reclaim` gave back (or, dry, would give back) of one node.
#[derive(Debug, Default)]
pub struct Reclaimed {
    /// The attachments released.
    pub holdings: Vec<Holding>,
    /// The workloads' holds ended (those of released attachments included).
    pub holds: Vec<Hold>,
    /// What changed meanwhile and was left alone (the node came back, or
    /// its runtime released it first).
    pub skipped: usize,
}

/// Gives back, unless `dry_run`, what node `node` holds in `store`'s
/// network: its attachments, the holds of their workloads, and the holds
/// it released last; each change made only while the node's registration
/// is still absent.
pub fn reclaim(
    store: &mut Etcd,
    node: &str,
    holdings: &[Holding],
    holds: &[Hold],
    dry_run: bool,
) -> Result<Reclaimed, Error> {
    let prefix = store.client().settings().prefix.clone();
    store.set_guard(vec![Compare::Absent(node_key(&prefix, node, "alive"))]);
    let mut done = Reclaimed::default();
    for holding in holdings.iter().filter(|h| h.owner.node == node) {
        if dry_run {
            done.holdings.push(holding.clone());
            continue;
        }
        if store.release(holding)? {
            done.holdings.push(holding.clone());
        } else {
            done.skipped += 1;
        }
    }
    // A hold no live container has bound: its node's, released there last
    // (those of the attachments just released among them).
    let released = |id: &str, ifname: &str| {
        done.holdings
            .iter()
            .any(|h| h.owner.id == id && h.owner.ifname == ifname)
    };
    let mut ending: Vec<Hold> = Vec::new();
    for hold in holds {
        let bound_elsewhere = match &hold.container {
            Some(id) if !released(id, &hold.ifname) => store.holding(id, &hold.ifname)?.is_some(),
            _ => false,
        };
        let of_node = hold.node == node
            || hold
                .container
                .as_ref()
                .is_some_and(|id| released(id, &hold.ifname));
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
        match store.hold(&hold.workload, &hold.ifname)? {
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
    store.set_guard(Vec::new());
    Ok(done)
}
