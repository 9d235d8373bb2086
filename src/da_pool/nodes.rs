//! Nodes of a cluster on the etcd store: each node's keeper keeps it
//! registered (a key bound to a lease it renews), so that `reclaim` can
//! give back what a node holds once its registration has been gone for
//! longer than any network partition the operator tolerates, counted by
//! the reclaimer's clock from when a reclaimer first saw it gone (never
//! by a time the node wrote: its clock may be wrong). A node reclaimed is
//! fenced in the same transactions: its containers may still use the
//! addresses given back, so its ADDs and STATUS are refused until an
//! operator who has drained it runs `readmit`.
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
//! lost yet.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use serde_json::{json, Value};

use super::etcd::Etcd;
use super::store::{self, Hold, Holding, Store};
use super::PoolError;
use crate::error::Error;
use crate::etcd::{Client, Compare, Kv, Op};
use crate::signals;

/// How long a keeper waits before it tries again after etcd failed it.
const RETRY: Duration = Duration::from_secs(1);

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

/// A node's fence: `reclaim` gave back what it held at `at` (seconds
/// since the epoch); read at `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub node: String,
    pub at: u64,
    pub revision: i64,
}

impl Fence {
    fn read(node: &str, kv: &Kv) -> Fence {
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
            store::utc(self.at),
            self.node
        ))
    }
}

/// Key `which` of node `node`.
pub fn node_key(prefix: &str, node: &str, which: &str) -> Vec<u8> {
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
        let state = states.entry(node.to_owned()).or_default();
        match which {
            "alive" => state.alive = true,
            "gone" => {
                let value: Option<Value> = serde_json::from_slice(&kv.value).ok();
                // Unreadable: as if first seen gone now.
                state.gone = Some(
                    value
                        .and_then(|v| v.get("since")?.as_u64())
                        .unwrap_or_else(store::now),
                );
            }
            "fenced" => state.fence = Some(Fence::read(node, &kv)),
            _ => {}
        }
    }
    Ok(states)
}

/// The fence on node `node`, if there is one.
pub fn fence(client: &Client, node: &str) -> Result<Option<Fence>, Error> {
    let key = node_key(&client.settings().prefix, node, "fenced");
    Ok(client.get(&key)?.map(|kv| Fence::read(node, &kv)))
}

/// The nodes to reclaim now, each with when it was first seen gone: those
/// whose registration has been gone for at least `dead_for` seconds by
/// this machine's clock. A node seen gone for the first time is recorded
/// so (while its registration is still absent), and counted from now.
pub fn dead(
    client: &Client,
    states: &BTreeMap<String, NodeState>,
    dead_for: u64,
) -> Result<Vec<(String, u64)>, Error> {
    let now = store::now();
    let prefix = &client.settings().prefix;
    let mut dead = Vec::new();
    for (node, state) in states.iter().filter(|(_, s)| !s.alive) {
        let since = match state.gone {
            Some(since) => since,
            None => {
                let key = node_key(prefix, node, "gone");
                let sight = json!({"node": node, "since": now});
                let first = client.txn(
                    &[
                        Compare::Absent(node_key(prefix, node, "alive")),
                        Compare::Absent(key.clone()),
                    ],
                    &[Op::Put(key, sight.to_string().into_bytes())],
                )?;
                if !first {
                    // Back meanwhile, or seen by another reclaimer: next time.
                    continue;
                }
                now
            }
        };
        if now.saturating_sub(since) >= dead_for {
            dead.push((node.clone(), since));
        }
    }
    Ok(dead)
}

/// Keeps node `node` registered in the cluster `client` reaches, its
/// registration outliving the last renewal by `ttl` seconds, until a
/// termination request: then the registration is withdrawn (the node
/// counts as gone at once, but reclaim still waits for its `--dead-for`).
/// Says what it does on `log`, and, at every renewal, that the node is
/// fenced while it is. Idle between renewals, in one poll(2).
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
                    say_fence(client, node, log);
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
            Some(id) => match client.keep_lease(id) {
                Ok(Some(_)) => {
                    say_fence(client, node, log);
                    renew_every
                }
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
        client.txn(&[], &[seen_op(&prefix, node)])?;
        client.revoke_lease(id)?;
    }
    let _ = writeln!(
        log,
        "ipam-da-pool node-keeper: stopped; node {node}'s registration withdrawn"
    );
    Ok(())
}

/// Says on `log`, as an error, that `node` is fenced, if it is: a read,
/// which adds nothing to etcd's history.
fn say_fence(client: &Client, node: &str, log: &mut dyn Write) {
    match fence(client, node) {
        Ok(None) => {}
        Ok(Some(fence)) => {
            let _ = writeln!(log, "ipam-da-pool node-keeper: error: {}", fence.refusal());
        }
        Err(e) => {
            let _ = writeln!(
                log,
                "ipam-da-pool node-keeper: cannot read whether node {node} is fenced: {e}"
            );
        }
    }
}

/// Registers `node` under a new lease of `ttl` seconds, no longer gone:
/// the lease's ID.
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
        Op::Delete(node_key(prefix, node, "gone")),
    ];
    client.txn(&[], &ops)?;
    Ok(id)
}

/// What keeps a node known once its lease is gone: when its keeper last
/// registered or withdrew it, by its own clock (said, never counted).
fn seen_op(prefix: &str, node: &str) -> Op {
    let record = json!({"node": node, "seen": store::now()});
    Op::Put(
        node_key(prefix, node, "seen"),
        record.to_string().into_bytes(),
    )
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
/// is still absent, and fencing the node in the same transaction.
pub fn reclaim(
    store: &mut Etcd,
    node: &str,
    holdings: &[Holding],
    holds: &[Hold],
    dry_run: bool,
) -> Result<Reclaimed, Error> {
    let prefix = store.client().settings().prefix.clone();
    let fence = json!({"node": node, "at": store::now()});
    store.set_guard(
        vec![Compare::Absent(node_key(&prefix, node, "alive"))],
        vec![Op::Put(
            node_key(&prefix, node, "fenced"),
            fence.to_string().into_bytes(),
        )],
    );
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
            Some(id) if !released(id, &hold.ifname) => {
                store.holding(&hold.node, id, &hold.ifname)?.is_some()
            }
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
    store.set_guard(Vec::new(), Vec::new());
    Ok(done)
}
