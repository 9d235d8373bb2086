//! Docker's pools: the PoolID the driver gives Docker for a (network,
//! subnet, ip-range), and how many of Docker's requests hold each one, in
//! a record of the network's state next to its attachments. A pool no
//! request holds stays recorded, at none, until nothing of it is left.

use std::collections::BTreeMap;
use std::fmt;

use super::error::DockerError;
use crate::addr::Subnet;
use crate::delegated::agent::state;

/// The record's name in the network's state directory.
const RECORD: &str = "docker-pools";

/// What a PoolID names.
#[derive(Debug, PartialEq, Eq)]
pub struct PoolId {
    /// The CNI network.
    pub network: String,
    /// Docker's `--subnet`, or the one the configuration declares.
    pub subnet: Subnet,
    /// Docker's `--ip-range`, if given.
    pub range: Option<Subnet>,
}

impl PoolId {
    /// Reads `NETWORK/SUBNET[/RANGE]` (`kube/10.1.0.0/16/10.1.2.0/24`): a
    /// network name has no '/', and each subnet has exactly one.
    pub fn parse(text: &str) -> Result<PoolId, DockerError> {
        let bad = || DockerError::Request(format!("{text:?} is not a pool of this driver"));
        let parts: Vec<&str> = text.split('/').collect();
        let subnet = |at: usize| {
            Subnet::parse(&format!("{}/{}", parts[at], parts[at + 1])).map_err(|_| bad())
        };
        match parts.len() {
            3 => Ok(PoolId {
                network: parts[0].to_owned(),
                subnet: subnet(1)?,
                range: None,
            }),
            5 => Ok(PoolId {
                network: parts[0].to_owned(),
                subnet: subnet(1)?,
                range: Some(subnet(3)?),
            }),
            _ => Err(bad()),
        }
    }

    /// What the IDs of the pool's attachments start with: a digest of the
    /// PoolID (FNV-1a), since container IDs cannot hold '/' or ':'.
    pub fn attachment_prefix(&self) -> String {
        let digest = crate::dir::name_digest(&self.to_string());
        format!("docker-{digest:016x}-")
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.subnet)?;
        match &self.range {
            Some(range) => write!(f, "/{range}"),
            None => Ok(()),
        }
    }
}

/// How many of Docker's RequestPools hold each pool of a network.
#[derive(Debug, Default)]
pub struct PoolRequests(BTreeMap<String, u64>);

impl PoolRequests {
    /// The network's record; none yet is no request.
    pub fn read(network: &state::Network) -> Result<PoolRequests, DockerError> {
        let Some(bytes) = network.read_record(RECORD)? else {
            return Ok(PoolRequests::default());
        };
        serde_json::from_slice(&bytes).map(PoolRequests).map_err(|e| {
            DockerError::Request(format!(
                "the driver's record of pools ({RECORD} in the network's state directory) is damaged: {e}"
            ))
        })
    }

    /// Stores it, whole; no pool at all is no record (after `docker
    /// network rm`, the network's state holds nothing).
    pub fn write(&self, network: &state::Network) -> Result<(), DockerError> {
        if self.0.is_empty() {
            return Ok(network.remove_record(RECORD)?);
        }
        let bytes = serde_json::to_vec(&self.0).map_err(|e| DockerError::Request(e.to_string()))?;
        Ok(network.write_record(RECORD, &bytes)?)
    }

    /// Whether Docker holds `pool`.
    pub fn holds(&self, pool: &PoolId) -> bool {
        self.0
            .get(&pool.to_string())
            .is_some_and(|count| *count > 0)
    }

    /// One more request holds `pool`.
    pub fn add(&mut self, pool: &PoolId) {
        *self.0.entry(pool.to_string()).or_default() += 1;
    }

    /// One request less holds `pool` (none stays none).
    pub fn remove(&mut self, pool: &PoolId) {
        let count = self.0.entry(pool.to_string()).or_default();
        *count = count.saturating_sub(1);
    }

    /// The pools no request holds, whose leftovers may still be held.
    pub fn released(&self) -> Vec<String> {
        let released = self.0.iter().filter(|(_, count)| **count == 0);
        released.map(|(pool, _)| pool.clone()).collect()
    }

    /// Forgets a released pool, nothing of it being left.
    pub fn forget(&mut self, pool: &str) {
        self.0.remove(pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_ids_read_back_what_they_say() {
        for text in [
            "kube/10.1.0.0/16",
            "a.b-c/fd00::/64",
            "n/10.1.0.0/16/10.1.2.0/24",
        ] {
            assert_eq!(PoolId::parse(text).unwrap().to_string(), text);
        }
        let id = PoolId::parse("n/10.1.0.0/16/10.1.2.0/24").unwrap();
        assert_eq!(id.range.unwrap().to_string(), "10.1.2.0/24");
        for bad in [
            "",
            "n",
            "n/10.1.0.0",
            "n/10.1.0.1/16",
            "n/x/16",
            "n/10.1.0.0/16/10.1.2.0",
        ] {
            let e = PoolId::parse(bad).unwrap_err();
            assert!(
                e.to_string().contains("is not a pool of this driver"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn each_pool_has_its_own_attachment_prefix_a_container_id_can_start() {
        let a = PoolId::parse("n/10.1.0.0/16").unwrap().attachment_prefix();
        let b = PoolId::parse("n/10.1.0.0/16/10.1.2.0/24")
            .unwrap()
            .attachment_prefix();
        assert_ne!(a, b);
        assert_eq!(a.len(), "docker-".len() + 17);
        assert!(crate::cni::is_identifier(&format!("{a}0")));
    }

    #[test]
    fn requests_are_counted_per_pool_and_released_pools_kept_until_forgotten() {
        let (a, b) = (
            PoolId::parse("n/10.1.0.0/16").unwrap(),
            PoolId::parse("n/10.2.0.0/16").unwrap(),
        );
        let mut requests = PoolRequests::default();
        requests.add(&a);
        requests.add(&a);
        requests.add(&b);
        requests.remove(&a);
        assert!(requests.holds(&a));
        requests.remove(&a);
        requests.remove(&a);
        assert!(!requests.holds(&a) && requests.holds(&b));
        assert_eq!(requests.released(), ["n/10.1.0.0/16"]);
        requests.forget("n/10.1.0.0/16");
        assert!(requests.released().is_empty());
    }
}
