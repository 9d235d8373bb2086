//! etcd's transactions: the conditions, the writes made if they hold, and
//! the reads made instead if they do not, all in one request, so that a
//! claim that loses a race brings back what the next try needs.

use serde_json::{json, Value};

use super::base64::encode;
use super::{wire, EtcdClient, EtcdError, Kv};

/// A condition of a transaction.
#[derive(Debug, Clone)]
pub enum Compare {
    /// No such key.
    Absent(Vec<u8>),
    /// The key was last written at this revision (as read).
    Unchanged(Vec<u8>, i64),
    /// The key is bound to this lease.
    LeasedTo(Vec<u8>, i64),
    /// The key is there.
    Present(Vec<u8>),
    /// The key holds exactly this value.
    Holds(Vec<u8>, Vec<u8>),
}

/// A write of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put(Vec<u8>, Vec<u8>),
    /// A put whose key goes when the lease (its ID) does.
    PutLeased(Vec<u8>, Vec<u8>, i64),
    Delete(Vec<u8>),
}

/// A read a transaction makes when its conditions fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// One key, with its value.
    Key(Vec<u8>),
    /// The keys alone from `from` up to (not including) `to`, in order, at
    /// most `limit` of them.
    Keys {
        from: Vec<u8>,
        to: Vec<u8>,
        limit: usize,
    },
}

/// What a transaction did.
#[derive(Debug)]
pub struct Outcome {
    /// Whether its conditions held, and so its writes were made.
    pub succeeded: bool,
    /// The cluster's revision once it was done: its writes' own, if it
    /// made them.
    pub revision: i64,
    /// What each of its reads found, in order, if the conditions failed.
    pub read: Vec<Vec<Kv>>,
}

impl EtcdClient {
    /// Runs `ops` if every one of `compares` holds, all or nothing:
    /// whether they held.
    pub fn txn(&self, compares: &[Compare], ops: &[Op]) -> Result<bool, EtcdError> {
        Ok(self.txn_or_read(compares, ops, &[])?.succeeded)
    }

    /// Runs `ops` if every one of `compares` holds, all or nothing; if one
    /// does not, makes `reads` instead, in the same request and at the
    /// same revision.
    pub fn txn_or_read(
        &self,
        compares: &[Compare],
        ops: &[Op],
        reads: &[Read],
    ) -> Result<Outcome, EtcdError> {
        let compare: Vec<Value> = compares.iter().map(compare).collect();
        let success: Vec<Value> = ops.iter().map(write).collect();
        let mut request = json!({"compare": compare, "success": success});
        if !reads.is_empty() {
            request["failure"] = reads.iter().map(read).collect();
        }
        let answer: wire::Txn = self.call("/v3/kv/txn", &request)?;
        let (succeeded, revision) = (answer.succeeded, answer.revision());
        let mut read = Vec::new();
        if !succeeded {
            // Each read answered, or none of it is trusted: a read missing
            // would pass for a key absent.
            let ranges: Vec<_> = answer.ranges().collect();
            if ranges.len() != reads.len() || ranges.iter().any(Option::is_none) {
                return Err(EtcdError::Refused {
                    status: 200,
                    message: format!(
                        "a transaction answered {} of its {} reads",
                        ranges.iter().flatten().count(),
                        reads.len()
                    ),
                });
            }
            for range in ranges.into_iter().flatten() {
                read.push(self.kvs(range)?);
            }
        }
        Ok(Outcome {
            succeeded,
            revision,
            read,
        })
    }
}

fn compare(compare: &Compare) -> Value {
    match compare {
        Compare::Absent(key) => json!({
            "key": encode(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0",
        }),
        Compare::Unchanged(key, revision) => json!({
            "key": encode(key), "target": "MOD", "result": "EQUAL", "mod_revision": revision.to_string(),
        }),
        Compare::Present(key) => json!({
            "key": encode(key), "target": "CREATE", "result": "GREATER", "create_revision": "0",
        }),
        Compare::LeasedTo(key, lease) => json!({
            "key": encode(key), "target": "LEASE", "result": "EQUAL", "lease": lease.to_string(),
        }),
        Compare::Holds(key, value) => json!({
            "key": encode(key), "target": "VALUE", "result": "EQUAL", "value": encode(value),
        }),
    }
}

fn write(op: &Op) -> Value {
    match op {
        Op::Put(key, value) => {
            json!({"request_put": {"key": encode(key), "value": encode(value)}})
        }
        Op::PutLeased(key, value, lease) => json!({"request_put": {
            "key": encode(key), "value": encode(value), "lease": lease.to_string(),
        }}),
        Op::Delete(key) => json!({"request_delete_range": {"key": encode(key)}}),
    }
}

fn read(read: &Read) -> Value {
    match read {
        Read::Key(key) => json!({"request_range": {"key": encode(key)}}),
        Read::Keys { from, to, limit } => json!({"request_range": {
            "key": encode(from),
            "range_end": encode(to),
            "limit": limit.to_string(),
            "keys_only": true,
        }}),
    }
}
