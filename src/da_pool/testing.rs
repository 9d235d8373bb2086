//! What the allocator's unit tests share: configurations, owners, and an
//! ADD against a store (the fake, or the local store in a temporary
//! directory).

use serde_json::{json, Value};

use super::add::add;
use super::error::PoolError;
use super::settings::Settings;
use super::store::fake_store::FakeStore;
use super::store::{Allocation, Owner, Store};
use crate::addr::Addr;
use crate::cni::NetConf;

/// A configuration with `ipam.pool` set to `pool` and the previous
/// result `prev`, at `version`.
pub fn config(version: &str, pool: Value, prev: Option<Value>) -> Vec<u8> {
    let mut config = json!({
        "cniVersion": version,
        "name": "n",
        "ipam": {"type": "ipam-delegated", "delegates": ["ipam-da-pool"], "pool": pool},
    });
    if let Some(prev) = prev {
        config["prevResult"] = prev;
    }
    config.to_string().into_bytes()
}

pub fn pools() -> Value {
    json!({
        "node": "node-a",
        "default": ["blue", "blue6"],
        "pools": {
            "blue": [{"subnet": "10.1.0.0/29"}],
            "blue6": [{"subnet": "fd00::/64"}],
            "tiny": [{"subnet": "10.9.0.0/30"}],
        },
        "routes": [{"dst": "0.0.0.0/0"}],
    })
}

pub fn owner(id: &str) -> Owner {
    Owner {
        id: id.into(),
        ifname: "eth0".into(),
        node: "node-a".into(),
        workload: None,
    }
}

/// ADD for container `id` with `raw` as configuration.
pub fn add_for(
    store: &FakeStore,
    raw: &[u8],
    id: &str,
    asked: &[&str],
) -> Result<Value, PoolError> {
    add_as(store, raw, &owner(id), asked)
}

/// ADD for `owner` with `raw` as configuration, on any store.
pub fn add_as(
    store: &dyn Store,
    raw: &[u8],
    owner: &Owner,
    asked: &[&str],
) -> Result<Value, PoolError> {
    let net = NetConf::parse(raw).unwrap();
    let settings = Settings::from_net(&net)?;
    let asked: Vec<Addr> = asked
        .iter()
        .map(|a| Addr::new(a.parse().unwrap()))
        .collect();
    let result = add(store, &net, &settings, owner, &asked)?;
    Ok(serde_json::from_slice(&result).unwrap())
}

/// Container `id` of workload `workload`, on `node`.
pub fn of_workload(id: &str, workload: &str, node: &str) -> Owner {
    Owner {
        id: id.into(),
        ifname: "eth0".into(),
        node: node.into(),
        workload: Some(workload.into()),
    }
}

/// A /29 (.2 to .6) whose addresses follow the pods for an hour.
pub fn sticky_config() -> Vec<u8> {
    config(
        "1.1.0",
        json!({"node": "node-a", "default": "blue",
            "pools": {"blue": [{"subnet": "10.1.0.0/29"}]},
            "sticky": ["K8S_POD_NAMESPACE", "K8S_POD_NAME"], "stickyFor": "1h"}),
        None,
    )
}

/// Makes the hold of `workload` end now, as if its hour were over.
pub fn expire(store: &FakeStore, workload: &str) {
    let mut holds = store.holds.borrow_mut();
    let hold = holds.get_mut(&(workload.into(), "eth0".into())).unwrap();
    hold.until = Some(1);
    hold.since = 0;
}

pub fn allocation(store: &FakeStore, id: &str) -> Allocation {
    store.attachments.borrow()[&(id.into(), "eth0".into())].clone()
}

pub fn addresses(result: &Value) -> Vec<&str> {
    result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| ip["address"].as_str().unwrap())
        .collect()
}
