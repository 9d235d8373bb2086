//! What an ADD and a DEL on etcd cost the cluster, in requests counted by
//! a proxy in front of a member, and that the node's notes that make them
//! cheap are only hints: a guess gone stale, an address another node
//! took, a fence, an ADD repeated, a pool exhausted, a note stale or
//! missing each costs round trips, never a doubled or a leaked address.
//!
//! Ignored unless asked for with --include-ignored (./.ci/test installs
//! etcd-server and does).

use std::path::Path;

use crate::common::etcd::{Cluster, Counting};
use crate::common::temp_dir;
use crate::operating::{self, add, cni, del, PREFIX};
use serde_json::{json, Value};

/// Network "pods" (10.70.0.2 to .14) on the cluster through `proxy`, as
/// node `node`, with its notes under `notes`.
fn pods(proxy: &Counting, node: &str, notes: &Path) -> String {
    let store = json!({
        "etcd": {"endpoints": [proxy.endpoint()], "prefix": PREFIX, "timeout": 5},
        "dataDir": notes,
    });
    operating::pods(&store, node, json!({}))
}

/// The requests `work` makes through `proxy`.
fn counted(proxy: &Counting, work: impl FnOnce()) -> usize {
    let before = proxy.requests();
    work();
    proxy.requests() - before
}

/// Every address record of "pods": address → container.
fn holders(cluster: &Cluster) -> Vec<(String, String)> {
    let prefix = format!("{PREFIX}/networks/pods/addresses/");
    cluster
        .values(&prefix)
        .into_iter()
        .map(|(key, value)| {
            let record: Value = serde_json::from_str(&value).unwrap();
            let address = key[prefix.len()..].to_owned();
            (address, record["containerID"].as_str().unwrap().to_owned())
        })
        .collect()
}

/// The attachments of "pods", every node's.
fn attachments(cluster: &Cluster) -> Vec<String> {
    let prefix = format!("{PREFIX}/networks/pods/nodes/");
    let mut found: Vec<String> = cluster
        .keys(&prefix)
        .into_iter()
        .filter(|key| key.contains("/attachments/"))
        .collect();
    found.sort();
    found
}

#[test]
#[ignore = "needs etcd-server"]
fn a_guessed_add_is_one_request_and_a_noted_del_one_and_without_notes_two() {
    let cluster = Cluster::start(1, None);
    let proxy = Counting::to(&cluster.endpoints()[0]);
    let notes = temp_dir("trips-notes");
    let config = pods(&proxy, "node-a", notes.path());
    // The first ADD has nothing to guess from: it reads.
    let first = counted(&proxy, || assert_eq!(add(&config, "c0", ""), "10.70.0.2"));
    assert!((2..=4).contains(&first), "{first} requests");
    for n in 1..=4 {
        let trips = counted(&proxy, || {
            assert_eq!(
                add(&config, &format!("c{n}"), ""),
                format!("10.70.0.{}", n + 2)
            );
        });
        assert_eq!(trips, 1, "ADD c{n}: one claim, nothing read");
    }
    for n in 0..=2 {
        let trips = counted(&proxy, || del(&config, &format!("c{n}")));
        assert_eq!(trips, 1, "DEL c{n}: one release, nothing read");
    }
    // A node whose notes are gone: the DEL reads the attachment, then
    // releases; the ADD reads, and guesses again after.
    std::fs::remove_dir_all(notes.path().join("etcd")).unwrap();
    assert_eq!(counted(&proxy, || del(&config, "c3")), 2);
    let unguessed = counted(&proxy, || {
        add(&config, "c5", "");
    });
    assert!(unguessed >= 2, "{unguessed}");
    assert_eq!(
        counted(&proxy, || {
            add(&config, "c6", "");
        }),
        1
    );
    // A DEL of what holds nothing: one read.
    assert_eq!(counted(&proxy, || del(&config, "none")), 1);
    let mut held: Vec<String> = holders(&cluster).into_iter().map(|(_, c)| c).collect();
    held.sort();
    assert_eq!(held, ["c4", "c5", "c6"], "{held:?}");
}

#[test]
#[ignore = "needs etcd-server"]
fn a_guess_another_node_took_costs_one_request_more_and_two_nodes_never_share_one() {
    let cluster = Cluster::start(1, None);
    let proxy = Counting::to(&cluster.endpoints()[0]);
    let (notes_a, notes_b) = (temp_dir("trips-a"), temp_dir("trips-b"));
    let (a, b) = (
        pods(&proxy, "node-a", notes_a.path()),
        pods(&proxy, "node-b", notes_b.path()),
    );
    assert_eq!(add(&a, "a0", ""), "10.70.0.2");
    // Node b takes .3, which node a guesses next.
    assert_eq!(add(&b, "b0", "IgnoreUnknown=1;IP=10.70.0.3"), "10.70.0.3");
    let mut given = String::new();
    let trips = counted(&proxy, || given = add(&a, "a1", ""));
    assert_eq!(trips, 2, "the claim, then one of the page it read");
    assert!(!["10.70.0.2", "10.70.0.3"].contains(&given.as_str()));
    // Both nodes at once, each guessing: no address twice, none left
    // over after the DELs.
    let run = |config: String, node: &'static str| {
        std::thread::spawn(move || {
            (0..5)
                .map(|n| add(&config, &format!("{node}-{n}"), ""))
                .collect::<Vec<String>>()
        })
    };
    let (ta, tb) = (run(a.clone(), "ra"), run(b.clone(), "rb"));
    let mut answered = ta.join().unwrap();
    answered.extend(tb.join().unwrap());
    answered.extend([given, "10.70.0.2".into(), "10.70.0.3".into()]);
    answered.sort();
    answered.dedup();
    assert_eq!(
        answered.len(),
        13,
        "an address answered twice: {answered:?}"
    );
    // Thirteen records, each naming a container of its own.
    let held = holders(&cluster);
    let mut containers: Vec<&String> = held.iter().map(|(_, c)| c).collect();
    containers.sort();
    containers.dedup();
    assert_eq!((held.len(), containers.len()), (13, 13), "{held:?}");
    assert_eq!(attachments(&cluster).len(), 13);
    for n in 0..5 {
        del(&a, &format!("ra-{n}"));
        del(&b, &format!("rb-{n}"));
    }
    for (config, id) in [(&a, "a0"), (&a, "a1"), (&b, "b0")] {
        del(config, id);
    }
    assert!(holders(&cluster).is_empty() && attachments(&cluster).is_empty());
}

#[test]
#[ignore = "needs etcd-server"]
fn a_fence_a_repeated_add_and_an_exhausted_pool_are_answered_as_ever() {
    let cluster = Cluster::start(1, None);
    let proxy = Counting::to(&cluster.endpoints()[0]);
    let notes = temp_dir("trips-fence");
    let config = pods(&proxy, "node-a", notes.path());
    let first = add(&config, "c0", "");
    // Repeated: the same answer, from the attachment the failed claim
    // found: the claim, then the attachment's read and its address's,
    // and no other claim.
    let repeated = counted(&proxy, || assert_eq!(add(&config, "c0", ""), first));
    assert_eq!(repeated, 3);
    assert_eq!(holders(&cluster).len(), 1);
    // Fenced after the node guessed: the claim meets the fence.
    let fence = json!({"at": 1_700_000_000u64});
    cluster.put(&format!("{PREFIX}/nodes/node-a/fenced"), &fence.to_string());
    let error = cni("ADD", &config, "c1", "").assert_error(50);
    assert!(error["msg"].as_str().unwrap().contains("fenced"), "{error}");
    // An ADD repeated answers what the attachment holds, fenced or not.
    assert_eq!(add(&config, "c0", ""), first);
    cluster.etcdctl(&["del", &format!("{PREFIX}/nodes/node-a/fenced")]);
    // .2 to .14: 13 addresses, one held.
    for n in 1..13 {
        add(&config, &format!("c{n}"), "");
    }
    cni("ADD", &config, "c13", "").assert_error(110);
    let held = holders(&cluster);
    let mut addresses: Vec<&String> = held.iter().map(|(a, _)| a).collect();
    addresses.dedup();
    assert_eq!(addresses.len(), 13);
}

#[test]
#[ignore = "needs etcd-server"]
fn a_stale_note_never_frees_what_the_attachment_no_longer_holds() {
    let cluster = Cluster::start(1, None);
    let proxy = Counting::to(&cluster.endpoints()[0]);
    let (here, elsewhere) = (temp_dir("trips-here"), temp_dir("trips-elsewhere"));
    let noting = pods(&proxy, "node-a", here.path());
    // The same node, without those notes (another process's dataDir).
    let other = pods(&proxy, "node-a", elsewhere.path());
    // Stale by one revision: the attachment's record written again as
    // it is. The noted DEL fails its compare; the DEL reads the record,
    // whose addresses are no longer at its revision, so the release
    // fails its compare too and releases them as it read them then.
    assert_eq!(add(&noting, "c1", ""), "10.70.0.2");
    let key = attachments(&cluster).pop().unwrap();
    let record = cluster.values(&key).pop().unwrap().1;
    cluster.put(&key, &record);
    assert_eq!(counted(&proxy, || del(&noting, "c1")), 4);
    assert!(holders(&cluster).is_empty() && attachments(&cluster).is_empty());
    // Released and claimed again by another process: c2 now holds the .3
    // that the note lists for c1, and c1 holds .2. The DEL frees c1's .2,
    // never c2's .3.
    assert_eq!(add(&noting, "c1", ""), "10.70.0.3");
    del(&other, "c1");
    assert_eq!(
        add(&other, "c2", "IgnoreUnknown=1;IP=10.70.0.3"),
        "10.70.0.3"
    );
    assert_eq!(
        add(&other, "c1", "IgnoreUnknown=1;IP=10.70.0.2"),
        "10.70.0.2"
    );
    // The note says c1 holds .3 (now c2's), at a revision gone.
    del(&noting, "c1");
    let held = holders(&cluster);
    assert_eq!(held, [("010.070.000.003".into(), "c2".into())], "{held:?}");
    assert_eq!(attachments(&cluster).len(), 1);
    del(&other, "c2");
    assert!(holders(&cluster).is_empty());
}

#[test]
#[ignore = "needs etcd-server"]
fn a_note_that_a_rebuilt_etcd_reaches_again_frees_nothing_of_another() {
    let mut cluster = Cluster::start(1, None);
    let proxy = Counting::to(&cluster.endpoints()[0]);
    let notes = temp_dir("trips-rebuilt");
    let noting = pods(&proxy, "node-a", notes.path());
    // c1 holds .2, noted at the claim's revision.
    assert_eq!(add(&noting, "c1", ""), "10.70.0.2");
    let noted = cluster.revision();
    let c1_key = attachments(&cluster).pop().unwrap();
    assert!(c1_key.ends_with("/c1:eth0"), "{c1_key}");
    let c1 = cluster.values(&c1_key).pop().unwrap().1;
    let address = |last: u8| format!("{PREFIX}/networks/pods/addresses/010.070.000.{last:03}");
    let two = cluster.values(&address(2)).pop().unwrap().1;
    // Rebuilt at the same endpoints, etcd counts its revisions again. At
    // the noted revision, one transaction (an import's) writes c1 holding
    // .5, and c7 holding the .2 that the note lists for c1: the
    // attachment's and the address's records are both at the noted
    // revision, as the claim left them, but hold another claim.
    cluster.rebuild();
    while cluster.revision() < noted - 1 {
        cluster.put("/elsewhere", "a write of another tenant");
    }
    let to_c7 = |text: &str| text.replace("\"c1\"", "\"c7\"");
    cluster.put_all(&[
        (c1_key.clone(), c1.replace("10.70.0.2", "10.70.0.5")),
        (address(5), two.clone()),
        (c1_key.replace("/c1:", "/c7:"), to_c7(&c1)),
        (address(2), to_c7(&two)),
    ]);
    assert_eq!(cluster.revision(), noted);
    // The note's compare fails on the record's bytes; the DEL reads what
    // c1 holds now and frees .5, never c7's .2: the noted release, the
    // read and the release as read, with no second try of the note.
    assert_eq!(counted(&proxy, || del(&noting, "c1")), 3);
    let held = holders(&cluster);
    assert_eq!(held, [("010.070.000.002".into(), "c7".into())], "{held:?}");
    assert_eq!(attachments(&cluster).len(), 1);
}

#[test]
#[ignore = "needs etcd-server"]
fn in_a_pool_held_all_but_every_tenth_address_a_page_read_once_guesses_the_next_adds() {
    let cluster = Cluster::start(1, None);
    let proxy = Counting::to(&cluster.endpoints()[0]);
    let notes = temp_dir("trips-tenth");
    let config = pods(&proxy, "node-a", notes.path()).replace("10.70.0.0/28", "10.70.0.0/24");
    let other = json!({"containerID": "other", "ifname": "eth0", "node": "node-b",
        "pool": "pods", "since": 0});
    let taken: Vec<(String, String)> = (2..255u32)
        .filter(|n| n % 10 != 0)
        .map(|n| {
            let key = format!("{PREFIX}/networks/pods/addresses/010.070.000.{n:03}");
            (key, other.to_string())
        })
        .collect();
    cluster.put_all(&taken);
    // The first ADD reads; the second's guess (just after the first) is
    // taken, and its failed claim reads a page; the next ones claim what
    // that page showed free, one request each.
    let mut given = vec![add(&config, "c0", "")];
    let mut trips = Vec::new();
    for n in 1..8 {
        trips.push(counted(&proxy, || {
            given.push(add(&config, &format!("c{n}"), ""))
        }));
    }
    assert_eq!(trips[0], 2, "{trips:?}");
    assert!(
        trips[1..].iter().filter(|t| **t == 1).count() >= 5,
        "{trips:?}"
    );
    for address in &given {
        let last: u32 = address.rsplit('.').next().unwrap().parse().unwrap();
        assert_eq!(last % 10, 0, "{address} was free: {given:?}");
    }
    let mut distinct = given.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), given.len(), "{given:?}");
}

/// The names of the node's notes of claims under `notes`, read from the
/// directory itself.
fn claim_notes(notes: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for node in std::fs::read_dir(notes.join("etcd")).unwrap() {
        for entry in std::fs::read_dir(node.unwrap().path()).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.starts_with("claim-") {
                found.push(name);
            }
        }
    }
    found.sort();
    found
}

#[test]
#[ignore = "needs etcd-server"]
fn notes_of_attachments_released_elsewhere_go_at_a_gc_once_as_old_as_its_grace() {
    let cluster = Cluster::start(1, None);
    let proxy = Counting::to(&cluster.endpoints()[0]);
    let notes = temp_dir("trips-gc");
    let store = |data: Option<&Path>, grace: u64| {
        let mut store = json!({
            "etcd": {"endpoints": [proxy.endpoint()], "prefix": PREFIX, "timeout": 5},
        });
        if let Some(data) = data {
            store["dataDir"] = json!(data);
        }
        operating::pods(&store, "node-a", json!({"gcGraceSeconds": grace}))
    };
    let (node, young) = (store(Some(notes.path()), 1), store(Some(notes.path()), 60));
    for id in ["c1", "c2", "c3"] {
        add(&node, id, "");
    }
    let noted = ["claim-c1:eth0", "claim-c2:eth0", "claim-c3:eth0"];
    assert_eq!(claim_notes(notes.path()), noted);
    // Released where the node's notes are not: the node's DEL never
    // comes, and the notes would stay.
    let elsewhere = store(None, 0);
    del(&elsewhere, "c1");
    del(&elsewhere, "c2");
    assert_eq!(attachments(&cluster).len(), 1);
    assert_eq!(claim_notes(notes.path()), noted);
    let gc = |config: &str| {
        let mut gc: Value = serde_json::from_str(config).unwrap();
        gc["cni.dev/valid-attachments"] = json!([{"containerID": "c3", "ifname": "eth0"}]);
        cni("GC", &gc.to_string(), "", "").assert_silent_success();
    };
    // Younger than the grace, a note may be an ADD's that finished after
    // the store was read: it stays.
    gc(&young);
    assert_eq!(claim_notes(notes.path()), noted);
    // As old as the grace, those of attachments the store no longer holds
    // go; the live attachment's stays, and its DEL is still one request.
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    gc(&node);
    assert_eq!(claim_notes(notes.path()), ["claim-c3:eth0"]);
    assert_eq!(counted(&proxy, || del(&node, "c3")), 1);
    assert!(claim_notes(notes.path()).is_empty());
    assert!(holders(&cluster).is_empty());
}
