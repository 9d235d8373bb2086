//! The ADD result: the addresses held, each with its range's prefix
//! length and gateway, added to those of the previous result; the
//! configured routes added to its routes; every other member kept in
//! place; all in the configuration's version.

use serde_json::{json, Map, Value};

use super::definitions::find_pool;
use super::error::PoolError;
use super::settings::Settings;
use super::store::{PoolAddress, Store};
use crate::addr::{Addr, Family};
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
    let legacy = matches!(net.cni_version, "0.3.0" | "0.3.1" | "0.4.0");
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
    // An earlier delegate's addresses stay; one of ours it listed too is
    // listed once, as ours.
    let earlier: Vec<Map<String, Value>> = previous["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|ip| !ours.iter().any(|(a, _)| Some(*a) == address_of(ip)))
        .filter_map(|ip| ip.as_object().cloned())
        .collect();
    let ips: Vec<Value> = earlier
        .into_iter()
        .chain(ours.into_iter().map(|(_, ip)| ip))
        .map(|ip| Value::Object(in_shape(ip, legacy)))
        .collect();
    let ips = Value::Array(ips).to_string();
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

/// The address of an `ips` entry (`ADDRESS/PREFIX`).
fn address_of(ip: &Value) -> Option<Addr> {
    let text = ip.get("address")?.as_str()?;
    let address = text.split_once('/').map_or(text, |(address, _)| address);
    address.parse().ok().map(Addr::new)
}

/// An `ips` entry in the configuration's version: before 1.0.0 each says
/// its IP `version`, first; from 1.0.0 none does.
fn in_shape(mut ip: Map<String, Value>, legacy: bool) -> Map<String, Value> {
    ip.remove("version");
    if !legacy {
        return ip;
    }
    let version = match address_of(&Value::Object(ip.clone())).map(Addr::family) {
        Some(Family::V6) => "6",
        _ => "4",
    };
    let mut shaped = Map::new();
    shaped.insert("version".into(), json!(version));
    shaped.extend(ip);
    shaped
}
