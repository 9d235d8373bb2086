//! The etcd store: every node of a cluster shares the pools.
//!
//! ```text
//! PREFIX/networks/NETWORK/attachments/ID:IFNAME    what the attachment holds
//! PREFIX/networks/NETWORK/addresses/ADDRESS        who holds the address, from which pool
//! PREFIX/networks/NETWORK/hints/POOL               where to look next in the pool
//! PREFIX/pools/NAME                                a pool defined centrally
//! ```
//!
//! Each address is one key of the network, whatever pool names it,
//! written with its attachment's record in one transaction that fails if
//! any of those keys exists: two nodes can never hold one address, and a
//! claim is all there or not at all. Addresses are named so that their
//! keys sort as they do, and a free one is found by reading the held keys
//! from where the search starts, a page at a time.

use serde_json::Value;

use super::range::Addr;
use super::store::{self, Held, Holding, Owner, Store};
use crate::error::Error;
use crate::etcd::{Client, Compare, Op};

/// How many held keys one read looks at while searching for a free address.
const PAGE: usize = 256;

/// A network's keys in a cluster.
pub struct Etcd {
    client: Client,
    /// `PREFIX/networks/NETWORK/`.
    network: String,
}

impl Etcd {
    /// The store of network `name` on the cluster `client` reaches.
    pub fn new(client: Client, name: &str) -> Etcd {
        let network = format!("{}/networks/{name}/", client.settings().prefix);
        Etcd { client, network }
    }

    fn attachment_key(&self, id: &str, ifname: &str) -> Vec<u8> {
        format!(
            "{}attachments/{}",
            self.network,
            store::attachment_name(id, ifname)
        )
        .into_bytes()
    }

    fn addresses_prefix(&self) -> String {
        format!("{}addresses/", self.network)
    }

    fn address_key(&self, address: Addr) -> Vec<u8> {
        format!("{}{}", self.addresses_prefix(), address.sortable()).into_bytes()
    }

    fn hint_key(&self, pool: &str) -> Vec<u8> {
        format!("{}hints/{pool}", self.network).into_bytes()
    }
}

impl Store for Etcd {
    fn holding(&self, id: &str, ifname: &str) -> Result<Option<Holding>, Error> {
        let found = self.client.get(&self.attachment_key(id, ifname))?;
        Ok(found.and_then(|kv| store::read_holding(&kv.value, kv.mod_revision)))
    }

    fn holder(&self, address: Addr) -> Result<Option<Owner>, Error> {
        let found = self.client.get(&self.address_key(address))?;
        // A record that says no one still makes the address taken.
        Ok(found.map(|kv| store::read_owner(&kv.value).unwrap_or_else(Owner::unknown)))
    }

    fn first_free(
        &self,
        from: Addr,
        to: Addr,
        gives: &dyn Fn(Addr) -> bool,
    ) -> Result<Option<Addr>, Error> {
        let prefix = self.addresses_prefix();
        let mut end = self.address_key(to);
        // Just after `to`'s key: the read is of [from, to].
        end.push(0);
        let mut candidate = from;
        let mut read_from = self.address_key(from);
        loop {
            let page = self.client.range(&read_from, &end, PAGE, true)?;
            if let Some(last) = page.last() {
                // The next page starts after this one, whatever its keys.
                read_from = last.key.clone();
                read_from.push(0);
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

    fn hint(&self, pool: &str) -> Result<Option<Addr>, Error> {
        let found = self.client.get(&self.hint_key(pool))?;
        Ok(found.and_then(|kv| {
            std::str::from_utf8(&kv.value)
                .ok()?
                .trim()
                .parse()
                .ok()
                .map(Addr::new)
        }))
    }

    fn claim(&self, owner: &Owner, held: &[Held]) -> Result<bool, Error> {
        let attachment = self.attachment_key(&owner.id, &owner.ifname);
        let mut compares = vec![Compare::Absent(attachment.clone())];
        let mut ops = vec![Op::Put(attachment, store::attachment_record(owner, held))];
        for h in held {
            let key = self.address_key(h.address);
            compares.push(Compare::Absent(key.clone()));
            ops.push(Op::Put(key, store::address_record(owner, &h.pool)));
            if let Some(next) = h.address.plus(1) {
                ops.push(Op::Put(
                    self.hint_key(&h.pool),
                    next.to_string().into_bytes(),
                ));
            }
        }
        self.client.txn(&compares, &ops)
    }

    fn release(&self, holding: &Holding) -> Result<bool, Error> {
        let attachment = self.attachment_key(&holding.owner.id, &holding.owner.ifname);
        let mut compares = vec![Compare::Unchanged(attachment.clone(), holding.revision)];
        let mut ops = vec![Op::Delete(attachment)];
        for h in &holding.held {
            let key = self.address_key(h.address);
            let Some(kv) = self.client.get(&key)? else {
                continue;
            };
            let mine =
                store::read_owner(&kv.value).is_some_and(|o| o.same_attachment(&holding.owner));
            if mine {
                compares.push(Compare::Unchanged(key.clone(), kv.mod_revision));
                ops.push(Op::Delete(key));
            }
        }
        self.client.txn(&compares, &ops)
    }

    fn holdings(&self) -> Result<Vec<Holding>, Error> {
        let prefix = format!("{}attachments/", self.network);
        let found = self.client.with_prefix(prefix.as_bytes())?;
        Ok(found
            .iter()
            .filter_map(|kv| store::read_holding(&kv.value, kv.mod_revision))
            .collect())
    }

    fn address_records(&self) -> Result<Vec<(Addr, Option<Owner>)>, Error> {
        let prefix = self.addresses_prefix();
        let found = self.client.with_prefix(prefix.as_bytes())?;
        Ok(found
            .iter()
            .filter_map(|kv| {
                let name = std::str::from_utf8(kv.key.strip_prefix(prefix.as_bytes())?).ok()?;
                Some((Addr::from_sortable(name)?, store::read_owner(&kv.value)))
            })
            .collect())
    }

    fn pool_definition(&self, name: &str) -> Result<Option<Value>, Error> {
        let key = format!("{}/pools/{name}", self.client.settings().prefix);
        let Some(kv) = self.client.get(key.as_bytes())? else {
            return Ok(None);
        };
        serde_json::from_slice(&kv.value).map(Some).map_err(|e| {
            crate::cni::Error::InvalidConfig(format!(
                "pool {name:?} in etcd ({key}) is not JSON: {e}"
            ))
            .into()
        })
    }

    fn ping(&self) -> Result<(), Error> {
        self.client.get(self.network.as_bytes()).map(drop)
    }

    fn is_shared(&self) -> bool {
        true
    }
}
