//! Section 7 of the pools bench: what a cooldown (`ipam.pool.reuseAfter`)
//! costs, on each store, side by side with none: ADD→DEL cycles of new
//! containers, the variants taking turns round by round, each DEL
//! cooling its address down; the ADD's and the DEL's p50 and, on etcd,
//! their requests, counted by a proxy in front of a 1-member cluster.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::etcd::{Cluster, Counting};
use crate::{add, del, median, median_f64, ms};

/// ADD→DEL cycles per variant and round.
const CYCLES: usize = 40;
/// Rounds; each figure is the median of them.
const ROUNDS: usize = 5;

/// ipam-da-pool alone on `store`, network `network`, allocating from a
/// /16, with `reuse_after` if any.
fn config(store: &Value, network: &str, reuse_after: Option<&str>) -> String {
    let mut pool = store.clone();
    pool["node"] = json!("bench");
    pool["default"] = json!("p");
    pool["pools"] = json!({"p": [{"subnet": "10.71.0.0/16"}]});
    if let Some(reuse_after) = reuse_after {
        pool["reuseAfter"] = json!(reuse_after);
    }
    json!({"cniVersion": "1.1.0", "name": network, "ipam": {"type": "ipam-da-pool", "pool": pool}})
        .to_string()
}

/// One variant's figures of one round: ADD and DEL p50, and requests per
/// ADD and per DEL (medians).
struct Round {
    add: Duration,
    del: Duration,
    add_requests: f64,
    del_requests: f64,
}

/// `CYCLES` ADD→DEL cycles of `config`'s containers `tag-N`, counted
/// through `proxy` if there is one.
fn cycles(
    allocator: &Path,
    bin: &Path,
    config: &str,
    tag: &str,
    proxy: Option<&Counting>,
) -> Round {
    let requests = || proxy.map_or(0, Counting::requests) as f64;
    let (mut adds, mut dels) = (Vec::new(), Vec::new());
    let (mut add_requests, mut del_requests) = (Vec::new(), Vec::new());
    for i in 0..CYCLES {
        let id = format!("{tag}-{i}");
        let before = requests();
        adds.push(add(allocator, bin, config, &id));
        add_requests.push(requests() - before);
        let (before, started) = (requests(), Instant::now());
        del(allocator, bin, config, &id);
        dels.push(started.elapsed());
        del_requests.push(requests() - before);
    }
    Round {
        add: median(&mut adds),
        del: median(&mut dels),
        add_requests: median_f64(add_requests),
        del_requests: median_f64(del_requests),
    }
}

/// The section, for `allocator` in `bin`, its files under `work`.
pub fn section(allocator: &Path, bin: &Path, work: &Path) {
    let cluster = Cluster::start(1, None);
    let proxy = Counting::to(&cluster.endpoints()[0]);
    let etcd = json!({"etcd": {"endpoints": [proxy.endpoint()], "prefix": "/bench-cooldown"},
        "dataDir": work.join("notes-cooldown")});
    let local = json!({"dataDir": work.join("cooldown-local")});
    println!("ADD->DEL cycles with a cooldown (reuseAfter 1h) and without, side by side, {CYCLES} per round, medians of {ROUNDS} rounds:");
    for (store, label, proxy) in [(&local, "local", None), (&etcd, "etcd", Some(&proxy))] {
        let off = config(store, "cool-off", None);
        let on = config(store, "cool-on", Some("1h"));
        // The node's first ADD on each has nothing to guess from.
        for config in [&off, &on] {
            add(allocator, bin, config, "first");
        }
        let (mut offs, mut ons) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            offs.push(cycles(allocator, bin, &off, &format!("off{round}"), proxy));
            ons.push(cycles(allocator, bin, &on, &format!("on{round}"), proxy));
        }
        let ratio = |f: fn(&Round) -> Duration| {
            median_f64(
                offs.iter()
                    .zip(&ons)
                    .map(|(off, on)| f(on).as_secs_f64() / f(off).as_secs_f64())
                    .collect(),
            )
        };
        let p50 = |rounds: &[Round], f: fn(&Round) -> Duration| {
            median(&mut rounds.iter().map(f).collect::<Vec<_>>())
        };
        let requests =
            |rounds: &[Round], f: fn(&Round) -> f64| median_f64(rounds.iter().map(f).collect());
        println!(
            "  {label}: ADD p50 {:.2} ms with, {:.2} ms without, {:.3}x (goal: within noise); DEL p50 {:.2} ms with, {:.2} ms without, {:.3}x",
            ms(p50(&ons, |r| r.add)),
            ms(p50(&offs, |r| r.add)),
            ratio(|r| r.add),
            ms(p50(&ons, |r| r.del)),
            ms(p50(&offs, |r| r.del)),
            ratio(|r| r.del),
        );
        if proxy.is_some() {
            println!(
                "  etcd: requests per ADD {:.1} with, {:.1} without (goal: the same); per DEL {:.1} with, {:.1} without",
                requests(&ons, |r| r.add_requests),
                requests(&offs, |r| r.add_requests),
                requests(&ons, |r| r.del_requests),
                requests(&offs, |r| r.del_requests),
            );
        }
    }
}
