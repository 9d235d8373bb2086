//! The plugin's side of the warm pool: an ADD answered from the node's
//! ledger with no controller call (a claim written before the answer),
//! and a DEL or CHECK that finds a port handed out whose owner the
//! keeper has yet to record.

use std::time::{Duration, Instant};

use super::ledger::{Claim, Found, Ledger, Locked, Pooled, Shelf};
use crate::addr::Addr;
use crate::da_neutron::api::{Controller, Port, Subnet};
use crate::da_neutron::error::NeutronError;
use crate::da_neutron::ports::{self, Attachment, OWNER};
use crate::da_neutron::settings::{Pool, Settings};
use crate::da_neutron::wire::SubnetWire;

/// A port answered, with the subnet of each of its addresses.
pub type Answered = (Port, Vec<(Addr, Subnet)>);

/// The attachment an ADD is for.
pub struct For<'a> {
    pub network: &'a str,
    pub container: &'a str,
    pub ifname: &'a str,
    pub pod: Option<&'a str>,
}

/// A port from the warm pool of each pool in `pools` (name and
/// settings), every one with `warm` and none asked for an address: the
/// attachment's claims where an earlier ADD of it made them (`answered`,
/// the ports it answered with, must all be), else free ports claimed
/// now. `None`, and nothing claimed, unless every pool has one and, for a
/// new claim, the node's keeper is at work on a ledger it has
/// reconciled: the ADD then makes its ports as without a pool. The
/// ports chosen are given to `note` (the record of the ADD's answer),
/// then the claims written, before this returns.
pub fn take(
    settings: &Settings,
    attachment: &For,
    pools: &[(String, &Pool)],
    answered: Option<&[String]>,
    note: &dyn Fn(&[String]),
) -> Result<Option<Vec<Answered>>, NeutronError> {
    if pools.is_empty() || pools.iter().any(|(_, pool)| pool.warm.is_none()) {
        return Ok(None);
    }
    let Some(shelf) = Shelf::open(&settings.data_dir) else {
        return Ok(None);
    };
    let locked = shelf.lock(Instant::now() + settings.timeout)?;
    let Found::Ledger(mut ledger) = locked.read(attachment.network) else {
        return Ok(None);
    };
    // A repeated ADD answers its claims, or finds its ports as without a
    // pool: it never takes a second port.
    if let Some(ids) = answered {
        let claims: Vec<&String> = ledger
            .claims_of(attachment.container, attachment.ifname)
            .map(|(id, _)| id)
            .collect();
        if !ids.iter().all(|id| claims.contains(&id)) {
            return Ok(None);
        }
    }
    // New claims only within a grace of the keeper's last heartbeat on
    // the controller: the other nodes' keepers take the node for gone,
    // and delete its ports that look free, only two graces on.
    let within = Duration::from_secs(settings.gc_grace);
    let may_claim = ledger.reconciled && shelf.beating(attachment.network, within);
    let mut chosen = Vec::new();
    let mut claimed_now = false;
    for (name, _) in pools {
        let earlier = ledger
            .claims_of(attachment.container, attachment.ifname)
            .find(|(_, c)| c.port.pool == *name)
            .map(|(id, _)| id.clone());
        let id = match earlier {
            Some(id) => id,
            None if !may_claim => {
                tracing::debug!("the warm pool's keeper is not at work: no hand-out");
                return Ok(None);
            }
            None => {
                // One whose every subnet an answer can be made from.
                let free = ledger
                    .free
                    .iter()
                    .find(|(_, p)| p.pool == *name && answerable(&ledger, p).is_some())
                    .map(|(id, _)| id.clone());
                let Some(id) = free else {
                    tracing::debug!("the warm pool of {name:?} is empty: no hand-out");
                    return Ok(None);
                };
                let Some(port) = ledger.free.remove(&id) else {
                    return Ok(None);
                };
                ledger.claimed.insert(
                    id.clone(),
                    Claim {
                        port,
                        container: attachment.container.to_owned(),
                        ifname: attachment.ifname.to_owned(),
                        pod: attachment.pod.map(String::from),
                    },
                );
                claimed_now = true;
                id
            }
        };
        chosen.push(id);
    }
    if claimed_now {
        // What the attachment is answered with, on record first: a
        // retried ADD finds it again, whether its owner is recorded on
        // the port by then or not (a record of ports never claimed costs
        // a retried ADD only the pool's answer).
        note(&chosen);
        // Not written, not handed out: the ADD makes its ports instead.
        if let Err(e) = locked.write(attachment.network, &ledger) {
            tracing::warn!("no hand-out from the warm pool: {e}");
            return Ok(None);
        }
    }
    drop(locked);
    let mut answered = Vec::new();
    for id in chosen {
        let claim = &ledger.claimed[&id];
        let Some(addresses) = answerable(&ledger, &claim.port) else {
            return Ok(None);
        };
        let port = Port {
            id: id.clone(),
            name: ports::name(attachment.network, &claim.port.pool, attachment.ifname),
            network_id: claim.port.network_id.clone(),
            device_id: attachment.container.to_owned(),
            device_owner: OWNER.to_owned(),
            description: String::new(),
            fixed_ips: addresses.iter().map(|(a, s)| (s.id.clone(), *a)).collect(),
            tags: Vec::new(),
            created_at: None,
            updated_at: None,
            revision_number: None,
        };
        tracing::info!(
            "port {id} handed out from the warm pool of {:?}",
            claim.port.pool
        );
        answered.push((port, addresses));
    }
    Ok(Some(answered))
}

/// `port`'s addresses with their subnets, if the ledger has every one.
fn answerable(ledger: &Ledger, port: &Pooled) -> Option<Vec<(Addr, Subnet)>> {
    if port.fixed_ips.is_empty() {
        return None;
    }
    port.fixed_ips
        .iter()
        .map(|(subnet_id, address)| {
            let wire: SubnetWire =
                serde_json::from_value(ledger.subnets.get(subnet_id)?.clone()).ok()?;
            let subnet = wire.subnet()?;
            let address: Addr = Addr::new(address.parse().ok()?);
            subnet
                .refusal(address)
                .is_none()
                .then_some((address, subnet))
        })
        .collect()
}

/// The attachment's ports handed out from the warm pool of CNI network
/// `network` whose owner is not on the controller yet, as the controller
/// has them (one gone is left out).
pub fn claimed(
    settings: &Settings,
    controller: &Controller,
    network: &str,
    container: &str,
    ifname: &str,
) -> Result<Vec<(Port, Attachment)>, NeutronError> {
    let Some(shelf) = Shelf::open(&settings.data_dir) else {
        return Ok(Vec::new());
    };
    let Found::Ledger(ledger) = shelf.peek(network) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for (id, claim) in ledger.claims_of(container, ifname) {
        if let Some(port) = controller.port(id)? {
            let attachment = Attachment {
                container: container.to_owned(),
                ifname: ifname.to_owned(),
                pool: claim.port.pool.clone(),
            };
            found.push((port, attachment));
        }
    }
    Ok(found)
}

/// DEL: deletes the attachment's ports handed out from the warm pool whose
/// owner is not on the controller yet, then forgets their claims.
pub fn delete_claimed(
    settings: &Settings,
    controller: &Controller,
    network: &str,
    container: &str,
    ifname: &str,
) -> Result<(), NeutronError> {
    let Some(shelf) = Shelf::open(&settings.data_dir) else {
        return Ok(());
    };
    let ids: Vec<String> = match shelf.peek(network) {
        Found::Ledger(ledger) => ledger
            .claims_of(container, ifname)
            .map(|(id, _)| id.clone())
            .collect(),
        _ => return Ok(()),
    };
    if ids.is_empty() {
        return Ok(());
    }
    for id in &ids {
        // Whether the keeper recorded its owner meanwhile or not.
        controller.delete_port(id)?;
        tracing::info!("DEL deletes port {id}, handed out from the warm pool");
    }
    forget(
        &shelf.lock(Instant::now() + settings.timeout)?,
        network,
        &ids,
    )
}

/// Forgets the claims on ports `ids` (deleted, or their owner recorded).
pub fn forget(locked: &Locked, network: &str, ids: &[String]) -> Result<(), NeutronError> {
    if let Found::Ledger(mut ledger) = locked.read(network) {
        let before = ledger.claimed.len();
        ledger.claimed.retain(|id, _| !ids.contains(id));
        if ledger.claimed.len() != before {
            locked.write(network, &ledger)?;
        }
    }
    Ok(())
}
