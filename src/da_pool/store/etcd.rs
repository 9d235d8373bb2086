//! The etcd store: every node of a cluster shares the pools.
//!
//! ```text
//! PREFIX/networks/NETWORK/attachments/ID:IFNAME    what the attachment holds
//! PREFIX/networks/NETWORK/addresses/ADDRESS        who holds the address, from which pool
//! PREFIX/networks/NETWORK/holds/WORKLOAD:IFNAME    what a workload's hold keeps for it
//! PREFIX/networks/NETWORK/hints/POOL               where to look next in the pool
//! PREFIX/pools/NAME                                a pool defined centrally
//! ```
//!
//! A claim also needs its node not fenced (`PREFIX/nodes/NODE/fenced`,
//! see `nodes`).
//!
//! Each address is one key of the network, whatever pool names it,
//! written with its attachment's record in one transaction that fails if
//! any of those keys exists: two nodes can never hold one address, and a
//! claim is all there or not at all. Addresses are named so that their
//! keys sort as they do, and a free one is found by reading the held keys
//! from where the search starts, a page at a time. A workload's hold
//! changes in the same transaction as the addresses it keeps.

use serde_json::Value;

use super::{self as store, Held, Hold, Holding, Owner, Sticky, Store};
use crate::addr::Addr;
use crate::da_pool::{nodes, PoolError};
use crate::error::Error;
use crate::etcd::{Client, Compare, EtcdError, Op};

/// How many held keys one read looks at while searching for a free address.
const PAGE: usize = 256;

/// What the record of an address says of an owner.
enum Record {
    Absent,
    /// The owner's (or its workload's), last written at this revision.
    Owned(i64),
    Other,
}

/// A network's keys in a cluster.
pub struct Etcd {
    client: Client,
    /// `PREFIX/networks/NETWORK/`.
    network: String,
    /// What every transaction also needs to hold.
    guard: Vec<Compare>,
    /// What every transaction also does.
    also: Vec<Op>,
}

impl Etcd {
    /// The store of network `name` on the cluster `client` reaches.
    pub fn new(client: Client, name: &str) -> Etcd {
        let network = format!("{}/networks/{name}/", client.settings().prefix);
        Etcd {
            client,
            network,
            guard: Vec::new(),
            also: Vec::new(),
        }
    }

    /// Sets what every change from now on also needs to hold and also
    /// does (`reclaim`: the node's registration is still absent, and the
    /// node is fenced).
    pub fn set_guard(&mut self, guard: Vec<Compare>, also: Vec<Op>) {
        self.guard = guard;
        self.also = also;
    }

    /// The client the store talks through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Runs `ops` if the guard and `compares` hold.
    fn txn(&self, mut compares: Vec<Compare>, ops: &[Op]) -> Result<bool, Error> {
        compares.extend(self.guard.iter().cloned());
        if self.also.is_empty() {
            return self.client.txn(&compares, ops);
        }
        let mut ops = ops.to_vec();
        ops.extend(self.also.iter().cloned());
        self.client.txn(&compares, &ops)
    }

    /// What a claim of `owner`'s needs: its node not fenced (a fence
    /// written after the ADD looked makes the claim fail).
    fn unfenced(&self, owner: &Owner) -> Compare {
        let prefix = &self.client.settings().prefix;
        Compare::Absent(nodes::node_key(prefix, &owner.node, "fenced"))
    }

    fn hold_key(&self, workload: &str, ifname: &str) -> Vec<u8> {
        format!(
            "{}holds/{}",
            self.network,
            store::hold_name(workload, ifname)
        )
        .into_bytes()
    }

    /// What the record of `address` says of `owner`, as read now.
    fn record_of(&self, owner: &Owner, address: Addr) -> Result<Record, Error> {
        Ok(match self.client.get(&self.address_key(address))? {
            None => Record::Absent,
            Some(kv) if store::read_owner(&kv.value).is_some_and(|o| owner.owns(&o)) => {
                Record::Owned(kv.mod_revision)
            }
            Some(_) => Record::Other,
        })
    }

    /// Adds to `compares` and `ops` the removal of each record of `held`
    /// that names `owner` (or its workload), as read now.
    fn give_back(
        &self,
        owner: &Owner,
        held: &[Held],
        compares: &mut Vec<Compare>,
        ops: &mut Vec<Op>,
    ) -> Result<(), Error> {
        for h in held {
            if let Record::Owned(revision) = self.record_of(owner, h.address)? {
                let key = self.address_key(h.address);
                compares.push(Compare::Unchanged(key.clone(), revision));
                ops.push(Op::Delete(key));
            }
        }
        Ok(())
    }

    /// Adds to `ops` the hint of each pool of `held`: just after it.
    fn hint_after(&self, held: &[Held], ops: &mut Vec<Op>) {
        for h in held {
            if let Some(next) = h.address.plus(1) {
                ops.push(Op::Put(
                    self.hint_key(&h.pool),
                    next.to_string().into_bytes(),
                ));
            }
        }
    }

    /// A claim for a workload's container, in one transaction: the
    /// attachment absent and the hold as read; each address the workload's
    /// already (as read) or absent and recorded as the workload's; what
    /// the prior hold kept and the claim does not, given back; the hold
    /// bound to the container.
    fn claim_for_workload(
        &self,
        owner: &Owner,
        held: &[Held],
        sticky: &Sticky,
    ) -> Result<bool, Error> {
        let owner = &sticky.owner(owner);
        let attachment = self.attachment_key(&owner.id, &owner.ifname);
        let hold = self.hold_key(sticky.workload, &owner.ifname);
        let mut compares = vec![
            Compare::Absent(attachment.clone()),
            self.unfenced(owner),
            match sticky.prior {
                Some(prior) => Compare::Unchanged(hold.clone(), prior.revision),
                None => Compare::Absent(hold.clone()),
            },
        ];
        let mut ops = vec![
            Op::Put(attachment, store::attachment_record(owner, held)),
            Op::Put(hold, store::hold_record(&sticky.hold(owner, held))),
        ];
        let prior: &[Held] = sticky.prior.map_or(&[], |p| &p.held);
        for h in held {
            let key = self.address_key(h.address);
            // Only an address the prior hold kept can be the workload's.
            let record = match prior.iter().any(|p| p.address == h.address) {
                true => self.record_of(owner, h.address)?,
                false => Record::Absent,
            };
            match record {
                Record::Owned(revision) => compares.push(Compare::Unchanged(key, revision)),
                Record::Other => return Ok(false),
                Record::Absent => {
                    compares.push(Compare::Absent(key.clone()));
                    ops.push(Op::Put(key, store::address_record(owner, &h.pool)));
                }
            }
        }
        let dropped: Vec<Held> = sticky.dropped(held).cloned().collect();
        self.give_back(owner, &dropped, &mut compares, &mut ops)?;
        self.hint_after(held, &mut ops);
        self.txn(compares, &ops)
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

    fn claim(&self, owner: &Owner, held: &[Held], sticky: Option<&Sticky>) -> Result<bool, Error> {
        if let Some(sticky) = sticky {
            return self.claim_for_workload(owner, held, sticky);
        }
        let attachment = self.attachment_key(&owner.id, &owner.ifname);
        let mut compares = vec![Compare::Absent(attachment.clone()), self.unfenced(owner)];
        let mut ops = vec![Op::Put(attachment, store::attachment_record(owner, held))];
        for h in held {
            let key = self.address_key(h.address);
            compares.push(Compare::Absent(key.clone()));
            ops.push(Op::Put(key, store::address_record(owner, &h.pool)));
        }
        self.hint_after(held, &mut ops);
        self.txn(compares, &ops)
    }

    fn release(&self, holding: &Holding) -> Result<bool, Error> {
        let owner = &holding.owner;
        let attachment = self.attachment_key(&owner.id, &owner.ifname);
        let mut compares = vec![Compare::Unchanged(attachment.clone(), holding.revision)];
        let mut ops = vec![Op::Delete(attachment)];
        let mut kept = false;
        let mut hold_put = None;
        if let Some(workload) = &owner.workload {
            let key = self.hold_key(workload, &owner.ifname);
            match self.hold(workload, &owner.ifname)? {
                Some(hold) => {
                    compares.push(Compare::Unchanged(key.clone(), hold.revision));
                    if hold.container.as_deref() == Some(owner.id.as_str()) {
                        let released = hold.released(store::now());
                        hold_put = Some(Op::Put(key, store::hold_record(&released)));
                    }
                    kept = true;
                }
                // Ended by an operator: nothing keeps the addresses.
                None => compares.push(Compare::Absent(key)),
            }
        }
        if !kept {
            self.give_back(owner, &holding.held, &mut compares, &mut ops)?;
        }
        let Some(put) = hold_put else {
            return self.txn(compares, &ops);
        };
        let deletes = ops.clone();
        ops.push(put);
        match self.txn(compares.clone(), &ops) {
            // A full etcd takes deletes only: the hold stays bound to the
            // container whose attachment goes, and so ends `stickyFor`
            // after it was bound rather than after now.
            Err(Error::Etcd(EtcdError::NoSpace { .. })) => self.txn(compares, &deletes),
            done => done,
        }
    }

    fn hold(&self, workload: &str, ifname: &str) -> Result<Option<Hold>, Error> {
        let found = self.client.get(&self.hold_key(workload, ifname))?;
        Ok(found
            .and_then(|kv| store::read_hold(&kv.value, kv.mod_revision))
            .filter(|hold| hold.workload == workload))
    }

    fn holds(&self) -> Result<Vec<Hold>, Error> {
        let prefix = format!("{}holds/", self.network);
        let found = self.client.with_prefix(prefix.as_bytes())?;
        Ok(found
            .iter()
            .filter_map(|kv| store::read_hold(&kv.value, kv.mod_revision))
            .collect())
    }

    fn end_hold(&self, hold: &Hold) -> Result<bool, Error> {
        let key = self.hold_key(&hold.workload, &hold.ifname);
        let mut compares = vec![Compare::Unchanged(key.clone(), hold.revision)];
        if let Some(id) = &hold.container {
            compares.push(Compare::Absent(self.attachment_key(id, &hold.ifname)));
        }
        let mut ops = vec![Op::Delete(key)];
        self.give_back(&hold.owner(), &hold.held, &mut compares, &mut ops)?;
        self.txn(compares, &ops)
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

    fn fenced(&self, node: &str) -> Result<Option<PoolError>, Error> {
        Ok(nodes::fence(&self.client, node)?.map(|fence| fence.refusal()))
    }

    fn ping(&self) -> Result<(), Error> {
        self.client.get(self.network.as_bytes()).map(drop)
    }

    fn is_shared(&self) -> bool {
        true
    }
}
