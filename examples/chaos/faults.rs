//! The faults, from a seeded schedule, each logged with its time as it
//! starts (and, if it lasts, as it ends): two threads, one for faults
//! that last (a partition, a keeper frozen, an etcd member killed or
//! paused or trickling its answers, quorum lost, a full database, a second keeper, a clock skewed
//! forward or back), one at a time, every kind once in a seeded order
//! first and then at random, so that every run has each; and one for the
//! instant ones (a plugin killed mid-command, a compaction, a re-pin
//! through the installer); and the operator's reclaim, run every few
//! seconds with a short --dead-for, whose fencing the orchestrator
//! answers by freeing the fenced node's workloads.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::history::lock;
use crate::nodes::{run, Kill};
use crate::workload::free_on;
use crate::{Rng, World};

/// How long a node's registration outlives its keeper's last renewal
/// (ipam.pool.nodeTTL), in seconds.
pub const NODE_TTL: u64 = 6;

/// reclaim's --dead-for, in seconds.
pub const DEAD_FOR: u64 = 4;

/// Each kind of lasting fault: its event, and the event that ends it.
pub const LASTING: [(&str, &str); 10] = [
    ("partition", "healed"),
    ("keeper-stopped", "keeper-resumed"),
    ("member-killed", "member-restarted"),
    ("member-paused", "member-resumed"),
    ("trickle", "trickle-stopped"),
    ("quorum-lost", "quorum-back"),
    ("nospace", "space-back"),
    ("second-keeper", "second-keeper-stopped"),
    ("clock-ahead", "clock-right"),
    ("clock-behind", "clock-right"),
];

/// Every kind of fault a run must have at least once (a fence by reclaim
/// is counted as "reclaim").
pub const KINDS: [&str; 17] = [
    "partition",
    "keeper-stopped",
    "member-killed",
    "member-paused",
    "trickle",
    "quorum-lost",
    "nospace",
    "second-keeper",
    "clock-ahead",
    "clock-behind",
    "kill-add",
    "kill-del",
    "kill-check",
    "kill-gc",
    "compaction",
    "re-pin",
    "reclaim",
];

/// Sleeps `millis`, or less if the world stops meanwhile.
fn pause(world: &World, millis: u64) {
    let mut left = millis;
    while left > 0 && !world.stopping() {
        let step = left.min(100);
        std::thread::sleep(Duration::from_millis(step));
        left -= step;
    }
}

/// Faults that last, one at a time, until the world stops: every kind
/// once, in a seeded order, then at random.
pub fn lasting(world: &World, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut first: Vec<usize> = (0..LASTING.len()).collect();
    for i in (1..first.len()).rev() {
        first.swap(i, rng.below(i as u64 + 1) as usize);
    }
    while !world.stopping() {
        pause(world, 500 + rng.below(1_500));
        if world.stopping() {
            return;
        }
        let node = &world.nodes[rng.below(world.nodes.len() as u64) as usize];
        let (kind, ends, first_round) = match first.pop() {
            Some(kind) => (LASTING[kind].0, LASTING[kind].1, true),
            None => {
                let (kind, ends) = LASTING[rng.below(LASTING.len() as u64) as usize];
                (kind, ends, false)
            }
        };
        match kind {
            "partition" | "keeper-stopped" => {
                // Past the TTL; half of them long enough to be reclaimed,
                // and the first partition always.
                let seconds = if kind == "partition" && first_round {
                    NODE_TTL + DEAD_FOR + 4 + rng.below(6)
                } else {
                    NODE_TTL + 1 + rng.below(2 * DEAD_FOR + 6)
                };
                let millis = seconds * 1_000;
                world
                    .recorder
                    .event(kind, &node.name, &format!("{millis} ms"));
                if kind == "partition" {
                    node.set_cut(true);
                } else {
                    node.signal_keeper("STOP");
                }
                pause(world, millis);
                if kind == "partition" {
                    node.set_cut(false);
                } else {
                    node.signal_keeper("CONT");
                }
                world.recorder.event(ends, &node.name, "");
            }
            "member-killed" | "member-paused" => {
                let mut cluster = lock(&world.cluster);
                let member = rng.below(cluster.size() as u64) as usize;
                world.recorder.event(kind, &format!("m{member}"), "");
                if kind == "member-killed" {
                    cluster.kill(member);
                } else {
                    // Its kernel still takes connections; it answers nothing.
                    cluster.pause(member, true);
                }
                drop(cluster);
                pause(world, 1_000 + rng.below(3_000));
                let mut cluster = lock(&world.cluster);
                cluster.pause(member, false);
                cluster.restart(member);
                world.recorder.event(ends, &format!("m{member}"), "");
            }
            "trickle" => {
                // The first member's answers, as the nodes reach it.
                world.recorder.event(kind, "m0", "");
                world.relay.trickle(true);
                pause(world, 2_000 + rng.below(3_000));
                world.relay.trickle(false);
                world.recorder.event(ends, "m0", "");
            }
            "quorum-lost" => {
                let mut cluster = lock(&world.cluster);
                let spared = rng.below(cluster.size() as u64) as usize;
                let killed: Vec<usize> = (0..cluster.size()).filter(|m| *m != spared).collect();
                world.recorder.event(kind, &format!("{killed:?}"), "");
                for member in &killed {
                    cluster.kill(*member);
                }
                drop(cluster);
                pause(world, 2_000 + rng.below(2_000));
                let mut cluster = lock(&world.cluster);
                for member in &killed {
                    cluster.restart(*member);
                }
                world.recorder.event(ends, "", "");
            }
            "nospace" => {
                world.recorder.event(kind, "", "");
                fill(world);
                pause(world, 2_000 + rng.below(2_000));
                clear(world);
                world.recorder.event(ends, "", "");
            }
            "second-keeper" => {
                world.recorder.event(kind, &node.name, "");
                node.start_keeper(&world.bin);
                pause(world, 2_000 + rng.below(3_000));
                node.stop_other_keepers();
                world.recorder.event(ends, &node.name, "");
            }
            _ => {
                let minutes = 1 + rng.below(9);
                let sign = if kind == "clock-ahead" { "+" } else { "-" };
                let offset = format!("{sign}{minutes}m");
                world.recorder.event(kind, &node.name, &offset);
                *lock(&node.skew) = Some(offset);
                pause(world, 3_000 + rng.below(5_000));
                *lock(&node.skew) = None;
                world.recorder.event(ends, &node.name, "");
            }
        }
    }
}

/// Instant faults, until the world stops.
pub fn instant(world: &World, seed: u64) {
    let mut rng = Rng::new(seed);
    while !world.stopping() {
        pause(world, 100 + rng.below(400));
        let node = &world.nodes[rng.below(world.nodes.len() as u64) as usize];
        match rng.below(20) {
            0..=16 => {
                let kill = Kill {
                    after: Duration::from_millis(rng.below(40)),
                    tree: rng.below(2) == 0,
                };
                // Recorded by the runtime, with the command it lands on.
                *lock(&node.kill_next) = Some(kill);
            }
            17 | 18 => {
                // No further than the checker's watchers have read.
                let client = lock(&world.cluster).client();
                if let Some(revision) = world.watchers.compact(&client, false) {
                    world
                        .recorder
                        .event("compaction", "", &revision.to_string());
                }
            }
            _ => {
                // An installer told another name: it must refuse.
                let scratch = node.dir.join("repin");
                let out = run(
                    world.bin.join("ipam-delegated").to_str().unwrap(),
                    &[
                        "install",
                        "--into",
                        scratch.to_str().unwrap(),
                        "--node-name",
                        &format!("{}-renamed", node.name),
                        "--node-name-file",
                        node.node_name_file.to_str().unwrap(),
                    ],
                );
                let pinned = std::fs::read_to_string(&node.node_name_file).unwrap_or_default();
                let kept = !out.status.success() && pinned.trim() == node.name;
                world.recorder.event(
                    "re-pin",
                    &node.name,
                    if kept { "refused" } else { "RENAMED" },
                );
            }
        }
    }
}

/// The operator's reclaim, every few seconds, until the world stops: a
/// node it fences loses its workloads, which may then start elsewhere.
/// The fences are read from etcd after each run, not from reclaim's
/// report: a reclaim cut short (quorum lost, a full database) may have
/// fenced a node before it failed, and says nothing then.
pub fn operator(world: &World) {
    while !world.stopping() {
        pause(world, 2_000);
        // A fence found from now on may date from here.
        lock(&world.reclaim_since).get_or_insert(world.recorder.now());
        let _ = run(
            world.bin.join("ipam-da-pool").to_str().unwrap(),
            &[
                "reclaim",
                "--config",
                world.operator_config.to_str().unwrap(),
                "--dead-for",
                &format!("{DEAD_FOR}s"),
                "--json",
            ],
        );
        see_fences(world);
    }
}

/// Reads the fences on etcd and marks each node newly fenced, its
/// workloads freed, the fence dated from the first reclaim since the last
/// reading: whether etcd answered. Never while a node's readmit runs, so
/// that a fence read just before a readmit lifts it is not taken for a
/// new one.
pub fn see_fences(world: &World) -> bool {
    let _readmits = lock(&world.fencing);
    let Some(fences) = fences(world) else {
        return false;
    };
    let from = lock(&world.reclaim_since)
        .take()
        .unwrap_or_else(|| world.recorder.now());
    for fenced in world.nodes.iter().filter(|n| fences.contains(&n.name)) {
        if fenced.fenced.load(Ordering::SeqCst) {
            continue;
        }
        // Recorded before the node hears of it: from here on, its
        // containers' addresses may be another's.
        let freed = free_on(world, &fenced.name);
        world.recorder.event_at(
            from,
            "fenced",
            &fenced.name,
            &format!("workloads freed: {}", freed.join(", ")),
        );
        world.recorder.event("fence-seen", &fenced.name, "");
        fenced.fenced.store(true, Ordering::SeqCst);
    }
    true
}

/// The nodes with a fence on etcd, if etcd answers.
fn fences(world: &World) -> Option<Vec<String>> {
    let client = lock(&world.cluster).client();
    let out = client.etcdctl(&["get", "--prefix", "--keys-only", "/chaos/nodes/"]);
    if !out.status.success() {
        return None;
    }
    let keys = String::from_utf8_lossy(&out.stdout);
    Some(
        keys.lines()
            .filter_map(|key| key.strip_prefix("/chaos/nodes/")?.strip_suffix("/fenced"))
            .map(str::to_owned)
            .collect(),
    )
}

/// Fills etcd's database to its quota (a NOSPACE alarm), with junk.
fn fill(world: &World) {
    let value = vec![b'x'; 1 << 20];
    // Read apart: a guard in the loop's head would be held through it.
    let quota = lock(&world.cluster).quota;
    for n in 0..((2 * quota) >> 20) {
        if !lock(&world.cluster).put_large(&format!("/chaos-junk/{n}"), &value) {
            return;
        }
    }
}

/// Clears a full database: the junk deleted, compacted (no further than
/// the checker's watchers have read: its mark deleted, since etcd refuses
/// puts), defragmented, the alarm disarmed, the mark written back.
pub fn clear(world: &World) {
    let cluster = lock(&world.cluster).client();
    let _ = cluster.etcdctl(&["del", "--prefix", "/chaos-junk/"]);
    let _ = world.watchers.compact(&cluster, true);
    let _ = cluster.etcdctl(&["defrag"]);
    let _ = cluster.etcdctl(&["alarm", "disarm"]);
    let _ = cluster.etcdctl(&["put", crate::etcd_history::MARK, "mark"]);
}
