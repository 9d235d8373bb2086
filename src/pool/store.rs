//! What the allocator keeps, and the one interface both stores give it: an
//! address held by one attachment, recorded with its owner; what each
//! attachment holds; a hint of where to look next in each pool.

use serde_json::{json, Value};

use super::range::Addr;
use crate::error::Error;

/// Who holds an address: an attachment (container ID and interface) on a
/// node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The container ID.
    pub id: String,
    /// The interface in the container.
    pub ifname: String,
    /// The node whose runtime made the attachment.
    pub node: String,
}

impl Owner {
    /// The owner of a record that does not say who it is: the address is
    /// taken all the same, by no attachment anyone can name.
    pub fn unknown() -> Owner {
        Owner {
            id: String::new(),
            ifname: String::new(),
            node: String::new(),
        }
    }

    /// Whether both are the same attachment (a container ID and interface
    /// name one attachment of a network, whatever node recorded it).
    pub fn same_attachment(&self, other: &Owner) -> bool {
        self.id == other.id && self.ifname == other.ifname
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
}

/// Where allocations are kept, for one network. An address is held at
/// most once in a network, whatever pool names it.
pub trait Store {
    /// What the attachment (`id`, `ifname`) holds, if anything.
    fn holding(&self, id: &str, ifname: &str) -> Result<Option<Holding>, Error>;

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

    /// Where to start looking for a free address of `pool`: just after the
    /// last one given.
    fn hint(&self, pool: &str) -> Result<Option<Addr>, Error>;

    /// Records that `owner` holds `held` (an address of each pool), all of
    /// it or none: `Ok(false)`, and nothing changed, if an address was
    /// taken meanwhile or the attachment holds something already.
    fn claim(&self, owner: &Owner, held: &[Held]) -> Result<bool, Error>;

    /// Gives back what `holding` holds, as it was read: `Ok(false)`, and
    /// nothing changed, if it changed meanwhile.
    fn release(&self, holding: &Holding) -> Result<bool, Error>;

    /// What every attachment of the network holds.
    fn holdings(&self) -> Result<Vec<Holding>, Error>;

    /// Every address record of the network, with the owner it names
    /// (`None` for a record that does not say who: torn, or not ours).
    fn address_records(&self) -> Result<Vec<(Addr, Option<Owner>)>, Error>;

    /// The ranges of pool `name` as the store defines them (etcd's
    /// `PREFIX/pools/NAME`), if it does.
    fn pool_definition(&self, name: &str) -> Result<Option<Value>, Error>;

    /// Whether the store can answer now.
    fn ping(&self) -> Result<(), Error>;

    /// Whether other nodes keep records here too (GC must then leave
    /// theirs alone); a local store's are all this node's, whatever name
    /// the node had when it made them.
    fn is_shared(&self) -> bool;
}

/// The record of an address: who holds it, and from which pool.
pub fn address_record(owner: &Owner, pool: &str) -> Vec<u8> {
    json!({
        "containerID": owner.id,
        "ifname": owner.ifname,
        "node": owner.node,
        "pool": pool,
        "since": now(),
    })
    .to_string()
    .into_bytes()
}

/// The record of an attachment: who, and what it holds.
pub fn attachment_record(owner: &Owner, held: &[Held]) -> Vec<u8> {
    let addresses: Vec<Value> = held
        .iter()
        .map(|h| json!({"pool": h.pool, "address": h.address.to_string()}))
        .collect();
    json!({
        "containerID": owner.id,
        "ifname": owner.ifname,
        "node": owner.node,
        "addresses": addresses,
        "since": now(),
    })
    .to_string()
    .into_bytes()
}

/// The owner an address record or attachment record names.
pub fn read_owner(record: &[u8]) -> Option<Owner> {
    let value: Value = serde_json::from_slice(record).ok()?;
    let field = |name: &str| value.get(name)?.as_str().map(String::from);
    Some(Owner {
        id: field("containerID")?,
        ifname: field("ifname")?,
        node: field("node")?,
    })
}

/// What an attachment record says is held; `None` if it is not one.
pub fn read_holding(record: &[u8], revision: i64) -> Option<Holding> {
    let owner = read_owner(record)?;
    let value: Value = serde_json::from_slice(record).ok()?;
    let held = value
        .get("addresses")?
        .as_array()?
        .iter()
        .map(|h| {
            Some(Held {
                pool: h.get("pool")?.as_str()?.to_owned(),
                address: Addr::new(h.get("address")?.as_str()?.parse().ok()?),
            })
        })
        .collect::<Option<Vec<Held>>>()?;
    let since = value.get("since").and_then(Value::as_u64).unwrap_or(0);
    Some(Holding {
        owner,
        held,
        revision,
        since,
    })
}

/// Seconds since the epoch: when a record was made.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An attachment's name in a store: `ID:IFNAME`, a ':' being in neither.
pub fn attachment_name(id: &str, ifname: &str) -> String {
    format!("{id}:{ifname}")
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
}
