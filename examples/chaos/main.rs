//! The fault-injection run: `.ci/chaos [SECONDS] [SEED]`. Four nodes, each
//! a network namespace with its own pinned name, state and keeper, run
//! ADD, CHECK, DEL and GC through the release build of ipam-delegated over
//! [ipam-ds-static, ipam-da-pool] on a 3-member etcd cluster, while faults
//! from a seeded schedule break things; then every fault is undone, every
//! node settled, and the checker reads the history and the stores: no
//! address held twice (but where reclaim fenced a node: the price of
//! reclaim, counted apart), nothing leaked, `ipam-da-pool check` clean.
//! Prints a summary line; exits 1 on any violation, naming it, the
//! history kept. Needs root, etcd-server, etcd-client, iproute2,
//! util-linux (nsenter), procps (pkill) and faketime.

mod checker;
mod cluster;
mod faults;
mod figures;
mod history;
mod nodes;
mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};

use cluster::Cluster;
use history::{lock, Recorder};
use nodes::{run, Node};
use workload::Runtime;

/// How many nodes.
const NODES: usize = 4;

/// How many sticky workloads move between them.
const WORKLOADS: usize = 12;

/// The pool: 10.212.0.0/23.
const POOL: &str = "10.212.0.0/23";

/// A small pseudo-random sequence (xorshift): the same seed, the same
/// schedule.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// A number below `n` (at least 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Everything the threads of a run share.
pub struct World {
    pub nodes: Vec<Node>,
    /// Where the release binaries are.
    pub bin: PathBuf,
    /// The network's configuration as the operator's commands on this
    /// host read it (etcd on loopback).
    pub operator_config: PathBuf,
    pub recorder: Recorder,
    /// Each sticky workload, and where a container of it runs.
    pub workloads: Mutex<BTreeMap<String, Option<(String, String)>>>,
    pub cluster: Mutex<Cluster>,
    /// Held while the fences are read, and while a node is readmitted.
    pub fencing: Mutex<()>,
    /// The start of the first reclaim since the fences were last read.
    pub reclaim_since: Mutex<Option<u64>>,
    stop: AtomicBool,
}

impl World {
    /// Whether the run is over.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// A workload that runs nowhere, now bound to `container` of `node`.
    pub fn take_workload(&self, node: &str, container: &str) -> Option<String> {
        let mut workloads = lock(&self.workloads);
        let (name, running) = workloads
            .iter_mut()
            .find(|(_, running)| running.is_none())?;
        *running = Some((node.to_owned(), container.to_owned()));
        Some(name.clone())
    }

    /// `container` of `node` is deleted: its workload may start again,
    /// unless it has been freed and started elsewhere meanwhile.
    pub fn free_workload(&self, workload: &str, node: &str, container: &str) {
        let mut workloads = lock(&self.workloads);
        if let Some(running) = workloads.get_mut(workload) {
            if running
                .as_ref()
                .is_some_and(|(n, c)| n == node && c == container)
            {
                *running = None;
            }
        }
    }

    /// An address of the pool, to ask for.
    pub fn some_address(&self, rng: &mut Rng) -> String {
        let host = 2 + rng.below(509);
        format!("10.212.{}.{}", host / 256, host % 256)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for node in &self.nodes {
            node.remove();
        }
    }
}

/// A free TCP port of this host.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("0.0.0.0:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// The network's configuration, without its etcd endpoints.
fn network() -> Value {
    json!({
        "cniVersion": "1.1.0",
        "name": "chaos",
        "type": "chaos-runtime",
        "ipam": {
            "type": "ipam-delegated",
            "delegates": ["ipam-ds-static", "ipam-da-pool"],
            "timeout": 8,
            "static": {"default": [{"name": "chaos"}]},
            "pool": {
                "etcd": {"endpoints": [], "prefix": "/chaos", "timeout": 2},
                "pools": {"chaos": [{"subnet": POOL}]},
                "sticky": ["K8S_POD_NAMESPACE", "K8S_POD_NAME"],
                "stickyFor": "20s",
                "nodeTTL": faults::NODE_TTL,
                "gcGraceSeconds": 0,
            },
        },
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(120);
    let seed: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64 | 1)
            .unwrap_or(1)
    });
    let bin = std::env::var_os("CHAOS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("this program's path");
            // target/release/examples/chaos: the binaries are in target/release.
            exe.parent()
                .and_then(Path::parent)
                .expect("target/release")
                .to_owned()
        });
    for binary in ["ipam-delegated", "ipam-ds-static", "ipam-da-pool"] {
        assert!(
            bin.join(binary).exists(),
            "{} is missing: cargo build --release first (.ci/chaos does)",
            bin.join(binary).display()
        );
    }
    // Names this run's namespaces, links and directory (.ci/chaos sets it,
    // to clean up after a run it had to kill).
    let tag =
        std::env::var("CHAOS_TAG").unwrap_or_else(|_| format!("{}", std::process::id() % 10_000));
    let dir = std::env::temp_dir().join(format!("chaos-{seed}-{tag}"));
    std::fs::create_dir_all(dir.join("etcd")).expect("the run's directory");
    let history_file = dir.join("history.jsonl");
    let recorder = Recorder::new(std::fs::File::create(&history_file).ok());
    eprintln!(
        "chaos seed={seed}, {seconds} s, history in {}",
        history_file.display()
    );

    let ports: Vec<u16> = (0..6).map(|_| free_port()).collect();
    let cluster = Cluster::start(&dir.join("etcd"), 3, &ports, 32 << 20, seconds + 900);
    let clients: Vec<u16> = ports.iter().step_by(2).copied().collect();
    let nodes: Vec<Node> = (0..NODES)
        .map(|i| Node::make(i, &tag, &dir, &network(), &clients, &bin))
        .collect();
    let mut operator = network();
    operator["ipam"]["pool"]["etcd"]["endpoints"] = json!(cluster.endpoints("127.0.0.1"));
    operator["ipam"]["pool"]["node"] = json!("operator");
    let operator_config = dir.join("operator.conf");
    std::fs::write(&operator_config, operator.to_string()).expect("the operator's configuration");
    let world = World {
        nodes,
        bin,
        operator_config,
        recorder,
        workloads: Mutex::new(
            (0..WORKLOADS)
                .map(|i| (format!("db/web-{i}"), None))
                .collect(),
        ),
        cluster: Mutex::new(cluster),
        fencing: Mutex::new(()),
        reclaim_since: Mutex::new(None),
        stop: AtomicBool::new(false),
    };
    if let Some(missing) = unregistered(&world) {
        panic!("the keepers did not register {missing:?}");
    }

    let runtimes: Vec<Runtime> = std::thread::scope(|scope| {
        let world = &world;
        let runtimes: Vec<_> = world
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                scope.spawn(move || {
                    let mut runtime =
                        Runtime::new(world, node, seed.wrapping_add(101 * (i as u64 + 1)));
                    runtime.run();
                    runtime
                })
            })
            .collect();
        scope.spawn(move || faults::lasting(world, seed.wrapping_add(7)));
        scope.spawn(move || faults::instant(world, seed.wrapping_add(13)));
        scope.spawn(move || faults::operator(world));
        std::thread::sleep(Duration::from_secs(seconds));
        world.stop.store(true, Ordering::SeqCst);
        runtimes
            .into_iter()
            .map(|r| r.join().expect("a runtime thread"))
            .collect()
    });
    let faulty_until = world.recorder.now();
    let mut trouble = undo_faults(&world);
    let mut runtimes = runtimes;
    for runtime in &mut runtimes {
        runtime.settle();
        trouble.append(&mut runtime.trouble);
    }
    let verdict = judge(&world, &runtimes, trouble, seed, faulty_until);
    match verdict {
        true => {
            drop(world);
            if std::env::var_os("CHAOS_KEEP").is_none() {
                let _ = std::fs::remove_dir_all(&dir);
            }
            ExitCode::SUCCESS
        }
        false => {
            eprintln!("the run's history and logs are kept in {}", dir.display());
            ExitCode::FAILURE
        }
    }
}

/// Waits up to 20 s until every node's keeper has registered it: the
/// nodes still not registered then, if any.
fn unregistered(world: &World) -> Option<Vec<String>> {
    let mut missing = Vec::new();
    for _ in 0..200 {
        let out =
            lock(&world.cluster).etcdctl(&["get", "--prefix", "--keys-only", "/chaos/nodes/"]);
        let keys = String::from_utf8_lossy(&out.stdout);
        missing = world
            .nodes
            .iter()
            .filter(|n| !keys.contains(&format!("/chaos/nodes/{}/alive", n.name)))
            .map(|n| n.name.clone())
            .collect();
        if missing.is_empty() {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(missing)
}

/// Every lasting fault undone: links up, keepers resumed, second keepers
/// stopped, clocks right, members running, space back. A node not
/// registered then, its keeper running, is trouble.
fn undo_faults(world: &World) -> Vec<String> {
    for node in &world.nodes {
        if node.cut.load(Ordering::SeqCst) {
            node.set_cut(false);
        }
        node.signal_keeper("CONT");
        node.stop_other_keepers();
        *lock(&node.skew) = None;
        *lock(&node.kill_next) = None;
    }
    {
        let mut cluster = lock(&world.cluster);
        for member in 0..cluster.size() {
            cluster.restart(member);
        }
        assert!(
            cluster.wait_healthy(Duration::from_secs(60)),
            "etcd is not healthy again"
        );
    }
    faults::clear(world);
    // A fence the last reclaims made and no reading saw.
    let mut trouble = Vec::new();
    let mut tries = 0;
    while !faults::see_fences(world) {
        tries += 1;
        if tries == 30 {
            trouble.push("the fences could not be read once the faults were undone".to_owned());
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    trouble.extend(unregistered(world).into_iter().flatten().map(|node| {
        format!("{node} is not registered once the faults were undone, its keeper running")
    }));
    trouble
}

/// Reads the history and the stores: whether all is well, said.
fn judge(
    world: &World,
    runtimes: &[Runtime],
    trouble: Vec<String>,
    seed: u64,
    faulty_until: u64,
) -> bool {
    let history = world.recorder.history();
    let mut violations = trouble;
    let overlaps = checker::overlaps(&history);
    let reclaimed = overlaps.iter().filter(|o| o.reclaimed).count();
    for overlap in overlaps.iter().filter(|o| !o.reclaimed) {
        violations.push(format!(
            "doubled: {} held by {} ({}) from {} ms and by {} ({}) from {} ms",
            overlap.first.address,
            overlap.first.container,
            overlap.first.node,
            overlap.first.from,
            overlap.second.container,
            overlap.second.node,
            overlap.second.from
        ));
        for line in checker::around(
            &history,
            &[&overlap.first.container, &overlap.second.container],
        ) {
            violations.push(format!("    {line}"));
        }
    }
    for add in checker::adds_through_fences(&history) {
        violations.push(format!("an ADD through a fence: {add:?}"));
    }
    // A fence needs the registration gone for --dead-for; a keeper back
    // registers its node again within a renewal, a TTL at most.
    let unexplained =
        checker::unexplained_fences(&history, faults::DEAD_FOR * 1_000, faults::NODE_TTL * 1_000);
    for fence in &unexplained {
        violations.push(format!(
            "reclaimed a live node: {} fenced at {} ms, its link up and its keeper running",
            fence.node, fence.at
        ));
    }
    for event in history
        .events
        .iter()
        .filter(|e| e.kind == "re-pin" && e.detail != "refused")
    {
        violations.push(format!("an installer renamed {}", event.target));
    }
    // The stores: exactly the live attachments.
    let live: BTreeMap<String, Vec<String>> = runtimes.iter().flat_map(Runtime::live).collect();
    let show = run(
        world.bin.join("ipam-da-pool").to_str().unwrap(),
        &[
            "show",
            "--config",
            world.operator_config.to_str().unwrap(),
            "--addresses",
            "--json",
        ],
    );
    let shown: Value = serde_json::from_slice(&show.stdout).unwrap_or_default();
    let mut stored: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut sticky = 0;
    for held in shown["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["addresses"].as_array().cloned().unwrap_or_default())
    {
        let container = held["containerID"].as_str().unwrap_or_default();
        let address = held["address"].as_str().unwrap_or_default().to_owned();
        if container.is_empty() {
            sticky += 1;
        } else {
            stored
                .entry(container.to_owned())
                .or_default()
                .push(address);
        }
    }
    if !show.status.success() {
        violations.push(format!("show failed: {show:?}"));
    }
    let differences = checker::differences(&live, &stored);
    let count = |what: &str| {
        differences
            .iter()
            .filter(|(_, d)| d.starts_with(what))
            .count()
    };
    let (leaked, lost) = (count("leaked"), count("lost"));
    for (container, difference) in &differences {
        violations.push(difference.clone());
        for line in checker::around(&history, &[container]) {
            violations.push(format!("    {line}"));
        }
    }
    let check = run(
        world.bin.join("ipam-da-pool").to_str().unwrap(),
        &[
            "check",
            "--config",
            world.operator_config.to_str().unwrap(),
            "--json",
        ],
    );
    let report: Value = serde_json::from_slice(&check.stdout).unwrap_or_default();
    for finding in report["findings"].as_array().into_iter().flatten() {
        violations.push(format!("check: {finding}"));
    }
    if report.is_null() {
        violations.push(format!("check failed: {check:?}"));
    }

    let kinds = figures::faults(&history);
    let faults: usize = kinds.values().sum();
    let operations = history.operations.len();
    let (during, between) = figures::throughput(&history, faulty_until);
    let listed: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let doubled = overlaps.len() - reclaimed;
    for violation in &violations {
        eprintln!("{violation}");
    }
    println!(
        "chaos seed={seed} {operations} operations ({during:.1}/s succeeded during lasting faults, {between:.1}/s between them), {faults} faults ({}), doubled {doubled}, leaked {leaked}, lost {lost}, live nodes reclaimed {}; {reclaimed} overlap(s) on nodes reclaim fenced (its price), {} live attachment(s), {sticky} address(es) kept by holds",
        listed.join(", "),
        unexplained.len(),
        live.len()
    );
    violations.is_empty()
}
