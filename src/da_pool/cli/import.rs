//! `ipam-da-pool import`: moving reservations from one store to another,
//! the upgrade of a node from the local store (one node) to etcd (a
//! cluster). Each attachment is claimed in the target as it was held in
//! the source, by the same owner, all its addresses at once; one the
//! target already has is left alone, and one whose addresses someone else
//! holds there is a conflict, named, for the operator to settle. An
//! attachment whose addresses follow a workload takes its hold along; a
//! hold no container uses now is left behind (its workload's next
//! container gets new addresses). An address given back that cools
//! down still (`reuseAfter`) cools down in the target until the same
//! end. The source is only read, once marked moved.

use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use super::{finish, OURS};
use crate::addr::Addr;
use crate::args::{Opt, Options, Verb};
use crate::cni::NetConf;
use crate::da_pool::add::holds_all;
use crate::da_pool::clock::{self, utc};
use crate::da_pool::error::PoolError;
use crate::da_pool::settings::{invalid, Settings};
use crate::da_pool::store::{
    Allocation, Cooling, Holder, Owner, PoolAddress, StickyClaim, Store, Stores, WorkloadHold,
};
use crate::dir::DirError;
use crate::netd;

/// `import`.
pub(super) const VERB: Verb = Verb {
    name: "import",
    synopsis: "--config FILE --from DATADIR [--dry-run]",
    options: &[
        Opt::value("--config"),
        Opt::value("--from"),
        Opt::flag("--dry-run"),
    ],
    operands: false,
    help: "\
Copy this node's reservations of FILE's network from the local
store under DATADIR into the etcd cluster FILE names, each held
by the same container and interface, under FILE's node name. On a
node reclaim fenced, imports nothing (code 50). One already there is
left alone; one whose address another holds in etcd is named as
a conflict (exit status 1). An address that cools down after its
release cools down in etcd until the same end. From then on the
local store refuses new addresses (code 11, try again later) until
the node runs FILE. With --dry-run, nothing is written.
",
    run: |given| Ok(finish(run(&options(given)?))),
};

/// `import`'s options.
#[derive(Debug, PartialEq)]
struct Import {
    config: PathBuf,
    from: PathBuf,
    dry_run: bool,
}

fn options(given: &Options) -> Result<Import, String> {
    let (Some(config), Some(from)) = (given.path("--config"), given.path("--from")) else {
        return Err("import needs --config and --from".into());
    };
    Ok(Import {
        config,
        from,
        dry_run: given.flag("--dry-run"),
    })
}

/// Imports, printing what it did: whether every attachment is in etcd now.
fn run(options: &Import) -> Result<bool, PoolError> {
    let raw = netd::load(&options.config, &OURS)?;
    let net = NetConf::parse(&raw)?;
    let settings = Settings::from_net(&net)?;
    let stores = Stores::new(&settings);
    let local_only = || {
        invalid(format!(
            "{} keeps pools in local files: import copies into etcd, so its \"ipam.pool\" must name an etcd cluster",
            options.config.display()
        ))
    };
    if !stores.on_etcd() {
        return Err(local_only());
    }
    let network = options.from.join(&net.name);
    if !network.is_dir() {
        let missing = std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no local store of this network here",
        );
        return Err(DirError::io(&network, missing).into());
    }
    let to = stores.etcd(&net.name)?.ok_or_else(local_only)?;
    // The local store's lock is held for one short step: marked moved (it
    // refuses new claims from now on: an ADD made locally after the
    // import would be missing from etcd) and read; the claims in etcd,
    // however many, take none of its time.
    let records = {
        let from = Stores::local_source(&options.from, &net.name)?;
        if !options.dry_run {
            from.mark_moved()?;
        }
        Records::read(&from)?
    };
    let report = import(&records, &to, &settings.node, options.dry_run)?;
    let mut out = std::io::stdout().lock();
    for line in &report.lines {
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(
        out,
        "{} attachment(s) of network {} under {}; {} conflict(s)",
        report.attachments,
        net.name,
        options.from.display(),
        report.conflicts
    );
    Ok(report.conflicts == 0)
}

/// What an import did (or, dry, would do): a line per attachment, per
/// hold left behind and per cooldown.
#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<String>,
    /// How many attachments the source holds.
    pub attachments: usize,
    /// How many attachments could not be imported.
    pub conflicts: usize,
}

/// What the local store holds, read in one step.
pub struct Records {
    holds: Vec<WorkloadHold>,
    /// Each attachment, and whether it holds all its record lists.
    allocations: Vec<(Allocation, bool)>,
    /// The addresses given back that cool down still.
    cooling: Vec<(Addr, Cooling)>,
}

impl Records {
    /// Reads every hold, attachment and cooldown of `from`.
    pub fn read(from: &dyn Store) -> Result<Records, PoolError> {
        let allocations = from
            .allocations()?
            .into_iter()
            .map(|allocation| {
                let whole = holds_all(from, &allocation)?;
                Ok((allocation, whole))
            })
            .collect::<Result<_, PoolError>>()?;
        let mut cooling = from.cooling(
            Addr::new(Ipv4Addr::UNSPECIFIED.into()),
            Addr::new(Ipv4Addr::BROADCAST.into()),
        )?;
        cooling.extend(from.cooling(
            Addr::new(Ipv6Addr::UNSPECIFIED.into()),
            Addr::new(Ipv6Addr::from(u128::MAX).into()),
        )?);
        Ok(Records {
            holds: from.workload_holds()?,
            allocations,
            cooling,
        })
    }
}

/// Claims in `to` every attachment `from` holds, unless `dry_run`, as
/// node `node`'s: the configuration's name for the node, under which its
/// GC and keeper work on etcd, whatever name (an earlier host name) the
/// local records carry. A fenced node imports nothing: its claims would
/// all fail until it is readmitted.
pub fn import(
    from: &Records,
    to: &dyn Store,
    node: &str,
    dry_run: bool,
) -> Result<Report, PoolError> {
    if let Some(fenced) = to.fenced(node)? {
        return Err(fenced);
    }
    let mut report = Report::default();
    for hold in &from.holds {
        if hold.container.is_none() {
            report.lines.push(format!(
                "left behind the hold of workload {} ({}): no container uses it",
                hold.workload, hold.ifname
            ));
        }
    }
    // First: no address is both cooling and held, and from the import on
    // no node gives a cooling one.
    carry_cooldowns(&from.cooling, to, dry_run, &mut report)?;
    report.attachments = from.allocations.len();
    for (allocation, whole) in &from.allocations {
        let owner = &Owner {
            node: node.to_owned(),
            ..allocation.owner.clone()
        };
        let who = match &owner.workload {
            Some(workload) => format!(
                "{}/{} (node {}, workload {workload})",
                owner.id, owner.ifname, owner.node
            ),
            None => format!("{}/{} (node {})", owner.id, owner.ifname, owner.node),
        };
        let addresses = listed(&allocation.held);
        if !whole {
            report.lines.push(format!(
                "skipped {who}: its record lists {addresses}, which it does not all hold (a claim cut short; DEL or GC frees it)"
            ));
            continue;
        }
        let mut conflict = |why: String| {
            report.conflicts += 1;
            report
                .lines
                .push(format!("conflict {who} {addresses}: {why}"));
        };
        if let Some(there) = to.allocation(&owner.node, &owner.id, &owner.ifname)? {
            if same(&there.held, &allocation.held) {
                report
                    .lines
                    .push(format!("already there {who} {addresses}"));
            } else {
                conflict(format!("the target has it holding {}", listed(&there.held)));
            }
            continue;
        }
        let mut taken = Vec::new();
        for h in &allocation.held {
            let there = to.holder(h.address)?;
            if let Some(other) = there.filter(|o| !o.owner().is_some_and(|o| owner.owns(o))) {
                taken.push(format!("{} is held there by {other}", h.address));
            }
        }
        // A workload's hold comes along, as the source has it.
        let (hold, there) = match &owner.workload {
            Some(workload) => (
                from.holds
                    .iter()
                    .find(|h| h.workload == *workload && h.ifname == owner.ifname),
                to.workload_hold(workload, &owner.ifname)?,
            ),
            None => (None, None),
        };
        // The workload's hold there, bound to another of its containers
        // (one that runs on a node moved already): that one's addresses.
        let bound = there.as_ref().and_then(|t| t.container.as_ref());
        if let (Some(workload), Some(other)) = (&owner.workload, bound) {
            if *other != owner.id {
                taken.push(format!(
                    "workload {workload}'s hold there is its container {other}'s"
                ));
            }
        }
        let sticky = hold.as_ref().map(|hold| StickyClaim {
            workload: &hold.workload,
            sticky_for: hold.sticky_for,
            prior: there.as_ref(),
        });
        if !taken.is_empty() {
            conflict(taken.join("; "));
        } else if dry_run {
            report.lines.push(format!("would import {who} {addresses}"));
        } else if to.claim(owner, &allocation.held, sticky.as_ref())?
            // A claim resent after a broken connection finds its own keys.
            || to
                .allocation(&owner.node, &owner.id, &owner.ifname)?
                .is_some_and(|there| same(&there.held, &allocation.held))
        {
            report.lines.push(format!("imported {who} {addresses}"));
        } else {
            conflict("taken there meanwhile; run the import again".into());
        }
    }
    Ok(report)
}

/// Puts in `to` the cooldowns of `cooling` that have not ended, each
/// until its end, unless `dry_run`: an address given back shortly before
/// the import is not given to another node sooner on etcd than it would
/// have been here. One that has a record there already is left as it is
/// and named: held there, the cooldown can no longer keep it from anyone;
/// cooling there, until the end there.
fn carry_cooldowns(
    cooling: &[(Addr, Cooling)],
    to: &dyn Store,
    dry_run: bool,
    report: &mut Report,
) -> Result<(), PoolError> {
    for (address, cooling) in cooling {
        if cooling.until <= clock::now() {
            continue;
        }
        let what = format!(
            "the cooldown of {}/{address} until {}",
            cooling.pool.as_deref().unwrap_or("?"),
            utc(cooling.until)
        );
        // The same end there: this one, carried (a carry resent after its
        // answer was lost finds itself there), or an earlier import's.
        let same_there = |there: &Cooling| there.until == cooling.until;
        let line = match to.holder(*address)? {
            Some(Holder::Cooling(there)) if there.until >= cooling.until => {
                format!("already there {what}")
            }
            Some(Holder::Cooling(there)) => format!(
                "left behind {what}: it cools down there until {} only",
                utc(there.until)
            ),
            Some(other) => format!("left behind {what}: held there by {other}"),
            None if dry_run => format!("would carry {what}"),
            None if to.carry_cooling(*address, cooling)? => format!("carried {what}"),
            None => match to.holder(*address)? {
                Some(Holder::Cooling(there)) if same_there(&there) => format!("carried {what}"),
                _ => format!("left behind {what}: taken there meanwhile"),
            },
        };
        report.lines.push(line);
    }
    Ok(())
}

/// `POOL/ADDRESS, …`.
fn listed(held: &[PoolAddress]) -> String {
    let each: Vec<String> = held
        .iter()
        .map(|h| format!("{}/{}", h.pool, h.address))
        .collect();
    each.join(", ")
}

/// Whether two attachments hold the same addresses, in any order.
fn same(a: &[PoolAddress], b: &[PoolAddress]) -> bool {
    a.len() == b.len() && a.iter().all(|h| b.contains(h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::Addr;
    use crate::da_pool::store::fake_store::FakeStore;
    use crate::da_pool::store::{Allocation, Owner, StickyClaim};

    /// `VERB`'s options, as the command line `list` gives them.
    fn parse(list: &[&str]) -> Result<Import, String> {
        VERB.parse_words(list).and_then(|given| options(&given))
    }

    #[test]
    fn import_takes_its_options_in_either_form_and_needs_both_paths() {
        assert_eq!(
            parse(&[
                "--config=/etc/cni/net.d/pods.conflist",
                "--from",
                "/var/lib/x",
                "--dry-run"
            ]),
            Ok(Import {
                config: "/etc/cni/net.d/pods.conflist".into(),
                from: "/var/lib/x".into(),
                dry_run: true,
            })
        );
        for (bad, said) in [
            (&["--config", "f"][..], "needs --config and --from"),
            (&["--from"][..], "--from needs a value"),
            (
                &["--config", "f", "--from", "d", "--force"][..],
                "unknown option \"--force\"",
            ),
            (&["--dry-run=yes"][..], "unknown option"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(said), "{bad:?}: {e}");
        }
    }

    fn allocation_of(store: &dyn Store, id: &str) -> Option<Allocation> {
        let all = store.allocations().unwrap();
        all.into_iter().find(|h| h.owner.id == id)
    }

    fn owner(id: &str, node: &str) -> Owner {
        Owner {
            id: id.into(),
            ifname: "eth0".into(),
            node: node.into(),
            workload: None,
        }
    }

    fn held(address: &str) -> Vec<PoolAddress> {
        vec![PoolAddress {
            pool: "blue".into(),
            address: Addr::new(address.parse().unwrap()),
        }]
    }

    #[test]
    fn each_attachment_is_claimed_as_held_and_conflicts_are_named() {
        let (local, cluster) = (FakeStore::default(), FakeStore::default());
        for (id, address) in [
            ("a", "10.1.0.2"),
            ("b", "10.1.0.3"),
            ("c", "10.1.0.4"),
            ("d", "10.1.0.5"),
        ] {
            assert!(local
                .claim(&owner(id, "node-a"), &held(address), None)
                .unwrap());
        }
        // b is there already; another node holds c's address; d is torn.
        assert!(cluster
            .claim(&owner("b", "node-a"), &held("10.1.0.3"), None)
            .unwrap());
        assert!(cluster
            .claim(&owner("x", "node-b"), &held("10.1.0.4"), None)
            .unwrap());
        local
            .addresses
            .borrow_mut()
            .remove(&Addr::new("10.1.0.5".parse().unwrap()));

        let dry = import(&Records::read(&local).unwrap(), &cluster, "node-a", true).unwrap();
        assert!(
            allocation_of(&cluster, "a").is_none(),
            "a dry run claims nothing"
        );
        assert_eq!(
            dry.lines[0],
            "would import a/eth0 (node node-a) blue/10.1.0.2"
        );

        let report = import(&Records::read(&local).unwrap(), &cluster, "node-a", false).unwrap();
        assert_eq!(
            report.lines,
            [
                "imported a/eth0 (node node-a) blue/10.1.0.2",
                "already there b/eth0 (node node-a) blue/10.1.0.3",
                "conflict c/eth0 (node node-a) blue/10.1.0.4: 10.1.0.4 is held there by x/eth0 on node node-b",
                "skipped d/eth0 (node node-a): its record lists blue/10.1.0.5, which it does not all hold (a claim cut short; DEL or GC frees it)",
            ]
        );
        assert_eq!((report.conflicts, report.attachments), (1, 4));
        let a = allocation_of(&cluster, "a").unwrap();
        assert_eq!((a.owner, a.held), (owner("a", "node-a"), held("10.1.0.2")));
        assert_eq!(local.held().len(), 3, "the source is only read");
    }

    #[test]
    fn records_go_under_the_configurations_node_name_and_a_fenced_node_imports_none() {
        let (local, cluster) = (FakeStore::default(), FakeStore::default());
        // Made when the host had another name: one node's all the same.
        assert!(local
            .claim(&owner("a", "old-host"), &held("10.1.0.2"), None)
            .unwrap());
        let records = Records::read(&local).unwrap();
        let report = import(&records, &cluster, "node-a", false).unwrap();
        assert_eq!(
            report.lines,
            ["imported a/eth0 (node node-a) blue/10.1.0.2"]
        );
        let a = allocation_of(&cluster, "a").unwrap();
        assert_eq!(a.owner, owner("a", "node-a"));
        let fenced = FakeStore::default();
        fenced
            .fences
            .borrow_mut()
            .insert("node-a".into(), "node node-a is fenced".into());
        let e = import(&records, &fenced, "node-a", false).unwrap_err();
        assert!(e.to_string().contains("node node-a is fenced"), "{e}");
        assert!(fenced.held().is_empty());
    }

    #[test]
    fn cooldowns_are_carried_until_their_end_unless_the_address_has_a_record_there() {
        let (local, cluster) = (FakeStore::default(), FakeStore::default());
        let cooling = |pool: &str, until: u64| Cooling {
            pool: Some(pool.into()),
            until,
        };
        let at = |address: &str| Addr::new(address.parse().unwrap());
        for (address, until) in [
            ("10.1.0.2", 4_000_000_000),
            ("10.1.0.3", 4_000_000_100),
            ("10.1.0.4", 4_000_000_200),
            ("10.1.0.6", 4_000_000_400),
            // Ended: not carried.
            ("10.1.0.7", 1_000_000_000),
            ("fd00::5", 4_000_000_300),
        ] {
            local
                .cooling
                .borrow_mut()
                .insert(at(address), cooling("blue", until));
        }
        // .3 cools down there already, .6 not as long; .4 is held there.
        assert!(cluster
            .carry_cooling(at("10.1.0.3"), &cooling("blue", 4_000_000_100))
            .unwrap());
        assert!(cluster
            .carry_cooling(at("10.1.0.6"), &cooling("blue", 4_000_000_050))
            .unwrap());
        assert!(cluster
            .claim(&owner("x", "node-b"), &held("10.1.0.4"), None)
            .unwrap());
        let records = Records::read(&local).unwrap();
        let dry = import(&records, &cluster, "node-a", true).unwrap();
        assert_eq!(
            dry.lines[0],
            "would carry the cooldown of blue/10.1.0.2 until 2096-10-02T07:06:40Z"
        );
        assert_eq!(cluster.cooling.borrow().len(), 2, "a dry run carries none");
        let report = import(&records, &cluster, "node-a", false).unwrap();
        assert_eq!(
            report.lines,
            [
                "carried the cooldown of blue/10.1.0.2 until 2096-10-02T07:06:40Z",
                "already there the cooldown of blue/10.1.0.3 until 2096-10-02T07:08:20Z",
                "left behind the cooldown of blue/10.1.0.4 until 2096-10-02T07:10:00Z: held there by x/eth0 on node node-b",
                "left behind the cooldown of blue/10.1.0.6 until 2096-10-02T07:13:20Z: it cools down there until 2096-10-02T07:07:30Z only",
                "carried the cooldown of blue/fd00::5 until 2096-10-02T07:11:40Z",
            ]
        );
        assert_eq!(report.attachments, 0);
        assert_eq!(cluster.holder(at("10.1.0.7")).unwrap(), None);
        // A carry whose answer was lost finds itself there; one another
        // carry beat does not.
        let records = Records::read(&local).unwrap();
        for (raced, said) in [
            (0, "carried the cooldown of blue/10.1.0.2"),
            (1, "left behind the cooldown of blue/10.1.0.2 until 2096-10-02T07:06:40Z: taken there meanwhile"),
        ] {
            let cluster = FakeStore::default();
            cluster.resent_carries.set(1 - raced);
            cluster.raced_carries.set(raced);
            let report = import(&records, &cluster, "node-a", false).unwrap();
            assert!(report.lines[0].starts_with(said), "{:?}", report.lines);
        }
        assert_eq!(report.conflicts, 0);
        assert_eq!(
            cluster.holder(at("fd00::5")).unwrap(),
            Some(Holder::Cooling(cooling("blue", 4_000_000_300)))
        );
    }

    #[test]
    fn a_workloads_hold_comes_along_unless_another_of_its_containers_has_it_there() {
        let (local, cluster) = (FakeStore::default(), FakeStore::default());
        let web = |id: &str, node: &str| Owner {
            workload: Some("db/pg-0".into()),
            ..owner(id, node)
        };
        let sticky = StickyClaim {
            workload: "db/pg-0",
            sticky_for: 3_600,
            prior: None,
        };
        assert!(local
            .claim(&web("c1", "node-a"), &held("10.1.0.2"), Some(&sticky))
            .unwrap());
        let report = import(&Records::read(&local).unwrap(), &cluster, "node-a", false).unwrap();
        assert_eq!(
            report.lines,
            ["imported c1/eth0 (node node-a, workload db/pg-0) blue/10.1.0.2"]
        );
        let hold = cluster.workload_hold("db/pg-0", "eth0").unwrap().unwrap();
        assert_eq!(
            (hold.container.as_deref(), hold.sticky_for, hold.held),
            (Some("c1"), 3_600, held("10.1.0.2"))
        );
        // The workload runs as c2 on a node moved already: the stale c1 of
        // a node moving late must not take its hold over.
        let (local, cluster) = (FakeStore::default(), FakeStore::default());
        assert!(local
            .claim(&web("c1", "node-a"), &held("10.1.0.2"), Some(&sticky))
            .unwrap());
        assert!(cluster
            .claim(&web("c2", "node-b"), &held("10.1.0.3"), Some(&sticky))
            .unwrap());
        let report = import(&Records::read(&local).unwrap(), &cluster, "node-a", false).unwrap();
        assert_eq!(report.conflicts, 1);
        assert!(
            report.lines[0].contains("workload db/pg-0's hold there is its container c2's"),
            "{:?}",
            report.lines
        );
        assert_eq!(cluster.held(), ["10.1.0.3"]);
    }
}
