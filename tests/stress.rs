//! Parallel ADD and DEL cycles through the plugin with Debian's host-local:
//! no address is ever held by two containers at once, and none stays
//! reserved. STRESS_CYCLES sets the number of cycles (64 by default;
//! fixtures/stress.sh runs 500). Prints its figures on stderr.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{real_plugins, run_plugin, Stack, TempDir};
use serde_json::json;

/// One container's address and the time it surely held it: from the end
/// of its ADD to the start of its DEL.
struct Held {
    address: String,
    from: Duration,
    until: Duration,
}

#[test]
fn parallel_add_del_cycles_never_double_allocate_or_leak() {
    let Some(plugins) = real_plugins() else {
        return;
    };
    let cycles: usize = std::env::var("STRESS_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64);
    // 16 at once in a /27 (29 addresses): addresses are handed out again
    // and again, so a double allocation would have every chance to show.
    let workers = cycles.min(16);
    let stack = Stack::new();
    stack.link("host-local", &plugins.join("host-local"));
    let data = TempDir::new("stress-data");
    let input = json!({
        "cniVersion": "1.0.0",
        "name": "stressnet",
        "ipam": {
            "type": "ipam-delegated",
            "delegates": ["host-local"],
            "ranges": [[{"subnet": "10.250.200.0/27"}]],
            "dataDir": data.path(),
            "timeout": 30,
        },
    })
    .to_string();

    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let held: Vec<Held> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= cycles {
                            return mine;
                        }
                        let env = stack
                            .env("ADD")
                            .set("CNI_CONTAINERID", &format!("stress-{i}"));
                        let out = run_plugin(&env, input.as_bytes());
                        assert!(out.status.success(), "ADD {i}: {out:?}");
                        let from = started.elapsed();
                        let address = out.json()["ips"][0]["address"].as_str().unwrap().to_owned();
                        // Held for 5 to 50 ms, varied by cycle: long enough
                        // for others' ADDs to land inside the window.
                        std::thread::sleep(Duration::from_millis(5 + (i as u64 * 37) % 46));
                        let until = started.elapsed();
                        run_plugin(&env.set("CNI_COMMAND", "DEL"), input.as_bytes())
                            .assert_silent_success();
                        mine.push(Held {
                            address,
                            from,
                            until,
                        });
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let took = started.elapsed();
    assert_eq!(held.len(), cycles);

    // No two holders of one address overlap.
    let mut by_address: BTreeMap<&str, Vec<&Held>> = BTreeMap::new();
    for h in &held {
        by_address.entry(&h.address).or_default().push(h);
    }
    for (address, mut holders) in by_address.clone() {
        holders.sort_by_key(|h| h.from);
        for pair in holders.windows(2) {
            assert!(
                pair[0].until <= pair[1].from,
                "{address} held twice at once"
            );
        }
    }
    let store =
        std::fs::read_dir(data.path().join("stressnet")).expect("host-local used the test's store");
    let left: BTreeSet<String> = store
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect();
    assert!(left.is_empty(), "left reserved: {left:?}");

    let most = by_address.values().map(Vec::len).max().unwrap_or(0);
    let _ = writeln!(
        std::io::stderr(),
        "stress: {cycles} ADD+DEL cycles on {workers} workers in {took:.2?} ({:.0} cycles/s); {} distinct addresses, one handed out up to {most} times; none held twice at once, none left reserved",
        cycles as f64 / took.as_secs_f64(),
        by_address.len()
    );
}
