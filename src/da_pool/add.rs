//! ADD: what the attachment holds already, if anything (an ADD repeated
//! gets the same addresses); else an address from each pool asked for,
//! claimed all together, the address asked for where one is, and for a
//! workload those its hold keeps. Losing a race for an address to another
//! node starts the ADD again, from a random place.

use tracing::warn;

use super::clock;
use super::definitions::pool_of;
use super::error::PoolError;
use super::predicted::{self, Predicted};
use super::settings::Settings;
use super::sticky::{hold_to_take_over, sweep_ended_holds};
use super::store::{
    Allocation, Holder, Owner, PoolAddress, StickyClaim, Store, WorkloadHold, ATTEMPTS,
};
use super::{result, search};
use crate::addr::Addr;
use crate::cni::NetConf;
use crate::pools::{self, Pool, Wanted};

/// ADD: what the attachment holds already, if anything (an ADD repeated
/// gets the same addresses); else an address from each pool asked for,
/// claimed all together: for a workload (`owner.workload`), those its
/// hold keeps, where the pool is asked for again and no other address is.
/// `asked` are the addresses the runtime asks for.
pub(super) fn add(
    store: &dyn Store,
    net: &NetConf,
    settings: &Settings,
    owner: &Owner,
    asked: &[Addr],
) -> Result<Vec<u8>, PoolError> {
    let wanted = pools::wanted(net, &settings.default)?;
    let pools: Vec<Pool> = wanted
        .iter()
        .map(|w| pool_of(store, settings, w))
        .collect::<Result<_, _>>()?;
    let requested = requested(&wanted, &pools, asked)?;
    let sticky = settings.sticky.as_ref().zip(owner.workload.as_deref());
    let mut lost = 0;
    // Where the node guesses, one claim and nothing read first; a
    // workload's hold is read first, and an address asked for is checked.
    if sticky.is_none() && requested.iter().all(Option::is_none) {
        match predicted::claim(store, owner, &pools)? {
            Predicted::Claimed(held) => return result::build(store, net, settings, &pools, &held),
            Predicted::Unsettled { lost: tries } => lost = tries,
        }
    }
    let mut swept = false;
    // A claim whose answer was lost, if the last one's was.
    let mut unanswered = None;
    // One look more than claims: the last claim's answer may be lost too.
    for attempt in 0..=ATTEMPTS {
        if let Some(allocation) = store.allocation(&owner.node, &owner.id, &owner.ifname)? {
            if holds_all(store, &allocation)? {
                still_asked(&allocation, &pools, &requested)?;
                return result::build(store, net, settings, &pools, &allocation.held);
            }
            // A claim cut short (the allocator killed between its record
            // and its addresses): what it got is given back, and the ADD
            // starts afresh, rather than answer with an address another
            // attachment may hold.
            warn!(
                "{}/{} holds only part of what its record lists: claiming again",
                owner.id, owner.ifname
            );
            store.release(&allocation)?;
            continue;
        }
        if attempt == ATTEMPTS {
            break;
        }
        let hold = match sticky {
            Some(_) => hold_to_take_over(store, owner)?,
            None => None,
        };
        let mut chosen: Vec<PoolAddress> = Vec::new();
        for (pool, asked) in pools.iter().zip(&requested) {
            let address = match asked {
                Some(address) => check_requested(store, pool, *address, owner)?,
                None => match kept(store, hold.as_ref(), pool, owner, &chosen)? {
                    Some(address) => address,
                    None => {
                        let start = search::starting_point(store, &owner.node, pool, lost)?;
                        match search::choose_free(store, pool, start, &chosen, true) {
                            // Holds whose time is up keep addresses until
                            // someone needs them: now.
                            Err(exhausted @ PoolError::Exhausted { .. }) if !swept => {
                                swept = true;
                                if sweep_ended_holds(store)? > 0 {
                                    lost += 1;
                                    break;
                                }
                                return Err(exhausted);
                            }
                            found => found?,
                        }
                    }
                },
            };
            chosen.push(PoolAddress {
                pool: pool.name.clone(),
                address,
            });
        }
        if chosen.len() < pools.len() {
            // Swept: look again.
            continue;
        }
        let claim = sticky.map(|(s, workload)| StickyClaim {
            workload,
            sticky_for: s.sticky_for,
            prior: hold.as_ref(),
        });
        match store.claim(owner, &chosen, claim.as_ref()) {
            Ok(true) => return result::build(store, net, settings, &pools, &chosen),
            Ok(false) => unanswered = None,
            // Its answer lost (a stall past the store's timeout, a member
            // gone mid-request): it may have been recorded all the same.
            // Looked for again at the top, it is answered if it was; if
            // not, claimed again, which fails should the first land late.
            Err(e) if e.may_have_landed() => {
                warn!("the claim's answer was lost, looking for it again: {e}");
                unanswered = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        }
        // Looked for only now: a fence makes every claim of the node fail.
        if let Some(fenced) = store.fenced(&owner.node)? {
            return Err(fenced);
        }
        lost += 1;
    }
    Err(unanswered.unwrap_or_else(|| {
        PoolError::Busy(format!(
            "other attachments took the addresses chosen, {ATTEMPTS} times over"
        ))
    }))
}

/// The address asked for in each pool, if one is: the pool's own
/// `requested-ip`, or one the runtime asks for that the pool's ranges
/// hold. Every address asked for must find its pool, and a pool cannot be
/// asked for two (code 111); nothing is claimed otherwise.
fn requested(
    wanted: &[Wanted],
    pools: &[Pool],
    asked: &[Addr],
) -> Result<Vec<Option<Addr>>, PoolError> {
    let mut requested: Vec<Option<Addr>> = wanted.iter().map(|w| w.requested).collect();
    let names = || {
        let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
        names.join(", ")
    };
    for address in asked {
        let containing: Vec<usize> = (0..pools.len())
            .filter(|i| pools[*i].range_of(*address).is_some())
            .collect();
        if containing.iter().any(|i| requested[*i] == Some(*address)) {
            continue;
        }
        // A default range leaves out its IPv4 network and broadcast
        // addresses: in no range, but not for the reason "in none".
        let special = || {
            pools
                .iter()
                .find_map(|p| Some((p, p.reserved_by_ipv4(*address)?)))
        };
        if let (true, Some((pool, why))) = (containing.is_empty(), special()) {
            return Err(PoolError::AddressUnavailable {
                address: address.to_string(),
                pool: pool.name.clone(),
                why,
            });
        }
        let Some(free) = containing.iter().find(|i| requested[**i].is_none()) else {
            let why = match containing.first() {
                None => "it is in none of the pools asked for".to_owned(),
                Some(i) => format!(
                    "pool {:?} is asked for {} already",
                    pools[*i].name,
                    requested[*i].map(|a| a.to_string()).unwrap_or_default()
                ),
            };
            return Err(PoolError::AddressUnavailable {
                address: address.to_string(),
                pool: names(),
                why,
            });
        };
        requested[*free] = Some(*address);
    }
    for (i, address) in requested.iter().enumerate() {
        if let Some(address) = address {
            if requested[..i].contains(&Some(*address)) {
                return Err(PoolError::AddressUnavailable {
                    address: address.to_string(),
                    pool: names(),
                    why: "two pools are asked for it: an attachment holds an address once".into(),
                });
            }
        }
    }
    Ok(requested)
}

/// An ADD repeated for an attachment that holds its addresses already must
/// not ask for others: it would get what it holds, not what it asks for.
fn still_asked(
    allocation: &Allocation,
    pools: &[Pool],
    requested: &[Option<Addr>],
) -> Result<(), PoolError> {
    for (pool, asked) in pools.iter().zip(requested) {
        let Some(asked) = asked else { continue };
        if !allocation.held.iter().any(|h| h.address == *asked) {
            let held: Vec<String> = allocation
                .held
                .iter()
                .map(|h| h.address.to_string())
                .collect();
            return Err(PoolError::AddressUnavailable {
                address: asked.to_string(),
                pool: pool.name.clone(),
                why: format!(
                    "the attachment holds {} already: DEL it first",
                    held.join(", ")
                ),
            });
        }
    }
    Ok(())
}

/// Whether the attachment holds every address its record lists.
pub(super) fn holds_all(store: &dyn Store, allocation: &Allocation) -> Result<bool, PoolError> {
    for h in &allocation.held {
        let holder = store.holder(h.address)?.and_then(Holder::into_owner);
        if !holder.is_some_and(|o| allocation.owner.owns(&o)) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The address of `pool` that the workload's hold keeps, if it keeps one
/// the pool may still give (a range may have shrunk since) and the
/// workload still holds it.
fn kept(
    store: &dyn Store,
    hold: Option<&WorkloadHold>,
    pool: &Pool,
    owner: &Owner,
    chosen: &[PoolAddress],
) -> Result<Option<Addr>, PoolError> {
    let Some(held) = hold.and_then(|h| h.held.iter().find(|h| h.pool == pool.name)) else {
        return Ok(None);
    };
    let address = held.address;
    if pool.refusal(address).is_some() || chosen.iter().any(|c| c.address == address) {
        return Ok(None);
    }
    Ok(match store.holder(address)? {
        Some(Holder::Owner(holder)) if owner.owns(&holder) => Some(address),
        None => Some(address),
        Some(_) => None,
    })
}

/// `address`, asked for, if the pool may give it and nobody else holds it;
/// else why not (code 111), with nothing claimed.
fn check_requested(
    store: &dyn Store,
    pool: &Pool,
    address: Addr,
    owner: &Owner,
) -> Result<Addr, PoolError> {
    let refuse = |why: String| PoolError::AddressUnavailable {
        address: address.to_string(),
        pool: pool.name.clone(),
        why,
    };
    if let Some(why) = pool.refusal(address) {
        return Err(refuse(why));
    }
    for _ in 0..ATTEMPTS {
        let holder = match store.holder(address)? {
            Some(Holder::Cooling(cooling)) => return Err(refuse(cooling.to_string())),
            Some(Holder::Owner(holder)) if !owner.owns(&holder) => holder,
            _ => return Ok(address),
        };
        // Another workload's hold whose time is up gives it back now.
        let hold = match &holder.workload {
            Some(workload) => store.workload_hold(workload, &holder.ifname)?,
            None => None,
        };
        let bound_alive = match hold
            .as_ref()
            .and_then(|h| Some((&h.node, h.container.as_ref()?)))
        {
            Some((node, id)) => store.allocation(node, id, &holder.ifname)?.is_some(),
            None => false,
        };
        match hold {
            Some(hold)
                if hold
                    .ends(bound_alive)
                    .is_some_and(|end| end <= clock::now()) =>
            {
                store.end_hold(&hold)?;
            }
            _ => return Err(refuse(format!("it is held by {holder}"))),
        }
    }
    Err(PoolError::Busy(format!(
        "{address}'s record changed under every one of {ATTEMPTS} attempts to read it"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::code;
    use crate::cni::Reportable;
    use crate::da_pool::store::fake_store::FakeStore;
    use crate::da_pool::teardown::{check, del};
    use crate::da_pool::testing::*;
    use serde_json::json;

    #[test]
    fn a_workloads_address_follows_it_to_its_next_container_on_any_node_and_no_one_else_gets_it() {
        let store = FakeStore::default();
        let raw = sticky_config();
        let web = |id: &str, node: &str| of_workload(id, "default/web-0", node);
        let first = add_as(&store, &raw, &web("c1", "node-a"), &[]).unwrap();
        assert_eq!(addresses(&first), ["10.1.0.2/29"]);
        // The workload's next container while the first is not deleted:
        // try again later, nothing claimed.
        let e = add_as(&store, &raw, &web("c2", "node-b"), &[]).unwrap_err();
        assert_eq!(e.code(), code::TRY_AGAIN_LATER, "{e}");
        assert!(e.to_string().contains("held by its container c1"), "{e}");
        assert_eq!(store.held(), ["10.1.0.2"]);
        // Deleted: the address stays held for the workload.
        del(&store, &owner("c1")).unwrap();
        assert_eq!(store.held(), ["10.1.0.2"]);
        let other = add_as(
            &store,
            &raw,
            &of_workload("o1", "default/web-1", "node-a"),
            &[],
        )
        .unwrap();
        assert_eq!(addresses(&other), ["10.1.0.3/29"]);
        let e = add_as(
            &store,
            &raw,
            &of_workload("o2", "default/web-2", "node-a"),
            &["10.1.0.2"],
        )
        .unwrap_err();
        assert_eq!(e.code(), code::ADDRESS_UNAVAILABLE);
        assert!(
            e.to_string()
                .contains("held by workload default/web-0 (eth0) on node node-a"),
            "{e}"
        );
        // Recreated under another container ID, on another node: the same.
        let again = add_as(&store, &raw, &web("c2", "node-b"), &[]).unwrap();
        assert_eq!(addresses(&again), ["10.1.0.2/29"]);
        let hold = store
            .workload_hold("default/web-0", "eth0")
            .unwrap()
            .unwrap();
        assert_eq!(
            (hold.container.as_deref(), hold.node.as_str(), hold.until),
            (Some("c2"), "node-b", None)
        );
        // An ADD repeated answers the same; CHECK judges it the workload's.
        assert_eq!(
            add_as(&store, &raw, &web("c2", "node-b"), &[]).unwrap(),
            again
        );
        let checked = config("1.1.0", pools(), Some(again.clone()));
        let on_b = Owner {
            node: "node-b".into(),
            ..owner("c2")
        };
        check(&store, &NetConf::parse(&checked).unwrap(), &on_b).unwrap();
        // Its hour over, the address is anyone's.
        del(&store, &on_b).unwrap();
        expire(&store, "default/web-0");
        let taker = add_as(
            &store,
            &raw,
            &of_workload("o3", "default/web-3", "node-a"),
            &["10.1.0.2"],
        )
        .unwrap();
        assert_eq!(addresses(&taker), ["10.1.0.2/29"]);
        assert!(store
            .workload_hold("default/web-0", "eth0")
            .unwrap()
            .is_none());
        // And the workload gets another one.
        let later = add_as(&store, &raw, &web("c3", "node-a"), &[]).unwrap();
        assert_ne!(addresses(&later), ["10.1.0.2/29"]);
    }

    #[test]
    fn a_requested_address_wins_and_moves_the_hold() {
        let store = FakeStore::default();
        let raw = sticky_config();
        let web = |id: &str| of_workload(id, "default/web-0", "node-a");
        add_as(&store, &raw, &web("c1"), &[]).unwrap();
        del(&store, &owner("c1")).unwrap();
        let moved = add_as(&store, &raw, &web("c2"), &["10.1.0.5"]).unwrap();
        assert_eq!(addresses(&moved), ["10.1.0.5/29"]);
        assert_eq!(store.held(), ["10.1.0.5"], "10.1.0.2 given back");
        let hold = store
            .workload_hold("default/web-0", "eth0")
            .unwrap()
            .unwrap();
        assert_eq!(hold.held, allocation(&store, "c2").held);
        del(&store, &owner("c2")).unwrap();
        assert_eq!(
            addresses(&add_as(&store, &raw, &web("c3"), &[]).unwrap()),
            ["10.1.0.5/29"]
        );
    }

    #[test]
    fn without_the_keys_in_cni_args_an_add_is_the_containers_alone() {
        let store = FakeStore::default();
        let raw = sticky_config();
        add_for(&store, &raw, "plain", &[]).unwrap();
        del(&store, &owner("plain")).unwrap();
        assert!(store.held().is_empty() && store.holds.borrow().is_empty());
    }

    #[test]
    fn holds_whose_time_is_up_give_their_addresses_to_whoever_needs_them() {
        let store = FakeStore::default();
        let raw = sticky_config();
        // Five workloads fill .2 to .6, then go.
        for i in 0..5 {
            let owner = of_workload(&format!("c{i}"), &format!("default/web-{i}"), "node-a");
            add_as(&store, &raw, &owner, &[]).unwrap();
            del(&store, &owner).unwrap();
        }
        let e = add_for(&store, &raw, "late", &[]).unwrap_err();
        assert_eq!(e.code(), code::POOL_EXHAUSTED);
        expire(&store, "default/web-3");
        let got = add_for(&store, &raw, "late", &[]).unwrap();
        assert_eq!(addresses(&got), ["10.1.0.5/29"]);
        assert_eq!(store.holds.borrow().len(), 4);
    }

    #[test]
    fn add_gives_one_address_from_each_pool_and_again_the_same_to_the_same_attachment() {
        let store = FakeStore::default();
        let raw = config("1.0.0", pools(), None);
        let first = add_for(&store, &raw, "c1", &[]).unwrap();
        assert_eq!(
            first,
            json!({
                "cniVersion": "1.0.0",
                "ips": [
                    {"address": "10.1.0.2/29", "gateway": "10.1.0.1"},
                    {"address": "fd00::2/64", "gateway": "fd00::1"},
                ],
                "routes": [{"dst": "0.0.0.0/0"}],
            })
        );
        assert_eq!(
            addresses(&add_for(&store, &raw, "c2", &[]).unwrap()),
            ["10.1.0.3/29", "fd00::3/64"]
        );
        assert_eq!(
            add_for(&store, &raw, "c1", &[]).unwrap(),
            first,
            "repeated: the same"
        );
        assert_eq!(store.held().len(), 4);
    }

    #[test]
    fn a_claim_cut_short_is_claimed_again_never_answered_with_another_attachments_address() {
        let store = FakeStore::default();
        let raw = config("1.0.0", pools(), None);
        let first = add_for(&store, &raw, "c1", &[]).unwrap();
        // As a SIGKILL between the records leaves it: c1's record lists
        // 10.1.0.2, which c1 never got, and which c2 holds now.
        store
            .addresses
            .borrow_mut()
            .insert(Addr::new("10.1.0.2".parse().unwrap()), owner("c2"));
        let again = add_for(&store, &raw, "c1", &[]).unwrap();
        assert_ne!(addresses(&again)[0], addresses(&first)[0]);
        assert_eq!(addresses(&again), ["10.1.0.3/29", "fd00::3/64"]);
        let holders = store.addresses.borrow();
        assert_eq!(holders[&Addr::new("10.1.0.2".parse().unwrap())].id, "c2");
        assert!(
            !holders.contains_key(&Addr::new("fd00::2".parse().unwrap())),
            "what the cut claim got is given back"
        );
    }

    #[test]
    fn the_previous_results_members_stay_in_place_and_legacy_versions_say_the_ip_version() {
        let store = FakeStore::default();
        let prev = json!({"cniVersion": "0.4.0", "ips": [], "dns": {"nameservers": ["10.0.0.53"]}, "pools": [{"name": "blue"}]});
        let raw = config("0.4.0", pools(), Some(prev));
        let text = {
            let net = NetConf::parse(&raw).unwrap();
            let settings = Settings::from_net(&net).unwrap();
            String::from_utf8(add(&store, &net, &settings, &owner("c1"), &[]).unwrap()).unwrap()
        };
        assert_eq!(
            text,
            r#"{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.0.2/29","gateway":"10.1.0.1"}],"dns":{"nameservers":["10.0.0.53"]},"pools":[{"name":"blue"}],"routes":[{"dst":"0.0.0.0/0"}]}"#
        );
    }

    #[test]
    fn an_inline_pool_is_used_as_the_original_readmes_example_flow_gives_it() {
        let store = FakeStore::default();
        let prev = json!({"cniVersion": "1.0.0", "ips": [], "routes": [], "dns": {}, "pools": [
            {"name": "local-pool", "subnet": "192.168.0.0/24", "gateway": "192.168.0.1", "requested-ip": "192.168.0.23"},
        ]});
        let raw = config("1.0.0", json!({"node": "node-a"}), Some(prev));
        let result = add_for(&store, &raw, "c1", &[]).unwrap();
        assert_eq!(
            result["ips"],
            json!([{"address": "192.168.0.23/24", "gateway": "192.168.0.1"}])
        );
        assert_eq!(result["pools"][0]["name"], "local-pool");
    }

    #[test]
    fn a_requested_address_is_given_or_refused_saying_why_with_nothing_claimed() {
        let store = FakeStore::default();
        let raw = config("1.0.0", pools(), None);
        let given = add_for(&store, &raw, "c1", &["10.1.0.5", "fd00::5"]).unwrap();
        assert_eq!(addresses(&given), ["10.1.0.5/29", "fd00::5/64"]);
        for (asked, said) in [
            (
                "10.1.0.5",
                "10.1.0.5 cannot be given from pool \"blue\": it is held by c1/eth0 on node node-a",
            ),
            ("10.1.0.1", "it is the gateway of 10.1.0.0/29"),
            ("10.2.0.5", "it is in none of the pools asked for"),
            // In no range, but not for that reason: IPv4's network and
            // broadcast addresses, which a default range leaves out.
            (
                "10.1.0.0",
                "10.1.0.0 cannot be given from pool \"blue\": it is the network address of 10.1.0.0/29",
            ),
            (
                "10.1.0.7",
                "10.1.0.7 cannot be given from pool \"blue\": it is the broadcast address of 10.1.0.0/29",
            ),
        ] {
            let e = add_for(&store, &raw, "c2", &[asked]).unwrap_err();
            assert_eq!(e.code(), code::ADDRESS_UNAVAILABLE, "{asked}");
            assert!(e.to_string().contains(said), "{asked}: {e}");
        }
        assert_eq!(store.held().len(), 2, "nothing claimed by the refusals");
    }

    #[test]
    fn every_address_asked_for_is_given_or_the_add_fails() {
        let store = FakeStore::default();
        let raw = config("1.0.0", pools(), None);
        let e = add_for(&store, &raw, "c1", &["10.1.0.5", "10.1.0.6"]).unwrap_err();
        assert_eq!(e.code(), code::ADDRESS_UNAVAILABLE);
        assert!(
            e.to_string()
                .contains("pool \"blue\" is asked for 10.1.0.5 already"),
            "{e}"
        );
        let prev = json!({"pools": [{"name": "blue", "requested-ip": "10.1.0.4"}]});
        let asked_twice = config("1.0.0", pools(), Some(prev));
        let e = add_for(&store, &asked_twice, "c1", &["10.1.0.5"]).unwrap_err();
        assert!(
            e.to_string().contains("is asked for 10.1.0.4 already"),
            "{e}"
        );
        assert_eq!(store.held(), Vec::<String>::new(), "nothing claimed");
        // Repeated with another address: it would not get it.
        add_for(&store, &raw, "c1", &["10.1.0.5"]).unwrap();
        let e = add_for(&store, &raw, "c1", &["10.1.0.6"]).unwrap_err();
        assert!(
            e.to_string()
                .contains("the attachment holds 10.1.0.5, fd00::2 already: DEL it first"),
            "{e}"
        );
        assert_eq!(
            addresses(&add_for(&store, &raw, "c1", &["10.1.0.5"]).unwrap())[0],
            "10.1.0.5/29"
        );
    }

    #[test]
    fn earlier_delegates_addresses_and_routes_stay_in_the_result() {
        let store = FakeStore::default();
        let prev = json!({
            "cniVersion": "1.0.0",
            "ips": [{"address": "fd99::7/64"}],
            "routes": [{"dst": "::/0"}, {"dst": "0.0.0.0/0"}],
            "pools": [{"name": "blue"}],
        });
        let raw = config("0.4.0", pools(), Some(prev));
        let result = add_for(&store, &raw, "c1", &[]).unwrap();
        assert_eq!(
            result["ips"],
            json!([
                {"version": "6", "address": "fd99::7/64"},
                {"version": "4", "address": "10.1.0.2/29", "gateway": "10.1.0.1"},
            ])
        );
        assert_eq!(
            result["routes"],
            json!([{"dst": "::/0"}, {"dst": "0.0.0.0/0"}])
        );
    }

    #[test]
    fn an_exhausted_pool_is_code_110_and_claims_nothing_from_the_others() {
        let store = FakeStore::default();
        let prev = json!({"pools": [{"name": "blue"}, {"name": "tiny"}]});
        let raw = config("1.0.0", pools(), Some(prev));
        // tiny, a /30, gives one address: .2 (.1 is its gateway).
        add_for(&store, &raw, "c1", &[]).unwrap();
        let e = add_for(&store, &raw, "c2", &[]).unwrap_err();
        assert_eq!(
            (e.code(), e.to_string()),
            (
                code::POOL_EXHAUSTED,
                "pool \"tiny\" has no free address".into()
            )
        );
        assert_eq!(store.held(), ["10.1.0.2", "10.9.0.2"]);
    }

    #[test]
    fn a_pool_whose_only_free_address_cools_down_says_so_and_so_does_one_asked_for() {
        let store = FakeStore::default();
        let prev = json!({"pools": [{"name": "blue"}, {"name": "tiny"}]});
        let raw = config("1.0.0", pools(), Some(prev));
        // tiny, a /30, gives .2 alone: the gateway and the broadcast
        // address cooling are none of its.
        let until = 1_800_000_060;
        for address in ["10.9.0.1", "10.9.0.2", "10.9.0.3"] {
            let cooling = crate::da_pool::store::Cooling { pool: None, until };
            let address = Addr::new(address.parse().unwrap());
            store.cooling.borrow_mut().insert(address, cooling);
        }
        let e = add_for(&store, &raw, "c1", &[]).unwrap_err();
        assert_eq!(e.code(), code::POOL_EXHAUSTED);
        assert_eq!(
            e.to_string(),
            "pool \"tiny\" has no free address now: 1 of its addresses cool down after their release (\"ipam.pool.reuseAfter\"), the first until 2027-01-15T08:01:00Z; `ipam-da-pool release --now ADDRESS` ends an address's cooldown"
        );
        let e = add_for(&store, &raw, "c1", &["10.9.0.2"]).unwrap_err();
        assert_eq!(e.code(), code::ADDRESS_UNAVAILABLE);
        assert!(
            e.to_string()
                .contains("it cools down after its release until 2027-01-15T08:01:00Z"),
            "{e}"
        );
        assert!(store.held().is_empty());
    }

    #[test]
    fn a_pool_found_full_is_not_read_whole_again_until_an_address_is_given_back() {
        let store = FakeStore::default();
        let mut settings = pools();
        settings["pools"]["wide"] = json!([{"subnet": "10.8.0.0/24"}]);
        settings["default"] = json!("wide");
        let raw = config("1.0.0", settings, None);
        for i in 0..253 {
            add_for(&store, &raw, &format!("c{i}"), &[]).unwrap();
        }
        let looked = store.looked_at.get();
        let e = add_for(&store, &raw, "more", &[]).unwrap_err();
        assert_eq!(e.code(), code::POOL_EXHAUSTED);
        assert!(
            store.looked_at.get() - looked >= 253,
            "the first reads it all"
        );
        assert!(store.full.borrow().contains_key("wide"));
        // The ADDs a runtime retries read one window, not the pool.
        let looked = store.looked_at.get();
        let e = add_for(&store, &raw, "more", &[]).unwrap_err();
        assert_eq!(e.code(), code::POOL_EXHAUSTED);
        assert!(store.looked_at.get() - looked <= 16, "one window");
        del(&store, &owner("c7")).unwrap();
        assert!(store.full.borrow().is_empty());
        add_for(&store, &raw, "more", &[]).unwrap();
    }

    #[test]
    fn allocation_goes_on_after_the_last_address_given_then_wraps() {
        let store = FakeStore::default();
        let prev = json!({"pools": [{"name": "blue"}]});
        let raw = config("1.0.0", pools(), Some(prev));
        for id in ["c1", "c2", "c3"] {
            add_for(&store, &raw, id, &[]).unwrap();
        }
        del(&store, &owner("c1")).unwrap();
        // .2 is free again, but the hint is after .4: .5 comes first.
        assert_eq!(
            addresses(&add_for(&store, &raw, "c4", &[]).unwrap()),
            ["10.1.0.5/29"]
        );
        assert_eq!(
            addresses(&add_for(&store, &raw, "c5", &[]).unwrap()),
            ["10.1.0.6/29"]
        );
        // The range ends at .6 (.7 is the broadcast address): back to .2.
        assert_eq!(
            addresses(&add_for(&store, &raw, "c6", &[]).unwrap()),
            ["10.1.0.2/29"]
        );
    }

    #[test]
    fn a_pool_90_percent_full_is_searched_in_a_few_looks_however_it_is_laid_out() {
        let raw = config(
            "1.0.0",
            json!({"node": "node-a", "default": "big", "pools": {"big": [{"subnet": "10.8.0.0/16"}]}}),
            None,
        );
        let holder = owner("earlier");
        let at = |n: u32| Addr::new(std::net::Ipv4Addr::from(0x0a08_0000 + n).into());
        // The worst layout for a search in order: the free tenth in one
        // block, the hint at the start of the full nine tenths.
        let store = FakeStore::default();
        for n in 2..=58_982 {
            store.addresses.borrow_mut().insert(at(n), holder.clone());
        }
        store.hints.borrow_mut().insert("big".into(), at(2));
        let given = add_for(&store, &raw, "c1", &[]).unwrap();
        let address: std::net::IpAddr = addresses(&given)[0]
            .trim_end_matches("/16")
            .parse()
            .unwrap();
        assert!(Addr::new(address) > at(58_982), "{given}");
        assert!(
            store.looked_at.get() < 2_000,
            "looked at {}",
            store.looked_at.get()
        );
        // After churn: one address in ten free, anywhere.
        let store = FakeStore::default();
        for n in (2..=65_534).filter(|n| n % 10 != 0) {
            store.addresses.borrow_mut().insert(at(n), holder.clone());
        }
        add_for(&store, &raw, "c1", &[]).unwrap();
        assert!(
            store.looked_at.get() < 20,
            "looked at {}",
            store.looked_at.get()
        );
    }

    #[test]
    fn a_wide_ipv6_pool_is_never_enumerated() {
        let store = FakeStore::default();
        let prev = json!({"pools": [{"name": "wide", "subnet": "fd00:1::/48"}]});
        let raw = config("1.0.0", json!({"node": "node-a"}), Some(prev));
        for id in 0..50 {
            add_for(&store, &raw, &format!("c{id}"), &[]).unwrap();
        }
        // Each ADD looked at about one address.
        assert!(store.looked_at.get() < 100, "{}", store.looked_at.get());
    }

    #[test]
    fn excluded_and_reserved_addresses_are_never_given_nor_given_when_asked_for() {
        let store = FakeStore::default();
        let raw = config(
            "1.0.0",
            json!({"node": "node-a", "default": "p", "pools": {"p": {
                "ranges": [{"subnet": "10.4.0.0/28", "exclude": ["10.4.0.4/30", "10.4.0.9"]}],
                "reserved": ["10.4.0.2", "10.4.0.13"],
            }}}),
            None,
        );
        // .1 the gateway, .15 broadcast: .3, .8, .10, .11, .12, .14 are left.
        let mut given: Vec<String> = (0..6)
            .map(|i| {
                addresses(&add_for(&store, &raw, &format!("c{i}"), &[]).unwrap())[0].to_owned()
            })
            .collect();
        given.sort();
        assert_eq!(
            given,
            [
                "10.4.0.10/28",
                "10.4.0.11/28",
                "10.4.0.12/28",
                "10.4.0.14/28",
                "10.4.0.3/28",
                "10.4.0.8/28"
            ]
        );
        let e = add_for(&store, &raw, "c6", &[]).unwrap_err();
        assert_eq!(e.code(), code::POOL_EXHAUSTED);
        del(&store, &owner("c0")).unwrap();
        for (asked, said) in [
            ("10.4.0.5", "10.4.0.5 cannot be given from pool \"p\": it is excluded (10.4.0.4/30) from 10.4.0.0/28"),
            ("10.4.0.9", "it is excluded (10.4.0.9) from 10.4.0.0/28"),
            ("10.4.0.13", "10.4.0.13 cannot be given from pool \"p\": it is reserved in the pool"),
            ("10.4.0.1", "it is the gateway of 10.4.0.0/28"),
        ] {
            let e = add_for(&store, &raw, "c7", &[asked]).unwrap_err();
            assert_eq!(e.code(), code::ADDRESS_UNAVAILABLE, "{asked}");
            assert!(e.to_string().contains(said), "{asked}: {e}");
            assert_eq!(store.held().len(), 5, "{asked}: nothing claimed");
        }
    }

    #[test]
    fn excluded_blocks_are_stepped_over_whole_however_wide() {
        // A /48 all excluded but its last /120, in 72 blocks from a /49
        // down: no random look lands in what is left, and the search in
        // order must cross 2^80 excluded addresses at once.
        let base: u128 = 0xfd00_0001_0000_0000_0000_0000_0000_0000;
        let exclude: Vec<String> = (49..=120u32)
            .map(|p| {
                let start = base + (1u128 << 80) - (1u128 << (129 - p));
                format!("{}/{p}", std::net::Ipv6Addr::from(start))
            })
            .collect();
        let store = FakeStore::default();
        let prev =
            json!({"pools": [{"name": "wide", "subnet": "fd00:1::/48", "exclude": exclude}]});
        let raw = config("1.0.0", json!({"node": "node-a"}), Some(prev));
        let given = add_for(&store, &raw, "c1", &[]).unwrap();
        assert_eq!(addresses(&given), ["fd00:1:0:ffff:ffff:ffff:ffff:ff00/48"]);
        assert!(store.looked_at.get() < 100, "{}", store.looked_at.get());
    }

    #[test]
    fn a_claim_whose_answer_was_lost_is_found_again_and_answered() {
        let store = FakeStore::default();
        let raw = config("1.0.0", pools(), None);
        store.unanswered_claims.set(1);
        let given = add_for(&store, &raw, "c1", &[]).unwrap();
        assert_eq!(store.held().len(), 2, "one claim, answered: {given}");
        assert_eq!(store.attachments.borrow().len(), 1);
        // However many answers would be lost, the first claim is the one.
        store.unanswered_claims.set(ATTEMPTS);
        add_for(&store, &raw, "c2", &[]).unwrap();
        assert_eq!(store.held().len(), 4);
        assert_eq!(store.unanswered_claims.get(), ATTEMPTS - 1);
    }

    #[test]
    fn the_last_claim_whose_answer_was_lost_is_looked_for_too() {
        let store = FakeStore::default();
        let raw = config("1.0.0", pools(), None);
        // Every claim's answer lost; all but the last lost their race too:
        // the last one landed, and is the answer.
        store.losing_claims.set(ATTEMPTS - 1);
        store.unanswered_claims.set(ATTEMPTS);
        let given = add_for(&store, &raw, "c1", &[]).unwrap();
        assert_eq!(store.held().len(), 2, "{given}");
        assert_eq!(store.unanswered_claims.get(), 0);
    }

    #[test]
    fn a_lost_race_is_run_again_and_one_lost_for_ever_is_try_again_later() {
        let store = FakeStore::default();
        let raw = config("1.0.0", pools(), None);
        store.losing_claims.set(2);
        let given = add_for(&store, &raw, "c1", &[]).unwrap();
        assert_eq!(store.held().len(), 2, "{given}");
        assert_eq!(
            addresses(&given),
            store
                .held()
                .iter()
                .zip(["/29", "/64"])
                .map(|(a, p)| format!("{a}{p}"))
                .collect::<Vec<_>>()
        );
        store.losing_claims.set(ATTEMPTS);
        let e = add_for(&store, &raw, "c2", &[]).unwrap_err();
        assert_eq!(e.code(), code::TRY_AGAIN_LATER);
    }

    #[test]
    fn a_claim_the_store_refuses_is_answered_at_once_not_made_again() {
        let store = FakeStore::default();
        let raw = config("1.0.0", pools(), None);
        store.refused_claims.set(2);
        let e = add_for(&store, &raw, "c1", &[]).unwrap_err();
        assert!(e.to_string().contains("database is full"), "{e}");
        assert_eq!(store.refused_claims.get(), 1, "one claim made");
        assert!(store.held().is_empty());
    }

    #[test]
    fn a_workload_asking_for_the_address_its_hold_keeps_gets_it() {
        let store = FakeStore::default();
        let raw = sticky_config();
        let web = |id: &str| of_workload(id, "default/web-0", "node-a");
        add_as(&store, &raw, &web("c1"), &[]).unwrap();
        del(&store, &owner("c1")).unwrap();
        let again = add_as(&store, &raw, &web("c2"), &["10.1.0.2"]).unwrap();
        assert_eq!(addresses(&again), ["10.1.0.2/29"]);
    }

    #[test]
    fn a_hold_keeps_its_address_in_every_pool() {
        let store = FakeStore::default();
        let raw = config(
            "1.1.0",
            json!({"node": "node-a", "default": ["blue", "green"],
                "pools": {"blue": [{"subnet": "10.1.0.0/29"}], "green": [{"subnet": "10.2.0.0/29"}]},
                "sticky": ["K8S_POD_NAMESPACE", "K8S_POD_NAME"], "stickyFor": "1h"}),
            None,
        );
        let web = |id: &str| of_workload(id, "default/web-0", "node-a");
        add_as(&store, &raw, &web("c1"), &[]).unwrap();
        del(&store, &owner("c1")).unwrap();
        assert_eq!(
            addresses(&add_as(&store, &raw, &web("c2"), &[]).unwrap()),
            ["10.1.0.2/29", "10.2.0.2/29"]
        );
    }

    #[test]
    fn a_hold_keeps_no_address_its_pool_gives_no_more() {
        let store = FakeStore::default();
        let web = |id: &str| of_workload(id, "default/web-0", "node-a");
        add_as(&store, &sticky_config(), &web("c1"), &[]).unwrap();
        del(&store, &owner("c1")).unwrap();
        // The operator has reserved .2 since.
        let raw = config(
            "1.1.0",
            json!({"node": "node-a", "default": "blue",
                "pools": {"blue": {"ranges": [{"subnet": "10.1.0.0/29"}], "reserved": ["10.1.0.2"]}},
                "sticky": ["K8S_POD_NAMESPACE", "K8S_POD_NAME"], "stickyFor": "1h"}),
            None,
        );
        let got = add_as(&store, &raw, &web("c2"), &[]).unwrap();
        assert_eq!(addresses(&got), ["10.1.0.3/29"]);
        assert_eq!(store.held(), ["10.1.0.3"], "10.1.0.2 given back");
    }

    #[test]
    fn a_hold_whose_address_another_attachment_holds_gets_a_new_one() {
        let store = FakeStore::default();
        let raw = sticky_config();
        let web = |id: &str| of_workload(id, "default/web-0", "node-a");
        add_as(&store, &raw, &web("c1"), &[]).unwrap();
        del(&store, &owner("c1")).unwrap();
        // The hold lists .2, but .2's record names another attachment.
        // The two are read one after the other, not as one snapshot, so
        // they may disagree; the claim's compare would then refuse .2 at
        // every try.
        let taken = Addr::new("10.1.0.2".parse().unwrap());
        store.addresses.borrow_mut().insert(taken, owner("other"));
        let got = add_as(&store, &raw, &web("c2"), &[]).unwrap();
        assert_eq!(addresses(&got), ["10.1.0.3/29"]);
    }

    #[test]
    fn after_a_lost_race_the_search_starts_at_random() {
        let store = FakeStore::default();
        let raw = config(
            "1.0.0",
            json!({"node": "node-a", "default": "big", "pools": {"big": [{"subnet": "10.8.0.0/16"}]}}),
            None,
        );
        assert_eq!(
            addresses(&add_for(&store, &raw, "c1", &[]).unwrap()),
            ["10.8.0.2/16"]
        );
        // Every node that lost 10.8.0.3 to another would race again for
        // 10.8.0.4 if it looked from the hint.
        let mut spread = std::collections::BTreeSet::new();
        for id in 0..4 {
            store.losing_claims.set(1);
            spread.insert(
                addresses(&add_for(&store, &raw, &format!("r{id}"), &[]).unwrap())[0].to_owned(),
            );
        }
        assert!(
            !spread.contains("10.8.0.3/16") && spread.len() == 4,
            "{spread:?}"
        );
    }

    #[test]
    fn a_pool_may_be_defined_by_the_store() {
        let mut store = FakeStore::default();
        store
            .pools
            .insert("central".into(), json!([{"subnet": "10.7.0.0/24"}]));
        let raw = config(
            "1.0.0",
            json!({"node": "node-a"}),
            Some(json!({"pools": [{"name": "central"}]})),
        );
        assert_eq!(
            addresses(&add_for(&store, &raw, "c1", &[]).unwrap()),
            ["10.7.0.2/24"]
        );
        let raw = config(
            "1.0.0",
            json!({"node": "node-a"}),
            Some(json!({"pools": [{"name": "nowhere"}]})),
        );
        let e = add_for(&store, &raw, "c2", &[]).unwrap_err();
        assert!(
            e.to_string().contains("pool \"nowhere\" is not defined"),
            "{e}"
        );
    }
}
