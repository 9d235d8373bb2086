//! STATUS: whether an ADD could succeed now: the store answers, the node
//! is not fenced, and every pool the configuration defines or names as a
//! default has a free address.

use super::definitions::find_pool;
use super::error::PoolError;
use super::search;
use super::settings::{invalid, Settings};
use super::sticky::ended_holds;
use super::store::Store;
use crate::cni::{code, Reportable};
use crate::pools::Pool;

/// STATUS: the store answers, and every pool the configuration defines or
/// names as a default has a free address; else why not, as code 50. A
/// termination request that stopped it keeps its own code.
pub(super) fn status(store: &dyn Store, settings: &Settings) -> Result<(), PoolError> {
    ready(store, settings).map_err(|e| match e.code() {
        code::INTERRUPTED => e,
        _ => PoolError::NotAvailable(e.to_string()),
    })
}

fn ready(store: &dyn Store, settings: &Settings) -> Result<(), PoolError> {
    store.ping()?;
    if let Some(fenced) = store.fenced(&settings.node)? {
        return Err(fenced);
    }
    let mut pools: Vec<Pool> = settings.pools.clone();
    for name in &settings.default {
        if !pools.iter().any(|p| p.name == *name) {
            let pool = find_pool(store, settings, name)?
                .ok_or_else(|| invalid(format!("default pool {name:?} is not defined")))?;
            pools.push(pool);
        }
    }
    for pool in &pools {
        let start = search::starting_point(store, &settings.node, pool, 0)?;
        match search::choose_free(store, pool, start, &[], false) {
            // An ADD would give back a hold whose time is up, and take
            // its address: STATUS writes nothing, but says so.
            Err(PoolError::Exhausted { .. })
                if ended_holds(store)?
                    .iter()
                    .flat_map(|h| &h.held)
                    .any(|h| pool.range_of(h.address).is_some()) => {}
            found => drop(found?),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::code;
    use crate::cni::NetConf;
    use crate::cni::Reportable;
    use crate::da_pool::add::add;
    use crate::da_pool::sticky::sweep_ended_holds;
    use crate::da_pool::store::fake_store::FakeStore;
    use crate::da_pool::teardown::del;
    use crate::da_pool::testing::*;
    use serde_json::json;

    #[test]
    fn status_counts_the_addresses_of_ended_holds_as_free_and_a_live_containers_hold_is_never_ended(
    ) {
        let store = FakeStore::default();
        let raw = sticky_config();
        let settings = Settings::from_net(&NetConf::parse(&raw).unwrap()).unwrap();
        for i in 0..5 {
            let owner = of_workload(&format!("c{i}"), &format!("default/web-{i}"), "node-a");
            add_as(&store, &raw, &owner, &[]).unwrap();
            if i > 0 {
                del(&store, &owner).unwrap();
            }
        }
        let e = status(&store, &settings).unwrap_err();
        assert_eq!(e.code(), code::NOT_AVAILABLE);
        expire(&store, "default/web-4");
        status(&store, &settings).unwrap();
        assert_eq!(store.holds.borrow().len(), 5, "STATUS writes nothing");
        // Its container c0 runs: its hold is not ended, however old.
        expire(&store, "default/web-0");
        let hold = store
            .workload_hold("default/web-0", "eth0")
            .unwrap()
            .unwrap();
        assert!(!store.end_hold(&hold).unwrap());
        assert_eq!(sweep_ended_holds(&store).unwrap(), 1, "web-4's only");
        assert!(store
            .workload_hold("default/web-0", "eth0")
            .unwrap()
            .is_some());
    }

    #[test]
    fn status_checks_the_default_pools_too() {
        let store = FakeStore::default();
        let settings_of = |raw: &[u8]| Settings::from_net(&NetConf::parse(raw).unwrap()).unwrap();
        let mut store_pools = pools();
        store_pools["default"] = json!("central");
        store_pools["pools"] = json!({});
        let raw = config("1.1.0", store_pools, None);
        let e = status(&store, &settings_of(&raw)).unwrap_err();
        assert!(
            e.to_string()
                .contains("default pool \"central\" is not defined"),
            "{e}"
        );
        let mut store = store;
        store
            .pools
            .insert("central".into(), json!([{"subnet": "10.7.0.0/30"}]));
        status(&store, &settings_of(&raw)).unwrap();
        add_for(&store, &raw, "c1", &[]).unwrap();
        let e = status(&store, &settings_of(&raw)).unwrap_err();
        assert_eq!(e.code(), code::NOT_AVAILABLE);
        assert!(e.to_string().contains("\"central\""), "{e}");
    }

    #[test]
    fn status_says_which_pool_is_exhausted() {
        let store = FakeStore::default();
        let raw = config("1.1.0", pools(), Some(json!({"pools": [{"name": "tiny"}]})));
        let net = NetConf::parse(&raw).unwrap();
        let settings = Settings::from_net(&net).unwrap();
        status(&store, &settings).unwrap();
        add(&store, &net, &settings, &owner("c1"), &[]).unwrap();
        let e = status(&store, &settings).unwrap_err();
        assert_eq!(e.code(), code::NOT_AVAILABLE);
        assert!(e.to_string().contains("\"tiny\""), "{e}");
    }
}
