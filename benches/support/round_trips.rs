//! Section 6 of the pools bench: what an ADD and a DEL on etcd cost the
//! cluster in requests, counted by a proxy in front of a member of a
//! 3-member cluster on loopback, and how near the ADD comes to its limit
//! (the no-op delegate's start, static against musl, and one claim
//! transaction by a bare client), side by side, for the allocator as
//! installed (static against musl) and as cargo builds it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use serde_json::json;

use crate::common::etcd::{bare_claim, Cluster, Counting};
use crate::{add, del, median, median_f64, ms};

/// Sequential calls counted, and no-ops and bare claims timed.
const CALLS: usize = 40;
/// Workers contending on one /24, and the ADD→DEL cycles of each.
const WORKERS: usize = 32;
const CYCLES: usize = 12;

/// ipam-da-pool alone on `endpoint`, as node `node`, its notes under
/// `notes`, allocating from `subnet`.
fn alone(endpoint: &str, node: &str, notes: &Path, subnet: &str) -> String {
    let pool = json!({
        "etcd": {"endpoints": [endpoint], "prefix": "/bench-trips"},
        "dataDir": notes, "node": node, "default": "p",
        "pools": {"p": [{"subnet": subnet}]},
    });
    json!({"cniVersion": "1.1.0", "name": "trips", "ipam": {"type": "ipam-da-pool", "pool": pool}})
        .to_string()
}

/// The requests `work` makes through `proxy`, and what it returns.
fn counted<T>(proxy: &Counting, work: impl FnOnce() -> T) -> (f64, T) {
    let before = proxy.requests();
    let done = work();
    ((proxy.requests() - before) as f64, done)
}

/// The section, for `allocator` (cargo's build) in `bin`, and the
/// allocator as installed, `installed`.
pub fn section(allocator: &Path, bin: &Path, installed: &Path, work: &Path) {
    let cluster = Cluster::start(3, None);
    let member = cluster.endpoints()[0].clone();
    println!("On etcd, requests per call, counted by a proxy in front of one member of 3:");
    let proxy = Counting::to(&member);
    let config = alone(
        &proxy.endpoint(),
        "seq",
        &work.join("notes-seq"),
        "10.66.0.0/16",
    );
    // The node's first ADD has nothing to guess from.
    add(allocator, bin, &config, "first");
    let (mut adds, mut dels, mut times) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..CALLS {
        let (requests, took) = counted(&proxy, || add(allocator, bin, &config, &format!("s{i}")));
        adds.push(requests);
        times.push(took);
    }
    for i in 0..CALLS {
        dels.push(counted(&proxy, || del(allocator, bin, &config, &format!("s{i}"))).0);
    }
    let add_p50 = median(&mut times);
    println!(
        "  {CALLS} sequential calls: requests per ADD, median {:.1} (goal <= 1.2); per DEL, median {:.1} (goal <= 1.2); ADD p50 {:.2} ms through the proxy",
        median_f64(adds),
        median_f64(dels),
        ms(add_p50)
    );
    // The ADD against its limit, in turn within each of CALLS rounds, and
    // straight to the member, as the bare claim is (the proxy only
    // counts): the no-op's start, a bare client's claim, and an ADD of a
    // node of its own, by the allocator as installed and as cargo built it.
    // Built against musl, as the installed allocator is: the cheapest
    // start there is.
    let noop = crate::static_build::build_noop(work, "musl-gcc");
    let direct = alone(
        &member,
        "direct",
        &work.join("notes-direct"),
        "10.68.0.0/16",
    );
    let built = alone(&member, "built", &work.join("notes-built"), "10.69.0.0/16");
    add(installed, bin, &direct, "first");
    add(allocator, bin, &built, "first");
    let (mut starts, mut claims) = (Vec::new(), Vec::new());
    let (mut direct_adds, mut built_adds) = (Vec::new(), Vec::new());
    for i in 0..CALLS {
        let started = Instant::now();
        let status = Command::new(&noop)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .expect("the no-op runs");
        assert!(status.success());
        starts.push(started.elapsed());
        let started = Instant::now();
        assert!(bare_claim(&member, &format!("/bench-trips-bare/{i}")));
        claims.push(started.elapsed());
        direct_adds.push(add(installed, bin, &direct, &format!("d{i}")));
        built_adds.push(add(allocator, bin, &built, &format!("b{i}")));
    }
    let (start, claim) = (median(&mut starts), median(&mut claims));
    let limit = (start + claim).as_secs_f64();
    let (direct_p50, built_p50) = (median(&mut direct_adds), median(&mut built_adds));
    println!(
        "  the limit: the no-op's start {:.2} ms + a bare client's claim transaction {:.2} ms = {:.2} ms; \
         ADD p50 straight to the member {:.2} ms as installed (static), / limit {:.2} (goal <= 1.3); \
         {:.2} ms as cargo builds it (dynamic), / limit {:.2}",
        ms(start),
        ms(claim),
        ms(start + claim),
        ms(direct_p50),
        direct_p50.as_secs_f64() / limit,
        ms(built_p50),
        built_p50.as_secs_f64() / limit,
    );
    contended(allocator, bin, work, &member);
}

/// `WORKERS` nodes at once on one /24, each through a proxy of its own so
/// that each ADD's requests are counted alone, each running `CYCLES`
/// ADD→DEL cycles.
fn contended(allocator: &Path, bin: &Path, work: &Path, member: &str) {
    let start = Arc::new(Barrier::new(WORKERS + 1));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let proxy = Counting::to(member);
            let config = alone(
                &proxy.endpoint(),
                &format!("w{w}"),
                &work.join(format!("notes-w{w}")),
                "10.67.0.0/24",
            );
            let (allocator, bin, start) = (allocator.to_owned(), bin.to_owned(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut requests = Vec::new();
                for c in 0..CYCLES {
                    let id = format!("w{w}-{c}");
                    requests.push(counted(&proxy, || add(&allocator, &bin, &config, &id)).0);
                    del(&allocator, &bin, &config, &id);
                }
                requests
            })
        })
        .collect();
    start.wait();
    let started = Instant::now();
    let mut requests: Vec<f64> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("a worker"))
        .collect();
    let took = started.elapsed();
    requests.sort_by(f64::total_cmp);
    let p99 = requests[(requests.len() * 99 / 100).min(requests.len() - 1)];
    let operations = (WORKERS * CYCLES * 2) as f64;
    println!(
        "  {WORKERS} workers on one /24, {CYCLES} ADD->DEL cycles each: requests per ADD, median {:.1}, p99 {p99:.0}; {:.0} operations/s",
        median_f64(requests.clone()),
        operations / took.as_secs_f64()
    );
}
