//! The local store: files under `ipam.pool.dataDir`, a directory per
//! network, locked for the whole of an invocation (a flock, which the
//! kernel drops with the process, so a killed allocator blocks no one).
//!
//! ```text
//! DATADIR/NETWORK/attachments/ID:IFNAME    what the attachment holds
//! DATADIR/NETWORK/addresses/POOL/ADDRESS   who holds the address
//! DATADIR/NETWORK/hints/POOL               where to look next
//! ```
//!
//! Every record is written whole or not at all (a temporary file, synced,
//! then a link), so a SIGKILL at any instant leaves no empty or unowned
//! record. An attachment's record is written before its addresses and
//! removed after them: an address is never held by an attachment that no
//! DEL or GC can find. Changes reach the disk in that order, through the
//! filesystem's journal, but are not each synced into their directory: a
//! power loss may undo the last ones, for containers that are gone with
//! it (a record that comes back is stale, and GC frees it); not syncing
//! saves two thirds of an ADD's disk waits. The hint is not synced at all.

use std::path::Path;

use serde_json::Value;

use super::range::Addr;
use super::store::{self, Held, Holding, Owner, Store};
use crate::dir::{Dir, Durability};
use crate::error::Error;
use crate::sys::Lock;

const ATTACHMENTS: &str = "attachments";
const ADDRESSES: &str = "addresses";
const HINTS: &str = "hints";

/// A network's files, locked.
pub struct Local {
    network: Dir,
}

impl Local {
    /// Opens (making it if need be) and locks network `name`'s directory
    /// under `data_dir`, waiting for any other holder unless asked to stop.
    pub fn open(data_dir: &Path, name: &str) -> Result<Local, Error> {
        let root = Dir::open_made(data_dir).map_err(|e| Error::Files {
            path: data_dir.to_owned(),
            error: e,
        })?;
        let network = root
            .child_made(name)
            .map_err(|e| root.error_at(name, e))?
            .with_durability(Durability::Ordered);
        network.lock(Lock::Exclusive, None)?;
        Ok(Local { network })
    }

    /// Sub-directory `name` of the network's, if it exists (or made, with
    /// `make`).
    fn sub(&self, name: &str, make: bool) -> Result<Option<Dir>, Error> {
        let found = if make {
            self.network.child_made(name).map(Some)
        } else {
            self.network.child(name)
        };
        found.map_err(|e| self.network.error_at(name, e))
    }

    /// The directory of `pool`'s addresses, if it exists (or made).
    fn pool(&self, pool: &str, make: bool) -> Result<Option<Dir>, Error> {
        let Some(addresses) = self.sub(ADDRESSES, make)? else {
            return Ok(None);
        };
        let found = if make {
            addresses.child_made(pool).map(Some)
        } else {
            addresses.child(pool)
        };
        found.map_err(|e| addresses.error_at(pool, e))
    }
}

fn read(dir: &Dir, name: &str) -> Result<Option<Vec<u8>>, Error> {
    dir.read(name).map_err(|e| dir.error_at(name, e))
}

fn remove(dir: &Dir, name: &str) -> Result<bool, Error> {
    dir.remove(name).map_err(|e| dir.error_at(name, e))
}

impl Store for Local {
    fn holding(&self, id: &str, ifname: &str) -> Result<Option<Holding>, Error> {
        let Some(attachments) = self.sub(ATTACHMENTS, false)? else {
            return Ok(None);
        };
        let name = store::attachment_name(id, ifname);
        Ok(read(&attachments, &name)?.and_then(|record| store::read_holding(&record, 0)))
    }

    fn holder(&self, pool: &str, address: Addr) -> Result<Option<Owner>, Error> {
        let Some(dir) = self.pool(pool, false)? else {
            return Ok(None);
        };
        match read(&dir, &address.to_string())? {
            None => Ok(None),
            // A record that says no one still makes the address taken.
            Some(record) => Ok(Some(store::read_owner(&record).unwrap_or(Owner {
                id: String::new(),
                ifname: String::new(),
                node: String::new(),
            }))),
        }
    }

    fn first_free(
        &self,
        pool: &str,
        from: Addr,
        to: Addr,
        gives: &dyn Fn(Addr) -> bool,
    ) -> Result<Option<Addr>, Error> {
        let dir = self.pool(pool, false)?;
        let mut candidate = from;
        loop {
            if gives(candidate) {
                let taken = match &dir {
                    Some(dir) => dir
                        .contains(&candidate.to_string())
                        .map_err(|e| dir.error(e))?,
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

    fn hint(&self, pool: &str) -> Result<Option<Addr>, Error> {
        let Some(hints) = self.sub(HINTS, false)? else {
            return Ok(None);
        };
        let text = read(&hints, pool)?.unwrap_or_default();
        Ok(String::from_utf8_lossy(&text)
            .trim()
            .parse()
            .ok()
            .map(Addr::new))
    }

    fn claim(&self, owner: &Owner, held: &[Held]) -> Result<bool, Error> {
        let Some(attachments) = self.sub(ATTACHMENTS, true)? else {
            return Ok(false);
        };
        let name = store::attachment_name(&owner.id, &owner.ifname);
        let record = store::attachment_record(owner, held);
        if !attachments
            .create(&name, &record)
            .map_err(|e| attachments.error_at(&name, e))?
        {
            return Ok(false);
        }
        let address_record = store::address_record(owner);
        let mut made: Vec<(Dir, String)> = Vec::new();
        for h in held {
            let Some(dir) = self.pool(&h.pool, true)? else {
                continue;
            };
            let address = h.address.to_string();
            if !dir
                .create(&address, &address_record)
                .map_err(|e| dir.error_at(&address, e))?
            {
                // Taken: what this claim made is undone, the record last.
                for (dir, address) in &made {
                    remove(dir, address)?;
                }
                remove(&attachments, &name)?;
                return Ok(false);
            }
            made.push((dir, address));
        }
        if let Some(hints) = self.sub(HINTS, true)? {
            for h in held {
                if let Some(next) = h.address.plus(1) {
                    // A hint only: losing it to a crash costs a longer look.
                    let _ = hints.overwrite(&h.pool, next.to_string().as_bytes());
                }
            }
        }
        Ok(true)
    }

    fn release(&self, holding: &Holding) -> Result<bool, Error> {
        for h in &holding.held {
            let Some(dir) = self.pool(&h.pool, false)? else {
                continue;
            };
            let address = h.address.to_string();
            let mine = read(&dir, &address)?
                .and_then(|record| store::read_owner(&record))
                .is_some_and(|o| o.id == holding.owner.id && o.ifname == holding.owner.ifname);
            if mine {
                remove(&dir, &address)?;
            }
        }
        if let Some(attachments) = self.sub(ATTACHMENTS, false)? {
            remove(
                &attachments,
                &store::attachment_name(&holding.owner.id, &holding.owner.ifname),
            )?;
        }
        Ok(true)
    }

    fn holdings(&self) -> Result<Vec<Holding>, Error> {
        let Some(attachments) = self.sub(ATTACHMENTS, false)? else {
            return Ok(Vec::new());
        };
        let names = attachments.names().map_err(|e| attachments.error(e))?;
        let mut found = Vec::new();
        for name in names {
            if let Some(record) = read(&attachments, &name)? {
                found.extend(store::read_holding(&record, 0));
            }
        }
        Ok(found)
    }

    fn pool_definition(&self, _name: &str) -> Result<Option<Value>, Error> {
        // Pools of a local store are the configuration's.
        Ok(None)
    }

    fn ping(&self) -> Result<(), Error> {
        // Locked and open: it answers.
        Ok(())
    }
}
