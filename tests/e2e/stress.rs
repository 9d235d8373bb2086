//! Parallel ADD and DEL cycles through the plugin with Debian's host-local:
//! no address is ever held by two containers at once, and none stays
//! reserved; and ADDs stopped by SIGTERM at every moment leave no
//! reservation behind but those of ADDs that succeeded. STRESS_CYCLES sets
//! the number of cycles (64 by default; fixtures/stress.sh runs 500).
//! Prints its figures on stderr.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{real_plugins, run_plugin, start_plugin, temp_dir, Stack};
use serde_json::json;

/// One container's address and the time it surely held it: from the end
/// of its ADD to the start of its DEL.
struct Held {
    address: String,
    from: Duration,
    until: Duration,
}

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn parallel_add_del_cycles_never_double_allocate_or_leak() {
    let plugins = real_plugins();
    let cycles: usize = std::env::var("STRESS_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64);
    // 16 at once in a /27 (29 addresses): addresses are handed out again
    // and again, so a double allocation would have every chance to show.
    let workers = cycles.min(16);
    let stack = Stack::new();
    stack.link("host-local", &plugins.join("host-local"));
    let data = temp_dir("stress-data");
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

#[test]
#[ignore = "needs Debian's containernetworking-plugins"]
fn adds_stopped_by_sigterm_at_any_moment_leave_no_torn_reservation() {
    let plugins = real_plugins();
    let adds = 300;
    let stack = Stack::new();
    stack.link("host-local", &plugins.join("host-local"));
    let data = temp_dir("sigterm-data");
    let input = json!({
        "cniVersion": "1.0.0",
        "name": "sigtermnet",
        "ipam": {
            "type": "ipam-delegated",
            "delegates": ["host-local"],
            "ranges": [[{"subnet": "10.250.204.0/22"}]],
            "dataDir": data.path(),
        },
    })
    .to_string();
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    // Each ADD gets SIGTERM 0 to 15 ms after it starts, a spread that
    // covers host-local's whole run: before, while and after it writes.
    let succeeded: BTreeSet<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = BTreeSet::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= adds {
                            return mine;
                        }
                        let id = format!("stopped-{i}");
                        let env = stack.env("ADD").set("CNI_CONTAINERID", &id);
                        let child =
                            start_plugin(&env, input.as_bytes(), std::process::Stdio::null());
                        std::thread::sleep(Duration::from_micros((i as u64 * 7919) % 15_000));
                        let _ = std::process::Command::new("kill")
                            .args(["-TERM", &child.id().to_string()])
                            .status();
                        let out = child.wait_with_output().unwrap();
                        if out.status.success() {
                            mine.insert(id);
                        } else if out.status.signal().is_some() {
                            // Ended before it took the signals over: it
                            // had not started a delegate yet.
                            assert!(out.stdout.is_empty());
                        } else {
                            let error: serde_json::Value =
                                serde_json::from_slice(&out.stdout).unwrap();
                            assert_eq!(error["code"], 105, "{error}");
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    // Every reservation names a container whose ADD succeeded; none is
    // empty (made, then killed before host-local wrote the ID into it).
    let store = std::fs::read_dir(data.path().join("sigtermnet")).expect("host-local ran");
    let mut owners = BTreeSet::new();
    for entry in store {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.parse::<std::net::IpAddr>().is_err() {
            continue;
        }
        let owner = std::fs::read_to_string(entry.path()).unwrap();
        let id = owner.lines().next().unwrap_or_default().trim().to_owned();
        assert!(
            succeeded.contains(&id),
            "{name} is held by {id:?}, whose ADD did not succeed"
        );
        owners.insert(id);
    }
    assert_eq!(owners, succeeded);
    let _ = writeln!(
        std::io::stderr(),
        "sigterm: {adds} ADDs stopped by SIGTERM in {:.2?}: {} succeeded before the request, {} rolled back; no torn reservation",
        started.elapsed(),
        succeeded.len(),
        adds - succeeded.len()
    );
}
