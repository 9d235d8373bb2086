//! The records every store keeps, and how each is written: who holds an
//! address (an attachment, or a workload's hold) and from which pool; what
//! an attachment was allocated; what a workload's hold keeps for it; each
//! as JSON, read back whole or not at all, and the names they go by.

use serde_json::{json, Value};

use crate::addr::Addr;
use crate::da_pool::clock::now;

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
pub struct PoolAddress {
    /// The pool's name.
    pub pool: String,
    /// The address.
    pub address: Addr,
}

/// What one attachment holds, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The attachment.
    pub owner: Owner,
    /// Its addresses, one per pool.
    pub held: Vec<PoolAddress>,
    /// The store's version of the record as read (etcd's mod revision; 0
    /// for the local store, which is locked while in use).
    pub revision: i64,
    /// When the record was made, in seconds since the epoch, by the clock
    /// of the node that made it.
    pub since: u64,
    /// Whether the record is where the etcd store's previous layout kept
    /// it (not under its node's prefix): there it is released, or moved.
    pub legacy: bool,
    /// The record's bytes, where the store compares them as well as its
    /// revision to release it: as a node's note of its claim keeps them,
    /// since an etcd rebuilt or restored counts its revisions again, and
    /// another record may reach the noted one.
    pub record: Option<Vec<u8>>,
}

/// What a workload's hold keeps for it (`ipam.pool.sticky`): its
/// addresses, one per pool, held while one of its containers runs and for
/// `sticky_for` seconds after the last is gone, whatever container ID or
/// node comes next. Its address records name the workload, not a
/// container, so that a new container takes them over without a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadHold {
    /// The workload, as its `CNI_ARGS` values name it (`NAMESPACE/NAME`).
    pub workload: String,
    /// The interface the addresses are for.
    pub ifname: String,
    /// The node it was last bound or released on.
    pub node: String,
    /// The addresses, one per pool.
    pub held: Vec<PoolAddress>,
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

impl WorkloadHold {
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
    pub fn released(&self, now: u64) -> WorkloadHold {
        WorkloadHold {
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
pub struct StickyClaim<'a> {
    /// The workload the addresses follow.
    pub workload: &'a str,
    /// How long the addresses stay held once the container is gone.
    pub sticky_for: u64,
    /// The workload's hold, if it had one.
    pub prior: Option<&'a WorkloadHold>,
}

impl StickyClaim<'_> {
    /// The hold as the claim leaves it: `held`, bound to `owner`'s container.
    pub fn hold_after(&self, owner: &Owner, held: &[PoolAddress]) -> WorkloadHold {
        WorkloadHold {
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
    pub fn dropped<'h>(&'h self, held: &'h [PoolAddress]) -> impl Iterator<Item = &'h PoolAddress> {
        self.prior
            .into_iter()
            .flat_map(|hold| &hold.held)
            .filter(|h| !held.iter().any(|kept| kept.address == h.address))
    }
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

/// An address given back and cooling down (`ipam.pool.reuseAfter`):
/// nobody's, and given to nobody before `until`, so that what still names
/// its last holder (an ARP or conntrack entry, a DNS record, a policy)
/// does not reach the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cooling {
    /// The pool it was given from, if the record says.
    pub pool: Option<String>,
    /// When it may be given again, seconds since the epoch (on etcd, its
    /// lease ends the record then, or a few seconds later).
    pub until: u64,
}

/// What the record of an address says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// Held by this owner ([`Owner::unknown`] for a record that names no
    /// one: torn, or not ours).
    Owner(Owner),
    /// Held by no one, and not given before its cooldown ends.
    Cooling(Cooling),
}

impl std::fmt::Display for Holder {
    /// As an operator reads who holds an address.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Owner(owner) => owner.fmt(f),
            Holder::Cooling(cooling) => write!(f, "no one: {cooling}"),
        }
    }
}

impl std::fmt::Display for Cooling {
    /// Why the address is not given, and how to end that.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "it cools down after its release until {} (\"ipam.pool.reuseAfter\"; `ipam-da-pool release --now ADDRESS` ends that)",
            crate::da_pool::clock::utc(self.until)
        )
    }
}

impl Holder {
    /// The owner, if it is held by one.
    pub fn owner(&self) -> Option<&Owner> {
        match self {
            Holder::Owner(owner) => Some(owner),
            Holder::Cooling(_) => None,
        }
    }

    /// The owner, if it is held by one.
    pub fn into_owner(self) -> Option<Owner> {
        match self {
            Holder::Owner(owner) => Some(owner),
            Holder::Cooling(_) => None,
        }
    }
}

/// The record of an address that `pool` gave and that cools down from
/// `freed` to `until` (seconds since the epoch): no owner's fields, so
/// that nothing reads it as held by someone.
/// It starts with [`COOLING`], which a search looks for before it reads
/// the rest.
pub fn cooling_record(pool: &str, freed: u64, until: u64) -> Vec<u8> {
    let pool = Value::from(pool);
    format!("{COOLING}{until},\"freed\":{freed},\"pool\":{pool}}}").into_bytes()
}

/// The record of an address that `pool` gave and that cools down from
/// now for `seconds`: a second more, since the clock counts whole ones.
pub fn cooling_from_now(pool: &str, seconds: u64) -> Vec<u8> {
    let now = now();
    cooling_record(pool, now, now.saturating_add(seconds).saturating_add(1))
}

/// How the record of a cooldown starts, and no other record does.
pub const COOLING: &str = "{\"coolingUntil\":";

/// What an address record says: its cooldown, or who holds it.
pub fn read_holder(record: &[u8]) -> Holder {
    let value: Option<Value> = serde_json::from_slice(record).ok();
    let cooling = value
        .as_ref()
        .filter(|_| record.starts_with(COOLING.as_bytes()))
        .and_then(|value| {
            Some(Cooling {
                until: value.get("coolingUntil")?.as_u64()?,
                pool: value.get("pool").and_then(Value::as_str).map(String::from),
            })
        });
    match cooling {
        Some(cooling) => Holder::Cooling(cooling),
        None => Holder::Owner(
            value
                .as_ref()
                .and_then(owner_of)
                .unwrap_or_else(Owner::unknown),
        ),
    }
}

/// The record of an attachment: who, and what it holds (for which
/// workload, if its addresses follow one).
pub fn attachment_record(owner: &Owner, held: &[PoolAddress]) -> Vec<u8> {
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
pub fn hold_record(hold: &WorkloadHold) -> Vec<u8> {
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

fn listed(held: &[PoolAddress]) -> Vec<Value> {
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

/// Whether an attachment's or a hold's record lists `address`.
pub fn lists(record: &[u8], address: Addr) -> bool {
    serde_json::from_slice::<Value>(record)
        .ok()
        .as_ref()
        .and_then(held_of)
        .is_some_and(|held| held.iter().any(|h| h.address == address))
}

/// The pool an address record says the address is from, if it says.
pub fn read_pool(record: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(record).ok()?;
    value.get("pool")?.as_str().map(String::from)
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

fn held_of(value: &Value) -> Option<Vec<PoolAddress>> {
    value
        .get("addresses")?
        .as_array()?
        .iter()
        .map(|h| {
            Some(PoolAddress {
                pool: h.get("pool")?.as_str()?.to_owned(),
                address: Addr::new(h.get("address")?.as_str()?.parse().ok()?),
            })
        })
        .collect()
}

/// What an attachment record says is held; `None` if it is not one.
pub fn read_allocation(record: &[u8], revision: i64) -> Option<Allocation> {
    let value: Value = serde_json::from_slice(record).ok()?;
    let owner = owner_of(&value)?;
    // A hold's record names its container too, but is no attachment's.
    if owner.id.is_empty() || value.get("stickyFor").is_some() {
        return None;
    }
    let held = held_of(&value)?;
    let since = value.get("since").and_then(Value::as_u64).unwrap_or(0);
    Some(Allocation {
        owner,
        held,
        revision,
        since,
        legacy: false,
        record: None,
    })
}

/// What a hold's record says; `None` if it is not one.
pub fn read_workload_hold(record: &[u8], revision: i64) -> Option<WorkloadHold> {
    let value: Value = serde_json::from_slice(record).ok()?;
    let field = |name: &str| value.get(name)?.as_str().map(String::from);
    let number = |name: &str| value.get(name).and_then(Value::as_u64);
    Some(WorkloadHold {
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
        let digest = crate::dir::name_digest(workload);
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
            PoolAddress {
                pool: "blue".into(),
                address: Addr::new("10.1.0.5".parse().unwrap()),
            },
            PoolAddress {
                pool: "blue6".into(),
                address: Addr::new("fd00::5".parse().unwrap()),
            },
        ];
        assert_eq!(
            read_owner(&address_record(&owner, "blue")),
            Some(owner.clone())
        );
        let allocation = read_allocation(&attachment_record(&owner, &held), 7).unwrap();
        assert!(allocation.since.abs_diff(now()) < 60);
        assert_eq!(
            (allocation.owner, allocation.held, allocation.revision),
            (owner, held, 7)
        );
        assert_eq!(read_allocation(b"{\"containerID\":\"c\"}", 0), None);
    }

    #[test]
    fn a_workloads_records_name_it_and_its_hold_reads_back() {
        let owner = Owner {
            id: "ctr".into(),
            ifname: "eth0".into(),
            node: "n1".into(),
            workload: Some("default/web-0".into()),
        };
        let held = vec![PoolAddress {
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
        let allocation = read_allocation(&attachment_record(&owner, &held), 3).unwrap();
        assert_eq!(allocation.owner, owner);
        let hold = StickyClaim {
            workload: "default/web-0",
            sticky_for: 60,
            prior: None,
        }
        .hold_after(&owner, &held);
        assert_eq!(hold.container.as_deref(), Some("ctr"));
        assert_eq!(hold.ends(true), None);
        assert_eq!(hold.ends(false), Some(hold.since + 60));
        let released = hold.released(1_000);
        assert_eq!(
            (released.container.as_deref(), released.ends(true)),
            (None, Some(1_060))
        );
        let read = read_workload_hold(&hold_record(&released), 9).unwrap();
        assert_eq!(
            read,
            WorkloadHold {
                revision: 9,
                ..released
            }
        );
        // A hold's record is neither an attachment's nor an address's.
        assert_eq!(read_allocation(&hold_record(&hold), 0), None);
    }

    #[test]
    fn hold_names_are_file_names() {
        assert_eq!(hold_name("default/web-0", "eth0"), "default%2Fweb-0:eth0");
        assert_eq!(hold_name("a:b%c", "net1"), "a%3Ab%25c:net1");
        assert_eq!(hold_name(".x/y.z", "eth0"), "%2Ex%2Fy.z:eth0");
        // 200 bytes are kept whole; past that, the first 183 and a digest
        // of the whole, the same in every release (a hold whose name
        // changed at an upgrade would be lost).
        let most = "m".repeat(200);
        assert_eq!(hold_name(&most, "eth0"), format!("{most}:eth0"));
        let long = "n".repeat(300);
        let name = hold_name(&long, "eth0");
        assert_eq!(name, format!("{}~a4cf91b7088f4495:eth0", "n".repeat(183)));
        assert_ne!(name, hold_name(&format!("{long}x"), "eth0"));
    }

    #[test]
    fn attachment_names_are_the_layouts() {
        assert_eq!(attachment_name("c1", "eth0"), "c1:eth0");
    }

    #[test]
    fn a_released_holds_record_says_when_it_was_released_and_when_it_ends() {
        let hold = WorkloadHold {
            workload: "default/web-0".into(),
            ifname: "eth0".into(),
            node: "n1".into(),
            held: Vec::new(),
            container: Some("ctr".into()),
            until: None,
            sticky_for: 60,
            since: 10,
            revision: 4,
        };
        let record: Value = serde_json::from_slice(&hold_record(&hold.released(1_000))).unwrap();
        assert_eq!(
            (&record["containerID"], &record["since"], &record["until"]),
            (&Value::Null, &json!(1_000), &json!(1_060))
        );
    }

    #[test]
    fn a_sticky_claim_records_its_owner_as_the_workloads() {
        // `import` claims for a hold with the attachment's owner as read,
        // which may name no workload.
        let plain = Owner {
            id: "ctr".into(),
            ifname: "eth0".into(),
            node: "n1".into(),
            workload: None,
        };
        let claim = StickyClaim {
            workload: "default/web-0",
            sticky_for: 60,
            prior: None,
        };
        assert_eq!(
            claim.owner(&plain).workload.as_deref(),
            Some("default/web-0")
        );
    }

    #[test]
    fn a_record_says_which_addresses_it_lists_and_the_pool_of_its_address() {
        let owner = Owner {
            id: "ctr".into(),
            ifname: "eth0".into(),
            node: "n1".into(),
            workload: None,
        };
        let addr = |a: &str| Addr::new(a.parse().unwrap());
        let held = [PoolAddress {
            pool: "blue".into(),
            address: addr("10.1.0.5"),
        }];
        let record = attachment_record(&owner, &held);
        assert!(lists(&record, addr("10.1.0.5")));
        assert!(!lists(&record, addr("10.1.0.6")));
        assert!(!lists(b"not json", addr("10.1.0.5")));
        assert_eq!(
            read_pool(&address_record(&owner, "blue")).as_deref(),
            Some("blue")
        );
        assert_eq!(read_pool(b"{}"), None);
    }
}
