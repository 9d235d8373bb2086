//! The plugin under the runtimes users run, each with Debian's `bridge` as
//! the main plugin and ipam-delegated as its IPAM, into network namespaces
//! these tests create: libcni itself (what containerd's CRI plugin, CRI-O
//! and cnitool call plugins through), podman with its CNI backend, and
//! containerd through `ctr run --cni`. Each runs an example conflist of
//! fixtures/conflists/ (shown in docs/runtimes.md), made private to the
//! test. And deploy/kubernetes's network, as Multus runs it through libcni
//! with Debian's macvlan on two nodes that share a network.
//!
//! Nothing touches this machine's own network or state: the runtimes, and
//! so the bridges, run inside a network namespace standing in for the host,
//! and podman and containerd in mount namespaces of their own with private
//! tmpfs over the directories they would leave things in. Every command is
//! bounded with timeout(1).
//!
//! Needs root and the runtime packages (./.ci/test installs them): the
//! tests are ignored unless asked for with --include-ignored, as ./.ci/test
//! does.

use crate::common;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::common::{
    recorded_calls, recorded_env, recorded_stdin, temp_dir, write_answer, Answer, TempDir,
    ALLOCATOR, PLUGIN, SELECTOR,
};
use serde_json::{json, Value};

/// What a test container runs: it prints its eth0 address.
const SHOW_ADDRESS: [&str; 7] = ["/bin/busybox", "ip", "-4", "-o", "addr", "show", "eth0"];

/// What the failing delegate answers; the runtime must pass it on.
const FAILURE_MSG: &str = "no lease from the e2e lease service";

/// The stacks each runtime runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Case {
    /// host-local alone.
    OneDelegate,
    /// A scripted pool selector, then host-local.
    SelectorThenAllocator,
    /// host-local, then a delegate that fails: rolled back.
    LastFails,
    /// The crate's own selector and allocator (local store).
    Pools,
}

const CASES: [Case; 4] = [
    Case::OneDelegate,
    Case::SelectorThenAllocator,
    Case::LastFails,
    Case::Pools,
];

impl Case {
    fn delegates(self) -> &'static [&'static str] {
        match self {
            Case::OneDelegate => &["host-local"],
            Case::SelectorThenAllocator => &["ipam-ds-pool", "host-local"],
            Case::LastFails => &["host-local", "ipam-da-fail"],
            Case::Pools => &["ipam-ds-static", "ipam-da-pool"],
        }
    }
}

/// `program` bounded by timeout(1), so nothing a test runs can hang CI.
fn bounded(program: &str) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "5", "120", program]);
    cmd
}

/// A network namespace, deleted when dropped.
struct Netns(String);

impl Netns {
    fn new(name: String) -> Netns {
        // The first `ip netns add` on a machine mounts /run/netns; several
        // at once could stack those mounts.
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let _ = run(bounded("ip").args(["netns", "del", &name]));
        ok(bounded("ip").args(["netns", "add", &name]));
        let ns = Netns(name);
        ok(bounded("ip").args(["-n", &ns.0, "link", "set", "lo", "up"]));
        ns
    }

    fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }

    /// `program` inside this network namespace, bounded by timeout(1), with
    /// the rest of the system (mounts, /sys, cgroups) as it is.
    fn bounded(&self, program: &str) -> Command {
        let mut cmd = bounded("nsenter");
        cmd.arg(format!("--net={}", self.path())).arg(program);
        cmd
    }

    /// `args` inside this network namespace and a mount namespace of their
    /// own, where each of `tmpfs` is an empty tmpfs and each (from, to) of
    /// `binds` is bind-mounted; all of it goes with the last process in it.
    fn isolated(&self, tmpfs: &[&str], binds: &[(&Path, &str)], args: &[&str]) -> Command {
        let mut script = String::from("set -e\n");
        for dir in tmpfs {
            script.push_str(&format!("mount -t tmpfs tmpfs {dir}\n"));
        }
        for (from, to) in binds {
            script.push_str(&format!("mount --bind {} {to}\n", from.display()));
        }
        script.push_str("exec \"$@\"\n");
        let mut cmd = self.bounded("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ])
        .args(args);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run(bounded("ip").args(["netns", "del", &self.0]));
    }
}

/// One test's private world: a host namespace, a CNI_PATH directory with
/// the real plugins, the plugin under test and the fixture delegates, a
/// host-local store, and a busybox root filesystem for containers.
struct Lab {
    dir: TempDir,
    host: Netns,
    tag: &'static str,
}

/// A network as one case runs it.
struct Network {
    case: Case,
    name: String,
    /// The first three octets of its subnet, with the dot.
    prefix: String,
    conflist: String,
    /// Where the scripted delegates of this case record their calls, and
    /// the plugin (verbose flavour) its log.
    rec: PathBuf,
}

impl Network {
    fn log(&self) -> PathBuf {
        self.rec.join("plugin.log")
    }
}

impl Lab {
    fn new(tag: &'static str) -> Lab {
        let dir = temp_dir(tag);
        let bin = dir.path().join("bin");
        fs::create_dir_all(&bin).unwrap();
        for plugin in ["bridge", "host-local", "loopback"] {
            std::os::unix::fs::symlink(Path::new("/usr/lib/cni").join(plugin), bin.join(plugin))
                .unwrap();
        }
        for (program, name) in [
            (PLUGIN, "ipam-delegated"),
            (SELECTOR, "ipam-ds-static"),
            (ALLOCATOR, "ipam-da-pool"),
        ] {
            fs::copy(program, bin.join(name)).unwrap();
        }
        let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-delegate");
        for name in ["ipam-ds-pool", "ipam-da-fail", "ipam-da-other-version"] {
            std::os::unix::fs::symlink(&fake, bin.join(name)).unwrap();
        }
        let rootfs = dir.path().join("rootfs/bin");
        fs::create_dir_all(&rootfs).unwrap();
        fs::copy("/bin/busybox", rootfs.join("busybox")).unwrap();
        let host = Netns::new(format!("ipamd-{tag}-host-{}", std::process::id()));
        Lab { dir, host, tag }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The example conflist `fixture` made private for one case: its own
    /// name, bridge, subnet 10.250.`octet`.0/24 (and gateway, if the
    /// example sets one), host-local store and delegates; every other
    /// setting as in the example.
    fn network(&self, fixture: &str, case: Case, octet: u8) -> Network {
        let file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/conflists")
            .join(fixture);
        let mut list: Value = serde_json::from_str(&fs::read_to_string(file).unwrap()).unwrap();
        let name = format!("ipamd-{}-{octet}", self.tag);
        let prefix = format!("10.250.{octet}.");
        list["name"] = json!(name);
        let version = list["cniVersion"].clone();
        let bridge = &mut list["plugins"][0];
        bridge["bridge"] = json!(format!("ipd{}{octet}", self.tag));
        let ipam = &mut bridge["ipam"];
        assert_eq!(ipam["type"], "ipam-delegated", "{fixture}");
        ipam["delegates"] = json!(case.delegates());
        ipam["dataDir"] = json!(self.path("data"));
        let range = &mut ipam["ranges"][0][0];
        range["subnet"] = json!(format!("{prefix}0/24"));
        if range.get("gateway").is_some() {
            range["gateway"] = json!(format!("{prefix}1"));
        }
        if case == Case::Pools {
            ipam["static"] = json!({"default": [{"name": "e2e"}]});
            ipam["pool"] = json!({
                "dataDir": self.path("pools"),
                "node": "e2e-node",
                "pools": {"e2e": [{"subnet": format!("{prefix}0/24")}]},
                "routes": ipam.get("routes").cloned().unwrap_or(json!([])),
            });
        }

        let rec = self.path(&format!("rec-{octet}"));
        fs::create_dir_all(&rec).unwrap();
        let pool = json!({"cniVersion": version, "ips": [], "pools": [{"name": "e2e", "subnet": format!("{prefix}0/24")}]});
        write_answer(
            &rec,
            "ipam-ds-pool",
            "ADD",
            Answer::prints(pool.to_string()),
        );
        let failure = json!({"cniVersion": version, "code": 11, "msg": FAILURE_MSG});
        write_answer(
            &rec,
            "ipam-da-fail",
            "ADD",
            Answer::fails(1, failure.to_string()),
        );
        Network {
            case,
            name,
            prefix,
            conflist: serde_json::to_string_pretty(&list).unwrap(),
            rec,
        }
    }

    /// `command` (add, check, del) on conflist `file` through libcni (the
    /// driver), in the host namespace, for container ctr-e2e in `container`.
    fn libcni(
        &self,
        driver: &Path,
        command: &str,
        file: &Path,
        container: &Netns,
        network: &Network,
    ) -> Output {
        run(self
            .host
            .bounded(driver.to_str().unwrap())
            .args([
                command,
                file.to_str().unwrap(),
                "ctr-e2e",
                &container.path(),
                "eth0",
            ])
            .env("CNI_PATH", self.path("bin"))
            .env("CNI_CACHE_DIR", self.path("libcni-cache"))
            .env("FAKE_DELEGATE_DIR", &network.rec)
            .env("IPAM_DELEGATED_LOG_FILE", network.log()))
    }

    /// The addresses the case's allocator holds for `network`: host-local's,
    /// or ipam-da-pool's records.
    fn reservations(&self, network: &Network) -> BTreeSet<String> {
        let dir = match network.case {
            Case::Pools => self.path("pools").join(&network.name).join("addresses"),
            _ => self.path("data").join(&network.name),
        };
        let Ok(entries) = fs::read_dir(dir) else {
            return BTreeSet::new();
        };
        entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }

    /// The last address the case's allocator handed out for `network`:
    /// proof that it allocated in the test's store and nowhere else.
    /// ipam-da-pool's hint is the address after it.
    fn last_reserved(&self, network: &Network) -> Option<String> {
        if network.case == Case::Pools {
            let hint = self.path("pools").join(&network.name).join("hints/e2e");
            // Written as 010.060.000.003, one width for every address.
            let octets: Vec<u8> = fs::read_to_string(hint)
                .ok()?
                .trim()
                .split('.')
                .map(|octet| octet.parse().ok())
                .collect::<Option<_>>()?;
            let next = std::net::Ipv4Addr::from(<[u8; 4]>::try_from(octets).ok()?);
            return Some(std::net::Ipv4Addr::from(u32::from(next) - 1).to_string());
        }
        fs::read_to_string(
            self.path("data")
                .join(&network.name)
                .join("last_reserved_ip.0"),
        )
        .ok()
    }
}

/// What a runtime did with one case.
struct Attachment {
    succeeded: bool,
    /// The address the container saw on eth0 (with its prefix length).
    address: Option<String>,
    /// What the runtime printed.
    output: String,
}

/// Runs every case through `attach` and checks the issue's rules: the
/// container gets an address from the stack (host-local's, in the test's
/// store); when it ends, DEL reaches the stack and nothing stays reserved;
/// a failing stack is reported by the runtime and rolled back by the
/// plugin itself.
fn run_cases(
    lab: &Lab,
    fixture: &str,
    first_octet: u8,
    mut attach: impl FnMut(&Network) -> Attachment,
) -> Vec<Network> {
    let mut networks = Vec::new();
    for (i, case) in CASES.into_iter().enumerate() {
        let net = lab.network(fixture, case, first_octet + i as u8);
        let outcome = attach(&net);
        let context = format!("{fixture} {case:?}: {}", outcome.output);
        let calls: Vec<String> = recorded_calls(&net.rec)
            .iter()
            .map(|c| format!("{} {}", c.name, c.command))
            .collect();
        match case {
            Case::OneDelegate | Case::SelectorThenAllocator | Case::Pools => {
                assert!(outcome.succeeded, "{context}");
                let address = outcome.address.unwrap_or_default();
                assert!(
                    address.starts_with(&net.prefix),
                    "address {address:?}: {context}"
                );
                let host = address.split('/').next().unwrap_or_default();
                assert_eq!(lab.last_reserved(&net).as_deref(), Some(host), "{context}");
            }
            Case::LastFails => {
                assert!(!outcome.succeeded, "{context}");
                // libcni's own wording: the runtime got the error object.
                assert!(outcome.output.contains("failed (add)"), "{context}");
                assert!(outcome.output.contains(FAILURE_MSG), "{context}");
                assert!(
                    lab.last_reserved(&net).is_some(),
                    "host-local never ran: {context}"
                );
                assert_rolled_back_by_the_plugin(&net, &context);
            }
        }
        if case == Case::SelectorThenAllocator {
            assert_eq!(
                calls.first().map(String::as_str),
                Some("ipam-ds-pool ADD"),
                "{context}"
            );
            assert!(
                calls.iter().any(|c| c == "ipam-ds-pool DEL"),
                "{calls:?}: {context}"
            );
        }
        assert!(
            lab.reservations(&net).is_empty(),
            "{:?} left: {context}",
            lab.reservations(&net)
        );
        if cfg!(feature = "verbose") {
            let log = fs::read_to_string(net.log()).unwrap_or_default();
            for command in ["command=ADD", "command=DEL"] {
                assert!(
                    log.contains(command),
                    "no {command} in the plugin's log: {context}"
                );
            }
        }
        networks.push(net);
    }
    networks
}

/// The failing delegate's first DEL came from the plugin that ran its ADD
/// (same parent pid), with what the ADD got (host-local's result as
/// prevResult): the plugin's rollback, not a DEL the runtime sent later.
fn assert_rolled_back_by_the_plugin(net: &Network, context: &str) {
    let calls = recorded_calls(&net.rec);
    let (Some(add), Some(del)) = (calls.first(), calls.get(1)) else {
        panic!("{calls:?}: {context}");
    };
    assert_eq!(
        (add.command.as_str(), del.command.as_str()),
        ("ADD", "DEL"),
        "{context}"
    );
    let parent = |call| {
        recorded_env(&net.rec, call)
            .get("IPAM_DELEGATED_PARENT")
            .cloned()
    };
    assert_eq!(parent(add), parent(del), "{context}");
    let rolled_back = recorded_stdin(&net.rec, del);
    assert_eq!(rolled_back, recorded_stdin(&net.rec, add), "{context}");
    let prev: Value = serde_json::from_slice(&rolled_back).unwrap();
    let address = prev["prevResult"]["ips"][0]["address"]
        .as_str()
        .unwrap_or_default();
    assert!(address.starts_with(&net.prefix), "{context}");
}

#[test]
#[ignore = "needs root, network namespaces and the runtimes"]
fn libcni_as_used_by_containerd_cri_crio_and_cnitool() {
    let libcni = "/usr/share/gocode/src/github.com/containernetworking/cni/libcni";
    prerequisites(&["go", "nsenter"], &[libcni]);
    let driver = libcni_driver();
    let lab = Lab::new("lib");
    for (fixture, first_octet) in [("crio.conflist", 41), ("cnitool.conflist", 45)] {
        run_cases(&lab, fixture, first_octet, |net| {
            let file = lab.path(&format!("{}.conflist", net.name));
            fs::write(&file, &net.conflist).unwrap();
            let container = Netns::new(format!("{}-ctr-{}", net.name, std::process::id()));
            let call = |command: &str| lab.libcni(&driver, command, &file, &container, net);
            let add = call("add");
            let mut output = text(&add);
            let mut address = None;
            if add.status.success() {
                let shown = ok(bounded("ip").args([
                    "-n",
                    &container.0,
                    "-4",
                    "-o",
                    "addr",
                    "show",
                    "eth0",
                ]));
                address = inet(&shown);
                assert_eq!(lab.reservations(net).len(), 1, "{output}");
                let check = call("check");
                assert!(check.status.success(), "CHECK: {}", text(&check));
            } else {
                // The error object itself reached libcni, code and all, and
                // the plugin rolled back before any DEL from the runtime.
                assert!(
                    output.contains(&format!("cni-error code=11 msg={FAILURE_MSG}")),
                    "{output}"
                );
                assert!(lab.reservations(net).is_empty(), "{output}");
                let calls = fs::read_to_string(net.rec.join("calls")).unwrap_or_default();
                assert_eq!(calls, "ipam-da-fail ADD\nipam-da-fail DEL\n", "{output}");
            }
            // A runtime deletes after a failed ADD too.
            let del = call("del");
            assert!(del.status.success(), "DEL: {}", text(&del));
            output.push_str(&text(&del));
            Attachment {
                succeeded: add.status.success(),
                address,
                output,
            }
        });
    }
}

#[test]
#[ignore = "needs root, network namespaces and the runtimes"]
fn pods_get_their_namespaces_pool_and_their_static_address_under_libcni() {
    let libcni = "/usr/share/gocode/src/github.com/containernetworking/cni/libcni";
    prerequisites(&["go", "nsenter"], &[libcni]);
    let driver = libcni_driver();
    let lab = Lab::new("k8s");
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/conflists/kubernetes.conflist");
    let mut list: Value = serde_json::from_str(&fs::read_to_string(fixture).unwrap()).unwrap();
    let name = "ipamd-k8s-pods";
    list["name"] = json!(name);
    let bridge = &mut list["plugins"][0];
    bridge["bridge"] = json!("ipdk8s0");
    let pool = &mut bridge["ipam"]["pool"];
    // One subnet on the bridge, two ranges of it: a bridge has one IPv4
    // gateway address.
    pool["pools"]["pods"][0] = json!({"subnet": "10.250.71.0/24", "rangeEnd": "10.250.71.127"});
    pool["pools"]["pci"][0] = json!({"subnet": "10.250.71.0/24", "rangeStart": "10.250.71.128"});
    pool["dataDir"] = json!(lab.path("pools"));
    let file = lab.path("pods.conflist");
    fs::write(&file, list.to_string()).unwrap();
    let rec = lab.path("rec");
    fs::create_dir_all(&rec).unwrap();

    // (pod, namespace, static address asked for, address expected)
    let pods = [
        ("pay", "payments", None, "10.250.71.128/24"),
        ("web", "default", None, "10.250.71.2/24"),
        ("db", "default", Some("10.250.71.50/24"), "10.250.71.50/24"),
        ("db-twin", "default", Some("10.250.71.50/24"), ""),
    ];
    let call = |command: &str, pod: &str, container: &Netns, namespace: &str, ip: Option<&str>| {
        run(lab
            .host
            .bounded(driver.to_str().unwrap())
            .args([
                command,
                file.to_str().unwrap(),
                &format!("ctr-{pod}"),
                &container.path(),
                "eth0",
            ])
            .env("CNI_PATH", lab.path("bin"))
            .env("CNI_CACHE_DIR", lab.path("libcni-cache"))
            .env("IPAM_DELEGATED_LOG_FILE", rec.join("plugin.log"))
            .env(
                "LIBCNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod}"),
            )
            .env("LIBCNI_IPS", ip.unwrap_or_default()))
    };
    let mut containers = Vec::new();
    for (pod, namespace, ip, expected) in pods {
        let container = Netns::new(format!("ipamd-k8s-{pod}-{}", std::process::id()));
        let add = call("add", pod, &container, namespace, ip);
        if expected.is_empty() {
            // The address is another pod's: refused, with the allocator's code.
            assert!(!add.status.success(), "{pod}: {}", text(&add));
            assert!(
                text(&add).contains("cni-error code=111"),
                "{pod}: {}",
                text(&add)
            );
        } else {
            assert!(add.status.success(), "{pod}: {}", text(&add));
            let shown =
                ok(bounded("ip").args(["-n", &container.0, "-4", "-o", "addr", "show", "eth0"]));
            assert_eq!(inet(&shown).as_deref(), Some(expected), "{pod}");
            let check = call("check", pod, &container, namespace, ip);
            assert!(check.status.success(), "{pod} CHECK: {}", text(&check));
        }
        containers.push((pod, namespace, ip, container));
    }
    for (pod, namespace, ip, container) in &containers {
        let del = call("del", pod, container, namespace, *ip);
        assert!(del.status.success(), "{pod} DEL: {}", text(&del));
    }
    let left = fs::read_dir(lab.path("pools").join(name).join("attachments"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0, "every pod's attachment is released");
}

#[test]
#[ignore = "needs root, network namespaces and the runtimes"]
fn bridge_under_libcni_gets_the_reply_in_the_configurations_version() {
    let libcni = "/usr/share/gocode/src/github.com/containernetworking/cni/libcni";
    prerequisites(&["go", "nsenter"], &[libcni]);
    let driver = libcni_driver();
    let lab = Lab::new("ver");
    // Debian's bridge (libcni 1.1) knows no 1.1.0 result: a delegate
    // answering 1.1.0 to a 1.0.0 configuration fails it unless the plugin
    // converts. The 0.4.0 case needs `ips[].version` added.
    for (fixture, octet, answers_in) in [
        ("crio.conflist", 61, "1.1.0"),
        ("podman.conflist", 62, "1.0.0"),
    ] {
        let mut net = lab.network(fixture, Case::OneDelegate, octet);
        let mut list: Value = serde_json::from_str(&net.conflist).unwrap();
        list["plugins"][0]["ipam"]["delegates"] = json!(["ipam-da-other-version"]);
        net.conflist = list.to_string();
        let address = format!("{}9/24", net.prefix);
        let result = json!({
            "cniVersion": answers_in,
            "ips": [{"address": address, "gateway": format!("{}1", net.prefix)}],
            "pools": [{"name": "kept"}],
        });
        write_answer(
            &net.rec,
            "ipam-da-other-version",
            "ADD",
            Answer::prints(result.to_string()),
        );
        let file = lab.path(&format!("{}.conflist", net.name));
        fs::write(&file, &net.conflist).unwrap();
        let container = Netns::new(format!("{}-ctr-{}", net.name, std::process::id()));
        let call = |command: &str| lab.libcni(&driver, command, &file, &container, &net);
        let add = call("add");
        assert!(add.status.success(), "{fixture}: {}", text(&add));
        let shown =
            ok(bounded("ip").args(["-n", &container.0, "-4", "-o", "addr", "show", "eth0"]));
        assert_eq!(inet(&shown).as_deref(), Some(address.as_str()), "{fixture}");
        let del = call("del");
        assert!(del.status.success(), "{fixture}: {}", text(&del));
    }
}

#[test]
#[ignore = "needs root, network namespaces and the runtimes"]
fn libcni_does_not_wait_for_what_a_delegate_leaves_running() {
    let libcni = "/usr/share/gocode/src/github.com/containernetworking/cni/libcni";
    prerequisites(&["go"], &[libcni]);
    let driver = libcni_driver();
    let dir = temp_dir("lingers");
    let bin = dir.path().join("bin");
    let rec = dir.path().join("rec");
    fs::create_dir_all(&bin).unwrap();
    fs::create_dir_all(&rec).unwrap();
    fs::copy(PLUGIN, bin.join("ipam-delegated")).unwrap();
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-delegate");
    std::os::unix::fs::symlink(&fake, bin.join("lingers")).unwrap();
    // Done in milliseconds, but it leaves a child holding its stderr.
    let result = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.250.63.2/24"}]}"#;
    write_answer(
        &rec,
        "lingers",
        "ADD",
        Answer::prints(result).after("sleep 8 >/dev/null &\n"),
    );
    // ipam-delegated as the only plugin of the list: libcni itself waits
    // on its stderr, no main plugin or namespace in between.
    let list = json!({
        "cniVersion": "1.0.0",
        "name": "lingers",
        "plugins": [{"type": "ipam-delegated", "ipam": {"type": "ipam-delegated", "delegates": ["lingers"]}}],
    });
    let file = dir.path().join("lingers.conflist");
    fs::write(&file, list.to_string()).unwrap();
    let started = Instant::now();
    let add = run(bounded(driver.to_str().unwrap())
        .args([
            "add",
            file.to_str().unwrap(),
            "ctr-lingers",
            "/run/netns/none",
            "eth0",
        ])
        .env("CNI_PATH", &bin)
        .env("CNI_CACHE_DIR", dir.path().join("cache"))
        .env("FAKE_DELEGATE_DIR", &rec)
        .env("IPAM_DELEGATED_LOG_FILE", rec.join("plugin.log")));
    let took = started.elapsed();
    assert!(add.status.success(), "{}", text(&add));
    assert!(took < Duration::from_secs(4), "libcni waited {took:?}");
}

/// etcd, run in a network namespace of the test's: a member of the nodes'
/// network, as a cluster's etcd is; stopped when dropped.
struct EtcdOnTheNetwork {
    process: Child,
    /// Its data directory, removed after it stops.
    _data: TempDir,
}

impl EtcdOnTheNetwork {
    /// One member in `ns`, its clients served on `address`:2379.
    fn start(ns: &Netns, address: &str) -> EtcdOnTheNetwork {
        let data = temp_dir("mvl-etcd");
        let client = format!("http://{address}:2379");
        let peer = "http://127.0.0.1:2380";
        let log = fs::File::create(data.path().join("etcd.log")).unwrap();
        let child = ns
            .bounded("/usr/bin/etcd")
            .args(["--data-dir", &data.path().join("m0").display().to_string()])
            .args(["--name", "m0", "--log-level", "warn"])
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", peer])
            .args(["--initial-advertise-peer-urls", peer])
            .args(["--initial-cluster", &format!("m0={peer}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let etcd = EtcdOnTheNetwork {
            process: child,
            _data: data,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let health = run(ns.bounded("etcdctl").env("ETCDCTL_API", "3").args([
                "--endpoints",
                &client,
                "endpoint",
                "health",
            ]));
            if health.status.success() {
                return etcd;
            }
            assert!(Instant::now() < deadline, "etcd: {}", text(&health));
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for EtcdOnTheNetwork {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

#[test]
#[ignore = "needs root, network namespaces, the runtimes and etcd-server"]
fn the_shipped_kubernetes_network_gives_pods_of_two_nodes_one_pool_through_each_uplink() {
    // deploy/kubernetes's network, as Multus runs it on each node: the
    // configuration the installer writes into /etc/cni/multus/net.d,
    // through libcni, with Debian's macvlan. Two nodes on one network
    // name their uplink differently (eth1, ens4): macvlan, told no
    // "master", takes each node's default-route interface.
    let libcni = "/usr/share/gocode/src/github.com/containernetworking/cni/libcni";
    prerequisites(
        &["go", "nsenter", "etcdctl"],
        &[libcni, "/usr/lib/cni/macvlan", "/usr/bin/etcd"],
    );
    let driver = libcni_driver();
    let lab = Lab::new("mvl");
    std::os::unix::fs::symlink("/usr/lib/cni/macvlan", lab.path("bin/macvlan")).unwrap();
    let pid = std::process::id();
    let nodes = [
        ("node-a", "eth1", "192.168.100.1"),
        ("node-b", "ens4", "192.168.100.2"),
    ];
    let (veth_a, veth_b) = (format!("mvla{pid}"), format!("mvlb{pid}"));
    ok(bounded("ip").args([
        "-n",
        &lab.host.0,
        "link",
        "add",
        &veth_a,
        "type",
        "veth",
        "peer",
        "name",
        &veth_b,
    ]));
    let mut node_ns = Vec::new();
    for ((node, uplink, address), veth) in nodes.iter().zip([&veth_a, &veth_b]) {
        let ns = Netns::new(format!("ipamd-mvl-{node}-{pid}"));
        ok(bounded("ip").args([
            "-n",
            &lab.host.0,
            "link",
            "set",
            veth,
            "netns",
            &ns.0,
            "name",
            uplink,
        ]));
        let ip = |args: &[&str]| ok(bounded("ip").args(["-n", &ns.0]).args(args));
        ip(&["addr", "add", &format!("{address}/24"), "dev", uplink]);
        ip(&["link", "set", uplink, "up"]);
        ip(&[
            "route",
            "add",
            "default",
            "via",
            "192.168.100.254",
            "dev",
            uplink,
        ]);
        node_ns.push(ns);
    }
    // The cluster's etcd, on the nodes' network (here, on node-a).
    let _etcd = EtcdOnTheNetwork::start(&node_ns[0], "192.168.100.1");
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/shared.conflist");
    let shipped: Value = serde_json::from_str(&fs::read_to_string(shipped).unwrap()).unwrap();
    // libcni's `command` on node `i` for its pod: as Multus runs it.
    let libcni = |i: usize, command: &str, file: &Path, pod: &Netns| {
        run(node_ns[i]
            .bounded(driver.to_str().unwrap())
            .args([command, file.to_str().unwrap(), &format!("ctr-{i}")])
            .args([&pod.path(), "net1"])
            .env("CNI_PATH", lab.path("bin"))
            .env("CNI_CACHE_DIR", lab.path(&format!("libcni-cache-{i}")))
            .env("IPAM_DELEGATED_LOG_FILE", lab.path("plugin.log"))
            .env(
                "LIBCNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-{i}"),
            ))
    };
    let mut pods = Vec::new();
    for (i, (node, _, _)) in nodes.iter().enumerate() {
        // As the installer writes it on the node, but for the test's etcd
        // (no TLS), and the node's name, which the installer pins in a
        // file that both nodes of this test would share.
        let mut list = shipped.clone();
        let pool = &mut list["plugins"][0]["ipam"]["pool"];
        pool["etcd"] = json!({"endpoints": ["http://192.168.100.1:2379"], "prefix": "/ipamd-mvl"});
        pool["node"] = json!(node);
        let file = lab.path(&format!("{node}.conflist"));
        fs::write(&file, list.to_string()).unwrap();
        let pod = Netns::new(format!("ipamd-mvl-pod{i}-{pid}"));
        let add = libcni(i, "add", &file, &pod);
        assert!(add.status.success(), "{node}: {}", text(&add));
        let shown = ok(bounded("ip").args(["-n", &pod.0, "-4", "-o", "addr", "show", "net1"]));
        let address = inet(&shown).unwrap_or_default();
        assert!(address.starts_with("192.168.100."), "{node}: {shown}");
        // A macvlan child of the node's own uplink, whatever its name.
        let link = ok(bounded("ip").args(["-n", &pod.0, "-d", "link", "show", "net1"]));
        assert!(link.contains("macvlan mode bridge"), "{node}: {link}");
        let check = libcni(i, "check", &file, &pod);
        assert!(check.status.success(), "{node} CHECK: {}", text(&check));
        let host = address.split('/').next().unwrap_or_default().to_owned();
        pods.push((file, pod, host));
    }
    let (a, b) = (&pods[0].2, &pods[1].2);
    assert_ne!(a, b, "one pool, never one address twice");
    // The pods reach each other across the nodes' network...
    let ping = |ns: &Netns, to: &str| {
        run(ns
            .bounded("/bin/busybox")
            .args(["ping", "-c", "1", "-W", "2", to]))
        .status
        .success()
    };
    assert!(ping(&pods[0].1, b), "the pod on node-a cannot reach {b}");
    assert!(ping(&pods[1].1, a), "the pod on node-b cannot reach {a}");
    // ...but a node cannot reach its own pod through macvlan: why this is
    // a second network (kubelet probes a pod on its first).
    assert!(!ping(&node_ns[0], a), "node-a reached its own pod");
    for (i, (file, pod, _)) in pods.iter().enumerate() {
        let del = libcni(i, "del", file, pod);
        assert!(del.status.success(), "{} DEL: {}", nodes[i].0, text(&del));
    }
}

#[test]
#[ignore = "needs root, network namespaces and the runtimes"]
fn podman_with_its_cni_backend() {
    prerequisites(&["podman", "runc", "conmon", "nsenter", "unshare"], &[]);
    let lab = Lab::new("pod");
    for dir in ["net.d", "podman-tmp", "podman-run", "podman-storage"] {
        fs::create_dir_all(lab.path(dir)).unwrap();
    }
    let storage_conf = format!(
        "[storage]\ndriver = \"vfs\"\nrunroot = \"{}\"\ngraphroot = \"{}\"\n",
        lab.path("podman-run").display(),
        lab.path("podman-storage").display()
    );
    fs::write(lab.path("storage.conf"), storage_conf).unwrap();
    // Where podman keeps libcni's cache, network namespaces and runc's
    // state: private tmpfs, gone with the test's mount namespace.
    let private = ["/var/lib/cni", "/run/netns", "/run/runc"];
    let _mount_points = MountPoints::ensure(&private);
    // Cgroups cannot be made private; podman's go under a parent of the
    // test's own, removed afterwards.
    let cgroups = crate::common::Cgroups(format!("ipamd-e2e-{}", std::process::id()));
    let cgroup_parent = format!("/{}", cgroups.0);

    run_cases(&lab, "podman.conflist", 51, |net| {
        fs::write(
            lab.path("net.d").join(format!("{}.conflist", net.name)),
            &net.conflist,
        )
        .unwrap();
        // podman's DEL comes from a cleanup process that conmon starts with
        // an environment of its own: delegates' settings reach it through
        // [engine] env, as they must in production.
        let containers_conf = format!(
            r#"[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "{tmp}"
env = ["FAKE_DELEGATE_DIR={rec}", "IPAM_DELEGATED_LOG_FILE={log}"]
[network]
network_backend = "cni"
cni_plugin_dirs = ["{bin}"]
network_config_dir = "{netd}"
"#,
            tmp = lab.path("podman-tmp").display(),
            rec = net.rec.display(),
            log = net.log().display(),
            bin = lab.path("bin").display(),
            netd = lab.path("net.d").display(),
        );
        fs::write(lab.path("containers.conf"), containers_conf).unwrap();
        let rootfs = lab.path("rootfs");
        let args = [
            "podman",
            "run",
            "--rm",
            "--cgroup-parent",
            &cgroup_parent,
            "--network",
            &net.name,
            "--rootfs",
            rootfs.to_str().unwrap(),
        ]
        .iter()
        .chain(&SHOW_ADDRESS)
        .copied()
        .collect::<Vec<&str>>();
        let out = run(lab
            .host
            .isolated(&private, &[], &args)
            .env("CONTAINERS_CONF", lab.path("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", lab.path("storage.conf")));
        Attachment {
            succeeded: out.status.success(),
            address: inet(&String::from_utf8_lossy(&out.stdout)),
            output: text(&out),
        }
    });
}

#[test]
#[ignore = "needs root, network namespaces and the runtimes"]
fn containerd_with_ctr_run_cni() {
    prerequisites(
        &["containerd", "ctr", "runc", "unshare", "nsenter", "pkill"],
        &[],
    );
    let lab = Lab::new("ctd");
    // ctr reads only the first two; the test mounts its own over them. The
    // others (libcni's cache, containerd's shim sockets) become private tmpfs.
    let _mount_points = MountPoints::ensure(&[
        "/etc/cni/net.d",
        "/opt/cni/bin",
        "/var/lib/cni",
        "/run/containerd",
    ]);
    let daemon = Containerd::start(&lab);
    fs::create_dir_all(lab.path("net.d")).unwrap();

    let mut n = 0;
    let networks = run_cases(&lab, "containerd.conflist", 61, |net| {
        // The only conflist there, so the one ctr uses.
        fs::write(lab.path("net.d/10-e2e.conflist"), &net.conflist).unwrap();
        n += 1;
        let id = format!("ipamd-e2e-{}-{n}", std::process::id());
        let (socket, runc, fifo, rootfs) = (
            daemon.socket.display().to_string(),
            lab.path("runc").display().to_string(),
            lab.path("fifo").display().to_string(),
            lab.path("rootfs").display().to_string(),
        );
        let args = [
            "ctr",
            "--address",
            &socket,
            "run",
            "--rm",
            "--cni",
            "--runc-root",
            &runc,
            "--fifo-dir",
            &fifo,
            "--rootfs",
            &rootfs,
            &id,
        ]
        .iter()
        .chain(&SHOW_ADDRESS)
        .copied()
        .collect::<Vec<&str>>();
        let binds = [
            (lab.path("net.d"), "/etc/cni/net.d"),
            (lab.path("bin"), "/opt/cni/bin"),
        ];
        let binds: Vec<(&Path, &str)> = binds
            .iter()
            .map(|(from, to)| (from.as_path(), *to))
            .collect();
        let out = run(lab
            .host
            .isolated(&["/var/lib/cni"], &binds, &args)
            .env("FAKE_DELEGATE_DIR", &net.rec)
            .env("IPAM_DELEGATED_LOG_FILE", net.log()));
        // When CNI set-up fails, ctr leaves the created task behind.
        daemon.remove(&id);
        Attachment {
            succeeded: out.status.success(),
            address: inet(&String::from_utf8_lossy(&out.stdout)),
            output: text(&out),
        }
    });

    // ctr deletes with an empty CNI_NETNS, which the selector saw.
    let selector = networks
        .iter()
        .find(|n| n.case == Case::SelectorThenAllocator)
        .unwrap();
    let calls = recorded_calls(&selector.rec);
    let del = calls
        .iter()
        .find(|c| c.command == "DEL")
        .expect("the selector got a DEL");
    assert_eq!(
        recorded_env(&selector.rec, del)
            .get("CNI_NETNS")
            .map(String::as_str),
        Some("")
    );
}

/// A containerd of the test's own: private root, state and sockets, CRI
/// off, its shims' sockets on a private tmpfs. timeout(1) ends it if the
/// test process dies before its Drop runs.
struct Containerd {
    child: Child,
    socket: PathBuf,
}

impl Containerd {
    fn start(lab: &Lab) -> Containerd {
        let socket = lab.path("containerd.sock");
        let config = format!(
            "version = 2\nroot = \"{}\"\nstate = \"{}\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = \"{}\"\n[ttrpc]\n  address = \"{}\"\n",
            lab.path("containerd-root").display(),
            lab.path("containerd-state").display(),
            socket.display(),
            lab.path("containerd-ttrpc.sock").display(),
        );
        fs::write(lab.path("containerd.toml"), config).unwrap();
        let log = fs::File::create(lab.path("containerd.log")).unwrap();
        let child = Command::new("timeout")
            .args([
                "-k",
                "5",
                "900",
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
            ])
            .arg("mount -t tmpfs tmpfs /run/containerd && exec containerd --config \"$1\"")
            .arg("sh")
            .arg(lab.path("containerd.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let daemon = Containerd { child, socket };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !run(bounded("ctr")
            .arg("--address")
            .arg(&daemon.socket)
            .arg("version"))
        .status
        .success()
        {
            assert!(
                Instant::now() < deadline,
                "containerd did not start: {:?}",
                fs::read_to_string(lab.path("containerd.log"))
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        daemon
    }

    /// Deletes container `id` and its task, whatever state they are in.
    fn remove(&self, id: &str) {
        for args in [
            &["task", "delete", "--force", id][..],
            &["container", "delete", id],
        ] {
            let _ = run(bounded("ctr").arg("--address").arg(&self.socket).args(args));
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Shims outlive their daemon; those of this one name its socket.
        let _ = run(bounded("pkill").args(["-KILL", "-f"]).arg(&self.socket));
        // timeout(1) passes the TERM on to containerd.
        let _ = run(bounded("kill").arg(self.child.id().to_string()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Directories created as mount points, removed again (innermost first)
/// if they did not exist before.
struct MountPoints(Vec<PathBuf>);

impl MountPoints {
    fn ensure(paths: &[&str]) -> MountPoints {
        // Tests run in parallel and may want the same ones.
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let mut created = Vec::new();
        for path in paths {
            let mut missing: Vec<PathBuf> = Path::new(path)
                .ancestors()
                .take_while(|p| !p.exists())
                .map(Path::to_path_buf)
                .collect();
            fs::create_dir_all(path).unwrap();
            created.append(&mut missing);
        }
        MountPoints(created)
    }
}

impl Drop for MountPoints {
    fn drop(&mut self) {
        for dir in &self.0 {
            let _ = fs::remove_dir(dir);
        }
    }
}

#[test]
fn the_docs_show_the_conflists_these_tests_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shown_in = fs::read_to_string(root.join("docs/runtimes.md")).unwrap();
    for fixture in [
        "containerd",
        "crio",
        "podman",
        "cnitool",
        "kubernetes",
        "nomad-pools",
    ] {
        let text = fs::read_to_string(root.join(format!("fixtures/conflists/{fixture}.conflist")))
            .unwrap();
        let block = format!("```json\n{}\n```", text.trim_end());
        assert!(
            shown_in.contains(&block),
            "docs/runtimes.md lacks fixtures/conflists/{fixture}.conflist as it is"
        );
    }
}

/// The cnitool-like driver in tests/libcni-driver, built once with
/// Debian's golang-go and golang-github-appc-cni-dev in GOPATH mode.
fn libcni_driver() -> PathBuf {
    static DRIVER: OnceLock<PathBuf> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
            let out = tmp.join("libcni-driver");
            ok(bounded("go")
                .args(["build", "-o"])
                .arg(&out)
                .arg("./tests/libcni-driver")
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .env("GO111MODULE", "off")
                .env(
                    "GOPATH",
                    format!("{}:/usr/share/gocode", tmp.join("gopath").display()),
                )
                .env("GOCACHE", tmp.join("go-cache"))
                .env("GOFLAGS", "")
                .env("CGO_ENABLED", "0"));
            out
        })
        .clone()
}

/// Checks that root, every tool and file named, a static busybox and the
/// plugins every test uses are there, and says which is missing: these
/// tests are ignored unless asked for (./.ci/test installs all of it).
fn prerequisites(tools: &[&str], files: &[&str]) {
    assert!(
        common::is_root(),
        "runtime tests need root (network namespaces, bridges, containers)"
    );
    let mut needed: Vec<&str> = tools.to_vec();
    needed.extend(["ip", "timeout", "ldd"]);
    for tool in needed {
        let found = run(Command::new("sh").args(["-c", &format!("command -v {tool}")]));
        assert!(
            found.status.success(),
            "runtime tests need {tool} (./.ci/test installs it)"
        );
    }
    let mut needed_files = vec![
        "/usr/lib/cni/bridge",
        "/usr/lib/cni/host-local",
        "/usr/lib/cni/loopback",
    ];
    needed_files.extend(files);
    for file in needed_files {
        assert!(
            Path::new(file).exists(),
            "runtime tests need {file} (./.ci/test installs it)"
        );
    }
    // Copied alone into a container's root, only a static busybox runs.
    let ldd = run(Command::new("ldd").arg("/bin/busybox"));
    assert!(
        text(&ldd).contains("not a dynamic executable"),
        "runtime tests need a static /bin/busybox (busybox-static; ./.ci/test installs it)"
    );
}

/// The IPv4 address in `ip -4 -o addr show` output.
fn inet(shown: &str) -> Option<String> {
    let mut words = shown.split_whitespace();
    words.find(|w| *w == "inet")?;
    words.next().map(String::from)
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null());
    cmd.output()
        .unwrap_or_else(|e| panic!("{cmd:?} could not run: {e}"))
}

/// Runs `cmd`, which must succeed; its stdout.
fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(out.status.success(), "{cmd:?} failed: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
