//! ipam-da-pool as operators run it, with real parts: addresses that
//! follow a workload from one container and node to the next on a
//! 3-member etcd cluster; node keepers and `reclaim` giving back exactly
//! what a dead node held; `show`, `check` and `release` on both stores,
//! each finding of `check` produced for real (an allocator killed between
//! its two records, a range shrunk in the configuration, a dead node); and
//! ADDs that go on while `show` and `check` read a 90 %-full /16.
//!
//! The etcd tests start clusters of their own from Debian's etcd-server;
//! the kill uses strace's fault injection. Ignored unless asked for with
//! --include-ignored (./.ci/test installs both and does).

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::etcd::Cluster;
use crate::common::{run_program, spawn_program, temp_dir, Env, Outcome, ALLOCATOR};
use serde_json::{json, Value};

/// The key prefix every test uses; each cluster is its own.
pub(crate) const PREFIX: &str = "/ipamd-ops";

/// The allocator's settings for the etcd store of `cluster`.
pub(crate) fn on_etcd(cluster: &Cluster) -> Value {
    json!({
        "etcd": {"endpoints": cluster.endpoints(), "prefix": PREFIX, "timeout": 5},
        "dataDir": cluster.notes(),
    })
}

/// The allocator's settings for a local store under `dir`.
fn on_files(dir: &Path) -> Value {
    json!({"dataDir": dir})
}

/// Network "pods" of ipam-da-pool alone on `store`, as node `node`: its
/// default pool "pods" 10.70.0.0/28 (.1 the gateway, .2 to .14 given),
/// `extra` added to its settings.
pub(crate) fn pods(store: &Value, node: &str, extra: Value) -> String {
    let mut pool = store.clone();
    pool["node"] = json!(node);
    pool["default"] = json!("pods");
    pool["pools"] = json!({"pods": [{"subnet": "10.70.0.0/28"}]});
    for (key, value) in extra.as_object().unwrap() {
        pool[key] = value.clone();
    }
    json!({"cniVersion": "1.1.0", "name": "pods", "ipam": {"type": "ipam-da-pool", "pool": pool}})
        .to_string()
}

/// Addresses follow pods, keyed as Kubernetes names them.
pub(crate) fn sticky(duration: &str) -> Value {
    json!({"sticky": ["K8S_POD_NAMESPACE", "K8S_POD_NAME"], "stickyFor": duration})
}

/// `CNI_ARGS` of pod `namespace/name`, and `IP=` if an address is asked for.
pub(crate) fn pod(workload: &str, ip: Option<&str>) -> String {
    let (namespace, name) = workload.split_once('/').unwrap();
    let mut args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}");
    if let Some(ip) = ip {
        args.push_str(&format!(";IP={ip}"));
    }
    args
}

/// Runs the allocator as a runtime would, for container `id`.
pub(crate) fn cni(command: &str, config: &str, id: &str, args: &str) -> Outcome {
    let mut env = Env(vec![
        ("CNI_COMMAND".into(), command.into()),
        ("CNI_CONTAINERID".into(), id.into()),
        ("CNI_NETNS".into(), "/var/run/netns/operating".into()),
        ("CNI_IFNAME".into(), "eth0".into()),
        ("CNI_PATH".into(), "/nonexistent".into()),
    ]);
    if !args.is_empty() {
        env = env.set("CNI_ARGS", args);
    }
    run_program(ALLOCATOR, Path::new("/"), &[], &env, config.as_bytes())
}

/// ADD for container `id`: the address given.
pub(crate) fn add(config: &str, id: &str, args: &str) -> String {
    let out = cni("ADD", config, id, args);
    assert!(out.status.success(), "ADD {id}: {out:?}");
    address_of(&out.json())
}

pub(crate) fn address_of(result: &Value) -> String {
    let address = result["ips"][0]["address"].as_str().unwrap();
    address.split('/').next().unwrap().to_owned()
}

pub(crate) fn del(config: &str, id: &str) {
    let out = cni("DEL", config, id, "");
    assert!(out.status.success(), "DEL {id}: {out:?}");
}

/// Runs an operator's command of the allocator.
pub(crate) fn operator(args: &[&str]) -> Outcome {
    run_program(ALLOCATOR, Path::new("/"), args, &Env(Vec::new()), b"")
}

/// Writes `config` into `dir` as the file operators point at.
pub(crate) fn config_file(dir: &Path, name: &str, config: &str) -> PathBuf {
    let file = dir.join(name);
    std::fs::write(&file, config).unwrap();
    file
}

/// Waits until `done` holds, or fails saying `what` after `limit`.
pub(crate) fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs etcd-server"]
fn a_workload_gets_its_address_back_on_any_node_and_no_other_workload_gets_it_while_held() {
    let cluster = Cluster::start(3, None);
    let store = on_etcd(&cluster);
    let on = |node: &str| pods(&store, node, sticky("4s"));
    let first = add(&on("node-a"), "c1", &pod("db/pg-0", None));
    del(&on("node-a"), "c1");
    // Held for db/pg-0: no other workload gets it, nor can ask for it.
    for i in 0..6 {
        let other = add(
            &on("node-b"),
            &format!("o{i}"),
            &pod(&format!("db/web-{i}"), None),
        );
        assert_ne!(other, first);
    }
    let refused = cni("ADD", &on("node-b"), "o9", &pod("db/web-9", Some(&first)));
    let error = refused.assert_error(111);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .contains("held by workload db/pg-0 (eth0) on node node-a"),
        "{error}"
    );
    // Recreated under another container ID, on another node: the same.
    let again = add(&on("node-c"), "c2", &pod("db/pg-0", None));
    assert_eq!(again, first);
    // Another container of it while c2 is not deleted: try again later.
    let out = cni("ADD", &on("node-b"), "c3", &pod("db/pg-0", None));
    out.assert_error(11);
    // Its time over once c2 is gone, the address is anyone's.
    del(&on("node-c"), "c2");
    std::thread::sleep(Duration::from_secs(5));
    let taken = add(&on("node-b"), "o10", &pod("db/web-10", Some(&first)));
    assert_eq!(taken, first);
}

/// A node keeper of the allocator, killed when dropped.
pub(crate) struct Keeper(pub(crate) Child);

impl Keeper {
    pub(crate) fn start(config: &Path) -> Keeper {
        Keeper(spawn_program(
            ALLOCATOR,
            Path::new("/"),
            &["node-keeper", "--config", config.to_str().unwrap()],
            &Env(Vec::new()),
            Stdio::piped(),
        ))
    }

    /// Asks it to stop (SIGTERM), as its service manager would: how it ended.
    pub(crate) fn stop(&mut self) -> std::process::ExitStatus {
        self.signal("TERM");
        self.0.wait().unwrap()
    }

    /// Stops it as `stop` does, checks that it ended well, and gives
    /// what it said.
    pub(crate) fn stop_saying(&mut self) -> String {
        assert!(self.stop().success());
        let mut said = String::new();
        std::io::Read::read_to_string(self.0.stderr.as_mut().unwrap(), &mut said).unwrap();
        said
    }

    pub(crate) fn signal(&self, signal: &str) {
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether node `node` is registered (its keeper's lease alive).
pub(crate) fn registered(cluster: &Cluster, node: &str) -> bool {
    let key = format!("{PREFIX}/nodes/{node}/alive");
    cluster.keys(&key).contains(&key)
}

/// The containers and workloads whose records the network keeps, as
/// `attachments/ID:IFNAME` (under whichever node) and `holds/NAME`.
pub(crate) fn holders(cluster: &Cluster) -> Vec<String> {
    let mut found: Vec<String> = cluster
        .keys(&format!("{PREFIX}/networks/pods/"))
        .iter()
        .filter_map(|key| {
            let rest = key.strip_prefix(&format!("{PREFIX}/networks/pods/"))?;
            let rest = match rest.strip_prefix("nodes/") {
                Some(under_node) => under_node.split_once('/')?.1,
                None => rest,
            };
            let (kind, name) = rest.split_once('/')?;
            matches!(kind, "attachments" | "holds").then(|| format!("{kind}/{name}"))
        })
        .collect();
    found.sort();
    found
}

#[test]
#[ignore = "needs etcd-server"]
fn reclaim_gives_back_exactly_what_a_dead_node_held_and_never_touches_a_live_one() {
    let cluster = Cluster::start(3, None);
    let dir = temp_dir("reclaim");
    let store = on_etcd(&cluster);
    let mut settings = sticky("1h");
    settings["nodeTTL"] = json!(2);
    let on = |node: &str| pods(&store, node, settings.clone());
    let files: Vec<PathBuf> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|node| config_file(dir.path(), &format!("{node}.conflist"), &on(node)))
        .collect();
    let mut keepers: Vec<Keeper> = files.iter().map(|f| Keeper::start(f)).collect();
    for node in ["node-a", "node-b", "node-c"] {
        wait_for(
            &format!("{node} registered"),
            Duration::from_secs(10),
            || registered(&cluster, node),
        );
    }
    // Each node holds something; node-b also a sticky hold (its pod gone).
    add(&on("node-a"), "a1", "");
    let b1 = cni("ADD", &on("node-b"), "b1", "");
    assert!(b1.status.success(), "{b1:?}");
    add(&on("node-b"), "b2", &pod("db/pg-0", None));
    del(&on("node-b"), "b2");
    add(&on("node-c"), "c1", &pod("db/pg-1", None));
    let before = holders(&cluster);
    assert_eq!(
        before,
        [
            "attachments/a1:eth0",
            "attachments/b1:eth0",
            "attachments/c1:eth0",
            "holds/db%2Fpg-0:eth0",
            "holds/db%2Fpg-1:eth0"
        ]
    );
    // node-b's keeper dies: its registration goes with its lease.
    keepers[1].0.kill().unwrap();
    keepers[1].0.wait().unwrap();
    wait_for("node-b's lease to end", Duration::from_secs(15), || {
        !registered(&cluster, "node-b")
    });
    let reclaim = |extra: &[&str]| {
        let mut args = vec!["reclaim", "--config", files[0].to_str().unwrap()];
        args.extend_from_slice(extra);
        operator(&args)
    };
    // Seen too recently: nothing yet, and that is no failure.
    let out = reclaim(&["--dead-for", "1h", "--json"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        out.json(),
        json!({"released": [], "nodes": [], "fenced": []})
    );
    let out = reclaim(&["--dead-for", "90m"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "no node of network pods has been gone for 90m: nothing to reclaim\n"
    );
    // check names it once it has been gone long enough, counted from when
    // that reclaim first saw it gone.
    std::thread::sleep(Duration::from_millis(1_100));
    let out = operator(&[
        "check",
        "--config",
        files[0].to_str().unwrap(),
        "--dead-for",
        "1s",
        "--json",
    ]);
    assert!(!out.status.success());
    let findings = out.json()["findings"].to_string();
    assert!(
        findings.contains("node node-b holds 1 attachment(s) and 1 sticky hold(s), but its keeper's registration is gone since"),
        "{findings}"
    );
    // A dry run says what would go, and changes nothing.
    let out = reclaim(&["--dead-for", "1s", "--dry-run"]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains("would release 10.70.0."), "{said}");
    assert!(said.contains("held by b1/eth0 on node node-b"), "{said}");
    assert!(
        said.contains("held by workload db/pg-0 (eth0) on node node-b"),
        "{said}"
    );
    assert_eq!(holders(&cluster), before);
    // A live node named is refused, and nothing changes.
    let out = reclaim(&["--node", "node-a"]);
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("node node-a is alive") && !out.stderr.contains("code 11"),
        "{}",
        out.stderr
    );
    assert_eq!(holders(&cluster), before);
    // Reclaimed: node-b's attachment and hold, and nothing else.
    let out = reclaim(&["--dead-for", "1s", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let report = out.json();
    assert_eq!(report["nodes"], json!(["node-b"]));
    let released: Vec<(String, String)> = report["released"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["containerID"].as_str().unwrap().to_owned(),
                r["workload"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        released,
        [
            ("b1".to_owned(), String::new()),
            (String::new(), "db/pg-0".to_owned())
        ]
    );
    assert_eq!(
        holders(&cluster),
        [
            "attachments/a1:eth0",
            "attachments/c1:eth0",
            "holds/db%2Fpg-1:eth0"
        ]
    );
    // node-b comes back: its keeper registers it again; the CHECK of the
    // attachment it lost fails; it cannot be reclaimed while alive.
    keepers[1] = Keeper::start(&files[1]);
    wait_for("node-b registered again", Duration::from_secs(10), || {
        registered(&cluster, "node-b")
    });
    let mut checked: Value = serde_json::from_str(&on("node-b")).unwrap();
    checked["prevResult"] = b1.json();
    let out = cni("CHECK", &checked.to_string(), "b1", "");
    out.assert_error(112);
    let out = reclaim(&["--node", "node-b"]);
    assert!(!out.status.success());
    // A keeper stopped cleanly withdraws its registration and exits 0.
    keepers[2].signal("TERM");
    let status = keepers[2].0.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!registered(&cluster, "node-c"));
}

/// Every sample of Prometheus's text exposition format in `text`, by
/// series, each checked: `# HELP` and `# TYPE gauge` before a metric's
/// samples, names and label values as the format has them, numbers.
fn exposition(text: &str) -> Vec<(String, f64)> {
    let mut typed: Vec<String> = Vec::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            assert!(rest.split_once(' ').is_some(), "{line}");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert_eq!(kind, "gauge", "{line}");
            typed.push(name.to_owned());
        } else {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (name, labels) = series.split_once('{').unwrap();
            assert!(
                typed.iter().any(|t| t == name),
                "{name} sampled before its TYPE"
            );
            assert!(
                name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{line}"
            );
            let labels = labels.strip_suffix('}').unwrap();
            for label in labels.split("\",") {
                let (key, value) = label.split_once("=\"").unwrap();
                assert!(key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
                assert!(!value.trim_end_matches('"').contains('\n'));
            }
            samples.push((series.to_owned(), value.parse::<f64>().unwrap()));
        }
    }
    samples
}

#[test]
#[ignore = "needs etcd-server"]
fn show_check_and_release_see_workloads_holds_on_both_stores() {
    let cluster = Cluster::start(1, None);
    let dir = temp_dir("operate");
    for store in [on_files(&dir.path().join("data")), on_etcd(&cluster)] {
        let config = pods(&store, "node-a", sticky("1h"));
        let file = config_file(dir.path(), "pods.conflist", &config);
        let file = file.to_str().unwrap();
        assert_eq!(add(&config, "w1", &pod("db/pg-0", None)), "10.70.0.2");
        del(&config, "w1");
        // The workload's next container gets the address its hold kept.
        assert_eq!(add(&config, "w1b", &pod("db/pg-0", None)), "10.70.0.2");
        del(&config, "w1b");
        assert_eq!(add(&config, "p1", ""), "10.70.0.3");
        assert_eq!(add(&config, "w2", &pod("db/pg-1", None)), "10.70.0.4");
        let show = |extra: &[&str]| {
            let mut args = vec!["show", "--config", file];
            args.extend_from_slice(extra);
            operator(&args)
        };
        let report = show(&["--addresses", "--json"]).json();
        let pool = &report["pools"][0];
        assert_eq!(
            (&pool["used"], &pool["sticky"]),
            (&json!(3), &json!(1)),
            "{report}"
        );
        let held = &pool["addresses"];
        assert_eq!(
            (&held[0]["containerID"], &held[0]["workload"]),
            (&json!(""), &json!("db/pg-0"))
        );
        assert!(held[0]["until"].as_str().unwrap().ends_with('Z'), "{held}");
        assert_eq!(
            (&held[2]["containerID"], &held[2]["workload"]),
            (&json!("w2"), &json!("db/pg-1"))
        );
        let gauges = String::from_utf8(show(&["--format", "prometheus"]).stdout).unwrap();
        let samples = exposition(&gauges);
        assert!(
            samples.contains(&(
                "ipam_da_pool_sticky{network=\"pods\",pool=\"pods\"}".into(),
                1.0
            )),
            "{gauges}"
        );
        assert!(samples.contains(&(
            "ipam_da_pool_free{network=\"pods\",pool=\"pods\"}".into(),
            10.0
        )));
        let check = || operator(&["check", "--config", file, "--json"]);
        let out = check();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(out.json()["findings"], json!([]));
        // A dry run names the hold and changes nothing; then it goes.
        let release = |extra: &[&str]| {
            let mut args = vec!["release", "--config", file];
            args.extend_from_slice(extra);
            operator(&args)
        };
        let out = release(&["--workload", "db/pg-0", "--dry-run"]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "would release 10.70.0.2 held by workload db/pg-0 (eth0) on node node-a\n"
        );
        assert_eq!(show(&["--json"]).json()["pools"][0]["sticky"], 1);
        let out = release(&["--workload", "db/pg-0"]);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(show(&["--json"]).json()["pools"][0]["used"], 2);
        // A workload whose container runs: its attachment and its hold.
        let out = release(&["--workload", "db/pg-1", "--json"]);
        let released = out.json()["released"].clone();
        assert_eq!(released.as_array().unwrap().len(), 2, "{released}");
        assert_eq!(released[0]["containerID"], "w2");
        let out = release(&["--workload", "db/nobody"]);
        assert!(!out.status.success());
        assert!(
            out.stderr.contains("matches workload db/nobody"),
            "{}",
            out.stderr
        );
        del(&config, "w2");
        // The range shrunk below p1's address: named.
        let mut shrunk: Value = serde_json::from_str(&config).unwrap();
        shrunk["ipam"]["pool"]["pools"]["pods"][0]["rangeEnd"] = json!("10.70.0.2");
        config_file(dir.path(), "pods.conflist", &shrunk.to_string());
        let out = check();
        assert!(!out.status.success());
        assert_eq!(
            out.json()["findings"],
            json!([
                "10.70.0.3 held by p1/eth0 (node node-a) is outside every range of pool \"pods\""
            ])
        );
        del(&config, "p1");
        assert_eq!(show(&["--json"]).json()["pools"][0]["used"], 0);
    }
}

#[test]
#[ignore = "needs strace"]
fn an_allocator_killed_between_its_two_records_is_named_by_check_and_repaired_by_release() {
    let dir = temp_dir("killed");
    let config = pods(&on_files(&dir.path().join("data")), "node-a", json!({}));
    let file = config_file(dir.path(), "pods.conflist", &config);
    let file = file.to_str().unwrap();
    add(&config, "c0", "");
    // SIGKILL as it makes its second record, the address's: its
    // attachment's record is there, the address's is not.
    let env = Env(vec![
        ("CNI_COMMAND".into(), "ADD".into()),
        ("CNI_CONTAINERID".into(), "c1".into()),
        ("CNI_NETNS".into(), "/var/run/netns/operating".into()),
        ("CNI_IFNAME".into(), "eth0".into()),
        ("CNI_PATH".into(), "/nonexistent".into()),
    ]);
    let killed = run_program(
        "/usr/bin/strace",
        Path::new("/"),
        &[
            "-qq",
            "-o",
            "/dev/null",
            "-e",
            "trace=symlinkat",
            "-e",
            "inject=symlinkat:signal=KILL:when=2",
            ALLOCATOR,
        ],
        &env,
        config.as_bytes(),
    );
    assert!(!killed.status.success(), "{killed:?}");
    assert!(killed.stdout.is_empty());
    let out = operator(&["check", "--config", file]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "c1/eth0 (node node-a) lists 10.70.0.3, which has no record: it could be given to another\n\
         network pods (this node: node-a): 2 attachment(s), 0 hold(s), 1 address record(s), 1 finding(s)\n"
    );
    let out = operator(&["release", "--config", file, "--container", "c1"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "released 10.70.0.3 held by c1/eth0 on node node-a\n"
    );
    let out = operator(&["check", "--config", file]);
    assert!(out.status.success(), "{out:?}");
}

/// The /16 of the 90 %-full tests: 10.71.0.0/16, .0.2 to .255.254 given.
fn big(store: &Value, node: &str) -> String {
    let mut pool = store.clone();
    pool["node"] = json!(node);
    pool["default"] = json!("big");
    pool["pools"] = json!({"big": [{"subnet": "10.71.0.0/16"}]});
    json!({"cniVersion": "1.1.0", "name": "big", "ipam": {"type": "ipam-da-pool", "pool": pool}})
        .to_string()
}

/// Host part `n` of the /16.
fn big_address(n: u32) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::from(0x0a47_0000 + n)
}

/// 90 % of the /16 held, every tenth address free, by attachments
/// `fill-N` of nodes node-a to node-c: each with its attachment's record
/// and its address's, as the store writes them.
fn fill_records() -> Vec<(String, String, String)> {
    (2..=65_534u32)
        .filter(|n| n % 10 != 0)
        .map(|n| {
            let id = format!("fill-{n}");
            let node = ["node-a", "node-b", "node-c"][n as usize % 3];
            let owner = json!({"containerID": id, "ifname": "eth0", "node": node, "pool": "big", "since": 0});
            let mut attachment = owner.clone();
            attachment["addresses"] =
                json!([{"pool": "big", "address": big_address(n).to_string()}]);
            (id, attachment.to_string(), owner.to_string())
        })
        .collect()
}

/// ADDs of nodes a to c while `show` and `check` run one after the other
/// over the /16 of `config_of`'s network: each ADD completes while the
/// reader runs (ten of them at most for each), and each reader completes
/// too, finding nothing wrong.
fn adds_go_on_while_show_and_check_run(config_of: impl Fn(&str) -> String, file: &Path) {
    let mut during = 0;
    let mut id = 0;
    for verb in ["check", "show"] {
        let mut reader = spawn_program(
            ALLOCATOR,
            Path::new("/"),
            &[verb, "--config", file.to_str().unwrap()],
            &Env(Vec::new()),
            Stdio::null(),
        );
        // Read by a thread: a full pipe must not stop the reader.
        let mut stdout = reader.stdout.take().unwrap();
        let drain = std::thread::spawn(move || {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut stdout, &mut out).unwrap();
            out
        });
        for _ in 0..10 {
            if reader.try_wait().unwrap().is_some() {
                break;
            }
            let node = ["node-a", "node-b", "node-c"][id % 3];
            let started = Instant::now();
            let given = add(&config_of(node), &format!("new-{id}"), "");
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "an ADD waited for the {verb}"
            );
            // Only every tenth address was free.
            let host = u32::from(given.parse::<std::net::Ipv4Addr>().unwrap()) - 0x0a47_0000;
            assert_eq!(host % 10, 0, "{given}");
            if reader.try_wait().unwrap().is_none() {
                during += 1;
            }
            id += 1;
        }
        let status = reader.wait().unwrap();
        let out = drain.join().unwrap();
        assert!(
            status.success(),
            "{verb}: {status:?} {}",
            String::from_utf8_lossy(&out)
        );
    }
    assert!(
        during >= 4,
        "only {during} ADDs completed while a reader ran"
    );
    // Every record read, however many pages it takes.
    let out = operator(&["show", "--config", file.to_str().unwrap(), "--json"]);
    assert_eq!(out.json()["pools"][0]["used"], 58_980 + id);
}

#[test]
#[ignore = "needs etcd-server"]
fn adds_on_every_node_go_on_while_show_and_check_read_a_90_percent_full_slash_16() {
    // Local files: no reader takes the network's lock.
    let dir = temp_dir("full");
    let data = dir.path().join("data");
    let network = data.join("big");
    for sub in ["attachments", "addresses"] {
        std::fs::create_dir_all(network.join(sub)).unwrap();
    }
    let records = fill_records();
    for (id, attachment, address) in &records {
        let host = id.trim_start_matches("fill-").parse().unwrap();
        std::os::unix::fs::symlink(attachment, network.join(format!("attachments/{id}:eth0")))
            .unwrap();
        std::os::unix::fs::symlink(
            address,
            network.join(format!("addresses/{}", big_address(host))),
        )
        .unwrap();
    }
    let local = on_files(&data);
    let file = config_file(dir.path(), "big.conflist", &big(&local, "node-a"));
    // One node holds a local store; its ADDs go on.
    adds_go_on_while_show_and_check_run(|_| big(&local, "node-a"), &file);

    // etcd, three nodes: each page a reader reads is one short request.
    let cluster = Cluster::start(3, None);
    let network = format!("{PREFIX}/networks/big/");
    let mut pairs = Vec::new();
    for (id, attachment, address) in &records {
        let host: u32 = id.trim_start_matches("fill-").parse().unwrap();
        let [a, b, c, d] = big_address(host).octets();
        let node: Value = serde_json::from_str(attachment).unwrap();
        let node = node["node"].as_str().unwrap();
        pairs.push((
            format!("{network}nodes/{node}/attachments/{id}:eth0"),
            attachment.clone(),
        ));
        pairs.push((
            format!("{network}addresses/{a:03}.{b:03}.{c:03}.{d:03}"),
            address.clone(),
        ));
    }
    cluster.put_all(&pairs);
    let store = on_etcd(&cluster);
    let file = config_file(dir.path(), "big-etcd.conflist", &big(&store, "node-a"));
    adds_go_on_while_show_and_check_run(|node| big(&store, node), &file);
}
