//! `ipam-da-pool check`: what it finds wrong in a network's records: an
//! address held outside its pool's ranges (a range shrunk since), an
//! attachment or a workload's hold whose addresses are not recorded as
//! its own, an address record nothing can free (torn, or neither its
//! attachment nor its workload's hold lists it), one address listed twice,
//! attachments the runtime no longer knows, what nodes hold whose
//! keeper is gone since long, the nodes `reclaim` fenced, and an etcd
//! database near its quota or raising an alarm. Each finding is a sentence naming what to
//! look at. The records are read without a lock, while ADDs and DELs go
//! on: a finding between two records is read again before it is named,
//! so that a record made or removed between the reads is not one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{dead_for, finish, open_unlocked, Format, Opened, DEFAULT_DEAD_FOR};
use crate::addr::Addr;
use crate::args::{Opt, Options, Verb};
use crate::da_pool::clock::{self, utc};
use crate::da_pool::cluster::{self, first_sight};
use crate::da_pool::error::PoolError;
use crate::da_pool::metrics::{header, label};
use crate::da_pool::settings::Settings;
use crate::da_pool::store::fence::Fence;
use crate::da_pool::store::{
    listed_by, Allocation, Holder, Owner, PoolAddress, Store, WorkloadHold,
};
use crate::etcd::{EtcdClient, Health};
use crate::netd::ConfigFileError;
use crate::pools::Pool;

/// `check`.
pub(super) const VERB: Verb = Verb {
    name: "check",
    synopsis:
        "--config PATH [--network NAME] [--valid-attachments FILE] [--dead-for DURATION] [--json | --format prometheus]",
    options: &[
        Opt::value("--config"),
        Opt::value("--network"),
        Opt::value("--valid-attachments"),
        Opt::value("--dead-for"),
        Opt::flag("--json"),
        Opt::value("--format"),
    ],
    operands: false,
    help: "\
Finds what is wrong in the network's records and names each:
an address held outside every range of its pool (a range shrunk
since), an attachment or a workload's hold whose address is not
recorded as its own, an address record nothing can free (torn,
or its attachment or hold gone), an address listed twice, on
etcd what nodes hold whose keeper's registration has been gone
for DURATION (15m by default; counted as reclaim counts it) and
the nodes reclaim fenced (recording, as reclaim does, when it
first sees a node gone; if it cannot, it says so, as
\"unrecorded\" with --json, and reports the rest), etcd's alarms
and a database at 80%
of its quota (the database's size and quota are printed too),
and, with
FILE (a JSON array of {\"containerID\", \"ifname\"}, as the
runtime lists them for GC), attachments not in it. --json prints
one JSON object; --format prometheus prints the count of findings
and the time of the check (ipam_da_pool_check_findings,
_check_timestamp_seconds) for node_exporter's textfile collector,
where the alert rules read them. Exit status 1 when it finds
anything. It takes no lock.
",
    run: |given| Ok(finish(run(&options(given)?))),
};

/// `check`'s options.
#[derive(Debug, PartialEq)]
struct Check {
    config: PathBuf,
    network: Option<String>,
    valid: Option<PathBuf>,
    dead_for: u64,
    format: Format,
}

fn options(given: &Options) -> Result<Check, String> {
    Ok(Check {
        config: given.path("--config").ok_or("check needs --config")?,
        network: given.value("--network").map(String::from),
        valid: given.path("--valid-attachments"),
        dead_for: match given.value("--dead-for") {
            Some(text) => dead_for(text)?,
            None => DEFAULT_DEAD_FOR,
        },
        format: Format::given(given, "check")?,
    })
}

/// Checks the network's records, printing each finding: whether there
/// were none.
fn run(options: &Check) -> Result<bool, PoolError> {
    // A report waits; allocations on this node should not.
    crate::sys::give_way();
    // Read before anything else: a bad list changes nothing and reads nothing.
    let valid = match &options.valid {
        Some(file) => Some(read_valid_attachments(file)?),
        None => None,
    };
    let Opened {
        name,
        settings,
        stores,
        store,
    } = open_unlocked(&options.config, options.network.as_deref())?;
    let records = match &store {
        Some(store) => Records {
            allocations: store.allocations()?,
            holds: store.workload_holds()?,
            addresses: store.address_records()?,
        },
        None => Records {
            allocations: Vec::new(),
            holds: Vec::new(),
            addresses: Vec::new(),
        },
    };
    let cluster = match stores.cluster()? {
        Some(client) => Some(Cluster::read(&client, options.dead_for)?),
        None => None,
    };
    let dead = cluster.as_ref().map_or(&[][..], |c| &c.dead);
    let mut findings = findings(
        store.as_deref(),
        &settings,
        &records,
        valid.as_deref(),
        dead,
    )?;
    if let Some(cluster) = &cluster {
        findings.extend(cluster.findings());
    }
    if let Some(unrecorded) = cluster.as_ref().and_then(|c| c.unrecorded.as_deref()) {
        let _ = writeln!(std::io::stderr(), "ipam-da-pool: {unrecorded}");
    }
    let mut out = std::io::stdout().lock();
    match options.format {
        Format::Json => {
            let _ = writeln!(
                out,
                "{}",
                serde_json::json!({
                    "network": name,
                    "node": settings.node,
                    "findings": findings,
                    "etcd": cluster.as_ref().map(|c| c.health_json()),
                    "unrecorded": cluster.as_ref().and_then(|c| c.unrecorded.as_deref()),
                })
            );
        }
        Format::Prometheus => {
            let network = label(&name);
            let mut text = String::new();
            header(
                &mut text,
                "check_findings",
                "gauge",
                "What the last `ipam-da-pool check` found wrong in the network's records.",
            );
            let _ = writeln!(
                text,
                "ipam_da_pool_check_findings{{network=\"{network}\"}} {}",
                findings.len()
            );
            header(
                &mut text,
                "check_timestamp_seconds",
                "gauge",
                "When `ipam-da-pool check` last read the network's records to its end.",
            );
            let _ = writeln!(
                text,
                "ipam_da_pool_check_timestamp_seconds{{network=\"{network}\"}} {}",
                clock::now()
            );
            let _ = out.write_all(text.as_bytes());
        }
        Format::Text => {
            for finding in &findings {
                let _ = writeln!(out, "{finding}");
            }
            if let Some(cluster) = &cluster {
                let _ = writeln!(out, "{}", cluster.health_line());
            }
            let _ = writeln!(
            out,
            "network {name} (this node: {}): {} attachment(s), {} hold(s), {} address record(s), {} finding(s)",
            settings.node,
            records.allocations.len(),
            records.holds.len(),
            records.addresses.len(),
            findings.len()
        );
        }
    }
    Ok(findings.is_empty())
}

/// The runtime's list of valid attachments, as GC takes it.
fn read_valid_attachments(file: &Path) -> Result<Vec<Attachment>, PoolError> {
    let fail = |reason: String| PoolError::from(ConfigFileError::new(file, reason));
    let text = std::fs::read(file).map_err(|e| fail(format!("cannot be read: {e}")))?;
    let list: Value =
        serde_json::from_slice(&text).map_err(|e| fail(format!("is not JSON: {e}")))?;
    list.as_array()
        .ok_or_else(|| fail("is not an array of {\"containerID\", \"ifname\"}".into()))?
        .iter()
        .map(|entry| {
            let field = |key: &str| entry.get(key)?.as_str().map(String::from);
            match (field("containerID"), field("ifname")) {
                (Some(id), Some(ifname)) => Ok((id, ifname)),
                _ => Err(fail(format!(
                    "has an entry that is not {{\"containerID\", \"ifname\"}}: {entry}"
                ))),
            }
        })
        .collect()
}

/// How long ago `seconds` was, roughly, as an operator reads it.
fn ago(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3_600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3_600),
        s => format!("{}d", s / 86_400),
    }
}

/// What `check` reads of an etcd cluster beside the network's records:
/// the nodes gone long enough, the fenced ones, and how full its
/// database is.
struct Cluster {
    dead: Vec<DeadNode>,
    fences: Vec<Fence>,
    health: Health,
    /// What could not be recorded of the nodes first seen gone, and why.
    unrecorded: Option<String>,
}

/// How full a database may be, in percent of its quota, before `check`
/// says so: time to compact and defragment, before etcd refuses puts.
const FULL_ENOUGH: u64 = 80;

impl Cluster {
    /// The cluster's nodes and health, as `client` reads them; a node
    /// seen gone for the first time is recorded so, as `reclaim` records
    /// it (`check` writes nothing else). One that cannot be (a monitoring
    /// user who may only read, a full database) is said, and the rest of
    /// the check goes on.
    fn read(client: &EtcdClient, dead_for: u64) -> Result<Cluster, PoolError> {
        let now = clock::now();
        let mut states = cluster::states(client)?;
        let unrecorded = match first_sight::record_first_sights(client, &mut states, now) {
            Ok(()) => None,
            Err(e) => {
                let nodes: Vec<&str> = states
                    .iter()
                    .filter(|(_, state)| !state.alive && state.gone.is_none())
                    .map(|(node, _)| node.as_str())
                    .collect();
                Some(format!(
                    "could not record that node(s) {} were seen gone ({e}): reclaim counts their absence from when it first records it",
                    nodes.join(", ")
                ))
            }
        };
        let dead = first_sight::gone_for(&states, dead_for, now)
            .into_iter()
            .map(|(node, since)| DeadNode {
                node,
                gone: format!(
                    "since {}, {} ago",
                    utc(since),
                    ago(now.saturating_sub(since))
                ),
            })
            .collect();
        let fences = states
            .into_values()
            .filter_map(|state| state.fence)
            .collect();
        Ok(Cluster {
            dead,
            fences,
            health: client.health()?,
            unrecorded,
        })
    }

    /// The fenced nodes, the alarms, and a database near its quota.
    fn findings(&self) -> Vec<String> {
        let mut found: Vec<String> = self
            .fences
            .iter()
            .map(|fence| fence.refusal().to_string())
            .collect();
        for alarm in &self.health.alarms {
            found.push(format!(
                "etcd raises alarm {alarm}: a NOSPACE alarm refuses every ADD until the database is compacted, defragmented and the alarm disarmed"
            ));
        }
        if let Some(quota) = self.health.quota.filter(|q| *q > 0) {
            let percent = self.health.db_size.saturating_mul(100) / quota;
            if percent >= FULL_ENOUGH {
                found.push(format!(
                    "etcd's database ({}) is at {percent}% of its quota: compact and defragment it before it refuses puts",
                    self.health.endpoint
                ));
            }
        }
        found
    }

    fn health_line(&self) -> String {
        let Health {
            endpoint,
            db_size,
            quota,
            alarms,
        } = &self.health;
        let quota = quota.map_or_else(
            || "of an unknown quota".to_owned(),
            |q| format!("of its {} quota", mib(q)),
        );
        let alarms = if alarms.is_empty() {
            "no alarm".to_owned()
        } else {
            format!("alarms: {}", alarms.join(", "))
        };
        format!(
            "etcd ({endpoint}): database {} {quota}, {alarms}",
            mib(*db_size)
        )
    }

    fn health_json(&self) -> Value {
        serde_json::json!({
            "endpoint": self.health.endpoint,
            "dbSize": self.health.db_size,
            "quota": self.health.quota,
            "alarms": self.health.alarms,
        })
    }
}

/// Bytes in MiB, for a person.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// An attachment, as the runtime names it.
pub type Attachment = (String, String);

/// A network's records, as read.
pub struct Records {
    pub allocations: Vec<Allocation>,
    pub holds: Vec<WorkloadHold>,
    pub addresses: Vec<(Addr, Option<Owner>)>,
}

/// A node whose keeper's registration is gone: its name, and since when
/// and how long ago, as text.
pub struct DeadNode {
    pub node: String,
    pub gone: String,
}

/// Everything wrong with the records, in the order found.
pub fn findings(
    store: Option<&dyn Store>,
    settings: &Settings,
    records: &Records,
    valid: Option<&[Attachment]>,
    dead: &[DeadNode],
) -> Result<Vec<String>, PoolError> {
    let Records {
        allocations,
        holds,
        addresses,
    } = records;
    let mut findings = Vec::new();
    let who = |o: &Owner| match &o.workload {
        Some(workload) if o.id.is_empty() => {
            format!("workload {workload} ({}, node {})", o.ifname, o.node)
        }
        _ => format!("{}/{} (node {})", o.id, o.ifname, o.node),
    };
    let recorded: BTreeMap<Addr, &Option<Owner>> = addresses.iter().map(|(a, o)| (*a, o)).collect();
    // Looked up by name, not searched: a /16 holds 65,000 of them.
    let by_attachment: HashMap<(&str, &str), &Allocation> = allocations
        .iter()
        .map(|h| ((h.owner.id.as_str(), h.owner.ifname.as_str()), h))
        .collect();
    let by_workload: HashMap<(&str, &str), &WorkloadHold> = holds
        .iter()
        .map(|h| ((h.workload.as_str(), h.ifname.as_str()), h))
        .collect();
    // A hold a live attachment has bound lists what the attachment does:
    // looked at through the attachment.
    let unbound: Vec<&WorkloadHold> = holds
        .iter()
        .filter(|h| {
            !h.container
                .as_ref()
                .is_some_and(|id| by_attachment.contains_key(&(id.as_str(), h.ifname.as_str())))
        })
        .collect();
    let listers = allocations
        .iter()
        .map(|h| (h.owner.clone(), &h.held))
        .chain(unbound.iter().map(|h| (h.owner(), &h.held)));
    let mut listed: BTreeMap<Addr, Owner> = BTreeMap::new();
    let mut pools: BTreeMap<String, Option<Pool>> = BTreeMap::new();
    for (owner, held) in listers {
        for held in held.iter() {
            if !pools.contains_key(&held.pool) {
                let pool = known_pool(store, settings, &held.pool)?;
                pools.insert(held.pool.clone(), pool);
            }
            if let Some(Some(pool)) = pools.get(&held.pool) {
                if pool.range_of(held.address).is_none() {
                    findings.push(format!(
                        "{} held by {} is outside every range of pool {:?}",
                        held.address,
                        who(&owner),
                        held.pool
                    ));
                }
            }
            let mismatch = match recorded.get(&held.address) {
                None => true,
                Some(Some(holder)) => !owner.owns(holder),
                Some(None) => false,
            };
            if mismatch && lists_now(store, &owner)?.contains(&held.address) {
                match now_held_by(store, held.address)? {
                    None => findings.push(format!(
                        "{} lists {}, which has no record: it could be given to another",
                        who(&owner),
                        held.address
                    )),
                    Some(holder) if !owner.owns(&holder) => findings.push(format!(
                        "{} lists {}, whose record says {} holds it",
                        who(&owner),
                        held.address,
                        who(&holder)
                    )),
                    Some(_) => {}
                }
            }
            if let Some(first) = listed.insert(held.address, owner.clone()) {
                if lists_now(store, &first)?.contains(&held.address)
                    && lists_now(store, &owner)?.contains(&held.address)
                {
                    findings.push(format!(
                        "{} is listed by both {} and {}",
                        held.address,
                        who(&first),
                        who(&owner)
                    ));
                }
            }
        }
    }
    for (address, owner) in addresses {
        let Some(owner) = owner else {
            findings.push(format!(
                "the record of {address} is torn or not ipam-da-pool's: no DEL or GC can free it"
            ));
            continue;
        };
        let lists = |held: &[PoolAddress]| held.iter().any(|h| h.address == *address);
        let listed = match &owner.workload {
            None => by_attachment
                .get(&(owner.id.as_str(), owner.ifname.as_str()))
                .is_some_and(|h| h.owner.owns(owner) && lists(&h.held)),
            Some(workload) => by_workload
                .get(&(workload.as_str(), owner.ifname.as_str()))
                .is_some_and(|h| lists(&h.held)),
        };
        if listed {
            continue;
        }
        // Read again: the record and what lists it may be newer than the
        // lists read first.
        let Some(owner) = now_held_by(store, *address)? else {
            continue;
        };
        if lists_now(store, &owner)?.contains(address) {
            continue;
        }
        findings.push(match owner.workload {
            None => format!(
                "{address} is held by {}, whose attachment record does not list it: no DEL will free it",
                who(&owner)
            ),
            Some(_) => format!(
                "{address} is held for {}, whose hold does not list it: nothing will free it",
                who(&owner)
            ),
        });
    }
    if let Some(valid) = valid {
        let valid: HashSet<(&str, &str)> = valid
            .iter()
            .map(|(id, ifname)| (id.as_str(), ifname.as_str()))
            .collect();
        for allocation in allocations {
            let owner = &allocation.owner;
            if !valid.contains(&(owner.id.as_str(), owner.ifname.as_str())) {
                findings.push(format!("{} is not among the valid attachments", who(owner)));
            }
        }
    }
    for node in dead {
        let attachments = allocations
            .iter()
            .filter(|h| h.owner.node == node.node)
            .count();
        let kept = unbound.iter().filter(|h| h.node == node.node).count();
        if attachments + kept > 0 {
            findings.push(format!(
                "node {} holds {attachments} attachment(s) and {kept} sticky hold(s), but its keeper's registration is gone {}: `ipam-da-pool reclaim` frees them",
                node.node, node.gone
            ));
        }
    }
    Ok(findings)
}

/// The addresses `owner` (an attachment, or, named without a container, a
/// workload's hold) lists now, read again from the store.
fn lists_now(store: Option<&dyn Store>, owner: &Owner) -> Result<Vec<Addr>, PoolError> {
    match store {
        Some(store) => listed_by(store, owner),
        None => Ok(Vec::new()),
    }
}

/// Who the record of `address` names now, read again; `None` if it is gone.
fn now_held_by(store: Option<&dyn Store>, address: Addr) -> Result<Option<Owner>, PoolError> {
    match store {
        Some(store) => Ok(store.holder(address)?.and_then(Holder::into_owner)),
        None => Ok(None),
    }
}

/// Pool `name` as the configuration or the store defines it, if either does.
fn known_pool(
    store: Option<&dyn Store>,
    settings: &Settings,
    name: &str,
) -> Result<Option<Pool>, PoolError> {
    if let Some(pool) = settings.pool(name) {
        return Ok(Some(pool.clone()));
    }
    let definition = match store {
        Some(store) => store.pool_definition(name)?,
        None => None,
    };
    Ok(definition.and_then(|d| Pool::parse(name, &d).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::NetConf;
    use crate::da_pool::store::fake_store::FakeStore;

    use serde_json::json;

    fn owner(id: &str) -> Owner {
        Owner {
            id: id.into(),
            ifname: "eth0".into(),
            node: "a".into(),
            workload: None,
        }
    }

    fn addr(text: &str) -> Addr {
        Addr::new(text.parse().unwrap())
    }

    /// Node a's settings, pool blue 10.4.0.0/28.
    fn settings() -> Settings {
        let raw =
            json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "ipam-da-pool", "pool": {
                "node": "a", "pools": {"blue": [{"subnet": "10.4.0.0/28"}]},
            }}})
            .to_string();
        Settings::from_net(&NetConf::parse(raw.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn every_inconsistency_is_named() {
        let settings = settings();
        let store = FakeStore::default();
        let claim = |id: &str, address: &str| {
            let held = [PoolAddress {
                pool: "blue".into(),
                address: addr(address),
            }];
            assert!(store.claim(&owner(id), &held, None).unwrap());
        };
        claim("ok", "10.4.0.2");
        claim("outside", "10.4.0.3");
        claim("unrecorded", "10.4.0.4");
        claim("other", "10.4.0.5");
        claim("torn", "10.4.0.6");
        // The records made inconsistent in the store itself: an address
        // without its record, one recorded as another's, one torn, one
        // whose attachment is gone, one outside the pool's ranges, one
        // listed twice.
        {
            let mut addresses = store.addresses.borrow_mut();
            addresses.remove(&addr("10.4.0.4"));
            addresses.insert(addr("10.4.0.5"), owner("thief"));
            addresses.insert(addr("10.4.0.9"), owner("gone"));
            addresses.insert(addr("10.4.1.3"), owner("outside"));
            addresses.insert(addr("10.4.0.10"), owner("thief"));
        }
        let mut attachments = store.attachments.borrow_mut();
        let outside = attachments
            .get_mut(&("outside".to_owned(), "eth0".to_owned()))
            .unwrap();
        outside.held[0].address = addr("10.4.1.3");
        attachments.insert(
            ("twin".into(), "eth0".into()),
            Allocation {
                owner: owner("twin"),
                held: vec![PoolAddress {
                    pool: "blue".into(),
                    address: addr("10.4.0.2"),
                }],
                revision: 0,
                since: 0,
                legacy: false,
                record: None,
            },
        );
        drop(attachments);
        // A workload's hold: one of its addresses recorded as another's,
        // one not recorded at all, one of its records that it no longer
        // lists; a node gone since long.
        let hold = WorkloadHold {
            workload: "ns/web-0".into(),
            ifname: "eth0".into(),
            node: "b".into(),
            held: vec![
                PoolAddress {
                    pool: "blue".into(),
                    address: addr("10.4.0.10"),
                },
                PoolAddress {
                    pool: "blue".into(),
                    address: addr("10.4.0.11"),
                },
            ],
            container: None,
            until: Some(0),
            sticky_for: 60,
            since: 0,
            revision: 0,
        };
        store
            .addresses
            .borrow_mut()
            .insert(addr("10.4.0.12"), hold.owner());
        store
            .holds
            .borrow_mut()
            .insert(("ns/web-0".into(), "eth0".into()), hold);
        let mut addresses = store.address_records().unwrap();
        for (address, holder) in &mut addresses {
            if *address == addr("10.4.0.6") {
                *holder = None;
            }
        }
        let records = Records {
            allocations: store.allocations().unwrap(),
            holds: store.workload_holds().unwrap(),
            addresses,
        };
        let valid: Vec<Attachment> = vec![("ok".into(), "eth0".into())];
        let dead = [DeadNode {
            node: "b".into(),
            gone: "since 2026-11-24T10:00:00Z, 2h ago".into(),
        }];
        let found = findings(Some(&store), &settings, &records, Some(&valid), &dead).unwrap();
        let expected = [
            "10.4.1.3 held by outside/eth0 (node a) is outside every range of pool \"blue\"",
            "unrecorded/eth0 (node a) lists 10.4.0.4, which has no record: it could be given to another",
            "other/eth0 (node a) lists 10.4.0.5, whose record says thief/eth0 (node a) holds it",
            "the record of 10.4.0.6 is torn or not ipam-da-pool's: no DEL or GC can free it",
            "10.4.0.3 is held by outside/eth0 (node a), whose attachment record does not list it: no DEL will free it",
            "10.4.0.5 is held by thief/eth0 (node a), whose attachment record does not list it: no DEL will free it",
            "10.4.0.9 is held by gone/eth0 (node a), whose attachment record does not list it: no DEL will free it",
            "outside/eth0 (node a) is not among the valid attachments",
            "10.4.0.2 is listed by both ok/eth0 (node a) and twin/eth0 (node a)",
            "twin/eth0 (node a) lists 10.4.0.2, whose record says ok/eth0 (node a) holds it",
            "workload ns/web-0 (eth0, node b) lists 10.4.0.10, whose record says thief/eth0 (node a) holds it",
            "workload ns/web-0 (eth0, node b) lists 10.4.0.11, which has no record: it could be given to another",
            "10.4.0.12 is held for workload ns/web-0 (eth0, node b), whose hold does not list it: nothing will free it",
            "node b holds 0 attachment(s) and 1 sticky hold(s), but its keeper's registration is gone since 2026-11-24T10:00:00Z, 2h ago: `ipam-da-pool reclaim` frees them",
        ];
        for sentence in expected {
            assert!(
                found.iter().any(|f| f == sentence),
                "missing {sentence:?} in {found:#?}"
            );
        }
        // A workload's container and its hold, as the stores keep them:
        // nothing wrong.
        let clean = FakeStore::default();
        let web = Owner {
            workload: Some("ns/web-0".into()),
            ..owner("c9")
        };
        let held = [PoolAddress {
            pool: "blue".into(),
            address: addr("10.4.0.2"),
        }];
        let sticky = crate::da_pool::store::StickyClaim {
            workload: "ns/web-0",
            sticky_for: 60,
            prior: None,
        };
        assert!(clean.claim(&web, &held, Some(&sticky)).unwrap());
        let records = Records {
            allocations: clean.allocations().unwrap(),
            holds: clean.workload_holds().unwrap(),
            addresses: clean.address_records().unwrap(),
        };
        let found = findings(Some(&clean), &settings, &records, None, &dead).unwrap();
        assert!(found.is_empty(), "{found:#?}");
        // Released, the hold alone keeps it: still nothing wrong.
        clean.release(&records.allocations[0]).unwrap();
        let records = Records {
            allocations: clean.allocations().unwrap(),
            holds: clean.workload_holds().unwrap(),
            addresses: clean.address_records().unwrap(),
        };
        assert_eq!(records.holds.len(), 1);
        let found = findings(Some(&clean), &settings, &records, None, &[]).unwrap();
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn records_made_or_removed_between_the_reads_are_no_finding() {
        let settings = settings();
        let store = FakeStore::default();
        let held = |address: &str| {
            [PoolAddress {
                pool: "blue".into(),
                address: addr(address),
            }]
        };
        assert!(store
            .claim(&owner("gone"), &held("10.4.0.2"), None)
            .unwrap());
        // The attachments read; then an ADD and a DEL; then the addresses.
        let allocations = store.allocations().unwrap();
        assert!(store.claim(&owner("new"), &held("10.4.0.3"), None).unwrap());
        store.release(&allocations[0]).unwrap();
        let records = Records {
            allocations,
            holds: Vec::new(),
            addresses: store.address_records().unwrap(),
        };
        let found = findings(Some(&store), &settings, &records, None, &[]).unwrap();
        assert!(found.is_empty(), "{found:#?}");
    }
}
