//! ipam-da-pool's command line, for when it is not run as a CNI plugin (no
//! CNI_COMMAND): `show`, `check` and `release`, an operator's report,
//! audit and repair of a network's pools; `node-keeper` and `reclaim`, a
//! node's registration in etcd and what a dead node held given back;
//! `import`, the upgrade from the local store to etcd; `--help` and
//! `--version`; or, with no arguments, the about text.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;

use super::settings::{parse_duration, Settings, StoreSettings};
use super::store::{Hold, Holding, Owner, Store};
use super::{check, etcd, import, local, nodes, report};
use crate::addr::Addr;
use crate::cni::{self, NetConf};
use crate::error::Error;
use crate::{netd, skel};

const USAGE: &str = "usage:
  ipam-da-pool show --config PATH [--network NAME] [--addresses] [--json | --format prometheus]
  ipam-da-pool check --config PATH [--network NAME] [--valid-attachments FILE] [--dead-for DURATION] [--json]
  ipam-da-pool release --config PATH [--network NAME] (ADDRESS | --container ID [--ifname IF] | --node NAME | --workload NAME) [--dry-run] [--json]
  ipam-da-pool node-keeper --config PATH [--network NAME]
  ipam-da-pool reclaim --config PATH [--network NAME] [--dead-for DURATION | --node NAME] [--dry-run] [--json]
  ipam-da-pool import --config FILE --from DATADIR [--dry-run]
  ipam-da-pool --help | --version
";

const HELP: &str = "ipam-da-pool: a CNI IPAM plugin that allocates addresses from pools.

As a plugin, a runtime (or ipam-delegated) runs it with CNI_COMMAND set; it
reads its settings from ipam.pool, and then reads no arguments.

Commands:
  show --config PATH [--network NAME] [--addresses] [--json | --format prometheus]
          Per pool of the network: how many addresses it may give (size),
          how many are held (used) and on which node, how many are free,
          how many it keeps back (reserved), and how many of those held
          only a workload's hold keeps, its container gone (sticky). With
          --addresses, each held address with its container ID,
          interface, node, workload and since (or, for a hold, until)
          when. --json prints one JSON object; --format prometheus prints
          gauges (ipam_da_pool_size, _used, _free, _sticky) for
          node_exporter's textfile collector. It takes no lock:
          allocation goes on.
          PATH is a conflist, one plugin's configuration, or a directory
          of them (.conflist, .conf, .json), of which --network picks one.
  check --config PATH [--network NAME] [--valid-attachments FILE] [--dead-for DURATION] [--json]
          Finds what is wrong in the network's records and names each:
          an address held outside every range of its pool (a range shrunk
          since), an attachment or a workload's hold whose address is not
          recorded as its own, an address record nothing can free (torn,
          or its attachment or hold gone), an address listed twice, on
          etcd what nodes hold whose keeper's lease is gone and that were
          last seen longer than DURATION ago (15m by default), and, with
          FILE (a JSON array of {\"containerID\", \"ifname\"}, as the
          runtime lists them for GC), attachments not in it. Exit status
          1 when it finds anything. It takes no lock.
  release --config PATH [--network NAME] (ADDRESS | --container ID [--ifname IF] | --node NAME | --workload NAME) [--dry-run] [--json]
          Gives back what the attachments holding ADDRESS, of container
          ID (on interface IF), of node NAME (one decommissioned) or of
          workload NAME (as sticky names it: NAMESPACE/NAME) hold, with
          the holds of their workloads, and the holds that keep ADDRESS,
          or were released on node NAME, or are workload NAME's; prints
          what it released (with --dry-run, what it would release).
          Nothing that matches is exit status 1, and nothing is changed.
          Each release is one short step: on the local store the
          network's lock is taken for one attachment at a time.
  node-keeper --config PATH [--network NAME]
          Keeps this node (ipam.pool.node) registered in the etcd cluster
          the configuration names: a key under a lease of ipam.pool.nodeTTL
          seconds (60 by default), renewed every third of it, and when it
          was last seen. Runs until SIGTERM or SIGINT, then withdraws the
          registration and exits 0. Logs to stderr.
  reclaim --config PATH [--network NAME] [--dead-for DURATION | --node NAME] [--dry-run] [--json]
          On etcd: gives back what every node holds in the network whose
          keeper's registration is gone and that was last seen longer
          than DURATION ago (15m by default; a node never registered is
          left alone), or what node NAME holds (one decommissioned):
          attachments and sticky holds. A node whose registration is
          there is never touched, not even named. Prints what it released
          (with --dry-run, what it would release).
  import --config FILE --from DATADIR [--dry-run]
          Copy this node's reservations of FILE's network from the local
          store under DATADIR into the etcd cluster FILE names, each held
          by the same container, interface and node. One already there is
          left alone; one whose address another holds in etcd is named as
          a conflict (exit status 1). From then on the local store refuses
          new addresses (code 11, try again later) until the node runs
          FILE. With --dry-run, nothing is written.
FILE is a conflist (its plugin that runs ipam-da-pool, directly or as a
delegate of ipam-delegated, is used) or one plugin's configuration.

  --help     this text
  --version  the version and the CNI spec versions it speaks
";

/// Runs the command line `args` (without the program name).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args: Vec<String> = match args.into_iter().map(OsString::into_string).collect() {
        Ok(args) => args,
        Err(arg) => return usage(&format!("{arg:?} is not UTF-8")),
    };
    match args.first().map(String::as_str) {
        None => skel::about(
            "ipam-da-pool",
            "a CNI IPAM plugin that allocates addresses from pools, on local files or etcd",
        ),
        Some("show") => match parse_show(&args[1..]) {
            Ok(options) => finish(run_show(&options)),
            Err(problem) => usage(&problem),
        },
        Some("check") => match parse_check(&args[1..]) {
            Ok(options) => finish(run_check(&options)),
            Err(problem) => usage(&problem),
        },
        Some("release") => match parse_release(&args[1..]) {
            Ok(options) => finish(run_release(&options)),
            Err(problem) => usage(&problem),
        },
        Some("node-keeper") => match parse_keeper(&args[1..]) {
            Ok(options) => finish(run_keeper(&options)),
            Err(problem) => usage(&problem),
        },
        Some("reclaim") => match parse_reclaim(&args[1..]) {
            Ok(options) => finish(run_reclaim(&options)),
            Err(problem) => usage(&problem),
        },
        Some("import") => match parse_import(&args[1..]) {
            Ok(options) => finish(run_import(&options)),
            Err(problem) => usage(&problem),
        },
        Some("--help" | "-h" | "help") if args.len() == 1 => print(HELP),
        Some("--version" | "-V") if args.len() == 1 => print(&format!(
            "ipam-da-pool {}\nCNI spec versions: {}\n",
            env!("CARGO_PKG_VERSION"),
            cni::SUPPORTED.join(", ")
        )),
        Some(other) => usage(&format!("unknown command {other:?}")),
    }
}

/// `import`'s options.
#[derive(Debug, PartialEq)]
struct Import {
    config: PathBuf,
    from: PathBuf,
    dry_run: bool,
}

fn parse_import(options: &[String]) -> Result<Import, String> {
    let mut import = Import {
        config: PathBuf::new(),
        from: PathBuf::new(),
        dry_run: false,
    };
    each_option(options, |name, value| {
        match name {
            "--config" => import.config = value()?.into(),
            "--from" => import.from = value()?.into(),
            "--dry-run" => import.dry_run = true,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if import.config.as_os_str().is_empty() || import.from.as_os_str().is_empty() {
        return Err("import needs --config and --from".into());
    }
    Ok(import)
}

/// How `show` prints.
#[derive(Debug, PartialEq, Clone, Copy)]
enum Format {
    Text,
    Json,
    Prometheus,
}

/// `show`'s options.
#[derive(Debug, PartialEq)]
struct Show {
    config: PathBuf,
    network: Option<String>,
    addresses: bool,
    format: Format,
}

fn parse_show(options: &[String]) -> Result<Show, String> {
    let mut show = Show {
        config: PathBuf::new(),
        network: None,
        addresses: false,
        format: Format::Text,
    };
    each_option(options, |name, value| {
        match name {
            "--config" => show.config = value()?.into(),
            "--network" => show.network = Some(value()?),
            "--addresses" => show.addresses = true,
            "--json" => show.format = Format::Json,
            "--format" => {
                show.format = match value()?.as_str() {
                    "text" => Format::Text,
                    "json" => Format::Json,
                    "prometheus" => Format::Prometheus,
                    other => {
                        return Err(format!(
                            "--format is text, json or prometheus, not {other:?}"
                        ))
                    }
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if show.config.as_os_str().is_empty() {
        return Err("show needs --config".into());
    }
    Ok(show)
}

/// How long a node's registration must have been gone, unless
/// `--dead-for` says, before `check` names what it holds and `reclaim`
/// gives it back: 15 minutes.
const DEFAULT_DEAD_FOR: u64 = 15 * 60;

/// A `--dead-for` duration, in seconds.
fn dead_for(text: &str) -> Result<u64, String> {
    parse_duration(text)
        .ok_or_else(|| format!("--dead-for takes a duration such as 15m, 1h or 90s, not {text:?}"))
}

/// `check`'s options.
#[derive(Debug, PartialEq)]
struct Check {
    config: PathBuf,
    network: Option<String>,
    valid: Option<PathBuf>,
    dead_for: u64,
    json: bool,
}

fn parse_check(options: &[String]) -> Result<Check, String> {
    let mut check = Check {
        config: PathBuf::new(),
        network: None,
        valid: None,
        dead_for: DEFAULT_DEAD_FOR,
        json: false,
    };
    each_option(options, |name, value| {
        match name {
            "--config" => check.config = value()?.into(),
            "--network" => check.network = Some(value()?),
            "--valid-attachments" => check.valid = Some(value()?.into()),
            "--dead-for" => check.dead_for = dead_for(&value()?)?,
            "--json" => check.json = true,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if check.config.as_os_str().is_empty() {
        return Err("check needs --config".into());
    }
    Ok(check)
}

/// Checks the network's records, printing each finding: whether there
/// were none.
fn run_check(options: &Check) -> Result<bool, Error> {
    // A report waits; allocations on this node should not.
    crate::sys::give_way();
    // Read before anything else: a bad list changes nothing and reads nothing.
    let valid = match &options.valid {
        Some(file) => Some(read_valid_attachments(file)?),
        None => None,
    };
    let Opened {
        name,
        settings,
        store,
    } = open_unlocked(&options.config, options.network.as_deref())?;
    let records = match &store {
        Some(store) => check::Records {
            holdings: store.holdings()?,
            holds: store.holds()?,
            addresses: store.address_records()?,
        },
        None => check::Records {
            holdings: Vec::new(),
            holds: Vec::new(),
            addresses: Vec::new(),
        },
    };
    let dead = match &settings.store {
        StoreSettings::Etcd(cluster) => {
            let client = crate::etcd::Client::new(cluster.clone())?;
            let now = super::store::now();
            nodes::dead(&nodes::states(&client)?, options.dead_for)
                .into_iter()
                .map(|(node, seen)| check::DeadNode {
                    node,
                    last_seen: format!(
                        "at {}, {} ago",
                        report::utc(seen),
                        ago(now.saturating_sub(seen))
                    ),
                })
                .collect()
        }
        StoreSettings::Local { .. } => Vec::new(),
    };
    let findings = check::check(
        store.as_deref(),
        &settings,
        &records,
        valid.as_deref(),
        &dead,
    )?;
    let mut out = std::io::stdout().lock();
    if options.json {
        let _ = writeln!(
            out,
            "{}",
            serde_json::json!({"network": name, "findings": findings})
        );
    } else {
        for finding in &findings {
            let _ = writeln!(out, "{finding}");
        }
        let _ = writeln!(
            out,
            "network {name}: {} attachment(s), {} hold(s), {} address record(s), {} finding(s)",
            records.holdings.len(),
            records.holds.len(),
            records.addresses.len(),
            findings.len()
        );
    }
    Ok(findings.is_empty())
}

/// The runtime's list of valid attachments, as GC takes it.
fn read_valid_attachments(file: &Path) -> Result<Vec<check::Attachment>, Error> {
    let fail = |reason: String| Error::ConfigFile {
        path: file.to_owned(),
        reason,
    };
    let text = std::fs::read(file).map_err(|e| fail(format!("cannot be read: {e}")))?;
    let list: Value =
        serde_json::from_slice(&text).map_err(|e| fail(format!("is not JSON: {e}")))?;
    list.as_array()
        .ok_or_else(|| fail("is not an array of {\"containerID\", \"ifname\"}".into()))?
        .iter()
        .map(|entry| {
            let field = |key: &str| entry.get(key)?.as_str().map(String::from);
            match (field("containerID"), field("ifname")) {
                (Some(id), Some(ifname)) => Ok((id, ifname)),
                _ => Err(fail(format!(
                    "has an entry that is not {{\"containerID\", \"ifname\"}}: {entry}"
                ))),
            }
        })
        .collect()
}

/// How long ago `seconds` was, roughly, as an operator reads it.
fn ago(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3_600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3_600),
        s => format!("{}d", s / 86_400),
    }
}

/// Which attachments and holds `release` gives back.
#[derive(Debug, PartialEq)]
enum Chosen {
    Address(Addr),
    Container { id: String, ifname: Option<String> },
    Node(String),
    Workload(String),
}

impl std::fmt::Display for Chosen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Chosen::Address(address) => write!(f, "address {address}"),
            Chosen::Container { id, ifname: None } => write!(f, "container {id}"),
            Chosen::Container {
                id,
                ifname: Some(ifname),
            } => write!(f, "container {id} interface {ifname}"),
            Chosen::Node(node) => write!(f, "node {node}"),
            Chosen::Workload(workload) => write!(f, "workload {workload}"),
        }
    }
}

impl Chosen {
    fn matches(&self, holding: &Holding) -> bool {
        match self {
            Chosen::Address(address) => holding.held.iter().any(|h| h.address == *address),
            Chosen::Container { id, ifname } => {
                holding.owner.id == *id
                    && ifname.as_ref().is_none_or(|i| holding.owner.ifname == *i)
            }
            Chosen::Node(node) => holding.owner.node == *node,
            Chosen::Workload(workload) => holding.owner.workload.as_ref() == Some(workload),
        }
    }

    /// Whether it chooses `hold` itself (a hold bound to a chosen
    /// attachment is ended with it).
    fn matches_hold(&self, hold: &Hold) -> bool {
        match self {
            Chosen::Address(address) => hold.held.iter().any(|h| h.address == *address),
            Chosen::Container { .. } => false,
            Chosen::Node(node) => hold.node == *node,
            Chosen::Workload(workload) => hold.workload == *workload,
        }
    }
}

/// `release`'s options.
#[derive(Debug, PartialEq)]
struct Release {
    config: PathBuf,
    network: Option<String>,
    chosen: Chosen,
    dry_run: bool,
    json: bool,
}

fn parse_release(options: &[String]) -> Result<Release, String> {
    let (mut config, mut network, mut dry_run, mut json) = (PathBuf::new(), None, false, false);
    let (mut address, mut container, mut ifname, mut node) = (None, None, None, None);
    let mut workload = None;
    let (addresses, options): (Vec<&String>, Vec<String>) = {
        // The one argument that is not an option is the address.
        let mut rest = Vec::new();
        let mut positional = Vec::new();
        let mut takes_value = false;
        for option in options {
            if !takes_value && !option.starts_with("--") {
                positional.push(option);
            } else {
                rest.push(option.clone());
            }
            takes_value = !option.contains('=')
                && matches!(
                    option.as_str(),
                    "--config" | "--network" | "--container" | "--ifname" | "--node" | "--workload"
                );
        }
        (positional, rest)
    };
    each_option(&options, |name, value| {
        match name {
            "--config" => config = value()?.into(),
            "--network" => network = Some(value()?),
            "--container" => container = Some(value()?),
            "--ifname" => ifname = Some(value()?),
            "--node" => node = Some(value()?),
            "--workload" => workload = Some(value()?),
            "--dry-run" => dry_run = true,
            "--json" => json = true,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if let Some(text) = addresses.first() {
        let ip: std::net::IpAddr = text
            .parse()
            .map_err(|_| format!("{text:?} is not an address"))?;
        address = Some(Addr::new(ip));
    }
    if config.as_os_str().is_empty() {
        return Err("release needs --config".into());
    }
    let chosen = match (addresses.len(), address, container, node, workload) {
        (1, Some(address), None, None, None) if ifname.is_none() => Chosen::Address(address),
        (0, None, Some(id), None, None) => Chosen::Container { id, ifname },
        (0, None, None, Some(node), None) if ifname.is_none() => Chosen::Node(node),
        (0, None, None, None, Some(workload)) if ifname.is_none() => Chosen::Workload(workload),
        _ => {
            return Err(
                "release needs one of ADDRESS, --container ID [--ifname IF], --node NAME or --workload NAME".into(),
            )
        }
    };
    Ok(Release {
        config,
        network,
        chosen,
        dry_run,
        json,
    })
}

/// Goes through `--name value`, `--name=value` and `--flag` options:
/// `take(name, value)` says whether it knows the option, and calls `value`
/// for one that takes a value. A flag given a value is unknown.
fn each_option(
    options: &[String],
    mut take: impl FnMut(&str, &mut dyn FnMut() -> Result<String, String>) -> Result<bool, String>,
) -> Result<(), String> {
    let mut options = options.iter();
    while let Some(option) = options.next() {
        let (name, inline) = match option.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (option.as_str(), None),
        };
        let mut asked = false;
        let mut value = || {
            asked = true;
            inline
                .clone()
                .or_else(|| options.next().cloned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let known = take(name, &mut value)?;
        if !known || (inline.is_some() && !asked) {
            return Err(format!("unknown option {option:?}"));
        }
    }
    Ok(())
}

/// The plugin of a configuration that runs ipam-da-pool, directly or as
/// a delegate.
const OURS: netd::Ours = netd::Ours {
    described: "that runs ipam-da-pool",
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
fn load_network(path: &Path, network: Option<&str>) -> Result<Vec<u8>, Error> {
    let found = netd::scan(path, &OURS, |stdin| {
        Ok(NetConf::parse(stdin)?.name.to_owned())
    })?;
    let fail = |reason: String| Error::ConfigFile {
        path: path.to_owned(),
        reason,
    };
    let mut networks = found.networks;
    if let (false, [only], Some(wanted)) = (path.is_dir(), networks.as_slice(), network) {
        if only.name != wanted {
            return Err(fail(format!("is network {:?}, not {wanted:?}", only.name)));
        }
    }
    networks.retain(|n| network.is_none_or(|wanted| wanted == n.name));
    let names: Vec<&str> = networks.iter().map(|n| n.name.as_str()).collect();
    match (networks.len(), network) {
        (1, _) => Ok(networks.remove(0).stdin),
        (0, Some(wanted)) => Err(fail(format!(
            "has no network {wanted:?} that runs ipam-da-pool"
        ))),
        (0, None) => Err(fail("has no network that runs ipam-da-pool".into())),
        _ => Err(fail(format!(
            "has several networks that run ipam-da-pool ({}): pick one with --network",
            names.join(", ")
        ))),
    }
}

/// A network as an operator's command reads it.
struct Opened {
    name: String,
    settings: Settings,
    /// Opened without its lock; `None`: a local store that never held anything.
    store: Option<Box<dyn Store>>,
}

/// The network the configuration at `config` names, its store opened
/// without the lock.
fn open_unlocked(config: &Path, network: Option<&str>) -> Result<Opened, Error> {
    let raw = load_network(config, network)?;
    let net = NetConf::parse(&raw)?;
    let settings = Settings::from_net(&net)?;
    let store: Option<Box<dyn Store>> = match &settings.store {
        StoreSettings::Local { data_dir } => local::Local::open_unlocked(data_dir, &net.name)?
            .map(|store| Box::new(store) as Box<dyn Store>),
        StoreSettings::Etcd(cluster) => Some(Box::new(etcd::Etcd::new(
            crate::etcd::Client::new(cluster.clone())?,
            &net.name,
        ))),
    };
    Ok(Opened {
        name: net.name.clone(),
        settings,
        store,
    })
}

/// What `release` or `reclaim` gave back: an attachment, or a hold.
enum Released<'a> {
    Attachment(&'a Holding),
    Hold(&'a Hold),
}

impl Released<'_> {
    /// Who held it, and what.
    fn parts(&self) -> (Owner, &[super::store::Held]) {
        match self {
            Released::Attachment(holding) => (holding.owner.clone(), &holding.held),
            Released::Hold(hold) => (hold.owner(), &hold.held),
        }
    }

    fn json(&self) -> Value {
        let (owner, held) = self.parts();
        let mut object = serde_json::json!({
            "containerID": owner.id,
            "ifname": owner.ifname,
            "node": owner.node,
            "addresses": held.iter().map(|a| a.address.to_string()).collect::<Vec<_>>(),
        });
        if let Some(workload) = owner.workload {
            object["workload"] = serde_json::json!(workload);
        }
        object
    }

    fn line(&self, verb: &str) -> String {
        let (owner, held) = self.parts();
        let addresses: Vec<String> = held.iter().map(|a| a.address.to_string()).collect();
        format!("{verb} {} held by {owner}", addresses.join(", "))
    }
}

/// Prints what was given back (or, dry, would be), as text or JSON.
fn print_released(released: &[Released], dry_run: bool, json: bool, extra: Option<(&str, Value)>) {
    let mut out = std::io::stdout().lock();
    let (verb, key) = if dry_run {
        ("would release", "wouldRelease")
    } else {
        ("released", "released")
    };
    if json {
        let list: Vec<Value> = released.iter().map(Released::json).collect();
        let mut object = serde_json::json!({ key: list });
        if let Some((name, value)) = extra {
            object[name] = value;
        }
        let _ = writeln!(out, "{object}");
    } else {
        for r in released {
            let _ = writeln!(out, "{}", r.line(verb));
        }
    }
}

/// Releases what the chosen attachments and holds keep, one at a time,
/// printing each: whether anything matched.
fn run_release(options: &Release) -> Result<bool, Error> {
    // Chosen from a read without the lock; each one then released as read
    // again under it (local) or in a transaction that fails if it changed
    // meanwhile (etcd).
    let Opened {
        name,
        settings,
        store: shared,
    } = open_unlocked(&options.config, options.network.as_deref())?;
    let (holdings, holds) = match &shared {
        Some(store) => (store.holdings()?, store.holds()?),
        None => (Vec::new(), Vec::new()),
    };
    let chosen: Vec<&Holding> = holdings
        .iter()
        .filter(|holding| options.chosen.matches(holding))
        .collect();
    // Holds chosen themselves, or whose container's attachment is chosen.
    let released_with = |hold: &Hold| {
        chosen.iter().any(|h| {
            h.owner.workload.as_ref() == Some(&hold.workload)
                && h.owner.ifname == hold.ifname
                && hold.container.as_ref() == Some(&h.owner.id)
        })
    };
    let bound_alive = |hold: &Hold| {
        hold.container.as_ref().is_some_and(|id| {
            holdings
                .iter()
                .any(|h| h.owner.id == *id && h.owner.ifname == hold.ifname)
        })
    };
    let chosen_holds: Vec<&Hold> = holds
        .iter()
        .filter(|hold| {
            released_with(hold) || (options.chosen.matches_hold(hold) && !bound_alive(hold))
        })
        .collect();
    let mut released = Vec::new();
    for holding in &chosen {
        if options.dry_run
            || with_store(&settings, &name, &shared, |s| release_as_read(s, holding))?
        {
            released.push(Released::Attachment(holding));
        }
    }
    for hold in &chosen_holds {
        let ended = options.dry_run
            || with_store(&settings, &name, &shared, |store| {
                // As it is now: releasing its container's attachment
                // released it too.
                match store.hold(&hold.workload, &hold.ifname)? {
                    Some(now)
                        if now.held == hold.held
                            && (now.container.is_none() || now.container == hold.container) =>
                    {
                        store.end_hold(&now)
                    }
                    _ => Ok(false),
                }
            })?;
        if ended {
            released.push(Released::Hold(hold));
        }
    }
    print_released(&released, options.dry_run, options.json, None);
    let matched = !chosen.is_empty() || !chosen_holds.is_empty();
    if !matched {
        let _ = writeln!(
            std::io::stderr(),
            "ipam-da-pool: no attachment or hold of network {} matches {}; nothing released",
            name,
            options.chosen
        );
    }
    Ok(matched)
}

/// Runs `step` on the network's store for one short step: on the local
/// store under the network's lock, taken for it alone; on etcd, as
/// opened. `false` for a local store that has no records any more.
fn with_store(
    settings: &Settings,
    name: &str,
    shared: &Option<Box<dyn Store>>,
    step: impl FnOnce(&dyn Store) -> Result<bool, Error>,
) -> Result<bool, Error> {
    match &settings.store {
        StoreSettings::Local { data_dir } => match local::Local::open_existing(data_dir, name)? {
            Some(store) => step(&store),
            None => Ok(false),
        },
        StoreSettings::Etcd(_) => match shared {
            Some(store) => step(store.as_ref()),
            None => Ok(false),
        },
    }
}

/// Releases `holding` if the store still has it as it was read: whether
/// it did (a holding that changed meanwhile is someone else's business).
fn release_as_read(store: &dyn Store, holding: &Holding) -> Result<bool, Error> {
    match store.holding(&holding.owner.id, &holding.owner.ifname)? {
        Some(now) if now.held == holding.held && now.owner == holding.owner => store.release(&now),
        _ => Ok(false),
    }
}

/// `node-keeper`'s options.
#[derive(Debug, PartialEq)]
struct Keeper {
    config: PathBuf,
    network: Option<String>,
}

fn parse_keeper(options: &[String]) -> Result<Keeper, String> {
    let mut keeper = Keeper {
        config: PathBuf::new(),
        network: None,
    };
    each_option(options, |name, value| {
        match name {
            "--config" => keeper.config = value()?.into(),
            "--network" => keeper.network = Some(value()?),
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if keeper.config.as_os_str().is_empty() {
        return Err("node-keeper needs --config".into());
    }
    Ok(keeper)
}

/// The etcd cluster a network's configuration names; code 7 for a local
/// store, which has no nodes but this one.
fn cluster_of(
    settings: &Settings,
    config: &Path,
    verb: &str,
) -> Result<crate::etcd::Client, Error> {
    match &settings.store {
        StoreSettings::Etcd(cluster) => crate::etcd::Client::new(cluster.clone()),
        StoreSettings::Local { .. } => Err(cni::Error::InvalidConfig(format!(
            "{} keeps pools in local files, which only this node uses: {verb} needs \"ipam.pool.etcd\"",
            config.display()
        ))
        .into()),
    }
}

/// Keeps the node registered until asked to stop.
fn run_keeper(options: &Keeper) -> Result<bool, Error> {
    let raw = load_network(&options.config, options.network.as_deref())?;
    let settings = Settings::from_net(&NetConf::parse(&raw)?)?;
    let client = cluster_of(&settings, &options.config, "node-keeper")?;
    nodes::keep(
        &client,
        &settings.node,
        settings.node_ttl,
        &mut std::io::stderr(),
    )?;
    Ok(true)
}

/// `reclaim`'s options.
#[derive(Debug, PartialEq)]
struct Reclaim {
    config: PathBuf,
    network: Option<String>,
    dead_for: u64,
    node: Option<String>,
    dry_run: bool,
    json: bool,
}

fn parse_reclaim(options: &[String]) -> Result<Reclaim, String> {
    let mut reclaim = Reclaim {
        config: PathBuf::new(),
        network: None,
        dead_for: DEFAULT_DEAD_FOR,
        node: None,
        dry_run: false,
        json: false,
    };
    let mut dead_for_given = false;
    each_option(options, |name, value| {
        match name {
            "--config" => reclaim.config = value()?.into(),
            "--network" => reclaim.network = Some(value()?),
            "--dead-for" => {
                reclaim.dead_for = dead_for(&value()?)?;
                dead_for_given = true;
            }
            "--node" => reclaim.node = Some(value()?),
            "--dry-run" => reclaim.dry_run = true,
            "--json" => reclaim.json = true,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if reclaim.config.as_os_str().is_empty() {
        return Err("reclaim needs --config".into());
    }
    if dead_for_given && reclaim.node.is_some() {
        return Err("reclaim takes --dead-for or --node, not both".into());
    }
    Ok(reclaim)
}

/// Gives back what dead nodes (or the one named) hold, printing it:
/// whether a node named had anything.
fn run_reclaim(options: &Reclaim) -> Result<bool, Error> {
    let raw = load_network(&options.config, options.network.as_deref())?;
    let net = NetConf::parse(&raw)?;
    let settings = Settings::from_net(&net)?;
    let client = cluster_of(&settings, &options.config, "reclaim")?;
    let states = nodes::states(&client)?;
    let mut store = etcd::Etcd::new(client, &net.name);
    let (holdings, holds) = (store.holdings()?, store.holds()?);
    let targets: Vec<String> = match &options.node {
        Some(node) => {
            if states.get(node).is_some_and(|s| s.alive) {
                return Err(Error::Busy(format!(
                    "node {node} is registered: its keeper renews its lease, so it is alive; stop its keeper (or let its lease end) first"
                )));
            }
            vec![node.clone()]
        }
        None => nodes::dead(&states, options.dead_for)
            .into_iter()
            .map(|(node, _)| node)
            .collect(),
    };
    let mut outcomes = Vec::new();
    for node in &targets {
        outcomes.push(nodes::reclaim(
            &mut store,
            node,
            &holdings,
            &holds,
            options.dry_run,
        )?);
    }
    let released: Vec<Released> = outcomes
        .iter()
        .flat_map(|done| {
            let holdings = done.holdings.iter().map(Released::Attachment);
            holdings.chain(done.holds.iter().map(Released::Hold))
        })
        .collect();
    let skipped: usize = outcomes.iter().map(|done| done.skipped).sum();
    print_released(
        &released,
        options.dry_run,
        options.json,
        Some(("nodes", serde_json::json!(targets))),
    );
    let mut err = std::io::stderr().lock();
    if skipped > 0 {
        let _ = writeln!(
            err,
            "ipam-da-pool: {skipped} record(s) changed meanwhile (a node back, or a DEL) and were left alone"
        );
    }
    // Nodes with records that no keeper ever registered: never judged dead.
    let unknown: std::collections::BTreeSet<&str> = holdings
        .iter()
        .map(|h| h.owner.node.as_str())
        .chain(holds.iter().map(|h| h.node.as_str()))
        .filter(|node| !states.contains_key(*node))
        .collect();
    if options.node.is_none() && !unknown.is_empty() {
        let list: Vec<&str> = unknown.into_iter().collect();
        let _ = writeln!(
            err,
            "ipam-da-pool: node(s) {} hold records but never ran a node-keeper: left alone (reclaim --node NAME releases one)",
            list.join(", ")
        );
    }
    match &options.node {
        Some(node) if released.is_empty() => {
            let _ = writeln!(
                err,
                "ipam-da-pool: node {node} holds nothing in network {}; nothing released",
                net.name
            );
            Ok(false)
        }
        _ => Ok(true),
    }
}

/// Shows the network's pools, as asked.
fn run_show(options: &Show) -> Result<bool, Error> {
    crate::sys::give_way();
    let Opened {
        name,
        settings,
        store,
    } = open_unlocked(&options.config, options.network.as_deref())?;
    let (holdings, holds) = match &store {
        Some(store) => (store.holdings()?, store.holds()?),
        // A local store that never held anything: every pool is free.
        None => (Vec::new(), Vec::new()),
    };
    let reports = report::report(store.as_deref(), &settings, &holdings, &holds)?;
    let printed = match options.format {
        Format::Text => report::text(&name, &reports, options.addresses),
        Format::Json => format!("{}\n", report::json(&name, &reports, options.addresses)),
        Format::Prometheus => report::prometheus(&name, &reports),
    };
    // A reader that went away (`| head`) has what it wanted.
    let _ = std::io::stdout().write_all(printed.as_bytes());
    Ok(true)
}

/// Imports, printing what it did: whether every attachment is in etcd now.
fn run_import(options: &Import) -> Result<bool, Error> {
    let raw = netd::load(&options.config, &OURS)?;
    let net = NetConf::parse(&raw)?;
    let settings = Settings::from_net(&net)?;
    let StoreSettings::Etcd(cluster) = &settings.store else {
        return Err(cni::Error::InvalidConfig(format!(
            "{} keeps pools in local files: import copies into etcd, so its \"ipam.pool\" must name an etcd cluster",
            options.config.display()
        ))
        .into());
    };
    let network = options.from.join(&net.name);
    if !network.is_dir() {
        return Err(Error::Files {
            path: network,
            error: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no local store of this network here",
            ),
        });
    }
    let from = local::Local::open(&options.from, &net.name)?;
    let to = etcd::Etcd::new(crate::etcd::Client::new(cluster.clone())?, &net.name);
    if !options.dry_run {
        // From now on (the lock held) the local store refuses new claims:
        // an ADD made locally after the import would be missing from etcd.
        from.mark_moved()?;
    }
    let report = import::import(&from, &to, options.dry_run)?;
    let mut out = std::io::stdout().lock();
    for line in &report.lines {
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(
        out,
        "{} attachment(s) of network {} under {}; {} conflict(s)",
        report.lines.len(),
        net.name,
        options.from.display(),
        report.conflicts
    );
    Ok(report.conflicts == 0)
}

/// Exit 0 when all went well, 1 when something is left to settle or an
/// error (said on stderr, with its CNI code) stopped the command.
fn finish(outcome: Result<bool, Error>) -> ExitCode {
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "ipam-da-pool: {e} (code {})", e.code());
            ExitCode::FAILURE
        }
    }
}

fn print(text: &str) -> ExitCode {
    match std::io::stdout().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

/// A usage error: what is wrong and the usage on stderr, exit status 2.
fn usage(problem: &str) -> ExitCode {
    let _ = write!(std::io::stderr(), "ipam-da-pool: {problem}\n{USAGE}");
    ExitCode::from(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn show_takes_a_config_a_network_and_one_format() {
        assert_eq!(
            parse_show(&args(&[
                "--config",
                "/etc/cni/net.d",
                "--network=pods",
                "--addresses",
                "--json"
            ])),
            Ok(Show {
                config: "/etc/cni/net.d".into(),
                network: Some("pods".into()),
                addresses: true,
                format: Format::Json,
            })
        );
        assert_eq!(
            parse_show(&args(&["--config=f", "--format", "prometheus"])).map(|s| s.format),
            Ok(Format::Prometheus)
        );
        for (bad, said) in [
            (&["--network", "pods"][..], "show needs --config"),
            (
                &["--config", "f", "--format", "xml"][..],
                "--format is text, json or prometheus, not \"xml\"",
            ),
            (
                &["--config", "f", "--addresses=yes"][..],
                "unknown option \"--addresses=yes\"",
            ),
            (&["--config", "f", "--all"][..], "unknown option \"--all\""),
            (&["--config"][..], "--config needs a value"),
        ] {
            let e = parse_show(&args(bad)).unwrap_err();
            assert!(e.contains(said), "{bad:?}: {e}");
        }
    }

    #[test]
    fn release_takes_exactly_one_choice() {
        let chosen = |list: &[&str]| parse_release(&args(list)).map(|r| r.chosen);
        assert_eq!(
            chosen(&["--config", "f", "10.1.0.5"]),
            Ok(Chosen::Address(Addr::new("10.1.0.5".parse().unwrap())))
        );
        assert_eq!(
            chosen(&["--container=c1", "--config", "f", "--ifname", "net1"]),
            Ok(Chosen::Container {
                id: "c1".into(),
                ifname: Some("net1".into())
            })
        );
        assert_eq!(
            chosen(&["--config", "f", "--node", "node-b", "--dry-run"]),
            Ok(Chosen::Node("node-b".into()))
        );
        for (bad, said) in [
            (&["10.1.0.5"][..], "release needs --config"),
            (&["--config", "f"][..], "release needs one of"),
            (
                &["--config", "f", "10.1.0.5", "--node", "b"][..],
                "release needs one of",
            ),
            (
                &["--config", "f", "--node", "b", "--ifname", "eth0"][..],
                "release needs one of",
            ),
            (
                &["--config", "f", "10.1.0.5", "10.1.0.6"][..],
                "release needs one of",
            ),
            (&["--config", "f", "ten"][..], "\"ten\" is not an address"),
        ] {
            let e = parse_release(&args(bad)).unwrap_err();
            assert!(e.contains(said), "{bad:?}: {e}");
        }
    }

    #[test]
    fn import_takes_its_options_in_either_form_and_needs_both_paths() {
        assert_eq!(
            parse_import(&args(&[
                "--config=/etc/cni/net.d/pods.conflist",
                "--from",
                "/var/lib/x",
                "--dry-run"
            ])),
            Ok(Import {
                config: "/etc/cni/net.d/pods.conflist".into(),
                from: "/var/lib/x".into(),
                dry_run: true,
            })
        );
        for (bad, said) in [
            (&["--config", "f"][..], "needs --config and --from"),
            (&["--from"][..], "--from needs a value"),
            (
                &["--config", "f", "--from", "d", "--force"][..],
                "unknown option \"--force\"",
            ),
            (&["--dry-run=yes"][..], "unknown option"),
        ] {
            let e = parse_import(&args(bad)).unwrap_err();
            assert!(e.contains(said), "{bad:?}: {e}");
        }
    }
}
