//! The local store's own tests: holds, free records, GC, cooldowns.

use super::*;
use crate::cni::NetConf;
use crate::da_pool::search::choose_free;
use crate::da_pool::settings::Settings;
use crate::da_pool::teardown::gc;
use crate::da_pool::testing::{add_as, config, of_workload, owner, pools};
use crate::pools::Pool;
use serde_json::json;

fn addr(text: &str) -> Addr {
    Addr::new(text.parse().unwrap())
}

fn held(address: &str) -> Vec<PoolAddress> {
    vec![PoolAddress {
        pool: "blue".into(),
        address: addr(address),
    }]
}

/// A claim of `address` for workload `ns/w`'s container `id`, taking
/// over `prior`: the store trusts the caller that `prior`'s container
/// is gone.
fn claim_for_workload(store: &LocalStore, id: &str, address: &str, prior: Option<&WorkloadHold>) {
    let sticky = StickyClaim {
        workload: "ns/w",
        sticky_for: 3600,
        prior,
    };
    let owner = of_workload(id, "ns/w", "node-a");
    assert!(store.claim(&owner, &held(address), Some(&sticky)).unwrap());
}

fn hold(store: &LocalStore) -> WorkloadHold {
    store.workload_hold("ns/w", "eth0").unwrap().unwrap()
}

fn attachment(store: &LocalStore, id: &str) -> Allocation {
    store.allocation("node-a", id, "eth0").unwrap().unwrap()
}

fn holder_of(store: &LocalStore, address: &str) -> Option<Owner> {
    store
        .holder(addr(address))
        .unwrap()
        .and_then(Holder::into_owner)
}

#[test]
fn a_search_goes_on_past_a_full_window_since_nothing_is_noted_full() {
    // Forty addresses, all taken but one well past the first window.
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::create(dir.path(), "n").unwrap();
    let range = json!([{"subnet": "10.1.0.0/24",
        "rangeStart": "10.1.0.10", "rangeEnd": "10.1.0.49"}]);
    let pool = Pool::parse("blue", &range).unwrap();
    for n in (10..50).filter(|n| *n != 40) {
        let taken = held(&format!("10.1.0.{n}"));
        assert!(store.claim(&owner(&format!("c{n}")), &taken, None).unwrap());
    }
    for _ in 0..2 {
        let found = choose_free(&store, &pool, addr("10.1.0.10"), &[], true).unwrap();
        assert_eq!(found, addr("10.1.0.40"));
    }
}

#[test]
fn a_release_frees_the_hold_its_container_bound_and_leaves_one_bound_to_another() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::create(dir.path(), "n").unwrap();
    claim_for_workload(&store, "c1", "10.1.0.2", None);
    // Container c2 takes the hold over before c1's DEL (as on a
    // node whose runtime lost c1 without a DEL).
    claim_for_workload(&store, "c2", "10.1.0.2", Some(&hold(&store)));
    assert!(store.release(&attachment(&store, "c1")).unwrap());
    let bound = hold(&store);
    assert_eq!(bound.container.as_deref(), Some("c2"), "{bound:?}");
    assert_eq!(bound.until, None);
    // c2's DEL releases it: held for its hour from now, not from
    // when it was bound.
    let before = clock::now();
    assert!(store.release(&attachment(&store, "c2")).unwrap());
    let released = hold(&store);
    assert_eq!(released.container, None, "{released:?}");
    assert!(released.until >= Some(before + 3600), "{released:?}");
    // Kept for the workload, by no attachment.
    assert!(store.allocations().unwrap().is_empty());
    let keeper = holder_of(&store, "10.1.0.2").and_then(|o| o.workload);
    assert_eq!(keeper.as_deref(), Some("ns/w"));
}

#[test]
fn a_release_whose_workload_has_no_hold_any_more_gives_its_addresses_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::create(dir.path(), "n").unwrap();
    claim_for_workload(&store, "c1", "10.1.0.2", None);
    // Undone by a power loss, or removed by hand: nothing keeps the
    // address for the workload any more.
    let name = records::hold_name("ns/w", "eth0");
    std::fs::remove_file(dir.path().join("n").join(HOLDS).join(name)).unwrap();
    assert!(store.release(&attachment(&store, "c1")).unwrap());
    assert_eq!(holder_of(&store, "10.1.0.2"), None);
    assert!(store.allocations().unwrap().is_empty());
}

#[test]
fn an_address_is_freed_alone_only_while_its_holder_does_not_list_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::create(dir.path(), "n").unwrap();
    assert!(store.claim(&owner("c1"), &held("10.1.0.2"), None).unwrap());
    let address = addr("10.1.0.2");
    // In use by its holder; and not another's to free.
    assert!(!store.free_record(address, &owner("c1")).unwrap());
    assert!(!store.free_record(address, &owner("c2")).unwrap());
    assert!(holder_of(&store, "10.1.0.2").is_some());
    // The attachment's record gone, the address's left: freed.
    let name = records::attachment_name("c1", "eth0");
    std::fs::remove_file(dir.path().join("n").join(ATTACHMENTS).join(name)).unwrap();
    assert!(store.free_record(address, &owner("c1")).unwrap());
    assert_eq!(holder_of(&store, "10.1.0.2"), None);
}

#[test]
fn gc_frees_what_the_node_made_whatever_it_was_called_then() {
    // Made as node-a; collected as node-b (the name set in the
    // configuration since): every record here is this node's.
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::create(dir.path(), "n").unwrap();
    let raw = config("1.1.0", pools(), None);
    add_as(&store, &raw, &owner("gone"), &[]).unwrap();
    add_as(&store, &raw, &owner("live"), &[]).unwrap();
    let mut renamed = pools();
    renamed["node"] = json!("node-b");
    let raw = config("1.1.0", renamed, None);
    let mut settings = Settings::from_net(&NetConf::parse(&raw).unwrap()).unwrap();
    settings.gc_grace = 0;
    gc(&store, &[("live".into(), "eth0".into())], &settings).unwrap();
    let left: Vec<String> = store
        .allocations()
        .unwrap()
        .into_iter()
        .map(|a| a.owner.id)
        .collect();
    assert_eq!(left, ["live"]);
    // Its two addresses (one of each family) are all that is held.
    assert_eq!(store.address_records().unwrap().len(), 2);
}

/// A store whose addresses given back cool down for an hour.
fn cooling_store(dir: &std::path::Path) -> LocalStore {
    LocalStore::create(dir, "n").unwrap().cooling_for(3600)
}

fn two_addresses() -> Pool {
    let range = json!([{"subnet": "10.1.0.0/24",
        "rangeStart": "10.1.0.2", "rangeEnd": "10.1.0.3"}]);
    Pool::parse("blue", &range).unwrap()
}

#[test]
fn an_address_given_back_cools_down_and_is_given_to_no_one_meanwhile_restart_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let store = cooling_store(dir.path());
    assert!(store.claim(&owner("c1"), &held("10.1.0.2"), None).unwrap());
    let before = clock::now();
    assert!(store.release(&attachment(&store, "c1")).unwrap());
    let Some(Holder::Cooling(cooling)) = store.holder(addr("10.1.0.2")).unwrap() else {
        panic!("not cooling: {:?}", store.holder(addr("10.1.0.2")));
    };
    assert!(cooling.until >= before + 3600, "{cooling:?}");
    assert_eq!(cooling.pool.as_deref(), Some("blue"));
    // Nobody's: no record of a holder, and the operator's reports see it.
    assert!(store.address_records().unwrap().is_empty());
    let listed = store.cooling(addr("10.1.0.0"), addr("10.1.0.255")).unwrap();
    assert_eq!(listed, [(addr("10.1.0.2"), cooling.clone())]);
    // Only those from `from` to `to`, of their family.
    for (id, address) in [("c8", "10.1.0.8"), ("c9", "fd00::2"), ("c10", "10.1.0.1")] {
        assert!(store.claim(&owner(id), &held(address), None).unwrap());
        assert!(store.release(&attachment(&store, id)).unwrap());
    }
    let listed = store.cooling(addr("10.1.0.2"), addr("10.1.0.7")).unwrap();
    assert_eq!(listed, [(addr("10.1.0.2"), cooling.clone())]);
    let listed = store.cooling(addr("fd00::"), addr("fd00::ffff")).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    for address in ["10.1.0.8", "fd00::2", "10.1.0.1"] {
        assert!(store.end_cooling(addr(address)).unwrap());
    }
    // Opened again (a restart), the cooldown holds: not searched, not
    // claimed, and a pool with nothing else to give says why.
    drop(store);
    let store = cooling_store(dir.path());
    let pool = two_addresses();
    assert_eq!(
        choose_free(&store, &pool, addr("10.1.0.2"), &[], true).unwrap(),
        addr("10.1.0.3")
    );
    assert!(!store.claim(&owner("c2"), &held("10.1.0.2"), None).unwrap());
    assert!(store.claim(&owner("c3"), &held("10.1.0.3"), None).unwrap());
    let e = choose_free(&store, &pool, addr("10.1.0.2"), &[], true).unwrap_err();
    let said = e.to_string();
    assert!(said.contains("1 of its addresses cool down after their release (\"ipam.pool.reuseAfter\"), the first until"), "{said}");
    assert!(said.contains("release --now ADDRESS"), "{said}");
    assert!(matches!(e, PoolError::Exhausted { .. }), "{e:?}");
}

#[test]
fn a_cooldown_that_has_ended_is_no_record_and_the_claim_takes_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let store = cooling_store(dir.path());
    let addresses = store.sub(ADDRESSES).unwrap();
    let addresses = match addresses {
        Some(dir) => dir,
        None => store.sub_made(ADDRESSES).unwrap(),
    };
    let now = clock::now();
    let ended = records::cooling_record("blue", now - 60, now - 1);
    assert!(addresses.create("10.1.0.2", &ended).unwrap());
    assert_eq!(store.holder(addr("10.1.0.2")).unwrap(), None);
    assert!(store
        .cooling(addr("10.1.0.2"), addr("10.1.0.2"))
        .unwrap()
        .is_empty());
    let pool = two_addresses();
    assert_eq!(
        choose_free(&store, &pool, addr("10.1.0.2"), &[], true).unwrap(),
        addr("10.1.0.2")
    );
    assert!(store.claim(&owner("c1"), &held("10.1.0.2"), None).unwrap());
    assert_eq!(holder_of(&store, "10.1.0.2"), Some(owner("c1")));
    // A workload's claim too.
    assert!(addresses.create("10.1.0.3", &ended).unwrap());
    claim_for_workload(&store, "w1", "10.1.0.3", None);
    let keeper = holder_of(&store, "10.1.0.3").and_then(|o| o.workload);
    assert_eq!(keeper.as_deref(), Some("ns/w"));
}

#[test]
fn a_carried_cooldown_lasts_until_its_end_and_takes_no_address_with_a_record() {
    let dir = tempfile::tempdir().unwrap();
    // Carried whatever this store's own setting.
    let store = LocalStore::create(dir.path(), "n").unwrap();
    let until = clock::now() + 600;
    let carried = Cooling {
        pool: Some("blue".into()),
        until,
    };
    assert!(store.carry_cooling(addr("10.1.0.2"), &carried).unwrap());
    assert_eq!(
        store.holder(addr("10.1.0.2")).unwrap(),
        Some(Holder::Cooling(carried.clone()))
    );
    assert!(!store.claim(&owner("c1"), &held("10.1.0.2"), None).unwrap());
    // Once more, or on a held address: nothing changes.
    assert!(!store.carry_cooling(addr("10.1.0.2"), &carried).unwrap());
    assert!(store.claim(&owner("c2"), &held("10.1.0.3"), None).unwrap());
    assert!(!store.carry_cooling(addr("10.1.0.3"), &carried).unwrap());
    assert_eq!(holder_of(&store, "10.1.0.3"), Some(owner("c2")));
    // Over a cooldown that has ended, it is made.
    let ended = Cooling {
        until: clock::now() - 1,
        ..carried.clone()
    };
    assert!(store.carry_cooling(addr("10.1.0.4"), &ended).unwrap());
    assert_eq!(store.holder(addr("10.1.0.4")).unwrap(), None);
    assert!(store.carry_cooling(addr("10.1.0.4"), &carried).unwrap());
    assert!(store.holder(addr("10.1.0.4")).unwrap().is_some());
}

#[test]
fn without_a_cooldown_an_address_given_back_is_gone_and_an_operator_ends_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::create(dir.path(), "n").unwrap();
    assert!(store.claim(&owner("c1"), &held("10.1.0.2"), None).unwrap());
    assert!(store.release(&attachment(&store, "c1")).unwrap());
    assert_eq!(store.holder(addr("10.1.0.2")).unwrap(), None);
    assert!(!store.end_cooling(addr("10.1.0.2")).unwrap());
    // Cooled by a store with a cooldown, ended by an operator's.
    drop(store);
    let store = cooling_store(dir.path());
    assert!(store.claim(&owner("c2"), &held("10.1.0.2"), None).unwrap());
    assert!(store.release(&attachment(&store, "c2")).unwrap());
    assert!(store.end_cooling(addr("10.1.0.2")).unwrap());
    assert!(!store.end_cooling(addr("10.1.0.2")).unwrap());
    assert!(store.claim(&owner("c3"), &held("10.1.0.2"), None).unwrap());
    // A held address is no cooldown to end.
    assert!(!store.end_cooling(addr("10.1.0.2")).unwrap());
    assert_eq!(holder_of(&store, "10.1.0.2"), Some(owner("c3")));
}

#[test]
fn every_way_an_address_is_given_back_cools_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = cooling_store(dir.path());
    let cooling = |address: &str| {
        matches!(
            store.holder(addr(address)).unwrap(),
            Some(Holder::Cooling(_))
        )
    };
    // A record nothing lists, freed.
    assert!(store.claim(&owner("c1"), &held("10.1.0.2"), None).unwrap());
    let name = records::attachment_name("c1", "eth0");
    std::fs::remove_file(dir.path().join("n").join(ATTACHMENTS).join(name)).unwrap();
    assert!(store.free_record(addr("10.1.0.2"), &owner("c1")).unwrap());
    assert!(cooling("10.1.0.2"));
    // A workload's hold ended; and the address a claim no longer keeps.
    claim_for_workload(&store, "c2", "10.1.0.3", None);
    assert!(store.release(&attachment(&store, "c2")).unwrap());
    assert!(!cooling("10.1.0.3"), "kept by the hold");
    claim_for_workload(&store, "c3", "10.1.0.4", Some(&hold(&store)));
    assert!(cooling("10.1.0.3"), "given back by the claim");
    assert!(store.release(&attachment(&store, "c3")).unwrap());
    assert!(store.end_hold(&hold(&store)).unwrap());
    assert!(cooling("10.1.0.4"), "given back with the hold");
    // A claim's undo of what it made itself is no giving back.
    assert!(store.claim(&owner("c4"), &held("10.1.0.5"), None).unwrap());
    let both = [held("10.1.0.6"), held("10.1.0.5")].concat();
    assert!(!store.claim(&owner("c5"), &both, None).unwrap());
    assert_eq!(store.holder(addr("10.1.0.6")).unwrap(), None);
}
