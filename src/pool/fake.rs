//! An in-memory store for the allocator's tests: records in maps, claims
//! that can be made to lose a race, and a count of the addresses looked at.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::range::Addr;
use super::store::{Held, Holding, Owner, Store};
use crate::error::Error;

/// More addresses than any test's search may look at.
const LOOK_LIMIT: u128 = 1 << 20;

/// A store in memory.
#[derive(Default)]
pub struct Fake {
    pub attachments: RefCell<BTreeMap<(String, String), Holding>>,
    pub addresses: RefCell<BTreeMap<Addr, Owner>>,
    pub hints: RefCell<HashMap<String, Addr>>,
    /// Pools the store defines, as etcd's `PREFIX/pools/NAME`.
    pub pools: HashMap<String, Value>,
    /// How many claims to come lose a race, as if another node won.
    pub losing_claims: Cell<usize>,
    /// How many addresses `first_free` has looked at.
    pub looked_at: Cell<u128>,
    /// Whether it stands for a local store (one node's records only).
    pub local: bool,
}

impl Fake {
    /// The addresses held, as text.
    pub fn held(&self) -> Vec<String> {
        self.addresses
            .borrow()
            .keys()
            .map(|address| address.to_string())
            .collect()
    }
}

impl Store for Fake {
    fn holding(&self, id: &str, ifname: &str) -> Result<Option<Holding>, Error> {
        Ok(self
            .attachments
            .borrow()
            .get(&(id.to_owned(), ifname.to_owned()))
            .cloned())
    }

    fn holder(&self, address: Addr) -> Result<Option<Owner>, Error> {
        Ok(self.addresses.borrow().get(&address).cloned())
    }

    fn first_free(
        &self,
        from: Addr,
        to: Addr,
        gives: &dyn Fn(Addr) -> bool,
    ) -> Result<Option<Addr>, Error> {
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
            if gives(candidate) && !addresses.contains_key(&candidate) {
                return Ok(Some(candidate));
            }
            match candidate.plus(1) {
                Some(next) if next <= to => candidate = next,
                _ => return Ok(None),
            }
        }
    }

    fn hint(&self, pool: &str) -> Result<Option<Addr>, Error> {
        Ok(self.hints.borrow().get(pool).copied())
    }

    fn claim(&self, owner: &Owner, held: &[Held]) -> Result<bool, Error> {
        if self.losing_claims.get() > 0 {
            self.losing_claims.set(self.losing_claims.get() - 1);
            return Ok(false);
        }
        let key = (owner.id.clone(), owner.ifname.clone());
        let mut addresses = self.addresses.borrow_mut();
        // As the stores: one record per address, the attachment's first.
        let repeated = held
            .iter()
            .enumerate()
            .any(|(i, h)| held[..i].iter().any(|e| e.address == h.address));
        if self.attachments.borrow().contains_key(&key)
            || repeated
            || held.iter().any(|h| addresses.contains_key(&h.address))
        {
            return Ok(false);
        }
        for h in held {
            addresses.insert(h.address, owner.clone());
            if let Some(next) = h.address.plus(1) {
                self.hints.borrow_mut().insert(h.pool.clone(), next);
            }
        }
        let holding = Holding {
            owner: owner.clone(),
            held: held.to_vec(),
            revision: 1,
            since: super::store::now(),
        };
        self.attachments.borrow_mut().insert(key, holding);
        Ok(true)
    }

    fn release(&self, holding: &Holding) -> Result<bool, Error> {
        let key = (holding.owner.id.clone(), holding.owner.ifname.clone());
        if self.attachments.borrow().get(&key) != Some(holding) {
            return Ok(false);
        }
        let mut addresses = self.addresses.borrow_mut();
        for h in &holding.held {
            if addresses
                .get(&h.address)
                .is_some_and(|o| o.same_attachment(&holding.owner))
            {
                addresses.remove(&h.address);
            }
        }
        self.attachments.borrow_mut().remove(&key);
        Ok(true)
    }

    fn holdings(&self) -> Result<Vec<Holding>, Error> {
        Ok(self.attachments.borrow().values().cloned().collect())
    }

    fn address_records(&self) -> Result<Vec<(Addr, Option<Owner>)>, Error> {
        Ok(self
            .addresses
            .borrow()
            .iter()
            .map(|(address, owner)| (*address, Some(owner.clone())))
            .collect())
    }

    fn pool_definition(&self, name: &str) -> Result<Option<Value>, Error> {
        Ok(self.pools.get(name).cloned())
    }

    fn ping(&self) -> Result<(), Error> {
        Ok(())
    }

    fn is_shared(&self) -> bool {
        !self.local
    }
}
