//! The fault-injection run: `.ci/chaos [SECONDS] [SEED]`. Four nodes, each
//! a network namespace with its own pinned name, state and keeper, run
//! ADD, CHECK, DEL and GC through the release build of ipam-delegated over
//! [ipam-ds-static, ipam-da-pool] on a 3-member etcd cluster with TLS,
//! while faults from a seeded schedule break things and watchers record
//! etcd's own history of the network; then every fault is undone, every
//! node's DELs settled, the store read, the final GC run, the store read
//! again, and the checker judges the store's history and snapshots (read
//! with etcdctl, never through the binaries judged) and the runtimes'
//! history: see `store_rules` and `checker`. Prints a summary line; exits
//! 1 on any violation, naming it, the history kept. Needs root,
//! etcd-server, etcd-client, openssl, iproute2, util-linux (nsenter),
//! procps (pkill) and faketime.

mod checker;
mod cluster;
mod etcd_history;
mod faults;
mod figures;
mod history;
mod nodes;
mod relay;
mod store_rules;
mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use cluster::Cluster;
use etcd_history::{Snapshot, Watchers};
use history::{lock, Recorder};
use nodes::Node;
use store_rules::{Rules, Violation};
use workload::Runtime;

/// How many nodes.
const NODES: usize = 4;

/// How many sticky workloads move between them.
const WORKLOADS: usize = 12;

/// The pool: 10.212.0.0/23.
const POOL: &str = "10.212.0.0/23";

/// The store's prefix, as the watchers read it.
const PREFIX: &str = "/chaos/";

/// ipam.timeout and ipam.pool.stickyFor, in seconds.
const TIMEOUT: u64 = 8;
const STICKY_FOR: u64 = 20;

/// ipam.pool.reuseAfter, in seconds.
const REUSE_AFTER: u64 = 3;

/// How long past its bound an operation may run, ms: the plugin's own
/// start and end, on a loaded machine.
const OVERDUE_SLACK: u64 = 2_000;

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

/// Where a sticky workload runs, if it does, and until when it rests
/// once its container is gone (ms since the run began): a workload away
/// for longer than `stickyFor` finds its hold ended.
#[derive(Debug, Default)]
pub struct Placement {
    /// The node and container it runs as.
    pub running: Option<(String, String)>,
    pub rests_until: u64,
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
    pub workloads: Mutex<BTreeMap<String, Placement>>,
    pub cluster: Mutex<Cluster>,
    /// etcd's own history of the store, as the checker reads it.
    pub watchers: Arc<Watchers>,
    /// The relay the first node reaches the first member through.
    pub relay: relay::Relay,
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

    /// A workload that runs nowhere and has rested, now bound to
    /// `container` of `node`.
    pub fn take_workload(&self, node: &str, container: &str) -> Option<String> {
        let now = self.recorder.now();
        let mut workloads = lock(&self.workloads);
        let (name, placement) = workloads
            .iter_mut()
            .find(|(_, p)| p.running.is_none() && p.rests_until <= now)?;
        placement.running = Some((node.to_owned(), container.to_owned()));
        Some(name.clone())
    }

    /// `container` of `node` is deleted: its workload may start again
    /// once it has rested `rest` ms, unless it has been freed and started
    /// elsewhere meanwhile.
    pub fn free_workload(&self, workload: &str, node: &str, container: &str, rest: u64) {
        let now = self.recorder.now();
        let mut workloads = lock(&self.workloads);
        if let Some(placement) = workloads.get_mut(workload) {
            if placement
                .running
                .as_ref()
                .is_some_and(|(n, c)| n == node && c == container)
            {
                placement.running = None;
                placement.rests_until = now + rest;
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
            "timeout": TIMEOUT,
            "static": {"default": [{"name": "chaos"}]},
            "pool": {
                "etcd": {"endpoints": [], "prefix": "/chaos", "timeout": 2},
                "pools": {"chaos": [{"subnet": POOL}]},
                "sticky": ["K8S_POD_NAMESPACE", "K8S_POD_NAME"],
                "stickyFor": format!("{STICKY_FOR}s"),
                "reuseAfter": format!("{REUSE_AFTER}s"),
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
    let gateways: Vec<String> = (0..NODES).map(nodes::gateway).collect();
    let cluster = Cluster::start(
        &dir.join("etcd"),
        3,
        &ports,
        &gateways,
        32 << 20,
        seconds + 900,
    );
    // From the cluster's first revision on.
    let watchers = Watchers::start(&cluster, PREFIX, recorder.began());
    let _ = cluster.etcdctl(&["put", etcd_history::MARK, "mark"]);
    // The first node reaches the first member through a relay that may
    // trickle (the others directly: a relay costs every call a little).
    let clients: Vec<u16> = ports.iter().step_by(2).copied().collect();
    let relay = relay::Relay::start(free_port(), clients[0]);
    let relayed: Vec<u16> = std::iter::once(relay.port)
        .chain(clients[1..].iter().copied())
        .collect();
    let nodes: Vec<Node> = (0..NODES)
        .map(|i| {
            let ports = if i == 0 { &relayed } else { &clients };
            Node::make(i, &tag, &dir, &network(), ports, &cluster.tls, &bin)
        })
        .collect();
    let mut operator = network();
    operator["ipam"]["pool"]["etcd"]["endpoints"] = json!(cluster.endpoints("127.0.0.1"));
    operator["ipam"]["pool"]["etcd"]["tls"] = nodes::tls_settings(&cluster.tls);
    operator["ipam"]["pool"]["node"] = json!("operator");
    // Its notes (a release's cooldown lease) in the run's directory, not
    // the machine's.
    operator["ipam"]["pool"]["dataDir"] = json!(dir.join("operator"));
    let operator_config = dir.join("operator.conf");
    std::fs::write(&operator_config, operator.to_string()).expect("the operator's configuration");
    let world = World {
        nodes,
        bin,
        operator_config,
        recorder,
        workloads: Mutex::new(
            (0..WORKLOADS)
                .map(|i| (format!("db/web-{i}"), Placement::default()))
                .collect(),
        ),
        cluster: Mutex::new(cluster),
        watchers,
        relay,
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
        runtime.settle_dels();
    }
    // What the DELs left, before GC frees what killed commands left.
    let before_gc = read_store(&world, &mut trouble);
    let gc_began = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for runtime in &mut runtimes {
        runtime.settle_gc();
        trouble.append(&mut runtime.trouble);
    }
    let after_gc = read_store(&world, &mut trouble);
    world.watchers.stop();
    keep_store_history(&world.watchers.changes(), &dir.join("store.jsonl"));
    let verdict = judge(
        &world,
        &runtimes,
        trouble,
        seed,
        faulty_until,
        (&before_gc, &after_gc, gc_began),
    );
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
            cluster.pause(member, false);
            cluster.restart(member);
        }
        assert!(
            cluster.wait_healthy(Duration::from_secs(60)),
            "etcd is not healthy again"
        );
    }
    world.relay.trickle(false);
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

/// The store as etcd has it now, once the watchers have read up to now
/// (a mark written, and seen); what fails is trouble.
fn read_store(world: &World, trouble: &mut Vec<String>) -> Snapshot {
    let cluster = lock(&world.cluster);
    let put = cluster.etcdctl(&["put", etcd_history::MARK, "mark", "-w", "json"]);
    let revision = serde_json::from_slice::<Value>(&put.stdout)
        .ok()
        .and_then(|v| v["header"]["revision"].as_u64());
    if !revision.is_some_and(|r| world.watchers.wait_for(r, Duration::from_secs(30))) {
        trouble.push("the watchers did not read the store's history up to its end".to_owned());
    }
    etcd_history::snapshot(&cluster, PREFIX).unwrap_or_else(|| {
        trouble.push("the store could not be read once the faults were undone".to_owned());
        Snapshot::new()
    })
}

/// Writes etcd's history of the store to `path`, a JSON line per change,
/// to be read again with the run's history should it fail.
fn keep_store_history(changes: &[etcd_history::Change], path: &Path) {
    use std::io::Write;
    let Ok(file) = std::fs::File::create(path) else {
        return;
    };
    let mut file = std::io::BufWriter::new(file);
    for change in changes {
        let value = change
            .value
            .as_ref()
            .map(|v| String::from_utf8_lossy(v).into_owned());
        let line = json!({"revision": change.revision, "at": change.at, "key": change.key, "value": value});
        // Kept for reading only: a line not written is no verdict lost.
        let _ = writeln!(file, "{line}");
    }
}

/// Whether `node`'s clock (any node's, if `None`) was skewed at some
/// time from `from` to `to` (ms).
fn skewed(history: &history::History, node: Option<&str>, from: u64, to: u64) -> bool {
    history
        .events
        .iter()
        .filter(|e| node.is_none_or(|n| e.target == n))
        .filter(|e| e.kind.starts_with("clock-") && e.kind != "clock-right")
        .any(|start| {
            let end = history
                .events
                .iter()
                .filter(|e| e.kind == "clock-right" && e.target == start.target && e.at >= start.at)
                .map(|e| e.at)
                .min()
                .unwrap_or(u64::MAX);
            start.at <= to && from <= end
        })
}

/// Judges the run from the runtimes' history, etcd's history of the
/// store, and the store before and after the final GC: whether all is
/// well, said.
fn judge(
    world: &World,
    runtimes: &[Runtime],
    trouble: Vec<String>,
    seed: u64,
    faulty_until: u64,
    (before_gc, after_gc, gc_began): (&Snapshot, &Snapshot, u64),
) -> bool {
    let history = world.recorder.history();
    let changes = world.watchers.changes();
    let mut violations = trouble;
    violations.extend(world.watchers.trouble());
    let rules = Rules {
        network: format!("{PREFIX}networks/chaos/"),
        nodes: format!("{PREFIX}nodes/"),
        dead_for: faults::DEAD_FOR * 1_000,
        dead_for_slack: 1_000,
        sticky_for: STICKY_FOR * 1_000,
        sticky_slack: 2_000,
        sticky_early: 2_000,
        reuse_after: REUSE_AFTER * 1_000,
        cooldown_early: 1_000,
        full: full_windows(&history, TIMEOUT * 1_000),
        cooldown_longest: 60_000,
    };
    let end = world.recorder.now();
    let mut found: Vec<Violation> = store_rules::judge(
        &changes,
        &rules,
        &history,
        &|node, from, to| skewed(&history, node, from, to),
        end,
    );
    found.extend(store_rules::unrecorded_answers(&history, &changes, &rules));
    found.extend(store_rules::left_by_dels(
        before_gc, &changes, &history, &rules,
    ));
    found.extend(store_rules::inconsistencies(after_gc, &rules));
    let cooled = store_rules::cooldowns(&changes, &rules);
    if cooled == 0 {
        violations.push("the run cooled no address down".into());
    }

    let overlaps = checker::overlaps(&history);
    let reclaimed = overlaps.iter().filter(|o| o.reclaimed).count();
    for overlap in overlaps.iter().filter(|o| !o.reclaimed) {
        found.push(Violation {
            kind: "doubled",
            what: format!(
                "doubled: {} answered to {} ({}) from {} ms and to {} ({}) from {} ms",
                overlap.first.address,
                overlap.first.container,
                overlap.first.node,
                overlap.first.from,
                overlap.second.container,
                overlap.second.node,
                overlap.second.from
            ),
        });
        let found = found.last_mut().expect("just pushed");
        for line in checker::around(
            &history,
            &[&overlap.first.container, &overlap.second.container],
        ) {
            found.what.push_str(&format!("\n    {line}"));
        }
    }
    for add in checker::adds_through_fences(&history) {
        found.push(Violation {
            kind: "through-fence",
            what: format!("an ADD through a fence: {add:?}"),
        });
    }
    // A fence needs the registration gone for --dead-for; a keeper back
    // registers its node again within a renewal, a TTL at most.
    let unexplained =
        checker::unexplained_fences(&history, faults::DEAD_FOR * 1_000, faults::NODE_TTL * 1_000);
    for fence in &unexplained {
        found.push(Violation {
            kind: "live-reclaimed",
            what: format!(
                "reclaimed a live node: {} fenced at {} ms, its link up and its keeper running",
                fence.node, fence.at
            ),
        });
    }
    // An ADD may run its delegate and then undo it, each within the
    // timeout; the other commands run their delegates once.
    let bound = |command: &str| {
        let calls = if command == "ADD" { 2 } else { 1 };
        calls * TIMEOUT * 1_000 + OVERDUE_SLACK
    };
    for op in checker::overdue(&history, &bound) {
        let faults: Vec<String> = history
            .events
            .iter()
            .filter(|e| e.at + 1_000 >= op.start && e.at <= op.end)
            .map(|e| format!("{} {}", e.kind, e.target))
            .collect();
        found.push(Violation {
            kind: "overdue",
            what: format!(
                "overdue: {} of {} on {} took {} ms (bound {} ms), during: {}",
                op.command,
                op.container,
                op.node,
                op.end - op.start,
                bound(&op.command),
                faults.join(", ")
            ),
        });
    }
    for event in history
        .events
        .iter()
        .filter(|e| e.kind == "re-pin" && e.detail != "refused")
    {
        violations.push(format!("an installer renamed {}", event.target));
    }
    // The store's attachments: exactly the live ones, as their ADDs gave.
    let live: BTreeMap<String, Vec<String>> = runtimes.iter().flat_map(Runtime::live).collect();
    let stored = store_rules::attachments(after_gc, &rules);
    let mut ahead = 0;
    for (container, difference) in checker::differences(&live, &stored) {
        let kind = if difference.starts_with("leaked") {
            "leaked"
        } else {
            "lost"
        };
        // Made, by its node's clock, after the final GC began: GC keeps
        // what may be newer than its list, until that clock is passed.
        let made = store_rules::made(after_gc, &rules, &container);
        if kind == "leaked" && made.is_some_and(|since| since >= gc_began) {
            ahead += 1;
            continue;
        }
        let mut what = difference;
        for line in checker::around(&history, &[&container]) {
            what.push_str(&format!("\n    {line}"));
        }
        found.push(Violation { kind, what });
    }
    let sticky = after_gc
        .keys()
        .filter(|k| k.starts_with(&format!("{}holds/", rules.network)))
        .count();

    let kinds = figures::faults(&history);
    let missing = figures::missing(&kinds);
    if !missing.is_empty() {
        violations.push(format!(
            "the run lacked a kind of fault: {}",
            missing.join(", ")
        ));
    }
    let faults: usize = kinds.values().sum();
    let operations = history.operations.len();
    let (during, between) = figures::throughput(&history, faulty_until);
    let listed: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let count = |kind: &str| found.iter().filter(|v| v.kind == kind).count();
    for violation in &found {
        match violation.what.starts_with(violation.kind) {
            true => eprintln!("{}", violation.what),
            false => eprintln!("{}: {}", violation.kind, violation.what),
        }
    }
    for violation in &violations {
        eprintln!("{violation}");
    }
    println!(
        "chaos seed={seed} {operations} operations ({during:.1}/s succeeded during lasting faults, {between:.1}/s between them), {faults} faults ({}), {} store revisions read; doubled {}, leaked {}, lost {}, through fences {}, early fences {}, live nodes reclaimed {}, left by DELs {}, unrecorded answers {}, holds outliving stickyFor {}, cooldowns broken {}, given back uncooled {}, overdue {}; {cooled} address(es) cooled down, {reclaimed} overlap(s) on nodes reclaim fenced (its price), {ahead} attachment(s) kept by GC for a clock that was ahead, {} live attachment(s), {sticky} hold(s)",
        listed.join(", "),
        changes.last().map_or(0, |c| c.revision),
        count("doubled"),
        count("leaked"),
        count("lost"),
        count("through-fence"),
        count("early-fence"),
        count("live-reclaimed"),
        count("left-by-del"),
        count("unrecorded"),
        count("sticky"),
        count("cooldown"),
        count("uncooled"),
        count("overdue"),
        live.len()
    );
    violations.is_empty() && found.is_empty()
}

/// When etcd was full (ms, from, to): from each NOSPACE fault to its end,
/// and `slack` more, for a DEL that met the alarm and landed after it.
fn full_windows(history: &history::History, slack: u64) -> Vec<(u64, u64)> {
    let mut windows = Vec::new();
    let mut from = None;
    for event in &history.events {
        match event.kind.as_str() {
            "nospace" => from = from.or(Some(event.at)),
            "space-back" => {
                if let Some(start) = from.take() {
                    windows.push((start, event.at + slack));
                }
            }
            _ => {}
        }
    }
    if let Some(start) = from {
        windows.push((start, u64::MAX));
    }
    windows
}
