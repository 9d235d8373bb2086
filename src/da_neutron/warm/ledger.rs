//! The ledger of a node's warm pool, one file per CNI network under
//! `dataDir/warm`: the free ports the node may hand out (each with what an
//! answer needs: its addresses, and their subnets as read), the ports
//! handed out whose owner the keeper has yet to record, and the epoch the
//! pooled ports are tagged with. Every change is made under the node-wide
//! lock (one `flock` on the directory) and written whole: synced, then
//! renamed into place, then the directory synced. The keeper's heartbeat
//! is a file beside it.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::da_neutron::state::now;
use crate::dir::{Dir, DirError, Durability};
use crate::sys::Lock;

/// The directory under `dataDir`.
const WARM_DIR: &str = "warm";

/// A free pooled port, as the ledger keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pooled {
    /// The pool (of `ipam.neutron`) it was made for.
    pub pool: String,
    /// The controller's network.
    pub network_id: String,
    /// `(subnet ID, address)`.
    pub fixed_ips: Vec<(String, String)>,
}

/// A pooled port handed out, until its owner is on the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub port: Pooled,
    pub container: String,
    pub ifname: String,
    /// The pod's tag, where the runtime named the pod.
    pub pod: Option<String>,
}

/// One CNI network's ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    /// What its pooled ports are tagged with: the boot ID when it began,
    /// a dot, and a random part.
    pub epoch: String,
    /// Whether the keeper has set it against the controller since it
    /// began: an ADD hands out nothing before.
    pub reconciled: bool,
    /// Free ports by ID.
    pub free: BTreeMap<String, Pooled>,
    /// Ports handed out by ID.
    pub claimed: BTreeMap<String, Claim>,
    /// The subnets of the pooled ports, as the controller gave them.
    pub subnets: BTreeMap<String, Value>,
}

impl Ledger {
    /// A new ledger, with an epoch of its own.
    pub fn new() -> io::Result<Ledger> {
        Ok(Ledger {
            epoch: format!("{}.{}", crate::sys::boot_id()?, crate::sys::random_hex()?),
            reconciled: false,
            free: BTreeMap::new(),
            claimed: BTreeMap::new(),
            subnets: BTreeMap::new(),
        })
    }

    /// How many free ports pool `pool` has.
    pub fn free_of(&self, pool: &str) -> u64 {
        self.free.values().filter(|p| p.pool == pool).count() as u64
    }

    /// The claims of attachment `container`/`ifname`, by port ID.
    pub fn claims_of<'a>(
        &'a self,
        container: &'a str,
        ifname: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a Claim)> + 'a {
        self.claimed
            .iter()
            .filter(move |(_, c)| c.container == container && c.ifname == ifname)
    }
}

/// What a read of a ledger found.
#[derive(Debug)]
pub enum Found {
    /// No ledger yet.
    Missing,
    /// A file that is not a ledger (what is wrong with it).
    Unreadable(String),
    /// The file could not be read now (not a verdict on what it holds).
    Failed(DirError),
    Ledger(Ledger),
}

/// The warm directory under a data directory.
pub struct Shelf {
    dir: Dir,
}

/// The shelf, locked for this process until dropped.
pub struct Locked {
    dir: Dir,
}

impl Shelf {
    /// The warm directory under `data_dir`, made if missing.
    pub fn open_made(data_dir: &Path) -> io::Result<Shelf> {
        let dir = Dir::open_made(data_dir)?.child_made(WARM_DIR)?;
        Ok(Shelf {
            dir: dir.with_durability(Durability::Durable),
        })
    }

    /// The warm directory under `data_dir`, if there is one.
    pub fn open(data_dir: &Path) -> Option<Shelf> {
        let dir = Dir::open(data_dir).ok()?.child(WARM_DIR).ok()??;
        Some(Shelf {
            dir: dir.with_durability(Durability::Durable),
        })
    }

    /// Takes the node-wide lock, waiting until `deadline` at most: on a
    /// descriptor of its own, so that it ends when the [`Locked`] goes.
    pub fn lock(&self, deadline: Instant) -> Result<Locked, DirError> {
        let dir = Dir::open(self.dir.path())
            .map_err(|e| DirError::io(self.dir.path(), e))?
            .with_durability(Durability::Durable);
        dir.lock(Lock::Exclusive, Some(deadline))?;
        Ok(Locked { dir })
    }

    /// Makes this process `network`'s only keeper on the node, waiting
    /// while another is (or until a termination request): a lock of its
    /// own, held while the returned directory is open. Two keepers of one
    /// ledger would each take the other's fresh ports for strays.
    pub fn keep_alone(&self, network: &str) -> Result<Dir, DirError> {
        let name = format!("{}.keeper-lock", network.trim_start_matches('.'));
        let dir = self
            .dir
            .child_made(&name)
            .map_err(|e| self.dir.error_at(&name, e))?;
        if dir.lock(Lock::Exclusive, Some(Instant::now())).is_err() {
            tracing::warn!("another keeper of network {network:?} runs on this node: waiting");
            dir.lock(Lock::Exclusive, None)?;
        }
        Ok(dir)
    }

    /// Notes that the keeper of `network` is at work now.
    pub fn beat(&self, network: &str) -> io::Result<()> {
        self.dir
            .overwrite(&beat_file(network), now().to_string().as_bytes())
    }

    /// Notes that the keeper of `network` stops: no ADD hands out until it
    /// beats again.
    pub fn stop_beating(&self, network: &str) -> io::Result<()> {
        self.dir.remove(&beat_file(network)).map(drop)
    }

    /// Whether the keeper of `network` beat within `within`.
    pub fn beating(&self, network: &str, within: Duration) -> bool {
        let beat = self
            .dir
            .read(&beat_file(network))
            .ok()
            .flatten()
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|b| b.trim().parse::<u64>().ok());
        beat.is_some_and(|at| at <= now() && now() - at < within.as_secs())
    }

    /// Reads `network`'s ledger without the lock (one whole file or
    /// another: it is only ever renamed into place), for a look.
    pub fn peek(&self, network: &str) -> Found {
        read(&self.dir, network)
    }
}

impl Locked {
    /// Reads `network`'s ledger.
    pub fn read(&self, network: &str) -> Found {
        read(&self.dir, network)
    }

    /// Writes `network`'s ledger whole.
    pub fn write(&self, network: &str, ledger: &Ledger) -> Result<(), DirError> {
        let content = serde_json::to_vec(ledger).map_err(io::Error::other);
        content
            .and_then(|c| self.dir.replace(&ledger_file(network), &c))
            .map_err(|e| self.dir.error_at(&ledger_file(network), e))
    }

    /// Keeps an unreadable ledger of `network`'s aside, for the operator,
    /// before a new one takes its place.
    pub fn set_aside(&self, network: &str) -> Result<(), DirError> {
        let name = ledger_file(network);
        let Some(content) = self
            .dir
            .read(&name)
            .map_err(|e| self.dir.error_at(&name, e))?
        else {
            return Ok(());
        };
        let aside = format!("{name}.unreadable");
        self.dir
            .replace(&aside, &content)
            .map_err(|e| self.dir.error_at(&aside, e))
    }
}

fn read(dir: &Dir, network: &str) -> Found {
    let name = ledger_file(network);
    match dir.read(&name) {
        Ok(None) => Found::Missing,
        Err(e) => Found::Failed(dir.error_at(&name, e)),
        Ok(Some(content)) => match serde_json::from_slice(&content) {
            Ok(ledger) => Found::Ledger(ledger),
            Err(e) => Found::Unreadable(e.to_string()),
        },
    }
}

/// A CNI network's name has no `/`; a leading dot is kept from hiding it.
fn ledger_file(network: &str) -> String {
    format!("{}.ledger", network.trim_start_matches('.'))
}

fn beat_file(network: &str) -> String {
    format!("{}.keeper", network.trim_start_matches('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pooled(pool: &str) -> Pooled {
        Pooled {
            pool: pool.into(),
            network_id: "n".into(),
            fixed_ips: vec![("s".into(), "10.0.0.5".into())],
        }
    }

    #[test]
    fn a_ledger_reads_back_as_written_and_a_garbled_one_is_said_unreadable() {
        let root = tempfile::tempdir().unwrap();
        let shelf = Shelf::open_made(root.path()).unwrap();
        let locked = shelf.lock(Instant::now() + Duration::from_secs(1)).unwrap();
        assert!(matches!(locked.read("net"), Found::Missing));
        let mut ledger = Ledger::new().unwrap();
        assert!(ledger.epoch.starts_with(&crate::sys::boot_id().unwrap()));
        ledger.free.insert("p1".into(), pooled("a"));
        ledger.free.insert("p2".into(), pooled("b"));
        locked.write("net", &ledger).unwrap();
        match locked.read("net") {
            Found::Ledger(read) => assert_eq!(read, ledger),
            other => panic!("{other:?}"),
        }
        assert_eq!(ledger.free_of("a"), 1);
        // A file that cannot be read now is no verdict on the ledger.
        let other = root.path().join("warm/other.ledger");
        std::fs::create_dir(&other).unwrap();
        assert!(matches!(shelf.peek("other"), Found::Failed(_)));
        std::fs::write(root.path().join("warm/net.ledger"), b"{\"epoch\":").unwrap();
        assert!(matches!(shelf.peek("net"), Found::Unreadable(_)));
        locked.set_aside("net").unwrap();
        assert_eq!(
            std::fs::read(root.path().join("warm/net.ledger.unreadable")).unwrap(),
            b"{\"epoch\":"
        );
    }

    #[test]
    fn the_lock_is_the_nodes_one_and_ends_with_its_holder() {
        let root = tempfile::tempdir().unwrap();
        let shelf = Shelf::open_made(root.path()).unwrap();
        let held = shelf.lock(Instant::now()).unwrap();
        let other = Shelf::open(root.path()).unwrap();
        let waited = other.lock(Instant::now() + Duration::from_millis(100));
        assert!(matches!(waited, Err(DirError::LockTimeout { .. })));
        drop(held);
        other.lock(Instant::now()).unwrap();
    }

    #[test]
    fn a_keeper_beats_and_stops_beating() {
        let root = tempfile::tempdir().unwrap();
        let shelf = Shelf::open_made(root.path()).unwrap();
        let within = Duration::from_secs(10);
        assert!(!shelf.beating("net", within));
        shelf.beat("net").unwrap();
        assert!(shelf.beating("net", within));
        assert!(!shelf.beating("other", within));
        let old = now() - 10;
        std::fs::write(root.path().join("warm/net.keeper"), old.to_string()).unwrap();
        assert!(!shelf.beating("net", within));
        shelf.beat("net").unwrap();
        shelf.stop_beating("net").unwrap();
        assert!(!shelf.beating("net", within));
        let _alone = shelf.keep_alone("net").unwrap();
        let other = Shelf::open(root.path()).unwrap();
        let second = other.dir.child("net.keeper-lock").unwrap().unwrap();
        assert!(second.lock(Lock::Exclusive, Some(Instant::now())).is_err());
    }
}
