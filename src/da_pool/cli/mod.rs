//! ipam-da-pool's command line, for when it is not run as a CNI plugin (no
//! CNI_COMMAND): an operator's verbs, one file each: `show`, `check` and
//! `release`, the report, audit and repair of a network's pools;
//! `node-keeper`, `reclaim` and `readmit`, a node's registration in etcd,
//! what a dead node held given back and the fence that puts on it lifted;
//! `import`, the upgrade from the local store to etcd, and `migrate`, from
//! the previous layout of etcd's keys; `validate`, its settings checked
//! for the doctor. What they share is here: reading the network they are
//! given, opening its stores, and saying how they went.

mod check;
mod import;
mod migrate;
mod node_keeper;
mod node_metrics;
mod readmit;
mod reclaim;
mod release;
mod show;
mod validate;

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::rc::Rc;

use serde_json::Value;

use super::clock;
use super::error::PoolError;
use super::settings::{invalid, parse_duration, Settings};
use super::store::{Access, Allocation, Owner, PoolAddress, Store, Stores, WorkloadHold};
use crate::addr::Addr;
use crate::args::{Options, Program};
use crate::cni::NetConf;
use crate::etcd::EtcdClient;
use crate::netd;

/// The command line.
pub const PROGRAM: Program = Program {
    name: "ipam-da-pool",
    purpose: "a CNI IPAM plugin that allocates addresses from pools, on local files or etcd",
    description: "\
As a plugin, a runtime (or ipam-delegated) runs it with CNI_COMMAND set; it
reads its settings from ipam.pool, and then reads no arguments.
",
    verbs: &[
        show::VERB,
        check::VERB,
        release::VERB,
        node_keeper::VERB,
        reclaim::VERB,
        readmit::VERB,
        import::VERB,
        migrate::VERB,
        validate::VERB,
    ],
    notes: "\
PATH is a conflist, one plugin's configuration, or a directory of them
(.conflist, .conf, .json), of which --network picks one. FILE is a
conflist (its plugin that runs ipam-da-pool, directly or as a delegate of
ipam-delegated, is used) or one plugin's configuration.
",
    command: None,
};

/// How long a node's registration must have been gone, unless
/// `--dead-for` says, before `check` names what it holds and `reclaim`
/// gives it back: 15 minutes.
const DEFAULT_DEAD_FOR: u64 = 15 * 60;

/// A `--dead-for` duration, in seconds.
fn dead_for(text: &str) -> Result<u64, String> {
    parse_duration(text)
        .ok_or_else(|| format!("--dead-for takes a duration such as 15m, 1h or 90s, not {text:?}"))
}

/// The plugin of a configuration that runs ipam-da-pool, directly or as
/// a delegate.
const OURS: netd::Ours = netd::Ours {
    described: "that runs ipam-da-pool",
    several: "networks that run ipam-da-pool",
    is_ours: |ipam| {
        ipam["type"] == "ipam-da-pool"
            || ipam["delegates"]
                .as_array()
                .is_some_and(|d| d.iter().any(|name| name == "ipam-da-pool"))
    },
};

/// The configuration of the network at `path` (a file, or a directory of
/// them, of which `network` picks one; a file of the directory that runs
/// no ipam-da-pool is another network's, and skipped).
fn load_network(path: &Path, network: Option<&str>) -> Result<Vec<u8>, PoolError> {
    let name_of =
        |stdin: &[u8]| -> Result<String, PoolError> { Ok(NetConf::parse(stdin)?.name.to_owned()) };
    Ok(netd::pick(path, &OURS, network, name_of)?.stdin)
}

/// A network as an operator's command reads it.
struct Opened {
    name: String,
    settings: Settings,
    /// Its stores, for a step that needs the lock (sharing one etcd
    /// client with `store`).
    stores: Stores,
    /// Opened without its lock; `None`: a local store that never held anything.
    store: Option<Box<dyn Store>>,
}

/// How a report prints: `--format text|json|prometheus`, or `--json`.
#[derive(Debug, PartialEq, Clone, Copy)]
enum Format {
    Text,
    Json,
    /// Gauges in Prometheus' text format, for node_exporter's textfile
    /// collector.
    Prometheus,
}

impl Format {
    /// The format `verb`'s options ask for: text unless they say.
    fn given(given: &Options, verb: &str) -> Result<Format, String> {
        // One format: of two, which was meant cannot be told.
        match (given.flag("--json"), given.value("--format")) {
            (false, None | Some("text")) => Ok(Format::Text),
            (true, None) | (false, Some("json")) => Ok(Format::Json),
            (false, Some("prometheus")) => Ok(Format::Prometheus),
            (false, Some(other)) => Err(format!(
                "--format is text, json or prometheus, not {other:?}"
            )),
            (true, Some(_)) => Err(format!("{verb} takes --json or --format, not both")),
        }
    }
}

/// The network the configuration at `config` names, its store opened
/// without the lock.
fn open_unlocked(config: &Path, network: Option<&str>) -> Result<Opened, PoolError> {
    let (name, settings) = read_network(config, network)?;
    let stores = Stores::new(&settings);
    let store = stores.existing(&name, Access::Unlocked)?;
    Ok(Opened {
        name,
        settings,
        stores,
        store,
    })
}

/// The name and settings of the network the configuration at `config`
/// names.
fn read_network(config: &Path, network: Option<&str>) -> Result<(String, Settings), PoolError> {
    let raw = load_network(config, network)?;
    let net = NetConf::parse(&raw)?;
    Ok((net.name.to_owned(), Settings::from_net(&net)?))
}

/// What `release` or `reclaim` gave back: an attachment, a hold, or the
/// record of an address that neither names (`check`'s "no DEL will free
/// it").
enum Released<'a> {
    Attachment(&'a Allocation),
    WorkloadHold(&'a WorkloadHold),
    Unlisted {
        address: Addr,
        holder: Owner,
    },
    /// An address whose cooldown ended before `until`.
    Cooldown {
        address: Addr,
        until: u64,
    },
}

impl Released<'_> {
    /// Who held it, and what.
    fn parts(&self) -> (Owner, Vec<Addr>) {
        let addresses = |held: &[PoolAddress]| held.iter().map(|h| h.address).collect();
        match self {
            Released::Attachment(allocation) => {
                (allocation.owner.clone(), addresses(&allocation.held))
            }
            Released::WorkloadHold(hold) => (hold.owner(), addresses(&hold.held)),
            Released::Unlisted { address, holder } => (holder.clone(), vec![*address]),
            Released::Cooldown { address, .. } => (Owner::unknown(), vec![*address]),
        }
    }

    fn json(&self) -> Value {
        let (owner, held) = self.parts();
        if let Released::Cooldown { address, until } = self {
            return serde_json::json!({
                "addresses": [address.to_string()],
                "coolingUntil": clock::utc(*until),
            });
        }
        if owner == Owner::unknown() {
            // A record that names no one.
            return serde_json::json!({
                "addresses": held.iter().map(Addr::to_string).collect::<Vec<_>>(),
                "unlisted": true,
            });
        }
        let mut object = serde_json::json!({
            "containerID": owner.id,
            "ifname": owner.ifname,
            "node": owner.node,
            "addresses": held.iter().map(Addr::to_string).collect::<Vec<_>>(),
        });
        if let Some(workload) = owner.workload {
            object["workload"] = serde_json::json!(workload);
        }
        if let Released::Unlisted { .. } = self {
            object["unlisted"] = true.into();
        }
        object
    }

    fn line(&self, verb: &str) -> String {
        let (owner, held) = self.parts();
        let addresses: Vec<String> = held.iter().map(Addr::to_string).collect();
        let addresses = addresses.join(", ");
        match self {
            Released::Cooldown { until, .. } => {
                format!(
                    "{verb} {addresses} from its cooldown, which was to last until {}",
                    clock::utc(*until)
                )
            }
            Released::Unlisted { holder, .. } if *holder == Owner::unknown() => {
                format!("{verb} the record of {addresses}, which names no one")
            }
            Released::Unlisted { .. } => {
                format!("{verb} the record of {addresses}, held by {owner}, which does not list it")
            }
            _ => format!("{verb} {addresses} held by {owner}"),
        }
    }
}

/// Prints what was given back (or, dry, would be), as text or JSON.
fn print_released(released: &[Released], dry_run: bool, json: bool, extra: Value) {
    let mut out = std::io::stdout().lock();
    let (verb, key) = if dry_run {
        ("would release", "wouldRelease")
    } else {
        ("released", "released")
    };
    if json {
        let list: Vec<Value> = released.iter().map(Released::json).collect();
        let mut object = serde_json::json!({ key: list });
        if let (Some(object), Value::Object(extra)) = (object.as_object_mut(), extra) {
            object.extend(extra);
        }
        let _ = writeln!(out, "{object}");
    } else {
        for r in released {
            let _ = writeln!(out, "{}", r.line(verb));
        }
    }
}

/// The etcd cluster `stores` are kept in; code 7 for a local store, which
/// has no nodes but this one (`config` and `verb` say which and what).
fn cluster_of(stores: &Stores, config: &Path, verb: &str) -> Result<Rc<EtcdClient>, PoolError> {
    stores.cluster()?.ok_or_else(|| local_only(config, verb))
}

/// Why `verb` cannot run on the configuration at `config`: its pools are
/// in local files (code 7).
fn local_only(config: &Path, verb: &str) -> PoolError {
    invalid(format!(
        "{} keeps pools in local files, which only this node uses: {verb} needs \"ipam.pool.etcd\"",
        config.display()
    ))
}

/// Exit 0 when all went well, 1 when something is left to settle or an
/// error (said on stderr, with its CNI code) stopped the command.
fn finish(outcome: Result<bool, PoolError>) -> ExitCode {
    crate::args::finish("ipam-da-pool", outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_synopsis_names_the_options_its_verb_takes() {
        crate::args::assert_synopses(&PROGRAM);
    }
}
