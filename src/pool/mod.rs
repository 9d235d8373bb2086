//! ipam-da-pool, the allocation delegate: one address from each pool an
//! ADD asks for (`prevResult.pools`, as a selector prints them, else
//! `ipam.pool.default`), kept in a store (local files, or etcd shared by
//! every node) with who holds it; given back on DEL, verified on CHECK,
//! and freed on GC when the runtime no longer knows its attachment, on
//! this node only. A store never decides what a command means; a command
//! never knows which store it talks to.

mod cli;
mod etcd;
#[cfg(test)]
mod fake;
mod import;
mod local;
mod range;
mod settings;
mod store;

use std::io::Write;

use serde_json::{json, Value};
use tracing::warn;

use crate::cni::{self, Environment, NetConf};
use crate::error::Error;
use crate::skel::{self, Plugin};
pub use cli::main as command_line;
pub(crate) use range::Addr;
use range::{Family, Range};
pub(crate) use settings::{requested_by_runtime, Pool, Wanted};
use settings::{Settings, StoreSettings};
use store::{Held, Holding, Owner, Store};

/// How many times a command starts again after losing a race for a key to
/// another node, before it says "try again later".
const ATTEMPTS: usize = 8;

/// ipam-da-pool as a CNI plugin.
pub struct Allocator;

impl Plugin for Allocator {
    fn add(&self, env: &Environment, net: NetConf, stdout: &mut dyn Write) -> Result<(), Error> {
        let settings = Settings::from_net(&net)?;
        let store = open(&settings, &net.name)?;
        let asked = settings::requested_by_runtime(env, &net)?;
        let result = add(&*store, &net, &settings, &owner(env, &settings), &asked)?;
        skel::write_reply(stdout, &result)
    }

    fn del(&self, env: &Environment, net: NetConf) -> Result<(), Error> {
        let settings = Settings::from_net(&net)?;
        let store = open(&settings, &net.name)?;
        del(&*store, &owner(env, &settings))
    }

    fn check(&self, env: &Environment, net: NetConf) -> Result<(), Error> {
        let settings = Settings::from_net(&net)?;
        let store = open(&settings, &net.name)?;
        check(&*store, &net, &owner(env, &settings))
    }

    fn gc(&self, _env: &Environment, net: NetConf) -> Result<(), Error> {
        let settings = Settings::from_net(&net)?;
        let store = open(&settings, &net.name)?;
        gc(&*store, &net, &settings)
    }

    fn status(&self, _env: &Environment, net: NetConf) -> Result<(), Error> {
        let settings = Settings::from_net(&net)?;
        let store = open(&settings, &net.name).map_err(|e| Error::NotAvailable(e.to_string()))?;
        status(&*store, &settings)
    }
}

/// The store the settings name, for network `name`.
fn open(settings: &Settings, name: &str) -> Result<Box<dyn Store>, Error> {
    Ok(match &settings.store {
        StoreSettings::Local { data_dir } => Box::new(local::Local::open(data_dir, name)?),
        StoreSettings::Etcd(cluster) => Box::new(etcd::Etcd::new(
            crate::etcd::Client::new(cluster.clone())?,
            name,
        )),
    })
}

/// The attachment a command is for. ADD, DEL and CHECK always have both
/// variables (the environment's rules), so the defaults are never used.
fn owner(env: &Environment, settings: &Settings) -> Owner {
    Owner {
        id: env.container_id.clone().unwrap_or_default(),
        ifname: env.ifname.clone().unwrap_or_default(),
        node: settings.node.clone(),
    }
}

/// ADD: what the attachment holds already, if anything (an ADD repeated
/// gets the same addresses); else an address from each pool asked for,
/// claimed all together. `asked` are the addresses the runtime asks for.
fn add(
    store: &dyn Store,
    net: &NetConf,
    settings: &Settings,
    owner: &Owner,
    asked: &[Addr],
) -> Result<Vec<u8>, Error> {
    let wanted = settings::wanted(net, settings)?;
    let pools: Vec<Pool> = wanted
        .iter()
        .map(|w| pool_of(store, settings, w))
        .collect::<Result<_, _>>()?;
    for address in asked {
        if !pools.iter().any(|p| p.range_of(*address).is_some()) {
            let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
            return Err(Error::AddressUnavailable {
                address: address.to_string(),
                pool: names.join(", "),
                why: "it is in none of the pools asked for".into(),
            });
        }
    }
    let mut lost = 0;
    for _ in 0..ATTEMPTS {
        if let Some(holding) = store.holding(&owner.id, &owner.ifname)? {
            if holds_all(store, &holding)? {
                return reply(store, net, settings, &pools, &holding.held);
            }
            // A claim cut short (the allocator killed between its record
            // and its addresses): what it got is given back, and the ADD
            // starts afresh, rather than answer with an address another
            // attachment may hold.
            warn!(
                "{}/{} holds only part of what its record lists: claiming again",
                owner.id, owner.ifname
            );
            store.release(&holding)?;
            continue;
        }
        let mut chosen = Vec::new();
        for (w, pool) in wanted.iter().zip(&pools) {
            let requested = w
                .requested
                .or_else(|| asked.iter().copied().find(|a| pool.range_of(*a).is_some()));
            let address = match requested {
                Some(address) => check_requested(store, pool, address, owner)?,
                None => choose_free(store, pool, starting_point(store, pool, lost)?)?,
            };
            chosen.push(Held {
                pool: pool.name.clone(),
                address,
            });
        }
        if store.claim(owner, &chosen)? {
            return reply(store, net, settings, &pools, &chosen);
        }
        lost += 1;
    }
    Err(Error::Busy(format!(
        "another node took the addresses chosen, {ATTEMPTS} times over"
    )))
}

/// Whether the attachment holds every address its record lists.
fn holds_all(store: &dyn Store, holding: &Holding) -> Result<bool, Error> {
    for h in &holding.held {
        let holder = store.holder(&h.pool, h.address)?;
        if !holder.is_some_and(|o| o.id == holding.owner.id && o.ifname == holding.owner.ifname) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The pool `wanted` names: its inline ranges, else the configuration's,
/// else the store's.
fn pool_of(store: &dyn Store, settings: &Settings, wanted: &Wanted) -> Result<Pool, Error> {
    if let Some(pool) = &wanted.inline {
        return Ok(pool.clone());
    }
    find_pool(store, settings, &wanted.name)?.ok_or_else(|| {
        cni::Error::InvalidConfig(format!(
            "pool {:?} is not defined: not in the previous result, nor in \"ipam.pool.pools\", nor in the store",
            wanted.name
        ))
        .into()
    })
}

/// Pool `name` as the configuration defines it, else the store.
fn find_pool(store: &dyn Store, settings: &Settings, name: &str) -> Result<Option<Pool>, Error> {
    if let Some(pool) = settings.pool(name) {
        return Ok(Some(pool.clone()));
    }
    match store.pool_definition(name)? {
        Some(ranges) => Pool::parse(name, &ranges).map(Some),
        None => Ok(None),
    }
}

/// `address`, asked for, if the pool may give it and nobody else holds it;
/// else why not (code 111), with nothing claimed.
fn check_requested(
    store: &dyn Store,
    pool: &Pool,
    address: Addr,
    owner: &Owner,
) -> Result<Addr, Error> {
    let refuse = |why: String| Error::AddressUnavailable {
        address: address.to_string(),
        pool: pool.name.clone(),
        why,
    };
    let Some(range) = pool.range_of(address) else {
        return Err(refuse("it is outside the pool's ranges".into()));
    };
    if !range.gives(address) {
        let what = if address == range.gateway {
            "the gateway"
        } else if address == range.network {
            "the network address"
        } else {
            "the broadcast address"
        };
        return Err(refuse(format!("it is {what} of {}", range.subnet())));
    }
    match store.holder(&pool.name, address)? {
        Some(holder) if holder.id != owner.id || holder.ifname != owner.ifname => {
            Err(refuse(format!(
                "it is held by {}/{} on node {}",
                holder.id, holder.ifname, holder.node
            )))
        }
        _ => Ok(address),
    }
}

/// Where an attempt starts looking in `pool`: until a race is lost, from
/// the hint (just after the last address given; the first range's start
/// without one), so that addresses go round the pool in order; after `lost` races, at a random address of a
/// random range, so that the nodes that raced for one address spread out
/// rather than race again for the next.
fn starting_point(store: &dyn Store, pool: &Pool, lost: usize) -> Result<Addr, Error> {
    if lost > 0 {
        return Ok(random_address(pool));
    }
    let hint = store.hint(&pool.name)?;
    Ok(hint
        .filter(|h| pool.range_of(*h).is_some())
        .unwrap_or(pool.ranges[0].start))
}

/// A number no other process draws: SipHash keyed from the system's
/// randomness, which std seeds once per thread and steps per use.
fn random() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0u8)
}

/// How many addresses one look at a place covers: one page of etcd keys
/// costs what one key does, a few probes of local files next to nothing.
const WINDOW: u128 = 16;

/// How many random places a search looks at before it goes through the
/// pool in order. However a pool 90 % full is laid out, a random place is
/// free one time in ten: 64 looks all fail once in a thousand searches.
const RANDOM_LOOKS: usize = 64;

/// A free address of `pool`, as cheap to find in a nearly full pool as in
/// an empty one: first just from `start`, then at random places, and only
/// then (a pool that may be exhausted) through every range in order, from
/// `start` round to it again.
fn choose_free(store: &dyn Store, pool: &Pool, start: Addr) -> Result<Addr, Error> {
    let look = |at: Addr| -> Result<Option<Addr>, Error> {
        let Some(range) = pool.range_of(at) else {
            return Ok(None);
        };
        let to = at
            .plus(WINDOW - 1)
            .filter(|to| *to <= range.end)
            .unwrap_or(range.end);
        store.first_free(&pool.name, at, to, &|a| range.gives(a))
    };
    let randoms = (0..RANDOM_LOOKS).map(|_| random_address(pool));
    for at in std::iter::once(start).chain(randoms) {
        if let Some(free) = look(at)? {
            return Ok(free);
        }
    }
    let first = pool
        .ranges
        .iter()
        .position(|r| r.contains(start))
        .unwrap_or(0);
    let count = pool.ranges.len();
    for i in 0..count {
        let range = &pool.ranges[(first + i) % count];
        let from = if i == 0 { start } else { range.start };
        let gives = |a: Addr| range.gives(a);
        if let Some(free) = store.first_free(&pool.name, from, range.end, &gives)? {
            return Ok(free);
        }
    }
    let range = &pool.ranges[first];
    let gives = |a: Addr| range.gives(a);
    if let Some(free) = store.first_free(&pool.name, range.start, start, &gives)? {
        return Ok(free);
    }
    Err(Error::PoolExhausted {
        pool: pool.name.clone(),
    })
}

/// An address of `pool` drawn at random, every address alike (within the
/// first 2^64 of a range).
fn random_address(pool: &Pool) -> Addr {
    let sizes: Vec<u128> = pool.ranges.iter().map(Range::size).collect();
    let total = sizes
        .iter()
        .fold(0u128, |sum, size| sum.saturating_add(*size));
    let mut n = u128::from(random()) % total.max(1);
    for (range, size) in pool.ranges.iter().zip(sizes) {
        if n < size {
            return range.at(n);
        }
        n -= size;
    }
    pool.ranges[0].start
}

/// The result of an ADD that gives `held`: every member of the previous
/// result kept in its place but those the allocator sets (`cniVersion`,
/// `ips`, and `routes` when `ipam.pool.routes` is set), which are set in
/// the configuration's version.
fn reply(
    store: &dyn Store,
    net: &NetConf,
    settings: &Settings,
    pools: &[Pool],
    held: &[Held],
) -> Result<Vec<u8>, Error> {
    let legacy = matches!(net.cni_version, "0.3.0" | "0.3.1" | "0.4.0");
    let mut ips = Vec::new();
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
        let range: &Range = pool.range_of(h.address).ok_or_else(|| {
            cni::Error::InvalidConfig(format!(
                "{} is outside pool {:?}'s ranges as they are now defined",
                h.address, h.pool
            ))
        })?;
        let mut ip = serde_json::Map::new();
        if legacy {
            let version = if h.address.family() == Family::V4 {
                "4"
            } else {
                "6"
            };
            ip.insert("version".into(), json!(version));
        }
        ip.insert(
            "address".into(),
            json!(format!("{}/{}", h.address, range.prefix)),
        );
        ip.insert("gateway".into(), json!(range.gateway.to_string()));
        ips.push(Value::Object(ip));
    }
    let ips = Value::Array(ips).to_string();
    let mut set = vec![("ips", ips.as_str())];
    if let Some(routes) = &settings.routes {
        set.push(("routes", routes));
    }
    Ok(net.result_on_previous(&set))
}

/// DEL: gives back what the attachment holds, if anything.
fn del(store: &dyn Store, owner: &Owner) -> Result<(), Error> {
    for _ in 0..ATTEMPTS {
        let Some(holding) = store.holding(&owner.id, &owner.ifname)? else {
            return Ok(());
        };
        if store.release(&holding)? {
            return Ok(());
        }
    }
    Err(Error::Busy(format!(
        "{}/{}'s record changed under every one of {ATTEMPTS} attempts to release it",
        owner.id, owner.ifname
    )))
}

/// CHECK: every address of the previous result must be held by the
/// attachment, in the store's records of both.
fn check(store: &dyn Store, net: &NetConf, owner: &Owner) -> Result<(), Error> {
    let prev: Value = net
        .member("prevResult")
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
        .ok_or_else(|| {
            cni::Error::InvalidConfig("CHECK needs the ADD's result as \"prevResult\"".into())
        })?;
    let holding = store.holding(&owner.id, &owner.ifname)?;
    let not_held = |address: &str, why: String| Error::NotHeld {
        address: address.to_owned(),
        id: owner.id.clone(),
        ifname: owner.ifname.clone(),
        why,
    };
    for ip in prev
        .get("ips")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let text = ip
            .get("address")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let Some(address) = text
            .split('/')
            .next()
            .and_then(|a| a.parse().ok())
            .map(Addr::new)
        else {
            return Err(not_held(text, "it is not an address".into()));
        };
        let Some(held) = holding
            .as_ref()
            .and_then(|h| h.held.iter().find(|h| h.address == address))
        else {
            return Err(not_held(
                text,
                "the attachment's record does not list it".into(),
            ));
        };
        match store.holder(&held.pool, address)? {
            Some(o) if o.id == owner.id && o.ifname == owner.ifname => {}
            Some(o) => {
                return Err(not_held(
                    text,
                    format!(
                        "pool {:?} records {}/{} on node {} as its holder",
                        held.pool, o.id, o.ifname, o.node
                    ),
                ))
            }
            None => {
                return Err(not_held(
                    text,
                    format!("pool {:?} has no record of it", held.pool),
                ))
            }
        }
    }
    Ok(())
}

/// GC (CNI 1.1): frees what this node's attachments hold that the runtime
/// no longer lists in `cni.dev/valid-attachments`; another node's are its
/// own runtime's business. An attachment younger than the grace is kept:
/// its ADD may have finished after the runtime made its list.
fn gc(store: &dyn Store, net: &NetConf, settings: &Settings) -> Result<(), Error> {
    let valid: Vec<(String, String)> = match net.member("cni.dev/valid-attachments") {
        None => Vec::new(),
        Some(raw) => serde_json::from_str::<Vec<Value>>(raw.get())
            .map_err(|_| {
                cni::Error::InvalidConfig("\"cni.dev/valid-attachments\" must be an array".into())
            })?
            .iter()
            .filter_map(|a| {
                Some((
                    a.get("containerID")?.as_str()?.to_owned(),
                    a.get("ifname")?.as_str()?.to_owned(),
                ))
            })
            .collect(),
    };
    let now = store::now();
    let stale = |h: &Holding| {
        h.owner.node == settings.node
            && h.since.saturating_add(settings.gc_grace) <= now
            && !valid
                .iter()
                .any(|(id, ifname)| *id == h.owner.id && *ifname == h.owner.ifname)
    };
    for holding in store.holdings()?.into_iter().filter(stale) {
        // A record that changed meanwhile is a new ADD's: the next GC
        // judges it.
        store.release(&holding)?;
    }
    Ok(())
}

/// STATUS: the store answers, and every pool the configuration defines
/// has a free address.
fn status(store: &dyn Store, settings: &Settings) -> Result<(), Error> {
    let not_available = |e: Error| Error::NotAvailable(e.to_string());
    store.ping().map_err(not_available)?;
    for pool in &settings.pools {
        let start = starting_point(store, pool, 0).map_err(not_available)?;
        choose_free(store, pool, start).map_err(not_available)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::fake::Fake;
    use super::*;
    use crate::error::code;

    /// A configuration with `ipam.pool` set to `pool` and the previous
    /// result `prev`, at `version`.
    fn config(version: &str, pool: Value, prev: Option<Value>) -> Vec<u8> {
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

    fn pools() -> Value {
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

    fn owner(id: &str) -> Owner {
        Owner {
            id: id.into(),
            ifname: "eth0".into(),
            node: "node-a".into(),
        }
    }

    /// ADD for container `id` with `raw` as configuration.
    fn add_for(store: &Fake, raw: &[u8], id: &str, asked: &[&str]) -> Result<Value, Error> {
        let net = NetConf::parse(raw).unwrap();
        let settings = Settings::from_net(&net)?;
        let asked: Vec<Addr> = asked
            .iter()
            .map(|a| Addr::new(a.parse().unwrap()))
            .collect();
        let result = add(store, &net, &settings, &owner(id), &asked)?;
        Ok(serde_json::from_slice(&result).unwrap())
    }

    fn addresses(result: &Value) -> Vec<&str> {
        result["ips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ip| ip["address"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn add_gives_one_address_from_each_pool_and_again_the_same_to_the_same_attachment() {
        let store = Fake::default();
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
        let store = Fake::default();
        let raw = config("1.0.0", pools(), None);
        let first = add_for(&store, &raw, "c1", &[]).unwrap();
        // As a SIGKILL between the records leaves it: c1's record lists
        // 10.1.0.2, which c1 never got, and which c2 holds now.
        store.addresses.borrow_mut().insert(
            ("blue".into(), Addr::new("10.1.0.2".parse().unwrap())),
            owner("c2"),
        );
        let again = add_for(&store, &raw, "c1", &[]).unwrap();
        assert_ne!(addresses(&again)[0], addresses(&first)[0]);
        assert_eq!(addresses(&again), ["10.1.0.3/29", "fd00::3/64"]);
        let holders = store.addresses.borrow();
        assert_eq!(
            holders[&("blue".into(), Addr::new("10.1.0.2".parse().unwrap()))].id,
            "c2"
        );
        assert!(
            !holders.contains_key(&("blue6".into(), Addr::new("fd00::2".parse().unwrap()))),
            "what the cut claim got is given back"
        );
    }

    #[test]
    fn the_previous_results_members_stay_in_place_and_legacy_versions_say_the_ip_version() {
        let store = Fake::default();
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
        let store = Fake::default();
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
        let store = Fake::default();
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
        ] {
            let e = add_for(&store, &raw, "c2", &[asked]).unwrap_err();
            assert_eq!(e.code(), code::ADDRESS_UNAVAILABLE, "{asked}");
            assert!(e.to_string().contains(said), "{asked}: {e}");
        }
        assert_eq!(store.held().len(), 2, "nothing claimed by the refusals");
    }

    #[test]
    fn an_exhausted_pool_is_code_110_and_claims_nothing_from_the_others() {
        let store = Fake::default();
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
    fn allocation_goes_on_after_the_last_address_given_then_wraps() {
        let store = Fake::default();
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
        let store = Fake::default();
        for n in 2..=58_982 {
            store
                .addresses
                .borrow_mut()
                .insert(("big".into(), at(n)), holder.clone());
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
        let store = Fake::default();
        for n in (2..=65_534).filter(|n| n % 10 != 0) {
            store
                .addresses
                .borrow_mut()
                .insert(("big".into(), at(n)), holder.clone());
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
        let store = Fake::default();
        let prev = json!({"pools": [{"name": "wide", "subnet": "fd00:1::/48"}]});
        let raw = config("1.0.0", json!({"node": "node-a"}), Some(prev));
        for id in 0..50 {
            add_for(&store, &raw, &format!("c{id}"), &[]).unwrap();
        }
        // Each ADD looked at about one address.
        assert!(store.looked_at.get() < 100, "{}", store.looked_at.get());
    }

    #[test]
    fn a_lost_race_is_run_again_and_one_lost_for_ever_is_try_again_later() {
        let store = Fake::default();
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
    fn after_a_lost_race_the_search_starts_at_random() {
        let store = Fake::default();
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
    fn del_gives_back_and_succeeds_when_nothing_is_held() {
        let store = Fake::default();
        let raw = config("1.0.0", pools(), None);
        add_for(&store, &raw, "c1", &[]).unwrap();
        del(&store, &owner("c1")).unwrap();
        del(&store, &owner("c1")).unwrap();
        del(&store, &owner("never")).unwrap();
        assert!(store.held().is_empty() && store.attachments.borrow().is_empty());
    }

    #[test]
    fn check_fails_unless_the_previous_results_addresses_are_the_attachments() {
        let store = Fake::default();
        let raw = config("1.0.0", pools(), None);
        let result = add_for(&store, &raw, "c1", &[]).unwrap();
        add_for(&store, &raw, "c2", &[]).unwrap();
        let checked = |id: &str, prev: &Value| {
            let raw = config("1.0.0", pools(), Some(prev.clone()));
            check(&store, &NetConf::parse(&raw).unwrap(), &owner(id))
        };
        checked("c1", &result).unwrap();
        let e = checked("c2", &result).unwrap_err();
        assert_eq!(e.code(), code::NOT_HELD);
        assert!(
            e.to_string()
                .starts_with("10.1.0.2/29 is not held by c2/eth0"),
            "{e}"
        );
        del(&store, &owner("c1")).unwrap();
        assert_eq!(checked("c1", &result).unwrap_err().code(), code::NOT_HELD);
    }

    #[test]
    fn gc_frees_only_this_nodes_unlisted_attachments_old_enough() {
        let store = Fake::default();
        let raw = config("1.1.0", pools(), None);
        for id in ["kept", "stale", "young", "elsewhere"] {
            add_for(&store, &raw, id, &[]).unwrap();
        }
        {
            let mut attachments = store.attachments.borrow_mut();
            for ((id, _), holding) in attachments.iter_mut() {
                if id != "young" {
                    holding.since -= 2 * settings::DEFAULT_GC_GRACE_SECONDS;
                }
                if id == "elsewhere" {
                    holding.owner.node = "node-b".into();
                }
            }
        }
        let mut gc_config: Value = serde_json::from_slice(&raw).unwrap();
        gc_config["cni.dev/valid-attachments"] = json!([{"containerID": "kept", "ifname": "eth0"}]);
        let gc_raw = gc_config.to_string().into_bytes();
        let gc_net = NetConf::parse(&gc_raw).unwrap();
        let mut settings = Settings::from_net(&gc_net).unwrap();
        let left = |store: &Fake| -> Vec<String> {
            let attachments = store.attachments.borrow();
            attachments.keys().map(|(id, _)| id.clone()).collect()
        };
        gc(&store, &gc_net, &settings).unwrap();
        assert_eq!(left(&store), ["elsewhere", "kept", "young"]);
        settings.gc_grace = 0;
        gc(&store, &gc_net, &settings).unwrap();
        assert_eq!(
            left(&store),
            ["elsewhere", "kept"],
            "no grace: young goes too"
        );
    }

    #[test]
    fn status_says_which_pool_is_exhausted() {
        let store = Fake::default();
        let raw = config("1.1.0", pools(), Some(json!({"pools": [{"name": "tiny"}]})));
        let net = NetConf::parse(&raw).unwrap();
        let settings = Settings::from_net(&net).unwrap();
        status(&store, &settings).unwrap();
        add(&store, &net, &settings, &owner("c1"), &[]).unwrap();
        let e = status(&store, &settings).unwrap_err();
        assert_eq!(e.code(), code::NOT_AVAILABLE);
        assert!(e.to_string().contains("\"tiny\""), "{e}");
    }

    #[test]
    fn a_pool_may_be_defined_by_the_store() {
        let mut store = Fake::default();
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
