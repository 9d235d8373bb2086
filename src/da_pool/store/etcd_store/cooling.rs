//! Cooldowns on etcd (`ipam.pool.reuseAfter`): an address given back
//! keeps its key, the record replaced by its cooldown's and put under a
//! lease that removes it once the cooldown is over. Every claim already
//! needs the key absent, so no node gives the address meanwhile, no
//! process has to end the cooldown, and an ADD makes no request more.
//!
//! The leases are shared: the nodes of a machine put the cooldowns of a
//! network on one lease (noted under `dataDir`) while its time left still
//! covers `reuseAfter`, the client's timeout (a transaction the client
//! retries lands that much later) and a second; then a new one is
//! granted for that much and a quarter of `reuseAfter` more (at least
//! [`SHARED_FOR`] seconds more). The lease is chosen when the transaction
//! is sent, after whatever the release read first. A cooldown so lasts
//! at least `reuseAfter`, and etcd keeps a few leases a machine, not one
//! an address. A lease gone before its time (an etcd restored from a
//! backup) is granted again; a full etcd, which grants no lease and
//! takes deletes only, has its addresses given back at once.
//!
//! A cooldown `import` brings from a node's local store goes on a lease
//! of its own time left, shared by those whose time left rounds up to
//! the same step (a power of two seconds, at most an eighth of it).

use std::time::Duration;

use super::notes::Lease;
use super::EtcdStore;
use crate::addr::Addr;
use crate::da_pool::clock;
use crate::da_pool::error::PoolError;
use crate::da_pool::settings::MAX_REUSE_AFTER;
use crate::da_pool::store::records::{self, Cooling, Holder};
use crate::etcd::{Compare, EtcdError, Op};
use crate::sys;

/// The fewest seconds a new lease is shared for: it outlives what the
/// cooldowns put on it need by this much at least.
const SHARED_FOR: u64 = 2;

/// What a lease's time left must exceed a cooldown by, besides the
/// client's timeout: etcd counts a lease's time in whole seconds from
/// when it grants it, a little after it was asked for.
const MARGIN: Duration = Duration::from_secs(1);

/// The lease a cooldown's record is put under until the transaction is
/// sent: none yet ([`EtcdStore::leased`] chooses it).
const CHOSEN_AT_SEND: i64 = 0;

/// How much time a lease must have left for a cooldown of `reuse_after`
/// seconds put on it by a client whose requests take up to `timeout`.
fn needed(reuse_after: u64, timeout: Duration) -> Duration {
    Duration::from_secs(reuse_after) + timeout + MARGIN
}

/// Whether `lease` has `needed` left at `now` (both as
/// [`sys::since_boot`] counts).
fn lasts(lease: &Lease, now: Duration, needed: Duration) -> bool {
    now.checked_sub(lease.granted)
        .is_some_and(|age| age + needed <= Duration::from_secs(lease.ttl))
}

/// The time to live of a new lease for cooldowns of `reuse_after`
/// seconds that need `needed`: that, rounded up, and a quarter of
/// `reuse_after` more, at least [`SHARED_FOR`] seconds.
fn ttl(reuse_after: u64, needed: Duration) -> u64 {
    let needed = needed.as_secs() + u64::from(needed.subsec_nanos() > 0);
    needed + reuse_after.div_ceil(4).max(SHARED_FOR)
}

/// The time to live of a lease for cooldowns brought from another store
/// that need `needed`: that, rounded up to a step of a power of two
/// seconds no more than an eighth of it, so that those of about the same
/// time left share one lease (eight times to live between one power of
/// two and the next: some 110 for a day's spread) and none lasts an
/// eighth longer than it must.
fn carried_ttl(needed: Duration) -> u64 {
    let needed = needed.as_secs() + u64::from(needed.subsec_nanos() > 0);
    let step = 1u64 << (needed / 8).max(1).ilog2();
    needed.div_ceil(step) * step
}

/// The lease of `leases` that a carried cooldown needing `needed`, and
/// so a lease of `ttl`, goes on at `now`: one granted for that `ttl` with
/// that much left, if any.
fn shared(leases: &[Lease], ttl: u64, now: Duration, needed: Duration) -> Option<i64> {
    let lasting = |lease: &&Lease| lease.ttl == ttl && lasts(lease, now, needed);
    leases.iter().find(lasting).map(|lease| lease.id)
}

/// Whether `op` puts a cooldown's record.
fn cools(op: &Op) -> bool {
    matches!(op, Op::PutLeased(_, value, _) if value.starts_with(records::COOLING.as_bytes()))
}

impl EtcdStore {
    /// The write that gives back the address whose key is `key` (from
    /// `pool`): its key's removal or, with a cooldown, its cooldown's
    /// record, its lease chosen when the transaction is sent. Every
    /// address given back is given back through here.
    pub(super) fn free_op(&self, key: Vec<u8>, pool: &str) -> Op {
        if self.reuse_after == 0 {
            return Op::Delete(key);
        }
        let record = records::cooling_from_now(pool, self.reuse_after);
        Op::PutLeased(key, record, CHOSEN_AT_SEND)
    }

    /// `ops` as they are sent now: each cooldown on a lease that covers
    /// it from now, or, etcd being full (it grants no lease), given back
    /// at once.
    pub(super) fn leased(&self, ops: Vec<Op>) -> Result<Vec<Op>, PoolError> {
        if !ops.iter().any(cools) {
            return Ok(ops);
        }
        let lease = match self.cooling_lease(false) {
            Ok(lease) => Some(lease),
            Err(PoolError::Etcd(EtcdError::NoSpace { .. })) => None,
            Err(e) => return Err(e),
        };
        Ok(on_lease(&ops, lease))
    }

    /// A lease with what a cooldown needs left: this process's, the
    /// machine's as noted, or, if neither has (or `anew`), a new one.
    fn cooling_lease(&self, anew: bool) -> Result<i64, PoolError> {
        let needed = needed(self.reuse_after, self.client.settings().timeout);
        // Without the boot's clock, no lease is known to last: a new one.
        if let (false, Some(now)) = (anew, sys::since_boot()) {
            let lasting = |lease: &Lease| lasts(lease, now, needed);
            let known = (self.lease.get().filter(lasting))
                .or_else(|| self.notes.cooling_lease().filter(lasting));
            if let Some(lease) = known {
                self.lease.set(Some(lease));
                return Ok(lease.id);
            }
        }
        let ttl = ttl(self.reuse_after, needed);
        // Before the grant: the lease's time is counted from later. (The
        // boot's start, if the clock does not say: the lease looks old.)
        let granted = sys::since_boot().unwrap_or_default();
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
        Ok(Some(on_lease(ops, lease)))
    }

    /// [`Store::carry_cooling`] on etcd: the cooldown's record put on a
    /// lease that covers its time left and the client's timeout, if the
    /// address's key is absent.
    ///
    /// [`Store::carry_cooling`]: crate::da_pool::store::Store::carry_cooling
    pub(super) fn carry(&self, address: Addr, cooling: &Cooling) -> Result<bool, PoolError> {
        // No cooldown lasts longer than the longest `reuseAfter` and the
        // second added: a record saying more is garbled.
        let left = (cooling.until.saturating_sub(clock::now())).min(MAX_REUSE_AFTER + 1);
        let needed = needed(left, self.client.settings().timeout);
        let lease = self.carrying_lease(needed)?;
        let key = self.address_key(address);
        let pool = cooling.pool.as_deref().unwrap_or_default();
        let record = records::cooling_record(pool, clock::now(), cooling.until);
        let mut compares = vec![Compare::Absent(key.clone())];
        compares.extend(self.guard.compares.iter().cloned());
        let mut ops = vec![Op::PutLeased(key, record, lease)];
        ops.extend(self.guard.also.iter().cloned());
        // Sent through the client as it is, not `txn_or_read`: its
        // `leased` would move the cooldown onto the shared lease, which
        // covers `reuseAfter`, not this time left.
        Ok(self.client.txn_or_read(&compares, &ops, &[])?.succeeded)
    }

    /// A lease with `needed` left, of about that much: one this process
    /// granted for as much, or a new one.
    fn carrying_lease(&self, needed: Duration) -> Result<i64, PoolError> {
        let ttl = carried_ttl(needed);
        let mut carried = self.carried.borrow_mut();
        if let Some(id) = sys::since_boot().and_then(|now| shared(&carried, ttl, now, needed)) {
            return Ok(id);
        }
        // Before the grant, as for the shared lease: its time is counted
        // from later.
        let granted = sys::since_boot().unwrap_or_default();
        let id = self.client.grant_lease(ttl)?;
        carried.push(Lease { id, ttl, granted });
        Ok(id)
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

/// `ops` with each cooldown put on `lease`, or, with none, its address
/// given back at once.
fn on_lease(ops: &[Op], lease: Option<i64>) -> Vec<Op> {
    ops.iter()
        .map(|op| match (op, lease) {
            (Op::PutLeased(key, value, _), Some(lease)) if cools(op) => {
                Op::PutLeased(key.clone(), value.clone(), lease)
            }
            (Op::PutLeased(key, ..), None) if cools(op) => Op::Delete(key.clone()),
            _ => op.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_takes_a_cooldown_only_while_it_covers_it_and_the_clients_timeout() {
        let timeout = Duration::from_secs(5);
        // reuseAfter 3 s: 9 s needed, a lease of 11 s, shared for 2.
        let needed = needed(3, timeout);
        assert_eq!(needed, Duration::from_secs(9));
        assert_eq!(ttl(3, needed), 11);
        // reuseAfter 1h: shared for a quarter of it.
        assert_eq!(ttl(3_600, super::needed(3_600, timeout)), 3_606 + 900);
        let lease = Lease {
            id: 7,
            ttl: 11,
            granted: Duration::from_secs(100),
        };
        let at = |seconds: f64| Duration::from_secs_f64(seconds);
        assert!(lasts(&lease, at(100.0), needed));
        assert!(lasts(&lease, at(102.0), needed));
        assert!(!lasts(&lease, at(102.001), needed));
        // A time before the grant (another boot's, noted) is no age.
        assert!(!lasts(&lease, at(99.0), needed));
        // A timeout of a fraction of a second rounds the lease up.
        assert_eq!(ttl(3, super::needed(3, at(0.5))), 7);
    }

    #[test]
    fn a_carried_cooldowns_lease_is_its_time_left_rounded_up_to_an_eighth() {
        let at = |seconds: f64| Duration::from_secs_f64(seconds);
        for (needed, ttl) in [
            (at(0.5), 1),
            (at(7.0), 7),
            (at(16.0), 16),
            (at(17.0), 18),
            (at(3_607.0), 3_840),
            (at(3_600.2), 3_840),
            (at(4_095.0), 4_096),
            (at(4_097.0), 4_608),
        ] {
            assert_eq!(carried_ttl(needed), ttl, "{needed:?}");
            assert!(Duration::from_secs(ttl) >= needed, "{needed:?}");
            assert!(
                Duration::from_secs(ttl) <= needed.max(at(1.0)) * 9 / 8,
                "{needed:?}"
            );
        }
    }

    #[test]
    fn carried_cooldowns_share_a_lease_of_their_eighth_while_it_lasts() {
        let at = |seconds: u64| Duration::from_secs(seconds);
        let leases = [
            Lease {
                id: 1,
                ttl: 18,
                granted: at(100),
            },
            Lease {
                id: 2,
                ttl: 3_840,
                granted: at(100),
            },
        ];
        // 17 s needed: the lease of 18 s, while it has that left.
        assert_eq!(shared(&leases, 18, at(100), at(17)), Some(1));
        assert_eq!(shared(&leases, 18, at(101), at(17)), Some(1));
        assert_eq!(shared(&leases, 18, at(102), at(17)), None);
        // Not a longer one, which has it left too.
        assert_eq!(shared(&leases, 16, at(100), at(16)), None);
        assert_eq!(shared(&leases, 3_840, at(200), at(3_607)), Some(2));
    }

    #[test]
    fn cooldowns_go_on_the_lease_or_are_given_back_at_once_and_nothing_else_changes() {
        let cooling = records::cooling_from_now("p", 3);
        let ops = vec![
            Op::Delete(b"attachment".to_vec()),
            Op::PutLeased(b"address".to_vec(), cooling.clone(), CHOSEN_AT_SEND),
            Op::PutLeased(b"full".to_vec(), b"{}".to_vec(), 5),
            Op::Put(b"hold".to_vec(), b"{}".to_vec()),
        ];
        let leased = on_lease(&ops, Some(42));
        assert_eq!(leased[1], Op::PutLeased(b"address".to_vec(), cooling, 42));
        assert_eq!(
            [&leased[0], &leased[2], &leased[3]],
            [&ops[0], &ops[2], &ops[3]]
        );
        let at_once = on_lease(&ops, None);
        assert_eq!(at_once[1], Op::Delete(b"address".to_vec()));
        assert_eq!(
            [&at_once[0], &at_once[2], &at_once[3]],
            [&ops[0], &ops[2], &ops[3]]
        );
    }
}
