//! Moving reservations from one store to another: the upgrade of a node
//! from the local store (one node) to etcd (a cluster). Each attachment is
//! claimed in the target as it was held in the source, by the same owner,
//! all its addresses at once; one the target already has is left alone,
//! and one whose addresses someone else holds there is a conflict, named,
//! for the operator to settle. An attachment whose addresses follow a
//! workload takes its hold along; a hold no container uses now is left
//! behind (its workload's next container gets new addresses). The source
//! is only read.

use super::store::{Sticky, Store};
use super::{holds_all, Held};
use crate::error::Error;

/// What an import did (or, dry, would do), one line per attachment.
#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<String>,
    /// How many attachments could not be imported.
    pub conflicts: usize,
}

/// Claims in `to` every attachment `from` holds, unless `dry_run`.
pub fn import(from: &dyn Store, to: &dyn Store, dry_run: bool) -> Result<Report, Error> {
    let mut report = Report::default();
    for hold in from.holds()? {
        if hold.container.is_none() {
            report.lines.push(format!(
                "left behind the hold of workload {} ({}): no container uses it",
                hold.workload, hold.ifname
            ));
        }
    }
    for holding in from.holdings()? {
        let owner = &holding.owner;
        let who = match &owner.workload {
            Some(workload) => format!(
                "{}/{} (node {}, workload {workload})",
                owner.id, owner.ifname, owner.node
            ),
            None => format!("{}/{} (node {})", owner.id, owner.ifname, owner.node),
        };
        let addresses = listed(&holding.held);
        if !holds_all(from, &holding)? {
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
        if let Some(there) = to.holding(&holding.owner.id, &holding.owner.ifname)? {
            if same(&there.held, &holding.held) {
                report
                    .lines
                    .push(format!("already there {who} {addresses}"));
            } else {
                conflict(format!("the target has it holding {}", listed(&there.held)));
            }
            continue;
        }
        let mut taken = Vec::new();
        for h in &holding.held {
            if let Some(other) = to.holder(h.address)?.filter(|o| !owner.owns(o)) {
                taken.push(format!("{} is held there by {other}", h.address));
            }
        }
        // A workload's hold comes along, as the source has it.
        let (hold, there) = match &owner.workload {
            Some(workload) => (
                from.hold(workload, &owner.ifname)?,
                to.hold(workload, &owner.ifname)?,
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
        let sticky = hold.as_ref().map(|hold| Sticky {
            workload: &hold.workload,
            sticky_for: hold.sticky_for,
            prior: there.as_ref(),
        });
        if !taken.is_empty() {
            conflict(taken.join("; "));
        } else if dry_run {
            report.lines.push(format!("would import {who} {addresses}"));
        } else if to.claim(owner, &holding.held, sticky.as_ref())?
            // A claim resent after a broken connection finds its own keys.
            || to
                .holding(&holding.owner.id, &holding.owner.ifname)?
                .is_some_and(|there| same(&there.held, &holding.held))
        {
            report.lines.push(format!("imported {who} {addresses}"));
        } else {
            conflict("taken there meanwhile; run the import again".into());
        }
    }
    Ok(report)
}

/// `POOL/ADDRESS, …`.
fn listed(held: &[Held]) -> String {
    let each: Vec<String> = held
        .iter()
        .map(|h| format!("{}/{}", h.pool, h.address))
        .collect();
    each.join(", ")
}

/// Whether two attachments hold the same addresses, in any order.
fn same(a: &[Held], b: &[Held]) -> bool {
    a.len() == b.len() && a.iter().all(|h| b.contains(h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::Addr;
    use crate::da_pool::store::fake::Fake;
    use crate::da_pool::store::{Holding, Owner, Sticky};

    fn holding_of(store: &dyn Store, id: &str) -> Option<Holding> {
        store.holding(id, "eth0").unwrap()
    }

    fn owner(id: &str, node: &str) -> Owner {
        Owner {
            id: id.into(),
            ifname: "eth0".into(),
            node: node.into(),
            workload: None,
        }
    }

    fn held(address: &str) -> Vec<Held> {
        vec![Held {
            pool: "blue".into(),
            address: Addr::new(address.parse().unwrap()),
        }]
    }

    #[test]
    fn each_attachment_is_claimed_as_held_and_conflicts_are_named() {
        let (local, cluster) = (Fake::default(), Fake::default());
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

        let dry = import(&local, &cluster, true).unwrap();
        assert!(
            holding_of(&cluster, "a").is_none(),
            "a dry run claims nothing"
        );
        assert_eq!(
            dry.lines[0],
            "would import a/eth0 (node node-a) blue/10.1.0.2"
        );

        let report = import(&local, &cluster, false).unwrap();
        assert_eq!(
            report.lines,
            [
                "imported a/eth0 (node node-a) blue/10.1.0.2",
                "already there b/eth0 (node node-a) blue/10.1.0.3",
                "conflict c/eth0 (node node-a) blue/10.1.0.4: 10.1.0.4 is held there by x/eth0 on node node-b",
                "skipped d/eth0 (node node-a): its record lists blue/10.1.0.5, which it does not all hold (a claim cut short; DEL or GC frees it)",
            ]
        );
        assert_eq!(report.conflicts, 1);
        let a = holding_of(&cluster, "a").unwrap();
        assert_eq!((a.owner, a.held), (owner("a", "node-a"), held("10.1.0.2")));
        assert_eq!(local.held().len(), 3, "the source is only read");
    }

    #[test]
    fn a_workloads_hold_comes_along_unless_another_of_its_containers_has_it_there() {
        let (local, cluster) = (Fake::default(), Fake::default());
        let web = |id: &str, node: &str| Owner {
            workload: Some("db/pg-0".into()),
            ..owner(id, node)
        };
        let sticky = Sticky {
            workload: "db/pg-0",
            sticky_for: 3_600,
            prior: None,
        };
        assert!(local
            .claim(&web("c1", "node-a"), &held("10.1.0.2"), Some(&sticky))
            .unwrap());
        let report = import(&local, &cluster, false).unwrap();
        assert_eq!(
            report.lines,
            ["imported c1/eth0 (node node-a, workload db/pg-0) blue/10.1.0.2"]
        );
        let hold = cluster.hold("db/pg-0", "eth0").unwrap().unwrap();
        assert_eq!(
            (hold.container.as_deref(), hold.sticky_for, hold.held),
            (Some("c1"), 3_600, held("10.1.0.2"))
        );
        // The workload runs as c2 on a node moved already: the stale c1 of
        // a node moving late must not take its hold over.
        let (local, cluster) = (Fake::default(), Fake::default());
        assert!(local
            .claim(&web("c1", "node-a"), &held("10.1.0.2"), Some(&sticky))
            .unwrap());
        assert!(cluster
            .claim(&web("c2", "node-b"), &held("10.1.0.3"), Some(&sticky))
            .unwrap());
        let report = import(&local, &cluster, false).unwrap();
        assert_eq!(report.conflicts, 1);
        assert!(
            report.lines[0].contains("workload db/pg-0's hold there is its container c2's"),
            "{:?}",
            report.lines
        );
        assert_eq!(cluster.held(), ["10.1.0.3"]);
    }
}
