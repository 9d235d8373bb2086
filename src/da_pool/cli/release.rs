//! `ipam-da-pool release`: gives back what the attachments and holds an
//! operator names keep (those holding an address, a container's, a
//! node's, a workload's), and an address's record that nothing lists,
//! each in one short step as it was read: on the local store under the
//! network's lock, taken for one attachment at a time; on etcd in a
//! transaction that fails if the record changed. With `--now`, what it
//! gives back is free at once, and an address's cooldown ends.

use std::io::Write;
use std::path::PathBuf;

use super::{finish, open_unlocked, print_released, Opened, Released};
use crate::addr::Addr;
use crate::args::{Opt, Options, Verb};
use crate::da_pool::error::PoolError;
use crate::da_pool::store::{
    listed_by, Access, Allocation, Holder, Owner, Store, Stores, WorkloadHold,
};

/// `release`.
pub(super) const VERB: Verb = Verb {
    name: "release",
    synopsis: "--config PATH [--network NAME] (ADDRESS | --container ID [--ifname IF] | --node NAME | --workload NAME) [--now] [--dry-run] [--json]",
    options: &[
        Opt::value("--config"),
        Opt::value("--network"),
        Opt::value("--container"),
        Opt::value("--ifname"),
        Opt::value("--node"),
        Opt::value("--workload"),
        Opt::flag("--now"),
        Opt::flag("--dry-run"),
        Opt::flag("--json"),
    ],
    operands: true,
    help: "\
Gives back what the attachments holding ADDRESS, of container
ID (on interface IF), of node NAME (one decommissioned) or of
workload NAME (as sticky names it: NAMESPACE/NAME) hold, with
the holds of their workloads, and the holds that keep ADDRESS,
or were released on node NAME, or are workload NAME's; then
the record of ADDRESS if neither its attachment nor its
workload's hold lists it (or it names no one), which no DEL
will free, as check says; prints what it released (with
--dry-run, what it would release). What it gives back cools
down for ipam.pool.reuseAfter, if set, before it is given
again; with --now it is free at once, and the cooldown of
ADDRESS, if it cools down, ends. Nothing that matches is
exit status 1, and nothing is changed. Each release is one
short step: on the local store the network's lock is taken
for one attachment at a time.
",
    run: |given| Ok(finish(run(&options(given)?))),
};

/// Which attachments and holds `release` gives back.
#[derive(Debug, PartialEq)]
enum Chosen {
    Address(Addr),
    Container { id: String, ifname: Option<String> },
    Node(String),
    Workload(String),
}

impl std::fmt::Display for Chosen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Chosen::Address(address) => write!(f, "address {address}"),
            Chosen::Container { id, ifname: None } => write!(f, "container {id}"),
            Chosen::Container {
                id,
                ifname: Some(ifname),
            } => write!(f, "container {id} interface {ifname}"),
            Chosen::Node(node) => write!(f, "node {node}"),
            Chosen::Workload(workload) => write!(f, "workload {workload}"),
        }
    }
}

impl Chosen {
    fn matches(&self, allocation: &Allocation) -> bool {
        match self {
            Chosen::Address(address) => allocation.held.iter().any(|h| h.address == *address),
            Chosen::Container { id, ifname } => {
                allocation.owner.id == *id
                    && ifname
                        .as_ref()
                        .is_none_or(|i| allocation.owner.ifname == *i)
            }
            Chosen::Node(node) => allocation.owner.node == *node,
            Chosen::Workload(workload) => allocation.owner.workload.as_ref() == Some(workload),
        }
    }

    /// Whether it chooses `hold` itself (a hold bound to a chosen
    /// attachment is ended with it).
    fn matches_hold(&self, hold: &WorkloadHold) -> bool {
        match self {
            Chosen::Address(address) => hold.held.iter().any(|h| h.address == *address),
            Chosen::Container { .. } => false,
            Chosen::Node(node) => hold.node == *node,
            Chosen::Workload(workload) => hold.workload == *workload,
        }
    }
}

/// `release`'s options.
#[derive(Debug, PartialEq)]
struct Release {
    config: PathBuf,
    network: Option<String>,
    chosen: Chosen,
    now: bool,
    dry_run: bool,
    json: bool,
}

fn options(given: &Options) -> Result<Release, String> {
    let address = match given.operands() {
        [text] => Some(Addr::new(
            text.parse()
                .map_err(|_| format!("{text:?} is not an address"))?,
        )),
        _ => None,
    };
    let config = given.path("--config").ok_or("release needs --config")?;
    let value = |name: &str| given.value(name).map(String::from);
    let ifname = value("--ifname");
    let one_of = (given.operands().len(), address, value("--container"));
    let chosen = match (one_of, value("--node"), value("--workload")) {
        ((1, Some(address), None), None, None) if ifname.is_none() => Chosen::Address(address),
        ((0, None, Some(id)), None, None) => Chosen::Container { id, ifname },
        ((0, None, None), Some(node), None) if ifname.is_none() => Chosen::Node(node),
        ((0, None, None), None, Some(workload)) if ifname.is_none() => Chosen::Workload(workload),
        _ => {
            return Err(
                "release needs one of ADDRESS, --container ID [--ifname IF], --node NAME or --workload NAME".into(),
            )
        }
    };
    Ok(Release {
        config,
        network: value("--network"),
        chosen,
        now: given.flag("--now"),
        dry_run: given.flag("--dry-run"),
        json: given.flag("--json"),
    })
}

/// Releases what the chosen attachments and holds keep, one at a time,
/// printing each: whether anything matched.
fn run(options: &Release) -> Result<bool, PoolError> {
    // Chosen from a read without the lock; each one then released as read
    // again under it (local) or in a transaction that fails if it changed
    // meanwhile (etcd).
    let Opened {
        name,
        stores,
        store: unlocked,
        ..
    } = open_unlocked(&options.config, options.network.as_deref())?;
    let stores = match options.now {
        true => stores.at_once(),
        false => stores,
    };
    let (allocations, holds) = match &unlocked {
        Some(store) => (store.allocations()?, store.workload_holds()?),
        None => (Vec::new(), Vec::new()),
    };
    let chosen: Vec<&Allocation> = allocations
        .iter()
        .filter(|allocation| options.chosen.matches(allocation))
        .collect();
    // Holds chosen themselves, or whose container's attachment is chosen.
    let released_with = |hold: &WorkloadHold| {
        chosen.iter().any(|h| {
            h.owner.workload.as_ref() == Some(&hold.workload)
                && h.owner.ifname == hold.ifname
                && hold.container.as_ref() == Some(&h.owner.id)
        })
    };
    let bound_alive = |hold: &WorkloadHold| {
        hold.container.as_ref().is_some_and(|id| {
            allocations
                .iter()
                .any(|h| h.owner.id == *id && h.owner.ifname == hold.ifname)
        })
    };
    let chosen_holds: Vec<&WorkloadHold> = holds
        .iter()
        .filter(|hold| {
            released_with(hold) || (options.chosen.matches_hold(hold) && !bound_alive(hold))
        })
        .collect();
    let mut released = Vec::new();
    for allocation in &chosen {
        if options.dry_run || in_one_step(&stores, &name, |s| release_as_read(s, allocation))? {
            released.push(Released::Attachment(allocation));
        }
    }
    for hold in &chosen_holds {
        let ended = options.dry_run
            || in_one_step(&stores, &name, |store| {
                // As it is now: releasing its container's attachment
                // released it too.
                match store.workload_hold(&hold.workload, &hold.ifname)? {
                    Some(now)
                        if now.held == hold.held
                            && (now.container.is_none() || now.container == hold.container) =>
                    {
                        store.end_hold(&now)
                    }
                    _ => Ok(false),
                }
            })?;
        if ended {
            released.push(Released::WorkloadHold(hold));
        }
    }
    // Read after the rest: the record may have gone with what it listed.
    if let (Chosen::Address(address), Some(store)) = (&options.chosen, &unlocked) {
        if let Some(holder) = unlisted(store.as_ref(), *address)? {
            let freed = options.dry_run
                || in_one_step(&stores, &name, |store| store.free_record(*address, &holder))?;
            if freed {
                released.push(Released::Unlisted {
                    address: *address,
                    holder,
                });
            }
        }
    }
    let mut cooling = None;
    if let (Chosen::Address(address), Some(store)) = (&options.chosen, &unlocked) {
        if let Some(Holder::Cooling(c)) = store.holder(*address)? {
            let ended = options.now
                && (options.dry_run
                    || in_one_step(&stores, &name, |store| store.end_cooling(*address))?);
            match ended {
                true => released.push(Released::Cooldown {
                    address: *address,
                    until: c.until,
                }),
                false => cooling = Some(c),
            }
        }
    }
    print_released(
        &released,
        options.dry_run,
        options.json,
        serde_json::Value::Null,
    );
    let matched = !chosen.is_empty() || !chosen_holds.is_empty() || !released.is_empty();
    if let (false, Some(cooling), Chosen::Address(address)) = (matched, cooling, &options.chosen) {
        let _ = writeln!(
            std::io::stderr(),
            "ipam-da-pool: nothing in network {name} holds {address}, but {cooling}: `--now` not given, nothing released"
        );
    } else if !matched {
        let _ = writeln!(
            std::io::stderr(),
            "ipam-da-pool: no attachment, hold or address record of network {} matches {}; nothing released",
            name,
            options.chosen
        );
    }
    Ok(matched)
}

/// Who the record of `address` names, if nothing lists it there: neither
/// that attachment nor that workload's hold (or it names no one, torn or
/// not ipam-da-pool's), so that no DEL or GC will ever free it.
fn unlisted(store: &dyn Store, address: Addr) -> Result<Option<Owner>, PoolError> {
    let Some(Holder::Owner(holder)) = store.holder(address)? else {
        return Ok(None);
    };
    let listed = listed_by(store, &holder)?.contains(&address);
    Ok((!listed).then_some(holder))
}

/// Runs `step` on network `name`'s store for one short step: on the
/// local store under the network's lock, taken for it alone; on etcd,
/// through the client the read used. `false` for a local store that has
/// no records any more.
fn in_one_step(
    stores: &Stores,
    name: &str,
    step: impl FnOnce(&dyn Store) -> Result<bool, PoolError>,
) -> Result<bool, PoolError> {
    match stores.existing(name, Access::Locked)? {
        Some(store) => step(store.as_ref()),
        None => Ok(false),
    }
}

/// Releases `allocation` if the store still has it as it was read: whether
/// it did (an allocation that changed meanwhile is someone else's business).
fn release_as_read(store: &dyn Store, allocation: &Allocation) -> Result<bool, PoolError> {
    match store.allocation(
        &allocation.owner.node,
        &allocation.owner.id,
        &allocation.owner.ifname,
    )? {
        Some(now) if now.held == allocation.held && now.owner == allocation.owner => {
            store.release(&now)
        }
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::da_pool::store::fake_store::FakeStore;
    use crate::da_pool::store::PoolAddress;
    use crate::da_pool::testing::owner;

    #[test]
    fn a_record_is_freed_only_while_nothing_lists_it_as_read() {
        let store = FakeStore::default();
        let address = Addr::new("10.4.0.2".parse().unwrap());
        let held = [PoolAddress {
            pool: "blue".into(),
            address,
        }];
        assert!(store.claim(&owner("c1"), &held, None).unwrap());
        // Listed by its attachment: a DEL frees it, not this.
        assert_eq!(unlisted(&store, address).unwrap(), None);
        assert!(!store.free_record(address, &owner("c1")).unwrap());
        let listing = store.attachments.borrow_mut().pop_first().unwrap();
        assert_eq!(unlisted(&store, address).unwrap(), Some(owner("c1")));
        // Listed again since it was read (the same container claimed it
        // anew): left alone.
        store
            .attachments
            .borrow_mut()
            .insert(listing.0.clone(), listing.1.clone());
        assert!(!store.free_record(address, &owner("c1")).unwrap());
        store.attachments.borrow_mut().clear();
        // Changed since it was read: left alone.
        assert!(!store.free_record(address, &owner("c2")).unwrap());
        assert!(store.free_record(address, &owner("c1")).unwrap());
        assert_eq!(unlisted(&store, address).unwrap(), None);
        assert!(store.held().is_empty());
    }

    /// `VERB`'s options, as the command line `list` gives them.
    fn parse(list: &[&str]) -> Result<Release, String> {
        VERB.parse_words(list).and_then(|given| options(&given))
    }

    #[test]
    fn release_takes_exactly_one_choice() {
        let chosen = |list: &[&str]| parse(list).map(|r| r.chosen);
        assert_eq!(
            chosen(&["--config", "f", "10.1.0.5"]),
            Ok(Chosen::Address(Addr::new("10.1.0.5".parse().unwrap())))
        );
        assert_eq!(
            chosen(&["--container=c1", "--config", "f", "--ifname", "net1"]),
            Ok(Chosen::Container {
                id: "c1".into(),
                ifname: Some("net1".into())
            })
        );
        assert_eq!(
            chosen(&["--config", "f", "--node", "node-b", "--dry-run"]),
            Ok(Chosen::Node("node-b".into()))
        );
        for (bad, said) in [
            (&["10.1.0.5"][..], "release needs --config"),
            (&["--config", "f"][..], "release needs one of"),
            (
                &["--config", "f", "10.1.0.5", "--node", "b"][..],
                "release needs one of",
            ),
            (
                &["--config", "f", "--node", "b", "--ifname", "eth0"][..],
                "release needs one of",
            ),
            (
                &["--config", "f", "10.1.0.5", "10.1.0.6"][..],
                "release needs one of",
            ),
            (&["--config", "f", "ten"][..], "\"ten\" is not an address"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(said), "{bad:?}: {e}");
        }
    }
}
