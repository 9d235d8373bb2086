//! The Docker remote IPAM driver under a real dockerd (Debian's docker.io
//! 20.10), with host-local and with the pool allocator behind it: the
//! addresses containers get come from the stack's stores, and go back.

use crate::common;
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::{real_plugins, run_program, temp_dir, Env, TempDir, ALLOCATOR, PLUGIN};
use crate::dockerd::{read_answer, send, Dockerd, Driver, IMAGE};

const NEEDS: &str = "needs root, docker.io, busybox-static and containernetworking-plugins";

/// How a driver is started: [`Driver::start`] or [`Driver::on_socket`].
type StartDriver = fn(&Path, &str, &[(&str, &str)], &Path) -> Driver;

/// A CNI world for the driver: a directory of conflists, a CNI_PATH with
/// Debian's host-local, the pool allocator and a delegate that can be
/// made to fail, and the stores' and state's directories.
struct World {
    dir: TempDir,
}

impl World {
    fn new() -> World {
        let dir = temp_dir("docker");
        let bin = dir.path().join("bin");
        fs::create_dir_all(&bin).unwrap();
        fs::create_dir_all(dir.path().join("net.d")).unwrap();
        symlink(real_plugins().join("host-local"), bin.join("host-local")).unwrap();
        symlink(ALLOCATOR, bin.join("ipam-da-pool")).unwrap();
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/pass-or-fail-delegate");
        symlink(fixture, bin.join("pass-or-fail")).unwrap();
        let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-delegate");
        symlink(&fake, bin.join("liar")).unwrap();
        symlink(&fake, bin.join("slow")).unwrap();
        fs::create_dir_all(dir.path().join("fake")).unwrap();
        World { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Adds network `name` whose bridge takes `capabilities` and whose IPAM
    /// is ipam-delegated with `ipam` (delegates and their keys).
    fn network(&self, name: &str, version: &str, capabilities: Value, mut ipam: Value) {
        ipam["type"] = "ipam-delegated".into();
        ipam["stateDir"] = self.path("state").to_string_lossy().into();
        let list = json!({
            "cniVersion": version,
            "name": name,
            "plugins": [{"type": "bridge", "capabilities": capabilities, "ipam": ipam}],
        });
        fs::write(
            self.path("net.d").join(format!("{name}.conflist")),
            list.to_string(),
        )
        .unwrap();
    }

    /// The driver for Docker, started `how` (for Docker, or on a socket
    /// of the test's for tests that speak the protocol themselves), its
    /// last delegate failing once the file `fail` exists.
    fn driver(&self, how: StartDriver) -> Driver {
        let marker = self.path("fail");
        how(
            &self.path("net.d"),
            self.path("bin").to_str().unwrap(),
            &[
                ("PASS_OR_FAIL_MARKER", marker.to_str().unwrap()),
                ("FAKE_DELEGATE_DIR", self.path("fake").to_str().unwrap()),
            ],
            self.dir.path(),
        )
    }

    /// A network "hl" over host-local in 10.94.0.0/24, and the driver.
    fn with_host_local(&self) -> Driver {
        self.with_host_local_then("pass-or-fail")
    }

    /// The same, with `last` as the last delegate.
    fn with_host_local_then(&self, last: &str) -> Driver {
        self.network(
            "hl",
            "1.0.0",
            json!({"ips": true}),
            json!({
                "delegates": ["host-local", last],
                "dataDir": self.path("host-local"),
                "ranges": [[{"subnet": "10.94.0.0/24"}]],
            }),
        );
        self.driver(Driver::on_socket)
    }

    /// An environment of exactly `vars`, with the verbose flavour's log
    /// in the test's directory.
    fn env(&self, vars: &[(&str, &str)]) -> Env {
        let log = self.path("plugin.log");
        let mut env = vec![(
            "IPAM_DELEGATED_LOG_FILE".to_owned(),
            log.to_string_lossy().into_owned(),
        )];
        env.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Env(env)
    }

    /// The driver's count of Docker's requests of each pool of `network`
    /// (no record: none).
    fn pool_requests(&self, network: &str) -> Value {
        let record = self.path("state").join(network).join("docker-pools");
        match fs::read(record) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => json!({}),
            Err(e) => panic!("{e}"),
        }
    }

    /// The container IDs the driver keeps for network `name`.
    fn kept(&self, name: &str) -> BTreeSet<String> {
        names(&self.path("state").join(name))
            .into_iter()
            .filter_map(|file| file.split_once(':').map(|(id, _)| id.to_owned()))
            .collect()
    }
}

/// The names in a directory (none if it is missing).
fn names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// host-local's reservations in `dir` (its dataDir's network directory):
/// address to container ID.
fn host_local_holds(dir: &Path) -> Vec<(String, String)> {
    names(dir)
        .into_iter()
        .filter(|name| name.parse::<std::net::IpAddr>().is_ok())
        .map(|address| {
            let text = fs::read_to_string(dir.join(&address)).unwrap();
            let id = text.lines().next().unwrap_or_default().to_owned();
            (address, id)
        })
        .collect()
}

/// Docker's view of a container's address on its network.
fn docker_address(docker: &Dockerd, container: &str) -> String {
    docker.ok(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        container,
    ])
}

/// `docker network create` of network `name` over CNI network `cni`
/// through `driver`, with `extra` options: its arguments.
fn create_args(driver: &Driver, cni: &str, extra: &[&str], name: &str) -> Vec<String> {
    let mut args: Vec<String> = ["network", "create", "--ipam-driver", &driver.name]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.extend(["--ipam-opt".into(), format!("network={cni}")]);
    args.extend(extra.iter().map(|a| a.to_string()));
    args.push(name.into());
    args
}

fn create(driver: &Driver, docker: &Dockerd, cni: &str, extra: &[&str], name: &str) -> String {
    let args = create_args(driver, cni, extra, name);
    docker.ok(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The same, refused: what Docker says.
fn create_refused(
    driver: &Driver,
    docker: &Dockerd,
    cni: &str,
    extra: &[&str],
    name: &str,
) -> String {
    let args = create_args(driver, cni, extra, name);
    docker.fails(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
#[ignore = "needs root, docker.io, busybox-static and containernetworking-plugins"]
fn docker_containers_get_host_local_addresses_through_the_stack() {
    assert!(common::is_root(), "{NEEDS}");
    let world = World::new();
    let data = world.path("host-local");
    let hl = |extra: Value| {
        let mut ipam = json!({"delegates": ["host-local", "pass-or-fail"], "dataDir": data});
        for (k, v) in extra.as_object().unwrap() {
            ipam[k] = v.clone();
        }
        ipam
    };
    world.network(
        "declared",
        "1.0.0",
        json!({"ips": true}),
        hl(json!({"ranges": [[{"subnet": "10.91.0.0/24"}]]})),
    );
    world.network(
        "ranged",
        "1.0.0",
        json!({"ips": true, "ipRanges": true}),
        hl(json!({})),
    );
    let mut driver = world.driver(Driver::start);
    let docker = Dockerd::start();
    let store = data.join("declared");

    // Without --subnet: the subnet the configuration declares.
    create(&driver, &docker, "declared", &[], "plain");
    let ipam = docker.ok(&["network", "inspect", "-f", "{{json .IPAM.Config}}", "plain"]);
    let ipam: Value = serde_json::from_str(&ipam).unwrap();
    assert_eq!(ipam[0]["Subnet"], "10.91.0.0/24", "{ipam}");
    // Docker's gateway is the one every CNI result names: host-local's,
    // which it never hands out, so nothing holds it.
    assert_eq!(ipam[0]["Gateway"], "10.91.0.1", "{ipam}");
    let c = docker.run_on("plain", &[]);
    let inside = docker.address_inside(&c);
    assert_eq!(inside, docker_address(&docker, &c));
    assert_eq!(docker.gateway_inside(&c), "10.91.0.1");
    let holds = host_local_holds(&store);
    let kept = world.kept("declared");
    assert_eq!(holds.len(), 1, "the container's: {holds:?}");
    let (address, id) = &holds[0];
    assert_eq!(*address, inside);
    assert!(
        kept.contains(id),
        "{id} is not kept by the driver: {kept:?}"
    );
    let state = world.path("state/declared").join(format!("{id}:eth0"));
    let result: Value = serde_json::from_slice(&fs::read(state).unwrap()).unwrap();
    assert_eq!(result["ips"][0]["gateway"], "10.91.0.1", "{result}");
    docker.ok(&["rm", "-f", &c]);
    docker.ok(&["network", "rm", "plain"]);
    assert_eq!(
        host_local_holds(&store),
        [],
        "network removal frees everything"
    );
    assert_eq!(world.kept("declared"), BTreeSet::new());

    // --aux-address, as --ip, only with --subnet: Docker's own rule.
    let refused = create_refused(
        &driver,
        &docker,
        "declared",
        &["--aux-address", "printer=10.91.0.9"],
        "aux-only",
    );
    assert!(
        refused.contains("no matching subnet for aux-address 10.91.0.9"),
        "{refused}"
    );
    assert_eq!(host_local_holds(&store), []);

    // --subnet, --gateway and --ip: a --gateway other than the stack's
    // would give the pool two; the stack's own is taken.
    let refused = create_refused(
        &driver,
        &docker,
        "declared",
        &["--subnet", "10.91.0.0/24", "--gateway", "10.91.0.254"],
        "other-gateway",
    );
    assert!(
        refused.contains("10.91.0.254 cannot be given from pool")
            && refused.contains("the stack gives the pool the gateway 10.91.0.1")
            && refused.contains("(CNI error code 111)"),
        "{refused}"
    );
    assert_eq!(host_local_holds(&store), [], "the refusal holds nothing");
    create(
        &driver,
        &docker,
        "declared",
        &["--subnet", "10.91.0.0/24", "--gateway", "10.91.0.1"],
        "fixed",
    );
    let c = docker.run_on("fixed", &["--ip", "10.91.0.50"]);
    assert_eq!(docker.address_inside(&c), "10.91.0.50");
    let held: BTreeSet<String> = host_local_holds(&store)
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert_eq!(held, BTreeSet::from(["10.91.0.50".into()]));
    // An address another holds is refused, and the message says why.
    let refused = docker.fails(&[
        "run",
        "--rm",
        "--network",
        "fixed",
        "--ip",
        "10.91.0.50",
        IMAGE,
        "true",
    ]);
    assert!(refused.contains("10.91.0.50"), "{refused}");
    docker.ok(&["rm", "-f", &c]);
    let _ = docker.docker(&["container", "prune", "-f"]);

    // A subnet the configuration neither declares nor takes as ipRanges.
    let refused = create_refused(
        &driver,
        &docker,
        "declared",
        &["--subnet", "10.99.0.0/24"],
        "other",
    );
    assert!(
        refused.contains("declares 10.91.0.0/24, not 10.99.0.0/24"),
        "{refused}"
    );

    // 20 containers at once: 20 different addresses, each held in the store.
    let started: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..20)
            .map(|_| s.spawn(|| docker.run_on("fixed", &[])))
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let addresses: BTreeSet<String> = started.iter().map(|c| docker_address(&docker, c)).collect();
    assert_eq!(addresses.len(), 20, "{addresses:?}");
    let held: BTreeSet<String> = host_local_holds(&store)
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert!(
        addresses.is_subset(&held),
        "{addresses:?} not all in {held:?}"
    );
    assert_eq!(held.len(), 20);
    let mut rm = vec!["rm", "-f"];
    rm.extend(started.iter().map(String::as_str));
    docker.ok(&rm);
    let held: Vec<(String, String)> = host_local_holds(&store);
    assert_eq!(held, [], "nothing is left");

    // A last delegate that fails: docker run says what it said, and the
    // address host-local reserved before it is given back.
    fs::write(world.path("fail"), "the address service is away").unwrap();
    let failed = docker.fails(&["run", "--network", "fixed", IMAGE, "true"]);
    assert!(failed.contains("the address service is away"), "{failed}");
    assert!(
        failed.contains("pass-or-fail (ADD)"),
        "the delegate is named: {failed}"
    );
    assert_eq!(host_local_holds(&store), [], "nothing left reserved");
    fs::remove_file(world.path("fail")).unwrap();
    let _ = docker.docker(&["container", "prune", "-f"]);

    // The driver restarted between create and run.
    assert!(driver.stop().success(), "{}", driver.log());
    assert!(!driver.socket.exists(), "the socket is removed at exit");
    driver.restart();
    let c = docker.run_on("fixed", &[]);
    assert!(docker.address_inside(&c).starts_with("10.91.0."));
    docker.ok(&["rm", "-f", &c]);
    docker.ok(&["network", "rm", "fixed"]);
    assert_eq!(host_local_holds(&store), []);

    // Docker's own subnet and ip-range, given to the stack as ipRanges.
    let refused = create_refused(&driver, &docker, "ranged", &[], "r0");
    assert!(refused.contains("declares no IPv4 subnet"), "{refused}");
    create(
        &driver,
        &docker,
        "ranged",
        &["--subnet", "10.92.0.0/24", "--ip-range", "10.92.0.128/25"],
        "ranged",
    );
    assert_eq!(host_local_holds(&data.join("ranged")), []);
    let c = docker.run_on("ranged", &[]);
    // The stack's gateway, outside the ip-range.
    assert_eq!(docker.gateway_inside(&c), "10.92.0.1");
    let last: u8 = docker
        .address_inside(&c)
        .rsplit('.')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(last >= 128, "10.92.0.{last} is outside the ip-range");
    docker.ok(&["rm", "-f", &c]);
    docker.ok(&["network", "rm", "ranged"]);
    assert_eq!(host_local_holds(&data.join("ranged")), []);
    assert_eq!(world.kept("ranged"), BTreeSet::new());
}

#[test]
#[ignore = "needs root, docker.io, busybox-static and containernetworking-plugins"]
fn docker_containers_get_pool_addresses_that_gc_leaves_alone() {
    assert!(common::is_root(), "{NEEDS}");
    let world = World::new();
    let data = world.path("pools");
    world.network(
        "pooled",
        "1.1.0",
        json!({"ips": true}),
        json!({
            "delegates": ["ipam-da-pool"],
            "pool": {
                "dataDir": data,
                "default": ["docker"],
                "pools": {"docker": [{"subnet": "10.93.0.0/24"}]},
                "gcGraceSeconds": 0,
            },
        }),
    );
    let driver = world.driver(Driver::start);
    let docker = Dockerd::start();
    let addresses = || names(&data.join("pooled/addresses"));

    // Without --subnet: the configuration's default pool.
    create(&driver, &docker, "pooled", &[], "p1");
    let c1 = docker.run_on("p1", &[]);
    let first = docker.address_inside(&c1);
    assert!(first.starts_with("10.93.0."), "{first}");
    assert!(
        addresses().contains(&first),
        "{first} not in {:?}",
        addresses()
    );
    assert_eq!(
        addresses().len(),
        1,
        "the container's; the gateway is none's"
    );
    let ipam = docker.ok(&["network", "inspect", "-f", "{{json .IPAM.Config}}", "p1"]);
    assert_eq!(
        serde_json::from_str::<Value>(&ipam).unwrap()[0]["Gateway"],
        "10.93.0.1",
        "the pool's gateway: {ipam}"
    );
    // Docker keeps them across reboots: their records are synced files,
    // not the links a power loss may undo.
    for address in addresses() {
        let record = fs::symlink_metadata(data.join("pooled/addresses").join(&address)).unwrap();
        assert!(record.file_type().is_file(), "{address}: {record:?}");
    }
    docker.ok(&["rm", "-f", &c1]);
    docker.ok(&["network", "rm", "p1"]);
    assert_eq!(addresses(), BTreeSet::new());

    // With --subnet, and --ip.
    create(
        &driver,
        &docker,
        "pooled",
        &["--subnet", "10.93.0.0/24"],
        "p2",
    );
    let c2 = docker.run_on("p2", &["--ip", "10.93.0.77"]);
    assert_eq!(docker.address_inside(&c2), "10.93.0.77");
    let c3 = docker.run_on("p2", &[]);
    let third = docker.address_inside(&c3);
    assert!(addresses().contains(&third) && addresses().contains("10.93.0.77"));
    assert_eq!(addresses().len(), 2, "{:?}", addresses());

    // A runtime's GC that knows none of them frees none of them.
    let config = json!({
        "cniVersion": "1.1.0",
        "name": "pooled",
        "type": "bridge",
        "ipam": serde_json::from_str::<Value>(
            &fs::read_to_string(world.path("net.d/pooled.conflist")).unwrap()
        ).unwrap()["plugins"][0]["ipam"],
        "cni.dev/valid-attachments": [],
    });
    let bin = world.path("bin");
    let env = world.env(&[("CNI_COMMAND", "GC"), ("CNI_PATH", bin.to_str().unwrap())]);
    let gc = run_program(
        PLUGIN,
        world.dir.path(),
        &[],
        &env,
        config.to_string().as_bytes(),
    );
    gc.assert_silent_success();

    assert_eq!(addresses().len(), 2, "GC freed the driver's addresses");
    assert_eq!(world.kept("pooled").len(), 2);

    docker.ok(&["rm", "-f", &c2, &c3]);
    docker.ok(&["network", "rm", "p2"]);
    assert_eq!(addresses(), BTreeSet::new());
    assert_eq!(world.kept("pooled"), BTreeSet::new());
}

/// The body of an error answer: what Docker prints.
fn error_of(answer: (u16, Value)) -> String {
    assert_eq!(
        answer.0, 200,
        "errors are a 200, which Docker reads: {answer:?}"
    );
    answer.1["Error"]
        .as_str()
        .unwrap_or_else(|| panic!("no \"Error\" in {answer:?}"))
        .to_owned()
}

#[test]
#[ignore = "needs containernetworking-plugins"]
fn the_protocol_is_answered_as_libnetwork_asks_it() {
    let world = World::new();
    let driver = world.with_host_local();
    let store = world.path("host-local/hl");
    let (status, activate) = driver.post("/Plugin.Activate", &Value::Null);
    assert_eq!(
        (status, activate),
        (200, json!({"Implements": ["IpamDriver"]}))
    );
    let (_, caps) = driver.post("/IpamDriver.GetCapabilities", &Value::Null);
    assert_eq!(caps["RequiresMACAddress"], false);
    let (status, _) = driver.post("/IpamDriver.Unknown", &json!({}));
    assert_eq!(status, 404);

    // Docker sends null options; the one network is used.
    let (_, pool) = driver.post(
        "/IpamDriver.RequestPool",
        &json!({"AddressSpace": "local", "Pool": "", "SubPool": "", "Options": null, "V6": false}),
    );
    assert_eq!(pool["Pool"], "10.94.0.0/24", "{pool}");
    let id = pool["PoolID"].as_str().unwrap().to_owned();
    assert_eq!(id, "hl/10.94.0.0/24");
    let ask = |address: &str| {
        driver.post(
            "/IpamDriver.RequestAddress",
            &json!({"PoolID": id, "Address": address, "Options": null}),
        )
    };
    let (_, given) = ask("");
    let given = given["Address"].as_str().unwrap().to_owned();
    assert!(
        given.starts_with("10.94.0.") && given.ends_with("/24"),
        "{given}"
    );
    let (_, asked) = ask("10.94.0.9");
    assert_eq!(asked["Address"], "10.94.0.9/24");
    assert_eq!(host_local_holds(&store).len(), 2);

    // The gateway is the one the stack gives, held by none; asked for, it
    // is that one or refused.
    let gateway = |address: &str| {
        driver.post(
            "/IpamDriver.RequestAddress",
            &json!({"PoolID": id, "Address": address,
                    "Options": {"RequestAddressType": "com.docker.network.gateway"}}),
        )
    };
    for asked in ["", "10.94.0.1"] {
        let (_, given) = gateway(asked);
        assert_eq!(given, json!({"Address": "10.94.0.1/24", "Data": {}}));
    }
    let other = error_of(gateway("10.94.0.254"));
    assert!(
        other.contains("the stack gives the pool the gateway 10.94.0.1, which every container's result names: give --gateway 10.94.0.1, or none (CNI error code 111)"),
        "{other}"
    );
    assert_eq!(host_local_holds(&store).len(), 2, "the gateway is none's");
    assert_eq!(world.kept("hl").len(), 2);

    // Refusals name the address, say why and carry the CNI code.
    let taken = error_of(ask("10.94.0.9"));
    assert!(
        taken.contains("10.94.0.9") && taken.contains("host-local (ADD)"),
        "{taken}"
    );
    let outside = error_of(ask("10.95.0.1"));
    assert!(
        outside.contains("10.95.0.1 cannot be given from pool \"hl/10.94.0.0/24\": it is outside the pool's subnet (CNI error code 111)"),
        "{outside}"
    );
    let unknown = error_of(driver.post(
        "/IpamDriver.RequestPool",
        &json!({"AddressSpace": "local", "Options": {"network": "nope"}}),
    ));
    assert!(
        unknown.contains("no network \"nope\" uses ipam-delegated"),
        "{unknown}"
    );
    let not_ours = error_of(driver.post(
        "/IpamDriver.RequestAddress",
        &json!({"PoolID": "hl/10.96.0.0/24", "Address": "", "Options": null}),
    ));
    assert!(
        not_ours.contains("was not requested from this driver"),
        "{not_ours}"
    );
    assert_eq!(
        host_local_holds(&store).len(),
        2,
        "refusals reserve nothing"
    );

    // ReleaseAddress is a DEL of the attachment that holds the address;
    // releasing it again is no error.
    let release = json!({"PoolID": id, "Address": "10.94.0.9"});
    assert_eq!(
        driver.post("/IpamDriver.ReleaseAddress", &release),
        (200, json!({}))
    );
    assert_eq!(
        driver.post("/IpamDriver.ReleaseAddress", &release),
        (200, json!({}))
    );
    assert_eq!(host_local_holds(&store).len(), 1);

    // A pool requested twice is released by its second release, with
    // whatever Docker left in it.
    driver.post("/IpamDriver.RequestPool", &json!({"AddressSpace": "local"}));
    ask("");
    let release_pool = json!({"PoolID": id});
    assert_eq!(
        driver.post("/IpamDriver.ReleasePool", &release_pool),
        (200, json!({}))
    );
    assert_eq!(host_local_holds(&store).len(), 2, "still requested once");
    driver.post("/IpamDriver.ReleasePool", &release_pool);
    assert_eq!(
        host_local_holds(&store),
        [],
        "the last release frees what is left"
    );
    assert_eq!(world.kept("hl"), BTreeSet::new());
}

#[test]
#[ignore = "needs containernetworking-plugins"]
fn an_address_docker_never_hears_of_is_given_back() {
    let world = World::new();
    let driver = world.with_host_local();
    let store = world.path("host-local/hl");
    let (_, pool) = driver.post("/IpamDriver.RequestPool", &json!({"AddressSpace": "local"}));
    // The client asks, and is gone before the answer.
    let mut stream = std::os::unix::net::UnixStream::connect(&driver.socket).unwrap();
    send(
        &mut stream,
        "/IpamDriver.RequestAddress",
        &json!({"PoolID": pool["PoolID"], "Address": "", "Options": null}),
    );
    drop(stream);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !driver.log().contains("could not be delivered") {
        assert!(std::time::Instant::now() < deadline, "{}", driver.log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Asked for again on a live connection: the same pool still works.
    let mut stream = std::os::unix::net::UnixStream::connect(&driver.socket).unwrap();
    send(
        &mut stream,
        "/IpamDriver.RequestAddress",
        &json!({"PoolID": pool["PoolID"], "Address": "", "Options": null}),
    );
    let (_, given) = read_answer(&mut std::io::BufReader::new(&stream));
    let given = given["Address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let held: Vec<String> = host_local_holds(&store)
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert_eq!(held, [given], "the undelivered address was released");
}

#[test]
#[ignore = "needs containernetworking-plugins"]
fn the_socket_is_replaced_when_stale_kept_when_served_and_removed_at_exit() {
    let world = World::new();
    let socket = world.path("driver.sock");
    // A socket nobody serves, as a killed driver leaves it.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let mut driver = world.with_host_local();
    assert_eq!(driver.post("/Plugin.Activate", &Value::Null).0, 200);
    let another = || {
        let config = world.path("net.d");
        let (config, socket) = (config.to_str().unwrap(), socket.to_str().unwrap());
        let args = ["docker-plugin", "--config", config, "--socket", socket];
        let outcome = run_program(PLUGIN, world.dir.path(), &args, &world.env(&[]), b"");
        assert_eq!(outcome.status.code(), Some(1));
        outcome.stderr
    };
    // A second driver on the same socket refuses, and leaves it be.
    let second = another();
    assert!(second.contains("another driver serves it"), "{second}");
    assert_eq!(driver.post("/Plugin.Activate", &Value::Null).0, 200);
    // SIGTERM: exit 0, the socket gone.
    assert!(driver.stop().success(), "{}", driver.log());
    assert!(!socket.exists());
    assert!(driver.log().contains("stopped"), "{}", driver.log());
    // Not a socket: refused, untouched.
    fs::write(&socket, "precious").unwrap();
    let refused = another();
    assert!(refused.contains("is not a socket"), "{refused}");
    assert_eq!(fs::read_to_string(&socket).unwrap(), "precious");
}

#[test]
#[ignore = "needs containernetworking-plugins"]
fn keep_alive_requests_and_a_stack_that_gives_another_address() {
    let world = World::new();
    let driver = world.with_host_local_then("liar");
    let store = world.path("host-local/hl");
    // Two requests on one connection, as Docker's client keeps them.
    let mut stream = std::os::unix::net::UnixStream::connect(&driver.socket).unwrap();
    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
    send(&mut stream, "/Plugin.Activate", &Value::Null);
    assert_eq!(read_answer(&mut reader).0, 200);
    send(
        &mut stream,
        "/IpamDriver.RequestPool",
        &json!({"AddressSpace": "local"}),
    );
    let (_, pool) = read_answer(&mut reader);
    // The last delegate answers with an address of its own.
    fs::write(
        world.path("fake/liar.ADD.stdout"),
        r#"{"cniVersion":"1.0.0","ips":[{"address":"10.94.0.200/24"}]}"#,
    )
    .unwrap();
    send(
        &mut stream,
        "/IpamDriver.RequestAddress",
        &json!({"PoolID": pool["PoolID"], "Address": "10.94.0.9", "Options": null}),
    );
    let refused = error_of(read_answer(&mut reader));
    assert!(
        refused.contains("10.94.0.9 cannot be given from pool \"hl/10.94.0.0/24\": the stack gave 10.94.0.200 instead (CNI error code 111)"),
        "{refused}"
    );
    assert_eq!(
        host_local_holds(&store),
        [],
        "what host-local gave is given back"
    );
    assert_eq!(world.kept("hl"), BTreeSet::new());
}

#[test]
#[ignore = "needs containernetworking-plugins"]
fn a_stack_that_names_no_gateway_gives_docker_one_as_any_address() {
    let world = World::new();
    let driver = world.with_host_local_then("liar");
    let store = world.path("host-local/hl");
    let (_, pool) = driver.post("/IpamDriver.RequestPool", &json!({"AddressSpace": "local"}));
    // The last delegate's result has an address and no gateway.
    fs::write(
        world.path("fake/liar.ADD.stdout"),
        r#"{"cniVersion":"1.0.0","ips":[{"address":"10.94.0.200/24"}]}"#,
    )
    .unwrap();
    let gateway = json!({"PoolID": pool["PoolID"], "Address": "",
                         "Options": {"RequestAddressType": "com.docker.network.gateway"}});
    let (_, given) = driver.post("/IpamDriver.RequestAddress", &gateway);
    assert_eq!(given["Address"], "10.94.0.200/24", "{given}");
    assert_eq!(host_local_holds(&store).len(), 1, "held, as any address");
    assert_eq!(world.kept("hl").len(), 1);
    let release = json!({"PoolID": pool["PoolID"], "Address": "10.94.0.200"});
    assert_eq!(
        driver.post("/IpamDriver.ReleaseAddress", &release),
        (200, json!({}))
    );
    assert_eq!(host_local_holds(&store), []);
    assert_eq!(world.kept("hl"), BTreeSet::new());
}

#[test]
#[ignore = "needs containernetworking-plugins"]
fn a_pool_whose_release_fails_is_released_later_and_an_unanswered_pool_not_counted() {
    let world = World::new();
    let driver = world.with_host_local();
    let store = world.path("host-local/hl");
    let request_pool = json!({"AddressSpace": "local"});
    let (_, pool) = driver.post("/IpamDriver.RequestPool", &request_pool);
    let id = pool["PoolID"].clone();
    driver.post(
        "/IpamDriver.RequestAddress",
        &json!({"PoolID": id, "Address": "", "Options": null}),
    );
    // The last delegate's DEL fails: Docker hears of it, the attachment
    // stays kept, and the pool is no longer counted as held.
    fs::write(world.path("fail"), "the address service is away").unwrap();
    let failed = error_of(driver.post("/IpamDriver.ReleasePool", &json!({"PoolID": id})));
    assert!(failed.contains("pass-or-fail (DEL)"), "{failed}");
    assert_eq!(world.kept("hl").len(), 1);
    assert_eq!(world.pool_requests("hl"), json!({"hl/10.94.0.0/24": 0}));
    // Requested and released again once the delegate works: what was left
    // is released with it.
    fs::remove_file(world.path("fail")).unwrap();
    driver.post("/IpamDriver.RequestPool", &request_pool);
    assert_eq!(world.kept("hl").len(), 1, "the pool is held again");
    driver.post("/IpamDriver.ReleasePool", &json!({"PoolID": id}));
    assert_eq!(world.kept("hl"), BTreeSet::new());
    assert_eq!(host_local_holds(&store), []);
    assert_eq!(world.pool_requests("hl"), json!({}));

    // A RequestPool whose answer Docker never gets is not counted.
    let mut stream = std::os::unix::net::UnixStream::connect(&driver.socket).unwrap();
    send(&mut stream, "/IpamDriver.RequestPool", &request_pool);
    drop(stream);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !driver
        .log()
        .contains("giving pool hl/10.94.0.0/24 could not be delivered")
    {
        assert!(std::time::Instant::now() < deadline, "{}", driver.log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while world.pool_requests("hl") != json!({}) {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            world.pool_requests("hl")
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
#[ignore = "needs containernetworking-plugins"]
fn sigterm_stops_the_driver_with_a_request_under_way_and_a_connection_idle() {
    let world = World::new();
    let mut driver = world.with_host_local_then("slow");
    let store = world.path("host-local/hl");
    let (_, pool) = driver.post("/IpamDriver.RequestPool", &json!({"AddressSpace": "local"}));
    fs::write(world.path("fake/slow.ADD.run"), "sleep 30\n").unwrap();
    // An idle connection, kept alive as Docker keeps them.
    let idle = std::os::unix::net::UnixStream::connect(&driver.socket).unwrap();
    let mut busy = std::os::unix::net::UnixStream::connect(&driver.socket).unwrap();
    send(
        &mut busy,
        "/IpamDriver.RequestAddress",
        &json!({"PoolID": pool["PoolID"], "Address": "", "Options": null}),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !fs::read_to_string(world.path("fake/calls"))
        .unwrap_or_default()
        .contains("slow ADD")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow delegate never ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let asked = std::time::Instant::now();
    assert!(driver.stop().success(), "{}", driver.log());
    assert!(
        asked.elapsed() < std::time::Duration::from_secs(10),
        "stopping took {:?}",
        asked.elapsed()
    );
    let stopped = error_of(read_answer(&mut std::io::BufReader::new(&busy)));
    assert!(stopped.contains("(CNI error code 105)"), "{stopped}");
    assert_eq!(
        host_local_holds(&store),
        [],
        "the ADD under way was rolled back"
    );
    assert!(!driver.socket.exists());
    drop(idle);
}

#[test]
#[ignore = "needs containernetworking-plugins"]
fn a_release_that_fails_and_an_add_the_driver_died_in_are_undone_and_nothing_stays() {
    let world = World::new();
    let mut driver = world.with_host_local_then("slow");
    let store = world.path("host-local/hl");
    let held = || -> Vec<String> {
        host_local_holds(&store)
            .into_iter()
            .map(|(a, _)| a)
            .collect()
    };
    // The last delegate answers with its prevResult, as pass-or-fail does.
    let pass =
        r#"tr -d '\n' <"$dir/$n.$name.$command.stdin" | sed -n 's/.*"prevResult":\(.*\)}$/\1/p'"#;
    fs::write(world.path("fake/slow.ADD.run"), pass).unwrap();
    let (_, pool) = driver.post("/IpamDriver.RequestPool", &json!({"AddressSpace": "local"}));
    let request = || {
        let (_, given) = driver.post(
            "/IpamDriver.RequestAddress",
            &json!({"PoolID": pool["PoolID"], "Address": "", "Options": null}),
        );
        given["Address"]
            .as_str()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .to_owned()
    };
    let release = |address: &str| {
        driver.post(
            "/IpamDriver.ReleaseAddress",
            &json!({"PoolID": pool["PoolID"], "Address": address}),
        )
    };
    // The stack's DEL fails (an etcd blip, say): Docker hears of it, the
    // attachment stays kept, and its release is tried again at the
    // network's next request.
    let first = request();
    let kept_first = world.kept("hl");
    assert_eq!(kept_first.len(), 1);
    fs::write(world.path("fake/slow.DEL.exit"), "1").unwrap();
    let refused = error_of(release(&first));
    assert!(refused.contains("CNI error code"), "{refused}");
    assert_eq!(world.kept("hl"), kept_first);
    fs::remove_file(world.path("fake/slow.DEL.exit")).unwrap();
    let second = request();
    let kept_second = world.kept("hl");
    assert!(
        kept_second.len() == 1 && kept_second != kept_first,
        "the first released before the second was given: {kept_second:?}"
    );
    assert_eq!(held(), std::slice::from_ref(&second));
    // ... and on the driver's timer, with no request at all.
    fs::write(world.path("fake/slow.DEL.exit"), "1").unwrap();
    error_of(release(&second));
    assert_eq!(world.kept("hl"), kept_second);
    fs::remove_file(world.path("fake/slow.DEL.exit")).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(25);
    while !world.kept("hl").is_empty() {
        assert!(std::time::Instant::now() < deadline, "{}", driver.log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The driver dies while the stack's ADD runs: host-local has given an
    // address nobody keeps. The driver, started again, gives it back.
    fs::write(world.path("fake/slow.ADD.run"), format!("sleep 3; {pass}")).unwrap();
    let socket = driver.socket.clone();
    let pool_id = pool["PoolID"].clone();
    let asking = std::thread::spawn(move || {
        let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        send(
            &mut stream,
            "/IpamDriver.RequestAddress",
            &json!({"PoolID": pool_id, "Address": "", "Options": null}),
        );
        let mut answer = String::new();
        let _ = std::io::Read::read_to_string(&mut stream, &mut answer);
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while held().is_empty() {
        assert!(std::time::Instant::now() < deadline, "{}", driver.log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    driver.kill();
    asking.join().unwrap();
    driver.restart();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !held().is_empty() {
        assert!(std::time::Instant::now() < deadline, "{}", driver.log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // `docker network rm`: the network's state holds nothing.
    let (status, _) = driver.post(
        "/IpamDriver.ReleasePool",
        &json!({"PoolID": pool["PoolID"]}),
    );
    assert_eq!(status, 200);
    assert_eq!(
        names(&world.path("state/hl")),
        BTreeSet::new(),
        "{}",
        driver.log()
    );
}
