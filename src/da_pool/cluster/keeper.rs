//! A node's keeper (`ipam-da-pool node-keeper`): keeps the node
//! registered under a lease it renews by keep-alives, which write
//! nothing; says at every renewal that the node is fenced while it is;
//! withdraws the registration when asked to stop.

use std::io::Write;
use std::time::Duration;

use serde_json::json;

use crate::da_pool::clock;
use crate::da_pool::store::fence::{self, node_key};
use crate::etcd::{EtcdClient, EtcdError, Op};
use crate::signals;

/// How long a keeper waits before it tries again after etcd failed it.
const RETRY: Duration = Duration::from_secs(1);

/// Keeps node `node` registered in the cluster `client` reaches, its
/// registration outliving the last renewal by `ttl` seconds, until a
/// termination request: then the registration is withdrawn (the node
/// counts as gone at once, but reclaim still waits for its `--dead-for`).
/// Says what it does on `log`, and, at every renewal, that the node is
/// fenced while it is. Idle between renewals, in one poll(2).
pub fn keep(
    client: &EtcdClient,
    node: &str,
    ttl: u64,
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

/// Registers `node` under a new lease of `ttl` seconds, no longer gone:
/// the lease's ID.
fn register(client: &EtcdClient, prefix: &str, node: &str, ttl: u64) -> Result<i64, EtcdError> {
    let id = client.grant_lease(ttl)?;
    let registration = json!({"node": node, "pid": std::process::id(), "since": clock::now()});
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
    let record = json!({"node": node, "seen": clock::now()});
    Op::Put(
        node_key(prefix, node, "seen"),
        record.to_string().into_bytes(),
    )
}
