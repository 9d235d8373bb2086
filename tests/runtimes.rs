//! The plugin under the runtimes users run: libcni (what containerd's CRI,
//! CRI-O and cnitool call plugins through), podman and containerd's `ctr`,
//! each running Debian's `bridge` with ipam-delegated as its IPAM, into
//! network namespaces these tests create. Each runs the example conflists
//! of fixtures/conflists/ (shown in the README), made private to the test.
//!
//! The runtime, and so the bridge, runs inside a network namespace standing
//! in for the host: nothing is added to this machine's own network.
//!
//! Needs root and the runtime packages (./.ci/test installs them); skipped
//! with a message elsewhere, a failure instead of a skip when CI=true.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{skip, write_answer, Answer, TempDir, PLUGIN};
use serde_json::{json, Value};

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
}

const CASES: [Case; 3] = [
    Case::OneDelegate,
    Case::SelectorThenAllocator,
    Case::LastFails,
];

impl Case {
    fn delegates(self) -> &'static [&'static str] {
        match self {
            Case::OneDelegate => &["host-local"],
            Case::SelectorThenAllocator => &["ipam-ds-pool", "host-local"],
            Case::LastFails => &["host-local", "ipam-da-fail"],
        }
    }
}

/// A network namespace, deleted when dropped.
struct Netns(String);

impl Netns {
    fn new(name: String) -> Netns {
        let _ = run(Command::new("ip").args(["netns", "del", &name]));
        ok(Command::new("ip").args(["netns", "add", &name]));
        let ns = Netns(name);
        ok(Command::new("ip").args(["-n", &ns.0, "link", "set", "lo", "up"]));
        ns
    }

    fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }

    /// `program` run inside this namespace, with the rest of the system
    /// (mounts, /sys, cgroups) as it is.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("timeout");
        cmd.args(["120", "nsenter", &format!("--net={}", self.path()), program]);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run(Command::new("ip").args(["netns", "del", &self.0]));
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
    name: String,
    /// The first three octets of its subnet, with the dot.
    prefix: String,
    conflist: String,
    /// Where the scripted delegates of this case record their calls.
    rec: PathBuf,
}

impl Lab {
    fn new(tag: &'static str) -> Lab {
        let dir = TempDir::new(tag);
        let bin = dir.path().join("bin");
        fs::create_dir_all(&bin).unwrap();
        for plugin in ["bridge", "host-local", "loopback"] {
            std::os::unix::fs::symlink(Path::new("/usr/lib/cni").join(plugin), bin.join(plugin))
                .unwrap();
        }
        fs::copy(PLUGIN, bin.join("ipam-delegated")).unwrap();
        let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-delegate");
        for name in ["ipam-ds-pool", "ipam-da-fail"] {
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

    /// The example conflist `fixture` made private for case `i`: its own
    /// name, bridge, subnet 10.250.`octet`.0/24, host-local store and
    /// delegates; every other setting as in the example.
    fn network(&self, fixture: &str, case: Case, octet: u8) -> Network {
        let file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/conflists")
            .join(fixture);
        let mut list: Value = serde_json::from_str(&fs::read_to_string(file).unwrap()).unwrap();
        let name = format!("ipamd-{}-{octet}", self.tag);
        let prefix = format!("10.250.{octet}.");
        list["name"] = json!(name);
        let bridge = &mut list["plugins"][0];
        bridge["bridge"] = json!(format!("ipd{}{octet}", self.tag));
        let ipam = &mut bridge["ipam"];
        assert_eq!(ipam["type"], "ipam-delegated", "{fixture}");
        ipam["delegates"] = json!(case.delegates());
        ipam["ranges"] = json!([[{"subnet": format!("{prefix}0/24")}]]);
        ipam["dataDir"] = json!(self.path("data"));

        let rec = self.path(&format!("rec-{octet}"));
        fs::create_dir_all(&rec).unwrap();
        let pool = json!({"cniVersion": "1.0.0", "ips": [], "pools": [{"name": "e2e", "subnet": format!("{prefix}0/24")}]});
        write_answer(
            &rec,
            "ipam-ds-pool",
            "ADD",
            Answer::prints(pool.to_string()),
        );
        let failure = json!({"cniVersion": "1.0.0", "code": 11, "msg": FAILURE_MSG});
        write_answer(
            &rec,
            "ipam-da-fail",
            "ADD",
            Answer::fails(1, failure.to_string()),
        );
        Network {
            name,
            prefix,
            conflist: serde_json::to_string_pretty(&list).unwrap(),
            rec,
        }
    }

    /// The addresses host-local holds for `network`.
    fn reservations(&self, network: &Network) -> BTreeSet<String> {
        let Ok(entries) = fs::read_dir(self.path("data").join(&network.name)) else {
            return BTreeSet::new();
        };
        entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }
}

/// What a runtime did with one case.
struct Attachment {
    succeeded: bool,
    /// The address the container saw on eth0, when it ran.
    address: Option<String>,
    /// What the runtime said, for failures and assertions.
    output: String,
}

/// Runs every case through `attach` and checks the rules of the issue:
/// the container gets an address from the stack, DEL reaches the stack
/// when it ends, a failing stack is reported and nothing stays reserved.
fn run_cases(
    lab: &Lab,
    fixture: &str,
    first_octet: u8,
    mut attach: impl FnMut(&Network) -> Attachment,
) {
    for (i, case) in CASES.into_iter().enumerate() {
        let net = lab.network(fixture, case, first_octet + i as u8);
        let outcome = attach(&net);
        let context = format!("{fixture} {case:?}: {}", outcome.output);
        if case == Case::LastFails {
            assert!(!outcome.succeeded, "{context}");
            assert!(outcome.output.contains(FAILURE_MSG), "{context}");
        } else {
            assert!(outcome.succeeded, "{context}");
            let address = outcome.address.unwrap_or_default();
            assert!(
                address.starts_with(&net.prefix),
                "address {address:?}: {context}"
            );
        }
        assert!(
            lab.reservations(&net).is_empty(),
            "{:?} left: {context}",
            lab.reservations(&net)
        );
        let calls = fs::read_to_string(net.rec.join("calls")).unwrap_or_default();
        match case {
            Case::OneDelegate => assert_eq!(calls, "", "{context}"),
            Case::SelectorThenAllocator => {
                assert!(
                    calls.starts_with("ipam-ds-pool ADD\n"),
                    "{calls}: {context}"
                );
                assert!(calls.contains("ipam-ds-pool DEL\n"), "{calls}: {context}");
            }
            Case::LastFails => {
                assert!(
                    calls.starts_with("ipam-da-fail ADD\nipam-da-fail DEL\n"),
                    "{calls}: {context}"
                )
            }
        }
    }
}

#[test]
fn libcni_as_used_by_containerd_cri_crio_and_cnitool() {
    if !prerequisites(
        &["go", "nsenter"],
        &["/usr/share/gocode/src/github.com/containernetworking/cni/libcni"],
    ) {
        return;
    }
    let driver = libcni_driver();
    let lab = Lab::new("lib");
    for (fixture, first_octet) in [("crio.conflist", 41), ("cnitool.conflist", 44)] {
        run_cases(&lab, fixture, first_octet, |net| {
            let file = lab.path(&format!("{}.conflist", net.name));
            fs::write(&file, &net.conflist).unwrap();
            let container = Netns::new(format!("{}-ctr", net.name));
            let call = |command: &str| {
                let mut cmd = lab.host.command(driver.to_str().unwrap());
                cmd.args([
                    command,
                    file.to_str().unwrap(),
                    "ctr-e2e",
                    &container.path(),
                    "eth0",
                ])
                .env("CNI_PATH", lab.path("bin"))
                .env("CNI_CACHE_DIR", lab.path("libcni-cache"))
                .env("FAKE_DELEGATE_DIR", &net.rec)
                .env("IPAM_DELEGATED_LOG_FILE", lab.path("plugin.log"));
                run(&mut cmd)
            };
            let add = call("add");
            let mut output = text(&add);
            let address = add.status.success().then(|| {
                let shown = ok(Command::new("ip").args([
                    "-n",
                    &container.0,
                    "-4",
                    "-o",
                    "addr",
                    "show",
                    "eth0",
                ]));
                let check = call("check");
                assert!(check.status.success(), "CHECK: {}", text(&check));
                inet(&shown)
            });
            // A runtime deletes after a failed ADD too.
            let del = call("del");
            assert!(del.status.success(), "DEL: {}", text(&del));
            output.push_str(&text(&del));
            Attachment {
                succeeded: add.status.success(),
                address: address.flatten(),
                output,
            }
        });
    }
}

#[test]
fn podman_with_its_cni_backend() {
    if !prerequisites(&["podman", "runc", "conmon", "nsenter"], &[]) {
        return;
    }
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

    run_cases(&lab, "podman.conflist", 51, |net| {
        fs::write(
            lab.path("net.d").join(format!("{}.conflist", net.name)),
            &net.conflist,
        )
        .unwrap();
        // podman's DEL comes from a cleanup process that conmon starts with
        // an environment of its own: delegates' settings reach it through
        // [engine] env, as they would in production.
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
            log = lab.path("plugin.log").display(),
            bin = lab.path("bin").display(),
            netd = lab.path("net.d").display(),
        );
        fs::write(lab.path("containers.conf"), containers_conf).unwrap();
        let out = run(lab
            .host
            .command("podman")
            .env("CONTAINERS_CONF", lab.path("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", lab.path("storage.conf"))
            .args(["run", "--rm", "--network", &net.name, "--rootfs"])
            .arg(lab.path("rootfs"))
            .args(["/bin/busybox", "ip", "-4", "-o", "addr", "show", "eth0"]));
        Attachment {
            succeeded: out.status.success(),
            address: inet(&String::from_utf8_lossy(&out.stdout)),
            output: text(&out),
        }
    });
}

#[test]
fn containerd_with_ctr_run_cni() {
    if !prerequisites(
        &["containerd", "ctr", "runc", "unshare", "nsenter", "pkill"],
        &[],
    ) {
        return;
    }
    let lab = Lab::new("ctd");
    let daemon = Containerd::start(&lab);
    // ctr reads only these two; the test mounts its own over them, in a
    // mount namespace of its own, so the mount points must exist.
    let _mount_points = MountPoints::ensure(&["/etc/cni/net.d", "/opt/cni/bin"]);
    fs::create_dir_all(lab.path("net.d")).unwrap();

    let mut n = 0;
    run_cases(&lab, "containerd.conflist", 61, |net| {
        // The only conflist there, so the one ctr uses.
        fs::write(lab.path("net.d/10-e2e.conflist"), &net.conflist).unwrap();
        n += 1;
        let id = format!("ipamd-e2e-{}-{n}", std::process::id());
        let script = format!(
            "mount --bind {netd} /etc/cni/net.d && mount --bind {bin} /opt/cni/bin && \
             exec ctr --address {socket} run --rm --cni --runc-root {runc} --rootfs {rootfs} {id} \
             /bin/busybox ip -4 -o addr show eth0",
            netd = lab.path("net.d").display(),
            bin = lab.path("bin").display(),
            socket = daemon.socket.display(),
            runc = lab.path("runc").display(),
            rootfs = lab.path("rootfs").display(),
        );
        let out = run(lab
            .host
            .command("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .env("FAKE_DELEGATE_DIR", &net.rec)
            .env("IPAM_DELEGATED_LOG_FILE", lab.path("plugin.log")));
        // When CNI set-up fails, ctr leaves the created task behind.
        daemon.remove(&id);
        Attachment {
            succeeded: out.status.success(),
            address: inet(&String::from_utf8_lossy(&out.stdout)),
            output: text(&out),
        }
    });

    // containerd deletes with an empty CNI_NETNS: the selector saw one.
    let rec = lab.path("rec-62");
    let del = fs::read_dir(&rec)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".ipam-ds-pool.DEL.env"))
        .expect("the selector got a DEL");
    let env = fs::read(del).unwrap();
    assert!(
        env.split(|b| *b == 0).any(|kv| kv == b"CNI_NETNS="),
        "DEL had a CNI_NETNS"
    );
}

#[test]
fn the_readme_shows_the_conflists_these_tests_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    for fixture in ["containerd", "crio", "podman", "cnitool"] {
        let text = fs::read_to_string(root.join(format!("fixtures/conflists/{fixture}.conflist")))
            .unwrap();
        let block = format!("```json\n{}\n```", text.trim_end());
        assert!(
            readme.contains(&block),
            "README lacks fixtures/conflists/{fixture}.conflist as it is"
        );
    }
}

/// A containerd of the test's own: private root, state and sockets, CRI off.
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
        let child = Command::new("containerd")
            .arg("--config")
            .arg(lab.path("containerd.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let daemon = Containerd { child, socket };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !run(Command::new("ctr")
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
}

impl Containerd {
    /// Deletes container `id` and its task, whatever state they are in.
    fn remove(&self, id: &str) {
        for args in [
            &["task", "delete", "--force", id][..],
            &["container", "delete", id],
        ] {
            let _ = run(Command::new("ctr")
                .arg("--address")
                .arg(&self.socket)
                .args(args));
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // Shims outlive their daemon; those of this one name its socket.
        let _ = run(Command::new("pkill")
            .args(["-KILL", "-f"])
            .arg(&self.socket));
        let _ = run(Command::new("kill").arg(self.child.id().to_string()));
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

/// Directories created for bind mounts, removed again (innermost first) if
/// they did not exist before.
struct MountPoints(Vec<PathBuf>);

impl MountPoints {
    fn ensure(paths: &[&str]) -> MountPoints {
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

/// The cnitool-like driver in tests/libcni-driver, built once with
/// Debian's golang-go and golang-github-appc-cni-dev in GOPATH mode.
fn libcni_driver() -> PathBuf {
    static DRIVER: OnceLock<PathBuf> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
            let out = tmp.join("libcni-driver");
            ok(Command::new("go")
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

/// Root, every tool and file named, and the plugins every test uses; or a
/// skip (a failure under CI=true).
fn prerequisites(tools: &[&str], files: &[&str]) -> bool {
    if fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) != 0 {
        return skip("runtime tests need root (network namespaces, bridges, containers)");
    }
    let mut needed: Vec<&str> = tools.to_vec();
    needed.extend(["ip", "timeout"]);
    for tool in needed {
        if !run(Command::new("sh").args(["-c", &format!("command -v {tool}")]))
            .status
            .success()
        {
            return skip(&format!(
                "runtime tests need {tool} (./.ci/test installs it)"
            ));
        }
    }
    let mut needed_files = vec![
        "/usr/lib/cni/bridge",
        "/usr/lib/cni/host-local",
        "/usr/lib/cni/loopback",
        "/bin/busybox",
    ];
    needed_files.extend(files);
    for file in needed_files {
        if !Path::new(file).exists() {
            return skip(&format!(
                "runtime tests need {file} (./.ci/test installs it)"
            ));
        }
    }
    true
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
