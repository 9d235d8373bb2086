//! What a node notes of its own claims on etcd, under `dataDir`: where
//! it expects the next free address of each pool, and what each of its
//! attachments was given, at which revision. Notes are only guesses: one
//! lost, stale, garbled or never written costs a round trip, never a
//! wrong answer, since every claim compares the address absent and every
//! release compares the records unchanged since the noted revision, the
//! attachment's holding the bytes its claim wrote. A note that cannot be
//! written is not an error.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::addr::Addr;
use crate::da_pool::store::records::{self, Allocation, Owner};
use crate::dir::{name_digest, Dir, Durability};

/// How many addresses a guess keeps at most.
pub const GUESSES: usize = 16;

/// Where a node expects the next free addresses of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guess {
    /// The addresses it expects free, in order: the first it claims
    /// first; those after it, as a page of the pool last showed them free,
    /// next.
    pub next: Vec<Addr>,
    /// The pool's hint on etcd, as the node last read or wrote it.
    pub shared: Option<Addr>,
}

/// A note of a claim, as [`Notes::note_claim`] writes it.
#[derive(Deserialize)]
struct Claim<'a> {
    revision: i64,
    /// The attachment's record, its bytes as the claim wrote them.
    #[serde(borrow)]
    record: &'a RawValue,
}

/// The notes of the nodes that run on this machine, for one network of
/// one cluster.
pub struct Notes {
    /// `dataDir/etcd/`, if the settings name a directory to keep notes in.
    root: Option<PathBuf>,
    /// What the directory is named after: the cluster and the network.
    scope: String,
    /// Each node's directory, once opened.
    opened: RefCell<HashMap<String, Dir>>,
}

impl Notes {
    /// The notes under `data_dir` of network `network` of the cluster
    /// that `cluster` names (its endpoints and prefix); none if
    /// `data_dir` is `None`.
    pub fn new(data_dir: Option<&Path>, cluster: &str, network: &str) -> Notes {
        Notes {
            root: data_dir.map(|dir| dir.join("etcd")),
            scope: format!("{cluster}\n{network}"),
            opened: RefCell::new(HashMap::new()),
        }
    }

    /// Where node `node` expects the next free addresses of `pool`, if it
    /// noted it.
    pub fn guess(&self, node: &str, pool: &str) -> Option<Guess> {
        let text = self.with_dir(node, false, |dir| dir.read(&guess_name(pool)))??;
        let value: Value = serde_json::from_slice(&text).ok()?;
        let address =
            |value: &Value| -> Option<Addr> { value.as_str()?.parse().ok().map(Addr::new) };
        let next: Vec<Addr> = value
            .get("next")?
            .as_array()?
            .iter()
            .map(address)
            .collect::<Option<_>>()?;
        Some(Guess {
            next: next.into_iter().take(GUESSES).collect(),
            shared: value.get("shared").and_then(address),
        })
    }

    /// Notes where node `node` expects the next free addresses of `pool`.
    pub fn note_guess(&self, node: &str, pool: &str, guess: Guess) {
        let next: Vec<String> = guess
            .next
            .iter()
            .take(GUESSES)
            .map(Addr::to_string)
            .collect();
        let text = json!({
            "next": next,
            "shared": guess.shared.map(|a| a.to_string()),
        })
        .to_string();
        // In place, unsynced: two ADDs at once may garble it, which makes
        // it no guess or a wrong one, and costs the next ADD a round trip.
        self.with_dir(node, true, |dir| {
            dir.overwrite(&guess_name(pool), text.as_bytes())
        });
    }

    /// What `owner` was noted to hold, as claimed at the noted revision.
    pub fn claimed(&self, owner: &Owner) -> Option<Allocation> {
        let name = claim_name(owner)?;
        let text = self.with_dir(&owner.node, false, |dir| dir.read(&name))??;
        let noted: Claim = serde_json::from_slice(&text).ok()?;
        let record = noted.record.get().as_bytes();
        let allocation = records::read_allocation(record, noted.revision)?;
        (allocation.owner == *owner).then(|| Allocation {
            record: Some(record.to_vec()),
            ..allocation
        })
    }

    /// Notes that `owner`'s claim wrote `record` (the attachment's record,
    /// JSON) at `revision`: its bytes as they are, not read and written
    /// again.
    pub fn note_claim(&self, owner: &Owner, record: &[u8], revision: i64) {
        let Some(name) = claim_name(owner) else {
            return;
        };
        let record = String::from_utf8_lossy(record);
        let text = format!("{{\"revision\":{revision},\"record\":{record}}}");
        self.with_dir(&owner.node, true, |dir| {
            dir.replace_record(&name, text.as_bytes())
        });
    }

    /// Forgets what `owner` was noted to hold: it was released, or the
    /// note was found stale.
    pub fn forget(&self, owner: &Owner) {
        if let Some(name) = claim_name(owner) {
            self.with_dir(&owner.node, false, |dir| dir.remove(&name));
        }
    }

    /// Forgets node `node`'s notes of claims at least `older_than` old,
    /// but those of `live`'s attachments.
    pub fn forget_except(&self, node: &str, live: &[&Owner], older_than: Duration) {
        let kept: HashSet<String> = live.iter().filter_map(|owner| claim_name(owner)).collect();
        self.with_dir(node, false, |dir| {
            for name in dir.names()? {
                let stale = name.starts_with("claim-") && !kept.contains(&name);
                // One gone meanwhile (its DEL forgot it) has no age.
                if stale && dir.age(&name).is_ok_and(|age| age >= older_than) {
                    dir.remove(&name)?;
                }
            }
            Ok(())
        });
    }

    /// The lease that a node on this machine granted for cooldowns, if
    /// one noted it this boot (a clock of another boot does not count).
    pub fn cooling_lease(&self) -> Option<Lease> {
        let text = self.with_dir(MACHINE, false, |dir| dir.read(LEASE))??;
        let value: Value = serde_json::from_slice(&text).ok()?;
        let boot = crate::sys::boot_id().ok()?;
        (value.get("boot")?.as_str()? == boot).then_some(())?;
        Some(Lease {
            id: value.get("id")?.as_i64()?,
            ttl: value.get("ttl")?.as_u64()?,
            granted: Duration::from_millis(value.get("grantedMs")?.as_u64()?),
        })
    }

    /// Notes `lease`, granted this boot, for the nodes on this machine.
    pub fn note_cooling_lease(&self, lease: &Lease) {
        let Ok(boot) = crate::sys::boot_id() else {
            return;
        };
        let text = json!({
            "boot": boot,
            "id": lease.id,
            "ttl": lease.ttl,
            "grantedMs": u64::try_from(lease.granted.as_millis()).unwrap_or(u64::MAX),
        })
        .to_string();
        self.with_dir(MACHINE, true, |dir| {
            dir.replace_record(LEASE, text.as_bytes())
        });
    }

    /// `work` on node `node`'s directory (made first if `make`); `None`
    /// if there is none, or it fails.
    fn with_dir<T>(
        &self,
        node: &str,
        make: bool,
        work: impl FnOnce(&Dir) -> std::io::Result<T>,
    ) -> Option<T> {
        let mut opened = self.opened.borrow_mut();
        if !opened.contains_key(node) {
            // Not kept when it fails: a later call may make it.
            let dir = self.open(node, make)?;
            opened.insert(node.to_owned(), dir);
        }
        let dir = opened.get(node)?;
        match work(dir) {
            Ok(done) => Some(done),
            Err(e) => {
                tracing::debug!("the node's note in {} failed: {e}", dir.path().display());
                None
            }
        }
    }

    /// Node `node`'s directory, made (with those above it) if `make`.
    fn open(&self, node: &str, make: bool) -> Option<Dir> {
        let root = self.root.as_ref()?;
        // Named by a digest: a node's, a network's and a cluster's names
        // may hold anything a file name may not.
        let digest = name_digest(&format!("{}\n{node}", self.scope));
        let path = root.join(format!("{digest:016x}"));
        let opened = match make {
            true => Dir::open_made(&path),
            false => Dir::open(&path),
        };
        match opened {
            Ok(dir) => Some(dir.with_durability(Durability::Ordered)),
            Err(e) => {
                if make {
                    tracing::debug!("no notes of the node's claims in {}: {e}", path.display());
                }
                None
            }
        }
    }
}

/// A lease granted for cooldowns: its ID, its time to live in seconds,
/// and when it was asked for, as [`crate::sys::since_boot`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// etcd's ID of it.
    pub id: i64,
    /// Its time to live, seconds.
    pub ttl: u64,
    /// When it was asked for, since this boot.
    pub granted: Duration,
}

/// The directory of what every node on this machine shares: no node's
/// name is empty.
const MACHINE: &str = "";

/// The file of the lease cooldowns are put on.
const LEASE: &str = "cooling-lease";

/// The file of a pool's guess.
fn guess_name(pool: &str) -> String {
    format!("guess-{:016x}", name_digest(pool))
}

/// The file of an attachment's claim, if its name can be one.
fn claim_name(owner: &Owner) -> Option<String> {
    let name = records::attachment_name(&owner.id, &owner.ifname);
    let fits = name.len() < 200 && !name.starts_with('.') && !name.contains('/');
    fits.then(|| format!("claim-{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guess_of(address: &str) -> Guess {
        Guess {
            next: vec![Addr::new(address.parse().unwrap())],
            shared: None,
        }
    }

    #[test]
    fn an_attachment_whose_name_cannot_be_a_file_in_the_notes_has_no_note() {
        // Owners also come from records in etcd, which anyone with write
        // access there may have made: none may name a path out of the
        // node's directory, or a temporary file.
        let owner = |id: &str| Owner {
            id: id.into(),
            ifname: "eth0".into(),
            node: "node-a".into(),
            workload: None,
        };
        assert_eq!(claim_name(&owner("c1")).as_deref(), Some("claim-c1:eth0"));
        for id in ["../../etc/x", "a/b", ".hidden", &"c".repeat(200)] {
            assert_eq!(claim_name(&owner(id)), None, "{id}");
        }
        let dir = tempfile::tempdir().unwrap();
        let notes = Notes::new(Some(dir.path()), "cluster", "pods");
        notes.note_claim(&owner("a/b"), b"{}", 7);
        assert_eq!(notes.claimed(&owner("a/b")), None);
    }

    #[test]
    fn each_pool_keeps_its_own_guess() {
        let dir = tempfile::tempdir().unwrap();
        let notes = Notes::new(Some(dir.path()), "cluster", "pods");
        notes.note_guess("node-a", "v4", guess_of("10.70.0.3"));
        notes.note_guess("node-a", "v6", guess_of("fd00::3"));
        assert_eq!(notes.guess("node-a", "v4"), Some(guess_of("10.70.0.3")));
        assert_eq!(notes.guess("node-a", "v6"), Some(guess_of("fd00::3")));
        assert_eq!(notes.guess("node-b", "v4"), None);
    }
}
