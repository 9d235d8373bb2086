//! A thousand nodes on one 3-member etcd cluster on loopback, simulated
//! from one process tree: each node a configuration of its own (its name,
//! its notes' directory), its ADDs and DELs the static `ipam-da-pool` as a
//! runtime calls it, and its keeper a real `ipam-da-pool node-keeper`
//! process. In order:
//!
//! 1. 1,000 keepers started: how long until all are registered, the
//!    memory each takes, then the revisions per second they add while the
//!    cluster is otherwise idle (goal 0: a renewal is a lease keep-alive
//!    and a read) and the bytes etcd receives from them;
//! 2. with the keepers running from here on, 10,000 ADDs by 100 nodes, 16
//!    at a time: etcd's database size per 10,000 attachments (`dbSize`,
//!    and `dbSizeInUse`, which counts no free page), and the ADDs'
//!    throughput; ADD p50 and p99 of one more node after the first 1,000;
//! 3. the records of 90,000 more attachments, held by 900 other nodes in
//!    the network's second pool, written as the store writes them:
//!    100,000 in all;
//! 4. GC on a node holding 100 of the 100,000, in the bytes etcd sends;
//! 5. ADD p50 and p99 of one node at 100,000 attachments, against step
//!    2's; then the same beside 4 workers churning ADD→DEL.
//!
//! Run with `cargo bench --bench scale` (about four minutes; needs
//! etcd-server, which ./.ci/test installs, and some 2 GiB of memory for
//! the keepers).

#[path = "support/cni_call.rs"]
mod cni_call;
// The tests' harness, of which the bench uses the etcd clusters.
#[allow(dead_code)]
#[path = "../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "support/static_build.rs"]
mod static_build;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::etcd::Cluster;
use common::temp_dir;
use serde_json::json;

/// The simulated nodes.
const NODES: usize = 1_000;
/// The nodes that make the real ADDs, and how many each makes.
const ADDING_NODES: usize = 100;
const ADDS_EACH: usize = 100;
/// Attachments in all, once the rest are written as records.
const ATTACHMENTS: usize = 100_000;
/// Processes making ADDs at once while the cluster fills.
const WORKERS: usize = 16;
/// ADDs timed for each p50 and p99.
const TIMED: usize = 200;
/// How long the keepers are watched idle.
const IDLE: Duration = Duration::from_secs(60);
/// Workers churning ADD→DEL while the last ADDs are timed.
const CHURNERS: usize = 4;
/// The etcd prefix, and the network's two pools: "p", which the ADDs
/// are given from, and "q", whose attachments are written directly (an
/// ADD that loses a race goes on from a random place of its pool, so
/// records written in its own pool could meet its claims).
const PREFIX: &str = "/scale";
const SUBNET: &str = "10.64.0.0/15";
const WRITTEN_SUBNET: &str = "10.66.0.0/15";
/// Where the records written directly start: 10.66.0.0.
const WRITTEN_FROM: u32 = 0x0a42_0000;
/// When the written records say they were made (seconds since the
/// epoch, as the store writes it): 2026-11-28.
const SINCE: u64 = 1_795_800_000;

/// Bytes etcd sends and receives, as its metrics count them.
const SENT: &str = "etcd_network_client_grpc_sent_bytes_total";
const RECEIVED: &str = "etcd_network_client_grpc_received_bytes_total";

fn main() {
    let cluster = Cluster::start(3, None);
    let work = temp_dir("bench-scale");
    let built = static_build::build_static();
    // As installed: a copy, not the file the linker wrote.
    let allocator = work.path().join("ipam-da-pool");
    std::fs::copy(built.join("ipam-da-pool"), &allocator).unwrap();
    let nodes = Nodes {
        endpoints: cluster.endpoints(),
        dir: work.path().to_owned(),
        allocator,
    };
    println!(
        "{NODES} nodes on a 3-member etcd cluster, one network, pools {SUBNET} and {WRITTEN_SUBNET}:"
    );

    // 1. The keepers, on a cluster that holds nothing yet.
    let started = Instant::now();
    let keepers = Keepers((0..NODES).map(|n| nodes.keeper(n)).collect());
    let deadline = Instant::now() + Duration::from_secs(120);
    while registered(&cluster) < NODES {
        assert!(
            Instant::now() < deadline,
            "{} of {NODES} keepers registered after 120 s",
            registered(&cluster)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let registering = started.elapsed();
    let rss: u64 = keepers.0.iter().map(|k| rss_kib(k.id())).sum();
    // A renewal's interval is a third of the default nodeTTL (60 s): the
    // window sees each keeper renew three times.
    let (revision, received) = (cluster.revision(), cluster.metric(RECEIVED));
    std::thread::sleep(IDLE);
    let revisions = cluster.revision() - revision;
    let received = cluster.metric(RECEIVED) - received;
    println!(
        "  {NODES} keepers: all registered in {:.1} s; {:.0} KiB of memory each; idle for {} s, \
         {:.2} revisions/s (goal 0), etcd received {:.1} KiB/s",
        registering.as_secs_f64(),
        rss as f64 / NODES as f64,
        IDLE.as_secs(),
        revisions as f64 / IDLE.as_secs_f64(),
        received / IDLE.as_secs_f64() / 1024.0
    );

    // 2. The real ADDs, the keepers running; the first 1,000 and then the rest.
    let (size_before, in_use_before) = cluster.db_size();
    let first = ADDING_NODES * 10;
    let started = Instant::now();
    nodes.add_many(0..first);
    let mut took = started.elapsed();
    let early = nodes.timed_adds("probe-early", TIMED);
    let started = Instant::now();
    nodes.add_many(first..ADDING_NODES * ADDS_EACH);
    took += started.elapsed();
    let (size_after, in_use_after) = cluster.db_size();
    let added = ADDING_NODES * ADDS_EACH + TIMED;
    let per_10k = |bytes: u64| bytes as f64 / added as f64 * 10_000.0 / (1024.0 * 1024.0);
    println!(
        "  database per 10,000 attachments (from {added} ADDs): {:.2} MiB, {:.2} MiB in use; \
         {:.0} ADDs/s with {WORKERS} at once",
        per_10k(size_after - size_before),
        per_10k(in_use_after - in_use_before),
        (ADDING_NODES * ADDS_EACH) as f64 / took.as_secs_f64()
    );

    // 3. The other attachments, as the store writes them.
    let written = ATTACHMENTS - ADDING_NODES * ADDS_EACH;
    let per_node = written / (NODES - ADDING_NODES);
    let base = format!("{PREFIX}/networks/scale/");
    let pairs: Vec<(String, String)> = (0..written)
        .flat_map(|n| {
            let node = node_name(ADDING_NODES + n / per_node);
            let at = Ipv4Addr::from(WRITTEN_FROM + n as u32);
            let [a, b, c, d] = at.octets();
            let id = format!("w{n}");
            let owner = json!({"containerID": id, "ifname": "eth0", "node": node, "pool": "q", "since": SINCE});
            let mut attachment = owner.clone();
            attachment["addresses"] = json!([{"pool": "q", "address": at.to_string()}]);
            attachment.as_object_mut().unwrap().remove("pool");
            [
                (
                    format!("{base}addresses/{a:03}.{b:03}.{c:03}.{d:03}"),
                    owner.to_string(),
                ),
                (
                    format!("{base}nodes/{node}/attachments/{id}:eth0"),
                    attachment.to_string(),
                ),
            ]
        })
        .collect();
    cluster.put_all(&pairs);

    // 4. GC on a node holding `per_node` of them, keeping them all (the
    // keepers' renewals are in the figure too: about 50 a second).
    let gc_node = ADDING_NODES;
    let valid: Vec<_> = (0..per_node)
        .map(|n| json!({"containerID": format!("w{n}"), "ifname": "eth0"}))
        .collect();
    let mut config: serde_json::Value = serde_json::from_str(&nodes.config(gc_node)).unwrap();
    config["cni.dev/valid-attachments"] = json!(valid);
    let gc_bytes: Vec<f64> = (0..5)
        .map(|_| {
            let before = cluster.metric(SENT);
            let out = nodes.call(&config.to_string(), "", "GC");
            assert!(out.status.success(), "GC: {out:?}");
            cluster.metric(SENT) - before
        })
        .collect();
    println!(
        "  GC on a node holding {per_node} of {ATTACHMENTS}: {:.1} KiB sent by etcd (median of 5)",
        median_f64(gc_bytes) / 1024.0
    );

    // 5. ADDs at 100,000: alone, then beside churn.
    let late = nodes.timed_adds("probe-late", TIMED);
    println!(
        "  ADD p50 / p99 of one node: with {first} attachments {:.2} / {:.2} ms; with {ATTACHMENTS} \
         and the keepers running {:.2} / {:.2} ms: p50 {:.2}x (goal <= 1.2)",
        ms(early.0),
        ms(early.1),
        ms(late.0),
        ms(late.1),
        late.0.as_secs_f64() / early.0.as_secs_f64()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let nodes = Arc::new(nodes);
    let churners: Vec<_> = (0..CHURNERS)
        .map(|w| {
            let (nodes, stop) = (nodes.clone(), stop.clone());
            std::thread::spawn(move || {
                let config = nodes.config(w);
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let id = format!("churn{w}-{n}");
                    assert!(nodes.call(&config, &id, "ADD").status.success());
                    assert!(nodes.call(&config, &id, "DEL").status.success());
                    n += 1;
                }
                n
            })
        })
        .collect();
    let churning = nodes.timed_adds("probe-churn", TIMED);
    stop.store(true, Ordering::SeqCst);
    let churned: usize = churners.into_iter().map(|c| c.join().unwrap()).sum();
    println!(
        "    the same beside {CHURNERS} workers churning ADD→DEL ({churned} of them) on this \
         2-core machine: {:.2} / {:.2} ms",
        ms(churning.0),
        ms(churning.1)
    );
    drop(keepers);
}

/// The keepers started, stopped (SIGTERM: each withdraws its
/// registration) however the bench ends.
struct Keepers(Vec<Child>);

impl Drop for Keepers {
    fn drop(&mut self) {
        for keeper in &self.0 {
            let _ = Command::new("kill")
                .args(["-TERM", &keeper.id().to_string()])
                .status();
        }
        for keeper in &mut self.0 {
            let _ = keeper.wait();
        }
    }
}

/// The simulated nodes' settings and the allocator they call.
struct Nodes {
    endpoints: Vec<String>,
    dir: PathBuf,
    allocator: PathBuf,
}

impl Nodes {
    /// Node `n`'s configuration: its name, and its notes' directory.
    fn config(&self, n: usize) -> String {
        self.config_named(&node_name(n))
    }

    fn config_named(&self, node: &str) -> String {
        let pool = json!({
            "etcd": {"endpoints": self.endpoints, "prefix": PREFIX},
            "node": node,
            "dataDir": self.dir.join("notes").join(node),
            "default": "p",
            "gcGraceSeconds": 0,
            "pools": {"p": [{"subnet": SUBNET}], "q": [{"subnet": WRITTEN_SUBNET}]},
        });
        json!({"cniVersion": "1.1.0", "name": "scale", "ipam": {"type": "ipam-da-pool", "pool": pool}})
            .to_string()
    }

    /// ADDs numbered `range`, spread over the adding nodes, WORKERS at once.
    fn add_many(&self, range: std::ops::Range<usize>) {
        let next = AtomicUsize::new(range.start);
        std::thread::scope(|scope| {
            for _ in 0..WORKERS {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= range.end {
                        break;
                    }
                    let config = self.config(i % ADDING_NODES);
                    let out = self.call(&config, &format!("c{i}"), "ADD");
                    assert!(out.status.success(), "ADD c{i}: {out:?}");
                });
            }
        });
    }

    /// `count` sequential ADDs of node `node`: their p50 and p99.
    fn timed_adds(&self, node: &str, count: usize) -> (Duration, Duration) {
        let config = self.config_named(node);
        let mut times: Vec<Duration> = (0..count)
            .map(|i| {
                let started = Instant::now();
                let out = self.call(&config, &format!("{node}-{i}"), "ADD");
                let took = started.elapsed();
                assert!(out.status.success(), "{out:?}");
                took
            })
            .collect();
        times.sort();
        (times[count / 2], times[(count * 99 / 100).min(count - 1)])
    }

    /// Node `n`'s keeper, started.
    fn keeper(&self, n: usize) -> Child {
        let file = self.dir.join(format!("{}.conf", node_name(n)));
        std::fs::write(&file, self.config(n)).unwrap();
        Command::new(&self.allocator)
            .arg("node-keeper")
            .arg("--config")
            .arg(&file)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the keeper starts")
    }

    /// One call of the allocator.
    fn call(&self, config: &str, id: &str, command: &str) -> std::process::Output {
        cni_call::call(&self.allocator, &self.dir, config, id, command)
    }
}

fn node_name(n: usize) -> String {
    format!("node-{n:04}")
}

/// How many nodes are registered (keys only: the nodes' prefixes hold
/// their attachments too).
fn registered(cluster: &Cluster) -> usize {
    cluster
        .try_keys_apart_from(usize::MAX, &format!("{PREFIX}/nodes/"))
        .unwrap_or_default()
        .iter()
        .filter(|key| key.ends_with("/alive"))
        .count()
}

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn median_f64(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
