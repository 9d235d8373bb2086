//! Where the allocator keeps its records, behind one interface: the
//! [`Store`] trait, which every command talks to and which never decides
//! what a CNI command means; the stores, [`LocalStore`] (files on this
//! node), [`EtcdStore`] (keys every node of a cluster shares) and a fake
//! for the tests; and [`Stores`], the one way a command opens one. A new
//! store is a file here, a line of [`Stores`], and its settings.

mod etcd_store;
#[cfg(test)]
pub mod fake_store;
pub mod fence;
mod local_store;
pub mod records;

use std::cell::OnceCell;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use serde_json::Value;

use crate::addr::{Addr, Range};
use crate::da_pool::error::{Cooldowns, PoolError};
use crate::da_pool::settings::{Settings, StoreSettings};
use crate::etcd::{EtcdClient, EtcdSettings};
pub use etcd_store::{EtcdStore, Guard, Released, LAYOUT};
pub use local_store::LocalStore;
pub use records::{Allocation, Cooling, Holder, Owner, PoolAddress, StickyClaim, WorkloadHold};

/// How many times a command starts again after losing a race for a record
/// to another node, before it says "try again later".
pub const ATTEMPTS: usize = 8;

/// How many addresses one look of a search covers: one page of etcd keys
/// costs what one key does, a few probes of local files next to nothing.
/// A node's hint that lags its next address by less finds it all the same.
pub const WINDOW: u128 = 16;

/// Where allocations are kept, for one network. An address is held at
/// most once in a network, whatever pool names it.
pub trait Store {
    /// What the attachment (`id`, `ifname`) of node `node` holds, if
    /// anything.
    fn allocation(
        &self,
        node: &str,
        id: &str,
        ifname: &str,
    ) -> Result<Option<Allocation>, PoolError>;

    /// Who holds `address`, or until when it cools down, if it has a
    /// record that counts (on the local store, a cooldown that has ended
    /// does not).
    fn holder(&self, address: Addr) -> Result<Option<Holder>, PoolError>;

    /// Whether what it gives back cools down (`reuseAfter` set).
    fn cools(&self) -> bool;

    /// The addresses from `from` to `to` that cool down now, in order.
    fn cooling(&self, from: Addr, to: Addr) -> Result<Vec<(Addr, Cooling)>, PoolError>;

    /// Ends the cooldown of `address` (an operator's `release --now`):
    /// `Ok(false)`, and nothing changed, if it does not cool down.
    fn end_cooling(&self, address: Addr) -> Result<bool, PoolError>;

    /// Puts on `address`, which has no record here, a cooldown brought
    /// from another store (`import`), lasting until `cooling.until`:
    /// `Ok(false)`, and nothing changed, if it has a record.
    fn carry_cooling(&self, address: Addr, cooling: &Cooling) -> Result<bool, PoolError>;

    /// The first address from `from` to `to` that nobody holds and that
    /// `gives` allows; never enumerating more than it must.
    fn first_free(
        &self,
        from: Addr,
        to: Addr,
        gives: &dyn Fn(Addr) -> bool,
    ) -> Result<Option<Addr>, PoolError>;

    /// Where node `node` starts looking for a free address of `pool`:
    /// just after the last one it gave (near it, on etcd, where the hint
    /// is written only when it has moved far).
    fn hint(&self, node: &str, pool: &str) -> Result<Option<Addr>, PoolError>;

    /// Notes that a search went through the whole of `pool` and found it
    /// full, with `cooling` of its addresses cooling down, so that the ADDs
    /// a runtime retries in the next moments do not read it whole again;
    /// any address given back ends the note.
    fn note_full(&self, pool: &str, cooling: &Cooldowns) -> Result<(), PoolError>;

    /// Whether a search found `pool` full moments ago, as noted: what it
    /// noted of its cooldowns, if it did.
    fn noted_full(&self, pool: &str) -> Result<Option<Cooldowns>, PoolError>;

    /// Where node `node` expects the next free address of `pool`, from
    /// what it noted itself: no request. `None` where it noted nothing,
    /// and on a store that does not guess (a local store, whose reads
    /// cost next to nothing).
    fn guess(&self, _node: &str, _pool: &str) -> Option<Addr> {
        None
    }

    /// As [`Store::claim`], for an attachment without a workload; where
    /// the claim fails, what the next try needs ([`Seen`]): on etcd, read
    /// in the same round trip, with, for each `(from, to)` of `looks`, the
    /// addresses held from `from` to `to`.
    fn claim_or_look(
        &self,
        owner: &Owner,
        held: &[PoolAddress],
        looks: &[(Addr, Addr)],
    ) -> Result<Attempt, PoolError> {
        let _ = looks;
        if self.claim(owner, held, None)? {
            return Ok(Attempt::Claimed);
        }
        Ok(Attempt::Refused(Seen {
            attached: self
                .allocation(&owner.node, &owner.id, &owner.ifname)?
                .is_some(),
            fenced: self.fenced(&owner.node)?,
            pages: Vec::new(),
        }))
    }

    /// What `owner`'s node noted of the attachment's claim, if it keeps
    /// notes: an allocation to release without reading it first, which
    /// [`Store::release`] releases only if the records are still as
    /// noted.
    fn noted(&self, _owner: &Owner) -> Option<Allocation> {
        None
    }

    /// Forgets `node`'s notes of claims at least `older_than` old whose
    /// attachments are not among `live`, the node's as the store holds
    /// them: released where the node's notes are not (an operator's
    /// `release` on another machine, a migration, a rebuilt store), they
    /// would otherwise stay on disk for good. A younger note may be an
    /// ADD's that finished after `live` was read.
    fn forget_notes_except(&self, _node: &str, _live: &[Allocation], _older_than: Duration) {}

    /// Records that `owner` holds `held` (an address of each pool), all of
    /// it or none: `Ok(false)`, and nothing changed, if an address was
    /// taken meanwhile or the attachment holds something already. With
    /// `sticky`, the addresses are recorded as the workload's, its hold
    /// bound to the container: those the prior hold
    /// listed are taken over, if still the workload's, the others given
    /// back; `Ok(false)` too if the hold changed meanwhile.
    fn claim(
        &self,
        owner: &Owner,
        held: &[PoolAddress],
        sticky: Option<&StickyClaim>,
    ) -> Result<bool, PoolError>;

    /// Gives back what `allocation` holds, as it was read: `Ok(false)`, and
    /// nothing changed, if it changed meanwhile. Addresses held for a
    /// workload stay held by its hold, released for its `sticky_for`
    /// (unless another container of the workload holds them now); without
    /// a hold, they are given back.
    fn release(&self, allocation: &Allocation) -> Result<bool, PoolError>;

    /// Removes the record of `address` if it names `holder` (as
    /// [`Store::holder`] reads it: [`Owner::unknown`] for a record that
    /// names no one) and what it names does not list it ([`listed_by`]),
    /// both as they are now and until the record is gone: a record that no
    /// DEL or GC will free. `Ok(false)`, and nothing changed, otherwise.
    fn free_record(&self, address: Addr, holder: &Owner) -> Result<bool, PoolError>;

    /// The hold of `workload` for interface `ifname`, if it has one.
    fn workload_hold(
        &self,
        workload: &str,
        ifname: &str,
    ) -> Result<Option<WorkloadHold>, PoolError>;

    /// Every workload's hold in the network.
    fn workload_holds(&self) -> Result<Vec<WorkloadHold>, PoolError>;

    /// Ends `hold` as it was read, giving back the addresses it keeps:
    /// `Ok(false)`, and nothing changed, if it changed meanwhile or a
    /// container's attachment holds it (its addresses are in use).
    fn end_hold(&self, hold: &WorkloadHold) -> Result<bool, PoolError>;

    /// What every attachment of the network holds.
    fn allocations(&self) -> Result<Vec<Allocation>, PoolError>;

    /// What node `node`'s attachments hold (GC's), read without reading
    /// every node's: on etcd, one prefix.
    fn allocations_of(&self, node: &str) -> Result<Vec<Allocation>, PoolError>;

    /// Every address record of the network that someone holds, with the
    /// owner it names (`None` for a record that does not say who: torn,
    /// or not ours); not those that cool down.
    fn address_records(&self) -> Result<Vec<(Addr, Option<Owner>)>, PoolError>;

    /// The ranges of pool `name` as the store defines them (etcd's
    /// `PREFIX/pools/NAME`), if it does.
    fn pool_definition(&self, name: &str) -> Result<Option<Value>, PoolError>;

    /// Why `node` may not claim, if it may not: `reclaim` gave back what
    /// it held, and fenced it (etcd only).
    fn fenced(&self, node: &str) -> Result<Option<PoolError>, PoolError>;

    /// How many addresses from `from` to `to` have a record, if the store
    /// counts them without reading the records (etcd counts keys); `None`
    /// where reading them is as cheap.
    fn count_held(&self, _from: Addr, _to: Addr) -> Result<Option<u64>, PoolError> {
        Ok(None)
    }

    /// Whether the store can answer now.
    fn ping(&self) -> Result<(), PoolError>;

    /// Whether other nodes keep records here too (GC must then leave
    /// theirs alone); a local store's are all this node's, whatever name
    /// the node had when it made them.
    fn is_shared(&self) -> bool;
}

/// What a claim that failed saw ([`Store::claim_or_look`]).
#[derive(Debug, Default)]
pub struct Seen {
    /// The attachment has a record already: an ADD repeated, or one whose
    /// answer was lost.
    pub attached: bool,
    /// Why the node may not claim, if it is fenced.
    pub fenced: Option<PoolError>,
    /// What each look found, in order; none if the store read nothing.
    pub pages: Vec<Page>,
}

/// How a claim with looks went.
#[derive(Debug)]
pub enum Attempt {
    /// Recorded.
    Claimed,
    /// Nothing recorded, and what was seen instead.
    Refused(Seen),
}

/// The addresses held from `from` to `to`, as one read found them: all of
/// them if `whole`, else as many as a page holds, the first ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub from: Addr,
    pub to: Addr,
    /// In order.
    pub held: Vec<Addr>,
    pub whole: bool,
}

impl Page {
    /// Up to `count` addresses of `range`, in order from the page's
    /// start, that the page says nobody holds and that `gives` allows;
    /// none past what the page knows of (its last held address, unless it
    /// is whole). Excluded blocks are stepped over whole.
    pub fn free(&self, range: &Range, gives: &dyn Fn(Addr) -> bool, count: usize) -> Vec<Addr> {
        let known = match (self.whole, self.held.last()) {
            (true, _) => self.to,
            (false, Some(last)) => *last,
            (false, None) => return Vec::new(),
        };
        let mut free = Vec::new();
        let mut held = self.held.iter().peekable();
        for (first, last) in range.spans(self.from, known.min(self.to)) {
            let mut candidate = first;
            loop {
                while held.next_if(|h| **h < candidate).is_some() {}
                if held.peek() != Some(&&candidate) && gives(candidate) {
                    free.push(candidate);
                    if free.len() == count {
                        return free;
                    }
                }
                match candidate.plus(1) {
                    Some(next) if next <= last => candidate = next,
                    _ => break,
                }
            }
        }
        free
    }
}

/// The addresses `owner` (an attachment, or, named without a container, a
/// workload's hold) lists in `store`, as read now.
pub fn listed_by(store: &dyn Store, owner: &Owner) -> Result<Vec<Addr>, PoolError> {
    let held = match (&owner.workload, owner.id.is_empty()) {
        (Some(workload), true) => store
            .workload_hold(workload, &owner.ifname)?
            .map(|h| h.held),
        _ => store
            .allocation(&owner.node, &owner.id, &owner.ifname)?
            .map(|h| h.held),
    };
    Ok(held
        .unwrap_or_default()
        .into_iter()
        .map(|h| h.address)
        .collect())
}

/// How a command that does not allocate opens a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Locked while in use (the local store's lock; etcd's transactions
    /// need none): DEL (but a durable one), CHECK, GC, STATUS, and each
    /// step of `release`.
    Locked,
    /// Locked, and what it removes synced to the disk before it counts
    /// (etcd's always is): the DEL of an address the runtime keeps across
    /// reboots, which a power loss must not bring back.
    Durable,
    /// Without a lock, so that no allocation waits for the reader, each
    /// record read whole as it was made: the operator's reports.
    Unlocked,
}

/// Opens the stores of the settings it was made with: the one way a
/// command reaches a store. Every store on etcd it opens shares one
/// client (one connection, one sign-in), made at the first.
pub struct Stores {
    settings: StoreSettings,
    /// How long an address given back cools down, in seconds.
    reuse_after: u64,
    client: OnceCell<Rc<EtcdClient>>,
}

impl Stores {
    /// The stores `settings` name, which cool what they give back for
    /// its `reuseAfter`.
    pub fn new(settings: &Settings) -> Stores {
        Stores {
            settings: settings.store.clone(),
            reuse_after: settings.reuse_after,
            client: OnceCell::new(),
        }
    }

    /// The same stores, but what they give back is free at once, not
    /// cooled down: an operator's `release --now`.
    pub fn at_once(self) -> Stores {
        Stores {
            reuse_after: 0,
            ..self
        }
    }

    /// Network `network`'s store, to allocate in: made if need be, and
    /// locked where it has a lock (local files; etcd's transactions need
    /// none); its claims synced to the disk before they count if
    /// `durable` (etcd's always are).
    pub fn create(&self, network: &str, durable: bool) -> Result<Box<dyn Store>, PoolError> {
        Ok(match &self.settings {
            StoreSettings::Local { data_dir } => Box::new(
                LocalStore::create(data_dir, network)?
                    .synced(durable)
                    .cooling_for(self.reuse_after),
            ),
            StoreSettings::Etcd { cluster, data_dir } => Box::new(
                EtcdStore::new(self.client(cluster)?, network, Some(data_dir))
                    .cooling_for(self.reuse_after),
            ),
        })
    }

    /// Network `network`'s store as it is, opened with `access`: `None`,
    /// and nothing made, for a local store that has no records of the
    /// network.
    pub fn existing(
        &self,
        network: &str,
        access: Access,
    ) -> Result<Option<Box<dyn Store>>, PoolError> {
        Ok(match &self.settings {
            StoreSettings::Local { data_dir } => {
                let store = match access {
                    Access::Locked => LocalStore::existing(data_dir, network)?,
                    Access::Durable => {
                        LocalStore::existing(data_dir, network)?.map(|s| s.synced(true))
                    }
                    Access::Unlocked => LocalStore::unlocked(data_dir, network)?,
                };
                store.map(|store| Box::new(store.cooling_for(self.reuse_after)) as Box<dyn Store>)
            }
            StoreSettings::Etcd { cluster, data_dir } => Some(Box::new(
                EtcdStore::new(self.client(cluster)?, network, Some(data_dir))
                    .cooling_for(self.reuse_after),
            )),
        })
    }

    /// Whether these are stores on etcd, which every node shares; nothing
    /// is opened to tell.
    pub fn on_etcd(&self) -> bool {
        matches!(self.settings, StoreSettings::Etcd { .. })
    }

    /// The local store of network `network` under `data_dir`, made if
    /// need be, and locked, whatever a configuration names: `import`'s
    /// source, which it marks moved.
    pub fn local_source(data_dir: &Path, network: &str) -> Result<LocalStore, PoolError> {
        LocalStore::create(data_dir, network)
    }

    /// The etcd cluster the settings name, for its nodes' keys (a
    /// keeper, reclaim, a fence): `None` for a local store, which has no
    /// node but this one.
    pub fn cluster(&self) -> Result<Option<Rc<EtcdClient>>, PoolError> {
        match &self.settings {
            StoreSettings::Local { .. } => Ok(None),
            StoreSettings::Etcd { cluster, .. } => self.client(cluster).map(Some),
        }
    }

    /// Network `network`'s store on etcd, for what only etcd has (reclaim's
    /// guarded releases, the previous layout's records): `None` for a
    /// local store.
    pub fn etcd(&self, network: &str) -> Result<Option<EtcdStore>, PoolError> {
        let data_dir = match &self.settings {
            StoreSettings::Etcd { data_dir, .. } => Some(data_dir.as_path()),
            StoreSettings::Local { .. } => None,
        };
        Ok(self
            .cluster()?
            .map(|client| EtcdStore::new(client, network, data_dir).cooling_for(self.reuse_after)))
    }

    /// The cluster's client, made at the first call.
    fn client(&self, settings: &EtcdSettings) -> Result<Rc<EtcdClient>, PoolError> {
        if let Some(client) = self.client.get() {
            return Ok(Rc::clone(client));
        }
        let client = Rc::new(EtcdClient::new(settings.clone())?);
        Ok(Rc::clone(self.client.get_or_init(|| client)))
    }
}
