//! The pool plugins measured side by side in one run, each called as a
//! runtime calls it (one process per call, the configuration on stdin):
//!
//! 1. sequential ADDs of new containers: host-local alone, against
//!    ipam-delegated running [ipam-ds-static, ipam-da-pool] on the local
//!    store and on a 3-member etcd cluster on loopback, with the binaries
//!    cargo built for the bench (dynamically linked) and with static ones
//!    as the README installs them (the variants interleaved round by
//!    round, so that machine noise falls on all of them alike); medians of
//!    the rounds, and p50/p99 of every call;
//! 2. one ADD in an empty /16 against one 90 % full, laid out three ways
//!    (filled in order, the hint just after; the free tenth in one block
//!    with the hint at the start of the full part; every tenth address
//!    free), for ipam-da-pool on each store and for host-local;
//! 3. operating a 90 %-full /16 on each store: how long `show` and `check`
//!    take, and the ADD's p50 while `check` runs over and over against
//!    its p50 alone;
//! 4. ADD in a /48 IPv6 pool against a /120, side by side;
//! 5. on etcd, what a node costs the cluster: the bytes etcd sends
//!    (`etcd_network_client_grpc_sent_bytes_total`) for a GC on a node
//!    holding 2 attachments while another holds 10,000, in the previous
//!    layout and this one; for ADDs on an exhausted /20, the first and
//!    those retried after it; and the ADD's p50 with 1,000 and 100,000
//!    addresses held in the pool;
//! 6. on etcd, the requests per ADD and per DEL, counted by a proxy, in
//!    order and with 32 workers on one /24, and the ADD's p50 against its
//!    limit: a process start and one claim transaction by a bare client.
//!
//! 7. what a cooldown (`reuseAfter`) costs an ADD and a DEL, on each
//!    store, side by side with none, and on etcd their requests.
//!
//! Run with `cargo bench --bench pools` (`-- cooldown` for section 7
//! alone); needs Debian's
//! containernetworking-plugins and etcd-server (./.ci/test installs them).

#[path = "support/cni_call.rs"]
mod cni_call;
// The tests' harness, of which the bench uses the etcd clusters.
#[allow(dead_code)]
#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/cooldown.rs"]
mod cooldown;
#[path = "support/round_trips.rs"]
mod round_trips;
#[path = "support/static_build.rs"]
mod static_build;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cni_call::call;
use common::etcd::Cluster;
use common::{temp_dir, PLUGIN};
use serde_json::{json, Value};

/// ADDs per measurement.
const CALLS: usize = 100;
/// Measurements per variant; the median is reported.
const ROUNDS: usize = 5;
/// ADDs timed per layout of a /16.
const FILL_CALLS: usize = 15;
/// Runs of `show` and `check`, and ADDs timed alone and during `check`.
const OPS_RUNS: usize = 5;
const OPS_ADDS: usize = 40;
/// ADDs timed in each IPv6 pool.
const V6_ADDS: usize = 100;
/// The /16 every measurement allocates from: 10.60.0.0/16.
const BASE: u32 = 0x0a3c_0000;
/// The addresses of that /16 a pool may give: .0.2 to .255.254.
const GIVEN: u32 = 65_533;

const HOST_LOCAL: &str = "/usr/lib/cni/host-local";

/// How one variant is called: a program, its CNI_PATH, and the
/// configuration for a round (each round starts from an empty store).
struct Variant {
    label: &'static str,
    program: PathBuf,
    cni_path: PathBuf,
    config: Box<dyn Fn(usize) -> String>,
    /// What its ratio to host-local alone should be, if anything.
    target: Option<&'static str>,
}

fn main() {
    assert!(
        Path::new(HOST_LOCAL).exists(),
        "the bench needs Debian's containernetworking-plugins"
    );
    let work = temp_dir("bench-pools");
    if std::env::args().any(|arg| arg == "cooldown") {
        let built = Path::new(PLUGIN).parent().unwrap();
        cooldown::section(&built.join("ipam-da-pool"), built, work.path());
        return;
    }
    // The binaries cargo built for the bench (dynamically linked), and
    // static ones, as the README installs them.
    let built = Path::new(PLUGIN).parent().unwrap().to_owned();
    let static_built = static_build::build_static();
    let (bin, static_bin) = (work.path().join("bin"), work.path().join("bin-static"));
    for (dir, from) in [(&bin, &built), (&static_bin, &static_built)] {
        std::fs::create_dir(dir).unwrap();
        for name in ["ipam-delegated", "ipam-ds-static", "ipam-da-pool"] {
            std::fs::copy(from.join(name), dir.join(name)).unwrap();
        }
        std::os::unix::fs::symlink(HOST_LOCAL, dir.join("host-local")).unwrap();
    }
    let cluster = Cluster::start(3, None);
    let data = work.path().to_owned();
    let endpoints = cluster.endpoints();

    let local =
        move |round: usize| json!({"dataDir": data.join(format!("pool-{round}")), "node": "bench"});
    let data = work.path().to_owned();
    let notes = work.path().join("notes");
    let on_etcd = move |round: usize| json!({"etcd": {"endpoints": endpoints, "prefix": format!("/bench-{round}")}, "node": "bench", "dataDir": notes});
    let variant =
        |label, dir: &Path, program: &str, config: Box<dyn Fn(usize) -> String>| Variant {
            label,
            program: dir.join(program),
            cni_path: dir.to_owned(),
            config,
            target: None,
        };
    let variants = [
        variant(
            "host-local alone",
            &bin,
            "host-local",
            Box::new(move |round| host_local(&data.join(format!("hl-{round}")))),
        ),
        variant(
            "ipam-delegated [ipam-ds-static, ipam-da-pool], local",
            &bin,
            "ipam-delegated",
            Box::new({
                let local = local.clone();
                move |round| stack(local(round))
            }),
        ),
        // The stack as installed: the whole of it should cost less than
        // host-local alone.
        Variant {
            target: Some("< 1.00"),
            ..variant(
                "  the same, static binaries",
                &static_bin,
                "ipam-delegated",
                Box::new({
                    let local = local.clone();
                    move |round| stack(local(round + 300))
                }),
            )
        },
        variant(
            "ipam-da-pool alone, local",
            &bin,
            "ipam-da-pool",
            Box::new(move |round| alone(local(round + 400))),
        ),
        variant(
            "ipam-delegated [ipam-ds-static, ipam-da-pool], etcd",
            &bin,
            "ipam-delegated",
            Box::new({
                let on_etcd = on_etcd.clone();
                move |round| stack(on_etcd(round + 100))
            }),
        ),
        variant(
            "  the same, static binaries",
            &static_bin,
            "ipam-delegated",
            Box::new({
                let on_etcd = on_etcd.clone();
                move |round| stack(on_etcd(round + 500))
            }),
        ),
        variant(
            "ipam-da-pool alone, etcd",
            &bin,
            "ipam-da-pool",
            Box::new(move |round| alone(on_etcd(round + 200))),
        ),
    ];

    let mut totals: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    let mut calls: Vec<Vec<Duration>> = vec![Vec::new(); variants.len()];
    for round in 0..ROUNDS {
        for (i, variant) in variants.iter().enumerate() {
            let config = (variant.config)(round);
            let started = Instant::now();
            for call in 0..CALLS {
                let took = add(
                    &variant.program,
                    &variant.cni_path,
                    &config,
                    &format!("r{round}-{call}"),
                );
                calls[i].push(took);
            }
            totals[i].push(started.elapsed());
        }
    }
    println!("{CALLS} sequential ADDs of new containers per measurement, median of {ROUNDS} rounds; p50/p99 of all {} calls; the ratio to host-local taken within each round, median of the rounds:", CALLS * ROUNDS);
    for (i, variant) in variants.iter().enumerate() {
        let ratio = median_f64(
            (0..ROUNDS)
                .map(|r| totals[i][r].as_secs_f64() / totals[0][r].as_secs_f64())
                .collect(),
        );
        let target = variant
            .target
            .map_or(String::new(), |t| format!("  (target {t})"));
        calls[i].sort();
        println!(
            "  {:<52} {:>6.2} ms/ADD  p50 {:>6.2} ms  p99 {:>6.2} ms  ratio to host-local {:>5.2}{target}",
            variant.label,
            median(&mut totals[i].clone()).as_secs_f64() * 1000.0 / CALLS as f64,
            ms(percentile(&calls[i], 50)),
            ms(percentile(&calls[i], 99)),
            ratio
        );
    }
    println!("  (each plugin's own start-up against the no-op: cargo bench --bench overhead)");

    println!("One ADD in 10.60.0.0/16, median of {FILL_CALLS}:");
    let (allocator, host_local_program) = (bin.join("ipam-da-pool"), bin.join("host-local"));
    for layout in [
        Layout::Empty,
        Layout::InOrder,
        Layout::OneBlock,
        Layout::EveryTenth,
    ] {
        let dir = work.path().join(format!("full-{layout:?}"));
        let prefix = format!("/full-{layout:?}");
        let local = alone(json!({"dataDir": dir.join("pool"), "node": "bench"}));
        let etcd = alone(
            json!({"etcd": {"endpoints": cluster.endpoints(), "prefix": prefix}, "node": "bench",
                   "dataDir": cluster.notes()}),
        );
        let host = host_local(&dir.join("hl"));
        fill_local(&dir.join("pool/bench/"), layout);
        fill_etcd(&cluster, &format!("{prefix}/networks/bench/"), layout);
        fill_host_local(&dir.join("hl/bench"), layout);
        let mut line = format!("  {:<44}", layout.describe());
        for (label, program, config) in [
            ("ipam-da-pool local", &allocator, &local),
            ("ipam-da-pool etcd", &allocator, &etcd),
            ("host-local", &host_local_program, &host),
        ] {
            let mut times: Vec<Duration> = (0..FILL_CALLS)
                .map(|call| {
                    let id = format!("probe-{call}");
                    let took = add(program, &bin, config, &id);
                    del(program, &bin, config, &id);
                    took
                })
                .collect();
            line.push_str(&format!("  {label} {:>7.2} ms", ms(median(&mut times))));
        }
        println!("{line}");
    }

    println!("Operating 10.60.0.0/16, 90 % full (every tenth address free), median of {OPS_RUNS} runs; ADD p50 of {OPS_ADDS}:");
    let layout = Layout::EveryTenth;
    let local_dir = work.path().join("ops");
    fill_local(&local_dir.join("pool/bench/"), layout);
    fill_etcd_attachments(&cluster, "/ops/networks/bench/", layout);
    fill_etcd(&cluster, "/ops/networks/bench/", layout);
    for (label, settings) in [
        (
            "local",
            json!({"dataDir": local_dir.join("pool"), "node": "bench"}),
        ),
        (
            "etcd",
            json!({"etcd": {"endpoints": cluster.endpoints(), "prefix": "/ops"}, "node": "bench",
                   "dataDir": cluster.notes()}),
        ),
    ] {
        let config = alone(settings);
        let file = work.path().join(format!("ops-{label}.conflist"));
        std::fs::write(&file, &config).unwrap();
        let mut line = format!("  {label:<6}");
        for verb in ["show", "check"] {
            let mut times: Vec<Duration> = (0..OPS_RUNS)
                .map(|_| operate(&allocator, verb, &file))
                .collect();
            let target = if verb == "show" && label == "etcd" {
                " (target <= 2000)"
            } else {
                ""
            };
            line.push_str(&format!(
                "  {verb} {:>7.0} ms{target}",
                ms(median(&mut times))
            ));
        }
        let mut alone_times: Vec<Duration> = (0..OPS_ADDS)
            .map(|call| add(&allocator, &bin, &config, &format!("ops-{label}-a{call}")))
            .collect();
        // `check` over and over, from a thread, while the ADDs go on.
        let stop = Arc::new(AtomicBool::new(false));
        let checker = {
            let (stop, allocator, file) = (stop.clone(), allocator.clone(), file.clone());
            std::thread::spawn(move || {
                let mut runs = 0;
                while !stop.load(Ordering::SeqCst) {
                    operate(&allocator, "check", &file);
                    runs += 1;
                }
                runs
            })
        };
        let mut during: Vec<Duration> = (0..OPS_ADDS)
            .map(|call| add(&allocator, &bin, &config, &format!("ops-{label}-d{call}")))
            .collect();
        stop.store(true, Ordering::SeqCst);
        let runs = checker.join().unwrap();
        let (alone_p50, during_p50) = (median(&mut alone_times), median(&mut during));
        line.push_str(&format!(
            "  ADD p50 {:.2} ms alone, {:.2} ms during check ({runs} runs): {:.2}x (target <= 1.5)",
            ms(alone_p50),
            ms(during_p50),
            during_p50.as_secs_f64() / alone_p50.as_secs_f64()
        ));
        println!("{line}");
    }

    println!("ADD in an IPv6 pool, p50 of {V6_ADDS} each, side by side:");
    let v6 = |subnet: &str, round: &str| {
        let mut pool = json!({"dataDir": work.path().join(format!("v6-{round}")), "node": "bench"});
        pool["pools"] = json!({"six": [{"subnet": subnet}]});
        pool["default"] = json!("six");
        json!({"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "ipam-da-pool", "pool": pool}})
            .to_string()
    };
    let (wide, narrow) = (v6("fd00:60::/48", "wide"), v6("fd00:61::/120", "narrow"));
    let (mut wide_times, mut narrow_times) = (Vec::new(), Vec::new());
    for call in 0..V6_ADDS {
        wide_times.push(add(&allocator, &bin, &wide, &format!("w{call}")));
        narrow_times.push(add(&allocator, &bin, &narrow, &format!("n{call}")));
    }
    let (wide_p50, narrow_p50) = (median(&mut wide_times), median(&mut narrow_times));
    println!(
        "  /48 {:.2} ms, /120 {:.2} ms: {:.2}x (target: as fast)",
        ms(wide_p50),
        ms(narrow_p50),
        wide_p50.as_secs_f64() / narrow_p50.as_secs_f64()
    );

    cluster_costs(&allocator, &bin);
    round_trips::section(
        &allocator,
        &bin,
        &static_bin.join("ipam-da-pool"),
        work.path(),
    );
    cooldown::section(&allocator, &bin, work.path());
}

/// Bytes etcd sends, as its metric counts them.
const SENT: &str = "etcd_network_client_grpc_sent_bytes_total";

/// Section 5: what one node's GC and ADDs cost a 1-member cluster (all
/// its traffic on one member's counter), however many others it holds.
fn cluster_costs(allocator: &Path, bin: &Path) {
    let cluster = Cluster::start(1, None);
    let prefix = "/bench-cost";
    let settings = |network: &str, node: &str, subnet: &str| {
        let pool = json!({"etcd": {"endpoints": cluster.endpoints(), "prefix": prefix},
            "dataDir": cluster.notes(), "node": node, "default": "p", "gcGraceSeconds": 0,
            "pools": {"p": [{"subnet": subnet}]}});
        json!({"cniVersion": "1.1.0", "name": network, "ipam": {"type": "ipam-da-pool", "pool": pool}})
            .to_string()
    };
    let sent = |run: &mut dyn FnMut()| {
        let before = cluster.metric(SENT);
        run();
        cluster.metric(SENT) - before
    };
    let kib = |bytes: f64| bytes / 1024.0;
    println!("On etcd, what a node costs the cluster (bytes etcd sends, median of {OPS_RUNS}):");
    // GC on node "small" (2 attachments) beside node "big" (10,000).
    let mut line = String::from("  GC on a node holding 2 while another holds 10,000:");
    for (network, legacy) in [("gc-previous", true), ("gc-nodes", false)] {
        let base = format!("{prefix}/networks/{network}/");
        let mut pairs = Vec::new();
        for n in 0..10_002u32 {
            let node = if n < 2 { "small" } else { "big" };
            let id = format!("c{n}");
            let at = Ipv4Addr::from(0x0a3e_0000 + 2 + n);
            let record = json!({"containerID": id, "ifname": "eth0", "node": node,
                "addresses": [{"pool": "p", "address": at.to_string()}], "since": 0});
            let key = match legacy {
                true => format!("{base}attachments/{id}:eth0"),
                false => format!("{base}nodes/{node}/attachments/{id}:eth0"),
            };
            pairs.push((key, record.to_string()));
        }
        cluster.put_all(&pairs);
        let mut config: Value =
            serde_json::from_str(&settings(network, "small", "10.62.0.0/16")).unwrap();
        config["cni.dev/valid-attachments"] = json!([{"containerID": "c0", "ifname": "eth0"}, {"containerID": "c1", "ifname": "eth0"}]);
        let config = config.to_string();
        let runs: Vec<f64> = (0..OPS_RUNS)
            .map(|_| {
                sent(&mut || {
                    let out = call(allocator, bin, &config, "", "GC");
                    assert!(out.status.success(), "GC: {out:?}");
                })
            })
            .collect();
        let label = if legacy {
            "previous layout"
        } else {
            "this layout"
        };
        line.push_str(&format!(" {label} {:.1} KiB", kib(median_f64(runs))));
    }
    println!("{line}");
    // ADDs on a /20 every address of which is held.
    let network = "exhausted";
    let base = format!("{prefix}/networks/{network}/");
    let owner =
        json!({"containerID": "fill", "ifname": "eth0", "node": "big", "pool": "p", "since": 0});
    let pairs: Vec<(String, String)> = (2..4095u32)
        .map(|n| {
            let [a, b, c, d] = Ipv4Addr::from(0x0a3f_0000 + n).octets();
            (
                format!("{base}addresses/{a:03}.{b:03}.{c:03}.{d:03}"),
                owner.to_string(),
            )
        })
        .collect();
    cluster.put_all(&pairs);
    let config = settings(network, "small", "10.63.0.0/20");
    let exhausted_add = |id: &str| {
        let out = call(allocator, bin, &config, id, "ADD");
        assert!(!out.status.success(), "the /20 is full");
    };
    let first = sent(&mut || exhausted_add("first"));
    let retried: Vec<f64> = (0..OPS_RUNS)
        .map(|i| sent(&mut || exhausted_add(&format!("retry{i}"))))
        .collect();
    let retried = median_f64(retried);
    println!(
        "  ADD on an exhausted /20: the first {:.1} KiB, each retried within 5 s {:.1} KiB ({:.0}x less)",
        kib(first),
        kib(retried),
        first / retried.max(1.0)
    );
    // ADD p50 with 1,000 and then 100,000 addresses held in a /14, the
    // node's hint just after them, as its own ADDs would have left it.
    let network = "held";
    let base = format!("{prefix}/networks/{network}/");
    let config = settings(network, "small", "10.64.0.0/14");
    let mut filled = 0u32;
    let mut p50s = Vec::new();
    for held in [1_000u32, 100_000] {
        let pairs: Vec<(String, String)> = (filled..held)
            .flat_map(|n| {
                let at = Ipv4Addr::from(0x0a40_0000 + 2 + n);
                let [a, b, c, d] = at.octets();
                let id = format!("fill{n}");
                let owner = json!({"containerID": id, "ifname": "eth0", "node": "big", "pool": "p", "since": 0});
                let mut attachment = owner.clone();
                attachment["addresses"] = json!([{"pool": "p", "address": at.to_string()}]);
                [
                    (format!("{base}addresses/{a:03}.{b:03}.{c:03}.{d:03}"), owner.to_string()),
                    (format!("{base}nodes/big/attachments/{id}:eth0"), attachment.to_string()),
                ]
            })
            .collect();
        cluster.put_all(&pairs);
        filled = held;
        let next = Ipv4Addr::from(0x0a40_0000 + 2 + held);
        cluster.put(&format!("{base}nodes/small/hints/p"), &next.to_string());
        let mut times: Vec<Duration> = (0..OPS_ADDS)
            .map(|i| add(allocator, bin, &config, &format!("h{held}-{i}")))
            .collect();
        p50s.push(median(&mut times));
    }
    println!(
        "  ADD p50 with 1,000 held {:.2} ms, with 100,000 held {:.2} ms: {:.2}x (target <= 1.2)",
        ms(p50s[0]),
        ms(p50s[1]),
        p50s[1].as_secs_f64() / p50s[0].as_secs_f64()
    );
}

/// One run of the allocator's operator command `verb` on `file`: how long
/// it took.
fn operate(allocator: &Path, verb: &str, file: &Path) -> Duration {
    let started = Instant::now();
    let out = Command::new(allocator)
        .args([verb, "--config"])
        .arg(file)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .expect("the allocator runs");
    let took = started.elapsed();
    assert!(out.success(), "{verb} {}", file.display());
    took
}

/// A configuration whose stack is the selector, then the allocator with
/// `pool` as its settings; one pool, 10.60.0.0/16.
fn stack(pool: Value) -> String {
    json!({
        "cniVersion": "1.0.0",
        "name": "bench",
        "ipam": {
            "type": "ipam-delegated",
            "delegates": ["ipam-ds-static", "ipam-da-pool"],
            "static": {"default": [{"name": "big"}]},
            "pool": with_pool(pool),
        },
    })
    .to_string()
}

/// A configuration for the allocator alone, its default the one pool.
fn alone(pool: Value) -> String {
    let mut pool = with_pool(pool);
    pool["default"] = json!("big");
    json!({"cniVersion": "1.0.0", "name": "bench", "ipam": {"type": "ipam-da-pool", "pool": pool}})
        .to_string()
}

fn with_pool(mut pool: Value) -> Value {
    pool["pools"] = json!({"big": [{"subnet": "10.60.0.0/16"}]});
    pool
}

fn host_local(data: &Path) -> String {
    json!({"cniVersion": "1.0.0", "name": "bench", "ipam": {
        "type": "host-local", "ranges": [[{"subnet": "10.60.0.0/16"}]], "dataDir": data,
    }})
    .to_string()
}

/// How a /16 is filled before an ADD is timed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    Empty,
    /// 90 % given in order; the next look starts just after.
    InOrder,
    /// The same, but the next look starts at the first address given.
    OneBlock,
    /// Every address held but one in ten; the next look starts anywhere.
    EveryTenth,
}

impl Layout {
    fn describe(self) -> &'static str {
        match self {
            Layout::Empty => "empty",
            Layout::InOrder => "90 % full, given in order, hint after",
            Layout::OneBlock => "90 % full, hint at the start of the full part",
            Layout::EveryTenth => "90 % full, every tenth address free",
        }
    }

    /// The host parts (2 to 65,534) held, and where the next look starts.
    fn held(self) -> (Vec<u32>, u32) {
        let ninety = GIVEN * 9 / 10;
        match self {
            Layout::Empty => (Vec::new(), 2),
            Layout::InOrder => ((2..2 + ninety).collect(), 2 + ninety),
            Layout::OneBlock => ((2..2 + ninety).collect(), 2),
            Layout::EveryTenth => ((2..=65_534).filter(|n| n % 10 != 0).collect(), 30_001),
        }
    }
}

fn address(n: u32) -> Ipv4Addr {
    Ipv4Addr::from(BASE + n)
}

/// The local store's records, as ipam-da-pool writes them
/// (src/da_pool/store/local_store/mod.rs).
fn fill_local(network: &Path, layout: Layout) {
    let (held, next) = layout.held();
    for dir in ["addresses", "attachments", "hints"] {
        std::fs::create_dir_all(network.join(dir)).unwrap();
    }
    for n in held {
        let id = format!("fill-{n}");
        // Records are links whose target is the record, as the store makes them.
        let owner = json!({"containerID": id, "ifname": "eth0", "node": "bench", "pool": "big", "since": 0});
        std::os::unix::fs::symlink(
            owner.to_string(),
            network.join(format!("addresses/{}", address(n))),
        )
        .unwrap();
        let mut record = owner;
        record["addresses"] = json!([{"pool": "big", "address": address(n).to_string()}]);
        std::os::unix::fs::symlink(
            record.to_string(),
            network.join(format!("attachments/{id}:eth0")),
        )
        .unwrap();
    }
    // The hint in the store's fixed-width form.
    let [a, b, c, d] = address(next).octets();
    std::fs::write(
        network.join("hints/big"),
        format!("{a:03}.{b:03}.{c:03}.{d:03}"),
    )
    .unwrap();
}

/// The etcd store's address keys (src/da_pool/store/etcd_store/mod.rs),
/// which are all a search reads, and its hint.
fn fill_etcd(cluster: &Cluster, network: &str, layout: Layout) {
    let (held, next) = layout.held();
    let mut pairs: Vec<(String, String)> = held
        .iter()
        .map(|n| {
            let [a, b, c, d] = address(*n).octets();
            let owner = json!({"containerID": format!("fill-{n}"), "ifname": "eth0", "node": "bench", "since": 0});
            (format!("{network}addresses/{a:03}.{b:03}.{c:03}.{d:03}"), owner.to_string())
        })
        .collect();
    pairs.push((format!("{network}hints/big"), address(next).to_string()));
    cluster.put_all(&pairs);
}

/// The etcd store's attachment keys of the addresses `layout` holds, as
/// the store writes them: what `show` and `check` read with the addresses.
fn fill_etcd_attachments(cluster: &Cluster, network: &str, layout: Layout) {
    let (held, _) = layout.held();
    let pairs: Vec<(String, String)> = held
        .iter()
        .map(|n| {
            let id = format!("fill-{n}");
            let record = json!({"containerID": id, "ifname": "eth0", "node": "bench",
                "addresses": [{"pool": "big", "address": address(*n).to_string()}], "since": 0});
            (
                format!("{network}nodes/bench/attachments/{id}:eth0"),
                record.to_string(),
            )
        })
        .collect();
    cluster.put_all(&pairs);
}

/// host-local's files: one per address, holding "ID\r\nIFNAME", and the
/// last address it gave.
fn fill_host_local(network: &Path, layout: Layout) {
    let (held, next) = layout.held();
    std::fs::create_dir_all(network).unwrap();
    for n in held {
        std::fs::write(
            network.join(address(n).to_string()),
            format!("fill-{n}\r\neth0"),
        )
        .unwrap();
    }
    std::fs::write(
        network.join("last_reserved_ip.0"),
        address(next - 1).to_string(),
    )
    .unwrap();
}

/// One ADD of container `id`: how long it took.
fn add(program: &Path, bin: &Path, config: &str, id: &str) -> Duration {
    let started = Instant::now();
    let out = call(program, bin, config, id, "ADD");
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{}: {}",
        program.display(),
        String::from_utf8_lossy(&out.stdout)
    );
    took
}

fn del(program: &Path, bin: &Path, config: &str, id: &str) {
    let out = call(program, bin, config, id, "DEL");
    assert!(
        out.status.success(),
        "{}: {}",
        program.display(),
        String::from_utf8_lossy(&out.stdout)
    );
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn median_f64(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The `p`th percentile of sorted `times`.
fn percentile(times: &[Duration], p: usize) -> Duration {
    times[(times.len() * p / 100).min(times.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
