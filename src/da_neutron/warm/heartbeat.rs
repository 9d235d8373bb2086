//! The warm pool's heartbeats: a node's keeper beats on the controller,
//! where other nodes' keepers read it, and, once that is written, on the
//! node, where its ADDs read it; it deletes the free pooled ports of a
//! node whose heartbeat is stale on two looks a grace apart.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::json;

use super::keeper::Keeper;
use super::{free_filter, looks_free, KEEPER};
use crate::da_neutron::api::{Controller, Guarded, Port};
use crate::da_neutron::error::NeutronError;
use crate::da_neutron::ports::{self, Marks, OWNER};
use crate::da_neutron::settings::invalid;

impl Keeper<'_> {
    /// Writes this node's heartbeat, a third of a grace after the last:
    /// the description of a port with no address, whose `updated_at` the
    /// controller's clock sets, saying the grace this node keeps. Then,
    /// if `owners_recorded` (the round recorded every owner due), notes
    /// it for the node's ADDs, which may hand out for a grace from then.
    ///
    /// A heartbeat found deleted, or written more than a grace after the
    /// last one, means other nodes' keepers may be deleting this node's
    /// free ports, or will: the pool begins anew (a new epoch, the free
    /// records dropped, their ports deleted) before any hand-out.
    pub(super) fn beat(
        &mut self,
        controller: &Controller,
        owners_recorded: bool,
    ) -> Result<(), NeutronError> {
        let grace = self.settings.gc_grace;
        let every = Duration::from_secs((grace / 3).max(1));
        if self
            .heartbeat
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() < every)
        {
            return Ok(());
        }
        let mut tags = self.marks.tags();
        tags.push(KEEPER.to_owned());
        let late = self
            .heartbeat
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() >= Duration::from_secs(grace));
        let known = self.heartbeat.take();
        let port = match &known {
            Some((port, _)) => Some(port.clone()),
            None => controller
                .ports(&[("device_owner", OWNER), ("tags", &tags.join(","))])?
                .into_iter()
                .find(|p| p.device_id.is_empty() && !ports::foreign(p, self.marks.cluster)),
        };
        let beat = format!(
            "ipam-da-neutron keeper beat {} grace {grace}",
            crate::da_neutron::state::now()
        );
        let (port, lost) = match port {
            Some(mut port) => {
                // Its own: no other writer to cross.
                port.revision_number = None;
                match controller.update_if(&port, &json!({ "description": beat }))? {
                    Guarded::Updated(port) => (*port, late),
                    // Deleted by another node's keeper: taken for gone.
                    _ => (
                        self.new_heartbeat(controller, &tags, &beat)?,
                        known.is_some(),
                    ),
                }
            }
            None => (self.new_heartbeat(controller, &tags, &beat)?, false),
        };
        self.heartbeat = Some((port, Instant::now()));
        if lost {
            self.begin_anew(controller)?;
        }
        if owners_recorded {
            // The node's ADDs may hand out for a grace from now: the other
            // nodes' keepers take this node for gone only two graces on.
            self.shelf
                .beat(self.network)
                .map_err(|e| crate::dir::DirError::io(&self.settings.data_dir, e))?;
        }
        Ok(())
    }

    /// A heartbeat port, made.
    fn new_heartbeat(
        &self,
        controller: &Controller,
        tags: &[String],
        beat: &str,
    ) -> Result<Port, NeutronError> {
        let network = self.settings.pools.values().find(|p| p.warm.is_some());
        let Some(pool) = network else {
            return Err(invalid("no pool keeps a warm pool".into()));
        };
        let body = json!({
            "network_id": pool.network,
            "device_owner": OWNER,
            "device_id": "",
            "name": self.network,
            "description": beat,
            "tags": tags,
            "fixed_ips": [],
        });
        let port = controller.create_port(&body, "the keeper's heartbeat")?;
        if tags.iter().any(|t| !port.tags.contains(t)) {
            controller.set_tags(&port.id, tags)?;
        }
        Ok(port)
    }

    /// Begins the pool anew after this node may have been taken for
    /// gone: a new epoch, so that no port of the old one is taken in
    /// again, and the free records dropped, their ports deleted (each
    /// only if unchanged). The claims stay, for their owners.
    pub(super) fn begin_anew(&mut self, controller: &Controller) -> Result<(), NeutronError> {
        let fresh = self.new_ledger()?;
        let mut dropped = Vec::new();
        self.change(|ledger| {
            ledger.epoch = fresh.epoch;
            dropped = std::mem::take(&mut ledger.free).into_keys().collect();
            true
        })?;
        self.say(format!(
            "its heartbeat was late or deleted: other nodes may take this node for gone; its {} free ports are dropped and the pool begun anew",
            dropped.len()
        ));
        for id in dropped {
            if let Some(port) = controller.port(&id)? {
                controller.delete_if(&port)?;
            }
        }
        Ok(())
    }

    /// Deletes the free pooled ports of each other node of this network
    /// whose heartbeat was older than the grace on two looks a grace
    /// apart, by the controller's clock, and then its heartbeat; its
    /// ports in use stay, for the operator (`release --node`).
    pub(super) fn look_for_gone_nodes(
        &mut self,
        controller: &Controller,
    ) -> Result<(), NeutronError> {
        let mut tags = vec![format!("cni-network={}", self.network), KEEPER.to_owned()];
        tags.extend(self.marks.cluster.map(|c| format!("cni-cluster={c}")));
        let beats = controller.ports(&[("device_owner", OWNER), ("tags", &tags.join(","))])?;
        let Some(now) = controller
            .date()
            .as_deref()
            .and_then(crate::da_neutron::age::http_date)
        else {
            return Ok(());
        };
        let mut seen = BTreeSet::new();
        for beat in beats {
            // The longer of this node's grace and the one the other says
            // it keeps: its ADDs hand out for its own.
            let grace = self.settings.gc_grace.max(grace_of(&beat));
            let Some(node) = ports::node_of(&beat) else {
                continue;
            };
            if node == ports::tag_value(self.marks.node)
                || ports::foreign(&beat, self.marks.cluster)
            {
                continue;
            }
            seen.insert(node.clone());
            let updated = beat.updated_at.clone().unwrap_or_default();
            let at = crate::da_neutron::age::rfc3339(&updated);
            if at.is_none_or(|at| at.saturating_add(grace) > now) {
                self.stale.remove(&node);
                continue;
            }
            let first = match self.stale.get(&node) {
                Some((seen_updated, first)) if *seen_updated == updated => *first,
                _ => {
                    self.stale.insert(node.clone(), (updated, now));
                    continue;
                }
            };
            if first.saturating_add(grace) > now {
                continue;
            }
            let marks = Marks {
                node: &node,
                network: self.network,
                cluster: self.marks.cluster,
            };
            let free =
                controller.ports(&[("device_owner", OWNER), ("tags", &free_filter(&marks))])?;
            // The heartbeat first, only if it is as read: a node that beat
            // since is not gone, and one whose heartbeat is deleted begins
            // its pool anew before it hands out again.
            self.stale.remove(&node);
            if controller.delete_if(&beat)? != Guarded::Deleted {
                continue;
            }
            let mut deleted = 0;
            let free = free.iter().filter(|p| looks_free(p) && marks.on(p));
            for port in free {
                if controller.delete_if(port)? == Guarded::Deleted {
                    deleted += 1;
                }
            }
            self.say(format!(
                "node {node:?} stopped beating (last at {updated}): its {deleted} free pooled ports are deleted, its ports in use left"
            ));
        }
        self.stale.retain(|node, _| seen.contains(node));
        Ok(())
    }
}

/// The grace a heartbeat says its node keeps (0 if it says none).
pub(super) fn grace_of(beat: &Port) -> u64 {
    let said = beat.description.split_once(" grace ").map(|(_, g)| g);
    said.and_then(|g| g.trim().parse().ok()).unwrap_or(0)
}
