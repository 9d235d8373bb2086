//! Releases on etcd: an attachment's record and its addresses' removed
//! in one transaction that needs them as read, a workload's hold kept or
//! ended with them; records that nothing lists freed; holds ended. An
//! attachment's addresses were written in its own claim's transaction, at
//! its revision: compared so, they need no read before the release, and
//! the node's note of a claim releases it in one round trip.

use super::EtcdStore;
use crate::addr::Addr;
use crate::da_pool::clock;
use crate::da_pool::error::PoolError;
use crate::da_pool::store::records::{self, Allocation, Owner, PoolAddress, WorkloadHold};
use crate::da_pool::store::Store;
use crate::etcd::{Compare, EtcdError, Kv, Op, Read};

/// What the record of an address says of an owner.
pub(super) enum Record {
    Absent,
    /// The owner's (or its workload's), last written at this revision.
    Owned(i64),
    Other,
}

/// What [`EtcdStore::release_ending_hold`] did.
#[derive(Debug)]
pub enum Released {
    /// Nothing: the attachment, or its workload's hold, changed meanwhile.
    Changed,
    /// The attachment released, with its workload's hold ended if it was
    /// the attachment's.
    Done(Option<WorkloadHold>),
}

impl EtcdStore {
    /// As [`Store::release`], but a workload's hold bound to the
    /// attachment is ended with it, in the same transaction, its addresses
    /// given back rather than kept for `stickyFor`: for a node reclaimed,
    /// whose containers may still use them, so that the workload's next
    /// container, elsewhere, gets new ones rather than these.
    pub fn release_ending_hold(&self, allocation: &Allocation) -> Result<Released, PoolError> {
        self.release_with(allocation, true)
    }

    /// Releases `allocation` as read; its workload's hold, if bound to it,
    /// kept for `stickyFor` or, if `ending`, ended.
    pub(super) fn release_with(
        &self,
        allocation: &Allocation,
        ending: bool,
    ) -> Result<Released, PoolError> {
        let owner = &allocation.owner;
        if owner.workload.is_none() {
            return self.release_alone(allocation);
        }
        let attachment = self.key_of(allocation);
        let mut compares = as_read(&attachment, allocation);
        let mut ops = vec![Op::Delete(attachment)];
        let mut given_back = allocation.held.clone();
        let mut ended = None;
        let mut hold_put = None;
        if let Some(workload) = &owner.workload {
            let key = self.hold_key(workload, &owner.ifname);
            match self.workload_hold(workload, &owner.ifname)? {
                Some(hold) => {
                    compares.push(Compare::Unchanged(key.clone(), hold.revision));
                    let bound_here = hold.container.as_deref() == Some(owner.id.as_str());
                    if bound_here && ending {
                        ops.push(Op::Delete(key));
                        given_back.extend(
                            hold.held
                                .iter()
                                .filter(|h| !given_back.iter().any(|g| g.address == h.address))
                                .cloned()
                                .collect::<Vec<_>>(),
                        );
                        ended = Some(hold);
                    } else {
                        if bound_here {
                            let released = hold.released(clock::now());
                            hold_put = Some(Op::Put(key, records::hold_record(&released)));
                        }
                        // Kept by the hold.
                        given_back.clear();
                    }
                }
                // Ended by an operator: nothing keeps the addresses.
                None => compares.push(Compare::Absent(key)),
            }
        }
        self.give_back(owner, &given_back, &mut compares, &mut ops)?;
        let done = |made: bool| match made {
            true => Released::Done(ended.clone()),
            false => Released::Changed,
        };
        let Some(put) = hold_put else {
            return self.txn(compares, &ops).map(done);
        };
        let deletes = ops.clone();
        ops.push(put);
        match self.txn(compares.clone(), &ops) {
            // A full etcd takes deletes only: the hold stays bound to the
            // container whose attachment goes, and so ends `stickyFor`
            // after it was bound rather than after now.
            Err(PoolError::Etcd(EtcdError::NoSpace { .. })) => self.txn(compares, &deletes),
            made => made,
        }
        .map(done)
    }
}

impl EtcdStore {
    /// What the record of `address` says of `owner`, as read now.
    pub(super) fn record_of(&self, owner: &Owner, address: Addr) -> Result<Record, PoolError> {
        Ok(match self.client.get(&self.address_key(address))? {
            None => Record::Absent,
            Some(kv) if names(owner, &kv) => Record::Owned(kv.mod_revision),
            Some(_) => Record::Other,
        })
    }

    /// Adds to `compares` and `ops` the removal of each record of `held`
    /// that names `owner` (or its workload), as read now.
    pub(super) fn give_back(
        &self,
        owner: &Owner,
        held: &[PoolAddress],
        compares: &mut Vec<Compare>,
        ops: &mut Vec<Op>,
    ) -> Result<(), PoolError> {
        for h in held {
            if let Record::Owned(revision) = self.record_of(owner, h.address)? {
                let key = self.address_key(h.address);
                compares.push(Compare::Unchanged(key.clone(), revision));
                ops.push(self.free_op(key, &h.pool));
                self.not_full(&h.pool, ops);
            }
        }
        Ok(())
    }

    /// Adds to `ops` the end of `pool`'s note that it is full, once: an
    /// address of it is given back. Deleting a key that is not there
    /// writes nothing to etcd's history.
    fn not_full(&self, pool: &str, ops: &mut Vec<Op>) {
        if self.reuse_after > 0 {
            // A cooldown frees nothing yet; the note's lease ends with
            // the first cooldown it counted.
            return;
        }
        let full = Op::Delete(self.full_key(pool));
        if !ops.contains(&full) {
            ops.push(full);
        }
    }

    /// Releases `allocation`, an attachment without a workload, as read.
    /// Its addresses' records are compared at its own revision, where its
    /// claim wrote them, so that nothing is read first; those records, and
    /// the attachment's, are read in the same round trip in case the
    /// compare fails. If only the addresses' differed (written since: an
    /// import, a migration), each that names the attachment, as read then,
    /// is given back in a second transaction.
    fn release_alone(&self, allocation: &Allocation) -> Result<Released, PoolError> {
        let owner = &allocation.owner;
        let attachment = self.key_of(allocation);
        let keys: Vec<Vec<u8>> = allocation
            .held
            .iter()
            .map(|h| self.address_key(h.address))
            .collect();
        let mut compares = as_read(&attachment, allocation);
        let mut ops = vec![Op::Delete(attachment.clone())];
        for (h, key) in allocation.held.iter().zip(&keys) {
            compares.push(Compare::Unchanged(key.clone(), allocation.revision));
            ops.push(self.free_op(key.clone(), &h.pool));
            self.not_full(&h.pool, &mut ops);
        }
        let mut reads = vec![Read::Key(attachment.clone())];
        reads.extend(keys.iter().cloned().map(Read::Key));
        let outcome = self.txn_or_read(compares, &ops, &reads)?;
        let mut read = outcome.read.into_iter();
        let current = read.next().unwrap_or_default();
        let unchanged = current.first().is_some_and(|kv| {
            kv.mod_revision == allocation.revision
                && allocation
                    .record
                    .as_ref()
                    .is_none_or(|bytes| *bytes == kv.value)
        });
        if outcome.succeeded || !unchanged {
            // Released, or a note found stale: no note of it stays.
            self.notes.forget(owner);
            return Ok(match outcome.succeeded {
                true => Released::Done(None),
                false => Released::Changed,
            });
        }
        let mut compares = as_read(&attachment, allocation);
        let mut ops = vec![Op::Delete(attachment)];
        for ((h, key), kvs) in allocation.held.iter().zip(keys).zip(read) {
            if let Some(kv) = kvs.first().filter(|kv| names(owner, kv)) {
                compares.push(Compare::Unchanged(key.clone(), kv.mod_revision));
                ops.push(self.free_op(key, &h.pool));
                self.not_full(&h.pool, &mut ops);
            }
        }
        let released = self.txn(compares, &ops)?;
        self.notes.forget(owner);
        Ok(match released {
            true => Released::Done(None),
            false => Released::Changed,
        })
    }

    /// [`Store::free_record`] on etcd.
    ///
    /// [`Store::free_record`]: crate::da_pool::store::Store::free_record
    pub(super) fn free_unlisted(&self, address: Addr, holder: &Owner) -> Result<bool, PoolError> {
        let key = self.address_key(address);
        let Some(kv) = self.client.get(&key)? else {
            return Ok(false);
        };
        if records::read_holder(&kv.value).owner() != Some(holder) {
            return Ok(false);
        }
        let mut compares = vec![Compare::Unchanged(key.clone(), kv.mod_revision)];
        // What would list it: unchanged (or still absent) until the delete,
        // so that no claim made meanwhile, of the same owner, loses it.
        let listing = match (&holder.workload, holder.id.is_empty()) {
            (Some(workload), true) => vec![self.hold_key(workload, &holder.ifname)],
            _ => vec![
                self.attachment_key(&holder.node, &holder.id, &holder.ifname),
                self.legacy_key(&holder.id, &holder.ifname),
            ],
        };
        for listing_key in listing {
            match self.client.get(&listing_key)? {
                None => compares.push(Compare::Absent(listing_key)),
                Some(record) if records::lists(&record.value, address) => return Ok(false),
                Some(record) => compares.push(Compare::Unchanged(listing_key, record.mod_revision)),
            }
        }
        let pool = records::read_pool(&kv.value);
        let mut ops = vec![self.free_op(key.clone(), pool.as_deref().unwrap_or_default())];
        // The pool is not full now, if the record says which it is.
        if let Some(pool) = pool {
            self.not_full(&pool, &mut ops);
        }
        self.txn(compares, &ops)
    }

    /// [`Store::end_hold`] on etcd.
    ///
    /// [`Store::end_hold`]: crate::da_pool::store::Store::end_hold
    pub(super) fn end_workload_hold(&self, hold: &WorkloadHold) -> Result<bool, PoolError> {
        let key = self.hold_key(&hold.workload, &hold.ifname);
        let mut compares = vec![Compare::Unchanged(key.clone(), hold.revision)];
        if let Some(id) = &hold.container {
            compares.push(Compare::Absent(self.attachment_key(
                &hold.node,
                id,
                &hold.ifname,
            )));
            compares.push(Compare::Absent(self.legacy_key(id, &hold.ifname)));
        }
        let mut ops = vec![Op::Delete(key)];
        self.give_back(&hold.owner(), &hold.held, &mut compares, &mut ops)?;
        self.txn(compares, &ops)
    }
}

/// Whether the address record `kv` names `owner` (or its workload).
fn names(owner: &Owner, kv: &Kv) -> bool {
    records::read_owner(&kv.value).is_some_and(|o| owner.owns(&o))
}

/// The conditions that `allocation`'s record, at key `attachment`, is as
/// read: unchanged since its revision, and, where its bytes are known
/// (a node's note), holding them, since a rebuilt or restored etcd counts
/// its revisions again and may reach the noted one with another record.
fn as_read(attachment: &[u8], allocation: &Allocation) -> Vec<Compare> {
    let mut compares = vec![Compare::Unchanged(attachment.to_vec(), allocation.revision)];
    if let Some(bytes) = &allocation.record {
        compares.push(Compare::Holds(attachment.to_vec(), bytes.clone()));
    }
    compares
}
