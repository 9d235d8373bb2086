//! Cooldown (`ipam.pool.reuseAfter`) through the built allocator, on both
//! stores: an address given back is given to no one, on any node, until
//! its cooldown ends, across restarts; a pool with nothing else to give
//! says so (code 110), as an address asked for does (code 111); `show`
//! counts it apart, `check` finds nothing wrong with it, and
//! `release --now` ends it.

use std::time::{Duration, Instant};

use crate::common::etcd::Cluster;
use crate::common::temp_dir;
use crate::operating::{add, cni, config_file, del, on_etcd, operator, pods, wait_for, PREFIX};
use serde_json::{json, Value};

/// A pool of two addresses, .2 and .3, whose addresses cool down for
/// `reuse_after`.
fn cooling(reuse_after: &str) -> Value {
    json!({
        "reuseAfter": reuse_after,
        "pools": {"pods": [{"subnet": "10.70.0.0/28",
            "rangeStart": "10.70.0.2", "rangeEnd": "10.70.0.3"}]},
    })
}

/// The message of a CNI error of `code` for the ADD of `id`.
fn refused(config: &str, id: &str, args: &str, code: u64) -> String {
    let error = cni("ADD", config, id, args).assert_error(code);
    error["msg"].as_str().unwrap().to_owned()
}

/// `show --json`'s figures of pool "pods": (used, cooling, free).
fn figures(file: &std::path::Path) -> (u64, u64, u64) {
    let out = operator(&["show", "--config", file.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{out:?}");
    let pool = &out.json()["pools"][0];
    let n = |key: &str| pool[key].as_u64().unwrap();
    (n("used"), n("cooling"), n("free"))
}

/// What a cooling address refuses, on a network of two addresses, one
/// held, one cooling: asked for, 111; not, 110; both naming the cooldown
/// and how to end it.
fn assert_refused_while_cooling(config: &str, cooling: &str) {
    let said = refused(config, "p9", &format!("IgnoreUnknown=1;IP={cooling}"), 111);
    assert!(
        said.contains("it cools down after its release until")
            && said.contains("ipam.pool.reuseAfter")
            && said.contains("release --now"),
        "{said}"
    );
    let said = refused(config, "p9", "", 110);
    assert!(
        said.contains("1 of its addresses cool down after their release (\"ipam.pool.reuseAfter\"), the first until"),
        "{said}"
    );
}

/// The address the ADD of `id` is given once it is given one, polled
/// for up to `limit`.
fn given_once_cooled(config: &str, id: &str, limit: Duration) -> String {
    let mut given = String::new();
    wait_for("the cooldown's end", limit, || {
        let out = cni("ADD", config, id, "");
        if out.status.success() {
            given = crate::operating::address_of(&out.json());
        }
        out.status.success()
    });
    given
}

/// Seconds since the epoch, as the records count them.
fn epoch_seconds() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.unwrap().as_secs()
}

/// An operator's `release --now` of `address` on the network of `file`.
fn release_now(file: &std::path::Path, address: &str) {
    let file = file.to_str().unwrap();
    let out = operator(&["release", "--config", file, "--now", address]);
    assert!(out.status.success(), "{out:?}");
}

/// `show` and `check` on a network of two addresses, one held, one
/// cooling: counted apart, and no finding.
fn assert_reported_while_cooling(file: &std::path::Path) {
    assert_eq!(figures(file), (1, 1, 0));
    let check = operator(&["check", "--config", file.to_str().unwrap()]);
    assert!(
        check.status.success(),
        "a cooldown is no finding: {check:?}"
    );
}

#[test]
#[ignore = "needs etcd-server"]
fn on_etcd_a_freed_address_cools_down_for_every_node_then_is_given_again() {
    let cluster = Cluster::start(1, None);
    let dir = temp_dir("cooldown-etcd");
    let mut store = on_etcd(&cluster);
    store["dataDir"] = json!(dir.path());
    let on = |node: &str| pods(&store, node, cooling("3s"));
    let file = config_file(dir.path(), "pods.conf", &on("node-a"));
    let first = add(&on("node-a"), "p1", "");
    let second = add(&on("node-b"), "p2", "");
    del(&on("node-a"), "p1");
    let freed = Instant::now();
    // Node b, which never held it, gives it to no one either.
    assert_refused_while_cooling(&on("node-b"), &first);
    assert_reported_while_cooling(&file);
    // Given again once it has cooled down, and no sooner: by the lease,
    // 3 s and at most 2 s more.
    let given = given_once_cooled(&on("node-b"), "p3", Duration::from_secs(15));
    let cooled = freed.elapsed();
    assert!(cooled >= Duration::from_secs(3), "{cooled:?}");
    assert_eq!(given, first, "{second} is held");
    assert_eq!(figures(&file), (2, 0, 0));
}

#[test]
#[ignore = "needs etcd-server and etcd-client"]
fn on_etcd_a_del_while_cooldowns_are_set_leaves_the_note_that_the_pool_is_full() {
    let cluster = Cluster::start(1, None);
    // Whether a DEL after the note left it; `None` if the note's 5 s ran
    // out before the DEL (a stalled machine): tried again on a prefix of
    // its own.
    let left_by_del = |prefix: &str| -> Option<bool> {
        let mut store = on_etcd(&cluster);
        store["etcd"]["prefix"] = json!(prefix);
        let config = pods(&store, "node-a", cooling("1h"));
        add(&config, "p1", "");
        add(&config, "p2", "");
        refused(&config, "p3", "", 110);
        del(&config, "p1");
        // The DEL's revision: that of the cooldown's record, the address
        // written last.
        let addresses = format!("{prefix}/networks/pods/addresses/");
        let read = cluster.etcdctl(&["get", &addresses, "--prefix", "-w", "json"]);
        let read: Value = serde_json::from_str(&read).unwrap();
        let revisions = read["kvs"].as_array().unwrap().iter();
        let del = revisions
            .map(|kv| kv["mod_revision"].as_i64().unwrap())
            .max()
            .unwrap();
        let full = format!("{prefix}/networks/pods/full/pods");
        let noted_at = |revision: i64| {
            let at = revision.to_string();
            let read = cluster.etcdctl(&["get", &full, "--rev", &at, "--keys-only"]);
            !read.trim().is_empty()
        };
        noted_at(del - 1).then(|| noted_at(del))
    };
    // A cooldown frees nothing: the DEL leaves the note.
    let seen = (0..3).find_map(|n| left_by_del(&format!("{PREFIX}-{n}")));
    assert_eq!(seen, Some(true), "None: no DEL came within the note's 5 s");
}

#[test]
#[ignore = "needs etcd-server and etcd-client"]
fn on_etcd_cooldowns_share_a_lease_outlast_a_restart_and_end_on_release_now() {
    let mut cluster = Cluster::start(1, None);
    let dir = temp_dir("cooldown-release");
    let mut store = on_etcd(&cluster);
    store["dataDir"] = json!(dir.path());
    let config = pods(&store, "node-a", cooling("1h"));
    let file = config_file(dir.path(), "pods.conf", &config);
    let first = add(&config, "p1", "");
    let second = add(&config, "p2", "");
    // Two DELs, two processes: one lease, as noted under dataDir.
    del(&config, "p1");
    del(&config, "p2");
    let leases = cluster.etcdctl(&["lease", "list"]);
    assert!(leases.starts_with("found 1 leases"), "{leases}");
    // The member restarted: its leases, and the cooldowns, go on.
    cluster.kill(0);
    cluster.restart(&[0]);
    let said = refused(&config, "p3", "", 110);
    assert!(said.contains("2 of its addresses cool down"), "{said}");
    assert_eq!(figures(&file), (0, 2, 0));
    // An operator ends one: not without --now.
    let release = |extra: &[&str]| {
        let mut args = vec![
            "release",
            "--config",
            file.to_str().unwrap(),
            first.as_str(),
        ];
        args.extend(extra);
        operator(&args)
    };
    let out = release(&[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("`--now` not given"), "{}", out.stderr);
    let out = release(&["--now", "--dry-run"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(figures(&file), (0, 2, 0), "a dry run changes nothing");
    let out = release(&["--now"]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.starts_with(&format!(
            "released {first} from its cooldown, which was to last until "
        )),
        "{said}"
    );
    assert_eq!(add(&config, "p3", ""), first);
    // A release --now of an attachment gives its addresses back at once.
    let out = operator(&[
        "release",
        "--config",
        file.to_str().unwrap(),
        "--container",
        "p3",
        "--now",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(figures(&file), (0, 1, 1), "{second} cools down still");
    // The shared lease revoked (as a restore from a backup would lose
    // it): the next address given back cools down on a new one.
    // (Every lease: a note that the pool was full has one too.)
    let leases = cluster.etcdctl(&["lease", "list"]);
    let revoked: Vec<&str> = leases.lines().skip(1).map(str::trim).collect();
    for lease in &revoked {
        cluster.etcdctl(&["lease", "revoke", lease]);
    }
    assert_eq!(figures(&file), (0, 0, 2));
    add(&config, "p4", "");
    del(&config, "p4");
    assert_eq!(figures(&file), (0, 1, 1));
    let leases = cluster.etcdctl(&["lease", "list"]);
    assert!(leases.starts_with("found 1 leases"), "{leases}");
    assert!(revoked.iter().all(|l| !leases.contains(l)), "{leases}");
}

#[test]
fn on_the_local_store_a_freed_address_cools_down_across_processes_then_is_given_again() {
    let dir = temp_dir("cooldown-local");
    let store = json!({"dataDir": dir.path().join("data")});
    let config = pods(&store, "node-a", cooling("2s"));
    let file = config_file(dir.path(), "pods.conf", &config);
    let first = add(&config, "p1", "");
    add(&config, "p2", "");
    del(&config, "p1");
    let freed = Instant::now();
    // Each command its own process: what cools is on disk.
    assert_refused_while_cooling(&config, &first);
    assert_reported_while_cooling(&file);
    let given = given_once_cooled(&config, "p3", Duration::from_secs(10));
    assert!(
        freed.elapsed() >= Duration::from_secs(2),
        "{:?}",
        freed.elapsed()
    );
    assert_eq!(given, first);
    // Cooled again, and ended by an operator.
    del(&config, "p3");
    release_now(&file, &first);
    assert_eq!(add(&config, "p4", ""), first);
}

#[test]
#[ignore = "needs etcd-server and etcd-client"]
fn import_carries_a_local_stores_cooldowns_into_etcd_until_their_end() {
    let cluster = Cluster::start(1, None);
    let dir = temp_dir("cooldown-import");
    let data = dir.path().join("data");
    let local = pods(&json!({"dataDir": data}), "node-a", cooling("1h"));
    let local_file = config_file(dir.path(), "local.conf", &local);
    let on = |node: &str| pods(&on_etcd(&cluster), node, cooling("1h"));
    let file = config_file(dir.path(), "etcd.conf", &on("node-a"));
    let first = add(&local, "p1", "");
    add(&local, "p2", "");
    del(&local, "p1");
    let import = |extra: &[&str]| {
        let mut args = vec!["import", "--config", file.to_str().unwrap()];
        args.extend(["--from", data.to_str().unwrap()]);
        args.extend(extra);
        let out = operator(&args);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let said = import(&["--dry-run"]);
    assert!(
        said.contains(&format!("would carry the cooldown of pods/{first} until")),
        "{said}"
    );
    assert_eq!(figures(&file), (0, 0, 2), "a dry run writes nothing");
    let imported = epoch_seconds();
    let said = import(&[]);
    assert!(
        said.contains(&format!("carried the cooldown of pods/{first} until")),
        "{said}"
    );
    // Node b, on etcd only, never gives it, and sees the same end.
    assert_refused_while_cooling(&on("node-b"), &first);
    assert_eq!(figures(&file), (1, 1, 0));
    let ends = |file: &std::path::Path| {
        let args = [
            "show",
            "--config",
            file.to_str().unwrap(),
            "--addresses",
            "--json",
        ];
        let out = operator(&args);
        assert!(out.status.success(), "{out:?}");
        out.json()["pools"][0]["coolingAddresses"].clone()
    };
    assert_eq!(ends(&file), ends(&local_file));
    // Its lease outlives the cooldown, and by no more than an eighth of
    // its time left at the import, the timeout (5 s) and a second.
    let (key, record) = cluster
        .values(&format!("{PREFIX}/networks/pods/addresses/"))
        .into_iter()
        .find(|(_, value)| value.starts_with("{\"coolingUntil\""))
        .unwrap();
    let record: Value = serde_json::from_str(&record).unwrap();
    let until = record["coolingUntil"].as_u64().unwrap();
    let fields = cluster.etcdctl(&["get", &key, "-w", "fields"]);
    let lease: i64 = (fields.lines())
        .find_map(|line| line.strip_prefix("\"Lease\" : "))
        .unwrap()
        .parse()
        .unwrap();
    let lease = cluster.etcdctl(&["lease", "timetolive", &format!("{lease:x}")]);
    let seconds = |label: &str| -> u64 {
        let after = lease.split(&format!("{label}(")).nth(1).unwrap();
        after.split('s').next().unwrap().parse().unwrap()
    };
    assert!(epoch_seconds() + seconds("remaining") >= until, "{lease}");
    assert!(
        seconds("TTL") <= (until - imported + 6) * 9 / 8 + 1,
        "{lease}"
    );
    // Run again: left as it is.
    let said = import(&[]);
    assert!(
        said.contains(&format!("already there the cooldown of pods/{first} until")),
        "{said}"
    );
    release_now(&file, &first);
    assert_eq!(add(&on("node-b"), "p3", ""), first);
}
