//! What `node-keeper --metrics-listen` serves, made again every
//! [`REFRESH`] by a thread of its own: the network's pools as the store
//! shows them, this node's share, its registration and fence, the store's
//! health, and the commands' counts. A scrape is answered with the last
//! text made, so it never waits on the store, and a store out of reach
//! is a gauge at 0, not a failed scrape.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::show::{self, Figures, PoolReport};
use super::{open_unlocked, Opened};
use crate::da_pool::counts::Tail;
use crate::da_pool::error::PoolError;
use crate::da_pool::metrics::{self, header, label, Latest};
use crate::da_pool::settings::{Settings, StoreSettings};
use crate::da_pool::store::{fence, Store};
use crate::etcd::EtcdClient;

/// How often the metrics' text is made again.
pub(super) const REFRESH: Duration = Duration::from_secs(10);

/// Where the metrics come from: the configuration at `config`, its
/// network as `--network` named it (`asked`), and what the keeper and
/// the commands leave.
pub(super) struct Sources {
    /// The configuration, as `--config` named it.
    pub config: PathBuf,
    /// Its network, as `--network` named it, if it did.
    pub asked: Option<String>,
    /// The network's name.
    pub network: String,
    /// The directory of the commands' counts; `None` where counting is off.
    pub counts: Option<PathBuf>,
    /// When the keeper last found the node registered, in seconds since
    /// the epoch (0: not yet); `None` on a local store, with no keeper.
    pub renewed: Option<Arc<AtomicU64>>,
}

/// Makes the metrics' text every [`REFRESH`], into `latest`, for ever.
pub(super) fn collect(sources: &Sources, latest: &Mutex<Latest>) {
    let network = &sources.network;
    let mut tails: Vec<Tail> = sources
        .counts
        .iter()
        .map(|dir| Tail::new(dir, network))
        .collect();
    loop {
        let mut text = String::new();
        let up = match read(&sources.config, sources.asked.as_deref(), &mut text) {
            Ok(()) => 1,
            Err(e) => {
                tracing::warn!("the pools of {network} cannot be read: {e}");
                0
            }
        };
        header(
            &mut text,
            "store_up",
            "gauge",
            "Whether the store answered the last read of the pools.",
        );
        let _ = writeln!(
            text,
            "ipam_da_pool_store_up{{network=\"{}\"}} {up}",
            label(network)
        );
        // 0 until the first renewal: a keeper that never renews alerts.
        if let Some(renewed) = &sources.renewed {
            let renewed = renewed.load(Ordering::Relaxed);
            header(
                &mut text,
                "keeper_last_renewal_timestamp_seconds",
                "gauge",
                "When this node's keeper last renewed its registration and found it in etcd.",
            );
            let _ = writeln!(
                text,
                "ipam_da_pool_keeper_last_renewal_timestamp_seconds{{network=\"{}\"}} {renewed}",
                label(network)
            );
        }
        for tail in &mut tails {
            if let Err(e) = tail.read_on() {
                tracing::warn!("the counts of {network} cannot be read: {e}");
            }
        }
        metrics::render_counts(&tails, &mut text);
        Latest::set(latest, text);
        std::thread::sleep(REFRESH);
    }
}

/// Writes the pools' gauges, this node's, and the store's, into `text`;
/// an error where the store did not answer.
fn read(config: &Path, asked: Option<&str>, text: &mut String) -> Result<(), PoolError> {
    let Opened {
        name,
        settings,
        stores,
        store,
    } = open_unlocked(config, asked)?;
    // Per pool: the figures of every node's use, and this node's use.
    let node_used = match store.as_deref() {
        Some(store) if store.is_shared() => {
            let (figures, node_used) = counted(store, &settings)?;
            text.push_str(&show::prometheus(&name, &figures));
            node_used
        }
        store => {
            let (allocations, holds) = match store {
                Some(store) => (store.allocations()?, store.workload_holds()?),
                None => (Vec::new(), Vec::new()),
            };
            let reports = show::report(store, &settings, &allocations, &holds)?;
            let figures: Vec<Figures> = reports.iter().map(PoolReport::figures).collect();
            text.push_str(&show::prometheus(&name, &figures));
            reports
                .iter()
                .map(|pool| {
                    let used = pool.held.iter().filter(|h| h.node == settings.node);
                    (pool.name.clone(), used.count())
                })
                .collect()
        }
    };
    let network = label(&name);
    let node = label(&settings.node);
    header(
        text,
        "node_used",
        "gauge",
        "Addresses of the pool held by this node's attachments.",
    );
    for (pool, used) in node_used {
        let _ = writeln!(
            text,
            "ipam_da_pool_node_used{{network=\"{network}\",pool=\"{}\",node=\"{node}\"}} {used}",
            label(&pool)
        );
    }
    header(
        text,
        "node_info",
        "gauge",
        "The name this node's records are under (pinned, or ipam.pool.node).",
    );
    let _ = writeln!(
        text,
        "ipam_da_pool_node_info{{network=\"{network}\",node=\"{node}\"}} 1"
    );
    match &settings.store {
        StoreSettings::Local { data_dir } => local(data_dir, &name, text),
        StoreSettings::Etcd { .. } => {
            if let Some(client) = stores.cluster()? {
                cluster(&client, &settings.node, text)?;
            }
        }
    }
    Ok(())
}

/// How many addresses of each pool (by name) this node's attachments hold.
type NodeUse = Vec<(String, usize)>;

/// The figures of each pool of `settings` on a store that every node
/// shares, and what this node uses of each, read without reading every
/// node's attachments: each range's records counted by the store, the
/// holds (few) read, and this node's own attachments. Every node's
/// daemon reads them every [`REFRESH`]: a thousand nodes reading a
/// network of 100,000 attachments whole would be 10,000 attachments a
/// second. A held address that its pool no longer gives (a range
/// shrunk, an address excluded since) is not counted.
fn counted<'a>(
    store: &dyn Store,
    settings: &'a Settings,
) -> Result<(Vec<Figures<'a>>, NodeUse), PoolError> {
    let holds = store.workload_holds()?;
    let mine = store.allocations_of(&settings.node)?;
    let mut figures = Vec::new();
    let mut node_used = Vec::new();
    for pool in &settings.pools {
        let mut used: u128 = 0;
        for range in &pool.ranges {
            // A store that counts: the caller asked only such a one.
            used += u128::from(store.count_held(range.start, range.end)?.unwrap_or(0));
        }
        let sticky = holds
            .iter()
            .filter(|hold| hold.until.is_some())
            .flat_map(|hold| &hold.held)
            .filter(|h| h.pool == pool.name)
            .count();
        figures.push(Figures {
            name: &pool.name,
            size: Some(pool.size()),
            reserved: pool.kept_back().len(),
            used,
            free: Some(pool.size().saturating_sub(used)),
            sticky,
            // Keys, counted: a cooldown's among them, not told apart.
            cooling: None,
        });
        let own = mine
            .iter()
            .flat_map(|a| &a.held)
            .filter(|h| h.pool == pool.name)
            .count();
        node_used.push((pool.name.clone(), own));
    }
    Ok((figures, node_used))
}

/// The node's registration and fence, and etcd's health.
fn cluster(client: &EtcdClient, node: &str, text: &mut String) -> Result<(), PoolError> {
    let alive = fence::node_key(&client.settings().prefix, node, "alive");
    let registered = u8::from(client.get(&alive)?.is_some());
    let fenced = u8::from(fence::read(client, node)?.is_some());
    let node = label(node);
    header(
        text,
        "node_registered",
        "gauge",
        "Whether this node's registration is in etcd (a keeper renews it).",
    );
    let _ = writeln!(
        text,
        "ipam_da_pool_node_registered{{node=\"{node}\"}} {registered}"
    );
    header(
        text,
        "node_fenced",
        "gauge",
        "Whether reclaim fenced this node: its ADDs are refused until readmit.",
    );
    let _ = writeln!(text, "ipam_da_pool_node_fenced{{node=\"{node}\"}} {fenced}");
    let health = client.health()?;
    let endpoint = label(&health.endpoint);
    header(
        text,
        "etcd_db_size_bytes",
        "gauge",
        "The database size of the etcd member this node reads.",
    );
    let _ = writeln!(
        text,
        "ipam_da_pool_etcd_db_size_bytes{{endpoint=\"{endpoint}\"}} {}",
        health.db_size
    );
    if let Some(quota) = health.quota {
        header(text, "etcd_quota_bytes", "gauge", "The member's database quota (--quota-backend-bytes): at it, etcd takes no more writes.");
        let _ = writeln!(
            text,
            "ipam_da_pool_etcd_quota_bytes{{endpoint=\"{endpoint}\"}} {quota}"
        );
    }
    header(
        text,
        "etcd_alarms",
        "gauge",
        "The etcd cluster's alarms raised (NOSPACE: no more writes; CORRUPT).",
    );
    let _ = writeln!(text, "ipam_da_pool_etcd_alarms {}", health.alarms.len());
    Ok(())
}

/// The local store's size on disk: its files' blocks, as `du` counts
/// them (0 before its first ADD).
fn local(data_dir: &Path, network: &str, text: &mut String) {
    let dir = data_dir.join(network);
    match metrics::disk_usage(&dir) {
        Ok(bytes) => {
            header(
                text,
                "local_store_bytes",
                "gauge",
                "Disk space the network's local store takes.",
            );
            let _ = writeln!(
                text,
                "ipam_da_pool_local_store_bytes{{network=\"{}\"}} {bytes}",
                label(network)
            );
        }
        Err(e) => tracing::warn!("the size of {} cannot be read: {e}", dir.display()),
    }
}
