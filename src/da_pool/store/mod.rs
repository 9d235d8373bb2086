//! What the allocator keeps, and the one interface both stores give it: an
//! address held by one attachment, or by a workload's hold, recorded with
//! its owner; what each attachment holds; what each workload's hold keeps
//! for it; a hint of where to look next in each pool.

pub mod etcd;
#[cfg(test)]
pub mod fake;
pub mod local;

use serde_json::{json, Value};

use crate::addr::Addr;
use crate::da_pool::PoolError;
use crate::error::Error;

/// Who holds an address: an attachment (container ID and interface) on a
/// node, its addresses its own or held for a workload; or, in an address
/// record that a workload's hold keeps, the workload and interface alone
/// (no container ID: whichever container of the workload runs holds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The container ID; empty in a record a workload's hold keeps.
    pub id: String,
    /// The interface in the container.
    pub ifname: String,
    /// The node whose runtime made the attachment.
    pub node: String,
    /// The workload the addresses follow (`ipam.pool.sticky`), if any.
    pub workload: Option<String>,
}

impl Owner {
    /// The owner of a record that does not say who it is: the address is
    /// taken all the same, by no attachment anyone can name.
    pub fn unknown() -> Owner {
        Owner {
            id: String::new(),
            ifname: String::new(),
            node: String::new(),
            workload: None,
        }
    }

    /// Whether both are the same attachment (a container ID and interface
    /// name one attachment of a network, whatever node recorded it).
    pub fn same_attachment(&self, other: &Owner) -> bool {
        self.id == other.id && self.ifname == other.ifname
    }

    /// Whether an address record naming `record` is this attachment's: it
    /// names the attachment, or the workload (and interface) the
    /// attachment holds its addresses for.
    pub fn owns(&self, record: &Owner) -> bool {
        match (&self.workload, &record.workload) {
            (Some(mine), Some(theirs)) => mine == theirs && self.ifname == record.ifname,
            (None, None) => self.same_attachment(record),
            _ => false,
        }
    }
}

impl std::fmt::Display for Owner {
    /// As an operator reads it: `ID/IFNAME on node N`, with the workload
    /// if there is one, or `workload W (IFNAME) on node N` for a record a
    /// workload's hold keeps.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.workload, self.id.is_empty()) {
            (Some(workload), true) => write!(f, "workload {workload} ({})", self.ifname)?,
            (Some(workload), false) => {
                write!(f, "{}/{} (workload {workload})", self.id, self.ifname)?
            }
            (None, _) => write!(f, "{}/{}", self.id, self.ifname)?,
        }
        write!(f, " on node {}", self.node)
    }
}

/// One address an attachment holds, and the pool it is from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The pool's name.
    pub pool: String,
    /// The address.
    pub address: Addr,
}

/// What one attachment holds, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// The attachment.
    pub owner: Owner,
    /// Its addresses, one per pool.
    pub held: Vec<Held>,
    /// The store's version of the record as read (etcd's mod revision; 0
    /// for the local store, which is locked while in use).
    pub revision: i64,
    /// When the record was made, in seconds since the epoch, by the clock
    /// of the node that made it.
    pub since: u64,
    /// Whether the record is where the etcd store's previous layout kept
    /// it (not under its node's prefix): there it is released, or moved.
    pub legacy: bool,
}

/// What a workload's hold keeps for it (`ipam.pool.sticky`): its
/// addresses, one per pool, held while one of its containers runs and for
/// `sticky_for` seconds after the last is gone, whatever container ID or
/// node comes next. Its address records name the workload, not a
/// container, so that a new container takes them over without a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The workload, as its `CNI_ARGS` values name it (`NAMESPACE/NAME`).
    pub workload: String,
    /// The interface the addresses are for.
    pub ifname: String,
    /// The node it was last bound or released on.
    pub node: String,
    /// The addresses, one per pool.
    pub held: Vec<Held>,
    /// The container whose attachment holds the addresses now, if one does.
    pub container: Option<String>,
    /// When the hold ends, seconds since the epoch, once released.
    pub until: Option<u64>,
    /// How long the addresses stay held once the container is gone.
    pub sticky_for: u64,
    /// When it was last bound or released.
    pub since: u64,
    /// The store's version of the record as read (0 for the local store).
    pub revision: i64,
}

impl Hold {
    /// When the hold ends, seconds since the epoch: never while a container
    /// of the workload holds it (`bound_alive`: its attachment's record
    /// exists); once released, `until`; bound to a container whose record
    /// is gone (an ADD cut short after it bound the hold), `sticky_for`
    /// after it was bound.
    pub fn ends(&self, bound_alive: bool) -> Option<u64> {
        match (&self.container, self.until) {
            (Some(_), _) if bound_alive => None,
            (_, Some(until)) => Some(until),
            _ => Some(self.since.saturating_add(self.sticky_for)),
        }
    }

    /// Whom its address records name.
    pub fn owner(&self) -> Owner {
        Owner {
            id: String::new(),
            ifname: self.ifname.clone(),
            node: self.node.clone(),
            workload: Some(self.workload.clone()),
        }
    }

    /// The same hold, given up by its container at `now`: held until
    /// `sticky_for` later.
    pub fn released(&self, now: u64) -> Hold {
        Hold {
            container: None,
            until: Some(now.saturating_add(self.sticky_for)),
            since: now,
            ..self.clone()
        }
    }
}

/// What a claim for a workload's container also records: the hold, made
/// or taken over from `prior` (the hold as read; the addresses it lists
/// that the claim does not are given back).
#[derive(Debug, Clone, Copy)]
pub struct Sticky<'a> {
    /// The workload the addresses follow.
    pub workload: &'a str,
    /// How long the addresses stay held once the container is gone.
    pub sticky_for: u64,
    /// The workload's hold, if it had one.
    pub prior: Option<&'a Hold>,
}

impl Sticky<'_> {
    /// The hold as the claim leaves it: `held`, bound to `owner`'s container.
    pub fn hold(&self, owner: &Owner, held: &[Held]) -> Hold {
        Hold {
            workload: self.workload.to_owned(),
            ifname: owner.ifname.clone(),
            node: owner.node.clone(),
            held: held.to_vec(),
            container: Some(owner.id.clone()),
            until: None,
            sticky_for: self.sticky_for,
            since: now(),
            revision: 0,
        }
    }

    /// `owner` as the claim records it: holding for the workload.
    pub fn owner(&self, owner: &Owner) -> Owner {
        Owner {
            workload: Some(self.workload.to_owned()),
            ..owner.clone()
        }
    }

    /// The prior hold's addresses that the claim gives back.
    pub fn dropped<'h>(&'h self, held: &'h [Held]) -> impl Iterator<Item = &'h Held> {
        self.prior
            .into_iter()
            .flat_map(|hold| &hold.held)
            .filter(|h| !held.iter().any(|kept| kept.address == h.address))
    }
}

/// Where allocations are kept, for one network. An address is held at
/// most once in a network, whatever pool names it.
pub trait Store {
    /// What the attachment (`id`, `ifname`) of node `node` holds, if
    /// anything.
    fn holding(&self, node: &str, id: &str, ifname: &str) -> Result<Option<Holding>, Error>;

    /// Who holds `address`, if anyone.
    fn holder(&self, address: Addr) -> Result<Option<Owner>, Error>;

    /// The first address from `from` to `to` that nobody holds and that
    /// `gives` allows; never enumerating more than it must.
    fn first_free(
        &self,
        from: Addr,
        to: Addr,
        gives: &dyn Fn(Addr) -> bool,
    ) -> Result<Option<Addr>, Error>;

    /// Where node `node` starts looking for a free address of `pool`:
    /// just after the last one it gave (near it, on etcd, where the hint
    /// is written only when it has moved far).
    fn hint(&self, node: &str, pool: &str) -> Result<Option<Addr>, Error>;

    /// Notes that a search went through the whole of `pool` and found it
    /// full, so that the ADDs a runtime retries in the next moments do not
    /// read it whole again; any address given back ends the note.
    fn note_full(&self, pool: &str) -> Result<(), Error>;

    /// Whether a search found `pool` full moments ago, as noted.
    fn noted_full(&self, pool: &str) -> Result<bool, Error>;

    /// Records that `owner` holds `held` (an address of each pool), all of
    /// it or none: `Ok(false)`, and nothing changed, if an address was
    /// taken meanwhile or the attachment holds something already. With
    /// `sticky`, the addresses are recorded as the workload's, its hold
    /// bound to the container: those the prior hold
    /// listed are taken over, if still the workload's, the others given
    /// back; `Ok(false)` too if the hold changed meanwhile.
    fn claim(&self, owner: &Owner, held: &[Held], sticky: Option<&Sticky>) -> Result<bool, Error>;

    /// Gives back what `holding` holds, as it was read: `Ok(false)`, and
    /// nothing changed, if it changed meanwhile. Addresses held for a
    /// workload stay held by its hold, released for its `sticky_for`
    /// (unless another container of the workload holds them now); without
    /// a hold, they are given back.
    fn release(&self, holding: &Holding) -> Result<bool, Error>;

    /// The hold of `workload` for interface `ifname`, if it has one.
    fn hold(&self, workload: &str, ifname: &str) -> Result<Option<Hold>, Error>;

    /// Every workload's hold in the network.
    fn holds(&self) -> Result<Vec<Hold>, Error>;

    /// Ends `hold` as it was read, giving back the addresses it keeps:
    /// `Ok(false)`, and nothing changed, if it changed meanwhile or a
    /// container's attachment holds it (its addresses are in use).
    fn end_hold(&self, hold: &Hold) -> Result<bool, Error>;

    /// What every attachment of the network holds.
    fn holdings(&self) -> Result<Vec<Holding>, Error>;

    /// What node `node`'s attachments hold (GC's), read without reading
    /// every node's: on etcd, one prefix.
    fn holdings_of(&self, node: &str) -> Result<Vec<Holding>, Error>;

    /// Every address record of the network, with the owner it names
    /// (`None` for a record that does not say who: torn, or not ours).
    fn address_records(&self) -> Result<Vec<(Addr, Option<Owner>)>, Error>;

    /// The ranges of pool `name` as the store defines them (etcd's
    /// `PREFIX/pools/NAME`), if it does.
    fn pool_definition(&self, name: &str) -> Result<Option<Value>, Error>;

    /// Why `node` may not claim, if it may not: `reclaim` gave back what
    /// it held, and fenced it (etcd only).
    fn fenced(&self, node: &str) -> Result<Option<PoolError>, Error>;

    /// Whether the store can answer now.
    fn ping(&self) -> Result<(), Error>;

    /// Whether other nodes keep records here too (GC must then leave
    /// theirs alone); a local store's are all this node's, whatever name
    /// the node had when it made them.
    fn is_shared(&self) -> bool;
}

/// The record of an address: who holds it (the attachment, or the
/// workload whose hold keeps it), and from which pool.
pub fn address_record(owner: &Owner, pool: &str) -> Vec<u8> {
    let record = match &owner.workload {
        Some(workload) => json!({
            "workload": workload,
            "ifname": owner.ifname,
            "node": owner.node,
            "pool": pool,
            "since": now(),
        }),
        None => json!({
            "containerID": owner.id,
            "ifname": owner.ifname,
            "node": owner.node,
            "pool": pool,
            "since": now(),
        }),
    };
    record.to_string().into_bytes()
}

/// The record of an attachment: who, and what it holds (for which
/// workload, if its addresses follow one).
pub fn attachment_record(owner: &Owner, held: &[Held]) -> Vec<u8> {
    let mut record = json!({
        "containerID": owner.id,
        "ifname": owner.ifname,
        "node": owner.node,
        "addresses": listed(held),
        "since": now(),
    });
    if let Some(workload) = &owner.workload {
        record["workload"] = json!(workload);
    }
    record.to_string().into_bytes()
}

/// The record of a workload's hold.
pub fn hold_record(hold: &Hold) -> Vec<u8> {
    json!({
        "workload": hold.workload,
        "ifname": hold.ifname,
        "node": hold.node,
        "addresses": listed(&hold.held),
        "containerID": hold.container,
        "until": hold.until,
        "stickyFor": hold.sticky_for,
        "since": hold.since,
    })
    .to_string()
    .into_bytes()
}

fn listed(held: &[Held]) -> Vec<Value> {
    held.iter()
        .map(|h| json!({"pool": h.pool, "address": h.address.to_string()}))
        .collect()
}

/// The owner an address record or attachment record names: an
/// attachment, or a workload's hold (no container ID).
pub fn read_owner(record: &[u8]) -> Option<Owner> {
    let value: Value = serde_json::from_slice(record).ok()?;
    owner_of(&value)
}

fn owner_of(value: &Value) -> Option<Owner> {
    let field = |name: &str| value.get(name)?.as_str().map(String::from);
    let workload = field("workload");
    let id = match (field("containerID"), &workload) {
        (Some(id), _) => id,
        (None, Some(_)) => String::new(),
        (None, None) => return None,
    };
    Some(Owner {
        id,
        ifname: field("ifname")?,
        node: field("node")?,
        workload,
    })
}

fn held_of(value: &Value) -> Option<Vec<Held>> {
    value
        .get("addresses")?
        .as_array()?
        .iter()
        .map(|h| {
            Some(Held {
                pool: h.get("pool")?.as_str()?.to_owned(),
                address: Addr::new(h.get("address")?.as_str()?.parse().ok()?),
            })
        })
        .collect()
}

/// What an attachment record says is held; `None` if it is not one.
pub fn read_holding(record: &[u8], revision: i64) -> Option<Holding> {
    let value: Value = serde_json::from_slice(record).ok()?;
    let owner = owner_of(&value)?;
    // A hold's record names its container too, but is no attachment's.
    if owner.id.is_empty() || value.get("stickyFor").is_some() {
        return None;
    }
    let held = held_of(&value)?;
    let since = value.get("since").and_then(Value::as_u64).unwrap_or(0);
    Some(Holding {
        owner,
        held,
        revision,
        since,
        legacy: false,
    })
}

/// What a hold's record says; `None` if it is not one.
pub fn read_hold(record: &[u8], revision: i64) -> Option<Hold> {
    let value: Value = serde_json::from_slice(record).ok()?;
    let field = |name: &str| value.get(name)?.as_str().map(String::from);
    let number = |name: &str| value.get(name).and_then(Value::as_u64);
    Some(Hold {
        workload: field("workload")?,
        ifname: field("ifname")?,
        node: field("node")?,
        held: held_of(&value)?,
        container: field("containerID"),
        until: number("until"),
        sticky_for: number("stickyFor")?,
        since: number("since").unwrap_or(0),
        revision,
    })
}

/// Seconds since the epoch: when a record was made.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `seconds` since the epoch as an RFC 3339 time in UTC.
pub fn utc(seconds: u64) -> String {
    let days = seconds / 86_400;
    let rest = seconds % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

/// An attachment's name in a store: `ID:IFNAME`, a ':' being in neither.
pub fn attachment_name(id: &str, ifname: &str) -> String {
    format!("{id}:{ifname}")
}

/// The longest workload part of a hold's name kept whole: with the
/// interface, a hold's name stays within a file name's 255 bytes.
const WORKLOAD_NAME_MAX: usize = 200;

/// A hold's name in a store: `WORKLOAD:IFNAME`, the workload with every
/// byte but letters, digits, '.', '_' and '-' written `%XX` (so
/// `default/web-0` is `default%2Fweb-0`), and a '.' that would start it
/// too (a name starting with one is a temporary file's, never listed);
/// one longer than 200 bytes so written is cut there and ends with a
/// digest of the whole.
pub fn hold_name(workload: &str, ifname: &str) -> String {
    let mut name = String::new();
    for (i, byte) in workload.bytes().enumerate() {
        let kept =
            byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-') || (byte == b'.' && i > 0);
        if kept {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    if name.len() > WORKLOAD_NAME_MAX {
        // FNV-1a: stable across builds and releases, as a name must be.
        let digest = workload.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        name.truncate(WORKLOAD_NAME_MAX - 17);
        name.push_str(&format!("~{digest:016x}"));
    }
    format!("{name}:{ifname}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back() {
        let owner = Owner {
            id: "ctr".into(),
            ifname: "eth0".into(),
            node: "n1".into(),
            workload: None,
        };
        let held = vec![
            Held {
                pool: "blue".into(),
                address: Addr::new("10.1.0.5".parse().unwrap()),
            },
            Held {
                pool: "blue6".into(),
                address: Addr::new("fd00::5".parse().unwrap()),
            },
        ];
        assert_eq!(
            read_owner(&address_record(&owner, "blue")),
            Some(owner.clone())
        );
        let holding = read_holding(&attachment_record(&owner, &held), 7).unwrap();
        assert!(holding.since.abs_diff(now()) < 60);
        assert_eq!(
            (holding.owner, holding.held, holding.revision),
            (owner, held, 7)
        );
        assert_eq!(read_holding(b"{\"containerID\":\"c\"}", 0), None);
    }

    #[test]
    fn a_workloads_records_name_it_and_its_hold_reads_back() {
        let owner = Owner {
            id: "ctr".into(),
            ifname: "eth0".into(),
            node: "n1".into(),
            workload: Some("default/web-0".into()),
        };
        let held = vec![Held {
            pool: "blue".into(),
            address: Addr::new("10.1.0.5".parse().unwrap()),
        }];
        // The address's record names the workload, not the container: the
        // workload's next container owns it without a write.
        let record = read_owner(&address_record(&owner, "blue")).unwrap();
        assert_eq!(record.id, "");
        assert!(owner.owns(&record));
        let next = Owner {
            id: "ctr2".into(),
            ..owner.clone()
        };
        assert!(next.owns(&record));
        let other = Owner {
            workload: Some("default/web-1".into()),
            ..owner.clone()
        };
        assert!(!other.owns(&record));
        let plain = Owner {
            workload: None,
            ..owner.clone()
        };
        assert!(!plain.owns(&record) && !owner.owns(&plain));
        // An attachment record keeps its workload; a hold's record reads back.
        let holding = read_holding(&attachment_record(&owner, &held), 3).unwrap();
        assert_eq!(holding.owner, owner);
        let hold = Sticky {
            workload: "default/web-0",
            sticky_for: 60,
            prior: None,
        }
        .hold(&owner, &held);
        assert_eq!(hold.container.as_deref(), Some("ctr"));
        assert_eq!(hold.ends(true), None);
        assert_eq!(hold.ends(false), Some(hold.since + 60));
        let released = hold.released(1_000);
        assert_eq!(
            (released.container.as_deref(), released.ends(true)),
            (None, Some(1_060))
        );
        let read = read_hold(&hold_record(&released), 9).unwrap();
        assert_eq!(
            read,
            Hold {
                revision: 9,
                ..released
            }
        );
        // A hold's record is neither an attachment's nor an address's.
        assert_eq!(read_holding(&hold_record(&hold), 0), None);
    }

    #[test]
    fn times_are_rfc_3339_in_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_795_438_282), "2026-11-23T12:51:22Z");
    }

    #[test]
    fn hold_names_are_file_names() {
        assert_eq!(hold_name("default/web-0", "eth0"), "default%2Fweb-0:eth0");
        assert_eq!(hold_name("a:b%c", "net1"), "a%3Ab%25c:net1");
        assert_eq!(hold_name(".x/y.z", "eth0"), "%2Ex%2Fy.z:eth0");
        let long = "n".repeat(300);
        let name = hold_name(&long, "eth0");
        assert!(name.len() <= 206, "{}", name.len());
        assert_ne!(name, hold_name(&format!("{long}x"), "eth0"));
    }
}
