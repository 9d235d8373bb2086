//! The local store: files under `ipam.pool.dataDir`, a directory per
//! network, locked for the whole of an invocation (a flock, which the
//! kernel drops with the process, so a killed allocator blocks no one).
//!
//! ```text
//! DATADIR/NETWORK/attachments/ID:IFNAME    what the attachment holds
//! DATADIR/NETWORK/addresses/ADDRESS        who holds the address, from which pool
//! DATADIR/NETWORK/holds/WORKLOAD:IFNAME    what a workload's hold keeps for it
//! DATADIR/NETWORK/hints/POOL               where to look next in the pool
//! DATADIR/NETWORK/moved                    the network's reservations are in etcd now
//! ```
//!
//! An address is one name in the network's directory, whatever pool names
//! it, so two pools that overlap can never give it twice. Every record is
//! a symbolic link whose target is the record (JSON), made in one step,
//! whole or not at all, so a SIGKILL or a crash at any instant leaves no
//! empty or unowned record, and there is no file content to sync. An
//! attachment's record is made before its addresses and removed after
//! them: an address is never held by an attachment that no DEL or GC can
//! find. Changes reach the disk in that order, through the filesystem's
//! journal, but are not each synced: a power loss may undo the last ones,
//! for containers that are gone with it (a record that comes back is
//! stale, and GC frees it). Once the network's directories exist, an ADD
//! waits for no disk write. The hint is a plain file written in place.
//!
//! An address given back while `ipam.pool.reuseAfter` is set is not
//! removed but replaced, in one rename, by a record of its cooldown,
//! with its end by this node's clock: a restart keeps it. A cooldown that
//! has ended counts as no record, and the claim that takes the address
//! removes it first.
//!
//! A workload's hold is written before the address records it keeps and
//! lists every one of them at every step (the addresses a claim takes
//! over and those it gives back, until they are gone), so that no address
//! record of a workload is ever missing from its hold: whatever is cut
//! short, the hold's end gives back all of it.

use std::path::Path;

use serde_json::Value;

use super::records::{
    self, Allocation, Cooling, Holder, Owner, PoolAddress, StickyClaim, WorkloadHold,
};
use super::Store;
use crate::addr::Addr;
use crate::da_pool::clock;
use crate::da_pool::error::{Cooldowns, PoolError};
use crate::dir::{Dir, DirError, Durability};
use crate::sys::Lock;

const ATTACHMENTS: &str = "attachments";
const ADDRESSES: &str = "addresses";
const HOLDS: &str = "holds";
const HINTS: &str = "hints";
/// Left by `ipam-da-pool import`: new claims belong in etcd from then on.
const MOVED: &str = "moved";

/// A network's files, locked.
pub struct LocalStore {
    network: Dir,
    /// Whether claims are synced to the disk before they count (for an
    /// address kept across reboots), rather than left to the journal.
    synced: bool,
    /// How long an address given back cools down, in seconds.
    reuse_after: u64,
}

impl LocalStore {
    /// Opens (making it if need be) and locks network `name`'s directory
    /// under `data_dir`, waiting for any other holder unless asked to stop.
    pub fn create(data_dir: &Path, name: &str) -> Result<LocalStore, PoolError> {
        let root = Dir::open_made(data_dir).map_err(|e| files(data_dir, e))?;
        let network = root.child_made(name).map_err(|e| root.error_at(name, e))?;
        network.keep_private().map_err(|e| root.error_at(name, e))?;
        LocalStore::locked(network)
    }

    /// As [`LocalStore::create`], but `None`, and nothing made, when the
    /// network has no directory: it holds nothing.
    pub fn existing(data_dir: &Path, name: &str) -> Result<Option<LocalStore>, PoolError> {
        match LocalStore::unlocked(data_dir, name)? {
            Some(local) => {
                local.network.lock(Lock::Exclusive, None)?;
                Ok(Some(local))
            }
            None => Ok(None),
        }
    }

    /// Network `name`'s records for reading only, without the lock, so
    /// that no allocation waits for the reader (an operator's report):
    /// each record is read whole, as it was made. `None` when the network
    /// has no directory.
    pub fn unlocked(data_dir: &Path, name: &str) -> Result<Option<LocalStore>, PoolError> {
        let root = match Dir::open(data_dir) {
            Ok(root) => root,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(files(data_dir, e)),
        };
        let network = root.child(name).map_err(|e| root.error_at(name, e))?;
        Ok(network.map(|network| LocalStore {
            network: network.with_durability(Durability::Ordered),
            synced: false,
            reuse_after: 0,
        }))
    }

    fn locked(network: Dir) -> Result<LocalStore, PoolError> {
        let network = network.with_durability(Durability::Ordered);
        network.lock(Lock::Exclusive, None)?;
        Ok(LocalStore {
            network,
            synced: false,
            reuse_after: 0,
        })
    }

    /// The same store, its claims and removals synced to the disk before
    /// they count when `synced` (CNI_ARGS `DURABLE=true`): a power loss
    /// can then undo none of them.
    pub fn synced(self, synced: bool) -> LocalStore {
        LocalStore { synced, ..self }
    }

    /// The same store, each address it gives back cooling down for
    /// `seconds` before it is given again (none if 0).
    pub fn cooling_for(self, seconds: u64) -> LocalStore {
        LocalStore {
            reuse_after: seconds,
            ..self
        }
    }

    /// Gives `address` (of `pool`) back: its record removed, or, with a
    /// cooldown, replaced by the cooldown's. Every address given back
    /// goes through here; a claim undoing its own records does not.
    fn free_address(&self, addresses: &Dir, address: &str, pool: &str) -> Result<(), PoolError> {
        if self.reuse_after == 0 {
            return self.remove(addresses, address).map(drop);
        }
        let record = records::cooling_from_now(pool, self.reuse_after);
        match addresses.replace_record(address, &record) {
            Ok(()) => {}
            // A full disk or quota takes no new link, but still takes an
            // unlink: given back at once, rather than not at all.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) => {
                tracing::warn!("{address} given back without its cooldown: {e}");
                return self.remove(addresses, address).map(drop);
            }
            Err(e) => return Err(addresses.error_at(address, e).into()),
        }
        if self.synced {
            addresses.sync_names().map_err(|e| addresses.error(e))?;
        }
        Ok(())
    }

    /// Makes the record of `address`, as [`LocalStore::record`] does, over
    /// a cooldown that has ended (removed first): whether it was made.
    fn record_address(
        &self,
        addresses: &Dir,
        address: &str,
        content: &[u8],
    ) -> Result<bool, PoolError> {
        if self.record(addresses, address, content)? {
            return Ok(true);
        }
        // Taken, or cooled down: read only when the first try fails.
        let cooled = read(addresses, address)?.is_some_and(|r| cooled_down(&r, clock::now()));
        if !cooled {
            return Ok(false);
        }
        self.remove(addresses, address)?;
        self.record(addresses, address, content)
    }

    /// Removes record `name` of `dir`: `Ok(false)` if there was none. When
    /// synced, the removal reaches the disk before it counts, so that a
    /// power loss brings no released record back (the Docker driver's
    /// DEL: Docker runs no GC that would free it).
    fn remove(&self, dir: &Dir, name: &str) -> Result<bool, PoolError> {
        let removed = dir.remove(name).map_err(|e| dir.error_at(name, e))?;
        if removed && self.synced {
            dir.sync_names().map_err(|e| dir.error(e))?;
        }
        Ok(removed)
    }

    /// Record `name` in `dir`, made whole once, synced if claims are.
    fn record(&self, dir: &Dir, name: &str, content: &[u8]) -> Result<bool, PoolError> {
        let made = match self.synced {
            true => dir.create_synced(name, content),
            false => dir.create(name, content),
        };
        made.map_err(|e| dir.error_at(name, e).into())
    }

    /// Marks the network as moved into etcd: from now on a claim here is
    /// refused (code 11) until the node's configuration names the cluster.
    pub fn mark_moved(&self) -> Result<(), PoolError> {
        let note = b"ipam-da-pool import copied this network's reservations into etcd\n";
        self.network
            .replace(MOVED, note)
            .map_err(|e| self.network.error_at(MOVED, e).into())
    }

    /// Sub-directory `name` of the network's, if it exists.
    fn sub(&self, name: &str) -> Result<Option<Dir>, PoolError> {
        self.network
            .child(name)
            .map_err(|e| self.network.error_at(name, e).into())
    }

    /// Sub-directory `name` of the network's, made if need be.
    fn sub_made(&self, name: &str) -> Result<Dir, PoolError> {
        self.network
            .child_made(name)
            .map_err(|e| self.network.error_at(name, e).into())
    }
}

fn files(path: &Path, error: std::io::Error) -> PoolError {
    DirError::io(path, error).into()
}

/// Whether `record`, an address's, is of a cooldown that has ended by
/// `now`: no record at all, to a claim and a search.
fn cooled_down(record: &[u8], now: u64) -> bool {
    record.starts_with(records::COOLING.as_bytes())
        && matches!(records::read_holder(record), Holder::Cooling(c) if c.until <= now)
}

fn read(dir: &Dir, name: &str) -> Result<Option<Vec<u8>>, PoolError> {
    dir.read(name).map_err(|e| dir.error_at(name, e).into())
}

impl LocalStore {
    /// A claim for a workload's container: the hold first, listing what it
    /// kept and what it takes (bound to the container), then the
    /// attachment, then each address recorded as the workload's (one it
    /// kept already is left as it is), then what it no longer keeps given
    /// back, and the hold listing only what it keeps now.
    fn claim_for_workload(
        &self,
        owner: &Owner,
        held: &[PoolAddress],
        sticky: &StickyClaim,
    ) -> Result<bool, PoolError> {
        let owner = &sticky.owner(owner);
        let holds = self.sub_made(HOLDS)?;
        let name = records::hold_name(sticky.workload, &owner.ifname);
        let on_disk = self.workload_hold(sticky.workload, &owner.ifname)?;
        if on_disk.as_ref() != sticky.prior {
            return Ok(false);
        }
        let mut both: Vec<PoolAddress> = held.to_vec();
        both.extend(sticky.dropped(held).cloned());
        let taking = records::hold_record(&sticky.hold_after(owner, &both));
        let bound = match sticky.prior {
            Some(_) => holds.replace_record(&name, &taking).map(|()| true),
            None => holds.create(&name, &taking),
        }
        .map_err(|e| holds.error_at(&name, e))?;
        if !bound {
            return Ok(false);
        }
        // Undone if the claim fails: the hold as it was.
        let undo_hold = |holds: &Dir| -> Result<(), PoolError> {
            match sticky.prior {
                Some(prior) => holds
                    .replace_record(&name, &records::hold_record(prior))
                    .map_err(|e| holds.error_at(&name, e).into()),
                None => self.remove(holds, &name).map(drop),
            }
        };
        let attachments = self.sub_made(ATTACHMENTS)?;
        let attachment = records::attachment_name(&owner.id, &owner.ifname);
        if !self.record(
            &attachments,
            &attachment,
            &records::attachment_record(owner, held),
        )? {
            undo_hold(&holds)?;
            return Ok(false);
        }
        let addresses = self.sub_made(ADDRESSES)?;
        let mut made: Vec<String> = Vec::new();
        for h in held {
            let address = h.address.to_string();
            // A cooldown that has ended is no record: the claim takes it.
            let now = clock::now();
            let record = read(&addresses, &address)?.filter(|r| !cooled_down(r, now));
            let theirs = match record {
                Some(record) => !records::read_owner(&record).is_some_and(|o| owner.owns(&o)),
                None => {
                    let created = self.record_address(
                        &addresses,
                        &address,
                        &records::address_record(owner, &h.pool),
                    )?;
                    if created {
                        made.push(address.clone());
                    }
                    !created
                }
            };
            if theirs {
                for address in &made {
                    self.remove(&addresses, address)?;
                }
                self.remove(&attachments, &attachment)?;
                undo_hold(&holds)?;
                return Ok(false);
            }
        }
        let given_back: Vec<PoolAddress> = sticky.dropped(held).cloned().collect();
        self.give_back(owner, &given_back)?;
        holds
            .replace_record(
                &name,
                &records::hold_record(&sticky.hold_after(owner, held)),
            )
            .map_err(|e| holds.error_at(&name, e))?;
        self.hint_after(held)?;
        Ok(true)
    }

    /// Releases the workload's hold that `allocation`'s container has bound:
    /// whether a hold keeps its addresses (it is released for its
    /// `sticky_for`, or another container of the workload holds it now).
    fn release_hold_of(&self, allocation: &Allocation, workload: &str) -> Result<bool, PoolError> {
        let owner = &allocation.owner;
        let Some(hold) = self.workload_hold(workload, &owner.ifname)? else {
            // Ended by an operator: nothing keeps the addresses.
            return Ok(false);
        };
        if hold.container.as_deref() == Some(owner.id.as_str()) {
            let holds = self.sub_made(HOLDS)?;
            let name = records::hold_name(workload, &owner.ifname);
            holds
                .replace_record(&name, &records::hold_record(&hold.released(clock::now())))
                .map_err(|e| holds.error_at(&name, e))?;
        }
        Ok(true)
    }

    /// Removes the records of `held` that name `owner` (or its workload).
    fn give_back(&self, owner: &Owner, held: &[PoolAddress]) -> Result<(), PoolError> {
        let Some(addresses) = self.sub(ADDRESSES)? else {
            return Ok(());
        };
        for h in held {
            let address = h.address.to_string();
            let mine = read(&addresses, &address)?
                .and_then(|record| records::read_owner(&record))
                .is_some_and(|o| owner.owns(&o));
            if mine {
                self.free_address(&addresses, &address, &h.pool)?;
            }
        }
        Ok(())
    }

    /// Where the next search in each pool of `held` starts: just after it.
    fn hint_after(&self, held: &[PoolAddress]) -> Result<(), PoolError> {
        let hints = self.sub_made(HINTS)?;
        for h in held {
            if let Some(next) = h.address.plus(1) {
                // A hint only: losing it to a crash costs a longer look.
                // In the sortable form: one width for the pool's family.
                let _ = hints.overwrite(&h.pool, next.sortable().as_bytes());
            }
        }
        Ok(())
    }
}

impl Store for LocalStore {
    fn allocation(
        &self,
        _node: &str,
        id: &str,
        ifname: &str,
    ) -> Result<Option<Allocation>, PoolError> {
        // One node's records, whatever name it had when it made them.
        let Some(attachments) = self.sub(ATTACHMENTS)? else {
            return Ok(None);
        };
        let name = records::attachment_name(id, ifname);
        Ok(read(&attachments, &name)?.and_then(|record| records::read_allocation(&record, 0)))
    }

    fn holder(&self, address: Addr) -> Result<Option<Holder>, PoolError> {
        let Some(dir) = self.sub(ADDRESSES)? else {
            return Ok(None);
        };
        let record = read(&dir, &address.to_string())?;
        Ok(record
            .filter(|record| !cooled_down(record, clock::now()))
            .map(|record| records::read_holder(&record)))
    }

    fn cools(&self) -> bool {
        self.reuse_after > 0
    }

    fn cooling(&self, from: Addr, to: Addr) -> Result<Vec<(Addr, Cooling)>, PoolError> {
        let Some(addresses) = self.sub(ADDRESSES)? else {
            return Ok(Vec::new());
        };
        let now = clock::now();
        let mut found = Vec::new();
        for name in addresses.names().map_err(|e| addresses.error(e))? {
            let Ok(ip) = name.parse() else {
                continue;
            };
            let address = Addr::new(ip);
            if address.family() != from.family() || address < from || address > to {
                continue;
            }
            if let Some(Holder::Cooling(cooling)) =
                read(&addresses, &name)?.map(|r| records::read_holder(&r))
            {
                if cooling.until > now {
                    found.push((address, cooling));
                }
            }
        }
        found.sort_by_key(|(address, _)| *address);
        Ok(found)
    }

    fn end_cooling(&self, address: Addr) -> Result<bool, PoolError> {
        let Some(addresses) = self.sub(ADDRESSES)? else {
            return Ok(false);
        };
        let name = address.to_string();
        let cooling = match read(&addresses, &name)?.map(|r| records::read_holder(&r)) {
            Some(Holder::Cooling(cooling)) => cooling,
            _ => return Ok(false),
        };
        self.remove(&addresses, &name)?;
        Ok(cooling.until > clock::now())
    }

    fn carry_cooling(&self, address: Addr, cooling: &Cooling) -> Result<bool, PoolError> {
        let addresses = self.sub_made(ADDRESSES)?;
        let pool = cooling.pool.as_deref().unwrap_or_default();
        let record = records::cooling_record(pool, clock::now(), cooling.until);
        self.record_address(&addresses, &address.to_string(), &record)
    }

    fn first_free(
        &self,
        from: Addr,
        to: Addr,
        gives: &dyn Fn(Addr) -> bool,
    ) -> Result<Option<Addr>, PoolError> {
        let dir = self.sub(ADDRESSES)?;
        let now = clock::now();
        let mut candidate = from;
        loop {
            if gives(candidate) {
                // One read, as a look for the name would be: a cooldown
                // that has ended leaves the address free.
                let taken = match &dir {
                    Some(dir) => read(dir, &candidate.to_string())?
                        .is_some_and(|record| !cooled_down(&record, now)),
                    None => false,
                };
                if !taken {
                    return Ok(Some(candidate));
                }
            }
            match candidate.plus(1) {
                Some(next) if next <= to => candidate = next,
                _ => return Ok(None),
            }
        }
    }

    fn hint(&self, _node: &str, pool: &str) -> Result<Option<Addr>, PoolError> {
        let Some(hints) = self.sub(HINTS)? else {
            return Ok(None);
        };
        let text = read(&hints, pool)?.unwrap_or_default();
        // A hint garbled by a crash is no hint.
        Ok(std::str::from_utf8(&text)
            .ok()
            .and_then(|text| Addr::from_sortable(text.trim())))
    }

    fn note_full(&self, _pool: &str, _cooling: &Cooldowns) -> Result<(), PoolError> {
        // Looking through local files again costs next to nothing.
        Ok(())
    }

    fn noted_full(&self, _pool: &str) -> Result<Option<Cooldowns>, PoolError> {
        Ok(None)
    }

    fn claim(
        &self,
        owner: &Owner,
        held: &[PoolAddress],
        sticky: Option<&StickyClaim>,
    ) -> Result<bool, PoolError> {
        if self
            .network
            .contains(MOVED)
            .map_err(|e| self.network.error(e))?
        {
            return Err(PoolError::Moved {
                marker: self.network.path().join(MOVED),
            });
        }
        if let Some(sticky) = sticky {
            return self.claim_for_workload(owner, held, sticky);
        }
        let attachments = self.sub_made(ATTACHMENTS)?;
        let name = records::attachment_name(&owner.id, &owner.ifname);
        let record = records::attachment_record(owner, held);
        if !self.record(&attachments, &name, &record)? {
            return Ok(false);
        }
        let addresses = self.sub_made(ADDRESSES)?;
        let mut made: Vec<String> = Vec::new();
        for h in held {
            let address = h.address.to_string();
            let address_record = records::address_record(owner, &h.pool);
            if !self.record_address(&addresses, &address, &address_record)? {
                // Taken: what this claim made is undone, the record last.
                for address in &made {
                    self.remove(&addresses, address)?;
                }
                self.remove(&attachments, &name)?;
                return Ok(false);
            }
            made.push(address);
        }
        self.hint_after(held)?;
        Ok(true)
    }

    fn release(&self, allocation: &Allocation) -> Result<bool, PoolError> {
        let kept = match &allocation.owner.workload {
            Some(workload) => self.release_hold_of(allocation, workload)?,
            None => false,
        };
        if !kept {
            self.give_back(&allocation.owner, &allocation.held)?;
        }
        if let Some(attachments) = self.sub(ATTACHMENTS)? {
            self.remove(
                &attachments,
                &records::attachment_name(&allocation.owner.id, &allocation.owner.ifname),
            )?;
        }
        Ok(true)
    }

    fn free_record(&self, address: Addr, holder: &Owner) -> Result<bool, PoolError> {
        // Under the network's lock: as read is as it is until the removal.
        let Some(addresses) = self.sub(ADDRESSES)? else {
            return Ok(false);
        };
        let name = address.to_string();
        let Some(record) = read(&addresses, &name)? else {
            return Ok(false);
        };
        let named = records::read_holder(&record);
        if named.owner() != Some(holder) || super::listed_by(self, holder)?.contains(&address) {
            return Ok(false);
        }
        let pool = records::read_pool(&record).unwrap_or_default();
        self.free_address(&addresses, &name, &pool)?;
        Ok(true)
    }

    fn workload_hold(
        &self,
        workload: &str,
        ifname: &str,
    ) -> Result<Option<WorkloadHold>, PoolError> {
        let Some(holds) = self.sub(HOLDS)? else {
            return Ok(None);
        };
        let record = read(&holds, &records::hold_name(workload, ifname))?;
        // A name shared by two long workloads (their digests alike) is
        // the other's.
        Ok(record
            .and_then(|record| records::read_workload_hold(&record, 0))
            .filter(|hold| hold.workload == workload))
    }

    fn workload_holds(&self) -> Result<Vec<WorkloadHold>, PoolError> {
        let Some(holds) = self.sub(HOLDS)? else {
            return Ok(Vec::new());
        };
        let mut found = Vec::new();
        for name in holds.names().map_err(|e| holds.error(e))? {
            if let Some(record) = read(&holds, &name)? {
                found.extend(records::read_workload_hold(&record, 0));
            }
        }
        Ok(found)
    }

    fn end_hold(&self, hold: &WorkloadHold) -> Result<bool, PoolError> {
        if self.workload_hold(&hold.workload, &hold.ifname)?.as_ref() != Some(hold) {
            return Ok(false);
        }
        if let Some(id) = &hold.container {
            if self.allocation(&hold.node, id, &hold.ifname)?.is_some() {
                return Ok(false);
            }
        }
        // The addresses first: the hold lists them until they are gone.
        self.give_back(&hold.owner(), &hold.held)?;
        let holds = self.sub_made(HOLDS)?;
        self.remove(&holds, &records::hold_name(&hold.workload, &hold.ifname))?;
        Ok(true)
    }

    fn allocations(&self) -> Result<Vec<Allocation>, PoolError> {
        let Some(attachments) = self.sub(ATTACHMENTS)? else {
            return Ok(Vec::new());
        };
        let names = attachments.names().map_err(|e| attachments.error(e))?;
        let mut found = Vec::new();
        for name in names {
            if let Some(record) = read(&attachments, &name)? {
                found.extend(records::read_allocation(&record, 0));
            }
        }
        Ok(found)
    }

    fn allocations_of(&self, _node: &str) -> Result<Vec<Allocation>, PoolError> {
        // Every record here is this node's.
        self.allocations()
    }

    fn address_records(&self) -> Result<Vec<(Addr, Option<Owner>)>, PoolError> {
        let Some(addresses) = self.sub(ADDRESSES)? else {
            return Ok(Vec::new());
        };
        let names = addresses.names().map_err(|e| addresses.error(e))?;
        let mut found = Vec::new();
        for name in names {
            let Ok(ip) = name.parse() else {
                continue;
            };
            let Some(record) = read(&addresses, &name)? else {
                continue;
            };
            if let Holder::Owner(_) = records::read_holder(&record) {
                found.push((Addr::new(ip), records::read_owner(&record)));
            }
        }
        Ok(found)
    }

    fn pool_definition(&self, _name: &str) -> Result<Option<Value>, PoolError> {
        // Pools of a local store are the configuration's.
        Ok(None)
    }

    fn fenced(&self, _node: &str) -> Result<Option<PoolError>, PoolError> {
        // One node, no reclaim: never fenced.
        Ok(None)
    }

    fn ping(&self) -> Result<(), PoolError> {
        // Locked and open: it answers.
        Ok(())
    }

    fn is_shared(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests;
