//! An in-memory store for the allocator's tests: records in maps, claims
//! that can be made to lose a race, and a count of the addresses looked at.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::range::Addr;
use super::store::{Held, Holding, Owner, Store};
use crate::error::Error;

/// A store in memory.
#[derive(Default)]
pub struct Fake {
    pub attachments: RefCell<BTreeMap<(String, String), Holding>>,
    pub addresses: RefCell<BTreeMap<(String, Addr), Owner>>,
    pub hints: RefCell<HashMap<String, Addr>>,
    /// Pools the store defines, as etcd's `PREFIX/pools/NAME`.
    pub pools: HashMap<String, Value>,
    /// How many claims to come lose a race, as if another node won.
    pub losing_claims: Cell<usize>,
    /// How many addresses `first_free` has looked at.
    pub looked_at: Cell<u128>,
}

impl Fake {
    /// The addresses held, as text.
    pub fn held(&self) -> Vec<String> {
        self.addresses
            .borrow()
            .keys()
            .map(|(_, address)| address.to_string())
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

    fn holder(&self, pool: &str, address: Addr) -> Result<Option<Owner>, Error> {
        Ok(self
            .addresses
            .borrow()
            .get(&(pool.to_owned(), address))
            .cloned())
    }

    fn first_free(
        &self,
        pool: &str,
        from: Addr,
        to: Addr,
        gives: &dyn Fn(Addr) -> bool,
    ) -> Result<Option<Addr>, Error> {
        let addresses = self.addresses.borrow();
        let mut candidate = from;
        loop {
            self.looked_at.set(self.looked_at.get() + 1);
            if gives(candidate) && !addresses.contains_key(&(pool.to_owned(), candidate)) {
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
        if self.attachments.borrow().contains_key(&key)
            || held
                .iter()
                .any(|h| addresses.contains_key(&(h.pool.clone(), h.address)))
        {
            return Ok(false);
        }
        for h in held {
            addresses.insert((h.pool.clone(), h.address), owner.clone());
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
            let slot = (h.pool.clone(), h.address);
            if addresses
                .get(&slot)
                .is_some_and(|o| o.id == holding.owner.id)
            {
                addresses.remove(&slot);
            }
        }
        self.attachments.borrow_mut().remove(&key);
        Ok(true)
    }

    fn holdings(&self) -> Result<Vec<Holding>, Error> {
        Ok(self.attachments.borrow().values().cloned().collect())
    }

    fn pool_definition(&self, name: &str) -> Result<Option<Value>, Error> {
        Ok(self.pools.get(name).cloned())
    }

    fn ping(&self) -> Result<(), Error> {
        Ok(())
    }
}
