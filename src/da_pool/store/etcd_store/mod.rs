//! The etcd store: every node of a cluster shares the pools.
//!
//! ```text
//! PREFIX/networks/NETWORK/nodes/NODE/attachments/ID:IFNAME
//!                                                  what the attachment holds, under its node
//! PREFIX/networks/NETWORK/addresses/ADDRESS        who holds the address, from which pool;
//!                                                  or, under a lease, until when it cools down
//! PREFIX/networks/NETWORK/holds/WORKLOAD:IFNAME    what a workload's hold keeps for it
//! PREFIX/networks/NETWORK/nodes/NODE/hints/POOL    where the node looks next in the pool
//! PREFIX/networks/NETWORK/full/POOL                a pool found full, for a few seconds
//! PREFIX/pools/NAME                                a pool defined centrally
//! ```
//!
//! A claim also needs its node not fenced (`PREFIX/nodes/NODE/fenced`,
//! see `fence`). A node's attachments are one prefix, so that its GC
//! reads its own records and no other node's. The previous layout kept
//! every attachment at `PREFIX/networks/NETWORK/attachments/ID:IFNAME`:
//! what is still there is read as well (and released there) until
//! `ipam-da-pool migrate` moves it.
//!
//! Each address is one key of the network, whatever pool names it,
//! written with its attachment's record in one transaction that fails if
//! any of those keys exists: two nodes can never hold one address, and a
//! claim is all there or not at all. Addresses are named so that their
//! keys sort as they do, and a free one is found by reading the held keys
//! from where the search starts, a page at a time. A workload's hold
//! changes in the same transaction as the addresses it keeps. A view of
//! the store can be guarded for one task (`reclaim` of one node): each of
//! its changes also needs more to hold, and also writes more, in the same
//! transaction.

mod claims;
mod cooling;
mod notes;
mod releases;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use serde_json::Value;

use super::fence;
use super::records::{
    self, Allocation, Cooling, Holder, Owner, PoolAddress, StickyClaim, WorkloadHold,
};
use super::{Attempt, Store};
use crate::addr::Addr;
use crate::cni;
use crate::da_pool::clock;
use crate::da_pool::error::{Cooldowns, PoolError};
use crate::etcd::{Compare, EtcdClient, EtcdError, Op, Outcome, Read};
use notes::{Lease, Notes};
pub use releases::Released;

/// The layout's version, as `PREFIX/networks/NETWORK/layout` says once
/// `migrate` has moved the previous one's records.
pub const LAYOUT: u64 = 2;

/// How long, in seconds, a pool found full stays noted so: the ADDs a
/// runtime retries meanwhile are refused without reading it whole again;
/// an address given back ends the note at once.
const FULL_FOR: u64 = 5;

/// How many held keys one read looks at while searching for a free address.
const PAGE: usize = 256;

/// A network's keys in a cluster.
pub struct EtcdStore {
    client: Rc<EtcdClient>,
    /// `PREFIX/networks/NETWORK/`.
    network: String,
    /// What every change also needs and does: nothing, but in a guarded view.
    guard: Guard,
    /// The hint of each pool as this process read it (or its node noted
    /// it), if it did.
    hints_read: RefCell<HashMap<String, Option<Addr>>>,
    /// What the nodes on this machine noted of their claims.
    notes: Rc<Notes>,
    /// The addresses of each pool this process expects free, in order:
    /// as the node noted them, or as a failed claim's page showed them.
    expected: RefCell<HashMap<String, Vec<Addr>>>,
    /// How long an address given back cools down, in seconds.
    reuse_after: u64,
    /// The lease this process puts cooldowns on, once it has one.
    lease: Cell<Option<Lease>>,
    /// The leases this process granted for cooldowns brought from
    /// another store.
    carried: RefCell<Vec<Lease>>,
}

/// What every change of a guarded view of a store also needs to hold, and
/// also does, in the same transaction (`reclaim`: the node's registration
/// still absent, and the node fenced).
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// Conditions added to each transaction's own.
    pub compares: Vec<Compare>,
    /// Writes added to each transaction's own.
    pub also: Vec<Op>,
}

impl EtcdStore {
    /// The store of network `name` on the cluster `client` reaches, with
    /// the nodes' notes of their claims under `data_dir`, if any.
    pub fn new(client: Rc<EtcdClient>, name: &str, data_dir: Option<&Path>) -> EtcdStore {
        let settings = client.settings();
        let network = format!("{}/networks/{name}/", settings.prefix);
        let cluster = format!("{} {}", settings.described(), settings.prefix);
        EtcdStore {
            notes: Rc::new(Notes::new(data_dir, &cluster, name)),
            client,
            network,
            guard: Guard::default(),
            hints_read: RefCell::new(HashMap::new()),
            expected: RefCell::new(HashMap::new()),
            reuse_after: 0,
            lease: Cell::new(None),
            carried: RefCell::new(Vec::new()),
        }
    }

    /// The same store, each address it gives back cooling down for
    /// `seconds` before it is given again (none if 0).
    pub fn cooling_for(self, seconds: u64) -> EtcdStore {
        EtcdStore {
            reuse_after: seconds,
            ..self
        }
    }

    /// The same network's store, every change of which also needs
    /// `guard.compares` to hold and also makes `guard.also` (besides this
    /// one's own guard, if it is a view already): a view for the one task
    /// it is made for, which ends with it.
    pub fn guarded(&self, guard: Guard) -> EtcdStore {
        let mut both = self.guard.clone();
        both.compares.extend(guard.compares);
        both.also.extend(guard.also);
        EtcdStore {
            client: Rc::clone(&self.client),
            network: self.network.clone(),
            guard: both,
            hints_read: RefCell::new(HashMap::new()),
            notes: Rc::clone(&self.notes),
            expected: RefCell::new(HashMap::new()),
            reuse_after: self.reuse_after,
            lease: Cell::new(self.lease.get()),
            carried: RefCell::new(Vec::new()),
        }
    }

    /// The client the store talks through.
    pub fn client(&self) -> &EtcdClient {
        &self.client
    }

    /// Runs `ops` if the guard and `compares` hold.
    fn txn(&self, compares: Vec<Compare>, ops: &[Op]) -> Result<bool, PoolError> {
        Ok(self.txn_or_read(compares, ops, &[])?.succeeded)
    }

    /// Runs `ops` if the guard and `compares` hold, else makes `reads`,
    /// in one round trip; once more with its cooldowns on a new lease, or
    /// given back at once, where etcd refuses them ([`EtcdStore::cooled_otherwise`]).
    fn txn_or_read(
        &self,
        mut compares: Vec<Compare>,
        ops: &[Op],
        reads: &[Read],
    ) -> Result<Outcome, PoolError> {
        compares.extend(self.guard.compares.iter().cloned());
        let mut ops = ops.to_vec();
        ops.extend(self.guard.also.iter().cloned());
        // Chosen now, after what the caller read: a cooldown's lease.
        let ops = self.leased(ops)?;
        match self.client.txn_or_read(&compares, &ops, reads) {
            Err(e) => match self.cooled_otherwise(&ops, &e)? {
                Some(instead) => Ok(self.client.txn_or_read(&compares, &instead, reads)?),
                None => Err(e.into()),
            },
            done => Ok(done?),
        }
    }

    /// What a claim of `owner`'s needs: its node not fenced (a fence
    /// written after the ADD looked makes the claim fail).
    fn unfenced(&self, owner: &Owner) -> Compare {
        Compare::Absent(fence::key(&self.client.settings().prefix, &owner.node))
    }

    fn hold_key(&self, workload: &str, ifname: &str) -> Vec<u8> {
        format!(
            "{}holds/{}",
            self.network,
            records::hold_name(workload, ifname)
        )
        .into_bytes()
    }

    /// Node `node`'s attachments: `PREFIX/networks/NETWORK/nodes/NODE/attachments/`.
    fn node_prefix(&self, node: &str) -> String {
        format!("{}nodes/{node}/attachments/", self.network)
    }

    fn attachment_key(&self, node: &str, id: &str, ifname: &str) -> Vec<u8> {
        let name = records::attachment_name(id, ifname);
        format!("{}{name}", self.node_prefix(node)).into_bytes()
    }

    /// Where the previous layout kept the attachment's record.
    fn legacy_key(&self, id: &str, ifname: &str) -> Vec<u8> {
        format!(
            "{}{}",
            self.legacy_prefix(),
            records::attachment_name(id, ifname)
        )
        .into_bytes()
    }

    fn legacy_prefix(&self) -> String {
        format!("{}attachments/", self.network)
    }

    /// Where `allocation`'s record is.
    fn key_of(&self, allocation: &Allocation) -> Vec<u8> {
        let owner = &allocation.owner;
        match allocation.legacy {
            true => self.legacy_key(&owner.id, &owner.ifname),
            false => self.attachment_key(&owner.node, &owner.id, &owner.ifname),
        }
    }

    /// The attachments whose records are under `prefix`, each marked
    /// `legacy` or not.
    fn read_allocations(&self, prefix: &str, legacy: bool) -> Result<Vec<Allocation>, PoolError> {
        let found = self.client.with_prefix(prefix.as_bytes())?;
        Ok(found
            .iter()
            .filter_map(|kv| records::read_allocation(&kv.value, kv.mod_revision))
            .map(|allocation| Allocation {
                legacy,
                ..allocation
            })
            .collect())
    }

    /// The records of the previous layout still in the network, for
    /// `migrate`.
    pub fn legacy_allocations(&self) -> Result<Vec<Allocation>, PoolError> {
        self.read_allocations(&self.legacy_prefix(), true)
    }

    /// Moves `allocation`, a record of the previous layout, under its node's
    /// prefix, as it was read: `Ok(false)`, and nothing changed, if it
    /// changed meanwhile.
    pub fn move_legacy(&self, allocation: &Allocation) -> Result<bool, PoolError> {
        let owner = &allocation.owner;
        let from = self.legacy_key(&owner.id, &owner.ifname);
        let to = self.attachment_key(&owner.node, &owner.id, &owner.ifname);
        let Some(kv) = self.client.get(&from)? else {
            return Ok(false);
        };
        self.txn(
            vec![
                Compare::Unchanged(from.clone(), allocation.revision),
                Compare::Absent(to.clone()),
            ],
            &[Op::Delete(from), Op::Put(to, kv.value)],
        )
    }

    /// Says the network's records are all in this layout: version 2.
    pub fn mark_layout(&self) -> Result<(), PoolError> {
        let key = format!("{}layout", self.network).into_bytes();
        let record = serde_json::json!({"version": LAYOUT}).to_string();
        self.client.txn(&[], &[Op::Put(key, record.into_bytes())])?;
        Ok(())
    }

    fn addresses_prefix(&self) -> String {
        format!("{}addresses/", self.network)
    }

    fn address_key(&self, address: Addr) -> Vec<u8> {
        format!("{}{}", self.addresses_prefix(), address.sortable()).into_bytes()
    }

    fn hint_key(&self, node: &str, pool: &str) -> Vec<u8> {
        format!("{}nodes/{node}/hints/{pool}", self.network).into_bytes()
    }

    /// The note that `pool` was found full, under a short lease.
    fn full_key(&self, pool: &str) -> Vec<u8> {
        format!("{}full/{pool}", self.network).into_bytes()
    }
}

impl Store for EtcdStore {
    fn allocation(
        &self,
        node: &str,
        id: &str,
        ifname: &str,
    ) -> Result<Option<Allocation>, PoolError> {
        // Both places in one request: the record is in one of them.
        let keys = [
            self.attachment_key(node, id, ifname),
            self.legacy_key(id, ifname),
        ];
        let found = self.client.get_each(&[&keys[0], &keys[1]])?;
        Ok(found
            .into_iter()
            .zip([false, true])
            .find_map(|(kv, legacy)| {
                let kv = kv?;
                let allocation = records::read_allocation(&kv.value, kv.mod_revision)?;
                Some(Allocation {
                    legacy,
                    ..allocation
                })
            }))
    }

    fn holder(&self, address: Addr) -> Result<Option<Holder>, PoolError> {
        let found = self.client.get(&self.address_key(address))?;
        // A record that says no one still makes the address taken.
        Ok(found.map(|kv| records::read_holder(&kv.value)))
    }

    fn cools(&self) -> bool {
        self.reuse_after > 0
    }

    fn cooling(&self, from: Addr, to: Addr) -> Result<Vec<(Addr, Cooling)>, PoolError> {
        self.cooling_between(from, to)
    }

    fn end_cooling(&self, address: Addr) -> Result<bool, PoolError> {
        self.end_cooling_of(address)
    }

    fn carry_cooling(&self, address: Addr, cooling: &Cooling) -> Result<bool, PoolError> {
        self.carry(address, cooling)
    }

    fn count_held(&self, from: Addr, to: Addr) -> Result<Option<u64>, PoolError> {
        let mut end = self.address_key(to);
        // Just after `to`'s key: the count is of [from, to]. An IPv4 range
        // that crosses a first byte may count IPv6 keys sorting into it
        // ("020.…" to "021.…" holds "0200:…"), which no pool gives.
        end.push(0);
        Ok(Some(self.client.count(&self.address_key(from), &end)?))
    }

    fn first_free(
        &self,
        from: Addr,
        to: Addr,
        gives: &dyn Fn(Addr) -> bool,
    ) -> Result<Option<Addr>, PoolError> {
        let prefix = self.addresses_prefix();
        let mut end = self.address_key(to);
        // Just after `to`'s key: the read is of [from, to].
        end.push(0);
        let mut candidate = from;
        let mut read_from = self.address_key(from);
        loop {
            let page = self.client.range(&read_from, &end, PAGE, true)?;
            if let Some(last) = page.last() {
                // The next page starts after this one, whatever its keys;
                // a member that answers a page of keys outside the range
                // asked, or the same page again, would be read for ever.
                let mut next = last.key.clone();
                next.push(0);
                if next <= read_from || last.key >= end {
                    return Err(PoolError::Etcd(EtcdError::Refused {
                        status: 200,
                        message: "a page of keys outside the range asked for".into(),
                    }));
                }
                read_from = next;
            }
            // An IPv6 key can sort between two IPv4 ones ("2001:…" after
            // "200.…"): the other family's keys are not this search's.
            let taken = page
                .iter()
                .filter_map(|kv| {
                    let name = std::str::from_utf8(kv.key.strip_prefix(prefix.as_bytes())?).ok()?;
                    Addr::from_sortable(name)
                })
                .filter(|held| held.family() == from.family());
            for held in taken {
                // Every address before the next held one is free.
                while candidate < held {
                    if gives(candidate) {
                        return Ok(Some(candidate));
                    }
                    candidate = candidate.plus(1).unwrap_or(held);
                }
                match held.plus(1) {
                    Some(next) if next <= to => candidate = next.max(candidate),
                    _ => return Ok(None),
                }
            }
            if page.len() < PAGE {
                // Nothing held from here to `to`.
                loop {
                    if gives(candidate) {
                        return Ok(Some(candidate));
                    }
                    match candidate.plus(1) {
                        Some(next) if next <= to => candidate = next,
                        _ => return Ok(None),
                    }
                }
            }
        }
    }

    fn hint(&self, node: &str, pool: &str) -> Result<Option<Addr>, PoolError> {
        let found = self.client.get(&self.hint_key(node, pool))?;
        let after = found.and_then(|kv| {
            std::str::from_utf8(&kv.value)
                .ok()?
                .trim()
                .parse()
                .ok()
                .map(Addr::new)
        });
        self.hints_read.borrow_mut().insert(pool.to_owned(), after);
        Ok(after)
    }

    fn noted_full(&self, pool: &str) -> Result<Option<Cooldowns>, PoolError> {
        let Some(kv) = self.client.get(&self.full_key(pool))? else {
            return Ok(None);
        };
        // "full", as an earlier version noted it: no cooldowns said.
        let noted: Value = serde_json::from_slice(&kv.value).unwrap_or_default();
        Ok(Some(Cooldowns {
            count: noted
                .get("cooling")
                .and_then(Value::as_u64)
                .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX)),
            first_until: noted.get("firstUntil").and_then(Value::as_u64),
        }))
    }

    fn note_full(&self, pool: &str, cooling: &Cooldowns) -> Result<(), PoolError> {
        // No longer than until the first cooldown ends: etcd ends that
        // one, not a release that would end the note.
        let ends = cooling.first_until.map(|u| u.saturating_sub(clock::now()));
        let lease = self
            .client
            .grant_lease(ends.map_or(FULL_FOR, |e| e.clamp(1, FULL_FOR)))?;
        let noted =
            serde_json::json!({"cooling": cooling.count, "firstUntil": cooling.first_until});
        let op = Op::PutLeased(self.full_key(pool), noted.to_string().into_bytes(), lease);
        self.client.txn(&[], &[op])?;
        Ok(())
    }

    fn claim(
        &self,
        owner: &Owner,
        held: &[PoolAddress],
        sticky: Option<&StickyClaim>,
    ) -> Result<bool, PoolError> {
        match sticky {
            Some(sticky) => self.claim_for_workload(owner, held, sticky),
            None => Ok(matches!(
                self.claim_looking(owner, held, &[])?,
                Attempt::Claimed
            )),
        }
    }

    fn guess(&self, node: &str, pool: &str) -> Option<Addr> {
        let guess = self.notes.guess(node, pool)?;
        // What the node last saw of the shared hint: moved far enough
        // from it, a claim writes it anew.
        self.hints_read
            .borrow_mut()
            .insert(pool.to_owned(), guess.shared);
        let first = guess.next.first().copied();
        self.expected
            .borrow_mut()
            .insert(pool.to_owned(), guess.next);
        first
    }

    fn claim_or_look(
        &self,
        owner: &Owner,
        held: &[PoolAddress],
        looks: &[(Addr, Addr)],
    ) -> Result<Attempt, PoolError> {
        self.claim_looking(owner, held, looks)
    }

    fn noted(&self, owner: &Owner) -> Option<Allocation> {
        self.notes.claimed(owner)
    }

    fn forget_notes_except(&self, node: &str, live: &[Allocation], older_than: Duration) {
        let owners: Vec<&Owner> = live.iter().map(|a| &a.owner).collect();
        self.notes.forget_except(node, &owners, older_than);
    }

    fn release(&self, allocation: &Allocation) -> Result<bool, PoolError> {
        Ok(!matches!(
            self.release_with(allocation, false)?,
            Released::Changed
        ))
    }

    fn free_record(&self, address: Addr, holder: &Owner) -> Result<bool, PoolError> {
        self.free_unlisted(address, holder)
    }

    fn workload_hold(
        &self,
        workload: &str,
        ifname: &str,
    ) -> Result<Option<WorkloadHold>, PoolError> {
        let found = self.client.get(&self.hold_key(workload, ifname))?;
        Ok(found
            .and_then(|kv| records::read_workload_hold(&kv.value, kv.mod_revision))
            .filter(|hold| hold.workload == workload))
    }

    fn workload_holds(&self) -> Result<Vec<WorkloadHold>, PoolError> {
        let prefix = format!("{}holds/", self.network);
        let found = self.client.with_prefix(prefix.as_bytes())?;
        Ok(found
            .iter()
            .filter_map(|kv| records::read_workload_hold(&kv.value, kv.mod_revision))
            .collect())
    }

    fn end_hold(&self, hold: &WorkloadHold) -> Result<bool, PoolError> {
        self.end_workload_hold(hold)
    }

    fn allocations(&self) -> Result<Vec<Allocation>, PoolError> {
        let mut found = self.read_allocations(&format!("{}nodes/", self.network), false)?;
        found.extend(self.legacy_allocations()?);
        Ok(found)
    }

    fn allocations_of(&self, node: &str) -> Result<Vec<Allocation>, PoolError> {
        let mut found = self.read_allocations(&self.node_prefix(node), false)?;
        // Until `migrate`, the previous layout's: every node's.
        let legacy = self.legacy_allocations()?;
        found.extend(legacy.into_iter().filter(|h| h.owner.node == node));
        Ok(found)
    }

    fn address_records(&self) -> Result<Vec<(Addr, Option<Owner>)>, PoolError> {
        let prefix = self.addresses_prefix();
        let found = self.client.with_prefix(prefix.as_bytes())?;
        Ok(found
            .iter()
            .filter_map(|kv| {
                let name = std::str::from_utf8(kv.key.strip_prefix(prefix.as_bytes())?).ok()?;
                let held = matches!(records::read_holder(&kv.value), Holder::Owner(_));
                held.then(|| Some((Addr::from_sortable(name)?, records::read_owner(&kv.value))))?
            })
            .collect())
    }

    fn pool_definition(&self, name: &str) -> Result<Option<Value>, PoolError> {
        let key = format!("{}/pools/{name}", self.client.settings().prefix);
        let Some(kv) = self.client.get(key.as_bytes())? else {
            return Ok(None);
        };
        serde_json::from_slice(&kv.value).map(Some).map_err(|e| {
            cni::Error::InvalidConfig(format!("pool {name:?} in etcd ({key}) is not JSON: {e}"))
                .into()
        })
    }

    fn fenced(&self, node: &str) -> Result<Option<PoolError>, PoolError> {
        Ok(fence::read(&self.client, node)?.map(|fence| fence.refusal()))
    }

    fn ping(&self) -> Result<(), PoolError> {
        self.client.get(self.network.as_bytes())?;
        Ok(())
    }

    fn is_shared(&self) -> bool {
        true
    }
}
