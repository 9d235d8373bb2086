//! Cooldowns on etcd (`ipam.pool.reuseAfter`): an address given back
//! keeps its key, the record replaced by its cooldown's and put under a
//! lease that removes it once the cooldown is over. Every claim already
//! needs the key absent, so no node gives the address meanwhile, no
//! process has to end the cooldown, and an ADD makes no request more.
//!
//! The leases are shared: one is granted for `reuseAfter` and a quarter
//! more (at least [`SHARED_FOR`] seconds more), and every address this
//! machine's nodes give back while its time left is still `reuseAfter`
//! goes on it (the lease is noted under `dataDir`). A cooldown so lasts
//! from `reuseAfter` to a quarter longer, and etcd keeps a few leases a
//! machine, not one an address. A lease gone before its time (an etcd
//! restored from a backup) is granted again; a full etcd, which takes
//! deletes and no puts, has its addresses given back at once.

use std::time::Duration;

use super::notes::Lease;
use super::EtcdStore;
use crate::addr::Addr;
use crate::da_pool::error::PoolError;
use crate::da_pool::store::records::{self, Cooling, Holder};
use crate::etcd::{Compare, EtcdError, Op};
use crate::sys;

/// The fewest seconds a shared lease outlives the cooldowns put on it,
/// and so the fewest it is shared for, but one.
const SHARED_FOR: u64 = 2;

/// What a lease's time left must exceed a cooldown by: etcd counts a
/// lease's time in whole seconds from when it grants it, a little after
/// it was asked for.
const MARGIN: Duration = Duration::from_secs(1);

impl EtcdStore {
    /// The write that gives back the address whose key is `key` (from
    /// `pool`): its key's removal or, with a cooldown, its cooldown's
    /// record under a shared lease. Every address given back is given
    /// back through here.
    pub(super) fn free_op(&self, key: Vec<u8>, pool: &str) -> Result<Op, PoolError> {
        if self.reuse_after == 0 {
            return Ok(Op::Delete(key));
        }
        let lease = match self.cooling_lease(false) {
            Ok(lease) => lease,
            // A full etcd grants no lease, and takes deletes only.
            Err(PoolError::Etcd(EtcdError::NoSpace { .. })) => return Ok(Op::Delete(key)),
            Err(e) => return Err(e),
        };
        let record = records::cooling_from_now(pool, self.reuse_after);
        Ok(Op::PutLeased(key, record, lease))
    }

    /// A lease with more than `reuseAfter` left: this process's, the
    /// machine's as noted, or, if neither has (or `anew`), a new one.
    fn cooling_lease(&self, anew: bool) -> Result<i64, PoolError> {
        let needed = Duration::from_secs(self.reuse_after) + MARGIN;
        let now = sys::since_boot();
        let lasts = |lease: &Lease| {
            now.checked_sub(lease.granted)
                .is_some_and(|age| age + needed <= Duration::from_secs(lease.ttl))
        };
        if !anew {
            let known = self.lease.get().or_else(|| self.notes.cooling_lease());
            if let Some(lease) = known.filter(lasts) {
                self.lease.set(Some(lease));
                return Ok(lease.id);
            }
        }
        let ttl = self.reuse_after + (self.reuse_after.div_ceil(4)).max(SHARED_FOR);
        // Before the grant: the lease's time is counted from later.
        let granted = sys::since_boot();
        let id = self.client.grant_lease(ttl)?;
        let lease = Lease { id, ttl, granted };
        self.lease.set(Some(lease));
        self.notes.note_cooling_lease(&lease);
        Ok(id)
    }

    /// `ops` as a transaction that failed with `error` may take them
    /// instead, if it may: with their cooldowns on a new lease, the one
    /// they were put on gone; or with none, their addresses given back
    /// at once, etcd being full. `None` if there are no cooldowns among
    /// them, or `error` is another.
    pub(super) fn cooled_otherwise(
        &self,
        ops: &[Op],
        error: &EtcdError,
    ) -> Result<Option<Vec<Op>>, PoolError> {
        let cools = |op: &Op| {
            matches!(op, Op::PutLeased(_, value, _)
                if value.starts_with(records::COOLING.as_bytes()))
        };
        if !ops.iter().any(cools) {
            return Ok(None);
        }
        let lease = match error {
            EtcdError::NoSpace { .. } => None,
            EtcdError::Refused { message, .. } if message.contains("lease not found") => {
                match self.cooling_lease(true) {
                    Ok(lease) => Some(lease),
                    Err(PoolError::Etcd(EtcdError::NoSpace { .. })) => None,
                    Err(e) => return Err(e),
                }
            }
            _ => return Ok(None),
        };
        let instead = ops.iter().map(|op| match (op, lease) {
            (Op::PutLeased(key, value, _), Some(lease)) if cools(op) => {
                Op::PutLeased(key.clone(), value.clone(), lease)
            }
            (Op::PutLeased(key, ..), None) if cools(op) => Op::Delete(key.clone()),
            _ => op.clone(),
        });
        Ok(Some(instead.collect()))
    }

    /// [`Store::cooling`] on etcd: the values from `from` to `to` read.
    ///
    /// [`Store::cooling`]: crate::da_pool::store::Store::cooling
    pub(super) fn cooling_between(
        &self,
        from: Addr,
        to: Addr,
    ) -> Result<Vec<(Addr, Cooling)>, PoolError> {
        let prefix = self.addresses_prefix();
        let mut end = self.address_key(to);
        // Just after `to`'s key: the read is of [from, to].
        end.push(0);
        let found = self.client.between(&self.address_key(from), &end)?;
        Ok(found
            .iter()
            .filter_map(|kv| {
                let name = std::str::from_utf8(kv.key.strip_prefix(prefix.as_bytes())?).ok()?;
                let address = Addr::from_sortable(name)?;
                match records::read_holder(&kv.value) {
                    Holder::Cooling(cooling) if address.family() == from.family() => {
                        Some((address, cooling))
                    }
                    _ => None,
                }
            })
            .collect())
    }

    /// [`Store::end_cooling`] on etcd: the key removed if it is still the
    /// cooldown read.
    ///
    /// [`Store::end_cooling`]: crate::da_pool::store::Store::end_cooling
    pub(super) fn end_cooling_of(&self, address: Addr) -> Result<bool, PoolError> {
        let key = self.address_key(address);
        let Some(kv) = self.client.get(&key)? else {
            return Ok(false);
        };
        let Holder::Cooling(cooling) = records::read_holder(&kv.value) else {
            return Ok(false);
        };
        let mut ops = vec![Op::Delete(key.clone())];
        if let Some(pool) = &cooling.pool {
            ops.push(Op::Delete(self.full_key(pool)));
        }
        self.txn(vec![Compare::Unchanged(key, kv.mod_revision)], &ops)
    }
}
