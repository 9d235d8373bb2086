//! `ipam-da-pool show`: per pool of a network, how many addresses it may
//! give, how many are held and by which node, how many of those only a
//! workload's hold keeps (its container gone), and, if asked, each held
//! address with its attachment or hold; as text, JSON or Prometheus
//! gauges. Read from the store without a lock, each record whole, while
//! allocation goes on.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use serde_json::{json, Value};

use super::{finish, open_unlocked, Format, Opened};
use crate::addr::Addr;
use crate::args::{Opt, Options, Verb};
use crate::da_pool::clock::utc;
use crate::da_pool::error::PoolError;
use crate::da_pool::metrics::label;
use crate::da_pool::settings::Settings;
use crate::da_pool::store::{Allocation, Cooling, Store, WorkloadHold};
use crate::pools::Pool;

/// `show`.
pub(super) const VERB: Verb = Verb {
    name: "show",
    synopsis: "--config PATH [--network NAME] [--addresses] [--json | --format prometheus]",
    options: &[
        Opt::value("--config"),
        Opt::value("--network"),
        Opt::flag("--addresses"),
        Opt::flag("--json"),
        Opt::value("--format"),
    ],
    operands: false,
    help: "\
Per pool of the network: how many addresses it may give (size),
how many are held (used) and on which node, how many are free,
how many it keeps back (reserved), how many of those held only
a workload's hold keeps, its container gone (sticky), and how
many were given back and cool down before they are given again
(cooling, ipam.pool.reuseAfter). With --addresses, each held
address with its container ID, interface, node, workload and
since (or, for a hold, until) when, and each cooling address
with its end. --json prints one JSON object; --format prometheus
prints gauges (ipam_da_pool_size, _reserved, _used, _free,
_sticky, _cooling) for
node_exporter's textfile collector. It takes no lock:
allocation goes on.
",
    run: |given| Ok(finish(run(&options(given)?))),
};

/// `show`'s options.
#[derive(Debug, PartialEq)]
struct Show {
    config: PathBuf,
    network: Option<String>,
    addresses: bool,
    format: Format,
}

fn options(given: &Options) -> Result<Show, String> {
    let format = Format::given(given, "show")?;
    Ok(Show {
        config: given.path("--config").ok_or("show needs --config")?,
        network: given.value("--network").map(String::from),
        addresses: given.flag("--addresses"),
        format,
    })
}

/// Shows the network's pools, as asked.
fn run(options: &Show) -> Result<bool, PoolError> {
    crate::sys::give_way();
    let Opened {
        name,
        settings,
        store,
        ..
    } = open_unlocked(&options.config, options.network.as_deref())?;
    let (allocations, holds) = match &store {
        Some(store) => (store.allocations()?, store.workload_holds()?),
        // A local store that never held anything: every pool is free.
        None => (Vec::new(), Vec::new()),
    };
    let reports = report(store.as_deref(), &settings, &allocations, &holds)?;
    let printed = match options.format {
        Format::Text => text(&name, &settings.node, &reports, options.addresses),
        Format::Json => format!(
            "{}\n",
            json(&name, &settings.node, &reports, options.addresses)
        ),
        Format::Prometheus => {
            let figures: Vec<Figures> = reports.iter().map(PoolReport::figures).collect();
            prometheus(&name, &figures)
        }
    };
    // A reader that went away (`| head`) has what it wanted.
    let _ = std::io::stdout().write_all(printed.as_bytes());
    Ok(true)
}
/// One pool's figures.
#[derive(Debug, PartialEq)]
pub struct PoolReport {
    /// The pool's name, as the records name it.
    pub name: String,
    /// How many addresses it may give; `None` for a pool defined neither
    /// in the configuration nor in the store (one inline in a selector's
    /// result), whose addresses are known only from the records.
    pub size: Option<u128>,
    /// How many of the pool's addresses `reserved` keeps back.
    pub reserved: usize,
    /// How many may still be given: the size less the held and cooling
    /// addresses the pool may give (one held from before an `exclude` is
    /// not counted twice); `None` when the size is not known.
    free: Option<u128>,
    /// The addresses held, in address order.
    pub held: Vec<HeldAddress>,
    /// The addresses the pool gives that cool down, in address order
    /// (none for a pool whose ranges are not known).
    pub cooling: Vec<(Addr, Cooling)>,
}

/// One held address and its attachment, or the workload's hold that
/// keeps it with no container.
#[derive(Debug, PartialEq)]
pub struct HeldAddress {
    pub address: Addr,
    /// Empty for an address only a workload's hold keeps.
    pub container_id: String,
    pub ifname: String,
    pub node: String,
    /// The workload the address follows, if it follows one.
    pub workload: Option<String>,
    /// When the attachment's record was made, or the hold released,
    /// seconds since the epoch.
    pub since: u64,
    /// When a hold with no container ends.
    pub until: Option<u64>,
}

impl PoolReport {
    /// How many addresses only a workload's hold keeps (its container gone).
    pub fn sticky(&self) -> usize {
        self.held
            .iter()
            .filter(|h| h.container_id.is_empty())
            .count()
    }

    /// How many are held on each node, by node name.
    pub fn per_node(&self) -> BTreeMap<&str, usize> {
        let mut nodes = BTreeMap::new();
        for h in &self.held {
            *nodes.entry(h.node.as_str()).or_insert(0) += 1;
        }
        nodes
    }

    /// How many may still be given; `None` when the size is not known.
    pub fn free(&self) -> Option<u128> {
        self.free
    }
}

/// The pools of a network, from what its attachments hold and what the
/// holds no container has bound keep: those the configuration defines,
/// then any other that a record names (defined by the store, if there is
/// one, or unknown), in name order.
pub fn report(
    store: Option<&dyn Store>,
    settings: &Settings,
    allocations: &[Allocation],
    holds: &[WorkloadHold],
) -> Result<Vec<PoolReport>, PoolError> {
    let mut by_pool: BTreeMap<&str, Vec<HeldAddress>> = BTreeMap::new();
    for allocation in allocations {
        for h in &allocation.held {
            by_pool.entry(&h.pool).or_default().push(HeldAddress {
                address: h.address,
                container_id: allocation.owner.id.clone(),
                ifname: allocation.owner.ifname.clone(),
                node: allocation.owner.node.clone(),
                workload: allocation.owner.workload.clone(),
                since: allocation.since,
                until: None,
            });
        }
    }
    let attached: HashSet<(&str, &str)> = allocations
        .iter()
        .map(|a| (a.owner.id.as_str(), a.owner.ifname.as_str()))
        .collect();
    let listed: HashSet<Addr> = allocations
        .iter()
        .flat_map(|a| a.held.iter().map(|h| h.address))
        .collect();
    for hold in holds {
        let bound_alive = hold
            .container
            .as_ref()
            .is_some_and(|id| attached.contains(&(id.as_str(), hold.ifname.as_str())));
        if bound_alive {
            // Its container's attachment lists its addresses.
            continue;
        }
        // One an attachment lists too (a DEL cut short) is counted once.
        for h in hold.held.iter().filter(|h| !listed.contains(&h.address)) {
            by_pool.entry(&h.pool).or_default().push(HeldAddress {
                address: h.address,
                container_id: String::new(),
                ifname: hold.ifname.clone(),
                node: hold.node.clone(),
                workload: Some(hold.workload.clone()),
                since: hold.since,
                until: hold.ends(false),
            });
        }
    }
    let mut reports = Vec::new();
    let mut add = |name: &str, pool: Option<&Pool>, held: Vec<HeldAddress>| {
        let mut held = held;
        held.sort_by_key(|h| h.address);
        let mut cooling = Vec::new();
        if let (Some(store), Some(p)) = (store, pool) {
            for range in &p.ranges {
                let found = store.cooling(range.start, range.end)?;
                cooling.extend(found.into_iter().filter(|(a, _)| p.refusal(*a).is_none()));
            }
        }
        let free = pool.map(|p| {
            let counted = held
                .iter()
                .filter(|h| p.refusal(h.address).is_none())
                .count();
            p.size()
                .saturating_sub(counted as u128)
                .saturating_sub(cooling.len() as u128)
        });
        reports.push(PoolReport {
            name: name.to_owned(),
            size: pool.map(Pool::size),
            reserved: pool.map_or(0, |p| p.kept_back().len()),
            free,
            held,
            cooling,
        });
        Ok::<(), PoolError>(())
    };
    for pool in &settings.pools {
        add(
            &pool.name,
            Some(pool),
            by_pool.remove(pool.name.as_str()).unwrap_or_default(),
        )?;
    }
    for (name, held) in by_pool {
        let definition = match store {
            Some(store) => store.pool_definition(name)?,
            None => None,
        };
        let defined = match definition {
            Some(definition) => Pool::parse(name, &definition).ok(),
            None => None,
        };
        add(name, defined.as_ref(), held)?;
    }
    Ok(reports)
}

/// The report as lines of text, as node `node` reads it; with
/// `addresses`, each held address too.
pub fn text(network: &str, node: &str, reports: &[PoolReport], addresses: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "network {network} (this node: {node})");
    for pool in reports {
        let size = pool
            .size
            .map_or_else(|| "not defined here".to_owned(), |s| s.to_string());
        let free = pool
            .free()
            .map_or_else(|| "?".to_owned(), |f| f.to_string());
        let _ = writeln!(
            out,
            "  pool {}: size {size}, used {}, free {free}, reserved {}, sticky {}, cooling {}",
            pool.name,
            pool.held.len(),
            pool.reserved,
            pool.sticky(),
            pool.cooling.len()
        );
        for (node, used) in pool.per_node() {
            let _ = writeln!(out, "    node {node}: {used} used");
        }
        if addresses {
            for h in &pool.held {
                let _ = match (&h.workload, h.until) {
                    (Some(workload), Some(until)) => writeln!(
                        out,
                        "    {} held for workload {workload} ({}) node {} until {}",
                        h.address,
                        h.ifname,
                        h.node,
                        utc(until)
                    ),
                    (workload, _) => writeln!(
                        out,
                        "    {} {}/{}{} node {} since {}",
                        h.address,
                        h.container_id,
                        h.ifname,
                        workload
                            .as_ref()
                            .map_or(String::new(), |w| format!(" workload {w}")),
                        h.node,
                        utc(h.since)
                    ),
                };
            }
            for (address, cooling) in &pool.cooling {
                let _ = writeln!(out, "    {address} cooling until {}", utc(cooling.until));
            }
        }
    }
    out
}

/// The report as one JSON object; with `addresses`, each held address too.
pub fn json(network: &str, node: &str, reports: &[PoolReport], addresses: bool) -> Value {
    let pools: Vec<Value> = reports
        .iter()
        .map(|pool| {
            let mut object = json!({
                "name": pool.name,
                "size": pool.size.map(number),
                "used": pool.held.len(),
                "free": pool.free().map(number),
                "reserved": pool.reserved,
                "sticky": pool.sticky(),
                "cooling": pool.cooling.len(),
                "nodes": pool.per_node(),
            });
            if addresses {
                object["addresses"] = pool
                    .held
                    .iter()
                    .map(|h| {
                        let mut held = json!({
                            "address": h.address.to_string(),
                            "containerID": h.container_id,
                            "ifname": h.ifname,
                            "node": h.node,
                            "since": utc(h.since),
                        });
                        if let Some(workload) = &h.workload {
                            held["workload"] = json!(workload);
                        }
                        if let Some(until) = h.until {
                            held["until"] = json!(utc(until));
                        }
                        held
                    })
                    .collect();
                object["coolingAddresses"] = pool
                    .cooling
                    .iter()
                    .map(|(address, cooling)| {
                        json!({"address": address.to_string(), "until": utc(cooling.until)})
                    })
                    .collect();
            }
            object
        })
        .collect();
    json!({"network": network, "node": node, "pools": pools})
}

/// What the Prometheus gauges say of one pool.
#[derive(Debug, PartialEq)]
pub struct Figures<'a> {
    pub name: &'a str,
    /// `None` for a pool of unknown size (then no size or free figure).
    pub size: Option<u128>,
    pub reserved: usize,
    pub used: u128,
    pub free: Option<u128>,
    pub sticky: usize,
    /// `None` where it is not counted apart (a daemon on etcd, which
    /// counts the keys: cooling addresses are among `used` there).
    pub cooling: Option<usize>,
}

impl PoolReport {
    /// Its figures, for the gauges.
    pub fn figures(&self) -> Figures<'_> {
        Figures {
            name: &self.name,
            size: self.size,
            reserved: self.reserved,
            used: self.held.len() as u128,
            free: self.free,
            sticky: self.sticky(),
            cooling: Some(self.cooling.len()),
        }
    }
}

/// One figure of a pool, if it has it.
type Figure = fn(&Figures) -> Option<u128>;

/// The pools' figures as Prometheus gauges, in the text exposition format
/// that node_exporter's textfile collector reads.
pub fn prometheus(network: &str, pools: &[Figures]) -> String {
    let mut out = String::new();
    let gauges: [(&str, &str, Figure); 6] = [
        ("size", "Addresses the pool may give.", |p| p.size),
        (
            "reserved",
            "Addresses of the pool kept back (reserved), never given.",
            |p| Some(p.reserved as u128),
        ),
        ("used", "Addresses of the pool held.", |p| Some(p.used)),
        ("free", "Addresses the pool may still give.", |p| p.free),
        (
            "sticky",
            "Addresses of the pool held for workloads with no container now.",
            |p| Some(p.sticky as u128),
        ),
        (
            "cooling",
            "Addresses of the pool given back that cool down before they are given again.",
            |p| p.cooling.map(|c| c as u128),
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP ipam_da_pool_{name} {help}");
        let _ = writeln!(out, "# TYPE ipam_da_pool_{name} gauge");
        for pool in pools {
            if let Some(value) = value(pool) {
                let _ = writeln!(
                    out,
                    "ipam_da_pool_{name}{{network=\"{}\",pool=\"{}\"}} {value}",
                    label(network),
                    label(pool.name)
                );
            }
        }
    }
    out
}

/// A count as a JSON number: exact up to 2^64, beyond (the size of a wide
/// IPv6 pool) a float, as precise as any consumer of JSON reads it.
fn number(count: u128) -> Value {
    match u64::try_from(count) {
        Ok(n) => json!(n),
        Err(_) => json!(count as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::NetConf;
    use crate::da_pool::store::fake_store::FakeStore;
    use crate::da_pool::store::{Owner, PoolAddress};

    /// `VERB`'s options, as the command line `list` gives them.
    fn parse(list: &[&str]) -> Result<Show, String> {
        VERB.parse_words(list).and_then(|given| options(&given))
    }

    #[test]
    fn show_takes_a_config_a_network_and_one_format() {
        assert_eq!(
            parse(&[
                "--config",
                "/etc/cni/net.d",
                "--network=pods",
                "--addresses",
                "--json"
            ]),
            Ok(Show {
                config: "/etc/cni/net.d".into(),
                network: Some("pods".into()),
                addresses: true,
                format: Format::Json,
            })
        );
        assert_eq!(
            parse(&["--config=f", "--format", "prometheus"]).map(|s| s.format),
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
            (
                &["--config", "f", "--json", "--format", "prometheus"][..],
                "show takes --json or --format, not both",
            ),
            (&["--config"][..], "--config needs a value"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(said), "{bad:?}: {e}");
        }
    }

    /// A store in which nodes a and b hold addresses of pools blue (the
    /// configuration's, a /28 with a block excluded and one address
    /// reserved), central (the store's) and inline (defined nowhere).
    fn reported() -> Vec<PoolReport> {
        let raw = json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"type": "ipam-da-pool", "pool": {
            "node": "a",
            "pools": {"blue": {"ranges": [{"subnet": "10.4.0.0/28", "exclude": ["10.4.0.8/30"]}], "reserved": ["10.4.0.2"]}},
        }}})
        .to_string();
        let net = NetConf::parse(raw.as_bytes()).unwrap();
        let settings = Settings::from_net(&net).unwrap();
        let mut store = FakeStore::default();
        store
            .pools
            .insert("central".into(), json!([{"subnet": "10.9.0.0/24"}]));
        let claim = |id: &str, node: &str, held: &[(&str, &str)]| {
            let owner = Owner {
                id: id.into(),
                ifname: "eth0".into(),
                node: node.into(),
                workload: None,
            };
            let held: Vec<PoolAddress> = held
                .iter()
                .map(|(pool, address)| PoolAddress {
                    pool: (*pool).into(),
                    address: Addr::new(address.parse().unwrap()),
                })
                .collect();
            assert!(store.claim(&owner, &held, None).unwrap());
        };
        claim("c2", "b", &[("blue", "10.4.0.5")]);
        claim("c1", "a", &[("blue", "10.4.0.3"), ("central", "10.9.0.7")]);
        claim("c3", "a", &[("inline", "192.168.0.9")]);
        // Held from before its block was excluded: used, but not from the size.
        claim("c4", "b", &[("blue", "10.4.0.9")]);
        // A workload's container, and a workload whose container is gone.
        for (id, workload, address) in [
            ("w1", "ns/web-0", "10.4.0.6"),
            ("w2", "ns/web-1", "10.4.0.7"),
        ] {
            let owner = Owner {
                id: id.into(),
                ifname: "eth0".into(),
                node: "b".into(),
                workload: Some(workload.into()),
            };
            let held = [PoolAddress {
                pool: "blue".into(),
                address: Addr::new(address.parse().unwrap()),
            }];
            let sticky = crate::da_pool::store::StickyClaim {
                workload,
                sticky_for: 3_600,
                prior: None,
            };
            assert!(store.claim(&owner, &held, Some(&sticky)).unwrap());
        }
        let w2 = store.attachments.borrow()[&("w2".into(), "eth0".into())].clone();
        store.release(&w2).unwrap();
        // Given back and cooling down: one blue gives, one of its excluded
        // block (not counted), one of central.
        for address in ["10.4.0.4", "10.4.0.10", "10.9.0.8"] {
            let cooling = crate::da_pool::store::Cooling {
                pool: None,
                until: 1_800_000_060,
            };
            let address = Addr::new(address.parse().unwrap());
            store.cooling.borrow_mut().insert(address, cooling);
        }
        let allocations = store.allocations().unwrap();
        let holds = store.workload_holds().unwrap();
        report(Some(&store), &settings, &allocations, &holds).unwrap()
    }

    #[test]
    fn each_pool_says_its_size_what_is_used_on_which_node_and_what_is_free() {
        let reports = reported();
        let names: Vec<&str> = reports.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["blue", "central", "inline"]);
        // .1 to .14, less the gateway, the block of 4 and the reserved one.
        let blue = &reports[0];
        assert_eq!(
            (blue.size, blue.held.len(), blue.free(), blue.reserved),
            (Some(8), 5, Some(3), 1)
        );
        assert_eq!(
            blue.cooling.len(),
            1,
            "10.4.0.4, not the excluded 10.4.0.10"
        );
        assert_eq!(blue.sticky(), 1, "10.4.0.7, whose container is gone");
        assert_eq!(blue.per_node(), BTreeMap::from([("a", 1), ("b", 4)]));
        assert_eq!(
            blue.held[0].address.to_string(),
            "10.4.0.3",
            "in address order"
        );
        assert_eq!((reports[1].size, reports[1].free()), (Some(253), Some(251)));
        assert_eq!((reports[2].size, reports[2].free()), (None, None));
        let text = text("n", "a", &reports, true);
        assert!(text.starts_with("network n (this node: a)\n"), "{text}");
        assert!(text.contains("  pool blue: size 8, used 5, free 3, reserved 1, sticky 1, cooling 1\n    node a: 1 used\n    node b: 4 used\n    10.4.0.3 c1/eth0 node a since "), "{text}");
        assert!(
            text.contains("\n    10.4.0.6 w1/eth0 workload ns/web-0 node b since "),
            "{text}"
        );
        assert!(
            text.contains("\n    10.4.0.7 held for workload ns/web-1 (eth0) node b until "),
            "{text}"
        );
        assert!(
            text.contains(
                "  pool inline: size not defined here, used 1, free ?, reserved 0, sticky 0, cooling 0"
            ),
            "{text}"
        );
        assert!(
            text.contains("\n    10.4.0.4 cooling until 2027-01-15T08:01:00Z\n"),
            "{text}"
        );
        let value = json("n", "a", &reports, true);
        assert_eq!(value["pools"][0]["cooling"], 1);
        assert_eq!(
            value["pools"][0]["coolingAddresses"],
            json!([{"address": "10.4.0.4", "until": "2027-01-15T08:01:00Z"}])
        );
        assert_eq!(value["node"], "a");
        assert_eq!(value["pools"][0]["nodes"], json!({"a": 1, "b": 4}));
        assert_eq!(value["pools"][0]["sticky"], 1);
        assert_eq!(value["pools"][0]["addresses"][1]["containerID"], "c2");
        let held = &value["pools"][0]["addresses"][3];
        assert_eq!(
            (&held["containerID"], &held["workload"]),
            (&json!(""), &json!("ns/web-1"))
        );
        assert!(held["until"].as_str().unwrap().ends_with('Z'));
        assert_eq!(value["pools"][2]["size"], Value::Null);
        assert!(json("n", "a", &reports, false)["pools"][0]
            .get("addresses")
            .is_none());
    }

    #[test]
    fn prometheus_gauges_are_in_the_exposition_format() {
        let reports = reported();
        let figures: Vec<Figures> = reports.iter().map(PoolReport::figures).collect();
        let out = prometheus("n", &figures);
        let mut samples = Vec::new();
        let mut typed = Vec::new();
        for line in out.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                typed.push(rest.to_owned());
            } else if !line.starts_with("# HELP ") {
                // name{labels} value, the value a number.
                let (series, value) = line.rsplit_once(' ').unwrap();
                value.parse::<f64>().unwrap();
                samples.push(series.to_owned());
            }
        }
        assert_eq!(
            typed,
            [
                "ipam_da_pool_size gauge",
                "ipam_da_pool_reserved gauge",
                "ipam_da_pool_used gauge",
                "ipam_da_pool_free gauge",
                "ipam_da_pool_sticky gauge",
                "ipam_da_pool_cooling gauge"
            ]
        );
        assert!(
            out.contains("ipam_da_pool_cooling{network=\"n\",pool=\"blue\"} 1\n"),
            "{out}"
        );
        assert!(
            samples.contains(&"ipam_da_pool_free{network=\"n\",pool=\"blue\"}".to_owned()),
            "{out}"
        );
        assert!(
            out.contains("ipam_da_pool_used{network=\"n\",pool=\"inline\"} 1\n"),
            "{out}"
        );
        assert!(
            !out.contains("ipam_da_pool_size{network=\"n\",pool=\"inline\"}"),
            "no size for an unknown pool"
        );
    }
}
