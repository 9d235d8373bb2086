//! The verdict on what the runtimes saw (the store's own history is
//! `store_rules`'): no address is held by two attachments at once, where
//! an attachment holds its address from its ADD's successful answer until
//! its DEL starts (an overlap in which one of the two is on a node reclaim
//! fenced meanwhile is the price of reclaim, counted apart; the store's
//! history says whether reclaim gave the address back first); no ADD
//! succeeds on a node once its fence is seen; no fence of a node nothing
//! cut off; every operation ends within its bound; and at the end the
//! store's attachments are exactly the live ones.

use std::collections::BTreeMap;

use crate::history::{History, Operation};

/// An attachment's holding of an address, in milliseconds since the run
/// began.
#[derive(Debug, Clone, PartialEq)]
pub struct Holding {
    pub address: String,
    pub node: String,
    pub container: String,
    /// When its ADD began.
    pub asked: u64,
    /// When its ADD answered.
    pub from: u64,
    /// When its DEL started; `None` while it still holds it.
    pub until: Option<u64>,
}

impl Holding {
    fn ends(&self) -> u64 {
        self.until.unwrap_or(u64::MAX)
    }
}

/// Two attachments holding one address at once.
#[derive(Debug, Clone, PartialEq)]
pub struct Overlap {
    pub first: Holding,
    pub second: Holding,
    /// One of them is on a node reclaim fenced during the overlap.
    pub reclaimed: bool,
}

/// Every holding the history shows.
pub fn holdings(history: &History) -> Vec<Holding> {
    // Each container's DELs, by when they started: a long run has
    // hundreds of thousands of operations.
    let mut dels: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for del in history.operations.iter().filter(|op| op.command == "DEL") {
        dels.entry(del.container.as_str())
            .or_default()
            .push(del.start);
    }
    let mut found = Vec::new();
    for add in history
        .operations
        .iter()
        .filter(|op| op.command == "ADD" && op.succeeded())
    {
        // Until the first DEL of the attachment that starts after.
        let until = dels
            .get(add.container.as_str())
            .into_iter()
            .flatten()
            .copied()
            .filter(|start| *start >= add.end)
            .min();
        for address in &add.addresses {
            found.push(Holding {
                address: address.clone(),
                node: add.node.clone(),
                container: add.container.clone(),
                asked: add.start,
                from: add.end,
                until,
            });
        }
    }
    found
}

/// A node's fence, as the history shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Fence {
    pub node: String,
    /// When the reclaim that fenced it began.
    pub at: u64,
    /// When the fence was seen in etcd: it held from then on.
    pub seen: u64,
    /// When its readmit began (or never).
    pub lifted: u64,
}

/// Every fence: from a "fenced" event, through the next "fence-seen" of
/// the node, to its next "readmitted" (or the end of the run).
pub fn fences(history: &History) -> Vec<Fence> {
    let next = |kind: &str, node: &str, after: u64| {
        history
            .events
            .iter()
            .filter(|e| e.kind == kind && e.target == node && e.at >= after)
            .map(|e| e.at)
            .min()
            .unwrap_or(u64::MAX)
    };
    history
        .events
        .iter()
        .filter(|e| e.kind == "fenced")
        .map(|fenced| Fence {
            node: fenced.target.clone(),
            at: fenced.at,
            seen: next("fence-seen", &fenced.target, fenced.at),
            lifted: next("readmitted", &fenced.target, fenced.at),
        })
        .collect()
}

/// Every ADD that succeeded on a node whose fence was seen before it
/// began and not yet lifted: a fence refuses a node's ADDs.
pub fn adds_through_fences(history: &History) -> Vec<&Operation> {
    let fences = fences(history);
    history
        .operations
        .iter()
        .filter(|op| op.command == "ADD" && op.succeeded())
        .filter(|op| {
            fences
                .iter()
                .any(|f| f.node == op.node && f.seen <= op.start && op.start < f.lifted)
        })
        .collect()
}

/// Every pair of attachments that held one address at once.
pub fn overlaps(history: &History) -> Vec<Overlap> {
    let mut by_address: BTreeMap<&str, Vec<Holding>> = BTreeMap::new();
    let all = holdings(history);
    for holding in &all {
        by_address
            .entry(holding.address.as_str())
            .or_default()
            .push(holding.clone());
    }
    let fences = fences(history);
    // The price of reclaim: an address the fenced node held from before
    // its fence was seen, given to another (its ADD answered) once
    // reclaim had begun, while the fence stood. The other's ADD may have
    // begun before: it found the address once reclaim gave it back.
    let reclaimed = |fenced: &Holding, other: &Holding| {
        fences.iter().any(|f| {
            f.node == fenced.node
                && fenced.asked <= f.seen
                && other.from >= f.at
                && other.asked < f.lifted
        })
    };
    let mut found = Vec::new();
    for list in by_address.values_mut() {
        list.sort_by_key(|h| h.from);
        for (i, first) in list.iter().enumerate() {
            for second in &list[i + 1..] {
                if second.from >= first.ends() {
                    // Sorted by when they began: none later overlaps.
                    break;
                }
                if first.container == second.container {
                    continue;
                }
                let (from, until) = (second.from, first.ends().min(second.ends()));
                if from < until {
                    found.push(Overlap {
                        reclaimed: reclaimed(first, second) || reclaimed(second, first),
                        first: first.clone(),
                        second: second.clone(),
                    });
                }
            }
        }
    }
    found
}

/// Each fence that nothing explains: a node is reclaimed only once its
/// registration has been gone for `dead_for` milliseconds, which takes
/// its link cut or its keeper frozen from at least that long before the
/// fence was seen, until at most `renewal` milliseconds before its
/// reclaim began (the keeper registers it again within a renewal). A fence
/// of a node with no such fault was of a live node (a second keeper that
/// unregistered it, say).
pub fn unexplained_fences(history: &History, dead_for: u64, renewal: u64) -> Vec<Fence> {
    let causes: Vec<(&str, u64, u64)> = history
        .events
        .iter()
        .filter_map(|start| {
            let end = match start.kind.as_str() {
                "partition" => "healed",
                "keeper-stopped" => "keeper-resumed",
                _ => return None,
            };
            let ended = history
                .events
                .iter()
                .filter(|e| e.kind == end && e.target == start.target && e.at >= start.at)
                .map(|e| e.at)
                .min()
                .unwrap_or(u64::MAX);
            Some((start.target.as_str(), start.at, ended))
        })
        .collect();
    fences(history)
        .into_iter()
        .filter(|fence| {
            !causes.iter().any(|(node, from, to)| {
                *node == fence.node
                    && from.saturating_add(dead_for) <= fence.seen
                    && to.saturating_add(renewal) >= fence.at
            })
        })
        .collect()
}

/// Every operation that ran past its bound (`bound` of its command, ms),
/// whatever the fault.
pub fn overdue<'h>(history: &'h History, bound: &dyn Fn(&str) -> u64) -> Vec<&'h Operation> {
    history
        .operations
        .iter()
        .filter(|op| op.end.saturating_sub(op.start) > bound(&op.command))
        .collect()
}

/// How the stores at the end differ from the live attachments (container
/// to its addresses): records of no live attachment (leaked), live
/// attachments with no record (lost), and records that say other
/// addresses than the attachment's ADD gave: each as the container it is
/// about, and what is wrong.
pub fn differences(
    live: &BTreeMap<String, Vec<String>>,
    stored: &BTreeMap<String, Vec<String>>,
) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (container, addresses) in stored {
        match live.get(container) {
            None => found.push((
                container.clone(),
                format!("leaked: {container} holds {}", addresses.join(", ")),
            )),
            Some(given) if sorted(given) != sorted(addresses) => found.push((
                container.clone(),
                format!(
                    "{container} holds {} in the store, but its ADD gave {}",
                    addresses.join(", "),
                    given.join(", ")
                ),
            )),
            Some(_) => {}
        }
    }
    for (container, addresses) in live {
        if !stored.contains_key(container) {
            found.push((
                container.clone(),
                format!(
                    "lost: {container}'s {} is in no record",
                    addresses.join(", ")
                ),
            ));
        }
    }
    found
}

/// What happened around a violation: every operation on `containers`,
/// and every fault from a second before the first of them began to the
/// end of the last, in time order.
pub fn around(history: &History, containers: &[&str]) -> Vec<String> {
    let ops: Vec<_> = history
        .operations
        .iter()
        .filter(|op| containers.contains(&op.container.as_str()))
        .collect();
    let (Some(first), Some(last)) = (
        ops.iter().map(|op| op.start).min(),
        ops.iter().map(|op| op.end).max(),
    ) else {
        return Vec::new();
    };
    let mut lines: Vec<(u64, String)> =
        ops.iter().map(|op| (op.start, format!("{op:?}"))).collect();
    lines.extend(
        history
            .events
            .iter()
            .filter(|e| e.at + 1_000 >= first && e.at <= last)
            .map(|e| (e.at, format!("{e:?}"))),
    );
    lines.sort();
    lines.into_iter().map(|(_, line)| line).collect()
}

fn sorted(list: &[String]) -> Vec<&String> {
    let mut sorted: Vec<&String> = list.iter().collect();
    sorted.sort();
    sorted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Event;

    fn op(
        node: &str,
        command: &str,
        container: &str,
        start: u64,
        end: u64,
        address: &str,
    ) -> Operation {
        Operation {
            node: node.into(),
            command: command.into(),
            container: container.into(),
            workload: None,
            start,
            end,
            status: Some(0),
            addresses: if address.is_empty() {
                vec![]
            } else {
                vec![address.into()]
            },
            said: String::new(),
        }
    }

    fn event(kind: &str, node: &str, at: u64) -> Event {
        Event {
            at,
            kind: kind.into(),
            target: node.into(),
            detail: String::new(),
        }
    }

    #[test]
    fn an_address_given_again_only_after_the_first_del_started_is_no_overlap() {
        let history = History {
            operations: vec![
                op("n1", "ADD", "a", 0, 10, "10.0.0.2"),
                op("n1", "DEL", "a", 20, 30, ""),
                op("n2", "ADD", "b", 25, 40, "10.0.0.2"),
            ],
            events: vec![],
        };
        assert_eq!(overlaps(&history), vec![]);
    }

    #[test]
    fn a_doubled_address_is_flagged() {
        let history = History {
            operations: vec![
                op("n1", "ADD", "a", 0, 10, "10.0.0.2"),
                op("n2", "ADD", "b", 5, 15, "10.0.0.2"),
                op("n1", "DEL", "a", 20, 30, ""),
            ],
            events: vec![],
        };
        let found = overlaps(&history);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(!found[0].reclaimed);
        assert_eq!(
            (
                found[0].first.container.as_str(),
                found[0].second.container.as_str()
            ),
            ("a", "b")
        );
    }

    #[test]
    fn a_failed_or_killed_add_holds_nothing() {
        let mut failed = op("n1", "ADD", "a", 0, 10, "10.0.0.2");
        failed.status = Some(1);
        let mut killed = op("n1", "ADD", "k", 0, 10, "10.0.0.2");
        killed.status = None;
        let history = History {
            operations: vec![failed, killed, op("n2", "ADD", "b", 5, 15, "10.0.0.2")],
            events: vec![],
        };
        assert_eq!(overlaps(&history), vec![]);
    }

    #[test]
    fn an_overlap_on_a_node_fenced_meanwhile_is_the_price_of_reclaim() {
        let history = History {
            operations: vec![
                op("n1", "ADD", "a", 0, 10, "10.0.0.2"),
                op("n2", "ADD", "b", 50, 60, "10.0.0.2"),
                op("n1", "DEL", "a", 100, 110, ""),
            ],
            events: vec![
                event("fenced", "n1", 40),
                event("fence-seen", "n1", 45),
                event("readmitted", "n1", 120),
            ],
        };
        let found = overlaps(&history);
        assert_eq!(found.len(), 1);
        assert!(found[0].reclaimed);
        // The other's ADD began before the reclaim and found the address
        // once reclaim gave it back: the same price.
        let mut early = history.clone();
        early.operations[1].start = 30;
        assert!(overlaps(&early)[0].reclaimed);
        // Answered before the reclaim began: a violation.
        early.operations[1].end = 35;
        assert!(!overlaps(&early)[0].reclaimed);
        // Fenced only after the overlap ended: a violation.
        let late = History {
            events: vec![event("fenced", "n1", 105), event("fence-seen", "n1", 106)],
            ..history.clone()
        };
        assert!(!overlaps(&late)[0].reclaimed);
        // The fenced node's address taken by an ADD after the fence was
        // seen: no price of reclaim, a violation.
        let mut through = history.clone();
        through.operations[0].start = 46;
        through.operations[0].end = 47;
        through.operations[1].end = 48;
        assert!(!overlaps(&through)[0].reclaimed);
    }

    #[test]
    fn an_add_through_a_seen_fence_is_flagged() {
        let history = History {
            operations: vec![
                op("n1", "ADD", "before", 30, 50, "10.0.0.2"),
                op("n1", "ADD", "through", 60, 70, "10.0.0.3"),
                op("n2", "ADD", "elsewhere", 60, 70, "10.0.0.4"),
                op("n1", "ADD", "after", 130, 140, "10.0.0.5"),
            ],
            events: vec![
                event("fenced", "n1", 40),
                event("fence-seen", "n1", 55),
                event("readmitted", "n1", 120),
            ],
        };
        let found: Vec<&str> = adds_through_fences(&history)
            .iter()
            .map(|op| op.container.as_str())
            .collect();
        assert_eq!(found, ["through"]);
    }

    #[test]
    fn a_fence_of_a_node_nothing_cut_off_is_flagged() {
        let history = History {
            operations: vec![],
            events: vec![
                event("partition", "n1", 1_000),
                event("fenced", "n1", 11_000),
                event("fence-seen", "n1", 11_500),
                event("healed", "n1", 12_000),
                event("keeper-stopped", "n2", 1_000),
                event("keeper-resumed", "n2", 9_000),
                event("fenced", "n2", 9_500),
                event("fence-seen", "n2", 10_000),
                // n3 was never cut off; n1 was, but long before; n4 too
                // short a time before the fence to be gone for dead_for.
                event("fenced", "n3", 11_000),
                event("fence-seen", "n3", 11_100),
                event("fenced", "n1", 60_000),
                event("fence-seen", "n1", 60_100),
                event("keeper-stopped", "n4", 20_000),
                event("fenced", "n4", 21_000),
                event("fence-seen", "n4", 21_100),
                event("keeper-resumed", "n4", 30_000),
            ],
        };
        let found: Vec<(String, u64)> = unexplained_fences(&history, 4_000, 2_000)
            .into_iter()
            .map(|f| (f.node, f.at))
            .collect();
        assert_eq!(
            found,
            [
                ("n3".to_owned(), 11_000),
                ("n1".to_owned(), 60_000),
                ("n4".to_owned(), 21_000)
            ]
        );
    }

    #[test]
    fn an_operation_past_its_bound_is_overdue() {
        let history = History {
            operations: vec![
                op("n1", "ADD", "a", 0, 18_000, "10.0.0.2"),
                op("n1", "ADD", "b", 0, 18_001, "10.0.0.3"),
                op("n1", "DEL", "a", 20_000, 30_001, ""),
            ],
            events: vec![],
        };
        let bound = |command: &str| if command == "ADD" { 18_000 } else { 10_000 };
        let found: Vec<&str> = overdue(&history, &bound)
            .iter()
            .map(|op| op.container.as_str())
            .collect();
        assert_eq!(found, ["b", "a"]);
    }

    #[test]
    fn around_a_violation_are_its_operations_and_the_faults_meanwhile() {
        let history = History {
            operations: vec![
                op("n1", "ADD", "a", 0, 10, "10.0.0.2"),
                op("n2", "ADD", "b", 5, 15, "10.0.0.3"),
                op("n1", "DEL", "a", 3_000, 3_010, ""),
            ],
            events: vec![event("kill-add", "n1", 20), event("partition", "n2", 9_000)],
        };
        let lines = around(&history, &["a"]);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].contains("\"ADD\"") && lines[0].contains("\"a\""));
        assert!(lines[1].contains("kill-add"));
        assert!(lines[2].contains("\"DEL\""));
    }

    #[test]
    fn a_leak_a_loss_and_a_mismatch_are_named() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, Vec<String>> {
            pairs
                .iter()
                .map(|(c, a)| (c.to_string(), vec![a.to_string()]))
                .collect()
        };
        let live = map(&[("a", "10.0.0.2"), ("b", "10.0.0.3"), ("c", "10.0.0.4")]);
        let stored = map(&[("a", "10.0.0.2"), ("b", "10.0.0.9"), ("x", "10.0.0.5")]);
        let found = differences(&live, &stored);
        let found: Vec<(&str, &str)> = found
            .iter()
            .map(|(c, m)| (c.as_str(), m.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                (
                    "b",
                    "b holds 10.0.0.9 in the store, but its ADD gave 10.0.0.3"
                ),
                ("x", "leaked: x holds 10.0.0.5"),
                ("c", "lost: c's 10.0.0.4 is in no record"),
            ]
        );
        assert_eq!(differences(&live, &live), []);
    }
}
