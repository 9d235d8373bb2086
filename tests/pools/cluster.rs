//! A cluster's ordinary life on etcd clusters the tests start: a host
//! renamed keeps its node's name; a node whose clock is slow is not
//! reclaimed early; a node reclaimed is fenced until an operator readmits
//! it; what changes while reclaim or a release runs is left alone; a
//! misspelt key in a pool defined in etcd is refused; a node's hint is
//! written seldom and follows the search; a cluster with authentication enabled and
//! short-lived tokens.
//!
//! Ignored unless asked for with --include-ignored: they need Debian's
//! etcd-server and etcd-client, libfaketime (package faketime) and root
//! for a UTS namespace (./.ci/test installs them and runs as root).

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::etcd::Cluster;
use crate::common::{libfaketime, run_program, spawn_program, temp_dir, Env, Outcome, ALLOCATOR};
use crate::operating::{
    add, cni, config_file, del, holders, on_etcd, operator, pod, pods, registered, sticky,
    wait_for, Keeper, PREFIX,
};

/// `config` without `ipam.pool.node`, its name pinned in `file`.
fn unnamed(config: &str, file: &Path) -> String {
    let mut config: Value = serde_json::from_str(config).unwrap();
    let pool = config["ipam"]["pool"].as_object_mut().unwrap();
    pool.remove("node");
    pool.insert("nodeNameFile".into(), json!(file));
    config.to_string()
}

/// Runs the allocator as a runtime on a host named `host` (its own UTS
/// namespace), for container `id`.
fn cni_on_host(host: &str, command: &str, config: &str, id: &str) -> Outcome {
    let env = Env(vec![
        ("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into()),
        ("CNI_COMMAND".into(), command.into()),
        ("CNI_CONTAINERID".into(), id.into()),
        ("CNI_NETNS".into(), "/var/run/netns/cluster".into()),
        ("CNI_IFNAME".into(), "eth0".into()),
        ("CNI_PATH".into(), "/nonexistent".into()),
    ]);
    on_host(host, &[ALLOCATOR], &env, config.as_bytes())
}

/// Runs `command` in a UTS namespace of its own whose host name is `host`.
fn on_host(host: &str, command: &[&str], env: &Env, stdin: &[u8]) -> Outcome {
    let mut args = vec![
        "--uts",
        "--",
        "sh",
        "-c",
        "hostname \"$0\" && exec \"$@\"",
        host,
    ];
    args.extend_from_slice(command);
    run_program("unshare", Path::new("/"), &args, env, stdin)
}

#[test]
#[ignore = "needs etcd-server and root (a UTS namespace)"]
fn a_renamed_host_keeps_its_pinned_node_name_and_its_gc_frees_what_it_made_before() {
    let cluster = Cluster::start(1, None);
    let dir = temp_dir("rename");
    let file = dir.path().join("state/node-name");
    let extra = json!({"gcGraceSeconds": 0, "nodeTTL": 2});
    let config = unnamed(&pods(&on_etcd(&cluster), "unused", extra), &file);
    let out = cni_on_host("host-before", "ADD", &config, "c1");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "host-before\n");
    // Renamed: its records, its GC and its keeper keep the pinned name.
    let out = cni_on_host("host-after", "ADD", &config, "c2");
    assert!(out.status.success(), "{out:?}");
    let nodes: Vec<String> = cluster
        .values(&format!("{PREFIX}/networks/pods/nodes/"))
        .iter()
        .filter(|(key, _)| key.contains("/attachments/"))
        .map(|(_, record)| {
            let record: Value = serde_json::from_str(record).unwrap();
            record["node"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(nodes, ["host-before", "host-before"]);
    let mut gc: Value = serde_json::from_str(&config).unwrap();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "c2", "ifname": "eth0"}]);
    let out = cni_on_host("host-after", "GC", &gc.to_string(), "");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(holders(&cluster), ["attachments/c2:eth0"], "c1 freed by GC");
    let conflist = config_file(dir.path(), "pods.conf", &config);
    let env = Env(vec![(
        "PATH".into(),
        "/usr/sbin:/usr/bin:/sbin:/bin".into(),
    )]);
    let keeper = std::thread::spawn(move || {
        let args = ["node-keeper", "--config", conflist.to_str().unwrap()];
        let mut command = vec!["timeout", "-s", "TERM", "3", ALLOCATOR];
        command.extend_from_slice(&args);
        on_host("host-after", &command, &env, b"")
    });
    wait_for(
        "the pinned name registered",
        Duration::from_secs(10),
        || registered(&cluster, "host-before"),
    );
    let out = keeper.join().unwrap();
    assert!(
        out.stderr.contains("node host-before registered"),
        "{out:?}"
    );
    assert!(!registered(&cluster, "host-after"));
    let out = operator(&[
        "show",
        "--config",
        dir.path().join("pods.conf").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.starts_with("network pods (this node: host-before)"),
        "{said}"
    );
}

/// A node keeper of `config`'s node, with `env`, logging to `log`.
fn start_keeper(config: &Path, env: &Env, log: &Path) -> std::process::Child {
    spawn_program(
        ALLOCATOR,
        Path::new("/"),
        &["node-keeper", "--config", config.to_str().unwrap()],
        env,
        Stdio::from(std::fs::File::create(log).unwrap()),
    )
}

/// Readmits node-b as an operator does, its keeper running (as readmit
/// needs), then stopped: `b_file` node-b's configuration, `config` an
/// operator's.
fn readmit_b(cluster: &Cluster, b_file: &Path, config: &str) {
    let mut keeper = Keeper::start(b_file);
    wait_for("node-b registered", Duration::from_secs(10), || {
        registered(cluster, "node-b")
    });
    assert!(
        operator(&["readmit", "--config", config, "--node", "node-b"])
            .status
            .success()
    );
    assert!(keeper.stop().success());
}

/// `reclaim --node NODE` of `config` under strace: see [`traced`].
fn reclaim_traced(config: &str, node: &str, log: &Path, inject: Option<&str>) -> Child {
    traced(
        &["reclaim", "--config", config, "--node", node],
        log,
        inject,
    )
}

/// The operator's command `command` under strace, its writes to etcd
/// logged in `log`, with `inject` (a fault of strace's) if one is given:
/// a child to wait for.
fn traced(command: &[&str], log: &Path, inject: Option<&str>) -> Child {
    let log = log.display().to_string();
    let mut args = vec!["-qq", "-s", "32", "-o", &log, "-e", "trace=sendto"];
    if let Some(inject) = inject {
        args.extend(["-e", inject]);
    }
    args.push(ALLOCATOR);
    args.extend(command);
    spawn_program(
        "/usr/bin/strace",
        Path::new("/"),
        &args,
        &Env(Vec::new()),
        Stdio::piped(),
    )
}

#[test]
#[ignore = "needs etcd-server and faketime"]
fn a_slow_clock_never_makes_a_node_dead_early_and_a_reclaimed_node_is_fenced_until_readmitted() {
    let cluster = Cluster::start(1, None);
    let dir = temp_dir("fence");
    let store = on_etcd(&cluster);
    let on = |node: &str| pods(&store, node, json!({"nodeTTL": 2}));
    let (a_file, b_file) = (
        config_file(dir.path(), "node-a.conf", &on("node-a")),
        config_file(dir.path(), "node-b.conf", &on("node-b")),
    );
    let b1 = add(&on("node-b"), "b1", "");
    add(&on("node-a"), "a1", "");
    // node-b's keeper runs half an hour behind; then it is killed.
    let log = dir.path().join("keeper-b.log");
    let env = Env(vec![
        ("LD_PRELOAD".into(), libfaketime().display().to_string()),
        ("FAKETIME".into(), "-30m".into()),
        ("DONT_FAKE_MONOTONIC".into(), "1".into()),
    ]);
    let mut keeper = start_keeper(&b_file, &env, &log);
    wait_for("node-b registered", Duration::from_secs(10), || {
        registered(&cluster, "node-b")
    });
    std::thread::sleep(Duration::from_secs(1));
    keeper.kill().unwrap();
    keeper.wait().unwrap();
    wait_for("node-b's lease to end", Duration::from_secs(15), || {
        !registered(&cluster, "node-b")
    });
    let reclaim = |dead_for: &str| {
        operator(&[
            "reclaim",
            "--config",
            a_file.to_str().unwrap(),
            "--dead-for",
            dead_for,
            "--json",
        ])
    };
    // Its clock says it was last here 30 minutes ago: that does not count.
    let out = reclaim("15m");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.json()["nodes"], json!([]), "{out:?}");
    let gone = format!("{PREFIX}/nodes/node-b/gone");
    assert!(
        cluster.keys(&gone).contains(&gone),
        "the first sight is kept"
    );
    std::thread::sleep(Duration::from_millis(2_100));
    let out = reclaim("2s");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.json()["nodes"], json!(["node-b"]));
    assert_eq!(out.json()["fenced"], json!(["node-b"]));
    assert!(out.stderr.contains("readmit --config"), "{}", out.stderr);
    assert_eq!(holders(&cluster), ["attachments/a1:eth0"]);
    // Its address goes to node-a; node-b, still running b1, is fenced.
    let taken = add(&on("node-a"), "a2", &format!("IP={b1}"));
    assert_eq!(taken, b1);
    let refused = |out: &Outcome| {
        let error = out.assert_error(50);
        let said = error["msg"].as_str().unwrap().to_owned();
        assert!(said.contains("node node-b is fenced"), "{said}");
        assert!(
            said.contains("`ipam-da-pool reclaim` gave back its addresses"),
            "{said}"
        );
        assert!(
            said.contains("ipam-da-pool readmit --config PATH --node node-b"),
            "{said}"
        );
    };
    refused(&cni("STATUS", &on("node-b"), "", ""));
    refused(&cni("ADD", &on("node-b"), "b2", ""));
    // Its DEL succeeds, and node-a keeps the address.
    del(&on("node-b"), "b1");
    assert_eq!(
        holders(&cluster),
        ["attachments/a1:eth0", "attachments/a2:eth0"]
    );
    // Its keeper, back, says so at every renewal.
    let log = dir.path().join("keeper-b-again.log");
    let mut keeper = start_keeper(&b_file, &Env(Vec::new()), &log);
    wait_for("two renewals logged", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&log).unwrap();
        text.matches("error: node node-b is fenced").count() >= 2
    });
    keeper.kill().unwrap();
    keeper.wait().unwrap();
    assert!(
        !cluster.keys(&gone).contains(&gone),
        "registering again clears the first sight"
    );
    let out = operator(&["check", "--config", a_file.to_str().unwrap()]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains("node node-b is fenced"), "{said}");
    // readmit: a dry run changes nothing; then the fence is lifted.
    let readmit = |extra: &[&str]| {
        let mut args = vec![
            "readmit",
            "--config",
            a_file.to_str().unwrap(),
            "--node",
            "node-b",
        ];
        args.extend_from_slice(extra);
        operator(&args)
    };
    // Not while its keeper is down: the next reclaim would take it again.
    wait_for("node-b's lease to end", Duration::from_secs(15), || {
        !registered(&cluster, "node-b")
    });
    for extra in [&["--dry-run"][..], &[]] {
        let out = readmit(extra);
        assert!(!out.status.success(), "{out:?}");
        assert!(
            out.stderr
                .contains("node node-b is not registered: start its keeper first"),
            "{out:?}"
        );
    }
    refused(&cni("STATUS", &on("node-b"), "", ""));
    let log = dir.path().join("keeper-b-last.log");
    let mut keeper = start_keeper(&b_file, &Env(Vec::new()), &log);
    wait_for("node-b registered", Duration::from_secs(10), || {
        registered(&cluster, "node-b")
    });
    let out = readmit(&["--dry-run"]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("would lift the fence on node node-b"));
    refused(&cni("STATUS", &on("node-b"), "", ""));
    let out = readmit(&[]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("lifted the fence on node node-b"));
    cni("STATUS", &on("node-b"), "", "").assert_silent_success();
    keeper.kill().unwrap();
    keeper.wait().unwrap();
    add(&on("node-b"), "b3", &pod("ns/web-0", None));
    let out = readmit(&[]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("node node-b is not fenced"), "{out:?}");
}

#[test]
#[ignore = "needs etcd-server"]
fn a_misspelt_key_in_a_pool_defined_in_etcd_is_refused_naming_it() {
    let cluster = Cluster::start(1, None);
    cluster.put(
        &format!("{PREFIX}/pools/central"),
        r#"[{"subnet": "10.71.0.0/24", "exlude": ["10.71.0.2/31"]}]"#,
    );
    let mut config: Value =
        serde_json::from_str(&pods(&on_etcd(&cluster), "node-a", json!({}))).unwrap();
    config["ipam"]["pool"]["default"] = json!("central");
    let out = cni("ADD", &config.to_string(), "c1", "");
    let error = out.assert_error(7);
    let said = error["msg"].as_str().unwrap();
    assert!(
        said.contains("pool \"central\": range 0: unknown key \"exlude\""),
        "{said}"
    );
    assert_eq!(holders(&cluster), Vec::<String>::new());
}

/// The `etcdctl` commands of the access-control recipe in
/// docs/allocator.md, in order, each as its words.
fn access_control_recipe() -> Vec<Vec<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = std::fs::read_to_string(root.join("docs/allocator.md")).unwrap();
    let section = docs.split("### Access control").nth(1).unwrap();
    let block = section.split("```console").nth(1).unwrap();
    let block = block.split("```").next().unwrap();
    let recipe: Vec<Vec<String>> = block
        .lines()
        .filter_map(|line| line.strip_prefix("# etcdctl "))
        .map(|command| command.split_whitespace().map(String::from).collect())
        .collect();
    assert!(recipe.len() >= 5, "{block}");
    recipe
}

#[test]
#[ignore = "needs etcd-server and etcd-client"]
fn a_cluster_with_authentication_signs_in_again_when_its_tokens_expire_and_refuses_bad_credentials()
{
    use std::os::unix::fs::PermissionsExt;
    let cluster = Cluster::start_with(1, None, &["--auth-token-ttl", "2"]);
    // The docs' recipe, as written, each password given as USER-secret
    // where etcdctl would ask for it, the prefix the tests'.
    for args in access_control_recipe() {
        let args: Vec<String> = match &args[..] {
            [user, add, name] if user == "user" && add == "add" => {
                vec![user.clone(), add.clone(), format!("{name}:{name}-secret")]
            }
            _ => args
                .iter()
                .map(|a| a.replace("/ipam-da-pool", PREFIX))
                .collect(),
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cluster.etcdctl(&args);
    }
    let dir = temp_dir("auth");
    let secret = |name: &str, text: &str, mode: u32| {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        file
    };
    let as_user = |user: &str, file: &Path, node: &str| {
        let mut store = on_etcd(&cluster);
        store["etcd"]["username"] = json!(user);
        store["etcd"]["passwordFile"] = json!(file);
        pods(&store, node, json!({"nodeTTL": 9}))
    };
    let good = secret("ipam.password", "ipam-secret\n", 0o600);
    let first = add(&as_user("ipam", &good, "node-a"), "c1", "");
    // A keeper renews every 3 s, after each of its 2-second tokens expired.
    let conf = config_file(dir.path(), "node-a.conf", &as_user("ipam", &good, "node-a"));
    let log = dir.path().join("keeper.log");
    let mut keeper = start_keeper(&conf, &Env(Vec::new()), &log);
    std::thread::sleep(Duration::from_secs(8));
    let alive = format!("{PREFIX}/nodes/node-a/alive");
    // Every key under the prefix, as root reads them.
    let keys_as_root = || {
        cluster.etcdctl(&[
            "--user",
            "root:root-secret",
            "get",
            "--prefix",
            "--keys-only",
            PREFIX,
        ])
    };
    let keys = keys_as_root();
    keeper.kill().unwrap();
    keeper.wait().unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(keys.contains(&alive), "{keys}\n{logged}");
    assert!(!logged.contains("cannot"), "{logged}");
    // A long operator's command signs in again too: check, then show.
    let out = operator(&["check", "--config", conf.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    // The same node, a new process: its ADD is given the same address.
    assert_eq!(add(&as_user("ipam", &good, "node-a"), "c1", ""), first);
    // Refusals that waiting would not mend come at once, never code 11.
    let wrong = secret("wrong.password", "guess", 0o600);
    let open = secret("open.password", "ipam-secret", 0o644);
    let mut anonymous = on_etcd(&cluster);
    anonymous["etcd"]["timeout"] = json!(5);
    for (config, code, said) in [
        (
            as_user("ipam", &wrong, "node-a"),
            5,
            "etcd authentication failed",
        ),
        (
            as_user("nobody", &good, "node-a"),
            5,
            "etcd authentication failed",
        ),
        (
            pods(&anonymous, "node-a", json!({})),
            5,
            "etcd authentication failed",
        ),
        (
            as_user("ipam", &open, "node-a"),
            7,
            "its group or other users may read or write it (mode 644)",
        ),
    ] {
        let started = std::time::Instant::now();
        let out = cni("ADD", &config, "c2", "");
        let error = out.assert_error(code);
        assert!(error["msg"].as_str().unwrap().contains(said), "{error}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
    }
    // A user without permission on the keys: refused, naming it.
    cluster.etcdctl(&[
        "--user",
        "root:root-secret",
        "user",
        "add",
        "outsider:outsider-secret",
    ]);
    let outsider = secret("outsider.password", "outsider-secret", 0o600);
    let out = cni("ADD", &as_user("outsider", &outsider, "node-a"), "c3", "");
    let error = out.assert_error(5);
    assert!(
        error["msg"].as_str().unwrap().contains("permission denied"),
        "{error}"
    );
    // A monitoring user who may only read: check reports all it finds,
    // and says what it could not record of node-a, gone since its keeper
    // was killed.
    for args in [
        &["user", "add", "monitor:monitor-secret"][..],
        &["role", "add", "monitor"],
        &[
            "role",
            "grant-permission",
            "monitor",
            "--prefix=true",
            "read",
            PREFIX,
        ],
        &["user", "grant-role", "monitor", "monitor"],
    ] {
        let mut all = vec!["--user", "root:root-secret"];
        all.extend_from_slice(args);
        cluster.etcdctl(&all);
    }
    wait_for("node-a's lease to end", Duration::from_secs(15), || {
        !keys_as_root().contains("nodes/node-a/alive")
    });
    let monitor = secret("monitor.password", "monitor-secret", 0o600);
    let conf = config_file(
        dir.path(),
        "monitor.conf",
        &as_user("monitor", &monitor, "node-m"),
    );
    let out = operator(&["check", "--config", conf.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{out:?}");
    let report = out.json();
    assert_eq!(report["findings"], json!([]), "{report}");
    let unrecorded = report["unrecorded"].as_str().unwrap();
    assert!(
        unrecorded.starts_with("could not record that node(s) node-a were seen gone")
            && unrecorded.contains("permission denied"),
        "{unrecorded}"
    );
    assert!(out.stderr.contains(unrecorded), "{out:?}");
}

#[test]
#[ignore = "needs root (network and mount namespaces) and python3"]
fn an_endpoints_name_lookup_is_bounded_by_the_timeout() {
    // A host whose name server takes every question and never answers: in
    // namespaces of its own, with a resolv.conf of its own.
    let dir = temp_dir("lookup");
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 127.0.0.1\noptions timeout:5 attempts:2\n",
    )
    .unwrap();
    let silent = "import socket, time\n\
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
        s.bind(('127.0.0.1', 53))\n\
        time.sleep(60)\n";
    let script = format!(
        "ip link set lo up && mount --bind {} /etc/resolv.conf && \
         (python3 -c \"$0\" </dev/null >/dev/null 2>&1 &) && sleep 0.5 && exec \"$@\"",
        resolv.display()
    );
    let store = json!({"etcd": {"endpoints": ["etcd.cluster.example:2379"], "timeout": 1}});
    let config = pods(&store, "node-a", json!({}));
    let env = Env(vec![
        ("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into()),
        ("CNI_COMMAND".into(), "ADD".into()),
        ("CNI_CONTAINERID".into(), "c1".into()),
        ("CNI_NETNS".into(), "/var/run/netns/lookup".into()),
        ("CNI_IFNAME".into(), "eth0".into()),
        ("CNI_PATH".into(), "/nonexistent".into()),
    ]);
    let started = std::time::Instant::now();
    let out = run_program(
        "unshare",
        Path::new("/"),
        &[
            "--net", "--mount", "--", "sh", "-c", &script, silent, ALLOCATOR,
        ],
        &env,
        config.as_bytes(),
    );
    let error = out.assert_error(11);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .contains("looking up etcd.cluster.example"),
        "{error}"
    );
    // The resolver alone would wait 10 s.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[test]
#[ignore = "needs etcd-server and etcd-client"]
fn a_full_etcd_still_frees_refuses_adds_at_once_and_check_says_so() {
    let cluster = Cluster::start_with(1, None, &["--quota-backend-bytes", "2097152"]);
    let dir = temp_dir("nospace");
    // Addresses given back cool down, but a full etcd grants no lease.
    let mut extra = sticky("1h");
    extra["reuseAfter"] = json!("1h");
    let config = pods(&on_etcd(&cluster), "node-a", extra);
    let file = config_file(dir.path(), "pods.conf", &config);
    add(&config, "p1", "");
    add(&config, "w1", &pod("ns/web-0", None));
    // One address cooling already: its lease is noted, and the DELs below
    // put theirs on it until etcd, full, refuses the put.
    add(&config, "p0", "");
    del(&config, "p0");
    let out = operator(&["check", "--config", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.contains("MiB of its 2.0 MiB quota, no alarm"),
        "{said}"
    );
    // Filled up to its quota by another user of the cluster.
    let endpoint = format!("--endpoints={}", cluster.endpoints()[0]);
    let value = "x".repeat(100_000);
    for i in 0..40 {
        let put = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args([endpoint.as_str(), "put", &format!("/fill/{i}"), &value])
            .output()
            .unwrap();
        if !put.status.success() {
            break;
        }
    }
    assert!(cluster.etcdctl(&["alarm", "list"]).contains("NOSPACE"));
    // An ADD is refused at once, naming the alarm.
    let started = std::time::Instant::now();
    let error = cni("ADD", &config, "p2", "").assert_error(11);
    assert!(
        error["msg"].as_str().unwrap().contains("NOSPACE"),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // DEL and GC still free: etcd takes deletes. The workload's hold stays.
    del(&config, "p1");
    del(&config, "w1");
    assert_eq!(holders(&cluster), ["holds/ns%2Fweb-0:eth0"]);
    // p1's address given back at once: the hold's and p0's cooldown
    // alone have a record.
    let addresses = cluster.values(&format!("{PREFIX}/networks/pods/addresses/"));
    assert_eq!(addresses.len(), 2, "{addresses:?}");
    assert_eq!(
        addresses
            .iter()
            .filter(|(_, v)| v.starts_with("{\"coolingUntil\":"))
            .count(),
        1,
        "{addresses:?}"
    );
    let mut gc: Value = serde_json::from_str(&config).unwrap();
    gc["cni.dev/valid-attachments"] = json!([]);
    cni("GC", &gc.to_string(), "", "").assert_silent_success();
    let out = operator(&["check", "--config", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains("etcd raises alarm NOSPACE"), "{said}");
    assert!(
        said.contains("of its quota: compact and defragment it"),
        "{said}"
    );
}

#[test]
#[ignore = "needs etcd-server"]
fn records_of_the_previous_layout_are_used_where_they_are_then_moved_by_migrate() {
    let cluster = Cluster::start(1, None);
    let dir = temp_dir("migrate");
    let store = on_etcd(&cluster);
    let on = |node: &str| pods(&store, node, json!({"gcGraceSeconds": 0}));
    // What the previous version wrote: every attachment under one prefix.
    let network = format!("{PREFIX}/networks/pods/");
    let mut pairs = Vec::new();
    for (id, node, host) in [
        ("a1", "node-a", 2),
        ("a2", "node-a", 3),
        ("b1", "node-b", 4),
    ] {
        let address = format!("10.70.0.{host}");
        let owner =
            json!({"containerID": id, "ifname": "eth0", "node": node, "pool": "pods", "since": 0});
        let mut attachment = owner.clone();
        attachment["addresses"] = json!([{"pool": "pods", "address": address}]);
        pairs.push((
            format!("{network}attachments/{id}:eth0"),
            attachment.to_string(),
        ));
        pairs.push((
            format!("{network}addresses/010.070.000.{host:03}"),
            owner.to_string(),
        ));
    }
    pairs.push((format!("{network}hints/pods"), "10.70.0.5".into()));
    cluster.put_all(&pairs);
    // An ADD repeated finds what its container holds; CHECK agrees.
    let again = cni("ADD", &on("node-a"), "a1", "");
    assert_eq!(
        again.json()["ips"][0]["address"],
        "10.70.0.2/28",
        "{again:?}"
    );
    let mut checked: Value = serde_json::from_str(&on("node-a")).unwrap();
    checked["prevResult"] = again.json();
    cni("CHECK", &checked.to_string(), "a1", "").assert_silent_success();
    // A new ADD never takes an address the old records hold.
    let fresh = add(&on("node-a"), "a3", "");
    assert!(
        !["10.70.0.2", "10.70.0.3", "10.70.0.4"].contains(&fresh.as_str()),
        "{fresh}"
    );
    // DEL and GC free old records: node-a's GC, a2 only (b1 is node-b's).
    del(&on("node-a"), "a1");
    let mut gc: Value = serde_json::from_str(&on("node-a")).unwrap();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "a3", "ifname": "eth0"}]);
    cni("GC", &gc.to_string(), "", "").assert_silent_success();
    assert_eq!(
        holders(&cluster),
        ["attachments/a3:eth0", "attachments/b1:eth0"]
    );
    let file = config_file(dir.path(), "pods.conf", &on("node-a"));
    let out = operator(&["check", "--config", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    // migrate: a dry run, then b1 moved under node-b, and the version.
    let migrate = |extra: &[&str]| {
        let mut args = vec!["migrate", "--config", file.to_str().unwrap()];
        args.extend_from_slice(extra);
        operator(&args)
    };
    let out = migrate(&["--dry-run"]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("would move b1/eth0 under node node-b"));
    assert!(cluster.keys(&format!("{network}attachments/")).len() == 1);
    let out = migrate(&[]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 attachment(s) moved; layout version 2")
    );
    assert_eq!(
        cluster.keys(&format!("{network}attachments/")),
        Vec::<String>::new()
    );
    assert_eq!(
        cluster.keys(&format!("{network}nodes/node-b/")),
        [format!("{network}nodes/node-b/attachments/b1:eth0")]
    );
    let layout = cluster.values(&format!("{network}layout"));
    assert_eq!(layout[0].1, r#"{"version":2}"#);
    // Under node-b now: its DEL frees it.
    del(&on("node-b"), "b1");
    assert_eq!(holders(&cluster), ["attachments/a3:eth0"]);
    let out = migrate(&[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 attachment(s) moved"));
}

#[test]
#[ignore = "needs etcd-server"]
fn an_idle_node_adds_no_revision_and_adds_write_only_what_they_must() {
    let cluster = Cluster::start(1, None);
    let dir = temp_dir("history");
    let store = on_etcd(&cluster);
    let on = |node: &str| pods(&store, node, json!({"nodeTTL": 3}));
    let file = config_file(dir.path(), "node-a.conf", &on("node-a"));
    let log = dir.path().join("keeper.log");
    let mut keeper = start_keeper(&file, &Env(Vec::new()), &log);
    wait_for("node-a registered", Duration::from_secs(10), || {
        registered(&cluster, "node-a")
    });
    // Three renewals, a second apart: keep-alives, no write.
    let before = cluster.revision();
    std::thread::sleep(Duration::from_millis(3_500));
    assert_eq!(
        cluster.revision(),
        before,
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    keeper.kill().unwrap();
    keeper.wait().unwrap();
    // Ten ADDs on one node: the node's hint is written by the first only
    // (it moves on by one address each time, well short of a rewrite).
    for i in 0..10 {
        add(&on("node-a"), &format!("c{i}"), "");
    }
    let hint = format!("{PREFIX}/networks/pods/nodes/node-a/hints/pods");
    assert_eq!(
        cluster.values(&hint),
        [(hint.clone(), "10.70.0.3".to_owned())]
    );
    // The pool (.2 to .14) full: the note that says so, then a DEL ends it.
    for i in 10..13 {
        add(&on("node-b"), &format!("c{i}"), "");
    }
    cni("ADD", &on("node-b"), "c13", "").assert_error(110);
    let full = format!("{PREFIX}/networks/pods/full/pods");
    assert_eq!(cluster.keys(&full), std::slice::from_ref(&full));
    // Refused on the note: a few reads, not a look through the pool
    // (128 random places, then every range in order).
    let ranges = cluster.metric("etcd_mvcc_range_total");
    cni("ADD", &on("node-a"), "c13", "").assert_error(110);
    let read = cluster.metric("etcd_mvcc_range_total") - ranges;
    assert!(read < 30.0, "{read} reads");
    del(&on("node-a"), "c0");
    assert_eq!(cluster.keys(&full), Vec::<String>::new());
    add(&on("node-a"), "c13", "");
}

#[test]
#[ignore = "needs etcd-server"]
fn a_nodes_hint_follows_its_adds_in_order_and_goes_round_with_the_search() {
    let cluster = Cluster::start(1, None);
    // .2 to .80: 79 addresses.
    let range = json!({"pools": {"pods": [{"subnet": "10.70.0.0/25", "rangeEnd": "10.70.0.80"}]}});
    let config = pods(&on_etcd(&cluster), "node-a", range);
    let hint = format!("{PREFIX}/networks/pods/nodes/node-a/hints/pods");
    // The hint and how many times it was written.
    let hint_now = || {
        let fields = cluster.etcdctl(&["get", &hint, "--write-out", "fields"]);
        let field = |name: &str| {
            let line = fields
                .lines()
                .find(|l| l.starts_with(&format!("\"{name}\" : ")))
                .unwrap_or_else(|| panic!("no {name} in {fields}"));
            line.split(" : ")
                .nth(1)
                .unwrap()
                .trim_matches('"')
                .to_owned()
        };
        (field("Value"), field("Version").parse::<u32>().unwrap())
    };
    // Addresses in order, each found in the first look from the hint,
    // which is written once in 16 ADDs: by the first (.3), and after .18,
    // .34, .50 and .66 were given.
    for i in 0..79 {
        assert_eq!(
            add(&config, &format!("c{i}"), ""),
            format!("10.70.0.{}", i + 2)
        );
    }
    assert_eq!(hint_now(), ("10.70.0.67".to_owned(), 5));
    // The pool full but .64: the search goes round, and the hint with it.
    del(&config, "c62");
    assert_eq!(add(&config, "c79", ""), "10.70.0.64");
    assert_eq!(hint_now(), ("10.70.0.65".to_owned(), 6));
}

#[test]
#[ignore = "needs etcd-server"]
fn two_keepers_of_one_node_keep_it_registered_whichever_stops_first() {
    let cluster = Cluster::start(1, None);
    let dir = temp_dir("two-keepers");
    // Renewed every second, its registration outliving the last by 3 s.
    let config = pods(&on_etcd(&cluster), "node-a", json!({"nodeTTL": 3}));
    let file = config_file(dir.path(), "node-a.conflist", &config);
    let stays_registered = |what: &str| {
        for _ in 0..10 {
            assert!(registered(&cluster, "node-a"), "{what}");
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    let mut first = Keeper::start(&file);
    wait_for("node-a registered", Duration::from_secs(10), || {
        registered(&cluster, "node-a")
    });
    // A second keeper (a service beside the DaemonSet) comes and goes.
    let mut second = Keeper::start(&file);
    std::thread::sleep(Duration::from_millis(1_500));
    // Two idle keepers add nothing to etcd's history.
    let before = cluster.revision();
    std::thread::sleep(Duration::from_millis(2_500));
    assert_eq!(cluster.revision(), before, "idle keepers wrote");
    assert!(second.stop().success());
    stays_registered("the second keeper's stop unregistered node-a");
    // A third comes; the first, whose registration it is, stops.
    let mut third = Keeper::start(&file);
    std::thread::sleep(Duration::from_millis(1_500));
    let said_first = first.stop_saying();
    wait_for(
        "node-a registered again by the keeper still running",
        Duration::from_secs(2),
        || registered(&cluster, "node-a"),
    );
    stays_registered("the third keeper let node-a go");
    let said_third = third.stop_saying();
    assert!(
        !registered(&cluster, "node-a"),
        "the last keeper withdrew it"
    );
    // Each says when it registers the node and when it first finds
    // another's registration, not at every renewal.
    let count = |said: &str, what: &str| said.matches(what).count();
    let (made, there) = ("node node-a registered (lease", "keeping watch");
    assert_eq!(
        (count(&said_first, made), count(&said_first, there)),
        (1, 0),
        "{said_first}"
    );
    assert_eq!(
        (count(&said_third, there), count(&said_third, made)),
        (1, 1),
        "{said_third}"
    );
}

#[test]
#[ignore = "needs etcd-server and strace"]
fn a_reclaimed_workloads_next_container_never_gets_the_address_the_fenced_node_may_use() {
    let cluster = Cluster::start(1, None);
    let dir = temp_dir("reclaim-sticky");
    let settings = sticky("1h");
    // Each try at etcd outlasts the stall below: the release is sent once.
    let mut store = on_etcd(&cluster);
    store["etcd"]["timeout"] = json!(20);
    let on = |node: &str| pods(&store, node, settings.clone());
    let file = config_file(dir.path(), "node-c.conflist", &on("node-c"));
    let file = file.to_str().unwrap();
    let log = dir.path().join("reclaim.strace");
    // Stalled 3 s after write `stall` (its answer read only then), if one
    // is given.
    let reclaim = |stall: Option<usize>| {
        let delay = stall.map(|n| format!("inject=sendto:delay_exit=3000000:when={n}"));
        reclaim_traced(file, "node-b", &log, delay.as_deref())
    };
    // node-b's container of db/pg-0, reclaimed once to learn which write
    // is the body of its first transaction: the release, with the fence.
    let first = add(&on("node-b"), "b1", &pod("db/pg-0", None));
    assert!(reclaim(None).wait_with_output().unwrap().status.success());
    let writes = std::fs::read_to_string(&log).unwrap();
    let head = writes
        .lines()
        .position(|line| line.contains("POST /v3/kv/txn"))
        .expect("a transaction");
    let release = head + 2;
    // The same again: node-b readmitted (its keeper running, as readmit
    // needs, then stopped), its container of the workload back on the
    // address, then reclaimed, stalled after the release.
    let b_file = config_file(dir.path(), "node-b.conflist", &on("node-b"));
    readmit_b(&cluster, &b_file, file);
    assert_eq!(
        add(&on("node-b"), "b2", &pod("db/pg-0", Some(&first))),
        first
    );
    // node-c's next search starts past an address of its own, not at the
    // lowest free one: it gets `first` only through the workload's hold.
    add(&on("node-c"), "c0", "");
    let stalled = reclaim(Some(release));
    std::thread::sleep(Duration::from_millis(1_500));
    // Meanwhile the workload's next container starts on node-c: the
    // address node-b's container may still use is not handed on.
    let next = add(&on("node-c"), "c1", &pod("db/pg-0", None));
    let out = stalled.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_ne!(
        next, first,
        "node-c got what the fenced node-b may still use"
    );
    let holders = holders(&cluster);
    assert!(
        holders.contains(&"attachments/c1:eth0".to_owned()),
        "{holders:?}"
    );
    assert!(
        !holders.contains(&"attachments/b2:eth0".to_owned()),
        "{holders:?}"
    );
}

#[test]
#[ignore = "needs etcd-server and strace"]
fn what_changes_while_reclaim_runs_is_left_alone() {
    let cluster = Cluster::start(1, None);
    let dir = temp_dir("reclaim-taken-over");
    let settings = sticky("1h");
    let mut store = on_etcd(&cluster);
    store["etcd"]["timeout"] = json!(20);
    let on = |node: &str| pods(&store, node, settings.clone());
    let file = config_file(dir.path(), "node-c.conflist", &on("node-c"));
    let file = file.to_str().unwrap();
    let b_file = config_file(dir.path(), "node-b.conflist", &on("node-b"));
    let log = dir.path().join("reclaim.strace");
    // db/pg-0's hold, released on node-b by its container's DEL.
    let released_on_b = |id: &str| {
        add(&on("node-b"), id, &pod("db/pg-0", None));
        del(&on("node-b"), id);
    };
    // Reclaimed once to learn which request reads the hold again just
    // before its end: of the range reads before the first transaction,
    // the last but one (the last reads the record of its one address,
    // for the end's compare).
    released_on_b("b1");
    assert!(reclaim_traced(file, "node-b", &log, None)
        .wait_with_output()
        .unwrap()
        .status
        .success());
    let writes = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = writes.lines().collect();
    let txn = lines
        .iter()
        .position(|line| line.contains("POST /v3/kv/txn"))
        .expect("a transaction");
    let reads: Vec<usize> = (0..txn)
        .filter(|i| lines[*i].contains("POST /v3/kv/range"))
        .collect();
    // Twice again, node-b readmitted, with the reclaim stalled 3 s before
    // the hold is read again, then before its end reads the address's
    // record (its compare then finds the hold changed).
    readmit_b(&cluster, &b_file, file);
    for (round, read) in reads[reads.len() - 2..].iter().enumerate() {
        released_on_b(&format!("b{round}-again"));
        let inject = format!("inject=sendto:delay_enter=3000000:when={}", read + 1);
        let stalled = reclaim_traced(file, "node-b", &log, Some(&inject));
        std::thread::sleep(Duration::from_millis(1_500));
        // Meanwhile the workload's next container starts on node-c, a
        // live node, takes the hold over, and goes: the hold is node-c's
        // now, released there, and reclaim must leave it. (Bound to a
        // living container, the store itself would refuse to end it.)
        let held = add(&on("node-c"), &format!("c{round}"), &pod("db/pg-0", None));
        del(&on("node-c"), &format!("c{round}"));
        // It says so, and that it released nothing (exit status 1).
        let out = stalled.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "round {round}: {said}");
        assert!(
            said.contains("1 record(s) changed meanwhile")
                && said.contains("node node-b holds nothing in network pods"),
            "round {round}: {said}"
        );
        assert_eq!(holders(&cluster), ["holds/db%2Fpg-0:eth0"], "round {round}");
        // The workload's next container gets its address back.
        let next = format!("next{round}");
        assert_eq!(add(&on("node-c"), &next, &pod("db/pg-0", None)), held);
        del(&on("node-c"), &next);
    }
    // A plain container's attachment, which its runtime DELs while
    // reclaim waits to send the release: learnt, readmitted, stalled.
    add(&on("node-b"), "plain", "");
    let learnt = reclaim_traced(file, "node-b", &log, None);
    assert!(learnt.wait_with_output().unwrap().status.success());
    let writes = std::fs::read_to_string(&log).unwrap();
    let txn = writes
        .lines()
        .position(|line| line.contains("POST /v3/kv/txn"))
        .expect("a transaction");
    readmit_b(&cluster, &b_file, file);
    add(&on("node-b"), "plain", "");
    let inject = format!("inject=sendto:delay_enter=3000000:when={}", txn + 1);
    let stalled = reclaim_traced(file, "node-b", &log, Some(&inject));
    std::thread::sleep(Duration::from_millis(1_500));
    del(&on("node-b"), "plain");
    let out = stalled.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("1 record(s) changed meanwhile"), "{said}");
}

#[test]
#[ignore = "needs etcd-server and strace"]
fn release_by_address_leaves_a_record_its_holder_comes_to_list_meanwhile() {
    let cluster = Cluster::start(1, None);
    let dir = temp_dir("release-listed-again");
    let mut store = on_etcd(&cluster);
    store["etcd"]["timeout"] = json!(20);
    let config = pods(&store, "node-a", sticky("1h"));
    let file = config_file(dir.path(), "pods.conf", &config);
    let file = file.to_str().unwrap();
    let log = dir.path().join("release.strace");
    let key = format!("{PREFIX}/networks/pods/addresses/010.070.000.005");
    let release = |dry_run: bool, inject: Option<&str>| {
        let mut command = vec!["release", "--config", file, "10.70.0.5"];
        command.extend(dry_run.then_some("--dry-run"));
        traced(&command, &log, inject)
    };
    // Records of .5 that nothing lists (as a restore from an older backup
    // can leave): a plain container's, then a workload's, each made again
    // by its holder while a release of .5 has read it as unlisted.
    let strays = [
        (json!({"containerID": "c1"}), "c1", String::new()),
        (json!({"workload": "db/pg-0"}), "w1", pod("db/pg-0", None)),
    ];
    for (round, (holder, id, args)) in strays.iter().enumerate() {
        let mut stray = json!({"ifname": "eth0", "node": "node-a", "pool": "pods", "since": 1});
        stray
            .as_object_mut()
            .unwrap()
            .extend(holder.as_object().unwrap().clone());
        cluster.put(&key, &stray.to_string());
        // A dry run reads all the real one reads before it frees: the
        // real one is stalled 3 s at its next write to etcd.
        let learnt = release(true, None).wait_with_output().unwrap();
        assert!(learnt.status.success(), "round {round}: {learnt:?}");
        let writes = std::fs::read_to_string(&log).unwrap();
        let read = writes.lines().filter(|l| l.starts_with("sendto(")).count();
        let inject = format!("inject=sendto:delay_enter=3000000:when={}", read + 1);
        let stalled = release(false, Some(&inject));
        std::thread::sleep(Duration::from_millis(1_500));
        // Meanwhile the record goes, and its holder takes .5 again.
        cluster.etcdctl(&["del", &key]);
        let asked = format!("IgnoreUnknown=1;IP=10.70.0.5;{args}");
        assert_eq!(add(&config, id, &asked), "10.70.0.5");
        // The release leaves it: its holder lists it now.
        let out = stalled.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "round {round}: {said}");
        assert!(said.contains("nothing released"), "round {round}: {said}");
        let check = operator(&["check", "--config", file]);
        assert!(check.status.success(), "round {round}: {check:?}");
        del(&config, id);
    }
    // The workload's hold keeps .5 after its container's DEL.
    assert_eq!(holders(&cluster), ["holds/db%2Fpg-0:eth0"]);
}

#[test]
#[ignore = "needs etcd-server"]
fn a_keeper_given_the_nodes_name_pins_it_as_the_installer_does() {
    let cluster = Cluster::start(1, None);
    let dir = temp_dir("keeper-name");
    let file = dir.path().join("node-name");
    let config = unnamed(&pods(&on_etcd(&cluster), "unused", json!({})), &file);
    let conf = config_file(dir.path(), "pods.conf", &config);
    let keeper = |name: &str| {
        spawn_program(
            ALLOCATOR,
            Path::new("/"),
            &[
                "node-keeper",
                "--config",
                conf.to_str().unwrap(),
                "--node-name",
                name,
                "--node-name-file",
                file.to_str().unwrap(),
            ],
            &Env(Vec::new()),
            Stdio::piped(),
        )
    };
    // Started before any installer: it pins the name it is given.
    let mut first = keeper("node-k");
    wait_for("node-k registered", Duration::from_secs(10), || {
        registered(&cluster, "node-k")
    });
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "node-k\n");
    first.kill().unwrap();
    first.wait().unwrap();
    // Another name is refused, as the installer refuses it.
    let out = keeper("node-other").wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("pins node name \"node-k\", not \"node-other\""),
        "{said}"
    );
}
