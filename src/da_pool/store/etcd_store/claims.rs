//! Claims on etcd: an attachment's record and its addresses' written in
//! one transaction that needs each of them absent and the node not
//! fenced; where it fails, the reads that the next try needs made in the
//! same round trip; and, where it lands, the node's notes of it.

use super::notes::{Guess, GUESSES};
use super::releases::Record;
use super::{EtcdStore, PAGE};
use crate::addr::Addr;
use crate::da_pool::error::PoolError;
use crate::da_pool::store::records::{self, Owner, PoolAddress, StickyClaim};
use crate::da_pool::store::{fence, Attempt, Page, Seen, WINDOW};
use crate::etcd::{Compare, Kv, Op, Read};

impl EtcdStore {
    /// A claim of an attachment without a workload, as [`Store::claim`]
    /// makes it; if it fails, the attachment's records, the node's fence
    /// and, for each `(from, to)` of `looks`, the address keys held from
    /// `from` to `to` (a page), read in the same round trip.
    ///
    /// [`Store::claim`]: crate::da_pool::store::Store::claim
    pub(super) fn claim_looking(
        &self,
        owner: &Owner,
        held: &[PoolAddress],
        looks: &[(Addr, Addr)],
    ) -> Result<Attempt, PoolError> {
        let attachment = self.attachment_key(&owner.node, &owner.id, &owner.ifname);
        let legacy = self.legacy_key(&owner.id, &owner.ifname);
        let fence = fence::key(&self.client.settings().prefix, &owner.node);
        let mut compares = vec![
            Compare::Absent(attachment.clone()),
            Compare::Absent(legacy.clone()),
            Compare::Absent(fence.clone()),
        ];
        let record = records::attachment_record(owner, held);
        let mut ops = vec![Op::Put(attachment.clone(), record.clone())];
        for h in held {
            let key = self.address_key(h.address);
            compares.push(Compare::Absent(key.clone()));
            ops.push(Op::Put(key, records::address_record(owner, &h.pool)));
        }
        self.hint_after(owner, held, &mut ops);
        let mut reads = Vec::new();
        if !looks.is_empty() {
            reads = vec![Read::Key(attachment), Read::Key(legacy), Read::Key(fence)];
            reads.extend(looks.iter().map(|(from, to)| self.page_read(*from, *to)));
        }
        let outcome = self.txn_or_read(compares, &ops, &reads)?;
        if outcome.succeeded {
            self.note_claim(owner, held, &ops, Some((outcome.revision, &record)));
            return Ok(Attempt::Claimed);
        }
        let mut read = outcome.read.into_iter();
        let mut found = || read.next().unwrap_or_default();
        let (current, legacy) = (found(), found());
        let attached = !current.is_empty() || !legacy.is_empty();
        let fenced = found()
            .first()
            .map(|kv| fence::Fence::from_kv(&owner.node, kv).refusal());
        let pages: Vec<Page> = looks
            .iter()
            .map(|(from, to)| self.page_of(*from, *to, &found()))
            .collect();
        // What the pages show free is what the node expects next.
        for (h, page) in held.iter().zip(&pages) {
            self.expected
                .borrow_mut()
                .insert(h.pool.clone(), unheld(page));
        }
        Ok(Attempt::Refused(Seen {
            attached,
            fenced,
            pages,
        }))
    }

    /// The read of a page of the address keys held from `from` to `to`.
    fn page_read(&self, from: Addr, to: Addr) -> Read {
        let mut end = self.address_key(to);
        // Just after `to`'s key: the read is of [from, to].
        end.push(0);
        Read::Keys {
            from: self.address_key(from),
            to: end,
            limit: PAGE,
        }
    }

    /// What a page read from `from` to `to` found: the addresses of
    /// `from`'s family among `kvs` (an IPv6 key can sort between two IPv4
    /// ones), whole if the page was not full.
    fn page_of(&self, from: Addr, to: Addr, kvs: &[Kv]) -> Page {
        let prefix = self.addresses_prefix();
        let held = kvs
            .iter()
            .filter_map(|kv| {
                let name = std::str::from_utf8(kv.key.strip_prefix(prefix.as_bytes())?).ok()?;
                Addr::from_sortable(name)
            })
            .filter(|held| held.family() == from.family() && *held >= from && *held <= to)
            .collect();
        Page {
            from,
            to,
            held,
            whole: kvs.len() < PAGE,
        }
    }

    /// Adds to `ops` `owner`'s node's hint of each pool of `held` whose
    /// hint this process read: just after the address, but written only
    /// when that is a search's [`WINDOW`] or more past the hint read, or
    /// before it (the search went round): a node's ADDs in order leave one
    /// write of the hint in [`WINDOW`], and the next search, which starts
    /// a little before where it could, still finds its address in its
    /// first look. (A hint that lagged further would send every search
    /// to a random place first, with a read more.)
    fn hint_after(&self, owner: &Owner, held: &[PoolAddress], ops: &mut Vec<Op>) {
        let read = self.hints_read.borrow();
        for h in held {
            let (Some(next), Some(hint)) = (h.address.plus(1), read.get(&h.pool)) else {
                continue;
            };
            let far = match hint {
                Some(hint) => next < *hint || next.distance(*hint) >= WINDOW,
                None => true,
            };
            if far {
                ops.push(Op::Put(
                    self.hint_key(&owner.node, &h.pool),
                    next.to_string().into_bytes(),
                ));
            }
        }
    }

    /// Notes, for `owner`'s node, where it expects each pool's next free
    /// addresses after a claim of `held` made with `ops`: those it
    /// expected after the one claimed, else the one just after it; and,
    /// for a claim of an attachment alone made at a revision, the record
    /// it wrote then.
    fn note_claim(
        &self,
        owner: &Owner,
        held: &[PoolAddress],
        ops: &[Op],
        claimed: Option<(i64, &[u8])>,
    ) {
        for h in held {
            let Some(next) = h.address.plus(1) else {
                continue;
            };
            let expected: Vec<Addr> = match self.expected.borrow().get(&h.pool) {
                Some(expected) => expected
                    .iter()
                    .copied()
                    .filter(|a| *a > h.address)
                    .collect(),
                None => Vec::new(),
            };
            let written = Op::Put(
                self.hint_key(&owner.node, &h.pool),
                next.to_string().into_bytes(),
            );
            let shared = match ops.contains(&written) {
                true => Some(next),
                false => self.hints_read.borrow().get(&h.pool).copied().flatten(),
            };
            let next = match expected.is_empty() {
                true => vec![next],
                false => expected,
            };
            self.notes
                .note_guess(&owner.node, &h.pool, Guess { next, shared });
        }
        // A revision the answer did not give is no note.
        if let Some((revision, record)) = claimed.filter(|(r, _)| *r > 0) {
            self.notes.note_claim(owner, record, revision);
        }
    }

    /// A claim for a workload's container, in one transaction: the
    /// attachment absent and the hold as read; each address the workload's
    /// already (as read) or absent and recorded as the workload's; what
    /// the prior hold kept and the claim does not, given back; the hold
    /// bound to the container.
    pub(super) fn claim_for_workload(
        &self,
        owner: &Owner,
        held: &[PoolAddress],
        sticky: &StickyClaim,
    ) -> Result<bool, PoolError> {
        let owner = &sticky.owner(owner);
        let attachment = self.attachment_key(&owner.node, &owner.id, &owner.ifname);
        let hold = self.hold_key(sticky.workload, &owner.ifname);
        let mut compares = vec![
            Compare::Absent(attachment.clone()),
            Compare::Absent(self.legacy_key(&owner.id, &owner.ifname)),
            self.unfenced(owner),
            match sticky.prior {
                Some(prior) => Compare::Unchanged(hold.clone(), prior.revision),
                None => Compare::Absent(hold.clone()),
            },
        ];
        let mut ops = vec![
            Op::Put(attachment, records::attachment_record(owner, held)),
            Op::Put(hold, records::hold_record(&sticky.hold_after(owner, held))),
        ];
        let prior: &[PoolAddress] = sticky.prior.map_or(&[], |p| &p.held);
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
                    ops.push(Op::Put(key, records::address_record(owner, &h.pool)));
                }
            }
        }
        let dropped: Vec<PoolAddress> = sticky.dropped(held).cloned().collect();
        self.give_back(owner, &dropped, &mut compares, &mut ops)?;
        self.hint_after(owner, held, &mut ops);
        let claimed = self.txn(compares, &ops)?;
        if claimed {
            // A workload's attachment is released through its hold, read
            // first: no note of what it holds.
            self.note_claim(owner, held, &ops, None);
        }
        Ok(claimed)
    }
}

/// The first addresses that `page` shows nobody holds, in order: twice
/// as many as a guess keeps, since the next claim takes one of the first
/// of them at random, and a guess's worth should be left after it.
/// Whether the pool gives them is for the one who guesses to judge.
fn unheld(page: &Page) -> Vec<Addr> {
    let known = match (page.whole, page.held.last()) {
        (true, _) => page.to,
        (false, Some(last)) => *last,
        (false, None) => return Vec::new(),
    };
    let mut free = Vec::new();
    let mut candidate = page.from;
    while candidate <= known && free.len() < 2 * GUESSES {
        if page.held.binary_search(&candidate).is_err() {
            free.push(candidate);
        }
        match candidate.plus(1) {
            Some(next) => candidate = next,
            None => break,
        }
    }
    free
}
