//! The warm pool: ports a node's keeper makes ahead of need
//! (`ipam.neutron.warm`), which an ADD of that node hands out with no
//! controller call. What marks a pooled port, and the settings; the
//! ledger that keeps what the node may hand out is in [`ledger`], the
//! hand-out in [`handout`], the keeper in [`keeper`].
//!
//! The rules that keep it safe:
//! - a pooled port is one node's: it carries the node's, the network's
//!   and the cluster's marks, an empty `device_id`, a name without an
//!   interface (`NETWORK/POOL`, which no attachment's name is), the tag
//!   [`FREE`], and the tag of the ledger it was made for ([`EPOCH`]);
//! - only that node hands it out, and only from its ledger's free
//!   records, under the node-wide lock; the claim is on disk (synced,
//!   then renamed into place) before the answer is printed;
//! - the keeper then records the owner on the port (`device_id`, name,
//!   tags), each change made only if the port is as read; from then on
//!   it is a port like any an ADD makes;
//! - a used port is deleted, never pooled again.

pub mod handout;
mod heartbeat;
pub mod keeper;
pub mod ledger;

use serde_json::{Map, Value};

use super::api::{Controller, Port};
use super::error::NeutronError;
use super::ports::{Marks, OWNER};
use super::settings::invalid;

/// The tag of a pooled port no attachment holds.
pub const FREE: &str = "cni-free";

/// The prefix of the tag that names the ledger a pooled port was made
/// for: `cni-warm=BOOT.RANDOM`, the node's boot ID when the ledger began
/// and a random part.
pub const EPOCH: &str = "cni-warm=";

/// The tag of a node's keeper's heartbeat port.
pub const KEEPER: &str = "cni-keeper";

/// The most ports a pool may keep warm.
const MAX_WARM: u64 = 1024;

/// `warm`: how many free ports a pool keeps on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Warm {
    /// The low watermark: below it the keeper refills.
    pub min: u64,
    /// The high watermark: a refill stops there.
    pub max: u64,
    /// The most ports one bulk request makes (a bulk request fails whole).
    pub batch: u64,
}

impl Warm {
    /// `{"min", "max", "batch"}` at `key`: 1 ≤ min ≤ max ≤ 1024, and
    /// 1 ≤ batch ≤ max (batch 8 by default, or max if less).
    pub fn parse(value: &Value, key: &str) -> Result<Warm, NeutronError> {
        let object: &Map<String, Value> = value.as_object().ok_or_else(|| {
            invalid(format!(
                "{key} must be an object: {{\"min\", \"max\", \"batch\"?}}"
            ))
        })?;
        if let Some(extra) = object
            .keys()
            .find(|k| !["min", "max", "batch"].contains(&k.as_str()))
        {
            return Err(invalid(format!(
                "unknown key {extra:?} in {key}: it has \"min\", \"max\" and \"batch\""
            )));
        }
        let number = |name: &str| -> Result<Option<u64>, NeutronError> {
            match object.get(name) {
                None => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) if (1..=MAX_WARM).contains(&n) => Ok(Some(n)),
                    _ => Err(invalid(format!(
                        "{key}.{name} must be a whole number from 1 to {MAX_WARM}, not {v}"
                    ))),
                },
            }
        };
        let min = number("min")?
            .ok_or_else(|| invalid(format!("{key} needs \"min\", the ports kept free at least")))?;
        let max = number("max")?.unwrap_or(min);
        if max < min {
            return Err(invalid(format!(
                "{key}.max ({max}) is below {key}.min ({min})"
            )));
        }
        let batch = number("batch")?.unwrap_or(8.min(max));
        if batch > max {
            return Err(invalid(format!(
                "{key}.batch ({batch}) is above {key}.max ({max}): a refill never makes more than max"
            )));
        }
        Ok(Warm { min, max, batch })
    }
}

/// The name of a free pooled port of `network`'s `pool`.
pub fn free_name(network: &str, pool: &str) -> String {
    format!("{network}/{pool}")
}

/// Whether `port` is a pooled port that no attachment holds, as the
/// controller has it: the keeper has not recorded an owner on it.
pub fn looks_free(port: &Port) -> bool {
    port.device_owner == OWNER && port.device_id.is_empty() && port.tags.iter().any(|t| t == FREE)
}

/// The ledger a pooled port was made for, from its tag.
pub fn epoch_of(port: &Port) -> Option<&str> {
    port.tags.iter().find_map(|t| t.strip_prefix(EPOCH))
}

/// The tags of a free pooled port with `marks`, made for ledger `epoch`.
pub fn free_tags(marks: &Marks, epoch: &str) -> Vec<String> {
    let mut tags = marks.tags();
    tags.push(FREE.to_owned());
    tags.push(format!("{EPOCH}{epoch}"));
    tags
}

/// The pooled ports of the node `marks` name that no attachment holds,
/// and its keeper's heartbeat: what `release --node` deletes beside its
/// attachments' ports.
pub fn pooled_of_node(controller: &Controller, marks: &Marks) -> Result<Vec<Port>, NeutronError> {
    let mut found: Vec<Port> = controller
        .ports(&[("device_owner", OWNER), ("tags", &free_filter(marks))])?
        .into_iter()
        .filter(|p| looks_free(p) && marks.on(p))
        .collect();
    let mut beat = marks.tags();
    beat.push(KEEPER.to_owned());
    let beats = controller.ports(&[("device_owner", OWNER), ("tags", &beat.join(","))])?;
    found.extend(
        beats
            .into_iter()
            .filter(|p| p.device_id.is_empty() && !super::ports::foreign(p, marks.cluster)),
    );
    Ok(found)
}

/// The filter that lists the free pooled ports with `marks`.
pub fn free_filter(marks: &Marks) -> String {
    let mut tags = marks.tags();
    tags.push(FREE.to_owned());
    tags.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_warm_setting_is_read_with_its_defaults_and_refused_when_it_cannot_hold() {
        let read = |v: Value| Warm::parse(&v, "\"ipam.neutron.warm\"");
        assert_eq!(
            read(json!({"min": 4})).unwrap(),
            Warm {
                min: 4,
                max: 4,
                batch: 4
            }
        );
        assert_eq!(
            read(json!({"min": 4, "max": 32})).unwrap(),
            Warm {
                min: 4,
                max: 32,
                batch: 8
            }
        );
        for (bad, says) in [
            (json!({"max": 4}), "needs \"min\""),
            (json!({"min": 0}), "from 1 to 1024"),
            (json!({"min": 8, "max": 4}), "is below"),
            (json!({"min": 2, "max": 4, "batch": 5}), "is above"),
            (json!({"min": 2, "size": 4}), "unknown key \"size\""),
            (json!([2]), "must be an object"),
            (json!({"min": 2.5}), "whole number"),
        ] {
            let e = read(bad.clone()).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn only_a_port_of_ours_with_no_device_and_the_free_tag_looks_free() {
        let port = Port {
            id: "p1".into(),
            name: free_name("net", "pool"),
            network_id: "n".into(),
            device_id: String::new(),
            device_owner: OWNER.into(),
            description: String::new(),
            fixed_ips: vec![],
            tags: vec![FREE.into(), "cni-warm=b.r".into()],
            created_at: None,
            updated_at: None,
            revision_number: Some(1),
        };
        assert!(looks_free(&port));
        assert_eq!(epoch_of(&port), Some("b.r"));
        let mut held = port.clone();
        held.device_id = "c1".into();
        assert!(!looks_free(&held));
        let mut untagged = port.clone();
        untagged.tags.clear();
        assert!(!looks_free(&untagged));
        let mut foreign = port;
        foreign.device_owner = "compute:nova".into();
        assert!(!looks_free(&foreign));
    }
}
