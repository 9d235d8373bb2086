//! ipam-da-pool's command line, for when it is not run as a CNI plugin (no
//! CNI_COMMAND): `show`, `check` and `release`, an operator's report,
//! audit and repair of a network's pools;
//! `import`, the upgrade from the local store to etcd; `--help` and
//! `--version`; or, with no arguments, the about text.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::Value;

use super::range::Addr;
use super::settings::{Settings, StoreSettings};
use super::store::{Holding, Store};
use super::{check, etcd, import, local, report};
use crate::cni::{self, NetConf};
use crate::error::Error;
use crate::{config, skel};

const USAGE: &str = "usage:
  ipam-da-pool show --config PATH [--network NAME] [--addresses] [--json | --format prometheus]
  ipam-da-pool check --config PATH [--network NAME] [--valid-attachments FILE] [--json]
  ipam-da-pool release --config PATH [--network NAME] (ADDRESS | --container ID [--ifname IF] | --node NAME) [--dry-run] [--json]
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
          and how many it keeps back (reserved). With --addresses, each
          held address with its container ID, interface, node and since
          when. --json prints one JSON object; --format prometheus prints
          gauges (ipam_da_pool_size, _used, _free) for node_exporter's
          textfile collector. It takes no lock: allocation goes on.
          PATH is a conflist, one plugin's configuration, or a directory
          of them (.conflist, .conf, .json), of which --network picks one.
  check --config PATH [--network NAME] [--valid-attachments FILE] [--json]
          Finds what is wrong in the network's records and names each:
          an address held outside every range of its pool (a range shrunk
          since), an attachment whose address is not recorded as its own,
          an address record that no DEL or GC can free (torn, or its
          attachment gone), an address listed by two attachments, and,
          with FILE (a JSON array of {\"containerID\", \"ifname\"}, as the
          runtime lists them for GC), attachments not in it. Exit status
          1 when it finds anything. It takes no lock.
  release --config PATH [--network NAME] (ADDRESS | --container ID [--ifname IF] | --node NAME) [--dry-run] [--json]
          Gives back what the attachments holding ADDRESS, of container
          ID (on interface IF), or of node NAME (one decommissioned) hold,
          each as a DEL would, and prints what it released (with
          --dry-run, what it would release). Nothing that matches is
          exit status 1, and nothing is changed. Each release is one short
          step: on the local store the network's lock is taken for one
          attachment at a time.
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

/// `check`'s options.
#[derive(Debug, PartialEq)]
struct Check {
    config: PathBuf,
    network: Option<String>,
    valid: Option<PathBuf>,
    json: bool,
}

fn parse_check(options: &[String]) -> Result<Check, String> {
    let mut check = Check {
        config: PathBuf::new(),
        network: None,
        valid: None,
        json: false,
    };
    each_option(options, |name, value| {
        match name {
            "--config" => check.config = value()?.into(),
            "--network" => check.network = Some(value()?),
            "--valid-attachments" => check.valid = Some(value()?.into()),
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
    let (holdings, records) = match &store {
        Some(store) => (store.holdings()?, store.address_records()?),
        None => (Vec::new(), Vec::new()),
    };
    let findings = check::check(
        store.as_deref(),
        &settings,
        &holdings,
        &records,
        valid.as_deref(),
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
            "network {name}: {} attachment(s), {} address record(s), {} finding(s)",
            holdings.len(),
            records.len(),
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

/// Which attachments `release` gives back.
#[derive(Debug, PartialEq)]
enum Chosen {
    Address(Addr),
    Container { id: String, ifname: Option<String> },
    Node(String),
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
                    "--config" | "--network" | "--container" | "--ifname" | "--node"
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
    let chosen = match (addresses.len(), address, container, node) {
        (1, Some(address), None, None) if ifname.is_none() => Chosen::Address(address),
        (0, None, Some(id), None) => Chosen::Container { id, ifname },
        (0, None, None, Some(node)) if ifname.is_none() => Chosen::Node(node),
        _ => {
            return Err(
                "release needs one of ADDRESS, --container ID [--ifname IF] or --node NAME".into(),
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

/// Whether a plugin's `ipam` runs ipam-da-pool, directly or as a delegate.
fn runs_allocator(ipam: &Value) -> bool {
    ipam["type"] == "ipam-da-pool"
        || ipam["delegates"]
            .as_array()
            .is_some_and(|d| d.iter().any(|name| name == "ipam-da-pool"))
}

/// The configuration of the network at `path` (a file, or a directory of
/// them, of which `network` picks one; a file of the directory that runs
/// no ipam-da-pool is another network's, and skipped).
fn load_network(path: &Path, network: Option<&str>) -> Result<Vec<u8>, Error> {
    let described = "that runs ipam-da-pool";
    if !path.is_dir() {
        let raw = config::load_plugin(path, described, runs_allocator)?;
        let name = NetConf::parse(&raw)?.name.to_owned();
        return match network {
            Some(wanted) if wanted != name => Err(Error::ConfigFile {
                path: path.to_owned(),
                reason: format!("is network {name:?}, not {wanted:?}"),
            }),
            _ => Ok(raw),
        };
    }
    let entries = std::fs::read_dir(path).map_err(|e| Error::Files {
        path: path.to_owned(),
        error: e,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|file| {
            let extension = file.extension().and_then(|e| e.to_str());
            matches!(extension, Some("conflist" | "conf" | "json"))
        })
        .collect();
    files.sort();
    let mut found: Vec<(String, Vec<u8>)> = Vec::new();
    for file in files {
        let Ok(raw) = config::load_plugin(&file, described, runs_allocator) else {
            continue;
        };
        let name = NetConf::parse(&raw)?.name.to_owned();
        if network.is_none_or(|wanted| wanted == name) {
            found.push((name, raw));
        }
    }
    let names: Vec<&str> = found.iter().map(|(name, _)| name.as_str()).collect();
    match (found.len(), network) {
        (1, _) => Ok(found.remove(0).1),
        (0, Some(wanted)) => Err(Error::ConfigFile {
            path: path.to_owned(),
            reason: format!("has no network {wanted:?} that runs ipam-da-pool"),
        }),
        (0, None) => Err(Error::ConfigFile {
            path: path.to_owned(),
            reason: "has no network that runs ipam-da-pool".into(),
        }),
        _ => Err(Error::ConfigFile {
            path: path.to_owned(),
            reason: format!(
                "has several networks that run ipam-da-pool ({}): pick one with --network",
                names.join(", ")
            ),
        }),
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

/// Releases what the chosen attachments hold, one at a time, printing
/// each: whether anything matched.
fn run_release(options: &Release) -> Result<bool, Error> {
    // Chosen from a read without the lock; each one then released as read
    // again under it (local) or in a transaction that fails if it changed
    // meanwhile (etcd).
    let Opened {
        name,
        settings,
        store: shared,
    } = open_unlocked(&options.config, options.network.as_deref())?;
    let chosen: Vec<Holding> = match &shared {
        Some(store) => store.holdings()?,
        None => Vec::new(),
    }
    .into_iter()
    .filter(|holding| options.chosen.matches(holding))
    .collect();
    let mut released = Vec::new();
    for holding in &chosen {
        if !options.dry_run {
            let done = match &settings.store {
                StoreSettings::Local { data_dir } => {
                    // The lock for this one attachment only.
                    match local::Local::open_existing(data_dir, &name)? {
                        Some(store) => release_as_read(&store, holding)?,
                        None => false,
                    }
                }
                StoreSettings::Etcd(_) => match &shared {
                    Some(store) => release_as_read(store.as_ref(), holding)?,
                    None => false,
                },
            };
            if !done {
                continue;
            }
        }
        released.push(holding);
    }
    let mut out = std::io::stdout().lock();
    let verb = if options.dry_run {
        "would release"
    } else {
        "released"
    };
    if options.json {
        let list: Vec<Value> = released
            .iter()
            .map(|h| {
                serde_json::json!({
                    "containerID": h.owner.id,
                    "ifname": h.owner.ifname,
                    "node": h.owner.node,
                    "addresses": h.held.iter().map(|a| a.address.to_string()).collect::<Vec<_>>(),
                })
            })
            .collect();
        let key = if options.dry_run {
            "wouldRelease"
        } else {
            "released"
        };
        let _ = writeln!(out, "{}", serde_json::json!({ key: list }));
    } else {
        for h in &released {
            let addresses: Vec<String> = h.held.iter().map(|a| a.address.to_string()).collect();
            let _ = writeln!(
                out,
                "{verb} {} held by {}/{} on node {}",
                addresses.join(", "),
                h.owner.id,
                h.owner.ifname,
                h.owner.node
            );
        }
    }
    if chosen.is_empty() {
        let _ = writeln!(
            std::io::stderr(),
            "ipam-da-pool: no attachment of network {} matches {}; nothing released",
            name,
            options.chosen
        );
    }
    Ok(!chosen.is_empty())
}

/// Releases `holding` if the store still has it as it was read: whether
/// it did (a holding that changed meanwhile is someone else's business).
fn release_as_read(store: &dyn Store, holding: &Holding) -> Result<bool, Error> {
    match store.holding(&holding.owner.id, &holding.owner.ifname)? {
        Some(now) if now.held == holding.held && now.owner == holding.owner => store.release(&now),
        _ => Ok(false),
    }
}

/// Shows the network's pools, as asked.
fn run_show(options: &Show) -> Result<bool, Error> {
    let Opened {
        name,
        settings,
        store,
    } = open_unlocked(&options.config, options.network.as_deref())?;
    let holdings = match &store {
        Some(store) => store.holdings()?,
        // A local store that never held anything: every pool is free.
        None => Vec::new(),
    };
    let reports = report::report(store.as_deref(), &settings, &holdings)?;
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
    let raw = config::load_plugin(&options.config, "that runs ipam-da-pool", runs_allocator)?;
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
