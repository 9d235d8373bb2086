//! `ipam-da-pool node-keeper`: keeps this node registered in the etcd
//! cluster its configuration names, until asked to stop.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::node_metrics::{self, Sources};
use super::{cluster_of, finish, read_network};
use crate::args::{Opt, Options, Verb};
use crate::da_pool::cluster::keeper;
use crate::da_pool::error::PoolError;
use crate::da_pool::metrics::{self, Latest};
use crate::da_pool::settings::invalid;
use crate::da_pool::store::Stores;
use crate::node_name;

/// `node-keeper`.
pub(super) const VERB: Verb = Verb {
    name: "node-keeper",
    synopsis: "--config PATH [--network NAME] [--node-name NAME [--node-name-file FILE]] [--metrics-listen ADDRESS:PORT]",
    options: &[
        Opt::value("--config"),
        Opt::value("--metrics-listen"),
        Opt::value("--network"),
        Opt::value("--node-name"),
        Opt::value("--node-name-file"),
    ],
    operands: false,
    help: "\
Keeps this node (ipam.pool.node, or the name pinned at first
use) registered in the etcd cluster the configuration names: a
key under a lease of ipam.pool.nodeTTL seconds (60 by default),
renewed every third of it by a keep-alive that writes nothing.
Several keepers of one node share that key: each registers the
node only if it is not registered, and checks at every renewal
(a read, writing nothing) that it still is. While `reclaim` has
the node fenced, says so as an error at every renewal. Runs
until SIGTERM or SIGINT, then withdraws the registration if it
is on its own lease, and exits 0. Logs to stderr. With --node-name, first
pins NAME as `ipam-delegated install --node-name` does (in
/var/lib/cni/ipam-da-pool/node-name, or FILE), so that a keeper
started before the installer takes the node's name from the same
source: a different name pinned already is refused. With
--metrics-listen, serves the node's metrics at
http://ADDRESS:PORT/metrics (Prometheus' text format), made
again every 10 s: each pool's size, use, free and reserved
addresses as the store shows them, and this node's use; the
node's registration, fence and last renewal; etcd's database
size, quota and alarms, or the local store's size; whether the
store answered; and the allocator's commands on this node, by
code, with their latency and etcd requests (ipam.pool.counts).
A scrape gets the last text made, never waiting on the store. On
a local store there is nothing to register, and the keeper runs
for its metrics alone.
",
    run: |given| Ok(finish(run(&options(given)?))),
};

/// `node-keeper`'s options.
#[derive(Debug, PartialEq)]
struct Keeper {
    config: PathBuf,
    network: Option<String>,
    /// The name to pin first, and where.
    node_name: Option<(String, PathBuf)>,
    /// Where to serve the node's metrics.
    metrics_listen: Option<SocketAddr>,
}

fn options(given: &Options) -> Result<Keeper, String> {
    let node_name = node_name::given(given)?;
    let metrics_listen = match given.value("--metrics-listen") {
        Some(address) => Some(listen_address(address).ok_or_else(|| {
            format!("--metrics-listen {address:?} is not ADDRESS:PORT (127.0.0.1:9641, [::1]:9641)")
        })?),
        None => None,
    };
    Ok(Keeper {
        metrics_listen,
        config: given.path("--config").ok_or("node-keeper needs --config")?,
        network: given.value("--network").map(String::from),
        node_name,
    })
}

/// `ADDRESS:PORT` as a socket address; an IPv6 address may come without
/// its brackets, as Kubernetes' `status.hostIP` gives it to
/// `--metrics-listen=$(NODE_IP):9641`.
fn listen_address(given: &str) -> Option<SocketAddr> {
    given.parse().ok().or_else(|| {
        let (host, port) = given.rsplit_once(':')?;
        format!("[{host}]:{port}").parse().ok()
    })
}

/// Keeps the node registered until asked to stop.
fn run(options: &Keeper) -> Result<bool, PoolError> {
    if let Some((name, file)) = &options.node_name {
        node_name::pin(file, name)?;
    }
    let (network, settings) = read_network(&options.config, options.network.as_deref())?;
    if let Some((name, _)) = options
        .node_name
        .as_ref()
        .filter(|(n, _)| *n != settings.node)
    {
        return Err(invalid(format!(
            "{} names node {:?} (ipam.pool.node, or another nodeNameFile), not {name:?}",
            options.config.display(),
            settings.node
        )));
    }
    let stores = Stores::new(&settings);
    let on_etcd = stores.on_etcd();
    // When this keeper last found the node registered: none yet.
    let renewed = Arc::new(AtomicU64::new(0));
    if let Some(address) = options.metrics_listen {
        // Before any thread starts, so that each inherits the signals
        // taken away from their default.
        if let Err(e) = crate::signals::watch() {
            eprintln!("ipam-da-pool node-keeper: SIGTERM and SIGINT will end it at once: {e}");
        }
        let sources = Sources {
            config: options.config.clone(),
            asked: options.network.clone(),
            network,
            counts: settings.counts.clone(),
            renewed: on_etcd.then(|| renewed.clone()),
        };
        // The node's registration matters more than its metrics: a port
        // taken is said, and the keeper goes on without them.
        match TcpListener::bind(address) {
            Ok(listener) => {
                let latest = Arc::new(Mutex::new(Latest::new()));
                let served = latest.clone();
                let stale_after = 3 * node_metrics::REFRESH;
                std::thread::spawn(move || metrics::serve(&listener, &served, stale_after));
                std::thread::spawn(move || node_metrics::collect(&sources, &latest));
            }
            // On a local store the metrics are all it is for.
            Err(e) if !on_etcd => {
                return Err(invalid(format!(
                    "--metrics-listen {address}: cannot listen there: {e}"
                )))
            }
            Err(e) => eprintln!(
                "ipam-da-pool node-keeper: --metrics-listen {address}: cannot listen there ({e}): no metrics served, the node kept registered"
            ),
        }
        if !on_etcd {
            // Nothing to register: the metrics alone, until asked to stop.
            while crate::signals::received(1).is_none() {
                crate::signals::sleep(Duration::from_secs(3600));
            }
            return Ok(true);
        }
    }
    let client = cluster_of(&stores, &options.config, "node-keeper")?;
    keeper::keep(
        &client,
        &settings.node,
        settings.node_ttl,
        &renewed,
        &mut std::io::stderr(),
    )?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_address_may_be_ipv6_without_brackets_as_a_host_ip_comes() {
        let parsed = |text: &str| listen_address(text).map(|a| a.to_string());
        assert_eq!(parsed("127.0.0.1:9641").as_deref(), Some("127.0.0.1:9641"));
        assert_eq!(parsed("[fd00::1]:9641").as_deref(), Some("[fd00::1]:9641"));
        assert_eq!(parsed("fd00::1:9641").as_deref(), Some("[fd00::1]:9641"));
        assert_eq!(parsed("node-a:9641"), None);
        assert_eq!(parsed("127.0.0.1"), None);
    }
}
