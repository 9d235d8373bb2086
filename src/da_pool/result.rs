//! The ADD result: the addresses held, each with its range's prefix
//! length and gateway, added to those of the previous result; the
//! configured routes added to its routes; every other member kept in
//! place; all in the configuration's version.

use serde_json::{json, Map, Value};

use super::definitions::find_pool;
use super::error::PoolError;
use super::settings::Settings;
use super::store::{PoolAddress, Store};
use crate::cni::{self, NetConf};
use crate::pools::Pool;

/// The result of an ADD that gives `held` (from `pools`, or as a pool is
/// defined now if it was held before).
pub fn build(
    store: &dyn Store,
    net: &NetConf,
    settings: &Settings,
    pools: &[Pool],
    held: &[PoolAddress],
) -> Result<Vec<u8>, PoolError> {
    let previous: Value = net
        .member("prevResult")
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
        .unwrap_or(Value::Null);
    let mut ours = Vec::new();
    for h in held {
        let pool = match pools.iter().find(|p| p.name == h.pool) {
            Some(pool) => pool.clone(),
            None => find_pool(store, settings, &h.pool)?.ok_or_else(|| {
                cni::Error::InvalidConfig(format!(
                    "pool {:?}, which the attachment holds {} of, is no longer defined",
                    h.pool, h.address
                ))
            })?,
        };
        let range = pool.range_of(h.address).ok_or_else(|| {
            cni::Error::InvalidConfig(format!(
                "{} is outside pool {:?}'s ranges as they are now defined",
                h.address, h.pool
            ))
        })?;
        let mut ip = Map::new();
        ip.insert(
            "address".into(),
            json!(format!("{}/{}", h.address, range.prefix)),
        );
        ip.insert("gateway".into(), json!(range.gateway.to_string()));
        ours.push((h.address, ip));
    }
    let ours = ours.into_iter().map(|(_, ip)| ip).collect();
    let ips = cni::ips_after(&previous, ours, net.cni_version);
    let ips = ips.to_string();
    let mut set = vec![("ips", ips)];
    if let Some(configured) = &settings.routes {
        let mut routes: Vec<Value> = previous["routes"].as_array().cloned().unwrap_or_default();
        for route in configured {
            if !routes.contains(route) {
                routes.push(route.clone());
            }
        }
        set.push(("routes", Value::Array(routes).to_string()));
    }
    let set: Vec<(&str, &str)> = set.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Ok(net.result_on_previous(&set))
}
