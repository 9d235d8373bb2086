//! What a request left for later, in a record of the network's state: an
//! ADD begun (recorded before the stack runs, forgotten once its result is
//! kept: one still recorded was cut short by the driver's death), and an
//! address whose release failed (an etcd blip in the stack's DEL). Each
//! is undone, a DEL through the stack, at the network's next request, on
//! the driver's timer and at its start, until one succeeds.

use std::collections::BTreeMap;

use tracing::{info, warn};

use super::error::DockerError;
use super::networks::Network;
use super::pool_ids::PoolId;
use crate::delegated::agent::state;
use crate::delegated::DelegatedError;

/// The record's name in the network's state directory.
const RECORD: &str = "docker-leftovers";

/// Attachments to undo, by container ID, each with the PoolID it was for.
#[derive(Debug, Default)]
pub struct Leftovers(BTreeMap<String, String>);

impl Leftovers {
    /// The network's record; none is nothing left.
    pub fn read(network: &state::Network) -> Result<Leftovers, DockerError> {
        let Some(bytes) = network.read_record(RECORD)? else {
            return Ok(Leftovers::default());
        };
        serde_json::from_slice(&bytes).map(Leftovers).map_err(|e| {
            DockerError::Request(format!(
                "the driver's record of what is left to undo ({RECORD} in the network's state directory) is damaged: {e}"
            ))
        })
    }

    /// Stores it, whole; nothing left is no record.
    fn write(&self, network: &state::Network) -> Result<(), DockerError> {
        if self.0.is_empty() {
            return Ok(network.remove_record(RECORD)?);
        }
        let bytes = serde_json::to_vec(&self.0).map_err(|e| DockerError::Request(e.to_string()))?;
        Ok(network.write_record(RECORD, &bytes)?)
    }

    /// Records, durably, that attachment `id` of `pool` is to be undone
    /// unless it is forgotten first.
    pub fn add(network: &state::Network, id: &str, pool: &PoolId) -> Result<(), DockerError> {
        let mut leftovers = Leftovers::read(network)?;
        leftovers.0.insert(id.to_owned(), pool.to_string());
        leftovers.write(network)
    }

    /// Forgets attachment `id`: nothing of it is left to undo.
    pub fn forget(network: &state::Network, id: &str) -> Result<(), DockerError> {
        let mut leftovers = Leftovers::read(network)?;
        if leftovers.0.remove(id).is_some() {
            leftovers.write(network)?;
        }
        Ok(())
    }
}

/// Undoes what is left in `state`, network `net`'s, with `release` (the
/// DEL through the stack of the attachment of a container ID, then
/// forgotten): each one undone is forgotten, each failure said and kept
/// for the next time.
pub fn undo(
    net: &Network,
    state: &state::Network,
    release: impl Fn(&Network, &PoolId, &str) -> Result<(), DelegatedError>,
) -> Result<(), DockerError> {
    let mut leftovers = Leftovers::read(state)?;
    if leftovers.0.is_empty() {
        return Ok(());
    }
    leftovers.0.retain(|id, pool| {
        let Ok(pool) = PoolId::parse(pool) else {
            warn!("{RECORD}: {pool:?} is not a pool of this driver: forgetting {id}");
            return false;
        };
        match release(net, &pool, id) {
            Ok(()) => {
                info!("{id} of pool {pool}, left to undo, is released");
                false
            }
            Err(e) => {
                warn!("{id} of pool {pool} is still to release: {e}");
                true
            }
        }
    });
    leftovers.write(state)
}
