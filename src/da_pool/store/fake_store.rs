//! An in-memory store for the allocator's tests: records in maps, claims
//! that can be made to lose a race, and a count of the addresses looked at.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::records::{Allocation, Cooling, Holder, Owner, PoolAddress, StickyClaim, WorkloadHold};
use super::{Attempt, Page, Seen, Store};
use crate::addr::Addr;
use crate::da_pool::clock;
use crate::da_pool::error::{Cooldowns, PoolError};
use crate::etcd::EtcdError;

/// How many held addresses a page read with a failed claim holds, as on
/// etcd.
const PAGE: usize = 256;

/// More addresses than any test's search may look at.
const LOOK_LIMIT: u128 = 1 << 20;

/// A store in memory.
#[derive(Default)]
pub struct FakeStore {
    pub attachments: RefCell<BTreeMap<(String, String), Allocation>>,
    pub addresses: RefCell<BTreeMap<Addr, Owner>>,
    pub holds: RefCell<BTreeMap<(String, String), WorkloadHold>>,
    pub hints: RefCell<HashMap<String, Addr>>,
    /// Whether the node guesses, as on etcd with its notes.
    pub guessing: bool,
    /// The node's guess of each pool, as its notes keep them.
    pub guesses: RefCell<HashMap<String, Addr>>,
    /// How many claims were made (each a round trip on etcd).
    pub claims: Cell<usize>,
    /// What each failed claim looked at, in order.
    pub looks: RefCell<Vec<(Addr, Addr)>>,
    /// Pools the store defines, as etcd's `PREFIX/pools/NAME`.
    pub pools: HashMap<String, Value>,
    /// How many claims to come lose a race, as if another node won.
    pub losing_claims: Cell<usize>,
    /// How many claims to come are recorded but answered with an error,
    /// as etcd's answer is lost to a stall.
    pub unanswered_claims: Cell<usize>,
    /// How many claims to come are refused, nothing recorded, as etcd at
    /// its quota refuses a put.
    pub refused_claims: Cell<usize>,
    /// How many addresses `first_free` has looked at.
    pub looked_at: Cell<u128>,
    /// Whether it stands for a local store (one node's records only).
    pub local: bool,
    /// Fenced nodes, each with what its refusal says.
    pub fences: RefCell<HashMap<String, String>>,
    /// Pools noted full, until an address is given back, with their
    /// cooldowns as noted.
    pub full: RefCell<HashMap<String, Cooldowns>>,
    /// Addresses that cool down, as a test put them: taken, by no one.
    pub cooling: RefCell<BTreeMap<Addr, Cooling>>,
    /// How many carried cooldowns to come are recorded but answered as
    /// refused, as a carry the client resent after a lost answer finds
    /// its own record.
    pub resent_carries: Cell<usize>,
    /// How many carried cooldowns to come find another one, a second
    /// longer, put just before them.
    pub raced_carries: Cell<usize>,
}

/// Whether `count` was above 0, counted down if so.
fn one_of(count: &Cell<usize>) -> bool {
    let left = count.get();
    count.set(left.saturating_sub(1));
    left > 0
}

impl FakeStore {
    /// The addresses held, as text.
    pub fn held(&self) -> Vec<String> {
        self.addresses
            .borrow()
            .keys()
            .map(|address| address.to_string())
            .collect()
    }
}

impl FakeStore {
    /// A claim, as the stores make it.
    fn record_claim(
        &self,
        owner: &Owner,
        held: &[PoolAddress],
        sticky: Option<&StickyClaim>,
    ) -> Result<bool, PoolError> {
        if self.losing_claims.get() > 0 {
            self.losing_claims.set(self.losing_claims.get() - 1);
            return Ok(false);
        }
        // As etcd's claim: a fenced node's claim fails.
        if self.fences.borrow().contains_key(&owner.node) {
            return Ok(false);
        }
        let key = (owner.id.clone(), owner.ifname.clone());
        let hold_key = sticky.map(|s| (s.workload.to_owned(), owner.ifname.clone()));
        let mut addresses = self.addresses.borrow_mut();
        // As the stores: one record per address, the attachment's first;
        // a workload's own records taken over, its hold as read.
        let repeated = held
            .iter()
            .enumerate()
            .any(|(i, h)| held[..i].iter().any(|e| e.address == h.address));
        let taken = |h: &PoolAddress| {
            self.cooling.borrow().contains_key(&h.address)
                || addresses.get(&h.address).is_some_and(|o| {
                    let kept = sticky
                        .and_then(|s| s.prior)
                        .is_some_and(|p| p.held.iter().any(|k| k.address == h.address));
                    !(kept && owner.owns(o))
                })
        };
        let hold_as_read = match (sticky, &hold_key) {
            (Some(sticky), Some(hold_key)) => self.holds.borrow().get(hold_key) == sticky.prior,
            _ => true,
        };
        if self.attachments.borrow().contains_key(&key)
            || repeated
            || !hold_as_read
            || held.iter().any(taken)
        {
            return Ok(false);
        }
        if let (Some(sticky), Some(hold_key)) = (sticky, hold_key) {
            for h in sticky.dropped(held) {
                if addresses.get(&h.address).is_some_and(|o| owner.owns(o)) {
                    addresses.remove(&h.address);
                }
            }
            let hold = WorkloadHold {
                revision: sticky.prior.map_or(1, |p| p.revision + 1),
                ..sticky.hold_after(owner, held)
            };
            self.holds.borrow_mut().insert(hold_key, hold);
        }
        let recorded = match sticky {
            Some(sticky) => Owner {
                id: String::new(),
                ..sticky.owner(owner)
            },
            None => owner.clone(),
        };
        for h in held {
            addresses.insert(h.address, recorded.clone());
            if let Some(next) = h.address.plus(1) {
                self.hints.borrow_mut().insert(h.pool.clone(), next);
                self.guesses.borrow_mut().insert(h.pool.clone(), next);
            }
        }
        let allocation = Allocation {
            owner: owner.clone(),
            held: held.to_vec(),
            revision: 1,
            since: clock::now(),
            legacy: false,
            record: None,
        };
        self.attachments.borrow_mut().insert(key, allocation);
        Ok(true)
    }

    /// Removes the records of `held` that name `owner` (or its workload).
    fn give_back(&self, owner: &Owner, held: &[PoolAddress]) {
        let mut addresses = self.addresses.borrow_mut();
        for h in held {
            if addresses.get(&h.address).is_some_and(|o| owner.owns(o)) {
                addresses.remove(&h.address);
                self.full.borrow_mut().remove(&h.pool);
            }
        }
    }
}

impl Store for FakeStore {
    fn allocation(
        &self,
        node: &str,
        id: &str,
        ifname: &str,
    ) -> Result<Option<Allocation>, PoolError> {
        // As etcd's: found under its node; a local store's have one node.
        Ok(self
            .attachments
            .borrow()
            .get(&(id.to_owned(), ifname.to_owned()))
            .filter(|h| self.local || h.owner.node == node)
            .cloned())
    }

    fn holder(&self, address: Addr) -> Result<Option<Holder>, PoolError> {
        if let Some(cooling) = self.cooling.borrow().get(&address) {
            return Ok(Some(Holder::Cooling(cooling.clone())));
        }
        Ok(self
            .addresses
            .borrow()
            .get(&address)
            .cloned()
            .map(Holder::Owner))
    }

    fn cools(&self) -> bool {
        // As a store whose configuration sets a cooldown, once a test
        // put one.
        !self.cooling.borrow().is_empty()
    }

    fn cooling(&self, from: Addr, to: Addr) -> Result<Vec<(Addr, Cooling)>, PoolError> {
        Ok(self
            .cooling
            .borrow()
            .range(from..=to)
            .map(|(a, c)| (*a, c.clone()))
            .collect())
    }

    fn end_cooling(&self, address: Addr) -> Result<bool, PoolError> {
        Ok(self.cooling.borrow_mut().remove(&address).is_some())
    }

    fn carry_cooling(&self, address: Addr, cooling: &Cooling) -> Result<bool, PoolError> {
        if one_of(&self.raced_carries) {
            let other = Cooling {
                until: cooling.until + 1,
                ..cooling.clone()
            };
            self.cooling.borrow_mut().insert(address, other);
        }
        if self.holder(address)?.is_some() {
            return Ok(false);
        }
        self.cooling.borrow_mut().insert(address, cooling.clone());
        Ok(!one_of(&self.resent_carries))
    }

    fn first_free(
        &self,
        from: Addr,
        to: Addr,
        gives: &dyn Fn(Addr) -> bool,
    ) -> Result<Option<Addr>, PoolError> {
        let addresses = self.addresses.borrow();
        let mut candidate = from;
        loop {
            self.looked_at.set(self.looked_at.get() + 1);
            // A search that goes address by address through a wide range
            // would never end: fail the test instead.
            assert!(
                self.looked_at.get() < LOOK_LIMIT,
                "the search enumerates the range"
            );
            let taken = addresses.contains_key(&candidate)
                || self.cooling.borrow().contains_key(&candidate);
            if gives(candidate) && !taken {
                return Ok(Some(candidate));
            }
            match candidate.plus(1) {
                Some(next) if next <= to => candidate = next,
                _ => return Ok(None),
            }
        }
    }

    fn hint(&self, _node: &str, pool: &str) -> Result<Option<Addr>, PoolError> {
        Ok(self.hints.borrow().get(pool).copied())
    }

    fn note_full(&self, pool: &str, cooling: &Cooldowns) -> Result<(), PoolError> {
        self.full
            .borrow_mut()
            .insert(pool.to_owned(), cooling.clone());
        Ok(())
    }

    fn noted_full(&self, pool: &str) -> Result<Option<Cooldowns>, PoolError> {
        Ok(self.full.borrow().get(pool).cloned())
    }

    fn claim(
        &self,
        owner: &Owner,
        held: &[PoolAddress],
        sticky: Option<&StickyClaim>,
    ) -> Result<bool, PoolError> {
        self.claims.set(self.claims.get() + 1);
        if self.refused_claims.get() > 0 {
            self.refused_claims.set(self.refused_claims.get() - 1);
            return Err(PoolError::Etcd(EtcdError::NoSpace {
                message: "etcdserver: mvcc: database space exceeded".into(),
            }));
        }
        let claimed = self.record_claim(owner, held, sticky)?;
        if self.unanswered_claims.get() > 0 {
            self.unanswered_claims.set(self.unanswered_claims.get() - 1);
            return Err(PoolError::Etcd(EtcdError::Unavailable {
                endpoints: "fake".into(),
                reason: "the answer was lost".into(),
            }));
        }
        Ok(claimed)
    }

    fn guess(&self, _node: &str, pool: &str) -> Option<Addr> {
        match self.guessing {
            true => self.guesses.borrow().get(pool).copied(),
            false => None,
        }
    }

    fn claim_or_look(
        &self,
        owner: &Owner,
        held: &[PoolAddress],
        looks: &[(Addr, Addr)],
    ) -> Result<Attempt, PoolError> {
        if self.claim(owner, held, None)? {
            return Ok(Attempt::Claimed);
        }
        self.looks.borrow_mut().extend_from_slice(looks);
        let addresses = self.addresses.borrow();
        let pages = looks
            .iter()
            .map(|(from, to)| {
                let held: Vec<Addr> = addresses
                    .range(*from..=*to)
                    .map(|(address, _)| *address)
                    .take(PAGE)
                    .collect();
                Page {
                    from: *from,
                    to: *to,
                    whole: held.len() < PAGE,
                    held,
                }
            })
            .collect();
        let key = (owner.id.clone(), owner.ifname.clone());
        Ok(Attempt::Refused(Seen {
            attached: self.attachments.borrow().contains_key(&key),
            fenced: self.fenced(&owner.node)?,
            pages,
        }))
    }

    fn free_record(&self, address: Addr, holder: &Owner) -> Result<bool, PoolError> {
        if self.holder(address)?.as_ref().and_then(Holder::owner) != Some(holder)
            || super::listed_by(self, holder)?.contains(&address)
        {
            return Ok(false);
        }
        Ok(self.addresses.borrow_mut().remove(&address).is_some())
    }

    fn release(&self, allocation: &Allocation) -> Result<bool, PoolError> {
        let owner = &allocation.owner;
        let key = (owner.id.clone(), owner.ifname.clone());
        if self.attachments.borrow().get(&key) != Some(allocation) {
            return Ok(false);
        }
        let mut kept = false;
        if let Some(workload) = &owner.workload {
            let mut holds = self.holds.borrow_mut();
            if let Some(hold) = holds.get_mut(&(workload.clone(), owner.ifname.clone())) {
                if hold.container.as_deref() == Some(owner.id.as_str()) {
                    *hold = WorkloadHold {
                        revision: hold.revision + 1,
                        ..hold.released(clock::now())
                    };
                }
                kept = true;
            }
        }
        if !kept {
            self.give_back(owner, &allocation.held);
        }
        self.attachments.borrow_mut().remove(&key);
        Ok(true)
    }

    fn workload_hold(
        &self,
        workload: &str,
        ifname: &str,
    ) -> Result<Option<WorkloadHold>, PoolError> {
        let key = (workload.to_owned(), ifname.to_owned());
        Ok(self.holds.borrow().get(&key).cloned())
    }

    fn workload_holds(&self) -> Result<Vec<WorkloadHold>, PoolError> {
        Ok(self.holds.borrow().values().cloned().collect())
    }

    fn end_hold(&self, hold: &WorkloadHold) -> Result<bool, PoolError> {
        let key = (hold.workload.clone(), hold.ifname.clone());
        if self.holds.borrow().get(&key) != Some(hold) {
            return Ok(false);
        }
        if let Some(id) = &hold.container {
            if self.allocation(&hold.node, id, &hold.ifname)?.is_some() {
                return Ok(false);
            }
        }
        self.give_back(&hold.owner(), &hold.held);
        self.holds.borrow_mut().remove(&key);
        Ok(true)
    }

    fn allocations(&self) -> Result<Vec<Allocation>, PoolError> {
        Ok(self.attachments.borrow().values().cloned().collect())
    }

    fn allocations_of(&self, node: &str) -> Result<Vec<Allocation>, PoolError> {
        let all = self.allocations()?;
        Ok(all
            .into_iter()
            .filter(|h| self.local || h.owner.node == node)
            .collect())
    }

    fn address_records(&self) -> Result<Vec<(Addr, Option<Owner>)>, PoolError> {
        Ok(self
            .addresses
            .borrow()
            .iter()
            .map(|(address, owner)| (*address, Some(owner.clone())))
            .collect())
    }

    fn pool_definition(&self, name: &str) -> Result<Option<Value>, PoolError> {
        Ok(self.pools.get(name).cloned())
    }

    fn fenced(&self, node: &str) -> Result<Option<PoolError>, PoolError> {
        Ok(self
            .fences
            .borrow()
            .get(node)
            .cloned()
            .map(PoolError::Fenced))
    }

    fn ping(&self) -> Result<(), PoolError> {
        Ok(())
    }

    fn is_shared(&self) -> bool {
        !self.local
    }
}
