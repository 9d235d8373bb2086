//! What the plugin keeps on the node, under its data directory, to spare
//! the controller round trips and to know its own answers again: each
//! subnet read (refreshed after a minute: prefixes, gateways, routes and
//! name servers rarely change), whether the controller refused to bind a
//! port to a host or, for the project's quota, to make one (for STATUS),
//! and the ports each ADD answered with (so that GC can
//! tell them from a late POST's extra port), and a Keystone token until
//! it is about to expire. None of it is a record the addresses depend on:
//! lost, it is read again, or GC keeps what it cannot tell.

use std::path::Path;

use serde_json::{json, Value};

use super::api::{Controller, Subnet};
use super::error::NeutronError;
use super::wire::SubnetWire;
use crate::dir::{Dir, Durability};

/// How long a subnet read stays fresh, and a refused host binding is
/// not tried again.
const FRESH_FOR: u64 = 60;

/// The data directory, if it can be used (none: everything is read from
/// the controller, and GC keeps a valid attachment's extra ports).
pub struct State {
    dir: Option<Dir>,
}

impl State {
    /// The data directory at `path`, made if missing (for ADD).
    pub fn open_made(path: &Path) -> State {
        let dir = Dir::open_made(path)
            .map(|d| d.with_durability(Durability::Ordered))
            .map_err(|e| tracing::warn!("{}: {e}: nothing is cached", path.display()))
            .ok();
        State { dir }
    }

    /// The data directory at `path` if there is one: a teardown makes
    /// nothing on a node that never had an ADD.
    pub fn open(path: &Path) -> State {
        let dir = Dir::open(path)
            .map(|d| d.with_durability(Durability::Ordered))
            .ok();
        State { dir }
    }

    /// Subnet `id`, from the cache if it was read within a minute.
    pub fn subnet(&self, controller: &Controller, id: &str) -> Result<Subnet, NeutronError> {
        let cached = self.read("subnets", id).filter(fresh);
        let kept =
            cached.and_then(|c| serde_json::from_value::<SubnetWire>(c["subnet"].clone()).ok());
        if let Some(subnet) = kept.as_ref().and_then(SubnetWire::subnet) {
            return Ok(subnet);
        }
        let (read, subnet) = controller.subnet(id)?;
        self.write("subnets", id, &json!({ "read": now(), "subnet": read }));
        Ok(subnet)
    }

    /// Whether the controller refused, within a minute, to bind a port to
    /// this host (its policy keeps `binding:host_id` to admins).
    pub fn binding_refused(&self) -> bool {
        self.read("controller", "binding-refused")
            .is_some_and(|c| fresh(&c))
    }

    /// Notes that the controller refused to bind a port to this host.
    pub fn note_binding_refused(&self) {
        self.write("controller", "binding-refused", &json!({ "read": now() }));
    }

    /// What the controller said, within a minute, when it refused a port
    /// for the project's quota, and how many seconds ago.
    pub fn over_quota(&self) -> Option<(String, u64)> {
        let noted = self.read("controller", "over-quota").filter(fresh)?;
        let ago = now().saturating_sub(noted["read"].as_u64()?);
        Some((noted["message"].as_str()?.to_owned(), ago))
    }

    /// Notes that the controller refused a port for the project's quota,
    /// in its words.
    pub fn note_over_quota(&self, message: &str) {
        let noted = json!({ "read": now(), "message": message });
        self.write("controller", "over-quota", &noted);
    }

    /// Forgets a refusal for the quota: a port was made since.
    pub fn forget_over_quota(&self) {
        let Some(dir) = &self.dir else { return };
        if let Ok(Some(sub)) = dir.child("controller") {
            let _ = sub.remove("over-quota");
        }
    }

    /// The Keystone token kept for application credential `id`, and when
    /// it expires (seconds since the epoch).
    pub fn keystone_token(&self, id: &str) -> Option<(String, u64)> {
        let kept = self.read("keystone", id)?;
        Some((
            kept["token"].as_str()?.to_owned(),
            kept["expires"].as_u64()?,
        ))
    }

    /// Keeps a Keystone token (a secret: the directory is its owner's).
    pub fn note_keystone_token(&self, id: &str, token: &str, expires: u64) {
        self.write(
            "keystone",
            id,
            &json!({ "token": token, "expires": expires }),
        );
    }

    /// Whether the data directory can be used, so that what ADDs
    /// answered with is on record.
    pub fn keeps_answers(&self) -> bool {
        self.dir.is_some()
    }

    /// The ports the last ADD of `network`'s attachment answered with.
    pub fn answered(&self, network: &str, container: &str, ifname: &str) -> Option<Vec<String>> {
        let record = self.read(&answered_dir(network), &attachment_file(container, ifname))?;
        record["ports"]
            .as_array()?
            .iter()
            .map(|p| p.as_str().map(String::from))
            .collect()
    }

    /// Keeps the ports an ADD answered with.
    pub fn note_answered(&self, network: &str, container: &str, ifname: &str, ports: &[String]) {
        let record = json!({ "ports": ports, "written": now() });
        self.write(
            &answered_dir(network),
            &attachment_file(container, ifname),
            &record,
        );
    }

    /// Forgets what the ADDs of `network`'s attachments answered with,
    /// but for those `valid` lists (GC) and those written within `grace`
    /// seconds (an ADD that finished after the runtime made its list): a
    /// record lost costs GC only its sight of a late POST's extra port,
    /// never an address.
    pub fn forget_all_but(&self, network: &str, valid: &[(String, String)], grace: u64) {
        let Some(dir) = &self.dir else { return };
        let Ok(Some(sub)) = dir.child(&answered_dir(network)) else {
            return;
        };
        let kept: Vec<String> = valid
            .iter()
            .map(|(id, ifname)| file_name(&attachment_file(id, ifname)))
            .collect();
        for name in sub.names().unwrap_or_default() {
            let recent = sub
                .read(&name)
                .ok()
                .flatten()
                .and_then(|content| serde_json::from_slice::<Value>(&content).ok())
                .and_then(|record| record["written"].as_u64())
                .is_some_and(|written| written.saturating_add(grace) > now());
            if !kept.contains(&name) && !recent {
                let _ = sub.remove(&name);
            }
        }
    }

    /// Forgets what an attachment's ADD answered with (its DEL).
    pub fn forget(&self, network: &str, container: &str, ifname: &str) {
        let Some(dir) = &self.dir else { return };
        if let Ok(Some(sub)) = dir.child(&answered_dir(network)) {
            let _ = sub.remove(&attachment_file(container, ifname));
        }
    }

    fn read(&self, sub: &str, name: &str) -> Option<Value> {
        let sub = self.dir.as_ref()?.child(sub).ok()??;
        let content = sub.read(&file_name(name)).ok()??;
        serde_json::from_slice(&content).ok()
    }

    /// Writes, or says in the log why not: a cache that cannot be written
    /// costs round trips, not addresses.
    fn write(&self, sub: &str, name: &str, value: &Value) {
        let Some(dir) = &self.dir else { return };
        let written = dir
            .child_made(sub)
            .and_then(|sub| sub.replace(&file_name(name), value.to_string().as_bytes()));
        if let Err(e) = written {
            tracing::warn!("{}/{sub}/{name}: {e}", dir.path().display());
        }
    }
}

/// Where a network's answered ports are kept.
fn answered_dir(network: &str) -> String {
    format!("answered-{network}")
}

/// A container ID has no `:`, so the file names one attachment only.
fn attachment_file(container: &str, ifname: &str) -> String {
    format!("{container}:{ifname}")
}

/// Names come from the controller and the runtime: none may reach
/// outside its directory, or hide as a dot-file.
fn file_name(name: &str) -> String {
    name.replace('/', "%2F").trim_start_matches('.').to_owned()
}

fn fresh(cached: &Value) -> bool {
    cached["read"]
        .as_u64()
        .is_some_and(|read| read <= now() && now() - read < FRESH_FOR)
}

/// The node's clock, in seconds since the epoch (0 before it).
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_kept_per_attachment_and_forgotten() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state");
        assert!(State::open(&path).answered("net", "c1", "eth0").is_none());
        assert!(!path.exists(), "a read made the directory");
        let state = State::open_made(&path);
        assert_eq!(state.answered("net", "c1", "eth0"), None);
        state.note_answered("net", "c1", "eth0", &["p1".into(), "p2".into()]);
        assert_eq!(
            state.answered("net", "c1", "eth0"),
            Some(vec!["p1".into(), "p2".into()])
        );
        assert_eq!(state.answered("net", "c1", "eth1"), None);
        state.forget("net", "c1", "eth0");
        assert_eq!(state.answered("net", "c1", "eth0"), None);
        for id in ["c1", "c2", "c3"] {
            state.note_answered("net", id, "eth0", &[format!("p-{id}")]);
        }
        // Within the grace, kept; past it, but for the valid one, forgotten.
        state.forget_all_but("net", &[("c2".into(), "eth0".into())], 60);
        assert!(state.answered("net", "c1", "eth0").is_some());
        state.forget_all_but("net", &[("c2".into(), "eth0".into())], 0);
        assert_eq!(state.answered("net", "c1", "eth0"), None);
        assert_eq!(
            state.answered("net", "c2", "eth0"),
            Some(vec!["p-c2".into()])
        );
        assert_eq!(state.answered("net", "c3", "eth0"), None);
        assert!(!state.binding_refused());
        state.note_binding_refused();
        assert!(state.binding_refused());
    }

    #[test]
    fn a_refusal_for_the_quota_is_kept_a_minute_or_until_a_port_is_made() {
        let tmp = tempfile::tempdir().unwrap();
        let state = State::open_made(tmp.path());
        assert_eq!(state.over_quota(), None);
        state.note_over_quota("OverQuota: Quota exceeded for resources: ['port'].");
        let (message, ago) = state.over_quota().unwrap();
        assert!(message.contains("['port']") && ago <= 1, "{message} {ago}");
        state.forget_over_quota();
        assert_eq!(state.over_quota(), None);
        // A minute old, it is no longer said.
        let old = json!({"read": now() - FRESH_FOR, "message": "OverQuota"});
        state.write("controller", "over-quota", &old);
        assert_eq!(state.over_quota(), None);
    }

    #[test]
    fn an_unusable_directory_costs_nothing_but_the_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        let state = State::open_made(&file.join("state"));
        state.note_answered("net", "c1", "eth0", &["p1".into()]);
        assert_eq!(state.answered("net", "c1", "eth0"), None);
    }
}
