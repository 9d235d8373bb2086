//! What `ipam-da-pool check` finds wrong in a network's records: an
//! address held outside its pool's ranges (a range shrunk since), an
//! attachment whose addresses are not recorded as its own, an address
//! record no attachment can free (torn, or its attachment gone), one
//! address listed by two attachments, and attachments the runtime no
//! longer knows. Each finding is a sentence naming what to look at.

use std::collections::BTreeMap;

use super::range::Addr;
use super::settings::{Pool, Settings};
use super::store::{Holding, Owner, Store};
use crate::error::Error;

/// An attachment, as the runtime names it.
pub type Attachment = (String, String);

/// Everything wrong with the records, in the order found.
pub fn check(
    store: Option<&dyn Store>,
    settings: &Settings,
    holdings: &[Holding],
    records: &[(Addr, Option<Owner>)],
    valid: Option<&[Attachment]>,
) -> Result<Vec<String>, Error> {
    let mut findings = Vec::new();
    let who = |o: &Owner| format!("{}/{} (node {})", o.id, o.ifname, o.node);
    let recorded: BTreeMap<Addr, &Option<Owner>> = records.iter().map(|(a, o)| (*a, o)).collect();
    let mut listed: BTreeMap<Addr, &Owner> = BTreeMap::new();
    let mut pools: BTreeMap<&str, Option<Pool>> = BTreeMap::new();
    for holding in holdings {
        let owner = &holding.owner;
        for held in &holding.held {
            if !pools.contains_key(held.pool.as_str()) {
                let pool = known_pool(store, settings, &held.pool)?;
                pools.insert(&held.pool, pool);
            }
            if let Some(Some(pool)) = pools.get(held.pool.as_str()) {
                if pool.range_of(held.address).is_none() {
                    findings.push(format!(
                        "{} held by {} is outside every range of pool {:?}",
                        held.address,
                        who(owner),
                        held.pool
                    ));
                }
            }
            match recorded.get(&held.address) {
                None => findings.push(format!(
                    "{} lists {}, which has no record: it could be given to another",
                    who(owner),
                    held.address
                )),
                Some(Some(holder)) if !holder.same_attachment(owner) => findings.push(format!(
                    "{} lists {}, whose record says {} holds it",
                    who(owner),
                    held.address,
                    who(holder)
                )),
                _ => {}
            }
            if let Some(first) = listed.insert(held.address, owner) {
                findings.push(format!(
                    "{} is listed by both {} and {}",
                    held.address,
                    who(first),
                    who(owner)
                ));
            }
        }
    }
    for (address, owner) in records {
        match owner {
            None => findings.push(format!(
                "the record of {address} is torn or not ipam-da-pool's: no DEL or GC can free it"
            )),
            Some(owner) => {
                let lists = holdings.iter().any(|h| {
                    h.owner.same_attachment(owner)
                        && h.held.iter().any(|held| held.address == *address)
                });
                if !lists {
                    findings.push(format!(
                        "{address} is held by {}, whose attachment record does not list it: no DEL will free it",
                        who(owner)
                    ));
                }
            }
        }
    }
    if let Some(valid) = valid {
        for holding in holdings {
            let owner = &holding.owner;
            if !valid
                .iter()
                .any(|(id, ifname)| *id == owner.id && *ifname == owner.ifname)
            {
                findings.push(format!("{} is not among the valid attachments", who(owner)));
            }
        }
    }
    Ok(findings)
}

/// Pool `name` as the configuration or the store defines it, if either does.
fn known_pool(
    store: Option<&dyn Store>,
    settings: &Settings,
    name: &str,
) -> Result<Option<Pool>, Error> {
    if let Some(pool) = settings.pool(name) {
        return Ok(Some(pool.clone()));
    }
    let definition = match store {
        Some(store) => store.pool_definition(name)?,
        None => None,
    };
    Ok(definition.and_then(|d| Pool::parse(name, &d).ok()))
}

#[cfg(test)]
mod tests {
    use super::super::fake::Fake;
    use super::super::store::Held;
    use super::*;
    use crate::cni::NetConf;
    use serde_json::json;

    fn owner(id: &str) -> Owner {
        Owner {
            id: id.into(),
            ifname: "eth0".into(),
            node: "a".into(),
        }
    }

    fn addr(text: &str) -> Addr {
        Addr::new(text.parse().unwrap())
    }

    #[test]
    fn every_inconsistency_is_named() {
        let raw =
            json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "ipam-da-pool", "pool": {
                "node": "a", "pools": {"blue": [{"subnet": "10.4.0.0/28"}]},
            }}})
            .to_string();
        let settings = Settings::from_net(&NetConf::parse(raw.as_bytes()).unwrap()).unwrap();
        let store = Fake::default();
        let claim = |id: &str, address: &str| {
            let held = [Held {
                pool: "blue".into(),
                address: addr(address),
            }];
            assert!(store.claim(&owner(id), &held).unwrap());
        };
        claim("ok", "10.4.0.2");
        claim("outside", "10.4.0.3");
        claim("unrecorded", "10.4.0.4");
        claim("other", "10.4.0.5");
        claim("torn", "10.4.0.6");
        let mut holdings = store.holdings().unwrap();
        // A range shrunk since: .3 as if the pool were defined without it.
        let mut records = store.address_records().unwrap();
        records.retain(|(a, _)| *a != addr("10.4.0.4"));
        for (address, holder) in &mut records {
            if *address == addr("10.4.0.5") {
                *holder = Some(owner("thief"));
            }
            if *address == addr("10.4.0.6") {
                *holder = None;
            }
        }
        records.push((addr("10.4.0.9"), Some(owner("gone"))));
        for h in &mut holdings {
            if h.owner.id == "outside" {
                h.held[0].address = addr("10.4.1.3");
                records.push((addr("10.4.1.3"), Some(owner("outside"))));
            }
        }
        holdings.push(Holding {
            owner: owner("twin"),
            held: vec![Held {
                pool: "blue".into(),
                address: addr("10.4.0.2"),
            }],
            revision: 0,
            since: 0,
        });
        let valid: Vec<Attachment> = vec![("ok".into(), "eth0".into())];
        let found = check(Some(&store), &settings, &holdings, &records, Some(&valid)).unwrap();
        let expected = [
            "10.4.1.3 held by outside/eth0 (node a) is outside every range of pool \"blue\"",
            "unrecorded/eth0 (node a) lists 10.4.0.4, which has no record: it could be given to another",
            "other/eth0 (node a) lists 10.4.0.5, whose record says thief/eth0 (node a) holds it",
            "the record of 10.4.0.6 is torn or not ipam-da-pool's: no DEL or GC can free it",
            "10.4.0.3 is held by outside/eth0 (node a), whose attachment record does not list it: no DEL will free it",
            "10.4.0.5 is held by thief/eth0 (node a), whose attachment record does not list it: no DEL will free it",
            "10.4.0.9 is held by gone/eth0 (node a), whose attachment record does not list it: no DEL will free it",
            "outside/eth0 (node a) is not among the valid attachments",
            "10.4.0.2 is listed by both ok/eth0 (node a) and twin/eth0 (node a)",
            "twin/eth0 (node a) lists 10.4.0.2, whose record says ok/eth0 (node a) holds it",
        ];
        for sentence in expected {
            assert!(
                found.iter().any(|f| f == sentence),
                "missing {sentence:?} in {found:#?}"
            );
        }
        let clean = Fake::default();
        let (h, r) = (clean.holdings().unwrap(), clean.address_records().unwrap());
        assert!(check(Some(&clean), &settings, &h, &r, None)
            .unwrap()
            .is_empty());
    }
}
