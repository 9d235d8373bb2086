//! A node's keeper of the warm pool of one CNI network (`ipam-da-neutron
//! keeper`): round after round, it sets the ledger against the
//! controller, records on each port handed out its owner, refills each
//! pool between its watermarks by bulk requests, beats (a port's
//! description for the other nodes' keepers, and once that is written, a
//! file that lets the node's ADDs hand out for a grace), and
//! deletes the free pooled ports of a node whose keeper has stopped
//! beating on two looks a grace apart. Only what it can prove unused is
//! ever deleted or handed out; what it cannot tell it leaves, and says.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::ledger::{Found, Ledger, Pooled, Shelf};
use super::{epoch_of, free_filter, free_name, free_tags, handout, looks_free};
use crate::da_neutron::api::{Controller, Guarded, Port};
use crate::da_neutron::error::NeutronError;
use crate::da_neutron::ports::{self, Marks, OWNER};
use crate::da_neutron::settings::{invalid, Settings};
use crate::da_neutron::state::State;
use crate::signals;

/// How long a round's pause is: a port handed out gets its owner
/// recorded within about that.
const ROUND: Duration = Duration::from_secs(1);

/// How often the ledger is set against the controller's listing, and the
/// subnets read again.
const RECONCILE_EVERY: Duration = Duration::from_secs(60);

/// The longest pause after the controller refused a refill for its quota
/// or its addresses; it doubles from a second.
const MOST_BACK_OFF: Duration = Duration::from_secs(60);

/// One keeper.
pub struct Keeper<'a> {
    pub(super) settings: &'a Settings,
    pub(super) network: &'a str,
    pub(super) marks: Marks<'a>,
    pub(super) shelf: Shelf,
    /// The lock that makes it the network's only keeper on the node.
    pub(super) _alone: crate::dir::Dir,
    pub(super) state: State,
    pub(super) log: &'a mut dyn Write,
    /// Pools refilling, from below `min` until `max`.
    pub(super) refilling: BTreeSet<String>,
    /// When a refill may be tried again, and the pause before.
    pub(super) back_off: Option<(Instant, Duration)>,
    pub(super) last_reconcile: Option<Instant>,
    /// This keeper's heartbeat port, and when it last beat.
    pub(super) heartbeat: Option<(Port, Instant)>,
    /// Other nodes' heartbeats found stale: node → (`updated_at` seen,
    /// the controller's clock at the first look that found it stale).
    pub(super) stale: BTreeMap<String, (String, u64)>,
    pub(super) last_look: Option<Instant>,
}

impl<'a> Keeper<'a> {
    /// The keeper of CNI network `network`'s warm pools.
    pub fn new(
        settings: &'a Settings,
        network: &'a str,
        log: &'a mut dyn Write,
    ) -> Result<Keeper<'a>, NeutronError> {
        if settings.pools.values().all(|p| p.warm.is_none()) {
            return Err(invalid(format!(
                "no pool of network {network:?} has \"warm\": there is no pool to keep"
            )));
        }
        let shelf = Shelf::open_made(&settings.data_dir)
            .map_err(|e| NeutronError::Ledger(crate::dir::DirError::io(&settings.data_dir, e)))?;
        let alone = shelf.keep_alone(network)?;
        Ok(Keeper {
            _alone: alone,
            marks: settings.marks(network)?,
            settings,
            network,
            shelf,
            state: State::open_made(&settings.data_dir),
            log,
            refilling: BTreeSet::new(),
            back_off: None,
            last_reconcile: None,
            heartbeat: None,
            stale: BTreeMap::new(),
            last_look: None,
        })
    }

    /// Keeps the pools until a termination request.
    pub fn keep(&mut self) {
        if let Err(e) = signals::watch() {
            self.say(format!("SIGTERM and SIGINT will end it at once: {e}"));
        }
        self.say(format!(
            "keeps the warm pools of network {:?} on node {:?}",
            self.network, self.marks.node
        ));
        while signals::received(1).is_none() {
            match self.round() {
                Ok(()) => {}
                Err(NeutronError::Interrupted(_)) => break,
                Err(e) => self.say(format!("{e}")),
            }
            // A refill goes on at once, a request a round, unless paused.
            let paused = self
                .back_off
                .is_some_and(|(until, _)| Instant::now() < until);
            let pause = match self.refilling.is_empty() || paused {
                true => ROUND,
                false => Duration::ZERO,
            };
            if signals::received(1).is_none() {
                signals::wait(pause);
            }
        }
        // The node's ADDs hand out no more, and what they handed out gets
        // its owner (its calls not stopped by the request that stops it).
        signals::take_in_hand();
        if let Err(e) = self.shelf.stop_beating(self.network) {
            self.say(format!("cannot note that it stops: {e}"));
        }
        let recorded = Controller::open(self.settings).and_then(|c| self.record_owners(&c));
        if let Err(e) = recorded {
            self.say(format!("{e}"));
        }
        self.say("stops".into());
    }

    /// One round: every part due, each with time of its own, and none
    /// stopped by another's failure: the owners of the ports handed out
    /// first, then the heartbeat, which lets the node's ADDs hand out for
    /// a grace only if those owners are recorded. The first failure is
    /// the round's.
    pub fn round(&mut self) -> Result<(), NeutronError> {
        let controller = Controller::open(self.settings)?;
        let owners = self.record_owners(&controller);
        let mut failed = owners.as_ref().err().map(|e| e.to_string());
        let mut note = |result: Result<(), NeutronError>| {
            if let Err(e) = result {
                failed.get_or_insert(e.to_string());
            }
        };
        note(self.beat(&controller.renewed(), owners.is_ok()));
        let due = self
            .last_reconcile
            .is_none_or(|at| at.elapsed() >= RECONCILE_EVERY);
        let reconciled = self.ledger().map(|l| l.reconciled);
        if due || reconciled.as_ref().is_ok_and(|r| !r) {
            let done = self.reconcile(&controller.renewed());
            if done.is_ok() {
                self.last_reconcile = Some(Instant::now());
            }
            note(done);
        }
        note(reconciled.map(drop));
        note(self.refill(&controller.renewed()));
        if self
            .last_look
            .is_none_or(|at| at.elapsed().as_secs() * 2 >= self.settings.gc_grace)
        {
            note(self.look_for_gone_nodes(&controller.renewed()));
            self.last_look = Some(Instant::now());
        }
        match (owners, failed) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(message)) => Err(NeutronError::NotAvailable(message)),
            (Ok(()), None) => Ok(()),
        }
    }

    /// The ledger as it is now: a new one where there was none, or where
    /// it cannot be read (set aside for the operator; the ports of the
    /// lost one are then left alone, see [`Keeper::reconcile`]).
    fn ledger(&mut self) -> Result<Ledger, NeutronError> {
        self.change(|_| false)
    }

    /// Changes the ledger by `change` under the node's lock, writing it
    /// if `change` says it changed; the ledger as it is then.
    pub(super) fn change(
        &mut self,
        change: impl FnOnce(&mut Ledger) -> bool,
    ) -> Result<Ledger, NeutronError> {
        let locked = self.shelf.lock(Instant::now() + self.settings.timeout)?;
        let (mut ledger, new) = match locked.read(self.network) {
            Found::Ledger(ledger) => (ledger, false),
            // Not now: tried again next round, the ledger as it is.
            Found::Failed(e) => return Err(e.into()),
            Found::Missing => (self.new_ledger()?, true),
            Found::Unreadable(why) => {
                locked.set_aside(self.network)?;
                let _ = writeln!(
                    self.log,
                    "ipam-da-neutron keeper: the ledger of network {:?} cannot be read ({why}): kept aside, and a new one begun; the ports of the old one are left alone",
                    self.network
                );
                (self.new_ledger()?, true)
            }
        };
        if change(&mut ledger) || new {
            locked.write(self.network, &ledger)?;
        }
        Ok(ledger)
    }

    pub(super) fn new_ledger(&self) -> Result<Ledger, NeutronError> {
        Ledger::new()
            .map_err(|e| NeutronError::Ledger(crate::dir::DirError::io(&self.settings.data_dir, e)))
    }

    /// Sets the ledger against the controller's pooled ports of this node:
    /// a free record whose port is gone is dropped; one of a pool that
    /// keeps no warm pool any more is dropped and its port deleted; a
    /// free-looking port of this ledger's epoch that the ledger did not
    /// know before the listing (a refill stopped before its write: no ADD
    /// can have handed it out) is taken in, or deleted above `max`; one
    /// of another epoch (a ledger lost) is left alone, since it may have
    /// been handed out, and said; one with no tags left (a refill stopped
    /// before its tags' PUT) was never listed, and is deleted. Then the
    /// subnets are read again.
    fn reconcile(&mut self, controller: &Controller) -> Result<(), NeutronError> {
        // Every port the ledger knows now, before the listing: one it
        // knew and no longer lists was handed out, or deleted by a DEL
        // since, and must never be taken in again.
        let known: BTreeSet<String> = {
            let ledger = self.ledger()?;
            ledger
                .free
                .keys()
                .chain(ledger.claimed.keys())
                .cloned()
                .collect()
        };
        let cluster = self.marks.cluster;
        let listed: Vec<Port> = controller
            .ports(&[("device_owner", OWNER), ("tags", &free_filter(&self.marks))])?
            .into_iter()
            .filter(|p| !ports::foreign(p, cluster))
            .collect();
        let untagged: Vec<Port> = controller
            .ports(&[
                ("device_owner", OWNER),
                ("description", &self.marks.description()),
            ])?
            .into_iter()
            .filter(|p| p.device_id.is_empty() && p.tags.is_empty() && self.marks.on(p))
            .filter(|p| self.pool_of(p).is_some())
            .collect();
        let mut delete: Vec<Port> = untagged;
        let mut retag: Vec<Port> = Vec::new();
        let mut left: Vec<String> = Vec::new();
        let settings = self.settings;
        let network = self.network;
        let warm_max = |pool: &str| settings.pools.get(pool).and_then(|p| p.warm).map(|w| w.max);
        let ledger = self.change(|ledger| {
            let mut changed = !ledger.reconciled;
            ledger.reconciled = true;
            let before = ledger.free.len();
            ledger
                .free
                .retain(|id, _| listed.iter().any(|p| p.id == *id && looks_free(p)));
            // A pool that keeps none any more: its ports go.
            let unkept: Vec<String> = ledger
                .free
                .iter()
                .filter(|(_, p)| warm_max(&p.pool).is_none())
                .map(|(id, _)| id.clone())
                .collect();
            for id in unkept {
                ledger.free.remove(&id);
                delete.extend(listed.iter().find(|p| p.id == id).cloned());
            }
            changed |= ledger.free.len() != before;
            for port in &listed {
                if !port.device_id.is_empty() {
                    // Its owner recorded, its tags not yet: the claim's
                    // round finishes it, or, with no claim, this one.
                    if !ledger.claimed.contains_key(&port.id) {
                        retag.push(port.clone());
                    }
                    continue;
                }
                if known.contains(&port.id)
                    || ledger.free.contains_key(&port.id)
                    || ledger.claimed.contains_key(&port.id)
                {
                    continue;
                }
                let pool = pool_of(network, port);
                match (epoch_of(port), pool) {
                    (Some(epoch), Some(pool)) if epoch == ledger.epoch => {
                        if warm_max(&pool).is_some_and(|max| ledger.free_of(&pool) < max) {
                            ledger.free.insert(port.id.clone(), pooled(&pool, port));
                            changed = true;
                        } else {
                            delete.push(port.clone());
                        }
                    }
                    _ => left.push(port.id.clone()),
                }
            }
            changed
        })?;
        for id in left {
            self.say(format!(
                "port {id} looks free, but is not of this ledger (one lost, or a port handed out before): it may be in use, and is left alone (ipam-da-neutron release deletes it)"
            ));
        }
        for port in delete {
            if controller.delete_if(&port)? == Guarded::Deleted {
                self.say(format!(
                    "deletes pooled port {} (not in the ledger)",
                    port.id
                ));
            }
        }
        for port in retag {
            controller.set_tags(&port.id, &self.marks.tags())?;
        }
        // The subnets an answer is made from, read anew.
        let mut subnets = BTreeMap::new();
        for id in ledger
            .free
            .values()
            .flat_map(|p| p.fixed_ips.iter().map(|(s, _)| s))
        {
            if !subnets.contains_key(id) {
                let (read, _) = controller.subnet(id)?;
                subnets.insert(
                    id.clone(),
                    serde_json::to_value(read).unwrap_or(Value::Null),
                );
            }
        }
        self.change(|ledger| {
            let changed = ledger.subnets != subnets;
            ledger.subnets.extend(subnets);
            changed
        })?;
        Ok(())
    }

    /// Records its owner on each port handed out (`device_id`, then the
    /// name, in one change made only if the port is as read; then the
    /// tags), and forgets the claim. A port gone (its DEL came first) is
    /// forgotten too.
    fn record_owners(&mut self, controller: &Controller) -> Result<(), NeutronError> {
        let claims = self.ledger()?.claimed;
        let mut done = Vec::new();
        for (id, claim) in claims {
            let Some(mut port) = controller.port(&id)? else {
                self.say(format!(
                    "port {id}, handed out to {}/{}, is gone (its DEL, or an operator's release)",
                    claim.container, claim.ifname
                ));
                done.push(id);
                continue;
            };
            if port.device_id.is_empty() {
                let members = json!({
                    "device_id": claim.container,
                    "name": ports::name(self.network, &claim.port.pool, &claim.ifname),
                });
                match controller.update_if(&port, &members)? {
                    Guarded::Updated(changed) => port = *changed,
                    Guarded::Gone => {
                        done.push(id);
                        continue;
                    }
                    // Read again next round.
                    Guarded::Changed | Guarded::Deleted => continue,
                }
            } else if port.device_id != claim.container {
                self.say(format!(
                    "port {id}, handed out to {}, is {}'s on the controller: the claim is dropped",
                    claim.container, port.device_id
                ));
                done.push(id);
                continue;
            }
            let mut tags = self.marks.tags();
            tags.extend(claim.pod.clone());
            if port.tags != tags {
                controller.set_tags(&id, &tags)?;
            }
            self.say(format!(
                "port {id} is recorded as {}/{}'s",
                claim.container, claim.ifname
            ));
            done.push(id);
        }
        if !done.is_empty() {
            let locked = self.shelf.lock(Instant::now() + self.settings.timeout)?;
            handout::forget(&locked, self.network, &done)?;
        }
        Ok(())
    }

    /// Refills each pool that fell below `min`, batch by batch, up to
    /// `max`; after the controller refused for its quota or its
    /// addresses, not before a pause that doubles up to a minute.
    fn refill(&mut self, controller: &Controller) -> Result<(), NeutronError> {
        if self
            .back_off
            .is_some_and(|(until, _)| Instant::now() < until)
        {
            return Ok(());
        }
        let settings = self.settings;
        // One request a pool a round: the owners of what ADDs hand out
        // meanwhile are recorded between two.
        for (name, pool) in &settings.pools {
            let Some(warm) = pool.warm else { continue };
            {
                let ledger = self.ledger()?;
                let free = ledger.free_of(name);
                if free < warm.min {
                    self.refilling.insert(name.clone());
                }
                if free >= warm.max {
                    self.refilling.remove(name);
                }
                if !self.refilling.contains(name) {
                    continue;
                }
                let count = warm.batch.min(warm.max - free);
                let body = self.pooled_body(name, pool, &ledger.epoch);
                let bodies = vec![body; count as usize];
                let what = format!("pool {name:?} (network {})", pool.network);
                let made = match controller.renewed().create_ports(&bodies, &what) {
                    Ok(made) => made,
                    Err(e @ (NeutronError::OverQuota { .. } | NeutronError::Exhausted { .. })) => {
                        if let NeutronError::OverQuota { message, .. } = &e {
                            self.state.note_over_quota(message);
                        }
                        let pause = self
                            .back_off
                            .map_or(ROUND, |(_, pause)| (pause * 2).min(MOST_BACK_OFF));
                        self.back_off = Some((Instant::now() + pause, pause));
                        self.say(format!("refill paused for {pause:?}: {e}"));
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                };
                self.back_off = None;
                self.state.forget_over_quota();
                let tags = free_tags(&self.marks, &ledger.epoch);
                for port in &made {
                    // A controller that drops a POST's tags.
                    if tags.iter().any(|t| !port.tags.contains(t)) {
                        controller.renewed().set_tags(&port.id, &tags)?;
                    }
                }
                let mut subnets = BTreeMap::new();
                for id in made.iter().flat_map(|p| p.fixed_ips.iter().map(|(s, _)| s)) {
                    if !ledger.subnets.contains_key(id) && !subnets.contains_key(id) {
                        let (read, _) = controller.renewed().subnet(id)?;
                        subnets.insert(
                            id.clone(),
                            serde_json::to_value(read).unwrap_or(Value::Null),
                        );
                    }
                }
                // Taken in only by the ledger they were tagged for: one
                // begun meanwhile leaves them alone (and they are deleted).
                let epoch = ledger.epoch.clone();
                let kept = self.change(|ledger| {
                    if ledger.epoch != epoch {
                        return false;
                    }
                    for port in &made {
                        ledger.free.insert(port.id.clone(), pooled(name, port));
                    }
                    ledger.subnets.extend(subnets);
                    true
                })?;
                if kept.epoch != epoch {
                    for port in &made {
                        controller.renewed().delete_if(port)?;
                    }
                    continue;
                }
                self.say(format!("made {} pooled ports of pool {name:?}", made.len()));
            }
        }
        Ok(())
    }

    /// The members of a free pooled port of pool `name`.
    fn pooled_body(
        &self,
        name: &str,
        pool: &crate::da_neutron::settings::Pool,
        epoch: &str,
    ) -> Value {
        let mut body = json!({
            "network_id": pool.network,
            "device_owner": OWNER,
            "device_id": "",
            "name": free_name(self.network, name),
            "description": self.marks.description(),
            "tags": free_tags(&self.marks, epoch),
        });
        if !pool.subnets.is_empty() {
            let fixed: Vec<Value> = pool
                .subnets
                .iter()
                .map(|s| json!({ "subnet_id": s }))
                .collect();
            body["fixed_ips"] = Value::Array(fixed);
        }
        if let Some(groups) = &self.settings.security_groups {
            body["security_groups"] = json!(groups);
        }
        body
    }

    /// The pool of ours a free-looking port's name says.
    pub(super) fn pool_of(&self, port: &Port) -> Option<String> {
        pool_of(self.network, port)
    }

    pub(super) fn say(&mut self, what: String) {
        let _ = writeln!(self.log, "ipam-da-neutron keeper: {what}");
    }
}

/// The pool a free pooled port of `network` is named for.
fn pool_of(network: &str, port: &Port) -> Option<String> {
    let pool = port.name.strip_prefix(network)?.strip_prefix('/')?;
    (!pool.is_empty() && !pool.contains('/')).then(|| pool.to_owned())
}

/// The ledger's record of a free pooled port of `pool`.
fn pooled(pool: &str, port: &Port) -> Pooled {
    Pooled {
        pool: pool.to_owned(),
        network_id: port.network_id.clone(),
        fixed_ips: port
            .fixed_ips
            .iter()
            .map(|(s, a)| (s.clone(), a.to_string()))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::da_neutron::warm::heartbeat::grace_of;

    #[test]
    fn a_heartbeat_says_the_grace_its_node_keeps_and_a_free_port_its_pool() {
        let mut port = Port {
            id: "p".into(),
            name: "net/blue".into(),
            network_id: "n".into(),
            device_id: String::new(),
            device_owner: OWNER.into(),
            description: "ipam-da-neutron keeper beat 1764000000 grace 300".into(),
            fixed_ips: vec![],
            tags: vec![],
            created_at: None,
            updated_at: None,
            revision_number: None,
        };
        assert_eq!(grace_of(&port), 300);
        assert_eq!(pool_of("net", &port).as_deref(), Some("blue"));
        assert_eq!(pool_of("other", &port), None);
        port.description = "ipam-da-neutron keeper beat 1764000000".into();
        assert_eq!(grace_of(&port), 0);
        port.name = "net/blue/eth0".into();
        assert_eq!(pool_of("net", &port), None);
        port.name = "net/".into();
        assert_eq!(pool_of("net", &port), None);
    }
}
