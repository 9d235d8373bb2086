//! The verdict on the store, from etcd's own history of the run's prefix
//! (read by the watchers, never by the code judged), replayed revision by
//! revision, and from snapshots of it:
//! - an address record written over another owner's (doubled);
//! - a claim by a node while its fence stands (an ADD through a fence),
//!   whether the harness saw the fence or not;
//! - a fence written when the node's registration had been gone for less
//!   than `--dead-for`, or while it was there;
//! - an attachment whose record lists an address whose record names
//!   another, or none;
//! - a workload's hold kept, once released, past a GC that began after
//!   its `stickyFor` was up; ended before `stickyFor`; or taken over with
//!   other addresses;
//! - an address record written over its cooldown (given while it cooled
//!   down), a cooldown ended sooner than `reuseAfter` after it began or
//!   still there long after, or an address given back without one while
//!   etcd had room for it;
//! - a successful ADD whose answer no record of it ever listed;
//! - at a point in time: a record a successful DEL should have freed; and
//!   every address record listed by its owner, every listed address
//!   recorded (leaked, lost).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::etcd_history::{Change, Snapshot};
use crate::history::{History, Operation};

/// What the rules need to know of the run.
pub struct Rules {
    /// The store's keys of the network: `PREFIX/networks/NETWORK/`.
    pub network: String,
    /// The nodes' keys: `PREFIX/nodes/`.
    pub nodes: String,
    /// reclaim's `--dead-for`, ms.
    pub dead_for: u64,
    /// How much sooner than `--dead-for` a fence may seem, ms: the two
    /// changes are dated as the watchers received them.
    pub dead_for_slack: u64,
    /// `ipam.pool.stickyFor`, ms.
    pub sticky_for: u64,
    /// How long a hold may still be seen after a GC that should have
    /// ended it has answered, ms: the watchers deliver changes late.
    pub sticky_slack: u64,
    /// How much sooner than `stickyFor` a released hold may end, ms: its
    /// end is written in whole seconds.
    pub sticky_early: u64,
    /// `ipam.pool.reuseAfter`, ms.
    pub reuse_after: u64,
    /// How much sooner than `reuseAfter` a cooldown may seem to end, ms:
    /// the watchers date its start and its end as they receive them.
    pub cooldown_early: u64,
    /// When etcd was full, ms (from, to): it grants no lease then, and an
    /// address is given back without a cooldown.
    pub full: Vec<(u64, u64)>,
    /// How long a cooldown may last at most, ms: its lease, renewed
    /// whole by each new leader, and expired only while etcd has one.
    pub cooldown_longest: u64,
}

/// One violation: its kind, for the summary's counts, and what it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub kind: &'static str,
    pub what: String,
}

fn violation(kind: &'static str, what: String) -> Violation {
    Violation { kind, what }
}

/// What a key of the store is.
#[derive(Debug, PartialEq)]
enum Key<'a> {
    Address(&'a str),
    /// An attachment's record, under its node.
    Attachment {
        node: &'a str,
        id: &'a str,
    },
    Hold(&'a str),
    /// `PREFIX/nodes/NODE/WHICH`: alive, fenced, gone, seen.
    Node {
        node: &'a str,
        which: &'a str,
    },
    /// Hints, notes of a full pool, marks: judged by nothing.
    Other,
}

impl Rules {
    fn key<'a>(&self, key: &'a str) -> Key<'a> {
        if let Some(rest) = key.strip_prefix(&self.network) {
            if let Some(address) = rest.strip_prefix("addresses/") {
                return Key::Address(address);
            }
            if let Some(hold) = rest.strip_prefix("holds/") {
                return Key::Hold(hold);
            }
            if let Some((node, name)) = rest
                .strip_prefix("nodes/")
                .and_then(|r| r.split_once("/attachments/"))
            {
                let id = name.split(':').next().unwrap_or(name);
                return Key::Attachment { node, id };
            }
        } else if let Some((node, which)) = key
            .strip_prefix(&self.nodes)
            .and_then(|r| r.split_once('/'))
        {
            return Key::Node { node, which };
        }
        Key::Other
    }
}

/// The name an address's key has: IPv4's dotted quads of three digits,
/// IPv6's eight groups in full, so that the keys sort as the addresses do.
fn key_name(address: &str) -> String {
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(v4)) => {
            let [a, b, c, d] = v4.octets();
            format!("{a:03}.{b:03}.{c:03}.{d:03}")
        }
        Ok(std::net::IpAddr::V6(v6)) => {
            let groups: Vec<String> = v6.segments().iter().map(|g| format!("{g:04x}")).collect();
            groups.join(":")
        }
        Err(_) => address.to_owned(),
    }
}

/// A record's JSON, or null.
fn json(value: &[u8]) -> Value {
    serde_json::from_slice(value).unwrap_or(Value::Null)
}

fn text<'a>(record: &'a Value, field: &str) -> &'a str {
    record[field].as_str().unwrap_or_default()
}

/// Whether an address record is a cooldown's: no owner's.
fn cools(record: &Value) -> bool {
    record["coolingUntil"].is_u64()
}

/// Whom an address record names: (container ID, workload, interface).
fn owner(record: &Value) -> (String, String, String) {
    (
        text(record, "containerID").to_owned(),
        text(record, "workload").to_owned(),
        text(record, "ifname").to_owned(),
    )
}

/// The addresses an attachment's or a hold's record lists.
fn listed(record: &Value) -> Vec<String> {
    record["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["address"].as_str().map(str::to_owned))
        .collect()
}

/// Whether address record `record` names the attachment or hold `holder`
/// (its workload's, if its addresses follow one).
fn names(record: &Value, holder: &Value) -> bool {
    let (id, workload, ifname) = owner(record);
    if ifname != text(holder, "ifname") {
        return false;
    }
    match text(holder, "workload") {
        "" => workload.is_empty() && id == text(holder, "containerID"),
        theirs => workload == theirs,
    }
}

/// Whether a node's clock (any node's, if none is named) was skewed at
/// some time from one time to another, ms: holds' times are by the clocks
/// of the nodes that write and end them, so not judged then.
pub type Skewed<'a> = &'a dyn Fn(Option<&str>, u64, u64) -> bool;

/// Replays `changes` (by revision) and judges each as it comes; `end` is
/// when the history ends, ms; `history` the runtimes' (a hold is released
/// when the DEL of its container begins, which may land later).
pub fn judge(
    changes: &[Change],
    rules: &Rules,
    history: &History,
    skewed: Skewed,
    end: u64,
) -> Vec<Violation> {
    let mut dels: BTreeMap<&str, u64> = BTreeMap::new();
    for del in history.operations.iter().filter(|op| op.command == "DEL") {
        let first = dels.entry(&del.container).or_insert(del.start);
        *first = (*first).min(del.start);
    }
    let mut found = Vec::new();
    let mut state: BTreeMap<&str, Value> = BTreeMap::new();
    // When each node's registration went, while it is gone.
    let mut unregistered: BTreeMap<&str, u64> = BTreeMap::new();
    // Each released hold: when, by which node, and what it keeps.
    let mut released: BTreeMap<&str, Release> = BTreeMap::new();
    // When each address that cools down began to, while it does.
    let mut cooling: BTreeMap<&str, u64> = BTreeMap::new();
    // Every GC sweeps the holds whose time is up, and only GCs do: a hold
    // outlives its time when one that began after it was up (a second
    // more, for the clock's whole seconds) answered success, and it stayed.
    let gcs: Vec<&Operation> = history
        .operations
        .iter()
        .filter(|op| op.command == "GC" && op.succeeded())
        .collect();
    let outlived = |key: &str, release: &Release, now: u64| {
        let due = release.landed + rules.sticky_for + 1_000;
        let node = &release.node;
        gcs.iter()
            .filter(|gc| gc.start >= due && gc.end + rules.sticky_slack < now)
            .find(|gc| !skewed(Some(&gc.node), gc.start, gc.end))
            .filter(|_| !skewed(Some(node), release.at, release.landed))
            .map(|gc| {
                violation(
                    "sticky",
                    format!(
                        "the hold {key} outlived stickyFor: released by {node} at {} ms, still there at {now} ms after {}'s GC of {}-{} ms",
                        release.landed, gc.node, gc.start, gc.end
                    ),
                )
            })
    };
    let mut i = 0;
    while i < changes.len() {
        let revision = changes[i].revision;
        let group: Vec<&Change> = changes[i..]
            .iter()
            .take_while(|c| c.revision == revision)
            .collect();
        i += group.len();
        let at = group[0].at;
        // Judged against the store before the revision.
        for change in &group {
            let Some(value) = &change.value else { continue };
            let record = json(value);
            let claimer = match rules.key(&change.key) {
                Key::Attachment { node, .. } => Some(node.to_owned()),
                Key::Address(_) => Some(text(&record, "node").to_owned()),
                Key::Hold(_) if record["containerID"].is_string() => {
                    Some(text(&record, "node").to_owned())
                }
                _ => None,
            };
            if let Some(node) = claimer {
                let fence = format!("{}{node}/fenced", rules.nodes);
                if state.contains_key(fence.as_str()) {
                    found.push(violation(
                        "through-fence",
                        format!(
                            "a claim through {node}'s fence: {} at revision {revision} ({at} ms)",
                            change.key
                        ),
                    ));
                }
            }
            match rules.key(&change.key) {
                Key::Address(address) => {
                    if let Some(before) = state.get(change.key.as_str()).filter(|b| cools(b)) {
                        found.push(violation(
                            "cooldown",
                            format!(
                                "{address} given while it cooled down ({before}): {record} at revision {revision} ({at} ms)"
                            ),
                        ));
                    } else if let Some(before) = state.get(change.key.as_str()) {
                        // Given back, to cool down: no one's.
                        if !cools(&record) && owner(before) != owner(&record) {
                            found.push(violation(
                                "doubled",
                                format!(
                                    "doubled: {address}'s record of {before} written over by {record} at revision {revision} ({at} ms)"
                                ),
                            ));
                        }
                    }
                }
                Key::Node {
                    node,
                    which: "fenced",
                } if !state.contains_key(change.key.as_str()) => {
                    let alive = format!("{}{node}/alive", rules.nodes);
                    if state.contains_key(alive.as_str()) {
                        found.push(violation(
                            "early-fence",
                            format!(
                                "{node} fenced at revision {revision} ({at} ms) while registered"
                            ),
                        ));
                    } else if let Some(gone) = unregistered.get(node) {
                        if at + rules.dead_for_slack < gone + rules.dead_for {
                            found.push(violation(
                                "early-fence",
                                format!(
                                    "{node} fenced at {at} ms (revision {revision}), its registration gone only since {gone} ms"
                                ),
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        // Reclaim ends the holds a fenced node released, with its fence.
        let fenced: BTreeSet<String> = state
            .keys()
            .copied()
            .chain(
                group
                    .iter()
                    .filter(|c| c.value.is_some())
                    .map(|c| c.key.as_str()),
            )
            .filter_map(|key| match rules.key(key) {
                Key::Node {
                    node,
                    which: "fenced",
                } => Some(node.to_owned()),
                _ => None,
            })
            .collect();
        for change in &group {
            let before = state.get(change.key.as_str()).cloned();
            if let (Key::Address(address), Some(before)) = (rules.key(&change.key), &before) {
                match &change.value {
                    Some(value) if cools(&json(value)) => {
                        cooling.insert(&change.key, at);
                    }
                    Some(_) => {}
                    None if cools(before) => {
                        let began = cooling.remove(change.key.as_str()).unwrap_or(0);
                        if at + rules.cooldown_early < began + rules.reuse_after {
                            found.push(violation(
                                "cooldown",
                                format!(
                                    "{address}'s cooldown, begun at {began} ms, ended at {at} ms (revision {revision})"
                                ),
                            ));
                        }
                    }
                    None => {
                        let full = rules
                            .full
                            .iter()
                            .any(|(from, to)| (*from..=*to).contains(&at));
                        if rules.reuse_after > 0 && !full {
                            found.push(violation(
                                "uncooled",
                                format!(
                                    "{address} given back without a cooldown at revision {revision} ({at} ms), etcd not full"
                                ),
                            ));
                        }
                    }
                }
            }
            match &change.value {
                Some(value) => {
                    state.insert(&change.key, json(value));
                }
                None => {
                    state.remove(change.key.as_str());
                }
            }
            match (rules.key(&change.key), &change.value) {
                (
                    Key::Node {
                        node,
                        which: "alive",
                    },
                    None,
                ) => {
                    unregistered.insert(node, at);
                }
                (
                    Key::Node {
                        node,
                        which: "alive",
                    },
                    Some(_),
                ) => {
                    unregistered.remove(node);
                }
                (Key::Hold(_), value) => {
                    let record = value.as_deref().map(json).unwrap_or(Value::Null);
                    let free = record["containerID"].is_null() && record["until"].is_u64();
                    if value.is_some() && free {
                        // From the first DEL of the container it was bound
                        // to, if that began before it landed.
                        let container = before.as_ref().map(|b| text(b, "containerID"));
                        let del = container.and_then(|c| dels.get(c)).copied();
                        released.entry(&change.key).or_insert(Release {
                            at: del.map_or(at, |d| d.min(at)),
                            landed: at,
                            node: text(&record, "node").to_owned(),
                            keeps: listed(&record),
                        });
                    } else if let Some(release) = released.remove(change.key.as_str()) {
                        found.extend(outlived(&change.key, &release, at));
                        let early = at + rules.sticky_early < release.at + rules.sticky_for
                            && !skewed(None, release.at, at)
                            && !fenced.contains(&release.node);
                        if value.is_none() && early {
                            found.push(violation(
                                "sticky",
                                format!(
                                    "the hold {} ended before stickyFor: released at {} ms, gone at {at} ms",
                                    change.key, release.at
                                ),
                            ));
                        }
                        if value.is_some() && listed(&record) != release.keeps {
                            found.push(violation(
                                "sticky",
                                format!(
                                    "the hold {} was taken over at {at} ms with {:?}, not the {:?} it kept",
                                    change.key,
                                    listed(&record),
                                    release.keeps
                                ),
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        // Judged against the store after the revision: a claim writes the
        // attachment and its addresses at once.
        for change in &group {
            let (Key::Attachment { .. }, Some(value)) = (rules.key(&change.key), &change.value)
            else {
                continue;
            };
            let attachment = json(value);
            for address in listed(&attachment) {
                let key = format!("{}addresses/{}", rules.network, key_name(&address));
                match state.get(key.as_str()) {
                    Some(record) if names(record, &attachment) => {}
                    Some(record) => found.push(violation(
                        "doubled",
                        format!(
                            "doubled: {} lists {address}, whose record names another ({record}) at revision {revision} ({at} ms)",
                            change.key
                        ),
                    )),
                    None => found.push(violation(
                        "lost",
                        format!(
                            "{} lists {address}, which has no record at revision {revision} ({at} ms)",
                            change.key
                        ),
                    )),
                }
            }
        }
    }
    for (key, release) in &released {
        found.extend(outlived(key, release, end));
    }
    for (key, began) in &cooling {
        if began + rules.cooldown_longest < end {
            found.push(violation(
                "cooldown",
                format!("{key}'s cooldown, begun at {began} ms, had not ended at {end} ms"),
            ));
        }
    }
    found
}

/// A released hold, as the rules follow it.
struct Release {
    /// When it was released, ms: from its container's first DEL.
    at: u64,
    /// When the release landed, ms: its end is counted from this.
    landed: u64,
    /// The node that released it.
    node: String,
    /// The addresses it keeps.
    keeps: Vec<String>,
}

/// How many addresses were given back to cool down.
pub fn cooldowns(changes: &[Change], rules: &Rules) -> usize {
    changes
        .iter()
        .filter(|c| matches!(rules.key(&c.key), Key::Address(_)))
        .filter(|c| c.value.as_deref().is_some_and(|v| cools(&json(v))))
        .count()
}

/// Each successful ADD whose answer no record of its attachment ever
/// listed: an address it was never given.
pub fn unrecorded_answers(history: &History, changes: &[Change], rules: &Rules) -> Vec<Violation> {
    let mut lists: BTreeMap<&str, BTreeSet<Vec<String>>> = BTreeMap::new();
    for change in changes {
        if let (Key::Attachment { id, .. }, Some(value)) = (rules.key(&change.key), &change.value) {
            let mut addresses = listed(&json(value));
            addresses.sort();
            lists.entry(id).or_default().insert(addresses);
        }
    }
    history
        .operations
        .iter()
        .filter(|op| op.command == "ADD" && op.succeeded())
        .filter(|op| {
            let mut answer = op.addresses.clone();
            answer.sort();
            !lists
                .get(op.container.as_str())
                .is_some_and(|l| l.contains(&answer))
        })
        .map(|op| {
            violation(
                "unrecorded",
                format!(
                    "the ADD of {} on {} answered {}, which no record of it ever listed",
                    op.container,
                    op.node,
                    op.addresses.join(", ")
                ),
            )
        })
        .collect()
}

/// Each record in `snapshot` that a successful DEL should have freed: an
/// attachment's record, or an address record naming its container, last
/// written before a DEL of that container that succeeded began (`times`:
/// each revision's time, ms). A record a killed command left afterwards
/// is the next DEL's or GC's.
pub fn left_by_dels(
    snapshot: &Snapshot,
    changes: &[Change],
    history: &History,
    rules: &Rules,
) -> Vec<Violation> {
    let times: BTreeMap<u64, u64> = changes.iter().map(|c| (c.revision, c.at)).collect();
    let mut dels: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for del in history
        .operations
        .iter()
        .filter(|op| op.command == "DEL" && op.succeeded())
    {
        dels.entry(&del.container).or_default().push(del.start);
    }
    let mut found = Vec::new();
    for (key, (value, revision)) in snapshot {
        let container = match rules.key(key) {
            Key::Attachment { id, .. } => id.to_owned(),
            Key::Address(_) => text(&json(value), "containerID").to_owned(),
            _ => continue,
        };
        let Some(written) = times.get(revision) else {
            continue;
        };
        if let Some(del) = dels
            .get(container.as_str())
            .into_iter()
            .flatten()
            .find(|start| **start > *written)
        {
            found.push(violation(
                "left-by-del",
                format!(
                    "a DEL of {container} that began at {del} ms answered success, but left {key} (written at {written} ms)"
                ),
            ));
        }
    }
    found
}

/// How the records in `snapshot` disagree among themselves: an address
/// record that its attachment (or its workload's hold) does not list
/// (leaked), an address an attachment or hold lists with no record naming
/// it (lost).
pub fn inconsistencies(snapshot: &Snapshot, rules: &Rules) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut holders: Vec<(&str, Value)> = Vec::new();
    for (key, (value, _)) in snapshot {
        if matches!(rules.key(key), Key::Attachment { .. } | Key::Hold(_)) {
            holders.push((key, json(value)));
        }
    }
    for (key, holder) in &holders {
        for address in listed(holder) {
            let record = snapshot
                .get(&format!(
                    "{}addresses/{}",
                    rules.network,
                    key_name(&address)
                ))
                .map(|(v, _)| json(v));
            if !record.as_ref().is_some_and(|r| names(r, holder)) {
                found.push(violation(
                    "lost",
                    format!(
                        "lost: {key} lists {address}, whose record is {}",
                        record.map_or("missing".to_owned(), |r| r.to_string())
                    ),
                ));
            }
        }
    }
    for (key, (value, _)) in snapshot {
        let Key::Address(address) = rules.key(key) else {
            continue;
        };
        let record = json(value);
        if cools(&record) {
            continue;
        }
        let listed_by = holders.iter().any(|(k, holder)| {
            names(&record, holder)
                // A workload's addresses are its hold's; its container's
                // record lists them too.
                && (text(&record, "workload").is_empty() || matches!(rules.key(k), Key::Hold(_)))
                && listed(holder).iter().any(|a| key_name(a) == address)
        });
        if !listed_by {
            found.push(violation(
                "leaked",
                format!("leaked: {address}'s record ({record}) is listed by no attachment or hold"),
            ));
        }
    }
    found
}

/// The containers whose attachment records are in `snapshot`, each with
/// the addresses it lists.
pub fn attachments(snapshot: &Snapshot, rules: &Rules) -> BTreeMap<String, Vec<String>> {
    snapshot
        .iter()
        .filter_map(|(key, (value, _))| match rules.key(key) {
            Key::Attachment { id, .. } => Some((id.to_owned(), listed(&json(value)))),
            _ => None,
        })
        .collect()
}

/// When the attachment record of `container` in `snapshot` says it was
/// made, seconds since the epoch by its node's clock.
pub fn made(snapshot: &Snapshot, rules: &Rules, container: &str) -> Option<u64> {
    snapshot
        .iter()
        .find_map(|(key, (value, _))| match rules.key(key) {
            Key::Attachment { id, .. } if id == container => json(value)["since"].as_u64(),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Operation;
    use serde_json::json;

    fn rules() -> Rules {
        Rules {
            network: "/p/networks/n/".into(),
            nodes: "/p/nodes/".into(),
            dead_for: 4_000,
            dead_for_slack: 1_000,
            sticky_for: 20_000,
            sticky_slack: 2_000,
            sticky_early: 2_000,
            reuse_after: 0,
            cooldown_early: 1_000,
            full: Vec::new(),
            cooldown_longest: 60_000,
        }
    }

    /// The rules of a run whose addresses cool down for 3 s, etcd full
    /// from 100 s to 110 s.
    fn cooling_rules() -> Rules {
        Rules {
            reuse_after: 3_000,
            full: vec![(100_000, 110_000)],
            ..rules()
        }
    }

    /// `id`'s release of `address` at `revision`, cooling it down.
    fn release_cooling(revision: u64, at: u64, node: &str, id: &str, address: &str) -> Vec<Change> {
        vec![
            del(
                revision,
                at,
                &format!("/p/networks/n/nodes/{node}/attachments/{id}:eth0"),
            ),
            put(
                revision,
                at,
                &format!("/p/networks/n/addresses/{}", key_name(address)),
                json!({"coolingUntil": 1_800_000_004u64, "freed": 1_800_000_000u64, "pool": "a"}),
            ),
        ]
    }

    #[test]
    fn an_address_cools_down_for_reuse_after_then_is_claimed_again() {
        let key = format!("/p/networks/n/addresses/{}", key_name("10.0.0.2"));
        let changes = [
            claim(2, 10, "n1", "a", "10.0.0.2"),
            release_cooling(3, 1_000, "n1", "a", "10.0.0.2"),
            vec![del(4, 4_500, &key)],
            claim(5, 4_600, "n2", "b", "10.0.0.2"),
        ]
        .concat();
        let rules = cooling_rules();
        assert_eq!(judge(&changes, &rules, &none(), &never, 5_000), []);
        assert_eq!(cooldowns(&changes, &rules), 1);
        // Not a leak, in the store as it is meanwhile.
        let snapshot: Snapshot = [(key.clone(), (changes[3].value.clone().unwrap(), 3))].into();
        assert_eq!(inconsistencies(&snapshot, &rules), []);
    }

    #[test]
    fn an_address_given_while_cooling_or_cooled_too_briefly_or_not_at_all_is_a_violation() {
        let key = format!("/p/networks/n/addresses/{}", key_name("10.0.0.2"));
        let rules = cooling_rules();
        // Claimed over its cooldown.
        let changes = [
            claim(2, 10, "n1", "a", "10.0.0.2"),
            release_cooling(3, 1_000, "n1", "a", "10.0.0.2"),
            claim(4, 2_000, "n2", "b", "10.0.0.2"),
        ]
        .concat();
        let found = judge(&changes, &rules, &none(), &never, 5_000);
        assert_eq!(kinds(&found), ["cooldown"], "{found:?}");
        // Its cooldown ended a second early, slack included.
        let changes = [
            claim(2, 10, "n1", "a", "10.0.0.2"),
            release_cooling(3, 1_000, "n1", "a", "10.0.0.2"),
            vec![del(4, 2_900, &key)],
        ]
        .concat();
        let found = judge(&changes, &rules, &none(), &never, 5_000);
        assert_eq!(kinds(&found), ["cooldown"], "{found:?}");
        // Its cooldown never ended (a put without its lease).
        let changes = [
            claim(2, 10, "n1", "a", "10.0.0.2"),
            release_cooling(3, 1_000, "n1", "a", "10.0.0.2"),
        ]
        .concat();
        assert_eq!(judge(&changes, &rules, &none(), &never, 61_000), []);
        let found = judge(&changes, &rules, &none(), &never, 61_001);
        assert_eq!(kinds(&found), ["cooldown"], "{found:?}");
        // Given back with none, but while etcd was full.
        for (at, kinds_found) in [(50_000, vec!["uncooled"]), (105_000, vec![])] {
            let changes = [
                claim(2, 10, "n1", "a", "10.0.0.2"),
                release(3, at, "n1", "a", "10.0.0.2"),
            ]
            .concat();
            let found = judge(&changes, &rules, &none(), &never, 200_000);
            assert_eq!(kinds(&found), kinds_found, "{found:?}");
        }
    }

    fn put(revision: u64, at: u64, key: &str, value: Value) -> Change {
        Change {
            revision,
            key: key.into(),
            value: Some(value.to_string().into_bytes()),
            at,
        }
    }

    fn del(revision: u64, at: u64, key: &str) -> Change {
        Change {
            revision,
            key: key.into(),
            value: None,
            at,
        }
    }

    /// A claim of `address` by container `id` on `node`, at `revision`.
    fn claim(revision: u64, at: u64, node: &str, id: &str, address: &str) -> Vec<Change> {
        vec![
            put(
                revision,
                at,
                &format!("/p/networks/n/nodes/{node}/attachments/{id}:eth0"),
                json!({"containerID": id, "ifname": "eth0", "node": node,
                       "addresses": [{"pool": "a", "address": address}]}),
            ),
            put(
                revision,
                at,
                &format!("/p/networks/n/addresses/{}", key_name(address)),
                json!({"containerID": id, "ifname": "eth0", "node": node, "pool": "a"}),
            ),
        ]
    }

    fn release(revision: u64, at: u64, node: &str, id: &str, address: &str) -> Vec<Change> {
        vec![
            del(
                revision,
                at,
                &format!("/p/networks/n/nodes/{node}/attachments/{id}:eth0"),
            ),
            del(
                revision,
                at,
                &format!("/p/networks/n/addresses/{}", key_name(address)),
            ),
        ]
    }

    fn kinds(found: &[Violation]) -> Vec<&str> {
        found.iter().map(|v| v.kind).collect()
    }

    fn never(_: Option<&str>, _: u64, _: u64) -> bool {
        false
    }

    fn none() -> History {
        History::default()
    }

    #[test]
    fn addresses_are_named_as_their_keys_sort() {
        assert_eq!(key_name("10.0.0.2"), "010.000.000.002");
        assert_eq!(
            key_name("fd00::1"),
            "fd00:0000:0000:0000:0000:0000:0000:0001"
        );
    }

    #[test]
    fn an_address_claimed_again_after_its_release_is_no_violation() {
        let changes = [
            claim(2, 10, "n1", "a", "10.0.0.2"),
            release(3, 20, "n1", "a", "10.0.0.2"),
            claim(4, 30, "n2", "b", "10.0.0.2"),
        ]
        .concat();
        assert_eq!(judge(&changes, &rules(), &none(), &never, 40), []);
    }

    #[test]
    fn an_address_record_written_over_anothers_is_doubled() {
        let changes = [
            claim(2, 10, "n1", "a", "10.0.0.2"),
            claim(3, 20, "n2", "b", "10.0.0.2"),
        ]
        .concat();
        let found = judge(&changes, &rules(), &none(), &never, 40);
        assert_eq!(kinds(&found), ["doubled"], "{found:?}");
        assert!(found[0].what.contains("010.000.000.002"));
    }

    #[test]
    fn an_attachment_listing_anothers_address_is_doubled_and_one_without_a_record_lost() {
        let mut changes = claim(2, 10, "n1", "a", "10.0.0.2");
        changes.push(put(
            3,
            20,
            "/p/networks/n/nodes/n2/attachments/b:eth0",
            json!({"containerID": "b", "ifname": "eth0", "node": "n2",
                   "addresses": [{"pool": "a", "address": "10.0.0.2"}]}),
        ));
        changes.push(put(
            4,
            30,
            "/p/networks/n/nodes/n2/attachments/c:eth0",
            json!({"containerID": "c", "ifname": "eth0", "node": "n2",
                   "addresses": [{"pool": "a", "address": "10.0.0.3"}]}),
        ));
        assert_eq!(
            kinds(&judge(&changes, &rules(), &none(), &never, 40)),
            ["doubled", "lost"]
        );
    }

    #[test]
    fn a_claim_while_the_nodes_fence_stands_is_flagged_seen_or_not() {
        let fence = "/p/nodes/n1/fenced";
        let changes = [
            vec![
                put(1, 0, "/p/nodes/n1/alive", json!({})),
                del(2, 1_000, "/p/nodes/n1/alive"),
            ],
            claim(3, 5_500, "n1", "before", "10.0.0.2"),
            vec![put(4, 6_000, fence, json!({"node": "n1"}))],
            claim(5, 6_010, "n1", "through", "10.0.0.3"),
            claim(6, 6_020, "n2", "elsewhere", "10.0.0.4"),
            vec![del(7, 9_000, fence)],
            claim(8, 9_010, "n1", "after", "10.0.0.5"),
        ]
        .concat();
        let found = judge(&changes, &rules(), &none(), &never, 10_000);
        assert_eq!(kinds(&found), ["through-fence", "through-fence"]);
        assert!(
            found.iter().all(|v| v.what.contains("through")),
            "{found:?}"
        );
        // A sticky claim takes over its workload's hold: the hold's write
        // is the claim.
        let hold = put(
            5,
            6_010,
            "/p/networks/n/holds/db%2Fw:eth0",
            json!({"workload": "db/w", "ifname": "eth0", "node": "n1", "containerID": "x",
                   "addresses": [], "stickyFor": 20}),
        );
        let mut sticky = changes[..5].to_vec();
        sticky.push(hold);
        assert_eq!(
            kinds(&judge(&sticky, &rules(), &none(), &never, 10_000)),
            ["through-fence"]
        );
    }

    #[test]
    fn a_fence_sooner_than_dead_for_or_of_a_registered_node_is_flagged() {
        let fence = |revision, at| put(revision, at, "/p/nodes/n1/fenced", json!({}));
        let gone = [
            put(1, 0, "/p/nodes/n1/alive", json!({})),
            del(2, 10_000, "/p/nodes/n1/alive"),
        ];
        // 4 s less the slack after its registration went: in time.
        let on_time = [gone.to_vec(), vec![fence(3, 13_000)]].concat();
        assert_eq!(judge(&on_time, &rules(), &none(), &never, 20_000), []);
        let early = [gone.to_vec(), vec![fence(3, 12_500)]].concat();
        assert_eq!(
            kinds(&judge(&early, &rules(), &none(), &never, 20_000)),
            ["early-fence"]
        );
        let registered = [gone[..1].to_vec(), vec![fence(3, 12_500)]].concat();
        let found = judge(&registered, &rules(), &none(), &never, 20_000);
        assert!(found[0].what.contains("while registered"), "{found:?}");
        // A fence written again over itself is not a new one.
        let again = [on_time.clone(), vec![fence(4, 13_001)]].concat();
        assert_eq!(judge(&again, &rules(), &none(), &never, 20_000), []);
    }

    #[test]
    fn a_released_hold_kept_past_a_gc_after_its_time_is_flagged() {
        let key = "/p/networks/n/holds/db%2Fw:eth0";
        let released = |revision, at| {
            put(
                revision,
                at,
                key,
                json!({"workload": "db/w", "ifname": "eth0", "node": "n1", "containerID": null,
                       "until": 100, "addresses": [], "stickyFor": 20}),
            )
        };
        // Released at 1 s: its time is up at 21 s, and 22 s leaves a
        // second for the clock's whole seconds.
        let gc_at = |start: u64, status: Option<i32>| History {
            operations: vec![Operation {
                status,
                end: start + 100,
                ..op("GC", "", start, &[])
            }],
            events: vec![],
        };
        let swept = gc_at(22_000, Some(0));
        let ended_by_it = [released(2, 1_000), del(3, 23_000, key)];
        assert_eq!(judge(&ended_by_it, &rules(), &swept, &never, 60_000), []);
        let kept = [released(2, 1_000), del(3, 32_000, key)];
        assert_eq!(
            kinds(&judge(&kept, &rules(), &swept, &never, 60_000)),
            ["sticky"]
        );
        // Never ended: judged at the end.
        let forever = [released(2, 1_000)];
        assert_eq!(
            kinds(&judge(&forever, &rules(), &swept, &never, 60_000)),
            ["sticky"]
        );
        // No GC that could have ended it: a GC too soon, one that failed
        // or was killed, or none at all (a quorum lost, the runtimes busy
        // with DELs).
        for history in [
            gc_at(21_500, Some(0)),
            gc_at(22_000, Some(1)),
            gc_at(22_000, None),
            none(),
        ] {
            assert_eq!(judge(&kept, &rules(), &history, &never, 60_000), []);
        }
        // Released by a node whose clock was skewed, or swept by one: the
        // times it went by were wrong.
        let releaser = |node: Option<&str>, from: u64, _: u64| node == Some("n1") && from == 1_000;
        assert_eq!(judge(&kept, &rules(), &swept, &releaser, 60_000), []);
        let mut elsewhere = gc_at(22_000, Some(0));
        elsewhere.operations[0].node = "n2".into();
        let sweeper = |node: Option<&str>, from: u64, _: u64| node == Some("n2") && from == 22_000;
        assert_eq!(judge(&kept, &rules(), &elsewhere, &sweeper, 60_000), []);
    }

    #[test]
    fn a_released_hold_ended_early_or_taken_over_with_other_addresses_is_flagged() {
        let key = "/p/networks/n/holds/db%2Fw:eth0";
        let hold = |revision, at, container: Value, address: &str| {
            put(
                revision,
                at,
                key,
                json!({"workload": "db/w", "ifname": "eth0", "node": "n1", "containerID": container,
                       "until": 100, "addresses": [{"pool": "a", "address": address}], "stickyFor": 20}),
            )
        };
        let released = hold(2, 1_000, Value::Null, "10.0.0.2");
        let back = [released.clone(), hold(3, 5_000, json!("c2"), "10.0.0.2")];
        assert_eq!(judge(&back, &rules(), &none(), &never, 10_000), []);
        let moved = [released.clone(), hold(3, 5_000, json!("c2"), "10.0.0.3")];
        assert_eq!(
            kinds(&judge(&moved, &rules(), &none(), &never, 10_000)),
            ["sticky"]
        );
        // Released by a DEL that began at 500 ms and landed late: counted
        // from its start.
        let bound = hold(1, 100, json!("c1"), "10.0.0.2");
        let late = [bound, released.clone(), del(3, 18_500, key)];
        let history = History {
            operations: vec![op("DEL", "c1", 500, &[])],
            events: vec![],
        };
        assert_eq!(judge(&late, &rules(), &history, &never, 30_000), []);
        assert_eq!(
            kinds(&judge(&late, &rules(), &none(), &never, 30_000)),
            ["sticky"]
        );
        let in_time = [released.clone(), del(3, 19_500, key)];
        assert_eq!(judge(&in_time, &rules(), &none(), &never, 30_000), []);
        let early = [released.clone(), del(3, 18_000, key)];
        assert_eq!(
            kinds(&judge(&early, &rules(), &none(), &never, 30_000)),
            ["sticky"]
        );
        // Ended by a node whose clock was ahead meanwhile.
        let ahead = |node: Option<&str>, _: u64, to: u64| node.is_none() && to == 18_000;
        assert_eq!(judge(&early, &rules(), &none(), &ahead, 30_000), []);
        // Ended by reclaim, with the fence of the node that released it.
        let reclaimed = [
            released,
            del(3, 18_000, key),
            put(3, 18_000, "/p/nodes/n1/fenced", json!({})),
        ];
        assert_eq!(judge(&reclaimed, &rules(), &none(), &never, 30_000), []);
    }

    fn op(command: &str, container: &str, start: u64, addresses: &[&str]) -> Operation {
        Operation {
            node: "n1".into(),
            command: command.into(),
            container: container.into(),
            workload: None,
            start,
            end: start + 5,
            status: Some(0),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            said: String::new(),
        }
    }

    #[test]
    fn an_add_answering_an_address_its_records_never_listed_is_flagged() {
        let changes = claim(2, 10, "n1", "a", "10.0.0.2");
        let history = History {
            operations: vec![
                op("ADD", "a", 0, &["10.0.0.2"]),
                op("ADD", "b", 0, &["10.0.0.3"]),
            ],
            events: vec![],
        };
        let found = unrecorded_answers(&history, &changes, &rules());
        assert_eq!(kinds(&found), ["unrecorded"]);
        assert!(found[0].what.contains("ADD of b"));
    }

    fn snapshot_of(changes: &[Change]) -> Snapshot {
        changes
            .iter()
            .filter_map(|c| Some((c.key.clone(), (c.value.clone()?, c.revision))))
            .collect()
    }

    #[test]
    fn a_record_left_by_a_successful_del_is_flagged_unless_written_after_it_began() {
        // a's DEL began after its claim landed: it should have freed it.
        // b's claim landed after its DEL began (an ADD killed alone, its
        // delegate finishing): the next DEL's or GC's.
        let changes = [
            claim(2, 10, "n1", "a", "10.0.0.2"),
            claim(3, 120, "n1", "b", "10.0.0.3"),
        ]
        .concat();
        let history = History {
            operations: vec![op("DEL", "a", 50, &[]), op("DEL", "b", 100, &[])],
            events: vec![],
        };
        let found = left_by_dels(&snapshot_of(&changes), &changes, &history, &rules());
        assert_eq!(kinds(&found), ["left-by-del", "left-by-del"]);
        assert!(found.iter().all(|v| v.what.contains("DEL of a")));
    }

    #[test]
    fn records_that_disagree_are_leaked_or_lost() {
        let hold = json!({"workload": "db/w", "ifname": "eth0", "node": "n1", "containerID": null,
                          "until": 100, "addresses": [{"pool": "a", "address": "10.0.0.5"}], "stickyFor": 20});
        let consistent = [
            claim(2, 10, "n1", "a", "10.0.0.2"),
            vec![
                put(3, 20, "/p/networks/n/holds/db%2Fw:eth0", hold),
                put(
                    3,
                    20,
                    "/p/networks/n/addresses/010.000.000.005",
                    json!({"workload": "db/w", "ifname": "eth0", "node": "n1", "pool": "a"}),
                ),
            ],
        ]
        .concat();
        assert_eq!(inconsistencies(&snapshot_of(&consistent), &rules()), []);
        // An address record whose attachment is gone; a workload's whose
        // hold is gone; an attachment whose address record is gone.
        let mut broken = snapshot_of(&consistent);
        broken.remove("/p/networks/n/nodes/n1/attachments/a:eth0");
        broken.remove("/p/networks/n/holds/db%2Fw:eth0");
        let claimed = claim(4, 30, "n1", "c", "10.0.0.7");
        broken.insert(
            claimed[0].key.clone(),
            (claimed[0].value.clone().unwrap(), 4),
        );
        let found = inconsistencies(&broken, &rules());
        assert_eq!(kinds(&found), ["lost", "leaked", "leaked"], "{found:?}");
        assert_eq!(
            attachments(&broken, &rules()),
            [("c".to_owned(), vec!["10.0.0.7".to_owned()])].into()
        );
        assert_eq!(made(&snapshot_of(&consistent), &rules(), "a"), None);
    }
}
