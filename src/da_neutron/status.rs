//! STATUS: whether an ADD could succeed now. Code 50 when the
//! controller is out of reach, or refused a port for the project's
//! quota within a minute (as an ADD noted), or a pool has no free
//! address where an ADD needs one: one of its subnets (a pool that lists
//! them asks each for an address), or every subnet of one IP version of
//! its network (the controller gives one address of each version). A token that may
//! not read the counts (Neutron's default policy keeps them to admins)
//! learns only that the network is there.

use super::api::{Controller, Free};
use super::error::NeutronError;
use super::settings::{Pool, Settings};
use super::state::State;

/// Runs STATUS.
pub fn status(settings: &Settings) -> Result<(), NeutronError> {
    // A termination request that stopped it keeps its own code.
    let not_available = |e: NeutronError| match e {
        NeutronError::Interrupted(_) => e,
        other => NeutronError::NotAvailable(other.to_string()),
    };
    // Keystone out of reach is the controller out of reach; a mistake in
    // the settings keeps its code.
    let controller = Controller::open(settings).map_err(|e| match e {
        NeutronError::Config(_) | NeutronError::Interrupted(_) => e,
        other => not_available(other),
    })?;
    // A refusal for the quota shows in no count of addresses.
    if let Some((message, ago)) = State::open(&settings.data_dir).over_quota() {
        return Err(NeutronError::NotAvailable(format!(
            "the controller at {} refused a port for the project's quota {ago} s ago ({message}); \
             raise the project's port quota, or delete ports",
            controller.url()
        )));
    }
    let mut networks: Vec<&str> = settings
        .pools
        .values()
        .map(|p| p.network.as_str())
        .collect();
    networks.sort();
    networks.dedup();
    for network in networks {
        let Some(free) = controller.free_addresses(network).map_err(not_available)? else {
            continue;
        };
        for (name, pool) in settings.pools.iter().filter(|(_, p)| p.network == network) {
            if let Some(full) = full(pool, &free) {
                return Err(NeutronError::NotAvailable(format!(
                    "pool {name:?}: network {network} has no free address {full} at {}",
                    controller.url()
                )));
            }
        }
    }
    Ok(())
}

/// Where `pool` has no address left for an ADD, if it has none.
fn full(pool: &Pool, free: &[Free]) -> Option<String> {
    if free.is_empty() {
        return Some("(it has no subnet)".into());
    }
    if !pool.subnets.is_empty() {
        return pool.subnets.iter().find_map(|id| {
            free.iter()
                .find(|f| f.subnet_id == *id && f.free == 0)
                .map(|_| format!("in subnet {id}"))
        });
    }
    let mut versions: Vec<u64> = free.iter().map(|f| f.ip_version).collect();
    versions.sort();
    versions.dedup();
    versions.into_iter().find_map(|version| {
        let left: u128 = free
            .iter()
            .filter(|f| f.ip_version == version)
            .map(|f| f.free)
            .sum();
        (left == 0).then(|| format!("of IP version {version}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(subnet: &str, version: u64, free: u128) -> Free {
        Free {
            subnet_id: subnet.into(),
            ip_version: version,
            free,
        }
    }

    #[test]
    fn a_pool_is_full_where_an_add_would_find_no_address() {
        let counts = [free("a4", 4, 0), free("b4", 4, 3), free("c6", 6, u128::MAX)];
        let network = |subnets: &[&str]| Pool {
            network: "n".into(),
            subnets: subnets.iter().map(|s| s.to_string()).collect(),
            warm: None,
        };
        // One IPv4 subnet of two is full: the controller takes the other.
        assert_eq!(full(&network(&[]), &counts), None);
        // A pool that asks subnet a4 for an address finds none.
        assert_eq!(
            full(&network(&["c6", "a4"]), &counts),
            Some("in subnet a4".into())
        );
        assert_eq!(full(&network(&["b4"]), &counts), None);
        // Every IPv4 subnet full: the controller refuses, IPv6 room or not.
        let counts = [free("a4", 4, 0), free("c6", 6, 10)];
        assert_eq!(full(&network(&[]), &counts), Some("of IP version 4".into()));
        // No subnet at all: no address ever.
        assert_eq!(full(&network(&[]), &[]), Some("(it has no subnet)".into()));
    }
}
