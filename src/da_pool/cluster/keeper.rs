//! A node's keeper (`ipam-da-pool node-keeper`): keeps the node
//! registered under a lease it renews by keep-alives, which write
//! nothing, beside any other keeper of the node; says at every renewal
//! that the node is fenced while it is; withdraws the registration, if it
//! is its own, when asked to stop.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;

use crate::da_pool::clock;
use crate::da_pool::store::fence::{self, node_key};
use crate::etcd::{Compare, EtcdClient, EtcdError, Op};
use crate::signals;

/// How long a keeper waits before it tries again after etcd failed it.
const RETRY: Duration = Duration::from_secs(1);

/// Keeps node `node` registered in the cluster `client` reaches, its
/// registration outliving the last renewal by `ttl` seconds, until a
/// termination request: then the registration is withdrawn if it is this
/// keeper's (the node counts as gone at once, but reclaim still waits for
/// its `--dead-for`). Says what it does on `log`, and, at every renewal,
/// that the node is fenced while it is. Each renewal that finds the node
/// registered sets `renewed` to the time of day, in seconds since the
/// epoch, for the node's metrics. Idle between renewals, in one poll(2).
///
/// Several keepers of one node (a service and a DaemonSet, a run by hand)
/// share its one registration: a keeper registers the node only when it
/// is not registered, under its own lease, and checks at every renewal
/// (a read, which adds nothing to etcd's history) that it still is,
/// registering it again if not. Stopping deletes the registration only if
/// it is on the stopping keeper's lease. So while any keeper runs, the
/// node is never unregistered for longer than a renewal's interval.
pub fn keep(
    client: &EtcdClient,
    node: &str,
    ttl: u64,
    renewed: &AtomicU64,
    log: &mut dyn Write,
) -> Result<(), EtcdError> {
    if let Err(e) = signals::watch() {
        // SIGTERM then ends it where it stands; its lease runs out.
        let _ = writeln!(
            log,
            "ipam-da-pool node-keeper: SIGTERM and SIGINT will end it at once: {e}"
        );
    }
    let prefix = client.settings().prefix.clone();
    let renew_every = renewal_interval(ttl);
    let mut lease: Option<i64> = None;
    // How this keeper last found the registration: none yet on this lease.
    let mut found: Option<Registration> = None;
    while signals::received(1).is_none() {
        let kept = match lease {
            None => client.grant_lease(ttl).map(|id| {
                lease = Some(id);
                Some(id)
            }),
            Some(id) => client.keep_lease(id).map(|kept| kept.map(|_| id)),
        };
        let pause = match kept {
            Ok(Some(id)) => match registered(client, &prefix, node, id) {
                Ok(now) => {
                    // Said when it registers, and when it first finds
                    // another keeper's registration.
                    if now == Registration::Made || found.is_none() {
                        let _ =
                            writeln!(log, "ipam-da-pool node-keeper: {}", now.said(node, id, ttl));
                    }
                    found = Some(now);
                    renewed.store(clock::now(), Ordering::Relaxed);
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
            Ok(None) => {
                let _ = writeln!(
                    log,
                    "ipam-da-pool node-keeper: node {node}'s lease ended (etcd out of reach for longer than its TTL?): registering again"
                );
                lease = None;
                found = None;
                continue;
            }
            Err(e) => {
                let _ = writeln!(
                    log,
                    "ipam-da-pool node-keeper: cannot {} node {node}'s lease: {e}",
                    if lease.is_some() { "renew" } else { "get" }
                );
                RETRY
            }
        };
        // A request that came during a call was read by it: not waited for.
        if signals::received(1).is_none() {
            signals::sleep(pause);
        }
    }
    // Withdrawing answers the request: its calls are not stopped by it.
    signals::take_in_hand();
    let mut said = "no registration of its own to withdraw";
    if let Some(id) = lease {
        // Withdrawn only if it is this keeper's: another's stays.
        let alive = node_key(&prefix, node, "alive");
        let withdrawn = client.txn(
            &[Compare::LeasedTo(alive.clone(), id)],
            &[Op::Delete(alive), seen_op(&prefix, node)],
        )?;
        client.revoke_lease(id)?;
        if withdrawn {
            said = "registration withdrawn";
        }
    }
    let _ = writeln!(
        log,
        "ipam-da-pool node-keeper: stopped; node {node}'s {said}"
    );
    Ok(())
}

/// Who holds a node's registration, as a keeper finds it at a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Registration {
    /// It registered the node now.
    Made,
    /// It is there, this keeper's or another's.
    There,
}

impl Registration {
    /// What a keeper says when it finds this, on lease `id`.
    fn said(self, node: &str, id: i64, ttl: u64) -> String {
        match self {
            Registration::Made => {
                format!("node {node} registered (lease {id:x}, TTL {ttl} s)")
            }
            Registration::There => {
                format!("node {node} is registered; keeping watch (lease {id:x}, TTL {ttl} s)")
            }
        }
    }
}

/// How often a keeper renews a lease of `ttl` seconds: three times in
/// its life, so that one renewal may fail and the next still comes in
/// time; never more than once a second.
fn renewal_interval(ttl: u64) -> Duration {
    Duration::from_secs(ttl / 3).max(Duration::from_secs(1))
}

/// Makes sure `node` is registered: reads its registration (which adds
/// nothing to etcd's history) and, only if it is gone, registers it under
/// lease `lease`, no longer gone.
fn registered(
    client: &EtcdClient,
    prefix: &str,
    node: &str,
    lease: i64,
) -> Result<Registration, EtcdError> {
    let alive = node_key(prefix, node, "alive");
    if client.get(&alive)?.is_some() {
        return Ok(Registration::There);
    }
    let registration = json!({"node": node, "pid": std::process::id(), "since": clock::now()});
    let ops = [
        Op::PutLeased(alive.clone(), registration.to_string().into_bytes(), lease),
        seen_op(prefix, node),
        Op::Delete(node_key(prefix, node, "gone")),
    ];
    // Another keeper may register it meanwhile: then it is there.
    Ok(match client.txn(&[Compare::Absent(alive)], &ops)? {
        true => Registration::Made,
        false => Registration::There,
    })
}

/// Says on `log`, as an error, that `node` is fenced, if it is: a read,
/// which adds nothing to etcd's history.
fn say_fence(client: &EtcdClient, node: &str, log: &mut dyn Write) {
    match fence::read(client, node) {
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

/// What keeps a node known once its lease is gone: when its keeper last
/// registered or withdrew it, by its own clock (said, never counted).
fn seen_op(prefix: &str, node: &str) -> Op {
    let record = json!({"node": node, "seen": clock::now()});
    Op::Put(
        node_key(prefix, node, "seen"),
        record.to_string().into_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_renewed_three_times_in_its_life_at_most_once_a_second() {
        let every = |ttl| renewal_interval(ttl).as_secs();
        assert_eq!((every(9), every(10), every(30)), (3, 3, 10));
        assert_eq!((every(2), every(0)), (1, 1));
    }
}
