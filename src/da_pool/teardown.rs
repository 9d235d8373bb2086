//! DEL, CHECK and GC: the commands that give back or verify what
//! attachments hold. They read only where the records are, so that a
//! mistake in a pool never stops a teardown.

use std::time::Duration;

use serde_json::Value;

use super::clock;
use super::error::PoolError;
use super::settings::{invalid, Settings};
use super::sticky::sweep_ended_holds;
use super::store::{Allocation, Holder, Owner, Store, ATTEMPTS};
use crate::addr::Addr;
use crate::cni::NetConf;

/// DEL: gives back what the attachment holds, if anything.
pub(super) fn del(store: &dyn Store, owner: &Owner) -> Result<(), PoolError> {
    // What the node noted of the claim, released with nothing read first
    // if the records are still as noted.
    if let Some(noted) = store.noted(owner) {
        if store.release(&noted)? {
            return Ok(());
        }
    }
    for _ in 0..ATTEMPTS {
        let Some(allocation) = store.allocation(&owner.node, &owner.id, &owner.ifname)? else {
            return Ok(());
        };
        if store.release(&allocation)? {
            return Ok(());
        }
    }
    Err(PoolError::Busy(format!(
        "{}/{}'s record changed under every one of {ATTEMPTS} attempts to release it",
        owner.id, owner.ifname
    )))
}

/// CHECK fails for an attachment that holds nothing here.
pub(super) fn nothing_held(owner: &Owner) -> PoolError {
    PoolError::NothingHeld {
        id: owner.id.clone(),
        ifname: owner.ifname.clone(),
    }
}

/// CHECK: every address the attachment's record lists must be in the
/// previous result and held by it; an address of the previous result that
/// the network's records give to another attachment is a failure too.
/// Addresses the records do not know are another delegate's business.
pub(super) fn check(store: &dyn Store, net: &NetConf, owner: &Owner) -> Result<(), PoolError> {
    let prev: Value = net
        .member("prevResult")
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
        .ok_or_else(|| invalid("CHECK needs the ADD's result as \"prevResult\"".into()))?;
    let not_held = |address: String, why: String| PoolError::NotHeld {
        address,
        id: owner.id.clone(),
        ifname: owner.ifname.clone(),
        why,
    };
    let mut listed = Vec::new();
    for ip in prev["ips"].as_array().into_iter().flatten() {
        let text = ip["address"].as_str().unwrap_or_default();
        let address = text
            .split('/')
            .next()
            .and_then(|a| a.parse().ok())
            .map(Addr::new);
        match address {
            Some(address) => listed.push(address),
            None => return Err(not_held(text.into(), "it is not an address".into())),
        }
    }
    let allocation = store
        .allocation(&owner.node, &owner.id, &owner.ifname)?
        .ok_or_else(|| nothing_held(owner))?;
    // As recorded: with the workload its addresses follow, if any.
    let owner = &allocation.owner;
    for h in &allocation.held {
        if !listed.contains(&h.address) {
            return Err(PoolError::NotListed {
                address: h.address.to_string(),
                pool: h.pool.clone(),
                id: owner.id.clone(),
                ifname: owner.ifname.clone(),
            });
        }
    }
    for address in listed {
        let recorded = allocation.held.iter().any(|h| h.address == address);
        let why = match store.holder(address)? {
            Some(Holder::Owner(o)) if owner.owns(&o) && !recorded => {
                "the address's record names the attachment, but the attachment's record does not list it".to_owned()
            }
            Some(Holder::Owner(o)) if !owner.owns(&o) => {
                format!("the network's records give it to {o}")
            }
            Some(Holder::Cooling(cooling)) if recorded => {
                format!("the network's records give it to no one: {cooling}")
            }
            None if recorded => {
                "the attachment's record lists it, but the network has no record of the address".to_owned()
            }
            // Held by the attachment, or another delegate's address.
            _ => continue,
        };
        return Err(not_held(address.to_string(), why));
    }
    Ok(())
}

/// GC (CNI 1.1): frees what this node's attachments hold that the runtime
/// no longer lists as valid; another node's are its own runtime's
/// business. An attachment younger than the grace is kept: its ADD may
/// have finished after the runtime made its list.
pub(super) fn gc(
    store: &dyn Store,
    valid: &[(String, String)],
    settings: &Settings,
) -> Result<(), PoolError> {
    let now = clock::now();
    let stale = |h: &Allocation| {
        (!store.is_shared() || h.owner.node == settings.node)
            && h.since.saturating_add(settings.gc_grace) <= now
            && !valid
                .iter()
                .any(|(id, ifname)| *id == h.owner.id && *ifname == h.owner.ifname)
    };
    // This node's records only, read without every other node's.
    let live = store.allocations_of(&settings.node)?;
    for allocation in live.iter().filter(|a| stale(a)) {
        // A record that changed meanwhile is a new ADD's: the next GC
        // judges it. A workload's addresses stay held by its hold.
        store.release(allocation)?;
    }
    // Notes of attachments released elsewhere (those released here were
    // forgotten as they went), as old as the grace.
    store.forget_notes_except(
        &settings.node,
        &live,
        Duration::from_secs(settings.gc_grace),
    );
    // Holds are left alone until their time is up; then they are no more.
    sweep_ended_holds(store)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::code;
    use crate::cni::Reportable;
    use crate::da_pool::store::fake_store::FakeStore;
    use crate::da_pool::testing::*;
    use crate::pools::valid_attachments;
    use serde_json::json;

    #[test]
    fn gc_keeps_holds_and_ends_those_whose_time_is_up() {
        let store = FakeStore::default();
        let raw = sticky_config();
        for i in 0..3 {
            let owner = of_workload(&format!("c{i}"), &format!("default/web-{i}"), "node-a");
            add_as(&store, &raw, &owner, &[]).unwrap();
        }
        let mut settings = Settings::from_net(&NetConf::parse(&raw).unwrap()).unwrap();
        settings.gc_grace = 0;
        // c0 is still running; c1 and c2 are gone: their holds keep theirs.
        let valid = [("c0".to_owned(), "eth0".to_owned())];
        gc(&store, &valid, &settings).unwrap();
        let left: Vec<String> = store
            .attachments
            .borrow()
            .keys()
            .map(|(id, _)| id.clone())
            .collect();
        assert_eq!(left, ["c0"]);
        assert_eq!(store.held(), ["10.1.0.2", "10.1.0.3", "10.1.0.4"]);
        // c2's hour over: the next GC ends its hold, and leaves c1's.
        expire(&store, "default/web-2");
        gc(&store, &valid, &settings).unwrap();
        assert_eq!(store.held(), ["10.1.0.2", "10.1.0.3"]);
        let holds: Vec<String> = store
            .holds
            .borrow()
            .keys()
            .map(|(w, _)| w.clone())
            .collect();
        assert_eq!(holds, ["default/web-0", "default/web-1"]);
    }

    #[test]
    fn del_gives_back_and_succeeds_when_nothing_is_held() {
        let store = FakeStore::default();
        let raw = config("1.0.0", pools(), None);
        add_for(&store, &raw, "c1", &[]).unwrap();
        del(&store, &owner("c1")).unwrap();
        del(&store, &owner("c1")).unwrap();
        del(&store, &owner("never")).unwrap();
        assert!(store.held().is_empty() && store.attachments.borrow().is_empty());
    }

    #[test]
    fn check_fails_when_the_attachments_record_and_the_addresses_disagree() {
        let store = FakeStore::default();
        let raw = config("1.0.0", pools(), None);
        let result = add_for(&store, &raw, "c1", &[]).unwrap();
        let checked = || {
            let raw = config("1.0.0", pools(), Some(result.clone()));
            check(&store, &NetConf::parse(&raw).unwrap(), &owner("c1"))
        };
        let text = result["ips"][0]["address"].as_str().unwrap();
        let first = Addr::new(text.split('/').next().unwrap().parse().unwrap());
        // Another delegate's address in the result, cooling down in this
        // store: none of the attachment's business.
        let mut with_other = result.clone();
        let ips = with_other["ips"].as_array_mut().unwrap();
        ips.push(serde_json::json!({"address": "192.0.2.7/24"}));
        let other = crate::da_pool::store::Cooling {
            pool: None,
            until: 1_800_000_060,
        };
        let other_address = Addr::new("192.0.2.7".parse().unwrap());
        store.cooling.borrow_mut().insert(other_address, other);
        let raw = config("1.0.0", pools(), Some(with_other));
        check(&store, &NetConf::parse(&raw).unwrap(), &owner("c1")).unwrap();
        store.cooling.borrow_mut().clear();
        // The address's record gone, the attachment's still listing it.
        let holder = store.addresses.borrow_mut().remove(&first).unwrap();
        let e = checked().unwrap_err();
        assert_eq!(e.code(), code::NOT_HELD, "{e}");
        assert!(
            e.to_string()
                .contains("the attachment's record lists it, but the network has no record"),
            "{e}"
        );
        // A cooldown's record instead (a release that raced the CHECK).
        let cooling = crate::da_pool::store::Cooling {
            pool: None,
            until: 1_800_000_060,
        };
        store.cooling.borrow_mut().insert(first, cooling);
        let e = checked().unwrap_err();
        assert_eq!(e.code(), code::NOT_HELD, "{e}");
        assert!(
            e.to_string().contains(
                "the network's records give it to no one: it cools down after its release until 2027-01-15T08:01:00Z"
            ),
            "{e}"
        );
        store.cooling.borrow_mut().clear();
        // Its record back, naming the attachment, which no longer lists it.
        store.addresses.borrow_mut().insert(first, holder);
        for allocation in store.attachments.borrow_mut().values_mut() {
            allocation.held.retain(|h| h.address != first);
        }
        let e = checked().unwrap_err();
        assert_eq!(e.code(), code::NOT_HELD, "{e}");
        assert!(
            e.to_string().contains(
                "the address's record names the attachment, but the attachment's record does not list it"
            ),
            "{e}"
        );
    }

    #[test]
    fn check_fails_unless_the_previous_results_addresses_are_the_attachments() {
        let store = FakeStore::default();
        let raw = config("1.0.0", pools(), None);
        let result = add_for(&store, &raw, "c1", &[]).unwrap();
        let other = add_for(&store, &raw, "c2", &[]).unwrap();
        let checked = |id: &str, prev: &Value| {
            let raw = config("1.0.0", pools(), Some(prev.clone()));
            check(&store, &NetConf::parse(&raw).unwrap(), &owner(id))
        };
        checked("c1", &result).unwrap();
        let refused = |id: &str, prev: &Value, said: &str| {
            let e = checked(id, prev).unwrap_err();
            assert_eq!(e.code(), code::NOT_HELD, "{e}");
            assert!(e.to_string().contains(said), "{e}");
        };
        refused(
            "c2",
            &result,
            "c2/eth0 holds 10.1.0.3 (pool \"blue\"), which the previous",
        );
        // Another delegate's address is its business; another attachment's
        // address of this network is not.
        let mut with_foreign = result.clone();
        with_foreign["ips"]
            .as_array_mut()
            .unwrap()
            .push(json!({"address": "192.0.2.9/24"}));
        checked("c1", &with_foreign).unwrap();
        let mut with_theirs = result.clone();
        with_theirs["ips"]
            .as_array_mut()
            .unwrap()
            .push(other["ips"][0].clone());
        refused(
            "c1",
            &with_theirs,
            "the network's records give it to c2/eth0",
        );
        let mut missing_one = result.clone();
        missing_one["ips"].as_array_mut().unwrap().pop();
        let last = result["ips"].as_array().unwrap().last().unwrap();
        let last = last["address"].as_str().unwrap().split('/').next().unwrap();
        refused(
            "c1",
            &missing_one,
            &format!(
                "c1/eth0 holds {last} (pool \"blue6\"), which the previous result does not list"
            ),
        );
        del(&store, &owner("c1")).unwrap();
        let e = checked("c1", &result).unwrap_err();
        assert_eq!(e.code(), code::NOT_HELD);
        assert_eq!(e.to_string(), "c1/eth0 holds no address in this network");
    }

    #[test]
    fn gc_frees_only_this_nodes_unlisted_attachments_old_enough() {
        let store = FakeStore::default();
        let raw = config("1.1.0", pools(), None);
        for id in ["kept", "stale", "young", "elsewhere"] {
            add_for(&store, &raw, id, &[]).unwrap();
        }
        {
            let mut attachments = store.attachments.borrow_mut();
            for ((id, _), allocation) in attachments.iter_mut() {
                if id != "young" {
                    allocation.since -= 2 * crate::da_pool::settings::DEFAULT_GC_GRACE_SECONDS;
                }
                if id == "elsewhere" {
                    allocation.owner.node = "node-b".into();
                }
            }
        }
        let mut gc_config: Value = serde_json::from_slice(&raw).unwrap();
        gc_config["cni.dev/valid-attachments"] = json!([{"containerID": "kept", "ifname": "eth0"}]);
        let gc_raw = gc_config.to_string().into_bytes();
        let gc_net = NetConf::parse(&gc_raw).unwrap();
        let mut settings = Settings::from_net(&gc_net).unwrap();
        let left = |store: &FakeStore| -> Vec<String> {
            let attachments = store.attachments.borrow();
            attachments.keys().map(|(id, _)| id.clone()).collect()
        };
        gc(&store, &valid_attachments(&gc_net).unwrap(), &settings).unwrap();
        assert_eq!(left(&store), ["elsewhere", "kept", "young"]);
        settings.gc_grace = 0;
        gc(&store, &valid_attachments(&gc_net).unwrap(), &settings).unwrap();
        assert_eq!(
            left(&store),
            ["elsewhere", "kept"],
            "no grace: young goes too"
        );
    }

    #[test]
    fn gc_needs_the_runtimes_list_whole_and_frees_a_local_stores_whatever_its_node_name() {
        let gc_net = |valid: Option<Value>| {
            let mut config: Value =
                serde_json::from_slice(&config("1.1.0", pools(), None)).unwrap();
            if let Some(valid) = valid {
                config["cni.dev/valid-attachments"] = valid;
            }
            config.to_string().into_bytes()
        };
        for (valid, said) in [
            (None, "GC needs \"cni.dev/valid-attachments\""),
            (Some(json!({})), "must be an array"),
            (
                Some(json!([{"containerID": "c"}])),
                "which is not {\"containerID\", \"ifname\"}",
            ),
        ] {
            let raw = gc_net(valid);
            let e = valid_attachments(&NetConf::parse(&raw).unwrap()).unwrap_err();
            assert_eq!(e.code(), 7);
            assert!(e.to_string().contains(said), "{e}");
        }
        let store = FakeStore {
            local: true,
            ..FakeStore::default()
        };
        let raw = config("1.1.0", pools(), None);
        add_for(&store, &raw, "renamed", &[]).unwrap();
        for allocation in store.attachments.borrow_mut().values_mut() {
            allocation.owner.node = "old-hostname".into();
        }
        let mut settings = Settings::from_net(&NetConf::parse(&raw).unwrap()).unwrap();
        settings.gc_grace = 0;
        gc(&store, &[], &settings).unwrap();
        assert!(store.attachments.borrow().is_empty());
    }
}
