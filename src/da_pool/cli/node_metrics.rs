//! What `node-keeper --metrics-listen` serves, made again every
//! [`REFRESH`] by a thread of its own: the network's pools as the store
//! shows them, this node's share, its registration and fence, the store's
//! health, and the commands' counts. A scrape is answered with the last
//! text made, so it never waits on the store, and a store out of reach
//! is a gauge at 0, not a failed scrape.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::{open_unlocked, show, Opened};
use crate::da_pool::counts::Tail;
use crate::da_pool::error::PoolError;
use crate::da_pool::metrics::{self, header, label};
use crate::da_pool::settings::StoreSettings;
use crate::da_pool::store::fence;
use crate::etcd::EtcdClient;

/// How often the metrics' text is made again.
pub(super) const REFRESH: Duration = Duration::from_secs(10);

/// Where the metrics come from: the configuration at `config`, its
/// network as `--network` named it (`asked`), and what the keeper and
/// the commands leave.
pub(super) struct Sources {
    pub config: PathBuf,
    pub asked: Option<String>,
    /// The network's name.
    pub network: String,
    /// The directory of the commands' counts; `None` where counting is off.
    pub counts: Option<PathBuf>,
}

/// Makes the metrics' text every [`REFRESH`], into `latest`, for ever.
/// `renewed` is when the keeper last found the node registered, in
/// seconds since the epoch (0: not yet, or no keeper).
pub(super) fn collect(sources: &Sources, renewed: &AtomicU64, latest: &Mutex<String>) {
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
        let renewed = renewed.load(Ordering::Relaxed);
        if renewed > 0 {
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
        match latest.lock() {
            Ok(mut held) => *held = text,
            Err(poisoned) => *poisoned.into_inner() = text,
        }
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
    let (allocations, holds) = match &store {
        Some(store) => (store.allocations()?, store.workload_holds()?),
        None => (Vec::new(), Vec::new()),
    };
    let reports = show::report(store.as_deref(), &settings, &allocations, &holds)?;
    text.push_str(&show::prometheus(&name, &reports));
    let network = label(&name);
    let node = label(&settings.node);
    header(
        text,
        "node_used",
        "gauge",
        "Addresses of the pool held by this node's attachments.",
    );
    for pool in &reports {
        let used = pool.held.iter().filter(|held| held.node == settings.node);
        let _ = writeln!(
            text,
            "ipam_da_pool_node_used{{network=\"{network}\",pool=\"{}\",node=\"{node}\"}} {}",
            label(&pool.name),
            used.count()
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
